"""`Structure.to_json` / `Structure.from_json`: round trips, and loading untrusted text safely."""

import collections
import copy
import dataclasses
import enum
import json
import re
import sys

import chex
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest
from hypothesis import given, strategies as st
from jax.sharding import PartitionSpec as P

import treeshape as ts
from treeshape._cli import main
from treeshape._json_load import _read_lines
from treeshape._tree import StaticRepr


Point = collections.namedtuple("Point", "x y")
AdamState = collections.namedtuple("AdamState", ["count", "mu", "nu"])


@jtu.register_dataclass
@dataclasses.dataclass
class Moments:
    mu: object
    nu: object


@chex.dataclass
class ChexNode:
    a: object
    b: object


class Activation(enum.Enum):
    RELU = 1


@dataclasses.dataclass
class Plain:  # a dataclass that is not a pytree node
    x: object = None


@jtu.register_dataclass
@dataclasses.dataclass
class Checked:  # a pytree dataclass whose __post_init__ rejects placeholder leaves
    x: object

    def __post_init__(self):
        if not hasattr(self.x, "shape") and self.x is not None:
            raise ValueError("not an array")


def _sds(shape, dtype, weak=False, **kwargs):
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak, **kwargs)


def _compact(text):
    """The same document in another layout: one line, no indent (so not read line by line)."""
    return json.dumps(json.loads(text))


def _structure(tree):
    """A Structure of `tree` as given (ShapeDtypeStructs kept exactly, whatever the x64 mode)."""
    leaves, treedef = jtu.tree_flatten(tree)
    return ts.Structure(treedef, tuple(leaves))


def roundtrip(s):
    text = s.to_json()
    loaded = ts.Structure.from_json(text)
    assert loaded == s, (s, loaded)
    assert ts.Structure.from_json(_compact(text)) == loaded  # read as any JSON: the same
    assert hash(loaded) == hash(s)
    assert loaded.to_json() == text  # stable: the same text again
    return loaded


# -- round trips ----------------------------------------------------------------------
DTYPES = [
    jnp.bool_,
    jnp.int2,
    jnp.int4,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.int64,
    jnp.uint2,
    jnp.uint4,
    jnp.uint8,
    jnp.uint16,
    jnp.uint32,
    jnp.uint64,
    jnp.float4_e2m1fn,
    jnp.float8_e3m4,
    jnp.float8_e4m3,
    jnp.float8_e4m3b11fnuz,
    jnp.float8_e4m3fn,
    jnp.float8_e4m3fnuz,
    jnp.float8_e5m2,
    jnp.float8_e5m2fnuz,
    jnp.float8_e8m0fnu,
    jnp.bfloat16,
    jnp.float16,
    jnp.float32,
    jnp.float64,
    jnp.complex64,
    jnp.complex128,
]
KEY_DTYPES = {
    impl: jax.eval_shape(lambda impl=impl: jax.random.key(0, impl=impl)).dtype
    for impl in ["threefry2x32", "rbg", "unsafe_rbg"]
}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("weak", [False, True])
def test_every_dtype_round_trips(dtype, weak):
    s = roundtrip(_structure({"x": _sds((2, 3), dtype, weak), "s": _sds((), dtype)}))
    assert [leaf.dtype for leaf in s.leaves] == [jnp.dtype(dtype)] * 2
    assert json.loads(s.to_json())["leaves"][1]["dtype"] == jnp.dtype(dtype).name


@pytest.mark.parametrize("impl", list(KEY_DTYPES))
def test_typed_prng_keys_round_trip(impl):
    s = roundtrip(ts.structure_of({"key": jax.random.key(0, impl=impl), "keys": jax.random.split(jax.random.key(1))}))
    assert s.leaves[0].dtype == KEY_DTYPES[impl]
    assert json.loads(s.to_json())["leaves"][0]["dtype"] == str(KEY_DTYPES[impl])  # key<fry>, key<rbg>, ...
    assert ts.structure_of(s.zeros()) == s


def test_64_bit_arrays_round_trip_with_x64_on():
    with jax.enable_x64(True):
        tree = {"f": jnp.zeros(2, jnp.float64), "i": jnp.zeros(2, jnp.int64), "n": 3, "x": 0.5}
        s = ts.structure_of(tree)
        assert {str(leaf.dtype) for leaf in s.leaves} == {"float64", "int64"}
        loaded = roundtrip(s)
        assert loaded.matches(tree)


TREES = {
    "dict_str_keys": lambda: {"b": jnp.zeros(3), "w": jnp.zeros((2, 3), jnp.bfloat16)},
    "dict_int_keys": lambda: {0: jnp.zeros(1), 7: [jnp.zeros(2)], 10: None},
    "nested_lists_tuples": lambda: [(jnp.zeros(2), [jnp.zeros(()), ()]), [], (None,)],
    "none": lambda: None,
    "empty_dict": lambda: {},
    "single_leaf": lambda: jnp.zeros((4, 5), jnp.int8),
    "python_scalars": lambda: {"i": 3, "f": 0.5, "b": True, "c": 1j},
    "namedtuples": lambda: {
        "opt": AdamState(jnp.int32(0), {"w": jnp.zeros(2)}, {"w": jnp.zeros(2)}),
        "p": Point(1, None),
    },
    "ordered_and_default_dicts": lambda: [
        collections.OrderedDict([("z", jnp.zeros(1)), ("a", jnp.zeros(2))]),
        collections.defaultdict(list, {"k": jnp.zeros(3)}),
        collections.defaultdict(None, {"k": jnp.zeros(3)}),
    ],
    "registered_dataclass": lambda: {"m": Moments(mu=jnp.zeros(2), nu=(jnp.zeros(()), None))},
    "chex_dataclass": lambda: ChexNode(a=jnp.zeros(2), b=[1, 2]),
    "static_leaves": lambda: {"act": "relu", "n": 3, "x": jnp.zeros(2)},
    "optax_state": lambda: __import__("optax").adamw(1e-3).init({"w": jnp.zeros((2, 2), jnp.bfloat16)}),
}


