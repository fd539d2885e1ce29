"""Case 18, `scale_cached_call` (group `scale`): a cached `out_structure` call at 1,000,000 leaves vs its floor.

`ts.out_structure(first_layer, tree)`, the same call repeated (every call
after the first is a cache hit), where `tree` is the model-like tree of
cases 11-13 (`workloads.model_tree`) with 1,000,000 distinct `jax.Array`
leaves (`workloads.model_leaves`, made once) and `first_layer` returns the
tree's first layer. The floor is `jax.tree_util.tree_flatten` of the same
tree + `jax.typeof` of each leaf (`workloads.typeof_floor`). Goal <=1.5x.
The row checks that one more call is 1 cache hit and 0 misses, and (untimed)
that the answer is the first layer's structure.

Why the baseline is fair: a cache keyed on the inputs' abstract values cannot
answer before it has flattened the inputs and read each leaf's abstract
value; the floor does exactly that and nothing else (it keeps the treedef, as
a key must). Both sides get the same tree object on every call.

Repetitions: 5 (a call takes ~1 s at 1M leaves; plus one untimed warm-up per
side). Under `--quick`: 10,000 leaves, 3 repetitions.
"""

from typing import Any

import treeshape as ts

from harness import Config, Row, at_most, case, check_cache, compare, k, repeat, timed_row
from workloads import model_leaves, model_tree, typeof_floor


N_LEAVES, N_LEAVES_QUICK = 1_000_000, 10_000


def first_layer(tree: dict[str, Any]) -> Any:
    return tree["layers"][0]


@case("scale_cached_call", group="scale")
def scale_cached_call(cfg: Config) -> list[Row]:
    """18. A cached out_structure call, 1M arrays, vs flatten + jax.typeof of each leaf."""
    n = N_LEAVES_QUICK if cfg.quick else N_LEAVES
    tree = model_tree(model_leaves(n, "array"))
    got = ts.out_structure(first_layer, tree)  # the one miss, untimed
    if got != ts.structure_of(first_layer(tree)):
        raise AssertionError("out_structure gave another structure than the first layer's")
    t = compare(
        repeat(lambda: typeof_floor(tree)),
        repeat(lambda: ts.out_structure(first_layer, tree)),
        cfg,
        reps=5,
    )
    row = timed_row(f"18 cached out_structure, {k(n)} arrays vs flatten + jax.typeof", t, at_most(1.5))
    row.detail["leaves"] = n
    return [check_cache(row, lambda: ts.out_structure(first_layer, tree), 1, 0)]
