"""Weak types (`ts.is_weak`, `weak_paths`, `strip_weak_type`, `upcast`) and the dtype-change
rules of the three policies, under which a typed PRNG key never changes dtype."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import treeshape as ts


# The dtypes JAX gives Python scalars: 64-bit under `jax_enable_x64`, 32-bit otherwise.
INT = jax.dtypes.canonicalize_dtype(jnp.int64)
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)


def _top(f, x):
    return f(x)


def _jit(f, x):
    return jax.jit(f)(x)


def _vmap(f, x):
    return jax.vmap(f)(jnp.stack([x, x]))[0]


WHERE = {"top": _top, "jit": _jit, "vmap": _vmap}


@pytest.fixture(params=list(WHERE))
def where(request):
    return WHERE[request.param]


@pytest.fixture(params=["standard", "strict"])
def promotion(request):
    with jax.numpy_dtype_promotion(request.param):
        yield


def test_is_weak(where):
    def f(x):
        assert ts.is_weak(x * 2.0) is False  # strong array times Python float stays strong
        assert ts.is_weak(x.sum() * 0 + 1) is False
        assert ts.is_weak(jnp.asarray(2.0)) is True
        assert ts.is_weak(1.0) and ts.is_weak(1) and ts.is_weak(1j)
        assert not ts.is_weak(True)
        assert not ts.is_weak(np.float32(1.0)) and not ts.is_weak(np.ones(2))
        assert ts.is_weak(jax.ShapeDtypeStruct((), jnp.float32, weak_type=True))
        assert not ts.is_weak(jax.ShapeDtypeStruct((), jnp.float32))
        return x

    where(f, jnp.ones(3))
    with pytest.raises(TypeError, match="treeshape.is_weak: expected an array"):
        ts.is_weak("not an array")


def test_weak_paths(where):
    def f(x):
        tree = {
            "lr": 0.1,
            "x": x,
            "w": (jnp.asarray(1.0), x * 2),
            "name": "adam",
            "n": True,
        }
        assert ts.weak_paths(tree) == ["['lr']", "['w'][0]"]
        return x

    where(f, jnp.ones(3))


def test_strip_weak_type(where):
    def f(x):
        tree = {
            "a": 1.0,
            "b": jnp.asarray(2),
            "c": x,
            "d": "static",
            "e": x.sum() + 1.0,
        }
        out = ts.strip_weak_type(tree)
        assert ts.weak_paths(out) == []
        assert out["d"] == "static" and out["c"] is x
        assert out["a"].dtype == FLOAT and out["b"].dtype == INT  # the same dtypes, made strong
        sds = ts.strip_weak_type(jax.ShapeDtypeStruct((2,), jnp.float16, weak_type=True))
        assert sds == jax.ShapeDtypeStruct((2,), jnp.float16)
        return x + out["a"]

    assert (where(f, jnp.ones(3)) == 2.0).all()


def test_strip_weak_type_gives_jit_one_signature():
    compiles = 0

    @jax.jit
    def f(x):
        nonlocal compiles
        compiles += 1
        return x * 2

    f(jnp.asarray(1.0))  # weak
    f(jnp.asarray(1.0, FLOAT))  # strong, same dtype: a second trace
    assert compiles == 2
    compiles = 0
    g = jax.jit(lambda x: x * 2)
    cache_size = []
    for value in (jnp.asarray(1.0), jnp.asarray(2.0, FLOAT), 3.0, jnp.asarray(4.0)):
        g(ts.strip_weak_type(value))
        cache_size.append(g._cache_size())
    assert cache_size == [1, 1, 1, 1]


@pytest.mark.parametrize(
    "value, target, needed",
    [
        (0.5, jnp.bfloat16, "weak"),  # a weak float meets bf16
        (3, jnp.float16, "weak"),  # a weak int meets f16
        (jnp.ones(2, jnp.bfloat16), jnp.float32, "promote"),
        (jnp.ones(2, jnp.int32), jnp.float32, "promote"),
        (jnp.ones(2, jnp.float32), jnp.bfloat16, "cast"),
        (1.5, jnp.int32, "cast"),  # a weak float meeting int32 stays float in JAX
    ],
)
@pytest.mark.parametrize("policy", ["weak", "promote", "cast"])
def test_upcast_policies(value, target, needed, policy, where, promotion):
    order = ["weak", "promote", "cast"]
    shape = np.shape(value)
    like = {"v": jax.ShapeDtypeStruct(shape, target)}

    def f(x):
        if order.index(policy) >= order.index(needed):
            out = ts.upcast({"v": value}, like, policy=policy)
            assert out["v"].dtype == target and out["v"].shape == shape
            assert ts.upcast(out, like, policy=policy)["v"] is out["v"]  # idempotent
        else:
            with pytest.raises(ts.StructureMismatchError) as info:
                ts.upcast({"v": value}, like, policy=policy)
            message = str(info.value)
            assert "tree['v']: expected dtype" in message
            assert f'policy="{needed}" would' in message
            assert isinstance(info.value, TypeError)
        return x

    where(f, jnp.ones(3))


def test_upcast_accepts_a_structure_and_keeps_matching_leaves():
    params = {"w": jnp.ones(3, jnp.bfloat16), "b": jnp.zeros(3, jnp.float32)}
    target = ts.structure_of({"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros(3, jnp.float32)})
    out = ts.upcast(params, target, policy="promote")
    assert out["w"].dtype == jnp.float32 and out["b"] is params["b"]
    assert target.matches(out)


def test_upcast_of_shape_dtype_structs_gives_shape_dtype_structs():
    mesh = jax.make_mesh((8,), ("i",))
    sharding = jax.NamedSharding(mesh, jax.sharding.PartitionSpec("i"))
    tree = {
        "w": jax.ShapeDtypeStruct((8, 3), jnp.bfloat16, sharding=sharding),
        "lr": jax.ShapeDtypeStruct((), jnp.float32, weak_type=True),
        "b": jax.ShapeDtypeStruct((3,), jnp.float32),
    }
    like = {"w": jnp.zeros((8, 3), jnp.float32), "lr": jnp.zeros((), jnp.bfloat16), "b": jnp.zeros(3, jnp.float32)}
    out = ts.upcast(tree, like, policy="promote")
    assert out["w"] == jax.ShapeDtypeStruct((8, 3), jnp.float32, sharding=sharding)  # the sharding kept
    assert out["lr"] == jax.ShapeDtypeStruct((), jnp.bfloat16)  # a weak leaf takes the target's dtype
    assert out["b"] is tree["b"]
    assert ts.structure_of(like).diff(out) == []
    assert ts.upcast(out, like, policy="promote")["w"] is out["w"]  # idempotent
    with pytest.raises(ts.StructureMismatchError, match=re.escape("tree['w']: expected dtype float32, got bfloat16")):
        ts.upcast(tree, like)  # policy="weak" keeps a strong bf16 leaf


def test_upcast_structure_and_shape_errors():
    like = {"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.upcast({"a": jnp.zeros(4, jnp.float32), "c": jnp.zeros(2, jnp.float32)}, like, policy="cast")
    message = str(info.value)
    assert "tree['a']: expected shape (3,), got (4,)." in message
    assert "tree['b']: missing; expected f32[2]." in message
    assert "tree['c']: unexpected extra entry f32[2]." in message
    assert [m.kind for m in info.value.mismatches] == [
        "shape",
        "structure",
        "structure",
    ]
    with pytest.raises(ValueError, match=re.escape("treeshape.upcast: unknown policy 'any'")):
        ts.upcast(like, like, policy="any")


# -- typed PRNG keys never change dtype, under any policy (carries and `upcast`) -------------------
POLICIES = ["weak", "promote", "cast"]


def _claims_a_policy(message):
    return re.search(r'policy="\w+" would', message) is not None


def _fry():
    return jax.random.key(0, impl="threefry2x32")


def _rbg():
    return jax.random.key(0, impl="rbg")


# (id, init's key leaf, what `body` makes of it, input type, output type, the advice)
KEY_CASES = [
    (
        "fry_to_rbg",
        _fry,
        lambda k: jax.random.key(1, impl="rbg"),
        "key<fry>[]",
        "key<rbg>[]",
        'no policy converts between PRNG key implementations (not even policy="cast"): start from key<rbg> '
        'keys (`jax.random.key(seed, impl="rbg")`), or make `body` return key<fry> keys.',
    ),
    (
        "uint32_to_key",
        lambda: jnp.uint32(7),
        lambda k: jax.random.key(k),
        "u32[]",
        "key<fry>[]",
        'no policy turns another dtype into a typed PRNG key (not even policy="cast"): start from key<fry> '
        'keys (`jax.random.wrap_key_data(data, impl="threefry2x32")`',
    ),
    (
        "key_to_uint32",
        _fry,
        lambda k: jax.random.bits(k, dtype=jnp.uint32),
        "key<fry>[]",
        "u32[]",
        'no policy turns a typed PRNG key into another dtype (not even policy="cast"): make `body` return '
        "key<fry> keys here (rewrap raw key data inside `body` with "
        '`jax.random.wrap_key_data(data, impl="threefry2x32")`), or carry the raw data throughout '
        "(`jax.random.key_data(key)` in `init`, rewrapped inside `body`).",
    ),
]


def _key_body(make):
    def body(carry, x):
        # Each case's body only makes sense for init's own dtype: a carry that a
        # policy had converted would fail in here, inside JAX.
        assert carry["rng"].dtype == carry["init_dtype_witness"].dtype
        return {"rng": make(carry["rng"]), "init_dtype_witness": carry["init_dtype_witness"], "w": carry["w"] + x}, x

    return body


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", KEY_CASES, ids=[c[0] for c in KEY_CASES])
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
def test_no_policy_changes_a_key_dtype(top_or_jit, fn, case, policy):
    _, make_init, make, in_type, out_type, advice = case

    def run():
        key = make_init()
        init = {"rng": key, "init_dtype_witness": key, "w": jnp.zeros(2, jnp.float32)}
        xs = jnp.ones((3, 2), jnp.float32)
        with pytest.raises(ts.CarryMismatchError) as info:
            fn(_key_body(make), init, xs, policy=policy)
        err = info.value
        assert isinstance(err, TypeError)
        assert [(m.where, m.kind) for m in err.mismatches] == [("carry['rng']", "dtype")]
        message = str(err)
        assert message.startswith(
            f'treeshape.{fn.__name__}: no carry type is a fixed point of `body` under policy="{policy}":'
        )
        assert f"carry['rng']: input {in_type}, output {out_type}. The dtypes differ, and {advice}" in message
        assert not _claims_a_policy(message)
        return jnp.zeros(())

    top_or_jit(run)


def test_keys_in_while_and_fori_carries(top_or_jit):
    def run():
        for policy in POLICIES:
            with pytest.raises(ts.CarryMismatchError, match=re.escape("carry[0]: input key<fry>[], output key<rbg>[]")):
                ts.while_carry(lambda c: (jax.random.key(1, impl="rbg"), c[1]), (_fry(), 0.0), policy=policy)
            with pytest.raises(ts.CarryMismatchError) as info:
                ts.fori_carry(lambda i, c: jax.random.key(c), jnp.uint32(0), policy=policy)
            [m] = info.value.mismatches
            assert (m.where, m.kind) == ("carry", "dtype")
            assert "carry: input u32[], output key<fry>[]. The dtypes differ, and no policy turns" in str(info.value)
            assert not _claims_a_policy(str(info.value))
        return jnp.zeros(())

    top_or_jit(run)


def test_key_carries_that_keep_their_type_still_work(top_or_jit):
    def run():
        body = lambda c, x: ({"rng": jax.random.split(c["rng"])[0], "w": c["w"] + x}, None)
        init = {"rng": _rbg(), "w": jnp.zeros((), jnp.bfloat16)}
        xs = jnp.ones(3, jnp.float32)
        carry = ts.scan_carry(body, init, xs, policy="cast")  # the float leaf is cast, the key kept
        assert carry["rng"].dtype == init["rng"].dtype and carry["w"].dtype == jnp.float32
        final, _ = lax.scan(body, carry, xs)
        assert final["rng"].dtype == init["rng"].dtype
        return final["w"]

    assert top_or_jit(run) == 3


# (id, tree's leaf, target leaf, the advice)
UPCAST_KEY_CASES = [
    (
        "fry_to_rbg",
        _fry,
        lambda: jax.ShapeDtypeStruct((), _rbg().dtype),
        "tree['k']: expected dtype key<rbg>, got key<fry>. The dtypes differ, and no policy converts between "
        'PRNG key implementations (not even policy="cast"): make these keys with `jax.random.key(seed, impl="rbg")`',
    ),
    (
        "key_to_uint32",
        _fry,
        lambda: jax.ShapeDtypeStruct((), jnp.uint32),
        "tree['k']: expected dtype uint32, got key<fry>. The dtypes differ, and no policy turns a typed PRNG key "
        'into another dtype (not even policy="cast"): take the raw key data explicitly with `jax.random.key_data(...)`',
    ),
    (
        "float_to_key",
        lambda: jnp.zeros((), jnp.float32),
        lambda: jax.ShapeDtypeStruct((), _fry().dtype),
        "tree['k']: expected dtype key<fry>, got float32. The dtypes differ, and no policy turns another dtype "
        'into a typed PRNG key (not even policy="cast"): wrap raw key data explicitly with '
        '`jax.random.wrap_key_data(data, impl="threefry2x32")`',
    ),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", UPCAST_KEY_CASES, ids=[c[0] for c in UPCAST_KEY_CASES])
def test_upcast_never_converts_keys(top_or_jit, case, policy):
    _, make_leaf, make_target, line = case

    def run():
        tree = {"k": make_leaf(), "w": jnp.zeros(2, jnp.bfloat16)}
        like = {"k": make_target(), "w": jax.ShapeDtypeStruct((2,), jnp.float32)}
        with pytest.raises(ts.StructureMismatchError) as info:
            ts.upcast(tree, like, policy=policy)
        err = info.value
        assert not isinstance(err, ts.CarryMismatchError) and isinstance(err, TypeError)
        kinds = [(m.where, m.kind) for m in err.mismatches]
        assert kinds[0] == ("tree['k']", "dtype")
        if policy != "weak":  # bf16 -> f32 is a promotion: only the key is left
            assert kinds == [("tree['k']", "dtype")]
        message = str(err)
        assert line in message
        assert not _claims_a_policy(message.split("tree['w']")[0])
        return jnp.zeros(())

    top_or_jit(run)


# -- upcast ----------------------------------------------------------------------------------------
def test_upcast_lists_dtype_problems_with_shape_problems():
    like = {"a": jnp.zeros(3, jnp.bfloat16), "b": jnp.zeros(2, jnp.float32)}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.upcast({"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros(5, jnp.float32)}, like)
    assert [(m.where, m.kind) for m in info.value.mismatches] == [("tree['a']", "dtype"), ("tree['b']", "shape")]
    assert 'policy="cast" would' in str(info.value) and "Make this leaf shape (2,)" in str(info.value)


def test_weak_helpers_take_structures():
    s = ts.structure_of({"lr": 0.1, "step": 0, "w": jnp.zeros(2, jnp.float32), "act": "relu"})
    assert ts.weak_paths(s) == ["['lr']", "['step']"]
    strong = ts.strip_weak_type(s)
    assert isinstance(strong, ts.Structure) and ts.weak_paths(strong) == []
    tree = {"lr": 0.1, "step": 0, "w": jnp.zeros(2, jnp.float32), "act": "relu"}
    assert strong == ts.structure_of(ts.strip_weak_type(tree))  # a Structure in: as for the values
    assert strong.tree["act"] == "relu" and strong.tree["step"].dtype == INT
    assert ts.is_weak(ts.structure_of(0.5)) and not ts.is_weak(ts.structure_of(jnp.float32(0.5)))
    with pytest.raises(TypeError, match="Structure of 4 leaves.*ts.weak_paths"):
        ts.is_weak(s)


def test_upcast_takes_a_structure_and_gives_one():
    source = ts.structure_of({"mu": jnp.zeros(3, jnp.bfloat16), "count": 0})
    like = {"mu": jnp.zeros(3, jnp.float32), "count": jnp.zeros((), jnp.int8)}
    out = ts.upcast(source, like, policy="promote")
    assert isinstance(out, ts.Structure)
    assert out.tree == {
        "mu": jax.ShapeDtypeStruct((3,), jnp.float32),
        "count": jax.ShapeDtypeStruct((), jnp.int8),
    }
    with pytest.raises(ts.StructureMismatchError, match="tree\\['mu'\\]"):
        ts.upcast(source, like)  # a strong bf16 may not become f32 under "weak"