@pytest.mark.parametrize("name", list(TREES))
def test_trees_round_trip(name):
    tree = TREES[name]()
    s = roundtrip(ts.structure_of(tree))
    assert s.paths == ts.structure_of(tree).paths
    assert s.diff(tree) == [] and s.matches(tree)
    s.check(tree)


def test_static_plain_values_come_back_as_themselves():
    s = ts.Structure(jtu.tree_structure([0] * 6), ("relu", 2**40, 0.25, False, float("inf"), float("nan")))
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded.leaves[:5] == ("relu", 2**40, 0.25, False, float("inf"))
    assert type(loaded.leaves[1]) is int and type(loaded.leaves[2]) is float
    assert repr(loaded.leaves[5]) == "nan"
    records = json.loads(s.to_json())["leaves"]
    assert records[0] == {
        "path": "[0]",
        "shape": None,
        "dtype": None,
        "weak_type": None,
        "static": "'relu'",
        "type": "builtins:str",
        "value": "relu",
    }
    assert "value" not in records[4]  # JSON has no infinity: kept by its repr


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


def test_other_static_values_are_kept_by_repr_and_differ_from_the_live_value():
    tree = {"act": Activation.RELU, "fn": jnp.tanh, "x": jnp.zeros(2)}
    s = ts.structure_of(tree)
    loaded = ts.Structure.from_json(s.to_json())
    marker = loaded.leaves[0]
    assert isinstance(marker, StaticRepr)
    assert repr(marker) == repr(Activation.RELU) and marker.type_name == "test_json:Activation"
    # A function is written by its name and found again (its module is imported): itself.
    assert json.loads(s.to_json())["leaves"][1]["name"] == "jax.numpy:tanh" and loaded.leaves[1] is jnp.tanh
    # Loaded twice, the markers are equal; against the live enum member they are not.
    assert ts.Structure.from_json(s.to_json()) == loaded
    assert loaded != s
    [m] = loaded.diff(tree)
    assert (m.where, m.kind) == ("tree['act']", "structure")
    assert ts.Structure.from_json(loaded.to_json()) == loaded  # markers are written back as they are
    # A repr that raises is replaced by a description of the type.
    s = ts.Structure(jtu.tree_structure(0), (BadRepr(),))
    assert "its repr raised" in json.loads(s.to_json())["leaves"][0]["static"]


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


def test_a_static_leaf_known_by_its_repr_only_is_told_as_such_when_it_differs():
    tree = {"mode": Mode.TRAIN, "x": jnp.zeros(2)}
    loaded = ts.Structure.from_json(ts.structure_of(tree).to_json())
    for found in (loaded.diff(tree), ts.structure_of(tree).diff(loaded)):
        [m] = found
        assert (m.path, m.kind) == ("['mode']", "structure")
        assert str(m) == (
            "tree['mode']: expected the static value <Mode.TRAIN: 1>, got one that prints the same but is not "
            "equal (a value loaded from JSON is known by its repr only)."
        )
    with pytest.raises(ts.StructureMismatchError) as info:
        loaded.check(tree)
    assert str(info.value).endswith(
        "(a value loaded from JSON is known by its repr only). JSON brings back str, int, float, bool and None "
        "static leaves, and functions and classes of imported modules, as themselves; compare with "
        "`ignore={'static'}` to leave static values out."
    )
    # Values that print differently are told as before.
    [m] = loaded.diff({"mode": Mode.EVAL, "x": jnp.zeros(2)})
    assert m.what == "expected the static value <Mode.TRAIN: 1>, got the static value <Mode.EVAL: 2>."


def test_json_document_layout():
    s = ts.structure_of({"opt": Point(jnp.zeros(2), None), "w": [jnp.zeros((), jnp.bfloat16)]})
    doc = json.loads(s.to_json())
    assert list(doc) == ["version", "treedef", "leaves"] and doc["version"] == 1
    assert doc["treedef"] == [
        {"type": "dict", "keys": ["opt", "w"]},
        {"type": "namedtuple", "name": "test_json:Point", "n": 2},
        "*",
        None,
        {"type": "list", "n": 1},
        "*",
    ]
    assert [r["path"] for r in doc["leaves"]] == list(s.paths)
    assert len(s.to_json().splitlines()) == 7 + 6 + 2  # one line per node and per leaf


