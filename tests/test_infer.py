"""`ts.out_structure` and `ts.structure_of`: parity with `jax.eval_shape`, under every transformation."""

import dataclasses
import enum
import functools as ft
import gc
import re

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from helpers import frames, listening
from jax import lax

import treeshape as ts


# The dtypes JAX gives Python scalars and 64-bit NumPy inputs: 64-bit under
# `jax_enable_x64`, 32-bit otherwise (the suite runs in both modes).
INT = jax.dtypes.canonicalize_dtype(jnp.int64)
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)
COMPLEX = jax.dtypes.canonicalize_dtype(jnp.complex128)


# -- callables of every kind ----------------------------------------------------
def _affine(w, x, *, b):
    """The core every callable of the matrix calls: arrays, a reduction, Python scalars out."""
    y = w * x + b
    return {"y": y, "total": jnp.sum(y), "pair": (x.astype(jnp.int32), 2.0), "step": 1}


def _plain(x):
    return _affine(x, x, b=0.5)


_jitted = jax.jit(_plain)


@jtu.register_dataclass
@dataclasses.dataclass
class _Layer:
    w: jax.Array
    b: jax.Array
    act: str = dataclasses.field(default="tanh", metadata={"static": True})

    def apply(self, x):
        out = _affine(self.w, x, b=self.b)
        return out if self.act == "tanh" else None


@jtu.register_dataclass
@dataclasses.dataclass
class _CallableLayer:
    w: jax.Array
    b: float

    def __call__(self, x):
        return _affine(self.w, x, b=self.b)


# Each entry builds, from the tracer `x` of the surrounding context, a callable
# taking one argument shaped like `x`.
CALLABLES = {
    "function": lambda x: _plain,
    "closure": lambda x: lambda y: _affine(x, y, b=x.sum()),
    "functools.partial": lambda x: ft.partial(_affine, x, b=2.0),
    "tree_util.Partial": lambda x: jtu.Partial(_affine, x, b=x[0]),
    "bound_method": lambda x: _Layer(x, x.sum()).apply,
    "jitted": lambda x: _jitted,
    "callable_pytree": lambda x: _CallableLayer(x, 3.0),
}


@pytest.mark.parametrize("kind", list(CALLABLES))
def test_matrix_matches_eval_shape(in_context, kind):
    """Every callable kind, in every context, twice (the second call may be a cache hit)."""
    seen = []

    def body(x):
        for _ in range(2):
            fn = CALLABLES[kind](x)  # rebuilt: a fresh partial / method / pytree each time
            s = ts.out_structure(fn, x)
            expected = jax.eval_shape(fn, x)
            assert s.tree == expected
            assert s.leaves == tuple(jax.tree.leaves(expected))
            seen.append(s)
        return x

    in_context(body, jnp.arange(3.0, dtype=jnp.float32) + 1.0)
    assert seen and all(s == seen[0] for s in seen)
    # The per-example (per-shard, per-level) shapes: never a batched one.
    assert seen[0].tree["y"].shape == (3,)
    scalar = seen[0].tree["pair"][1]  # the Python float 2.0
    assert (scalar.shape, scalar.dtype, scalar.weak_type) == ((), FLOAT, True)
    assert seen[0].tree["step"].weak_type


# -- the seed scenario --------------------------------------------------------------
def _f1(a, b):
    return {"h": jnp.tanh(a @ b), "count": jnp.zeros((), jnp.int32)}


