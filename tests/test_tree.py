"""The tree model (`treeshape._tree`), held against JAX's own paths: child keys, path walks,
the plain-data test, and the static text marker."""

import collections
import copy
import enum
import functools
import pickle

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from flax import nnx
from helpers import ChexNode, Node, Pair
from hypothesis import given, strategies as st

import treeshape as ts
from treeshape import _tree


class Linear(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    name: str = eqx.field(static=True, default="lin")


class Color(enum.Enum):
    RED = 1


def _containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abcdw"), children, max_size=4),
        st.dictionaries(st.integers(0, 9), children, max_size=3).map(
            lambda d: collections.OrderedDict(sorted(d.items()))
        ),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        st.tuples(children, children).map(lambda t: Node(*t)),
        st.tuples(children, children).map(lambda t: ChexNode(x=t[0], y=t[1])),
    )


trees = st.recursive(st.integers(0, 3).map(lambda n: np.zeros((n,), np.float32)), _containers, max_leaves=20)


def _paths_from_node_keys(tree):
    """Every leaf's path, built only from `_tree.child_texts` of each node (the tree model's keys)."""
    leaves, treedef = jtu.tree_flatten(tree)
    out = []

    def walk(td, leaves, prefix):
        if td.num_nodes == 1 and td.num_leaves == 1:
            out.append(prefix)
            return
        texts = _tree.child_texts(td, leaves)
        start = 0
        for text, child in zip(texts, td.children(), strict=True):
            walk(child, leaves[start : start + child.num_leaves], prefix + text)
            start += child.num_leaves

    walk(treedef, leaves, "")
    return out


@given(trees)
def test_child_keys_write_the_paths_jax_writes(tree):
    expected = [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(tree)[0]]
    assert _paths_from_node_keys(tree) == expected


@given(trees, st.integers(1, 6))
def test_edge_paths_are_the_first_and_last_paths(tree, n):
    paths = [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(tree)[0]]
    first, last = _tree.edge_paths(tree, jtu.tree_leaves(tree), n)
    assert first == paths[:n]
    assert last == paths[::-1][:n]


@given(trees)
def test_nodes_visits_every_node_in_pre_order_with_its_path(tree):
    found = [path for path, _, _ in _tree.nodes(tree, "out")]
    expected = []

    def walk(x, path):
        try:
            keyed, _ = _tree.keyed_children(x)
        except ValueError:
            return
        expected.append(path)
        for key, child in keyed:
            walk(child, path + jtu.keystr((key,)))

    walk(tree, "out")
    assert found == expected


def test_framework_nodes_are_keyed_as_jax_keys_them():
    model = {
        "eqx": Linear(jnp.zeros((2, 3)), jnp.zeros(3)),
        "nnx": nnx.Linear(2, 3, rngs=nnx.Rngs(0)),
        "state": nnx.state(nnx.Linear(2, 2, rngs=nnx.Rngs(1))),
    }
    expected = [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(model)[0]]
    assert _paths_from_node_keys(model) == expected
    assert "['eqx'].weight" in expected


def test_key_text_is_keystr_for_every_key_kind():
    keys = [jtu.SequenceKey(3), jtu.DictKey("w"), jtu.DictKey(7), jtu.GetAttrKey("bias"), jtu.FlattenedIndexKey(2)]
    assert [_tree.key_text(k) for k in keys] == [jtu.keystr((k,)) for k in keys]


def test_chain_path_names_each_step():
    inner = [0, {"x": 1}]
    outer = {"a": (5, inner)}
    assert _tree.chain_path([outer, outer["a"], inner, inner[1]]) == "['a'][1][1]"


def test_mapping_keys_of_dict_like_nodes():
    for tree in ({"b": 1, "a": 2}, collections.OrderedDict(b=1, a=2), collections.defaultdict(list, b=1, a=2)):
        node_type, aux = jtu.tree_structure(tree).node_data()
        assert list(_tree.mapping_keys(node_type, aux)) == (
            ["a", "b"] if type(tree) is not collections.OrderedDict else ["b", "a"]
        )
    node_type, aux = jtu.tree_structure([1, 2]).node_data()
    assert _tree.mapping_keys(node_type, aux) is None


def test_namedtuples_are_told_from_tuples():
    assert _tree.is_namedtuple(Pair)
    assert not _tree.is_namedtuple(tuple)
    assert not _tree.is_namedtuple(type("Fake", (tuple,), {"_fields": "ab"}))  # `_fields` must be a tuple
    assert not _tree.is_namedtuple(Pair(1, 2))  # a type, not an instance


@pytest.mark.parametrize(
    "value",
    [
        1,
        True,
        1.0,
        -0.0,
        0.0,
        1j,
        "s",
        b"s",
        None,
        (1, "a"),
        frozenset({1}),
        Pair(1, 2),
        Color.RED,
        jnp.float32,
        np.dtype("int8"),
        jax.nn.gelu,
    ],
)
def test_plain_values_are_keyed_by_value(value):
    assert _tree.is_plain(value)
    key = _tree.plain_key(value)
    assert key == _tree.plain_key(copy.deepcopy(value))
    assert hash(key) == hash(_tree.plain_key(copy.deepcopy(value)))


def test_plain_keys_keep_values_apart_that_behave_differently():
    keys = [_tree.plain_key(v) for v in (1, True, 1.0, 0.0, -0.0, (1,), [1][0])]
    assert len(set(keys[:5])) == 5
    assert keys[0] == keys[6]


@pytest.mark.parametrize(
    "value",
    [[1], {"a": 1}, {1}, object(), lambda x: x, functools.partial(jnp.sin), np.zeros(2), jnp.zeros(2), (1, [2])],
)
def test_mutable_or_unnamed_values_are_not_plain(value):
    assert not _tree.is_plain(value)


def test_a_state_callback_keys_what_is_not_plain():
    seen = []

    def state(x, depth):
        seen.append((type(x).__name__, depth))
        return ("state", len(x))

    assert _tree.plain_key((1, [2, 3]), state=state) is not None
    assert seen == [("list", 1)]


def test_treedefs_with_plain_node_data_are_plain():
    assert _tree.treedef_is_plain(jtu.tree_structure({"a": [1, (2, Pair(3, 4))], "n": Node(1, 2)}))
    unplain = jtu.Partial(lambda x: x, 1)  # node data: a local function
    assert not _tree.treedef_is_plain(jtu.tree_structure(unplain))


def test_clip_cuts_with_an_ellipsis():
    assert _tree.clip("abcdef", 6) == "abcdef"
    assert _tree.clip("abcdefg", 6) == "abc..."
    assert _tree.clip("a  b\nc", 10) == "a  b\nc"


def test_static_repr_is_a_value():
    marker = ts.StaticRepr("enum:Color", "<Color.RED: 1>")
    assert repr(marker) == "<Color.RED: 1>"
    assert marker == ts.StaticRepr("enum:Color", "<Color.RED: 1>")
    assert marker != ts.StaticRepr("enum:Shade", "<Color.RED: 1>")
    assert hash(marker) == hash(ts.StaticRepr("enum:Color", "<Color.RED: 1>"))
    assert pickle.loads(pickle.dumps(marker)) == marker
    with pytest.raises(AttributeError, match="immutable"):
        marker.text = "x"
