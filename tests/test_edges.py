"""Clear errors at the edges (issue 14): typed PRNG keys under every policy, `length`
validation, shard_map carries that change shape, and 64-bit Structures with x64 off."""

import os
import pickle
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _jax_range import pcast_varying
from jax import lax
from jax.sharding import PartitionSpec as P

import treeshape as ts


POLICIES = ["weak", "promote", "cast"]

# A Python float in `init` is a weak float of the default width (the suite runs with x64 on and off).
F_NAME = f"f{jax.dtypes.canonicalize_dtype(jnp.float64).itemsize * 8}"

WHERE = {"top": lambda f: f(), "jit": lambda f: jax.jit(f)()}


@pytest.fixture(params=list(WHERE))
def where(request):
    """Run a zero-argument function at top level or while tracing it under `jax.jit`."""
    return WHERE[request.param]


def _claims_a_policy(message):
    return re.search(r'policy="\w+" would', message) is not None


# -- 1. typed PRNG keys never change dtype ----------------------------------------------
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
def test_no_policy_changes_a_key_dtype(where, fn, case, policy):
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

    where(run)


def test_keys_in_while_and_fori_carries(where):
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

    where(run)


def test_key_carries_that_keep_their_type_still_work(where):
    def run():
        body = lambda c, x: ({"rng": jax.random.split(c["rng"])[0], "w": c["w"] + x}, None)
        init = {"rng": _rbg(), "w": jnp.zeros((), jnp.bfloat16)}
        xs = jnp.ones(3, jnp.float32)
        carry = ts.scan_carry(body, init, xs, policy="cast")  # the float leaf is cast, the key kept
        assert carry["rng"].dtype == init["rng"].dtype and carry["w"].dtype == jnp.float32
        final, _ = lax.scan(body, carry, xs)
        assert final["rng"].dtype == init["rng"].dtype
        return final["w"]

    assert where(run) == 3


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
def test_upcast_never_converts_keys(where, case, policy):
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

    where(run)


# -- 2. `length` is an int >= 0, also without `xs` -----------------------------------------
_BODY = lambda c, x: (c + 1, None)


@pytest.mark.parametrize("length", ["abc", 2.5, 3.0, [3], jnp.float32(3), jnp.arange(3)], ids=repr)
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
@pytest.mark.parametrize("with_xs", [False, True], ids=["no_xs", "xs"])
def test_length_must_be_an_int(where, fn, length, with_xs):
    def run():
        xs = jnp.ones(3) if with_xs else None
        with pytest.raises(TypeError) as info:
            fn(_BODY, 0, xs, length=length)
        message = str(info.value)
        assert message.startswith(
            f"treeshape.{fn.__name__}: `length` must be an int >= 0 (the number of steps, as for `lax.scan`), "
            f"got {type(length).__name__} "
        )
        assert message.endswith("Pass the number of steps as an int, e.g. `length=3`.")
        return jnp.zeros(())

    where(run)


@pytest.mark.parametrize("length", [-3, np.int64(-1), -1], ids=repr)
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
def test_length_must_not_be_negative(where, fn, length):
    def run():
        with pytest.raises(
            ValueError,
            match=re.escape(f"treeshape.{fn.__name__}: `length` must be an int >= 0 (the number of steps, as for "),
        ) as info:
            fn(_BODY, 0, length=length)
        assert str(info.value).endswith(f"got {int(length)}. Pass 0 or more.")
        return jnp.zeros(())

    where(run)


# Integers as `lax.scan` takes them (it calls `int(length)`): Python and NumPy ints,
# bools and concrete integer scalar arrays.
@pytest.mark.parametrize("length", [0, 3, True, np.int64(3), np.uint8(2), np.array(3), jnp.int32(3)], ids=repr)
def test_integer_lengths_are_accepted(where, length):
    def run():
        carry = ts.scan_carry(_BODY, 0, length=length)
        assert ts.carry_structure(_BODY, 0, length=length) == ts.structure_of(carry)
        return lax.scan(_BODY, carry, length=length)[0]

    assert where(run) == int(length)
    xs = jnp.ones(int(length))
    assert ts.carry_structure(_BODY, 0, xs, length=length) == ts.structure_of(0)


def test_traced_length_is_a_type_error():
    def run(n):
        with pytest.raises(TypeError):  # JAX's own ConcretizationTypeError
            lax.scan(_BODY, 0, length=n)
        with pytest.raises(TypeError, match=re.escape("`length` must be a concrete int >= 0")) as info:
            ts.scan_carry(_BODY, 0, length=n)
        assert "it is a traced i32[] here" in str(info.value)
        assert "`static_argnames`" in str(info.value) and "`ts.while_carry`" in str(info.value)
        return n

    jax.jit(run)(jnp.int32(3))


def test_length_still_checked_against_xs():
    with pytest.raises(ValueError, match=re.escape("`length=4` disagrees with the leading axis of `xs` (5")):
        ts.scan_carry(_BODY, 0, jnp.ones(5), length=np.int64(4))


# -- 3. shard_map carries that change shape ------------------------------------------------
def _mesh(axis_type):
    return jax.make_mesh((8,), ("i",), axis_types=(axis_type,))


AXIS_TYPES = {"explicit": jax.sharding.AxisType.Explicit, "auto": jax.sharding.AxisType.Auto}


