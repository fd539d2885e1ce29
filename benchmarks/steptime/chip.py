"""Measure the table's train steps on a real accelerator (run it on the machine that has one).

For each row (`models.build(name, size)`): the step compiled as users compile it,
`jax.jit(step, donate_argnums=0)`, with libtpu asked to dump the optimized module (the
same options `ts.cost(target=...)` compiles with), then run on real arrays: warm-up,
then each of `--steps` runs timed alone (`block_until_ready`), the median kept; then a
few runs under `jax.profiler`, each kernel's device time summed by name. Compiles run in
parallel threads, all before the first run; runs one at a time. Needs JAX and optax (flax, equinox for their rows),
not treeshape.

    python benchmarks/steptime/chip.py --out DIR [--rows GROUP,NAME:SIZE,...] [--profile-runs N]

GROUP is tuning, held-out, fresh, unseen, last, after-e, after-f, after-g, after-h, after-i or host
(`models.py`), K (`kinds.py`), L (`kinds_l.py`), N (`kinds_n.py`) or M (`models.POLICIES`).

A row `plan/REMAT/DTYPE:SIZE` is the plan's step (`models.plan_case`); a row whose
compile the chip refuses is recorded with the compiler's error.

Writes DIR/rows.json (one record a row, written after each row) and the modules (each
row's optimized module as libtpu dumped it, `*.after_codegen.hlo.pb`, in
DIR/modules.tar.gz).
"""

import argparse
import concurrent.futures
import gc
import glob
import json
import os
import platform
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


sys.path.insert(0, str(Path(__file__).resolve().parent))
import kinds  # noqa: E402
import kinds_l  # noqa: E402
import kinds_n  # noqa: E402
import models  # noqa: E402


DUMP = {"xla_dump_hlo_as_text": True, "xla_dump_hlo_as_proto": True}


