"""`ts.cost` against XLA's own analysis of `jax.jit(f).lower(...).compile()` (the oracle):
at top level, under jit / vmap / grad / scan, with sharded inputs, donation, Structures
and static values; its cache (counted in backend compilations) and its errors."""

import functools as ft
import gc
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._cache import set_cache_maxsize


F32 = jnp.float32


def oracle(f, *args, **jit_options):
    """The figures XLA reports for `jax.jit(f, **jit_options)` on these arguments."""
    compiled = jax.jit(f, **jit_options).lower(*args).compile()
    memory, analysis = compiled.memory_analysis(), compiled.cost_analysis()
    return {
        "flops": analysis.get("flops"),  # absent for a program of transcendentals only
        "bytes_accessed": analysis["bytes accessed"],
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
    }


def figures(c):
    keys = ("flops", "bytes_accessed", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes")
    return {k: getattr(c, k) for k in keys}


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"]) ** 2)


PARAMS = {
    "w1": jax.ShapeDtypeStruct((64, 128), F32),
    "b1": jax.ShapeDtypeStruct((128,), F32),
    "w2": jax.ShapeDtypeStruct((128, 16), F32),
}
X = jax.ShapeDtypeStruct((32, 64), F32)


# -- top level ------------------------------------------------------------------
def test_top_level_equals_xlas_own_analysis():
    grad_step = jax.value_and_grad(mlp)
    c = ts.cost(grad_step, PARAMS, X)
    assert figures(c) == oracle(grad_step, PARAMS, X)
    assert c.argument_bytes == (64 * 128 + 128 + 128 * 16 + 32 * 64) * 4
    assert c.peak_bytes == c.argument_bytes + c.output_bytes + c.temp_bytes - c.alias_bytes
    assert c.flops > 2 * 32 * 64 * 128  # at least the first matmul
    assert c.device_bytes is None  # the CPU reports no memory limit


def test_arrays_numpy_and_shape_dtype_structs_are_the_same_input():
    x = np.zeros((32, 64), np.float32)
    a = ts.cost(mlp, PARAMS, X)
    assert ts.cost(mlp, PARAMS, x) == a
    assert ts.cost(mlp, jtu.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS), jnp.asarray(x)) == a


def test_python_scalars_are_abstract_weak_inputs():
    def f(x, scale):
        return x * scale

    c = ts.cost(f, X, 0.5)
    assert figures(c) == oracle(f, X, 0.5)
    assert c.argument_bytes == 32 * 64 * 4 + ts.structure_of(0.5).nbytes  # an argument, not a constant


def test_static_strings_are_passed_unchanged():
    def f(x, activation):
        return getattr(jnp, activation)(x)

    c = ts.cost(f, X, "tanh")
    assert figures(c) == oracle(ft.partial(f, activation="tanh"), X)
    with pytest.raises(TypeError):  # what `jax.jit(...).lower` alone says to a string argument
        jax.jit(f).lower(X, "tanh")
    assert ts.cost(f, X, activation="sin").argument_bytes == 32 * 64 * 4


def test_structures_stand_for_their_trees():
    params = ts.out_structure(lambda: jtu.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS))
    c = ts.cost(mlp, params, ts.structure_of(X))
    assert c == ts.cost(mlp, params.tree, X)
    assert figures(c) == oracle(mlp, PARAMS, X)
    assert c.argument_bytes == params.nbytes + 32 * 64 * 4
    nested = ts.cost(lambda t: mlp(t["p"], t["x"]), {"p": params, "x": X})
    assert nested.argument_bytes == c.argument_bytes


def test_bound_arrays_are_arguments_and_closed_over_arrays_constants():
    w = jnp.ones((256, 256), F32)
    x = jax.ShapeDtypeStruct((256, 8), F32)
    bound = ts.cost(ft.partial(jnp.matmul, w), x)
    assert bound.argument_bytes == (256 * 256 + 8 * 256) * 4
    assert figures(bound) == oracle(jnp.matmul, w, x)
    assert ts.cost(jtu.Partial(jnp.matmul, w), x) == bound

    def closure(x):
        return x @ w

    closed = ts.cost(closure, jax.ShapeDtypeStruct((8, 256), F32))
    assert figures(closed) == oracle(closure, jax.ShapeDtypeStruct((8, 256), F32))
    assert closed.argument_bytes == 8 * 256 * 4


def test_bound_arrays_needed_as_values_are_constants():
    def f(n, x):
        return jnp.zeros(int(n), F32) + x.sum()

    c = ts.cost(ft.partial(f, np.int32(5)), X)
    assert c.output_bytes == 5 * 4
    assert c.argument_bytes == 32 * 64 * 4


