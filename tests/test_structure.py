"""`ts.Structure` and `ts.Mismatch`: value semantics, building values (and refusing 64-bit leaves
with x64 off), `astype`, comparing trees (paths, `ignore=`, messages for big trees)."""

import collections
import dataclasses
import os
import pickle
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from helpers import pcast_varying, varying
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


Point = collections.namedtuple("Point", ["x", "y"])

# The dtypes JAX gives Python scalars, and their short names in messages: 64-bit
# under `jax_enable_x64`, 32-bit otherwise (the suite runs in both modes).
INT = jax.dtypes.canonicalize_dtype(jnp.int64)
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)
I_NAME, F_NAME = f"i{INT.itemsize * 8}", f"f{FLOAT.itemsize * 8}"


@jtu.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array
    act: str = dataclasses.field(default="relu", metadata={"static": True})


def _mesh(kind=jax.sharding.AxisType.Explicit):
    return jax.make_mesh((8,), ("i",), axis_types=(kind,))


def _sample_tree():
    return {
        "params": Params(jnp.ones((2, 3), jnp.float32), jnp.zeros(3, jnp.bfloat16)),
        "opt": (Point(jnp.zeros(4, jnp.float16), 1.0), [jnp.int8(1), 3]),
        "key": jax.random.key(0),
        "rbg": jax.random.split(jax.random.key(1, impl="rbg"), 2),
        "flag": True,
        "name": "model",
        "empty": jnp.zeros((0, 5), jnp.float32),
    }


# -- the description -----------------------------------------------------------
def test_members():
    s = ts.structure_of(_sample_tree())
    assert s.treedef == jtu.tree_structure(_sample_tree())
    assert len(s) == 11
    assert s.paths == (
        "['empty']",
        "['flag']",
        "['key']",
        "['name']",
        "['opt'][0].x",
        "['opt'][0].y",
        "['opt'][1][0]",
        "['opt'][1][1]",
        "['params'].w",
        "['params'].b",
        "['rbg']",
    )
    assert s.leaves[3] == "model"
    assert s.leaves[5] == jax.ShapeDtypeStruct((), FLOAT, weak_type=True)
    assert s.tree["params"] == Params(
        jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((3,), jnp.bfloat16)
    )
    assert s.tree == jax.eval_shape(lambda t: t, {k: v for k, v in _sample_tree().items() if k != "name"}) | {
        "name": "model"
    }
    # size: one element per key; nbytes: bytes of the key data (threefry 2 x u32, rbg 4 x u32),
    # and the Python scalars 1.0 and 3 as wide as the mode's defaults.
    assert s.size == 0 + 1 + 1 + 4 + 1 + 1 + 1 + 6 + 3 + 2
    assert s.nbytes == 0 + 1 + 8 + 8 + FLOAT.itemsize + 1 + INT.itemsize + 24 + 6 + 2 * 16


def test_nbytes_matches_jax_arrays():
    tree = [jnp.zeros((3, 5), d) for d in (jnp.int4, jnp.bool_, jnp.float8_e4m3fn, jnp.complex64, jnp.uint16)]
    s = ts.structure_of(tree)
    assert s.nbytes == sum(x.nbytes for x in tree)
    assert s.size == sum(x.size for x in tree)
    big = ts.structure_of(jax.ShapeDtypeStruct((2**20, 2**14), jnp.float32))
    assert big.nbytes == 2**36 and big.size == 2**34
    assert repr(big) == "Structure(f32[1048576,16384], 1 leaf, 64.0 GiB)"


