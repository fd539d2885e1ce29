"""Framework nodes, told by name, with the real flax.nnx, flax.linen, equinox,
flax.struct, optax and orbax.

- The layouts: what `treeshape/_nodes.py` knows of each framework's node data, pinned on the
  installed releases (a release that lays it out otherwise fails `test_the_layouts_of_the_installed_releases`).
- Diffs: each differing static field by name, then the leaves under it; missing and extra
  children by name; opaque node data summarised around where it differs; no private name.
- JSON and snapshots of framework models: written by field name, loaded with nothing imported,
  and diffing empty against the model they were taken from.

Every model is tiny and built once per module.
"""

import dataclasses
import functools
import json
import pickle
import re
import sys
from typing import Any, NamedTuple

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx, struct
from flax.core import FrozenDict
from flax.training import train_state
from hypothesis import given, settings, strategies as st

import treeshape as ts
from treeshape import _nodes


pytest_plugins = ["pytester"]
F32 = jnp.float32
SDS = jax.ShapeDtypeStruct
KEY = jax.random.key(0)
# The type of what `nnx.split` returns first, as JSON names it (its module differs between flax releases).
_GRAPHDEF = "{0.__module__}:{0.__qualname__}".format(type(nnx.split(nnx.Linear(1, 1, rngs=nnx.Rngs(0)))[0]))
PRIVATE = re.compile(r"_pytree__|_object__|_length|\bMissing\b|MISSING|_Missing")


@struct.dataclass
class TrainState:
    params: Any
    lr: float = struct.field(pytree_node=False)
    name: str = struct.field(pytree_node=False)


@jtu.register_dataclass
@dataclasses.dataclass
class Registered:
    x: Any
    tag: str = dataclasses.field(metadata={"static": True})
    size: int = dataclasses.field(metadata={"static": True})


class Net(nnx.Module):
    def __init__(self, *, extra: bool, dropout: bool, width: int = 2, norm: bool = True):
        rngs = nnx.Rngs(0)
        self.lin = nnx.Linear(2, width, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs) if norm else None
        if dropout:
            self.dropout = nnx.Dropout(0.1, rngs=rngs)
        if extra:
            self.extra = nnx.Linear(width, 3, rngs=rngs)


class Stack(nnx.Module):
    def __init__(self, n: int):
        rngs = nnx.Rngs(0)
        self.layers = nnx.List([nnx.Linear(2, 2, rngs=rngs) for _ in range(n)])


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.attn = nnx.Linear(4, 4, rngs=rngs)
        self.mlp = nnx.Linear(4, 8, rngs=rngs)


