"""Compiling for a named accelerator this machine does not have (`ts.cost(...,
target=NAME)`): the call's leaves placed on a mesh of the target topology's devices
(`place`), and the lowered program compiled by the target's own compiler in this process
(`compile_for`), read as `_cost` reads any compiled program (`Targeted`).

A step that names this process's devices itself (`jax.shard_map(..., mesh=mesh)`,
`with_sharding_constraint` or `reshard` onto a `NamedSharding` of a `jax.make_mesh`
mesh, a `jax.pmap`, a shard_map over this process's first devices) is traced here as
`ts.cost` without a target traces it, and its jaxpr moved onto the target's devices
(`moved`, `_Moved`): each device of this process it names becomes the target's device of
the same position (by id), so each mesh keeps its axis names, sizes, types and device
order, and every abstract mesh (in types, parameters and each equation's context) takes
the target's device kind. JAX lowers a sharding from its mesh's axes and the program's
device assignment alone, so the moved program is the one the step written over the
target's own mesh traces to; it is replayed (`jax.core.eval_jaxpr`) under `jax.jit` on
the target's devices. Rewriting the lowered StableHLO instead would follow how each
release spells meshes and device ids there; `jax.export`, which lowers for other devices
publicly, refuses host callbacks and hides the loops that `_loops` reads from the jaxpr.

A deviceless compile gives an empty buffer assignment, and XLA:GPU no cost analysis: the
FLOPs are XLA's HLO cost analysis of the GPU-optimized module (`_compat`), and the buffer
assignment is the one the target's compiler writes when asked to dump that compile (the
optimized module as an `xla.HloProto`, whose field 3 is the `BufferAssignmentProto`; XLA:GPU
and libtpu both write it).
"""

import math
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np
from jax.extend import core as jcore
from jax.sharding import AbstractMesh, Mesh, NamedSharding, SingleDeviceSharding

from .. import _compat, _quiet
from .._leaf import ARRAY, SDS, kind_of, leaf_str
from . import _target
from ._hlo import fields


class OutOfMemory(ValueError):
    """The target's compiler refused the program for want of memory (libtpu does): it does
    not fit there. `largest_fit` takes it as a size that does not fit."""


class Refused(ValueError, jax.errors.JaxRuntimeError):  # type: ignore[misc]
    """The target's compiler refused the program for another reason than memory (libtpu
    has no complex128 FFT). Also a `JaxRuntimeError`, as JAX raised it: `largest_fit`
    judges a size its compiler fails on as it judges JAX's compiler errors."""

    def __init__(self, message: str) -> None:
        jax.errors.JaxRuntimeError.__init__(self, message)  # (whose `str` reads what its own init sets)


class Placed:
    """The call's leaves on the target's devices, and how they were placed: `device`, the
    target's first, is JAX's default device while the program is traced and lowered, so
    that a program none of whose inputs places it (an init with no array argument, a step
    whose arguments JAX drops as unused) is compiled for the target too, not for the
    default backend, this process's CPU."""

    def __init__(self, values: list[Any], mesh: Any, target: _target.Target, count: int, device: Any) -> None:
        self.values, self.mesh, self.target, self.count = values, mesh, target, count
        self.device = device

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
    partition spec, else with the axes of the `jax.set_mesh` mesh (its leaves placed as
    JAX places them under it), or on one device (`path_of(i)` names leaf `i` as the user
    passed it). Errors before anything compiles."""
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
    for i, m in meshes:
        _check_divides(values[i], m, path_of(i), who)
    # The `jax.set_mesh` mesh stands in for the inputs' where they name none (or one of as many devices).
    context = _compat.current_mesh()
    if context.empty or context.size == 1 or (first is not None and first[1].size != context.size):
        context = None
    source = first[1] if first is not None else context
    count = 1 if source is None else source.size
    where = path_of(first[0]) if first is not None else "the jax.set_mesh mesh" if context is not None else None
    topology = _target.topology(target, shape, count, where or "the program's inputs", who)
    devices = _target.devices(target.name, topology)
    if len(devices) != count:
        raise _target.CountError(
            f"treeshape.{who}: target {target.name!r} topology {topology} has {len(devices)} devices, and {where} "
            f"is sharded over {count}. Give a mesh whose axis sizes multiply to {len(devices)}."
        )
    out = list(values)
    if source is None:
        for i in arrays:
            single = jax.sharding.SingleDeviceSharding(devices[0], memory_kind=host_kind(values[i]))
            out[i] = jax.ShapeDtypeStruct(values[i].shape, values[i].dtype, sharding=single)
        return Placed(out, None, target, 1, devices[0])
    mesh = _on_devices(source, devices)
    for i in arrays:
        x, m, kind = values[i], _mesh_of(values[i]), host_kind(values[i])
        if first is None and kind is None:  # unsharded, under the `jax.set_mesh` mesh: placed as JAX places it there
            out[i] = jax.ShapeDtypeStruct(x.shape, x.dtype)
            continue
        spec = x.sharding.spec if m is not None and m.size > 1 else jax.sharding.PartitionSpec()
        sharding = jax.sharding.NamedSharding(mesh, spec, memory_kind=kind)
        out[i] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    return Placed(out, mesh if context is None else _on_devices(context, devices), target, count, devices[0])


def host_kind(x: Any) -> str | None:
    """The host memory kind `x`'s sharding places it in (`pinned_host`, `unpinned_host`),
    which its place on the target keeps; None for the device's memory."""
    kind = getattr(getattr(x, "sharding", None), "memory_kind", None)
    return kind if kind in ("pinned_host", "unpinned_host") else None