@pytest.fixture(params=list(AXIS_TYPES))
def axis_type(request):
    return AXIS_TYPES[request.param]


def _per_shard(f, mesh, jit):
    """Run `f(x)` on each shard of a float32 vector of 16 (`x` is `f32[2]`, varying over `i`)."""
    x = jax.device_put(jnp.arange(16.0, dtype=jnp.float32), jax.NamedSharding(mesh, P("i")))
    g = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return (jax.jit(g) if jit else g)(x)


@pytest.mark.parametrize("jit", [False, True], ids=["shard_map", "jit_shard_map"])
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
def test_shard_map_carry_that_gains_a_shape(axis_type, jit, fn):
    def per_shard(x):
        body = lambda c, _: ({"acc": c["acc"] + x, "n": c["n"] + 1}, None)
        for init in ({"acc": 0.0, "n": 0}, {"acc": jnp.zeros((), jnp.float32), "n": 0}):
            in_type = f"~{F_NAME}[]" if isinstance(init["acc"], float) else "f32[]"
            with pytest.raises(ts.CarryMismatchError) as info:
                fn(body, init, length=3)
            assert [(m.where, m.kind) for m in info.value.mismatches] == [("carry['acc']", "shape")]
            assert str(info.value) == (
                f'treeshape.{fn.__name__}: no carry type is a fixed point of `body` under policy="weak": '
                f"carry['acc']: input {in_type}, output f32[2]{{V:i}}. The shapes differ, and no policy changes "
                "a shape: give `init` shape (2,) here (e.g. `jnp.zeros((2,))` instead of a scalar), or make "
                "`body` return shape ()."
            )
        # inside a jitted function within the shard_map too; and it is a TypeError, as JAX's own
        with pytest.raises(TypeError, match=re.escape("carry['acc']: input f32[], output f32[2]{V:i}")):
            jax.jit(lambda: fn(body, {"acc": jnp.zeros((), jnp.float32), "n": 0}, length=3))()
        return x

    _per_shard(per_shard, _mesh(axis_type), jit)


@pytest.mark.parametrize("jit", [False, True], ids=["shard_map", "jit_shard_map"])
def test_shard_map_shape_and_varying_axes_change_together(axis_type, jit):
    def per_shard(x):
        # varying in, replicated and longer out: both are reported
        with pytest.raises(ts.CarryMismatchError) as info:
            ts.scan_carry(lambda c, _: (jnp.zeros(3, jnp.float32), None), x, length=2)
        assert [m.kind for m in info.value.mismatches] == ["shape", "vma"]
        message = str(info.value)
        assert "carry: input f32[2]{V:i}, output f32[3]. The shapes differ" in message
        assert "make `body` return shape (2,) here" in message
        assert "apply `jax.lax.pcast(..., ('i',), to=\"varying\")` to that output inside `body`" in message
        # varying in, varying and reshaped out: the shape only
        with pytest.raises(ts.CarryMismatchError) as info:
            ts.carry_structure(lambda c, _: (c[:, None] * 2, None), x, length=2)
        assert [(m.where, m.kind) for m in info.value.mismatches] == [("carry", "shape")]
        return x

    _per_shard(per_shard, _mesh(axis_type), jit)


def test_shard_map_two_axes():
    mesh = jax.make_mesh((4, 2), ("i", "j"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jax.device_put(jnp.arange(16.0, dtype=jnp.float32).reshape(8, 2), jax.NamedSharding(mesh, P("i", "j")))

    def per_shard(x):  # x: f32[2,1], varying over i and j
        only_i = pcast_varying(jnp.zeros((), jnp.float32), ("i",))
        with pytest.raises(ts.CarryMismatchError) as info:  # gains j and a shape
            ts.carry_structure(lambda c, _: (c + x[:, 0], None), only_i, length=2)
        assert [(m.kind, m.expected, m.actual) for m in info.value.mismatches] == [("shape", (), (2,))]
        assert "carry: input f32[]{V:i}, output f32[2]{V:i,j}" in str(info.value)
        only_j = pcast_varying(jnp.zeros(2, jnp.float32), ("j",))
        other = lambda c, _: (pcast_varying(jnp.zeros(3, jnp.float32), ("i",)), None)
        with pytest.raises(ts.CarryMismatchError) as info:  # i for j, and a shape
            ts.carry_structure(other, only_j, length=2)
        assert [m.kind for m in info.value.mismatches] == ["shape", "vma"]
        assert "carry: input f32[2]{V:j}, output f32[3]{V:i}" in str(info.value)
        return x

    jax.shard_map(per_shard, mesh=mesh, in_specs=P("i", "j"), out_specs=P("i", "j"))(x)


# -- 4. 64-bit Structures with x64 off -------------------------------------------------
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
def test_64_bit_leaves_with_x64_off_are_refused(where, method):
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

        where(run)
    with jax.enable_x64(True):  # and with x64 on, the values are exact

        def exact():
            assert s.matches(BUILDERS[method](s))
            return jnp.zeros(())

        where(exact)


def test_one_64_bit_leaf_and_many(where):
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

        where(run)


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
def test_upcast_towards_64_bit_leaves_with_x64_off_is_refused(where, policy):
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

        where(run)
    with jax.enable_x64(True):
        wide = ts.upcast(jax.tree.map(lambda x: x, tree), s, policy=policy)
        assert wide["w"].dtype == jnp.float64 and s.matches(wide)
