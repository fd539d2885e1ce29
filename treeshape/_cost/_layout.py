"""What a TPU layout says about a kernel's access to its operands (the layout is the
optimized module's: `f32[1000000,32]{0,1:T(8,128)}` holds its rows along the lanes):

- `strided`: a slice that steps over its operand's minor dimension (each element of a
  vector register's lanes gathered) or over its second-minor one from HBM;
- `row_tiles`: a gather's or scatter's table laid out with the dimension it indexes minor,
  so that one of its rows is one lane of several tiles (libtpu lays a table of fewer than
  128 lanes out so, where padding its rows to 128 lanes would take more memory);
- `lane_tiles`: a dynamic-update-slice whose update fills a part of the lanes of every
  tile it writes (a KV cache `[b, s, h, k]` laid out `{1,3,2,0}`, its positions along the
  lanes: one position written is one lane of each of its tiles).

Read by `_kernels`. Nothing compiles.
"""

import math
import re
from typing import Final

from ._hlo_text import CALLS, Computation, Instruction, Module, op_of, shape_bytes


_SLICE: Final = re.compile(r"\bslice=\{((?:\[[\d:]+\],?\s*)*)\}")
_LAYOUT: Final = re.compile(r"\{([\d,]+)(?::|\})")
_DIMS: Final = re.compile(r"\[([\d,]*)\]")
_TILE: Final = re.compile(r":T\((\d+),\d+\)")
_LANES: Final = 128  # a vector register's lanes, a tile's minor extent
_INDEXED: Final = re.compile(r"\b(?:start_index_map|scatter_dims_to_operand_dims)=\{([\d,]*)\}")


def _shape(instruction: Instruction | None) -> str:
    return re.sub(r"/\*.*?\*/", "", instruction.shape) if instruction is not None else ""


def strided(computation: Computation, instruction: Instruction) -> tuple[str, float]:
    """Whether a slice steps over its operand's minor dimension (`"lanes"`: a TPU gathers
    each element of a vector register's lanes), else over its second-minor one
    (`"sublanes"`, from HBM), by its operand's layout; and the operand's bytes the slice
    spans (its result's times that stride). `("", 0)` for a slice with no stride there."""
    operands, attributes = op_of(instruction)[1:]
    found = _SLICE.search(attributes)
    shape = _shape(computation.named.get(operands[0]) if operands else None)
    layout = _LAYOUT.search(shape)
    if found is None or layout is None:
        return "", 0.0
    strides = [int(d.split(":")[2]) if d.count(":") == 2 else 1 for d in re.findall(r"\[([\d:]+)\]", found.group(1))]
    order = [int(d) for d in layout.group(1).split(",")]
    in_vmem = re.search(r"S\(\d+\)", shape) is not None
    for name, place in (("lanes", 0), ("sublanes", 1)):
        if place < len(order) and order[place] < len(strides) and strides[order[place]] > 1:
            if name == "sublanes" and in_vmem:  # (every other row of VMEM: at VMEM's pace)
                break
            return name, float(shape_bytes(instruction) * strides[order[place]])
    return "", 0.0


def strided_of(module: Module, computation: Computation) -> tuple[str, float]:
    """The most costly strided slice a fused computation holds (`strided`; one over lanes
    before one over sublanes), a fusion inside it searched too; the bytes they span summed."""
    kinds, spanned = set(), 0.0
    for instruction in computation.instructions:
        inner, _, attributes = op_of(instruction)
        found: tuple[str, float] = ("", 0.0)
        if inner == "slice":
            found = strided(computation, instruction)
        called = CALLS.search(attributes)
        if inner == "fusion" and called is not None and called.group(1) in module.computations:
            found = strided_of(module, module.computations[called.group(1)])
        if found[0]:
            kinds.add(found[0])
            spanned += found[1]
    return next((k for k in ("lanes", "sublanes") if k in kinds), ""), spanned


def row_tiles(computation: Computation, instruction: Instruction) -> tuple[int, bool]:
    """For a gather or scatter whose table (a gather's operand, a scatter's result) is laid
    out with a dimension it indexes minor: the tiles one row spans (its elements over the
    tile's rows: a 32-lane f32 row of `T(8,128)` spans 4), else 0; and whether the table is
    in VMEM (its layout's `S(1)`: libtpu prefetches a table that fits there)."""
    opcode, operands = op_of(instruction)[:2]
    table = computation.named.get(operands[0]) if opcode == "gather" and operands else instruction
    shape = _shape(table)
    layout, dims, tile = _LAYOUT.search(shape), _DIMS.search(shape), _TILE.search(shape)
    indexed = _INDEXED.search(instruction.text)
    in_vmem = re.search(r"S\(1\)", shape) is not None
    if layout is None or dims is None or tile is None or indexed is None:
        return 0, in_vmem
    order = [int(d) for d in layout.group(1).split(",")]
    sizes = [int(d) for d in dims.group(1).split(",") if d]
    by = {int(d) for d in indexed.group(1).split(",") if d}
    if not order or order[0] not in by:
        return 0, in_vmem
    row = math.prod(n for d, n in enumerate(sizes) if d not in by)
    return math.ceil(row / int(tile.group(1))), in_vmem


def lane_tiles(computation: Computation, instruction: Instruction) -> int:
    """For a dynamic-update-slice whose update spans fewer of its operand's minor dimension
    than a tile's lanes and than the operand has: the tiles the update writes a part of
    (each read and written whole), else 0."""
    operands = op_of(instruction)[1]
    update = computation.named.get(operands[1]) if len(operands) > 1 else None
    shape, written = _shape(instruction), _DIMS.search(_shape(update))
    layout, dims, tile = _LAYOUT.search(shape), _DIMS.search(shape), _TILE.search(shape)
    if layout is None or dims is None or tile is None or written is None:
        return 0
    order = [int(d) for d in layout.group(1).split(",")]
    sizes = [int(d) for d in dims.group(1).split(",") if d]
    parts = [int(d) for d in written.group(1).split(",") if d]
    if len(order) < 2 or len(parts) != len(sizes) or not parts[order[0]] < min(sizes[order[0]], _LANES):
        return 0
    rest = math.prod(n for d, n in enumerate(parts) if d not in order[:2])
    return rest * math.ceil(parts[order[1]] / int(tile.group(1)))
