"""`StepTime` and `KernelTime`: how long one run of a compiled program takes on the
target, before it runs (`Cost.time`), from its kernels as `_kernels` reads them and the
chip's figures (`_chips`).

Three figures:

- `compiler_seconds`: the compiler's own estimate as it writes it (libtpu's
  `estimated_cycles` of every kernel, each loop body counted by its trip count), at the
  chip's clock. TPU targets only.
- `floor_seconds`: the roofline floor, on every target: each kernel's FLOPs at the chip's
  peak for its dtype or its device-memory bytes at the chip's HBM bandwidth, the larger;
  no kernel runs faster.
- `seconds`: the estimate, where one was checked on the chip (TPU targets): a matrix
  product (matmul, batched matmul, convolution) at the compiler's estimate as measured
  for its kind, unless its roofline is lower (its FLOPs at the efficiency measured for
  its kind times its fill of the matrix unit's tiles, `Kernel.fill`; a matmul then
  between the two, mostly the roofline); a matmul or convolution fused with other
  results (a multi-output fusion) at the compiler's estimate as measured for those; a
  batched matmul whose operands stay in VMEM at its FLOPs at the peak and a cost per
  product; a convolution's weight gradient at the compiler's estimate (its roofline is
  too fast); a vector kernel (elementwise, reduction, data movement, copy) at its bytes,
  at the HBM and VMEM rates measured for its kind (a reduction's at its share of a
  vector register's lanes; a loop body's copies, reductions and small elementwise
  kernels in VMEM at their faster rates there; a layout copy between HBM and VMEM at
  HBM's pace; a strided slice no faster than the rate measured for its stride; libtpu's
  estimates of those are up to 20x the chip's time), a kernel on less than a vector
  register (the scalar unit's) at its floor; a gather or scatter (no estimate) per slice,
  at the rates the chip measured (a scatter's by the emitter libtpu picks);
  each run's latency where it reads or writes HBM (less in a loop's body, none where a
  loop's body reads only its counter there), next to nothing in VMEM; never below its
  floor; an asynchronous copy at the part of its HBM time the kernels
  around it did not hide on the chip; a collective at its whole array's bytes over the
  interconnect's links (a ring) plus their latency, once for all the kernels that carry
  it (products that libtpu fuses a part of an all-gather into run at its pace where it
  outlasts their work); the chip's idle time between two kernels at the top of the
  program; and the runtime's gap between two steps; a step whose kernels take less than
  its host takes to call it (its arrays and registered pytree nodes, in and out) at the
  host's pace. On every target a conditional counts its most costly branch.

The correction (`CORRECTION`) is read from the chip's calibration table
(`calibration/v5e.json`, every number with where it came from, rebuilt by
`benchmarks/steptime/calibrate.py`): measured on a v5e against each kernel's time in a
profile of 94 train steps (and the host's calls of 15 tiny ones) and, for the kinds those
steps barely had (gathers and scatters, Pallas kernels, copies to and from the host, f32
products above the default precision, strided slices, layout copies in a loop), on
microbenchmarks that vary one thing at a time; checked on steps it was never fitted on
(the guide's "How fast will it run?", `benchmarks/steptime/`). v5p and v6e use it as
measured there, `source` says so, and `StepTime.checked` is 0 on them.
"""

import dataclasses
import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

from .._table import grid, html_grid
from ._chips import Chip
from ._kernels import Collective, Kernel
from ._ops import NO_OP, phase_name


