"""The serving guide's decode step on a real accelerator, against treeshape's `seconds`.

The step is the guide's own (docs/guide/serving.md, the python block that defines
`make_decode`: read from the page, so the guide, this script and the tests run one
definition). A row is a batch size `b` and a cache length: the step jitted with its KV
cache donated (`donate_argnums=1`), all compiled first in a thread pool, run on real arrays
(bf16 weights, a zero cache, every sequence at position `cache // 2`): 10 steps of warm-up,
then 100 steps back to back in groups of 5, one `block_until_ready` a group, the median of
the per-step times of the groups (as `chip.py`'s `median_back_to_back`). A step writes one
token for each of the `b` sequences: its time is the time per token.

    # on the chip (jax, numpy; about a minute):
    PYTHONPATH=. python benchmarks/steptime/serving.py --out serving-chip.json
    # here, deviceless (treeshape's seconds for the same rows, target v5e):
    PYTHONPATH=. python benchmarks/steptime/serving.py --model --out serving-model.json
    # the guide's table:
    PYTHONPATH=. python benchmarks/steptime/serving.py compare serving-chip.json serving-model.json

`--config wide|deep` runs the guide's step at another size (`CONFIGS`: committed before
they were measured, to check the model on decode steps it was not fitted on) over its own
rows; `--rows B:CACHE,...` replaces the default rows (`ROWS`); `--profile-runs N` adds, for each
row, N steps under `jax.profiler`: each op's device time summed by name (`XLA Ops`) and each
run of the module with the device's idle time before the next.
"""

import argparse
import concurrent.futures
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "serving.md"
BATCHES = (1, 8, 32, 64)
CACHES = (1024, 2048, 4096)
# and the sizes the guide's plans choose: 59 (the largest at 2,048), 20 and 17 (at 4,096)
ROWS = sorted({(b, cache) for cache in CACHES for b in BATCHES} | {(59, 2048), (20, 4096), (17, 4096)},
              key=lambda r: (r[1], r[0]))  # fmt: skip
GROUP, GROUPS, WARMUP = 5, 20, 10
# Held-out sizes: 4 layers of d 1024 (16 heads of 64), and 8 layers of 4 heads of 128 (a
# cache whose head fills the lanes); each with its own rows.
CONFIGS = {
    "wide": ({"vocab": 16384, "d_model": 1024, "layers": 4, "heads": 16, "d_head": 64, "d_ff": 4096},
             [(1, 2048), (8, 2048), (32, 1024), (16, 4096), (48, 2048), (4, 8192)]),
    "deep": ({"vocab": 8192, "d_model": 512, "layers": 8, "heads": 4, "d_head": 128, "d_ff": 2048},
             [(1, 1024), (16, 2048), (64, 1024), (32, 4096)]),
}  # fmt: skip


