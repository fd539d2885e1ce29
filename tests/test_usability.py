"""What makes treeshape fit the hand: paths that match, `ignore=`, readable
messages for big trees, weak helpers and `astype` on Structures, precision
warnings and `fori_carry` bounds."""

import dataclasses
import re
import warnings

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from jax import lax

import treeshape as ts


INT = jnp.result_type(int)  # JAX's default int (int64 with x64 on)
FLOAT = jnp.result_type(float)


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


def test_carry_mismatch_paths_are_keystr_paths_printed_under_carry():
    body = lambda c, x: ({"w": c["w"] + x}, None)
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.carry_structure(body, {"w": jnp.zeros(2, jnp.bfloat16)}, jnp.ones((3, 2), jnp.float32))
    [m] = info.value.mismatches
    assert (m.path, m.root, m.where) == ("['w']", "carry", "carry['w']")
    assert "carry['w']: input bf16[2], output f32[2]" in str(info.value)


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


def test_upcast_lists_dtype_problems_with_shape_problems():
    like = {"a": jnp.zeros(3, jnp.bfloat16), "b": jnp.zeros(2, jnp.float32)}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.upcast({"a": jnp.zeros(3, jnp.float32), "b": jnp.zeros(5, jnp.float32)}, like)
    assert [(m.where, m.kind) for m in info.value.mismatches] == [("tree['a']", "dtype"), ("tree['b']", "shape")]
    assert 'policy="cast" would' in str(info.value) and "Make this leaf shape (2,)" in str(info.value)


def test_a_scalar_accumulator_meeting_a_vector_is_told_to_change_init():
    body = lambda acc, x: (acc + x, None)
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.carry_structure(body, 0.0, jnp.ones((4, 16), jnp.float32))
    message = str(info.value)
    assert f"carry: input ~f{FLOAT.itemsize * 8}[], output f32[16]" in message
    assert "give `init` shape (16,) here" in message


# -- weak helpers and astype on Structures ----------------------------------------------
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


# -- precision ------------------------------------------------------------------------
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


# -- Python scalars a training loop needs ------------------------------------------------
def test_restored_checkpoint_style_comparison():
    opt = optax.adam(1e-3)
    params = {"w": jnp.zeros((2, 3), jnp.float32)}
    state = {"params": params, "opt": opt.init(params), "step": 0}
    restored = jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), state)
    s = ts.structure_of(state)
    assert not s.matches(restored)
    assert s.matches(restored, ignore={"weak_type"})
    np.testing.assert_array_equal(s.zeros()["params"]["w"], np.zeros((2, 3)))


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


def test_a_structure_passed_to_fn_stands_for_its_tree():
    opt = optax.adam(1e-3)
    s = ts.structure_of({"w": jnp.zeros((3, 2))})
    assert ts.out_structure(opt.init, s) == ts.out_structure(opt.init, s.tree) == ts.out_structure(opt.init, s.zeros())
    jax.jit(lambda: ts.out_structure(opt.init, s).zeros())()


# -- values as the user wrote them, and callbacks' signatures ------------------------
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


def test_full_with_a_complex_value_names_the_leaves_that_cannot_hold_it(where_run):
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

    out = run() if where_run == "top" else jax.jit(run)()
    np.testing.assert_array_equal(np.asarray(out), np.full(2, 1 + 2j, np.complex64))


@pytest.fixture(params=["top", "jit"])
def where_run(request):
    return request.param


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
