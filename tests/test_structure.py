"""`ts.Structure` and `ts.Mismatch`: value semantics, building values, comparing trees."""

import collections
import dataclasses
import pickle
import re

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from _jax_range import pcast_varying, varying
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