def log(*args: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def _file(key: tuple[str, int]) -> str:
    return f"{key[0]}-{key[1]}".replace("/", "_")


def case_of(name: str, size: int) -> models.Case:
    """A table row (`resnet`), or the plan's step (`plan/REMAT/DTYPE`)."""
    if name.startswith("plan/"):
        _, remat, dtype = name.split("/")
        return models.plan_case(remat, dtype, size)
    return models.build(name, size)


def lower_row(case: models.Case) -> Any:
    state, batch = case.abstract()
    return jax.jit(case.step, donate_argnums=0).lower(state, batch)


def compile_row(lowered: Any, dump: Path) -> Any:
    start = time.perf_counter()
    compiled = lowered.compile(compiler_options={"xla_dump_to": str(dump), **DUMP})
    return compiled, time.perf_counter() - start


def profile_summary(directory: Path) -> dict[str, Any]:
    """Every device plane's lines, each event name's count and total duration (ns), and
    the stats of its first occurrence."""
    files = glob.glob(str(directory / "**" / "*.xplane.pb"), recursive=True)
    if not files:
        return {"error": "no xplane.pb written"}
    data = jax.profiler.ProfileData.from_file(files[0])
    planes: dict[str, Any] = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines: dict[str, Any] = {}
        for line in plane.lines:
            events: dict[str, Any] = {}
            for event in line.events:
                rec = events.get(event.name)
                if rec is None:
                    stats = {}
                    for key, value in event.stats:
                        text = value if isinstance(value, (int, float)) else str(value)
                        stats[key] = text[:160] if isinstance(text, str) else text
                    if line.name != "XLA Ops":
                        stats = {k: v for k, v in stats.items() if k in ("hlo_category", "program_id")}
                    rec = events[event.name] = {"count": 0, "ns": 0.0, "stats": stats}
                    if line.name in ("XLA Ops", "XLA Modules"):
                        rec["each"] = []  # every run's duration, in order: the profile's own spread
                    if line.name == "XLA Modules":
                        rec["starts"] = []  # each run's start (ns): the device's idle time between steps
                rec["count"] += 1
                rec["ns"] += event.duration_ns
                if "each" in rec:
                    rec["each"].append(event.duration_ns)
                if "starts" in rec:
                    rec["starts"].append(event.start_ns)
            lines[line.name] = events
        planes[plane.name] = lines
    return planes


def measure(
    case: models.Case, compiled: Any, steps: int, profile_dir: Path, profile: bool = True, profile_runs: int = 3
) -> dict[str, Any]:
    state, batch = jax.jit(case.make)(jax.random.key(1))
    jax.block_until_ready((state, batch))
    for _ in range(3):
        state, loss = compiled(state, batch)
    jax.block_until_ready(state)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        state, loss = compiled(state, batch)
        jax.block_until_ready((state, loss))
        times.append(time.perf_counter() - start)
    # As a training loop runs: `group` steps dispatched back to back, then one wait.
    # `issued`: the host's time to return from a call (flatten, dispatch, unflatten)
    group, grouped, issued = 5, [], []
    for _ in range(max(3, steps // group)):
        start = time.perf_counter()
        for _ in range(group):
            state, loss = compiled(state, batch)
        issued.append((time.perf_counter() - start) / group)
        jax.block_until_ready((state, loss))
        grouped.append((time.perf_counter() - start) / group)
    out: dict[str, Any] = {"times": times, "median": statistics.median(times), "loss": float(loss)}
    out["grouped"] = grouped
    out["median_back_to_back"] = statistics.median(grouped)
    out["issued"] = issued
    out["median_issued"] = statistics.median(issued)
    try:
        out["memory_stats"] = {k: int(v) for k, v in (jax.devices()[0].memory_stats() or {}).items()}
    except Exception:
        pass
    if not profile:
        del state, batch
        return out
    try:
        jax.profiler.start_trace(str(profile_dir))
        for _ in range(profile_runs):
            state, loss = compiled(state, batch)
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
        out["profile"] = profile_summary(profile_dir)
        out["profile_runs"] = profile_runs
    except Exception:
        out["profile_error"] = traceback.format_exc()[-2000:]
    del state, batch
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="tuning")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--profile-runs", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = Path(tempfile.mkdtemp(prefix="modules-"))
    groups = {
        "tuning": models.TUNING,
        "held-out": models.HELD_OUT,
        "fresh": models.FRESH,
        "unseen": models.UNSEEN,
        "last": models.LAST,
        "after-e": models.AFTER_E,
        "after-f": models.AFTER_F,
        "after-g": models.AFTER_G,
        "after-h": models.AFTER_H,
        "after-i": models.AFTER_I,
        "K": kinds.AFTER_J,
        "L": kinds_l.AFTER_K,
        "N": kinds_n.AFTER_L,
        "host": models.HOST,
        "M": models.POLICIES,
    }
    rows = []
    for r in args.rows.split(","):
        if r in groups:
            rows += models.rows(groups[r])
        else:
            rows.append((r.rsplit(":", 1)[0], int(r.rsplit(":", 1)[1])))
    env = {
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "python": platform.python_version(),
    }
    try:
        import libtpu  # type: ignore[import-not-found]

        env["libtpu"] = getattr(libtpu, "__version__", "?")
    except Exception:
        env["libtpu"] = "not importable"
    log("env", env)
    work = Path(tempfile.mkdtemp(prefix="steptime-"))
    cases = {(n, s): case_of(n, s) for n, s in rows}
    futures = {}
    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
        for key, case in cases.items():
            try:
                lowered = lower_row(case)
            except Exception as e:
                futures[key] = pool.submit(lambda e=e: (_ for _ in ()).throw(e))
                continue
            futures[key] = pool.submit(compile_row, lowered, work / _file(key))
        # every compile done before the first step runs: a compile beside a timed step takes
        # the host's cores, and a step its host bounds ran slower (host_calls.py)
        concurrent.futures.wait(futures.values())
        results = []
        for key, case in cases.items():
            record: dict[str, Any] = {"name": key[0], "size": key[1], "kind": case.kind, "case": case.name}
            record["tokens"] = case.tokens
            try:
                compiled, seconds = futures[key].result()
                record["compile_seconds"] = seconds
                m = compiled.memory_analysis()
                record["memory"] = {
                    f: int(getattr(m, f))
                    for f in (
                        "argument_size_in_bytes",
                        "output_size_in_bytes",
                        "alias_size_in_bytes",
                        "temp_size_in_bytes",
                        "peak_memory_in_bytes",
                    )
                    if hasattr(m, f)
                }
                cost = compiled.cost_analysis()
                cost = cost[0] if isinstance(cost, list) else cost
                record["cost_analysis"] = {k: float(v) for k, v in cost.items() if k in ("flops", "optimal_seconds")}
                dumps = glob.glob(str(work / _file(key) / "*after_codegen.hlo.pb"))
                for d in dumps:
                    shutil.copy(d, modules / f"{_file(key)}.after_codegen.hlo.pb")
                    shutil.copy(d.replace(".hlo.pb", ".txt"), modules / f"{_file(key)}.after_codegen.txt")
                with tarfile.open(out / "modules.tar.gz", "w:gz") as tar:
                    tar.add(modules, arcname="modules")
                record["modules"] = len(dumps)
                record.update(
                    measure(case, compiled, args.steps, work / f"profile-{_file(key)}", args.profile, args.profile_runs)
                )
                del compiled
                log(key, "median", f"{record['median'] * 1e3:.2f} ms", "compile", f"{seconds:.0f} s")
            except Exception:
                record["error"] = traceback.format_exc()[-3000:]
                log(key, "FAILED", record["error"][-300:])
            results.append(record)
            (out / "rows.json").write_text(json.dumps({"env": env, "rows": results}))
            gc.collect()
    shutil.rmtree(work, ignore_errors=True)
    log("done")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    np.set_printoptions(precision=4)
    main()
