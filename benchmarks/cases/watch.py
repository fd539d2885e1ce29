"""Case 17, `watch`: a watched jitted train step vs the same step unwatched, 10,000 calls each.

A small SGD step on a two-layer MLP (`{"w1": f32[8,32], "b1": f32[32], "w2": f32[32,1],
"b2": f32[1]}`, a batch of `f32[16,8]`), jitted as `jax.jit(step)` and as
`jax.jit(ts.watch(step))`, and likewise with `eqx.filter_jit`; each side runs
a training loop of 10,000 steps (1,000 with `--quick`), each step's output
the next step's state, and waits for the last result.

Why the baseline is fair: both sides are compiled before timing and run the
same compiled program (`ts.watch` adds nothing to it), so the ratio is what
the watch costs per call once compiled: nothing, as the wrapper is called only
when JAX traces. The step is small on purpose, so that any per-call cost
(JAX's dispatch, `eqx.filter_jit`'s hashing of static parts, which include
the watched function) would show. Each row checks that its watch saw exactly
one trace. Goal: <=1.02.
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import treeshape as ts

from harness import Config, Row, at_most, case, compare, repeat, timed_row


def step(params: dict[str, jax.Array], x: jax.Array) -> dict[str, jax.Array]:
    def loss(p: dict[str, jax.Array]) -> jax.Array:
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"]) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def _loop(jitted: Any, params: Any, x: Any, n: int) -> Any:
    def run() -> Any:
        state = params
        for _ in range(n):
            state = jitted(state, x)
        return jax.block_until_ready(state)

    return run


@case("watch")
def watch(cfg: Config) -> list[Row]:
    """17. A watched jitted train step vs the same step unwatched, 10,000 calls each."""
    rng = np.random.default_rng(0)
    shapes = {"w1": (8, 32), "b1": (32,), "w2": (32, 1), "b2": (1,)}
    params = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}
    x = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    n = 1_000 if cfg.quick else 10_000
    rows = []
    for name, jit in (("jax.jit", jax.jit), ("eqx.filter_jit", eqx.filter_jit)):
        watched = ts.watch(step)  # the watches of `step` share one history: count this row's traces
        before = len(watched.traces)
        plain, observed = jit(step), jit(watched)
        t = compare(repeat(_loop(plain, params, x, n)), repeat(_loop(observed, params, x, n)), cfg, reps=11)
        row = timed_row(f"17 {n:,} steps, {name}(ts.watch(step)) vs {name}(step)", t, at_most(1.02))
        traced = len(watched.traces) - before
        if traced != 1:
            row.add_note(f"WARNING: the watch saw {traced} traces, expected 1")
        rows.append(row)
    return rows