@dataclasses.dataclass(frozen=True)
class Correction:
    """What a real v5e measured of libtpu's kernels, against each kernel's time in a profile
    of 94 train steps (`benchmarks/steptime/`): per kind of matrix product, the fraction
    of the compiler's estimate it took (`estimate`; a convolution's weight gradient
    `weight_gradient_estimate`; a matmul or convolution fused with other results
    `multi_output_estimate`) and of the chip's peak it reached with the matrix unit's
    tiles full (`efficiency`, times the product's fill of them), and where that roofline
    is below the estimate, the estimate's weight in their geometric mean
    (`estimate_weight`: a matmul with vector work fused in took between the two); what
    each product of a batched matmul whose operands stay in VMEM costs besides its FLOPs
    at the peak (`vmem_product_seconds`: small products, as attention's over 64 tokens,
    run 3x faster there than the fill of their tiles says); the bytes per cycle each kind
    of vector kernel moves in VMEM (libtpu's estimates of those are up to 20x the chip's
    time, so their bytes decide), in a loop's body where it differs
    (`loop_vmem_bytes_per_cycle`: copies 7x faster, reductions 1.5x) and for an
    elementwise kernel or reduction there that moves under 1 MiB a run
    (`small_loop_vmem_bytes_per_cycle`: a recurrent cell's step, 2.5-3.5x faster); HBM's
    fraction of its bandwidth; what a gather takes per slice (a single element; a row at
    least, from a small table and a large one, and a wide row by its bytes) and what a
    scatter takes per row (and its elements' rate, and how much slower in a large table
    where libtpu stages its rows; where it adds each row in place in HBM, its cost a row and
    its bytes' rate); the rate of a slice that strides over lanes or over sublanes;
    the host link's rate each way; a Pallas kernel's cost per grid step and its matrix
    unit's efficiency; the cycles a run costs besides, reading or
    writing HBM (at the top of the program and in a loop's body, where one that reads only
    the loop's counter there pays none) or not; the cycles the chip idles between two
    kernels at the top of the program; the fraction of an asynchronous copy's HBM time that the kernels around
    it do not hide; the runtime's gap between two steps run back to back, in seconds; and
    what the chip's host takes to call a step, which bounds a step whose kernels take less:
    a call, each array passed in or returned, and each node of a pytree type registered
    outside JAX's own containers (an nnx `State`'s, an equinox `Module`'s), in or out.
    Built from the chip's calibration table (`calibration`), each number's provenance there."""

    estimate: Mapping[str, float]
    weight_gradient_estimate: float
    multi_output_estimate: Mapping[str, float]
    estimate_weight: Mapping[str, float]
    efficiency: Mapping[str, float]
    vmem_product_seconds: float
    vmem_bytes_per_cycle: Mapping[str, float]
    loop_vmem_bytes_per_cycle: Mapping[str, float]
    small_loop_vmem_bytes_per_cycle: float
    hbm_efficiency: float
    gather_seconds_per_element: float
    gather_seconds_per_row: Mapping[str, float]
    gather_row_bytes_per_second: float
    gather_row_knee_bytes: float
    scatter_seconds_per_row: float
    scatter_row_bytes_per_second: float
    scatter_large_table_factor: float
    scatter_in_place_row_seconds: float
    scatter_in_place_row_bytes_per_second: float
    scatter_transposed_tile_seconds: float
    update_lane_tile_seconds: float
    gather_transposed_row_seconds: Mapping[str, float]
    gather_transposed_tile_seconds: Mapping[str, float]
    strided_bytes_per_second: Mapping[str, float]
    host_bytes_per_second: Mapping[str, float]
    pallas_step_seconds: float
    pallas_mxu_efficiency: float
    f32_passes: Mapping[str, float]
    hbm_cycles_per_run: float
    hbm_cycles_per_loop_run: float
    vmem_cycles_per_run: float
    gap_cycles: float
    exposed_copy: float
    launch_seconds: float
    host_call_seconds: float
    host_input_seconds: float
    host_output_seconds: float
    host_node_seconds: float
    measured_on: str


CALIBRATION: Final = Path(__file__).with_name("calibration")


def calibration(chip: str = "v5e") -> dict[str, Any]:
    """The chip's calibration table (`calibration/<chip>.json`): every number the model uses,
    each with its unit and where it came from; `benchmarks/steptime/calibrate.py` rebuilds
    it from the committed measurement summaries."""
    table: dict[str, Any] = json.loads((CALIBRATION / f"{chip}.json").read_text())
    return table


def _correction(table: Mapping[str, Any]) -> Correction:
    numbers = {name: entry["value"] for name, entry in table["numbers"].items()}

    def by(prefix: str, scale: float = 1.0) -> dict[str, float]:
        return {n[len(prefix) + 1 :]: v * scale for n, v in numbers.items() if n.startswith(prefix + ".")}

    clock = 1.5e9  # (the v5e's: rates in VMEM are per cycle, so that v5p and v6e scale them by theirs)
    return Correction(
        estimate=by("estimate"),
        weight_gradient_estimate=numbers["weight_gradient_estimate"],
        multi_output_estimate=by("multi_output_estimate"),
        estimate_weight=by("estimate_weight"),
        efficiency=by("efficiency"),
        vmem_product_seconds=numbers["vmem_product_seconds"],
        vmem_bytes_per_cycle=by("vmem_bytes_per_second", 1 / clock),
        loop_vmem_bytes_per_cycle=by("loop_vmem_bytes_per_second", 1 / clock),
        small_loop_vmem_bytes_per_cycle=numbers["small_loop_vmem_bytes_per_second"] / clock,
        hbm_efficiency=numbers["hbm_efficiency"],
        gather_seconds_per_element=numbers["gather_seconds_per_element"],
        gather_seconds_per_row=by("gather_seconds_per_row"),
        gather_row_bytes_per_second=numbers["gather_row_bytes_per_second"],
        gather_row_knee_bytes=numbers["gather_row_knee_bytes"],
        scatter_seconds_per_row=numbers["scatter_seconds_per_row"],
        scatter_row_bytes_per_second=numbers["scatter_row_bytes_per_second"],
        scatter_large_table_factor=numbers["scatter_large_table_factor"],
        scatter_in_place_row_seconds=numbers["scatter_in_place_row_seconds"],
        scatter_in_place_row_bytes_per_second=numbers["scatter_in_place_row_bytes_per_second"],
        scatter_transposed_tile_seconds=numbers["scatter_transposed_tile_seconds"],
        update_lane_tile_seconds=numbers["update_lane_tile_seconds"],
        gather_transposed_row_seconds=by("gather_transposed_row_seconds"),
        gather_transposed_tile_seconds=by("gather_transposed_tile_seconds"),
        strided_bytes_per_second=by("strided_bytes_per_second"),
        host_bytes_per_second=by("host_bytes_per_second"),
        pallas_step_seconds=numbers["pallas_step_seconds"],
        pallas_mxu_efficiency=numbers["pallas_mxu_efficiency"],
        f32_passes=by("f32_passes"),
        hbm_cycles_per_run=numbers["hbm_cycles_per_run"],
        hbm_cycles_per_loop_run=numbers["hbm_cycles_per_loop_run"],
        vmem_cycles_per_run=numbers["vmem_cycles_per_run"],
        gap_cycles=numbers["gap_cycles"],
        exposed_copy=numbers["exposed_copy"],
        launch_seconds=numbers["launch_seconds"],
        host_call_seconds=numbers["host_call_seconds"],
        host_input_seconds=numbers["host_input_seconds"],
        host_output_seconds=numbers["host_output_seconds"],
        host_node_seconds=numbers["host_node_seconds"],
        measured_on=table["chip"],
    )


