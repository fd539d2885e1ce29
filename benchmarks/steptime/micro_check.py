"""The microbenchmarks against the model: each `micro.py` case costed here by a deviceless
`ts.cost(target="v5e")` (the module libtpu writes here is the one the chip's compile wrote)
and its kernels' `seconds` summed, against the device time the chip's profile measured
(`kernels_s` of the committed summary). Prints the guide's table per kind (cases, the
measured range, model / measured: median and range, and the numbers of the calibration the
kind fixes) and, with `--cases`, every case.

    python benchmarks/steptime/micro_check.py [--summary PATH] [--groups host,pallas] [--cases] [--json OUT]

The second set's cases (`micro_cases_k.py`) are costed with its summary:
`--summary measured/microk-2026-12-07.json`; the third's (`micro_cases_l.py`) with
`--summary measured/microl-2026-12-07.json`.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import jax


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import micro_cases  # noqa: E402
import micro_cases_k  # noqa: E402
import micro_cases_l  # noqa: E402

import treeshape as ts  # noqa: E402


# The calibration's numbers each kind's microbenchmarks fix (`calibrate.py`).
FIXES = {
    "host": "host_bytes_per_second.*",
    "pallas": "pallas_step_seconds, pallas_mxu_efficiency",
    "gather": "gather_seconds_per_row.*, gather_row_bytes_per_second, gather_row_knee_bytes",
    "scatter": "scatter_seconds_per_row, scatter_row_bytes_per_second",
    "mm_f32": "f32_passes.*",
    "scatter2": "scatter_large_table_factor, scatter_in_place_row_seconds, scatter_in_place_row_bytes_per_second",
    "stride": "strided_bytes_per_second.*",
    "layout": "loop_vmem_bytes_per_second.copy",
    "ttable": "scatter_transposed_tile_seconds, gather_transposed_*",
    "cacheput": "update_lane_tile_seconds",
}


def model_seconds(case: micro_cases.Case) -> tuple[float, float]:
    """The case's kernels' `seconds` summed (the runtime's gaps left out: a profile's kernels
    hold none of them), and the step's `checked`."""

    def placed(a: micro_cases.Arg) -> jax.ShapeDtypeStruct:  # in the memory kind the case puts it in
        where = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind=a.memory)
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=where if a.memory != "device" else None)

    args = [placed(a) for a in case.args]
    t = ts.cost(jax.jit(case.named(), donate_argnums=case.donate), *args, target="v5e").time
    assert t is not None
    return sum(k.seconds for k in t.kernels if k.kind != "launch"), t.checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = sorted((HERE / "measured").glob("micro-*.json"))[-1]
    parser.add_argument("--summary", default=str(default))
    parser.add_argument("--groups", help="comma-separated groups (default: all)")
    parser.add_argument("--cases", action="store_true", help="print every case")
    parser.add_argument("--json", help="write every case's figures here")
    args = parser.parse_args()
    summary = {c["name"]: c for c in json.loads(Path(args.summary).read_text())["cases"]}
    every = micro_cases.GROUPS + micro_cases_k.GROUPS_K + micro_cases_l.GROUPS_L
    groups = args.groups.split(",") if args.groups else list(every)
    device = jax.devices()[0]
    rows: list[dict[str, Any]] = []
    for case in micro_cases.cases(device) + micro_cases_k.cases() + micro_cases_l.cases():
        measured = summary.get(case.name, {})
        if case.group not in groups or "kernels_s" not in measured:
            continue
        seconds, checked = model_seconds(case)
        row = {"name": case.name, "group": case.group, "varied": case.varied, "measured_s": measured["kernels_s"]}
        row |= {"seconds": seconds, "ratio": seconds / measured["kernels_s"], "checked": checked}
        rows.append(row)
        if args.cases:
            us = f"measured {row['measured_s'] * 1e6:10.1f} us  seconds {seconds * 1e6:10.1f} us"
            print(f"{case.name:28s} {us}  {row['ratio']:.2f}")
    print("| kind | cases | measured (us) | `seconds` / measured: median | range | within 0.8-1.25 | fixes |")
    print("|---|---:|---|---:|---|---:|---|")
    for group in groups:
        chosen = [r for r in rows if r["group"] == group]
        if not chosen:
            continue
        ratios = [r["ratio"] for r in chosen]
        spread = f"{min(r['measured_s'] for r in chosen) * 1e6:.1f}-{max(r['measured_s'] for r in chosen) * 1e6:.0f}"
        inside = sum(0.8 <= x <= 1.25 for x in ratios)
        print(
            f"| {group} | {len(chosen)} | {spread} | {statistics.median(ratios):.2f} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} | {inside} | {FIXES.get(group, 'profiles (groups A-I)')} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
