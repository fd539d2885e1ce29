"""Case 1, `cached`: a repeated call, treeshape's cache vs JAX's own trace cache.

`ts.out_structure(mlp, params, x)` vs `jax.eval_shape(mlp, params, x)`, the
same call repeated, on the 50-layer MLP of `workloads.py` (101 leaves; both
sides get exactly the same arguments).

Why the baseline is fair: JAX caches this trace too (by function identity
and input types), so the baseline is JAX's own cache hit (~1 ms), not a
retrace. Goal: treeshape >=20x faster. The row checks that one more call is
1 cache hit and 0 misses.
"""

import jax

import treeshape as ts

from harness import Config, Row, case, check_cache, compare, faster, repeat, timed_row
from workloads import mlp, mlp_inputs


@case("cached")
def cached_call(cfg: Config) -> list[Row]:
    """1. A repeated call: treeshape's cache vs JAX's own trace cache."""
    params, x = mlp_inputs()
    t = compare(
        repeat(lambda: jax.eval_shape(mlp, params, x)),
        repeat(lambda: ts.out_structure(mlp, params, x)),
        cfg,
        reps=31,
    )
    row = timed_row("1 cached call, 50-layer MLP", t, faster(20))
    return [check_cache(row, lambda: ts.out_structure(mlp, params, x), 1, 0)]