def test_a_jitted_function_keeps_its_static_arguments():
    f = jax.jit(lambda x, n: jnp.tile(x, n), static_argnums=1)
    c = ts.cost(f, X, 3)
    assert c.output_bytes == 3 * 32 * 64 * 4
    assert c.argument_bytes == 32 * 64 * 4


# -- under transformations --------------------------------------------------------
def _inside(step):
    """Costs of functions closing over the tracer `t` (and a Partial holding it), taken in `step`."""
    found = []

    def body(t):
        found.append(ts.cost(lambda a: a * t + jnp.sum(t), jax.ShapeDtypeStruct(t.shape, F32)))
        found.append(ts.cost(jtu.Partial(lambda t, a: a @ t, t), jax.ShapeDtypeStruct((2, *t.shape), F32)))
        return t

    step(body)
    return found


def _expected(per_example):
    t = jax.ShapeDtypeStruct(per_example, F32)
    return [
        oracle(lambda a, t: a * t + jnp.sum(t), jax.ShapeDtypeStruct(per_example, F32), t),
        oracle(lambda t, a: a @ t, t, jax.ShapeDtypeStruct((2, *per_example), F32)),
    ]


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(lambda body: jax.jit(body)(jnp.ones(3, F32)), id="jit"),
        pytest.param(lambda body: jax.grad(lambda y: body(y).sum())(jnp.ones(3, F32)), id="grad"),
        pytest.param(lambda body: jax.lax.scan(lambda c, _: (body(c), None), jnp.ones(3, F32), length=2), id="scan"),
        pytest.param(lambda body: jax.lax.fori_loop(0, 2, lambda i, c: body(c), jnp.ones(3, F32)), id="fori"),
    ],
)
def test_closed_over_tracers_are_arguments(step):
    found = _inside(step)
    assert [figures(c) for c in found[:2]] == _expected((3,))


def test_under_vmap_the_figures_are_the_per_example_programs():
    found = _inside(lambda body: jax.vmap(body)(jnp.ones((16, 3), F32)))
    assert [figures(c) for c in found] == _expected((3,))
    assert found[0].argument_bytes == 2 * 3 * 4


def test_an_integer_tracer_closed_over_under_jit_is_an_argument():
    found = []

    @jax.jit
    def step(x, n):
        found.append(ts.cost(lambda a: a * n, jax.ShapeDtypeStruct((100,), F32)))
        return x

    step(jnp.ones(3), jnp.arange(100, dtype=jnp.int32))
    assert figures(found[0]) == oracle(lambda a, n: a * n, jax.ShapeDtypeStruct((100,), F32), jnp.zeros(100, jnp.int32))
    assert found[0].argument_bytes == 800


def test_the_cost_can_be_used_to_decide_inside_jit():
    @jax.jit
    def step(x):
        c = ts.cost(lambda y: y @ y.T, x)
        return x * (2.0 if c.peak_bytes > 10_000 else 1.0)

    assert float(step(jnp.ones((64, 64)))[0, 0]) == 2.0
    assert float(step(jnp.ones((4, 4)))[0, 0]) == 1.0


# -- shardings -------------------------------------------------------------------
@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))


def test_sharded_inputs_are_compiled_with_their_shardings(mesh):
    rows = NamedSharding(mesh, P("d", None))
    w = jax.ShapeDtypeStruct((512, 256), F32, sharding=rows)
    x = jax.ShapeDtypeStruct((256, 64), F32, sharding=NamedSharding(mesh, P()))
    c = ts.cost(jnp.matmul, w, x)
    assert figures(c) == oracle(jnp.matmul, w, x)
    assert c.argument_bytes == 512 * 256 * 4 // 8 + 256 * 64 * 4  # per device: a row block and all of x
    assert c.output_bytes == 512 * 64 * 4 // 8
    committed = ts.cost(jnp.matmul, jax.device_put(jnp.zeros((512, 256), F32), rows), x)
    assert committed == c
    unsharded = ts.cost(jnp.matmul, w.update(sharding=None), x.update(sharding=None))
    assert unsharded.argument_bytes == (512 * 256 + 256 * 64) * 4  # another entry: shardings are in the key


def test_a_planned_structure_on_the_mesh():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    params = ts.structure_of(PARAMS).with_shardings(
        lambda path, leaf: NamedSharding(mesh, P("d") if leaf.shape[0] % 8 == 0 else P())
    )
    x = jax.ShapeDtypeStruct((32, 64), F32, sharding=NamedSharding(mesh, P("d")))
    c = ts.cost(mlp, params, x)
    assert c.argument_bytes == params.nbytes_per_device + 32 * 64 * 4 // 8
    assert figures(c) == oracle(mlp, params.tree, x)


