"""`ts.watch`: what each trace of a jitted function saw, and why it was traced again.

Every cause is checked against JAX itself: the second call really compiles again
(counted with `jax.monitoring`), and the report names the path, the kind and a fix.
"""

import functools
import gc
import re
import threading
import types
import weakref

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts


JITS = {
    "jax.jit": jax.jit,
    "eqx.filter_jit": eqx.filter_jit,
    "nnx.jit": nnx.jit,
}


@pytest.fixture(params=list(JITS))
def jit(request):
    return JITS[request.param]


def _ident():
    """A new function each time: watches of one function share their history."""

    def ident(*args, **kwargs):
        return args, kwargs

    return ident


def _compiles_of(compiles, call):
    """How many backend compilations `call()` makes."""
    before = len(compiles)
    call()
    return len(compiles) - before


def _second_call(compiles, jitted, first, second):
    """Call `jitted` with `first` then `second` (each `(args, kwargs)`); return how many
    compilations the second call made."""
    jitted(*first[0], **first[1])
    return _compiles_of(compiles, lambda: jitted(*second[0], **second[1]))


_A, _B = np.ones(3, np.float32), np.ones(4, np.float32)

# (first call, second call, the path, the kind, a word of the fix)
INPUT_CAUSES = {
    "weak type flipped": (
        (({"lr": 0.1},), {}),
        (({"lr": jnp.asarray(0.1, float)},), {}),  # JAX's default float dtype, strongly typed
        "args[0]['lr']",
        "weak_type",
        "jnp.asarray",
    ),
    "dtype": (((_A,), {}), ((_A.astype(np.int32),), {}), "args[0]", "dtype", ".astype(float32)"),
    "shape": (((_A,), {}), ((_B,), {}), "args[0]", "shape", "pad"),
    "list against tuple": ((([_A],), {}), (((_A,),), {}), "args[0]", "structure", "tuple("),
    "key added": ((({"a": _A},), {}), (({"a": _A, "b": _A},), {}), "args[0]['b']", "structure", "up front"),
    "key removed": ((({"a": _A, "b": _A},), {}), (({"a": _A},), {}), "args[0]['b']", "structure", "same keys"),
    "None against an array": (
        (({"a": None},), {}),
        (({"a": _A},), {}),
        "args[0]['a']",
        "structure",
        "zeros",
    ),
    "keyword argument": (((), {"x": _A}), ((), {"x": _B}), "kwargs['x']", "shape", "pad"),
}


@pytest.mark.parametrize("cause", list(INPUT_CAUSES))
def test_each_input_cause_is_named_by_path_with_a_fix(compiles, jit, cause):
    first, second, path, kind, fix = INPUT_CAUSES[cause]
    if cause == "weak type flipped" and jit is eqx.filter_jit:  # a Python scalar is static there
        first = (({"lr": jnp.asarray(0.1)},), {})  # a weak array
    watched = ts.watch(_ident())
    assert _second_call(compiles, jit(watched), first, second) == 1  # JAX really compiles again
    [retrace] = watched.retraces
    [m] = retrace.mismatches
    assert (m.where, m.kind) == (path, kind)
    assert fix in m.fix
    assert retrace.index == 1 and retrace.closest is watched.traces[0]
    report = str(retrace)
    assert path in report and m.fix in report and "`ident` was traced again" in report


def test_a_python_scalar_in_the_state_that_becomes_an_array_is_a_weak_type_flip(compiles):
    @jax.jit
    @ts.watch
    def step(state):
        return {"w": state["w"] * 2, "count": state["count"] + jnp.ones((), int)}  # JAX's default int dtype

    state = {"w": jnp.ones(3), "count": 0}
    state = step(state)  # `count` comes back a strong int
    assert _compiles_of(compiles, lambda: step(state)) == 1
    [m] = step.retraces[0].mismatches
    assert (m.where, m.kind, m.expected, m.actual) == ("args[0]['count']", "weak_type", True, False)
    assert "Python scalar" in m.fix and "jnp.asarray" in m.fix
    assert _compiles_of(compiles, lambda: step(step(state))) == 0
    assert len(step.traces) == 2


def test_a_static_arguments_value(compiles):
    watched = ts.watch(lambda x, n: x * n)
    jitted = jax.jit(watched, static_argnums=1)
    assert _second_call(compiles, jitted, ((_A, 2), {}), ((_A, 3), {})) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind) == ("args[1]", "structure")
    assert "2" in str(m.expected) and "3" in str(m.actual)
    assert "static_argnums" in m.fix


