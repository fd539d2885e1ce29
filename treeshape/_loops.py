"""How often each loop body of a traced program runs, and what XLA's cost analysis misses
by counting every loop body once (`ts.cost`'s loop correction).

XLA's cost analysis counts a `while` body once, whatever its trip count, so a 50-step
`lax.scan` reports the FLOPs of one step. This module walks the program's `ClosedJaxpr`
(into `pjit`, `checkpoint`, `custom_jvp` / `custom_vjp`, `cond` branches, `shard_map` and
loop bodies), finds each loop's trip count where the compiled program knows it (a `scan`'s
`length`; a `while` whose condition compares a counter stepped by a constant with a
constant bound, as `fori_loop` with array bounds and a hand-written counted loop make),
compiles each loop body alone for its abstract inputs (inside a `shard_map` over the same
mesh where it sits in one; on the program's mesh where all its axes are Explicit), and
returns `sum(runs_not_counted * body_cost)`, for `ts.cost` to add to XLA's figures. A body
nested in a loop is counted for every run of its enclosing loops. A loop in a `cond`
branch is counted as XLA counts a conditional: the most costly branch. A scan that XLA
partitions across devices as it sees fit (`Auto` mesh axes) has a cost per device only
inside the program: the program is compiled once more with that scan unrolled twice, and
the difference is one run of its body.

Where a trip count is not known when compiling, or a body cannot be compiled alone, that
body stays counted once and the correction says it is not exact.
"""

import contextlib
import dataclasses
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _compat


@dataclasses.dataclass(frozen=True)
class LoopCorrection:
    """What to add to XLA's `flops` and `bytes accessed` so each loop body counts as often as
    it runs, and whether every loop's count was known (`exact`)."""

    flops: float = 0.0
    bytes_accessed: float = 0.0
    exact: bool = True


NO_LOOPS: Final = LoopCorrection()


# -- where a body runs -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Manual:
    """The `shard_map` a body sits in: its mesh, the manual axes, and whether it checks vma."""

    mesh: Any
    axes: frozenset[str]
    check_vma: bool


@dataclasses.dataclass(frozen=True)
class _Body:
    """One loop body, and how many more times it runs than XLA counts it."""

    jaxpr: jex.ClosedJaxpr
    extra_runs: int
    manual: _Manual | None
    scan: tuple[int, int, int] | None  # a scan's (consts, carries, length)
    mesh: Any = None  # the mesh of a body whose values all have Explicit shardings on it


@dataclasses.dataclass(frozen=True)
class _Branches:
    """The loops of each branch of a `cond`, of which XLA counts the most costly."""

    branches: tuple[list["_Term"], ...]


_Term = _Body | _Branches


