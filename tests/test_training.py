"""Real training loops as clients: optax state as a `lax.scan` carry built by `scan_carry`."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import linear_loss, train_step
from jax import lax

import treeshape as ts


OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.05),
    "momentum": lambda: optax.sgd(0.05, momentum=0.9),
    "adam": lambda: optax.adam(0.05),
    "adamw": lambda: optax.adamw(0.05, weight_decay=1e-3),
    "lion": lambda: optax.lion(0.01),
    "adafactor": lambda: optax.adafactor(0.05),
    "rmsprop": lambda: optax.rmsprop(0.05),
    "lamb": lambda: optax.lamb(0.05),
    "clip_then_adam": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.05)),
    "inject_hyperparams_adam": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=0.05),
    "multisteps_adam": lambda: optax.MultiSteps(optax.adam(0.05), every_k_schedule=2),
}
STEPS = 20


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, 16, 3)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3
    return jnp.asarray(x), jnp.asarray(y)


INITS = {
    # a bias made from a Python scalar is weakly typed, as is every state leaf built from it
    "weak_scalar": lambda: {"w": jnp.zeros(3), "b": jnp.asarray(0.0)},
    "zeros": lambda: {"w": jnp.zeros(3), "b": jnp.zeros(())},
}


def _check_training(opt, params):
    step = train_step(opt)
    xs = _data()

    carry = ts.scan_carry(step, (params, opt.init(params)), xs)
    (_, _), losses = jax.jit(lambda c, xs: lax.scan(step, c, xs))(carry, xs)

    # The oracle, JAX alone, step by step: without the leak checker, which turns
    # JAX's caches off and would compile the step again on every call.
    reference = []
    with jax.check_tracer_leaks(False):
        ref_carry = (params, opt.init(params))
        jitted = jax.jit(step)
        for i in range(STEPS):
            ref_carry, loss = jitted(ref_carry, (xs[0][i], xs[1][i]))
            reference.append(loss)
    np.testing.assert_allclose(losses, np.asarray(reference), rtol=2e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    # the announced carry type is what the loop carries
    assert ts.carry_structure(step, (params, opt.init(params)), xs) == ts.structure_of(carry)


@pytest.mark.parametrize("init_kind", list(INITS))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optax_training_in_scan_matches_python_loop(name, init_kind):
    _check_training(OPTIMIZERS[name](), INITS[init_kind]())


# optimizers whose `init` accepts a bare Python float as a parameter (adafactor, for
# one, reads `.shape` off every parameter)
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "lion", "rmsprop"])
def test_optax_training_from_a_python_float_parameter(name):
    _check_training(OPTIMIZERS[name](), {"w": jnp.zeros(3), "b": 0.0})


@pytest.mark.parametrize("name", ["adam", "inject_hyperparams_adam"])
def test_scan_carry_under_jit_is_cached(name):
    opt = OPTIMIZERS[name]()
    step = train_step(opt)
    xs = _data()
    traces = 0

    def counted(carry, batch):
        nonlocal traces
        traces += 1
        return step(carry, batch)

    @jax.jit
    def train(params, xs):
        carry = ts.scan_carry(counted, (params, opt.init(params)), xs)
        return lax.scan(step, carry, xs)[1]

    params = INITS["zeros"]()
    train(params, xs)
    first = traces
    train.lower({"w": jnp.ones(3), "b": jnp.ones(())}, xs)  # a retrace of `train`: scan_carry hits the cache
    assert traces == first


@chex.dataclass
class TrainState:
    params: dict
    step: jax.Array
    loss_scale: float


def test_chex_dataclass_carry():
    def body(state, batch):
        loss, grads = jax.value_and_grad(linear_loss)(state.params, *batch)
        lr = jnp.float32(0.05)  # a float32 learning rate meets bfloat16 parameters
        params = jax.tree.map(lambda p, g: p - lr * g, state.params, grads)
        new = TrainState(params=params, step=state.step + 1, loss_scale=state.loss_scale * 0.5)
        return new, loss

    xs = _data()
    init = TrainState(params={"w": jnp.zeros(3, jnp.bfloat16), "b": 0.0}, step=0, loss_scale=1.0)
    with pytest.raises(
        ts.CarryMismatchError,
        match=r"carry\.params\['w'\]: input bf16\[3\], output f32\[3\]",
    ):
        ts.scan_carry(body, init, xs)  # mixed precision: bf16 parameters become f32
    carry = ts.scan_carry(body, init, xs, policy="promote")
    assert isinstance(carry, TrainState)
    assert carry.params["w"].dtype == jnp.float32
    assert carry.params["b"] == 0.0  # weakly typed float32 in and out: left as it is
    final, losses = lax.scan(body, carry, xs)
    assert int(final.step) == STEPS and losses[-1] < losses[0]