def _check_divides(x: Any, mesh: Any, where: str, who: str) -> None:
    """A `ValueError` naming the input where its mesh axes do not divide a dimension they
    split (JAX's `IndivisibleError` once placed)."""
    spec = _compat.spec_entries(x.sharding.spec)
    for d, entry in enumerate(spec[: len(x.shape)]):
        names = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
        ways = math.prod(mesh.shape[n] for n in names if n in mesh.shape)  # (not P.UNCONSTRAINED)
        if x.shape[d] % ways:
            raise ValueError(
                f"treeshape.{who}: the sharding of {where} ({leaf_str(x)}, {_compat.spec_text(x.sharding.spec)}) does "
                f"not fit it: dimension {d} (size {x.shape[d]}) would be split {ways} ways over mesh axes {names}, "
                "which does not divide it (JAX's IndivisibleError). Give it a size those axes divide, or another "
                "PartitionSpec."
            )


def _on_devices(mesh: Any, devices: Sequence[Any]) -> Any:
    """A concrete mesh of `devices` (in order) with `mesh`'s axes: names, sizes, types."""
    grid = np.array(devices, dtype=object).reshape(mesh.axis_sizes)
    return jax.sharding.Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types)


# -- a step that names this process's devices itself -------------------------------
# How to write a step whose every mesh the target gives: the spelling that always moves.
OVER_INPUTS: Final = (
    "Write the step over its inputs' mesh instead: shard the inputs (over an AbstractMesh, for any device count) "
    "and, in the step, call jax.shard_map without mesh= and give with_sharding_constraint and reshard "
    "PartitionSpecs: they take the mesh the target gives the inputs."
)
# The host callbacks, by primitive, as the user calls them.
_CALLBACKS: Final = {
    "debug_print": "jax.debug.print",
    "debug_callback": "jax.debug.callback",
    "pure_callback": "jax.pure_callback",
    "io_callback": "jax.experimental.io_callback",
}


def _eqns(jaxpr: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """Every equation of `jaxpr` and of the jaxprs in its parameters; each jaxpr once."""
    seen = set() if seen is None else seen
    if id(jaxpr) in seen:
        return
    seen.add(id(jaxpr))
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, (jcore.ClosedJaxpr, jcore.Jaxpr)):
                    yield from _eqns(getattr(item, "jaxpr", item), seen)


def _params(jaxpr: Any) -> Iterator[tuple[str, Any]]:
    """Every (primitive name, parameter value) of the program, a tuple's items one by one."""
    for eqn in _eqns(jaxpr):
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                yield eqn.primitive.name, item


def _callbacks(jaxpr: Any) -> list[str]:
    """The host callbacks of a program (`jax.debug.print`, ...), as the user calls them."""
    return sorted({_CALLBACKS[eqn.primitive.name] for eqn in _eqns(jaxpr) if eqn.primitive.name in _CALLBACKS})


