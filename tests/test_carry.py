"""The carry functions (`scan_carry`, `while_carry`, `fori_carry`, `carry_structure`): the
fixed point of a loop body's carry type under each policy, `length` and `fori_carry` bounds,
precision warnings, messages, and carries inside transformations and `shard_map`."""

import dataclasses
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import pcast_varying, varying
from jax import lax
from jax.sharding import PartitionSpec as P

import treeshape as ts
from treeshape import _compat


POLICIES = ["weak", "promote", "cast"]

# The dtype JAX gives a Python float, and its short name in messages: 64-bit
# under `jax_enable_x64`, 32-bit otherwise (the suite runs in both modes).
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)
F_NAME = f"f{FLOAT.itemsize * 8}"  # f32 or f64


@pytest.fixture(params=["standard", "strict"])
def promotion(request):
    """Run a test under both `jax_numpy_dtype_promotion` modes."""
    with jax.numpy_dtype_promotion(request.param):
        yield request.param


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Moments:
    mu: jax.Array
    nu: jax.Array


def _allowed(policy, needed):
    return POLICIES.index(policy) >= POLICIES.index(needed)


def _dtypes(tree):
    return [x.dtype for x in jax.tree.leaves(tree)]


# -- the three loop kinds ----------------------------------------------------------
# Each runner turns a step `f(carry) -> carry` into a body of its loop kind, asks
# treeshape for the carry, runs the real JAX loop on it and returns both.
def _run_scan(step, init, policy):
    xs = jnp.arange(3.0)
    body = lambda c, x: (step(c), x)
    carry = ts.scan_carry(body, init, xs, policy=policy)
    assert ts.carry_structure(body, init, xs, policy=policy) == ts.structure_of(carry)
    return carry, lax.scan(body, carry, xs)[0]


def _run_while(step, init, policy):
    carry = ts.while_carry(step, init, policy=policy)
    counted = lambda ic: (ic[0] + 1, step(ic[1]))
    return carry, lax.while_loop(lambda ic: ic[0] < 3, counted, (0, carry))[1]


def _run_fori(step, init, policy):
    body = lambda i, c: step(c)
    carry = ts.fori_carry(body, init, policy=policy)
    return carry, lax.fori_loop(0, 3, body, carry)


LOOPS = {"scan": _run_scan, "while": _run_while, "fori": _run_fori}
FN_NAMES = {"scan": "scan_carry", "while": "while_carry", "fori": "fori_carry"}


def _nested(mu, nu, last, step=None):
    """A carry of dicts of tuples of dataclasses."""
    step = jnp.zeros((), jnp.int32) if step is None else step
    return {"opt": (Moments(mu=mu, nu=nu), last), "step": step}


def _replace(carry, mu=None, nu=None, last=None, step=None):
    (m, old_last) = carry["opt"]
    return {
        "opt": (
            Moments(m.mu if mu is None else mu, m.nu if nu is None else nu),
            old_last if last is None else last,
        ),
        "step": carry["step"] if step is None else step,
    }


def _f32(*shape):
    return jnp.zeros(shape, jnp.float32)


# (id, step, init, least policy that allows it, path, input type, output type)
# The bodies convert explicitly, so they also run under strict dtype promotion.
# A Python float in `init` is a weak float of the default width (`F_NAME`).
DTYPE_CASES = [
    (
        "weak_float_meets_f16",
        lambda c: _replace(c, mu=c["opt"][0].mu * jnp.float16(2)),
        lambda: _nested(0.0, _f32(3), _f32(2)),
        "weak",
        "carry['opt'][0].mu",
        f"~{F_NAME}[]",
        "f16[]",
    ),
    (
        "bf16_meets_f32",
        lambda c: _replace(c, nu=c["opt"][0].nu.astype(jnp.float32) * 2),
        lambda: _nested(_f32(2), jnp.zeros(3, jnp.bfloat16), _f32(2)),
        "promote",
        "carry['opt'][0].nu",
        "bf16[3]",
        "f32[3]",
    ),
    (
        "int32_counter_becomes_float",
        lambda c: _replace(c, step=c["step"].astype(jnp.float32) + 0.5),
        lambda: _nested(_f32(2), _f32(3), _f32(2)),
        "promote",
        "carry['step']",
        "i32[]",
        "f32[]",
    ),
    (
        "f32_cast_down_to_bf16",
        lambda c: _replace(c, last=c["opt"][1].astype(jnp.bfloat16)),
        lambda: _nested(_f32(2), _f32(3), _f32(2)),
        "cast",
        "carry['opt'][1]",
        "f32[2]",
        "bf16[2]",
    ),
    (
        "weak_float_meets_int32",
        lambda c: _replace(c, nu=jnp.zeros((), jnp.int32)),
        lambda: _nested(_f32(2), 1.0, _f32(2)),
        "cast",
        "carry['opt'][0].nu",
        f"~{F_NAME}[]",
        "i32[]",
    ),
]


