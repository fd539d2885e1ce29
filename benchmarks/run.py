"""Speed and memory benchmarks for treeshape (issue 2 "Speed", issue 3 loop carries, issue 5 cache memory).

Run `python benchmarks/run.py` for the full benchmark, `--quick` for the CI
smoke run (few repetitions; goals are printed but never fail the run), `--only
NAME` for some cases, `--json PATH` to save the results.

Every timed case runs its baseline and its treeshape side interleaved in one
process: batches of the two sides alternate (AB BA AB ..., the order flipped
on every repetition), the garbage collector is run before and disabled during
each timed batch (as `timeit` does), and the table reports the median time of
one call for each side and their ratio, `treeshape / baseline`. Absolute
times on a shared machine are noise; the ratios are what count. A row is
flagged "noisy" when the ratio of medians and the ratio of minimums disagree
by more than 25%, and a case that relies on treeshape's cache checks (with
`ts.cache_info()`) that it really hits it.

Adding a case: write a function `def my_case(cfg: Config) -> list[Row]`,
decorate it with `@case("name")`, and build its rows with `compare()` and the
runners `repeat()` (the same call again and again, timed in batches) or
`per_call()` (an untimed setup before each timed call, e.g. a fresh function
object). Cases run in registration order.
"""

import argparse
import collections
import cProfile
import dataclasses
import functools as ft
import gc
import json
import math
import operator
import os
import platform
import pstats
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

import treeshape as ts


# -- results -------------------------------------------------------------------
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    "==": operator.eq,
}


@dataclasses.dataclass(frozen=True)
class Goal:
    """A bound on a row's measured value (by default its ratio)."""

    op: str  # one of _OPS
    bound: float
    text: str  # how the table shows it, e.g. "<=0.05 (20x faster)"
    low: float | None = None  # also require `value >= low` (a two-sided goal)

    def met(self, value: float) -> bool:
        return _OPS[self.op](value, self.bound) and (self.low is None or value >= self.low)


def faster(times: float) -> Goal:
    """treeshape at least `times` x faster than the baseline."""
    return Goal("<=", 1 / times, f"<={1 / times:.3g} ({times:g}x faster)")


def at_most(ratio: float, what: str = "") -> Goal:
    return Goal("<=", ratio, f"<={ratio:g}" + (f" ({what})" if what else ""))


def within(low: float, high: float) -> Goal:
    """The ratio between `low` and `high` (inclusive): as fast as the baseline, within noise."""
    return Goal("<=", high, f"{low:g}-{high:g}", low=low)


@dataclasses.dataclass
class Row:
    """One line of the table.

    `baseline` and `treeshape` are medians in `unit` ("s" for times, "MiB" for
    memory, "instr" for HLO instruction counts, "entries" for cache sizes).
    The goal is checked against `measured`, which defaults to the ratio
    `treeshape / baseline`. A row whose cache check is strict (see
    `check_cache`) misses its goal when the cache was not used as assumed.
    """

    case: str
    baseline: float
    treeshape: float
    goal: Goal | None
    unit: str = "s"
    measured: float | None = None
    measured_unit: str = "x"
    note: str = ""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    cache_ok: bool = True  # False once a strict cache check failed

    def __post_init__(self) -> None:
        if self.measured is None:
            self.measured = self.ratio

    @property
    def ratio(self) -> float | None:
        return self.treeshape / self.baseline if self.baseline else None

    @property
    def met(self) -> bool | None:
        assert self.measured is not None
        if self.goal is None:
            return None
        return self.cache_ok and self.goal.met(self.measured)


# -- timing --------------------------------------------------------------------
Runner = Callable[[int], float]  # run n calls, return the seconds one call took


def repeat(fn: Callable[[], Any]) -> Runner:
    """Time the same call `n` times in a row (after one untimed call); the per-call time."""

    def run(n: int) -> float:
        # Untimed: the first call after `gc.collect()` finds the CPU caches cold,
        # which would weigh on a batch of 1 call but not on a batch of 100.
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    return run


def per_call(setup: Callable[[], Any], call: Callable[[Any], Any]) -> Runner:
    """Time `call(setup())` `n` times; only `call` is timed (setup is excluded)."""

    def run(n: int) -> float:
        total = 0.0
        for _ in range(n):
            arg = setup()
            t0 = time.perf_counter()
            call(arg)
            total += time.perf_counter() - t0
            del arg
        return total / n

    return run


def _timed(run: Runner, n: int) -> float:
    gc.collect()
    gc.disable()
    try:
        return run(n)
    finally:
        gc.enable()