# -- donation ----------------------------------------------------------------------
def sgd(state, batch):
    grads = jax.grad(mlp)(state, batch)
    return jtu.tree_map(lambda p, g: p - 0.1 * g, state, grads)


def test_donation_by_number_and_by_name():
    plain = ts.cost(sgd, PARAMS, X)
    donated = ts.cost(sgd, PARAMS, X, donate_argnums=0)
    assert plain.alias_bytes == 0
    assert figures(donated) == oracle(sgd, PARAMS, X, donate_argnums=0)
    assert donated.alias_bytes == ts.structure_of(PARAMS).nbytes
    assert donated.peak_bytes < plain.peak_bytes  # less than the aliased bytes: XLA's CPU temporaries grow
    assert ts.cost(sgd, PARAMS, X, donate_argnames="state") == donated
    assert ts.cost(sgd, state=PARAMS, batch=X, donate_argnames=("state",)) == donated
    assert ts.cost(sgd, PARAMS, X, donate_argnums=(0,), donate_argnames="state") == donated


def test_donation_by_number_and_name_together():
    # `jax.jit(f, donate_argnums=(), donate_argnames=...)` donates nothing when the named
    # argument is passed by position; ts.cost donates it.
    assert oracle(sgd, PARAMS, X, donate_argnums=(), donate_argnames="state")["alias_bytes"] == 0
    both = ts.cost(sgd, PARAMS, X, donate_argnums=(), donate_argnames="state")
    assert both.alias_bytes == ts.structure_of(PARAMS).nbytes

    def step(state, batch, extra):
        return sgd(state, batch), extra + 1

    e = jax.ShapeDtypeStruct((1000,), F32)
    c = ts.cost(step, PARAMS, X, extra=e, donate_argnums=0, donate_argnames="extra")
    assert c.alias_bytes == ts.structure_of(PARAMS).nbytes + 4000
    assert figures(c) == oracle(lambda s, b, e: step(s, b, e), PARAMS, X, e, donate_argnums=(0, 2))


def test_bad_donations():
    with pytest.raises(ValueError, match="donate_argnums"):
        ts.cost(sgd, PARAMS, X, donate_argnums=2)
    with pytest.raises(ValueError, match="'stat'"):
        ts.cost(sgd, PARAMS, X, donate_argnames="stat")
    with pytest.raises(TypeError, match="donate_argnums"):
        ts.cost(sgd, PARAMS, X, donate_argnums="state")


# -- the cache -----------------------------------------------------------------------
def test_a_fresh_partial_compiles_nothing_the_second_time(compiles):
    params = jtu.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS)
    compiles.clear()  # making the zeros compiled programs too
    first = ts.cost(ft.partial(mlp, params), X)
    assert len(compiles) == 1
    for make in (ft.partial, jtu.Partial, ft.partial):
        assert ts.cost(make(mlp, params), X) == first
    assert len(compiles) == 1
    jax.jit(ft.partial(mlp, params)).lower(X).compile()
    jax.jit(ft.partial(mlp, params)).lower(X).compile()
    assert len(compiles) == 3  # where jax.jit alone compiles again


def test_the_cache_is_bounded_and_holds_no_program():
    old = set_cache_maxsize(4)
    try:
        alive = []
        for i in range(10):
            constant = np.full((1000,), i, np.float32)
            alive.append(weakref.ref(constant))
            f = lambda x, c=constant: x + c  # noqa: E731
            ts.cost(f, jax.ShapeDtypeStruct((1000,), F32))
            del f, constant
        gc.collect()
        assert all(ref() is None for ref in alive)  # nothing keeps the functions or their constants
        assert not [x for x in gc.get_objects() if isinstance(x, (jax.stages.Compiled, jax.stages.Lowered))]
        from treeshape._cache import COST_CACHE

        assert COST_CACHE.info().size <= 4
    finally:
        set_cache_maxsize(old)


def test_the_key_covers_shapes_donation_and_x64():
    a = ts.cost(sgd, PARAMS, X)
    assert ts.cost(sgd, PARAMS, jax.ShapeDtypeStruct((8, 64), F32)).argument_bytes < a.argument_bytes
    assert ts.cost(sgd, PARAMS, X, donate_argnums=0).alias_bytes > 0
    assert ts.cost(sgd, PARAMS, X) == a
    with jax.enable_x64(not jax.config.jax_enable_x64):
        b = ts.cost(lambda x: x + 1.0, 1.0)
    assert b.argument_bytes == (4 if jax.config.jax_enable_x64 else 8)