def test_seed_scenario_partial_over_tracer_as_scan_carry():
    xs = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3) / 10.0
    b = jnp.linspace(-1.0, 1.0, 6, dtype=jnp.float32).reshape(3, 2)

    @jax.jit
    def run(xs, b):
        s = ts.out_structure(jtu.Partial(_f1, b=b), xs[0])
        assert s.tree == {
            "h": jax.ShapeDtypeStruct((4, 2), jnp.float32),
            "count": jax.ShapeDtypeStruct((), jnp.int32),
        }

        def step(carry, a):
            out = _f1(a, b)
            return {"h": carry["h"] + out["h"], "count": carry["count"] + 1}, None

        final, _ = lax.scan(step, s.zeros(), xs)
        return final

    with jax.check_tracer_leaks(True):
        final = run(xs, b)
    expected = sum(np.tanh(np.asarray(a) @ np.asarray(b)) for a in xs)
    np.testing.assert_allclose(final["h"], expected, rtol=1e-6)
    assert int(final["count"]) == 2


# -- no compilation ---------------------------------------------------------------
def _is_compile_event(event: str) -> bool:
    # `/jax/core/compile/jaxpr_trace_duration` is tracing, which out_structure does.
    return any(word in event for word in ("mlir_module", "backend_compile", "compilation_cache"))


@pytest.fixture
def jax_events():
    events: list[str] = []

    def on_event(event, **kwargs):
        events.append(event)

    def on_duration(event, duration, **kwargs):
        events.append(event)

    with listening(on_event, on_duration):
        yield events


def test_no_lowering_or_compilation(jax_events):
    big = jax.ShapeDtypeStruct((2**20, 2**14), jnp.float32)  # 64 GiB if it were real
    fresh_jit = jax.jit(lambda x: (x @ x.T).sum(axis=0))
    x = jnp.ones((4, 3), jnp.float32)
    jax_events.clear()  # creating `x` compiled a kernel
    gc.collect()  # arrays of earlier tests that are garbage already do not count
    live = len(jax.live_arrays())

    s1 = ts.out_structure(lambda x: (x @ x.T).sum(axis=0), x)
    s2 = ts.out_structure(fresh_jit, x)
    s3 = ts.out_structure(fresh_jit, big)
    s4 = ts.out_structure(jtu.Partial(_affine, x, b=1.0), x)
    jax.make_jaxpr(lambda y: ts.out_structure(fresh_jit, y).zeros())(x)  # under a trace
    assert not [e for e in jax_events if _is_compile_event(e)]
    assert len(jax.live_arrays()) == live  # and no device memory
    assert s1 == s2 == ts.structure_of(jax.ShapeDtypeStruct((4,), jnp.float32))
    assert s3.tree == jax.ShapeDtypeStruct((2**20,), jnp.float32)
    assert s4.tree["y"].shape == (4, 3)

    # The listener does see a compilation when there is one.
    jax.jit(lambda x: x * 3 + 1)(x).block_until_ready()
    assert [e for e in jax_events if _is_compile_event(e)]


# -- dtypes and shapes ---------------------------------------------------------
_NUMERIC = [
    jnp.bool_,
    jnp.int2,
    jnp.int4,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.uint4,
    jnp.uint8,
    jnp.uint16,
    jnp.uint32,
    jnp.float4_e2m1fn,
    jnp.float8_e3m4,
    jnp.float8_e4m3,
    jnp.float8_e4m3fn,
    jnp.float8_e4m3fnuz,
    jnp.float8_e4m3b11fnuz,
    jnp.float8_e5m2,
    jnp.float8_e5m2fnuz,
    jnp.float8_e8m0fnu,
    jnp.bfloat16,
    jnp.float16,
    jnp.float32,
    jnp.complex64,
]
_X64 = [jnp.int64, jnp.uint64, jnp.float64, jnp.complex128]
_SHAPES = [(), (0,), (3, 0, 2), (2, 3), (2**20, 2**12)]

_NUMERIC_FNS = {
    "identity": lambda x: x,
    "containers": lambda x: (x, [x.reshape(-1)], {"row": x[None], "t": x.T}),
    "astype": lambda x: {"f32": jnp.real(x).astype(jnp.float32), "eq": x == x},
    "where": lambda x: jnp.where(jnp.ones(x.shape, bool), x, jnp.zeros_like(x)),
    "stack": lambda x: jnp.stack([x, x], axis=-1),
}


