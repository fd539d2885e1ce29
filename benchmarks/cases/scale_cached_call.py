"""Case 18, `scale_cached_call` (group `scale`): a cached `out_structure` call, 1,000,000 and 100 leaves, vs its floor.

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

A second row (issue 62) times the same call on a state of 100 leaves (the same
layout, 10 layers) against flatten + one `.aval` read per leaf
(`workloads.aval_floor`, the tighter floor of case 3), both sides on the same
tree object: there what a hit does beside the floor weighs most, per call
(the key, the lookup) and per container (the walk for cycles before JAX's
flatten, the comparison of the call's treedef with the entry's), beside a
floor of ~10-25 us. Goal <=2x, as case 3's (whose 101 leaves are a list of
dicts: 2 levels of containers, where these have 5). It checks 1 hit, 0 misses.

Repetitions: 5 (a call takes ~1 s at 1M leaves; plus one untimed warm-up per
side), 31 for the 100-leaf row. Under `--quick`: 10,000 leaves, 3 repetitions
(the 100-leaf row unchanged but for its repetitions).
"""

from typing import Any

import jax

import treeshape as ts

from harness import Config, Row, at_most, case, check_cache, compare, k, repeat, timed_row
from workloads import aval_floor, model_leaves, model_tree, typeof_floor


N_LEAVES, N_LEAVES_QUICK = 1_000_000, 10_000
N_STATE = 100  # the small state of issue 62


def first_layer(tree: dict[str, Any]) -> Any:
    return tree["layers"][0]


@case("scale_cached_call", group="scale")
def scale_cached_call(cfg: Config) -> list[Row]:
    """18. A cached out_structure call, 1M arrays, vs flatten + jax.typeof of each leaf; and
    the same call on a state of 100 arrays vs flatten + one `.aval` per leaf."""
    n = N_LEAVES_QUICK if cfg.quick else N_LEAVES
    tree = model_tree(model_leaves(n, "array"))
    got = ts.out_structure(first_layer, tree)  # the one miss, untimed
    if got != ts.structure_of(first_layer(tree)):
        raise AssertionError("out_structure gave another structure than the first layer's")
    large = _cached_row(cfg, tree, typeof_floor, f"{k(n)} arrays vs flatten + jax.typeof", at_most(1.5), reps=5)
    state = model_tree(model_leaves(N_STATE, "array"))
    ts.out_structure(first_layer, state)  # the one miss, untimed
    small = _cached_row(cfg, state, aval_floor, f"{N_STATE} arrays vs flatten + one .aval per leaf", at_most(2), 31)
    return [large, small]


def _cached_row(cfg: Config, tree: Any, floor: Any, label: str, goal: Any, reps: int) -> Row:
    """The cached call on `tree` against `floor(tree)`, interleaved, its one hit checked."""
    t = compare(repeat(lambda: floor(tree)), repeat(lambda: ts.out_structure(first_layer, tree)), cfg, reps=reps)
    row = timed_row(f"18 cached out_structure, {label}", t, goal)
    row.detail["leaves"] = len(jax.tree.leaves(tree))
    return check_cache(row, lambda: ts.out_structure(first_layer, tree), 1, 0)
