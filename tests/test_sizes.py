"""Sizes past 63 bits: XLA counts a shape's elements and bytes in int64 and aborts the
whole process on an overflow (a notebook kernel dies). Every entry where a shape comes
into treeshape refuses such a leaf first, with a `ValueError` naming its path.

Inputs that would reach XLA run in a subprocess, so that a regression fails a test
instead of killing the test run."""

import json
import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest

import treeshape as ts


F32 = jnp.float32
BIG = (2**32, 2**32)  # 2**64 elements
BIG_BYTES = (2**31, 2**31)  # 2**62 elements, 2**64 bytes of float32


def _sds(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


# -- in this process: entries that never reach XLA ---------------------------------------
@pytest.mark.parametrize(
    "shape, what",
    [
        (BIG, "has 18,446,744,073,709,551,616 elements, more than 2**63 - 1"),
        (BIG_BYTES, "takes 18,446,744,073,709,551,616 bytes (4,611,686,018,427,387,904 elements of 4 B)"),
        ((2**60, 2, 0), "has no elements, but its dimensions up to axis 1 come to 9,223,372,036,854,775,808 bytes"),
    ],
    ids=["elements", "bytes", "zero-last"],
)
@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_structure_of_and_out_structure_name_the_leaf(shape, what, jit):
    tree = {"params": [_sds((2,)), {"w": _sds(shape)}]}
    calls = {
        "structure_of": (lambda: ts.structure_of(tree), "tree['params'][1]['w']"),
        "out_structure": (lambda: ts.out_structure(lambda t, x: x, 1.0, tree), "args[1]['params'][1]['w']"),
    }
    for who, (call, where) in calls.items():
        with pytest.raises(ValueError) as info:
            jax.jit(lambda x, call=call: (call(), x)[1])(1.0) if jit else call()
        message = str(info.value)
        assert message.startswith(f"treeshape.{who}: {where} (f32[{','.join(map(str, shape))}]) {what}")
        assert "the most that XLA's 64-bit sizes hold (it would abort the process on it)" in message


def test_the_largest_shapes_xla_holds_are_accepted():
    s = ts.structure_of({"w": _sds((2**61 - 1,)), "k": _sds((2**63 - 1,), jnp.int8), "e": _sds((0, 2**62, 4))})
    assert s.nbytes == 4 * (2**61 - 1) + 2**63 - 1
    for shape, dtype in [((2**61,), F32), ((2**63,), jnp.int8), ((4, 2**62, 0), F32), ((2**62,), jnp.bfloat16)]:
        with pytest.raises(ValueError, match=r"more than 2\*\*63 - 1"):
            ts.structure_of({"w": _sds(shape, dtype)})


def test_typed_prng_keys_count_their_key_data():
    key = jax.eval_shape(lambda: jax.random.key(0)).dtype  # 8 bytes of key data each
    assert ts.structure_of(_sds((2**60 - 1,), key)).nbytes == 8 * (2**60 - 1)
    with pytest.raises(ValueError, match=r"^treeshape\.structure_of: tree \(key<fry>\[1152921504606846976\]\) takes"):
        ts.structure_of(_sds((2**60,), key))


def test_a_duck_array_is_checked_like_a_shape_dtype_struct():
    class Duck:
        shape, dtype = BIG, jnp.dtype("float32")

    with pytest.raises(ValueError, match=r"^treeshape\.structure_of: tree\['d'\] \(f32\[4294967296,4294967296\]\)"):
        ts.structure_of({"d": Duck()})
    with pytest.raises(ValueError, match=r"^treeshape\.out_structure: args\[0\] \(f32"):
        ts.out_structure(lambda d: d, Duck())


@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_bind_names_the_leaf_and_never_wraps_around(jit):
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"x": _sds((b, 3)), "w": _sds((b, b, 4)), "y": _sds((2 * b + 1,))})
    assert s.bind(b=2**20).tree["w"].shape == (2**20, 2**20, 4)

    def bind(**sizes):
        return jax.jit(lambda x: (s.bind(**sizes), x)[1])(1.0) if jit else s.bind(**sizes)

    with pytest.raises(ValueError) as info:
        bind(b=2**32)
    assert str(info.value).startswith(
        "treeshape.Structure.bind: tree['w'] (f32[4294967296,4294967296,4]) has 73,786,976,294,838,206,464 "
        "elements, more than 2**63 - 1"
    )
    assert "At b=4294967296, choose smaller sizes" in str(info.value)
    # 2*b + 1 past 64 bits: NumPy's int64 arithmetic would warn and wrap it to a negative size
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError) as info:
            ts.structure_of({"y": _sds((2 * b + 1,))}).bind(b=2**62)
    message = str(info.value)
    assert message.startswith(
        "treeshape.Structure.bind: at tree['y'] (f32[2*b + 1]), b=4611686018427387904 makes dimension 0 "
        "(2*b + 1) larger than 2**63 - 1"
    )
    assert "negative" not in message


def test_from_json_refuses_a_shape_xla_cannot_hold():
    text = ts.structure_of({"w": _sds((3, 4))}).to_json().replace("[3, 4]", f"[{2**32}, {2**32}]")
    with pytest.raises(ValueError) as info:
        ts.Structure.from_json(text)
    assert str(info.value) == (
        "treeshape.Structure.from_json: leaves[0].shape: the leaf at ['w'] has 18,446,744,073,709,551,616 "
        "elements, more than 2**63 - 1, the most that XLA's 64-bit sizes hold"
    )