class Model(nnx.Module):
    def __init__(self, layers: int):
        rngs = nnx.Rngs(0)
        self.embed = nnx.Embed(16, 4, rngs=rngs)
        self.layers = nnx.List([Block(rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(4, rngs=rngs)


class Filtered(eqx.Module):
    a: Any
    b: Any


def _abstract(make: Any, *args: Any, **kwargs: Any) -> Any:
    """A model of `ShapeDtypeStruct`s, made without running or compiling its initialisers."""
    return eqx.filter_eval_shape(make, *args, **kwargs)


@pytest.fixture(scope="module")
def m():
    """Every model the tests compare, built once, abstractly (fast: nothing is compiled)."""
    with jax.checking_leaks():
        return {
            "linear8": nnx.eval_shape(lambda: nnx.Linear(3, 8, rngs=nnx.Rngs(0))),
            "linear16": nnx.eval_shape(lambda: nnx.Linear(3, 16, rngs=nnx.Rngs(0))),
            "net": nnx.eval_shape(lambda: Net(extra=False, dropout=True)),
            "net_extra": nnx.eval_shape(lambda: Net(extra=True, dropout=False, width=4)),
            "net_no_norm": nnx.eval_shape(lambda: Net(extra=False, dropout=True, norm=False)),
            "stack12": nnx.eval_shape(lambda: Stack(12)),
            "stack16": nnx.eval_shape(lambda: Stack(16)),
            "model12": nnx.eval_shape(lambda: Model(12)),
            "model16": nnx.eval_shape(lambda: Model(16)),
            "eqx8": _abstract(eqx.nn.Linear, 3, 8, key=KEY),
            "eqx16": _abstract(eqx.nn.Linear, 3, 16, key=KEY),
            "mlp": _abstract(eqx.nn.MLP, 2, 3, 4, 2, key=KEY),
            "bn_state": eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")[1],
        }


def _message(expected: Any, actual: Any) -> str:
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.structure_of(expected).check(actual)
    message = str(info.value)
    assert max(len(line) for line in message.splitlines()) <= 300
    assert not PRIVATE.search(message), message
    return message


# -- the layouts: what _nodes knows, on the installed releases ---------------------------------
def _samples(m: dict[str, Any]) -> dict[str, tuple[Any, str, list[str], list[str]]]:
    """A node of each layout: (tree, kind, public field names, public child names)."""
    # A Linear's static attributes (which ones differs between flax releases), sorted as nnx sorts them.
    linear = sorted(name for name in vars(m["linear8"]) if not name.startswith("_") and name not in ("bias", "kernel"))
    assert {"in_features", "out_features", "use_bias"} <= set(linear)
    return {
        "nnx_module": (m["linear8"], _nodes.NNX, linear, ["bias", "kernel"]),
        "nnx_list": (m["stack12"].layers, _nodes.NNX, [], list(range(12))),
        "nnx_variable": (m["linear8"].kernel, _nodes.NNX_VARIABLE, None, ["value"]),
        "nnx_state": (nnx.state(m["linear8"]), _nodes.KEYED, [], ["bias", "kernel"]),
        "frozen_dict": (FrozenDict({"b": 1, "a": 2}), _nodes.KEYED, [], ["a", "b"]),
        "equinox": (m["eqx8"], _nodes.EQUINOX, ["in_features", "out_features", "use_bias"], ["weight", "bias"]),
        "flax_struct": (TrainState({}, 0.1, "sgd"), _nodes.DATACLASS, ["lr", "name"], ["params"]),
        "registered": (Registered(1, "t", 2), _nodes.DATACLASS, ["tag", "size"], ["x"]),
        "partitioned": (nn.Partitioned(SDS((2,), F32), ("d",)), _nodes.DATACLASS, ["names", "mesh"], ["value"]),
        "equinox_state": (m["bn_state"], _nodes.EQUINOX_STATE, [], [0, 1]),
    }


@pytest.mark.parametrize(
    "sample",
    [
        "nnx_module",
        "nnx_list",
        "nnx_variable",
        "nnx_state",
        "frozen_dict",
        "equinox",
        "flax_struct",
        "registered",
        "partitioned",
        "equinox_state",
    ],
)
def test_the_layouts_of_the_installed_releases(m, sample):
    tree, kind, fields, children = _samples(m)[sample]
    node_type, aux = jtu.tree_structure(tree).node_data()
    assert _nodes.kind(node_type) == kind
    split = _nodes.split(node_type, aux)
    assert split is not None, f"{node_type.__qualname__}: its node data has a layout treeshape does not know"
    if fields is not None:
        assert [_nodes.key_name(k) for k in split.fields] == fields
    assert [_nodes.key_name(k) for k in split.children if not _nodes.is_private(k)] == children
    # The JSON parts rebuild the very node data, and name the children as JAX's paths do.
    recorded = _nodes.record(node_type, aux)
    assert recorded is not None and recorded[0] == kind
    rebuilt, keys = _nodes.rebuild(kind, node_type, recorded[1], len(jtu.tree_structure(tree).children()))
    assert rebuilt == aux
    paths = {jtu.keystr(path[:1]) for path, _ in jtu.tree_flatten_with_path(tree)[0]}
    assert paths <= {jtu.keystr((k,)) for k in keys}


def test_each_kind_of_framework_node_round_trips_through_json_with_the_parts_nodes_lists(m):
    """Every kind `_nodes.PARTS` teaches is written by a sample (`to_json`), with the parts listed
    for its kind, and read back (`from_json`) to the same Structure and the same text."""
    written = set()
    for name, (tree, kind, _, _) in _samples(m).items():
        s = ts.structure_of(tree)
        text = s.to_json()
        entries = [e for e in json.loads(text)["treedef"] if isinstance(e, dict) and e["type"] in _nodes.PARTS]
        assert kind in {e["type"] for e in entries}, name
        for entry in entries:
            assert set(entry) - {"type", "name", "n"} <= set(_nodes.PARTS[entry["type"]]), (name, entry)
            written.add(entry["type"])
        loaded = ts.Structure.from_json(text)
        assert loaded == s and loaded.paths == s.paths and loaded.to_json() == text, name
    assert written == set(_nodes.PARTS)  # nnx's internal state is inside an nnx module


def test_the_layout_of_nnx_internal_state_and_equinox_sentinel(m):
    [state] = [c for c in jtu.tree_structure(m["linear8"]).children() if c.num_leaves == 0]
    node_type, aux = state.node_data()
    assert _nodes.kind(node_type) == _nodes.NNX_INTERNAL and type(aux) is tuple and set(aux) <= {True, False}
    node_type, aux = jtu.tree_structure(m["eqx8"]).node_data()
    assert _nodes.is_sentinel(aux[0]) and _nodes.split(node_type, aux).hidden == {"wrapper": aux[0]}


# -- diffs: fields by name, then the leaves under them --------------------------------------
def test_an_nnx_static_attribute_by_name_then_the_leaves_under_it(m):
    found = ts.structure_of(m["linear8"]).diff(m["linear16"])
    assert found == [
        ts.Mismatch(".out_features", "structure", "8", "16"),
        ts.Mismatch(".bias.value", "shape", (8,), (16,)),
        ts.Mismatch(".kernel.value", "shape", (3, 8), (3, 16)),
    ]
    assert str(found[0]) == "tree.out_features: expected 8, got 16."
    message = _message(m["linear8"], m["linear16"])
    assert "* tree.out_features: expected 8, got 16. A static field is part of the tree structure" in message


def test_an_equinox_static_field_by_name_then_the_leaves_under_it(m):
    assert ts.structure_of(m["eqx8"]).diff(m["eqx16"]) == [
        ts.Mismatch(".out_features", "structure", "8", "16"),
        ts.Mismatch(".weight", "shape", (8, 3), (16, 3)),
        ts.Mismatch(".bias", "shape", (8,), (16,)),
    ]
    _message(m["eqx8"], m["eqx16"])


def test_flax_struct_and_registered_dataclass_fields(m):
    sgd = TrainState({"w": SDS((3,), F32)}, 0.1, "sgd")
    adam = TrainState({"w": SDS((4,), F32)}, 0.1, "adam")
    assert ts.structure_of(sgd).diff(adam) == [
        ts.Mismatch(".name", "structure", "'sgd'", "'adam'"),
        ts.Mismatch(".params['w']", "shape", (3,), (4,)),
    ]
    assert ts.structure_of(Registered(SDS((2,), F32), "a", 1)).diff(Registered(SDS((2,), F32), "b", 2)) == [
        ts.Mismatch(".tag", "structure", "'a'", "'b'"),
        ts.Mismatch(".size", "structure", "1", "2"),
    ]


def test_linen_params_and_partitioned_boxes():
    def init(features, names):
        dense = nn.Dense(features, kernel_init=nn.with_partitioning(nn.initializers.lecun_normal(), names))
        return jax.eval_shape(dense.init, KEY, SDS((1, 3), F32))

    found = ts.structure_of(init(8, (None, "model"))).diff(init(16, ("data", "model")))
    assert found == [
        ts.Mismatch("['params']['bias']", "shape", (8,), (16,)),
        ts.Mismatch("['params']['kernel'].names", "structure", "(None, 'model')", "('data', 'model')"),
        ts.Mismatch("['params']['kernel'].value", "shape", (3, 8), (3, 16)),
    ]


def test_missing_and_extra_children_by_name_and_the_shared_ones_compared(m):
    found = ts.structure_of(m["net"]).diff(m["net_extra"])
    assert found == [  # in leaf order: the attributes sorted by name, as nnx flattens them
        ts.Mismatch(".dropout", "structure", "a Dropout with children ['rngs']", None),
        ts.Mismatch(".extra", "structure", None, "a Linear with children ['bias', 'kernel']"),
        ts.Mismatch(".lin.out_features", "structure", "2", "4"),
        ts.Mismatch(".lin.bias.value", "shape", (2,), (4,)),
        ts.Mismatch(".lin.kernel.value", "shape", (2, 2), (2, 4)),
        ts.Mismatch(".norm.num_features", "structure", "2", "4"),
        ts.Mismatch(".norm.bias.value", "shape", (2,), (4,)),
        ts.Mismatch(".norm.scale.value", "shape", (2,), (4,)),
    ]
    message = _message(m["net"], m["net_extra"])
    assert "tree.dropout: missing; expected a Dropout with children ['rngs']. Add this entry." in message
    assert "tree.extra: unexpected extra entry a Linear with children ['bias', 'kernel']." in message


def test_an_attribute_static_on_one_side_and_a_child_on_the_other_is_one_mismatch(m):
    [found] = [x for x in ts.structure_of(m["net"]).diff(m["net_no_norm"]) if x.path.startswith(".norm")]
    assert found == ts.Mismatch(".norm", "structure", "a LayerNorm with children ['bias', 'scale']", "None")


def test_fields_come_before_the_children_at_their_node():
    one = {"a": Registered({"x": SDS((2,), F32)}, "t", 1), "b": SDS((2,), F32)}
    two = {"a": Registered({"x": SDS((3,), F32)}, "u", 1), "b": SDS((3,), F32)}
    assert [x.path for x in ts.structure_of(one).diff(two)] == ["['a'].tag", "['a'].x['x']", "['b']"]


def test_layers_missing_at_consecutive_indices_are_one_line(m):
    message = _message(m["stack16"], m["stack12"])
    assert message == (
        "treeshape.Structure.check: the tree does not match: tree.layers: entries 12-15 missing (4 of them); "
        "each expected a Linear with children ['bias', 'kernel']. Add these entries."
    )
    assert "entries 12-15 unexpected (4 of them)" in _message(nnx.state(m["stack12"]), nnx.state(m["stack16"]))


def test_a_checkpoint_of_12_layers_against_a_16_layer_model(m, tmp_path):
    checkpointer = ocp.StandardCheckpointer()
    weights = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nnx.state(m["model12"]))
    checkpointer.save(tmp_path / "ckpt", weights)  # a 12-layer model's checkpoint
    checkpointer.wait_until_finished()
    saved = ts.structure_of(checkpointer.metadata(tmp_path / "ckpt").item_metadata.tree)
    expected = ts.structure_of(ocp.tree.serialize_tree(nnx.state(m["model16"])))  # as orbax writes it
    with pytest.raises(ts.StructureMismatchError) as info:
        expected.check(saved)
    assert len(info.value.mismatches) == 4  # four layers, not their 16 leaves
    assert str(info.value) == (
        "treeshape.Structure.check: the tree does not match: tree['layers']: entries '12'-'15' missing (4 of them); "
        "each expected a dict with keys ['attn', 'mlp']. Add these entries."
    )


def test_framework_internal_data_is_told_without_its_name(m):
    linear = jtu.tree_structure(m["linear8"])
    node_data, children = linear.node_data(), linear.children()
    [at] = [i for i, c in enumerate(children) if c.num_leaves == 0]
    state_type, state = children[at].node_data()
    other = jtu.PyTreeDef.from_node_data_and_children(jtu.default_registry, (state_type, (not state[0], state[1])), [])
    changed = [other if i == at else c for i, c in enumerate(children)]
    linear_other = jtu.PyTreeDef.from_node_data_and_children(jtu.default_registry, node_data, changed)
    leaves = ts.structure_of(m["linear8"]).leaves
    [found] = ts.Structure(linear, leaves).diff(ts.Structure(linear_other, leaves))
    assert found == ts.Mismatch(
        "",
        "structure",
        f"a Linear with internal data {state}",
        f"a Linear with internal data {(not state[0], state[1])}",
    )
    assert not PRIVATE.search(str(found))


def test_an_unset_equinox_field_is_nothing_never_the_sentinel():
    full = Filtered(SDS((2,), F32), SDS((2,), F32))
    partial = object.__new__(Filtered)
    object.__setattr__(partial, "a", SDS((2,), F32))
    assert ts.structure_of(full).diff(partial) == [ts.Mismatch(".b", "structure", "f32[2]", "nothing")]
    _message(full, partial)


class Opaque:
    """Node data with no names: a long tuple."""

    def __init__(self, x: Any, data: tuple[str, ...]):
        self.x, self.data = x, data


jtu.register_pytree_node(Opaque, lambda o: ((o.x,), o.data), lambda data, kids: Opaque(kids[0], data))


def test_opaque_node_data_is_summarised_around_where_it_differs_and_its_children_compared():
    base = tuple(f"option_{i}" for i in range(40))
    one = Opaque(SDS((2,), F32), base)
    two = Opaque(SDS((3,), F32), (*base[:-1], "changed"))
    summary, leaf = ts.structure_of(one).diff(two)
    assert summary.path == "" and summary.kind == "structure"
    # the item that differs, whole; no cut-off start that is the same on both sides
    assert summary.expected == "an Opaque with static data (..., 'option_39')"
    assert summary.actual == "an Opaque with static data (..., 'changed')"
    assert leaf == ts.Mismatch("[<flat index 0>]", "shape", (2,), (3,))


class Meta(NamedTuple):
    kind: str
    size: int


def test_node_data_that_is_a_dict_or_a_namedtuple_is_told_by_its_names():
    def node(aux):
        return jtu.PyTreeDef.from_node_data_and_children(jtu.default_registry, (Opaque, aux), [jtu.tree_structure(0)])

    leaves = (jax.ShapeDtypeStruct((), F32),)
    dicts = ts.Structure(node({"act": "relu", "n": 1}), leaves), ts.Structure(node({"act": "gelu", "n": 1}), leaves)
    assert dicts[0].diff(dicts[1]) == [ts.Mismatch("['act']", "structure", "'relu'", "'gelu'")]
    tuples = ts.Structure(node(Meta("a", 1)), leaves), ts.Structure(node(Meta("a", 2)), leaves)
    assert tuples[0].diff(tuples[1]) == [ts.Mismatch(".size", "structure", "1", "2")]


def test_optax_states():
    adam = optax.adam(1e-3)
    small, big = jax.eval_shape(adam.init, {"w": SDS((2, 2), F32)}), jax.eval_shape(adam.init, {"w": SDS((2, 3), F32)})
    assert [(x.path, x.kind) for x in ts.structure_of(small).diff(big)] == [
        ("[0].mu['w']", "shape"),
        ("[0].nu['w']", "shape"),
    ]
    adamw = jax.eval_shape(optax.adamw(1e-3).init, {"w": SDS((2, 2), F32)})
    assert ts.structure_of(small).diff(adamw)[-1] == ts.Mismatch("[2]", "structure", None, "an empty EmptyState")


# -- describe and check_prefix on framework models -----------------------------------------
def test_memory_by_module_of_an_nnx_model(m):
    rows = ts.describe(m["model12"], depth=2).splitlines()
    assert rows[2].split() == [".embed.embedding", "1", "64", "256", "B"]
    assert rows[3].split() == [".layers[0]", "4", "60", "240", "B"]  # attn 4x4 + 4, mlp 4x8 + 8
    assert rows[-1].split() == ["total", "51", "792", "3.1", "KiB"]


def test_per_layer_learning_rates_as_a_prefix_of_an_nnx_state(m):
    state = nnx.state(m["model12"])
    ts.check_prefix(jax.tree.map(lambda _: 1e-3, state), state)
    rates = jax.tree.map(lambda _: 1e-3, nnx.state(m["model16"]))
    with pytest.raises(ts.StructureMismatchError, match=re.escape("prefix['layers']: entries 12-15 unexpected")):
        ts.check_prefix(rates, state)


# -- JSON and snapshots ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "linear8",
        "net",
        "stack12",
        "model12",
        "model16",
        "state",
        "eqx8",
        "mlp",
        "eqx_filtered",
        "struct",
        "optax",
        "linen",
        "eqx_stateful",
    ],
)
def test_json_of_framework_models_diffs_empty_against_the_model(m, name):
    trees = {
        "state": lambda: nnx.state(m["model12"]),
        "eqx_filtered": lambda: eqx.filter(m["mlp"], lambda x: isinstance(x, jax.ShapeDtypeStruct)),  # arrays kept
        "struct": lambda: TrainState({"w": SDS((2,), F32)}, 0.1, "sgd"),
        "optax": lambda: jax.eval_shape(optax.chain(optax.clip(1.0), optax.adamw(1e-3)).init, {"w": SDS((2,), F32)}),
        "linen": lambda: jax.eval_shape(nn.Dense(2).init, KEY, SDS((1, 3), F32)),
        "eqx_stateful": lambda: eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch"),  # (model, state)
    }
    tree = trees[name]() if name in trees else m[name]
    s = ts.structure_of(tree)
    text = s.to_json()
    assert " at 0x" not in text  # no memory address: the same text in every process
    loaded = ts.Structure.from_json(text)
    assert loaded.diff(tree) == [] and ts.structure_of(tree).diff(loaded) == []
    assert loaded.paths == s.paths and loaded.leaves == s.leaves
    assert ts.Structure.from_json(loaded.to_json()) == loaded


