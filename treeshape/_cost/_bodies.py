"""A loop body as a program of its own, and what one run of it costs (`cost_of_runs`):
the loops of a traced program as `_loops` finds them (`Loop`, `Body`, the `shard_map`
a body sits in, `Manual`), a body's runs chained back to back as the program runs them,
compiled alone for its abstract inputs (inside a `shard_map` over the same mesh where it
sits in one; on the program's mesh where all its axes are Explicit), and XLA's cost
analysis of that program.
"""

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _compat
from ._compiles import compiled


# -- where a body runs -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Manual:
    """The `shard_map` a body sits in: its mesh, the manual axes, and whether it checks vma."""

    mesh: Any
    axes: frozenset[str]
    check_vma: bool


@dataclasses.dataclass(frozen=True, eq=False)
class Loop:
    """One loop of the program, as its runs differ when unrolled: the carries that hold a
    constant when it starts (which XLA folds into the first run), and the outputs that
    nothing reads after it (a carry's last value, which XLA drops from the last run; a
    stacked output, from every run)."""

    jaxpr: jex.ClosedJaxpr
    scan: tuple[int, int, int] | None  # a scan's (consts, carries, length)
    reverse: bool = False
    starts: tuple[tuple[int, Any], ...] = ()  # (body input, the scalar it is filled with)
    unread: frozenset[int] = frozenset()  # body outputs


@dataclasses.dataclass(frozen=True)
class Body:
    """One loop body (or a scan and the scan that reads its stacked outputs step by step, a
    forward pass and its transpose, as an unrolled program runs them), run `steps` times
    back to back, and the weight of its cost in what XLA misses (`extra_runs`)."""

    loops: tuple[Loop, ...]
    extra_runs: int
    manual: Manual | None
    mesh: Any = None  # the mesh of a body whose values all have Explicit shardings on it
    steps: int = 1  # runs chained back to back
    edges: bool = False  # the runs are the loop's first and last
    wires: tuple[tuple[int, bool, int], ...] = ()  # (input of loops[1], from an output?, of loops[0])


# -- what one run of a body costs -----------------------------------------------------
def _step(body: Body) -> tuple[Callable[..., Any], list[Any], list[tuple[int, ...]], list[Any], list[bool], int]:
    """`body.steps` runs of a body's loops back to back as the program runs them: the
    function, the types of its arguments (a scanned input's per step, and the step index
    last), their shapes (a scanned input's whole), the types of its outputs and which
    arguments are carries updated in place (whose outputs come first, as many as the last
    figure). Each run
    takes the carries of the one before; a scan reads its slice of each scanned input at
    the step index; its stacked outputs are left as the step's own: XLA's analysis counts a
    slice written in place as the whole buffer, which the loop does not touch. Of the first
    and last runs (`edges`), a carry that starts as a constant is that constant, and a last
    value that nothing reads is no output. Of a pair, the second reads the first's stacked
    outputs, and the scanned inputs they share, at the same step. Only the outputs a body
    computes count, each once: an input passed through, or a value returned twice, is one
    buffer in the loop, where a program of its own would copy it."""
    plans = []  # per loop: its inputs ("arg", slot, scanned?) / ("fill", value) / ("wire", ...)
    outputs: list[tuple[int, int, int]] = []  # (loop, run, body output)
    avals: list[Any] = []
    shapes: list[tuple[int, ...]] = []
    slots: list[tuple[int, int]] = []  # per argument: its loop and body input
    wired = {k: (out, j) for k, out, j in body.wires}
    n = body.steps
    for m, loop in enumerate(body.loops):
        n_consts = loop.scan[0] if loop.scan is not None else len(loop.jaxpr.in_avals) - len(loop.jaxpr.out_avals)
        n_carry = loop.scan[1] if loop.scan is not None else len(loop.jaxpr.out_avals)
        head = n_consts + n_carry
        fills = dict(loop.starts) if body.edges and body.manual is None and body.mesh is None else {}
        inputs: list[tuple[Any, ...]] = []
        for k, aval in enumerate(loop.jaxpr.in_avals):
            if k in fills:
                inputs.append(("fill", fills[k]))
            elif m == 1 and k in wired:
                inputs.append(("wire", *wired[k]))
            else:
                inputs.append(("arg", len(avals), k >= head))
                slots.append((m, k))
                avals.append(aval)
                shapes.append((loop.scan[2], *aval.shape) if k >= head and loop.scan is not None else aval.shape)
        inner = loop.jaxpr.jaxpr
        for r in range(n):
            last = r == n - 1
            seen = set(map(id, inner.invars))
            for k, var in enumerate(inner.outvars):
                dropped = k in loop.unread and (k >= n_carry or (last and body.edges))
                if (k < n_carry and not last) or dropped or isinstance(var, jex.Literal) or id(var) in seen:
                    continue
                outputs.append((m, r, k))
                seen.add(id(var))
        plans.append((inputs, n_consts, n_carry))
    # A carry updated in place: its argument is donated, matched to its output (outputs of
    # those come first, in the arguments' order, so that donation pairs them one to one).
    last_carries = {(m, k + plans[m][1]) for m, r, k in outputs if r == n - 1 and k < plans[m][2]}
    carried = [slot in last_carries for slot in slots]
    front = [(m, n - 1, k - plans[m][1]) for m, k in slots if (m, k) in last_carries]
    outputs = front + [o for o in outputs if o not in front]
    out_avals = [body.loops[m].jaxpr.out_avals[k] for m, _, k in outputs]
    scans = any(loop.scan is not None for loop in body.loops)
    if scans:
        avals.append(jax.ShapeDtypeStruct((), np.dtype(np.int32)))
        shapes.append(())
        carried.append(False)

    def run(*args: Any) -> list[Any]:
        index = args[-1] if scans else 0
        results: dict[tuple[int, int], list[Any]] = {}
        firsts: dict[int, tuple[list[Any], list[Any]]] = {}  # the first loop's (outputs, inputs) by step
        for m, (loop, (inputs, n_consts, n_carry)) in enumerate(zip(body.loops, plans, strict=True)):
            carries: list[Any] | None = None
            for r in range(n):
                at = n - 1 - r if loop.reverse else r  # the step this run reads and writes
                values = []
                for k, plan in enumerate(inputs):
                    aval = loop.jaxpr.in_avals[k]
                    if carries is not None and n_consts <= k < n_consts + n_carry:
                        values.append(carries[k - n_consts])
                    elif plan[0] == "fill":
                        values.append(jnp.full(aval.shape, plan[1], aval.dtype))
                    elif plan[0] == "wire":
                        values.append(firsts[at][0 if plan[1] else 1][plan[2]])
                    elif plan[2]:
                        values.append(lax.dynamic_index_in_dim(args[plan[1]], index + at, keepdims=False))
                    else:
                        values.append(args[plan[1]])
                outs = list(jex.jaxpr_as_fun(loop.jaxpr)(*values))
                carries = outs[:n_carry]
                if m == 0:
                    firsts[at] = (outs, values)
                results[m, r] = outs
        return [results[m, r][k] for m, r, k in outputs]

    return run, avals, shapes, out_avals, carried, len(front)