@dataclasses.dataclass
class _Walk:
    """What walking a program found: its loop terms, and whether every count is known."""

    multi_device: bool
    mesh: Any  # the program's mesh, where its inputs or outputs are on one
    exact: bool = True
    depth: int = 0  # how many loops or conditionals hold the equations being walked
    # Scans that XLA partitions, outside any loop: (equation, extra runs, length % 2).
    partitioned: list[tuple[Any, int, int]] = dataclasses.field(default_factory=list)

    def terms(self, jaxpr: jex.Jaxpr, known: dict[Any, int], runs: int, manual: _Manual | None) -> list[_Term]:
        """The loop terms of `jaxpr`, run `runs` times, with the scalar values `known`."""
        found: list[_Term] = []
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name == "scan":
                found += self._scan(eqn, known, runs, manual)
            elif name == "while":
                found += self._while(eqn, known, runs, manual)
            elif name == "cond":
                self.depth += 1
                branches = tuple(self.terms(b.jaxpr, _consts(b), runs, manual) for b in eqn.params["branches"])
                self.depth -= 1
                if any(branches):
                    found.append(_Branches(branches))
            elif name not in _OPAQUE:
                inner = _shard_map_context(eqn, manual) if name == "shard_map" else manual
                for sub in _sub_jaxprs(eqn):
                    found += self.terms(sub.jaxpr, _passed(eqn, sub, known), runs, inner)
            _propagate(eqn, known)
        return found

    def _loop(
        self,
        body: jex.ClosedJaxpr,
        trips: int | None,
        counted: int,
        runs: int,
        manual: _Manual | None,
        scan: tuple[int, int, int] | None = None,
        eqn: Any = None,
    ) -> list[_Term]:
        mesh = None
        if manual is None and self.multi_device:
            if not _explicit(body, self.mesh):
                # A body XLA partitions across devices as it sees fit: its cost per device
                # is known only inside the program, from the program with the scan
                # unrolled twice (a scan outside other loops, without loops inside).
                if scan is not None and trips is not None and trips >= 2 and counted == 1 and self.depth == 0:
                    self.partitioned.append((eqn, runs * (trips - 1), trips % 2))
                    if holds_loops(body.jaxpr):
                        self.exact = False
                else:
                    self.exact = False
                return []
            mesh = self.mesh
        self.depth += 1
        try:
            if trips is None:
                self.exact = False
                return self.terms(body.jaxpr, _consts(body), runs, manual)
            found: list[_Term] = []
            if trips == 0:
                # XLA removes a scan that never runs (and counts nothing); whether it
                # removes such a `while` (or counts its body once) depends on the release.
                self.exact = self.exact and scan is not None
                return found
            if trips != counted and runs:
                found.append(_Body(body, runs * (trips - counted), manual, scan, mesh))
            return found + self.terms(body.jaxpr, _consts(body), runs * trips, manual)
        finally:
            self.depth -= 1

    def _scan(self, eqn: Any, known: dict[Any, int], runs: int, manual: _Manual | None) -> list[_Term]:
        length, unroll = int(eqn.params["length"]), eqn.params.get("unroll", 1)
        # JAX lowers a scan unrolled `u` times as a loop over `u` copies of the body plus the
        # `length % u` left over, and XLA counts each copy once.
        per_step = length if unroll is True or not unroll else min(max(int(unroll), 1), max(length, 1))
        counted = per_step + length % per_step if length else 0
        scan = (eqn.params["num_consts"], eqn.params["num_carry"], length)
        return self._loop(eqn.params["jaxpr"], length, counted, runs, manual, scan, eqn)

    def _while(self, eqn: Any, known: dict[Any, int], runs: int, manual: _Manual | None) -> list[_Term]:
        return self._loop(eqn.params["body_jaxpr"], _trip_count(eqn, known), 1, runs, manual)


# Equations whose jaxprs XLA does not see as HLO loops (a Pallas kernel is a custom call).
_OPAQUE: Final = frozenset({"pallas_call", "custom_call"})


def _explicit(body: jex.ClosedJaxpr, mesh: Any) -> bool:
    """Whether every value of `body` has an Explicit sharding on `mesh` (every axis of which
    is Explicit), so that the body compiled alone is partitioned as in the program."""
    if not isinstance(mesh, jax.sharding.Mesh):
        return False
    if any(t != jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return False
    for aval in (*body.in_avals, *body.out_avals):
        on = getattr(getattr(aval, "sharding", None), "mesh", None)
        if on is None or on.axis_names != mesh.axis_names or tuple(on.axis_sizes) != tuple(mesh.axis_sizes):
            return False
    return True


def holds_loops(jaxpr: jex.Jaxpr) -> bool:
    """Whether `jaxpr` runs a loop, at any depth (`cond` branches included)."""
    return any(
        eqn.primitive.name in ("scan", "while") or any(holds_loops(sub.jaxpr) for sub in _sub_jaxprs(eqn))
        for eqn in jaxpr.eqns
    )


def _consts(closed: jex.ClosedJaxpr) -> dict[Any, int]:
    """The integer scalars among a closed jaxpr's constants, by variable."""
    return {v: int(c) for v, c in zip(closed.jaxpr.constvars, closed.consts, strict=True) if _is_int_scalar(c)}


def _is_int_scalar(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, np.integer):
        return False
    return not isinstance(x, jax.core.Tracer)


def _value(atom: Any, known: dict[Any, int]) -> int | None:
    if isinstance(atom, jex.Literal):
        return int(atom.val) if _is_int_scalar(atom.val) else None
    return known.get(atom)


_ARITHMETIC: Final[dict[str, Callable[..., int]]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "neg": operator.neg,
    "max": max,
    "min": min,
    "convert_element_type": lambda x: x,
}


def _propagate(eqn: Any, known: dict[Any, int]) -> None:
    """Record the value of `eqn`'s output where it is integer arithmetic on known scalars
    (`fori_loop` converts its bounds; a bound may be computed from constants)."""
    op = _ARITHMETIC.get(eqn.primitive.name)
    if op is None or len(eqn.outvars) != 1:
        return
    out = eqn.outvars[0]
    aval = getattr(out, "aval", None)
    if getattr(aval, "shape", None) != () or not jnp.issubdtype(getattr(aval, "dtype", np.float32), np.integer):
        return
    values = [_value(a, known) for a in eqn.invars]
    if all(v is not None for v in values):
        known[out] = op(*values)


def _sub_jaxprs(eqn: Any) -> Iterator[jex.ClosedJaxpr]:
    """The jaxprs an equation runs once (`pjit`, `checkpoint`, `custom_jvp` / `custom_vjp`'s
    primal, `shard_map`, ...), each closed."""
    names: Sequence[str] = ("call_jaxpr",) if eqn.primitive.name.startswith("custom_") else tuple(eqn.params)
    for name in names:
        value = eqn.params.get(name)
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(sub, jex.ClosedJaxpr):
                yield sub
            elif isinstance(sub, jex.Jaxpr):
                yield jex.ClosedJaxpr(sub, ())


def _passed(eqn: Any, sub: jex.ClosedJaxpr, known: dict[Any, int]) -> dict[Any, int]:
    """The known scalars of `sub`: its constants, and its inputs where the equation passes
    them one to one (a loop bound given to a jitted helper)."""
    inner = _consts(sub)
    if len(sub.jaxpr.invars) == len(eqn.invars):
        for var, atom in zip(sub.jaxpr.invars, eqn.invars, strict=True):
            value = _value(atom, known)
            if value is not None:
                inner[var] = value
    return inner


def _shard_map_context(eqn: Any, outer: _Manual | None) -> _Manual:
    params = eqn.params
    axes = params.get("newly_manual_axes", params.get("manual_axes", params.get("axis_names", frozenset())))
    mesh = params["mesh"]
    check = bool(params.get("check_vma", params.get("check_rep", True)))
    if outer is not None:
        axes = frozenset(axes) | outer.axes
    return _Manual(mesh, frozenset(axes), check)


# -- trip counts of `while` loops -------------------------------------------------------
_FLIPPED: Final = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "ne": "ne"}


