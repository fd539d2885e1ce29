import gc
import os


# Eight host CPU devices for sharding and shard_map tests: must be set before
# JAX initialises its backends.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# The CPU alone, also where JAX's CUDA plugin or libtpu is installed (the `test` extra
# installs both, for `target=`): they compile deviceless without starting a device. jax
# 0.8.0's CUDA plugin checks the CUDA libraries when it loads unless told not to.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from helpers import CONTEXTS, listening  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import treeshape as ts  # noqa: E402


# A few hundred examples per property in CI; `HYPOTHESIS_PROFILE=thorough` for more.
_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("thorough", max_examples=2000, deadline=None, suppress_health_check=_HEALTH)
# CI's second and third passes (x64, the floor release): half as many.
settings.register_profile("ci-repeat", max_examples=100, deadline=None, suppress_health_check=_HEALTH)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=list(CONTEXTS))
def in_context(request):
    """Run `f(x)` inside one JAX transformation (parametrised over all of them)."""
    return CONTEXTS[request.param]


@pytest.fixture(params=["top", "jit"])
def top_or_jit(request):
    """Run a function of no arguments at top level, or traced under `jax.jit`."""
    return (lambda f: f()) if request.param == "top" else (lambda f: jax.jit(f)())


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
# otherwise (`JAX_CHECK_TRACER_LEAKS=0`: CI's x64 pass and most of the floor's; the checker
# turns JAX's caches off, which makes every eager operation compile again and
# the suite three times slower; .ci/run says what that gives up).
_CHECK_LEAKS = jax.config.jax_check_tracer_leaks if "JAX_CHECK_TRACER_LEAKS" in os.environ else True


def pytest_collection_finish(session):
    """What collection made (every module imported, every parameter built) is frozen out of
    the garbage collector's walks: JAX's leak checker runs a full collection and walks every
    object the collector tracks each time a trace outlives its end, which took a third of a
    second each on the heap of the whole suite. The leak check finds the same leaks: it looks
    for tracers that refer to the ended trace, and every tracer is made by a test, after the
    freeze, so the walk still sees it (as it sees every object a test makes)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _no_tracer_leaks():
    with jax.check_tracer_leaks(_CHECK_LEAKS):
        yield


@pytest.fixture(autouse=True)
def _fresh_cache():
    ts.clear_cache()
    yield