# -- in a subprocess: entries that would reach XLA -----------------------------------------
_CASES = r"""
import json, sys
import jax, jax.numpy as jnp
import treeshape as ts

F32 = jnp.float32
BIG = (2**32, 2**32)
(b,) = jax.export.symbolic_shape("b")
wide = ts.out_structure(lambda x: {"w": jnp.broadcast_to(x, BIG)}, 1.0)  # an output may be that large
key = jax.eval_shape(lambda: jax.random.key(0)).dtype


def under_jit(f):
    return lambda: jax.jit(lambda x: (f(), x)[1])(1.0)


def tracer_cost(x):
    return ts.cost(lambda y: y.sum(), jnp.broadcast_to(x.astype(F32), BIG))


cases = {
    "cost": lambda: ts.cost(lambda t: t["w"].sum(), {"w": jax.ShapeDtypeStruct(BIG, F32)}),
    "cost-bytes": lambda: ts.cost(lambda w: w.sum(), jax.ShapeDtypeStruct((2**61,), F32)),
    "cost-jit": under_jit(lambda: ts.cost(lambda w: w.sum(), jax.ShapeDtypeStruct(BIG, F32))),
    "cost-tracer": lambda: jax.jit(tracer_cost)(1.0),
    "zeros": lambda: wide.zeros(),
    "ones": lambda: wide.ones(),
    "full": lambda: wide.full(2),
    "zeros-jit": lambda: jax.jit(wide.zeros)(),
    "largest_fit": lambda: ts.largest_fit(
        lambda w: w.sum(), jax.ShapeDtypeStruct((b, 2**44), F32), dim="b", budget=2**70
    ),
    # inputs XLA holds, a value inside the program it does not
    "cost-inside": lambda: ts.cost(lambda x: jnp.outer(x, x).sum(), jax.ShapeDtypeStruct((2**33,), F32)),
    "cost-inside-jit": under_jit(
        lambda: ts.cost(lambda x: jax.lax.cond(x[0] > 0, lambda: jnp.outer(x, x).sum(), lambda: x[0]),
                        jax.ShapeDtypeStruct((2**33,), F32))
    ),
    # the largest that XLA holds: compiled (and, empty, made), never refused
    "cost-largest": lambda: ts.cost(lambda w: w, jax.ShapeDtypeStruct((2**61 - 1,), F32)).argument_bytes,
    "cost-largest-keys": lambda: ts.cost(lambda k: k, jax.ShapeDtypeStruct((2**60 - 1,), key)).argument_bytes,
    "zeros-empty": lambda: ts.structure_of(jax.ShapeDtypeStruct((0, 2**62, 4), F32)).zeros().shape,
    "zeros-empty-jit": lambda: jax.jit(ts.structure_of(jax.ShapeDtypeStruct((0, 2**62, 4), F32)).zeros)().shape,
}
for name in sys.argv[1:]:
    try:
        result = f"OK {cases[name]()}"
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    print(json.dumps([name, result]), flush=True)
"""


def _run(names):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", _CASES, *names], env=env, capture_output=True, text=True, timeout=600, cwd=os.getcwd()
    )
    results = dict(json.loads(line) for line in done.stdout.splitlines())
    assert done.returncode == 0, (names[len(results)] if len(results) < len(names) else "", done.stderr[-2000:])
    return results


def test_nothing_that_would_abort_reaches_xla():
    weak = "~f64" if jax.config.jax_enable_x64 else "~f32"  # a Python float's type
    refused = {
        "cost": "treeshape.cost: args[0]['w'] (f32[4294967296,4294967296]) has 18,446,744,073,709,551,616 elements",
        "cost-bytes": "treeshape.cost: args[0] (f32[2305843009213693952]) takes 9,223,372,036,854,775,808 bytes",
        "cost-jit": "treeshape.cost: args[0] (f32[4294967296,4294967296]) has",
        "cost-tracer": "treeshape.cost: args[0] (f32[4294967296,4294967296]) has",
        "zeros": f"treeshape.Structure.zeros: tree['w'] ({weak}[4294967296,4294967296]) has",
        "ones": f"treeshape.Structure.ones: tree['w'] ({weak}[4294967296,4294967296]) has",
        "full": f"treeshape.Structure.full: tree['w'] ({weak}[4294967296,4294967296]) has",
        "zeros-jit": f"treeshape.Structure.zeros: tree['w'] ({weak}[4294967296,4294967296]) has",
        "largest_fit": "treeshape.largest_fit: at b=1048576, args[0] (f32[1048576,17592186044416]) has",
        "cost-inside": "treeshape.cost: the program makes a value of mul (f32[8589934592,8589934592]) that has",
        "cost-inside-jit": "treeshape.cost: the program makes a value of mul (f32[8589934592,8589934592]) that has",
    }
    empty = f"OK {(0, 2**62, 4)}"
    results = _run([*refused, "cost-largest", "cost-largest-keys", "zeros-empty", "zeros-empty-jit"])
    for name, start in refused.items():
        # a ValueError: largest_fit's is its subclass ts.SizeError, which users catch by name
        error = "SizeError" if name == "largest_fit" else "ValueError"
        assert results[name].startswith(f"{error}: {start}"), (name, results[name])
        assert "more than 2**63 - 1" in results[name]
    # XLA compiles them (its argument bytes are rounded up to its alignment)
    assert 4 * (2**61 - 1) <= int(results["cost-largest"].removeprefix("OK ")) <= 2**63
    assert 8 * (2**60 - 1) <= int(results["cost-largest-keys"].removeprefix("OK ")) <= 2**63
    assert results["zeros-empty"] == results["zeros-empty-jit"] == empty