def _batch_size(run: Runner, seconds: float) -> int:
    """Warm up `run` and pick how many calls make one batch of about `seconds`."""
    once = _timed(run, 1)
    if once < 20 * seconds:  # not too dear: warm up once more, the first call may have filled a cache
        once = _timed(run, 1)
    return max(1, min(100_000, math.ceil(seconds / max(once, 1e-9))))


@dataclasses.dataclass
class Timing:
    baseline: list[float]
    treeshape: list[float]
    batch: tuple[int, int]

    @property
    def medians(self) -> tuple[float, float]:
        return statistics.median(self.baseline), statistics.median(self.treeshape)

    @property
    def min_ratio(self) -> float:
        return min(self.treeshape) / min(self.baseline)

    def detail(self) -> dict[str, Any]:
        def stats(xs: list[float]) -> dict[str, float]:
            q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
            return {
                "median": statistics.median(xs),
                "q1": q[0],
                "q3": q[2],
                "min": min(xs),
            }

        return {
            "reps": len(self.baseline),
            "batch": list(self.batch),
            "ratio_of_minimums": self.min_ratio,
            "baseline": stats(self.baseline),
            "treeshape": stats(self.treeshape),
        }


def compare(baseline: Runner, candidate: Runner, cfg: "Config", reps: int) -> Timing:
    """Time both runners interleaved: `reps` batches each, alternating order."""
    reps = cfg.reps(reps)
    nb = _batch_size(baseline, cfg.batch_seconds)
    nc = _batch_size(candidate, cfg.batch_seconds)
    tb: list[float] = []
    tc: list[float] = []
    for i in range(reps):
        sides = [(baseline, nb, tb), (candidate, nc, tc)]
        if i % 2:
            sides.reverse()
        for run, n, out in sides:
            out.append(_timed(run, n))
    return Timing(tb, tc, (nb, nc))


NOISY = 1.25  # flag a row whose ratio of medians and ratio of minimums differ this much


def timed_row(case_name: str, timing: Timing, goal: Goal | None, note: str = "") -> Row:
    b, t = timing.medians
    row = Row(case_name, b, t, goal, note=note, detail=timing.detail())
    assert row.ratio is not None
    if not 1 / NOISY <= row.ratio / timing.min_ratio <= NOISY:
        warning = (
            f"noisy: ratio of medians {row.ratio:.3g} but of minimums {timing.min_ratio:.3g}; "
            "rerun on a quieter machine"
        )
        row.note = f"{row.note}; {warning}" if row.note else warning
    return row


def check_cache(row: Row, call: Callable[[], Any], hits: int, misses: int, strict: bool = False) -> Row:
    """Record how one more `call` uses treeshape's cache, and warn in the row's
    note when that is not what the case assumes (a cache that silently stopped
    hitting would otherwise look like a slow cache). With `strict`, the cache
    behaviour is part of the goal: the row is then marked missed."""
    before = ts.cache_info()
    call()
    after = ts.cache_info()
    got = (after.hits - before.hits, after.misses - before.misses)
    row.detail["cache"] = {"hits": got[0], "misses": got[1]}
    if got != (hits, misses):
        warning = f"WARNING: expected {hits} cache hit(s) and {misses} miss(es) per call, got {got[0]} and {got[1]}"
        row.note = f"{row.note}; {warning}" if row.note else warning
        if strict:
            row.cache_ok = False
    return row


# -- registry ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    quick: bool
    batch_seconds: float  # a timed batch of a fast call lasts about this long

    def reps(self, full: int) -> int:
        """Repetitions for a case: `full`, or a handful in --quick mode."""
        return min(full, 3) if self.quick else full


Case = Callable[[Config], list[Row]]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        if name in CASES:
            raise ValueError(f"duplicate benchmark case {name!r}")
        CASES[name] = fn
        return fn

    return register


# -- workloads -----------------------------------------------------------------
MLP_LAYERS = 50
MLP_WIDTH = 32