@pytest.mark.filterwarnings("ignore::treeshape.PrecisionWarning")  # weak floats meeting float16 are the subject
@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", DTYPE_CASES, ids=[c[0] for c in DTYPE_CASES])
def test_dtype_changes_follow_the_policy(loop, policy, case, promotion):
    _, step, make_init, needed, path, in_type, out_type = case
    init = make_init()
    if _allowed(policy, needed):
        carry, final = LOOPS[loop](step, init, policy)
        # The announced carry type is what the real loop carries.
        assert _dtypes(carry) == _dtypes(final)
        assert [m.kind for m in ts.structure_of(final).diff(carry)] in (
            [],
            ["weak_type"],
        )
        return
    with pytest.raises(ts.CarryMismatchError, match=re.escape(path)) as info:
        LOOPS[loop](step, init, policy)
    message = str(info.value)
    assert message.startswith(
        f'treeshape.{FN_NAMES[loop]}: no carry type is a fixed point of `body` under policy="{policy}"'
    )
    assert f"{path}: input {in_type}, output {out_type}." in message
    assert f'so policy="{policy}" may not change it; policy="{needed}" would' in message
    assert isinstance(info.value, TypeError)
    [m] = info.value.mismatches
    assert (m.where, m.kind) == (path, "dtype")


@pytest.mark.parametrize("loop", list(LOOPS))
@pytest.mark.parametrize("policy", POLICIES)
def test_shape_and_structure_changes_fail_under_every_policy(loop, policy):
    init = _nested(_f32(2), _f32(3), _f32(8))
    reshaped = lambda c: _replace(c, last=c["opt"][1][:, None], mu=c["opt"][0].mu.astype(jnp.bfloat16))
    with pytest.raises(ts.CarryMismatchError) as info:
        LOOPS[loop](reshaped, init, policy)
    message = str(info.value)
    assert "carry['opt'][1]: input f32[8], output f32[8,1]." in message
    assert "make `body` return shape (8,) here" in message
    kinds = {m.where: m.kind for m in info.value.mismatches}
    assert kinds["carry['opt'][1]"] == "shape"
    if policy == "cast":
        assert len(info.value.mismatches) == 1
    else:  # every offending leaf is listed, in leaf order
        assert list(kinds) == ["carry['opt'][0].mu", "carry['opt'][1]"]
        assert "2 leaves differ" in message

    restructured = lambda c: {"opt": c["opt"], "steps": c["step"]}
    with pytest.raises(ts.CarryMismatchError) as info:
        LOOPS[loop](restructured, init, policy)
    paths = [(m.where, m.kind) for m in info.value.mismatches]
    assert paths == [("carry['step']", "structure"), ("carry['steps']", "structure")]
    assert "No policy changes the tree structure" in str(info.value)

    as_list = lambda c: [c["opt"], c["step"]]
    with pytest.raises(
        ts.CarryMismatchError,
        match=re.escape("carry: expected a dict with keys ['opt', 'step'], got a list"),
    ):
        LOOPS[loop](as_list, init, policy)


