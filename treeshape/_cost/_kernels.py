"""The kernels of a compiled program, read from the optimized module its compiler dumped
(as text): each instruction the schedule runs that does work (a fusion, a copy, a
collective, ...), in schedule order, with how often it runs in one step (a loop's body as
often as its trip count says, a loop inside it as often again), the compiler's own
estimate of its cycles where it writes one (libtpu's `estimated_cycles`), its FLOPs and
bytes by XLA's HLO cost analysis of the kernel alone, the bytes of those in device memory
(not in a TPU's VMEM or SMEM, which a layout's `S(n)` names), its kind, the collective it
runs or carries a part of (`Collective`), and the conditional branches that hold it.

Nothing compiles: each kernel is costed as a module of its own, in about a millisecond.
"""

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from .. import _compat
from . import _hlo_loops
from ._hlo_text import (
    Computation,
    Instruction,
    Module,
    array_dims,
    arrays,
    channel,
    cost_estimate,
    custom_call_target,
    dim_labels,
    dims_of,
    dot_dims,
    dtype_name,
    estimated_cycles,
    fused,
    group_size,
    host_arrays,
    int_of,
    ints_of,
    itemsize,
    minor as minor_of,
    op_of,
    operand_precision,
    parse,
    permute_pairs,
    scoped_bytes,
    shape_bytes,
    types,
    window,
)
from ._layout import lane_tiles, row_tiles, strided, strided_of
from ._pallas import Work, signature


Kind = Literal[
    "matmul",
    "batched matmul",
    "convolution",
    "reduction",
    "elementwise",
    "data movement",
    "gather",
    "scatter",
    "copy",
    "async copy",
    "collective",
    "custom call",
]
KINDS: Final[tuple[Kind, ...]] = typing.get_args(Kind)


@dataclasses.dataclass(frozen=True)
class Collective:
    """The communication a kernel carries: the collective's op (`"all-gather"`,
    `"all-reduce"`, `"reduce-scatter"`, `"all-to-all"`, `"collective-permute"`, ...), its
    group's size (a permute's: 2 where it sends to another device, else 1), the bytes of the
    whole array it communicates (an all-gather's gathered result, not its shard; a
    reduce-scatter's, all-reduce's or all-to-all's operand; a permute's), and its channel:
    the instructions of one collective (libtpu's start, each kernel it fuses a part of the
    communication into, its done) share it, so that it is counted once."""

    op: str
    devices: int
    bytes: float
    channel: str


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str  # the instruction's name in the optimized module, as a profile names it
    opcode: str
    kind: Kind
    position: int  # in the schedule flattened (a loop's body once, where the loop runs it)
    runs: int  # in one run of the program
    cycles: float | None  # the compiler's estimate of one run, where it writes one
    flops: float  # one run
    bytes_accessed: float  # one run
    device_bytes: float  # one run, read or written in device memory (HBM)
    dtype: str  # of its matrix product's operands where it has one (a custom call's), else of its result
    done: int | None = None  # an asynchronous copy's or collective's `-done` position
    devices: int = 1  # a collective's group size
    in_loop: bool = False  # in a loop's body
    fill: float = 1.0  # a matrix product's fill of the matrix unit's tiles (`tile_fill`)
    weight_gradient: bool = False  # a convolution whose window spans its output (`weight_gradient`)
    products: int = 1  # a batched matmul's matrix products in one run (`batch_count`)
    lanes: float = 1.0  # a reduction's share of a vector register's lanes (`lane_fill`)
    indices: int = 0  # a gather's or scatter's slices in one run
    slice_bytes: float = 0.0  # each of those slices' bytes
    table_bytes: float = 0.0  # the array a scatter writes, or a gather reads
    results: int = 1  # the arrays one run writes (a multi-output fusion's several)
    collective: Collective | None = None  # the communication it carries, where it carries one
    branch: tuple[tuple[int, int], ...] = ()  # (conditional, branch) of each conditional holding it
    by_bytes: bool = False  # a custom call with no figures of its own: costed by its operands' and results' bytes
    grid_steps: int = 0  # a Pallas kernel's grid steps, where its work was read from the program (`_pallas`)
    host: str = ""  # an asynchronous copy's direction to or from the host's memory ("device_to_host", ...)
    host_bytes: float = 0.0  # the bytes it moves there, one run
    precision: str = ""  # a matrix product's operand precision above the default ("high", "highest")
    staged: bool = False  # a scatter that libtpu's staged emitter runs (megabytes of scoped VMEM: `scoped_bytes`)
    row_tiles: int = 0  # its table laid out transposed (its rows along the lanes): the tiles a row spans
    table_in_vmem: bool = False  # a gather's or scatter's table in VMEM (prefetched there)
    strided: str = ""  # a slice with a stride over its operand's lanes ("lanes") or sublanes ("sublanes")
    strided_bytes: float = 0.0  # the bytes of the operand that slice spans, one run
    lane_tiles: int = 0  # a dynamic-update-slice writing a part of each tile's lanes: those tiles, one run