def _name(dtype):
    return jnp.dtype(dtype).name


@pytest.mark.parametrize("shape", _SHAPES, ids=str)
@pytest.mark.parametrize("dtype", _NUMERIC, ids=_name)
def test_parity_numeric_dtypes(dtype, shape):
    x = jax.ShapeDtypeStruct(shape, dtype)
    for fn in _NUMERIC_FNS.values():
        assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)
    s = ts.structure_of(x)
    assert s.leaves == (jax.ShapeDtypeStruct(shape, dtype),)
    assert s.size == int(np.prod(shape))


@pytest.mark.parametrize("dtype", _X64, ids=_name)
def test_parity_x64_dtypes(dtype):
    with jax.enable_x64(True):
        for shape in [(), (2, 3), (2**20, 2**12)]:
            x = jax.ShapeDtypeStruct(shape, dtype)
            for fn in _NUMERIC_FNS.values():
                assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)
            assert ts.structure_of(x).leaves[0].dtype == dtype
        # Python scalars take the 64-bit defaults.
        s = ts.structure_of((1, 1.0, 1j, True))
        assert [leaf.dtype for leaf in s.leaves] == [jnp.int64, jnp.float64, jnp.complex128, jnp.bool_]
    # Back under 32 bits: the cache must not answer with the x64 result.
    with jax.enable_x64(False):
        assert ts.structure_of(1).leaves[0].dtype == jnp.int32
        assert ts.structure_of(jax.ShapeDtypeStruct((2,), jnp.float64)).leaves[0].dtype == jnp.float32
    # And in the suite's own mode, after both: its own answers.
    assert ts.structure_of(1).leaves[0].dtype == INT
    assert ts.structure_of(jax.ShapeDtypeStruct((2,), jnp.float64)).leaves[0].dtype == FLOAT


def test_parity_concrete_arrays_of_every_dtype():
    for dtype in _NUMERIC:
        x = jnp.zeros((2, 3), dtype)
        for fn in _NUMERIC_FNS.values():
            assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)


