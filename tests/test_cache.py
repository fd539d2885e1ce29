"""The `out_structure` cache: hits without retracing, bounded, thread-safe, leak-free (memory
stays flat over thousands of distinct functions)."""

import concurrent.futures
import dataclasses
import functools as ft
import gc
import pickle
import resource
import threading
import types
import weakref

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax import lax

import treeshape as ts
from treeshape import _cache, _compat


# The dtypes JAX gives Python scalars: 64-bit under `jax_enable_x64`, 32-bit otherwise.
INT = jax.dtypes.canonicalize_dtype(jnp.int64)
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)


def _counted():
    """A fresh function `f(w, x, *, scale=1.0)` and a getter for how often it was traced."""
    n = 0

    def f(w, x, *, scale=1.0):
        nonlocal n
        n += 1
        return {"y": w * x * scale, "n": x.ndim}

    return f, lambda: n


def test_repeated_call_is_a_hit():
    f, traces = _counted()
    for x in [
        jnp.ones(3, jnp.float32),
        jnp.zeros(3, jnp.float32),
        np.ones(3, np.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
    ]:
        s = ts.out_structure(f, x, x)
        assert s.tree["y"] == jax.ShapeDtypeStruct((3,), jnp.float32)
    assert traces() == 1  # an array, a NumPy array and a ShapeDtypeStruct of one type are one input
    info = ts.cache_info()
    assert (info.hits, info.misses) == (3, 1)
    # Another abstract input is another entry.
    ts.out_structure(f, jnp.ones(4), jnp.ones(4))
    ts.out_structure(f, jnp.ones(3, jnp.bfloat16), jnp.ones(3, jnp.bfloat16))
    ts.out_structure(f, 1.0, 2.0)
    ts.out_structure(f, 1.0, 2)
    assert traces() == 5


def test_fresh_functools_partial_hits():
    f, traces = _counted()
    results = [ts.out_structure(ft.partial(f, jnp.ones(3), scale=2.0), jnp.full(3, i)) for i in range(5)]
    assert traces() == 1
    assert all(s == results[0] for s in results)
    assert ts.cache_info().hits == 4


def test_fresh_tree_util_partial_hits():
    f, traces = _counted()
    for i in range(5):
        ts.out_structure(jtu.Partial(f, jnp.full(3, i), scale=0.5), jnp.ones(3))
    assert traces() == 1


def test_partial_bound_python_values_are_concrete_and_compared_by_equality():
    seen = []

    def f(n, x):
        seen.append(n)
        assert type(n) is int  # concrete, as jax.eval_shape passes a partial's values
        return jnp.zeros((n,) + x.shape)

    assert ts.out_structure(ft.partial(f, 2), jnp.ones(3)).tree.shape == (2, 3)
    assert ts.out_structure(ft.partial(f, 2), jnp.ones(3)).tree.shape == (2, 3)
    assert ts.out_structure(jtu.Partial(f, 5), jnp.ones(3)).tree.shape == (5, 3)
    assert seen == [2, 5]
    # 2 == 2.0, but a float is another value: a separate entry (int32 times a Python float: the default float).
    assert ts.out_structure(ft.partial(lambda n, x: x * n, 2.0), jnp.ones(3, jnp.int32)).tree.dtype == FLOAT


def test_fresh_partials_inside_jit_hit_across_traces():
    f, traces = _counted()

    def step(w, x):
        out = []
        for _ in range(3):
            s = ts.out_structure(jtu.Partial(f, w, scale=2.0), x)  # holds the tracer `w`
            out.append(s.zeros()["y"])
            s = ts.out_structure(ft.partial(f, w), x)
            out.append(s.zeros()["y"])
        return out

    jax.make_jaxpr(step)(jnp.ones(3), jnp.ones(3))
    jax.make_jaxpr(step)(jnp.zeros(3), jnp.zeros(3))  # a new trace, new tracers, same avals
    out = jax.jit(step)(jnp.ones(3), jnp.ones(3))
    assert traces() == 2  # one per distinct bound keyword set
    assert all(o.shape == (3,) for o in out)


def test_fresh_bound_methods_and_callable_pytrees_hit():
    n = 0

    @jtu.register_dataclass
    @dataclasses.dataclass
    class Model:
        w: jax.Array
        depth: int = dataclasses.field(metadata={"static": True})

        def apply(self, x):
            nonlocal n
            n += 1
            return self.w @ x

        def __call__(self, x):
            return self.apply(x)

    for i in range(3):
        model = Model(jnp.full((2, 3), i), depth=4)
        assert ts.out_structure(model.apply, jnp.ones(3)).tree.shape == (2,)
        assert ts.out_structure(model, jnp.ones(3)).tree.shape == (2,)
    assert n == 2
    ts.out_structure(Model(jnp.ones((2, 3)), depth=5).apply, jnp.ones(3))  # static field differs
    assert n == 3


def test_jitted_function_hits():
    f, traces = _counted()
    jf = jax.jit(f)
    for _ in range(3):
        ts.out_structure(jf, jnp.ones(2), jnp.ones(2))
    assert traces() == 1


def test_cache_info_and_clear_cache():
    info = ts.cache_info()
    assert info == (0, 0, 0, 4096)
    assert info._fields == ("hits", "misses", "size", "maxsize")
    f = lambda x: x + 1
    ts.out_structure(f, jnp.ones(2))
    ts.out_structure(f, jnp.ones(2))
    ts.out_structure(f, jnp.ones(3))
    assert ts.cache_info() == (1, 2, 2, 4096)
    ts.clear_cache()
    assert ts.cache_info() == (0, 0, 0, 4096)


def test_context_settings_are_part_of_the_key():
    f = lambda x, y: x + y
    assert ts.out_structure(f, jnp.ones(2, jnp.float32), 1).tree.dtype == jnp.float32
    ident = lambda x: x
    assert ts.out_structure(ident, 1).tree.dtype == INT  # the suite's own mode first
    with jax.enable_x64(True):
        assert ts.out_structure(lambda x: x, 1).tree.dtype == jnp.int64
        assert ts.out_structure(ident, 1).tree.dtype == jnp.int64
    with jax.enable_x64(False):
        assert ts.out_structure(lambda x: x, 1).tree.dtype == jnp.int32
        assert ts.out_structure(ident, 1).tree.dtype == jnp.int32
    assert ts.out_structure(ident, 1).tree.dtype == INT

    mixed = (jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float16))
    assert ts.out_structure(f, *mixed).tree.dtype == jnp.float32
    with jax.numpy_dtype_promotion("strict"), pytest.raises(_compat.TypePromotionError, match="strict"):
        ts.out_structure(f, *mixed)  # not the cached standard-mode answer

    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    make = lambda: jnp.zeros(8, out_sharding=jax.P("i") if not jax.sharding.get_abstract_mesh().empty else None)
    assert ts.out_structure(make).tree.sharding is None
    with jax.set_mesh(mesh):
        assert ts.out_structure(make).tree.sharding.mesh == mesh.abstract_mesh

    key = lambda: jax.random.key(0)
    assert str(ts.out_structure(key).tree.dtype) == "key<fry>"
    with jax.default_prng_impl("rbg"):
        assert str(ts.out_structure(key).tree.dtype) == "key<rbg>"