CORRECTION: Final = _correction(calibration("v5e"))


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """The kernels of a compiled program that compute one JAX operation at one source line
    (each layer's of an unrolled model, a loop body's as often as the loop runs), and their
    share of the step's time: where the time goes, by the line that spends it.

    Attributes:
        op: The JAX operation they compute, named as a [treeshape.Buffer][]'s `op` (a
            fusion's first), or `None` where XLA made them (then one entry per kind).
        source: The user's source line that led to them (`file.py:line`), or `None`.
        runs: How often they run in one step, together (a loop's body counted by its trip
            count).
        seconds: All their runs together: the estimate where the target has one, else the
            roofline floor.
        flops: FLOPs of all their runs, by XLA's HLO cost analysis.
        bytes_accessed: Bytes of all their runs, by the same.
        name: The largest one's instruction name in the optimized module, as a profile
            names it.
        kind: The largest one's kind: `"matmul"`, `"batched matmul"`, `"convolution"`, `"reduction"`,
            `"elementwise"`, `"data movement"`, `"copy"`, `"async copy"`,
            `"gather"`, `"scatter"`, `"collective"`, `"custom call"` (or `"launch"`: the
            runtime's gaps, `"between kernels"` and `"between steps"`, and a step shorter
            than its host's call `"waiting on the host"`, which are no kernel's).

    Examples:
        >>> import treeshape as ts
        >>> k = ts.KernelTime(op="jit(step)/jvp()/dot_general", source="train.py:12", runs=12,
        ...                   seconds=0.012, flops=2.4e12, bytes_accessed=3e9, name="fusion.7", kind="matmul")
        >>> f"{k.flops / k.seconds / 1e12:.0f} TFLOP/s over its {k.runs} runs"
        '200 TFLOP/s over its 12 runs'
    """

    __module__ = "treeshape"

    op: str | None
    source: str | None
    runs: int
    seconds: float
    flops: float
    bytes_accessed: float
    name: str
    kind: str


class PhaseTime(NamedTuple):
    """A phase of a step's time ([treeshape.StepTime][]`.phases`): a run of consecutive
    kernels under one module path, named as [treeshape.Phase][] names the timeline's.

    Attributes:
        name: Their op without its outermost `jit(...)`, to `depth` path components
            (`transpose(jvp(MLP))/layers_1` at depth 2), or `"between steps"` and
            `"waiting on the host"`, the runtime's.
        seconds: All their runs together (a loop's body counted by its trip count).

    Examples:
        >>> import treeshape as ts
        >>> p = ts.PhaseTime("layers_0", 0.002)
        >>> f"{p.name}: {p.seconds * 1e3:.1f} ms"
        'layers_0: 2.0 ms'
    """

    name: str
    seconds: float


PhaseTime.__module__ = "treeshape"