def _trip_count(eqn: Any, known: dict[Any, int]) -> int | None:
    """How often a `while` body runs, where its condition is `counter OP bound` (OP one of
    `<`, `<=`, `>`, `>=`, `!=`), the counter a carry that starts at a known integer and that
    the body steps by a known integer, and the bound a constant or a carry the body keeps."""
    params = eqn.params
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    init = eqn.invars[n_cond + n_body :]
    cond_known = _consts(cond)
    for var, atom in zip(cond.jaxpr.invars[:n_cond], eqn.invars[:n_cond], strict=True):
        value = _value(atom, known)
        if value is not None:
            cond_known[var] = value
    test = _defining(cond.jaxpr, cond.jaxpr.outvars[0])
    if test is None or test.primitive.name not in _FLIPPED:
        return None
    carries = cond.jaxpr.invars[n_cond:]

    def carry_index(atom: Any) -> int | None:
        return carries.index(atom) if not isinstance(atom, jex.Literal) and atom in carries else None

    body_known = _consts(body)
    for var, atom in zip(body.jaxpr.invars[:n_body], eqn.invars[:n_body], strict=True):
        value = _value(atom, known)
        if value is not None:
            body_known[var] = value

    def step(i: int) -> int | None:
        """What the body adds to carry `i` each run, if a known integer."""
        update = _defining(body.jaxpr, body.jaxpr.outvars[i])
        counter = body.jaxpr.invars[n_body + i]
        if update is None or update.primitive.name not in ("add", "sub"):
            return None
        a, b = update.invars
        if a is counter and (s := _value(b, body_known)) is not None:
            return s if update.primitive.name == "add" else -s
        if b is counter and update.primitive.name == "add" and (s := _value(a, body_known)) is not None:
            return s
        return None

    def bound(atom: Any) -> int | None:
        i = carry_index(atom)
        if i is None:
            return _value(atom, cond_known)
        if body.jaxpr.outvars[i] is not body.jaxpr.invars[n_body + i]:
            return None  # the body changes it
        return _value(init[i], known)

    op = test.primitive.name
    left, right = test.invars
    if carry_index(left) is None:
        left, right, op = right, left, _FLIPPED[op]
    i = carry_index(left)
    if i is None:
        return None
    start, by, end = _value(init[i], known), step(i), bound(right)
    if start is None or by is None or end is None:
        return None
    return _runs(start, by, end, op)