def test_json_writes_node_data_by_field_name(m):
    doc = json.loads(ts.structure_of(m["eqx8"]).to_json())
    assert doc["treedef"][0] == {
        "type": "equinox",
        "name": "equinox.nn._linear:Linear",
        "n": 2,
        "fields": {"in_features": 3, "out_features": 8, "use_bias": True},
    }
    doc = json.loads(ts.structure_of(m["linear8"]).to_json())
    entry = doc["treedef"][0]
    assert entry["type"] == "nnx" and entry["keys"] == ["_pytree__state", "bias", "kernel"]
    static = dict((name, value) for name, value in entry["static"])
    assert static["out_features"] == 8 and static["dot_general"] == {"name": "jax.lax:dot_general"}


def test_a_loaded_model_names_the_fields_and_leaves_that_differ(m):
    loaded = ts.Structure.from_json(ts.structure_of(m["linear8"]).to_json())
    assert loaded.diff(m["linear16"]) == ts.structure_of(m["linear8"]).diff(m["linear16"])
    loaded = ts.Structure.from_json(ts.structure_of(m["eqx8"]).to_json())
    assert loaded.diff(m["eqx16"])[0] == ts.Mismatch(".out_features", "structure", "8", "16")


def test_loading_imports_nothing(m, monkeypatch):
    text = ts.structure_of(m["net"]).to_json()
    before = set(sys.modules)
    ts.Structure.from_json(text)
    assert set(sys.modules) == before
    monkeypatch.delitem(sys.modules, "flax.nnx.nn.linear")
    with pytest.raises(ValueError, match=re.escape("names the module 'flax.nnx.nn.linear', which is not imported")):
        ts.Structure.from_json(text)
    assert "flax.nnx.nn.linear" not in sys.modules