def log(*args: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def model(config: str | None = None) -> dict[str, Any]:
    """The namespace of the guide's block that defines `make_decode` (and `CONFIG`), its
    `CONFIG` replaced by `CONFIGS[config]`'s where one is named."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), flags=re.DOTALL | re.MULTILINE)
    (code,) = [block for block in blocks if "def make_decode(" in block]
    namespace: dict[str, Any] = {"__name__": "serving_model"}
    exec(compile(code, f"<{GUIDE.name}: make_decode>", "exec"), namespace)
    if config is not None:
        namespace["CONFIG"] = dict(CONFIGS[config][0])
    return namespace


def real(shapes: Any, seed: int) -> Any:
    """Arrays of `shapes`: weights normal * 0.02, integers and the cache zero."""
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [
        (jax.random.normal(k, s.shape, jnp.float32) * 0.02).astype(s.dtype)
        if jnp.issubdtype(s.dtype, jnp.floating)
        else jnp.zeros(s.shape, s.dtype)
        for k, s in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def profiled(directory: str) -> dict[str, Any]:
    """The device's ops summed by name (count, ns), and its module runs with the idle time
    between them (ns)."""
    (file,) = Path(directory).glob("**/*.xplane.pb")
    data = jax.profiler.ProfileData.from_file(str(file))
    out: dict[str, Any] = {"ops": {}, "runs_ns": [], "idle_ns": []}
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name == "XLA Ops":
                for event in line.events:
                    count, ns = out["ops"].get(event.name, (0, 0.0))
                    out["ops"][event.name] = (count + 1, ns + event.duration_ns)
            elif line.name == "XLA Modules":
                events = sorted(line.events, key=lambda e: e.start_ns)
                out["runs_ns"] = [e.duration_ns for e in events]
                pairs = zip(events, events[1:], strict=False)
                out["idle_ns"] = [b.start_ns - a.start_ns - a.duration_ns for a, b in pairs]
    return out


def measure(compiled: Any, params: Any, cache_shapes: Any, b: int, cache: int, profile_runs: int = 0) -> dict[str, Any]:
    kv = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
    tokens, pos = jnp.zeros((b,), jnp.int32), jnp.int32(cache // 2)
    for _ in range(WARMUP):
        tokens, kv = compiled(params, kv, tokens, pos)
    jax.block_until_ready((tokens, kv))
    grouped = []
    for _ in range(GROUPS):
        start = time.perf_counter()
        for _ in range(GROUP):
            tokens, kv = compiled(params, kv, tokens, pos)
        jax.block_until_ready((tokens, kv))
        grouped.append((time.perf_counter() - start) / GROUP)
    record: dict[str, Any] = {"grouped": grouped, "seconds": statistics.median(grouped)}
    if profile_runs:
        with tempfile.TemporaryDirectory() as tmp:
            jax.profiler.start_trace(tmp)
            for _ in range(profile_runs):
                tokens, kv = compiled(params, kv, tokens, pos)
            jax.block_until_ready((tokens, kv))
            jax.profiler.stop_trace()
            record["profile"] = profiled(tmp)
    del kv
    return record


def chip(rows: list[tuple[int, int]], threads: int, profile_runs: int = 0, config: str | None = None) -> dict[str, Any]:
    ns = model(config)
    make = ns["make_decode"]
    env = {"jax": jax.__version__, "device_kind": jax.devices()[0].device_kind, "python": platform.python_version()}
    log("env", env, "config", ns["CONFIG"])
    step, params_shapes, *_ = make(rows[0][1], rows[0][0])
    params = real(params_shapes, 0)  # the same weights for every row (not donated)
    jitted = jax.jit(step, donate_argnums=1)
    out: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = {}
        for b, cache in rows:
            lowered = jitted.lower(*make(cache, b)[1:])  # traced here, compiled in the pool

            def build(lowered: Any = lowered) -> tuple[Any, float]:
                start = time.perf_counter()
                compiled = lowered.compile()
                return compiled, time.perf_counter() - start

            futures[b, cache] = pool.submit(build)
        concurrent.futures.wait(futures.values())  # (no compile beside a timed step: the host's own time counts)
        for b, cache in rows:
            record: dict[str, Any] = {"b": b, "cache": cache}
            try:
                compiled, seconds = futures[b, cache].result()
                record["compile_seconds"] = seconds
                peak = getattr(compiled.memory_analysis(), "peak_memory_in_bytes", None)
                record["peak_bytes"] = None if peak is None else int(peak)
                record.update(measure(compiled, params, make(cache, b)[2], b, cache, profile_runs))
                log(f"b={b} cache={cache}: {record['seconds'] * 1e3:.3f} ms a token (compiled in {seconds:.0f} s)")
            except Exception as e:  # a row the chip cannot hold is recorded, not fatal
                record["error"] = f"{type(e).__name__}: {str(e)[:500]}"
                log(f"b={b} cache={cache}: FAILED {record['error'][:200]}")
            futures.pop((b, cache))
            out.append(record)
    return {"env": env, "config": ns["CONFIG"], "rows": out}


def modelled(rows: list[tuple[int, int]], config: str | None = None) -> dict[str, Any]:
    import treeshape as ts

    ns = model(config)
    make = ns["make_decode"]
    out = []
    for b, cache in rows:
        step, *args = make(cache, b)
        cost = ts.cost(step, *args, donate_argnums=1, target="v5e")
        assert cost.time is not None
        out.append({"b": b, "cache": cache, "seconds": cost.time.seconds, "floor_seconds": cost.time.floor_seconds,
                    "peak_bytes": cost.compiler_peak_bytes})  # fmt: skip
        log(f"b={b} cache={cache}: {cost.time.seconds * 1e3:.3f} ms a token (treeshape, v5e)")
    return {"env": {"jax": jax.__version__, "treeshape": ts.__version__}, "config": ns["CONFIG"], "rows": out}


def compare(measured_path: str, model_path: str) -> None:
    measured = {(r["b"], r["cache"]): r for r in json.loads(Path(measured_path).read_text())["rows"]}
    model_rows = json.loads(Path(model_path).read_text())["rows"]
    print("| b | cache | measured (ms a token) | treeshape (ms a token) | treeshape / measured |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in model_rows:
        m = measured.get((r["b"], r["cache"]))
        if m is None or "seconds" not in m:
            continue
        ratio = r["seconds"] / m["seconds"]
        flag = "" if 0.8 <= ratio <= 1.2 else " (!)"
        figures = f"{m['seconds'] * 1e3:.3f} | {r['seconds'] * 1e3:.3f} | {ratio:.2f}{flag}"
        print(f"| {r['b']} | {r['cache']:,} | {figures} |")


def main() -> None:
    if sys.argv[1:2] == ["compare"]:
        compare(*sys.argv[2:4])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", action="store_true", help="treeshape's seconds (deviceless v5e), not the chip's")
    parser.add_argument("--rows", default=None, metavar="B:CACHE,...")
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--profile-runs", type=int, default=0)
    parser.add_argument("--config", choices=sorted(CONFIGS), default=None)
    args = parser.parse_args()
    default = ROWS if args.config is None else CONFIGS[args.config][1]
    rows = default if args.rows is None else [tuple(map(int, r.split(":"))) for r in args.rows.split(",")]
    start = time.perf_counter()
    if args.model:
        data = modelled(rows, args.config)  # type: ignore[arg-type]
    else:
        data = chip(rows, args.threads, args.profile_runs, args.config)  # type: ignore[arg-type]
    data["wall_seconds"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(data, indent=1))
    log(f"wrote {args.out} ({data['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
