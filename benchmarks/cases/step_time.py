"""Case 21, `step_time`: `ts.cost(..., target="v5e")` with its time vs the bare deviceless
libtpu compile of the same step with its dump.

The program: a train step (value_and_grad and SGD) of a 4-layer bf16 MLP whose layers run
in one `lax.scan` (1024 wide, a batch of 256), its parameters donated, on one v5e. The
baseline is what a user writes by hand for libtpu's own figures and its kernels' estimates:
the topology's device from `jax.experimental.topologies` (made once, outside the timing),
`ShapeDtypeStruct`s on it, and `jax.jit(step, donate_argnums=0).lower(...).compile()` with
libtpu asked to dump the optimized module (`xla_dump_to`, as text and protobuf: what
`ts.cost` asks for), then `memory_analysis()`.

Row 1, a miss: a fresh step on both sides, the cost cache emptied before each `ts.cost`. On
top of that compile `ts.cost` traces the step, reads the buffer assignment and libtpu's
live ranges, counts the scan's body by its trip count, and reads every kernel of the dumped
module (each costed alone by XLA's HLO cost analysis) into `Cost.time`. Goal: at most 1.3x
(issue 49's). Row 2, a hit: the same step again compiles nothing. Goal: >= 100x faster.
Needs libtpu (`treeshape[tpu]`); without it the case has no rows.
"""

import tempfile
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import treeshape as ts

from harness import Config, Row, at_most, case, compare, faster, per_call, repeat, target_ready, timed_row


def _fresh_step() -> Any:
    def loss(params: jax.Array, x: jax.Array) -> jax.Array:
        h = lax.scan(lambda h, w: (jax.nn.gelu(h @ w), None), x, params)[0]
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    def step(params: jax.Array, x: jax.Array) -> jax.Array:
        return params - 0.01 * jax.grad(loss)(params, x)

    return step


@case("step_time")
def step_time(cfg: Config) -> list[Row]:
    """21. ts.cost(..., target="v5e") with its time vs the bare deviceless libtpu compile with its dump."""
    if not target_ready("step_time", "v5e"):
        return []
    from jax.experimental import topologies

    device = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]
    on_chip = jax.sharding.SingleDeviceSharding(device)
    abstract = (jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16))
    real = tuple(a.update(sharding=on_chip) for a in abstract)

    def by_hand(step: Any) -> Any:
        with tempfile.TemporaryDirectory() as dump:
            options = {"xla_dump_to": dump, "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}
            return jax.jit(step, donate_argnums=0).lower(*real).compile(options).memory_analysis()

    def with_treeshape(step: Any) -> Any:
        cost = ts.cost(step, *abstract, donate_argnums=0, target="v5e")
        assert cost.time is not None and cost.time.seconds is not None
        return cost

    def fresh() -> Any:
        ts.clear_cache()
        return _fresh_step()

    t = compare(per_call(fresh, by_hand), per_call(fresh, with_treeshape), cfg, reps=7)
    miss = timed_row("21 ts.cost(target='v5e') with its time, miss, vs deviceless compile + dump", t, at_most(1.3))
    step = _fresh_step()
    t = compare(per_call(_fresh_step, by_hand), repeat(lambda: with_treeshape(step)), cfg, reps=5)
    hit = timed_row("21 cached ts.cost(target='v5e') with its time vs deviceless compile + dump", t, faster(100))
    return [miss, hit]