# -- where JAX stops short -----------------------------------------------------------
def _one_more_leaf_each_step(c, x):
    # Each step mixes float16 into one more leaf: three passes to settle.
    return [c[0] + x, c[1] + c[0], c[2] + c[1]], None


def test_a_carry_that_widens_one_leaf_per_pass_needs_a_true_fixed_point():
    xs = jnp.ones(5, jnp.float16)
    init = [0.0] * 3
    with pytest.raises(TypeError):  # JAX's two-pass promotion is not enough
        lax.scan(_one_more_leaf_each_step, init, xs)
    traces = 0

    def body(c, x):
        nonlocal traces
        traces += 1
        return _one_more_leaf_each_step(c, x)

    with pytest.warns(ts.PrecisionWarning, match=r"3 leaves \(e\.g\. carry\[0\]: ~f(32|64)\[\] -> f16\[\]\)"):
        s = ts.carry_structure(body, init, xs)
    assert traces == 4  # one per promotion step, plus the one that confirms
    assert [leaf.dtype for leaf in s.leaves] == [jnp.float16] * 3
    with pytest.warns(ts.PrecisionWarning):
        carry = ts.scan_carry(_one_more_leaf_each_step, init, xs)
    final, _ = lax.scan(_one_more_leaf_each_step, carry, xs)
    assert [float(v) for v in final] == [5.0, 10.0, 10.0]
    assert ts.structure_of(final).matches(carry)


def test_python_scalar_accumulator():
    xs = jnp.arange(4, dtype=jnp.float16)
    body = lambda acc, x: (acc + x, acc)
    with pytest.warns(ts.PrecisionWarning, match=re.escape("jnp.float32(0)")):
        carry = ts.scan_carry(body, 0.0, xs)
    assert carry.dtype == jnp.float16 and not ts.is_weak(carry)
    total, ys = lax.scan(body, carry, xs)
    assert total == 6 and ys.dtype == jnp.float16


def test_fori_int32_counter_turned_float():
    body = lambda i, c: c + 0.5  # int32 plus a Python float: a weak float of the default width
    for policy in ("weak",):
        with pytest.raises(ts.CarryMismatchError, match=re.escape(f"carry: input i32[], output ~{F_NAME}[]")):
            ts.fori_carry(body, jnp.int32(0), policy=policy)
    for policy in ("promote", "cast"):
        init = ts.fori_carry(body, jnp.int32(0), policy=policy)
        assert lax.fori_loop(0, 4, body, init) == 2.0
    # a Python int counter is weak: JAX's own rule lets it become float
    assert lax.fori_loop(0, 4, body, ts.fori_carry(body, 0)) == 2.0


@pytest.mark.filterwarnings("ignore::treeshape.PrecisionWarning")  # weak floats meeting float16 are the subject
def test_weak_promotion_follows_jax_arithmetic(promotion):
    # jnp.result_type ignores a ShapeDtypeStruct's weak flag (weak f32 with f16
    # gives f32); the carry must follow what JAX's arithmetic really does.
    body = lambda c, x: (c * x, None)
    for dtype in (
        jnp.float16,
        jnp.bfloat16,
        jnp.float32,
        jnp.complex64,
        jnp.int8,
        jnp.uint8,
    ):
        xs = jnp.ones(3, dtype)
        for init in (1, 1.0, 1j):
            try:
                concrete = init * xs[0]
            except _compat.TypePromotionError:
                with pytest.raises(_compat.TypePromotionError):
                    ts.carry_structure(body, init, xs)
                continue
            [leaf] = ts.carry_structure(body, init, xs).leaves
            assert leaf.dtype == concrete.dtype, (init, dtype)
            final, _ = lax.scan(body, ts.scan_carry(body, init, xs), xs)
            assert final.dtype == concrete.dtype


def test_weak_flag_alone_never_mismatches():
    # input weak float, output strong float of the same (default) dtype: init keeps its flag
    body = lambda c, x: (c * x, None)
    s = ts.carry_structure(body, 1.0, jnp.ones((2,), FLOAT))
    assert s.leaves[0].dtype == FLOAT and s.leaves[0].weak_type
    # input strong, output weak
    s = ts.carry_structure(lambda c, x: (jnp.asarray(2.0), None), jnp.zeros((), FLOAT), length=2)
    assert s.leaves[0].dtype == FLOAT and not s.leaves[0].weak_type