class _Config:
    """Compared by value, not hashable."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, width):
        self.width = width

    def __eq__(self, other):
        return isinstance(other, _Config) and other.width == self.width


def test_mutable_static_values_are_keyed_by_their_current_state():
    f, traces = _counted()

    def g(x, cfg):
        f(x, x)
        return jnp.zeros((cfg.width,) + x.shape)

    for width in [2, 2, 3]:  # unhashable, compared by their attributes: the second 2 is a hit
        assert ts.out_structure(g, jnp.ones(4), _Config(width)).tree.shape == (width, 4)
    assert traces() == 2
    cfg = _Config(5)
    assert ts.out_structure(ft.partial(g, cfg=cfg), jnp.ones(4)).tree.shape == (5, 4)
    cfg.width = 6  # mutated in place: the next call answers for its state now
    assert ts.out_structure(ft.partial(g, cfg=cfg), jnp.ones(4)).tree.shape == (6, 4)
    assert traces() == 4
    items = {1, 2}
    bound_set = ft.partial(lambda s, x: x * len(s), items)  # a set is an unhashable leaf
    assert ts.out_structure(bound_set, jnp.ones(2)).tree.shape == (2,)
    ts.out_structure(bound_set, jnp.ones(2))  # the same contents: a hit
    info = ts.cache_info()
    assert (info.hits, info.misses, info.size) == (2, 5, 5)
    del bound_set
    gc.collect()
    assert ts.cache_info().size == 4  # the lambda died, and its entry with it
    del g
    gc.collect()
    assert ts.cache_info().size == 0


def test_mutable_static_values_whose_state_is_not_plain_bypass_the_cache():
    f, traces = _counted()

    def g(x, cfg):
        f(x, x)
        return jnp.zeros((cfg.width,) + x.shape)

    cfg = _Config(2)
    cfg.act = lambda v: v  # a local function attribute: the state cannot be keyed by value
    for _ in range(2):
        assert ts.out_structure(g, jnp.ones(4), cfg).tree.shape == (2, 4)
    cfg.width = 3
    assert ts.out_structure(g, jnp.ones(4), cfg).tree.shape == (3, 4)
    assert traces() == 3
    assert ts.cache_info().size == 0


# -- lifetimes: the cache keeps nothing alive -----------------------------------------
def _collected(ref):
    gc.collect()
    return ref() is None


@pytest.mark.parametrize("wrap", ["function", "functools.partial", "tree_util.Partial", "jitted"])
def test_deleted_function_is_collected(wrap):
    def f(x, y=1.0):
        return x * y

    ref = weakref.ref(f)
    fn = {"function": f, "functools.partial": ft.partial(f, y=2.0), "tree_util.Partial": jtu.Partial(f, y=3.0)}.get(
        wrap
    ) or jax.jit(f)
    assert ts.out_structure(fn, jnp.ones(2)).tree.shape == (2,)
    assert ts.cache_info().size == 1
    del f, fn
    assert _collected(ref)
    assert ts.cache_info().size == 0  # and its entry is gone


def test_function_passed_as_static_argument_is_collected():
    def act(x):
        return jnp.tanh(x)

    class Net:  # a local class: its objects are keyed by their state, the class by weak reference
        def apply(self, x):
            return x * 2

    net, jitted = Net(), jax.jit(act)
    refs = [weakref.ref(act), weakref.ref(net), weakref.ref(jitted)]
    apply = lambda x, fs, obj: {"y": fs[0](x) + fs[1](x) + obj.apply(x)}
    for _ in range(2):
        assert ts.out_structure(apply, jnp.ones(2), [act, jitted], net).tree["y"].shape == (2,)
        ts.out_structure(net.apply, jnp.ones(2))  # a bound method of a plain object: `self` is static
    assert ts.cache_info() == (2, 2, 2, 4096)
    del act, jitted, net
    assert all(_collected(r) for r in refs)
    assert ts.cache_info().size == 1  # the entry of `apply` is gone; `net.apply`'s lives with the class
    net_class = weakref.ref(Net)
    del Net
    assert _collected(net_class)
    assert ts.cache_info().size == 0


def test_static_function_in_the_output_is_not_kept_alive():
    def act(x):
        return jnp.tanh(x)

    ref = weakref.ref(act)
    returns_fn = lambda x, f: {"y": f(x), "f": f}
    returns_partial = lambda x, f: {"y": f(x), "p": jtu.Partial(f)}  # `f` in the output's treedef
    for _ in range(2):
        assert ts.out_structure(returns_fn, jnp.ones(2), act).tree["f"] is act
        assert ts.out_structure(returns_partial, jnp.ones(2), act).tree["p"].func is act
    # Such results are not cached: the entry would keep `act` alive.
    assert ts.cache_info().size == 0
    assert ts.out_structure(returns_fn, jnp.ones(2), jnp.tanh).tree["f"] is jnp.tanh  # importable: cached
    assert ts.cache_info().size == 1
    del act
    assert _collected(ref)


def test_function_inside_an_argument_treedef_is_not_kept_alive():
    def act(x):
        return jnp.tanh(x)

    ref = weakref.ref(act)
    call = lambda x, p: p(x)
    for _ in range(2):  # a Partial argument: `act` is node data of the call's treedef
        assert ts.out_structure(call, jnp.ones(2), jtu.Partial(act)).tree.shape == (2,)
    assert ts.cache_info().size == 0
    ts.out_structure(call, jnp.ones(2), jtu.Partial(jnp.tanh))
    ts.out_structure(call, jnp.ones(2), jtu.Partial(jnp.tanh))
    assert ts.cache_info() == (1, 3, 1, 4096)
    del act
    assert _collected(ref)


def test_equinox_failure_mode_closure_does_not_keep_function_alive():
    """A cached wrapper closing over the user's function would keep it (and its closure) alive."""

    def make_model():
        big = jnp.ones((256, 256))

        def model(x):
            return big @ x

        return model, weakref.ref(big)

    model, big_ref = make_model()
    model_ref = weakref.ref(model)
    for _ in range(2):
        ts.out_structure(model, jnp.ones(256))
        ts.out_structure(ft.partial(model), jnp.ones(256))
    del model
    assert _collected(model_ref) and _collected(big_ref)


