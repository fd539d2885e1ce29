"""Re-check the guide's step-time table against the time model as it stands, without a chip.

The guide's table ("How fast will it run?", section "The table": 105 steps, groups A-J)
holds each step's median as measured on one TPU v5e chip (`chip.py`) and the `seconds` the
model gave then. The chip's own output is not kept here; its measured figures are, in
`measured/steps-a-j.json` (written from the guide's table by `--from-guide`). libtpu's
deviceless compile here (the same jax and libtpu as the chip) writes the same optimized
module as the chip's compile, so each row's module is dumped once (`--dump`, slow: a
compile a row) and then read as often as the model changes (the default, no compile):
each row's `seconds` by `table.py`'s reading of the module, with the model of the
`treeshape` this process imports.

    python benchmarks/steptime/recheck.py --from-guide            # measured/steps-a-j.json
    python benchmarks/steptime/recheck.py --dump DIR [--rows G|NAME:SIZE,...]
    python benchmarks/steptime/recheck.py DIR [--json OUT]

`--dump` compiles each row as `ts.cost(jax.jit(step, donate_argnums=0), state, batch,
target="v5e")` does (it is that call, with libtpu's dump kept): DIR/modules/NAME-SIZE
.after_codegen.{txt,hlo.pb} as `chip.py` names them, and DIR/rows.json (each row's
FLOPs by XLA's cost analysis, the arrays and pytree nodes of a call, and `ts.cost`'s own
`seconds`, as `table.py` reads `chip.py`'s). Rows already in DIR are skipped, so a dump
that stops can be run again. The default prints, for each row, the measured step,
`seconds` now, their ratio (`!` outside 0.8-1.2) and the guide's `seconds`.
"""

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any


os.environ.setdefault("JAX_PLATFORMS", "cpu")  # (libtpu compiles deviceless; no accelerator is needed)
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import jax  # noqa: E402
import table  # noqa: E402
from chip import case_of  # noqa: E402


MEASURED = HERE / "measured" / "steps-a-j.json"
GUIDE = HERE.parents[1] / "docs" / "guide" / "time.md"
ROWS = 105
# The guide's columns, by the header it prints (`table.step_table`), and their keys here.
COLUMNS = {
    "group": "group",
    "step": "step",
    "kind": "kind",
    "size": "size",
    "measured (ms)": "measured_ms",
    "one step alone (ms)": "one_step_alone_ms",
    "`seconds` (ms)": "seconds_ms",
    "`compiler_seconds` (ms)": "compiler_seconds_ms",
    "`floor_seconds` (ms)": "floor_seconds_ms",
}


def log(*args: Any) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


# -- the measured figures, from the guide --------------------------------------------
def parse_guide(text: str) -> list[dict[str, Any]]:
    """The rows of the guide's section "The table", by `COLUMNS` (figures as numbers)."""
    section = text.split("\n## The table\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        row: dict[str, Any] = {}
        for column, key in COLUMNS.items():
            value = cells[column]
            row[key] = int(value) if key == "size" else float(value) if key.endswith("_ms") else value
        rows.append(row)
    return rows


def from_guide(guide: Path = GUIDE, out: Path = MEASURED) -> None:
    rows = parse_guide(guide.read_text())
    if len(rows) != ROWS or {r["group"] for r in rows} != set(table.GROUPS):
        raise SystemExit(f"{guide}: {len(rows)} rows in groups {sorted({r['group'] for r in rows})}; expected {ROWS}")
    for r in rows:
        if table.group_of(r["step"], r["size"]) != r["group"]:
            raise SystemExit(f"{r['step']}:{r['size']} is in group {r['group']} of the guide, not of models.py")
    data = {
        "source": "docs/guide/time.md, section 'The table' (written by benchmarks/steptime/recheck.py --from-guide)",
        "chip": "TPU v5e (one chip)",
        "jax": "0.10.2",
        "libtpu": "0.0.42.1",
        "measured_by": "benchmarks/steptime/chip.py",
        "models": "benchmarks/steptime/models.py",
        "columns": {
            "measured_ms": "median of groups of five steps dispatched back to back, one wait (chip.py's "
            "median_back_to_back), per step",
            "one_step_alone_ms": "median of single steps, each waited for (chip.py's median)",
            "seconds_ms": "StepTime.seconds as the guide recorded it (table.py, the model of that commit)",
            "compiler_seconds_ms": "StepTime.compiler_seconds as the guide recorded it",
            "floor_seconds_ms": "StepTime.floor_seconds as the guide recorded it",
        },
        "rows": rows,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in data.items() if k != "rows"}, indent=1)[:-2]
    out.write_text(head + ',\n "rows": [\n' + ",\n".join(f"  {json.dumps(r)}" for r in rows) + "\n ]\n}\n")
    print(f"{out}: {len(rows)} rows")


