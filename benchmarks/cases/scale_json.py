"""Case 14, `scale_json` (group `scale`, issue 20 "Speed"): JSON and tables of big Structures vs the least they must do.

The rows are on `s = ts.structure_of(workloads.model_tree(leaves))`, the
model-like tree of cases 11-13 (`{"layers": [layer, ...]}`, 10 leaves per
layer in nested dicts and a list: 1.5 tree nodes per leaf), its leaves
distinct `jax.ShapeDtypeStruct` objects of the six leaf types a layer has
(f32[4,4], bf16[4,8], bf16[8,4], f32[8], f32[4], i32[]): as in a real
model, the layers repeat and many leaves share a type. Each row is measured
against its floor side by side in the same run:

- *`s.to_json()`, 200,000 and 1,000,000 leaves*, vs `json.dumps` of the
  same list of leaf record dicts (`{"path", "shape", "dtype", "weak_type"}`
  each, as `treeshape inspect --json` prints them), built untimed. Goal <=3x
  at 200,000 leaves, <=1.2x at 1,000,000.
- *`ts.Structure.from_json(text)`, 200,000 and 1,000,000 leaves*, vs
  `json.loads(text)` plus one `jax.ShapeDtypeStruct` per leaf record (its
  dtype looked up by name in a dict, the cheapest way). Goal <=3x.
- *`ts.Structure.from_json(text)`, 1,000,000 leaves*, vs `json.loads(text)`
  plus one `jax.ShapeDtypeStruct` per distinct leaf type (the six types,
  known to the floor in advance: it neither reads nor checks a record).
  A loaded Structure shares one (immutable) description among the leaves of
  a type, so parsing the text is most of what it must do. Goal <=1.3x.
- *`str(s)`, 1,000,000 and 20,000 leaves* (the table shows 50 rows; its
  total row counts every leaf), `s` as `ts.structure_of(tree)` returns it (a
  new one for every call, made in the untimed setup), vs one pass over the
  leaves summing their bytes (`math.prod(x.shape) * x.dtype.itemsize` for
  each array leaf). Goal <=2x at both sizes (issue 51 for 20,000: the 50
  rows weigh more beside a smaller pass).

Rows for information (no goal), at 200,000 leaves unless said: `to_json`
again on the same Structure (its paths memoised by the first call, as after
a `str(s)` or a `diff`); `to_json` and `from_json` of a tree in which no two
layers are alike (each layer has its own keys and leaf shapes, so only the
small subtrees inside a layer repeat, and most leaves have a type of their
own: what treeshape's per-subtree and per-leaf-type work costs when it is
not shared); `str(s)` at 1,000,000 leaves vs `s.nbytes` of a new
Structure (treeshape's own pass over the leaves, which also counts typed
PRNG keys by their key data); and `str(s)` of a Structure rebuilt from its
treedef and leaves (`ts.Structure(s.treedef, s.leaves)`, as pickle or a
hand-built one gives: `structure_of` notes the paths of the leaves at both
ends while it has the tree, and this one must rebuild the tree once to find
them).

Why the baselines are fair: `to_json` must write at least every leaf's
record, and `json.dumps` of those records is the cheapest way to write them;
the floor gets the records (and so every leaf's path) for free, while
`to_json` also writes the tree's nodes and finds the paths. `from_json` must
at least parse the text and make one leaf description per leaf; the floor
trusts the text, while `from_json` checks every field (and that each
record's path is where the tree puts that leaf) and rebuilds the treedef. A
table's total row needs every leaf's bytes, so a table can cost no less
than one pass summing them; the floor's pass is as tight as Python allows.

No memo flatters the treeshape side: `to_json` (but for the "again" row)
and `str` run on a *new* `ts.Structure` (same treedef and leaves, or fresh
from `structure_of`, built in the untimed setup of every call), so nothing
it memoises (paths, sizes, bytes) survives from one call to the next. What each side allocates is
freed inside its timing (as in every `per_call` row). Each row first checks
its result (untimed): `to_json`'s leaf records equal the floor's,
`from_json` gives a Structure equal to `s`, and the table's total row counts
every leaf and the floor's bytes; a wrong but fast answer stops the run with
an `AssertionError`.

Repetitions: 7 for the 200k rows, 5 for the 1M rows (a `from_json` and its
floor take several seconds there), 15 for the 20k table, plus one or two
untimed warm-up calls per side. Under `--quick`: 2,000 and 10,000 leaves (and
a table of 2,000), 3 repetitions.
"""

