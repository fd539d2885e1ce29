"""Compiling for a mesh this process does not have: the program lowered here for the CPU,
compiled in a child process that simulates the mesh's devices.

A program whose inputs are sharded over a `jax.sharding.AbstractMesh` larger than this
process's device count cannot be compiled here. It can be lowered here (for the CPU, with
the abstract mesh's shardings), and the lowered module (StableHLO bytecode: no user code,
nothing pickled) is compiled by a fresh Python process started with
`--xla_force_host_platform_device_count` set to the mesh's size, which sends back what
`ts.cost` reads of a compiled program: XLA's memory and cost analyses, the optimized HLO
text and the serialized buffer assignment. The parent wraps them in `Simulated`, which
answers the same questions as a `jax.stages.Compiled`.

The child always ends: it is killed on timeout (`TREESHAPE_SIMULATE_TIMEOUT` seconds,
600 by default), on an interrupt and on any error in the parent while it runs.
"""

import base64
import json
import os
import subprocess
import sys
import time
import types
from typing import Any, Final

from .. import _compat


# The most devices a child simulates: XLA's CPU client makes this many in one process in
# seconds and a few hundred MiB; past it, a request is refused before any child starts.
MAX_DEVICES: Final = 4096
_TIMEOUT_VARIABLE: Final = "TREESHAPE_SIMULATE_TIMEOUT"
_DEFAULT_TIMEOUT: Final = 600.0


class Simulated:
    """What a child process compiled, read as `_compat` reads a `jax.stages.Compiled`:
    `cost_analysis()`, `memory_analysis()`, `as_text()`, the optimized module
    (`runtime_executable().hlo_modules()`) and the arguments it keeps."""

    def __init__(self, reply: dict[str, Any], devices: int, kept: Any) -> None:
        self._cost = reply["cost"]
        self._memory = _Memory(reply["memory"])
        self._hlo = reply["hlo"]
        proto = reply.get("module")
        self._module = None if proto is None else base64.b64decode(proto)
        self._executable = types.SimpleNamespace(_kept_var_idx=kept)
        self.devices = devices
        self.args_info: Any = None
        self.out_info: Any = None

    def runtime_executable(self) -> "Simulated":
        return self

    def hlo_modules(self) -> list[Any]:
        if self._module is None:
            return []
        module = self._module
        return [types.SimpleNamespace(as_serialized_hlo_module_proto=lambda: module)]

    def cost_analysis(self) -> dict[str, Any]:
        return dict(self._cost)

    def memory_analysis(self) -> "_Memory":
        return self._memory

    def as_text(self) -> str:
        return str(self._hlo)


class _Memory:
    def __init__(self, fields: dict[str, Any]) -> None:
        for name, value in fields.items():
            if name == "serialized_buffer_assignment_proto":
                value = None if value is None else base64.b64decode(value)
            setattr(self, name, value)


def timeout() -> float:
    """The seconds a child may take, from `TREESHAPE_SIMULATE_TIMEOUT` (default 600)."""
    text = os.environ.get(_TIMEOUT_VARIABLE, "").strip()
    if not text:
        return _DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(
            f"treeshape: {_TIMEOUT_VARIABLE}={text!r} is not a number of seconds above 0; "
            f"set it to e.g. 600, or unset it for the default ({_DEFAULT_TIMEOUT:g} s)."
        )
    return seconds


def check_devices(devices: int, where: str) -> None:
    """Refuse a mesh larger than a child simulates, before any child starts."""
    if devices > MAX_DEVICES:
        raise ValueError(
            f"treeshape: {where} is sharded over a mesh of {devices} devices; a program is compiled for at "
            f"most {MAX_DEVICES} simulated devices. Plan on a mesh of at most {MAX_DEVICES} devices (the "
            "figures per device of a larger mesh with the same sharding per device are the same)."
        )


def _child_environment(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return env


def compile_for(lowered: Any, devices: int) -> Simulated:
    """Compile a lowered program (`jax.stages.Lowered`, lowered for the CPU) for `devices`
    simulated CPU devices in a child process; a `RuntimeError` with the child's reason if it
    fails or times out."""
    check_devices(devices, "the program")
    module = _compat.lowered_module(lowered)
    kept = _compat.lowered_kept_arguments(lowered)
    limit = timeout()
    request = json.dumps({"module": base64.b64encode(module).decode("ascii"), "devices": devices})
    command = [sys.executable, "-c", "from treeshape._cost._simulate import child_main; child_main()"]
    start = time.monotonic()
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_environment(devices),
        text=True,
    ) as process:  # leaving the block closes the pipes and waits for the child
        try:
            out, err = process.communicate(request, timeout=limit)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise RuntimeError(
                f"treeshape: compiling the program for {devices} simulated CPU devices ran past its timeout of "
                f"{limit:g} s (in a child process, now ended). Set {_TIMEOUT_VARIABLE} to more seconds, or plan "
                "on a smaller mesh."
            ) from None
        except BaseException:  # an interrupt, or any error while waiting: the child never outlives it
            process.kill()
            raise
    if process.returncode != 0:
        reason = _last_line(err) or f"exit status {process.returncode}"
        raise RuntimeError(
            f"treeshape: compiling the program for {devices} simulated CPU devices failed in a child process "
            f"after {time.monotonic() - start:.1f} s: {reason}"
        )
    simulated = Simulated(json.loads(out), devices, kept)
    simulated.args_info, simulated.out_info = lowered.args_info, lowered.out_info  # global types, as a Compiled has
    return simulated


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def child_main() -> None:
    """The child: read a request on standard input, compile, answer on standard output."""
    request = json.loads(sys.stdin.read())
    devices = int(request["devices"])
    compiled = _compat.compile_module(base64.b64decode(request["module"]), devices)
    memory = compiled.get_compiled_memory_stats()
    fields = {name: getattr(memory, name, None) for name in _compat.MEMORY_STATS_FIELDS}
    proto = getattr(memory, "serialized_buffer_assignment_proto", None)
    fields["serialized_buffer_assignment_proto"] = None if not proto else base64.b64encode(proto).decode("ascii")
    module = _compat.optimized_module_proto(compiled)
    reply = {
        "memory": fields,
        "cost": _compat.cost_analysis(compiled),
        "hlo": _compat.optimized_hlo(compiled),
        "module": None if module is None else base64.b64encode(module).decode("ascii"),
    }
    sys.stdout.write(json.dumps(reply))
    sys.stdout.flush()