# -- no tracers ----------------------------------------------------------------------
def _reachable(root, depth=8):
    """Everything reachable from `root` through `gc.get_referents` (modules and types excluded)."""
    seen = {id(root): root}
    frontier = [root]
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) in seen or isinstance(ref, (types.ModuleType, type)):
                    continue
                seen[id(ref)] = ref
                nxt.append(ref)
        frontier = nxt
    return list(seen.values())


def test_cache_holds_no_tracer_jax_24818():
    """JAX removed a cache that leaked tracers (jax#24818): ours must hold none."""

    def f(a, b, *, c):
        return {"h": a @ b + c, "static": "ok"}

    @jax.jit
    def step(a, b):
        closure = lambda x: f(x, b, c=a.sum())
        s1 = ts.out_structure(jtu.Partial(f, b=b, c=a[0, 0]), a)
        s2 = ts.out_structure(ft.partial(f, c=b.sum()), a, b)
        s3 = ts.out_structure(closure, a)
        s4 = ts.structure_of({"a": a, "b": b})
        return s1.zeros()["h"] + s2.zeros()["h"] + s3.zeros()["h"] + s4.zeros()["a"] @ b

    with jax.check_tracer_leaks(True):
        out = step(jnp.ones((2, 3)), jnp.ones((3, 2)))
    assert out.shape == (2, 2)
    assert ts.cache_info().size >= 2  # s1, s2 (structure_of reads its tree and caches nothing)
    gc.collect()
    reachable = _reachable(_cache.CACHE)
    assert len(reachable) > 10  # the walk did look inside the entries
    assert not [x for x in reachable if isinstance(x, jax.core.Tracer)]


