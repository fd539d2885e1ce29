"""Compiling for a named accelerator this machine does not have (`ts.cost(...,
target=NAME)`): the call's leaves placed on a mesh of the target topology's devices
(`place`), and the lowered program compiled by the target's own compiler in this process
(`compile_for`), read as `_cost` reads any compiled program (`Targeted`).

A deviceless compile gives an empty buffer assignment, and XLA:GPU no cost analysis: the
FLOPs are XLA's HLO cost analysis of the GPU-optimized module (`_compat`), and the buffer
assignment is the one the target's compiler writes when asked to dump that compile (the
optimized module as an `xla.HloProto`, whose field 3 is the `BufferAssignmentProto`; XLA:GPU
and libtpu both write it).
"""

import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np

from .. import _compat
from .._leaf import ARRAY, SDS, kind_of
from . import _target
from ._hlo import fields


class OutOfMemory(ValueError):
    """The target's compiler refused the program for want of memory (libtpu does): it does
    not fit there. `largest_fit` takes it as a size that does not fit."""


class Placed:
    """The call's leaves on the target's devices, and how they were placed."""

    def __init__(self, values: list[Any], mesh: Any, target: _target.Target, count: int) -> None:
        self.values, self.mesh, self.target, self.count = values, mesh, target, count

    @property
    def backend(self) -> str:
        return f"{self.target.label} x{self.count} (deviceless)"


def _mesh_of(x: Any) -> Any:
    sharding = getattr(x, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return mesh if isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)) else None


def place(values: list[Any], abstract: list[bool], path_of: Callable[[int], str], name: str, who: str) -> Placed:
    """Every array leaf as a `ShapeDtypeStruct` on the target's devices: over a mesh of the
    target topology with the inputs' mesh axes (names, sizes, types) and each leaf's
    partition spec, or on one device for unsharded inputs (`path_of(i)` names leaf `i` as the
    user passed it). Errors before anything compiles."""
    target, shape = _target.resolve(name, who)
    _target.check_installed(target, who)
    if not _compat.at_top_level():
        raise ValueError(
            f"treeshape.{who}: target= compiles the program for another machine, at top level only; call it "
            "outside jit, vmap, grad, loops and shard_map."
        )
    arrays = [i for i, x in enumerate(values) if abstract[i] and kind_of(type(x)) in (ARRAY, SDS)]
    meshes = [(i, m) for i in arrays if (m := _mesh_of(values[i])) is not None and m.size > 1]
    first = meshes[0] if meshes else None
    for i, m in meshes[1:]:
        if (m.axis_names, m.axis_sizes) != (first[1].axis_names, first[1].axis_sizes):  # type: ignore[index]
            raise ValueError(
                f"treeshape.{who}: {path_of(first[0])} is sharded over a mesh of axes "  # type: ignore[index]
                f"{_axes(first[1])} and {path_of(i)} over {_axes(m)}; a program is compiled "  # type: ignore[index]
                "for one mesh. Shard every input over the same mesh."
            )
    count = 1 if first is None else first[1].size
    where = "the program's inputs" if first is None else path_of(first[0])
    topology = _target.topology(target, shape, count, where, who)
    devices = _target.devices(target.name, topology)
    if len(devices) != count:
        raise ValueError(
            f"treeshape.{who}: target {target.name!r} topology {topology} has {len(devices)} devices, and {where} "
            f"is sharded over {count}. Give a mesh whose axis sizes multiply to {len(devices)}."
        )
    out = list(values)
    if first is None:
        single = jax.sharding.SingleDeviceSharding(devices[0])
        for i in arrays:
            out[i] = jax.ShapeDtypeStruct(values[i].shape, values[i].dtype, sharding=single)
        return Placed(out, None, target, 1)
    source = first[1]
    mesh = jax.sharding.Mesh(
        np.array(devices, dtype=object).reshape(source.axis_sizes),
        source.axis_names,
        axis_types=source.axis_types,
    )
    for i in arrays:
        x, m = values[i], _mesh_of(values[i])
        spec = x.sharding.spec if m is not None and m.size > 1 else jax.sharding.PartitionSpec()
        out[i] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.NamedSharding(mesh, spec))
    return Placed(out, mesh, target, count)


def _axes(mesh: Any) -> str:
    return "(" + ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True)) + ")"


# The dump of the optimized module with its buffer assignment, as an `xla.HloProto`, by platform.
_DUMP_SUFFIX: Final = {"cuda": "gpu_after_optimizations.hlo.pb", "tpu": ".after_optimizations.hlo.pb"}
_HLO_PROTO_BUFFER_ASSIGNMENT: Final = 3
_HBM_OOM: Final = re.compile(r"RESOURCE_EXHAUSTED: .*(out of memory|exceeds available HBM)", re.IGNORECASE | re.DOTALL)