def _doc(entry: dict[str, Any], n_leaves: int = 0) -> str:
    leaves = [{"path": f"[{i}]", "shape": [], "dtype": "float32", "weak_type": False} for i in range(n_leaves)]
    return json.dumps({"version": 1, "treedef": [entry, *["*"] * entry.get("n", 0)], "leaves": leaves})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"type": "nnx", "name": "flax.nnx.nn.linear:Linear", "n": 1, "keys": ["__class__"], "static": []},
            "'__class__' is not an attribute name",
        ),
        (
            {"type": "nnx", "name": "flax.nnx.nn.linear:Linear", "n": 2, "keys": ["kernel"], "static": []},
            "expected 2 child attribute names",
        ),
        (
            {"type": "equinox", "name": "equinox.nn._linear:Linear", "n": 2, "fields": {"in_features": 3}},
            "has the static fields ['in_features', 'out_features', 'use_bias']",
        ),
        ({"type": "keyed", "name": "flax.nnx.statelib:State", "n": 2, "keys": ["b", "a"]}, "sorted order"),
        ({"type": "nnx", "name": "equinox.nn._linear:Linear", "n": 0, "keys": [], "static": []}, "not a node of kind"),
        (
            {"type": "dataclass", "name": "test_frameworks:TrainState", "n": 1, "fields": {"lr": {"eval": "1"}}},
            "expected a value as to_json writes node data",
        ),
        ({"type": "static", "name": _GRAPHDEF, "data": 1}, "expected a value's text"),
        (
            {"type": "static", "name": "builtins:int", "data": {"repr": "1", "type": "builtins:int"}},
            "cannot rebuild this node",
        ),
    ],
    ids=["dunder", "arity", "equinox_fields", "unsorted", "wrong_kind", "bad_value", "static_data", "static_type"],
)
def test_malformed_framework_records_are_value_errors(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ts.Structure.from_json(_doc(entry, entry.get("n", 0)))


class PooledCNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs, window: tuple[int, int] = (2, 2)) -> None:
        self.conv1 = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=window, strides=(2, 2))


