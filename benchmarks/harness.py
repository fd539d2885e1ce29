"""The benchmark harness: goals, rows, interleaved timing, the case registry, subprocess probes, the report.

Every timed case runs its baseline and its treeshape side interleaved in one
process: batches of the two sides alternate (AB BA AB ..., the order flipped
on every repetition), the garbage collector is run before and disabled during
each timed batch (as `timeit` does), and the table reports the median time of
one call for each side and their ratio, `treeshape / baseline`. Absolute
times on a shared machine are noise; the ratios are what count. A row is
flagged "noisy" when the ratio of medians and the ratio of minimums disagree
by more than 25%, and a case that relies on treeshape's cache checks (with
`ts.cache_info()`) that it really hits it.

Adding a case: a module in `cases/` (listed in `cases/__init__.py`, which
sets the order) with a function `def my_case(cfg: Config) -> list[Row]`,
decorated with `@case("name")`; build its rows with `compare()` and the
runners `repeat()` (the same call again and again, timed in batches) or
`per_call()` (an untimed setup before each timed call, e.g. a fresh function
object). A case that must run in a fresh process registers a `@probe` and
starts it with `run_probe()`.
"""

import argparse
import cProfile
import dataclasses
import gc
import json
import math
import operator
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

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
    memory growth, "MiB peak" for a peak RSS, "instr" for HLO instruction
    counts, "entries" for cache sizes, "compiles" for compilations). The goal
    is checked against `measured`, which defaults to the ratio
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

    def add_note(self, text: str) -> None:
        self.note = f"{self.note}; {text}" if self.note else text


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
        row.add_note(
            f"noisy: ratio of medians {row.ratio:.3g} but of minimums {timing.min_ratio:.3g}; "
            "rerun on a quieter machine"
        )
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
        row.add_note(f"WARNING: expected {hits} cache hit(s) and {misses} miss(es) per call, got {got[0]} and {got[1]}")
        if strict:
            row.cache_ok = False
    return row


def k(n: int) -> str:
    """1000000 -> "1M", 10000 -> "10k", 100 -> "100"."""
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


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
GROUPS: dict[str, list[str]] = {}  # a name for `--only` that stands for several cases
LEGENDS: dict[str, Callable[[Config], str]] = {}  # a line printed under the table when the case ran


def target_ready(name: str, target: str) -> bool:
    """Whether `ts.cost(..., target=target)` works here (its compiler installed and starting);
    if not, case `name` says why on stderr and gives no rows."""
    import jax.numpy as jnp

    try:
        ts.cost(jnp.sin, jax.ShapeDtypeStruct((8,), jnp.float32), target=target)
    except (ImportError, RuntimeError, ts.JaxReleaseError) as e:
        print(f"case {name}: no rows ({type(e).__name__}: {e})", file=sys.stderr)
        return False
    return True


def case(name: str, group: str | None = None, legend: Callable[[Config], str] | None = None) -> Callable[[Case], Case]:
    """Register a case under `name` (and in `group`, if given); cases run in registration order."""

    def register(fn: Case) -> Case:
        if name in CASES or name in GROUPS:
            raise ValueError(f"duplicate benchmark case {name!r}")
        CASES[name] = fn
        if group is not None:
            if group in CASES:
                raise ValueError(f"benchmark group {group!r} has the name of a case")
            GROUPS.setdefault(group, []).append(name)
        if legend is not None:
            LEGENDS[name] = legend
        return fn

    return register


# -- subprocess probes ---------------------------------------------------------
Probe = Callable[[str], dict[str, Any]]
PROBES: dict[str, Probe] = {}
RUN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")


def probe(name: str) -> Callable[[Probe], Probe]:
    """Register a function that `run_probe(name, arg)` runs in a fresh process (`run.py --probe name arg`)."""

    def register(fn: Probe) -> Probe:
        if name in PROBES:
            raise ValueError(f"duplicate benchmark probe {name!r}")
        PROBES[name] = fn
        return fn

    return register


def run_probe(name: str, arg: str) -> dict[str, Any]:
    """Run the probe `name` in a fresh Python process; its result (the last line of its output, JSON)."""
    proc = subprocess.run(
        [sys.executable, RUN_PY, "--probe", name, arg],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def status_mb(field: str) -> float | None:
    """A `VmHWM`/`VmRSS` line of /proc/self/status in MiB, or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_rss_mb() -> float:
    """The peak RSS: VmHWM where it can be reset, else ru_maxrss."""
    hwm = status_mb("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -- report --------------------------------------------------------------------
def _fmt_value(value: float, unit: str) -> str:
    if unit == "MiB":
        return f"{value:+.1f} MiB"
    if unit == "MiB peak":
        return f"{value:,.0f} MiB"
    if unit in ("instr", "entries", "compiles"):
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
        "treeshape_path": os.path.dirname(os.path.abspath(ts.__file__)),
        "revision": _git_revision(),
        "python": platform.python_version(),
        "device": f"{device.platform}: {device.device_kind} x{jax.device_count()}",
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
    }


def _case_names(only: list[str] | None, parser: argparse.ArgumentParser) -> list[str]:
    if not only:
        return list(CASES)
    given = [n for spec in only for n in spec.split(",")]
    unknown = [n for n in given if n not in CASES and n not in GROUPS]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join([*CASES, *GROUPS])}")
    names = [c for n in given for c in GROUPS.get(n, [n])]
    return list(dict.fromkeys(names))  # each case once, in the order given


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="few repetitions and smaller trees: a smoke test; goals never fail",
    )
    groups = "; groups: " + ", ".join(f"{g} = {'+'.join(c)}" for g, c in GROUPS.items()) if GROUPS else ""
    parser.add_argument(
        "--only",
        action="append",
        metavar="CASE",
        help=f"run only these cases (comma-separated or repeated): {', '.join(CASES)}{groups}",
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
    parser.add_argument("--probe", nargs=2, metavar=("NAME", "ARG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.probe:
        name, arg = args.probe
        print(json.dumps(PROBES[name](arg)))
        return 0

    names = _case_names(args.only, parser)
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
    seconds: dict[str, float] = {}
    profiler = cProfile.Profile() if args.profile else None
    for name in names:
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        new = CASES[name](cfg)
        if profiler:
            profiler.disable()
        rows.extend(new)
        seconds[name] = time.perf_counter() - t0
        print(f"  {name}: {len(new)} row(s) in {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    load_after = os.getloadavg()

    print()
    print(table(rows))
    print()
    for r in rows:
        if r.note:
            print(f"note: {r.case}: {r.note}")
    print("ratio = treeshape / baseline; medians of interleaved repetitions")
    for name in names:
        if name in LEGENDS:
            print(LEGENDS[name](cfg))
    print(f"total {elapsed:.0f} s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    if profiler:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    missed = [r.case for r in rows if r.met is False]
    if missed and args.quick:
        # Smaller trees and few repetitions: fixed costs weigh more than in the full run.
        print(f"goals missed in this quick run (the full run judges them): {len(missed)}: " + "; ".join(missed))
    elif missed:
        print(f"missed goals: {len(missed)}: " + "; ".join(missed))

    if args.json:
        result = {
            "environment": env,
            "mode": mode,
            "seconds": elapsed,
            "case_seconds": seconds,
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
