"""Programs whose buffers `tests/test_buffers.py` checks against XLA's own dump.

Run as a script (in a child process whose XLA_FLAGS make XLA dump every compiled
program): costs each program with `ts.cost` and prints one JSON object, by program
name, of what `ts.cost` reports. Each program has its own function name, so its dump
files are `module_*.jit_<name>.*`. Inputs are `ShapeDtypeStruct`s: nothing else compiles.
"""

import json
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


F32 = jnp.float32


def sds(*shape, dtype=F32, sharding=None):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _mlp_params(width=256, depth=3):
    return {f"layer{i}": {"w": sds(width, width), "b": sds(width)} for i in range(depth)}


def _mlp(params, x):
    for name in sorted(params):
        x = jnp.tanh(x @ params[name]["w"] + params[name]["b"])
    return x


def optax_step(params, opt_state, x, y):
    def loss(p):
        return jnp.mean((_mlp(p, x) - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = optax.adam(1e-3).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def _optax():
    params = _mlp_params()
    opt_state = jax.eval_shape(optax.adam(1e-3).init, params)
    return ts.cost(optax_step, params, opt_state, sds(64, 256), sds(64, 256), donate_argnums=(0, 1))


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.encoder = nnx.Linear(128, 512, rngs=rngs)
        self.decoder = nnx.Linear(512, 128, rngs=rngs)

    def __call__(self, x):
        return self.decoder(jax.nn.relu(self.encoder(x)))


def _nnx():
    graphdef, state = nnx.split(nnx.eval_shape(lambda: NnxMLP(nnx.Rngs(0))))

    def nnx_grads(state, x):
        def loss(state):
            return jnp.mean(nnx.merge(graphdef, state)(x) ** 2)

        return jax.grad(loss)(state)

    return ts.cost(nnx_grads, state, sds(256, 128))


class EqxMLP(eqx.Module):
    encoder: eqx.nn.Linear
    decoder: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.encoder = eqx.nn.Linear(128, 512, key=k1)
        self.decoder = eqx.nn.Linear(512, 128, key=k2)

    def __call__(self, x):
        return self.decoder(jax.nn.relu(self.encoder(x)))


def _eqx():
    model = eqx.filter_eval_shape(EqxMLP, jax.random.key(0))

    def eqx_grads(model, x):
        return eqx.filter_grad(lambda m: jnp.mean(jax.vmap(m)(x) ** 2))(model)

    return ts.cost(eqx_grads, model, sds(256, 128))


def _deep(x, ws):
    for w in ws:
        x = jnp.sin(x @ w)
    return jnp.sum(x**2)


def plain_grads(ws, x):
    return jax.grad(_deep, argnums=1)(x, ws)


def remat_grads(ws, x):
    layer = jax.checkpoint(lambda x, w: jnp.sin(x @ w))

    def deep(x, ws):
        for w in ws:
            x = layer(x, w)
        return jnp.sum(x**2)

    return jax.grad(deep, argnums=1)(x, ws)


def scan_grads(ws, x):
    def deep(x, ws):
        x, _ = jax.lax.scan(lambda x, w: (jnp.sin(x @ w), None), x, ws)
        return jnp.sum(x**2)

    return jax.grad(deep, argnums=1)(x, ws)


def sharded_step(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


def _sharded():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    w = sds(256, 512, sharding=NamedSharding(mesh, P(None, "d")))
    x = sds(64, 256, sharding=NamedSharding(mesh, P("d", None)))
    return ts.cost(sharded_step, w, x)


def cast_step(params, x):
    return jax.tree.map(lambda p: (p * x).astype(jnp.bfloat16), params)


def _cast():
    return ts.cost(cast_step, {"w": sds(128, 128), "b": sds(128)}, sds(), donate_argnums=0)


def _ws(n=4, width=256):
    return [sds(width, width) for _ in range(n)]


PROGRAMS = {
    "optax_step": _optax,
    "nnx_grads": _nnx,
    "eqx_grads": _eqx,
    "plain_grads": lambda: ts.cost(plain_grads, _ws(), sds(128, 256)),
    "remat_grads": lambda: ts.cost(remat_grads, _ws(), sds(128, 256)),
    "scan_grads": lambda: ts.cost(scan_grads, sds(4, 256, 256), sds(128, 256)),
    "sharded_step": _sharded,
    "cast_step": _cast,
}


def report(cost):
    return {
        "buffers": [
            {
                "nbytes": b.nbytes,
                "shape": None if b.shape is None else list(b.shape),
                "dtype": str(b.dtype),
                "kind": b.kind,
                "path": b.path,
                "op": b.op,
                "source": b.source,
                "donated": b.donated,
            }
            for b in cost.buffers
        ],
        "live_peak_bytes": cost.live_peak_bytes,
        "peak_bytes": cost.peak_bytes,
        "alias_bytes": cost.alias_bytes,
        "donation": {k: [d.path, d.reused, d.output, d.reason] for k, d in cost.donation.items()},
    }


if __name__ == "__main__":
    names = sys.argv[1:] or list(PROGRAMS)
    print(json.dumps({name: report(PROGRAMS[name]()) for name in names}))