def _runs(start: int, by: int, end: int, op: str) -> int | None:
    """How often `i = start; while i OP end: i += by` runs its body (None: forever)."""
    holds = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "ne": operator.ne}[op]
    if not holds(start, end):
        return 0
    if op == "ne":
        gap = end - start
        return gap // by if by and gap % by == 0 and gap // by > 0 else None
    towards = by > 0 if op in ("lt", "le") else by < 0
    if not towards:
        return None
    gap, by = abs(end - start), abs(by)
    return gap // by + 1 if op in ("le", "ge") else math.ceil(gap / by)


def _defining(jaxpr: jex.Jaxpr, var: Any) -> Any:
    """The equation of `jaxpr` that computes `var` (None for an input or a literal)."""
    for eqn in reversed(jaxpr.eqns):
        if any(out is var for out in eqn.outvars):
            return eqn
    return None


# -- what one run of a body costs -----------------------------------------------------
def _scan_step(body: _Body) -> tuple[Callable[..., Any], list[Any], list[tuple[int, ...]]]:
    """One step of a scan as its loop runs it: the body reading its slice of each scanned
    input at a step index, the types of its arguments (a scanned input's per step, and the
    index last) and their shapes (a scanned input's whole). Its stacked outputs are left as
    the step's own: XLA's analysis counts a slice written in place as the whole buffer,
    which the loop does not touch."""
    run = jex.jaxpr_as_fun(body.jaxpr)
    assert body.scan is not None
    n_consts, n_carry, length = body.scan
    avals = list(body.jaxpr.in_avals)
    head = n_consts + n_carry

    def step(*args: Any) -> list[Any]:
        xs, i = args[head:-1], args[-1]
        return list(run(*args[:head], *(lax.dynamic_index_in_dim(x, i, keepdims=False) for x in xs)))

    index = jax.ShapeDtypeStruct((), np.dtype(np.int32))
    shapes = [a.shape for a in avals[:head]] + [(length, *a.shape) for a in avals[head:]] + [()]
    return step, [*avals, index], shapes


def _on_mesh(aval: Any, shape: tuple[int, ...], mesh: Any) -> jax.ShapeDtypeStruct:
    """An argument of `shape` placed on `mesh` as `aval`'s Explicit sharding says (a scanned
    input's leading axis, which the aval of its step does not have, not split)."""
    spec = tuple(getattr(getattr(aval, "sharding", None), "spec", None) or ())
    sharding = NamedSharding(mesh, P(*([None] * (len(shape) - len(spec))), *spec))
    return jax.ShapeDtypeStruct(shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding)


def _body_program(body: _Body) -> tuple[Callable[..., Any], list[Any]]:
    """The body as a program of its own, and its arguments' types: inside a `shard_map` over
    the same mesh where it sits in one, each value that varies over manual axes given a
    leading axis of their size, split over them (so each device sees the body's own type)."""
    if body.scan is not None:
        whole, avals, shapes = _scan_step(body)
    else:
        whole, avals = jex.jaxpr_as_fun(body.jaxpr), body.jaxpr.in_avals
        shapes = [a.shape for a in avals]
    # Only the outputs the body computes, each once: an input passed through, or a value
    # returned twice, is one buffer in the loop, where a program of its own would copy it.
    inner = body.jaxpr.jaxpr
    keep, seen = [], set(map(id, inner.invars))
    for k, var in enumerate(inner.outvars):
        if not isinstance(var, jex.Literal) and id(var) not in seen:
            keep.append(k)
            seen.add(id(var))
    out_avals = [body.jaxpr.out_avals[k] for k in keep]

    def run(*args: Any) -> list[Any]:
        outs = whole(*args)
        return [outs[k] for k in keep]

    if body.mesh is not None:
        return run, [_on_mesh(a, shape, body.mesh) for a, shape in zip(avals, shapes, strict=True)]
    if body.manual is None:
        return run, [
            jax.ShapeDtypeStruct(shape, a.dtype, weak_type=a.weak_type) for a, shape in zip(avals, shapes, strict=True)
        ]
    mesh, manual = body.manual.mesh, body.manual

    def axes_of(aval: Any) -> tuple[str, ...]:
        return tuple(sorted(_compat.varying_axes(aval) & manual.axes)) if manual.check_vma else ()

    in_axes = [axes_of(a) for a in avals]
    out_axes = [axes_of(a) for a in out_avals]

    def local(*xs: Any) -> list[Any]:
        xs = tuple(x.reshape(x.shape[1:]) if ax else x for x, ax in zip(xs, in_axes, strict=True))
        outs = run(*xs)
        return [y.reshape((1, *y.shape)) if ax else y for y, ax in zip(outs, out_axes, strict=True)]

    def spec(axes: tuple[str, ...], ndim: int) -> P:
        return P(axes, *([None] * ndim)) if axes else P()

    program = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=tuple(spec(ax, len(shape)) for ax, shape in zip(in_axes, shapes, strict=True)),
        out_specs=[spec(ax, len(a.shape)) for ax, a in zip(out_axes, out_avals, strict=True)],
        axis_names=set(manual.axes),
        check_vma=manual.check_vma,
    )
    concrete = isinstance(mesh, jax.sharding.Mesh)
    arguments = []
    for ax, a, shape in zip(in_axes, avals, shapes, strict=True):
        sharding = NamedSharding(mesh, spec(ax, len(shape))) if concrete else None
        whole_shape = (math.prod(mesh.shape[n] for n in ax), *shape) if ax else shape
        arguments.append(jax.ShapeDtypeStruct(whole_shape, a.dtype, weak_type=a.weak_type, sharding=sharding))
    return program, arguments