@dataclasses.dataclass(frozen=True)
class StepTime:
    """How long one run of a compiled program takes on one device of the target, before
    it runs: [How fast will it run?](../guide/time.md).

    Attributes:
        seconds: The estimate (see the guide for how it was checked on a chip), or `None`
            where no device has checked one (the NVIDIA targets).
        compiler_seconds: The target compiler's own estimate, every loop body counted by
            its trip count, at the chip's clock (TPU targets), else `None`.
        floor_seconds: The roofline floor: every kernel's FLOPs at the chip's peak for its
            dtype or its bytes at the chip's HBM bandwidth, the larger, summed.
        source: Which model gave `seconds`, and how it was checked.
        mfu: The model FLOPs utilization `seconds` implies: the program's FLOPs over
            `seconds` times the chip's bf16 peak; `None` where `seconds` is.
        kernels: The kernels by op and source line, each a [treeshape.KernelTime][],
            largest first; their `seconds` sum to `seconds` (to `floor_seconds` where
            `seconds` is `None`).
        checked: The share of `seconds` (in [0, 1]) spent in kinds of kernel that the
            chip's calibration measured on that chip (`source` says it): 0 where
            `seconds` is `None` or the chip was not measured (v5p, v6e), less than 1 where
            the step holds collectives (one chip has no links to measure) or custom calls
            costed by their bytes alone.

    Examples:
        >>> import treeshape as ts
        >>> t = ts.StepTime(seconds=0.012, compiler_seconds=0.015, floor_seconds=0.009,
        ...                 source="an example", mfu=0.4, kernels=())
        >>> print(t)
        time 12.0 ms per step (an example), MFU 40%
    """

    __module__ = "treeshape"

    seconds: float | None
    compiler_seconds: float | None
    floor_seconds: float
    source: str
    mfu: float | None
    kernels: tuple[KernelTime, ...]
    checked: float = 0.0
    # (phase op, seconds) of each kernel in schedule order, for `phases`
    schedule: tuple[tuple[str | None, float], ...] = dataclasses.field(default=(), repr=False, compare=False)
    device: str = dataclasses.field(default="", repr=False, compare=False)  # "TPU v5e"

    def phases(self, depth: int = 1) -> tuple[PhaseTime, ...]:
        """The step's time by phase, in schedule order: a [treeshape.PhaseTime][] (`name`,
        `seconds`) for each run of consecutive kernels whose op shares its first `depth`
        path components (a loop's body counted by its trip count), named as
        `Cost.timeline.phases` names them.

        Raises:
            ValueError: `depth` is not an int >= 1.
        """
        if type(depth) is not int or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (how many path components name a phase), got {depth!r}")
        names = [None if op is None else phase_name(op, depth) for op, _ in self.schedule]
        current = next((name for name in names if name is not None), NO_OP)
        out: list[PhaseTime] = []
        for name, (_, seconds) in zip(names, self.schedule, strict=True):
            if out and (name is None or name == out[-1].name):
                out[-1] = PhaseTime(out[-1].name, out[-1].seconds + seconds)
            else:
                out.append(PhaseTime(current if name is None else name, seconds))
        return tuple(out)

    def line(self) -> str:
        """The one line `str(cost)` prints."""
        on = f" on {self.device}" if self.device else ""
        if self.seconds is None:
            return f"time at least {_duration(self.floor_seconds)} per step{on} ({self.source})"
        mfu = f", MFU {self.mfu:.0%}" if self.mfu is not None else ""
        return f"time {_duration(self.seconds)} per step{on} ({self.source}){mfu}"

    def _rows(self, n: int) -> list[list[str]]:
        total = self.seconds if self.seconds is not None else self.floor_seconds
        rows = []
        for k in self.kernels[:n]:
            share = f"{k.seconds / total:.0%}" if total else "-"
            op = k.op if k.op is not None else f"({k.name})"
            rows.append([op, k.source or "", str(k.runs), _duration(k.seconds), share])
        return rows

    def __str__(self) -> str:
        if not self.kernels:
            return self.line()
        head = ["kernel", "source", "runs", "seconds", "share"]
        return self.line() + "\n\n" + grid(head, self._rows(10), right=3)

    def _repr_html_(self) -> str:
        head = ["kernel", "source", "runs", "seconds", "share"]
        return f"<p>{html.escape(self.line())}</p>" + html_grid(head, self._rows(10), right=3)


# A kernel without the compiler's estimate that touches less than a vector register (a loop's
# counter, an optimizer's step count) runs on the scalar unit: a profile shows no kernel for it.
_SCALAR_BYTES: Final = 4096
_LOOP_SCALAR_BYTES: Final = 8
_SMALL_LOOP_BYTES: Final = 2**20
_LAUNCH: Final = "between steps"
_GAPS: Final = "between kernels"
_HOST: Final = "waiting on the host"
# What the guide's table measured on a real v5e (docs/guide/time.md): said with every estimate.
CHECKED: Final = "libtpu's cost model, corrected per kind of kernel as measured on a v5e"


def _percent(share: float) -> str:
    """A share as a whole percentage, never rounded up to 100% nor down to 0%."""
    if 0.0 < share < 0.01:
        return "under 1%"
    if 0.99 < share < 1.0:
        return "over 99%"
    return f"{share:.0%}"


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def _floor(k: Kernel, chip: Chip) -> float:
    """One run of `k` at the roofline: its FLOPs at the peak of its dtype (a matrix
    product's operands'), or its bytes in device memory at HBM's bandwidth, the larger."""
    return max(k.flops / chip.peak(k.dtype), k.device_bytes / chip.hbm_bytes_per_second, 0.0)


