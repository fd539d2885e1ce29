"""`ts.settle`: train steps that compile once.

Compilations are counted with `jax.monitoring` (JAX records one backend-compile
event per XLA compilation, named after the jitted function), and each run
builds its step afresh, so no run can reuse another's executable.
"""

import collections
import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import listening

import treeshape as ts


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# The dtype JAX gives a Python float: 64-bit under `jax_enable_x64`, else 32-bit.
FLOAT = jax.dtypes.canonicalize_dtype(jnp.float64)


@contextlib.contextmanager
def compilations(name):
    """Collect the XLA compilations of jitted functions named `name` inside the block."""
    seen = []

    def listener(event, duration, **kwargs):
        if event == COMPILE_EVENT and kwargs.get("fun_name") == f"jit({name})":
            seen.append(duration)

    with listening(on_duration=listener):
        yield seen


# -- a real model: a bf16 MLP trained with optax.adamw, optimizer math in f32 ----------
def _data(steps=3, batch=16):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps, batch, 4)).astype(np.float32)
    y = np.sin(x @ np.array([[1.0], [-2.0], [0.5], [0.3]], np.float32))
    return jnp.asarray(x), jnp.asarray(y)


def _init_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "hidden": {"w": (jax.random.normal(k1, (4, 8)) / 2).astype(jnp.bfloat16), "b": jnp.zeros(8, jnp.bfloat16)},
        "out": {"w": (jax.random.normal(k2, (8, 1)) / 3).astype(jnp.bfloat16), "b": jnp.zeros(1, jnp.bfloat16)},
    }


def _loss(params, x, y):
    h = jnp.tanh(x.astype(jnp.bfloat16) @ params["hidden"]["w"] + params["hidden"]["b"])
    pred = h @ params["out"]["w"] + params["out"]["b"]
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)


def _make_train_step(opt):
    """A fresh function object per call: a new jit cache entry, a new compilation."""

    def train_step(state, x, y):
        loss, grads = jax.value_and_grad(_loss)(state["params"], x, y)
        # Mixed precision: bf16 parameters, the optimizer's arithmetic in f32. Adam's
        # first moment `mu` starts bf16 (zeros like the parameters) and comes back f32.
        grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        updates, opt_state = opt.update(grads, state["opt"], state["params"])
        params = optax.apply_updates(state["params"], updates)  # cast back to bf16
        return {"params": params, "opt": opt_state, "step": state["step"] + 1}, loss

    return train_step


def _train(settle, opt, steps=3):
    xs, ys = _data(steps)
    params = _init_params()
    state = {"params": params, "opt": opt.init(params), "step": 0}  # a Python-int counter
    train_step = _make_train_step(opt)
    if settle:
        state = ts.settle(train_step, state, xs[0], ys[0], policy="promote")
    jitted = jax.jit(train_step)
    losses = []
    with compilations("train_step") as compiled:
        for i in range(steps):
            state, loss = jitted(state, xs[i], ys[i])
            losses.append(float(loss))
    return len(compiled), losses, state


@pytest.mark.parametrize("make_opt", [lambda: optax.adamw(1e-2, weight_decay=1e-4), lambda: optax.adam(1e-2)])
def test_adamw_bf16_params_compile_once_with_settle(make_opt):
    opt = make_opt()
    compiled_without, losses_without, state_without = _train(False, opt)
    compiled_with, losses_with, state_with = _train(True, opt)
    assert compiled_without == 2  # the second call sees f32 moments and an int32 array counter
    assert compiled_with == 1
    assert losses_with == losses_without
    assert np.isfinite(losses_with).all() and len(set(losses_with)) == 3  # it trains
    assert ts.structure_of(state_with) == ts.structure_of(state_without)
    assert int(state_with["step"]) == 3