def test_static_argnames_follow_the_watched_functions_signature(compiles):
    def scale(x, *, factor):
        return x * factor

    watched = ts.watch(scale)
    jitted = jax.jit(watched, static_argnames="factor")
    assert _second_call(compiles, jitted, ((_A,), {"factor": 2}), ((_A,), {"factor": 3})) == 1
    [m] = watched.retraces[0].mismatches
    assert m.where == "kwargs['factor']"


class _Model(eqx.Module):
    w: jax.Array
    activation: str = eqx.field(static=True)


def test_an_equinox_static_field(compiles):
    watched = ts.watch(lambda model, x: model.w * x)
    jitted = eqx.filter_jit(watched)
    first = ((_Model(jnp.ones(3), "relu"), _A), {})
    second = ((_Model(jnp.ones(3), "gelu"), _A), {})
    assert _second_call(compiles, jitted, first, second) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind, m.expected, m.actual) == ("args[0].activation", "structure", "'relu'", "'gelu'")
    assert "eqx.field(static=True)" in m.fix


class _Block(nnx.Module):
    def __init__(self, rate):
        self.linear = nnx.Linear(3, 3, rngs=nnx.Rngs(0))
        self.rate = rate

    def __call__(self, x):
        return self.linear(x) * (1 - self.rate)


def test_a_flax_nnx_attribute(compiles):
    watched = ts.watch(lambda model, x: model(x))
    jitted = nnx.jit(watched)
    x = np.ones((1, 3), np.float32)
    first, second = ((_Block(0.1), x), {}), ((_Block(0.2), x), {})
    assert _second_call(compiles, jitted, first, second) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind, m.expected, m.actual) == ("args[0].rate", "structure", "0.1", "0.2")
    assert "nnx.Variable" in m.fix


def test_a_static_value_that_becomes_an_array_under_filter_jit(compiles):
    watched = ts.watch(lambda x, scale: x * scale)
    jitted = eqx.filter_jit(watched)
    assert _second_call(compiles, jitted, ((_A, 2.0), {}), ((_A, np.float32(2.0)), {})) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind) == ("args[1]", "structure")
    assert "array every time" in m.fix


def test_jax_enable_x64_is_a_setting(compiles):
    watched = ts.watch(_ident())
    jitted = jax.jit(watched)
    with jax.enable_x64(False):
        jitted(_A)
    with jax.enable_x64(True):
        assert _compiles_of(compiles, lambda: jitted(_A)) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind, m.expected, m.actual) == ("jax_enable_x64", "setting", "False", "True")
    assert "jax_enable_x64" in m.fix
    assert watched.traces[1].settings["jax_enable_x64"] is True


def test_the_mesh_is_a_setting(compiles):
    watched = ts.watch(_ident())
    jitted = jax.jit(watched)
    small = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])
    large = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:4])
    with jax.set_mesh(small):
        jitted(_A)
    with jax.set_mesh(large):
        assert _compiles_of(compiles, lambda: jitted(_A)) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind) == ("mesh", "setting")
    assert "'data': 2" in m.expected and "'data': 4" in m.actual and "Explicit" in m.actual
    assert "jax.set_mesh" in m.fix
    assert watched.traces[1].settings["mesh"].axis_sizes == (4,)


def test_a_sharding_under_explicit_mesh_axes(compiles):
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    x = np.ones((8, 4), np.float32)
    with jax.set_mesh(mesh):
        rows, cols = jax.device_put(x, P("a")), jax.device_put(x, P(None, "b"))
        watched = ts.watch(_ident())
        jitted = jax.jit(watched)
        assert _second_call(compiles, jitted, ((rows,), {}), ((cols,), {})) == 1
    [m] = watched.retraces[0].mismatches
    assert (m.where, m.kind, m.expected, m.actual) == ("args[0]", "sharding", P("a", None), P(None, "b"))
    assert "reshard" in m.fix
    assert watched.traces[0].inputs.leaves[0].sharding.spec == P("a", None)