def test_cli_json_is_the_leaves_array(capsys):
    assert main(["inspect", "jax.numpy:matmul", "bf16[8,4]", "bf16[4,2]", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    a, b = jax.ShapeDtypeStruct((8, 4), jnp.bfloat16), jax.ShapeDtypeStruct((4, 2), jnp.bfloat16)
    assert printed == json.loads(ts.out_structure(jnp.matmul, a, b).to_json())["leaves"]
    assert set(printed[0]) == {"path", "shape", "dtype", "weak_type"}


# -- big trees: repeated subtrees and shared leaf types ----------------------------------
def _block(i):
    """A subtree that a big tree repeats (a model's layer), holding every JSON node type."""
    return {
        "m": Moments(mu=_sds((2,), jnp.float32), nu=(_sds((), jnp.int32, True), None)),
        "p": Point("relu", [_sds((1,), jnp.bfloat16)]),
        "o": collections.OrderedDict([("z", _sds((i,), jnp.float32)), ("a", ChexNode(a=_sds((3,), jnp.int8), b=[]))]),
        "d": collections.defaultdict(list, {"k": _sds((2, 2), jnp.float32)}),
    }


def test_repeated_subtrees_are_written_in_full_under_each_path():
    s = _structure({"blocks": [_block(1), _block(1), _block(2)], "head": (_block(1),), "tail": _block(1)})
    doc = json.loads(s.to_json())
    assert [r["path"] for r in doc["leaves"]] == list(s.paths)
    assert doc["leaves"][7]["path"] == "['blocks'][1]['d']['k']" and doc["leaves"][7]["shape"] == [2, 2]
    assert doc["leaves"][-1]["path"] == "['tail']['p'].y[0]"
    # Each copy of the block has the same node entries; the block with another leaf count differs.
    entries = doc["treedef"]
    starts = [i for i, entry in enumerate(entries) if entry == {"type": "dict", "keys": ["d", "m", "o", "p"]}]
    assert len(starts) == 5
    size = starts[1] - starts[0]
    blocks = [entries[i : i + size] for i in starts]
    assert blocks[0] == blocks[1] == blocks[3] == blocks[4] and blocks[2] == blocks[0]
    loaded = roundtrip(s)
    assert loaded.paths == s.paths and loaded.leaves == s.leaves


@jtu.register_dataclass
@dataclasses.dataclass
class Tagged:
    x: object
    tag: int = dataclasses.field(default=0, metadata={"static": True})


def test_sibling_subtrees_that_differ_only_in_keys_or_node_data_are_each_written_as_they_are():
    x = _sds((2,), jnp.float32)
    s = _structure([{"a": x}, {"b": x}, {"b": x}, Tagged(x, 1), Tagged(x, 2), Tagged(x, 2), [x], (x,)])
    doc = json.loads(s.to_json())
    a, b = {"type": "dict", "keys": ["a"]}, {"type": "dict", "keys": ["b"]}
    assert doc["treedef"][1:7] == [a, "*", b, "*", b, "*"]
    assert [
        entry.get("fields") for entry in doc["treedef"] if type(entry) is dict and entry["type"] == "dataclass"
    ] == [
        {"tag": 1},
        {"tag": 2},
        {"tag": 2},
    ]
    paths = ["[0]['a']", "[1]['b']", "[2]['b']", "[3].x", "[4].x", "[5].x", "[6][0]", "[7][0]"]
    assert [r["path"] for r in doc["leaves"]] == list(s.paths) == paths
    assert doc["treedef"][-4:] == [{"type": "list", "n": 1}, "*", {"type": "tuple", "n": 1}, "*"]
    roundtrip(s)


def test_repeated_subtrees_keep_the_exact_text():
    s = _structure([Point(_sds((2,), jnp.float32), "relu"), Point(_sds((2,), jnp.float32), "relu")])
    assert s.to_json() == (
        "{\n"
        '  "version": 1,\n'
        '  "treedef": [\n'
        '    {"type": "list", "n": 2},\n'
        '    {"type": "namedtuple", "name": "test_json:Point", "n": 2},\n'
        '    "*",\n'
        '    "*",\n'
        '    {"type": "namedtuple", "name": "test_json:Point", "n": 2},\n'
        '    "*",\n'
        '    "*"\n'
        "  ],\n"
        '  "leaves": [\n'
        '    {"path": "[0].x", "shape": [2], "dtype": "float32", "weak_type": false},\n'
        '    {"path": "[0].y", "shape": null, "dtype": null, "weak_type": null, "static": "\'relu\'", '
        '"type": "builtins:str", "value": "relu"},\n'
        '    {"path": "[1].x", "shape": [2], "dtype": "float32", "weak_type": false},\n'
        '    {"path": "[1].y", "shape": null, "dtype": null, "weak_type": null, "static": "\'relu\'", '
        '"type": "builtins:str", "value": "relu"}\n'
        "  ]\n"
        "}\n"
    )


def test_leaves_of_one_type_load_as_equal_descriptions_and_other_types_stay_apart():
    leaves = [_sds((2,), jnp.float32), _sds((2,), jnp.float32, True), _sds((2,), jnp.bfloat16), _sds((3,), jnp.float32)]
    s = _structure(leaves * 3)
    loaded = roundtrip(s)
    assert list(loaded.leaves) == leaves * 3
    assert [leaf.weak_type for leaf in loaded.leaves[:4]] == [False, True, False, False]


# -- shardings and manual axes --------------------------------------------------------
def test_named_sharding_specs_round_trip_over_an_abstract_mesh():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    leaf = _sds((8, 16), jnp.float32, sharding=jax.NamedSharding(mesh, P(("data", "model"), None)))
    auto = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    other = _sds((8,), jnp.float32, sharding=jax.NamedSharding(auto, P(P.UNCONSTRAINED)))
    s = roundtrip(_structure({"w": leaf, "u": other, "plain": _sds((2,), jnp.int8)}))
    record = json.loads(s.to_json())["leaves"][2]
    assert record["sharding"] == {
        "spec": [["data", "model"], None],
        "mesh": {"axis_names": ["data", "model"], "axis_sizes": [2, 4], "axis_types": ["Explicit", "Explicit"]},
    }
    loaded = s.leaves[2].sharding
    assert isinstance(loaded.mesh, jax.sharding.AbstractMesh)
    assert (loaded.mesh.axis_names, loaded.mesh.axis_sizes, loaded.mesh.axis_types) == (
        mesh.axis_names,
        mesh.axis_sizes,
        mesh.axis_types,
    )
    assert loaded.spec == P(("data", "model"), None)
    assert s.leaves[1].sharding.spec == P(P.UNCONSTRAINED)
    assert "sharding" not in json.loads(s.to_json())["leaves"][0]


def test_manual_axes_under_shard_map_round_trip():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    seen = []

    def f(x):
        s = ts.structure_of({"x": x, "y": jnp.zeros(3)})
        seen.append((s, ts.Structure.from_json(s.to_json())))
        return x

    xs = jax.device_put(jnp.zeros(8), jax.NamedSharding(mesh, P("i")))
    jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(xs)
    [(s, loaded)] = seen
    assert loaded == s
    assert json.loads(s.to_json())["leaves"][0]["vma"] == {"varying": ["i"], "unreduced": [], "reduced": []}


def test_from_json_under_jit():
    s = ts.structure_of({"w": jnp.zeros(3)})
    text = s.to_json()

    @jax.jit
    def f(x):
        loaded = ts.Structure.from_json(text)
        loaded.check({"w": x})
        return loaded.zeros()["w"] + x

    assert f(jnp.ones(3)).shape == (3,)


def test_loaded_structures_diff_and_check_live_trees():
    loaded = ts.Structure.from_json(ts.structure_of({"b": jnp.zeros(3), "w": jnp.zeros((2, 3))}).to_json())
    live = {"b": jnp.zeros(3, jnp.int32), "w": jnp.zeros((3, 2))}
    assert [(m.where, m.kind) for m in loaded.diff(live)] == [("tree['b']", "dtype"), ("tree['w']", "shape")]
    with pytest.raises(ts.StructureMismatchError, match=r"tree\['w'\]: expected shape \(2, 3\), got \(3, 2\)"):
        loaded.check(live)
    assert ts.structure_of(live).diff(loaded)  # and the other way round


@jtu.register_dataclass
@dataclasses.dataclass
class WithFunction:
    x: object
    fn: object = dataclasses.field(metadata={"static": True}, default=jnp.tanh)
    closure: object = dataclasses.field(metadata={"static": True}, default=None)


def test_node_data_is_written_by_field_name_functions_by_name_other_values_by_their_repr():
    def make_closure():
        return lambda x: x

    tree = {"a": WithFunction(jnp.zeros(2), closure=make_closure())}
    text = ts.structure_of(tree).to_json()
    [entry] = [e for e in json.loads(text)["treedef"] if type(e) is dict and e["type"] == "dataclass"]
    closure = (
        "test_json.test_node_data_is_written_by_field_name_functions_by_name_other_values_by_their_repr.<locals>."
        "make_closure.<locals>.<lambda>"
    )
    assert entry["fields"] == {
        "fn": {"name": "jax.numpy:tanh"},
        "closure": {"repr": closure, "type": "builtins:function"},
    }  # the closure by its module and qualified name, no memory address: the same text in every process
    loaded = ts.Structure.from_json(text)
    # Known by its text only, the closure stands for every function that prints as it: `==` and `diff` agree.
    assert loaded == ts.structure_of(tree) and loaded.diff(tree) == []
    assert loaded == ts.structure_of({"a": WithFunction(jnp.zeros(2), closure=make_closure())})

    def named():
        return None

    [m] = loaded.diff({"a": WithFunction(jnp.zeros(2), closure=named)})
    assert m.path == "['a'].closure" and m.expected.endswith("make_closure.<locals>.<lambda>")
    other = {"a": WithFunction(jnp.zeros(2), fn=jnp.sin, closure=make_closure())}
    assert loaded.diff(other)[0] == ts.Mismatch("['a'].fn", "structure", "jax.numpy.tanh", "jax.numpy.sin")


def test_unsupported_trees_fail_to_encode_with_the_path():
    with pytest.raises(TypeError, match=r"the dict at tree\['a'\] has a key \(1, 2\) of type tuple"):
        ts.structure_of({"a": {(1, 2): jnp.zeros(1)}}).to_json()
    with pytest.raises(TypeError, match=r"node at tree\[0\] is a Partial, which JSON cannot describe"):
        ts.structure_of([jtu.Partial(jnp.add, jnp.zeros(2))]).to_json()


def test_a_defaultdict_factory_is_loaded_only_as_a_class():
    """A hostile document names a function as the factory that the loaded tree would call on
    a missing key: refused, naming the field, and nothing is installed or called."""
    live = collections.defaultdict(list, {"k": jnp.zeros(2)})
    text = ts.structure_of(live).to_json()
    assert '"factory": "builtins:list"' in text
    for hostile, kind in [("os:abort", "builtin_function_or_method"), ("builtins:exit", "Quitter")]:
        with pytest.raises(ValueError, match=rf"treedef\[0\]\.factory: {hostile} names a {kind}, not a class"):
            ts.Structure.from_json(text.replace("builtins:list", hostile))
    with pytest.raises(ValueError, match=r"treedef\[0\]\.factory: builtins:List is not defined"):
        ts.Structure.from_json(text.replace("builtins:list", "builtins:List"))
    other = ts.Structure.from_json(text.replace("builtins:list", "builtins:dict"))
    assert other.tree.default_factory is dict and other != ts.structure_of(live)
    assert other.diff(live) == [ts.Mismatch(".default_factory", "structure", "builtins.dict", "builtins.list")]
    with pytest.raises(ts.StructureMismatchError, match=r"tree\.default_factory: expected builtins\.dict, got"):
        other.check(live)
    assert ts.Structure.from_json(text).diff(live) == []
    with pytest.raises(TypeError, match=r"factory <function .*>; JSON describes a factory only as a class"):
        ts.structure_of(collections.defaultdict(_make_list, {"k": jnp.zeros(2)})).to_json()


def _make_list():
    return []


# -- a property: random trees round-trip ----------------------------------------------
def _leaf_strategy():
    shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
    dtypes = st.sampled_from([*DTYPES, *KEY_DTYPES.values()])

    def build(shape, dtype, weak):
        kind = jnp.dtype(dtype).kind if not jnp.issubdtype(dtype, jax.dtypes.prng_key) else "key"
        return _sds(shape, dtype, weak and kind in "iufc")

    arrays = st.builds(build, shapes, dtypes, st.booleans())
    statics = st.one_of(st.text(max_size=5), st.integers(-(2**70), 2**70), st.booleans())
    return st.one_of(arrays, arrays, statics)


def _containers(children):
    keys = st.one_of(st.text(max_size=4), st.integers(-3, 1000))
    return st.one_of(
        st.dictionaries(st.text(max_size=4), children, max_size=3),
        st.dictionaries(st.integers(-3, 1000), children, max_size=3),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.tuples(children, children).map(lambda t: Point(*t)),
        st.tuples(children, children).map(lambda t: Moments(*t)),
        st.lists(st.tuples(keys, children), max_size=3).map(collections.OrderedDict),
    )


@given(st.recursive(st.one_of(_leaf_strategy(), st.none()), _containers, max_leaves=10))
def test_random_trees_round_trip(tree):
    try:
        s = _structure(tree)
    except (TypeError, ValueError):  # keys of mixed types JAX cannot sort
        return
    loaded = roundtrip(s)
    assert loaded.paths == s.paths
    assert loaded.diff(s) == [] and s.diff(loaded) == []


# -- hostile input ----------------------------------------------------------------------
VALID = ts.Structure(
    jtu.tree_structure({"opt": Point(0, 0), "w": [0, 0], "d": collections.defaultdict(list, {"k": 0})}),
    (
        _sds((2,), jnp.int32, sharding=jax.NamedSharding(jax.sharding.AbstractMesh((2,), ("i",)), P("i"))),
        _sds((3, 4), jnp.float32),
        _sds((), jnp.bfloat16, True),
        "relu",
        Activation.RELU,
    ),
).to_json()

JUNK = [None, True, 0, -1, 2**63, 1.5, "x", "*", [], [None], {}, {"type": "list"}, [[[]]]]


def _all_positions(doc, at=()):
    """Every (container, key) position in a parsed JSON document."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield at + (key,)
            yield from _all_positions(value, at + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield at + (i,)
            yield from _all_positions(value, at + (i,))


def _replaced(doc, position, value):
    doc = copy.deepcopy(doc)
    target = doc
    for key in position[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[position[-1]]
    else:
        target[position[-1]] = value
    return doc


_DELETE = object()


def _outcome(text):
    """What `from_json` gives for `text`: a Structure, or its ValueError's message."""
    try:
        return ts.Structure.from_json(text)
    except ValueError as err:
        return str(err)


def _laid_out(doc):
    """A parsed document written back as `to_json` lays it out: a line per member, and the
    `treedef` and `leaves` lists a line per item."""
    members = []
    for key, value in doc.items():
        if key in ("treedef", "leaves") and type(value) is list and value:
            items = ",\n".join("    " + json.dumps(item) for item in value)
            members.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            members.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(members) + "\n}\n"


def test_the_valid_document_loads():
    loaded = ts.Structure.from_json(VALID)
    assert isinstance(loaded.leaves[4], StaticRepr)


def test_every_field_replaced_by_junk_or_deleted_is_a_value_error_or_loads():
    doc = json.loads(VALID)
    positions = list(_all_positions(doc))
    assert len(positions) > 60
    for position in positions:
        for value in [*JUNK, _DELETE]:
            edited = _replaced(doc, position, value)
            compact = _outcome(json.dumps(edited))
            assert _outcome(_laid_out(edited)) == compact, (position, value)  # read line by line: the same


@pytest.mark.parametrize("cut", [0, 1, 10, 50, 100, 200, -3, -2])
def test_truncated_json(cut):
    with pytest.raises(ValueError, match="from_json: not valid JSON"):
        ts.Structure.from_json(VALID[:cut])


@pytest.mark.parametrize("version", [None, 0, 2, 99, "1", 1.0, True, [1]])
def test_wrong_or_missing_version(version):
    doc = json.loads(VALID)
    if version is None:
        del doc["version"]
        match = "missing the key 'version'"
    else:
        doc["version"] = version
        match = "this treeshape reads version 1"
    with pytest.raises(ValueError, match=match):
        ts.Structure.from_json(json.dumps(doc))


@pytest.mark.parametrize(
    "text",
    ["null", "[]", '"text"', "1", "NaN", '{"version": NaN}', "\ufeff{}", "{}" * 3, b"\xff\xfe", "{" * 200_000],
)
def test_not_a_document(text):
    with pytest.raises(ValueError, match="treeshape.Structure.from_json: "):
        ts.Structure.from_json(text)


def test_non_text_is_a_type_error():
    with pytest.raises(TypeError, match="expected the JSON text as a str"):
        ts.Structure.from_json({"version": 1})


def _doc(treedef, leaves):
    return json.dumps({"version": 1, "treedef": treedef, "leaves": leaves})


def _leaf(path, shape=(), dtype="float32", **extra):
    return {"path": path, "shape": list(shape), "dtype": dtype, "weak_type": False, **extra}


def _deep_aux(depth):
    aux = '{"tuple": [' * depth + "]}" * depth
    return (
        '{"version": 1, "treedef": [{"type": "dataclass", "name": "test_json:Moments", "n": 0, "aux": '
        + aux
        + '}], "leaves": []}'
    )


BAD_DOCS = {
    "unknown_node_type": (_doc([{"type": "set", "n": 0}], []), "unknown node type 'set'"),
    "too_few_leaves": (_doc([{"type": "list", "n": 2}, "*", "*"], [_leaf("[0]")]), "2 leaves, but there are 1"),
    "too_few_nodes": (_doc([{"type": "list", "n": 3}, "*"], []), "claims 3 children, but only 1 nodes follow it"),
    "two_roots": (_doc(["*", "*"], [_leaf(""), _leaf("")]), "form 2 trees"),
    "empty_treedef": (_doc([], []), "at least one node"),
    "unsorted_keys": (_doc([{"type": "dict", "keys": ["b", "a"]}, "*", "*"], []), "JAX's sorted order"),
    "duplicate_keys": (_doc([{"type": "dict", "keys": ["a", "a"]}, "*", "*"], []), "unique"),
    "mixed_keys": (_doc([{"type": "dict", "keys": ["a", 1]}, "*", "*"], []), "strings mixed with integers"),
    "float_key": (_doc([{"type": "dict", "keys": [1.5]}, "*"], []), "strings or integers"),
    "unimported_module": (
        _doc([{"type": "namedtuple", "name": "antigravity:Point", "n": 2}, "*", "*"], []),
        "names the module 'antigravity', which is not imported",
    ),
    "unimported_factory": (
        _doc([{"type": "defaultdict", "factory": "this:f", "keys": []}], []),
        "names the module 'this', which is not imported",
    ),
    "undefined_name": (_doc([{"type": "namedtuple", "name": "collections:Nope", "n": 0}], []), "not defined"),
    "locals_name": (_doc([{"type": "namedtuple", "name": "m:f.<locals>.P", "n": 0}], []), "module:qualname"),
    "not_a_namedtuple": (_doc([{"type": "namedtuple", "name": "builtins:dict", "n": 0}], []), "not a namedtuple"),
    "namedtuple_arity": (
        _doc([{"type": "namedtuple", "name": "test_json:Point", "n": 1}, "*"], [_leaf(".x")]),
        "has 2 fields, not 1",
    ),
    "not_a_dataclass": (
        _doc([{"type": "dataclass", "name": "test_json:Activation", "n": 0, "aux": None}], []),
        "is not a dataclass",
    ),
    "unregistered_dataclass": (
        _doc([{"type": "dataclass", "name": "test_json:Plain", "n": 0, "aux": None}], []),
        "is not registered as a pytree node",
    ),
    "dataclass_arity": (
        _doc([{"type": "dataclass", "name": "test_json:Moments", "n": 0, "aux": {"tuple": []}}], []),
        "has 2 pytree children, not 0",
    ),
    "dataclass_aux": (
        _doc([{"type": "dataclass", "name": "test_json:Moments", "n": 2, "aux": {"tuple": ["x"]}}, "*", "*"], []),
        "has node data like ()",
    ),
    "dataclass_init_rejects": (
        _doc([{"type": "dataclass", "name": "test_json:Checked", "n": 1, "aux": {"tuple": []}}, "*"], [_leaf(".x")]),
        "cannot be rebuilt: ValueError: not an array",
    ),
    "custom_bad_aux": (
        _doc([{"type": "dataclass", "name": "test_json:Moments", "n": 0, "aux": {"set": []}}], []),
        "expected plain data",
    ),
    "unknown_dtype": (_doc(["*"], [_leaf("", dtype="float33")]), "unknown dtype 'float33'"),
    "object_dtype": (_doc(["*"], [_leaf("", dtype="object")]), "unknown dtype 'object'"),
    "dtype_mini_language": (_doc(["*"], [_leaf("", dtype="i4,f8")]), "unknown dtype"),
    "huge_dim": (_doc(["*"], [_leaf("", shape=[2**63])]), "expected an integer in [0, 9223372036854775807]"),
    "negative_dim": (_doc(["*"], [_leaf("", shape=[-1])]), "expected an integer"),
    "bool_dim": (_doc(["*"], [_leaf("", shape=[True])]), "expected an integer"),
    "float_dim": (_doc(["*"], [_leaf("", shape=[2.0])]), "expected an integer"),
    "weak_not_bool": (_doc(["*"], [{**_leaf(""), "weak_type": 0}]), "expected true or false"),
    "wrong_path": (_doc([{"type": "list", "n": 1}, "*"], [_leaf("[1]")]), "puts leaf 0 at '[0]'"),
    "static_with_dtype": (
        _doc(["*"], [{"path": "", "shape": None, "dtype": "float32", "weak_type": None, "static": "1"}]),
        "a static leaf has no shape",
    ),
    "static_value_of_wrong_type": (
        _doc(
            ["*"],
            [
                {
                    **_leaf(""),
                    "shape": None,
                    "dtype": None,
                    "weak_type": None,
                    "static": "'1'",
                    "type": "builtins:str",
                    "value": 1,
                }
            ],
        ),
        "cannot be 1",
    ),
    "mesh_axis_missing": (
        _doc(
            ["*"],
            [
                _leaf(
                    "",
                    [2],
                    sharding={"spec": ["j"], "mesh": {"axis_names": ["i"], "axis_sizes": [2], "axis_types": ["Auto"]}},
                )
            ],
        ),
        "not a valid sharding",
    ),
    "mesh_axis_type": (
        _doc(
            ["*"],
            [
                _leaf(
                    "",
                    [2],
                    sharding={"spec": [], "mesh": {"axis_names": ["i"], "axis_sizes": [2], "axis_types": ["Fast"]}},
                )
            ],
        ),
        "expected one of",
    ),
    "mesh_lengths": (
        _doc(
            ["*"],
            [_leaf("", [2], sharding={"spec": [], "mesh": {"axis_names": ["i"], "axis_sizes": [], "axis_types": []}})],
        ),
        "the same length",
    ),
    "mesh_size_zero": (
        _doc(
            ["*"],
            [
                _leaf(
                    "",
                    [2],
                    sharding={"spec": [], "mesh": {"axis_names": ["i"], "axis_sizes": [0], "axis_types": ["Auto"]}},
                )
            ],
        ),
        "expected an integer in [1,",
    ),
    "deep_aux": (_deep_aux(5000), "nested too deeply"),
    "nested_aux": (_deep_aux(300), "has 2 pytree children, not 0"),
    "deep_tree": (_doc([{"type": "list", "n": 1}] * 100_000 + ["*"], [_leaf("[0]" * 100_000)]), "nested more deeply"),
}


@pytest.mark.parametrize("name", list(BAD_DOCS))
def test_malformed_documents_are_value_errors(name):
    text, message = BAD_DOCS[name]
    modules = set(sys.modules)
    with pytest.raises(ValueError) as info:
        ts.Structure.from_json(text)
    assert message in str(info.value)
    assert str(info.value).startswith("treeshape.Structure.from_json: ")
    assert len(str(info.value)) < 400
    assert set(sys.modules) == modules  # nothing was imported (antigravity would open a browser)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("shape", [2.0], "leaves[2].shape[0]: expected an integer"),  # 2.0 == 2, as the record before
        ("shape", [True], "leaves[2].shape[0]: expected an integer"),  # True == 1, as the first record
        ("weak_type", 0, "leaves[2].weak_type: expected true or false"),  # 0 == False
        ("dtype", "float33", "leaves[2].dtype: unknown dtype 'float33'"),
    ],
)
def test_a_leaf_type_seen_before_does_not_let_a_malformed_record_through(field, value, message):
    records = [_leaf("[0]", [1]), _leaf("[1]", [2]), {**_leaf("[2]", [1]), field: value}]
    with pytest.raises(ValueError, match=re.escape(message)):
        ts.Structure.from_json(_doc([{"type": "list", "n": 3}, "*", "*", "*"], records))


