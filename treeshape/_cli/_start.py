"""JAX's start-up for the command: the backends started with the chatter of accelerator
plugins that cannot start here left out of standard error (`start_jax`), and JAX kept to
the CPU when a command compiles for a named `--target` (`start_for_targets`)."""

import os
import re
import sys
from collections.abc import Sequence
from typing import Final


# What accelerator plugins that cannot start here print on standard error when JAX starts
# its backends (JAX's CUDA plugin without a driver, libtpu without a TPU): installing the
# `cuda` / `tpu` extras adds no line to a command's output.
_PLUGIN_CHATTER: Final = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|^[IWE]\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers"
    r"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
    r"|^E\d{4} [\d:. ]+\d+ common_lib\.cc:\d+\] .*TPU_WORKER_HOSTNAMES"
    r"|^=== Source Location Trace: ===$|^learning/\S+/libtpu_init_utils\.cc:\d+$"
    r"|^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
)

_PLUGIN_FAILED: Final = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"
_PLUGIN_FAILED_END: Final = "RuntimeError: Unable to "


def start_jax() -> None:
    """Start JAX's backends with the start-up chatter of plugins that cannot start here
    left out of standard error (every other line is passed on). Where JAX is started
    already (the command line called in-process), nothing happens."""
    if "jax" in sys.modules:
        return
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import jax

            jax.devices()
        except Exception:  # raised again, with its message, where the command uses JAX
            pass
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", "replace")
    in_block = False  # the CUDA plugin's failed start-up check, logged by JAX with its traceback
    for line in text.splitlines():
        if line.startswith(_PLUGIN_FAILED):
            in_block = True
        elif in_block:
            in_block = not line.startswith(_PLUGIN_FAILED_END)
        elif not _PLUGIN_CHATTER.search(line.strip()):
            print(line, file=sys.stderr)


def start_for_targets(argv: Sequence[str] | None) -> None:
    """With `--target`, JAX must start on the CPU alone (no accelerator plugin starts its
    devices), which the environment says before JAX is imported; a setting of the user's
    own is kept."""
    words = sys.argv[1:] if argv is None else argv
    if any(w == "--target" or w.startswith("--target=") for w in words):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
