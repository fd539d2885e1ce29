"""Microbenchmarks on the chip: each kind of kernel, one thing varied at a time (issue 59).

The cases are `micro_cases.py`'s (matrix products by tile fill and dtype; gathers and
scatters by row bytes, rows and collisions; associative scans and segment sums; Pallas TPU
kernels; slices, pads, concatenations, transposes and `dynamic_update_slice` in and out of
loops; elementwise work and reductions by lanes, by size and inside loops; copies between
the device and pinned host memory). For each: compiled as `chip.py` compiles a step
(libtpu asked to dump its optimized module), its arguments built on the device, two runs
to warm up, then up to `--steps` runs timed alone (`block_until_ready`, the median) and
groups of runs dispatched back to back (the median per run), then `--profile-runs` runs
under `jax.profiler`: each kernel's device time by its name (the profile's "XLA Ops"
line) with its `hlo_category`, and the program's own time ("XLA Modules"). Several cases
share one trace (`--chunk`), each kernel credited to the case whose program's span holds
it; were that to fail, each case is traced alone. Compiles run in threads, ahead of the
runs, which go one at a time; a case not started when `--budget-seconds` runs short is
left out (and listed). Needs JAX and NumPy only.

    python benchmarks/steptime/micro.py --out DIR [--cases GROUP|NAME,...] [--quick | --selftest]
        [--budget-seconds 420] [--no-profile] [--deviceless v5e] [--list]

A second set, `micro_cases_k.py` (groups scatter2, stride, layout, mm_f32, flash2), and a
third, `micro_cases_l.py` (groups ttable, cacheput), run only when `--cases` names their groups or
cases; with no `--cases`, the first set runs.

Writes DIR/micro.json (the environment and one record a case, rewritten after each case)
and DIR/modules.tar.gz (each case's optimized module as the compiler dumped it:
`modules/<case>.after_codegen.txt` and `.hlo.pb` on a TPU, `after_optimizations` on a
CPU; rewritten each minute and at the end). `micro_summary.py DIR` writes the compact
summary that is committed. (`chip.py`'s helpers are not imported: it imports optax, which
the chip's machine lacks.)

On a CPU (JAX_PLATFORMS=cpu) Pallas TPU kernels are skipped (said so per case) and cases
larger than `--max-run-bytes` / `--max-run-flops` are compiled but not run: a check that
the script works. `--deviceless v5e` compiles every case for a v5e with no chip (libtpu,
deviceless) and runs none: a check that the chip's compiler takes them all.
"""

import argparse
import bisect
import concurrent.futures
import gc
import glob
import hashlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import numpy as np


START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))
import micro_cases  # noqa: E402
import micro_cases_k  # noqa: E402
import micro_cases_l  # noqa: E402
from micro_cases import Case  # noqa: E402


DUMP = {"xla_dump_hlo_as_text": True, "xla_dump_hlo_as_proto": True}
_NAME = re.compile(r"%?([\w.\-]+) = ")
_OPCODE = re.compile(r"(?<![\w.\-])([a-z][a-z0-9\-]*)\(")


def log(*args: Any) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s]", *args, flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for micro.json and modules.tar.gz")
    p.add_argument("--cases", default="", help="groups or case names, comma-separated (default: all)")
    p.add_argument("--quick", action="store_true", help="a few cases of each group")
    p.add_argument("--selftest", action="store_true", help="three cases, checked (under 30 s on the chip)")
    p.add_argument("--budget-seconds", type=float, default=420.0, help="start no case past this wall time")
    p.add_argument("--steps", type=int, default=10, help="most runs timed alone")
    p.add_argument("--target-seconds", type=float, default=0.25, help="about how long a case's timed runs take")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--profile-runs", type=int, default=3)
    p.add_argument("--chunk", type=int, default=8, help="cases profiled in one trace")
    p.add_argument("--chunk-bytes", type=float, default=3 * 2**30, help="most bytes a chunk's cases keep alive")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--max-run-bytes", type=float, default=None, help="run no larger case (default: 64 MiB on CPU)")
    p.add_argument("--max-run-flops", type=float, default=None, help="run no larger case (default: 4e9 on CPU)")
    p.add_argument("--deviceless", metavar="TARGET", help="compile for a TPU (e.g. v5e) with no chip; run nothing")
    p.add_argument("--list", action="store_true", help="print the chosen cases and stop")
    args = p.parse_args()
    on_cpu = args.deviceless is None and jax.default_backend() == "cpu"
    args.max_run_bytes = args.max_run_bytes or (64 * 2**20 if on_cpu else math.inf)
    args.max_run_flops = args.max_run_flops or (4e9 if on_cpu else math.inf)
    return args