def test_the_document_is_not_evaluated():
    sneaky = {**_leaf(""), "shape": None, "dtype": None, "weak_type": None}
    sneaky.update(static="__import__('os').system('false')", type="builtins:eval")
    loaded = ts.Structure.from_json(_doc(["*"], [sneaky]))
    [leaf] = loaded.leaves
    assert isinstance(leaf, StaticRepr) and leaf.text == sneaky["static"]


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@given(json_values)
def test_random_json_is_a_value_error_or_a_structure(value):
    _outcome(json.dumps(value))
    for doc in [{"version": 1, "treedef": value, "leaves": value}, {"version": 1, "treedef": ["*"], "leaves": [value]}]:
        assert _outcome(_laid_out(doc)) == _outcome(json.dumps(doc))


# -- the written layout, read line by line ------------------------------------------------
def _layers(n):
    layer = {"b": _sds((4,), jnp.float32), "w": _sds((4, 4), jnp.bfloat16)}
    return _structure({"act": "relu", "layers": [dict(layer) for _ in range(n)], "step": _sds((), jnp.int32, True)})


LAYERS = _layers(3).to_json()


@pytest.mark.parametrize(
    "s",
    [
        _layers(3),
        _layers(1),
        _structure(_sds((2,), jnp.float32)),
        _structure({"empty": [], "none": None}),
        _structure([_sds(jax.export.symbolic_shape("b, 2*b", constraints=["b >= 2"]), jnp.float32)]),
        ts.Structure.from_json(VALID),
    ],
    ids=["layers", "one_layer", "one_leaf", "no_leaves", "symbolic", "sharding_static_nodes"],
)
def test_the_written_layout_is_read_line_by_line_and_reads_as_any_json(s):
    text = s.to_json()
    assert _read_lines(text) is not None  # read line by line, not by `json.loads` of the whole text
    assert ts.Structure.from_json(text) == ts.Structure.from_json(_compact(text)) == s
    assert ts.Structure.from_json(text.encode()) == s