# -- what the backend does not say ---------------------------------------------------
def test_unreported_or_negative_figures_are_none(monkeypatch):
    class Stats:
        argument_size_in_bytes = 64
        output_size_in_bytes = -1  # a sentinel
        temp_size_in_bytes = 0
        # no alias_size_in_bytes at all

    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: Stats())
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: [{"flops": 12.0}])  # older releases
    c = ts.cost(lambda x: x * 2, jax.ShapeDtypeStruct((16,), F32))
    assert (c.flops, c.bytes_accessed, c.argument_bytes, c.output_bytes, c.temp_bytes) == (12.0, None, 64, None, 0)
    assert c.alias_bytes is None and c.peak_bytes is None
    assert "not reported" in str(c)


def test_no_analysis_at_all(monkeypatch):
    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: None)
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: None)
    c = ts.cost(lambda x: x * 2, jax.ShapeDtypeStruct((16,), F32))
    # (the host's figures unknown too, where the compiler gives no memory analysis)
    unknown = dict.fromkeys(("host_argument_bytes", "host_output_bytes", "host_temp_bytes", "host_alias_bytes"))
    where = "cpu x1"  # where it was compiled
    assert c == ts.Cost(None, None, None, None, None, None, None, None, backend=where, **unknown)


@pytest.mark.parametrize("target", [None, "v5e"])
def test_each_analysis_of_the_compiled_program_is_asked_once(monkeypatch, target):
    """XLA's cost and memory analyses of the program `ts.cost` compiles are read once each
    (the loop count, the figures, the buffers and libtpu's peak all read that one record);
    a loop body compiled alone is another program, asked once too."""
    asked: dict[tuple[int, str], int] = {}
    held = []  # (every program asked is kept alive, so no two share an id)
    for name in ("cost_analysis", "memory_analysis"):
        original = getattr(jax.stages.Compiled, name)

        def counted(self, original=original, name=name):
            held.append(self)
            asked[id(self), name] = asked.get((id(self), name), 0) + 1
            return original(self)

        monkeypatch.setattr(jax.stages.Compiled, name, counted)

    def step(w, xs):
        def loss(w):
            return jax.lax.scan(lambda total, x: (total + jnp.sum(jnp.tanh(x @ w) ** 2), None), 0.0, xs)[0]

        return w - 0.1 * jax.grad(loss)(w)

    w, xs = jax.ShapeDtypeStruct((64, 64), F32), jax.ShapeDtypeStruct((4, 8, 64), F32)
    c = ts.cost(step, w, xs, target=target)
    assert c.exact_flops and c.flops > 4 * 2 * 8 * 64 * 64  # (each of the 4 runs counted)
    assert (c.compiler_peak_bytes is not None) == (target == "v5e")
    names = {name for _, name in asked}
    assert names == {"cost_analysis", "memory_analysis"}
    assert set(asked.values()) == {1}, asked


# -- display -----------------------------------------------------------------------
def test_table_and_html():
    c = ts.cost(sgd, PARAMS, X, donate_argnums=0)
    text = str(c)
    lines = text.splitlines()
    assert lines[0].split() == ["per", "device", "value", "exact"]
    assert f"{c.peak_bytes:,}" in [line for line in lines if line.startswith("peak")][0]
    assert f"{c.alias_bytes:,}" in [line for line in lines if line.startswith("aliased")][0]
    html = c._repr_html_()
    assert html.startswith("<table") and f"{c.argument_bytes:,}" in html


# -- errors --------------------------------------------------------------------------
def test_errors():
    with pytest.raises(TypeError, match="callable"):
        ts.cost(3, X)

    def broken(x):
        raise KeyError("the user's own")

    with pytest.raises(KeyError, match="the user's own"):
        ts.cost(broken, X)
    with pytest.raises(TypeError):  # JAX's own shape error, as out_structure raises it
        ts.cost(jnp.matmul, X, X)


def test_symbolic_dimensions_ask_for_bind():
    (b,) = jax.export.symbolic_shape("b")
    with pytest.raises(ValueError, match=r"args\[1\]\['x'\].*Structure\.bind"):
        ts.cost(lambda p, d: mlp(p, d["x"]), PARAMS, {"x": jax.ShapeDtypeStruct((b, 64), F32)})


# -- command line -------------------------------------------------------------------
def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "treeshape", *argv], capture_output=True, text=True, timeout=120)


def test_command_line():
    from treeshape._cli import main

    ok = _cli("cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]")
    assert ok.returncode == 0, ok.stderr
    expected = ts.cost(jnp.matmul, jax.ShapeDtypeStruct((8, 784), F32), jax.ShapeDtypeStruct((784, 10), F32))
    assert ok.stdout.strip() == str(expected)
    bad = _cli("cost", "jax.numpy:matmul", "f32[8,784]", "f32[3,10]")
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith("treeshape: error: calling jax.numpy:matmul failed: TypeError")
    assert main(["cost", "jax.numpy:matmul", "f32[8,"]) == 2