# Instructions that run no kernel of their own.
_FREE: Final = frozenset(
    {
        "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
        "replica-id", "opt-barrier", "add-dependency", "domain", "copy-done", "async-done", "all-reduce-done",
        "all-gather-done", "collective-permute-done", "send-done", "recv-done", "while", "call", "conditional",
    }
)  # fmt: skip
_ASYNC_COPIES: Final = frozenset({"copy-start", "async-start"})
_COLLECTIVES: Final = frozenset(
    {
        "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
        "all-reduce-start", "all-gather-start", "collective-permute-start", "ragged-all-to-all",
    }
)  # fmt: skip
_DATA: Final = frozenset(
    {
        "broadcast", "convert", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate",
        "pad", "gather", "scatter", "reshape", "reverse", "iota", "select", "sort",
    }
)  # fmt: skip


def _shape(instruction: Instruction) -> str:
    return instruction.shape


@dataclasses.dataclass(frozen=True)
class _Traits:
    kind: Kind
    dtype: str | None = None  # the XLA type of its matrix product's operands, where it has one
    fill: float = 1.0  # that product's `tile_fill`
    weight_gradient: bool = False  # that product is a convolution's `weight_gradient`
    products: int = 1  # that product's `batch_count`
    lanes: float = 1.0  # a reduction's `lane_fill`
    indices: int = 0  # a gather's or scatter's slices, one run
    slice_bytes: float = 0.0  # each slice's
    table_bytes: float = 0.0  # a scatter's result, a gather's operand
    precision: str = ""  # that product's operand precision above the default (`precision_of`)
    staged: bool = False  # a scatter run by libtpu's staged emitter
    row_tiles: int = 0  # a gather's or scatter's row: the tiles it spans where its table lies transposed (`row_tiles`)
    in_vmem: bool = False  # that table is in VMEM
    strided: str = ""  # a strided slice's strided dimension: "lanes" or "sublanes" (`strided_of`)
    strided_bytes: float = 0.0  # the operand's bytes it spans
    lane_tiles: int = 0  # a dynamic-update-slice's: the tiles its update writes a part of the lanes of (`lane_tiles`)


def precision_of(attributes: str) -> str:
    """A matrix product's operand precision where either operand's is above the default:
    `"highest"` or `"high"` (a TPU multiplies f32 at those in several bf16 passes), else ``."""
    said = operand_precision(attributes)
    return next((p for p in ("highest", "high") if p in said), "")


def _find(module: Module, computation: Computation, opcode: str) -> tuple[Computation, Instruction] | None:
    """The first `opcode` instruction of a fused computation, a fusion inside it searched too."""
    for instruction in computation.instructions:
        inner, _, attributes = op_of(instruction)
        if inner == opcode:
            return computation, instruction
        called = fused(module, attributes) if inner == "fusion" else None
        if called is not None:
            found = _find(module, called, opcode)
            if found is not None:
                return found
    return None