# -- bound and threads ---------------------------------------------------------
@pytest.fixture
def small_cache():
    old = _cache.set_cache_maxsize(3)
    yield
    _cache.set_cache_maxsize(old)


def test_lru_bound_holds(small_cache):
    fns = [_counted() for _ in range(5)]
    x = jnp.ones(2)
    for f, _ in fns:
        ts.out_structure(f, x, x)
    assert ts.cache_info().size == 3
    assert ts.cache_info().maxsize == 3
    ts.out_structure(fns[2][0], x, x)  # refresh 2: LRU order is now 3, 4, 2
    ts.out_structure(fns[0][0], x, x)  # miss, evicts 3
    assert [t() for _, t in fns] == [2, 1, 1, 1, 1]
    ts.out_structure(fns[4][0], x, x)
    ts.out_structure(fns[2][0], x, x)
    ts.out_structure(fns[3][0], x, x)  # evicted: traced again
    assert [t() for _, t in fns] == [2, 1, 1, 2, 1]
    assert ts.cache_info().size == 3


def test_a_call_repeated_or_alternating_hits_and_an_evicted_one_traces_again(small_cache):
    f, traces = _counted()
    a, b = jnp.ones(2), jnp.ones(3)
    for x in (a, a, b, a, b, b):  # the latest entry again, and calls alternating between two entries
        assert ts.out_structure(f, x, x).tree["y"] == jax.ShapeDtypeStruct(x.shape, x.dtype)
    assert traces() == 2
    assert ts.cache_info()[:3] == (4, 2, 2)
    _cache.set_cache_maxsize(0)  # every entry evicted, the latest one found too
    _cache.set_cache_maxsize(3)
    assert ts.out_structure(f, b, b).tree["y"] == jax.ShapeDtypeStruct((3,), b.dtype)
    assert traces() == 3
    assert ts.cache_info()[:3] == (4, 3, 1)