def test_repr_is_one_line():
    s = ts.structure_of({"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros(3, jnp.float32)})
    assert repr(s) == "Structure({'b': f32[3], 'w': f32[2,3]}, 2 leaves, 36 B)"
    long = ts.structure_of([jax.ShapeDtypeStruct((i,), jnp.float32) for i in range(100)])
    assert "\n" not in repr(long) and len(repr(long)) < 200 and "100 leaves" in repr(long)


def test_immutable():
    s = ts.structure_of({"w": jnp.zeros(2, jnp.float32)})
    for name in ["treedef", "leaves", "paths", "tree", "size", "nbytes", "_treedef", "_leaves", "other"]:
        with pytest.raises(AttributeError, match="immutable"):
            setattr(s, name, None)
        with pytest.raises(AttributeError, match="immutable"):
            delattr(s, name)
    tree = s.tree
    tree["w"] = "changed"  # the returned pytree is the caller's
    assert s.tree["w"] == jax.ShapeDtypeStruct((2,), jnp.float32)
    assert isinstance(s.leaves, tuple)


# -- value semantics ------------------------------------------------------------
def test_equality_and_hash():
    a = ts.structure_of({"w": jnp.zeros((2, 3)), "n": 1, "s": "x"})
    b = ts.out_structure(lambda: {"w": jnp.ones((2, 3)), "n": 5, "s": "x"})
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    different = [
        {"w": jnp.zeros((3, 2)), "n": 1, "s": "x"},  # shape
        {"w": jnp.zeros((2, 3), jnp.bfloat16), "n": 1, "s": "x"},  # dtype
        {"w": jnp.zeros((2, 3)), "n": jnp.int32(1), "s": "x"},  # weak_type
        {"w": jnp.zeros((2, 3)), "n": 1, "s": "y"},  # static leaf
        {"w": jnp.zeros((2, 3)), "m": 1, "s": "x"},  # treedef
        [jnp.zeros((2, 3)), 1, "x"],
    ]
    for tree in different:
        assert ts.structure_of(tree) != a
    assert a != {"w": jnp.zeros((2, 3))} and a != None  # noqa: E711


def test_sharding_is_not_compared():
    mesh = _mesh()
    x = jax.device_put(jnp.ones((16, 2)), NamedSharding(mesh, P("i")))
    sharded, plain = ts.structure_of(x), ts.structure_of(jnp.ones((16, 2)))
    assert sharded.leaves[0].sharding == x.sharding
    assert plain.leaves[0].sharding is None
    assert sharded == plain and hash(sharded) == hash(plain)
    assert not sharded.diff(plain)


def test_unhashable_static_leaves_still_hash():
    class Cfg:
        __hash__ = None

        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return isinstance(other, Cfg) and other.n == self.n

    a, b, c = (ts.structure_of({"cfg": Cfg(n), "x": jnp.ones(2)}) for n in (1, 1, 2))
    assert a == b and hash(a) == hash(b)
    assert a != c


def _roundtrip(s):
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == hash(s)
    assert copy.paths == s.paths and repr(copy) == repr(s)
    return copy


def test_pickle_roundtrip():
    _roundtrip(ts.structure_of(_sample_tree()))
    _roundtrip(ts.structure_of(()))
    _roundtrip(ts.out_structure(lambda: jnp.zeros((0,), jnp.float8_e5m2)))
    # Concrete shardings travel as their abstract mesh (devices do not pickle).
    mesh = _mesh()
    x = jax.device_put(jnp.ones((16, 2)), NamedSharding(mesh, P("i")))
    copy = _roundtrip(ts.structure_of({"x": x, "d": jax.device_put(jnp.ones(2), jax.devices()[3])}))
    assert copy.leaves[1].sharding == NamedSharding(mesh.abstract_mesh, P("i"))
    assert copy.leaves[0].sharding is None


def test_pickle_roundtrip_of_manual_axes():
    seen = []

    def body(x):
        seen.append(ts.structure_of({"x": x, "n": 1.0}))
        return x

    _run_shard_map(body, jnp.ones((16, 2)))
    copy = _roundtrip(seen[0])
    assert varying(copy.leaves[1]) == frozenset({"i"})


# -- building values --------------------------------------------------------------
def _leaf_type(x):
    t = jax.typeof(x)
    return t.shape, t.dtype, t.weak_type


def test_zeros_ones_full_keep_every_leaf_type():
    s = ts.structure_of(_sample_tree())
    for build, value in [(s.zeros, 0), (s.ones, 1), (lambda: s.full(7), 7)]:
        out = build()
        assert ts.structure_of(out) == s
        assert out["name"] == "model"
        assert out["params"].act == "relu"
        for leaf, spec in zip(jax.tree.leaves(out), s.leaves, strict=True):
            if isinstance(spec, str):
                continue
            assert _leaf_type(leaf) == (spec.shape, spec.dtype, spec.weak_type)
            if jax.dtypes.issubdtype(spec.dtype, jax.dtypes.prng_key):
                assert jax.random.key_impl(leaf) == jax.random.key_impl(
                    _sample_tree()["key" if spec.shape == () else "rbg"]
                )
                assert not np.asarray(jax.random.key_data(leaf)).any()  # zero key data, also for ones/full
            elif spec.dtype == jnp.bool_:
                assert np.asarray(leaf).all() == bool(value) if leaf.size else True
            else:
                np.testing.assert_array_equal(np.asarray(leaf, np.float32), np.full(spec.shape, value))


@pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint8, jnp.float8_e4m3fn, jnp.bfloat16, jnp.float16, jnp.complex64])
def test_zeros_of_weak_leaves_of_any_dtype(dtype):
    leaf = jax.ShapeDtypeStruct((2,), dtype, weak_type=True)
    s = ts.out_structure(lambda: leaf)  # a ShapeDtypeStruct in the output is kept as is
    assert s.leaves == (leaf,)
    z = s.zeros()
    assert _leaf_type(z) == ((2,), jnp.dtype(dtype), True)
    assert ts.structure_of(z) == s


def test_x64_zeros():
    with jax.enable_x64(True):
        s = ts.structure_of({"i": 1, "f": jnp.zeros(2, jnp.float64), "c": jnp.zeros(1, jnp.complex128)})
        z = s.ones()
        assert ts.structure_of(z) == s
        assert z["i"].dtype == jnp.int64 and z["i"].weak_type


@pytest.mark.parametrize("value", [1 + 2j, 0.5j, 0j, np.complex64(3j)], ids=["1+2j", "0.5j", "0j", "np"])
@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_full_with_a_complex_value_fills_bool_leaves_nonzero_as_true(value, jit):
    s = ts.structure_of({"mask": jnp.zeros(3, bool), "z": jnp.zeros(2, jnp.complex64), "seen": False})
    # NumPy's reading (and jnp.full's on the newest JAX; jax 0.8.0's dropped the imaginary part)
    expected = {
        "mask": np.full(3, value).astype(bool),
        "z": np.full(2, value, np.complex64),
        "seen": np.asarray(value).astype(bool),
    }
    out = jax.jit(lambda: s.full(value))() if jit else s.full(value)  # no warning (filterwarnings=error)
    assert s.matches(out)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), out, expected))
    assert bool(out["mask"][0]) == (value != 0)
    with pytest.raises(TypeError) as info:
        ts.structure_of({"mask": jnp.zeros(3, bool), "n": jnp.zeros(2, jnp.int8)}).full(value)
    assert "tree['n'] (1 of 2 leaves) is of an integer or real floating dtype" in str(info.value)
    assert "mask" not in str(info.value)


def test_zeros_in_every_context(in_context):
    def body(x):
        s = ts.structure_of({"x": x, "weak": 2.0, "key": jax.random.key(0), "s": "static", "i": jnp.int8(1)})
        for out in [s.zeros(), s.ones(), s.full(3)]:
            assert ts.structure_of(out) == s
            assert out["s"] == "static"
        return x + s.zeros()["x"] + s.full(0.5)["weak"]

    np.testing.assert_array_equal(in_context(body, jnp.ones(3)), in_context(lambda x: x + 0.5, jnp.ones(3)))


def _run_shard_map(f, x):
    mesh = _mesh()
    g = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return g(jax.device_put(x, NamedSharding(mesh, P("i"))))