def test_a_changed_sharding_or_mesh_is_named_by_the_inputs_path_as_out_structure_names_it(compiles):
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    x = np.ones((8, 4), np.float32)
    with jax.set_mesh(mesh):
        rows, cols = jax.device_put(x, P("a")), jax.device_put(x, P(None, "b"))
        watched = ts.watch(_ident())
        jitted = jax.jit(watched)
        assert _second_call(compiles, jitted, (({"w": rows},), {"n": rows}), (({"w": cols},), {"n": cols})) == 1
    found = [(m.path, m.root, m.kind) for m in watched.retraces[0].mismatches]
    assert found == [("args[0]['w']", "", "sharding"), ("kwargs['n']", "", "sharding")]
    # another mesh (set with `jax.set_mesh`): the setting by its name, the input by its path
    small = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])
    large = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:4])
    watched = ts.watch(_ident())
    jitted = jax.jit(watched)
    with jax.set_mesh(small):
        jitted(jax.device_put(np.ones(8, np.float32), P("data")))
    with jax.set_mesh(large):
        assert _compiles_of(compiles, lambda: jitted(jax.device_put(np.ones(8, np.float32), P("data")))) == 1
    [retrace] = watched.retraces
    assert [(m.path, m.kind) for m in retrace.mismatches] == [("mesh", "setting"), ("args[0]", "sharding")]
    assert [m.path for m in retrace.mismatches] == [m.where for m in retrace.mismatches]
    assert "\n  * args[0]: expected sharding P('data',) on Mesh('data': 2;" in str(retrace)


def test_a_scalar_made_outside_the_mesh_that_comes_back_on_it_is_named_with_its_mesh(compiles):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))

    def step(x, total):
        return x * 2, total + x.sum()

    total = jnp.float32(0)  # made outside the mesh: an array of one device
    with jax.set_mesh(mesh):
        watched = ts.watch(step)
        jitted = jax.jit(watched)  # built once
        x = jax.device_put(np.ones(8, np.float32), P("data"))
        x, total = jitted(x, total)
        assert _compiles_of(compiles, lambda: jitted(x, total)) == 1  # it comes back on the mesh: traced anew
        assert _compiles_of(compiles, lambda: jitted(x, total)) == 0
    [retrace] = watched.retraces
    [m] = retrace.mismatches
    assert (m.where, m.kind) == ("args[1]", "sharding")
    assert m.expected == "of no mesh (one device's array)"
    assert m.actual == "P() on Mesh('data': 8; axis types Explicit)"
    assert "made outside the mesh at trace 0" in m.fix and "jax.set_mesh(mesh)" in m.fix
    assert "jax.device_put(x, NamedSharding(mesh, P()))" in m.fix
    assert "built again" not in str(retrace)


def test_under_auto_mesh_axes_a_new_sharding_recompiles_without_tracing(compiles):
    mesh = jax.make_mesh((8,), ("a",), axis_types=(AxisType.Auto,))
    x = np.ones((8, 8), np.float32)
    rows = jax.device_put(x, NamedSharding(mesh, P("a")))
    cols = jax.device_put(x, NamedSharding(mesh, P(None, "a")))
    watched = ts.watch(_ident())
    assert _second_call(compiles, jax.jit(watched), ((rows,), {}), ((cols,), {})) == 1
    assert len(watched.traces) == 1 and watched.retraces == []  # no trace: nothing to watch


def test_a_function_built_again_is_told_apart_from_cleared_caches(compiles):
    watched = ts.watch(_ident())
    jax.jit(functools.partial(watched))(_A)
    assert _compiles_of(compiles, lambda: jax.jit(functools.partial(watched))(_A)) == 1
    jitted = jax.jit(watched)
    jitted(_A)
    jax.clear_caches()
    assert _compiles_of(compiles, lambda: jitted(_A)) == 1
    kinds = [[m.kind for m in r.mismatches] for r in watched.retraces]
    assert kinds == [["function"], ["function"], ["cache"]]
    function, cache = watched.retraces[0].mismatches[0], watched.retraces[2].mismatches[0]
    assert function.where == "ident" and "inside the loop" in function.fix
    assert "jax.clear_caches()" in cache.fix
    assert watched.retraces[2].closest is watched.traces[2]


def test_the_closest_earlier_trace_is_the_least_different_and_on_a_tie_the_latest():
    watched = ts.watch(_ident())
    jitted = jax.jit(watched)
    jitted(_A, _A)
    jitted(_B, _B)
    jitted(_A, _B)  # one difference from each earlier trace: the latest
    jitted(_A, _A.astype(np.int32))  # one from trace 0, two from the others
    assert [r.closest.index for r in watched.retraces] == [0, 1, 0]
    assert [m.where for m in watched.retraces[1].mismatches] == ["args[0]"]
    assert [m.kind for m in watched.retraces[2].mismatches] == ["dtype"]