def _corrected(k: Kernel, chip: Chip, c: Correction) -> float:
    """One run of `k` as the chip runs it: a matrix product at its compiler estimate,
    scaled as measured for its kind, unless its roofline at the efficiency measured for
    its kind and its tile fill is lower (libtpu charges bytes it keeps in VMEM as if they
    came from HBM; the vector work fused around a matmul keeps it above its roofline:
    the two's geometric mean, weighted to the roofline), a matmul or convolution fused
    with other results at its estimate as measured for those, a batched one whose
    operands stay in VMEM at its FLOPs at the peak and a cost per product; a vector kernel
    at its bytes, HBM's and VMEM's at the rates measured for its kind (a reduction's at
    its lanes' fill; in a loop's body, where the chip ran copies, reductions and small
    kernels faster; a layout copy between HBM and VMEM at HBM's pace alone; a slice that
    strides over lanes, or over sublanes in HBM, no faster than the rate measured for it,
    by the bytes it spans); each with the cost of a run, smaller in a loop's body."""
    assert chip.clock_hz is not None
    if k.kind == "convolution" and k.weight_gradient:
        assert k.cycles is not None  # (a product without libtpu's estimate stays at its floor)
        return c.weight_gradient_estimate * k.cycles / chip.clock_hz
    hbm = chip.hbm_bytes_per_second * c.hbm_efficiency
    run = _hbm_run(k, chip, c) if _reads_hbm(k) else c.vmem_cycles_per_run / chip.clock_hz
    if k.kind == "batched matmul" and k.device_bytes == 0:  # each product's operands at hand
        return k.flops / chip.peak(k.dtype) + k.products * c.vmem_product_seconds + run
    if k.kind in c.estimate:
        assert k.cycles is not None
        if k.results > 1 and k.kind in c.multi_output_estimate:  # (a bias's gradient, a norm's statistics)
            return c.multi_output_estimate[k.kind] * k.cycles / chip.clock_hz
        roofline = max(k.flops / (chip.peak(k.dtype) * c.efficiency[k.kind] * k.fill), k.device_bytes / hbm) + run
        estimate = c.estimate[k.kind] * k.cycles / chip.clock_hz
        weight = c.estimate_weight.get(k.kind, 0.0)
        corrected = min(estimate, float(roofline ** (1 - weight) * estimate**weight))
        passes = c.f32_passes.get(k.precision, 1.0) if k.dtype == "float32" else 1.0
        if passes > 1.0:  # f32 at a precision above the default: several bf16 passes through the matrix unit
            return max(corrected, passes * k.flops / (chip.peak("bfloat16") * k.fill) + run)
        return corrected
    per_cycle = c.vmem_bytes_per_cycle.get(k.kind, c.vmem_bytes_per_cycle["data movement"])
    if k.in_loop and not _reads_hbm(k):  # a loop body's, in VMEM: small ones run fastest
        small = k.kind in ("elementwise", "reduction") and k.bytes_accessed < _SMALL_LOOP_BYTES
        per_cycle = c.small_loop_vmem_bytes_per_cycle if small else c.loop_vmem_bytes_per_cycle.get(k.kind, per_cycle)
    vmem = per_cycle * chip.clock_hz * k.lanes
    in_vmem = max(k.bytes_accessed - k.device_bytes, 0.0) / vmem
    if k.kind == "copy" and k.device_bytes and in_vmem:  # a layout copy between HBM and VMEM, at HBM's pace
        return k.device_bytes / hbm + run
    moved = k.device_bytes / hbm + in_vmem
    if k.strided:
        moved = max(moved, k.strided_bytes / c.strided_bytes_per_second[k.strided])
    if k.lane_tiles:  # (each tile read and written for the lanes the update fills)
        moved = max(moved, k.lane_tiles * c.update_lane_tile_seconds)
    return moved + run


def _reads_hbm(k: Kernel) -> bool:
    """Whether a run of `k` waits on HBM: in a loop's body, a kernel whose only bytes in HBM
    are scalars (the loop's counter) does not."""
    return k.device_bytes > (_LOOP_SCALAR_BYTES if k.in_loop else 0)


def _hbm_run(k: Kernel, chip: Chip, c: Correction) -> float:
    """What a run that reads or writes HBM costs besides its bytes, less in a loop's body."""
    assert chip.clock_hz is not None
    return (c.hbm_cycles_per_loop_run if k.in_loop else c.hbm_cycles_per_run) / chip.clock_hz


# A table a scatter updates where its emitter adds rows in place: larger than this, in HBM
_VMEM_TABLE_BYTES: Final = 16 * 2**20
# The gathers' and scatters' tables measured small (their rows cost least) and large
_SMALL_TABLE_ROWS: Final = 16384
_LARGE_TABLE_ROWS: Final = 262144