def test_zeros_keep_manual_axes_under_shard_map():
    def body(x):
        s = ts.structure_of({"varying": x, "invariant": jnp.ones(2), "weak": pcast_varying(1.0, "i")})
        assert varying(x) == frozenset({"i"})
        z = s.zeros()
        assert varying(z["varying"]) == frozenset({"i"})
        assert varying(z["weak"]) == frozenset({"i"})
        assert jax.typeof(z["weak"]).weak_type
        assert not varying(z["invariant"])
        assert ts.structure_of(z) == s
        # The zeros can be a carry of a loop whose body returns varying values.
        carry = lax.fori_loop(0, 2, lambda i, c: {**c, "varying": c["varying"] + x}, z)
        return carry["varying"]

    out = _run_shard_map(body, jnp.arange(16.0).reshape(8, 2))
    np.testing.assert_array_equal(out, 2 * np.arange(16.0).reshape(8, 2))


def test_top_level_zeros_are_placed_with_a_concrete_sharding():
    mesh = _mesh()
    sharding = NamedSharding(mesh, P("i"))
    x = jax.device_put(jnp.ones((16, 2)), sharding)
    one_device = jax.device_put(jnp.ones(3), jax.devices()[5])
    sds = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)
    s = ts.structure_of({"x": x, "d": one_device, "sds": sds, "plain": jnp.ones(2)})
    for out in [s.zeros(), s.ones(), s.full(2)]:
        assert out["x"].sharding == sharding
        assert len(out["x"].sharding.device_set) == 8
        assert out["sds"].sharding == sharding
        assert out["d"].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[5])
        assert not out["plain"].committed
    keys = jax.device_put(jax.random.split(jax.random.key(0), 8), sharding)
    assert ts.structure_of(keys).zeros().sharding == sharding


def test_abstract_mesh_shardings_are_placed_on_the_set_mesh():
    mesh = _mesh()
    x = jax.device_put(jnp.ones((16, 2)), NamedSharding(mesh, P("i")))
    s = ts.out_structure(lambda y: {"y": y * 2, "r": jnp.zeros(4)}, x)  # shardings over the abstract mesh
    assert s.leaves[1].sharding.mesh == mesh.abstract_mesh
    # No mesh set: the mesh of the call's argument (never silently one device).
    assert s.zeros()["y"].sharding == NamedSharding(mesh, P("i", None))
    with pytest.raises(ValueError, match=re.escape("tree['y']")):
        pickle.loads(pickle.dumps(s)).zeros()  # no argument to take a mesh from
    with jax.set_mesh(mesh):
        z = s.zeros()
    assert z["y"].sharding == NamedSharding(mesh, P("i", None))
    assert z["r"].sharding.mesh == mesh


@pytest.mark.parametrize("set_mesh", [True, False], ids=["set_mesh", "no_mesh"])
def test_zeros_under_jit_keep_explicit_shardings_as_scan_carry(set_mesh):
    mesh = _mesh()
    x = jax.device_put(jnp.ones((16, 2)), NamedSharding(mesh, P("i")))

    @jax.jit
    def run(x):
        s = ts.out_structure(lambda y: {"y": y * 2, "n": y.sum()}, x)
        z = s.zeros()
        assert jax.typeof(z["y"]).sharding.spec == P("i", None)  # part of the type
        assert ts.structure_of(z) == s
        carry, _ = lax.scan(lambda c, _: ({"y": c["y"] + x, "n": c["n"] + 1}, None), z, length=3)
        return carry["y"]

    if set_mesh:
        with jax.set_mesh(mesh):
            out = run(x)
    else:
        out = run(x)
    np.testing.assert_array_equal(out, np.full((16, 2), 3.0))
    assert out.sharding == NamedSharding(mesh, P("i", None))