def test_one_trace_when_init_is_a_fixed_point():
    traces = 0

    def body(c, x):
        nonlocal traces
        traces += 1
        return {"w": c["w"] + x, "n": c["n"] + 1}, c["w"].sum()

    init = {"w": jnp.zeros(3), "n": jnp.zeros((), jnp.int32)}
    xs = jnp.ones((4, 3))
    assert ts.carry_structure(body, init, xs) == ts.structure_of(init)
    assert traces == 1
    ts.scan_carry(body, init, xs)
    assert traces == 1  # answered from the cache


def test_scan_xs_and_length():
    body = lambda c, x: (c + x["a"][0] + x["b"], None)
    xs = {"a": (jnp.ones((5, 2)),), "b": jnp.ones((5, 2))}
    assert ts.scan_carry(body, jnp.zeros(2), xs, length=5).shape == (2,)
    with pytest.raises(
        ValueError,
        match=re.escape("`length=4` disagrees with the leading axis of `xs` (5"),
    ):
        ts.scan_carry(body, jnp.zeros(2), xs, length=4)
    with pytest.raises(ValueError, match=re.escape("xs['a'][0] has 5, xs['b'] has 6")):
        ts.scan_carry(body, jnp.zeros(2), {"a": (jnp.ones((5, 2)),), "b": jnp.ones((6, 2))})
    with pytest.raises(ValueError, match="`length` must be given"):
        ts.scan_carry(lambda c, x: (c, None), jnp.zeros(2))
    with pytest.raises(ValueError, match=re.escape("xs[0] is a scalar")):
        ts.scan_carry(lambda c, x: (c, None), jnp.zeros(2), [jnp.float32(1)])
    # xs=None with length; y may be any pytree
    body = lambda c, x: (c + 1, {"y": (c, [c * 2])})
    carry = ts.scan_carry(body, 0, length=3)
    assert lax.scan(body, carry, None, length=3)[0] == 3


def test_bad_body_and_policy():
    with pytest.raises(TypeError, match=re.escape("a scan body must return a pair `(carry, y)`")):
        ts.scan_carry(lambda c, x: c, jnp.zeros(2), length=2)
    with pytest.raises(TypeError, match="pair"):
        ts.carry_structure(lambda c, x: (c, x, x), jnp.zeros(2), length=2)
    with pytest.raises(ValueError, match=re.escape("use one of 'weak', 'promote', 'cast'")):
        ts.scan_carry(lambda c, x: (c, None), jnp.zeros(2), length=2, policy="loose")
    for fn in (
        ts.while_carry,
        lambda b, i, policy: ts.fori_carry(lambda k, c: b(c), i, policy=policy),
    ):
        with pytest.raises(ValueError, match="unknown policy 'upcast'"):
            fn(lambda c: c, jnp.zeros(2), policy="upcast")
    with pytest.raises(TypeError, match=re.escape("carry['name'] is a str")):
        ts.while_carry(lambda c: c, {"name": "x", "v": 0.0})


def test_body_errors_propagate_unchanged():
    class Boom(Exception):
        pass

    def body(c, x):
        raise Boom("from the body")

    with pytest.raises(Boom, match="from the body"):
        ts.scan_carry(body, 0.0, length=2)


def test_never_settling_body_is_reported():
    flip = lambda c: c.astype(jnp.bfloat16) if c.dtype == jnp.float32 else c.astype(jnp.float32)
    with pytest.raises(ts.CarryMismatchError, match="did not settle within 32 evaluations"):
        ts.while_carry(flip, jnp.zeros(2), policy="cast")


# -- under transformations ------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::treeshape.PrecisionWarning")  # weak floats meeting float16 are the subject
def test_carries_inside_transformations(in_context):
    def f(x):
        body = lambda c, xi: (c + xi * jnp.float16(1), None)
        carry = ts.scan_carry(body, 0.0, x.astype(jnp.float16))
        total, _ = lax.scan(body, carry, x.astype(jnp.float16))
        assert total.dtype == jnp.float16
        return x + total.astype(x.dtype)

    in_context(f, jnp.ones(3))