def test_set_cache_maxsize_rejects_bad_sizes():
    with pytest.raises(ValueError, match="maxsize"):
        _cache.set_cache_maxsize(-1)
    assert ts.cache_info().maxsize == 4096


def test_threads_get_correct_results():
    f, traces = _counted()
    shapes = [(i,) for i in range(1, 9)]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(t):
        try:
            barrier.wait()
            for r in range(40):
                shape = shapes[(t + r) % 8]
                w = jnp.ones(shape, jnp.bfloat16) if r % 2 else jax.ShapeDtypeStruct(shape, jnp.bfloat16)
                s = ts.out_structure(jtu.Partial(f, w, scale=2.0), jax.ShapeDtypeStruct(shape, jnp.float32))
                assert s.tree == {
                    "y": jax.ShapeDtypeStruct(shape, jnp.float32),
                    "n": jax.ShapeDtypeStruct((), INT, weak_type=True),  # x.ndim, a Python int
                }
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    info = ts.cache_info()
    assert info.hits + info.misses == 8 * 40
    assert info.size == 8  # 8 shapes; an array and a ShapeDtypeStruct bound leaf are one input
    assert 8 <= traces() <= info.misses


@dataclasses.dataclass
class _MutableConfig:  # a plain, not frozen, dataclass: what users pass as a config
    width: int = 2
    act: str = "relu"


@pytest.mark.parametrize("how", ["argument", "partial", "tree_util.Partial"])
def test_a_mutated_config_gives_the_answer_for_its_state_now(how):
    def f(cfg, x):
        return {"h": jnp.zeros(cfg.width) + x, "act": cfg.act}

    def infer(cfg, x):
        if how == "argument":
            return ts.out_structure(f, cfg, x)
        wrap = ft.partial if how == "partial" else jtu.Partial
        return ts.out_structure(wrap(f, cfg), x)

    cfg = _MutableConfig()

    def step(x):  # and under jit, where the partial is rebuilt on every trace
        return infer(cfg, x).zeros()["h"]

    for width in [2, 9, 9, 3]:
        cfg.width = width
        oracle = jax.eval_shape(lambda x: f(cfg, x)["h"], 1.0)
        assert infer(cfg, 1.0).tree["h"] == oracle
        assert infer(cfg, 1.0).tree["h"].shape == (width,)
        fresh = lambda x: step(x)  # noqa: B023 (jax.jit's own cache is keyed by the function)
        assert jax.jit(fresh).trace(jnp.float32(1.0)).out_info.shape == (width,)
    cfg.act = "gelu"
    assert infer(cfg, 1.0).tree["act"] == "gelu"


class _Scaler:
    def __init__(self, w):
        self.w = w


def test_objects_holding_arrays_bypass_the_cache():
    use = lambda x, s: x @ s.w  # noqa: E731
    assert ts.out_structure(use, jnp.ones(2), _Scaler(jnp.ones((2, 3)))).tree.shape == (3,)
    assert ts.out_structure(use, jnp.ones(2), _Scaler(jnp.ones((2, 5)))).tree.shape == (5,)
    scaler = _Scaler(np.ones((2, 4), np.float32))  # a small NumPy array: keyed by its contents
    assert ts.out_structure(use, jnp.ones(2), scaler).tree.shape == (4,)
    scaler.w = np.ones((2, 6), np.float32)
    assert ts.out_structure(ft.partial(use, s=scaler), jnp.ones(2)).tree.shape == (6,)
    assert ts.out_structure(use, jnp.ones(2), scaler).tree.shape == (6,)


class _Layer:
    def __init__(self, n):
        self.n = n

    def __call__(self, x):
        return jnp.zeros(self.n) + x


def test_a_callable_object_is_keyed_by_its_state():
    layer = _Layer(2)
    apply = lambda x, f: f(x)  # noqa: E731
    for n in [2, 5, 5]:
        layer.n = n
        assert ts.out_structure(apply, 1.0, layer).tree.shape == (n,)  # as a static argument
        assert ts.out_structure(layer, 1.0).tree.shape == (n,)  # as fn itself
    assert ts.cache_info().hits == 2
    assert ts.out_structure(ft.partial(apply, f=_Layer(7)), 1.0).tree.shape == (7,)