import functools as ft
import json
import math
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts
from treeshape._shapes import human_bytes  # only to check the table's total row

from harness import Config, Row, at_most, case, compare, k, per_call, repeat, timed_row
from workloads import BF16, F32, I32, model_leaves, model_tree


SIZES, SIZES_QUICK = (200_000, 1_000_000), (2_000, 10_000)
TABLE, TABLE_QUICK = 20_000, 2_000  # the smaller table (issue 51)


def leaf_records(s: ts.Structure) -> list[dict[str, Any]]:
    """The records `to_json` writes for `s`'s leaves (all plain arrays here), built by hand."""
    return [
        {"path": path, "shape": list(leaf.shape), "dtype": leaf.dtype.name, "weak_type": leaf.weak_type}
        for path, leaf in zip(s.paths, s.leaves, strict=True)
    ]


def load_floor(text: str) -> list[jax.ShapeDtypeStruct]:
    """The least a loader must do: parse the text and make one `ShapeDtypeStruct` per leaf record."""
    dtypes: dict[str, Any] = {}
    out = []
    for r in json.loads(text)["leaves"]:
        name = r["dtype"]
        dtype = dtypes.get(name)
        if dtype is None:
            dtype = dtypes[name] = jnp.dtype(name)
        out.append(jax.ShapeDtypeStruct(tuple(r["shape"]), dtype, weak_type=r["weak_type"]))
    return out


def load_floor_shared(text: str, types: list[tuple[tuple[int, ...], Any, bool]]) -> list[jax.ShapeDtypeStruct]:
    """Parse the text and make one `ShapeDtypeStruct` per distinct leaf type (`types`, found untimed)."""
    json.loads(text)
    return [jax.ShapeDtypeStruct(shape, dtype, weak_type=weak) for shape, dtype, weak in types]


def bytes_floor(leaves: tuple[Any, ...]) -> int:
    """One pass over the leaves summing the bytes of the array leaves: what a table's total row needs at least."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves if isinstance(x, jax.ShapeDtypeStruct))


@ft.cache
def distinct_tree(n: int) -> dict[str, Any]:
    """`n` leaves (a multiple of 10) in layers of which no two are alike: layer `i` has the keys `w{i}`,
    `v{i}`, `b{i}` and leaves of shapes made from `i`, so only the lists inside a layer repeat."""
    layers = []
    for i in range(n // 10):
        d = i % 4096 + 1
        layers.append(
            {
                f"w{i}": [jax.ShapeDtypeStruct((d, j + 1), F32) for j in range(4)],
                f"v{i}": [jax.ShapeDtypeStruct((j + 1, d), BF16) for j in range(4)],
                f"b{i}": [jax.ShapeDtypeStruct((d,), F32), jax.ShapeDtypeStruct((), I32)],
            }
        )
    return {"layers": layers}


def _structure(tree: Any) -> ts.Structure:
    ts.clear_cache()
    return ts.structure_of(tree)


def _fresh(s: ts.Structure) -> ts.Structure:
    return ts.Structure(s.treedef, s.leaves)  # nothing memoised


def _checked(s: ts.Structure) -> tuple[list[dict[str, Any]], str]:
    """Untimed: the floor's records, and `s.to_json()` after checking that it writes them and loads back as `s`."""
    records = leaf_records(s)
    text = s.to_json()
    if json.loads(text)["leaves"] != records:
        raise AssertionError("to_json wrote other leaf records than the floor")
    if ts.Structure.from_json(text) != s:
        raise AssertionError("from_json did not give back the Structure")
    return records, text


