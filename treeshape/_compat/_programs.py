"""Compiled programs: XLA's cost and memory analyses and the buffer assignment, the programs
XLA compiles counted, how JAX names a jitted function's operations, the optimized module and
the arguments it keeps, compiling a lowered program for simulated devices, XLA's HLO cost
analysis of a module, and whether JAX's CUDA plugin compiles for an NVIDIA GPU without one.
"""

import functools as ft
from typing import Any, Final

import jax
import numpy as np

from . import _private
from ._private import config as _config, xla_bridge as _xla_bridge


# -- what a compiled program needs (`ts.cost`) ----------------------------------------
# `jax.stages.Compiled.cost_analysis()` and `.memory_analysis()` are public, but JAX
# documents neither as a stable API: what they return has changed between releases.
# These two functions read them into one shape for every supported release.

_MEMORY_FIELDS: Final = {
    "argument": "argument_size_in_bytes",
    "output": "output_size_in_bytes",
    "temp": "temp_size_in_bytes",
    "alias": "alias_size_in_bytes",
    "peak": "peak_memory_in_bytes",
    # In the host's memory kinds (`pinned_host`, `unpinned_host`): 0 where nothing is there.
    "host_argument": "host_argument_size_in_bytes",
    "host_output": "host_output_size_in_bytes",
    "host_temp": "host_temp_size_in_bytes",
    "host_alias": "host_alias_size_in_bytes",
}


def cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program as one dict (`{}` when the backend gives none).

    Older releases returned a list with one dict per program (one program for everything
    `jit` compiles), jax 0.10.2 the dict itself; a backend without the analysis returns
    `None` or raises.
    """
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # e.g. "cost analysis not implemented" on some plugin backends
        return {}
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return dict(analysis) if isinstance(analysis, dict) else {}


def memory_analysis(compiled: Any) -> dict[str, Any]:
    """The per-device bytes of a compiled program (`argument`, `output`, `temp`, `alias`, and
    the same in the host's memory kinds, `host_argument` ...), each
    as the backend reports it (possibly negative, a sentinel) or `None` when it does not;
    `buffer_assignment`, XLA's buffer assignment (see `Fields`), or `None`; and `live_ranges`,
    the compiler's own schedule and live ranges as it dumps them, where a deviceless compile
    carries them (`_cost._deviceless`), else `None`.

    `memory_analysis()` returns a `CompiledMemoryStats` whose `*_size_in_bytes` fields name
    these figures on every supported release (`None` from a backend without the analysis).
    """
    try:
        stats = compiled.memory_analysis()
    except Exception:
        stats = None
    if isinstance(stats, (list, tuple)):  # one entry per program, as cost_analysis once was
        stats = stats[0] if stats else None
    figures = {name: getattr(stats, field, None) for name, field in _MEMORY_FIELDS.items()}
    assignment = getattr(stats, "serialized_buffer_assignment_proto", None)
    figures["buffer_assignment"] = assignment if isinstance(assignment, bytes) and assignment else None
    live_ranges = getattr(stats, "live_ranges", None)  # a deviceless TPU compile's, from its dump
    figures["live_ranges"] = live_ranges if isinstance(live_ranges, str) and live_ranges else None
    return figures


# -- what is at a compiled program's peak (`Cost.buffers`) ---------------------------------
# How JAX names an operation of a jitted function in the program's metadata: the function's
# `jit(name)` (`pjit(name)` in older releases, `pmap(name)` for a `jax.pmap`) and the path
# of transformations and scopes.
JIT_OP_PREFIXES: Final = ("jit(", "pjit(", "pmap(")


def dtype_named(name: str) -> Any:
    """The NumPy dtype that `jax.numpy` names `name` (`"bfloat16"`, `"float8_e4m3fn"`), or
    `name` itself where JAX has no such dtype: a narrow type XLA gains before JAX does
    (every type in `_cost._hlo.PRIMITIVE_TYPES` but `tuple`, `opaque` and `token` is
    named on jax 0.8.0 to 0.10.2)."""
    try:
        return np.dtype(getattr(jax.numpy, name)) if hasattr(jax.numpy, name) else name
    except TypeError:  # a name of something else
        return name


def optimized_module(compiled: Any) -> bytes | None:
    """The compiled (optimized, scheduled) program as a serialized `xla.HloModuleProto`, or
    None where there is not exactly one. `runtime_executable()` is public in `jax.stages`."""
    try:
        modules = compiled.runtime_executable().hlo_modules()
        if len(modules) != 1:
            return None
        data = modules[0].as_serialized_hlo_module_proto()
    except Exception:
        return None
    return data if isinstance(data, bytes) else None


def kept_arguments(compiled: Any, n_arguments: int) -> list[int] | None:
    """The positions (among the `n_arguments` leaves it was lowered with) of the arguments the
    compiled program takes, in parameter order: `jax.jit` leaves out unused ones
    (`keep_unused=False`). No public API says which; JAX's executable keeps the set as
    `_kept_var_idx` on every supported release. None when that is not found."""
    kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
    if not isinstance(kept, (set, frozenset, list, tuple)) or not all(isinstance(i, int) for i in kept):
        return None
    return sorted(i for i in kept if 0 <= i < n_arguments)


# -- compiling for simulated devices (`_simulate`) --------------------------------------
# A program lowered here over an abstract mesh larger than this process is compiled in a
# child process with that many simulated CPU devices. JAX has no public API that compiles a
# lowered module apart from the function it was traced from (`jax.export` drops the abstract
# mesh's shardings on 0.10.2, and serializing an export needs flatbuffers), so these use
# JAX's own compile path: the same functions `jax.jit(...).lower(...).compile()` calls.

MEMORY_STATS_FIELDS: Final = (*_MEMORY_FIELDS.values(), "generated_code_size_in_bytes")

# XLA's CPU client gives device ids of one process 11 bits; a device count above this makes
# it refuse the program ("Multiprocess computations aren't implemented on the CPU backend")
# unless the process has cross-process collectives, which a one-process `jax.distributed`
# gives it.
_CPU_DEVICES_PER_PROCESS: Final = 2048


def lowered_module(lowered: Any) -> bytes:
    """A lowered program (`jax.stages.Lowered`) as StableHLO bytecode, with its locations (so
    the compiled program's metadata keeps the user's op names and source lines)."""
    mlir = _private.mlir()
    module = lowered.compiler_ir("stablehlo")
    return bytes(mlir.module_to_bytecode(module))


def compile_module(module: bytes, devices: int) -> Any:
    """Compile StableHLO bytecode for `devices` CPU devices (this process must have them) with
    the options `jax.jit` compiles a partitioned program with: one replica, one partition per
    device (as the module's `mhlo.num_partitions` says), SPMD partitioning."""
    if devices > _CPU_DEVICES_PER_PROCESS:
        import socket

        with socket.socket() as s:  # a free loopback port for a coordinator of this process only
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
    from jax.extend import backend as jax_backend

    compiler, mlir = _private.compiler(), _private.mlir()

    cpus = jax.devices("cpu")
    if len(cpus) < devices:
        raise RuntimeError(f"this process has {len(cpus)} CPU devices, not {devices}")
    context = mlir.make_ir_context()
    with context:
        parsed = mlir.ir.Module.parse(module)
        attributes = parsed.operation.attributes
        partitions = _int_attribute(attributes, "mhlo.num_partitions", 1)
        replicas = _int_attribute(attributes, "mhlo.num_replicas", 1)
        chosen = cpus[: partitions * replicas]
        assignment = np.array(chosen).reshape(replicas, partitions)
        options = compiler.get_compile_options(
            num_replicas=replicas, num_partitions=partitions, device_assignment=assignment
        )
        backend = jax_backend.get_backend("cpu")
        return compiler.backend_compile_and_load(backend, parsed, compiler.xc.DeviceList(tuple(chosen)), options, [])


def _int_attribute(attributes: Any, name: str, default: int) -> int:
    mlir = _private.mlir()
    if name not in attributes:
        return default
    return int(mlir.ir.IntegerAttr(attributes[name]).value)


def optimized_hlo(compiled: Any) -> str:
    """The optimized HLO text of a loaded executable (what `Compiled.as_text()` gives)."""
    modules = compiled.hlo_modules()
    return "\n\n".join(m.to_string() for m in modules)


def optimized_module_proto(loaded: Any) -> bytes | None:
    """The optimized module of a loaded executable as a serialized `xla.HloModuleProto` (what
    `optimized_module` reads from a `jax.stages.Compiled`), or None where there is not one."""
    try:
        modules = loaded.hlo_modules()
        data = modules[0].as_serialized_hlo_module_proto() if len(modules) == 1 else None
    except Exception:
        return None
    return data if isinstance(data, bytes) else None


def lowered_kept_arguments(lowered: Any) -> Any:
    """The positions of the arguments a lowered program keeps (`jax.jit` leaves out unused
    ones), as `kept_arguments` reads them from a compiled one; None where not found."""
    kept = getattr(getattr(lowered, "_lowering", None), "compile_args", {}).get("kept_var_idx")
    return kept if isinstance(kept, (set, frozenset)) else None


# -- compiling for an accelerator this machine does not have (`target=`) ---------------------
def _hlo_cost_analysis() -> Any:
    """jaxlib's private `hlo_module_cost_analysis(client, module)`: XLA's HLO cost analysis of
    a module, run by a client of this process (no public API runs it on a module)."""
    lib = _private.lib()
    analyse = getattr(getattr(lib, "_jax", None), "hlo_module_cost_analysis", None)
    return analyse if analyse is not None else lib.xla_client._xla.hlo_module_cost_analysis


def module_cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's HLO cost analysis of a compiled program's optimized module, run by this
    process's CPU client (`{}` where not found). A deviceless XLA:GPU compile answers
    `cost_analysis()` with None; the same analysis over the module it optimized gives its
    FLOPs and bytes."""
    try:
        from jax.extend import backend as jax_backend

        modules = compiled.runtime_executable().hlo_modules()
        if len(modules) != 1:
            return {}
        analysis = _hlo_cost_analysis()(jax_backend.get_backend("cpu"), modules[0])
    except Exception:
        return {}
    return dict(analysis) if isinstance(analysis, dict) else {}


def program_cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program: the backend's own, else (a deviceless
    XLA:GPU compile gives none) that of the module it optimized."""
    return cost_analysis(compiled) or module_cost_analysis(compiled)


def hlo_text_cost_analysis(text: str) -> dict[str, Any]:
    """XLA's HLO cost analysis of a module given as HLO text (`{}` where it cannot be read):
    a loop body of an optimized program, made a module of its own (`_cost._hlo_loops`).
    jaxlib's private `hlo_module_from_text` is the only parser of that text."""
    try:
        from jax.extend import backend as jax_backend

        lib = _private.lib()

        parse = getattr(getattr(lib.xla_client, "hlo", None), "hlo_module_from_text", None)
        if parse is None:  # jaxlib before 0.10 keeps it in `_xla`
            parse = lib.xla_client._xla.hlo_module_from_text
        module = parse(text)
        analysis = _hlo_cost_analysis()(jax_backend.get_backend("cpu"), module)
    except Exception:
        return {}
    return dict(analysis) if isinstance(analysis, dict) else {}


def optimized_text(compiled: Any) -> str | None:
    """The optimized HLO text of a compiled program (`Compiled.as_text()`, public), or None."""
    try:
        text = compiled.as_text()
    except Exception:
        return None
    return text if isinstance(text, str) and text else None


# -- compiling for an NVIDIA GPU without one (`target=`) -------------------------------------
def cuda_starts_without_gpu() -> bool:
    """Whether JAX's CUDA plugin starts here where JAX is kept off the GPU (`JAX_PLATFORMS`
    without CUDA): from jax 0.10.0 it skips its check of the CUDA libraries there, so it
    starts without them; jax 0.8.0's checks them anyway (unless
    `JAX_SKIP_CUDA_CONSTRAINTS_CHECK` is set). Where JAX may start CUDA's devices
    (`JAX_PLATFORMS` unset, or naming CUDA) every release checks them: True, and whether
    it started is the compile's to say (`_cost._target.devices`). No public API tells which
    platforms have topologies; JAX's plugin registry does."""
    platforms = [name.strip() for name in (_config.jax_platforms.value or "").split(",") if name.strip()]
    if not platforms or "cuda" in {p for name in platforms for p in _xla_bridge.expand_platform_alias(name)}:
        return True
    _xla_bridge._discover_and_register_pjrt_plugins()  # as `jax.experimental.topologies` does first
    return "cuda" in _xla_bridge._topology_factories


@ft.cache
def compiles_without_device(device: Any) -> bool:
    """Whether the compiler of `device`, a device of a topology this machine does not have
    (`jax.experimental.topologies`), compiles a matrix product for it. XLA:GPU autotunes one
    on the device; from jax 0.10.0 it compiles one without (jax 0.8.0's wants autotuning
    results and refuses it). A program of one 16x16 product, compiled once per device as
    `jax.jit` compiles (`backend_compile_and_load`) but apart from it: no compile is counted
    and nothing is cached."""
    compiler = _private.compiler()
    x = jax.ShapeDtypeStruct((16, 16), np.float32)
    module = jax.jit(jax.numpy.dot).lower(x, x).compiler_ir("stablehlo")
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1, device_assignment=np.array([[device]]))
    try:
        compiler.backend_compile_and_load(device.client, module, compiler.xc.DeviceList((device,)), options, [])
    except jax.errors.JaxRuntimeError:
        return False
    return True


# -- a `jax.pmap` over the devices of another machine (`ts.cost(..., target=)`) -------
# A `jax.pmap` wrapper maps over `devices=` or, without, over this process's first devices;
# JAX keeps its settings in the closure it builds (jax 0.8+ builds it over `shard_map`:
# `lower` closes over `infer_params`, which closes over the settings, named as `jax.pmap`'s
# parameters, its function as `f`, `fun` or `wrapped_fun`, its out_axes flattened on newer
# releases). No public API reads them; where a release names them otherwise, `pmap_over`
# finds nothing (None) and the pmap is traced over this process's devices, as before.
_PMAP_SETTINGS: Final = ("axis_name", "in_axes", "static_broadcasted_tuple", "donate_tuple", "axis_size")


def _closure(fn: Any) -> dict[str, Any]:
    """The values a function closes over, by name."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    found: dict[str, Any] = {}
    for name, cell in zip(getattr(code, "co_freevars", ()), cells or (), strict=False):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
    return found


class PmapOver:
    """A `jax.pmap` wrapper's own settings: the size of the axis it maps for a call
    (`size`), and the same pmap over other devices (`over`, as `jax.pmap(f, devices=...)`
    makes it)."""

    def __init__(self, fun: Any, settings: dict[str, Any], out_axes: Any) -> None:
        self.fun, self.settings, self.out_axes = fun, settings, out_axes
        static = self.static = tuple(sorted(settings["static_broadcasted_tuple"]))
        # `jax.pmap` counts donated arguments among the dynamic ones: back to positions.
        positions = (i for i in range(len(static) + max(settings["donate_tuple"], default=-1) + 1) if i not in static)
        dynamic = list(positions)
        self.donated = tuple(dynamic[j] for j in settings["donate_tuple"])

    def size(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """The size of the mapped axis for a call (`vmap`'s rule for `in_axes`, which
        `jax.pmap` shares), or `axis_size` where the wrapper was given one."""
        given = self.settings["axis_size"]
        if given is not None:
            return int(given)
        in_axes = self.settings["in_axes"]
        in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
        dynamic = [i for i in range(len(args)) if i not in self.static]
        if self.static and isinstance(in_axes, tuple):
            in_axes = tuple(in_axes[i] for i in dynamic)
        mapped = jax.vmap(lambda *a, **k: jax.numpy.zeros((), np.int8), in_axes=in_axes)
        return int(jax.eval_shape(mapped, *(args[i] for i in dynamic), **kwargs).shape[0])

    def over(self, devices: Any) -> Any:
        """The same pmap over `devices` (the first of them its mapped axis takes)."""
        s = self.settings
        return jax.pmap(
            self.fun,
            s["axis_name"],
            in_axes=s["in_axes"],
            out_axes=self.out_axes,
            static_broadcasted_argnums=self.static,
            devices=tuple(devices),
            axis_size=s["axis_size"],
            donate_argnums=self.donated,
        )


def pmap_over(core: Any) -> PmapOver | None:
    """`core`'s settings where it is a `jax.pmap` wrapper built over `shard_map` (jax 0.8+)
    that names them as `_PMAP_SETTINGS` says, else None."""
    infer = _closure(getattr(core, "lower", None)).get("infer_params")
    settings = _closure(infer)
    if not all(name in settings for name in _PMAP_SETTINGS):
        return None
    if "out_axes" in settings:
        out_axes = settings["out_axes"]
    elif "out_axes_flat" in settings and "out_axes_tree" in settings:
        out_axes = jax.tree_util.tree_unflatten(settings["out_axes_tree"], list(settings["out_axes_flat"]))
    else:
        return None
    wrapped = settings.get("wrapped_fun", settings.get("fun"))  # a `linear_util.WrappedFun` of it
    fun = settings.get("f", getattr(core, "__wrapped__", getattr(wrapped, "f", None)))
    return PmapOver(fun, settings, out_axes) if callable(fun) else None