def _indexed(computation: Computation, instruction: Instruction) -> _Traits:
    """A gather's or scatter's traits: how many slices it moves and their bytes (each
    gathered slice, or each scattered update row, and the table a scatter writes)."""
    opcode, operands, attributes = op_of(instruction)
    named = computation.named
    tiles, vmem = row_tiles(computation, instruction)
    if opcode == "gather":
        sizes = ints_of(attributes, "slice_sizes")
        each = math.prod(sizes) if sizes is not None else 1
        out = dims_of(instruction) or []
        count = math.prod(out) // max(each, 1)
        table = shape_bytes(named.get(operands[0])) if operands else 0
        row = shape_bytes(instruction) / max(count, 1)
        return _Traits("gather", indices=count, slice_bytes=row, table_bytes=table, row_tiles=tiles, in_vmem=vmem)
    indices = dims_of(named.get(operands[1])) if len(operands) >= 3 else None
    at = int_of(attributes, "index_vector_dim")
    if indices is None or at is None:
        return _Traits("scatter", table_bytes=shape_bytes(instruction))
    count = math.prod(indices) // (indices[at] if at < len(indices) else 1)
    updates = shape_bytes(named.get(operands[2])) / max(count, 1)
    table = shape_bytes(instruction)
    return _Traits("scatter", indices=count, slice_bytes=updates, table_bytes=table, row_tiles=tiles, in_vmem=vmem)


def _kind(
    module: Module, computation: Computation, instruction: Instruction, tile: int | None, lanes: int | None
) -> _Traits:
    """A kernel's kind and what its cost depends on besides its bytes: a matrix product's
    operand type, fill of the chip's `tile`s and direction; a reduction's fill of the
    chip's `lanes`; a gather's or scatter's slices."""
    opcode, _, attributes = op_of(instruction)
    if opcode in _ASYNC_COPIES:
        return _Traits("async copy")
    if opcode in _COLLECTIVES:
        return _Traits("collective")
    if opcode == "custom-call":
        return _Traits("custom call", _operand_type(computation, instruction))
    if opcode in ("convolution", "dot"):
        fill, gradient, products = product_traits(computation, instruction, tile)
        dtype, said = _operand_type(computation, instruction), precision_of(attributes)
        return _Traits(_product(attributes), dtype, fill, gradient, products, precision=said)
    if opcode in ("gather", "scatter"):
        return _indexed(computation, instruction)
    if opcode in ("reduce", "reduce-window", "select-and-scatter"):
        return _Traits("reduction", lanes=lane_fill(computation, instruction, lanes))
    if opcode == "slice":
        over, span = strided(computation, instruction)
        return _Traits("data movement", strided=over, strided_bytes=span)
    if opcode in ("copy", "transpose", "reshape"):  # (a reshape left alone is a change of layout: a copy)
        return _Traits("copy")
    if opcode == "dynamic-update-slice":
        return _Traits("data movement", lane_tiles=lane_tiles(computation, instruction))
    fusion = fused(module, attributes) if opcode == "fusion" else None
    if fusion is None:
        return _Traits("data movement" if opcode in _DATA else "elementwise")
    kinds: set[Kind] = set()
    product = None
    for inner_instruction in fusion.instructions:
        inner, operands, rest = op_of(inner_instruction)
        if inner in ("convolution", "dot"):
            kinds.add(_product(rest))
            if product is None:
                dtype = _operand_type(fusion, inner_instruction)
                fill, gradient, products = product_traits(fusion, inner_instruction, tile)
                product = _Traits(_product(rest), dtype, fill, gradient, products, precision=precision_of(rest))
        elif inner in ("reduce", "reduce-window", "select-and-scatter"):
            kinds.add("reduction")
        elif inner not in _DATA and inner not in ("parameter", "constant", "get-tuple-element", "tuple", "bitcast"):
            kinds.add("elementwise")
    for kind in ("convolution", "batched matmul", "matmul"):
        if kind in kinds and product is not None:
            return dataclasses.replace(product, kind=typing.cast(Kind, kind))
    for indexed in ("scatter", "gather"):  # (no product: the indexed op is its work)
        found = _find(module, fusion, indexed)
        if found is not None:
            return dataclasses.replace(_indexed(*found), staged=scoped_bytes(attributes) >= _STAGED_SCOPED_BYTES)
    over, spanned = strided_of(module, fusion)
    if "reduction" in kinds:
        return _Traits(
            "reduction", lanes=lane_fill(computation, instruction, lanes), strided=over, strided_bytes=spanned
        )
    return _Traits("elementwise" if "elementwise" in kinds else "data movement", strided=over, strided_bytes=spanned)


# libtpu's staged scatter emitter holds its rows in megabytes of scoped VMEM (1-16 MB as
# libtpu 0.0.42.1 compiles them); the other adds each row in place, in 68-544 KB (1 MB for
# 256-byte rows into a table of a million).
_STAGED_SCOPED_BYTES: Final = 4 * 2**20


