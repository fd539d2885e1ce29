"""Case 19, `target`: `ts.cost(..., target="h100")` vs the bare deviceless compile of the same program.

The program: a train step (value_and_grad and SGD) of a 4-layer bf16 MLP whose layers
run in one `lax.scan` (1024 wide), its state donated, planned FSDP over 64 H100s on an
`AbstractMesh`. The baseline is what a user writes by hand for XLA:GPU's own figures:
the topology's devices from `jax.experimental.topologies` (made once, outside the
timing), a `Mesh` of them, `ShapeDtypeStruct`s with `NamedSharding`s, and
`jax.jit(step, donate_argnums=0).lower(...).compile()`, then `memory_analysis()`.

Row 1, a cached call: `ts.cost` of the same step again compiles nothing (checked: one
cost-cache hit, no miss), where the baseline compiles every time. Goal: >=100x faster.
Row 2, a miss: a fresh step (no cache knows it) on both sides, the cost cache emptied
before each `ts.cost`. On top of the compile, `ts.cost` traces the step, has XLA dump
the compile's buffer assignment and reads it, runs the HLO cost analysis of the
optimized module, and counts the scan's body by its trip count: XLA partitions that scan
(`Auto` axes), so its body is read from the compiled program's optimized HLO and costed
alone (nothing compiles again). Goal: at most 1.2x (issue 40's).
Row 3, a miss of the same step with its layers unrolled (no loop): the compile and the
readings alone. Goal: at most 1.2x. Needs JAX's
CUDA plugin (`treeshape[cuda]`); without it the case has no rows.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec as P

import treeshape as ts

from harness import Config, Row, at_most, case, compare, faster, per_call, repeat, target_ready, timed_row


def _fresh_step(unrolled: bool = False) -> Any:
    def loss(params: jax.Array, x: jax.Array) -> jax.Array:
        if unrolled:
            h = x
            for i in range(params.shape[0]):
                h = jax.nn.gelu(h @ params[i])
        else:
            h = lax.scan(lambda h, w: (jax.nn.gelu(h @ w), None), x, params)[0]
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    def step(params: jax.Array, x: jax.Array) -> jax.Array:
        return params - 0.01 * jax.grad(loss)(params, x)

    return step


def _inputs(mesh: Any) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    params = jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "fsdp")))
    x = jax.ShapeDtypeStruct((64 * 16, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))
    return params, x


@case("target")
def target(cfg: Config) -> list[Row]:
    """19. ts.cost(..., target="h100") vs the bare deviceless XLA:GPU compile of the same step."""
    if not target_ready("target", "h100"):
        return []
    from treeshape._cost import _target

    devices = _target.devices("h100", "1x8x8")
    auto = (AxisType.Auto,)
    abstract = _inputs(AbstractMesh((64,), ("fsdp",), axis_types=auto))
    real = _inputs(Mesh(np.array(devices), ("fsdp",), axis_types=auto))

    def by_hand(step: Any) -> Any:
        return jax.jit(step, donate_argnums=0).lower(*real).compile().memory_analysis()

    def with_treeshape(step: Any) -> Any:
        return ts.cost(step, *abstract, donate_argnums=0, target="h100")

    step = _fresh_step()  # the baseline compiles a fresh step each time: JAX would answer the same one from its cache
    t = compare(per_call(_fresh_step, by_hand), repeat(lambda: with_treeshape(step)), cfg, reps=7)
    cached = timed_row("19 cached ts.cost(target='h100'), 64 H100s, vs deviceless compile", t, faster(100))
    before = ts.cache_info()
    with_treeshape(step)
    after = ts.cache_info()
    got = (after.cost_hits - before.cost_hits, after.cost_misses - before.cost_misses)
    cached.detail["cache"] = {"hits": got[0], "misses": got[1]}
    if got != (1, 0):
        cached.add_note(f"WARNING: expected 1 cost-cache hit and 0 misses per call, got {got[0]} and {got[1]}")
        cached.cache_ok = False

    def fresh() -> Any:
        ts.clear_cache()
        return _fresh_step()

    t = compare(per_call(fresh, by_hand), per_call(fresh, with_treeshape), cfg, reps=5)
    miss = timed_row("19 ts.cost(target='h100') miss, 64 H100s, loops counted, vs deviceless compile", t, at_most(1.2))

    def fresh_unrolled() -> Any:
        ts.clear_cache()
        return _fresh_step(unrolled=True)

    t = compare(per_call(fresh_unrolled, by_hand), per_call(fresh_unrolled, with_treeshape), cfg, reps=5)
    flat = timed_row("19 ts.cost(target='h100') miss, 64 H100s, no loop, vs deviceless compile", t, at_most(1.2))
    return [cached, miss, flat]