_KEY_FNS = {
    "identity": lambda k: k,
    "split": lambda k: jax.random.split(k.reshape(-1)[0], 4),
    "key_data": lambda k: jax.random.key_data(k),
    "uniform": lambda k: jax.random.uniform(k.reshape(-1)[0], (5,)),
    "fold_in": lambda k: {"k": jax.vmap(lambda kk: jax.random.fold_in(kk, 1))(k.reshape(-1))},
}


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
@pytest.mark.parametrize("shape", [(), (3,), (2, 2)], ids=str)
def test_parity_typed_keys(impl, shape):
    keys = jax.random.split(jax.random.key(0, impl=impl), int(np.prod(shape))).reshape(shape)
    for x in [keys, jax.ShapeDtypeStruct(shape, keys.dtype)]:
        for fn in _KEY_FNS.values():
            assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)
    assert jax.dtypes.issubdtype(ts.structure_of(keys).leaves[0].dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize(
    ("value", "dtype", "weak"),
    [(1, INT, True), (1.5, FLOAT, True), (1j, COMPLEX, True), (True, jnp.bool_, False)],
    ids=["int", "float", "complex", "bool"],
)
def test_python_scalars_typed_as_jax_types_them(value, dtype, weak):
    s = ts.structure_of(value)
    assert s.leaves == (jax.ShapeDtypeStruct((), dtype, weak_type=weak),)
    assert s.tree == jax.eval_shape(lambda v: v, value)
    fn = lambda v: v * 2
    assert ts.out_structure(fn, value).tree == jax.eval_shape(fn, value)


def test_python_int_too_large_names_its_path():
    bits = jnp.iinfo(INT).bits  # a Python int is typed as the default int: int32, or int64 under x64
    big = 2 ** (bits + 8)  # 2**40 under 32 bits
    with pytest.raises(OverflowError, match=re.escape("args[0]['n']")) as info:
        ts.out_structure(lambda t: t["n"] + 1, {"n": big})
    assert str(big) in str(info.value)
    with pytest.raises(OverflowError, match=re.escape("kwargs['big']")):
        ts.out_structure(lambda *, big: big, big=-(2 ** (bits + 3)))
    # Bound in a partial it stays a concrete Python value: no overflow.
    s = ts.out_structure(ft.partial(lambda n, x: x * (n // (big // 2)), big), jnp.ones(2, jnp.float32))
    assert s.tree == jax.ShapeDtypeStruct((2,), jnp.float32)


def test_numpy_arrays_and_scalars_are_strong_abstract_inputs():
    for x in [np.ones((2, 3), np.float32), np.float32(1), np.int8(3), np.ones(4, np.float64), np.bool_(True)]:
        fn = lambda v: (v, v + 1)
        assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)
        assert not ts.structure_of(x).leaves[0].weak_type
    assert ts.structure_of(np.float64(1)).leaves[0].dtype == FLOAT  # canonicalised, as JAX does


class _DuckArray:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def test_array_numpy_sds_and_duck_array_are_the_same_input():
    fn = lambda x: {"sum": x.sum(0), "x": x}
    inputs = [
        jnp.ones((4, 2), jnp.bfloat16),
        np.ones((4, 2), jnp.bfloat16),
        jax.ShapeDtypeStruct((4, 2), jnp.bfloat16),
        _DuckArray((4, 2), jnp.bfloat16),
    ]
    structures = [ts.out_structure(fn, x) for x in inputs]
    assert all(s == structures[0] for s in structures)
    assert structures[0].tree == jax.eval_shape(fn, inputs[0])


class _Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class _Opaque:
    """An arbitrary object, compared by identity."""


class _Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other):
        return isinstance(other, _Unhashable)


def test_static_leaves_pass_through_arguments_and_outputs():
    obj, unhashable, act = _Opaque(), _Unhashable(), jnp.tanh
    received = {}

    def fn(x, name, act, mode, obj, unhashable):
        received.update(name=name, act=act, mode=mode, obj=obj, unhashable=unhashable)
        y = act(x) if mode is _Mode.TRAIN else x
        return {"y": y, "name": name + "!", "mode": mode, "obj": obj, "act": act, "u": unhashable}

    s = ts.out_structure(fn, jnp.ones(2, jnp.float32), "layer", act, _Mode.TRAIN, obj, unhashable=unhashable)
    assert received == {"name": "layer", "act": act, "mode": _Mode.TRAIN, "obj": obj, "unhashable": unhashable}
    tree = s.tree
    assert tree["y"] == jax.ShapeDtypeStruct((2,), jnp.float32)
    assert tree["name"] == "layer!"
    assert tree["mode"] is _Mode.TRAIN
    assert tree["obj"] is obj and tree["act"] is act and tree["u"] is unhashable
    assert s.paths == ("['act']", "['mode']", "['name']", "['obj']", "['u']", "['y']")


def test_python_scalars_in_outputs_become_weak_arrays():
    fn = lambda: (1, 2.5, 1j, True, np.float32(1), None)
    s = ts.out_structure(fn)
    assert s.tree == jax.eval_shape(fn)
    assert [leaf.weak_type for leaf in s.leaves] == [True, True, True, False, False]


def test_kwargs_and_nested_containers():
    def fn(a, *, cfg, scale=2.0):
        return {"out": [a["x"] * scale, cfg["n"]], "t": (a["y"],)}

    a = {"x": jnp.ones((2,)), "y": jnp.zeros((3, 1), jnp.int8)}
    s = ts.out_structure(fn, a, cfg={"n": 3}, scale=0.5)
    assert s.tree == jax.eval_shape(lambda a, cfg, scale: fn(a, cfg=cfg, scale=scale), a, {"n": 3}, 0.5)
    assert s.paths == ("['out'][0]", "['out'][1]", "['t'][0]")


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: jnp.linalg.svd(x, full_matrices=False),
        lambda x: lax.cond(x.sum() > 0, lambda: x.T, lambda: -x.T),
        lambda x: lax.scan(lambda c, r: (c + r, r * 2), jnp.zeros(x.shape[1]), x),
        lambda x: jax.grad(lambda y: (y**2).sum())(x),
        lambda x: jax.vmap(jnp.outer)(x, x),
        lambda x: jnp.fft.rfft(x),
        lambda x: lax.top_k(x, 2),
        lambda x: jnp.einsum("ij,kj->ik", x, x).astype(jnp.bfloat16),
    ],
    ids=["svd", "cond", "scan", "grad", "vmap", "rfft", "top_k", "einsum"],
)
def test_parity_assorted_functions(fn):
    x = jnp.arange(12.0).reshape(4, 3)
    assert ts.out_structure(fn, x).tree == jax.eval_shape(fn, x)
    assert ts.out_structure(fn, jax.ShapeDtypeStruct((40, 30), jnp.float32)).tree == jax.eval_shape(
        fn, jax.ShapeDtypeStruct((40, 30), jnp.float32)
    )