def _operand_type(computation: Computation, kernel: Instruction) -> str | None:
    """The XLA type a matrix product or custom call computes in: its operands' (an int8
    product's `s8`, whatever it accumulates into), the type that holds the most of their
    bytes; None where they cannot be read."""
    named = computation.named
    held: dict[str, int] = {}
    for operand in op_of(kernel)[1]:
        for kind, size, _ in arrays(_shape(named[operand])) if operand in named else ():
            held[kind] = held.get(kind, 0) + size
    return max(held, key=lambda kind: (held[kind], itemsize(kind))) if held else None


def lane_fill(computation: Computation, kernel: Instruction, lanes: int | None) -> float:
    """The share of a vector register's `lanes` (a TPU's 128, `Chip.lanes`) that the minor
    dimension of a kernel's largest array (its operands' and result's) fills: a reduction
    over 64-wide attention heads holds 64 of them, and a v5e ran it at half the rate of a
    full one. 1.0 for a chip without lanes counted (`None`)."""
    if lanes is None:
        return 1.0
    named = computation.named
    arrays = [kernel, *(named[o] for o in op_of(kernel)[1] if o in named)]
    largest, minor = 0, lanes
    for instruction in arrays:
        for _, dims, layout in array_dims(_shape(instruction)):
            at = minor_of(layout)
            if dims and at is not None and math.prod(dims) > largest:
                largest, minor = math.prod(dims), dims[at]
    return _filled(minor, lanes) if minor > 0 else 1.0


