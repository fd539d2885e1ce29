"""How often each loop body of a traced program runs, and what XLA's cost analysis misses
by counting every loop body once (`ts.cost`'s loop correction).

XLA's cost analysis counts a `while` body once, whatever its trip count, so a 50-step
`lax.scan` reports the FLOPs of one step. This module walks the program's `ClosedJaxpr`
(into `pjit`, `checkpoint`, `custom_jvp` / `custom_vjp`, `cond` branches, `shard_map` and
loop bodies), finds each loop's trip count where the compiled program knows it (a `scan`'s
`length`; a `while` whose condition compares a counter stepped by a constant with a
constant bound, as `fori_loop` with array bounds and a hand-written counted loop make),
compiles each loop body alone for its abstract inputs (inside a `shard_map` over the same
mesh where it sits in one), and returns `sum(runs_not_counted * body_cost)`, for `ts.cost`
to add to XLA's figures. A body nested in a loop is counted for every run of its enclosing
loops. A loop in a `cond` branch is counted as XLA counts a conditional: the most costly
branch.

Where a trip count is not known when compiling, or a body cannot be compiled alone, that
body stays counted once and the correction says it is not exact.
"""

import dataclasses
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import jax
import jax.extend.core as jex
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


@dataclasses.dataclass(frozen=True)
class _Branches:
    """The loops of each branch of a `cond`, of which XLA counts the most costly."""

    branches: tuple[list["_Term"], ...]


_Term = _Body | _Branches


@dataclasses.dataclass
class _Walk:
    """What walking a program found: its loop terms, and whether every count is known."""

    multi_device: bool
    exact: bool = True

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
                branches = tuple(self.terms(b.jaxpr, _consts(b), runs, manual) for b in eqn.params["branches"])
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
    ) -> list[_Term]:
        if manual is None and self.multi_device:
            # A body partitioned by XLA across devices: its per-device cost is XLA's choice.
            self.exact = False
            return []
        if trips is None:
            self.exact = False
            return self.terms(body.jaxpr, _consts(body), runs, manual)
        found: list[_Term] = []
        if trips == 0:  # XLA removes a loop that never runs (and so counts nothing)
            return found
        if trips != counted and runs:
            found.append(_Body(body, runs * (trips - counted), manual, scan))
        return found + self.terms(body.jaxpr, _consts(body), runs * trips, manual)

    def _scan(self, eqn: Any, known: dict[Any, int], runs: int, manual: _Manual | None) -> list[_Term]:
        length, unroll = int(eqn.params["length"]), eqn.params.get("unroll", 1)
        # JAX lowers a scan unrolled `u` times as a loop over `u` copies of the body plus the
        # `length % u` left over, and XLA counts each copy once.
        per_step = length if unroll is True or not unroll else min(max(int(unroll), 1), max(length, 1))
        counted = per_step + length % per_step if length else 0
        scan = (eqn.params["num_consts"], eqn.params["num_carry"], length)
        return self._loop(eqn.params["jaxpr"], length, counted, runs, manual, scan)

    def _while(self, eqn: Any, known: dict[Any, int], runs: int, manual: _Manual | None) -> list[_Term]:
        return self._loop(eqn.params["body_jaxpr"], _trip_count(eqn, known), 1, runs, manual)


# Equations whose jaxprs XLA does not see as HLO loops (a Pallas kernel is a custom call).
_OPAQUE: Final = frozenset({"pallas_call", "custom_call"})


def _consts(closed: jex.ClosedJaxpr) -> dict[Any, int]:
    """The integer scalars among a closed jaxpr's constants, by variable."""
    return {v: int(c) for v, c in zip(closed.jaxpr.constvars, closed.consts, strict=True) if _is_int_scalar(c)}


