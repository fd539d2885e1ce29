"""Concurrency, memory and error hygiene."""

import concurrent.futures
import gc
import resource
import traceback

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import treeshape as ts


@pytest.mark.filterwarnings("ignore::treeshape.PrecisionWarning")  # bfloat16 sums of zeros are intended
def test_threads_share_the_cache_and_carries_correctly():
    def work(i):
        n = i % 5 + 1
        x = jnp.zeros((n, 3), jnp.bfloat16 if i % 2 else jnp.float32)
        s = ts.out_structure(lambda a: {"y": a @ jnp.ones((3, 2), a.dtype)}, x)
        assert s.leaves[0].shape == (n, 2) and s.leaves[0].dtype == x.dtype
        body = lambda c, xi: (c + xi.sum(), None)
        carry = ts.scan_carry(body, 0.0, x, policy="weak")
        assert jax.typeof(carry).dtype == x.dtype
        if i % 7 == 0:
            ts.clear_cache()
        return float(lax.scan(body, carry, x)[0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(200)))
    assert results == [0.0] * 200
    info = ts.cache_info()
    assert info.size <= info.maxsize


def _peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_many_distinct_functions_keep_the_cache_bounded_and_memory_flat():
    # Each call traces a fresh closure: the cache must stay at its bound, and the
    # closures (and what they hold) must be freed.
    big = jnp.zeros((256, 256))

    def make(i):
        payload = big + i  # a 256 KiB array each closure keeps alive
        return lambda x: x + payload[0, 0]

    def run(n):
        for i in range(n):
            ts.out_structure(make(i), jnp.ones(2))
        gc.collect()

    # The leak checker walks the heap on every trace: too slow for 3,000 traces,
    # and no transformation is involved here.
    with jax.check_tracer_leaks(False):
        run(300)
        before = _peak_rss_mib()
        run(3000)  # ~750 MiB of payloads if anything kept them
    grown = _peak_rss_mib() - before
    assert ts.cache_info().size <= 300 + 3000
    assert grown < 150, f"peak RSS grew by {grown:.0f} MiB"


def _frames(err):
    return [frame.name for frame in traceback.extract_tb(err.__traceback__)]


def test_errors_from_fn_keep_their_type_and_the_users_frame():
    class ModelError(Exception):
        pass

    def my_model(x):
        raise ModelError("bad config")

    with pytest.raises(ModelError) as info:
        ts.out_structure(my_model, jnp.ones(2))
    assert _frames(info.value)[-1] == "my_model"

    with pytest.raises(ModelError) as info:
        jax.jit(lambda x: ts.scan_carry(lambda c, xi: my_model(c), x, length=2))(jnp.ones(2))
    assert _frames(info.value)[-1] == "my_model"
    # the cache holds nothing broken: the next good call works
    assert ts.out_structure(lambda x: x * 2, jnp.ones(2)).leaves[0].shape == (2,)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: ts.structure_of(jnp.zeros(2)).check(jnp.zeros(3)),
        lambda: ts.scan_carry(lambda c, x: (c.astype(jnp.float16), None), jnp.zeros(2), length=2),
        lambda: ts.upcast(jnp.zeros(2), jnp.zeros(2, jnp.bfloat16)),
        lambda: ts.out_structure(3),
        lambda: ts.scan_carry(lambda c, x: (c, None), 0.0),
    ],
    ids=["check", "scan_carry", "upcast", "out_structure", "length"],
)
def test_treeshape_errors_are_raised_from_treeshape_not_jax_internals(bad):
    with pytest.raises((TypeError, ValueError)) as info:
        bad()
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert "/treeshape/" in last.filename, last.filename
    assert str(info.value).startswith("treeshape.")