def test_what_nnx_split_returns_is_written_its_graphdef_by_text_and_loads_back_equal():
    model = PooledCNN(rngs=nnx.Rngs(0))
    for split in (nnx.split(model), nnx.split(model, nnx.Param, ...)):
        live = ts.structure_of(split)
        doc = json.loads(live.to_json())
        assert doc["treedef"][1] == {
            "type": "static",
            "name": _GRAPHDEF,
            "data": {"repr": _nodes.static_text(split[0]), "type": _GRAPHDEF},
        }
        loaded = ts.Structure.from_json(json.dumps(doc))
        assert loaded == live and hash(loaded) == hash(live) and loaded.diff(split) == [] and live.diff(loaded) == []
        assert pickle.loads(pickle.dumps(live)) == live
    loaded = ts.Structure.from_json(ts.structure_of(nnx.split(model)).to_json())
    assert loaded == ts.structure_of(nnx.split(PooledCNN(rngs=nnx.Rngs(1))))  # other values, one structure
    [m] = loaded.diff(nnx.split(PooledCNN(rngs=nnx.Rngs(0), window=(3, 3))))
    assert m.path == "[0]" and "window_shape=(2, 2)" in m.expected and "window_shape=(3, 3)" in m.actual


def test_an_equinox_state_is_written_by_its_keys_and_diffs_by_position():
    model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(3, "batch", mode="batch")
    doc = json.loads(ts.structure_of(state).to_json())
    assert doc["treedef"][0] == {
        "type": "equinox_state",
        "name": "equinox.nn._stateful:State",
        "n": 2,
        "keys": list(jtu.tree_structure(state).node_data()[1]),
    }
    jax_paths = [jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(state)[0]]
    assert [leaf["path"] for leaf in doc["leaves"]] == jax_paths  # ["[<flat index 0>]", "[<flat index 1>][0]", ...]
    loaded = ts.Structure.from_json(json.dumps(doc))
    assert loaded == ts.structure_of(state) and loaded.diff(state) == []
    _, wider = eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, "batch", mode="batch")
    assert [(m.path, m.kind, m.expected, m.actual) for m in loaded.diff(wider)] == [
        (path, "shape", (3,), (4,)) for path in jax_paths[1:]
    ]
    doc["treedef"][0]["keys"] = ["a", "a"]
    with pytest.raises(ValueError, match=re.escape("the state keys must be unique")):
        ts.Structure.from_json(json.dumps(doc))


