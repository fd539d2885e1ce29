"""JAX's start-up for the command: the backends started with the chatter of accelerator
plugins that cannot start here left out of standard error (`start_jax`, by `_quiet`), and
JAX kept to the CPU when a command compiles for a named `--target` (`start_for_targets`)."""

import os
import sys
import warnings
from collections.abc import Sequence

from .. import _quiet


def start_jax() -> None:
    """Start JAX's backends with the start-up chatter of plugins that cannot start here
    left out of standard error (`_quiet`, JAX's report of its CUDA plugin's failed check
    too; every other line is passed on). Where JAX is started already (the command line
    called in-process), nothing happens."""
    if "jax" in sys.modules:
        return
    with _quiet.quiet(plugin_errors=True), warnings.catch_warnings():
        # JAX's advice to a TPU VM's administrator, at import on a TPU machine (the command
        # compiles for `--target` on the CPU there, and cannot change the VM's settings)
        warnings.filterwarnings("ignore", "Transparent hugepages are not enabled", UserWarning)
        try:
            import jax

            jax.devices()
        except Exception:  # raised again, with its message, where the command uses JAX
            pass


def start_for_targets(argv: Sequence[str] | None) -> None:
    """With `--target`, JAX must start on the CPU alone (no accelerator plugin starts its
    devices), which the environment says before JAX is imported; a setting of the user's
    own is kept."""
    words = sys.argv[1:] if argv is None else argv
    if any(w == "--target" or w.startswith("--target=") for w in words):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
