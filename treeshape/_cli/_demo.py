"""`treeshape demo`: the built-in example, offline, in seconds: a small model's parameter and
optimizer-state structures, its scan carry (the mismatch and the fix it names), a few scan
steps of training, the cache's figures, what its train step needs (on the CPU, unless JAX has
an accelerator here) and the largest batch that fits a budget, and where libtpu is installed
(the `tpu` extra) its time on a v5e and the fastest of two plans, compiled without one."""

import argparse
import functools
import json
import re
import textwrap
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TextIO


# What the demo sizes and plans: the budget of its largest batch, and the plan of its state
# and batches in two dtypes on one v5e (b up to 16: five compiles each, a few seconds).
BUDGET: Final = 2**20
PLAN_CHOICES: Final = {"dtype": ["float32", "bfloat16"]}
PLAN_MAX_SIZE: Final = 16
_TARGET: Final = "v5e"
_WIDTH: Final = 96


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    demo = sub.add_parser(
        "demo",
        help="run the built-in example: a small model's structures, carry, training and cost",
        description="Infer a small MLP's parameter and optimizer-state structures,\n"
        "build the scan carry, train it for a few scan steps, print the\n"
        "cache figures, what its train step needs and the largest batch\n"
        "that fits 1 MiB; with libtpu installed (the tpu extra), its time\n"
        "on a TPU v5e and the fastest plan, compiled without one.\n"
        "Offline, seconds, no arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return demo  # type: ignore[no-any-return]


class Model(NamedTuple):
    """The demo's model: a 2-layer MLP regression, trained with a hand-written Adam."""

    params: Any
    x: Any  # (scans, steps per scan, batch, features): one batch per scan step
    y: Any
    adam_init: Callable[[Any], Any]
    train_step: Callable[[Any, Any], tuple[Any, Any]]
    make: Callable[[str], tuple[Any, ...]]  # the plan's: (train_step, state, batches of b rows)


@functools.cache  # one per process: the demo run again in it (its tests) compiles nothing again
def model() -> Model:
    """The model, its synthetic data (y = sin(x @ v)) and its train step."""
    import jax
    import jax.numpy as jnp

    from .. import structure_of

    steps_per_scan, scans, batch, features, hidden = 50, 4, 64, 8, 32
    k_data, k_true, k_1, k_2 = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(k_data, (scans, steps_per_scan, batch, features))
    v = jax.random.normal(k_true, (features, 1)) / jnp.sqrt(features)
    params = {
        "hidden": {
            "w": jax.random.normal(k_1, (features, hidden)) / jnp.sqrt(features),
            "b": jnp.zeros(hidden),
        },
        "out": {
            "w": jax.random.normal(k_2, (hidden, 1)) / jnp.sqrt(hidden),
            "b": jnp.zeros(1),
        },
    }

    def predict(params: Any, x: jax.Array) -> Any:
        h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
        return h @ params["out"]["w"] + params["out"]["b"]

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> Any:
        return jnp.mean((predict(params, x) - y) ** 2)

    def adam_init(params: Any) -> Any:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return {"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": zeros}

    def adam_update(grads: Any, state: Any, params: Any, lr: float = 1e-2) -> Any:
        b1, b2, eps = 0.9, 0.999, 1e-8
        count = state["count"] + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
        nu = jax.tree.map(lambda n, g: b2 * n + (1 - b2) * g * g, state["nu"], grads)
        t = count.astype(jnp.float32)

        def step(p: jax.Array, m: jax.Array, n: jax.Array) -> Any:
            m_hat, n_hat = m / (1 - b1**t), n / (1 - b2**t)
            return p - lr * m_hat / (jnp.sqrt(n_hat) + eps)

        new_params = jax.tree.map(step, params, mu, nu)
        return new_params, {"count": count, "mu": mu, "nu": nu}

    def train_step(carry: Any, batch: Any) -> tuple[Any, jax.Array]:
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        params, opt_state = adam_update(grads, opt_state, params)
        return (params, opt_state), loss

    @functools.cache  # one step per dtype: asked again, the plan's compiles hit the cache
    def make(dtype: str) -> tuple[Any, ...]:
        (b,) = jax.export.symbolic_shape("b")
        state = structure_of((params, adam_init(params))).astype(dtype)
        return train_step, state, (jax.ShapeDtypeStruct((b, features), dtype), jax.ShapeDtypeStruct((b, 1), dtype))

    return Model(params, x, jnp.sin(x @ v), adam_init, train_step, make)


def run(stdout: TextIO) -> int:
    """The demo's sections, in order: structures, the carry, training, the cache, then what
    the train step costs, the largest batch that fits, and its time and plan on a v5e."""

    def say(text: str = "") -> None:
        print(text, file=stdout)

    m = model()
    say("treeshape demo: a 2-layer MLP regression trained with a hand-written Adam")
    say()
    opt_structure = _structures(say, m)
    carry = _carry(say, m, opt_structure)
    carry = _train(say, m, carry)
    _cache(say, m)
    batch = (m.x[0, 0], m.y[0, 0])
    _cost(say, m, carry, batch)
    _on_a_v5e(say, m, carry, batch)
    return 0


def _structures(say: Callable[..., None], m: Model) -> Any:
    """1 and 2: the parameters, and the optimizer state inferred without running its init."""
    from .. import describe, out_structure

    say("1. The parameters: ts.describe(params)")
    say(describe(m.params))
    say()
    opt_structure = out_structure(m.adam_init, m.params)
    say("2. The optimizer state, inferred without running adam_init:")
    say("   ts.out_structure(adam_init, params)")
    say(str(opt_structure))
    say()
    return opt_structure


def _carry(say: Callable[..., None], m: Model, opt_structure: Any) -> Any:
    """3: the scan carry with the moments stored in bfloat16. `train_step` returns them as
    float32, so this initial carry is not a type `lax.scan` accepts: `scan_carry` says which
    leaves differ and names the policy that allows the change, and with it converts `init`
    to the carry type `train_step` maps to itself."""
    import jax.numpy as jnp

    from .. import CarryMismatchError, carry_structure, scan_carry

    xs = (m.x[0], m.y[0])
    init = (m.params, opt_structure.astype(jnp.bfloat16).zeros())
    say("3. The scan carry (params, opt_state), with the moments stored in bfloat16:")
    say("   init = (params, opt_structure.astype(jnp.bfloat16).zeros())")
    say("   ts.scan_carry(train_step, init, xs) raises:")
    try:
        scan_carry(m.train_step, init, xs=xs)
    except CarryMismatchError as err:
        _wrapped(say, f"{type(err).__name__}: {err}")
    say()
    say('   The fix it names: ts.scan_carry(train_step, init, xs, policy="promote")')
    carry = scan_carry(m.train_step, init, xs=xs, policy="promote")
    settled = carry_structure(m.train_step, init, xs=xs, policy="promote")
    say(str(settled))
    say(f"   the initial carry matches it: {settled.matches(carry)}")
    say()
    return carry


def _train(say: Callable[..., None], m: Model, carry: Any) -> Any:
    """4: a few `lax.scan`s of training, and the loss going down."""
    import jax
    from jax import lax

    @jax.jit
    def train(carry: Any, xs: Any) -> tuple[Any, jax.Array]:
        return lax.scan(m.train_step, carry, xs)

    scans, steps_per_scan = m.x.shape[:2]
    say(f"4. Training: lax.scan over {steps_per_scan} batches, {scans} times")
    for i in range(scans):
        carry, losses = train(carry, (m.x[i], m.y[i]))
        first, last = i * steps_per_scan + 1, (i + 1) * steps_per_scan
        say(f"   steps {first:3d}-{last:3d}  mean loss {float(losses.mean()):.4f}")
    say()
    return carry


def _cache(say: Callable[..., None], m: Model) -> None:
    """5: the same question again is answered from the cache, without tracing."""
    from .. import cache_info, out_structure

    out_structure(m.adam_init, m.params)
    info = cache_info()
    say("5. The out_structure cache: ts.cache_info()")
    hits, misses = _count(info.hits, "call"), _count(info.misses, "call")
    say(f"   {info}: {hits} answered without tracing, {misses} traced")
    say()


def _cost(say: Callable[..., None], m: Model, carry: Any, batch: Any) -> None:
    """6 and 7: what one train step needs on this machine's device (the CPU, unless JAX has an
    accelerator here), its carry donated as a training loop donates it, and the largest batch
    that fits `BUDGET`."""
    import jax

    from .. import cost, largest_fit

    c = cost(m.train_step, carry, batch, donate_argnums=0)
    device = jax.devices()[0].platform.upper()
    say(f"6. What one train step needs on the {device}, compiled (nothing runs), its carry donated:")
    say(f"   ts.cost(train_step, carry, (x, y), donate_argnums=0), a batch of {batch[0].shape[0]} rows")
    _wrapped(
        say,
        f"peak {_bytes(c.peak_bytes)} per device: arguments {_bytes(c.argument_bytes)}, outputs "
        f"{_bytes(c.output_bytes)} ({_bytes(c.alias_bytes)} of them in the donated carry's memory), temporaries "
        f"{_bytes(c.temp_bytes)}; {c.flops:,.0f} FLOPs",
    )
    say()
    fit = largest_fit(*m.make(batch[0].dtype.name), dim="b", budget=BUDGET, donate_argnums=0)
    say(f"7. The largest batch that fits {_bytes(BUDGET)} per device, x and y of b rows, found by compiling:")
    say('   ts.largest_fit(train_step, carry, (x, y), dim="b", budget=2**20, donate_argnums=0)')
    grows = ""
    if fit.fixed_bytes is not None and fit.per_unit_bytes is not None:
        grows = f"; {_bytes(fit.fixed_bytes)} fixed and {_bytes(fit.per_unit_bytes)} a row"
    peak = "unknown" if fit.cost.peak_bytes is None else f"{fit.cost.peak_bytes:,} B"
    say(f"   b = {fit.size:,}: peak {peak} of {BUDGET:,}{grows} ({_count(fit.compiles, 'program')} compiled)")
    say()


def _on_a_v5e(say: Callable[..., None], m: Model, carry: Any, batch: Any) -> None:
    """8: the step's time on a v5e and the fastest plan, compiled by libtpu without one; where
    libtpu is not installed (or cannot start), what to do."""
    from .. import cost, plan

    try:
        c = cost(m.train_step, carry, batch, donate_argnums=0, target=_TARGET)
    except (ImportError, RuntimeError) as err:  # libtpu not installed, or it did not start here
        say(f"8. On a TPU {_TARGET}: not here.")
        for sentence in re.split(r"(?<=\.) (?=[A-Z]|pip )", str(err)):  # one a line: the fix whole
            _wrapped(say, sentence)
        again = f"Then run the demo again: it compiles this step for a {_TARGET} here, for its time and fastest plan."
        _wrapped(say, again)
        return
    say(f"8. On a TPU {_TARGET}, compiled here by libtpu without one: its time")
    say(f'   ts.cost(train_step, carry, (x, y), donate_argnums=0, target="{_TARGET}").time')
    _wrapped(say, c.time.line() if c.time is not None else "unknown")
    say()
    say(f"   and the fastest plan: the state and b rows in each dtype, b up to {PLAN_MAX_SIZE}:")
    say(f'   ts.plan(make, {json.dumps(PLAN_CHOICES)}, target="{_TARGET}", donate_argnums=0, max_size={PLAN_MAX_SIZE})')
    p = plan(m.make, PLAN_CHOICES, target=_TARGET, donate_argnums=0, max_size=PLAN_MAX_SIZE)
    say(textwrap.indent(str(p), "   "))
    if p.best is not None:
        best, compiled = p.best, _count(p.compiles, "program")
        say(f"   best: {best.choice} at b={best.size}, {best.throughput:,.0f} rows/s ({compiled} compiled)")
        say("   (a step this small takes the host's time to start it, whatever b: the smaller peak ranks first)")


def _wrapped(say: Callable[..., None], text: str, indent: str = "   ") -> None:
    """`text` wrapped for the terminal, indented, a bulleted line's continuation under its text."""
    for line in text.splitlines():
        bullet = " " * (len(line) - len(line.lstrip(" *")))
        say(textwrap.fill(line, _WIDTH, initial_indent=indent, subsequent_indent="   " + bullet) if line else "")


def _bytes(n: float | None) -> str:
    from .._shapes import human_bytes

    return "unknown" if n is None else human_bytes(round(n))


def _count(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"