def _cost_of_runs(bodies: Sequence[_Body]) -> tuple[float, float] | None:
    """XLA's (flops, bytes accessed) of one run of each of `bodies`, summed: one program that
    runs them side by side (on separate inputs, so XLA shares nothing between them). None
    where one cannot be compiled alone or the backend does not say."""
    programs = [_body_program(body) for body in bodies]

    def side_by_side(*args: Any) -> list[Any]:
        outs, start = [], 0
        for program, arguments in programs:
            outs.append(program(*args[start : start + len(arguments)]))
            start += len(arguments)
        return outs

    mesh = bodies[0].mesh
    try:
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            lowered = jax.jit(side_by_side).lower(*(a for _, arguments in programs for a in arguments))
            analysis = _compat.cost_analysis(lowered.compile())
    except Exception:  # our own program of the user's bodies: any failure means "not known"
        return None
    flops, accessed = analysis.get("flops", 0.0), analysis.get("bytes accessed")
    if not isinstance(accessed, (int, float)) or not isinstance(flops, (int, float)):
        return None
    return float(flops), float(accessed)


def _missed(terms: list[_Term]) -> tuple[float, float, bool]:
    """The (flops, bytes, exact) that XLA's analysis misses for `terms`: each distinct body
    once with all its extra runs, the bodies with as many extra runs compiled together."""
    runs: dict[tuple[int, _Manual | None, Any], tuple[_Body, int]] = {}
    flops = accessed = 0.0
    exact = True
    for term in terms:
        if isinstance(term, _Branches):
            f, b, e = max((_missed(branch) for branch in term.branches), key=lambda fbe: fbe[0])
            flops, accessed, exact = flops + f, accessed + b, exact and e
            continue
        key = (id(term.jaxpr.jaxpr), term.manual, term.mesh)
        runs[key] = (term, runs[key][1] + term.extra_runs if key in runs else term.extra_runs)
    groups: dict[tuple[int, _Manual | None, Any], list[_Body]] = {}
    for body, extra in runs.values():
        groups.setdefault((extra, body.manual, body.mesh), []).append(body)
    for (extra, _, _), bodies in groups.items():
        parts = [_cost_of_runs(bodies)]
        if parts[0] is None and len(bodies) > 1:  # which one fails: the others still count
            parts = [_cost_of_runs([body]) for body in bodies]
        for part in parts:
            if part is None:
                exact = False
            else:
                flops, accessed = flops + extra * part[0], accessed + extra * part[1]
    return flops, accessed, exact


