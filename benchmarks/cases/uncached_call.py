"""Case 4, `uncached`: a first call (a fresh function object each time) vs `jax.eval_shape`.

Each repetition makes a new closure that calls the MLP of `workloads.py`
(`workloads.fresh_mlp`), on both sides, in the untimed setup, so neither
JAX's cache nor treeshape's can know it; the timed call is
`ts.out_structure(f, params, x)` vs `jax.eval_shape(f, params, x)`.

Why the baseline is fair: both sides trace the same function once; what
treeshape adds on a miss (its cache key, the wrapper that handles static
leaves and tracers, the `Structure`, the cache insertion) is what the ratio
shows. Goal <=1.15x. The row checks that one more call is 0 hits, 1 miss.
"""

import jax

import treeshape as ts

from harness import Config, Row, at_most, case, check_cache, compare, per_call, timed_row
from workloads import fresh_mlp, mlp_inputs


@case("uncached")
def uncached_call(cfg: Config) -> list[Row]:
    """4. A first call (a fresh function object each time) vs `jax.eval_shape`."""
    params, x = mlp_inputs()
    t = compare(
        per_call(fresh_mlp, lambda f: jax.eval_shape(f, params, x)),
        per_call(fresh_mlp, lambda f: ts.out_structure(f, params, x)),
        cfg,
        reps=21,
    )
    row = timed_row("4 first (uncached) call, 50-layer MLP", t, at_most(1.15))
    return [check_cache(row, lambda: ts.out_structure(fresh_mlp(), params, x), 0, 1)]