def test_shard_map_makes_the_carry_varying():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(jnp.arange(16.0), jax.NamedSharding(mesh, P("i")))

    def per_device(x):
        body = lambda c, xi: ({"acc": c["acc"] + xi, "n": c["n"] + 1}, None)
        init = {"acc": jnp.zeros(2), "n": 0}
        with pytest.raises(TypeError):  # JAX rejects it on its own
            lax.scan(body, init, x[None])
        carry = ts.scan_carry(body, init, x[None])
        assert varying(carry["acc"]) == {"i"}
        assert varying(ts.carry_structure(body, init, x[None]).leaves[0]) == {"i"}
        return lax.scan(body, carry, x[None])[0]["acc"]

    out = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)
    assert (out == jnp.arange(16.0)).all()


def test_shard_map_less_varying_output_is_reported():
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(jnp.arange(16.0, dtype=jnp.float32), jax.NamedSharding(mesh, P("i")))

    def per_device(x):
        body = lambda c, xi: (jnp.zeros(2, jnp.float32), None)  # drops the varying input
        with pytest.raises(
            ts.CarryMismatchError,
            match=re.escape("carry: input f32[2]{V:i}, output f32[2]"),
        ) as info:
            ts.scan_carry(body, x, length=2)
        assert 'to="varying")` to that output inside `body`' in str(info.value)
        assert info.value.mismatches[0].kind == "vma"
        return x

    jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


def test_scan_carry_adds_no_runtime_op_under_jit():
    body = lambda c, x: (c + x, None)
    xs = jnp.ones((8, 4), jnp.float32)

    def with_treeshape(init, xs):
        return lax.scan(body, ts.scan_carry(body, init, xs, policy="promote"), xs)[0]

    def by_hand(init, xs):
        return lax.scan(body, init.astype(jnp.float32), xs)[0]

    init = jnp.zeros(4, jnp.bfloat16)
    count = lambda f: jax.jit(f).lower(init, xs).compile().as_text().count(" = ")
    assert count(with_treeshape) == count(by_hand)
    assert (jax.jit(with_treeshape)(init, xs) == by_hand(init, xs)).all()


def test_while_and_fori_carry_values_are_init_converted():
    init = {"x": jnp.arange(3, dtype=jnp.bfloat16), "k": 2}
    body = lambda c: {"x": c["x"].astype(jnp.float32) * 2, "k": c["k"] + 1}
    carry = ts.while_carry(body, init, policy="promote")
    assert carry["x"].dtype == jnp.float32 and carry["k"] == 2
    assert (carry["x"] == jnp.arange(3.0)).all()
    out = lax.while_loop(lambda c: c["k"] < 5, body, carry)
    assert out["k"] == 5 and (out["x"] == jnp.arange(3.0) * 8).all()


def test_structure_and_dtype_changes_are_reported_together():
    def body(carry, x):
        w, stats = carry
        return (w + x.astype(jnp.float32), [stats[0] + 1, stats[1]]), None

    init = (jnp.zeros(3, jnp.bfloat16), (jnp.int32(0), jnp.zeros(())))
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.scan_carry(body, init, jnp.ones((4, 3)))
    message = str(info.value)
    assert "2 places differ" in message
    assert (
        'carry[0]: input bf16[3], output f32[3]. The dtypes differ and the leaf is strongly typed, so policy="weak"'
        in message
    )
    assert "carry[1]: expected a tuple with 2 children, got a list with 2 children. No policy changes" in message
    assert [(m.where, m.kind) for m in info.value.mismatches] == [("carry[0]", "dtype"), ("carry[1]", "structure")]
    # under "promote" only the structure is left
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.scan_carry(body, init, jnp.ones((4, 3)), policy="promote")
    assert [(m.where, m.kind) for m in info.value.mismatches] == [("carry[1]", "structure")]


