"""`Cost.buffers`, `Cost.donation`, `Cost.breakdown`: what is at a program's peak.

The oracle is XLA's own account of the same compiled program: the programs of
`buffer_programs.py` are costed in a child process whose XLA_FLAGS make XLA dump, for
each, its buffer assignment (allocations, each value's offset and size), the live range
of every value on the flattened schedule, and the optimized HLO (each instruction's
metadata). From those files alone the live set at the peak step is computed (per
allocation, the union of the bytes of the values live at a step; shared bytes once, the
value defined last listed) and compared with what `ts.cost` read from the compiled
program.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest


HERE = pathlib.Path(__file__).parent


# -- XLA's dump ----------------------------------------------------------------------------
@dataclasses.dataclass
class DumpedValue:
    id: int
    name: str  # instruction{index}, as the live-range file names it
    allocation: int
    offset: int
    size: int
    shape: tuple[int, ...]
    start: int = -1
    end: int = -1


_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(r"^ value: <(\d+) ([^\s{]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_RANGE = re.compile(r"^    (\S+\{[\d,]*\}):(\d+)-(\d+)$")
_MAX = re.compile(r"^HloLiveRange \(max (\d+)\):")


def _dims(shape_text: str) -> tuple[int, ...]:
    match = re.match(r"^[a-z0-9]+\[([\d,]*)\]", shape_text)
    if match is None:
        return ()
    return tuple(int(d) for d in match.group(1).split(",") if d)


def read_dump(directory: pathlib.Path, name: str) -> tuple[dict[str, DumpedValue], int, dict[int, str], str]:
    """The values of program `name` (by instruction{index}) with their live ranges, the
    schedule's end, each allocation's description, and the optimized HLO text."""
    stem = sorted(directory.glob(f"module_*.jit_{name}.cpu_after_optimizations-buffer-assignment.txt"))[-1]
    prefix = str(stem)[: -len("-buffer-assignment.txt")]
    values: dict[str, DumpedValue] = {}
    allocations: dict[int, str] = {}
    allocation = -1
    for line in stem.read_text().splitlines():
        if m := _ALLOCATION.match(line):
            allocation = int(m.group(1))
            allocations[allocation] = m.group(3)
        elif m := _VALUE.match(line):
            key = m.group(2) + (m.group(3) or "{}")
            shape = _dims(m.group(6))
            values[key] = DumpedValue(int(m.group(1)), key, allocation, int(m.group(5)), int(m.group(4)), shape)
        elif line.startswith("Total bytes used"):
            break
    end_time = -1
    for line in pathlib.Path(prefix + "-live-range.txt").read_text().splitlines():
        if m := _MAX.match(line):
            end_time = int(m.group(1))
        elif (m := _RANGE.match(line)) and m.group(1) in values:
            values[m.group(1)].start, values[m.group(1)].end = int(m.group(2)), int(m.group(3))
        elif line.startswith("  Live ranges at"):
            break
    return values, end_time, allocations, pathlib.Path(prefix + ".txt").read_text()


def contract_peak(values: dict[str, DumpedValue], end_time: int, allocations: dict[int, str]):
    """The live set as the contract defines it, from XLA's live ranges and allocations alone."""
    ranged = [v for v in values.values() if v.start >= 0 and "thread-local" not in allocations[v.allocation]]
    best, best_listed = -1, []
    for t in range(end_time + 1):
        live = sorted((v for v in ranged if v.start <= t <= v.end), key=lambda v: (-v.start, -v.id))
        covered: dict[int, np.ndarray] = {}
        total, listed = 0, []
        for v in live:
            size = max((w.offset + w.size for w in ranged if w.allocation == v.allocation), default=0)
            mask = covered.setdefault(v.allocation, np.zeros(size, bool))
            new = int((~mask[v.offset : v.offset + v.size]).sum())
            mask[v.offset : v.offset + v.size] = True
            if new:
                total += new
                listed.append((v, new))
        if total > best:
            best, best_listed = total, listed
    return best, best_listed


def op_names(hlo_text: str) -> dict[str, str]:
    """Each instruction of the optimized HLO by name: its metadata's op_name."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%(\S+) = .*?metadata=\{op_name=\"([^\"]*)\"", hlo_text, re.M):
        out[m.group(1)] = m.group(2)
    return out


# -- the child process ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    """What `ts.cost` reports for each program of `buffer_programs.py`, and XLA's dump directory."""
    dump = tmp_path_factory.mktemp("xla_dump")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "buffer_programs.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,  # subprocess.run kills the child when this runs out
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child process costing the programs ran out of time: {e}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), dump


def _shape_of(b):
    return tuple(b["shape"])


PROGRAMS = [
    "optax_step",
    "nnx_grads",
    "eqx_grads",
    "plain_grads",
    "remat_grads",
    "scan_grads",
    "sharded_step",
    "cast_step",
]


@pytest.mark.parametrize("name", PROGRAMS)
def test_live_set_is_xla_s(costed, name):
    """Bytes at the peak, and the buffers listed (size and shape), as XLA's live ranges and
    buffer assignment give them."""
    reports, dump = costed
    ours = reports[name]
    values, end_time, allocations, _ = read_dump(dump, name)
    peak, listed = contract_peak(values, end_time, allocations)
    assert ours["live_peak_bytes"] == peak
    assert sum(b["nbytes"] for b in ours["buffers"]) == peak
    assert ours["live_peak_bytes"] <= ours["peak_bytes"]
    assert sorted((b["nbytes"], _shape_of(b)) for b in ours["buffers"]) == sorted((n, v.shape) for v, n in listed)
    sizes = [b["nbytes"] for b in ours["buffers"]]
    assert sizes == sorted(sizes, reverse=True)