def _hlo_ops(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sorted(re.findall(r"= \S+ ([a-z][\w-]*)\(", text))


def test_zeros_under_jit_add_no_runtime_op():
    tree = {"w": jnp.ones((4, 3)), "b": jnp.ones(3, jnp.bfloat16), "n": 1.0, "i": 2, "k": jax.random.key(0)}
    s = ts.structure_of(tree)

    def with_treeshape(t):
        z = s.zeros()
        return {"w": t["w"] + z["w"], "b": t["b"] * z["b"], "n": t["n"] + z["n"], "i": z["i"], "k": z["k"]}

    def by_hand(t):
        return {
            "w": t["w"] + jnp.zeros((4, 3)),
            "b": t["b"] * jnp.zeros(3, jnp.bfloat16),
            "n": t["n"] + 0.0,
            "i": jnp.asarray(0),
            "k": jnp.zeros((), t["k"].dtype),
        }

    assert _hlo_ops(with_treeshape, tree) == _hlo_ops(by_hand, tree)
    assert ts.structure_of(jax.jit(with_treeshape)(tree)) == ts.structure_of(jax.jit(by_hand)(tree))


# -- comparing ----------------------------------------------------------------
def test_diff_reports_every_leaf_difference_by_path():
    s = ts.structure_of({"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros(3, jnp.float32), "n": 1.0, "s": "relu"})
    # "n": a strong array of the dtype JAX gives the Python float 1.0: only the weak flag differs.
    actual = {
        "w": jnp.zeros((3, 2), jnp.bfloat16),
        "b": jnp.zeros(3, jnp.float32),
        "n": jnp.asarray(1, FLOAT),
        "s": "gelu",
    }
    assert s.diff(actual) == [
        ts.Mismatch("['n']", "weak_type", True, False),
        ts.Mismatch("['s']", "structure", "the static value 'relu'", "the static value 'gelu'"),
        ts.Mismatch("['w']", "shape", (2, 3), (3, 2)),
        ts.Mismatch("['w']", "dtype", jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)),
    ]
    assert not s.matches(actual)
    assert s.matches({"w": jnp.ones((2, 3), jnp.float32), "b": np.ones(3, np.float32), "n": 5.0, "s": "relu"})
    assert s.diff(ts.structure_of(actual)) == s.diff(actual)  # a Structure is accepted too


def test_diff_reports_missing_extra_and_different_nodes():
    f32 = lambda n: jnp.zeros(n, jnp.float32)
    s = ts.structure_of(
        {
            "a": f32(2),
            "b": {"c": 1, "d": f32(1)},
            "t": (f32(1), f32(2)),
            "p": Point(f32(1), f32(1)),
            "l": [f32(1), f32(2)],
        }
    )
    actual = {
        "b": {"d": f32(5), "e": 2.0},
        "t": [f32(1), f32(2)],
        "p": {"x": f32(1), "y": f32(1)},
        "l": [f32(1), jnp.zeros(2, jnp.int32), f32(3)],
        "z": "extra",
    }
    assert s.diff(actual) == [
        ts.Mismatch("['a']", "structure", "f32[2]", None),
        ts.Mismatch("['b']['c']", "structure", f"~{I_NAME}[]", None),
        ts.Mismatch("['b']['d']", "shape", (1,), (5,)),
        ts.Mismatch("['b']['e']", "structure", None, f"~{F_NAME}[]"),
        ts.Mismatch("['l'][1]", "dtype", jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)),
        ts.Mismatch("['l'][2]", "structure", None, "f32[3]"),
        ts.Mismatch("['p']", "structure", "a Point with 2 children", "a dict with keys ['x', 'y']"),
        ts.Mismatch("['t']", "structure", "a tuple with 2 children", "a list with 2 children"),
        ts.Mismatch("['z']", "structure", None, "the static value 'extra'"),
    ]


def test_diff_leaf_count_and_node_vs_leaf():
    f32 = lambda n: jnp.zeros(n, jnp.float32)
    s = ts.structure_of([f32(1), f32(2)])
    assert s.diff([f32(1)]) == [ts.Mismatch("[1]", "structure", "f32[2]", None)]
    assert s.diff(f32(2)) == [ts.Mismatch("", "structure", "a list with 2 children", "f32[2]")]
    assert s.diff(None) == [ts.Mismatch("", "structure", "a list with 2 children", "None")]
    assert ts.structure_of(f32(2)).diff([f32(2)]) == [ts.Mismatch("", "structure", "f32[2]", "a list with 1 child")]
    assert ts.structure_of(Point(1, 2)).diff(Point(1, (2, 3))) == [
        ts.Mismatch(".y", "structure", f"~{I_NAME}[]", "a tuple with 2 children")
    ]
    p = ts.structure_of(Params(jnp.zeros(2), jnp.zeros(2)))
    assert p.diff(Params(jnp.zeros(2), jnp.zeros(2), act="gelu")) == [
        ts.Mismatch(".act", "structure", "'relu'", "'gelu'")  # the static field, by its name
    ]
    assert p.diff(Params(jnp.zeros(2), jnp.zeros(3))) == [ts.Mismatch(".b", "shape", (2,), (3,))]


def test_diff_vma_inside_shard_map():
    found = []

    def body(x):
        s = ts.structure_of({"v": x, "u": jnp.zeros(2)})
        found.append(s.diff({"v": jnp.zeros(x.shape), "u": pcast_varying(jnp.zeros(2), "i")}))
        with pytest.raises(ts.StructureMismatchError) as info:
            s.check({"v": jnp.zeros(x.shape), "u": jnp.zeros(2)})
        found.append(str(info.value))
        return x

    _run_shard_map(body, jnp.ones(16))
    assert found[0] == [
        ts.Mismatch("['u']", "vma", frozenset(), frozenset({"i"})),
        ts.Mismatch("['v']", "vma", frozenset({"i"}), frozenset()),
    ]
    assert "tree['v']: expected a leaf varying over manual axes {'i'}, got {} (none)." in found[1]
    assert "lax.pcast(x, ('i',), to=\"varying\")" in found[1]


def test_check_raises_one_error_listing_every_mismatch():
    s = ts.structure_of(
        {"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros(3, jnp.float32), "step": 0, "cfg": {"lr": 0.1}}
    )
    # "step": a strong array of the dtype JAX gives the Python int 0: only the weak flag differs.
    actual = {"w": jnp.zeros((2, 4), jnp.bfloat16), "step": jnp.asarray(0, INT), "cfg": {"lr": 0.1, "wd": 0.0}}
    with pytest.raises(ts.StructureMismatchError) as info:
        s.check(actual)
    err = info.value
    assert isinstance(err, TypeError)
    assert err.mismatches == s.diff(actual)
    assert len(err.mismatches) == 5
    message = str(err)
    assert message.startswith("treeshape.Structure.check: the tree does not match; 5 differences:")
    for line in [
        "* tree['b']: missing; expected f32[3]. Add this entry.",
        f"* tree['cfg']['wd']: unexpected extra entry ~{F_NAME}[]. Remove this entry.",
        "* tree['step']: expected a weakly typed leaf, got a strongly typed one.",
        "* tree['w']: expected shape (2, 3), got (2, 4). Make this leaf shape (2, 3).",
        "* tree['w']: expected dtype float32, got bfloat16. Convert it with `.astype(float32)`.",
    ]:
        assert line in message
    assert (
        s.check({"w": jnp.ones((2, 3), jnp.float32), "b": jnp.ones(3, jnp.float32), "step": 5, "cfg": {"lr": 0.5}})
        is None
    )


def test_check_key_dtype_fix():
    s = ts.structure_of({"key": jax.random.key(0)})
    with pytest.raises(ts.StructureMismatchError) as info:
        s.check({"key": jnp.zeros(2, jnp.uint32)})
    message = str(info.value)
    assert "tree['key']: expected shape (), got (2,)." in message
    assert "tree['key']: expected dtype key<fry>, got uint32." in message
    assert "jax.random.wrap_key_data" in message


def test_check_single_mismatch_is_one_sentence():
    with pytest.raises(ts.StructureMismatchError, match=re.escape("tree[0]: expected dtype int32, got float32.")):
        ts.structure_of([jnp.zeros(2, jnp.int32)]).check([jnp.zeros(2, jnp.float32)])


def test_check_inside_jit():
    s = ts.structure_of({"x": jax.ShapeDtypeStruct((3,), jnp.float32)})

    @jax.jit
    def f(x):
        s.check({"x": x})
        assert not s.matches({"x": x[:2]})
        return x

    f(jnp.ones(3, jnp.float32))
    with pytest.raises(ts.StructureMismatchError, match=re.escape("tree['x']: expected shape (3,), got (4,)")):
        f(jnp.ones(4, jnp.float32))


def test_mismatch_is_a_frozen_dataclass_with_a_sentence():
    m = ts.Mismatch("[0]", "shape", (8,), (8, 1), root="carry")
    assert str(m) == "carry[0]: expected shape (8,), got (8, 1)."
    assert dataclasses.astuple(m) == ("[0]", "shape", (8,), (8, 1), "carry", (), "", "", ())  # ends: fix, here
    assert (m.where, m.what) == ("carry[0]", "expected shape (8,), got (8, 1).")
    assert str(ts.Mismatch("['w']", "dtype", "float32", "int32")) == "tree['w']: expected dtype float32, got int32."
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.path = "x"  # type: ignore[misc]
    assert str(ts.Mismatch("['a']", "dtype", jnp.dtype("float32"), jnp.dtype("int8"), root="t")) == (
        "t['a']: expected dtype float32, got int8."
    )
    assert str(ts.Mismatch("", "weak_type", False, True, root="t")) == (
        "t: expected a strongly typed leaf, got a weakly typed one."
    )
    assert str(ts.Mismatch("", "structure", "f32[2]", None, root="t")) == "t: missing; expected f32[2]."
    assert str(ts.Mismatch("", "structure", None, "f32[2]", root="t")) == "t: unexpected extra entry f32[2]."


class _ArrayMeta:
    """A pytree node whose static data is a NumPy array (JAX refuses to compare it)."""

    def __init__(self, x, meta):
        self.x, self.meta = x, meta


jax.tree_util.register_pytree_node(
    _ArrayMeta, lambda n: ((n.x,), n.meta), lambda meta, children: _ArrayMeta(children[0], meta)
)


def test_node_data_that_jax_cannot_compare_is_diffed_by_contents():
    s = ts.structure_of({"n": _ArrayMeta(jnp.zeros(2), np.array([1, 2]))})
    other = {"n": _ArrayMeta(jnp.zeros(2), np.array([1, 3])), "extra": 1}
    assert [(m.path, m.kind) for m in s.diff(other)] == [("['extra']", "structure"), ("['n']", "structure")]
    assert s.diff(other)[1].expected == "a _ArrayMeta with static data array([1, 2])"
    assert not s.matches(other)
    with pytest.raises(ts.StructureMismatchError, match=re.escape("tree['n']")):
        s.check(other)
    same = {"n": _ArrayMeta(jnp.zeros(2), np.array([1, 2]))}
    assert s.diff(same) == []
    assert s == ts.structure_of(same) and hash(s) == hash(ts.structure_of(same))
    changed_leaf = {"n": _ArrayMeta(jnp.zeros(3), np.array([1, 2]))}
    # The node has no keys: JAX's own flattened-index key names the child, as in `s.paths`.
    assert [(m.path, m.kind) for m in s.diff(changed_leaf)] == [(s.paths[0], "shape")]
    assert s.paths == ("['n'][<flat index 0>]",)
    assert s != ts.structure_of(changed_leaf)


# -- astype: Python types and 64-bit dtypes --------------------------------------------------
_PARAMS = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3, jnp.float32), "n": jnp.int32(0)}