# -- `length` is an int >= 0, also without `xs` -----------------------------------------
_BODY = lambda c, x: (c + 1, None)


@pytest.mark.parametrize("length", ["abc", 2.5, 3.0, [3], jnp.float32(3), jnp.arange(3)], ids=repr)
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
@pytest.mark.parametrize("with_xs", [False, True], ids=["no_xs", "xs"])
def test_length_must_be_an_int(top_or_jit, fn, length, with_xs):
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

    top_or_jit(run)


@pytest.mark.parametrize("length", [-3, np.int64(-1), -1], ids=repr)
@pytest.mark.parametrize("fn", [ts.carry_structure, ts.scan_carry], ids=["carry_structure", "scan_carry"])
def test_length_must_not_be_negative(top_or_jit, fn, length):
    def run():
        with pytest.raises(
            ValueError,
            match=re.escape(f"treeshape.{fn.__name__}: `length` must be an int >= 0 (the number of steps, as for "),
        ) as info:
            fn(_BODY, 0, length=length)
        assert str(info.value).endswith(f"got {int(length)}. Pass 0 or more.")
        return jnp.zeros(())

    top_or_jit(run)


# Integers as `lax.scan` takes them (it calls `int(length)`): Python and NumPy ints,
# bools and concrete integer scalar arrays.
@pytest.mark.parametrize("length", [0, 3, True, np.int64(3), np.uint8(2), np.array(3), jnp.int32(3)], ids=repr)
def test_integer_lengths_are_accepted(top_or_jit, length):
    def run():
        carry = ts.scan_carry(_BODY, 0, length=length)
        assert ts.carry_structure(_BODY, 0, length=length) == ts.structure_of(carry)
        return lax.scan(_BODY, carry, length=length)[0]

    assert top_or_jit(run) == int(length)
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


# -- shard_map carries that change shape ------------------------------------------------
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


# -- messages: paths under `carry`, and the fix for a scalar meeting a vector ----------------------
def test_carry_mismatch_paths_are_keystr_paths_printed_under_carry():
    body = lambda c, x: ({"w": c["w"] + x}, None)
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.carry_structure(body, {"w": jnp.zeros(2, jnp.bfloat16)}, jnp.ones((3, 2), jnp.float32))
    [m] = info.value.mismatches
    assert (m.path, m.root, m.where) == ("['w']", "carry", "carry['w']")
    assert "carry['w']: input bf16[2], output f32[2]" in str(info.value)


def test_a_scalar_accumulator_meeting_a_vector_is_told_to_change_init():
    body = lambda acc, x: (acc + x, None)
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.carry_structure(body, 0.0, jnp.ones((4, 16), jnp.float32))
    message = str(info.value)
    assert f"carry: input ~f{FLOAT.itemsize * 8}[], output f32[16]" in message
    assert "give `init` shape (16,) here" in message


# -- precision warnings ----------------------------------------------------------------------------
def test_a_python_float_accumulator_in_bfloat16_warns():
    xs = jnp.full(1000, 1.001, jnp.bfloat16)
    body = lambda total, x: (total + x, None)
    weak = f"~f{FLOAT.itemsize * 8}[]"  # a Python float: f64 with x64 on
    with pytest.warns(ts.PrecisionWarning, match=re.escape(f"carry ({weak} -> bf16[])")) as record:
        carry = ts.scan_carry(body, 0.0, xs)
    assert record[0].filename == __file__  # points at the user's call
    assert issubclass(ts.PrecisionWarning, UserWarning)
    total, _ = lax.scan(body, carry, xs)
    assert float(total) == 256.0  # the loss the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = ts.scan_carry(body, jnp.float32(0), xs)  # the advice: no warning, and the right sum
    assert float(lax.scan(body, fixed, xs)[0]) == 1000.0  # 1.001 is 1.0 in bfloat16; the sum is exact in float32