class _Named:
    """What a traced program names of this process's devices: the devices (by id), and
    each mesh or sharding by the primitive that holds it; `moves` where any is there;
    `count`, the devices it runs on."""

    def __init__(self, jaxpr: Any, inputs: Sequence[Any], context: Any) -> None:
        self.devices: dict[int, Any] = {}
        self.meshes: list[tuple[str, Any]] = []  # (who names it, a concrete mesh)
        self.foreign: list[tuple[str, Any]] = []  # shardings that cannot be moved
        self.moves = False
        self.abstract: Any = None  # the inputs' abstract mesh (of more devices than this process has)
        for x in inputs:
            sharding = getattr(x, "sharding", None)
            if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
                self._mesh("an input's mesh", sharding.mesh)
            elif isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
                self.abstract = self.abstract or sharding.mesh
        if context is not None and not context.empty:
            self._mesh("the jax.set_mesh mesh", context)
        for who, value in _params(jaxpr):
            if isinstance(value, NamedSharding):
                value = value.mesh
            if isinstance(value, (Mesh, AbstractMesh)) and not value.empty:
                self.moves = True
                if isinstance(value, Mesh):
                    self._mesh(f"the mesh of the step's {who}", value)
            elif isinstance(value, SingleDeviceSharding):
                self.moves = True
                self._devices(value.device_set)
            elif isinstance(value, jax.sharding.Sharding):
                self.foreign.append((who, value))
            elif isinstance(value, jax.Device):
                self.moves = True
                self.devices[value.id] = value

    @property
    def count(self) -> int:
        return len(self.devices) or (1 if self.abstract is None else self.abstract.size)

    def _mesh(self, who: str, mesh: Any) -> None:
        self.meshes.append((who, mesh))
        self._devices(mesh.devices.flat)

    def _devices(self, devices: Iterable[Any]) -> None:
        self.devices.update((d.id, d) for d in devices)

    def problem(self) -> str | None:
        """Why the program cannot be moved onto one set of the target's devices, or None."""
        if self.foreign:
            who, sharding = self.foreign[0]
            return f"{who} is a {type(sharding).__name__}, which names devices otherwise than a mesh does"
        for who, mesh in self.meshes[1:]:
            first_who, first = self.meshes[0]
            if _ids(mesh) != _ids(first):
                return (
                    f"{first_who} is over devices {sorted(_ids(first))} and {who} over {sorted(_ids(mesh))}: a "
                    "program runs on one set of devices"
                )
        return None


def _ids(mesh: Any) -> set[int]:
    return {d.id for d in mesh.devices.flat}


class _Moved:
    """A traced program's meshes, shardings and devices, and the types, parameters and
    equation contexts that hold them, on the target's devices: this process's device of
    position `i` (by id) becomes `devices[i]`, an abstract mesh takes the target's device
    kind. Each jaxpr is rewritten once (a body shared by several equations stays shared)."""

    def __init__(self, ours: Sequence[Any], devices: Sequence[Any]) -> None:
        self.device = {d.id: t for d, t in zip(ours, devices, strict=False)}
        self.abstract_device = Mesh(np.array(devices[:1], dtype=object), ("_",)).abstract_mesh.abstract_device
        self._meshes: dict[int, Any] = {}
        self._jaxprs: dict[int, Any] = {}

    def mesh(self, mesh: Any) -> Any:
        if isinstance(mesh, Mesh) and not mesh.empty:
            if id(mesh) not in self._meshes:
                grid = np.vectorize(lambda d: self.device[d.id], otypes=[object])(mesh.devices)
                self._meshes[id(mesh)] = Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types)
            return self._meshes[id(mesh)]
        if isinstance(mesh, AbstractMesh) and not mesh.empty and mesh.abstract_device != self.abstract_device:
            return mesh.update(abstract_device=self.abstract_device)
        return mesh

    def value(self, value: Any) -> Any:
        """A parameter's value moved: meshes, shardings, devices, jaxprs, tuples of them."""
        if isinstance(value, (Mesh, AbstractMesh)):
            return self.mesh(value)
        if isinstance(value, NamedSharding):
            mesh = self.mesh(value.mesh)
            return value if mesh is value.mesh else value.update(mesh=mesh)
        if isinstance(value, SingleDeviceSharding):
            (device,) = list[Any](value.device_set)
            return SingleDeviceSharding(self.device[device.id], memory_kind=value.memory_kind)
        if isinstance(value, jax.Device):
            return self.device[value.id]
        if isinstance(value, (tuple, list)):
            return type(value)(self.value(v) for v in value)
        if isinstance(value, jcore.ClosedJaxpr):
            return value.replace(jaxpr=self.jaxpr(value.jaxpr))
        if isinstance(value, jcore.Jaxpr):
            return self.jaxpr(value)
        return value

    def aval(self, aval: Any) -> Any:
        sharding = getattr(aval, "sharding", None)
        if isinstance(aval, jax.core.ShapedArray) and isinstance(sharding, NamedSharding):
            moved = self.value(sharding)
            return aval if moved is sharding else aval.update(sharding=moved)
        return aval

    def jaxpr(self, jaxpr: Any) -> Any:
        if id(jaxpr) in self._jaxprs:
            return self._jaxprs[id(jaxpr)][1]
        variables: dict[Any, Any] = {}

        def var(v: Any) -> Any:
            if isinstance(v, jcore.Literal):
                return jcore.Literal(v.val, self.aval(v.aval))
            if v not in variables:
                aval = self.aval(v.aval)
                if aval is v.aval:
                    variables[v] = v
                elif type(v) is jcore.Var:
                    variables[v] = jcore.Var(aval, v.initial_qdd, v.final_qdd)
                else:  # a `DropVar` (not in jax.extend.core before 0.10), which takes its type alone
                    variables[v] = type(v)(aval)
            return variables[v]

        constvars, invars = [var(v) for v in jaxpr.constvars], [var(v) for v in jaxpr.invars]
        eqns = []
        for eqn in jaxpr.eqns:
            ins = [var(v) for v in eqn.invars]
            params = {name: self.value(p) for name, p in eqn.params.items()}
            outs = [var(v) for v in eqn.outvars]
            context = _compat.with_context_mesh(eqn.ctx, self.mesh(_compat.context_mesh(eqn.ctx)))
            effects = {_moved_effect(e, variables) for e in eqn.effects}
            eqns.append(eqn.replace(invars=ins, outvars=outs, params=params, ctx=context, effects=effects))
        moved = jaxpr.replace(
            constvars=constvars,
            invars=invars,
            outvars=[var(v) for v in jaxpr.outvars],
            eqns=eqns,
            debug_info=jaxpr.debug_info,
        )
        self._jaxprs[id(jaxpr)] = (jaxpr, moved)  # (the original kept alive: its id stays its own)
        return moved