def _at(text, old, new, nth=0):
    """`text` with the `nth` occurrence of `old` replaced by `new`."""
    parts = text.split(old)
    assert len(parts) > nth + 1, (old, nth)
    return old.join(parts[: nth + 1]) + new + old.join(parts[nth + 1 :])


# Edits of a written document: each is read as the same document in any other layout reads.
LINE_EDITS = {
    "unknown_dtype": ('"dtype": "bfloat16"', '"dtype": "bfloat17"', 1),
    "weak_type_0": ('"weak_type": false}', '"weak_type": 0}', 2),
    "float_dim": ('"shape": [4]', '"shape": [4.0]', 1),
    "bool_dim": ('"shape": [4]', '"shape": [true]', 2),
    "other_path": ("\"path\": \"['layers'][1]['b']\"", "\"path\": \"['layers'][2]['b']\"", 0),
    "path_extended": ("['layers'][1]['b']\"", "['layers'][1]['b']x\"", 0),
    "path_cut": ("['layers'][1]['b']\"", "['layers'][1]\"", 0),
    "path_escaped": ('"path": "[\'layers\'][0]', '"path": "[\\u0027layers\'][0]', 0),
    "path_twice": ('"weak_type": false}', '"weak_type": false, "path": "[\'layers\'][0][\'b\']"}', 1),
    "path_twice_same": ('"weak_type": false}', '"weak_type": false, "path": "[\'layers\'][0][\'b\']"}', 0),
    "no_path": ("\"path\": \"['layers'][2]['w']\", ", "", 0),
    "extra_field": ('"weak_type": false}', '"weak_type": false, "extra": 1}', 0),
    "space_after_path": ('[\'b\']", "shape"', '[\'b\']" , "shape"', 1),
    "two_records_a_line": ('},\n    {"path"', '}, {"path"', 1),
    "record_over_two_lines": ('", "shape"', '",\n "shape"', 2),
    "blank_line": ('\n    {"path"', '\n\n    {"path"', 3),
    "no_comma": ('},\n    {"path"', '}\n    {"path"', 1),
    "comma_after_last_record": ("}\n  ]\n}", "},\n  ]\n}", 0),
    "static_value": ('"value": "relu"', '"value": 7', 0),
    "list_keys_reordered": ('{"type": "list", "n": 3}', '{"n": 3, "type": "list"}', 0),
    "list_n": ('{"type": "list", "n": 3}', '{"type": "list", "n": 4}', 0),
    "two_entries_a_line": ('"*",\n    "*"', '"*", "*"', 0),
    "entry_no_comma": ('"*",\n    "*"', '"*"\n    "*"', 0),
    "comma_after_last_entry": ('"*"\n  ],', '"*",\n  ],', 0),
    "no_entries": ('{"type": "dict", "keys": ["act", "layers", "step"]},', "", 0),
    "version": ('"version": 1,', '"version": 2,', 0),
    "constraints": ('"version": 1,', '"version": 1,\n  "constraints": ["b >= 2"],', 0),
    "constraints_junk": ('"version": 1,', '"version": 1,\n  "constraints": [3],', 0),
    "member_order": ('  "treedef": [', '  "leaves": [],\n  "treedef": [', 0),
    "no_final_newline": ("}\n", "}", -1),
    "crlf": ("\n", "\r\n", None),
    "indent_tab": ("\n    ", "\n\t", None),
}