def _tile(x, n, *, mode="tile"):
    return jnp.tile(x, n) if mode == "tile" else x[:n]


def test_jitted_function_with_static_arguments():
    jf = jax.jit(_tile, static_argnames=("n", "mode"))
    x = jnp.ones(2)
    for n, mode in [(3, "tile"), (2, "tile"), (3, "tile"), (1, "slice")]:
        assert ts.out_structure(jf, x, n, mode=mode).tree == jax.eval_shape(jf, x, n, mode=mode)
        assert ts.out_structure(ft.partial(jf, n=n), x, mode=mode).tree == jax.eval_shape(jf, x, n, mode=mode)
    assert ts.out_structure(jf, x, 3).tree.shape == (6,)
    assert ts.out_structure(jf, x, 2**40, mode="slice").tree.shape == (2,)  # static: no int32 overflow
    # Non-static Python scalars are still abstracted (by jit itself), weak as usual.
    add = jax.jit(lambda a, b: a + b)
    assert ts.out_structure(add, 1, 2.0).tree == jax.eval_shape(add, 1, 2.0)
    assert ts.out_structure(add, 1, 2.0).tree.weak_type


def test_nested_transformations():
    def inner(x):
        s = ts.out_structure(_plain, x)
        assert s.tree == jax.eval_shape(_plain, x)
        return s.zeros()["y"] + x

    def outer(x):
        return lax.fori_loop(0, 2, lambda i, c: jax.checkpoint(inner)(c), x)

    x = jnp.ones((2, 3))
    out = jax.jit(jax.vmap(jax.grad(lambda y: outer(y).sum())))(x)
    np.testing.assert_allclose(out, np.ones((2, 3)))


def test_structure_of_equals_out_structure_of_identity(in_context):
    def body(x):
        tree = {
            "x": x,
            "n": 1,
            "f": 2.0,
            "np": np.ones(2, np.int8),
            "s": "static",
            "sds": jax.ShapeDtypeStruct((2,), x.dtype),
        }
        assert ts.structure_of(tree) == ts.out_structure(lambda t: t, tree)
        return x

    in_context(body, jnp.ones(3))


# -- errors ----------------------------------------------------------------------
@pytest.mark.parametrize("bad", [3, "f", None, jnp.ones(2)], ids=["int", "str", "None", "array"])
def test_non_callable_raises_type_error(bad):
    with pytest.raises(TypeError, match="must be callable"):
        ts.out_structure(bad, jnp.ones(2))


class _BoomError(Exception):
    pass


