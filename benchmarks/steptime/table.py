"""The guide's step-time tables ("How fast will it run?"), from what `chip.py` measured.

Each directory holds `chip.py`'s output for some rows: `rows.json` (each step's median and
its profile, each kernel's device time) and the optimized module libtpu dumped
(`modules.tar.gz`), the one a deviceless `ts.cost(target="v5e")` reads. For each row this
prints the measured step, `seconds`, `compiler_seconds`, `floor_seconds` (from the module,
with treeshape's time model as it stands) and how many of the profile's ten longest entries
(kernels by op and source line, as `StepTime.kernels` has them) are among the ten longest
by `seconds`, and the same for each compiled kernel on its own; then the time per kind of
kernel, summed over the rows of the groups the correction was fitted on.

    python benchmarks/steptime/table.py DIR [DIR ...]
"""

import collections
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import kinds  # noqa: E402
import models  # noqa: E402
from chip import case_of  # noqa: E402

# What the guide's figures come from: treeshape's reading of a dumped module and its time
# model (no public API reads a module that was compiled elsewhere).
from treeshape._cost import _chips, _host, _kernels, _time  # noqa: E402
from treeshape._cost._deviceless import _HLO_PROTO_MODULE  # noqa: E402
from treeshape._cost._hlo import F, Frames, Module, fields, str_field  # noqa: E402
from treeshape._cost._hlo_text import op_of  # noqa: E402
from treeshape._cost._ops import AS_WRITTEN  # noqa: E402


CHIP = _chips.CHIPS["v5e"]
GROUPS = {
    "A": models.TUNING,
    "B": models.HELD_OUT,
    "C": models.FRESH,
    "D": models.UNSEEN,
    "E": models.LAST,
    "F": models.AFTER_E,
    "G": models.AFTER_F,
    "H": models.AFTER_G,
    "I": models.AFTER_H,
    "J": models.AFTER_I,
    "K": kinds.AFTER_J,
}
FITTED_ON = ("A", "B", "C", "D", "E", "F", "G", "H", "I")  # (A-D fitted first; E-I checked, then refitted on)


def group_of(name: str, size: int) -> str:
    return next((g for g, rows in GROUPS.items() if size in rows.get(name, ((), ()))[1]), "?")


def profile_kernels(module: Any, events: dict[str, Any], runs: int) -> dict[str, float]:
    """Each kernel's device seconds in one step, by its name in the module: a loop's or a
    call's own event (which spans its body) dropped, an asynchronous copy's wait counted
    under the name of its start."""
    ops = {i.name: op_of(i) for c in module.computations.values() for i in c.instructions}
    out: dict[str, float] = collections.defaultdict(float)
    for text, event in events.items():
        name = re.match(r"%(\S+) = ", text).group(1)
        opcode, operands, _ = ops.get(name, ("?", [], ""))
        if opcode in ("while", "call", "conditional"):
            continue
        if opcode.endswith("-done") and operands:
            name = operands[0]
        out[name] += event["ns"] / runs / 1e9
    return out


def modules_of(directory: Path) -> Path:
    """The folder of a directory's dumped modules (`modules/`, else `modules.tar.gz` unpacked)."""
    modules = directory / "modules"
    if not modules.is_dir():
        modules = Path(tempfile.mkdtemp()) / "modules"
        with tarfile.open(directory / "modules.tar.gz") as tar:
            tar.extractall(modules.parent, filter="data")
    return modules


def load(directory: Path) -> list[dict[str, Any]]:
    modules = modules_of(directory)
    return [read(r, modules) for r in json.loads((directory / "rows.json").read_text())["rows"] if "error" not in r]


def read(r: dict[str, Any], modules: Path) -> dict[str, Any]:
    """A row of `rows.json` with its module read and its time estimated (`time`, `alone`)."""
    key = f"{r['name']}-{r['size']}".replace("/", "_")
    text = (modules / f"{key}.after_codegen.txt").read_text()
    kernels, exact = _kernels.read(text, tile=CHIP.matrix_tile, lanes=CHIP.lanes)
    module = _kernels.parse(text)
    events = r["profile"]["/device:TPU:0"]["XLA Ops"] if "profile" in r else {}  # (`--no-profile`)
    measured = profile_kernels(module, events, r.get("profile_runs", 3))
    dumped = fields((modules / f"{key}.after_codegen.hlo.pb").read_bytes())[_HLO_PROTO_MODULE][-1]
    proto = Module.read(bytes(dumped))
    frames = Frames(proto)
    names = {
        i.name: (AS_WRITTEN.op(str_field(i.metadata, F.METADATA_OP_NAME)), frames.source(i.metadata))
        for i in proto.instructions.values()
    }
    # (recorded by `recheck.py --dump`; else counted from the step)
    # (a record of 2 counts, arrays in and out together, is from before they were apart)
    call = tuple(r["call"]) if len(r.get("call", ())) == 3 else call_counts(r["name"], r["size"])
    t = _time.estimate(kernels, names, CHIP, "TPU v5e", r["cost_analysis"]["flops"], exact, call)
    # each compiled kernel on its own (named apart, so that none go together by line)
    alone = _time.estimate(kernels, {k.name: (k.name, None) for k in kernels}, CHIP, "", None, exact)
    group = group_of(r["name"], r["size"])
    return {**r, "group": group, "kernels": kernels, "profile": measured, "time": t, "alone": alone, "names": names}


