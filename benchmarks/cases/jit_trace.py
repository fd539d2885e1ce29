"""Case 5, `jit_trace`: tracing a jitted step that infers 20 structures on fresh partials.

A step function that 20 times infers the structure of
`functools.partial(mlp, params)(x)` (a fresh partial holding the step's
tracers) and adds `jnp.zeros` of that shape to `x`; the two sides differ only
in using `ts.out_structure` or `jax.eval_shape`. Each repetition traces a
*new* step function with `jax.jit(step).trace(params, x)`.

Why the baseline is fair: tracing only, no lowering and no compilation, which
would add the same cost to both sides. "Cold cache" empties treeshape's cache
before each trace (checked: 1 miss + 19 hits); "warm cache" keeps it
(retracing the same step for new shapes elsewhere; checked: 20 hits). JAX's
side retraces each fresh partial (its cache keys on the partial object).
Goal <=0.25x.
"""

import functools as ft
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Row, at_most, case, check_cache, compare, per_call, timed_row
from workloads import mlp, mlp_inputs


N_INFER = 20


def traced_step(infer: Callable[..., Any]) -> Callable[..., jax.Array]:
    """A fresh function that infers a structure 20 times from fresh partials."""

    def step(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        for _ in range(N_INFER):
            out = infer(ft.partial(mlp, params), x)
            x = x + jnp.zeros(out.shape, out.dtype)
        return x

    return step


def _ts_tree(fn: Callable[..., Any], *args: Any) -> Any:
    return ts.out_structure(fn, *args).tree


@case("jit_trace")
def jit_trace(cfg: Config) -> list[Row]:
    """5. Tracing a jitted step that infers 20 structures on fresh partials."""
    params, x = mlp_inputs()
    rows = []
    for label, clear in (("cold cache", True), ("warm cache", False)):

        def setup(infer: Callable[..., Any], clear: bool = clear) -> Callable[[], Any]:
            def make() -> Any:
                if clear:
                    ts.clear_cache()
                return jax.jit(traced_step(infer))

            return make

        t = compare(
            per_call(setup(jax.eval_shape), lambda f: f.trace(params, x)),
            per_call(setup(_ts_tree), lambda f: f.trace(params, x)),
            cfg,
            reps=11,
        )
        note = (
            "ts.clear_cache() before each trace: 1 miss + 19 hits"
            if clear
            else "cache kept across traces (retracing the same step): 20 hits"
        )
        row = timed_row(
            f"5 jit trace, {N_INFER} infers on fresh partials ({label})",
            t,
            at_most(0.25),
            note,
        )
        if clear:
            ts.clear_cache()
        trace = lambda: jax.jit(traced_step(_ts_tree)).trace(params, x)  # noqa: E731
        rows.append(check_cache(row, trace, N_INFER - clear, int(clear)))
    return rows
