"""`ts.check_prefix`: partition specs, `in_axes`, optax masks and per-layer
learning rates against the tree they describe; every place where a prefix is not one, at once."""

import re

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

import treeshape as ts


F32 = jnp.float32
PARAMS = {
    "dense": {"b": jnp.zeros(2, F32), "w": jnp.zeros((4, 2), F32)},
    "head": [jnp.zeros(2, F32), jnp.zeros((2, 2), F32)],
    "act": "relu",
}


@pytest.mark.parametrize(
    "prefix",
    [
        None,  # one leaf for the whole tree
        0,
        P("d"),
        {"dense": P(None, "d"), "head": None, "act": None},  # partition specs by module
        {"dense": {"b": True, "w": False}, "head": [True, True], "act": False},  # an optax mask, leaf by leaf
        {"dense": 1e-3, "head": [1e-3, 1e-4], "act": 0.0},  # learning rates by layer
        PARAMS,  # the tree itself
    ],
    ids=["none", "int", "spec", "specs", "mask", "rates", "itself"],
)
def test_a_tree_prefix_passes(prefix):
    assert ts.check_prefix(prefix, PARAMS) is None
    assert ts.check_prefix(prefix, ts.structure_of(PARAMS)) is None  # a Structure stands for its tree


def test_every_place_is_listed_with_what_each_side_has():
    prefix = {"dense": {"w": P("d"), "x": None}, "head": (0, 0), "act": {"a": 0}}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.check_prefix(prefix, PARAMS)
    assert isinstance(info.value, TypeError)
    assert info.value.mismatches == [
        ts.Mismatch("['act']", "structure", "the static value 'relu'", "a dict with keys ['a']", root="prefix"),
        ts.Mismatch("['dense']['b']", "structure", "f32[2]", None, root="prefix"),
        ts.Mismatch("['dense']['x']", "structure", None, "None", root="prefix"),
        ts.Mismatch("['head']", "structure", "a list with 2 children", "a tuple with 2 children", root="prefix"),
    ]
    assert str(info.value) == (
        "treeshape.check_prefix: `prefix` is not a tree prefix of `tree`; 4 differences:\n\n"
        "  * prefix['act']: the tree has the static value 'relu' here, the prefix a dict with keys ['a'].\n"
        "  * prefix['dense']['b']: missing from the prefix; the tree has f32[2] here.\n"
        "  * prefix['dense']['x']: not in the tree; the prefix has None here.\n"
        "  * prefix['head']: the tree has a list with 2 children here, the prefix a tuple with 2 children.\n\n"
        "Each leaf of `prefix` (a value, None or a PartitionSpec) stands for the whole subtree of `tree` at its "
        "path; above its leaves, `prefix` must have the containers of `tree`."
    )


def test_jax_tells_one_place_in_words_of_its_release_where_check_prefix_tells_all():
    tree = {"a": jnp.zeros((2, 3)), "b": [jnp.zeros(2), jnp.zeros(2)], "c": {"x": jnp.zeros(2)}}
    in_axes = {"a": 0, "b": [0, 0, 0], "c": {"y": 0}}
    with pytest.raises(ValueError, match="tree prefix"):
        jax.vmap(lambda t: t, in_axes=(in_axes,))(tree)
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.check_prefix(in_axes, tree)
    assert [(m.path, m.expected is None, m.actual is None) for m in info.value.mismatches] == [
        ("['b'][2]", True, False),
        ("['c']['x']", False, True),
        ("['c']['y']", True, False),
    ]


def test_entries_at_consecutive_indices_are_one_line():
    rates = [1e-3] * 16  # one learning rate per layer, for a 16-layer model
    layers = [{"w": jax.ShapeDtypeStruct((2, 2), F32)} for _ in range(12)]
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.check_prefix({"layers": rates}, {"layers": layers})
    assert len(info.value.mismatches) == 4
    assert str(info.value).splitlines()[0] == (
        "treeshape.check_prefix: `prefix` is not a tree prefix of `tree`: prefix['layers']: entries 12-15 "
        "unexpected (4 of them); each 0.001."
    )


def test_many_places_keep_lines_short_and_the_list_bounded():
    tree = {f"k{i:03d}": {"w": jax.ShapeDtypeStruct((2,), F32)} for i in range(100)}
    prefix = {f"k{i:03d}": [0] for i in range(100)}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.check_prefix(prefix, tree)
    message = str(info.value)
    assert len(info.value.mismatches) == 100 and "... and 80 more" in message
    assert max(len(line) for line in message.splitlines()) <= 300


def test_an_optax_mask_for_a_namedtuple_state_and_masked_optimizer():
    params = {"w": jnp.zeros((3, 3)), "b": jnp.zeros(3)}
    mask = {"w": True, "b": False}
    ts.check_prefix(mask, params)
    optax.masked(optax.adam(1e-3), mask).init(params)  # the same mask works for optax
    with pytest.raises(ts.StructureMismatchError, match=re.escape("prefix['bias']: not in the tree")):
        ts.check_prefix({"w": True, "bias": False}, params)


def test_under_transformations_with_tracer_leaves(in_context):
    def body(x):
        tree = {"x": x, "y": [x, x]}
        ts.check_prefix({"x": 0, "y": None}, tree)
        with pytest.raises(ts.StructureMismatchError, match=re.escape("prefix['y'][1]: missing from the prefix")):
            ts.check_prefix({"x": 0, "y": [0]}, tree)
        return x

    in_context(body, jnp.ones(3))


def test_a_top_level_list_against_arguments_reads_as_vmap_reads_in_axes():
    args = (jnp.ones((4, 3)), {"w": jnp.ones(3), "b": jnp.ones(())})
    in_axes = [0, {"w": None, "b": None}]
    out = jax.vmap(lambda x, p: x * p["w"] + p["b"], in_axes=in_axes)(*args)  # JAX accepts the list
    assert out.shape == (4, 3)
    assert ts.check_prefix(in_axes, args) is None
    assert ts.check_prefix([0, None], ts.structure_of(args)) is None  # a Structure of the arguments too
    jax.jit(lambda x, p: ts.check_prefix([0, None], (x, p)))(*args)
    with pytest.raises(ValueError):  # JAX refuses a list of another length, as check_prefix does
        jax.vmap(lambda x, p: x, in_axes=[0, None, 0])(*args)
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.check_prefix([0, None, 0], args)
    assert info.value.mismatches == [ts.Mismatch("[2]", "structure", None, "0", root="prefix")]
    assert "The top-level list of `prefix` was read as a tuple, as `jax.vmap` reads `in_axes`" in str(info.value)
    # only at the top, and only against a tuple: a list inside stays a list
    with pytest.raises(ts.StructureMismatchError, match=r"prefix\[1\]: the tree has a dict"):
        ts.check_prefix([0, [None, None]], args)
    with pytest.raises(
        ts.StructureMismatchError, match=r"the tree has a dict with keys \['b', 'w'\] here, the prefix a list"
    ):
        ts.check_prefix([None, None], {"w": 1.0, "b": 2.0})