@pytest.mark.parametrize("kind", [float, int, complex, bool])
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
def test_astype_to_a_python_type_is_jaxs_default_dtype_of_that_kind(kind, x64):
    with jax.enable_x64(x64):
        s = ts.structure_of(_PARAMS).astype(kind)
        expected = jnp.zeros(3, kind).dtype  # JAX's reading of the Python type
        assert [leaf.dtype for leaf in s.leaves] == [expected, jnp.dtype(jnp.int32), expected]
        assert s.matches(jax.jit(s.zeros)()) and s.matches(s.ones())


@pytest.mark.parametrize("dtype", [jnp.float64, np.int64, "float64", np.dtype("float64"), jnp.complex128])
@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_astype_to_a_64_bit_dtype_with_x64_off_is_refused_as_zeros_refuses_it(dtype, jit):
    s = ts.structure_of(_PARAMS)
    name = np.dtype(dtype).name
    narrow = {"float64": "float32", "int64": "int32", "complex128": "complex64"}[name]
    with jax.enable_x64(False):
        with pytest.raises(ValueError) as info:
            jax.jit(lambda: s.astype(dtype).zeros())() if jit else s.astype(dtype)
        assert str(info.value) == (
            f"treeshape.Structure.astype: {name} is a 64-bit dtype, but jax_enable_x64 is off, so JAX would "
            f"silently make arrays of it {narrow} (`zeros()` refuses such a Structure). It would convert tree['b'], "
            "tree['w']. Turn x64 on first: `jax.config.update(\"jax_enable_x64\", True)`, or build inside `with "
            f"jax.enable_x64(True):`; or convert to {narrow}."
        )
        assert ts.structure_of({"n": jnp.int32(0)}).astype(dtype) == ts.structure_of({"n": jnp.int32(0)})  # none
    with jax.enable_x64(True):
        wide = s.astype(dtype)
        assert wide.tree["b"].dtype == np.dtype(dtype) and wide.matches(wide.zeros())


# -- NamedTuple children are keyed by their own fields -----------------------------------
Pair = collections.namedtuple("Pair", "a b")


def test_namedtuple_children_are_named_by_their_own_field_everywhere():
    s = ts.structure_of(Pair(jnp.zeros(8), jnp.zeros(3)))
    assert s.paths == (".a", ".b")
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    with pytest.raises(TypeError, match=r"shardings\.b is str 'x', not a sharding") as info:
        s.with_shardings(Pair(jax.NamedSharding(mesh, jax.P("d")), "x"))
    assert "shardings.a" not in str(info.value)

    class Holder:
        def __init__(self, value):
            self.value = value

    with pytest.raises(TypeError, match=r"the output leaf \.b holds a JAX tracer"):
        ts.out_structure(lambda x: Pair(x, Holder(x)), jnp.ones(2))
    assert ts.Structure.from_json(s.to_json()).paths == (".a", ".b")
    [m] = s.diff(Pair(jnp.zeros(8), jnp.zeros(4)))
    assert (m.path, m.kind) == (".b", "shape")