def test_a_trace_records_the_inputs_settings_and_the_users_line():
    watched = ts.watch(_ident())
    line = _line_of("jax.jit(watched)({")
    jax.jit(watched)({"w": _A, "lr": 0.1}, n=np.int32(3))
    [trace] = watched.traces
    assert trace.index == 0
    assert trace.inputs == ts.structure_of((({"w": _A, "lr": 0.1},), {"n": np.int32(3)}))
    assert trace.where == f"test_watch.py:{line}"
    assert trace.settings["jax_enable_x64"] == jax.config.jax_enable_x64
    assert trace.settings["mesh"] is None


def _line_of(text):
    import inspect

    frame = inspect.currentframe().f_back
    source, start = inspect.getsourcelines(frame.f_code)
    return next(start + i for i, line in enumerate(source) if text in line and "_line_of" not in line)


def test_max_traces_raises_from_inside_the_trace_with_the_report(compiles):
    def step(x):
        return x * 2

    jitted = jax.jit(ts.watch(step, max_traces=2))
    jitted(_A)
    jitted(_B)
    with pytest.raises(ts.RetraceError) as info:
        jitted(_A.astype(np.int32))
    err = info.value
    assert isinstance(err, RuntimeError)
    assert "max_traces=2" in str(err) and "args[0]: expected dtype float32, got int32" in str(err)
    assert str(err.retrace) in str(err) and err.retrace.index == 2
    assert jitted(_A).dtype == np.float32  # the allowed traces still run


def test_max_traces_pins_a_step_that_compiles_once(compiles):
    @jax.jit
    @functools.partial(ts.watch, max_traces=1)
    def step(state, batch):
        return {"w": state["w"] + batch.sum()}

    state = {"w": jnp.zeros(3)}
    for batch in np.ones((5, 2), np.float32):
        state = step(state, batch)
    with pytest.raises(ts.RetraceError, match=re.escape("args[1]: expected shape (2,), got (3,)")):
        step(state, np.ones(3, np.float32))


def test_watches_of_one_function_share_one_history():
    def step(x):
        return x + 1

    jax.jit(ts.watch(step))(_A)
    again = ts.watch(step)
    jax.jit(again)(_B)
    assert len(again.traces) == 2
    assert [m.where for m in again.retraces[0].mismatches] == ["args[0]"]
    assert ts.watch(step) is not again  # a new wrapper every time


def test_the_wrapper_calls_fn_unchanged_and_only_when_traced(compiles):
    calls = []

    def step(x, *, scale=2.0):
        calls.append(1)
        return x * scale

    watched = ts.watch(step)
    assert watched(_A, scale=3.0).tolist() == (_A * 3.0).tolist()  # no trace at top level
    assert watched.traces == []
    jitted = jax.jit(watched)
    for _ in range(50):
        out = jitted(_A)
    assert len(calls) == 2 and len(watched.traces) == 1  # traced once: never called again
    np.testing.assert_array_equal(out, jax.jit(step)(_A))
    assert watched.__name__ == "step" and watched.__wrapped__ is step


def _hlo(lowered):
    text = lowered.as_text()
    text = re.sub(r"\s*loc\(.*?\)(?=\s*$)", "", text, flags=re.MULTILINE)  # op locations
    return [line for line in text.splitlines() if not line.startswith("#loc")]


@pytest.mark.parametrize("jit_name", ["jax.jit", "eqx.filter_jit"])
def test_the_compiled_program_is_the_same_as_without_the_watch(jit_name):
    def step(state, batch):
        grads = jax.grad(lambda w: jnp.sum((batch @ w) ** 2))(state["w"])
        return {"w": state["w"] - state["lr"] * grads, "lr": state["lr"]}

    state, batch = {"w": np.ones((3, 2), np.float32), "lr": 0.1}, np.ones((4, 3), np.float32)
    jit = JITS[jit_name]
    plain = jit(step).lower(state, batch)
    watched = jit(ts.watch(step)).lower(state, batch)
    assert _hlo(watched) == _hlo(plain)
    assert len(_hlo(plain)) > 5


def test_under_vmap_and_grad_the_per_example_inputs_are_recorded():
    watched = ts.watch(lambda x: jnp.sum(x**2))
    jax.jit(jax.vmap(jax.grad(watched)))(np.ones((5, 3), np.float32))
    [trace] = watched.traces
    assert trace.inputs.leaves[0].shape == (3,)


