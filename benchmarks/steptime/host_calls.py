"""The host's time to call a jitted step, on a real accelerator: microbenchmarks that vary
one thing at a time (run it on the machine that has one; jax and numpy only).

A case is a step whose device time is next to nothing (each array is 8x128 f32, one
vector op): its time back to back is the host's call. What varies: the arrays in
(`leaves`, 1-256), whether they are donated (`donated`: the state in and out, as a train
step; `kept`: in and out, nothing donated, as a serving step's weights; `read`: in, and one
scalar out), and a serving step's own arguments (`decode_args`: `kept` with a donated
state beside it and two small integer arguments); `train`: `chip.py`'s `pytree-dict` step
(its state donated, a batch, a loss out); `eqx` and `nnx`: that step over an equinox
module of `leaves / 2` linear layers and over an nnx module's `State` of as many (their
registered pytree nodes beside their arrays). And how the step is called (`--paths`): `jit`, the
function `jax.jit` returns (its dispatch in C++), `compiled`, the `Compiled` object
`.lower(...).compile()` returns (as `chip.py` and `serving.py` call their steps), `dumped`,
that compiled with `chip.py`'s dump options. Each case: 10 calls of warm-up, 20 groups
of 5 calls back to back, one `block_until_ready` a group (as `serving.py` and `chip.py`
measure), the median of the per-call times; `issued`, the host's time to return from a call
(dispatch without the wait); and `--profile-runs` calls under `jax.profiler`: the device's
time in each run of the module and the idle time between two runs' starts.

    PYTHONPATH=. python benchmarks/steptime/host_calls.py --out host-calls.json
"""

import argparse
import glob
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp


LEAVES = (1, 4, 16, 64, 256)
KINDS = ("donated", "kept", "read", "decode_args", "train", "eqx", "nnx")
DUMP = {"xla_dump_hlo_as_text": True, "xla_dump_hlo_as_proto": True}
GROUP, GROUPS, WARMUP = 5, 20, 10