def _snapshot_models(width: int) -> dict[str, Any]:
    return {
        "nnx": nnx.eval_shape(lambda: nnx.Linear(3, width, rngs=nnx.Rngs(0))),
        "eqx": eqx.filter_eval_shape(eqx.nn.MLP, 2, width, 4, 1, key=jax.random.key(0)),
        "eqx_state": eqx.nn.make_with_state(eqx.nn.BatchNorm)(width, "batch", mode="batch")[1],
    }


def test_snapshots_of_nnx_and_equinox_models_in_another_process(pytester):
    # Snapshots written here, checked by the fixture in a fresh process (its own imports, addresses).
    snapshots = pytester.path / "__structures__"
    snapshots.mkdir()
    for test in ("test_same", "test_changed"):
        (snapshots / f"{test}.json").write_text(ts.structure_of(_snapshot_models(8)).to_json())
    pytester.makepyfile(
        test_snap="""
        import jax, equinox as eqx
        from flax import nnx

        def models(width):
            return {
                "nnx": nnx.eval_shape(lambda: nnx.Linear(3, width, rngs=nnx.Rngs(0))),
                "eqx": eqx.filter_eval_shape(eqx.nn.MLP, 2, width, 4, 1, key=jax.random.key(0)),
                "eqx_state": eqx.nn.make_with_state(eqx.nn.BatchNorm)(width, "batch", mode="batch")[1],
            }

        def test_same(structure_snapshot):
            structure_snapshot.check(models(8))

        def test_changed(structure_snapshot):
            structure_snapshot.check(models(16))
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "['nnx'].out_features: expected 8, got 16." in text
    assert "['nnx'].kernel.value: expected shape (3, 8), got (3, 16)." in text
    assert "['eqx'].out_size: expected 8, got 16." in text
    assert "['eqx_state'][<flat index 1>][0]: expected shape (8,), got (16,)." in text
    assert not PRIVATE.search(text[text.index("structure_snapshot: the structure differs") :])


class _Config:
    """A static value JSON keeps by its repr (a default repr, with a memory address)."""


def _closure():
    return lambda x: x


_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=4),
        st.sampled_from([jnp.tanh, jax.nn.relu, jnp.float32, np.dtype("int8"), _Config(), _closure(), Meta("a", 1)]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), inner, max_size=3),
    ),
    max_leaves=6,
)


@settings(max_examples=max(60, settings().max_examples // 4))  # each example writes and reads JSON three times
@given(_values, _values)
def test_any_static_field_values_round_trip_and_eq_agrees_with_diff(tag, size):
    tree = {"a": Registered(SDS((2,), F32), tag, size)}
    s = ts.structure_of(tree)
    text = s.to_json()
    assert " at 0x" not in text and ts.structure_of(tree).to_json() == text  # the same text every time
    loaded = ts.Structure.from_json(text)
    # Equal exactly when diff finds nothing; a field kept by its repr only is named, both ways.
    assert (loaded == s) == (loaded.diff(tree) == []) == (s.diff(loaded) == [])
    by_repr = {_nodes.static_text(v) for v in (tag, size) if _unequal_once_loaded(v)}
    changed = {f"['a']{p}" for p, v in ((".tag", tag), (".size", size)) if _unequal_once_loaded(v)}
    assert {m.path for m in loaded.diff(tree)} == changed
    assert {m.expected for m in loaded.diff(tree)} <= by_repr
    assert loaded.diff(tree, ignore={"static"}) == [] and s.diff(loaded, ignore={"static"}) == []
    again = ts.Structure.from_json(loaded.to_json())  # what snapshots compare: the text on both sides
    assert again.to_json() == loaded.to_json() and again == loaded and again.diff(loaded) == []


def _unequal_once_loaded(value: Any) -> bool:
    """A value that JSON cannot bring back as itself and that its text does not stand for (an object
    with its own `==`), NaN (which equals no other NaN), or a container holding one. (A closure's text
    stands for it.)"""
    if isinstance(value, (list, tuple)) and not isinstance(value, Meta):
        return any(map(_unequal_once_loaded, value))
    if isinstance(value, dict):
        return any(map(_unequal_once_loaded, value.values()))
    if isinstance(value, float):
        return value != value
    return isinstance(value, (_Config, Meta))


def test_long_field_values_are_told_around_where_they_differ_and_lookalikes_as_such():
    long = tuple(f"option_{i}" for i in range(20))
    [m] = ts.structure_of(Registered(SDS((2,), F32), long, 1)).diff(Registered(SDS((2,), F32), (*long, "x"), 1))
    assert (m.path, m.expected, m.actual) == (".tag", "(..., 'option_19')", "(..., 'option_19', 'x')")
    adam = train_state.TrainState.create(apply_fn=_apply, params={}, tx=optax.adam(1e-3))
    again = train_state.TrainState.create(apply_fn=_apply, params={}, tx=optax.adam(1e-3))
    [m] = ts.structure_of(adam).diff(again)  # two optimizers built alike print alike (new closures)
    assert str(m) == (
        "tree.tx: expected GradientTransformationExtraArgs(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, "
        "eps_root=0.0, mu_dtype=None, nesterov=False), optax.scale(step_size=-0.001)), got another value that prints "
        "the same (the two are not equal)."
    )


def test_two_nnx_optimizers_whose_tx_differ_name_tx_also_when_one_is_loaded_from_json():
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    adam = ts.structure_of(nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param))
    sgd = nnx.Optimizer(model, optax.sgd(1e-3), wrt=nnx.Param)
    for expected in (adam, ts.Structure.from_json(adam.to_json())):  # a snapshot knows tx by its text only
        assert [str(m) for m in expected.diff(sgd)] == [  # each cut between the items of a call, never inside one
            "tree.tx: expected GradientTransformationExtraArgs(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, ...), "
            "...), got GradientTransformationExtraArgs(optax.identity(), ...).",
            "tree.opt_state[0]: expected a ScaleByAdamState with 3 children, got an empty EmptyState.",
        ]
    loaded = ts.Structure.from_json(adam.to_json())
    [m] = loaded.diff(nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param))  # what tx holds is what it is
    assert str(m) == (
        "tree.tx: expected GradientTransformationExtraArgs(..., optax.scale(step_size=-0.001)), "
        "got GradientTransformationExtraArgs(..., optax.scale(step_size=-0.01))."
    )
    assert loaded.diff(nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)) == [] and loaded == adam


def _apply(params, x):
    return x
