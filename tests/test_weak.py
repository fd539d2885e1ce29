import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
