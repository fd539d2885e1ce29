"""Case 10, `cache_memory`: 100k calls with distinct functions; the cache stays at its bound, RSS flat (issue 5).

In a fresh subprocess, 100,000 `ts.out_structure` calls, each with a newly
created function (`lambda a: a * 2 + 1` on an f32[4] `ShapeDtypeStruct`), so
every call is a miss and a trace (~0.35 ms). The newest 8,192 functions (2x
the bound) are kept alive, as a program's live functions would be: the cache
must then evict by its LRU bound, not merely because functions die (entries
of dead functions are dropped, so with no live function the cache would stay
nearly empty and never test its bound). After 10,000 calls (when the cache
has long been full) the probe records VmRSS and resets the peak
(`clear_refs`, as in case 7); after 100,000 it reads `ts.cache_info()` and
VmHWM (each reading after `gc.collect()`; VmRSS is also sampled every 10,000
calls, in the JSON).

Goals: `size == maxsize` (4096), and peak RSS growth from 10k to 100k calls
<50 MB. The *baseline* column of the RSS row is the growth over the first
10,000 calls (filling the cache and JAX's own caches), for scale: the goal is
about what comes after, when a leaking cache would keep growing.
`jax_check_tracer_leaks` stays off (the default; the JSON records it). Under
`--quick`: 3,000 calls, readings at 300 and 3,000, and the bound lowered to
256 with the private `treeshape._cache.set_cache_maxsize` (restored
afterwards). The full case takes ~35 s.
"""

import collections
import gc
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Goal, Row, case, peak_rss_mb, probe, reset_peak, run_probe, status_mb


CACHE_CALLS = 100_000
CACHE_CALLS_QUICK = 3_000
CACHE_MAXSIZE_QUICK = 256  # set with the private treeshape._cache.set_cache_maxsize under --quick


def _fresh_function() -> Callable[[Any], Any]:
    """A distinct function object on every call: a cache miss every time."""
    return lambda a: a * 2 + 1


@probe("cache")
def cache_probe(arg: str) -> dict[str, Any]:
    """In a fresh process: `calls` out_structure calls (`arg` is "calls:maxsize"), each with a new
    function; the cache's size and the process's RSS after 10% and after 100% of them.

    The most recent `2 * maxsize` functions stay alive (as a program's live
    functions would), so the cache fills up and must evict by LRU; older ones
    die, and with them whatever the cache or JAX keyed on them.
    """
    from treeshape import _cache  # private: lowering the bound is for tests and benchmarks only

    calls, maxsize = (int(n) for n in arg.split(":"))
    default = ts.cache_info().maxsize
    old = _cache.set_cache_maxsize(maxsize) if maxsize != default else None
    try:
        x = jax.ShapeDtypeStruct((4,), jnp.float32)
        live: collections.deque[Callable[[Any], Any]] = collections.deque(maxlen=2 * maxsize)

        def call() -> None:
            f = _fresh_function()
            live.append(f)
            ts.out_structure(f, x)

        for _ in range(50):  # warm up the tracing machinery
            call()
        ts.clear_cache()
        gc.collect()
        start_mb = status_mb("VmRSS") or 0.0
        checkpoint = calls // 10
        samples: list[tuple[int, float]] = []
        reset, at_checkpoint = False, 0.0
        t0 = time.perf_counter()
        for i in range(1, calls + 1):
            call()
            if i % checkpoint == 0:
                gc.collect()
                samples.append((i, status_mb("VmRSS") or 0.0))
                if i == checkpoint:
                    # From here on, the peak RSS (VmHWM) starts at the current RSS.
                    at_checkpoint = samples[-1][1]
                    reset = reset_peak()
        seconds = time.perf_counter() - t0
        gc.collect()
        info = ts.cache_info()
        end_mb = status_mb("VmRSS") or 0.0
        peak_mb = peak_rss_mb()
    finally:
        if old is not None:
            _cache.set_cache_maxsize(old)
    return {
        "calls": calls,
        "checkpoint": checkpoint,
        "maxsize": info.maxsize,
        "size": info.size,
        "hits": info.hits,
        "misses": info.misses,
        "live_functions": len(live),
        "check_tracer_leaks": bool(jax.check_tracer_leaks.value),
        "seconds_per_call": seconds / calls,
        "rss_start": start_mb,
        "rss_checkpoint": at_checkpoint,
        "rss_end": end_mb,
        "peak_method": "VmHWM after clear_refs" if reset else "VmRSS",
        "peak_since_checkpoint": peak_mb if reset else end_mb,
        "samples": samples,
    }


@case("cache_memory")
def cache_memory(cfg: Config) -> list[Row]:
    """10. 100k calls with distinct functions: the cache stays at its bound, RSS flat."""
    calls, maxsize = (CACHE_CALLS_QUICK, CACHE_MAXSIZE_QUICK) if cfg.quick else (CACHE_CALLS, ts.cache_info().maxsize)
    r = run_probe("cache", f"{calls}:{maxsize}")
    checkpoint = r["checkpoint"]
    filling = r["rss_checkpoint"] - r["rss_start"]
    growth = r["peak_since_checkpoint"] - r["rss_checkpoint"]
    note = (
        f"{r['seconds_per_call'] * 1e3:.2f} ms per call, {r['misses']:,} misses, {r['hits']} hits; "
        f"the newest {r['live_functions']:,} functions kept alive"
        + (f"; --quick: maxsize lowered to {maxsize} with _cache.set_cache_maxsize" if cfg.quick else "")
    )
    if r["misses"] != calls or r["check_tracer_leaks"]:
        note += "; WARNING: expected one miss per call and jax_check_tracer_leaks off"
    rows = [
        Row(
            f"10 cache size after {calls:,} calls, distinct functions",
            r["maxsize"],
            r["size"],
            Goal("==", r["maxsize"], f"== maxsize ({r['maxsize']})"),
            unit="entries",
            measured=r["size"],
            measured_unit="entries",
            note=note,
            detail=r,
        ),
        Row(
            f"10 RSS growth from {checkpoint:,} to {calls:,} calls",
            filling,
            growth,
            Goal("<", 50e6 / 2**20, "<50 MB"),
            unit="MiB",
            measured=growth,
            measured_unit="MiB",
            note=(
                f"baseline: RSS growth over the first {checkpoint:,} calls (filling the cache); treeshape: peak "
                f"RSS ({r['peak_method']}) over the next {calls - checkpoint:,} above the RSS at {checkpoint:,} calls; "
                f"VmRSS {r['rss_checkpoint']:.0f} -> {r['rss_end']:.0f} MiB"
            ),
            detail=r,
        ),
    ]
    return rows
