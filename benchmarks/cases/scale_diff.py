"""Case 12, `scale_diff` (group `scale`, issue 9 "Scale"): `diff` of big trees vs flattening both with paths.

Three rows, each against the floor `jax.tree_util.tree_flatten_with_path` of
both trees (`workloads.paths_floor`), measured side by side in the same run:

- *1,000,000 `ShapeDtypeStruct`s, one leaf's shape changed*: `s.diff(other)`
  where `s = ts.structure_of(tree)`, `tree` the model-like tree of case 11
  (`workloads.model_tree`, 10 leaves per layer, 1,000,000 distinct
  `ShapeDtypeStruct` leaves) and `other` the same tree with the middle
  layer's `attn` `k` leaf made f32[4,5] instead of f32[4,4]
  (`workloads.changed_tree`). Goal <=3x.
- *1,000,000 `ShapeDtypeStruct`s, one nested list grown*: the same with
  `other` the tree whose middle layer's `mlp` `bias` list has a third leaf
  (`workloads.grown_tree`): the treedefs differ, so `diff` must walk both
  trees' nodes to find where. Goal <=3x.
- *100,000-leaf flat list, one leaf longer*: `ts.structure_of(flat).diff(longer)`,
  `flat` a list of 100,000 distinct `ShapeDtypeStruct`s and `longer` the
  same list with one more; here `structure_of` is inside the timing too (a
  new list object, same leaves, and `ts.clear_cache()` in the untimed setup
  of both sides). Goal <=3x.
- *100,000 leaves with a symbolic batch size*: the same with `f32[b,n]`
  leaves (`b` from `jax.export.symbolic_shape`) diffed against a batch of
  `f32[8,n]` leaves in which one leaf has 9 rows: `diff` binds `b` once
  across the list and reports that leaf (naming where `b` was bound). Goal
  <=3x.

Why the baseline is fair: a diff that reports *where* trees differ must at
least visit every leaf of both trees and know its path; flattening both
with paths does exactly that, and leaves the comparison itself out. In the
1M rows `s` is built fresh by `ts.structure_of(tree)` (after
`ts.clear_cache()`) in the untimed setup before every call, so data that a
`Structure` memoises (its paths, its comparison keys) does not flatter the
timed `diff`. What each side allocates is freed inside its timing (as in
every `per_call` row). Each row first checks (untimed) that the diff finds
exactly the one expected mismatch, of the right kind at the right path (e.g.
`['layers'][50000]['attn']['k']`, shape; `['layers'][50000]['mlp']['bias'][2]`,
structure; `[100000]`, structure), so a wrong-but-fast diff cannot pass: the
run stops with an `AssertionError` otherwise.

Repetitions: 5 for each 1M row (one call, and one setup, take ~1 s), 11 for
the 100k row, plus one or two untimed warm-up calls per side. Under
`--quick`: 10,000 and 1,000 leaves, 3 repetitions.
"""

from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Row, at_most, case, compare, k, per_call, timed_row
from workloads import (
    changed_tree,
    check_one_mismatch,
    grown_tree,
    model_leaves,
    model_tree,
    paths_floor,
    sds_leaf,
)


N_MODEL, N_MODEL_QUICK = 1_000_000, 10_000
N_FLAT, N_FLAT_QUICK = 100_000, 1_000


@case("scale_diff", group="scale")
def scale_diff(cfg: Config) -> list[Row]:
    """12. diff of 1M-leaf trees (a shape changed; a list grown) and of a 100k-leaf list vs flatten_with_path."""
    n = N_MODEL_QUICK if cfg.quick else N_MODEL
    leaves = model_leaves(n, "sds")
    tree = model_tree(leaves)

    def fresh_structure() -> ts.Structure:
        ts.clear_cache()
        return ts.structure_of(tree)

    rows = []
    for label, make, kind in (
        ("one leaf's shape changed", changed_tree, "shape"),
        ("one nested list grown by one leaf", grown_tree, "structure"),
    ):
        other, path = make(leaves)
        check_one_mismatch(fresh_structure().diff(other), path, kind)

        def floor(_: None, other: Any = other) -> Any:
            return paths_floor(tree, other)

        def diff(s: ts.Structure, other: Any = other) -> Any:
            return s.diff(other)

        t = compare(per_call(ts.clear_cache, floor), per_call(fresh_structure, diff), cfg, reps=5)
        note = f"s = ts.structure_of(tree) fresh before each call (untimed); the one mismatch: {kind} at {path}"
        rows.append(timed_row(f"12 diff, {label}, {k(n)} SDS vs flatten_with_path of both", t, at_most(3), note))

    m = N_FLAT_QUICK if cfg.quick else N_FLAT
    flat = [sds_leaf(i) for i in range(m)]
    longer = [*flat, sds_leaf(m)]
    note = f"structure_of inside the timing; the one mismatch: structure at [{m}]"
    name = f"12 structure_of(flat).diff(longer), {k(m)}-leaf list vs flatten_with_path"
    rows.append(_list_row(name, flat, longer, f"[{m}]", "structure", note, cfg))

    # Symbolic dimensions: every leaf has the batch size `b`, which diff binds once (to 8) across the list.
    (b,) = jax.export.symbolic_shape("b")
    symbolic = [jax.ShapeDtypeStruct((b, i % 7 + 1), jnp.float32) for i in range(m)]
    batch = [jax.ShapeDtypeStruct((8, i % 7 + 1), jnp.float32) for i in range(m)]
    batch[m // 2] = jax.ShapeDtypeStruct((9, m // 2 % 7 + 1), jnp.float32)  # b = 9 here: the one mismatch
    note = f"structure_of inside the timing; b bound to 8 once; the one mismatch: shape at [{m // 2}] (b = 9)"
    name = f"12 structure_of(symbolic).diff(batch), {k(m)} leaves f32[b,n] vs flatten_with_path"
    rows.append(_list_row(name, symbolic, batch, f"[{m // 2}]", "shape", note, cfg))
    return rows


def _list_row(name: str, leaves: list[Any], other: list[Any], path: str, kind: str, note: str, cfg: Config) -> Row:
    """`ts.structure_of(a new list of leaves).diff(other)` vs `tree_flatten_with_path` of both, once
    checked to find the one mismatch of `kind` at `path`."""

    def fresh_list() -> list[Any]:
        ts.clear_cache()
        return list(leaves)

    check_one_mismatch(ts.structure_of(fresh_list()).diff(other), path, kind)
    t = compare(
        per_call(fresh_list, lambda f: paths_floor(f, other)),
        per_call(fresh_list, lambda f: ts.structure_of(f).diff(other)),
        cfg,
        reps=11,
    )
    return timed_row(name, t, at_most(3), note)
