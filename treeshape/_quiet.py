"""Standard error kept free of the accelerators' own logging while treeshape starts JAX's
backends or compiles for a target (`quiet`): libtpu's start-up on a machine without a TPU
(`E0000 ... common_lib.cc ... TPU_WORKER_HOSTNAMES` and the lines around it), JAX's CUDA
plugin without a driver, and XLA's log lines (`Invalid stack_frame_id`) from inside the
compilers. They are C++ logs written to file descriptor 2, below Python's `sys.stderr` and
its `logging`, and no setting of the process turns them off for one call only.

So fd 2 is caught (into a temporary file) around treeshape's own work and nothing else: a
backend's start, a target's devices, lowering and compiling, reading the compiled program.
The user's function never runs inside (it is traced before), and whatever else reaches fd 2
meanwhile (another thread, JAX's own Python logging as the user configured it) is written
back once the block ends, in order; only the accelerators' lines (`CHATTER`, in the formats
their logging writes) are left out. fd 2 is restored however the block ends. One lock: one
block at a time in the process (fd 2 is the process's), blocks nested in a thread are one.
A process that the compiler aborts loses what the block caught.

Imports only the standard library: the command line calls it before JAX is imported.
"""

import contextlib
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Final


# The accelerators' own lines, each a whole line: every line their C++ logging writes (absl's
# and glog's prefix, TSL's), and the lines without one that they print at start-up.
_CPP_LOG: Final = r"^[IWEF]\d{4} [\d:. ]+\d+ \S+\.(cc|h):\d+\] |^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+\.(cc|h):\d+\] "
CHATTER: Final = re.compile(
    rf"{_CPP_LOG}"  # (XLA's `Invalid stack_frame_id`, libtpu's `TPU_WORKER_HOSTNAMES`, `cudart_stub.cc`)
    # absl's notice before its logging is set up (libtpu, JAX's CUDA plugin, each copy of absl)
    r"|^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^WARNING: Logging before InitGoogle\(\) is written to STDERR$"
    # libtpu without a TPU: the host bounds, and the trace below its workers' error
    r"|^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
    r"|^=== Source Location Trace: ===$|^learning/\S+/libtpu_init_utils\.cc:\d+$"
)
# JAX's report of a plugin that failed to start (its CUDA plugin's check of the CUDA
# libraries), with its traceback: JAX's own Python logging, left out by the command line only.
_PLUGIN_FAILED: Final = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"
_PLUGIN_FAILED_END: Final = "RuntimeError: Unable to "

_LOCK: Final = threading.RLock()
_held = [0]  # how deep the blocks of the thread holding `_LOCK` are nested


def kept(text: str, plugin_errors: bool = False) -> str:
    """`text` less the accelerators' lines (`CHATTER`), and with `plugin_errors` less JAX's
    report of a plugin that failed to start; every other line as it was, in order."""
    out = []
    in_block = False
    for line in text.splitlines(keepends=True):
        if plugin_errors and line.startswith(_PLUGIN_FAILED):
            in_block = True
        elif in_block:
            in_block = not line.startswith(_PLUGIN_FAILED_END)
        elif not CHATTER.search(line.strip()):
            out.append(line)
    return "".join(out)


@contextlib.contextmanager
def quiet(plugin_errors: bool = False) -> Iterator[None]:
    """File descriptor 2 caught while the block runs, and written back after it less the
    accelerators' lines (`kept`). Where fd 2 cannot be duplicated (closed), or inside
    another block of this thread, the block runs as it is."""
    with _LOCK:
        if _held[0]:
            _held[0] += 1
            try:
                yield
            finally:
                _held[0] -= 1
            return
        _flush()
        try:
            caught = tempfile.TemporaryFile()
        except OSError:
            yield
            return
        try:
            saved = os.dup(2)
        except OSError:
            caught.close()
            yield
            return
        _held[0] = 1
        try:
            os.dup2(caught.fileno(), 2)
            try:
                yield
            finally:
                _flush()
                os.dup2(saved, 2)
        finally:
            _held[0] = 0
            os.close(saved)
            with caught:
                caught.seek(0)
                text = caught.read().decode("utf-8", "surrogateescape")
            _write(kept(text, plugin_errors).encode("utf-8", "surrogateescape"))


def _flush() -> None:
    """What Python holds for standard error, written to fd 2 (before it is caught or restored)."""
    for stream in {id(s): s for s in (sys.stderr, sys.__stderr__) if s is not None}.values():
        with contextlib.suppress(Exception):
            stream.flush()


def _write(data: bytes) -> None:
    while data:
        try:
            written = os.write(2, data)
        except OSError:
            return
        data = data[written:]