def device_of(args: argparse.Namespace) -> tuple[Any, str]:
    """The device the cases compile for, and where they run: "tpu", "cpu" (or another
    backend's name), or "deviceless"."""
    if args.deviceless is None:
        return jax.devices()[0], jax.default_backend()
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(f"{args.deviceless}:1x1", "tpu", chips_per_host_bounds=(1, 1, 1))
    return topology.devices[0], "deviceless"


def choose(cases: list[Case], args: argparse.Namespace, where: str) -> list[Case]:
    if args.selftest:
        names = list(micro_cases.SELFTEST)
        if where not in ("tpu", "deviceless"):
            names[-1] = "ew_16mib"  # (no Pallas TPU kernel off a TPU)
        return [c for n in names for c in cases if c.name == n]
    groups = micro_cases.GROUPS + micro_cases_k.GROUPS_K + micro_cases_l.GROUPS_L
    if args.cases:
        wanted = args.cases.split(",")
        unknown = [w for w in wanted if w not in groups and w not in {c.name for c in cases}]
        if unknown:
            raise SystemExit(f"--cases: no group or case {unknown}; groups: {', '.join(groups)}")
        cases = [c for c in cases if c.group in wanted or c.name in wanted]
    else:  # the first set (the second only by name)
        cases = [c for c in cases if c.group in micro_cases.GROUPS]
    return [c for c in cases if c.quick] if args.quick else cases


def _version(module: str) -> str:
    try:
        return str(getattr(__import__(module), "__version__", "?"))
    except Exception:
        return "not importable"


def environment(dev: Any, where: str, args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": where,
        "device": str(dev),
        "device_kind": getattr(dev, "device_kind", "?"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in vars(args).items()},
        "libtpu_init_args": os.environ.get("LIBTPU_INIT_ARGS"),
        "xla_flags": os.environ.get("XLA_FLAGS"),
    }
    env["libtpu"] = _version("libtpu")
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("micro.py", "micro_cases.py", "micro_cases_k.py", "micro_cases_l.py"):
        digest.update((here / name).read_bytes())
    env["scripts_sha256"] = digest.hexdigest()[:16]
    return env


# -- compiling ----------------------------------------------------------------------------------
def _sharding(dev: Any, memory: str) -> Any:
    return jax.sharding.SingleDeviceSharding(dev, memory_kind=None if memory == "device" else memory)


def lower(case: Case, dev: Any) -> tuple[Any, Any]:
    """The case's step lowered for `dev`, and the program that builds its arguments there."""
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_sharding(dev, a.memory)) for a in case.args]
    step = jax.jit(case.named(), donate_argnums=case.donate).lower(*abstract)
    shardings = tuple(_sharding(dev, a.memory) for a in case.args)
    init = jax.jit(lambda: micro_cases.make(case.args), out_shardings=shardings).lower()
    return step, init


def compile_case(step: Any, init: Any, dump: Path) -> tuple[Any, Any, float]:
    start = time.perf_counter()
    compiled = step.compile(compiler_options={"xla_dump_to": str(dump), **DUMP})
    seconds = time.perf_counter() - start
    return compiled, init.compile(), seconds