def mlp(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    for layer in params:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x


@ft.cache
def mlp_inputs() -> tuple[list[dict[str, jax.Array]], jax.Array]:
    """A 50-layer MLP's parameters (a list of dicts, 100 leaves) and a batch."""
    keys = jax.random.split(jax.random.key(0), MLP_LAYERS)
    params = [
        {
            "w": jax.random.normal(k, (MLP_WIDTH, MLP_WIDTH)) / MLP_WIDTH**0.5,
            "b": jnp.zeros(MLP_WIDTH),
        }
        for k in keys
    ]
    return params, jnp.ones((8, MLP_WIDTH))


def floor(*trees: Any) -> list[tuple[Any, Any, bool]]:
    """The least any cached lookup must do: flatten, read each leaf's type."""
    return [(x.shape, x.dtype, x.weak_type) for x in jtu.tree_leaves(trees)]


def aval_floor(*trees: Any) -> list[Any]:
    """A tighter floor for `jax.Array` leaves: one `.aval` read per leaf."""
    return [x.aval for x in jtu.tree_leaves(trees)]


def fresh_mlp() -> Callable[..., jax.Array]:
    """A new function object on every call, so no cache can know it."""

    def f(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        return mlp(params, x)

    return f


@ft.cache
def leaf_tree(n_leaves: int) -> list[dict[str, jax.Array]]:
    """A list of dicts with `n_leaves` arrays of mixed shapes and dtypes."""
    return [
        {
            "b": jnp.zeros(4),
            "h": jnp.zeros(2, jnp.bfloat16),
            "step": jnp.zeros((), jnp.int32),
            "w": jnp.zeros((4, 4)),
        }
        for _ in range(n_leaves // 4)
    ]


def fresh_identity() -> Callable[[Any], Any]:
    """A new identity function on every call: `jax.eval_shape` cannot cache it."""
    return lambda t: t


@ft.cache
def committed_tree(n_leaves: int) -> list[dict[str, jax.Array]]:
    """`leaf_tree(n_leaves)` placed on a device explicitly: committed arrays, as
    `jax.device_put(x, device)` and sharded computations make them."""
    return jax.device_put(leaf_tree(n_leaves), jax.devices()[0])  # type: ignore[no-any-return]


def _ts_tree(fn: Callable[..., Any], *args: Any) -> Any:
    return ts.out_structure(fn, *args).tree


# -- cases ---------------------------------------------------------------------
@case("cached")
def cached_call(cfg: Config) -> list[Row]:
    """1. A repeated call: treeshape's cache vs JAX's own trace cache."""
    params, x = mlp_inputs()
    t = compare(
        repeat(lambda: jax.eval_shape(mlp, params, x)),
        repeat(lambda: ts.out_structure(mlp, params, x)),
        cfg,
        reps=31,
    )
    row = timed_row("1 cached call, 50-layer MLP", t, faster(20))
    return [check_cache(row, lambda: ts.out_structure(mlp, params, x), 1, 0)]


@case("fresh_partial")
def fresh_partial(cfg: Config) -> list[Row]:
    """2. A partial rebuilt on every call: JAX retraces, treeshape hits its cache."""
    params, x = mlp_inputs()
    rows = []
    for label, make in (
        ("functools.partial", ft.partial),
        ("tree_util.Partial", jtu.Partial),
    ):
        t = compare(
            repeat(lambda make=make: jax.eval_shape(make(mlp, params), x)),
            repeat(lambda make=make: ts.out_structure(make(mlp, params), x)),
            cfg,
            reps=21,
        )
        row = timed_row(f"2 cached call, fresh {label}", t, faster(50))
        call = lambda make=make: ts.out_structure(make(mlp, params), x)  # noqa: E731
        rows.append(check_cache(row, call, 1, 0))
    return rows


@case("floor")
def cached_vs_floor(cfg: Config) -> list[Row]:
    """3. A cached call vs flattening the inputs and reading each leaf's type."""
    params, x = mlp_inputs()
    t = compare(
        repeat(lambda: floor(params, x)),
        repeat(lambda: ts.out_structure(mlp, params, x)),
        cfg,
        reps=31,
    )
    rows = [timed_row("3 cached call vs floor (flatten + read types)", t, at_most(3))]
    t = compare(
        repeat(lambda: floor(jtu.Partial(mlp, params), x)),
        repeat(lambda: ts.out_structure(jtu.Partial(mlp, params), x)),
        cfg,
        reps=31,
    )
    row = timed_row("3 same, fresh tree_util.Partial", t, at_most(3))
    rows.append(check_cache(row, lambda: ts.out_structure(jtu.Partial(mlp, params), x), 1, 0))
    t = compare(
        repeat(lambda: aval_floor(params, x)),
        repeat(lambda: ts.out_structure(mlp, params, x)),
        cfg,
        reps=31,
    )
    note = "tighter floor than the issue's: flatten + one `.aval` read per leaf"
    rows.append(timed_row("3 cached call vs aval floor", t, None, note))
    return rows


@case("uncached")
def uncached_call(cfg: Config) -> list[Row]:
    """4. A first call (a fresh function object each time) vs `jax.eval_shape`."""
    params, x = mlp_inputs()
    t = compare(
        per_call(fresh_mlp, lambda f: jax.eval_shape(f, params, x)),
        per_call(fresh_mlp, lambda f: ts.out_structure(f, params, x)),
        cfg,
        reps=21,
    )
    row = timed_row("4 first (uncached) call, 50-layer MLP", t, at_most(1.15))
    return [check_cache(row, lambda: ts.out_structure(fresh_mlp(), params, x), 0, 1)]


N_INFER = 20


def traced_step(infer: Callable[..., Any]) -> Callable[..., jax.Array]:
    """A fresh function that infers a structure 20 times from fresh partials."""

    def step(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
        for _ in range(N_INFER):
            out = infer(ft.partial(mlp, params), x)
            x = x + jnp.zeros(out.shape, out.dtype)
        return x

    return step


@case("jit_trace")
def jit_trace(cfg: Config) -> list[Row]:
    """5. Tracing a jitted step that infers 20 structures on fresh partials."""
    params, x = mlp_inputs()
    rows = []
    for label, clear in (("cold cache", True), ("warm cache", False)):

        def setup(infer: Callable[..., Any], clear: bool = clear) -> Callable[[], Any]:
            def make() -> Any:
                if clear:
                    ts.clear_cache()
                return jax.jit(traced_step(infer))

            return make

        t = compare(
            per_call(setup(jax.eval_shape), lambda f: f.trace(params, x)),
            per_call(setup(_ts_tree), lambda f: f.trace(params, x)),
            cfg,
            reps=11,
        )
        note = (
            "ts.clear_cache() before each trace: 1 miss + 19 hits"
            if clear
            else "cache kept across traces (retracing the same step): 20 hits"
        )
        row = timed_row(
            f"5 jit trace, {N_INFER} infers on fresh partials ({label})",
            t,
            at_most(0.25),
            note,
        )
        if clear:
            ts.clear_cache()
        trace = lambda: jax.jit(traced_step(_ts_tree)).trace(params, x)  # noqa: E731
        rows.append(check_cache(row, trace, N_INFER - clear, int(clear)))
    return rows


SMALL, LARGE = 1_000, 10_000
QUICK_SMALL, QUICK_LARGE = 100, 1_000  # --quick: 10x smaller trees (the 10k-leaf zeros() alone took ~15 s)


def _leaf_counts(cfg: Config) -> tuple[int, int]:
    return (QUICK_SMALL, QUICK_LARGE) if cfg.quick else (SMALL, LARGE)


def _k(n: int) -> str:
    """10000 -> "10k", 100 -> "100"."""
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _scaling(
    cfg: Config,
    name: str,
    make: Callable[[list[Any]], Runner],
    reps: int,
    goal: Goal | None,
    trees: Callable[[int], Any] = leaf_tree,
) -> Row:
    n_small, n_large = _leaf_counts(cfg)
    small, large = trees(n_small), trees(n_large)
    t = compare(make(small), make(large), cfg, reps=reps)
    row = timed_row(f"6 {name}: {_k(n_large)} vs {_k(n_small)} leaves", t, goal)
    row.detail["sides"] = [f"{n_small} leaves", f"{n_large} leaves"]
    return row


def _blocked_zeros(s: ts.Structure) -> Any:
    return jax.block_until_ready(s.zeros())


def _blocked_tree_map(s: ts.Structure) -> Any:
    return jax.block_until_ready(jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), s.tree))


@case("scaling")
def scaling(cfg: Config) -> list[Row]:
    """6. structure_of, zeros() and diff are linear in the number of leaves."""
    linear = at_most(13, "linear")

    def floor_steady(tree: list[Any]) -> Runner:
        return repeat(lambda: floor(tree))

    def structure_of_steady(tree: list[Any]) -> Runner:
        ts.structure_of(tree)  # fill the cache
        return repeat(lambda: ts.structure_of(tree))

    def structure_of_first(tree: list[Any]) -> Runner:
        return per_call(ts.clear_cache, lambda _: ts.structure_of(tree))

    def zeros(tree: list[Any]) -> Runner:
        s = ts.structure_of(tree)
        return repeat(lambda: _blocked_zeros(s))

    def diff_steady(tree: list[Any]) -> Runner:
        s = ts.structure_of(tree)
        s.diff(tree)  # memoise the paths, fill the cache
        return repeat(lambda: s.diff(tree))

    def diff_first(tree: list[Any]) -> Runner:
        s = ts.structure_of(tree)

        def setup() -> ts.Structure:
            ts.clear_cache()
            return ts.Structure(s.treedef, s.leaves)  # nothing memoised yet

        return per_call(setup, lambda fresh: fresh.diff(tree))

    n_small, n_large = _leaf_counts(cfg)
    large, large_committed = leaf_tree(n_large), committed_tree(n_large)
    rows = [
        _scaling(cfg, "reference: floor (flatten + types)", floor_steady, 15, None),
        check_cache(
            _scaling(cfg, "structure_of (cached)", structure_of_steady, 15, linear),
            lambda: ts.structure_of(large),
            1,
            0,
        ),
        _scaling(cfg, "structure_of (first call)", structure_of_first, 7, None),
        check_cache(
            _scaling(cfg, "structure_of (cached), committed arrays", structure_of_steady, 15, linear, committed_tree),
            lambda: ts.structure_of(large_committed),
            1,
            0,
        ),
        _scaling(cfg, "zeros() + block_until_ready", zeros, 11, linear),
        check_cache(
            _scaling(cfg, "diff, matching tree (steady)", diff_steady, 15, linear),
            lambda: ts.structure_of(large).diff(large),
            2,
            0,
        ),
        _scaling(cfg, "diff, matching tree (first call)", diff_first, 7, None),
    ]
    t = compare(repeat(lambda: ts.structure_of(large)), repeat(lambda: ts.structure_of(large_committed)), cfg, reps=15)
    note = (
        f"same {_k(n_large)}-leaf tree; baseline = uncommitted arrays, treeshape = committed (device_put to a device)"
    )
    rows.append(timed_row(f"6 structure_of (cached), committed vs uncommitted, {_k(n_large)}", t, None, note))
    for n in (n_small, n_large):
        s = ts.structure_of(leaf_tree(n))
        t = compare(
            repeat(lambda s=s: _blocked_tree_map(s)),
            repeat(lambda s=s: _blocked_zeros(s)),
            cfg,
            reps=11,
        )
        rows.append(
            timed_row(
                f"6 zeros() vs tree.map(jnp.zeros), {_k(n)} leaves",
                t,
                at_most(1.2),
                "both eager, both timed to block_until_ready",
            )
        )
    for n in (n_small, n_large):
        tree = leaf_tree(n)
        t = compare(
            per_call(fresh_identity, lambda f, tree=tree: jax.eval_shape(f, tree)),
            per_call(ts.clear_cache, lambda _, tree=tree: ts.structure_of(tree)),
            cfg,
            reps=7,
        )
        rows.append(
            timed_row(
                f"6 structure_of first call vs eval_shape(identity), {_k(n)}",
                t,
                None,
            )
        )
    return rows


# -- memory --------------------------------------------------------------------
BIG = 2**17  # a (BIG, BIG) float32 matrix is 64 GiB


def _status_mb(field: str) -> float | None:
    """A `VmHWM`/`VmRSS` line of /proc/self/status in MiB, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _peak_rss_mb() -> float:
    """The peak RSS: VmHWM where it can be reset, else ru_maxrss."""
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


CONTROL_MIB = 256


def _control(fn: Callable[..., Any], a: Any, b: Any) -> Any:
    """Not an inference: really allocate CONTROL_MIB, to show the probe sees memory."""
    n = CONTROL_MIB * 2**20 // 4
    return jnp.ones(n, jnp.float32).block_until_ready()


PROBES: dict[str, Callable[..., Any]] = {
    "eval_shape": jax.eval_shape,
    "treeshape": ts.out_structure,
    "control": _control,
}


def memory_probe(which: str) -> dict[str, float]:
    """In a fresh process: peak RSS added by inferring a 64 GiB matmul's output."""
    infer = PROBES[which]
    fn = lambda a, b: jnp.tanh(a @ b)  # noqa: E731
    sds = jax.ShapeDtypeStruct
    small = sds((8, 16), jnp.float32), sds((16, 8), jnp.float32)
    jax.eval_shape(fn, *small)  # warm up the tracing machinery
    ts.out_structure(fn, *small)
    jax.block_until_ready(jnp.ones(8) + 1)
    gc.collect()
    # The peak so far (imports, start-up) may exceed the current RSS, and would
    # hide growth below it: reset it to the current RSS where Linux allows.
    reset = _reset_peak()
    before = _peak_rss_mb()
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = infer(fn, sds((BIG, 4096), jnp.float32), sds((4096, BIG), jnp.float32))
    after = _peak_rss_mb()
    maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tree = out.tree if isinstance(out, ts.Structure) else out
    return {
        "method": "VmHWM after clear_refs" if reset else "ru_maxrss",
        "before": before,
        "after": after,
        "rss_after": _status_mb("VmRSS") or 0.0,
        "ru_maxrss_before": maxrss_before,
        "ru_maxrss_after": maxrss_after,
        "output_gib": math.prod(tree.shape) * tree.dtype.itemsize / 2**30,
    }


def _run_probe(which: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--memory-probe", which],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@case("memory")
def memory(cfg: Config) -> list[Row]:
    """7. Inferring a 64 GiB output adds (almost) nothing to peak RSS."""
    base, mine = _run_probe("eval_shape"), _run_probe("treeshape")
    control = _run_probe("control")
    added_base = base["after"] - base["before"]
    added = mine["after"] - mine["before"]
    added_control = control["after"] - control["before"]
    return [
        Row(
            f"7 peak RSS added, {mine['output_gib']:.0f} GiB matmul output",
            added_base,
            added,
            Goal("<", 200e6 / 2**20, "<200 MB added"),
            unit="MiB",
            measured=added,
            measured_unit="MiB",
            note=(
                "baseline: jax.eval_shape; each side in its own subprocess, "
                f"peak RSS ({mine['method']}) before/after the call; control: "
                f"really allocating {CONTROL_MIB} MiB adds +{added_control:.0f} MiB"
            ),
            detail={"eval_shape": base, "treeshape": mine, "control": control},
        )
    ]


# -- loop carries (issue 3) ----------------------------------------------------
ADAM_SIZES = (16, 64, 64, 8)  # a 3-layer MLP: 6 parameter leaves, 19 carry leaves with the Adam state
ADAM_BATCH = 32
SCAN_STEPS = 64

Params = list[dict[str, jax.Array]]
AdamCarry = tuple[Params, tuple[jax.Array, Params, Params]]
Batch = tuple[jax.Array, jax.Array]


def adam_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return jnp.mean((x - y) ** 2)


def make_train_step(
    lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
) -> Callable[[AdamCarry, Batch], tuple[AdamCarry, jax.Array]]:
    """A new scan body on every call: one hand-written Adam step (no optax) of
    the MLP, `(params, (count, mu, nu)), (x, y) -> (carry, loss)`."""

    def train_step(carry: AdamCarry, batch: Batch) -> tuple[AdamCarry, jax.Array]:
        params, (count, mu, nu) = carry
        loss, grads = jax.value_and_grad(adam_loss)(params, *batch)
        count = count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)
        t = count.astype(jnp.float32)
        step = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + eps), params, mu, nu)
        return (params, (count, mu, nu)), loss

    return train_step