def _filled(size: int, tile: int) -> float:
    return size / (-(-size // tile) * tile)


def _operands(computation: Computation, product: Instruction) -> tuple[list[int], list[int], list[int]] | None:
    """A matrix product's operands' and result's dimensions, where they can be read."""
    operands = op_of(product)[1]
    if len(operands) < 2:
        return None
    named = computation.named
    lhs, rhs, out = dims_of(named.get(operands[0])), dims_of(named.get(operands[1])), dims_of(product)
    return None if lhs is None or rhs is None or out is None else (lhs, rhs, out)


def _labels(attributes: str, dims: tuple[list[int], list[int], list[int]]) -> tuple[str, str, str] | None:
    """A convolution's `dim_labels` (input, kernel, output), where they match its dimensions."""
    labels = dim_labels(attributes)
    if labels is None or any(len(t) != len(d) for t, d in zip(labels, dims, strict=True)):
        return None
    return labels


def _window(labels: str, dims: list[int]) -> int:
    return math.prod(d for label, d in zip(labels, dims, strict=True) if label.isdigit())


def product_traits(computation: Computation, product: Instruction, tile: int | None) -> tuple[float, bool, int]:
    """A matrix product's `tile_fill` of the chip's `tile`, whether it is a convolution's `weight_gradient`, and
    its `batch_count` (its operands read once: a product at the top of a large program is
    one of many)."""
    dims = _operands(computation, product)
    if dims is None:
        return 1.0, False, 1
    return tile_fill(product, dims, tile), weight_gradient(product, dims), batch_count(product, dims)


def batch_count(product: Instruction, dims: tuple[list[int], list[int], list[int]]) -> int:
    """How many matrix products a batched matmul computes: its batch dimensions' sizes
    multiplied (a TPU writes them as the window of a convolution); 1 for any other product."""
    opcode, _, attributes = op_of(product)
    if opcode == "convolution":
        labels = _labels(attributes, dims)
        if labels is None or _product(attributes) != "batched matmul":
            return 1
        return _window(labels[2], dims[2])
    dot = dot_dims(attributes)
    return math.prod(dims[0][d] for d in dot.get("lhs_batch", []))


def tile_fill(product: Instruction, dims: tuple[list[int], list[int], list[int]], tile: int | None) -> float:
    """How well a matrix product fills a TPU matrix unit's `tile` x `tile` tiles
    (`Chip.matrix_tile`: 128 on a v5e, 256 on a v6e), as a v5e measured it: its
    contraction (`K`; a convolution's input features times its window) at its share of
    the tiles it spans; its output features (`N`) at twice theirs, up to a whole
    (the chip ran 64 output features as fast as 128); a product with batch dimensions,
    each product's rows at their share of theirs. 1.0 where the dimensions cannot be read,
    or for a chip without tiles counted (`None`)."""
    if tile is None:
        return 1.0
    opcode, _, attributes = op_of(product)
    lhs, rhs, out = dims
    if opcode == "convolution":
        labels = _labels(attributes, dims)
        if labels is None:
            return 1.0
        kind = _product(attributes)
        k, n = lhs[labels[0].index("f")], rhs[labels[1].index("o")]
        if kind == "convolution":  # the chip contracts over the window's taps too
            k *= _window(labels[1], rhs)
        rows = out[labels[2].index("b")] if kind == "batched matmul" else None
    else:
        dot = dot_dims(attributes)
        contracting = dot.get("lhs_contracting", [])
        k = math.prod(lhs[d] for d in contracting)
        rhs_free = set(range(len(rhs))) - set(dot.get("rhs_contracting", [])) - set(dot.get("rhs_batch", []))
        n = math.prod(rhs[d] for d in rhs_free)
        lhs_free = set(range(len(lhs))) - set(contracting) - set(dot.get("lhs_batch", []))
        rows = math.prod(lhs[d] for d in lhs_free) if dot.get("lhs_batch") else None
    if min(k, n) <= 0:
        return 1.0
    fill = _filled(k, tile) * min(1.0, 2 * _filled(n, tile))
    return fill * _filled(rows, tile) if rows else fill


def weight_gradient(product: Instruction, dims: tuple[list[int], list[int], list[int]]) -> bool:
    """Whether a convolution is a weight gradient, as a TPU writes one: its window (the
    activations' spatial size) spans more than its output (the kernel's)."""
    opcode, _, attributes = op_of(product)
    if opcode != "convolution" or _product(attributes) != "convolution":
        return False
    labels = _labels(attributes, dims)
    return labels is not None and _window(labels[1], dims[1]) > _window(labels[2], dims[2])


def _product(attributes: str) -> Kind:
    """A matrix product's kind: a convolution over padded spatial windows; a product
    with batch dimensions (a TPU writes it as a convolution whose window dilates over the
    batch); else a matmul."""
    written = window(attributes)
    if written is None:
        return "matmul"
    if "pad=" in written:
        return "convolution"
    return "batched matmul" if "lhs_dilate=" in written else "matmul"


# libtpu's custom calls that do no work of their own: a buffer allocated, arrays laid out
# to be concatenated in place, facts about a gather's indices.
_BOOKKEEPING: Final = frozenset(
    {"AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked"}
)


def _figures(instruction: Instruction) -> tuple[float, float] | None:
    """A custom call's own FLOPs and bytes, where it carries them: a Pallas kernel's
    `pallas_call(cost_estimate=...)`, which its backend config holds as `"cost_estimate"`
    (its bytes those it moves in device memory); `(0, 0)` for one that does no work."""
    attributes = op_of(instruction)[2]
    if custom_call_target(attributes) in _BOOKKEEPING:
        return 0.0, 0.0
    figures = cost_estimate(attributes)
    if "flops" not in figures or "bytes_accessed" not in figures:
        return None
    return float(figures["flops"]), float(figures["bytes_accessed"])


def _costed(module: Module, computation: Computation, instruction: Instruction) -> tuple[float, float, float]:
    """FLOPs, bytes accessed and those in device memory of one run of `instruction`, by XLA's
    HLO cost analysis of the instruction alone (each operand's bytes as it reads them: a
    slice of a stacked array, not the whole); the shapes' bytes where that fails or gives
    no figure (-1: a custom call, which XLA cannot see into); a custom call's own figures
    where it carries them (`_figures`). Never negative."""
    opcode, operands, _ = op_of(instruction)
    named = computation.named
    in_device = [all(d for _, _, d in arrays(_shape(named[o]))) if o in named else True for o in operands]
    outputs = [d for _, _, d in arrays(_shape(instruction))]
    out_device = all(outputs)
    figures = _figures(instruction) if opcode == "custom-call" else None
    if figures is not None:
        return figures[0], figures[1], figures[1]
    alone = opcode not in _ASYNC_COPIES | _COLLECTIVES | {"custom-call"}
    text = module.alone(computation, instruction) if alone else None
    analysis = _compat.hlo_text_cost_analysis(text) if text is not None else {}
    if "bytes accessed" not in analysis or any(v < 0 for k, v in analysis.items() if k.startswith(("flops", "bytes"))):
        sizes = [shape_bytes(named.get(o)) for o in operands]
        out = shape_bytes(instruction)
        if opcode in _ASYNC_COPIES | _COLLECTIVES:  # the output holds the operand again, and a context
            return 0.0, float(sum(sizes)), float(sum(sizes))
        held = sum(s for s, d in zip(sizes, in_device, strict=True) if d) + (out if out_device else 0)
        return 0.0, float(sum(sizes) + out), float(held)
    read = sum(float(analysis.get(f"bytes accessed{i}{{}}", 0.0)) for i, d in enumerate(in_device) if d)
    if f"bytes accessedout{{{0}}}" in analysis:  # a tuple: each element in its own memory
        written = sum(float(analysis.get(f"bytes accessedout{{{i}}}", 0.0)) for i, d in enumerate(outputs) if d)
    else:
        written = float(analysis.get("bytes accessedout{}", 0.0)) if out_device else 0.0
    return float(analysis.get("flops", 0.0)), float(analysis["bytes accessed"]), read + written


_COLLECTIVE_OPS: Final = frozenset(op for op in _COLLECTIVES if not op.endswith("-start"))


def _held(module: Module, computation: Computation) -> tuple[Computation, Instruction] | None:
    """The first collective a called computation holds, a fusion inside it searched too."""
    for instruction in computation.instructions:
        inner, _, attributes = op_of(instruction)
        if inner.removesuffix("-start") in _COLLECTIVE_OPS:
            return computation, instruction
        called = fused(module, attributes) if inner == "fusion" else None
        if called is not None:
            found = _held(module, called)
            if found is not None:
                return found
    return None


def _communication(module: Module, computation: Computation, kernel: Instruction, everyone: int) -> Collective | None:
    """The collective a kernel runs, or runs a part of: itself, one that an asynchronous
    start wraps (XLA:GPU's), or one fused into it (libtpu's asynchronous collective fusions,
    and the products it overlaps with one); None where it runs none."""
    opcode, _, attributes = op_of(kernel)
    found: tuple[Computation, Instruction] | None = (computation, kernel)
    if opcode.removesuffix("-start") not in _COLLECTIVE_OPS:
        called = fused(module, attributes) if opcode in ("fusion", "async-start") else None
        if called is None:
            return None
        found = _held(module, called)
    if found is None:
        return None
    inside, instruction = found
    opcode, operands, attributes = op_of(instruction)
    op = opcode.removesuffix("-start")
    sizes = [shape_bytes(inside.named.get(o)) for o in operands]
    said = channel(attributes)
    name = f"channel {said}" if said is not None else kernel.name
    if op == "collective-permute":
        pairs = permute_pairs(attributes)
        moves = pairs is not None and any(a != b for a, b in pairs)
        return Collective(op, 2 if moves else 1, float(sizes[0] if sizes else 0), name)
    devices = group_size(attributes, everyone)
    if op == "all-gather":
        return Collective(op, devices, float(sum(sizes) * devices), name)
    if op == "all-reduce" and instruction is not kernel and shape_bytes(kernel) < shape_bytes(instruction):
        op = "reduce-scatter"  # (libtpu's: an all-reduce fused with the slice of each device's shard)
    return Collective(op, devices, float(sum(sizes)), name)


def _host_move(opcode: str, instruction: Instruction) -> tuple[str, float]:
    """The direction and the bytes of an asynchronous start that moves data between device
    and host memory (a `copy-start`: its result, then its operand; an `async-start` of a
    slice or an update: its operands, then its result), else `("", 0)`. The bytes are those
    on the device's side: the slice read from the host, the update written to it."""
    arrays = host_arrays(_shape(instruction))
    if len(arrays) < 2:
        return "", 0.0
    if opcode == "copy-start":
        result, operands = arrays[0], arrays[1:2]
    else:
        result, operands = arrays[-2], arrays[:-2]

    def nbytes(kind: str, dims: str) -> float:
        return float(math.prod(int(d) for d in dims.split(",") if d) * itemsize(kind))

    if result[2] and not all(o[2] for o in operands):
        return "device_to_host", sum(nbytes(k, d) for k, d, host in operands if not host and d)
    if not result[2] and any(o[2] for o in operands):
        return "host_to_device", nbytes(result[0], result[1])
    return "", 0.0


def read(
    text: str,
    lengths: Sequence[int] = (),
    pallas: Mapping[tuple[tuple[str, ...], tuple[str, ...]], Work] | None = None,
    *,
    tile: int | None,
    lanes: int | None,
) -> tuple[list[Kernel], bool] | None:
    """The kernels of the optimized module `text` in schedule order, and whether every loop's
    trip count was known (a loop whose count is not is counted once); None where the text
    cannot be read. `lengths`: the program's own loops' trip counts as it was traced (scans),
    for a top-level loop whose count the module does not tell (see `_hlo_loops.missed`).
    Each branch of a conditional is read, its kernels marked with it (`Kernel.branch`): one
    run takes one branch, and `_time` counts the most costly. `pallas`: the program's Pallas
    kernels' work by their types (`_pallas.kernels`), for the custom calls that run them.
    `tile` and `lanes`: the chip's matrix unit and vector register (`Chip.matrix_tile`,
    `Chip.lanes`), which a product's and a reduction's fill are counted in."""
    module = parse(text)
    if module is None:
        return None
    everyone = module.devices
    top = sum(1 for _ in module.computations[module.entry].loops())
    same = lengths[0] if len(set(lengths)) == 1 and top == len(lengths) else None
    kernels: list[Kernel] = []
    exact = True
    pending: dict[str, int] = {}  # an async start's name -> its kernel's index
    for step in _hlo_loops.walk(module, same=same):  # (a loop's body and a branch read where they run)
        computation, instruction, runs, branch = step.computation, step.instruction, step.runs, step.branch
        opcode, operands, attributes = op_of(instruction)
        if step.loop is not None:
            exact = exact and step.trips is not None
            continue
        if opcode in ("while", "call", "conditional"):
            continue
        if opcode.endswith("-done") and operands and operands[0] in pending:
            start = pending.pop(operands[0])
            kernels[start] = dataclasses.replace(kernels[start], done=len(kernels))
        if opcode in _FREE:
            continue
        cycles = estimated_cycles(attributes)
        traits = _kind(module, computation, instruction, tile, lanes)
        flops, accessed, device = _costed(module, computation, instruction)
        result = next(iter(arrays(_shape(instruction))), ("f32", 0, True))[0]
        work = None
        if opcode == "custom-call" and pallas:
            named = computation.named
            operand_types = [t for o in operands if o in named for t in types(_shape(named[o]))]
            work = pallas.get(signature(operand_types, types(_shape(instruction))))
        if work is not None and _figures(instruction) is None:  # (its own `cost_estimate` first)
            flops, accessed, device = work.flops, work.bytes_copied, work.bytes_copied
        communication = _communication(module, computation, instruction, everyone)
        host = _host_move(opcode, instruction) if opcode in _ASYNC_COPIES else ("", 0.0)
        if communication is not None and traits.kind not in ("matmul", "batched matmul", "convolution"):
            traits = dataclasses.replace(traits, kind="collective")  # (a product keeps its kind: it overlaps one)
        kernel = Kernel(
            name=instruction.name,
            opcode=opcode,
            kind=traits.kind,
            position=len(kernels),
            runs=runs,
            cycles=cycles,
            flops=flops,
            bytes_accessed=accessed,
            device_bytes=device,
            dtype=dtype_name(traits.dtype or result),
            devices=communication.devices if communication is not None else 1,
            in_loop=not step.at_top,
            fill=traits.fill,
            weight_gradient=traits.weight_gradient,
            products=traits.products,
            lanes=traits.lanes,
            indices=traits.indices,
            slice_bytes=traits.slice_bytes,
            table_bytes=traits.table_bytes,
            precision=traits.precision,
            staged=traits.staged,
            row_tiles=traits.row_tiles,
            table_in_vmem=traits.in_vmem,
            strided=traits.strided,
            strided_bytes=traits.strided_bytes,
            lane_tiles=traits.lane_tiles,
            results=sum(1 for _ in arrays(_shape(instruction))),
            collective=communication,
            branch=branch,
            by_bytes=opcode == "custom-call" and work is None and accessed > 0 and _figures(instruction) is None,
            grid_steps=work.steps if work is not None else 0,
            host=host[0],
            host_bytes=host[1],
        )
        if opcode.endswith("-start"):
            pending[instruction.name] = len(kernels)
        kernels.append(kernel)
    return kernels, exact