def _user_fn_that_fails(x):
    raise _BoomError(f"user failure on {x.shape}")


def _user_fn_with_shape_error(x):
    return x @ jnp.ones((7, 7))


@pytest.mark.parametrize("wrap", ["plain", "partial", "jitted"])
def test_errors_from_fn_propagate_unchanged(wrap):
    fn = {
        "plain": _user_fn_that_fails,
        "partial": ft.partial(_user_fn_that_fails),
        "jitted": jax.jit(_user_fn_that_fails),
    }[wrap]
    with pytest.raises(_BoomError, match=re.escape("user failure on (2,)")) as info:
        ts.out_structure(fn, jnp.ones(2))
    assert type(info.value) is _BoomError
    assert "_user_fn_that_fails" in frames(info.value)
    # Nothing was cached for the failing call.
    assert ts.cache_info().size == 0


def test_errors_from_fn_propagate_under_jit():
    @jax.jit
    def outer(x):
        return ts.out_structure(_user_fn_that_fails, x).zeros()

    with pytest.raises(_BoomError) as info:
        outer(jnp.ones(2))
    assert "_user_fn_that_fails" in frames(info.value)


def test_jax_errors_from_fn_keep_their_type():
    with pytest.raises(TypeError) as expected:
        jax.eval_shape(_user_fn_with_shape_error, jnp.ones((2, 3)))
    with pytest.raises(TypeError) as info:
        ts.out_structure(_user_fn_with_shape_error, jnp.ones((2, 3)))
    assert type(info.value) is type(expected.value)
    assert "_user_fn_with_shape_error" in frames(info.value)


# -- Python scalars a function needs as Python values ---------------------------------
def _init(key, n, m):
    return {"w": jax.random.normal(key, (n, m))}


def _apply(v, x, *, train):
    if train:
        return x * 2
    return x


def _loop(x, steps):
    for _ in range(steps):
        x = x * 2
    return x


@pytest.mark.parametrize(
    "call, error, named, bind",
    [
        (
            lambda: ts.out_structure(_init, jax.random.key(0), 8, 32),
            TypeError,
            "args[1] = 8, args[2] = 32",
            "n=8, m=32",
        ),
        (
            lambda: ts.out_structure(_apply, {}, jnp.ones(2), train=True),
            jax.errors.TracerBoolConversionError,
            "kwargs['train'] = True",
            "train=True",
        ),
        (
            lambda: ts.out_structure(_loop, jnp.ones(2), 3),
            jax.errors.TracerIntegerConversionError,
            "args[1] = 3",
            "steps=3",
        ),
    ],
    ids=["shape", "flag", "loop_count"],
)
@pytest.mark.parametrize("wrap", ["top", "jit"])
def test_a_needed_python_scalar_gets_a_note_naming_the_argument(call, error, named, bind, wrap):
    def run():  # only text leaves the trace: the exception's frames hold tracers
        with pytest.raises(error) as info:
            call()
        return type(info.value), str(info.value), list(info.value.__notes__)

    if wrap == "top":
        kind, message, notes = run()
    else:
        seen = []
        jax.jit(lambda x: seen.append(run()) or x)(jnp.ones(1))
        [(kind, message, notes)] = seen
    assert kind is error  # the user's exception, not a treeshape wrapper
    [note] = [n for n in notes if n.startswith("treeshape:")]
    assert named in note and bind in note and "static_argnames" in note
    for internal in ("treeshape/_infer", "treeshape/_call", "function traced", "values[", "_evaluate"):
        assert internal not in message + "\n".join(notes)  # JAX's message names the user's function too
    parameters = [part.split("=")[0] for part in bind.split(", ")]  # named as `jax.jit(fn)` names them
    assert any(f"argument {p}" in message or f"argument '{p}'" in message for p in parameters), message


def _fill(scale, table, x, n, fill=0.0):
    return jnp.full((n,), fill) * scale + x + table["a"].sum()