def test_settled_optimizer_state_types():
    opt = optax.adamw(1e-2)
    params = _init_params()
    xs, ys = _data(1)
    state = {"params": params, "opt": opt.init(params), "step": 0}
    settled = ts.settle(_make_train_step(opt), state, xs[0], ys[0], policy="promote")
    adam = settled["opt"][0]
    # optax keeps `nu` in its initial dtype, but `mu` follows the f32 gradients.
    assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(settled["params"])} == {jnp.dtype(jnp.bfloat16)}
    assert adam.count.dtype == jnp.int32 and not ts.is_weak(adam.count)
    # The Python int became a weak array: `step + 1` returns a weak int, so the flag stays.
    assert isinstance(settled["step"], jax.Array) and ts.is_weak(settled["step"])
    # Unchanged leaves are returned as they are.
    assert settled["params"]["hidden"]["w"] is params["hidden"]["w"]


# -- a Python-int step counter ------------------------------------------------------
def _counter_step():
    def count_step(state, x):
        return {"w": state["w"] * x, "step": state["step"] + jnp.int32(1)}

    return count_step


def _run_counter(settle):
    step = _counter_step()
    state = {"w": jnp.ones(3, jnp.float32), "step": 0}
    x = jnp.full(3, 2.0, jnp.float32)
    if settle:
        state = ts.settle(step, state, x)
    jitted = jax.jit(step)
    with compilations("count_step") as compiled:
        for _ in range(3):
            state = jitted(state, x)
    return len(compiled), state


def test_python_int_counter_becomes_a_strong_int32_and_compiles_once():
    compiled_without, state_without = _run_counter(False)
    compiled_with, state_with = _run_counter(True)
    assert (compiled_without, compiled_with) == (2, 1)
    assert int(state_with["step"]) == int(state_without["step"]) == 3
    settled = ts.settle(_counter_step(), {"w": jnp.ones(3, jnp.float32), "step": 0}, jnp.ones(3, jnp.float32))
    assert settled["step"].dtype == jnp.int32 and not ts.is_weak(settled["step"])


def test_weak_flag_alone_takes_the_output_flag_under_every_policy():
    def step(state):
        return {"lr": 0.5 * 0.2, "w": state["w"]}  # the lr comes back a Python float: weak

    for policy in ("weak", "promote", "cast"):
        lr = jnp.asarray(0.1, FLOAT)  # strong, of the dtype JAX gives a Python float
        settled = ts.settle(step, {"lr": lr, "w": jnp.zeros(2, jnp.float32)}, policy=policy)
        assert ts.is_weak(settled["lr"]) and settled["lr"].dtype == FLOAT


def test_python_and_numpy_leaves_become_arrays():
    state = {"a": np.zeros(2, np.float32), "b": 1.5, "c": True, "d": np.int32(3)}
    settled = ts.settle(lambda s: s, state)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(settled))
    assert ts.structure_of(settled) == ts.structure_of(state)
    assert float(settled["b"]) == 1.5 and bool(settled["c"]) and int(settled["d"]) == 3


# -- output conventions ---------------------------------------------------------------
def _state():
    return {"w": jnp.zeros(2, jnp.bfloat16), "n": jnp.int32(0)}


def _updated(state):
    return {"w": state["w"] + jnp.ones(2, jnp.float32), "n": state["n"] + 1}


OUTPUTS = {
    "state": lambda s: _updated(s),
    "tuple_state_loss": lambda s: (_updated(s), jnp.float32(1.0)),
    "tuple_state_metrics": lambda s: (_updated(s), {"loss": jnp.float32(1.0), "acc": 0.5}),
    "list_state_aux": lambda s: [_updated(s), "aux"],
    "one_tuple": lambda s: (_updated(s),),
}


@pytest.mark.parametrize("output", list(OUTPUTS))
def test_output_conventions(output):
    settled = ts.settle(OUTPUTS[output], _state(), policy="promote")
    assert settled["w"].dtype == jnp.float32 and settled["n"].dtype == jnp.int32


def test_a_tuple_state_is_taken_whole_before_the_first_element():
    def step(state):
        w, n = state
        return (w + 0.5, n + jnp.int32(1))  # the state itself, a pair

    settled = ts.settle(step, (jnp.zeros(2, jnp.float32), 0))
    assert settled[1].dtype == jnp.int32 and not ts.is_weak(settled[1])

    def step_with_loss(state):
        return step(state), jnp.float32(0)

    assert ts.structure_of(ts.settle(step_with_loss, (jnp.zeros(2, jnp.float32), 0))) == ts.structure_of(settled)