@ft.cache
def adam_inputs(param_dtype: str) -> tuple[AdamCarry, Batch]:
    """`(init, xs)`: the MLP's parameters in `param_dtype`, an f32 Adam state
    (`count` an int32 0, `mu`/`nu` zeros), and SCAN_STEPS batches to scan over."""
    rng = np.random.default_rng(1)  # NumPy, not jax.random: no XLA compilation before the timings
    params = [
        {
            "w": jnp.asarray(rng.standard_normal((a, b), np.float32) / a**0.5, param_dtype),
            "b": jnp.zeros(b, param_dtype),
        }
        for a, b in zip(ADAM_SIZES[:-1], ADAM_SIZES[1:], strict=False)
    ]
    mu, nu = ([{name: jnp.zeros(p.shape, jnp.float32) for name, p in layer.items()} for layer in params] for _ in "mn")
    init = (params, (jnp.zeros((), jnp.int32), mu, nu))
    xs = (
        jnp.asarray(rng.standard_normal((SCAN_STEPS, ADAM_BATCH, ADAM_SIZES[0]), np.float32)),
        jnp.asarray(rng.standard_normal((SCAN_STEPS, ADAM_BATCH, ADAM_SIZES[-1]), np.float32)),
    )
    return init, xs


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


_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+ = ")
_HLO_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")


