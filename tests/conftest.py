import os


# Eight host CPU devices for sharding and shard_map tests: must be set before
# JAX initialises its backends.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from _jax_range import listening  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import treeshape as ts  # noqa: E402


# A few hundred examples per property in CI; `HYPOTHESIS_PROFILE=thorough` for more.
_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=_HEALTH)
# CI's second and third passes (x64, the floor release): half as many.
settings.register_profile("ci-repeat", max_examples=100, deadline=None, suppress_health_check=_HEALTH)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _shard_map(f, x):
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    g = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    xs = jnp.concatenate([x] * 8)
    return g(jax.device_put(xs, jax.NamedSharding(mesh, P("i"))))


def _custom_jvp(f, x):
    @jax.custom_jvp
    def g(y):
        return y

    @g.defjvp
    def g_jvp(primals, tangents):
        (y,), (t,) = primals, tangents
        return f(y), f(t)

    return jax.jvp(g, (x,), (x,))[1]


def _custom_vjp_fwd(f, x):
    @jax.custom_vjp
    def g(y):
        return y

    def fwd(y):
        return f(y), None

    def bwd(_, ct):
        return (ct,)

    g.defvjp(fwd, bwd)
    return jax.grad(lambda y: g(y).sum())(x)


def _custom_vjp_bwd(f, x):
    @jax.custom_vjp
    def g(y):
        return y

    def fwd(y):
        return y, None

    def bwd(_, ct):
        return (f(ct),)

    g.defvjp(fwd, bwd)
    return jax.grad(lambda y: g(y).sum())(x)


# Each context calls `f(x)` with `x` a float32 vector seen through one JAX
# transformation; `f` must return an array shaped like its input.
CONTEXTS = {
    "top": lambda f, x: f(x),
    "jit": lambda f, x: jax.jit(f)(x),
    "vmap": lambda f, x: jax.vmap(f)(jnp.stack([x, x]))[0],
    "grad": lambda f, x: jax.grad(lambda y: f(y).sum())(x),
    "jvp": lambda f, x: jax.jvp(f, (x,), (x,))[1],
    "vjp": lambda f, x: jax.vjp(f, x)[1](x)[0],
    "scan": lambda f, x: jax.lax.scan(lambda c, _: (f(c), None), x, length=2)[0],
    "while": lambda f, x: jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, f(c[1])), (0, x))[1],
    "fori": lambda f, x: jax.lax.fori_loop(0, 2, lambda i, c: f(c), x),
    "cond": lambda f, x: jax.lax.cond(x.sum() > 0, f, lambda y: y, x),
    "checkpoint": lambda f, x: jax.checkpoint(f)(x),
    "custom_jvp": _custom_jvp,
    "custom_vjp_fwd": _custom_vjp_fwd,
    "custom_vjp_bwd": _custom_vjp_bwd,
    "shard_map": _shard_map,
    "jit_vmap_grad": lambda f, x: jax.jit(jax.vmap(jax.grad(lambda y: f(y).sum())))(jnp.stack([x, x]))[0],
}


@pytest.fixture(params=list(CONTEXTS))
def in_context(request):
    """Run `f(x)` inside one JAX transformation (parametrised over all of them)."""
    return CONTEXTS[request.param]


@pytest.fixture
def compiles():
    """A list that gains one entry per backend compilation while the test runs."""
    seen = []

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(duration)

    with listening(on_duration=listener):
        yield seen


# Tracer leaks are checked around every test, unless JAX's own switch says
# otherwise (`JAX_CHECK_TRACER_LEAKS=0`: CI's x64 pass, since leaks do not depend
# on the dtype width and the checker turns JAX's caches off, which makes every
# eager operation compile again and the suite three times slower).
_CHECK_LEAKS = jax.config.jax_check_tracer_leaks if "JAX_CHECK_TRACER_LEAKS" in os.environ else True


@pytest.fixture(autouse=True)
def _no_tracer_leaks():
    with jax.check_tracer_leaks(_CHECK_LEAKS):
        yield


@pytest.fixture(autouse=True)
def _fresh_cache():
    ts.clear_cache()
    yield
