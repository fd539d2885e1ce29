"""A held-out group against the model as committed: each row's `ts.cost(target="v5e")` as a
user gets it (deviceless, one process a row, several at once), then the chip's measured
median (`chip.py`'s rows.json) beside it.

    python benchmarks/steptime/heldout.py cost --rows K --out costs.json [--workers 8]
    python benchmarks/steptime/heldout.py compare costs.json DIR/rows.json [--json OUT]

`cost` needs no accelerator (run it with JAX_PLATFORMS=cpu where a chip is held by another
program); `compare` prints the guide's table: each step's measured median, `seconds`,
their ratio, `checked`, and the median of |seconds / measured - 1|.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ONE_ROW = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import jax
import chip
import treeshape as ts
name, size = sys.argv[2], int(sys.argv[3])
case = chip.case_of(name, size)
start = time.perf_counter()
c = ts.cost(jax.jit(case.step, donate_argnums=0), *case.abstract(), target="v5e")
t = c.time
kinds = {}
for k in t.kernels:
    kinds[k.kind] = kinds.get(k.kind, 0.0) + k.seconds
print("ROW " + json.dumps({
    "name": name, "size": size, "seconds": t.seconds, "compiler_seconds": t.compiler_seconds,
    "floor_seconds": t.floor_seconds, "checked": t.checked, "source": t.source,
    "by_kind": kinds, "kernels": [[k.op, k.kind, k.seconds] for k in t.kernels[:10]],
    "cost_seconds": time.perf_counter() - start,
}))
"""


def _cost_row(row: tuple[str, int]) -> dict[str, Any]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = str(HERE.parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-c", ONE_ROW, str(HERE), row[0], str(row[1])],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode or not found:
        return {"name": row[0], "size": row[1], "error": done.stderr.strip().splitlines()[-1:]}
    record: dict[str, Any] = json.loads(found[-1])
    return record


def cost(args: argparse.Namespace) -> None:
    import kinds  # (JAX and the step models, only here)
    import kinds_l
    import kinds_n
    import models

    groups = {"K": kinds.AFTER_J, "L": kinds_l.AFTER_K, "N": kinds_n.AFTER_L, "M": models.POLICIES}
    rows = []
    for name in args.rows.split(","):  # a group, or one row as NAME:SIZE
        rows += models.rows(groups[name]) if name in groups else [(name.rsplit(":", 1)[0], int(name.rsplit(":", 1)[1]))]
    out: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        for record in pool.map(_cost_row, rows):
            out.append(record)
            print(json.dumps({k: record.get(k) for k in ("name", "size", "seconds", "checked", "error")}), flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def compare(args: argparse.Namespace) -> None:
    costs = {(r["name"], r["size"]): r for r in json.loads(Path(args.costs).read_text())}
    measured = json.loads(Path(args.rows).read_text())["rows"]
    print("| step | size | measured (ms) | `seconds` (ms) | `seconds` / measured | `checked` | largest kind |")
    print("|---|---:|---:|---:|---:|---:|---|")
    ratios, table = [], []
    for m in measured:
        c = costs.get((m["name"], m["size"]))
        if c is None or "error" in m or "error" in c:
            why = m.get("error") or (c or {}).get("error") or "not costed"
            print(f"| {m['name']} | {m['size']} | - | - | - | - | {str(why)[:80]} |")
            continue
        ratio = c["seconds"] / m["median_back_to_back"]
        ratios.append(ratio)
        kind = max(c["by_kind"], key=lambda k: c["by_kind"][k])
        print(
            f"| {m['name']} | {m['size']} | {m['median_back_to_back'] * 1e3:.2f} | {c['seconds'] * 1e3:.2f} "
            f"| {ratio:.2f} | {c['checked']:.0%} | {kind} |"
        )
        table.append({"name": m["name"], "size": m["size"], "measured": m["median_back_to_back"], **c, "ratio": ratio})
    if ratios:
        errors = [abs(r - 1) for r in ratios]
        inside = sum(0.8 <= r <= 1.25 for r in ratios)
        print(
            f"\n{len(ratios)} steps: `seconds` / measured {min(ratios):.2f}-{max(ratios):.2f}, "
            f"{inside} within 0.8-1.25, median |seconds / measured - 1| {statistics.median(errors):.1%}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cost")
    p.add_argument("--rows", default="K")
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=8)
    p = sub.add_parser("compare")
    p.add_argument("costs")
    p.add_argument("rows")
    p.add_argument("--json")
    args = parser.parse_args()
    {"cost": cost, "compare": compare}[args.command](args)


if __name__ == "__main__":
    main()
