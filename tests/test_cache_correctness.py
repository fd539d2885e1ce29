"""A cached answer is the answer `jax.eval_shape` gives at that point, or the same error.

These tests mix contexts on purpose and never clear the cache in between: an
entry made in one context (a `vmap` axis, a PRNG setting, a promotion mode)
must never answer in another.
"""

import contextlib
import dataclasses
import functools as ft
import gc
import weakref

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax import lax
from jax.sharding import PartitionSpec as P

import treeshape as ts


X64 = jax.config.jax_enable_x64


def _both(fn, *args):
    """`(treeshape's tree or exception type, eval_shape's tree or exception type)`.

    `jax.eval_shape` gets a fresh function each time: JAX's own trace cache is
    not keyed on every setting (e.g. `jax_enable_custom_prng`), and the truth
    here is a fresh evaluation.
    """
    try:
        mine = ts.out_structure(fn, *args).tree
    except Exception as e:
        mine = type(e)
    try:
        truth = jax.eval_shape(lambda *a: fn(*a), *args)
    except Exception as e:
        truth = type(e)
    return mine, truth


def _sharded(mesh, x):
    return jax.device_put(x, jax.NamedSharding(mesh, P("i")))


# -- named axes ------------------------------------------------------------------
def _axis_size_zeros(x):
    return jnp.zeros(lax.axis_size("i")) + x.sum()


def _psum(x):
    return lax.psum(x, "i")


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_vmap_axis_size_is_part_of_the_key(wrap):
    def body(row):
        s = ts.out_structure(_axis_size_zeros, row)
        assert s.tree == jax.eval_shape(_axis_size_zeros, row)
        return s.zeros()

    for n in (2, 5, 2):
        out = wrap(jax.vmap(body, axis_name="i"))(jnp.ones((n, 3)))
        assert out.shape == (n, n)


def test_an_axis_bound_under_vmap_is_unbound_at_top_level():
    jax.vmap(lambda row: ts.out_structure(_psum, row).zeros(), axis_name="i")(jnp.ones((2, 3)))
    with pytest.raises(NameError, match="unbound axis name: i"):
        ts.out_structure(_psum, jnp.ones(3))
    with pytest.raises(NameError, match="unbound axis name: i"):
        jax.jit(lambda x: ts.out_structure(_psum, x).zeros())(jnp.ones(3))
    # Another axis name is another context too.
    with pytest.raises(NameError):
        jax.vmap(lambda row: ts.out_structure(_psum, row).zeros(), axis_name="j")(jnp.ones((2, 3)))


def test_shard_map_axes_and_vmap_axes_of_one_name_are_told_apart():
    mesh = jax.make_mesh((8,), ("i",))
    sizes = []

    def body(x):
        sizes.append(ts.out_structure(_axis_size_zeros, x).tree.shape)
        return x

    jax.vmap(body, axis_name="i")(jnp.ones((3, 2)))
    jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(_sharded(mesh, jnp.ones((8, 2))))
    jax.vmap(body, axis_name="i")(jnp.ones((3, 2)))
    assert sizes == [(3,), (8,), (3,)]


def test_nested_named_axes():
    def inner(x):
        f = lambda y: jnp.zeros((lax.axis_size("i"), lax.axis_size("j"))) + y.sum()
        s = ts.out_structure(f, x)
        assert s.tree == jax.eval_shape(f, x)
        return x

    jax.vmap(jax.vmap(inner, axis_name="j"), axis_name="i")(jnp.ones((2, 3, 4)))
    jax.vmap(jax.vmap(inner, axis_name="j"), axis_name="i")(jnp.ones((3, 2, 4)))
    jax.vmap(jax.vmap(inner, axis_name="i"), axis_name="j")(jnp.ones((2, 3, 4)))


# -- settings that change tracing ---------------------------------------------------
@contextlib.contextmanager
def _global(name, value):
    """A global config setting for the duration (for those without a context manager)."""
    old = getattr(jax.config, name)
    jax.config.update(name, value)
    try:
        yield
    finally:
        jax.config.update(name, old)


def _raw_key(x):
    return jax.random.PRNGKey(0)


def _split(x):
    return jax.random.split(jax.random.PRNGKey(0))


def _reuse(x):
    key = jax.random.key(0)
    return jax.random.normal(key, (2,)), jax.random.normal(key, (2,))


