"""`treeshape demo`: the built-in example, offline, in seconds: a small model's parameter and
optimizer-state structures, its scan carry (the mismatch and the fix it names), a few scan
steps of training and the cache's figures."""

import argparse
from typing import Any, TextIO


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    demo = sub.add_parser(
        "demo",
        help="run the built-in example: a small model's structures, carry and training",
        description="Infer a small MLP's parameter and optimizer-state structures,\n"
        "build the scan carry, train it for a few scan steps and print the\n"
        "cache figures. Offline, a few seconds, no arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return demo  # type: ignore[no-any-return]


def run(stdout: TextIO) -> int:
    """A 2-layer MLP regression, trained with a hand-written Adam inside `lax.scan`."""
    import textwrap

    import jax
    import jax.numpy as jnp
    from jax import lax

    from .. import CarryMismatchError, cache_info, carry_structure, describe, out_structure, scan_carry

    def say(text: str = "") -> None:
        print(text, file=stdout)

    steps_per_scan, scans, batch, features, hidden = 50, 4, 64, 8, 32
    k_data, k_true, k_1, k_2 = jax.random.split(jax.random.key(0), 4)

    # Synthetic data: one batch per scan step, y = sin(x @ v).
    x = jax.random.normal(k_data, (scans, steps_per_scan, batch, features))
    v = jax.random.normal(k_true, (features, 1)) / jnp.sqrt(features)
    y = jnp.sin(x @ v)

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

    say("treeshape demo: a 2-layer MLP regression trained with a hand-written Adam")
    say()
    say("1. The parameters: ts.describe(params)")
    say(describe(params))
    say()

    opt_structure = out_structure(adam_init, params)
    say("2. The optimizer state, inferred without running adam_init:")
    say("   ts.out_structure(adam_init, params)")
    say(str(opt_structure))
    say()

    # The scan carry: the parameters plus a zero optimizer state whose moments
    # are stored in bfloat16. `train_step` returns them as float32, so this
    # initial carry is not a type `lax.scan` accepts: `scan_carry` says which
    # leaves differ and names the policy that allows the change, and with it
    # converts `init` to the carry type `train_step` maps to itself.
    init = (params, opt_structure.astype(jnp.bfloat16).zeros())
    say("3. The scan carry (params, opt_state), with the moments stored in bfloat16:")
    say("   init = (params, opt_structure.astype(jnp.bfloat16).zeros())")
    say("   ts.scan_carry(train_step, init, xs) raises:")
    try:
        scan_carry(train_step, init, xs=(x[0], y[0]))
    except CarryMismatchError as err:
        for line in f"{type(err).__name__}: {err}".splitlines():
            bullet = " " * (len(line) - len(line.lstrip(" *")))
            say(textwrap.fill(line, 96, initial_indent="   ", subsequent_indent="   " + bullet) if line else "")
    say()
    say('   The fix it names: ts.scan_carry(train_step, init, xs, policy="promote")')
    carry = scan_carry(train_step, init, xs=(x[0], y[0]), policy="promote")
    settled = carry_structure(train_step, init, xs=(x[0], y[0]), policy="promote")
    say(str(settled))
    say(f"   the initial carry matches it: {settled.matches(carry)}")
    say()

    @jax.jit
    def train(carry: Any, xs: Any) -> tuple[Any, jax.Array]:
        return lax.scan(train_step, carry, xs)

    say(f"4. Training: lax.scan over {steps_per_scan} batches, {scans} times")
    for i in range(scans):
        carry, losses = train(carry, (x[i], y[i]))
        first, last = i * steps_per_scan + 1, (i + 1) * steps_per_scan
        say(f"   steps {first:3d}-{last:3d}  mean loss {float(losses.mean()):.4f}")
    say()

    # The same question again is answered from the cache, without tracing.
    out_structure(adam_init, params)
    info = cache_info()
    say("5. The out_structure cache: ts.cache_info()")
    hits, misses = _count(info.hits, "call"), _count(info.misses, "call")
    say(f"   {info}: {hits} answered without tracing, {misses} traced")
    return 0


def _count(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"