def hlo_opcodes(text: str) -> collections.Counter[str]:
    """The instructions of an optimized HLO module, counted by opcode: the
    lines `name = type opcode(operands), ...` of every computation."""
    ops: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if " = " in line and _HLO_INSTRUCTION.match(line):
            found = _HLO_OPCODE.search(line.split(" = ", 1)[1])
            ops[found.group(1) if found else "?"] += 1
    return ops


@case("scan_carry")
def scan_carry_hlo(cfg: Config) -> list[Row]:
    """9. A lax.scan whose carry comes from scan_carry vs one cast by hand with .astype."""
    init, xs = adam_inputs("bfloat16")  # bf16 params meet the f32 Adam state and batches: promoted to f32
    body = make_train_step()

    def by_hand(init: AdamCarry, xs: Batch) -> tuple[AdamCarry, jax.Array]:
        params, opt_state = init
        params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return lax.scan(body, (params, opt_state), xs)

    def with_treeshape(init: AdamCarry, xs: Batch) -> tuple[AdamCarry, jax.Array]:
        return lax.scan(body, ts.scan_carry(body, init, xs, policy="promote"), xs)

    compiled = [jax.jit(f).lower(init, xs).compile() for f in (by_hand, with_treeshape)]
    ops = [hlo_opcodes(c.as_text() or "") for c in compiled]
    counts = [sum(o.values()) for o in ops]
    same_ops = ops[0] == ops[1]
    opcode_diff = {k: ops[1][k] - ops[0][k] for k in ops[0] | ops[1] if ops[1][k] != ops[0][k]}
    rows = [
        Row(
            "9 scan_carry vs hand-cast scan: optimized HLO instructions",
            counts[0],
            counts[1],
            Goal("==", 0, "equal"),
            unit="instr",
            measured=counts[1] - counts[0],
            measured_unit="instr",
            note=(
                "bf16 params, f32 Adam state and batches, policy='promote'; instructions of "
                "jax.jit(f).lower(...).compile().as_text(); "
                + ("same count for every opcode" if same_ops else f"opcode counts differ: {opcode_diff}")
            ),
            detail={"opcodes_by_hand": dict(ops[0]), "opcodes_treeshape": dict(ops[1]), "same_opcodes": same_ops},
        )
    ]
    outs = [jax.block_until_ready(c(init, xs)) for c in compiled]
    assert ts.structure_of(outs[0]) == ts.structure_of(outs[1]), "both scans must return the same types"
    t = compare(
        repeat(lambda: jax.block_until_ready(compiled[0](init, xs))),
        repeat(lambda: jax.block_until_ready(compiled[1](init, xs))),
        cfg,
        reps=21,
    )
    rows.append(
        timed_row(
            f"9 scan_carry vs hand-cast scan: runtime, {SCAN_STEPS} steps",
            t,
            within(0.9, 1.1),
            "the two compiled executables, timed to block_until_ready",
        )
    )
    return rows


