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
returns `sum(runs_not_counted * body_cost)`, for `ts.cost` to add to XLA's figures: the
figures of the program with its loops unrolled. A scan and the scan that reads its stacked
outputs step by step (its transpose under `grad`) run side by side, as unrolled. Where an
unrolled program simplifies a loop's first or last run (a carry that starts as a constant;
a last value that nothing reads after the loop, as the gradient of a train step's input),
those two runs are costed as a two-run loop unrolled alone. A body
nested in a loop is counted for every run of its enclosing loops. A loop in a `cond`
branch is counted as XLA counts a conditional: the most costly branch. A scan that XLA
partitions across devices as it sees fit (`Auto` mesh axes) has a cost per device only
inside the program: where every loop is such a scan, each is read from the compiled
program's optimized module (`_hlo_loops`); else the program is compiled once more with
those scans unrolled twice, and the difference is one run of each body.

Where a trip count is not known when compiling, or a body cannot be compiled alone, that
body stays counted once and the correction says it is not exact.
"""

import dataclasses
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from .. import _compat
from . import _hlo_loops
from ._bodies import Body, Loop, Manual, cost_of_runs
from ._compiles import compiled


@dataclasses.dataclass(frozen=True)
class LoopCorrection:
    """What to add to XLA's `flops` and `bytes accessed` so each loop body counts as often as
    it runs, and whether every loop's count was known (`exact`)."""

    flops: float = 0.0
    bytes_accessed: float = 0.0
    exact: bool = True


NO_LOOPS: Final = LoopCorrection()


@dataclasses.dataclass(frozen=True)
class _Branches:
    """The loops of each branch of a `cond`, of which XLA counts the most costly."""

    branches: tuple[list["_Term"], ...]


_Term = Body | _Branches


@dataclasses.dataclass
class _Walk:
    """What walking a program found: its loop terms, and whether every count is known."""

    multi_device: bool
    mesh: Any  # the program's mesh, where its inputs or outputs are on one
    exact: bool = True
    depth: int = 0  # how many loops or conditionals hold the equations being walked
    # Scans that XLA partitions, outside any loop: (equation, extra runs, length % 2).
    partitioned: list[tuple[Any, int, int]] = dataclasses.field(default_factory=list)
    nested: bool = False  # whether such a scan holds loops (unrolling it twice misses them)

    def terms(self, jaxpr: jex.Jaxpr, known: dict[Any, int], runs: int, manual: Manual | None) -> list[_Term]:
        """The loop terms of `jaxpr`, run `runs` times, with the scalar values `known`."""
        found: list[_Term] = []
        reads: dict[int, int] = {}  # how often each value is read, by id
        for atom in [a for eqn in jaxpr.eqns for a in eqn.invars] + list(jaxpr.outvars):
            reads[id(atom)] = reads.get(id(atom), 0) + 1
        made: dict[int, Any] = {id(v): eqn for eqn in jaxpr.eqns for v in eqn.outvars}
        # The bodies of each scan counted here, by the id of each of its stacked outputs.
        stacked: dict[int, tuple[Any, Loop, list[Body], tuple[Any, ...]]] = {}
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name in ("scan", "while"):
                loop = _loop_of(eqn, reads, made)
                trips, counted = _scan_counts(eqn) if name == "scan" else (_trip_count(eqn, known), 1)
                bodies, nested = self._loop(loop, trips, counted, runs, manual, eqn)
                key = (trips, counted, runs, manual, bodies[0].mesh if bodies else None)
                first = _reads_stacked(eqn, stacked, key) if bodies else None
                if first is not None:
                    found = [t for t in found if all(t is not b for b in first[2])]
                    bodies = _paired(first[0], first[1], eqn, loop, reads, key)
                    stacked = {i: r for i, r in stacked.items() if r is not first}
                elif name == "scan" and bodies:
                    record = (eqn, loop, bodies, key)
                    stacked.update((id(v), record) for v in eqn.outvars[eqn.params["num_carry"] :])
                found += bodies + nested
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
        self, loop: Loop, trips: int | None, counted: int, runs: int, manual: Manual | None, eqn: Any
    ) -> tuple[list[Body], list[_Term]]:
        """The terms of one loop: its own body's runs, and the terms of the loops inside it."""
        body, scan = loop.jaxpr, loop.scan
        mesh = None
        if manual is None and self.multi_device:
            if not _explicit(body, self.mesh):
                # A body XLA partitions across devices as it sees fit: its cost per device
                # is known only inside the program, so it is read there (a scan outside
                # other loops; `_from_bodies` says how).
                if scan is not None and trips is not None and trips >= 2 and counted == 1 and self.depth == 0:
                    self.partitioned.append((eqn, runs * (trips - 1), trips % 2))
                    self.nested = self.nested or holds_loops(body.jaxpr)
                else:
                    self.exact = False
                return [], []
            mesh = self.mesh
        self.depth += 1
        try:
            if trips is None:
                self.exact = False
                return [], self.terms(body.jaxpr, _consts(body), runs, manual)
            if trips == 0:
                # XLA removes a scan that never runs (and counts nothing); whether it
                # removes such a `while` (or counts its body once) depends on the release.
                self.exact = self.exact and scan is not None
                return [], []
            bodies = _uncounted((loop,), trips, counted, runs, manual, mesh) if runs else []
            return bodies, self.terms(body.jaxpr, _consts(body), runs * trips, manual)
        finally:
            self.depth -= 1