def test_nothing_keeps_the_function_alive_and_no_tracer_or_array_is_held():
    def make():
        def step(x):
            return x * 2

        return step

    step = make()
    ref = weakref.ref(step)
    watched = ts.watch(step)
    jitted = jax.jit(watched)
    jitted(_A)
    jitted(_B)
    held = _reachable((watched.traces, watched.retraces))
    assert not any(isinstance(x, (jax.core.Tracer, jax.Array)) for x in held)
    del step, watched, jitted
    jax.clear_caches()
    gc.collect()
    assert ref() is None


# Code, not data a trace holds: a treedef refers to JAX's pytree registry, whose flatten
# functions reach every module's globals (this test module's arrays among them).
_CODE = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type(jtu.default_registry))


def _reachable(root, limit=20_000):
    seen, stack, out = set(), [root], []
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, int, float, *_CODE)):
            continue
        seen.add(id(obj))
        out.append(obj)
        if not isinstance(obj, jax.sharding.AbstractMesh):
            stack.extend(gc.get_referents(obj))
    assert not stack, f"more than {limit} objects reachable: the walk left the data for code"
    return out


def test_traces_from_many_threads_are_each_recorded_once():
    watched = ts.watch(_ident())
    jitted = jax.jit(watched)
    inputs = [np.ones(n, np.float32) for n in range(1, 9)]
    barrier = threading.Barrier(len(inputs))
    errors = []

    def work(x):
        try:
            barrier.wait()
            for _ in range(3):
                jitted(x)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [t.index for t in watched.traces] == list(range(len(watched.traces)))
    shapes = sorted(t.inputs.leaves[0].shape for t in watched.traces)
    assert sorted(set(shapes)) == [(n,) for n in range(1, 9)]
    assert len(watched.retraces) == len(watched.traces) - 1


def test_bad_arguments_say_what_is_expected():
    with pytest.raises(TypeError, match="must be callable"):
        ts.watch(3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_traces"):
            ts.watch(_ident(), max_traces=bad)


@pytest.mark.parametrize("wrapper", [*JITS, "jax.pmap"])
def test_a_watch_outside_the_jit_warns_at_once_naming_the_watch_inside(wrapper):
    def step(x):
        return x * 2

    wrap = JITS.get(wrapper, jax.pmap)
    name = wrap(step).__name__  # `step` (jax 0.8.0's pmap names itself `wrapped`)
    with pytest.warns(UserWarning, match=re.escape(f"Watch the function inside it: `{wrapper}(ts.watch({name}))`")):
        outside = ts.watch(wrap(step))
    outside(_A)
    assert outside.traces == []  # what it warned of: the trace is the wrapper's, not the watch's
    inside = ts.watch(step)
    wrap(inside)(_A[None] if wrapper == "jax.pmap" else _A)
    assert len(inside.traces) == 1


def test_safe_under_every_transformation(in_context, request):
    watched = ts.watch(lambda y: y * 2)
    x = jnp.arange(3.0)
    out = in_context(watched, x)
    expected = in_context(lambda y: y * 2, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected))
    for trace in watched.traces:
        [leaf] = trace.inputs.leaves
        assert isinstance(leaf, jax.ShapeDtypeStruct) and leaf.shape == (3,)
    # Custom rules run eagerly at top level (nothing is traced there), as plain calls do.
    eager = {"top", "custom_jvp", "custom_vjp_fwd", "custom_vjp_bwd"}
    assert (len(watched.traces) == 0) == (request.node.callspec.params["in_context"] in eager)


def test_watches_of_one_function_are_one_function_to_a_cache_that_holds_one(compiles):
    def step(x):
        return x * 2

    jitted = eqx.filter_jit(ts.watch(step))
    jitted(_A)
    assert ts.watch(step) == ts.watch(step) and hash(ts.watch(step)) == hash(ts.watch(step))
    assert ts.watch(step) != ts.watch(step, max_traces=3)
    assert _compiles_of(compiles, lambda: eqx.filter_jit(ts.watch(step))(_A)) == 0  # as eqx.filter_jit(step)
    assert len(ts.watch(step).traces) == 1


class _Unhashable(eqx.Module):
    w: jax.Array

    def __call__(self, x):
        return self.w * x


def test_a_callable_module_is_watched_by_identity_without_its_eq_or_hash():
    model = _Unhashable(jnp.ones(3))
    watched = ts.watch(model)
    hash(watched)
    assert watched == ts.watch(model) and watched != ts.watch(_Unhashable(jnp.ones(3)))
    jax.jit(watched)(_A)
    jax.jit(watched)(_A.astype(np.int32))
    assert [(m.where, m.kind) for m in watched.retraces[0].mismatches] == [("args[0]", "dtype")]


