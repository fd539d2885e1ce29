"""Case 11, `scale_structure_of` (group `scale`, issue 9 "Scale"): `structure_of` of big trees vs reading them by hand.

Two rows, each against a floor measured side by side in the same run:

- *100,000 arrays, first call*: `ts.structure_of(tree)` of a model-like tree
  (`workloads.model_tree`: `{"layers": [layer, ...]}`, each layer 10 leaves
  in nested dicts and a list: `attn` q/k/v/o f32[4,4], `mlp` up bf16[4,8],
  down bf16[8,4], bias [f32[8], f32[4]], `norm` scale f32[4], count i32[])
  whose 100,000 leaves are distinct `jax.Array`s made with `jnp.zeros`. The
  floor is `jax.tree_util.tree_flatten` + `jax.typeof` of each leaf
  (`workloads.typeof_floor`): what describing an existing tree by hand
  takes. Goal <=2x.
- *1,000,000 `ShapeDtypeStruct`s*: `ts.structure_of(tree)` of the same
  layout with 1,000,000 *distinct* `jax.ShapeDtypeStruct` leaves (one object
  per leaf, as `jax.eval_shape` of a model returns them; made once, ~2 s).
  The floor is `tree_flatten` + reading `.shape`, `.dtype` and `.weak_type`
  of each leaf (`workloads.fields_floor`). Goal <=2x.

Why the baselines are fair: a `Structure` is the treedef plus each leaf's
type, so no implementation can do less than flatten the tree and read every
leaf's type; the floors do exactly that and keep the treedef. Both sides run
the same untimed setup before every call: `ts.clear_cache()` and a *new tree
object* (new dicts and lists around the same leaves, `workloads.model_tree`),
so neither treeshape's `out_structure` cache nor anything keyed on the tree
object can answer from memory: every timed call is a first call. What each
side allocates is also freed inside its timing (as in every `per_call` row).
After timing, each row checks (untimed) that `structure_of` gave the
floor's treedef and leaf types, so a wrong-but-fast result cannot pass.

Repetitions: 7 for the 100k row; 5 for the 1M row (a call takes ~1 s; plus
one untimed warm-up call per side). Under `--quick`: 1,000 arrays and
10,000 `ShapeDtypeStruct`s, 3 repetitions.
"""

from typing import Any

import jax.tree_util as jtu

import treeshape as ts

from harness import Config, Row, at_most, case, compare, k, per_call, timed_row
from workloads import fields_floor, model_leaves, model_tree, typeof_floor


N_ARRAYS, N_ARRAYS_QUICK = 100_000, 1_000
N_SDS, N_SDS_QUICK = 1_000_000, 10_000


def _check_same(s: ts.Structure, tree: Any) -> None:
    """Untimed: `s` has the tree's treedef and each leaf's shape, dtype and weak type."""
    leaves, treedef = jtu.tree_flatten(tree)
    if s.treedef != treedef:
        raise AssertionError("structure_of gave another treedef than tree_flatten")
    got = [(x.shape, x.dtype, x.weak_type) for x in s.leaves]
    if got != [(x.shape, x.dtype, x.weak_type) for x in leaves]:
        raise AssertionError("structure_of gave other leaf types than the leaves have")


def _row(cfg: Config, name: str, leaves: tuple[Any, ...], floor: Any, reps: int, note: str) -> Row:
    def setup() -> dict[str, Any]:
        ts.clear_cache()
        return model_tree(leaves)  # a new tree object around the same leaves

    t = compare(per_call(setup, floor), per_call(setup, ts.structure_of), cfg, reps=reps)
    row = timed_row(name, t, at_most(2), note)
    tree = setup()
    _check_same(ts.structure_of(tree), tree)
    row.detail["leaves"] = len(leaves)
    return row


@case("scale_structure_of", group="scale")
def scale_structure_of(cfg: Config) -> list[Row]:
    """11. structure_of of 100k arrays and of 1M ShapeDtypeStructs vs flatten + read each leaf's type."""
    n_arrays = N_ARRAYS_QUICK if cfg.quick else N_ARRAYS
    n_sds = N_SDS_QUICK if cfg.quick else N_SDS
    setup_note = "both sides: ts.clear_cache() and a new tree object before each call (untimed)"
    return [
        _row(
            cfg,
            f"11 structure_of first call, {k(n_arrays)} arrays vs flatten + jax.typeof",
            model_leaves(n_arrays, "array"),
            typeof_floor,
            7,
            setup_note,
        ),
        _row(
            cfg,
            f"11 structure_of, {k(n_sds)} ShapeDtypeStructs vs flatten + read shape/dtype/weak_type",
            model_leaves(n_sds, "sds"),
            fields_floor,
            5,
            setup_note + "; distinct ShapeDtypeStruct objects",
        ),
    ]