def _is_int_scalar(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape != () or dtype is None or not np.issubdtype(dtype, np.integer):
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
    if getattr(aval, "shape", None) != () or not np.issubdtype(getattr(aval, "dtype", np.float32), np.integer):
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
def _scan_step(body: _Body) -> tuple[Callable[..., Any], list[Any]]:
    """One step of a scan as its loop runs it: the body reading its slice of each scanned
    input at a step index, with the types of its arguments (the whole scanned inputs, and
    the index last). Its stacked outputs are left as the step's own: XLA's analysis counts
    a slice written in place as the whole buffer, which the loop does not touch."""
    run = jex.jaxpr_as_fun(body.jaxpr)
    assert body.scan is not None
    n_consts, n_carry, length = body.scan
    avals = list(body.jaxpr.in_avals)
    head = n_consts + n_carry

    def step(*args: Any) -> list[Any]:
        xs, i = args[head:-1], args[-1]
        return list(run(*args[:head], *(lax.dynamic_index_in_dim(x, i, keepdims=False) for x in xs)))

    index = jax.ShapeDtypeStruct((), np.dtype(np.int32))
    stacked = [a.update(shape=(length, *a.shape)) for a in avals[head:]]
    return step, [*avals[:head], *stacked, index]


def _body_program(body: _Body) -> tuple[Callable[..., Any], list[Any]]:
    """The body as a program of its own, and its arguments' types: inside a `shard_map` over
    the same mesh where it sits in one, each value that varies over manual axes given a
    leading axis of their size, split over them (so each device sees the body's own type)."""
    whole, avals = _scan_step(body) if body.scan is not None else (jex.jaxpr_as_fun(body.jaxpr), body.jaxpr.in_avals)
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

    if body.manual is None:
        return run, [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
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
        in_specs=tuple(spec(ax, len(a.shape)) for ax, a in zip(in_axes, avals, strict=True)),
        out_specs=[spec(ax, len(a.shape)) for ax, a in zip(out_axes, out_avals, strict=True)],
        axis_names=set(manual.axes),
        check_vma=manual.check_vma,
    )
    concrete = isinstance(mesh, jax.sharding.Mesh)
    arguments = []
    for ax, a in zip(in_axes, avals, strict=True):
        shape = (math.prod(mesh.shape[n] for n in ax), *a.shape) if ax else a.shape
        sharding = NamedSharding(mesh, spec(ax, len(a.shape))) if concrete else None
        arguments.append(jax.ShapeDtypeStruct(shape, a.dtype, weak_type=a.weak_type, sharding=sharding))
    return program, arguments


def _body_cost(body: _Body) -> tuple[float, float] | None:
    """XLA's (flops, bytes accessed) of one run of `body`, or None where it cannot be compiled
    alone (a collective over axes it cannot be given) or the backend does not say."""
    try:
        program, arguments = _body_program(body)
        analysis = _compat.cost_analysis(jax.jit(program).lower(*arguments).compile())
    except Exception:  # our own program of the user's body: any failure means "not known"
        return None
    flops, accessed = analysis.get("flops", 0.0), analysis.get("bytes accessed")
    if not isinstance(accessed, (int, float)) or not isinstance(flops, (int, float)):
        return None
    return float(flops), float(accessed)


# -- the public entry ---------------------------------------------------------------------
def loop_correction(closed: jex.ClosedJaxpr, *, devices: int = 1) -> LoopCorrection:
    """What XLA's cost analysis of the program `closed` misses by counting each loop body once.

    Args:
        closed: The traced program (`jax.jit(f).trace(*args).jaxpr`).
        devices: How many devices the program is compiled for. A loop outside `shard_map`
            in a program over several devices is partitioned by XLA, so its per-device
            body cost is not known: it is left counted once, and the answer is not exact.

    Returns:
        The FLOPs and bytes to add, each body compiled once (a body that appears several
        times is compiled once), and whether every trip count and body cost was known.
    """
    walk = _Walk(multi_device=devices > 1)
    terms = walk.terms(closed.jaxpr, _consts(closed), 1, None)
    if not terms:
        return LoopCorrection(exact=walk.exact) if not walk.exact else NO_LOOPS
    costs: dict[tuple[int, _Manual | None], tuple[float, float] | None] = {}

    def total(terms: list[_Term]) -> tuple[float, float]:
        flops = accessed = 0.0
        for term in terms:
            if isinstance(term, _Branches):
                f, b = max((total(branch) for branch in term.branches), key=lambda fb: fb[0])
            else:
                key = (id(term.jaxpr.jaxpr), term.manual)
                if key not in costs:
                    costs[key] = _body_cost(term)
                cost = costs[key]
                if cost is None:
                    walk.exact = False
                    continue
                f, b = cost[0] * term.extra_runs, cost[1] * term.extra_runs
            flops, accessed = flops + f, accessed + b
        return flops, accessed

    flops, accessed = total(terms)
    return LoopCorrection(flops, accessed, walk.exact)