def compiled_facts(compiled: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        m = compiled.memory_analysis()
        fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")
        out["memory"] = {f: int(getattr(m, f)) for f in fields if hasattr(m, f)}
    except Exception:
        pass
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        keep = ("flops", "transcendentals", "bytes accessed", "optimal_seconds")
        out["cost_analysis"] = {k: float(v) for k, v in (cost or {}).items() if k in keep}
    except Exception:
        pass
    return out


def keep_module(dump: Path, name: str, modules: Path) -> tuple[str | None, list[str]]:
    """The module's name and its files, copied from the compiler's dump into `modules`
    (libtpu's after_codegen module, else XLA's after_optimizations one)."""
    for kind in ("after_codegen", "after_optimizations"):
        found = sorted(glob.glob(str(dump / f"*{kind}.txt")))
        if found:
            break
    kept, module = [], None
    for i, path in enumerate(found):
        stem = f"{name}{'' if i == 0 else f'.{i}'}.{kind}"
        match = re.match(r"module_\d+\.([\w\-]+)\.", os.path.basename(path))
        module = module or (match.group(1) if match else None)
        for suffix in (".txt", ".hlo.pb"):
            source = path[: -len(".txt")] + suffix
            if os.path.exists(source):
                shutil.copy(source, modules / f"{stem}{suffix}")
                kept.append(f"{stem}{suffix}")
    shutil.rmtree(dump, ignore_errors=True)
    return module, kept


def write_tar(modules: Path, out: Path) -> None:
    tmp = out / "modules.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(modules, arcname="modules")
    os.replace(tmp, out / "modules.tar.gz")


# -- running ----------------------------------------------------------------------------------
def step_once(case: Case, compiled: Any, state: list[Any]) -> Any:
    """One run; a donated argument replaced by what the run returned for it."""
    out = compiled(*state)
    for j, i in enumerate(case.donate):
        state[i] = out[j]
    return out


def measure(case: Case, compiled: Any, init: Any, args: argparse.Namespace) -> tuple[dict[str, Any], list[Any]]:
    """Warm-up, runs timed alone, groups back to back; the record and the live arguments."""
    state = list(init())
    jax.block_until_ready(state)
    warm = []
    for _ in range(2):
        start = time.perf_counter()
        jax.block_until_ready(step_once(case, compiled, state))
        warm.append(time.perf_counter() - start)
    steps = int(min(args.steps, max(3, args.target_seconds / 2 / max(warm[-1], 1e-6))))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(step_once(case, compiled, state))
        times.append(time.perf_counter() - start)
    # As a training loop runs: `group` runs dispatched back to back, then one wait;
    # `issued`: the host's time to return from a call
    group = 5 if warm[-1] < 0.02 else 2
    groups = int(min(6, max(3, args.target_seconds / 2 / max(group * warm[-1], 1e-6))))
    grouped, issued = [], []
    for _ in range(groups):
        start = time.perf_counter()
        for _ in range(group):
            out = step_once(case, compiled, state)
        issued.append((time.perf_counter() - start) / group)
        jax.block_until_ready(out)
        grouped.append((time.perf_counter() - start) / group)
        del out
    rec = {"warm_up": warm, "times": times, "median": statistics.median(times), "group_size": group}
    rec |= {
        "grouped": grouped,
        "median_back_to_back": statistics.median(grouped),
        "median_issued": statistics.median(issued),
    }
    return rec, state


# -- profiling --------------------------------------------------------------------------------
def _stats(event: Any) -> dict[str, Any]:
    out = {}
    for key, value in event.stats:
        out[key] = value if isinstance(value, (int, float)) else str(value)[:160]
    return out


def read_trace(directory: Path) -> list[dict[str, Any]]:
    """Each plane that ran the programs: its "XLA Modules" events (name, start, duration)
    and its kernels' events (name, start, duration, stats): a device's "XLA Ops" line, or
    on a CPU the host's events that name an HLO op."""
    files = sorted(glob.glob(str(directory / "**" / "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not files:
        raise RuntimeError("the profiler wrote no .xplane.pb")
    everything = list(jax.profiler.ProfileData.from_file(files[-1]).planes)
    chosen = [p for p in everything if p.name.startswith("/device:")]
    chosen = chosen or [p for p in everything if p.name == "/host:CPU"]  # (a CPU: its programs run on the host)
    planes = []
    for plane in chosen:
        device = plane.name.startswith("/device:")
        modules, ops, lines = [], [], {}
        for line in plane.lines:
            events = list(line.events)
            lines[line.name] = len(events)
            if line.name == "XLA Modules":
                modules += [(e.name, e.start_ns, e.duration_ns) for e in events]
            elif line.name == "XLA Ops" or not device:
                for e in events:
                    stats = _stats(e)
                    if device or "hlo_op" in stats:
                        ops.append((e.name, e.start_ns, e.duration_ns, stats))
        if ops or modules:
            planes.append({"plane": plane.name, "modules": modules, "ops": ops, "lines": lines})
    return planes


def _is_module(event_name: str, module: str) -> bool:
    """Whether an "XLA Modules" event (e.g. `jit_step(12)`) is a run of `module`: its name
    as a whole word (`jit_ew_16mib` is not `jit_ew_16mib_bf16`)."""
    return re.search(r"(?<!\w)" + re.escape(module) + r"(?!\w)", event_name) is not None


def attribute(planes: list[dict[str, Any]], modules: list[str], runs: int) -> tuple[str | None, dict[str, Any]]:
    """Each case's kernel events and its program's durations, and how they were told apart:
    by the program's span on the "XLA Modules" line ("span"), by the kernel's hlo_module
    stat ("hlo_module"), the one case of the trace ("alone"), or the programs' order
    ("order"); None if no way credits every case with a kernel."""
    found: dict[str, Any] = {m: {"ops": [], "module_ns": []} for m in modules}
    windows = []
    for p in planes:
        for name, start, duration in p["modules"]:
            owner = next((m for m in modules if _is_module(name, m)), None)
            if owner is not None:
                windows.append((p["plane"], start, start + duration, owner))
                found[owner]["module_ns"].append(duration)
    if windows:
        ordered = sorted(windows)
        keys = [(w[0], w[1]) for w in ordered]
        for p in planes:
            for op in p["ops"]:
                i = bisect.bisect_right(keys, (p["plane"], op[1])) - 1
                if i >= 0 and ordered[i][0] == p["plane"] and op[1] <= ordered[i][2]:
                    found[ordered[i][3]]["ops"].append((p["plane"], *op))
        if all(f["ops"] for f in found.values()):
            return "span", found
    with_module = [(p["plane"], *op) for p in planes for op in p["ops"] if "hlo_module" in op[3]]
    if with_module:
        for f in found.values():
            f["ops"] = []
        for op in with_module:
            if op[4]["hlo_module"] in found:
                found[op[4]["hlo_module"]]["ops"].append(op)
        if all(f["ops"] for f in found.values()):
            return "hlo_module", found
    if len(modules) == 1:
        found[modules[0]]["ops"] = [(p["plane"], *op) for p in planes for op in p["ops"]]
        found[modules[0]]["module_ns"] = [e[2] for p in planes for e in p["modules"]]
        return ("alone" if found[modules[0]]["ops"] else None), found
    busiest = max(planes, key=lambda p: len(p["modules"]), default=None)
    if busiest is not None and len(busiest["modules"]) == runs * len(modules):
        spans = sorted(busiest["modules"], key=lambda e: e[1])
        for i, m in enumerate(modules):
            mine = spans[i * runs : (i + 1) * runs]
            found[m] = {"module_ns": [e[2] for e in mine], "ops": []}
            for op in busiest["ops"]:
                if any(s <= op[1] <= s + d for _, s, d in mine):
                    found[m]["ops"].append((busiest["plane"], *op))
        if all(f["ops"] for f in found.values()):
            return "order", found
    return None, found


def kernels(ops: list[tuple[Any, ...]], runs: int) -> dict[str, Any]:
    """Each kernel (by its instruction's name) with its op, hlo_category, count, total and
    each run's duration (ns), and its first event's stats."""
    out: dict[str, Any] = {}
    planes = {op[0] for op in ops}
    for plane, name, _, duration, stats in ops:
        match = _NAME.match(name)
        key = match.group(1) if match else name[:120]
        if len(planes) > 1:
            key += f"@{plane}"
        rec = out.get(key)
        if rec is None:
            rest = name[match.end() :] if match else ""
            opcode = _OPCODE.search(rest)
            fusion = re.search(r"kind=(k\w+)", rest)
            rec = out[key] = {
                "op": opcode.group(1) if opcode else stats.get("hlo_op"),
                "fusion_kind": fusion.group(1) if fusion else None,
                "category": stats.get("hlo_category"),
                "count": 0,
                "ns": 0.0,
                "each": [],
                "hlo": name[:300],
                "stats": stats,
            }
        rec["count"] += 1
        rec["ns"] += duration
        if len(rec["each"]) < 64:
            rec["each"].append(duration)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ns"]))


def trace(items: list[tuple[Case, Any, list[Any], dict[str, Any]]], runs: int, directory: Path) -> Any:
    """`runs` runs of each case under the profiler (its defaults, as `chip.py`); the trace's
    planes, and the seconds it took to run and to read."""
    shutil.rmtree(directory, ignore_errors=True)
    start = time.perf_counter()
    jax.profiler.start_trace(str(directory))
    try:
        for case, compiled, state, _ in items:
            for _ in range(runs):
                out = step_once(case, compiled, state)
            jax.block_until_ready(out)
            del out
    finally:
        jax.profiler.stop_trace()
    traced = time.perf_counter() - start
    planes = read_trace(directory)
    shutil.rmtree(directory, ignore_errors=True)
    return planes, traced, time.perf_counter() - start - traced


def profile_chunk(items: list[Any], args: argparse.Namespace, directory: Path, settings: dict[str, Any]) -> None:
    """Each case's kernels into its record ("profile"), from one trace of all the chunk's
    cases; each case traced alone where that fails (and from then on)."""
    runs = max(1, args.profile_runs)
    try:
        planes, traced, parsed = trace(items, runs, directory)
    except Exception:
        for *_, rec in items:
            rec["profile_error"] = traceback.format_exc()[-2000:]
        log("profile FAILED", traceback.format_exc()[-400:])
        return
    method, found = attribute(planes, [rec["module"] for *_, rec in items], runs)
    if method is None and len(items) > 1:
        log(f"profile: kernels of {len(items)} cases not told apart in one trace; each case traced alone from now on")
        settings["chunk"] = 1
        for item in items:
            profile_chunk([item], args, directory, settings)
        return
    lines = {p["plane"]: p["lines"] for p in planes}
    for *_, rec in items:
        mine = found[rec["module"]]
        module_ns = mine["module_ns"]
        rec["profile"] = {
            "runs": runs,
            "method": method,
            "chunk": len(items),
            "trace_seconds": traced,
            "parse_seconds": parsed,
            "module_ns": module_ns,
            "device_seconds": sum(module_ns) / len(module_ns) / 1e9 if module_ns else None,
            "kernels": kernels(mine["ops"], runs),
            "lines": lines,
        }
        if method is None:
            rec["profile_error"] = "no kernel events credited to this case"


# -- the run ------------------------------------------------------------------------------------
def summary_line(rec: dict[str, Any]) -> str:
    name = f"{rec['name']:<26} {rec['group']:<11}"
    if "error" in rec:
        return f"{name} FAILED {rec['error'].strip().splitlines()[-1][:200]}"
    if "not_run" in rec:
        return f"{name} {rec['not_run']}"
    line = f"{name} median {rec['median'] * 1e6:10.1f} us  back-to-back {rec['median_back_to_back'] * 1e6:10.1f} us"
    profile = rec.get("profile")
    if profile and profile["kernels"]:
        device = profile["device_seconds"]
        top, k = next(iter(profile["kernels"].items()))
        line += f"  device {device * 1e6:9.1f} us" if device else ""
        line += f"  top {top} ({k['category']}) {k['ns'] / profile['runs'] / 1e3:9.1f} us"
        line += f" x{k['count'] // profile['runs']}" if k["count"] > profile["runs"] else ""
    elif "profile_error" in rec:
        line += "  profile FAILED"
    return line


def base_record(case: Case) -> dict[str, Any]:
    expected = {"flops": case.flops, "bytes": case.bytes, "transcendentals": case.transcendentals}
    return {
        "name": case.name,
        "group": case.group,
        "varied": case.varied,
        "params": case.params,
        "expected": expected,
        "donate": list(case.donate),
        "module": f"jit_{case.name}",
    }


class Runner:
    def __init__(self, args: argparse.Namespace, dev: Any, where: str, cases: list[Case]) -> None:
        self.args, self.dev, self.where, self.cases = args, dev, where, cases
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="micro-"))
        self.modules = self.work / "modules"
        self.modules.mkdir()
        self.env = environment(dev, where, args)
        self.records: list[dict[str, Any]] = []
        self.settings = {"chunk": max(1, args.chunk)}
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, args.threads))
        self.futures: dict[str, Any] = {}
        self.lowered = 0
        self.per_case: list[float] = []
        self.tar_written = time.perf_counter()

    def write(self, final: bool = False, left_out: list[str] | None = None) -> None:
        doc = {"env": self.env, "cases": self.records, "done": final, "left_out": left_out or []}
        tmp = self.out / "micro.json.tmp"
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.out / "micro.json")
        if final or time.perf_counter() - self.tar_written > 60:
            write_tar(self.modules, self.out)
            self.tar_written = time.perf_counter()

    def submit_ahead(self, index: int) -> None:
        """Lower (here: tracing wants this thread) and hand to the compile threads every
        case up to `index` plus a lookahead that keeps the threads busy."""
        ahead = min(len(self.cases), index + 2 * max(1, self.args.threads) + 4)
        while self.lowered < ahead:
            case = self.cases[self.lowered]
            self.lowered += 1
            if case.tpu_only and self.where not in ("tpu", "deviceless"):
                continue
            start = time.perf_counter()
            try:
                step, init = lower(case, self.dev)
            except Exception:
                future: Any = concurrent.futures.Future()
                future.set_exception(RuntimeError("lowering failed:\n" + traceback.format_exc()[-3000:]))
                self.futures[case.name] = (future, time.perf_counter() - start)
                continue
            future = self.pool.submit(compile_case, step, init, self.work / "dumps" / case.name)
            self.futures[case.name] = (future, time.perf_counter() - start)

    def over_budget(self, reserve: float) -> bool:
        elapsed = time.perf_counter() - START
        typical = statistics.median(self.per_case[-20:]) if self.per_case else 2.0
        return bool(elapsed + reserve + 2 * typical > self.args.budget_seconds)

    def run(self) -> int:
        chunk: list[Any] = []
        chunk_bytes = 0.0
        left_out: list[str] = []
        for index, case in enumerate(self.cases):
            if self.over_budget(reserve=10 + (3 if chunk else 0)):
                left_out = [c.name for c in self.cases[index:]]
                more = ", ..." if len(left_out) > 8 else ""
                log(f"budget: {len(left_out)} cases left out ({', '.join(left_out[:8])}{more})")
                break
            began = time.perf_counter()
            self.submit_ahead(index)
            rec = base_record(case)
            self.records.append(rec)
            kept = self.one(case, rec)
            if kept is not None:
                chunk.append(kept)
                chunk_bytes += sum(a.nbytes for a in case.args) + case.bytes
            else:
                print(summary_line(rec), flush=True)
            last = index == len(self.cases) - 1
            if chunk and (
                len(chunk) >= self.settings["chunk"]
                or chunk_bytes > self.args.chunk_bytes
                or last
                or self.over_budget(reserve=13)
            ):
                self.flush(chunk)
                chunk, chunk_bytes = [], 0.0
            self.per_case.append(time.perf_counter() - began)
            self.write()
        if chunk:
            self.flush(chunk)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.write(final=True, left_out=left_out)
        shutil.rmtree(self.work, ignore_errors=True)
        failed = [r["name"] for r in self.records if "error" in r]
        log(f"done: {len(self.records)} cases, {len(failed)} failed {failed[:10]}, {len(left_out)} left out")
        return 1 if failed else 0

    def flush(self, chunk: list[Any]) -> None:
        if self.args.profile and self.where != "deviceless":
            profile_chunk(chunk, self.args, self.work / "trace", self.settings)
        for *_, rec in chunk:
            print(summary_line(rec), flush=True)
        chunk.clear()
        gc.collect()

    def one(self, case: Case, rec: dict[str, Any]) -> Any:
        """Compile (wait for its thread), keep the module, time it; what the profile needs
        if it ran, else None."""
        if case.tpu_only and self.where not in ("tpu", "deviceless"):
            rec["not_run"] = f"skipped on {self.where}: a Pallas TPU kernel (checked with --deviceless v5e)"
            return None
        future, rec["lower_seconds"] = self.futures.pop(case.name)
        try:
            compiled, init, rec["compile_seconds"] = future.result()
            rec |= compiled_facts(compiled)
            module, rec["module_files"] = keep_module(self.work / "dumps" / case.name, case.name, self.modules)
            rec["module"] = module or rec["module"]
        except Exception:
            rec["error"] = traceback.format_exc()[-3000:]
            return None
        if self.where == "deviceless":
            rec["not_run"] = f"compiled for {self.args.deviceless} (deviceless)"
            return None
        size = sum(a.nbytes for a in case.args) + case.bytes
        if size > self.args.max_run_bytes or case.flops > self.args.max_run_flops:
            rec["not_run"] = f"compiled; not run on {self.where} ({size / 2**20:.0f} MiB, {case.flops:.1e} FLOPs)"
            return None
        try:
            timing, state = measure(case, compiled, init, self.args)
            rec |= timing
        except Exception:
            rec["error"] = traceback.format_exc()[-3000:]
            return None
        if not self.args.profile:
            print(summary_line(rec), flush=True)
            del state
            return None
        return case, compiled, state, rec


