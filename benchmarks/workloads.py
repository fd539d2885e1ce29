"""Workloads shared by several cases: the MLP, trees of many leaves, the floors, the Adam train step.

- **The MLP** (cases 1-5): a 50-layer MLP, `tanh(x @ w + b)` per layer,
  `params` a list of 50 dicts (`w`: f32[32,32], `b`: f32[32]) and `x`:
  f32[8,32] (101 leaves). Both sides of a row get exactly the same arguments.
- **Leaf trees** (case 6): a list of dicts of f32[4], bf16[2], i32[],
  f32[4,4] `jax.Array`s.
- **Model trees** (cases 11-13, issue 9 "Scale"): `{"layers": [layer, ...]}`,
  10 leaves per layer in nested dicts and a list, as a model's parameters
  are laid out (see `model_tree`); the leaves are `jax.Array`s or
  `jax.ShapeDtypeStruct`s, made once per size and reused, and the containers
  can be rebuilt around them to get a new tree object cheaply.
- **Floors**: the least any implementation must do, e.g. flatten a tree and
  read each leaf's type.
- **The Adam train step** (cases 8 and 9): a hand-written Adam update (no
  optax) of a 3-layer MLP (16-64-64-8, ReLU, mean squared error).
"""

import functools as ft
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import treeshape as ts


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


def typeof_floor(tree: Any) -> tuple[Any, list[Any]]:
    """Describing an existing tree of arrays by hand: `tree_flatten` + `jax.typeof` per leaf."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, [jax.typeof(x) for x in leaves]


def fields_floor(tree: Any) -> tuple[Any, list[tuple[Any, Any, bool]]]:
    """Describing a tree of `ShapeDtypeStruct`s by hand: `tree_flatten` + `.shape`, `.dtype`, `.weak_type`."""
    leaves, treedef = jtu.tree_flatten(tree)
    return treedef, [(x.shape, x.dtype, x.weak_type) for x in leaves]


def paths_floor(a: Any, b: Any) -> tuple[Any, Any]:
    """What any diff that reports paths must at least do: `tree_flatten_with_path` of both trees."""
    return jtu.tree_flatten_with_path(a), jtu.tree_flatten_with_path(b)


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


# -- model trees (cases 11-13) ---------------------------------------------------
F32, BF16, I32 = np.dtype("float32"), jnp.dtype("bfloat16"), np.dtype("int32")
# The leaf types of one layer, in the order `_layer` places them.
LAYER_TYPES: tuple[tuple[tuple[int, ...], Any], ...] = (
    *[((4, 4), F32)] * 4,  # attn q, k, v, o
    ((4, 8), BF16),  # mlp up
    ((8, 4), BF16),  # mlp down
    ((8,), F32),  # mlp bias[0]
    ((4,), F32),  # mlp bias[1]
    ((4,), F32),  # norm scale
    ((), I32),  # norm count
)
LAYER_LEAVES = len(LAYER_TYPES)
CHANGED_SHAPE = (4, 5)  # the shape `changed_tree` gives one attn "k" leaf (f32[4,4] elsewhere)


def _layer(leaves: Sequence[Any], i: int) -> dict[str, Any]:
    """One layer from `leaves[i : i + LAYER_LEAVES]`: nested dicts and a list, as a model lays them out."""
    q, k, v, o, up, down, b0, b1, scale, count = leaves[i : i + LAYER_LEAVES]
    return {
        "attn": {"q": q, "k": k, "v": v, "o": o},
        "mlp": {"up": up, "down": down, "bias": [b0, b1]},
        "norm": {"scale": scale, "count": count},
    }


def model_tree(leaves: Sequence[Any]) -> dict[str, Any]:
    """A new tree object (new dicts and lists) around `leaves`: `{"layers": [layer, ...]}`."""
    return {"layers": [_layer(leaves, i) for i in range(0, len(leaves), LAYER_LEAVES)]}


def sds_leaf(i: int) -> jax.ShapeDtypeStruct:
    shape, dtype = LAYER_TYPES[i % LAYER_LEAVES]
    return jax.ShapeDtypeStruct(shape, dtype)


@ft.cache
def model_leaves(n_leaves: int, kind: str) -> tuple[Any, ...]:
    """`n_leaves` (a multiple of 10) distinct leaves of `model_tree`'s layers: `jax.Array`s
    (`kind="array"`, made with `jnp.zeros`) or `jax.ShapeDtypeStruct`s (`kind="sds"`)."""
    if n_leaves % LAYER_LEAVES:
        raise ValueError(f"a model tree has a multiple of {LAYER_LEAVES} leaves, not {n_leaves}")
    if kind == "sds":
        return tuple(sds_leaf(i) for i in range(n_leaves))
    if kind == "array":
        return tuple(jnp.zeros(*LAYER_TYPES[i % LAYER_LEAVES]) for i in range(n_leaves))
    raise ValueError(f"kind must be 'sds' or 'array', not {kind!r}")


def middle_layer(n_leaves: int) -> int:
    return n_leaves // LAYER_LEAVES // 2


def changed_tree(leaves: Sequence[Any]) -> tuple[dict[str, Any], str]:
    """`model_tree(leaves)` with the middle layer's attn "k" leaf made f32[4,5]; the path of that leaf."""
    mid = middle_layer(len(leaves))
    tree = model_tree(leaves)
    tree["layers"][mid]["attn"]["k"] = jax.ShapeDtypeStruct(CHANGED_SHAPE, F32)
    return tree, f"['layers'][{mid}]['attn']['k']"


