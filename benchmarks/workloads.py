"""Workloads shared by several cases: the MLP, trees of many leaves, the floors, the Adam train step.

- **The MLP** (cases 1-5): a 50-layer MLP, `tanh(x @ w + b)` per layer,
  `params` a list of 50 dicts (`w`: f32[32,32], `b`: f32[32]) and `x`:
  f32[8,32] (101 leaves). Both sides of a row get exactly the same arguments.
- **Leaf trees** (case 6): a list of dicts of f32[4], bf16[2], i32[],
  f32[4,4] `jax.Array`s.
- **Floors**: the least any implementation must do, e.g. flatten a tree and
  read each leaf's type.
- **The Adam train step** (cases 8 and 9): a hand-written Adam update (no
  optax) of a 3-layer MLP (16-64-64-8, ReLU, mean squared error).
"""

import functools as ft
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np


# -- the MLP (cases 1-5) ---------------------------------------------------------
MLP_LAYERS = 50
MLP_WIDTH = 32


def mlp(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x


@ft.cache
def mlp_inputs() -> tuple[list[dict[str, jax.Array]], jax.Array]:
    """A 50-layer MLP's parameters (a list of dicts, 100 leaves) and a batch."""
    keys = jax.random.split(jax.random.key(0), MLP_LAYERS)
    params = [
        {
            "w": jax.random.normal(k, (MLP_WIDTH, MLP_WIDTH)) / MLP_WIDTH**0.5,
            "b": jnp.zeros(MLP_WIDTH),
        }
        for k in keys
    ]
    return params, jnp.ones((8, MLP_WIDTH))


def fresh_mlp() -> Callable[..., jax.Array]:
    """A new function object on every call, so no cache can know it."""

    def f(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        return mlp(params, x)

    return f


# -- floors ----------------------------------------------------------------------
def floor(*trees: Any) -> list[tuple[Any, Any, bool]]:
    """The least any cached lookup must do: flatten, read each leaf's type."""
    return [(x.shape, x.dtype, x.weak_type) for x in jtu.tree_leaves(trees)]


def aval_floor(*trees: Any) -> list[Any]:
    """A tighter floor for `jax.Array` leaves: one `.aval` read per leaf."""
    return [x.aval for x in jtu.tree_leaves(trees)]


# -- leaf trees (case 6) ---------------------------------------------------------
@ft.cache
def leaf_tree(n_leaves: int) -> list[dict[str, jax.Array]]:
    """A list of dicts with `n_leaves` arrays of mixed shapes and dtypes."""
    return [
        {
            "b": jnp.zeros(4),
            "h": jnp.zeros(2, jnp.bfloat16),
            "step": jnp.zeros((), jnp.int32),
            "w": jnp.zeros((4, 4)),
        }
        for _ in range(n_leaves // 4)
    ]


@ft.cache
def committed_tree(n_leaves: int) -> list[dict[str, jax.Array]]:
    """`leaf_tree(n_leaves)` placed on a device explicitly: committed arrays, as
    `jax.device_put(x, device)` and sharded computations make them."""
    return jax.device_put(leaf_tree(n_leaves), jax.devices()[0])  # type: ignore[no-any-return]


def fresh_identity() -> Callable[[Any], Any]:
    """A new identity function on every call: `jax.eval_shape` cannot cache it."""
    return lambda t: t


# -- the Adam train step (cases 8 and 9) ------------------------------------------
ADAM_SIZES = (16, 64, 64, 8)  # a 3-layer MLP: 6 parameter leaves, 19 carry leaves with the Adam state
ADAM_BATCH = 32
SCAN_STEPS = 64

Params = list[dict[str, jax.Array]]
AdamCarry = tuple[Params, tuple[jax.Array, Params, Params]]
Batch = tuple[jax.Array, jax.Array]


def adam_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return jnp.mean((x - y) ** 2)


def make_train_step(
    lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
) -> Callable[[AdamCarry, Batch], tuple[AdamCarry, jax.Array]]:
    """A new scan body on every call: one hand-written Adam step (no optax) of
    the MLP, `(params, (count, mu, nu)), (x, y) -> (carry, loss)`."""

    def train_step(carry: AdamCarry, batch: Batch) -> tuple[AdamCarry, jax.Array]:
        params, (count, mu, nu) = carry
        loss, grads = jax.value_and_grad(adam_loss)(params, *batch)
        count = count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)
        t = count.astype(jnp.float32)
        step = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + eps), params, mu, nu)
        return (params, (count, mu, nu)), loss

    return train_step


@ft.cache
def adam_inputs(param_dtype: str) -> tuple[AdamCarry, Batch]:
    """`(init, xs)`: the MLP's parameters in `param_dtype`, an f32 Adam state
    (`count` an int32 0, `mu`/`nu` zeros), and SCAN_STEPS batches to scan over."""
    rng = np.random.default_rng(1)  # NumPy, not jax.random: no XLA compilation before the timings
    params = [
        {
            "w": jnp.asarray(rng.standard_normal((a, b), np.float32) / a**0.5, param_dtype),
            "b": jnp.zeros(b, param_dtype),
        }
        for a, b in zip(ADAM_SIZES[:-1], ADAM_SIZES[1:], strict=False)
    ]
    mu, nu = ([{name: jnp.zeros(p.shape, jnp.float32) for name, p in layer.items()} for layer in params] for _ in "mn")
    init = (params, (jnp.zeros((), jnp.int32), mu, nu))
    xs = (
        jnp.asarray(rng.standard_normal((SCAN_STEPS, ADAM_BATCH, ADAM_SIZES[0]), np.float32)),
        jnp.asarray(rng.standard_normal((SCAN_STEPS, ADAM_BATCH, ADAM_SIZES[-1]), np.float32)),
    )
    return init, xs