_ITEMSIZE: Final = {"bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1, "float64": 8, "int64": 8}


def _table_share(k: Kernel) -> float:
    """Where `k`'s table lies between the small and the large tables the chip measured, by
    the log of its rows: 0 at or under the small one, 1 at or over the large one."""
    rows = k.table_bytes / k.slice_bytes if k.slice_bytes else 0.0
    if rows <= _SMALL_TABLE_ROWS:
        return 0.0
    return min(math.log(rows / _SMALL_TABLE_ROWS) / math.log(_LARGE_TABLE_ROWS / _SMALL_TABLE_ROWS), 1.0)


def _indexed(k: Kernel, chip: Chip, c: Correction) -> float:
    """One run of a gather or scatter (libtpu writes no estimate of them), at the rates the
    chip measured per row: a gather's row at least its least cost, which grows with its
    table's rows (random rows of a large table cost 5x), and a wide row by its bytes; a
    single element (a loss picking its labels' logits) slower; a scatter writes its whole
    table at HBM's rate and adds each row at its cost and its bytes' rate, slower in a large
    table; where libtpu does not stage the rows of a scatter into a table larger than VMEM's
    scoped share, it adds each in place in HBM, slower still (the table written apart). A
    table laid out transposed (`Kernel.row_tiles`) costs a row by the tiles it spans."""
    hbm = chip.hbm_bytes_per_second * c.hbm_efficiency
    run = _hbm_run(k, chip, c)
    share = _table_share(k)
    if k.kind == "scatter" and not k.staged and k.table_bytes > _VMEM_TABLE_BYTES:  # each row added in HBM
        # (a row of a table laid out transposed is one lane of `row_tiles` tiles, each read and written)
        spans = k.row_tiles * c.scatter_transposed_tile_seconds
        row = c.scatter_in_place_row_seconds + (spans or k.slice_bytes / c.scatter_in_place_row_bytes_per_second)
        return k.indices * row + run
    if k.kind == "scatter":  # (its rows add element by element: a bf16 row's as an f32 row twice as wide)
        wide = k.slice_bytes * 4 / _ITEMSIZE.get(k.dtype, 4)
        row = c.scatter_seconds_per_row + wide / c.scatter_row_bytes_per_second
        slower: float = c.scatter_large_table_factor**share
        return k.table_bytes / hbm + k.indices * row * slower + run
    if k.slice_bytes <= 8:  # (one element)
        return k.indices * c.gather_seconds_per_element + k.device_bytes / hbm + run
    if k.kind == "gather" and k.row_tiles:  # (each row a lane of its tiles, read whole)
        where = "vmem" if k.table_in_vmem else "hbm"
        row = c.gather_transposed_row_seconds.get(where, 0.0) + k.row_tiles * c.gather_transposed_tile_seconds[where]
        return k.indices * row + run
    rows = c.gather_seconds_per_row
    least: float = rows["small_table"] * (rows["large_table"] / rows["small_table"]) ** share
    wide = (k.slice_bytes - c.gather_row_knee_bytes) / c.gather_row_bytes_per_second
    return k.indices * max(least, wide) + run


def _custom(k: Kernel, chip: Chip, c: Correction) -> float:
    """One run of a custom call (a Pallas kernel, a linear-algebra call), of which libtpu
    writes no estimate: a Pallas kernel whose grid the program told (`Kernel.grid_steps`)
    at its FLOPs (its `cost_estimate`'s, else its body's matrix products over the grid) at
    the efficiency the chip measured in a kernel, or its bytes (the estimate's, else the
    blocks its pipeline copies) at HBM's rate, the larger, and each grid step's cost as the
    chip measured; else its own FLOPs at the peak of its operands' dtype or its bytes
    at HBM's rate, the larger (a Pallas kernel's `cost_estimate`; else the bytes of its
    operands and results, wherever they live); plus a run's cost."""
    assert chip.clock_hz is not None
    hbm = chip.hbm_bytes_per_second * c.hbm_efficiency
    run = _hbm_run(k, chip, c) if _reads_hbm(k) else c.vmem_cycles_per_run / chip.clock_hz
    if k.grid_steps:
        work = max(k.flops / (chip.peak(k.dtype) * c.pallas_mxu_efficiency), k.device_bytes / hbm)
        return work + k.grid_steps * c.pallas_step_seconds + run
    return max(k.flops / chip.peak(k.dtype), k.bytes_accessed / hbm) + run


def _offloaded(kernels: Sequence[Kernel], each: list[float], c: Correction) -> list[float]:
    """`each` with each copy between device and host memory at the host link's rate measured
    for its direction, less the work that runs while it lasts (the kernels between its start
    and its wait, a copy the other way among them at the time it waits): the chip ran a
    copy beside a matrix product as long as the copy alone."""
    out = list(each)
    hosted = [i for i, k in enumerate(kernels) if k.host in c.host_bytes_per_second]
    done: list[int] = []
    covered: dict[str, set[int]] = {}  # each direction's kernels already counted beside a copy
    for i in sorted(hosted, key=lambda i: kernels[i].position):
        k = kernels[i]
        moved = k.runs * k.host_bytes / c.host_bytes_per_second[k.host]
        end = k.done if k.done is not None else k.position + 1
        used = covered.setdefault(k.host, set())
        beside = [j for j, other in enumerate(kernels) if not other.host and k.position < other.position < end]
        hidden = sum(out[j] for j in beside if j not in used)
        used.update(beside)
        hidden += sum(
            out[h]
            for h in done
            if kernels[h].host != k.host and kernels[h].position < k.position < (kernels[h].done or 0)
        )
        out[i] = max(moved - hidden, 0.0)
        done.append(i)
    return out


def _collective(c: Collective, chip: Chip) -> float:
    """One run of a collective over the interconnect, by the standard ring over its group of
    n devices, each sending over one link and receiving over another: an all-gather or a
    reduce-scatter moves (n-1)/n of the whole array's bytes (the gathered result, the
    scattered operand) per device at the link's bandwidth, in n-1 steps of a hop's latency
    each; an all-reduce (a reduce-scatter, then an all-gather) twice that; an all-to-all
    sends (n-1)/n of its array as a reduce-scatter does; a collective-permute its array over
    one link, with one hop's latency; nothing where the group is one device."""
    if c.devices <= 1:
        return 0.0
    link, hop = chip.link_bytes_per_second, chip.link_latency_seconds
    if c.op == "collective-permute":
        return c.bytes / link + hop
    n, passes = c.devices, 2 if c.op == "all-reduce" else 1
    return passes * ((n - 1) / n * c.bytes / link + (n - 1) * hop)


def _communicated(kernels: Sequence[Kernel], each: Sequence[float], chip: Chip) -> list[float]:
    """`each` (one entry per kernel, all its runs) with each collective's communication
    counted once, on the kernels that carry it (those of its channel that run as often):
    where products carry a part of it (libtpu fuses an all-gather's transfers into the
    products that run while it lasts), they are slowed to its pace, in proportion to their
    own time, and run at their own pace only where their work outlasts it; else its first
    kernel (the collective, or its start) takes at least its time."""
    out = list(each)
    carriers: dict[tuple[str, int], list[int]] = {}
    for i, k in enumerate(kernels):
        if k.collective is not None:
            carriers.setdefault((k.collective.channel, k.runs), []).append(i)
    for (_, runs), found in carriers.items():
        collective = kernels[found[0]].collective
        assert collective is not None
        moved = runs * _collective(collective, chip)
        products = [i for i in found if kernels[i].kind != "collective"]
        working = sum(out[i] for i in products)
        if products and working > 0:
            for i in products:
                out[i] *= max(moved / working, 1.0)
        else:
            out[found[0]] = max(out[found[0]], moved)
    return out


def _taken(kernels: Sequence[Kernel], each: Sequence[float]) -> tuple[list[Kernel], list[float], int]:
    """The kernels one run takes, with their entries of `each`: of each conditional, its most
    costly branch (its kernels' times summed, a conditional inside it at its own most costly
    branch); and how many conditionals there were."""
    keep = [True] * len(kernels)
    conditionals = {c for k in kernels for c, _ in k.branch}
    for level in reversed(range(max((len(k.branch) for k in kernels), default=0))):  # innermost first
        totals: dict[int, dict[int, float]] = {}
        for i, k in enumerate(kernels):
            if keep[i] and len(k.branch) > level:
                c, b = k.branch[level]
                branches = totals.setdefault(c, {})
                branches[b] = branches.get(b, 0.0) + each[i]
        chosen = {c: max(branches, key=lambda b: branches[b]) for c, branches in totals.items()}
        for i, k in enumerate(kernels):
            if keep[i] and len(k.branch) > level and chosen[k.branch[level][0]] != k.branch[level][1]:
                keep[i] = False
    taken = [i for i in range(len(kernels)) if keep[i]]
    return [kernels[i] for i in taken], [each[i] for i in taken], len(conditionals)


def estimate(
    kernels: Sequence[Kernel],
    names: dict[str, tuple[str | None, str | None]],
    chip: Chip,
    label: str,
    flops: float | None,
    exact: bool,
    call: tuple[int, int, int] | None = None,
) -> StepTime:
    """The `StepTime` of a program's kernels on `chip`: `names` gives each kernel's op and
    source by name; `flops` is the program's (for the MFU); `exact` whether every loop's
    trip count was known; `call` the arrays a call passes in, the arrays it gets back, and
    their registered pytree nodes (`_host.tree_counts`), where the step is called from Python."""
    checked = chip.estimated
    c = CORRECTION
    each = [kernel_seconds(k, chip, c, checked) for k in kernels]
    if checked:
        each = _communicated(kernels, _offloaded(kernels, each, c), chip)
    kernels, each, conditionals = _taken(kernels, each)
    clock = chip.clock_hz or 1.0
    compiler = sum(k.runs * k.cycles / clock for k in kernels if k.cycles is not None) if checked else 0.0
    floor_seconds = sum(k.runs * _floor(k, chip) for k in kernels if k.kind != "async copy")
    # the chip's idle time between two kernels at the top of the program (none measured in a
    # loop's body), which a profile gives to no kernel
    gap = c.gap_cycles / chip.clock_hz if checked and chip.clock_hz is not None else 0.0
    gaps = [gap if not k.in_loop and k.kind != "async copy" else 0.0 for k in kernels]
    seconds = sum(each) + sum(gaps) + c.launch_seconds if checked else None
    # a step whose kernels take less time than its host takes to call it waits for the host
    each_part = (c.host_input_seconds, c.host_output_seconds, c.host_node_seconds)  # (arrays in, out; nodes)
    host = c.host_call_seconds + sum(n * s for n, s in zip(call, each_part, strict=True)) if call else 0.0
    waiting = max(host - seconds, 0.0) if seconds is not None else 0.0
    seconds = seconds + waiting if seconds is not None else None
    uncosted = sum(1 for k in kernels if k.kind in c.estimate and k.cycles is None and k.flops)
    uncosted = uncosted if checked else 0
    measured = label.endswith(c.measured_on) and seconds is not None
    share = (sum(t for k, t in zip(kernels, each, strict=True) if _measured(k)) + sum(gaps)) if measured else 0.0
    share = min((share + c.launch_seconds + waiting) / seconds, 1.0) if measured and seconds else 0.0
    source = _source(label, checked, uncosted, exact, _by_bytes(kernels), conditionals, share)
    bf16 = chip.peak("bfloat16")
    mfu = flops / (seconds * bf16) if seconds and flops is not None else None
    times = [
        KernelTime(
            op=names.get(k.name, (None, None))[0],
            source=names.get(k.name, (None, None))[1],
            runs=k.runs,
            seconds=t,
            flops=k.runs * k.flops,
            bytes_accessed=k.runs * k.bytes_accessed,
            name=k.name,
            kind=k.kind,
        )
        for k, t in zip(kernels, each, strict=True)
    ]
    # each kernel's phase holds the gap after it; the step's gaps are one entry of `kernels`
    schedule = [(t.op, t.seconds + gap) for t, gap in zip(times, gaps, strict=True)]
    if checked:
        times.append(KernelTime(None, None, sum(g > 0 for g in gaps), sum(gaps), 0.0, 0.0, _GAPS, "launch"))
        # the runtime's gap between two steps, as a training loop runs them
        times.append(KernelTime(None, None, 1, c.launch_seconds, 0.0, 0.0, _LAUNCH, "launch"))
        schedule.append((_LAUNCH, c.launch_seconds))
        if waiting > 0:
            times.append(KernelTime(None, None, 1, waiting, 0.0, 0.0, _HOST, "launch"))
            schedule.append((_HOST, waiting))
    ordered = _by_line(t for t in times if t.seconds > 0)
    return StepTime(
        seconds, compiler if checked else None, floor_seconds, source, mfu, ordered, share, tuple(schedule), label
    )


def kernel_seconds(k: Kernel, chip: Chip, c: Correction, checked: bool) -> float:
    """All the runs of one kernel in a step, alone: the estimate where the chip's is
    `checked`, else its floor (a collective's communication and a copy to or from the host
    are added over the step: `_communicated`, `_offloaded`)."""
    floor = k.runs * _floor(k, chip)
    if k.kind == "collective":
        return floor
    if k.kind == "async copy":  # the part of its HBM time the kernels around it do not hide
        moved = k.runs * k.device_bytes / (chip.hbm_bytes_per_second * c.hbm_efficiency)
        return c.exposed_copy * moved if checked else 0.0
    if checked and k.kind in ("gather", "scatter"):
        return max(floor, k.runs * _indexed(k, chip, c))
    if checked and k.kind == "custom call" and (k.flops or k.bytes_accessed):
        return max(floor, k.runs * _custom(k, chip, c))
    if not checked or (k.cycles is None and (k.kind in c.estimate or k.bytes_accessed < _SCALAR_BYTES)):
        return floor
    return max(floor, k.runs * _corrected(k, chip, c))


def _measured(k: Kernel) -> bool:
    """Whether the chip measured `k`'s kind as the model costs it: not a collective (one chip
    has no links), nor a custom call costed by its bytes or by a `cost_estimate` that knows
    nothing of its grid (a Pallas kernel costed from its body over its grid was)."""
    if k.kind == "collective" or k.collective is not None:
        return False
    return k.kind != "custom call" or k.grid_steps > 0 or (k.flops == 0 and k.bytes_accessed == 0)


def _by_line(times: Iterable[KernelTime]) -> tuple[KernelTime, ...]:
    """The kernels of each op at each source line together (an unrolled model's layers, a
    loop's forward and rematerialized copies), largest first: named by their largest
    kernel's name and kind. XLA's own kernels (no op) go together by kind."""
    groups: dict[tuple[str | None, str | None, str | None], list[KernelTime]] = {}
    for t in times:
        key = (t.op, t.source, None) if t.op is not None else (None, t.source, t.name if t.kind == "launch" else t.kind)
        groups.setdefault(key, []).append(t)
    merged = []
    for same in groups.values():
        largest = max(same, key=lambda t: t.seconds)
        merged.append(
            dataclasses.replace(
                largest,
                runs=sum(t.runs for t in same),
                seconds=sum(t.seconds for t in same),
                flops=sum(t.flops for t in same),
                bytes_accessed=sum(t.bytes_accessed for t in same),
            )
        )
    return tuple(sorted(merged, key=lambda t: -t.seconds))


# A kernel costed by its bytes alone (section 28): its kind, as `source` names one and several.
_BY_BYTES: Final = {
    "collective": ("collective", "collectives"),
    "async copy": ("asynchronous copy", "asynchronous copies"),
    "custom call": ("custom call without figures of its own", "custom calls without figures of their own"),
}


def _by_bytes(kernels: Sequence[Kernel]) -> dict[str, int]:
    """How many kernels of each kind were costed by their bytes alone: collectives and
    asynchronous copies (over a link, or HBM), custom calls without figures of their own."""
    counts: dict[str, int] = {}
    for k in kernels:
        if k.kind in ("collective", "async copy") or k.by_bytes:
            counts[k.kind] = counts.get(k.kind, 0) + 1
    return counts


def _source(
    label: str,
    checked: bool,
    uncosted: int,
    exact: bool,
    by_bytes: Mapping[str, int],
    conditionals: int = 0,
    share: float = 0.0,
) -> str:
    if checked:
        said = f"{CHECKED}; {_percent(share)} of this step in kinds measured there"
        if not label.endswith("v5e"):
            said = "libtpu's cost model, with the correction measured on a v5e (this chip is not measured)"
    else:
        said = "the roofline floor only: no estimate checked on an NVIDIA GPU"
    notes = []
    if uncosted:
        notes.append(f"{uncosted} kernel{'s' if uncosted != 1 else ''} without the compiler's estimate at the floor")
    if by_bytes:
        kinds = ", ".join(f"{count} {_BY_BYTES[kind][count != 1]}" for kind, count in sorted(by_bytes.items()))
        notes.append(f"costed by their bytes alone: {kinds}")
    if not exact:
        notes.append("a loop of unknown trip count counted once")
    if conditionals:
        notes.append("each conditional counted at its most costly branch")
    return said + "".join(f"; {n}" for n in notes)


# The public classes report module `treeshape`, so doctest would not find their examples here.
__test__ = {"StepTime": StepTime, "KernelTime": KernelTime, "PhaseTime": PhaseTime}