def test_a_bound_method_shares_the_history_of_its_function_and_instance():
    class Trainer:
        def step(self, x):
            return x + 1

    trainer = Trainer()
    jax.jit(ts.watch(trainer.step))(_A)
    jax.jit(ts.watch(trainer.step))(_B)
    assert len(ts.watch(trainer.step).traces) == 2
    assert ts.watch(Trainer().step).traces == []


def test_a_trace_that_raised_is_not_recorded_and_the_next_one_is_told_by_its_inputs():
    def step(x):
        if x.shape == (4,):
            raise ValueError("no batches of 4")
        return x

    watched = ts.watch(step)
    jitted = jax.jit(watched)
    jitted(_A)
    with pytest.raises(ValueError, match="no batches of 4"):  # the user's own error, unchanged
        jitted(_B)
    assert len(watched.traces) == 1
    jitted(_A.astype(np.int32))
    assert [m.kind for m in watched.retraces[0].mismatches] == ["dtype"]
    assert watched.retraces[0].index == 1


def test_a_trace_over_max_traces_is_refused_each_time_and_not_recorded():
    jitted = jax.jit(ts.watch(_ident(), max_traces=1))
    jitted(_A)
    for _ in range(2):  # JAX keeps nothing of a failed trace: the next call traces again
        with pytest.raises(ts.RetraceError):
            jitted(_B)
    assert len(jitted.traces) == 1 and jitted.retraces == []


def test_under_nnx_jit_the_compiled_program_is_the_same_as_without_the_watch():
    def train(model, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.sum(m.linear(x) ** 2))(model)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
        return loss

    model, x = _Block(0.5), np.ones((4, 3), np.float32)
    plain = nnx.jit(train).lower(model, x)
    watched = nnx.jit(ts.watch(train)).lower(model, x)
    assert _hlo(watched) == _hlo(plain)
    assert len(_hlo(plain)) > 5


class _MLPModule(eqx.Module):
    layers: list
    hidden_size: int

    def __init__(self) -> None:
        keys = jax.random.split(jax.random.key(0), 2)
        self.layers = [eqx.nn.Linear(8, 64, key=keys[0]), eqx.nn.Linear(64, 8, key=keys[1])]
        self.hidden_size = 64

    def __call__(self, x):
        return self.layers[1](jax.nn.relu(self.layers[0](x)))


def test_a_watched_callable_pytree_keeps_its_arrays_arguments_under_filter_jit():
    model, x = _MLPModule(), jnp.ones(8)
    plain = eqx.filter_jit(model).lower(x).lowered
    watched = ts.watch(model)
    lowered = eqx.filter_jit(watched).lower(x).lowered
    assert _hlo(lowered) == _hlo(plain)
    n = len(jax.tree.leaves(eqx.filter(model, eqx.is_array))) + 1
    assert len(jax.tree.leaves(lowered.args_info)) == n
    assert lowered.compile().memory_analysis().argument_size_in_bytes == (8 * 64 * 2 + 64 + 8 + 8) * x.dtype.itemsize
    assert len(watched.traces) == 1
    eqx.filter_jit(watched)(x)
    eqx.filter_jit(ts.watch(model))(x + 1)  # the same program: equinox's cache holds it, no new trace
    assert len(watched.traces) == 1


def test_a_watched_partial_passed_to_jax_jit_keeps_its_arrays_arguments():
    p = jax.tree_util.Partial(lambda w, x: w @ x, jnp.ones((8, 8)))

    def apply(f, x):
        return f(x)

    plain, watched = jax.jit(apply).lower(p, jnp.ones(8)), jax.jit(apply).lower(ts.watch(p), jnp.ones(8))
    assert _hlo(watched) == _hlo(plain)
    assert len(jax.tree.leaves(watched.args_info)) == 2
    assert jax.tree.structure(ts.watch(p)).num_leaves == 1


def test_a_watched_module_is_costed_as_the_module_and_named_as_it():
    model, x = _MLPModule(), jnp.ones(8)
    watched, plain = ts.cost(ts.watch(model), x), ts.cost(model, x)
    assert watched == plain
    assert [b.path for b in watched.buffers] == [b.path for b in plain.buffers]
    assert "self.layers[0].weight" in {b.path for b in plain.buffers}