def test_a_written_document_nested_too_deeply_is_a_value_error():
    deep = "[" * 100_000 + "]" * 100_000  # one line, as deep as no JSON reader goes
    with pytest.raises(ValueError, match="from_json: the JSON is nested too deeply"):
        ts.Structure.from_json(_at(LAYERS, '"*",', deep + ",", 0))


@pytest.mark.parametrize("name", list(LINE_EDITS))
def test_an_edited_written_document_reads_as_any_json(name):
    old, new, nth = LINE_EDITS[name]
    if nth is None:
        text = LAYERS.replace(old, new)
    elif nth < 0:
        text = LAYERS[: LAYERS.rindex(old)] + new + LAYERS[LAYERS.rindex(old) + len(old) :]
    else:
        text = _at(LAYERS, old, new, nth)
    assert text != LAYERS
    try:
        compact = _compact(text)
    except json.JSONDecodeError:
        with pytest.raises(ValueError, match="from_json: not valid JSON"):
            ts.Structure.from_json(text)
        return
    assert _outcome(text) == _outcome(compact)


# -- shapes that cannot exist ------------------------------------------------------------
def _symbolic_doc(shape, constraints=None):
    doc = {"version": 1, "treedef": [{"type": "dict", "keys": ["x"]}, "*"]}
    doc["leaves"] = [{"path": "['x']", "shape": shape, "dtype": "float32", "weak_type": False}]
    if constraints is not None:
        doc["constraints"] = constraints
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("shape", "constraints", "message"),
    [
        (
            ["-b", 3],
            None,
            "leaves[0].shape[0]: the leaf at ['x'] has the dimension '-b', which is below 0 for every size (dimension",
        ),
        (
            [2, "b - 5"],
            ["b <= 3"],
            "leaves[0].shape[1]: the leaf at ['x'] has the dimension 'b - 5', which is below 0 for every size the "
            "constraints allow (b <= 3;",
        ),
        (["b"], ["b >= 10", "b <= 5"], "constraints: no size satisfies 'b <= 5' together with 'b >= 10'"),
        (["b", "c"], ["b + c <= 1"], "constraints: no size satisfies 'b + c <= 1' (dimension variables are >= 1)"),
        (["b"], ["b == 3", "b >= 5"], "constraints: not valid constraints of a symbolic scope"),
        (["b"], [f"b >= {2**70}"], f"constraints: only sizes beyond {2**63 - 1} (2**63 - 1) satisfy 'b >= {2**70}'"),
        (["b"], ["b >= 2*c", f"c >= {2**63}"], f"constraints: only sizes beyond {2**63 - 1} (2**63 - 1) satisfy 'c"),
    ],
    ids=[
        "negative",
        "negative_under_constraints",
        "contradiction",
        "below_the_least_sizes",
        "found_by_jax",
        "beyond_63_bits",
        "beyond_63_bits_by_another_name",
    ],
)
def test_from_json_refuses_shapes_and_constraints_that_cannot_exist(shape, constraints, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        ts.Structure.from_json(_symbolic_doc(shape, constraints))
    assert str(info.value).startswith("treeshape.Structure.from_json: ")


@pytest.mark.parametrize("layout", ["as_written", "compact"])
def test_from_json_names_the_field_of_an_integer_of_more_digits_than_python_converts(layout):
    huge = "9" * 5000
    s = ts.structure_of({"n": 5, "x": jnp.zeros((2, 3))})
    static = (
        '{"path": "[\'n\']", "shape": null, "dtype": null, "weak_type": null, "static": "5", "type": "builtins:int", '
        '"value": 5}'
    )
    text = re.sub(r'\{"path": "\[\'n\'\]"[^}]*\}', lambda _: static, s.to_json())
    assert ts.Structure.from_json(text).leaves[0] == 5
    text = text if layout == "as_written" else json.dumps(json.loads(text))
    cases = [
        (
            text.replace("[2, 3]", f"[2, {huge}]"),
            "leaves[1].shape[1]: expected an integer in [0, 9223372036854775807], got ",
        ),
        (text.replace('"value": 5', f'"value": {huge}'), "leaves[0].value: a value of type builtins:int cannot be "),
        (text.replace('"version": 1', f'"version": -{huge}'), "version: this treeshape reads version 1, got "),
    ]
    for doc, message in cases:
        assert doc != text
        with pytest.raises(ValueError, match=re.escape(message + "an integer of 5000 digits")) as info:
            ts.Structure.from_json(doc)
        assert "set_int_max_str_digits" not in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize(
    "treedef",
    [
        [{"type": "list", "n": 1_000_000_000}, "*"],
        [{"type": "tuple", "n": 1_000_000_000}],
        [{"type": "namedtuple", "name": "jax.sharding:PartitionSpec", "n": 1_000_000_000}],
        [{"type": "dict", "keys": ["a"]}, {"type": "nnx", "name": "flax.nnx:Linear", "n": 10**18, "keys": []}],
    ],
    ids=["list", "tuple", "namedtuple", "framework"],
)
def test_from_json_refuses_a_node_claiming_more_children_than_the_document_holds_before_building_them(treedef):
    text = json.dumps({"version": 1, "treedef": treedef, "leaves": []})
    assert len(text) < 300
    where = "treedef[1].n" if len(treedef) == 2 and "keys" in treedef[0] else "treedef[0].n"
    with pytest.raises(ValueError, match=re.escape(f"{where}: the node claims ")):
        ts.Structure.from_json(text)


@pytest.mark.parametrize(
    ("shape", "constraints", "sizes"),
    [
        (["1 - b"], None, {"b": 1}),  # 0 for b = 1: an empty array
        (["b - 5"], None, {"b": 7}),  # negative for small sizes only
        (["b - 5"], ["b >= 5"], {"b": 5}),
        (["b", "c"], ["b + c <= 4"], {"b": 2, "c": 2}),
    ],
)
def test_from_json_keeps_shapes_that_some_sizes_allow(shape, constraints, sizes):
    s = ts.Structure.from_json(_symbolic_doc(shape, constraints))
    bound = s.bind(**sizes)
    assert all(d >= 0 for d in bound.leaves[0].shape)
    assert ts.Structure.from_json(s.to_json()) == s


@pytest.mark.parametrize(
    ("shape", "constraints", "where"),
    [(["b + " + "9" * 5000], None, "leaves[0].shape[0]"), (["b"], ["b >= " + "9" * 5000], "constraints")],
    ids=["shape", "constraint"],
)
def test_from_json_names_the_field_of_an_expression_with_an_integer_of_more_digits_than_python_converts(
    shape, constraints, where
):
    with pytest.raises(ValueError, match=re.escape(f"{where}: ") + r".* holds an integer of 5000 digits") as info:
        ts.Structure.from_json(_symbolic_doc(shape, constraints))
    assert "set_int_max_str_digits" not in str(info.value) and len(str(info.value)) < 300