def compile_for(lowered: Any, placed: Placed) -> "Targeted":
    """Compile a lowered program with the target's own compiler; an `OutOfMemory` where
    that compiler refuses it for want of memory."""
    with tempfile.TemporaryDirectory(prefix="treeshape-target-") as dump:
        options = {"xla_dump_to": dump, "xla_dump_hlo_as_proto": True}
        if placed.target.platform == "tpu":
            options["xla_dump_hlo_as_text"] = True  # (which also writes libtpu's live ranges)
        try:
            compiled = lowered.compile(compiler_options=options)
        except Exception as e:
            if _HBM_OOM.search(str(e)) is None:
                raise
            raise OutOfMemory(
                f"treeshape: the program does not fit on {placed.backend.replace(' (deviceless)', '')}: "
                f"{placed.target.label}'s compiler refuses it ({_reason(e)}). Shard it over more devices, donate "
                "buffers (donate_argnums) or shrink it."
            ) from None
        assignment, live_ranges = None, None
        for path in sorted(Path(dump).glob(f"*{_DUMP_SUFFIX[placed.target.platform]}")):
            message = fields(path.read_bytes())
            parts = message.get(_HLO_PROTO_BUFFER_ASSIGNMENT)
            assignment = bytes(parts[-1]) if parts else None
            ranges = path.with_name(path.name.removesuffix(".hlo.pb") + "-live-range.txt")
            # libtpu's schedule also runs the insides of its asynchronous slices as steps (1,220
            # of them in the fit guide's 124M step), which XLA's rules over the module skip: its
            # own live ranges are read. XLA:GPU's follow those rules, as the CPU's do.
            live_ranges = ranges.read_text() if placed.target.platform == "tpu" and ranges.exists() else None
    if placed.target.platform == "tpu" and live_ranges is None:
        assignment = None  # a libtpu that writes no live ranges: no buffers, rather than guessed ones
    return Targeted(compiled, assignment, live_ranges)


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    # libtpu 0.0.42 ("... exceeds available HBM (15.75G)"), 0.0.24 ("Used 16.00G of 15.75G hbm")
    match = re.search(r"Ran out of memory.*?(available HBM \([^)]*\)|Used \S+ of \S+ hbm)", text)
    return match.group(0) if match else text[:200]


class Targeted:
    """A deviceless `jax.stages.Compiled`, read as `_compat` reads any: with the buffer
    assignment from XLA's dump, and on NVIDIA the cost analysis of the optimized module."""

    def __init__(self, compiled: Any, assignment: bytes | None, live_ranges: str | None = None) -> None:
        self._compiled, self._assignment, self._live_ranges = compiled, assignment, live_ranges

    def __getattr__(self, name: str) -> Any:  # input_shardings, runtime_executable, _executable, ...
        return getattr(self._compiled, name)

    def cost_analysis(self) -> dict[str, Any]:
        return _compat.program_cost_analysis(self._compiled)

    def memory_analysis(self) -> Any:
        stats = self._compiled.memory_analysis()
        if self._assignment is None:
            return stats
        return _WithAssignment(stats, self._assignment, self._live_ranges)


class _WithAssignment:
    def __init__(self, stats: Any, assignment: bytes, live_ranges: str | None) -> None:
        self._stats, self.serialized_buffer_assignment_proto, self.live_ranges = stats, assignment, live_ranges

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stats, name)


def budget(target: _target.Target, variable: str | None) -> tuple[int, str]:
    """The memory JAX lets XLA use on one device of the target, and how it was found: on
    NVIDIA the fraction JAX preallocates (`XLA_PYTHON_CLIENT_MEM_FRACTION`, else 0.75), on
    TPU all of it."""
    if target.platform == "tpu":
        return target.device_bytes, f"the memory libtpu lets one program use on a {target.label}"
    fraction, said = 0.75, "JAX's default preallocation, 75%"
    if variable is not None and variable.strip():
        try:
            fraction = float(variable)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ValueError(
                f"treeshape.largest_fit: XLA_PYTHON_CLIENT_MEM_FRACTION={variable!r} is not a fraction in (0, 1]; "
                "set it as JAX reads it (e.g. 0.9), or unset it for JAX's default (0.75)."
            )
        said = f"XLA_PYTHON_CLIENT_MEM_FRACTION={variable.strip()}"
    return math.floor(fraction * target.device_bytes), f"{said} of the {target.label}'s {target.device_bytes:,} B"