def test_a_note_after_bound_arguments_names_the_same_parameter_in_cost_and_out_structure():
    # Two bound arguments holding three leaves: `args[1]` is the fourth parameter, `n`.
    fn = ft.partial(_fill, 2, {"a": jnp.ones(2), "b": jnp.ones(2)})
    notes = []
    for who in ("out_structure", "cost"):
        with pytest.raises(TypeError) as info:
            getattr(ts, who)(fn, jnp.ones(()), 3)
        [note] = [n for n in info.value.__notes__ if n.startswith("treeshape:")]
        assert "args[1] = 3" in note and f"ts.{who}(functools.partial(_fill, n=3), ...)" in note
        notes.append(note.replace(f"ts.{who}(", "ts.fn("))
    assert notes[0] == notes[1]
    bound = ts.cost(ft.partial(fn, n=3), jnp.ones(()))  # the binding it suggests works
    assert bound.output_bytes == 3 * jnp.ones(()).dtype.itemsize


def test_the_suggested_binding_works():
    s = ts.out_structure(ft.partial(_init, n=8, m=32), jax.random.key(0))
    assert s.tree == {"w": jax.ShapeDtypeStruct((8, 32), jnp.result_type(float))}
    s = ts.out_structure(jax.jit(_apply, static_argnames="train"), {}, jnp.ones(2, jnp.float32), train=True)
    assert s.tree == jax.ShapeDtypeStruct((2,), jnp.float32)


def test_other_errors_get_no_note():
    def bad(x, n):
        raise ValueError("mine")

    with pytest.raises(ValueError, match="mine") as info:
        ts.out_structure(bad, jnp.ones(2), 3)
    assert not [n for n in getattr(info.value, "__notes__", []) if n.startswith("treeshape:")]

    def needs_concrete(x):
        return jnp.zeros(x.sum().astype(int))  # no Python scalar to blame: no note

    with pytest.raises(TypeError) as info:
        ts.out_structure(needs_concrete, jnp.ones(2))
    assert not [n for n in getattr(info.value, "__notes__", []) if n.startswith("treeshape:")]


# -- arrays bound in a partial that fn needs as values -----------------------------------
def _sized(x, n):
    return jnp.zeros(n) + x  # `n` is a size: it must be concrete


def _read_int(x, idx):
    return jnp.zeros(int(idx)) + x


def _sliced(w, x, *, n):
    return w[:n] + x


_NEEDS_VALUES = {
    "numpy scalar as a size": (_sized, (), {"n": np.int32(3)}),
    "jax array read with int()": (_read_int, (), {"idx": jnp.array(4)}),
    "numpy 0-d array in a slice": (_sliced, (jnp.ones(6),), {"n": np.array(2)}),
    "positional numpy scalar": (lambda n, x: jnp.ones((n, 2)) * x, (np.int64(5),), {}),
}


@pytest.mark.parametrize("case", list(_NEEDS_VALUES))
@pytest.mark.parametrize("wrap", [ft.partial, jtu.Partial])
def test_bound_arrays_that_fn_needs_as_values_are_passed_concrete(case, wrap):
    fn, args, kwargs = _NEEDS_VALUES[case]
    oracle = jax.eval_shape(wrap(fn, *args, **kwargs), 1.0)
    for _ in range(2):  # the second call is answered from the cache, by the bound values
        assert ts.out_structure(wrap(fn, *args, **kwargs), 1.0).tree == oracle
    info = ts.cache_info()
    assert (info.hits, info.misses) == (1, 1)

    @jax.jit
    def step(x):
        s = ts.out_structure(wrap(fn, *args, **kwargs), x)
        assert s.tree == oracle
        return s.zeros()

    assert step(jnp.float32(2.0)).shape == oracle.shape