def _unrolled(eqn: Any) -> int:
    """How many copies of a scan's body one run of its loop holds (1 for a `while`)."""
    if eqn.primitive.name != "scan":
        return 1
    length, unroll = int(eqn.params["length"]), eqn.params.get("unroll", 1)
    return length if unroll is True or not unroll else min(max(int(unroll), 1), max(length, 1))


def _scan_counts(eqn: Any) -> tuple[int, int]:
    """A scan's trip count, and how many copies of its body XLA counts."""
    # JAX lowers a scan unrolled `u` times as a loop over `u` copies of the body plus the
    # `length % u` left over, and XLA counts each copy once.
    length, per_step = int(eqn.params["length"]), _unrolled(eqn)
    return length, per_step + length % per_step if length else 0


def _loop_of(eqn: Any, reads: dict[int, int], made: dict[int, Any]) -> Loop:
    """The loop of a `scan` or `while` equation: its body, the carries that start as a
    constant, and the outputs that nothing reads after it."""
    if eqn.primitive.name == "scan":
        n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
        scan: tuple[int, int, int] | None = (n_consts, n_carry, int(eqn.params["length"]))
        body, reverse, skip = eqn.params["jaxpr"], bool(eqn.params["reverse"]), 0
    else:
        n_consts, n_carry = eqn.params["body_nconsts"], len(eqn.outvars)
        scan, body, reverse, skip = None, eqn.params["body_jaxpr"], False, eqn.params["cond_nconsts"]
    starts = []
    for k in range(n_consts, n_consts + n_carry):
        value = _filled(eqn.invars[skip + k], made)
        if value is not None:
            starts.append((k, value))
    unread = frozenset(k for k, v in enumerate(eqn.outvars) if not reads.get(id(v)))
    length, per_step = int(eqn.params.get("length", 0)), _unrolled(eqn)
    if scan is not None and length % per_step:
        # The runs left over from an unrolled scan are straight-line code, which XLA
        # simplifies where it stands: its first and last runs are counted as any other.
        starts, unread = [], frozenset(k for k in unread if k >= n_carry)
    return Loop(body, scan, reverse, tuple(starts), unread)


def _filled(atom: Any, made: dict[int, Any]) -> Any:
    """The scalar that `atom` is filled with, where it is a constant (a literal, broadcast,
    reshaped or converted: `jnp.zeros` of a carry, also batched by `vmap`), else None."""
    for _ in range(16):
        if isinstance(atom, jex.Literal):
            value = np.asarray(atom.val)
            return value.item() if value.shape == () else None
        eqn = made.get(id(atom))
        if eqn is None or eqn.primitive.name not in ("broadcast_in_dim", "reshape", "convert_element_type"):
            return None
        atom = eqn.invars[0]
    return None


def _uncounted(
    loops: tuple[Loop, ...],
    trips: int,
    counted: int,
    runs: int,
    manual: Manual | None,
    mesh: Any,
    wires: tuple[tuple[int, bool, int], ...] = (),
) -> list[Body]:
    """The runs of `loops` that XLA does not count, which XLA counts `counted` times (one run
    alone each, as the loop runs it). Where an unrolled program simplifies its first or
    last run (a carry that starts as a constant is folded into the first; a last value that
    nothing reads is dropped from the last), those two cost as a two-run loop unrolled
    alone, and each other run as one run alone."""
    if trips <= counted:
        return []
    if not any(_simplified(loop, manual, mesh) for loop in loops):
        weights = {(1, False): runs * (trips - counted)}
    else:
        weights = {(2, True): runs, (1, False): runs * (trips - 2 - counted)}
    return [Body(loops, w, manual, mesh, n, e, wires) for (n, e), w in weights.items() if w]


def _simplified(loop: Loop, manual: Manual | None, mesh: Any) -> bool:
    """Whether an unrolled program simplifies the first or last run of `loop`."""
    if loop.starts and manual is None and mesh is None:
        return True
    n_carry = loop.scan[1] if loop.scan is not None else len(loop.jaxpr.out_avals)
    return any(k < n_carry for k in loop.unread)


