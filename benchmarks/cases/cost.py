"""Case 15, `cost`: a cached `ts.cost` of a fresh partial vs `jax.jit(...).lower().compile()` of it.

`ts.cost(functools.partial(mlp, params), x)` vs
`jax.jit(functools.partial(mlp, params)).lower(x).compile()`, the partial
built anew inside every timed call on both sides (so its construction counts
on both), on the 50-layer MLP of `workloads.py` (101 leaves).

Why the baseline is fair: it is what a user writes by hand to get the same
figures (`.memory_analysis()` and `.cost_analysis()` of the compiled program,
which cost microseconds on top), and how code in a training loop or under
`jit` calls it: JAX keys its caches on the partial object, so every call
traces, lowers and compiles again, while `ts.cost` keys on the underlying
function and the bound arguments' types and answers from its cache. Goal:
treeshape >=100x faster. The row checks, strictly, that one more call is 1
hit and 0 misses of the cost cache.
"""

import functools as ft
from typing import Any

import jax

import treeshape as ts

from harness import Config, Row, case, compare, faster, repeat, timed_row
from workloads import mlp, mlp_inputs


@case("cost")
def cost(cfg: Config) -> list[Row]:
    """15. A cached ts.cost of a fresh partial vs jax.jit(...).lower().compile() of it."""
    params, x = mlp_inputs()

    def with_jax() -> Any:
        return jax.jit(ft.partial(mlp, params)).lower(x).compile()

    def with_treeshape() -> Any:
        return ts.cost(ft.partial(mlp, params), x)

    t = compare(repeat(with_jax), repeat(with_treeshape), cfg, reps=11)
    row = timed_row("15 cached ts.cost, fresh functools.partial, vs lower().compile()", t, faster(100))
    before = ts.cache_info()
    with_treeshape()
    after = ts.cache_info()
    got = (after.cost_hits - before.cost_hits, after.cost_misses - before.cost_misses)
    row.detail["cache"] = {"hits": got[0], "misses": got[1]}
    if got != (1, 0):
        row.add_note(f"WARNING: expected 1 cost-cache hit and 0 misses per call, got {got[0]} and {got[1]}")
        row.cache_ok = False
    return [row]