def test_no_precision_warning_for_wide_floats_or_strong_leaves():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ts.carry_structure(lambda c, x: (c + x, None), 0.0, jnp.ones(3, jnp.float32))
        ts.carry_structure(lambda c, x: (c + x, None), jnp.zeros((), jnp.bfloat16), jnp.ones(3, jnp.bfloat16))
        ts.while_carry(lambda c: c + 1, 0)


# -- fori_carry bounds -------------------------------------------------------------------
def test_fori_index_follows_lax_fori_loop_for_traced_bounds():
    body = lambda i, c: c + i  # the carry takes the index's type

    @jax.jit
    def run(lo, hi):
        init = ts.fori_carry(body, jnp.int16(0), lower=lo, upper=hi, policy="promote")
        return lax.fori_loop(lo, hi, body, init)

    assert run(jnp.int16(0), jnp.int16(4)).dtype == jnp.int16
    out = run(jnp.int32(0), jnp.int32(4))
    assert out.dtype == jnp.int32 and int(out) == 6

    @jax.jit
    def mixed(hi):  # a Python lower bound is weak: the traced bound's dtype wins
        init = ts.fori_carry(body, jnp.int8(0), lower=0, upper=hi, policy="promote")
        return lax.fori_loop(0, hi, body, init)

    assert mixed(jnp.int16(3)).dtype == jnp.int16


def test_fori_index_for_concrete_bounds_is_weak():
    body = lambda i, c: c + i
    init = ts.fori_carry(body, jnp.int8(0), lower=0, upper=3)  # weak int32 index: int8 stays int8
    assert init.dtype == jnp.int8
    assert lax.fori_loop(0, 3, body, init).dtype == jnp.int8


def test_fori_bounds_are_checked():
    body = lambda i, c: c
    with pytest.raises(TypeError, match="`upper` must be an integer scalar"):
        ts.fori_carry(body, 0.0, upper=2.5)
    with pytest.raises(TypeError, match="`lower` must be an integer scalar"):
        ts.fori_carry(body, 0.0, lower="a")

    @jax.jit
    def run(lo, hi):
        return ts.fori_carry(body, 0.0, lower=lo, upper=hi)

    with pytest.raises(TypeError, match="different integer types"):
        run(jnp.int16(0), jnp.int32(3))


# -- a Structure where values are needed ---------------------------------------------
def _step(carry, x):
    return {"w": carry["w"] + x}, None


@pytest.mark.parametrize(
    "call, fix",
    [
        (lambda s: ts.scan_carry(_step, s, jnp.ones((3, 2))), "Pass `s.zeros()` (arrays of that structure) instead."),
        (lambda s: ts.while_carry(lambda c: c, {"inner": s}), "Pass `s.zeros()`"),
        (lambda s: ts.fori_carry(lambda i, c: c, s), "Pass `s.zeros()`"),
        (lambda s: ts.settle(lambda st: st, s), "Pass `s.zeros()`"),
        (
            lambda s: ts.carry_structure(_step, s, jnp.ones((3, 2))),
            "Pass `s.zeros()` (arrays of that structure) or `s.tree`",
        ),
    ],
)
def test_a_structure_passed_as_a_carry_says_to_pass_zeros_or_tree(call, fix):
    s = ts.structure_of({"w": jnp.zeros(2)})
    with pytest.raises(TypeError) as info:
        call(s)
    message = str(info.value)
    assert "is a treeshape.Structure" in message and fix in message
    assert "close over" not in message
    assert re.match(r"treeshape\.\w+: (carry|state)(\['inner'\])? is a treeshape\.Structure", message)


# -- fori_carry bounds as the user wrote them ------------------------------------------------------
@pytest.mark.parametrize(
    "lower, upper, shown",
    [
        (0.5, 3, "`lower` must be an integer scalar (.*), got 0.5 \\(~f(32|64)\\[\\]\\)"),
        (0, "3", "`upper` .*, got '3' \\(a str\\)"),
    ],
)
def test_fori_bounds_are_shown_as_written(lower, upper, shown):
    with pytest.raises(TypeError, match=shown) as info:
        ts.fori_carry(lambda i, c: c, 0.0, lower=lower, upper=upper)
    assert "ShapedArray" not in str(info.value)