def _reads_stacked(
    eqn: Any, stacked: dict[int, tuple[Any, Loop, list[Body], tuple[Any, ...]]], key: tuple[Any, ...]
) -> tuple[Any, Loop, list[Body], tuple[Any, ...]] | None:
    """The earlier scan whose stacked outputs this scan reads step by step (a scan and its
    transpose under `grad`), where both run as often in the same place."""
    if eqn.primitive.name != "scan":
        return None
    head = eqn.params["num_consts"] + eqn.params["num_carry"]
    for v in eqn.invars[head:]:
        first = stacked.get(id(v))
        if first is not None and first[3] == key:
            return first
    return None


def _paired(
    before: Any, loop_before: Loop, eqn: Any, loop: Loop, reads: dict[int, int], key: tuple[Any, ...]
) -> list[Body]:
    """The runs of two scans side by side, the second reading each stacked output of the
    first at the same step (never written to memory where nothing else reads it)."""
    head = eqn.params["num_consts"] + eqn.params["num_carry"]
    head_before = before.params["num_consts"] + before.params["num_carry"]
    outs = {id(v): k for k, v in enumerate(before.outvars) if k >= before.params["num_carry"]}
    ins = {id(v): k for k, v in enumerate(before.invars) if k >= head_before}
    wires = []
    for k in range(head, len(eqn.invars)):
        v = eqn.invars[k]
        if id(v) in outs:
            wires.append((k, True, outs[id(v)]))
        elif id(v) in ins:
            wires.append((k, False, ins[id(v)]))
    # A stacked output of the first that only the second reads is no output of the pair.
    inner = frozenset(k for _, out, k in wires if out and reads.get(id(before.outvars[k])) == 1)
    loop_before = dataclasses.replace(loop_before, unread=loop_before.unread | inner)
    trips, counted, runs, manual, mesh = key
    return _uncounted((loop_before, loop), trips, counted, runs, manual, mesh, tuple(wires))


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


def scan_lengths(jaxpr: jex.Jaxpr) -> list[int]:
    """The lengths of the scans `jaxpr` runs outside any other loop (through calls and
    `shard_map`), in order: what a compiled module whose loop counters cannot be read
    (libtpu's under `jax_enable_x64`) runs its top-level loops as often as."""
    out: list[int] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append(int(eqn.params["length"]))
        elif eqn.primitive.name not in ("while", "cond"):
            for sub in _sub_jaxprs(eqn):
                out += scan_lengths(sub.jaxpr)
    return out


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


def _shard_map_context(eqn: Any, outer: Manual | None) -> Manual:
    params = eqn.params
    axes = params.get("newly_manual_axes", params.get("manual_axes", params.get("axis_names", frozenset())))
    mesh = params["mesh"]
    check = bool(params.get("check_vma", params.get("check_rep", True)))
    if outer is not None:
        axes = frozenset(axes) | outer.axes
    return Manual(mesh, frozenset(axes), check)


# -- trip counts of `while` loops -------------------------------------------------------
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
    if test is None or test.primitive.name not in _hlo_loops.FLIPPED:
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
        left, right, op = right, left, _hlo_loops.FLIPPED[op]
    i = carry_index(left)
    if i is None:
        return None
    start, by, end = _value(init[i], known), step(i), bound(right)
    if start is None or by is None or end is None:
        return None
    return _hlo_loops.runs(start, by, end, op)


def _defining(jaxpr: jex.Jaxpr, var: Any) -> Any:
    """The equation of `jaxpr` that computes `var` (None for an input or a literal)."""
    for eqn in reversed(jaxpr.eqns):
        if any(out is var for out in eqn.outvars):
            return eqn
    return None


def _missed(terms: list[_Term]) -> tuple[float, float, bool]:
    """The (flops, bytes, exact) that XLA's analysis misses for `terms`: each distinct body
    once with all its extra runs, the bodies with as many extra runs compiled together."""
    runs: dict[tuple[Any, ...], tuple[Body, int]] = {}
    flops = accessed = 0.0
    exact = True
    for term in terms:
        if isinstance(term, _Branches):
            f, b, e = max((_missed(branch) for branch in term.branches), key=lambda fbe: fbe[0])
            flops, accessed, exact = flops + f, accessed + b, exact and e
            continue
        loops = tuple((id(loop.jaxpr.jaxpr), loop.reverse, loop.starts, loop.unread) for loop in term.loops)
        key = (loops, term.steps, term.edges, term.wires, term.manual, term.mesh)
        runs[key] = (term, runs[key][1] + term.extra_runs if key in runs else term.extra_runs)
    groups: dict[tuple[int, Manual | None, Any], list[Body]] = {}
    for body, extra in runs.values():
        groups.setdefault((extra, body.manual, body.mesh), []).append(body)
    for (extra, _, _), bodies in groups.items():
        if not extra:
            continue
        parts = [cost_of_runs(bodies)]
        if parts[0] is None and len(bodies) > 1:  # which one fails: the others still count
            parts = [cost_of_runs([body]) for body in bodies]
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
            analysis = _compat.program_cost_analysis(jax.jit(jex.jaxpr_as_fun(variant)).lower(*arguments).compile())
            compiled()
            once_f = float(analysis["flops"]) - reported[0]
            once_b = float(analysis["bytes accessed"]) - reported[1]
        except Exception:  # our own program of the user's jaxpr: any failure means "not known"
            exact = False
            continue
        flops += extra * max(once_f, 0.0) / (1 + odd)
        accessed += extra * max(once_b, 0.0) / (1 + odd)
    return flops, accessed, exact