# -- scans partitioned by XLA: the program again, each such scan unrolled twice --------------
def _unrolled_twice(closed: jex.ClosedJaxpr, scans: set[int]) -> jex.ClosedJaxpr:
    """`closed` with each scan equation whose id is in `scans` unrolled twice (two copies
    of its body per run of its loop, which XLA counts twice), wherever it sits."""

    def rewrite(jaxpr: jex.Jaxpr) -> jex.Jaxpr:
        eqns = []
        for eqn in jaxpr.eqns:
            if id(eqn) in scans:
                eqn = eqn.replace(params={**eqn.params, "unroll": 2})
            elif eqn.primitive.name not in _OPAQUE and eqn.primitive.name not in ("scan", "while", "cond"):
                params: dict[str, Any] = {}
                for name, value in eqn.params.items():
                    if isinstance(value, jex.ClosedJaxpr):
                        params[name] = jex.ClosedJaxpr(rewrite(value.jaxpr), value.consts)
                    elif isinstance(value, jex.Jaxpr):
                        params[name] = rewrite(value)
                if params:
                    eqn = eqn.replace(params={**eqn.params, **params})
            eqns.append(eqn)
        rewritten: jex.Jaxpr = jaxpr.replace(eqns=eqns)
        return rewritten

    return jex.ClosedJaxpr(rewrite(closed.jaxpr), closed.consts)


def _partitioned_missed(
    closed: jex.ClosedJaxpr, scans: list[tuple[Any, int, int]], arguments: Sequence[Any], reported: tuple[Any, Any]
) -> tuple[float, float, bool]:
    """What XLA misses of scans it partitions: per group of scans with as many extra runs
    (and as many body copies left over), the program compiled again with them unrolled
    twice, whose figures exceed the program's by one run of each body (two, for an odd
    length: its copy left over)."""
    flops = accessed = 0.0
    exact = True
    groups: dict[tuple[int, int], set[int]] = {}
    for eqn, extra, odd in scans:
        groups.setdefault((extra, odd), set()).add(id(eqn))
    for (extra, odd), ids in groups.items():
        try:
            variant = _unrolled_twice(closed, ids)
            analysis = _compat.cost_analysis(jax.jit(jex.jaxpr_as_fun(variant)).lower(*arguments).compile())
            once_f = float(analysis["flops"]) - reported[0]
            once_b = float(analysis["bytes accessed"]) - reported[1]
        except Exception:  # our own program of the user's jaxpr: any failure means "not known"
            exact = False
            continue
        flops += extra * max(once_f, 0.0) / (1 + odd)
        accessed += extra * max(once_b, 0.0) / (1 + odd)
    return flops, accessed, exact


# -- the public entry ---------------------------------------------------------------------
def loop_correction(
    closed: jex.ClosedJaxpr,
    shardings: Sequence[Any] = (),
    *,
    arguments: Sequence[Any] = (),
    reported: tuple[float | None, float | None] = (None, None),
) -> LoopCorrection:
    """What XLA's cost analysis of the program `closed` misses by counting each loop body once.

    Args:
        closed: The traced program (`jax.jit(f).trace(*args).jaxpr`).
        shardings: The compiled program's input and output shardings. Over several
            devices, a loop outside `shard_map` is counted where all its values have
            Explicit shardings (its body is then compiled alone on the same mesh); else
            XLA partitions it as it sees fit, and its cost per device is known only
            inside the program: a scan outside other loops is then counted from the
            program compiled again with it unrolled twice (for `arguments`, compared
            with `reported`); any other such loop is left counted once (not exact).
        arguments: The program's arguments as it was lowered (`ShapeDtypeStruct`s with
            their shardings), one per input of `closed`.
        reported: XLA's (flops, bytes accessed) of the program.

    Returns:
        The FLOPs and bytes to add, and whether every trip count and body cost was known.
        Each distinct body is compiled once, and the bodies that run as many more times
        as XLA counts them in one program (a scan and its transpose under `grad`).
    """
    devices = {d for s in shardings if isinstance(s, jax.sharding.Sharding) for d in s.device_set}
    meshes = [s.mesh for s in shardings if isinstance(s, NamedSharding) and isinstance(s.mesh, jax.sharding.Mesh)]
    walk = _Walk(multi_device=len(devices) > 1, mesh=meshes[0] if meshes else None)
    terms = walk.terms(closed.jaxpr, _consts(closed), 1, None)
    if not terms and not walk.partitioned:
        return LoopCorrection(exact=walk.exact) if not walk.exact else NO_LOOPS
    flops, accessed, exact = _missed(terms)
    if walk.partitioned:
        if None in reported or len(arguments) != len(closed.jaxpr.invars):
            exact = False
        else:
            f, b, e = _partitioned_missed(closed, walk.partitioned, arguments, reported)
            flops, accessed, exact = flops + f, accessed + b, exact and e
    return LoopCorrection(flops, accessed, exact and walk.exact)