def grown_tree(leaves: Sequence[Any]) -> tuple[dict[str, Any], str]:
    """`model_tree(leaves)` with one more leaf in the middle layer's mlp "bias" list; the path of that leaf."""
    mid = middle_layer(len(leaves))
    tree = model_tree(leaves)
    tree["layers"][mid]["mlp"]["bias"].append(sds_leaf(7))  # another f32[4], as bias[1]
    return tree, f"['layers'][{mid}]['mlp']['bias'][2]"


def check_one_mismatch(found: list[ts.Mismatch], path: str, kind: str) -> None:
    """Raise unless `found` is exactly one mismatch of `kind` at `path` (a wrong but fast diff must not pass)."""
    got = [(m.path, m.kind) for m in found]
    if got != [(path, kind)]:
        raise AssertionError(f"diff found {got[:5]}{' ...' if len(got) > 5 else ''}, expected [{(path, kind)}]")


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


# -- a GPT-2-small-sized train step (the "Will it fit?" guide's model, one device) -----------
GPT2 = {"vocab": 50_304, "d_model": 768, "layers": 12, "heads": 12, "d_ff": 3_072, "batch": 8, "seq": 1_024}


def gpt2_step_inputs(layers: int = 12) -> tuple[Callable[..., Any], Any, Any]:
    """`(train_step, state, batch)`: an AdamW train step of a 124M-parameter decoder (GPT-2
    small's sizes, `layers` layers), its state and a token batch, all abstract."""
    import optax  # a test extra, needed by this workload only

    c = {**GPT2, "layers": layers}
    d, f = c["d_model"], c["d_ff"]
    sds = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    layer = {"qkv": sds(d, 3 * d), "out": sds(d, d), "up": sds(d, f), "down": sds(f, d), "norm": sds(2, d)}
    params = {"embed": sds(c["vocab"], d), "pos": sds(c["seq"], d), "layers": [layer] * layers, "norm": sds(d)}
    tx = optax.adamw(3e-4, weight_decay=0.1)

    def norm(x: jax.Array, scale: jax.Array) -> jax.Array:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
        b, t = tokens.shape
        x = params["embed"][tokens] + params["pos"][:t]
        for p in params["layers"]:
            q, k, v = jnp.split(norm(x, p["norm"][0]) @ p["qkv"], 3, axis=-1)
            heads = lambda y: y.reshape(b, t, c["heads"], d // c["heads"])  # noqa: E731
            attended = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
            x = x + attended.reshape(b, t, d) @ p["out"]
            x = x + jax.nn.gelu(norm(x, p["norm"][1]) @ p["up"]) @ p["down"]
        logits = norm(x, params["norm"]) @ params["embed"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    def train_step(state: Any, tokens: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], tokens)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    state = {"params": params, "opt_state": jax.eval_shape(tx.init, params)}
    return train_step, state, jax.ShapeDtypeStruct((c["batch"], c["seq"]), jnp.int32)