def test_bound_values_key_the_answer():
    for n in [2, 3, 2]:
        assert ts.out_structure(ft.partial(_sized, n=np.int32(n)), 1.0).tree.shape == (n,)
    info = ts.cache_info()
    assert (info.hits, info.misses, info.size) == (1, 2, 3)  # the marker, and one entry per value
    big = np.full(100_000, 3, np.int32)  # too large to copy into a key: answered, uncached
    for _ in range(2):
        assert ts.out_structure(ft.partial(lambda x, a: jnp.zeros(int(a[0])) + x, a=big), 1.0).tree.shape == (3,)
    assert ts.cache_info().misses == 4


def test_a_bound_value_that_is_needed_is_named_as_the_user_wrote_it():
    sds = jax.ShapeDtypeStruct((), jnp.int32)  # a description: it has no value to pass
    with pytest.raises(TypeError, match=r"depends on the value of the argument n\.") as info:
        ts.out_structure(ft.partial(_sized, n=sds), 1.0)
    assert "bound" not in str(info.value)
    with pytest.raises(TypeError, match=r"the argument n\.") as info:
        ts.out_structure(ft.partial(_sized, 1.0, sds))  # positional: the parameter's name
    assert "bound" not in str(info.value)

    @jax.jit
    def step(x, m):  # a tracer of the enclosing jit: named as the user's own argument there
        with pytest.raises(TypeError, match=r"the argument m\.") as info:
            ts.out_structure(ft.partial(_sized, n=m), x)
        assert "bound" not in str(info.value)
        return x

    step(1.0, 3)


# -- a Structure among the inputs stands for its tree -----------------------------------------
def _init_dense(key, d_in, d_out):
    return {"w": jax.random.normal(key, (d_in, d_out)), "b": jnp.zeros(d_out)}


def _sgd_step(params, batch, lr=0.1):
    def loss(p):
        return jnp.mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss(params)


def test_a_structure_argument_stands_for_the_tree_it_describes(in_context):
    # a model far too large to allocate here: its structure only
    state = ts.out_structure(ft.partial(_init_dense, d_in=2**16, d_out=2**15), jax.random.key(0))
    batch = ts.structure_of({"x": jax.ShapeDtypeStruct((8, 2**16), jnp.float32), "y": jnp.zeros((8, 2**15))})

    def body(x):
        expected = jax.eval_shape(_sgd_step, state.tree, batch.tree)  # as seen at this level
        assert ts.out_structure(_sgd_step, state, batch).tree == expected
        assert ts.out_structure(ft.partial(_sgd_step, state), batch).tree == expected  # bound in a partial
        assert ts.out_structure(_sgd_step, state, batch=batch).tree == expected
        mixed = {"x": x[:1, None] * jnp.ones((8, 2**16)), "y": batch}  # a Structure inside a tree
        assert ts.out_structure(lambda b: b["y"], mixed) == batch
        return x

    in_context(body, jnp.ones(3))


def test_a_structure_argument_is_cached_as_its_tree():
    n = 0

    def f(params):
        nonlocal n
        n += 1
        return params["w"].sum()

    s = ts.structure_of({"w": jnp.zeros((3, 2), jnp.float32)})
    ts.clear_cache()
    a = ts.out_structure(f, s)
    b = ts.out_structure(f, ts.structure_of({"w": jnp.ones((3, 2), jnp.float32)}))  # equal, another object
    c = ts.out_structure(f, s.tree)
    assert a == b == c == ts.structure_of(jnp.float32(0)) and n == 1


# -- a Structure as an argument --------------------------------------------------------------------
def test_a_structure_passed_to_fn_stands_for_its_tree():
    opt = optax.adam(1e-3)
    s = ts.structure_of({"w": jnp.zeros((3, 2))})
    assert ts.out_structure(opt.init, s) == ts.out_structure(opt.init, s.tree) == ts.out_structure(opt.init, s.zeros())
    jax.jit(lambda: ts.out_structure(opt.init, s).zeros())()