def log(*args: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def case(kind: str, leaves: int) -> tuple[Any, tuple[Any, ...], int]:
    """The jitted step, its arguments, and which argument its output hands back (-1: none)."""
    state = {f"w{i:03d}": jnp.full((8, 128), float(i), jnp.float32) for i in range(leaves)}
    if kind in ("train", "eqx", "nnx"):
        layers: Any = {"layers": [{"w": jnp.ones((8, 8)), "b": jnp.zeros(8)} for _ in range(max(leaves // 2, 1))]}
        if kind == "eqx":
            import equinox as eqx

            keys = jax.random.split(jax.random.key(0), max(leaves // 2, 1))
            layers = [eqx.nn.Linear(8, 8, key=k) for k in keys]
        if kind == "nnx":
            from flax import nnx

            rngs = nnx.Rngs(0)
            layers = nnx.state(nnx.List([nnx.Linear(8, 8, rngs=rngs) for _ in range(max(leaves // 2, 1))]))

        def train(s: Any, batch: Any) -> Any:
            new = jax.tree.map(lambda x: x * 0.999 + batch["x"], s)
            return new, jnp.sum(jax.tree.leaves(new)[0])

        return jax.jit(train, donate_argnums=0), (layers, {"x": jnp.ones((), jnp.float32)}), 2
    if kind == "read":
        return jax.jit(lambda s: sum(jnp.sum(x) for x in s.values())), (state,), -1
    if kind == "decode_args":
        cache = [jnp.zeros((8, 128), jnp.float32) for _ in range(4)]

        def decode(weights: Any, cache: Any, tokens: Any, pos: Any) -> Any:
            bump = (tokens[0] + pos).astype(jnp.float32)
            return tokens + 1, [c + bump + weights["w000"] for c in cache]

        args = (state, cache, jnp.zeros((8,), jnp.int32), jnp.int32(3))
        return jax.jit(decode, donate_argnums=1), args, 1
    step = jax.jit(lambda s: {k: x + 1.0 for k, x in s.items()}, donate_argnums=0 if kind == "donated" else ())
    return step, (state,), 0


def call(step: Any, args: list[Any], hands_back: int) -> Any:
    out = step(*args)
    if hands_back == 0:
        args[0] = out
    elif hands_back == 1:
        args[2], args[1] = out
    elif hands_back == 2:
        args[0] = out[0]
    return out


def device_runs(directory: Path) -> dict[str, Any]:
    """Each run of the step's module on the device: its duration and the gap to the next start."""
    files = glob.glob(str(directory / "**" / "*.xplane.pb"), recursive=True)
    data = jax.profiler.ProfileData.from_file(files[0])
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        for line in plane.lines:
            if line.name != "XLA Modules":
                continue
            events = sorted(line.events, key=lambda e: e.start_ns)
            runs = [e.duration_ns for e in events]
            starts = [e.start_ns for e in events]
            gaps = [b - a - d for a, b, d in zip(starts, starts[1:], runs, strict=False)]
            return {"run_ns": runs, "idle_ns": gaps,
                    "median_run_ns": statistics.median(runs), "median_idle_ns": statistics.median(gaps)}  # fmt: skip
    return {"error": "no XLA Modules line"}


def measure(kind: str, leaves: int, profile_runs: int, path: str = "jit") -> dict[str, Any]:
    step, args0, hands_back = case(kind, leaves)
    if path != "jit":
        step = step.lower(*args0).compile(compiler_options=DUMP if path == "dumped" else None)
    args = list(args0)
    for _ in range(WARMUP):
        out = call(step, args, hands_back)
    jax.block_until_ready(out)
    grouped, issued = [], []
    for _ in range(GROUPS):
        start = time.perf_counter()
        for _ in range(GROUP):
            out = call(step, args, hands_back)
        issued.append((time.perf_counter() - start) / GROUP)
        jax.block_until_ready(out)
        grouped.append((time.perf_counter() - start) / GROUP)
    record: dict[str, Any] = {"kind": kind, "leaves": leaves, "path": path, "grouped": grouped, "issued": issued}
    trees = [jax.tree_util.tree_structure(a) for a in args0] + [jax.tree_util.tree_structure(out)]
    record["arrays_in"] = sum(t.num_leaves for t in trees[:-1])
    record["arrays_out"] = trees[-1].num_leaves
    record |= {"seconds": statistics.median(grouped), "issued_seconds": statistics.median(issued)}
    if profile_runs:
        with tempfile.TemporaryDirectory() as tmp:
            jax.profiler.start_trace(tmp)
            for _ in range(profile_runs):
                out = call(step, args, hands_back)
            jax.block_until_ready(out)
            jax.profiler.stop_trace()
            record["profile"] = device_runs(Path(tmp))
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile-runs", type=int, default=20)
    parser.add_argument("--paths", default="jit", help="comma-separated: jit, compiled, dumped")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--leaves", default=",".join(map(str, LEAVES)))
    args = parser.parse_args()
    env = {"jax": jax.__version__, "device_kind": jax.devices()[0].device_kind, "python": platform.python_version()}
    rows = []
    for path in args.paths.split(","):
        for kind in args.kinds.split(","):
            for leaves in map(int, args.leaves.split(",")):
                try:
                    record = measure(kind, leaves, args.profile_runs, path)
                except ImportError as e:  # (equinox or flax not installed there)
                    log(f"{path} {kind} {leaves}: {e}")
                    continue
                rows.append(record)
                idle = record.get("profile", {}).get("median_idle_ns")
                log(f"{path} {kind} {leaves}: {record['seconds'] * 1e6:.0f} us a call back to back,"
                    f" issued {record['issued_seconds'] * 1e6:.0f} us, device idle {idle} ns")  # fmt: skip
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