def measured_rows(path: Path = MEASURED) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["rows"]


# -- the dump ------------------------------------------------------------------------
def _key(name: str, size: int) -> str:
    return f"{name}-{size}".replace("/", "_")


@contextlib.contextmanager
def _kept_dump(directory: Path) -> Any:
    """`ts.cost`'s first compile for its target dumps into `directory` (kept) rather than a
    temporary folder; yields the list its compiled programs are appended to."""
    from treeshape._cost import _deviceless

    original, captured = _deviceless.compile_for, []

    def compile_for(lowered: Any, placed: Any) -> Any:
        first = not captured
        kept = types.SimpleNamespace(TemporaryDirectory=lambda prefix="": contextlib.nullcontext(str(directory)))
        saved = _deviceless.tempfile
        if first:
            _deviceless.tempfile = kept
        try:
            compiled = original(lowered, placed)
        finally:
            _deviceless.tempfile = saved
        captured.append(compiled)
        return compiled

    _deviceless.compile_for = compile_for
    try:
        yield captured
    finally:
        _deviceless.compile_for = original


def dump_row(name: str, size: int, modules: Path) -> dict[str, Any]:
    """Compile one row as `ts.cost(..., target="v5e")` does, its module kept in `modules`."""
    import treeshape as ts

    case = case_of(name, size)
    state, batch = case.abstract()
    work = Path(tempfile.mkdtemp(prefix="recheck-"))
    start = time.perf_counter()
    try:
        with _kept_dump(work) as captured:
            cost = ts.cost(jax.jit(case.step, donate_argnums=0), state, batch, target="v5e")
        seconds = time.perf_counter() - start
        key = _key(name, size)
        for suffix in (".after_codegen.txt", ".after_codegen.hlo.pb"):
            found = sorted(work.glob(f"*{suffix}"))  # (the last, as `ts.cost` reads it)
            shutil.copy(found[-1], modules / f"{key}{suffix}")
        analysis = captured[0].cost_analysis()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "name": name,
        "size": size,
        "kind": case.kind,
        "cost_analysis": {"flops": float(analysis["flops"])},
        "call": list(table.call_counts(name, size)),
        "ts_cost_seconds": None if cost.time is None else cost.time.seconds,
        "compile_seconds": seconds,  # (with ts.cost's reading of it)
    }


def dump(directory: Path, only: set[str] | None) -> None:
    modules = directory / "modules"
    modules.mkdir(parents=True, exist_ok=True)
    path = directory / "rows.json"
    env = {"jax": jax.__version__, "python": platform.python_version(), "target": "v5e (deviceless)"}
    with contextlib.suppress(Exception):
        import libtpu  # type: ignore[import-not-found]

        env["libtpu"] = getattr(libtpu, "__version__", "?")
    done = json.loads(path.read_text())["rows"] if path.exists() else []
    have = {(r["name"], r["size"]) for r in done if "error" not in r}
    done = [r for r in done if (r["name"], r["size"]) in have]
    todo = [r for r in measured_rows() if (r["step"], r["size"]) not in have]
    if only:
        todo = [r for r in todo if r["group"] in only or f"{r['step']}:{r['size']}" in only]
    log("env", env, f"{len(have)} rows dumped before, {len(todo)} to go")
    for i, r in enumerate(todo):
        try:
            record = dump_row(r["step"], r["size"], modules)
            log(f"{i + 1}/{len(todo)}", r["group"], r["step"], r["size"], f"compile {record['compile_seconds']:.0f} s")
        except Exception as e:
            record = {"name": r["step"], "size": r["size"], "error": f"{type(e).__name__}: {e}"[:3000]}
            log(f"{i + 1}/{len(todo)}", r["group"], r["step"], r["size"], "FAILED", record["error"][:300])
        done.append(record)
        path.with_suffix(".part").write_text(json.dumps({"env": env, "rows": done}, indent=1) + "\n")
        path.with_suffix(".part").replace(path)  # (whole, should the dump stop here)
        jax.clear_caches()
    log("done")