def call_counts(name: str, size: int) -> tuple[int, int, int]:
    """The arrays a call of the row's step passes in, the arrays it gets back, and their
    registered pytree nodes, as `ts.cost` counts them (`_host.tree_counts`)."""
    case = case_of(name, size)
    state, batch = case.abstract()
    out = jax.eval_shape(case.step, state, batch)
    inputs = jax.tree_util.tree_structure(((state, batch), {}))
    return _host.tree_counts(inputs, [jax.tree_util.tree_structure(out)])


def _key(op: str | None, source: str | None, kind: str) -> tuple[str | None, str | None, str | None]:
    """A kernel's entry in `StepTime.kernels`: its op and source line (XLA's own: by kind)."""
    return (op, source, None) if op is not None else (None, source, kind)


def top_ten(row: dict[str, Any]) -> int:
    """How many of the profile's ten longest entries are among the ten longest of
    `StepTime.kernels`: each kernel's time in the profile summed by op and source line (XLA's
    own kernels by kind) as `kernels` sums them."""
    predicted = [_key(k.op, k.source, k.kind) for k in row["time"].kernels if k.kind != "launch"][:10]
    kinds = {k.name: k.kind for k in row["kernels"]}
    measured: dict[Any, float] = collections.defaultdict(float)
    for name, seconds in row["profile"].items():
        op, source = row["names"].get(name, (None, None))
        measured[_key(op, source, kinds.get(name, "?"))] += seconds
    return len(set(predicted) & set(sorted(measured, key=lambda n: -measured[n])[:10]))


def top_ten_compiled(row: dict[str, Any]) -> int:
    """The same, each compiled kernel on its own (an unrolled model's layers apart)."""
    predicted = [k.name for k in row["alone"].kernels if k.kind != "launch"][:10]
    measured = row["profile"]
    return len(set(predicted) & set(sorted(measured, key=lambda n: -measured[n])[:10]))


def step_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| group | step | kind | size | measured (ms) | one step alone (ms) | `seconds` (ms) "
        "| `compiler_seconds` (ms) | `floor_seconds` (ms) | `seconds` / measured | compiler / measured "
        "| top 10 | top 10 compiled kernels |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: r["group"]):
        t, m = r["time"], r["median_back_to_back"]
        print(
            f"| {r['group']} | {r['name']} | {r['kind']} | {r['size']} | {m * 1e3:.2f} | {r['median'] * 1e3:.2f} "
            f"| {t.seconds * 1e3:.2f} | {t.compiler_seconds * 1e3:.2f} | {t.floor_seconds * 1e3:.2f} "
            f"| {t.seconds / m:.2f} | {t.compiler_seconds / m:.2f} | {top_ten(r)} | {top_ten_compiled(r)} |"
        )
    for groups in (FITTED_ON, ("J",), ("K",)):
        chosen = [r for r in rows if r["group"] in groups]
        if not chosen:
            continue
        ratios = [r["time"].seconds / r["median_back_to_back"] for r in chosen]
        tops = [top_ten(r) for r in chosen]
        compiled = [top_ten_compiled(r) for r in chosen]
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(
            f"\ngroups {'+'.join(groups)}: {len(chosen)} steps, `seconds` / measured {spread}, "
            f"{sum(0.8 <= x <= 1.2 for x in ratios)} within 20%; top 10 >= 8 on {sum(s >= 8 for s in tops)} "
            f"(each compiled kernel on its own: on {sum(n >= 8 for n in compiled)})"
        )


def kind_table(rows: list[dict[str, Any]]) -> None:
    total: dict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r in rows:
        if r["group"] not in FITTED_ON:
            continue
        seconds = {k.name: k.seconds for k in r["alone"].kernels}
        for k in r["kernels"]:
            if k.kind in ("async copy", "collective", "custom call") or (k.cycles is None and not k.indices):
                continue
            where = "VMEM" if k.device_bytes < 0.05 * max(k.bytes_accessed, 1.0) else "HBM"
            t = total[(k.kind, where, "loop body" if k.in_loop else "top")]
            t[0] += 1
            t[1] += r["profile"].get(k.name, 0.0)
            t[2] += k.runs * (k.cycles or 0.0) / CHIP.clock_hz  # (none for a gather or scatter)
            t[3] += seconds.get(k.name, 0.0)
    print(
        "\n| kind | operands in | runs at | kernels | measured (ms) | libtpu's estimate (ms) | `seconds` (ms) "
        "| estimate / measured | `seconds` / measured |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for (kind, where, at), (n, measured, estimate, seconds) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        if measured < 1e-4:
            continue
        raw = (f"{estimate * 1e3:.1f}", f"{estimate / measured:.2f}") if estimate else ("none", "-")
        print(
            f"| {kind} | {where} | {at} | {n} | {measured * 1e3:.1f} | {raw[0]} | {seconds * 1e3:.1f} "
            f"| {raw[1]} | {seconds / measured:.2f} |"
        )


def main() -> None:
    rows = [row for directory in sys.argv[1:] for row in load(Path(directory))]
    step_table(rows)
    kind_table(rows)


if __name__ == "__main__":
    main()