BAD_OUTPUTS = {
    "scalar": lambda s: jnp.float32(1.0),
    "other_dict": lambda s: {"loss": jnp.float32(1.0)},
    "empty_tuple": lambda s: (),
    "none": lambda s: None,
}


@pytest.mark.parametrize("output", list(BAD_OUTPUTS))
def test_other_outputs_raise_a_type_error_naming_the_conventions(output):
    with pytest.raises(TypeError) as info:
        ts.settle(BAD_OUTPUTS[output], _state())
    message = str(info.value)
    assert not isinstance(info.value, ts.StructureMismatchError)
    assert message.startswith("treeshape.settle: `step` must return the new state")
    assert "tuple or list whose first element is the new state" in message
    assert "(state, loss)" in message


def test_a_wrong_first_element_is_a_structure_mismatch():
    with pytest.raises(ts.CarryMismatchError, match=re.escape("state['extra']")) as info:
        ts.settle(lambda s: ({**s, "extra": jnp.zeros(1)}, None), _state())
    assert "make `step` return a state with the same containers as `state`" in str(info.value)


# -- errors ---------------------------------------------------------------------------
OptState = collections.namedtuple("OptState", ["mu", "count"])


def _nested_state():
    return {
        "params": {"w": jnp.zeros((3, 2), jnp.bfloat16)},
        "opt": OptState(mu={"w": jnp.zeros((3, 2), jnp.bfloat16)}, count=jnp.int32(0)),
    }


def _nested_step(state, g):
    mu = {"w": 0.9 * state["opt"].mu["w"] + g}  # bf16 meets an f32 gradient: f32
    params = {"w": (state["params"]["w"] - 0.1 * mu["w"]).astype(jnp.bfloat16)[None]}  # a slip: (1, 3, 2)
    return {"params": params, "opt": OptState(mu=mu, count=state["opt"].count + 1)}, jnp.float32(0)


def test_carry_mismatch_names_every_leaf_under_state():
    g = jnp.ones((3, 2), jnp.float32)
    with pytest.raises(ts.CarryMismatchError) as info:
        ts.settle(_nested_step, _nested_state(), g)
    err = info.value
    message = str(err)
    assert isinstance(err, TypeError)
    assert message.startswith('treeshape.settle: no state type is a fixed point of `step` under policy="weak"')
    assert "state['opt'].mu['w']: input bf16[3,2], output f32[3,2]" in message
    assert 'policy="promote" would (bf16 promotes to f32)' in message
    assert "state['params']['w']: input bf16[3,2], output bf16[1,3,2]" in message
    assert "make `step` return shape (3, 2) here" in message
    assert sorted((m.where, m.kind) for m in err.mismatches) == [
        ("state['opt'].mu['w']", "dtype"),
        ("state['params']['w']", "shape"),
    ]


def test_policy_decides_and_unknown_policies_are_rejected():
    g = jnp.ones((3, 2), jnp.float32)

    def step(state, g):
        new, loss = _nested_step(state, g)
        return {**new, "params": state["params"]}, loss  # without the shape slip

    assert ts.settle(step, _nested_state(), g, policy="promote")["opt"].mu["w"].dtype == jnp.float32
    with pytest.raises(ValueError, match="unknown policy 'fast'"):
        ts.settle(step, _nested_state(), g, policy="fast")