def _moved_effect(effect: Any, variables: dict[Any, Any]) -> Any:
    """An effect on an input (a mutable array's), on the input's moved variable."""
    held = getattr(effect, "input", None)
    return effect.replace(input=variables[held]) if isinstance(held, jcore.Var) and held in variables else effect


def moved(closed: Any, inputs: list[Any], context: Any, name: str, who: str) -> tuple[Any, Placed] | None:
    """A program traced on this process's devices (`closed`, its flat `inputs`, traced under
    the concrete mesh `context` or none) moved onto the target's (`_Moved`): the moved
    jaxpr, and its inputs, mesh to trace under and devices as `Placed`; None where the
    program names no mesh, sharding or device of its own. A `ValueError` for what cannot
    move, before anything compiles."""
    target, shape = _target.resolve(name, who)
    held = _callbacks(closed.jaxpr)
    if held and not target.chip.compiler.host_callbacks:
        raise ValueError(
            f"treeshape.{who}: target {name!r}: the step holds a host callback ({', '.join(held)}), which JAX "
            "compiles for a GPU only where that GPU's backend started, never deviceless. Cost the step without it "
            '(a TPU target, e.g. target="v5e", compiles it as it is).'
        )
    named = _Named(closed.jaxpr, inputs, context)
    if not named.moves:
        return None
    problem = named.problem()
    if problem is not None:
        raise ValueError(
            f"treeshape.{who}: target {name!r}: the step cannot be moved onto its devices: {problem}. {OVER_INPUTS}"
        )
    ours, count = [named.devices[i] for i in sorted(named.devices)], named.count
    where = next((w for w, m in named.meshes if m.size == count), "the program's inputs")
    devices = _target.devices(target.name, _target.topology(target, shape, count, where, who))
    move = _Moved(ours, devices)
    single = jax.sharding.SingleDeviceSharding(devices[0])
    flat = list(inputs)
    for i, x in enumerate(inputs):
        if kind_of(type(x)) not in (ARRAY, SDS):
            continue
        mesh = _mesh_of(x)
        if isinstance(mesh, jax.sharding.Mesh):
            sharding = move.value(x.sharding)
        elif mesh is not None and not mesh.empty:  # an abstract mesh of more devices than this process has
            sharding = jax.sharding.NamedSharding(_on_devices(mesh, devices), x.sharding.spec, memory_kind=host_kind(x))
        elif host_kind(x) is not None:
            sharding = jax.sharding.SingleDeviceSharding(devices[0], memory_kind=host_kind(x))
        else:
            sharding = single if count == 1 else None
        flat[i] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False))
    mesh = None if context is None or context.empty else move.mesh(context)
    return move.value(closed), Placed(flat, mesh, target, count, devices[0])


def _axes(mesh: Any) -> str:
    return "(" + ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True)) + ")"


