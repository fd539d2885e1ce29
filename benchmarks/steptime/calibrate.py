"""Rebuild the v5e's calibration table (`treeshape/_cost/calibration/v5e.json`) from the
committed measurement summaries: every number the step-time model uses on a TPU, each with
where it came from (the microbenchmarks or the profiles it was fitted on, libtpu's version,
the date).

- `measured/profiles-a-i.json`: the numbers fitted on the profiles of the train steps of
  groups A to I (matrix products, vector kernels, each run's latency, the gaps, the host's
  call), as recorded when they were fitted.
- `measured/micro-*.json` (`micro_summary.py` of a `micro.py` run): the kinds fitted here,
  each on microbenchmarks that vary one thing: host transfers (each way, alone), Pallas
  kernels (a blocked matmul over block sizes: each grid step's cost and the matrix unit's
  efficiency inside a kernel), gathers (per row, by row bytes and table rows) and scatters
  (per row, by row bytes and table rows).
- `measured/microk-*.json`: the second set (`micro_cases_k.py`): f32 products at each
  precision (the passes a higher one takes), scatters into large tables by each of
  libtpu's two emitters, strided slices over lanes and over sublanes, layout copies in a
  loop's body (in VMEM).
- `measured/microl-*.json`: the third set (`micro_cases_l.py`): gathers and scatters on
  tables libtpu lays out transposed (a row one lane of several tiles), by the tiles a row
  spans and where the table lies; one position written into a KV cache laid out with its
  positions along the lanes (group cacheput, a second run of the set).

    python benchmarks/steptime/calibrate.py [--check]

`--check` rebuilds in memory and fails if the committed table differs (CI's tests read the
table; this says whether it is the one the summaries give).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


HERE = Path(__file__).resolve().parent
MEASURED = HERE / "measured"
TABLE = HERE.parents[1] / "treeshape" / "_cost" / "calibration" / "v5e.json"
PEAK_BF16 = 197e12
HBM = 819e9
SMALL_TABLE_ROWS = 16384  # the gathers' and scatters' tables at or under this many rows
LARGE_TABLE_ROWS = 262144  # ... and at or over this many


def _number(value: float, unit: str, came_from: str, summary: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "value": float(f"{value:.4g}"),
        "unit": unit,
        "from": came_from,
        "summary": summary,
        "libtpu": env.get("libtpu"),
        "date": (env.get("date") or "")[:10],
    }


def _cases(doc: dict[str, Any], group: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["cases"] if c["group"] == group and "kernels" in c}


def _kernel_seconds(case: dict[str, Any], prefix: str) -> float:
    return sum(k["s"] for k in case["kernels"] if k["kernel"].startswith(prefix))


def host(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """Each way's rate: a copy's bytes over its wait (`copy-done`), alone in its step."""
    cases = _cases(doc, "host")
    out = {}
    for way in ("device_to_host", "host_to_device"):
        chosen = [c for c in cases.values() if c["params"]["direction"] == way and not c["params"].get("beside")]
        rates = [c["params"]["bytes"] / _kernel_seconds(c, "copy-done") for c in chosen]
        names = ", ".join(sorted(c["name"] for c in chosen))
        out[f"host_bytes_per_second.{way}"] = number(
            statistics.median(rates), "B/s", f"micro: {names} (median of {len(rates)} sizes, 1-256 MiB)"
        )
    return out


def _pallas_step(c: dict[str, Any]) -> tuple[int, float, float]:
    """A blocked matmul's grid steps, and each step's FLOPs and bytes copied in and out (the
    output block written once per (i, j))."""
    p = c["params"]
    b, k_steps = p["block"], p["grid"][2]
    steps = p["grid"][0] * p["grid"][1] * k_steps
    return steps, 2.0 * b**3, 2 * b * b * 2 + b * b * 2 / k_steps


def pallas(doc: dict[str, Any], number: Any, hbm_efficiency: float) -> dict[str, Any]:
    """Each grid step's cost beside its work, from the blocked matmul whose steps do least
    (128-wide blocks: their copies dominate); then the matrix unit's efficiency inside a
    kernel from the one whose steps do most (512-wide blocks of a 4096-wide product)."""
    cases = _cases(doc, "pallas")
    small = cases["pallas_mm_4096_b128_est"]
    steps, _, moved = _pallas_step(small)
    step = small["kernels"][0]["s"] / steps - moved / (HBM * hbm_efficiency)
    large = [c for n, c in cases.items() if n.startswith("pallas_mm_4096_b512")]
    efficiencies = []
    for c in large:
        steps, flops, _ = _pallas_step(c)
        efficiencies.append(flops / (PEAK_BF16 * (c["kernels"][0]["s"] / steps - step)))
    return {
        "pallas_step_seconds": number(
            step, "s a grid step besides its copies and work", "micro: pallas_mm_4096_b128_est"
        ),
        "pallas_mxu_efficiency": number(
            statistics.median(efficiencies),
            "of the bf16 peak inside a Pallas kernel's step",
            "micro: pallas_mm_4096_b512, pallas_mm_4096_b512_est",
        ),
    }


def _per_row(c: dict[str, Any], prefix: str) -> float:
    return _kernel_seconds(c, prefix) / c["params"]["rows"]


def gather(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """A row's least cost, from a table of few rows and from one of many (rows up to 512
    bytes: all cost the same), and the rate of wider rows (a line through 2048- and
    16384-byte rows, which crosses the least cost at `gather_row_knee_bytes`)."""
    cases = _cases(doc, "gather")
    take = {n: c for n, c in cases.items() if c["params"].get("form") == "take" and c["params"]["dtype"] == "float32"}
    small = [
        _per_row(c, "gather")
        for c in take.values()
        if c["params"]["table_rows"] <= SMALL_TABLE_ROWS and c["params"]["row_bytes"] <= 512
    ]
    large = [_per_row(c, "gather") for c in take.values() if c["params"]["table_rows"] >= LARGE_TABLE_ROWS]
    (x0, y0), (x1, y1) = (
        (take[n]["params"]["row_bytes"], _per_row(take[n], "gather")) for n in ("gather_row2048b", "gather_row16384b")
    )
    rate = (x1 - x0) / (y1 - y0)
    return {
        "gather_seconds_per_row.small_table": number(
            statistics.median(small),
            "s a row",
            f"micro: {len(small)} gathers of rows up to 512 B from tables up to {SMALL_TABLE_ROWS} rows",
        ),
        "gather_seconds_per_row.large_table": number(
            statistics.median(large),
            "s a row",
            f"micro: {len(large)} gathers from tables of {LARGE_TABLE_ROWS} rows or more",
        ),
        "gather_row_bytes_per_second": number(
            rate, "B/s of a wide row", "micro: gather_row2048b, gather_row16384b (a line)"
        ),
        "gather_row_knee_bytes": number(
            x0 - y0 * rate, "B a row costs nothing beyond its least cost", "micro: the same line"
        ),
    }


def scatter(doc: dict[str, Any], number: Any, hbm_efficiency: float) -> dict[str, Any]:
    """A scatter-add's cost per row in a small table (a line through 512-, 2048- and
    16384-byte rows, its whole table written at HBM's rate besides)."""
    cases = _cases(doc, "scatter")
    hbm = HBM * hbm_efficiency
    points = []
    for name in ("scatter_row512b", "scatter_row2048b", "scatter_row16384b"):
        c = cases[name]
        p = c["params"]
        table = p["table_rows"] * p["row_bytes"]
        points.append((p["row_bytes"], (_kernel_seconds(c, "scatter") - table / hbm) / p["rows"]))
    row, slope = _line(points)
    return {
        "scatter_seconds_per_row": number(
            row, "s a row", "micro: scatter_row512b, scatter_row2048b, scatter_row16384b (a line)"
        ),
        "scatter_row_bytes_per_second": number(1 / slope, "B/s beyond a row's cost", "micro: the same line's slope"),
    }


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares line through `points`: its value at 0 and its slope."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def scatter_emitters(doc: dict[str, Any], first: dict[str, Any], number: Any, hbm_efficiency: float) -> dict[str, Any]:
    """The two emitters libtpu picks for a scatter into a large table (`micro_cases_k.py`'s
    `scatter2`): the staged one (megabytes of scoped VMEM) at the small tables' cost a row,
    slower by `scatter_large_table_factor` from 262,144 rows (the median of its cases
    there, against the first set's row of the same bytes); the other, which adds each row
    in place in HBM, at a cost a row and a rate of its bytes (the line through its f32 rows
    of 256-2048 bytes into 262,144 rows; the table written apart, not by the scatter)."""
    cases = _cases(doc, "scatter2")
    hbm = HBM * hbm_efficiency
    small = {c["params"]["row_bytes"]: _per_row(c, "scatter") for c in _cases(first, "scatter").values()}
    slower = []
    staged = ("scatter2_t256k_n64k", "scatter2_t256k_n128k", "scatter2_t1m_n256k", "scatter2_bag_t400k_d64_n8k")
    for name in staged:
        p = cases[name]["params"]
        table = 0 if p["donated"] else p["table_rows"] * p["row_bytes"]
        row = (_kernel_seconds(cases[name], "scatter") - table / hbm) / p["rows"]
        slower.append(row / small[p["row_bytes"]])
    in_place = ("scatter2_t256k_d64", "scatter2_t256k", "scatter2_t256k_d256", "scatter2_t256k_d512")
    row, slope = _line([(cases[n]["params"]["row_bytes"], _per_row(cases[n], "scatter")) for n in in_place])
    return {
        "scatter_large_table_factor": number(
            statistics.median(slower),
            f"x a row's cost, staged, in a table of {LARGE_TABLE_ROWS} rows or more",
            f"micro: {', '.join(staged)} (median)",
        ),
        "scatter_in_place_row_seconds": number(
            row, "s a row added in place in HBM", f"micro: {', '.join(in_place)} (a line)"
        ),
        "scatter_in_place_row_bytes_per_second": number(
            1 / slope, "B/s beyond that row's cost", "micro: the same line's slope"
        ),
    }