# -- 64-bit Structures with x64 off -------------------------------------------------
def _wide_structure():
    """A Structure made with x64 on: 64-bit leaves next to 32-bit and static ones."""
    with jax.enable_x64(True):
        tree = {
            "w": jnp.zeros(3, jnp.float64),
            "step": 1,  # a weak int64
            "f32": jnp.zeros(2, jnp.float32),
            "name": "adam",
            "z": jax.ShapeDtypeStruct((2,), jnp.complex128),
        }
        return ts.structure_of(tree)


X64_FIX = (
    'Turn x64 on first: `jax.config.update("jax_enable_x64", True)`, or build the values inside '
    "`with jax.enable_x64(True):`. Or rebuild the Structure with the dtypes JAX uses with x64 off: "
    "`ts.structure_of(s.tree)`, called with x64 off, makes each 64-bit leaf 32-bit."
)


BUILDERS = {"zeros": lambda s: s.zeros(), "ones": lambda s: s.ones(), "full": lambda s: s.full(2)}


@pytest.mark.parametrize("method", list(BUILDERS))
def test_64_bit_leaves_with_x64_off_are_refused(top_or_jit, method):
    s = _wide_structure()
    assert [str(getattr(leaf, "dtype", "static")) for leaf in s.leaves] == [
        "float32",
        "static",
        "int64",
        "float64",
        "complex128",
    ]
    with jax.enable_x64(False):

        def run():
            with pytest.raises(ValueError) as info:
                BUILDERS[method](s)
            assert str(info.value) == (
                f"treeshape.Structure.{method}: 3 leaves have 64-bit dtypes, but jax_enable_x64 is off, so JAX "
                "would silently make them 32-bit and the result would not match this Structure (one made with "
                "x64 on, e.g. unpickled from such a process).\n\n"
                "  * ~i64: tree['step']\n"
                "  * f64: tree['w']\n"
                "  * c128: tree['z']\n\n" + X64_FIX
            )
            # the fix: the same structure with the dtypes JAX uses now
            narrow = ts.structure_of(s.tree)
            assert [str(leaf.dtype) for leaf in narrow.leaves if hasattr(leaf, "dtype")] == [
                "float32",
                "int32",
                "float32",
                "complex64",
            ]
            assert narrow.leaves[2].weak_type
            values = BUILDERS[method](narrow)
            assert narrow.matches(values)
            return jnp.zeros(())

        top_or_jit(run)
    with jax.enable_x64(True):  # and with x64 on, the values are exact

        def exact():
            assert s.matches(BUILDERS[method](s))
            return jnp.zeros(())

        top_or_jit(exact)


def test_one_64_bit_leaf_and_many(top_or_jit):
    with jax.enable_x64(True):
        one = ts.structure_of(jnp.zeros((2, 3), jnp.float64))
        many = ts.structure_of({"a": [jnp.zeros(2, jnp.float64)] * 10, "n": jnp.zeros((), jnp.uint64)})
    with jax.enable_x64(False):

        def run():
            with pytest.raises(ValueError) as info:
                one.zeros()
            assert str(info.value) == (
                "treeshape.Structure.zeros: tree is f64[2,3], a 64-bit dtype, but jax_enable_x64 is off, so JAX "
                "would silently make it 32-bit and the result would not match this Structure (one made with x64 "
                "on, e.g. unpickled from such a process).\n\n" + X64_FIX
            )
            with pytest.raises(ValueError) as info:
                many.ones()
            message = str(info.value)
            assert message.startswith("treeshape.Structure.ones: 11 leaves have 64-bit dtypes")
            assert "  * f64: tree['a'][0], tree['a'][1], tree['a'][2] and 7 more (10 leaves)\n" in message
            assert "  * u64: tree['n']\n" in message
            assert max(len(line) for line in message.splitlines()) < 300
            return jnp.zeros(())

        top_or_jit(run)


def test_explicit_64_bit_dtypes_allowed():
    # With `jax_explicit_x64_dtypes="allow"` JAX keeps explicit 64-bit dtypes with x64 off: nothing to refuse.
    s = _wide_structure()
    before = jax.config.jax_explicit_x64_dtypes.name.lower()
    jax.config.update("jax_explicit_x64_dtypes", "allow")
    try:
        with jax.enable_x64(False):
            values = s.zeros()
            assert values["w"].dtype == jnp.float64 and s.matches(values)
    finally:
        jax.config.update("jax_explicit_x64_dtypes", before)


_PICKLE_IN_X64 = """
import pickle, sys
import jax, jax.numpy as jnp
import treeshape as ts
assert jax.config.jax_enable_x64
s = ts.structure_of({"w": jnp.zeros(3, jnp.float64), "step": 1, "b": jnp.zeros(2, jnp.float32)})
sys.stdout.write(pickle.dumps(s).hex())
"""


def test_structure_pickled_in_an_x64_process():
    env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", _PICKLE_IN_X64], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    s = pickle.loads(bytes.fromhex(done.stdout))
    assert [str(leaf.dtype) for leaf in s.leaves] == ["float32", "int64", "float64"]
    with jax.enable_x64(False):
        for build in (lambda: s.zeros(), jax.jit(lambda: s.zeros())):
            with pytest.raises(ValueError) as info:
                build()
            message = str(info.value)
            assert "2 leaves have 64-bit dtypes, but jax_enable_x64 is off" in message
            assert "  * ~i64: tree['step']\n  * f64: tree['w']\n" in message
    with jax.enable_x64(True):
        assert s.matches(s.zeros()) and s.matches(jax.jit(s.ones)())