def _on_mesh(aval: Any, shape: tuple[int, ...], mesh: Any) -> jax.ShapeDtypeStruct:
    """An argument of `shape` placed on `mesh` as `aval`'s Explicit sharding says (a scanned
    input's leading axis, which the aval of its step does not have, not split)."""
    spec = tuple(getattr(getattr(aval, "sharding", None), "spec", None) or ())
    sharding = NamedSharding(mesh, P(*([None] * (len(shape) - len(spec))), *spec))
    return jax.ShapeDtypeStruct(shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding)


def _body_program(body: Body) -> tuple[Callable[..., Any], list[Any], list[bool], int]:
    """The body as a program of its own, its arguments' types, which of them are carries
    updated in place, and how many outputs (the first) are those carries: inside a `shard_map` over
    the same mesh where it sits in one, each value that varies over manual axes given a
    leading axis of their size, split over them (so each device sees the body's own type)."""
    run, avals, shapes, out_avals, carried, front = _step(body)
    if body.mesh is not None:
        return run, [_on_mesh(a, shape, body.mesh) for a, shape in zip(avals, shapes, strict=True)], carried, front
    if body.manual is None:
        return (
            run,
            [
                jax.ShapeDtypeStruct(shape, a.dtype, weak_type=a.weak_type)
                for a, shape in zip(avals, shapes, strict=True)
            ],
            carried,
            front,
        )
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
    return program, arguments, carried, front


def cost_of_runs(bodies: Sequence[Body]) -> tuple[float, float] | None:
    """XLA's (flops, bytes accessed) of one run of each of `bodies`, summed: one program that
    runs them side by side (on separate inputs, so XLA shares nothing between them). None
    where one cannot be compiled alone or the backend does not say."""
    programs = [_body_program(body) for body in bodies]

    def side_by_side(*args: Any) -> list[Any]:
        outs, start = [], 0
        for program, arguments, _, _ in programs:
            outs.append(program(*args[start : start + len(arguments)]))
            start += len(arguments)
        # The carries of all bodies first, in their arguments' order, to be donated to.
        fronts = [front for _, _, _, front in programs]
        return [y for out, front in zip(outs, fronts, strict=True) for y in out[:front]] + [
            y for out, front in zip(outs, fronts, strict=True) for y in out[front:]
        ]

    mesh = bodies[0].mesh
    try:
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext(), warnings.catch_warnings():
            # The loop updates its carries in place: each body's carries are donated to it
            # (a carry that no output matches, as a dropped last value, is not reused).
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            donated = [i for i, c in enumerate(c for _, _, carried, _ in programs for c in carried) if c]
            flat = [a for _, arguments, _, _ in programs for a in arguments]
            lowered = jax.jit(side_by_side, donate_argnums=donated).lower(*flat)
            analysis = _compat.program_cost_analysis(lowered.compile())
            compiled()
    except Exception:  # our own program of the user's bodies: any failure means "not known"
        return None
    flops, accessed = analysis.get("flops", 0.0), analysis.get("bytes accessed")
    if not isinstance(accessed, (int, float)) or not isinstance(flops, (int, float)):
        return None
    return float(flops), float(accessed)
