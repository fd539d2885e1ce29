"""Programs whose timelines `tests/test_timeline.py` checks against XLA's own dump.

Run as a script (in a child process whose XLA_FLAGS make XLA dump every compiled
program): costs each program with `ts.cost` and prints one JSON object, by program
name, of what `cost.timeline` says. Each program has its own function name, so its dump
files are `module_*.jit_<name>.*`. Inputs are `ShapeDtypeStruct`s: nothing else compiles.
"""

import json
import sys

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


F32 = jnp.float32


def sds(*shape, dtype=F32, sharding=None):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _layers(params, x):
    for i, p in enumerate(params):
        with jax.named_scope(f"layers_{i}"):
            x = jnp.tanh(x @ p["w"] + p["b"])
    return x


def _params(depth=3, width=256):
    return [{"w": sds(width, width), "b": sds(width)} for _ in range(depth)]


def mlp_step(params, x, y):
    """Forward and backward of an MLP whose layers are named scopes."""

    def loss(params):
        return jnp.mean((_layers(params, x) - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def optax_update(params, opt_state, grads):
    """An optax update, its parameters and state donated."""
    updates, opt_state = optax.adam(1e-3).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _optax():
    params = {"w": sds(512, 512), "b": sds(512)}
    opt_state = jax.eval_shape(optax.adam(1e-3).init, params)
    return ts.cost(optax_update, params, opt_state, params, donate_argnums=(0, 1))


def _scan_loss(ws, x):
    def layer(x, w):
        with jax.named_scope("layer"):
            return jnp.sin(x @ w), None

    x, _ = jax.lax.scan(layer, x, ws)
    return jnp.sum(x**2)


def scan_layers(ws, x):
    """A scan over stacked layers, forward and backward: each body appears once."""
    return jax.grad(_scan_loss)(ws, x)


def scan_layers_long(ws, x):
    """`scan_layers` with four times the layers."""
    return jax.grad(_scan_loss)(ws, x)


def while_carry(x, w):
    """A while loop carrying several arrays, some read after it."""

    def body(i, carry):
        a, b, c = carry
        return jnp.tanh(a @ w), b + a.sum(), c * 2.0

    a, b, c = jax.lax.fori_loop(0, 5, body, (x, x[0], x))
    return a.sum() + b.sum(), c


def nested_loops(x, w):
    """A loop inside a loop: each body appears once."""

    def outer(i, x):
        return jax.lax.fori_loop(0, 3, lambda j, x: jnp.tanh(x @ w), x) + x

    return jax.lax.fori_loop(0, 4, outer, x)


def cond_step(x, w, p):
    """A conditional's branches, flattened before it."""
    y = jax.lax.cond(p > 0, lambda x: jnp.tanh(x @ w) @ w, lambda x: jnp.sin(x) * 2.0, x)
    return (y @ w).sum(), y


def sharded_step(w, x):
    """A sharded forward and backward on the 8 CPU devices."""
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


def _sharded():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    w = sds(256, 512, sharding=NamedSharding(mesh, P(None, "d")))
    x = sds(64, 256, sharding=NamedSharding(mesh, P("d", None)))
    return ts.cost(sharded_step, w, x)


PROGRAMS = {
    "mlp_step": lambda: ts.cost(mlp_step, _params(), sds(64, 256), sds(64, 256)),
    "optax_update": _optax,
    "scan_layers": lambda: ts.cost(scan_layers, sds(4, 256, 256), sds(64, 256)),
    "scan_layers_long": lambda: ts.cost(scan_layers_long, sds(16, 256, 256), sds(64, 256)),
    "while_carry": lambda: ts.cost(while_carry, sds(128, 128), sds(128, 128)),
    "nested_loops": lambda: ts.cost(nested_loops, sds(128, 128), sds(128, 128)),
    "cond_step": lambda: ts.cost(cond_step, sds(128, 128), sds(128, 128), sds()),
    "sharded_step": _sharded,
}


def _buffer(b):
    return [b.nbytes, None if b.shape is None else list(b.shape), b.kind, b.path, b.op]


def report(cost):
    t = cost.timeline
    n = len(t.live_bytes)
    at = sorted({0, n // 3, n // 2, (2 * n) // 3, n - 1, t.peak_step})
    return {
        "live_bytes": list(t.live_bytes),
        "by_kind": {k: list(v) for k, v in t.by_kind.items()},
        "ops": list(t.ops),
        "peak_step": t.peak_step,
        "phases": {d: [list(p) for p in t.phases(d)] for d in (1, 2)},
        "buffers_at": {s: [_buffer(b) for b in t.buffers_at(s)] for s in at},
        "buffers": [_buffer(b) for b in cost.buffers],
        "live_peak_bytes": cost.live_peak_bytes,
        "chart": str(t),
    }


if __name__ == "__main__":
    names = sys.argv[1:] or list(PROGRAMS)
    print(json.dumps({name: report(PROGRAMS[name]()) for name in names}))