def selftest_check(records: list[dict[str, Any]], where: str, profiled: bool) -> int:
    problems = []
    for r in records:
        if "error" in r:
            problems.append(f"{r['name']}: failed")
        elif where != "deviceless" and "median" not in r:
            problems.append(f"{r['name']}: not run ({r.get('not_run')})")
        elif where == "tpu" and profiled and not (r.get("profile") or {}).get("kernels"):
            problems.append(f"{r['name']}: no kernels in its profile ({r.get('profile_error', '')[-200:]})")
        elif not r.get("module_files"):
            problems.append(f"{r['name']}: no module dumped")
    methods = sorted({(r.get("profile") or {}).get("method") or "-" for r in records})
    log(f"selftest: {len(records)} cases, profiles told apart by {methods}: " + ("; ".join(problems) or "ok"))
    return 1 if problems else 0


def main() -> int:
    args = parse_args()
    dev, where = device_of(args)
    every = micro_cases.cases(dev) + micro_cases_k.cases() + micro_cases_l.cases()
    assert len({c.name for c in every}) == len(every), "case names must be unique across the sets"
    cases = choose(every, args, where)
    if args.list:
        for c in cases:
            size = sum(a.nbytes for a in c.args) / 2**20
            print(
                f"{c.name:<28} {c.group:<11} varies {c.varied:<11} {size:9.1f} MiB in  {c.flops:9.2e} FLOPs  {c.params}"
            )
        print(f"{len(cases)} cases")
        return 0
    if where not in ("deviceless",) and "pinned_host" not in {m.kind for m in dev.addressable_memories()}:
        log("this device has no pinned_host memory: the host group is left out")
        cases = [c for c in cases if c.group != "host"]
    runner = Runner(args, dev, where, cases)
    set_of = {g: "k" for g in micro_cases_k.GROUPS_K} | {g: "l" for g in micro_cases_l.GROUPS_L}
    sets = {set_of.get(c.group, "first") for c in cases}
    runner.env["set"] = sets.pop() if len(sets) == 1 else "mixed"
    log("env", json.dumps(runner.env))
    log(f"{len(cases)} cases on {where}, {args.threads} compile threads, budget {args.budget_seconds:.0f} s")
    status = runner.run()
    if args.selftest:
        status = selftest_check(runner.records, where, args.profile) or status
    return status


if __name__ == "__main__":
    sys.exit(main())
