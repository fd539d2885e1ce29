"""Case 20, `timeline`: what `Cost.timeline` adds to an uncached `ts.cost` of a deep train step.

`ts.cost(step, params, x)` of a new train step (value_and_grad and SGD) of a
96-layer MLP, unrolled (every layer a `jax.named_scope`, so the schedule has
thousands of steps and values), its cache emptied before each call, then reading
the timeline, the buffers live at its peak step and its phases, vs
`jax.jit(step).lower(params, x).compile()` of the same new function. Each call's
step has its own learning rate, so neither side finds the program in JAX's caches.

Why the baseline is fair: it is the compilation every uncached `ts.cost` runs
anyway, and what a user writes by hand to get XLA's figures. The difference is
tracing for the loop walk, reading the buffer assignment and module, the live
ranges, and the timeline's sweep over their ends. Goal: at most 1.3x.
"""

import itertools
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Row, at_most, case, compare, per_call, timed_row


WIDTH, BATCH = 256, 64
_RATES = itertools.count()


def _step(layers: int) -> Any:
    """A new train step of a `layers`-layer MLP, with a learning rate no other has."""
    rate = 0.01 + next(_RATES) * 1e-7

    def loss(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        for i, p in enumerate(params):
            with jax.named_scope(f"layers_{i}"):
                x = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.mean(x**2)

    def step(params: list[dict[str, jax.Array]], x: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x)
        return value, jax.tree.map(lambda w, g: w - rate * g, params, grads)

    return step


@case("timeline")
def timeline(cfg: Config) -> list[Row]:
    """20. An uncached ts.cost reading the timeline of a 96-layer train step vs lower().compile()."""
    layers = 12 if cfg.quick else 96
    params = [
        {"w": jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32), "b": jax.ShapeDtypeStruct((WIDTH,), jnp.float32)}
    ] * layers
    x = jax.ShapeDtypeStruct((BATCH, WIDTH), jnp.float32)

    def fresh() -> Any:
        ts.clear_cache()
        return _step(layers)

    def with_jax(step: Any) -> Any:
        return jax.jit(step).lower(params, x).compile()

    def with_treeshape(step: Any) -> Any:
        t = ts.cost(step, params, x).timeline
        return t.buffers_at(t.peak_step), t.phases()

    t = compare(per_call(fresh, with_jax), per_call(fresh, with_treeshape), cfg, reps=5)
    name = f"20 ts.cost miss with its timeline, {layers}-layer unrolled train step, vs lower().compile()"
    row = timed_row(name, t, at_most(1.3))
    c = ts.cost(fresh(), params, x)
    assert c.timeline is not None
    row.detail["steps"] = len(c.timeline.live_bytes)
    row.detail["values"] = len(c.timeline._values)
    row.detail["phases"] = len(c.timeline.phases())
    return [row]
