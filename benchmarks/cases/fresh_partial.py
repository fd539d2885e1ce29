"""Case 2, `fresh_partial`: a partial rebuilt on every call; JAX retraces, treeshape hits its cache.

The same call as case 1 with `functools.partial(mlp, params)` or
`jax.tree_util.Partial(mlp, params)` built anew inside every timed call, on
both sides (so the construction cost counts on both).

Why the baseline is fair: this is how code under `jit` or in a training loop
calls it, and JAX keys its cache on the partial object, so it retraces;
treeshape keys on the underlying function and the bound arguments' types.
Goal: >=50x faster. Each row checks that one more call is 1 hit and 0 misses.
"""

import functools as ft
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

import treeshape as ts

from harness import Config, Row, case, check_cache, compare, faster, repeat, timed_row
from workloads import mlp, mlp_inputs


@case("fresh_partial")
def fresh_partial(cfg: Config) -> list[Row]:
    """2. A partial rebuilt on every call: JAX retraces, treeshape hits its cache."""
    params, x = mlp_inputs()
    rows = []
    makers: tuple[tuple[str, Callable[..., Any]], ...] = (
        ("functools.partial", ft.partial),
        ("tree_util.Partial", jtu.Partial),
    )
    for label, make in makers:

        def with_jax(make: Callable[..., Any] = make) -> Any:
            return jax.eval_shape(make(mlp, params), x)

        def with_treeshape(make: Callable[..., Any] = make) -> Any:
            return ts.out_structure(make(mlp, params), x)

        t = compare(repeat(with_jax), repeat(with_treeshape), cfg, reps=21)
        row = timed_row(f"2 cached call, fresh {label}", t, faster(50))
        rows.append(check_cache(row, with_treeshape, 1, 0))
    return rows