@pytest.mark.parametrize("policy", ["promote", "cast"])
def test_upcast_towards_64_bit_leaves_with_x64_off_is_refused(top_or_jit, policy):
    s = _wide_structure()
    with jax.enable_x64(False):
        tree = {
            "f32": jnp.ones(2),
            "name": "adam",
            "step": jnp.zeros((), jnp.int32),
            "w": jnp.ones(3, jnp.float32),
            "z": jnp.ones(2, jnp.complex64),
        }

        def run():
            with pytest.raises(ValueError) as info:
                ts.upcast(tree, s, policy=policy)  # what zeros() says: no helper makes a 64-bit array here
            assert str(info.value) == (
                "treeshape.upcast: 3 leaves have 64-bit dtypes, but jax_enable_x64 is off, so JAX "
                "would silently make them 32-bit and the result would not match this Structure (one made with "
                "x64 on, e.g. unpickled from such a process).\n\n"
                "  * ~i64: tree['step']\n"
                "  * f64: tree['w']\n"
                "  * c128: tree['z']\n\n" + X64_FIX
            )
            # only the leaves that would be converted count: f32 stays f32
            narrow = ts.upcast(tree, ts.structure_of(s.tree), policy=policy)
            assert narrow["w"].dtype == jnp.float32 and narrow["step"].dtype == jnp.int32
            return jnp.zeros(())

        top_or_jit(run)
    with jax.enable_x64(True):
        wide = ts.upcast(jax.tree.map(lambda x: x, tree), s, policy=policy)
        assert wide["w"].dtype == jnp.float64 and s.matches(wide)


# -- paths that match -----------------------------------------------------------------
def test_mismatch_paths_are_keystr_paths_like_structure_paths():
    s = ts.structure_of(
        {"w": jnp.zeros(3, jnp.float32), "opt": [jnp.zeros(2, jnp.float32), {"mu": jnp.zeros(2, jnp.float32)}]}
    )
    mismatches = s.diff(
        {"w": jnp.zeros(4, jnp.float32), "opt": [jnp.zeros(2, jnp.float32), {"mu": jnp.zeros(2, jnp.int32)}]}
    )
    assert [m.path for m in mismatches] == ["['opt'][1]['mu']", "['w']"]
    assert all(m.path in s.paths for m in mismatches)
    assert [m.root for m in mismatches] == ["tree", "tree"]
    assert str(mismatches[1]) == "tree['w']: expected shape (3,), got (4,)."
    weak = ts.structure_of({"lr": 0.1, "w": jnp.zeros(2, jnp.float32)})
    [m] = weak.diff({"lr": jnp.zeros((), FLOAT), "w": jnp.zeros(2, jnp.float32)})  # strong, same dtype
    assert m.path in ts.weak_paths(weak)


# -- ignore= ------------------------------------------------------------------------
def test_ignore_leaves_out_the_named_kinds():
    s = ts.structure_of({"step": 0, "w": jnp.zeros((2, 3), jnp.float32)})
    restored = {"step": jnp.zeros((), INT), "w": jnp.zeros((2, 3), jnp.float32)}  # strong, same dtype
    assert [m.kind for m in s.diff(restored)] == ["weak_type"]
    assert s.diff(restored, ignore={"weak_type"}) == []
    assert s.matches(restored, ignore=["weak_type"])
    s.check(restored, ignore="weak_type")  # one kind as a string
    other = {"step": jnp.zeros((), INT), "w": jnp.zeros((3, 2), jnp.bfloat16)}
    assert [m.kind for m in s.diff(other, ignore={"weak_type", "dtype"})] == ["shape"]
    assert s.diff(other, ignore={"weak_type", "dtype", "shape", "vma", "sharding"}) == []
    with pytest.raises(ts.StructureMismatchError) as info:
        s.check(other, ignore={"weak_type"})
    assert [m.kind for m in info.value.mismatches] == ["shape", "dtype"]


def test_ignore_never_hides_a_structure_difference():
    s = ts.structure_of({"a": jnp.zeros(2, jnp.float32)})
    assert [m.kind for m in s.diff({"b": jnp.zeros(2, jnp.float32)}, ignore={"shape", "dtype"})] == [
        "structure",
        "structure",
    ]
    with pytest.raises(ValueError, match=r"`ignore` takes mismatch kinds among .*'weak_type'.*got 'structure'"):
        s.diff({"a": jnp.zeros(2, jnp.float32)}, ignore={"structure"})
    with pytest.raises(ValueError, match="got 'dtypes'"):
        s.check({"a": jnp.zeros(2, jnp.float32)}, ignore={"dtypes"})


# -- messages for big trees ------------------------------------------------------------
def test_leaves_that_fail_alike_are_one_line():
    init = {f"layer{i}": {"w": jnp.zeros((3, 4), jnp.bfloat16), "b": jnp.zeros(4, jnp.bfloat16)} for i in range(19)}
    body = lambda c, x: (jax.tree.map(lambda v: v + x.sum(), c), None)  # bf16 + f32 -> f32, 38 leaves
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.carry_structure(body, init, jnp.ones((2, 3), jnp.float32))
    err = info.value
    assert len(err.mismatches) == 38  # every mismatch stays on the exception
    message = str(err)
    assert message.count('policy="promote" would') == 1
    listed = "carry['layer0']['b'], carry['layer0']['w'], carry['layer1']['b'] and 35 more"
    assert f"38 leaves fail alike ({listed})" in message
    assert "e.g. carry['layer0']['b']: input bf16[4], output f32[4]." in message
    assert max(len(line) for line in message.splitlines()) <= 300
    assert len(message) < 600  # was 8 KB: one sentence repeated 38 times


def test_check_groups_and_keeps_lines_short():
    s = ts.structure_of({f"p{i:03d}": np.zeros(2, np.float32) for i in range(200)})
    with pytest.raises(ts.StructureMismatchError) as info:
        s.check({f"p{i:03d}": np.zeros(2, np.int32) for i in range(200)})
    message = str(info.value)
    assert "200 differences" in message and "200 leaves fail alike" in message and "and 197 more" in message
    assert max(len(line) for line in message.splitlines()) <= 300
    assert len(info.value.mismatches) == 200