def transposed_tables(doc: dict[str, Any], number: Any, in_place_row: float) -> dict[str, Any]:
    """Gathers and scatters on tables libtpu lays out transposed (`micro_cases_l.py`'s
    `ttable`: a row one lane of `ceil(lanes / 8)` tiles): a scatter adds a row in place at
    `scatter_in_place_row_seconds` and each tile it spans at a cost fitted through the f32
    rows of 1-8 tiles (least squares, the line held at that row's cost); a gather from a
    table in HBM at a tile's cost (the median of the 4-tile cases: every other width was
    laid out plainly or prefetched into VMEM); from a table prefetched into VMEM at a line
    through its rows of 1, 2 and 4 tiles (the f32 8- and 16-lane tables, the bf16 32-lane)."""
    cases = _cases(doc, "ttable")

    def tiles(c: dict[str, Any]) -> int:
        return -(-c["params"]["lanes"] // 8)

    scatters = [cases[f"ttable_scatter_d{d}"] for d in (8, 16, 32, 64)]
    points = [(tiles(c), _per_row(c, "scatter_fusion") - in_place_row) for c in scatters]
    tile = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    in_hbm = ("ttable_gather_d32", "ttable_gather_d32_n4k", "ttable_gather_d32_n256k", "ttable_gather_t4m_d32")
    hbm_tile = statistics.median(_per_row(cases[n], "gather_fusion") / tiles(cases[n]) for n in in_hbm)
    in_vmem = ("ttable_gather_d8", "ttable_gather_d16", "ttable_gather_bf16_d32")
    row, slope = _line([(tiles(cases[n]), _per_row(cases[n], "gather_fusion")) for n in in_vmem])
    return {
        "scatter_transposed_tile_seconds": number(
            tile, "s a tile a row spans, besides its in-place row", f"micro: {', '.join(c['name'] for c in scatters)}"
        ),
        "gather_transposed_tile_seconds.hbm": number(
            hbm_tile, "s a tile a row spans, the table in HBM", f"micro: {', '.join(in_hbm)} (median)"
        ),
        "gather_transposed_row_seconds.vmem": number(
            row, "s a row, the table in VMEM", f"micro: {', '.join(in_vmem)} (a line)"
        ),
        "gather_transposed_tile_seconds.vmem": number(
            slope, "s a tile a row spans, the table in VMEM", "micro: the same line's slope"
        ),
    }


def host_calls(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """The host's time to call a step (`host_calls.py`: steps whose device time is next to
    nothing, by arrays in and out, donated or not, and how the step is called): least
    squares over every case, a call's own cost plus each array in and each array out."""
    rows = doc["rows"]
    a = [[1.0, float(r["inputs"]), float(r["outputs"])] for r in rows]
    y = [r["seconds"] for r in rows]
    # (the normal equations of a 3-term fit, solved by Cramer's rule: no numpy here)
    m = [[sum(p[i] * p[j] for p in a) for j in range(3)] for i in range(3)]
    v = [sum(p[i] * t for p, t in zip(a, y, strict=True)) for i in range(3)]

    def det(x: list[list[float]]) -> float:
        return (x[0][0] * (x[1][1] * x[2][2] - x[1][2] * x[2][1]) - x[0][1] * (x[1][0] * x[2][2] - x[1][2] * x[2][0])
                + x[0][2] * (x[1][0] * x[2][1] - x[1][1] * x[2][0]))  # fmt: skip

    whole = det(m)
    call, each_in, each_out = (det([[v[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]) / whole
                               for k in range(3))  # fmt: skip
    came_from = (
        f"micro: host_calls.py, {len(rows)} steps, {', '.join(sorted({r['kind'] for r in rows}))} (least squares)"
    )
    # each registered pytree node (an equinox module's, an nnx State's): what its steps took
    # beyond their arrays' figures, a line through zero over the nodes
    points = [(r["nodes"], r["seconds"] - call - r["inputs"] * each_in - r["outputs"] * each_out)
              for r in doc["nodes_rows"] if r["nodes"]]  # fmt: skip
    node = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    kinds = ", ".join(sorted({r["kind"] for r in doc["nodes_rows"] if r["nodes"]}))
    return {
        "host_call_seconds": number(call, "s a call", came_from),
        "host_input_seconds": number(each_in, "s an array in", came_from),
        "host_output_seconds": number(each_out, "s an array out", came_from),
        "host_node_seconds": number(
            node, "s a registered pytree node in or out", f"micro: host_calls.py, {kinds} (a line)"
        ),
    }


def cache_writes(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """One position written into a KV cache whose positions lie along the lanes
    (`micro_cases_l.py`'s `cacheput`): each tile the update writes a lane of, at a cost
    fitted through the bf16 caches of 8-128 sequences (least squares through zero: the
    tiles `b * heads * head / 8`)."""
    cases = _cases(doc, "cacheput")
    chosen = [f"cacheput_b{b}" for b in (8, 16, 32, 64, 128)]
    points = [(cases[n]["params"]["tiles_spanned"], _kernel_seconds(cases[n], "dynamic_update_slice")) for n in chosen]
    tile = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
    return {
        "update_lane_tile_seconds": number(
            tile, "s a tile a dynamic-update-slice writes a part of the lanes of", f"micro: {', '.join(chosen)}"
        )
    }


def strides(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """A strided slice's rate by the bytes of its operand it spans: over lanes (the minor
    dimension: `x[:, ::2]`, the odd lanes of rotary embeddings) the median of those cases;
    over sublanes (the second-minor: every other row) the median of the slices that read
    from HBM (`x[::2]`, and the halves of `lax.associative_scan`'s split that read the
    argument, `slice.3`)."""
    cases = _cases(doc, "stride")
    over_lanes = [c for c in cases.values() if c["params"]["op"] in ("minor", "odd")]
    lanes = [c["params"]["bytes"] / _kernel_seconds(c, "slice") for c in over_lanes]
    rows = [c for c in cases.values() if c["params"]["op"] == "major"]
    sublanes = [c["params"]["bytes"] / _kernel_seconds(c, "slice") for c in rows]
    split = [c for c in cases.values() if c["params"]["op"].startswith(("split", "pairsum"))]
    sublanes += [c["params"]["bytes"] / _kernel_seconds(c, "slice.3") for c in split]
    return {
        "strided_bytes_per_second.lanes": number(
            statistics.median(lanes), "B/s of the operand spanned", f"micro: {len(lanes)} slices over lanes (median)"
        ),
        "strided_bytes_per_second.sublanes": number(
            statistics.median(sublanes),
            "B/s of the operand spanned",
            f"micro: {len(sublanes)} slices over sublanes reading HBM (median)",
        ),
    }


def loop_copies(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """The rate of a layout copy in a loop's body with its operand and result in VMEM (a
    `fori_loop` transposing its carry: two copies a trip, `copy.4` and `copy.14`), by the
    bytes each reads and writes: the median of the carries VMEM holds (64 KiB-8 MiB)."""
    cases = _cases(doc, "layout")
    chosen = [c for n, c in sorted(cases.items()) if n.startswith("layout_loop_btc_") and n != "layout_loop_btc_64mib"]
    rates = []
    for c in chosen:
        moved = 2 * c["params"]["bytes"] * c["params"]["trips"] * 2  # (read and written, two copies a trip)
        rates.append(moved / (_kernel_seconds(c, "copy.4") + _kernel_seconds(c, "copy.14")))
    return {
        "loop_vmem_bytes_per_second.copy": number(
            statistics.median(rates),
            "B/s read and written",
            f"micro: {', '.join(c['name'] for c in chosen)} (median)",
        )
    }


def precision(doc: dict[str, Any], number: Any) -> dict[str, Any]:
    """The time of an f32 matrix product at a precision above the default (the matrix
    unit's several bf16 passes), as a multiple of its FLOPs at the bf16 peak: the median of
    the sizes measured."""
    cases = _cases(doc, "mm_f32")
    out = {}
    for said in ("high", "highest"):
        chosen = sorted(n for n in cases if n.startswith(f"mm_f32_prec_{said}_"))
        times = [_kernel_seconds(cases[n], "fusion") * PEAK_BF16 / cases[n]["expected"]["flops"] for n in chosen]
        out[f"f32_passes.{said}"] = number(
            statistics.median(times), "x the time of its FLOPs at the bf16 peak", f"micro: {', '.join(chosen)}"
        )
    return out


def build() -> dict[str, Any]:
    profiles = json.loads((MEASURED / "profiles-a-i.json").read_text())
    numbers: dict[str, Any] = {}
    for name, (value, unit, came_from) in profiles["numbers"].items():
        numbers[name] = _number(value, unit, f"profiles: {came_from}", "profiles-a-i.json", profiles["env"])
    micro_files = sorted(MEASURED.glob("micro-*.json"))
    latest = micro_files[-1]
    micro = json.loads(latest.read_text())

    def number(value: float, unit: str, came_from: str) -> dict[str, Any]:
        return _number(value, unit, came_from, latest.name, micro["env"])

    hbm_efficiency = numbers["hbm_efficiency"]["value"]
    numbers |= host(micro, number)
    numbers |= pallas(micro, number, hbm_efficiency)
    numbers |= gather(micro, number)
    numbers |= scatter(micro, number, hbm_efficiency)
    second = sorted(MEASURED.glob("microk-*.json"))[-1]  # the second set (`micro_cases_k.py`)
    micro_k = json.loads(second.read_text())

    def number_k(value: float, unit: str, came_from: str) -> dict[str, Any]:
        return _number(value, unit, came_from, second.name, micro_k["env"])

    numbers |= precision(micro_k, number_k)
    numbers |= scatter_emitters(micro_k, micro, number_k, hbm_efficiency)
    numbers |= strides(micro_k, number_k)
    numbers |= loop_copies(micro_k, number_k)
    third = sorted(MEASURED.glob("microl-*.json"))[-1]  # the third set (`micro_cases_l.py`)
    micro_l = json.loads(third.read_text())

    def number_l(value: float, unit: str, came_from: str) -> dict[str, Any]:
        return _number(value, unit, came_from, third.name, micro_l["env"])

    numbers |= transposed_tables(micro_l, number_l, numbers["scatter_in_place_row_seconds"]["value"])
    numbers |= cache_writes(micro_l, number_l)
    calls_file = sorted(MEASURED.glob("host-calls-*.json"))[-1]
    calls = json.loads(calls_file.read_text())
    for name in ("host_call_seconds", "host_leaf_seconds", "host_node_seconds"):  # (measured beside compiles)
        numbers.pop(name, None)

    def number_h(value: float, unit: str, came_from: str) -> dict[str, Any]:
        return _number(value, unit, came_from, calls_file.name, calls["env"])

    numbers |= host_calls(calls, number_h)
    return {
        "chip": "v5e",
        "rebuilt_by": "benchmarks/steptime/calibrate.py",
        "summaries": ["profiles-a-i.json", latest.name, second.name, third.name, calls_file.name],
        "numbers": dict(sorted(numbers.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed table is not the rebuilt one")
    args = parser.parse_args()
    text = json.dumps(build(), indent=1) + "\n"
    if args.check:
        if TABLE.read_text() != text:
            sys.exit(f"{TABLE} is not what the summaries give: run benchmarks/steptime/calibrate.py")
        print(f"{TABLE}: as the summaries give")
        return
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(text)
    for name, n in build()["numbers"].items():
        print(f"{name:45s} {n['value']:<12g} {n['unit']}  <- {n['from']}")


if __name__ == "__main__":
    main()