def test_cache_info_counts_the_cost_cache_too():
    ts.clear_cache()
    f = lambda x: x * 2
    ts.out_structure(f, jnp.ones(2))
    ts.cost(f, jnp.ones(2))
    ts.cost(f, jnp.zeros(2))  # the same abstract input: compiled once
    ts.cost(ft.partial(f), jnp.ones(3))
    info = ts.cache_info()
    assert info == (0, 1, 1, 4096)  # the four fields are out_structure's, as before
    hits, misses, size, maxsize = info
    assert (hits, misses, size, maxsize) == (0, 1, 1, 4096)
    assert (info.cost_hits, info.cost_misses, info.cost_size) == (1, 2, 2)
    assert repr(info) == ("CacheInfo(hits=0, misses=1, size=1, maxsize=4096, cost_hits=1, cost_misses=2, cost_size=2)")
    assert info == ts.CacheInfo(0, 1, 1, 4096, cost_hits=1, cost_misses=2, cost_size=2)
    assert info != ts.CacheInfo(0, 1, 1, 4096) and hash(info) == hash((0, 1, 1, 4096))
    assert pickle.loads(pickle.dumps(info)) == info
    with pytest.raises(AttributeError, match="immutable"):
        info.cost_hits = 5
    (b,) = jax.export.symbolic_shape("b")
    fit = ts.largest_fit(f, jax.ShapeDtypeStruct((b, 8), jnp.float32), dim="b", budget=2**12)
    assert ts.cache_info().cost_misses == 2 + fit.compiles  # largest_fit compiles through the same cache
    ts.clear_cache()
    assert ts.cache_info() == ts.CacheInfo(0, 0, 0, 4096, 0, 0, 0)


def test_cache_info_under_jit():
    ts.clear_cache()

    def step(x):
        ts.cost(jnp.sin, x)
        ts.cost(jnp.sin, x)
        return x

    jax.jit(step)(jnp.ones(3))
    info = ts.cache_info()
    assert (info.cost_hits, info.cost_misses, info.cost_size) == (1, 1, 1)


# -- threads and memory ----------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::treeshape.PrecisionWarning")  # bfloat16 sums of zeros are intended
def test_threads_share_the_cache_and_carries_correctly():
    def work(i):
        n = i % 5 + 1
        x = jnp.zeros((n, 3), jnp.bfloat16 if i % 2 else jnp.float32)
        s = ts.out_structure(lambda a: {"y": a @ jnp.ones((3, 2), a.dtype)}, x)
        assert s.leaves[0].shape == (n, 2) and s.leaves[0].dtype == x.dtype
        body = lambda c, xi: (c + xi.sum(), None)
        carry = ts.scan_carry(body, 0.0, x, policy="weak")
        assert jax.typeof(carry).dtype == x.dtype
        if i % 7 == 0:
            ts.clear_cache()
        return float(lax.scan(body, carry, x)[0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(200)))
    assert results == [0.0] * 200
    info = ts.cache_info()
    assert info.size <= info.maxsize


def _peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_many_distinct_functions_keep_the_cache_bounded_and_memory_flat():
    # Each call traces a fresh closure: the cache must stay at its bound, and the
    # closures (and what they hold) must be freed.
    big = jnp.zeros((256, 256))

    def make(i):
        payload = big + i  # a 256 KiB array each closure keeps alive
        return lambda x: x + payload[0, 0]

    def run(n):
        for i in range(n):
            ts.out_structure(make(i), jnp.ones(2))
        gc.collect()

    # The leak checker walks the heap on every trace: too slow for 3,000 traces,
    # and no transformation is involved here.
    with jax.check_tracer_leaks(False):
        run(300)
        before = _peak_rss_mib()
        run(3000)  # ~750 MiB of payloads if anything kept them
    grown = _peak_rss_mib() - before
    assert ts.cache_info().size <= 300 + 3000
    assert grown < 150, f"peak RSS grew by {grown:.0f} MiB"
