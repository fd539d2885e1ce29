"""Case 16, `fit`: how many programs `ts.largest_fit` compiles vs a plain bisection.

The question: the largest batch size `b` in `1..max_size` (2**20) for which a program's
peak bytes (XLA's figures: arguments + outputs + temporaries - aliased) fit a budget.
Three programs of a batch `b`: the Adam train step of case 8 (a peak linear in `b`
piecewise: XLA needs about 616 B more per row up to 64 rows and about 1,400 B beyond,
so the probes' line overshoots and a secant corrects it), rows padded to a multiple of
64 (a peak with steps) and an outer product (quadratic).

Why the baseline is fair: it is the search users write by hand when they do not
extrapolate: check that size 1 fits, then bisect `1..max_size` with
`jax.jit(f).lower(inputs at size n).compile().memory_analysis()`, which is exact
too (it has compiled the answer and the next size) and is not fooled by steps or
curvature. Both sides must give the same size (asserted). The measure is the number
of compilations, deterministic for a given XLA, which is what the search's time is made
of (each compilation of a real train step takes seconds); times are in the JSON.
Goals: at most 8 compilations (the contract's bound for a linear peak; 6 here) against
bisection's 21 for the train step, and at most 0.75x bisection's for the others.
`--quick` runs the outer product only (the cheapest to compile).
"""

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Goal, Row, at_most, case
from workloads import ADAM_SIZES, adam_inputs, make_train_step


MAX_SIZE = 2**20
(_B,) = jax.export.symbolic_shape("b")


def _peak(f: Callable[..., Any], args: tuple[Any, ...]) -> int:
    m = jax.jit(f).lower(*args).compile().memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def bisection(f: Callable[..., Any], inputs: Callable[[Any], tuple[Any, ...]], budget: int) -> tuple[int, int]:
    """The largest size that fits by plain bisection, and how many programs it compiled."""
    assert _peak(f, inputs(1)) <= budget
    lo, hi, compiles = 1, MAX_SIZE + 1, 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        compiles += 1
        lo, hi = (mid, hi) if _peak(f, inputs(mid)) <= budget else (lo, mid)
    return lo, compiles


def _adam() -> tuple[Callable[..., Any], Callable[[Any], tuple[Any, ...]]]:
    init, _ = adam_inputs("float32")
    carry = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), init)

    def inputs(n: Any) -> tuple[Any, ...]:
        x = jax.ShapeDtypeStruct((n, ADAM_SIZES[0]), jnp.float32)
        return carry, (x, jax.ShapeDtypeStruct((n, ADAM_SIZES[-1]), jnp.float32))

    return make_train_step(), inputs


def _padded(x: jax.Array) -> jax.Array:
    return jnp.pad(x, ((0, -x.shape[0] % 64), (0, 0))) * 2


def _outer(x: jax.Array) -> jax.Array:
    return x[:, None] * x[None, :]


PROGRAMS: dict[str, Callable[[], tuple[Callable[..., Any], Callable[[Any], tuple[Any, ...]]]]] = {
    "Adam MLP train step (near-linear)": _adam,
    "rows padded to 64 (steps)": lambda: (_padded, lambda n: (jax.ShapeDtypeStruct((n, 16), jnp.float32),)),
    "outer product (quadratic)": lambda: (_outer, lambda n: (jax.ShapeDtypeStruct((n,), jnp.float32),)),
}
GOALS = {"Adam MLP train step (near-linear)": Goal("<=", 8 / 21, "<=8/21 (at most 8 compilations)")}
BUDGET = 10**8


@case("fit")
def fit(cfg: Config) -> list[Row]:
    """16. ts.largest_fit vs a plain bisection: programs compiled to find the largest batch."""
    rows = []
    for name, make in list(PROGRAMS.items())[-1 if cfg.quick else 0 :]:
        f, inputs = make()
        start = time.perf_counter()
        expected, baseline = bisection(f, inputs, BUDGET)
        seconds = time.perf_counter() - start
        ts.clear_cache()
        start = time.perf_counter()
        found = ts.largest_fit(f, *inputs(_B), dim="b", budget=BUDGET)
        fit_seconds = time.perf_counter() - start
        assert found.size == expected, (name, found.size, expected)
        row = Row(
            f"16 largest_fit vs bisection, compilations: {name}",
            baseline,
            found.compiles,
            GOALS.get(name, at_most(0.75, "fewer compilations")),
            unit="compiles",
            note=f"b = {found.size:,}",
        )
        row.detail.update(size=found.size, bisection_seconds=seconds, largest_fit_seconds=fit_seconds)
        rows.append(row)
    return rows