# -- the re-check --------------------------------------------------------------------
def recheck(directory: Path) -> list[dict[str, Any]]:
    """Each measured row with `seconds` from its dumped module and the model as it stands."""
    dumped = {(r["name"], r["size"]): r for r in json.loads((directory / "rows.json").read_text())["rows"]}
    modules = table.modules_of(directory)
    out = []
    for m in measured_rows():
        d = dumped.get((m["step"], m["size"]))
        row = {k: m[k] for k in ("group", "step", "kind", "size", "measured_ms", "seconds_ms")}
        row["guide_seconds_ms"] = row.pop("seconds_ms")
        if d is None or "error" in d:
            out.append({**row, "missing": "not dumped" if d is None else d["error"][:200]})
            continue
        t = table.read(d, modules)["time"]
        seconds = t.seconds * 1e3
        out.append(
            {
                **row,
                "seconds_ms": seconds,
                "ratio": seconds / m["measured_ms"],
                "compiler_seconds_ms": t.compiler_seconds * 1e3,
                "floor_seconds_ms": t.floor_seconds * 1e3,
                "ts_cost_seconds_ms": None if d.get("ts_cost_seconds") is None else d["ts_cost_seconds"] * 1e3,
            }
        )
    return out


def _name(r: dict[str, Any]) -> str:
    return f"{r['group']} {r['step']}:{r['size']}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if "ratio" in r]
    if not done:
        return {"rows": len(rows), "rechecked": 0}
    worst = max(done, key=lambda r: abs(r["ratio"] - 1))
    return {
        "rows": len(rows),
        "rechecked": len(done),
        "within_20_percent": sum(0.8 <= r["ratio"] <= 1.2 for r in done),
        "outside": [_name(r) + f" {r['ratio']:.2f}" for r in done if not 0.8 <= r["ratio"] <= 1.2],
        "median_abs_ratio_minus_1": statistics.median(abs(r["ratio"] - 1) for r in done),
        "worst": _name(worst) + f" {worst['ratio']:.3f}",
        "ratio_range": [min(r["ratio"] for r in done), max(r["ratio"] for r in done)],
        # the guide's figure, to its rounding (0.01 ms)
        "same_as_guide": sum(f"{r['seconds_ms']:.2f}" == f"{r['guide_seconds_ms']:.2f}" for r in done),
    }


def show(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    print("| group | step | size | measured (ms) | `seconds` (ms) | `seconds` / measured | | guide's `seconds` (ms) |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        if "ratio" not in r:
            print(f"| {r['group']} | {r['step']} | {r['size']} | {r['measured_ms']:.2f} | - | - | {r['missing']} |")
            continue
        flag = "" if 0.8 <= r["ratio"] <= 1.2 else "!"
        print(
            f"| {r['group']} | {r['step']} | {r['size']} | {r['measured_ms']:.2f} | {r['seconds_ms']:.2f} "
            f"| {r['ratio']:.2f} | {flag} | {r['guide_seconds_ms']:.2f} |"
        )
    if not s["rechecked"]:
        print(f"\nnone of the {s['rows']} rows dumped")
        return
    low, high = s["ratio_range"]
    print(
        f"\n{s['rechecked']} of {s['rows']} rows: {s['within_20_percent']} within 20% ({low:.2f}-{high:.2f}x), "
        f"median |ratio - 1| {s['median_abs_ratio_minus_1']:.3f}, worst {s['worst']}; "
        f"{s['same_as_guide']} with the guide's `seconds` (to 0.01 ms)"
    )
    for line in s["outside"]:
        print("outside 0.8-1.2:", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", type=Path, help="a dump of --dump: re-check its rows")
    parser.add_argument("--dump", type=Path, metavar="DIR", help="compile every row for v5e, its module kept in DIR")
    parser.add_argument("--rows", help="with --dump: groups (A-J) or NAME:SIZE, comma separated")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the rows and the summary as JSON")
    parser.add_argument("--from-guide", action="store_true", help="write measured/steps-a-j.json from the guide")
    args = parser.parse_args()
    if args.from_guide:
        from_guide()
    elif args.dump is not None:
        dump(args.dump, set(args.rows.split(",")) if args.rows else None)
    elif args.directory is not None:
        rows = recheck(args.directory)
        s = summary(rows)
        show(rows, s)
        if args.json is not None:
            args.json.write_text(json.dumps({"summary": s, "rows": rows}, indent=1) + "\n")
    else:
        parser.error("give DIR, --dump DIR or --from-guide")


if __name__ == "__main__":
    main()