def _promote(x):
    return x.astype(jnp.bfloat16) + jnp.ones(3, jnp.int8)


def _rank(x):
    return x + jnp.ones((2, 3))


def _explicit_f64(x):
    return jnp.zeros(2, jnp.float64) + 1


def _arange(x):
    return jnp.arange(3) * 2


@pytest.mark.parametrize(
    "fn, context",
    [
        (_raw_key, lambda: jax.enable_custom_prng(True)),
        (_raw_key, lambda: jax.default_prng_impl("rbg")),
        (_reuse, lambda: jax.debug_key_reuse(True)),
        (_split, lambda: jax.legacy_prng_key("error")),
        (_promote, lambda: jax.numpy_dtype_promotion("strict")),
        (_rank, lambda: jax.numpy_rank_promotion("raise")),
        (_arange, lambda: jax.enable_x64(not X64)),
    ],
    ids=[
        "custom_prng",
        "default_prng_impl",
        "debug_key_reuse",
        "legacy_prng_key",
        "strict_promotion",
        "rank_promotion",
        "x64",
    ],
)
@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_setting_that_changes_tracing_is_part_of_the_key(fn, context, wrap):
    results = []

    def check(x):
        results.append(_both(fn, x))
        return x

    wrap(lambda x: check(x))(jnp.ones(3))  # cached in the default context (fresh lambdas: traced each time)
    with context():
        wrap(lambda x: check(x))(jnp.ones(3))
    wrap(lambda x: check(x))(jnp.ones(3))  # and back
    for mine, truth in results:
        assert mine == truth
    assert results[0] != results[1]  # the setting did change the answer
    assert results[0] == results[2]


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_the_explicit_x64_policy_is_part_of_the_key(wrap):
    results = []

    def check(x):
        results.append(_both(_explicit_f64, x))
        return x

    with jax.enable_x64(False):
        for policy in ("error", "allow", "error"):
            with _global("jax_explicit_x64_dtypes", policy):
                wrap(lambda x: check(x))(jnp.ones(3))
    f64 = jax.ShapeDtypeStruct((2,), jnp.float64)
    assert results == [(ValueError, ValueError), (f64, f64), (ValueError, ValueError)]


# -- a property over random (function, context) sequences ------------------------------
_FUNCTIONS = [_raw_key, _split, _reuse, _promote, _rank, _arange, _axis_size_zeros, _psum]


def _run_plain(body):
    body(jnp.ones(3, jnp.float32))


def _run_in(make_context):
    def run(body):
        with make_context():
            body(jnp.ones(3, jnp.float32))

    return run


def _run_vmap(n, name="i"):
    def run(body):
        def row(x):
            body(x)
            return x

        jax.vmap(row, axis_name=name)(jnp.ones((n, 3), jnp.float32))

    return run


def _run_jit(body):
    def traced(x):
        body(x)
        return x

    jax.jit(traced)(jnp.ones(3, jnp.float32))


