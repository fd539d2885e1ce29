"""The committed summary of a `micro.py` run: what the calibration is rebuilt from.

Reads DIR/micro.json and writes a small JSON (by default
`benchmarks/steptime/measured/micro-<date of the run>.json`, or `microk-<date>.json` for a
run of the second set alone, `micro_cases_k.py`, which `calibrate.py` then does not take
for the first set's): the run's environment (jax, libtpu, the device, the date, the
scripts' digest, the set) and per case its group, the one thing it varies, its parameters,
the FLOPs and bytes a user expects, libtpu's own estimate (`cost_analysis`), the median
step (runs timed alone, and back to back), the program's device time per run, and its
kernels: each kernel's device seconds and count per run, its op, fusion kind and
`hlo_category` (the longest `--kernels`, the rest summed as `other_s`). Cases that failed
keep their error's last line; cases not run, why.

    python benchmarks/steptime/micro_summary.py DIR [--output PATH] [--kernels 16]
"""

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def _round(x: Any, digits: int = 4) -> Any:
    """Floats to `digits` significant digits (the summary stays small)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    return x


def case_summary(rec: dict[str, Any], top: int) -> dict[str, Any]:
    out: dict[str, Any] = {k: rec[k] for k in ("name", "group", "varied", "params", "expected")}
    cost = rec.get("cost_analysis") or {}
    out["libtpu"] = {
        "flops": cost.get("flops"),
        "bytes": cost.get("bytes accessed"),
        "transcendentals": cost.get("transcendentals"),
        "optimal_s": cost.get("optimal_seconds"),
    }
    if "error" in rec:
        out["error"] = rec["error"].strip().splitlines()[-1][:300]
        return out
    if "not_run" in rec:
        out["not_run"] = rec["not_run"]
        return out
    out["median_s"] = rec["median"]
    out["median_back_to_back_s"] = rec["median_back_to_back"]
    out["runs_timed"] = len(rec["times"])
    profile = rec.get("profile")
    if not profile:
        out["profile"] = rec.get("profile_error", "not profiled").strip().splitlines()[-1][:300]
        return out
    runs = profile["runs"]
    out["device_s"] = profile["device_seconds"]
    kernels = []
    for name, k in profile["kernels"].items():
        entry = {"kernel": name, "op": k["op"], "fusion_kind": k["fusion_kind"], "category": k["category"]}
        entry |= {"s": k["ns"] / runs / 1e9, "n": k["count"] / runs}
        kernels.append({key: value for key, value in entry.items() if value is not None})
    kernels.sort(key=lambda k: -k["s"])
    out["kernels"] = kernels[:top]
    if len(kernels) > top:
        out["other_s"] = sum(k["s"] for k in kernels[top:])
        out["other_kernels"] = len(kernels) - top
    # (a loop's or a call's own event spans its body's kernels: not counted twice)
    out["kernels_s"] = sum(k["s"] for k in kernels if k.get("op") not in ("while", "call", "conditional"))
    return out


def summarize(doc: dict[str, Any], top: int) -> dict[str, Any]:
    env = doc["env"]
    keep = ("jax", "jaxlib", "libtpu", "device_kind", "backend", "date", "scripts_sha256", "libtpu_init_args", "set")
    return {
        "source": "benchmarks/steptime/micro.py (summarized by micro_summary.py)",
        "env": {k: env.get(k) for k in keep},
        "profile_runs": env.get("args", {}).get("profile_runs"),
        "complete": doc.get("done", False),
        "left_out": doc.get("left_out", []),
        "cases": [_round(case_summary(r, top)) for r in doc["cases"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="micro.py's --out directory")
    parser.add_argument("--output", help="default: benchmarks/steptime/measured/micro[k]-<date>.json")
    parser.add_argument("--kernels", type=int, default=16, help="kernels kept per case (the longest)")
    args = parser.parse_args()
    doc = json.loads((Path(args.directory) / "micro.json").read_text())
    summary = summarize(doc, args.kernels)
    env = summary["env"]
    if args.output:
        output = Path(args.output)
    else:
        prefix = {"k": "microk", "l": "microl"}.get(env.get("set", ""), "micro")  # (not `micro-*.json`: the first set)
        output = Path(__file__).resolve().parent / "measured" / f"{prefix}-{env['date'][:10]}.json"
    if env["backend"] != "tpu":
        print(f"note: measured on {env['backend']} ({env['device_kind']}), not on a TPU", file=sys.stderr)
    output.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(summary, indent=None, separators=(",", ":"))
    # one line per case: small, and a diff shows which cases changed
    text = text.replace(',{"name":', ',\n{"name":').replace('"cases":[{', '"cases":[\n{')
    output.write_text(text + "\n")
    measured = sum("median_s" in c for c in summary["cases"])
    print(f"{output}: {len(summary['cases'])} cases ({measured} measured), {len(text) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