def test_bad_arguments():
    with pytest.raises(TypeError, match="`step` must be callable"):
        ts.settle(3, _state())
    with pytest.raises(TypeError, match=re.escape("state['act'] is a str")):
        ts.settle(lambda s: s, {"act": "relu", "w": jnp.zeros(2)})
    with pytest.raises(TypeError, match="has no value to convert"):
        ts.settle(lambda s: s, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_a_state_of_free_symbolic_dimensions_is_told_to_bind_them_and_the_advice_runs():
    (b, c) = jax.export.symbolic_shape("b, c")
    state = {"w": jax.ShapeDtypeStruct((b, 2), jnp.float32), "v": jax.ShapeDtypeStruct((c,), jnp.float32)}
    with pytest.raises(TypeError) as info:
        ts.settle(lambda s: s, state)
    advice = "`ts.structure_of(state).bind(c=..., b=...).zeros()`"
    assert str(info.value) == (
        "treeshape.settle: `state` holds a jax.ShapeDtypeStruct, which has no value to convert, of symbolic "
        f"dimensions (c, b): bind them to sizes and build values with {advice} instead."
    )
    settled = ts.settle(lambda s: s, ts.structure_of(state).bind(c=4, b=3).zeros())  # as advised, with sizes
    assert jax.tree.map(jnp.shape, settled) == {"w": (3, 2), "v": (4,)}


def test_errors_from_step_keep_their_type_and_frame():
    def step(state):
        raise KeyError("missing batch")

    with pytest.raises(KeyError, match="missing batch") as info:
        ts.settle(step, _state())
    assert any(entry.name == "step" for entry in info.traceback)


# -- tracing: once for a fixed point, cached, safe under transformations -----------------
def test_one_trace_for_a_fixed_point_and_none_when_cached():
    traces = 0

    def step(state, x):
        nonlocal traces
        traces += 1
        return {"w": state["w"] + x, "n": state["n"] + 1}, state["w"].sum()

    state = {"w": jnp.zeros(4, jnp.float32), "n": jnp.asarray(0)}
    x = jnp.ones(4, jnp.float32)
    settled = ts.settle(step, state, x)
    assert traces == 1
    assert settled["w"] is state["w"] and settled["n"] is state["n"]
    ts.settle(step, state, x)
    assert traces == 1  # answered from the out_structure cache

    traces = 0
    ts.clear_cache()
    ts.settle(step, {"w": jnp.zeros(4, jnp.bfloat16), "n": jnp.asarray(0)}, x, policy="promote")
    assert traces == 2  # one promotion step, then the fixed point


def test_settle_in_every_context(in_context):
    def step(state, x):
        return {"mu": 0.9 * state["mu"] + x, "n": state["n"] + jnp.int32(1)}, x.sum()

    def f(x):
        state = {"mu": jnp.zeros_like(x, jnp.bfloat16), "n": 0}
        settled = ts.settle(step, state, x, policy="promote")
        new_state, _ = ts.out_structure(step, settled, x).tree
        assert ts.structure_of(settled) == ts.structure_of(new_state)
        assert settled["mu"].dtype == x.dtype and settled["n"].dtype == jnp.int32
        return settled["mu"] + x

    in_context(f, jnp.arange(3.0, dtype=jnp.float32))


def test_under_jit_the_settled_state_feeds_a_scan():
    def step(state, x):
        return {"acc": state["acc"] + x, "n": state["n"] + jnp.int32(1)}, state["acc"].sum()

    @jax.jit
    def run(xs):
        state = ts.settle(step, {"acc": jnp.zeros(2, jnp.bfloat16), "n": 0}, xs[0], policy="promote")
        return jax.lax.scan(step, state, xs)

    state, losses = run(jnp.ones((4, 2), jnp.float32))
    assert state["acc"].dtype == jnp.float32 and int(state["n"]) == 4
    np.testing.assert_array_equal(losses, [0.0, 2.0, 4.0, 6.0])


def test_keyword_arguments_reach_step():
    def step(state, *, scale):
        return {"w": state["w"] * scale}

    settled = ts.settle(step, {"w": 1}, scale=jnp.float32(2.0))
    assert settled["w"].dtype == jnp.float32 and not ts.is_weak(settled["w"])


def test_keywords_named_step_and_state_reach_step():
    def train_step(params, lr, *, step, state):  # a step counter passed as `step=` is common
        return {"w": params["w"] - lr * state * step}

    settled = ts.settle(
        train_step,
        {"w": jnp.zeros(3, jnp.bfloat16)},
        0.1,
        step=jnp.int32(2),
        state=jnp.ones(3, jnp.float32),
        policy="promote",
    )
    assert jax.tree.map(lambda x: x.dtype, settled) == {"w": jnp.float32}
