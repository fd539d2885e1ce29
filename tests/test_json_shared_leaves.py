"""A Structure loaded from JSON shares one leaf description among the leaves of a type:
paths, tables, `describe` and diffs still tell every leaf apart by where it is."""

import json

import jax
import jax.numpy as jnp
import pytest

import treeshape as ts


def _layer(i):
    # Layers alike but for every 97th one, so a big tree has both runs of equal subtrees and breaks.
    width = 5 if i % 97 == 42 else 4
    return {"b": jax.ShapeDtypeStruct((width,), jnp.float32), "w": jax.ShapeDtypeStruct((4, width), jnp.bfloat16)}


@pytest.fixture(scope="module")
def model():
    tree = {"head": jax.ShapeDtypeStruct((4,), jnp.float32), "layers": [_layer(i) for i in range(300)]}
    return tree, ts.structure_of(tree)


def test_loaded_leaves_of_a_type_are_one_description(model):
    _, s = model
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s
    assert loaded.leaves[1] is loaded.leaves[3]  # ['layers'][0]['b'] and ['layers'][1]['b']
    assert len({id(leaf) for leaf in loaded.leaves}) == 4  # f32[4], f32[5], bf16[4,4], bf16[4,5]


def test_paths_and_the_cut_table_name_every_leaf_where_it_is(model):
    tree, s = model
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded.paths == s.paths
    assert loaded.paths[-2:] == ("['layers'][299]['b']", "['layers'][299]['w']")
    rebuilt = ts.Structure(loaded.treedef, loaded.leaves)  # no paths known: found by walking the rebuilt tree
    table = str(s)
    assert "more leaves" in table and "['layers'][299]['w']" in table and "['layers'][150]['w']" not in table
    assert str(loaded) == table
    assert str(rebuilt) == table
    assert ts.describe(loaded.treedef.unflatten(loaded.leaves)) == ts.describe(tree)


def test_describe_by_depth_counts_every_shared_leaf(model):
    tree, s = model
    loaded = ts.Structure.from_json(s.to_json())
    assert ts.describe(loaded, depth=1) == ts.describe(tree, depth=1)
    assert (
        loaded.nbytes
        == s.nbytes
        == 4 * 4 + sum(4 * 5 * 2 + 5 * 4 if i % 97 == 42 else 4 * 4 * 2 + 4 * 4 for i in range(300))
    )


def test_a_diff_names_the_one_leaf_that_differs_among_equal_ones(model):
    tree, s = model
    loaded = ts.Structure.from_json(s.to_json())
    changed = {"head": tree["head"], "layers": list(tree["layers"])}
    changed["layers"][250] = {**changed["layers"][250], "b": jax.ShapeDtypeStruct((4,), jnp.float16)}
    [mismatch] = loaded.diff(changed)
    assert (mismatch.path, mismatch.kind) == ("['layers'][250]['b']", "dtype")
    assert (mismatch.expected, mismatch.actual) == (jnp.dtype(jnp.float32), jnp.dtype(jnp.float16))
    assert loaded.diff(tree) == []
    assert [m.path for m in s.diff(loaded.treedef.unflatten(loaded.leaves))] == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("path", 7, r"leaves\[5\]\.path: expected a string, got 7"),
        ("weak_type", 0, r"leaves\[5\]\.weak_type: expected true or false, got 0"),
        ("shape", [4.0], r"leaves\[5\]\.shape\[0\]"),
        ("shape", [True], r"leaves\[5\]\.shape\[0\]"),
        ("dtype", ["float32"], r"leaves\[5\]\.dtype"),
    ],
)
def test_a_field_equal_but_of_another_type_is_named_among_equal_records(model, field, value, message):
    _, s = model
    doc = json.loads(s.to_json())
    doc["leaves"][5][field] = value  # leaves [1], [3] and [5] are alike: the bulk reader must not take it for them
    with pytest.raises(ValueError, match=message):
        ts.Structure.from_json(json.dumps(doc))


def test_a_path_other_than_where_the_treedef_puts_the_leaf_is_named(model):
    _, s = model
    doc = json.loads(s.to_json())
    doc["leaves"][3]["path"], doc["leaves"][5]["path"] = doc["leaves"][5]["path"], doc["leaves"][3]["path"]
    with pytest.raises(ValueError, match=r"leaves\[3\]\.path: the treedef puts leaf 3 at \"\['layers'\]\[1\]\['b'\]\""):
        ts.Structure.from_json(json.dumps(doc))


@pytest.mark.parametrize("key", ["plain", 'a"quote', "back\\slash", "caf\u00e9", "tab\t", "del\x7f", ""])
def test_every_path_is_written_as_json_writes_it(key):
    x = jax.ShapeDtypeStruct((2,), jnp.float32)
    s = ts.structure_of({key: [x, x], "z": x})
    text = s.to_json()
    records = json.loads(text)["leaves"]
    assert [r["path"] for r in records] == list(s.paths)
    assert text.split('"leaves": [\n    ')[1].startswith(json.dumps(records[0]))  # the escapes json.dumps writes
    assert ts.Structure.from_json(text) == s