# -- cache memory (issue 5) ----------------------------------------------------
CACHE_CALLS = 100_000
CACHE_CALLS_QUICK = 3_000
CACHE_MAXSIZE_QUICK = 256  # set with the private treeshape._infer.set_cache_maxsize under --quick


def _fresh_function() -> Callable[[Any], Any]:
    """A distinct function object on every call: a cache miss every time."""
    return lambda a: a * 2 + 1


def cache_probe(calls: int, maxsize: int) -> dict[str, Any]:
    """In a fresh process: `calls` out_structure calls, each with a new function;
    the cache's size and the process's RSS after 10% and after 100% of them.

    The most recent `2 * maxsize` functions stay alive (as a program's live
    functions would), so the cache fills up and must evict by LRU; older ones
    die, and with them whatever the cache or JAX keyed on them.
    """
    from treeshape import _infer  # private: lowering the bound is for tests and benchmarks only

    default = ts.cache_info().maxsize
    old = _infer.set_cache_maxsize(maxsize) if maxsize != default else None
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
        start_mb = _status_mb("VmRSS") or 0.0
        checkpoint = calls // 10
        samples: list[tuple[int, float]] = []
        reset, at_checkpoint = False, 0.0
        t0 = time.perf_counter()
        for i in range(1, calls + 1):
            call()
            if i % checkpoint == 0:
                gc.collect()
                samples.append((i, _status_mb("VmRSS") or 0.0))
                if i == checkpoint:
                    # From here on, the peak RSS (VmHWM) starts at the current RSS.
                    at_checkpoint = samples[-1][1]
                    reset = _reset_peak()
        seconds = time.perf_counter() - t0
        gc.collect()
        info = ts.cache_info()
        end_mb = _status_mb("VmRSS") or 0.0
        peak_mb = _peak_rss_mb()
    finally:
        if old is not None:
            _infer.set_cache_maxsize(old)
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
    proc = subprocess.run(
        [sys.executable, __file__, "--cache-probe", f"{calls}:{maxsize}"],
        check=True,
        capture_output=True,
        text=True,
    )
    r: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    checkpoint = r["checkpoint"]
    filling = r["rss_checkpoint"] - r["rss_start"]
    growth = r["peak_since_checkpoint"] - r["rss_checkpoint"]
    note = (
        f"{r['seconds_per_call'] * 1e3:.2f} ms per call, {r['misses']:,} misses, {r['hits']} hits; "
        f"the newest {r['live_functions']:,} functions kept alive"
        + (f"; --quick: maxsize lowered to {maxsize} with _infer.set_cache_maxsize" if cfg.quick else "")
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


# -- report --------------------------------------------------------------------
def _fmt_value(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value:+.1f} MiB"
    if unit in ("instr", "entries"):
        return f"{value:,.0f} {unit}"
    for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value / 1e-9:.3g} ns"


