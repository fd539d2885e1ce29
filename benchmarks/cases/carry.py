"""Case 8, `carry`: `carry_structure` on a fixed-point init vs one `jax.eval_shape` of the body (issue 3).

The scan body is a realistic train step (`workloads.make_train_step`): a
hand-written Adam update (no optax) of a 3-layer MLP (16-64-64-8, ReLU, mean
squared error), `body((params, (count, mu, nu)), (x, y)) -> (carry, loss)`,
with `jax.value_and_grad` inside; the carry has 19 leaves (params and Adam
moments in f32, `count` an int32), `xs` is 64 batches of 32. `init` already
is a fixed point, so `carry_structure` should trace the body once.

- *First call*: a fresh body (from a factory) and `ts.clear_cache()` before
  every repetition, on both sides; the baseline is one `jax.eval_shape(body,
  init, x_step)`, `x_step` being one step of `xs` as `ShapeDtypeStruct`s,
  computed beforehand (treeshape slices `xs` itself, inside the timing), so
  the baseline is the one trace any carry check needs and nothing more. Goal
  <=1.1x. Strict cache check: exactly 1 miss and 0 hits (one trace, no
  promotion step).
- *Cached*: the same body object again vs that same first-call `eval_shape`
  (fresh body each time). Goal: answered from the cache, <=0.1x, and a strict
  cache check of exactly 1 hit and 0 misses. For information, a third row
  compares it with `jax.eval_shape` of the same body again (JAX's own trace
  cache hit).
"""

from collections.abc import Callable
from typing import Any

import jax

import treeshape as ts

from harness import Config, Row, at_most, case, check_cache, compare, per_call, repeat, timed_row
from workloads import adam_inputs, make_train_step


def _fresh_train_step() -> Callable[..., Any]:
    """A new body and an empty cache: a first call for JAX and for treeshape."""
    ts.clear_cache()
    return make_train_step()


@case("carry")
def carry_first_and_cached(cfg: Config) -> list[Row]:
    """8. carry_structure on a fixed-point init vs one jax.eval_shape of the body."""
    init, xs = adam_inputs("float32")
    x_step = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), xs)  # what the body sees
    assert ts.carry_structure(make_train_step(), init, xs) == ts.structure_of(init), "init must be a fixed point"
    rows = []
    t = compare(
        per_call(_fresh_train_step, lambda body: jax.eval_shape(body, init, x_step)),
        per_call(_fresh_train_step, lambda body: ts.carry_structure(body, init, xs)),
        cfg,
        reps=31,
    )
    row = timed_row("8 carry_structure first call vs one eval_shape, Adam MLP", t, at_most(1.1))
    # One trace of the body (1 miss) and nothing else: init already is the fixed point.
    rows.append(check_cache(row, lambda: ts.carry_structure(make_train_step(), init, xs), 0, 1, strict=True))

    body = make_train_step()
    ts.carry_structure(body, init, xs)  # fill the cache
    t = compare(
        per_call(make_train_step, lambda fresh: jax.eval_shape(fresh, init, x_step)),
        repeat(lambda: ts.carry_structure(body, init, xs)),
        cfg,
        reps=21,
    )
    row = timed_row(
        "8 carry_structure cached (same body) vs one eval_shape",
        t,
        at_most(0.1, "cache hit"),
        "baseline: a first eval_shape (fresh body), as in the row above",
    )
    rows.append(check_cache(row, lambda: ts.carry_structure(body, init, xs), 1, 0, strict=True))
    t = compare(
        repeat(lambda: jax.eval_shape(body, init, x_step)),
        repeat(lambda: ts.carry_structure(body, init, xs)),
        cfg,
        reps=21,
    )
    row = timed_row(
        "8 carry_structure cached vs eval_shape, same body",
        t,
        None,
        "baseline: jax.eval_shape of the same body again (JAX's own trace cache)",
    )
    rows.append(check_cache(row, lambda: ts.carry_structure(body, init, xs), 1, 0))
    return rows