def _run_shard_map(body):
    def shard(x):
        body(x.reshape(3))
        return x

    mesh = jax.make_mesh((8,), ("i",))
    x = _sharded(mesh, jnp.ones((8, 3), jnp.float32))
    jax.shard_map(shard, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(x)


_CONTEXTS = [
    _run_plain,
    _run_jit,
    _run_in(lambda: jax.enable_custom_prng(True)),
    _run_in(lambda: jax.default_prng_impl("rbg")),
    _run_in(lambda: jax.debug_key_reuse(True)),
    _run_in(lambda: jax.legacy_prng_key("error")),
    _run_in(lambda: jax.numpy_dtype_promotion("strict")),
    _run_in(lambda: jax.numpy_rank_promotion("raise")),
    _run_in(lambda: jax.enable_x64(not X64)),
    _run_vmap(2),
    _run_vmap(3),
    _run_vmap(2, name="j"),
    _run_shard_map,
]


@settings(max_examples=max(50, settings().max_examples // 3))  # each example traces a dozen times
@given(st.lists(st.tuples(st.sampled_from(_FUNCTIONS), st.sampled_from(_CONTEXTS)), min_size=2, max_size=6))
def test_cached_answers_equal_eval_shape_in_every_context(pairs):
    for fn, run in pairs:
        results = []

        def body(x, fn=fn, results=results):
            results.append(_both(fn, x))

        run(body)
        [(mine, truth)] = results
        assert mine == truth, (fn.__name__, mine, truth)


# -- no tracer escapes through an output -------------------------------------------
class _Holder:
    def __init__(self, value):
        self.value = value


class _Slotted:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _gen(x):
    yield x


_ESCAPES = {
    "attribute": lambda x: {"y": x, "aux": _Holder(x)},
    "slots": lambda x: {"y": x, "aux": _Slotted(x)},
    "closure": lambda x: {"y": x, "aux": lambda: x},
    "generator": lambda x: {"y": x, "aux": _gen(x)},
    "nested": lambda x: {"y": x, "aux": _Holder([1, {"deep": _Holder(x)}])},
}


@pytest.mark.filterwarnings("ignore:Python iterable type 'generator' is treated as a leaf:DeprecationWarning")
@pytest.mark.parametrize("name", list(_ESCAPES))
@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_a_static_output_holding_a_tracer_raises(name, wrap):
    fn = _ESCAPES[name]
    with pytest.raises(TypeError):  # the reference behaviour
        jax.eval_shape(fn, jnp.ones(2))

    def call(x):
        with pytest.raises(TypeError, match=r"the output leaf \['aux'\] holds a JAX tracer"):
            ts.out_structure(fn, x)
        return x

    wrap(call)(jnp.ones(2))
    wrap(call)(jnp.ones(2))  # never cached: raises again
    assert ts.cache_info().size == 0


def test_a_static_output_without_tracers_still_works():
    holder = _Holder(np.arange(3))
    s = ts.out_structure(lambda x: {"y": x, "aux": holder, "fn": jnp.sin}, jnp.ones(2))
    assert s.tree["aux"] is holder and s.tree["fn"] is jnp.sin


def test_a_node_whose_static_data_closes_over_a_tracer_raises():
    def fn(x):
        return jax.tree_util.Partial(lambda: x)

    with pytest.raises(TypeError, match="static data of the output node Partial"):
        ts.out_structure(fn, jnp.ones(2))


# -- what the cache keeps alive -------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Cfg:
    act: object
    width: int = 4


class _SlottedCallable:
    __slots__ = ("payload",)

    def __init__(self):
        self.payload = np.zeros(1000)

    def __call__(self, x):
        return x * 2


def _alive(refs):
    gc.collect()
    return sum(r() is not None for r in refs)


def test_closures_in_frozen_configs_and_slotted_callables_are_not_kept_alive():
    refs = []
    for i in range(50):
        payload = np.full(100, i)
        act = lambda y, payload=payload: y * payload[0]  # noqa: B023 - a distinct closure each time
        cfg = _Cfg(act)
        refs += [weakref.ref(act), weakref.ref(cfg), weakref.ref(payload)]
        s = ts.out_structure(lambda x, c: c.act(x) + c.width, jnp.ones(2, jnp.float32), cfg)
        assert s.tree.shape == (2,)
    for _ in range(50):
        fn = _SlottedCallable()
        refs.append(weakref.ref(fn.payload))
        assert ts.out_structure(fn, jnp.ones(2)).tree.shape == (2,)
    del act, cfg, payload, fn
    assert _alive(refs) == 0
    assert ts.cache_info().size == 0


def test_frozen_configs_of_plain_values_are_compared_by_value():
    f = lambda x, c: jnp.zeros((c.width,)) + x.sum()
    for width in (3, 3, 5, 3):
        assert ts.out_structure(f, jnp.ones(2), _Cfg("relu", width)).tree.shape == (width,)
    info = ts.cache_info()
    assert (info.hits, info.misses, info.size) == (2, 2, 2)


def test_static_values_are_keyed_by_type_and_value():
    f = lambda x, v: jnp.zeros(2, jnp.int32 if type(v.act) is int else jnp.float32)
    seen = [ts.out_structure(f, jnp.ones(2), _Cfg(v)).tree.dtype for v in (1, True, 1.0, 0.0, -0.0, 1)]
    assert seen == [jnp.int32, jnp.float32, jnp.float32, jnp.float32, jnp.float32, jnp.int32]
    assert ts.cache_info().hits == 1  # only the repeated `1`


# -- odd equality ---------------------------------------------------------------
class _BadHash:
    def __init__(self, exc):
        self.exc = exc

    def __hash__(self):
        raise self.exc

    def __eq__(self, other):
        raise self.exc


class _ArrayEq:
    def __hash__(self):
        return 0

    def __eq__(self, other):
        return np.array([True, False])


@pytest.mark.parametrize("static", [_BadHash(ValueError("no")), _BadHash(RuntimeError("no")), _ArrayEq()])
def test_static_values_with_odd_hash_or_eq_are_passed_through(static):
    f = lambda x, s: x * 2
    for _ in range(2):
        assert ts.out_structure(f, jnp.ones(2, jnp.float32), static).tree == jax.ShapeDtypeStruct((2,), jnp.float32)
    assert ts.out_structure(ft.partial(f, s=static), jnp.ones(2)).tree.shape == (2,)
    assert ts.out_structure(lambda x: {"y": x, "s": static}, jnp.ones(2)).tree["s"] is static


class _BadHashCallable:
    def __hash__(self):
        raise ValueError("no")

    def __call__(self, x):
        return x + 1


def test_a_callable_whose_hash_raises_works():
    fn = _BadHashCallable()
    assert ts.out_structure(fn, jnp.ones(2)).tree == jax.eval_shape(ft.partial(fn), jnp.ones(2))
    assert ts.out_structure(fn, jnp.ones(2)).tree.shape == (2,)
    assert ts.cache_info().hits == 1


def test_static_numpy_arrays_compare_by_contents():
    tree = {"labels": np.array(["cat", "dog"]), "w": jnp.zeros(2)}
    s = ts.structure_of(tree)
    s.check({"labels": np.array(["cat", "dog"]), "w": jnp.ones(2)})
    assert s == ts.structure_of({"labels": np.array(["cat", "dog"]), "w": jnp.ones(2)})
    assert hash(s) == hash(ts.structure_of(tree))
    assert len({s, ts.structure_of(tree)}) == 1
    other = ts.structure_of({"labels": np.array(["cat", "cow"]), "w": jnp.zeros(2)})
    assert s != other
    [m] = s.diff(other)
    assert (m.kind, "cow" in str(m)) == ("structure", True)
    objects = ts.structure_of([np.array([{"a": 1}, None], dtype=object)])
    assert objects == ts.structure_of([np.array([{"a": 1}, None], dtype=object)])
    assert objects != ts.structure_of([np.array([{"a": 2}, None], dtype=object)])
    hash(objects)


# -- parity ---------------------------------------------------------------------
def test_jit_out_shardings_are_reported_as_eval_shape_does():
    mesh = jax.make_mesh((8,), ("d",))
    sharding = jax.NamedSharding(mesh, P("d"))
    f = jax.jit(lambda x: x * 2, out_shardings=sharding)
    for _ in range(2):
        s = ts.out_structure(f, jnp.ones(8))
        assert s.tree == jax.eval_shape(f, jnp.ones(8))
        assert s.leaves[0].sharding == sharding
    assert s.zeros().sharding == sharding


class _Duck:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)


def test_array_numpy_shapedtypestruct_and_duck_inputs_share_an_entry():
    n = 0

    def f(w, x):
        nonlocal n
        n += 1
        return w * x

    inputs = [
        jnp.ones(3, jnp.float32),
        np.ones(3, np.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
        _Duck((3,), "float32"),
    ]
    for x in inputs:
        assert ts.out_structure(f, x, x).tree == jax.ShapeDtypeStruct((3,), jnp.float32)
    for w in inputs:  # a fresh partial binding each kind of input
        assert ts.out_structure(ft.partial(f, w), jnp.ones(3, jnp.float32)).tree.shape == (3,)
    assert n == 2  # one entry for direct arguments, one for a bound argument
    assert ts.cache_info().size == 2


# -- purity -----------------------------------------------------------------------
def test_a_function_reading_mutable_state_needs_clear_cache():
    state = {"width": 2}
    f = lambda x: jnp.zeros(state["width"]) + x.sum()
    assert ts.out_structure(f, jnp.ones(3)).tree.shape == (2,)
    state["width"] = 5
    assert ts.out_structure(f, jnp.ones(3)).tree.shape == (2,)  # answered by input, as documented
    ts.clear_cache()
    assert ts.out_structure(f, jnp.ones(3)).tree.shape == (5,)