# -- the count -------------------------------------------------------------------------------
def count(
    closed: jex.ClosedJaxpr,
    compiled: Any,
    *,
    shardings: Sequence[Any] = (),
    arguments: Sequence[Any] = (),
    reported: tuple[float | None, float | None] = (None, None),
    far: bool = False,
    loop_counts: bool | None = None,
) -> LoopCorrection:
    """What XLA's cost analysis of a compiled program misses by counting each loop body
    once, decided here alone for every program `ts.cost` compiles.

    Args:
        closed: The traced program (`jax.jit(f).trace(*args).jaxpr`).
        compiled: The program compiled (`jax.stages.Compiled`, or one compiled elsewhere).
        shardings: Its input and output shardings (see `_from_bodies`).
        arguments: Its arguments as it was lowered, one per input of `closed`.
        reported: XLA's (flops, bytes accessed) of the program.
        far: Compiled for a mesh whose devices are not here (`_simulate`): the loops
            are read from its optimized module alone, as no body can compile alone.
        loop_counts: Where compiled for a target (`target=`), whether its compiler's module
            tells each loop's trip count (libtpu's: `Compiler.loop_counts`); None without one.
            On a TPU, libtpu's optimized module tells each loop's body and trip count:
            read there first (nothing compiles again). A body the target's compiler
            cannot take alone is counted once, and said so.

    Returns:
        The FLOPs and bytes to add, and whether every trip count and body cost was known.
        A program without loops compiles nothing more.
    """
    if not holds_loops(closed.jaxpr):
        return NO_LOOPS
    if far:
        return _from_module(compiled)
    bodies = functools.partial(
        _from_bodies, closed, shardings, arguments=arguments, reported=reported, compiled=compiled
    )
    if loop_counts is None:
        return bodies()
    if loop_counts:
        read = _from_module(compiled, scan_lengths(closed.jaxpr))
        if read.exact:
            return read
    try:  # each body compiled alone by the target's compiler, on the target's devices
        return bodies()
    except Exception:  # a body the target's compiler cannot take alone: counted once, and said so
        return LoopCorrection(exact=False)


def _from_module(compiled: Any, lengths: Sequence[int] = ()) -> LoopCorrection:
    """What XLA's cost analysis of `compiled` misses, read from its optimized HLO alone
    (`_hlo_loops`): for a program whose loop bodies cannot be compiled here (a far mesh)
    or have a cost per device only inside it (scans XLA partitions, of `lengths`)."""
    text = _compat.optimized_text(compiled)
    read = _hlo_loops.missed(text, lengths) if text is not None else None
    if read is None:
        return LoopCorrection(exact=False)
    return LoopCorrection(read.flops, read.bytes_accessed, read.exact)


def _from_bodies(
    closed: jex.ClosedJaxpr,
    shardings: Sequence[Any] = (),
    *,
    arguments: Sequence[Any] = (),
    reported: tuple[float | None, float | None] = (None, None),
    compiled: Any = None,
) -> LoopCorrection:
    """What XLA's cost analysis of the program `closed` misses by counting each loop body
    once, each body compiled alone for its abstract inputs.

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
        compiled: The compiled program. Where every loop is a scan XLA partitions, each
            is read from its optimized module instead (`_hlo_loops`): nothing compiles.

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
    if walk.partitioned and not terms and compiled is not None:
        # Every loop is a scan XLA partitions: each is read from the compiled program itself
        # (where that cannot be read, the program is compiled again below).
        read = _from_module(compiled, [eqn.params["length"] for eqn, _, _ in walk.partitioned])
        if read.exact:
            return dataclasses.replace(read, exact=walk.exact)
    flops, accessed, exact = _missed(terms)
    if walk.partitioned:
        if None in reported or len(arguments) != len(closed.jaxpr.invars):
            exact = False
        else:
            f, b, e = _partitioned_missed(closed, walk.partitioned, arguments, reported)
            flops, accessed, exact = flops + f, accessed + b, exact and e and not walk.nested
    return LoopCorrection(flops, accessed, exact and walk.exact)