def _json_rows(cfg: Config, s: ts.Structure, label: str, reps: int, goal: bool, large: bool = False) -> list[Row]:
    records, text = _checked(s)
    note = f"{s.treedef.num_nodes - len(s):,} tree nodes besides the leaves"
    dump = compare(per_call(lambda: records, json.dumps), per_call(lambda: _fresh(s), ts.Structure.to_json), cfg, reps)
    load = compare(per_call(lambda: text, load_floor), per_call(lambda: text, ts.Structure.from_json), cfg, reps)
    target = at_most(3) if goal else None
    dump_target = at_most(1.2) if large else target
    rows = [
        timed_row(f"14 to_json, {label} vs json.dumps of the leaf records", dump, dump_target, note),
        timed_row(f"14 from_json, {label} vs json.loads + a ShapeDtypeStruct per leaf", load, target, note),
    ]
    if large:
        types = list(dict.fromkeys((leaf.shape, leaf.dtype, leaf.weak_type) for leaf in s.leaves))
        shared = compare(
            per_call(lambda: text, lambda t: load_floor_shared(t, types)),
            per_call(lambda: text, ts.Structure.from_json),
            cfg,
            reps,
        )
        rows.append(
            timed_row(
                f"14 from_json, {label} vs json.loads + a ShapeDtypeStruct per leaf type", shared, at_most(1.3), note
            )
        )
    for row in rows:
        row.detail["leaves"] = len(s)
    return rows


def _again_row(cfg: Config, s: ts.Structure, n: int) -> Row:
    records, _ = _checked(s)
    s.paths  # noqa: B018  (memoised now, as after a str(s) or a diff)
    t = compare(repeat(lambda: json.dumps(records)), repeat(s.to_json), cfg, reps=7)
    return timed_row(f"14 to_json again, {k(n)} leaves (paths known) vs json.dumps of the leaf records", t, None)


def _table_rows(cfg: Config, tree: Any, reps: int, info: bool = True) -> list[Row]:
    """`str(s)` vs summing the bytes; with `info`, the rows for information too."""
    s = _structure(tree)
    n = len(s)
    last = str(s).splitlines()[-1]
    total = bytes_floor(s.leaves)
    if not (last.startswith(f"total: {n:,} leaves") and last.endswith(f" {human_bytes(total)}")):
        raise AssertionError(f"the table's total row is not {n:,} leaves and {human_bytes(total)}: {last}")
    if str(_fresh(s)) != str(s):
        raise AssertionError("a rebuilt Structure's table differs from the one read from the tree")
    table = per_call(lambda: ts.structure_of(tree), str)
    floor = compare(per_call(lambda: s.leaves, bytes_floor), table, cfg, reps)
    row = timed_row(f"14 str(s), {k(n)} leaves (50 rows) vs one pass summing the bytes", floor, at_most(2))
    if not info:
        return [row]
    own = compare(per_call(lambda: _fresh(s), lambda x: x.nbytes), per_call(lambda: _fresh(s), str), cfg, reps)
    rebuilt = compare(per_call(lambda: s.leaves, bytes_floor), per_call(lambda: _fresh(s), str), cfg, reps)
    return [
        row,
        timed_row(f"14 str(s), {k(n)} leaves (50 rows) vs s.nbytes of a new Structure", own, None),
        timed_row(f"14 str(s) rebuilt from treedef and leaves, {k(n)} leaves vs summing the bytes", rebuilt, None),
    ]


@case("scale_json", group="scale")
def scale_json(cfg: Config) -> list[Row]:
    """14. to_json / from_json at 200k and 1M leaves vs json.dumps / json.loads; str(s) at 20k and 1M vs the bytes."""
    small, large = SIZES_QUICK if cfg.quick else SIZES
    table = TABLE_QUICK if cfg.quick else TABLE
    rows = _table_rows(cfg, model_tree(model_leaves(table, "sds")), 15, info=False)  # first: before the big heaps
    s_small = _structure(model_tree(model_leaves(small, "sds")))
    rows += _json_rows(cfg, s_small, f"{k(small)} leaves", 7, goal=True)
    rows.append(_again_row(cfg, s_small, small))
    rows += _json_rows(cfg, _structure(distinct_tree(small)), f"{k(small)} leaves, no two layers alike", 7, goal=False)
    large_tree = model_tree(model_leaves(large, "sds"))
    rows += _json_rows(cfg, _structure(large_tree), f"{k(large)} leaves", 5, goal=True, large=True)
    rows += _table_rows(cfg, large_tree, 5)
    return rows