@jtu.register_dataclass
@dataclasses.dataclass
class _Linear:
    """A node with big static data, like a flax.nnx module's graph description."""

    kernel: jax.Array
    in_features: int = dataclasses.field(metadata={"static": True})
    out_features: int = dataclasses.field(metadata={"static": True})
    config: tuple = dataclasses.field(default=tuple(f"option_{i}" for i in range(60)), metadata={"static": True})


def test_node_data_is_told_by_the_fields_that_differ_and_the_leaves_under_them():
    a = _Linear(jnp.zeros((3, 8), jnp.float32), 3, 8)
    b = _Linear(jnp.zeros((3, 16), jnp.float32), 3, 16)
    field, leaf = ts.structure_of(a).diff(b)
    assert field == ts.Mismatch(".out_features", "structure", "8", "16")  # the differing field, by name
    assert str(field).startswith("tree.out_features: expected 8, got 16.")
    assert leaf == ts.Mismatch(".kernel", "shape", (3, 8), (3, 16))  # and on into the children
    message = str(pytest.raises(ts.StructureMismatchError, ts.structure_of(a).check, b).value)
    assert max(len(line) for line in message.splitlines()) <= 300


def test_empty_containers_and_none_are_told_apart():
    [m] = ts.structure_of([]).diff(None)
    assert str(m) == "tree: expected an empty list, got None."
    [m] = ts.structure_of({"a": {}}).diff({"a": ()})
    assert str(m) == "tree['a']: expected an empty dict, got an empty tuple."
    [m] = ts.structure_of(None).diff([])
    assert str(m) == "tree: expected None, got an empty list."


# -- astype ----------------------------------------------------------------------------------------
def test_astype_for_mixed_precision():
    params = {"w": jnp.ones((4, 3), jnp.bfloat16), "b": jnp.ones(3, jnp.bfloat16), "step": jnp.int32(0)}
    acc = ts.structure_of(params).astype(jnp.float32)
    assert acc.tree == {
        "w": jax.ShapeDtypeStruct((4, 3), jnp.float32),
        "b": jax.ShapeDtypeStruct((3,), jnp.float32),
        "step": jax.ShapeDtypeStruct((), jnp.int32),
    }
    zeros = acc.zeros()
    assert zeros["w"].dtype == jnp.float32 and zeros["step"].dtype == jnp.int32
    only_w = ts.structure_of(params).astype(jnp.float16, where=lambda path, leaf: path == "['w']")
    assert [leaf.dtype for leaf in only_w.leaves] == [jnp.bfloat16, jnp.int32, jnp.float16]
    weak = ts.structure_of({"x": 1.0}).astype(jnp.bfloat16)
    assert weak.tree["x"] == jax.ShapeDtypeStruct((), jnp.bfloat16)  # converted leaves are strong


def test_astype_refuses_keys_and_non_dtypes():
    s = ts.structure_of({"k": jax.random.key(0), "w": jnp.zeros(2, jnp.float32)})
    assert s.astype(jnp.float16).tree["k"].dtype == s.tree["k"].dtype  # keys are not floating: left alone
    with pytest.raises(TypeError, match=r"typed PRNG keys.*tree\['k'\]"):
        s.astype(jnp.float16, where=lambda path, leaf: True)
    with pytest.raises(TypeError, match="`dtype` must be a dtype"):
        s.astype("not a dtype")


# -- weak Python scalars in a restored checkpoint --------------------------------------------------
def test_restored_checkpoint_style_comparison():
    opt = optax.adam(1e-3)
    params = {"w": jnp.zeros((2, 3), jnp.float32)}
    state = {"params": params, "opt": opt.init(params), "step": 0}
    restored = jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), state)
    s = ts.structure_of(state)
    assert not s.matches(restored)
    assert s.matches(restored, ignore={"weak_type"})
    np.testing.assert_array_equal(s.zeros()["params"]["w"], np.zeros((2, 3)))


# -- values and callbacks as the user wrote them ---------------------------------------------------
def test_full_with_a_complex_value_names_the_leaves_that_cannot_hold_it(top_or_jit):
    s = ts.structure_of({"n": jnp.zeros(3, jnp.int32), "f": jnp.zeros(2), "z": jnp.zeros(2, jnp.complex64)})

    def run():
        with pytest.raises(TypeError) as info:
            s.full(1 + 2j)
        assert str(info.value).startswith(
            "treeshape.Structure.full: `value` (1+2j) is complex, but tree['f'], tree['n'] (2 of 3 leaves) are of "
            "an integer or real floating dtype, which JAX refuses to fill with a complex value"
        )
        complex_only = ts.structure_of({"z": jnp.zeros(2, jnp.complex64)})
        return complex_only.full(1 + 2j)["z"]

    out = top_or_jit(run)
    np.testing.assert_array_equal(np.asarray(out), np.full(2, 1 + 2j, np.complex64))


@pytest.mark.parametrize("callback", [lambda path: None, lambda: None, lambda a, b, c: None])
def test_a_callback_of_the_wrong_arity_is_told_its_signature(callback):
    s = ts.structure_of({"w": jnp.zeros(2)})
    for call, name in [
        (lambda: s.with_shardings(callback), "with_shardings"),
        (lambda: s.astype(jnp.bfloat16, where=callback), "astype"),
    ]:
        with pytest.raises(TypeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"treeshape.Structure.{name}: the callable <lambda>(")
        assert "is called as `fn(path, leaf)`" in message and "`lambda path, leaf: ...`" in message


def test_a_type_error_inside_a_callback_is_the_users_own():
    s = ts.structure_of({"w": jnp.zeros(2)})

    def pick(path, leaf):
        return leaf.shape + 1  # a bug: TypeError: can only concatenate tuple

    with pytest.raises(TypeError, match="can only concatenate tuple") as info:
        s.astype(jnp.bfloat16, where=pick)
    assert "treeshape" not in str(info.value)