def _fmt_measured(row: Row) -> str:
    assert row.measured is not None
    if row.measured_unit == "MiB":
        return f"{row.measured:+.1f} MiB"
    if row.measured_unit == "instr":
        return f"{row.measured:+,.0f} instr"
    if row.measured_unit == "entries":
        return f"{row.measured:,.0f}"
    return f"{row.measured:.3g}x"


def _mark(row: Row) -> str:
    return {True: "met", False: "MISSED", None: "info"}[row.met]


def table(rows: list[Row]) -> str:
    header = ("case", "baseline median", "treeshape median", "ratio", "goal", "")
    lines = [
        (
            r.case,
            _fmt_value(r.baseline, r.unit),
            _fmt_value(r.treeshape, r.unit),
            _fmt_measured(r),
            r.goal.text if r.goal else "-",
            _mark(r),
        )
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    out = []
    for i, line in enumerate([header, *lines]):
        cells = [
            c.ljust(w) if j in (0, 4, 5) else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def _git_revision() -> str | None:
    """The checkout's commit, marked `+dirty` if treeshape/ has uncommitted edits (read-only git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "treeshape"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None),
        "treeshape": ts.__version__,
        "revision": _git_revision(),
        "python": platform.python_version(),
        "device": f"{device.platform}: {device.device_kind} x{jax.device_count()}",
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few repetitions: a smoke test; goals never fail",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="CASE",
        help=f"run only these cases: {', '.join(CASES)}",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a goal is missed (ignored with --quick)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the cases under cProfile (both sides; the times are then distorted) and print the 30 "
        "functions with the most own time to stderr, e.g. `--only cached --profile`",
    )
    parser.add_argument("--memory-probe", choices=list(PROBES), help=argparse.SUPPRESS)
    parser.add_argument("--cache-probe", metavar="CALLS:MAXSIZE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe)))
        return 0
    if args.cache_probe:
        calls, maxsize = (int(n) for n in args.cache_probe.split(":"))
        print(json.dumps(cache_probe(calls, maxsize)))
        return 0

    names = list(CASES) if not args.only else [n for spec in args.only for n in spec.split(",")]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")

    cfg = Config(quick=args.quick, batch_seconds=0.002 if args.quick else 0.01)
    env = environment()
    mode = "quick" if args.quick else "full"
    print(
        f"treeshape {env['treeshape']} ({env['revision'] or 'unknown revision'}) | jax {env['jax']} | "
        f"{env['device']} | python {env['python']} | {env['cpus']} cpus | mode: {mode}"
    )
    load_before = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)}", flush=True)

    start = time.perf_counter()
    rows: list[Row] = []
    profiler = cProfile.Profile() if args.profile else None
    for name in names:
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        new = CASES[name](cfg)
        if profiler:
            profiler.disable()
        rows.extend(new)
        print(
            f"  {name}: {len(new)} row(s) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.perf_counter() - start
    load_after = os.getloadavg()

    print()
    print(table(rows))
    print()
    for r in rows:
        if r.note:
            print(f"note: {r.case}: {r.note}")
    print("ratio = treeshape / baseline; medians of interleaved repetitions")
    small, large = _leaf_counts(cfg)
    print(f"rows '6 ...: {_k(large)} vs {_k(small)} leaves': baseline = {_k(small)} leaves, treeshape = {_k(large)}")
    print(f"total {elapsed:.0f} s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    if profiler:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    missed = [r.case for r in rows if r.met is False]
    if missed:
        print(f"missed goals: {len(missed)}: " + "; ".join(missed))

    if args.json:
        result = {
            "environment": env,
            "mode": "quick" if args.quick else "full",
            "seconds": elapsed,
            "load_average": {"before": load_before, "after": load_after},
            "rows": [
                {
                    "case": r.case,
                    "baseline": r.baseline,
                    "treeshape": r.treeshape,
                    "unit": r.unit,
                    "ratio": r.ratio,
                    "measured": r.measured,
                    "goal": r.goal.text if r.goal else None,
                    "met": r.met,
                    "note": r.note,
                    "detail": r.detail,
                }
                for r in rows
            ],
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
            f.write("\n")
    return 1 if (args.check and not args.quick and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