_HLO_PROTO_MODULE: Final = 1
_HLO_PROTO_BUFFER_ASSIGNMENT: Final = 3
_HBM_OOM: Final = re.compile(r"RESOURCE_EXHAUSTED: .*(out of memory|exceeds available HBM)", re.IGNORECASE | re.DOTALL)


def compile_for(lowered: Any, placed: Placed) -> "Targeted":
    """Compile a lowered program with the target's own compiler; an `OutOfMemory` where
    that compiler refuses it for want of memory."""
    with tempfile.TemporaryDirectory(prefix="treeshape-target-") as dump:
        # As text too: libtpu's live ranges, and the optimized module whose kernels `_time` reads.
        options = {"xla_dump_to": dump, "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}
        try:
            with _quiet.quiet():  # (XLA's log lines from inside the compiler)
                compiled = lowered.compile(compiler_options=options)
        except jax.errors.JaxRuntimeError as e:
            if _HBM_OOM.search(str(e)) is None:
                raise Refused(
                    f"treeshape: target {placed.target.name!r}: {placed.target.label}'s compiler refuses the program: "
                    f"{_compiler_reason(e)}. The program compiles for this process's CPU; change what the compiler "
                    f"names for one the {placed.target.label} has (another dtype or operation)."
                ) from None
            raise OutOfMemory(
                f"treeshape: the program does not fit on {placed.backend.replace(' (deviceless)', '')}: "
                f"{placed.target.label}'s compiler refuses it ({_reason(e)}). Shard it over more devices, donate "
                "buffers (donate_argnums) or shrink it."
            ) from None
        assignment, live_ranges = None, None
        compiler = placed.target.chip.compiler
        # (the dump of the optimized module with its buffer assignment, as an `xla.HloProto`)
        for path in sorted(Path(dump).glob(f"*{compiler.dump}")):
            message = fields(path.read_bytes())
            parts = message.get(_HLO_PROTO_BUFFER_ASSIGNMENT)
            assignment = bytes(parts[-1]) if parts else None
            ranges = path.with_name(path.name.removesuffix(".hlo.pb") + "-live-range.txt")
            # libtpu's schedule also runs the insides of its asynchronous slices as steps (1,220
            # of them in the fit guide's 124M step), which XLA's rules over the module skip: its
            # own live ranges are read. XLA:GPU's follow those rules, as the CPU's do.
            live_ranges = ranges.read_text() if compiler.live_ranges and ranges.exists() else None
        kernels = _dumped_kernels(Path(dump), compiler.kernels)
    if compiler.live_ranges and live_ranges is None:
        assignment = None  # a libtpu that writes no live ranges: no buffers, rather than guessed ones
    return Targeted(compiled, assignment, live_ranges, kernels)


def _dumped_kernels(dump: Path, suffix: str) -> tuple[str, bytes] | None:
    """The text and the `HloModuleProto` of the module whose kernels run, from a dump: the
    files whose names end in `suffix` (`Compiler.kernels`: libtpu's module after code
    generation, each kernel with its `estimated_cycles`; XLA:GPU's optimized one)."""
    texts = sorted(dump.glob(f"*{suffix}.txt"))
    protos = sorted(dump.glob(f"*{suffix}.hlo.pb"))
    if not texts or not protos:
        return None
    module = fields(protos[-1].read_bytes()).get(_HLO_PROTO_MODULE)
    return (texts[-1].read_text(), bytes(module[-1])) if module else None


def _compiler_reason(e: BaseException) -> str:
    """The compiler's own words: its first line, less XLA's context prefix."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return re.sub(r"during context \[[^]]*\]: ", "", lines[0] if lines else type(e).__name__).rstrip(".")


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    # libtpu 0.0.42 ("... exceeds available HBM (15.75G)"), 0.0.24 ("Used 16.00G of 15.75G hbm")
    match = re.search(r"Ran out of memory.*?(available HBM \([^)]*\)|Used \S+ of \S+ hbm)", text)
    return match.group(0) if match else text[:200]


class Targeted:
    """A deviceless `jax.stages.Compiled`, read as `_compat` reads any: with the buffer
    assignment from XLA's dump, and on NVIDIA the cost analysis of the optimized module."""

    def __init__(
        self,
        compiled: Any,
        assignment: bytes | None,
        live_ranges: str | None = None,
        kernels: tuple[str, bytes] | None = None,
    ) -> None:
        self._compiled, self._assignment, self._live_ranges = compiled, assignment, live_ranges
        self.kernels = kernels  # the dumped module whose kernels run: its text and HloModuleProto

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
