"""XLA's HLO module as treeshape reads it, from the bytes XLA returns with a compiled
program: a reader of protobuf wire format (`fields`, `ints`, `int_field`, ...), and the
optimized, scheduled module (`Module`: its instructions with their shapes, operands and
called computations, each computation's root, parameters and name, a `while`'s body and
condition, the schedule, the input/output aliases and the stack frames), decoded with the
field numbers that
`Fields` pins. No Python module ships to decode these messages.
"""

import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import Any, Final


# -- XLA's field numbers ---------------------------------------------------------------
# `memory_analysis()` carries XLA's buffer assignment as a serialized
# `xla.BufferAssignmentProto` (`serialized_buffer_assignment_proto`, on every supported
# release), and `Compiled.runtime_executable().hlo_modules()` the optimized, scheduled module
# as a serialized `xla.HloModuleProto`. No Python module ships to decode either; `_buffers`
# reads their wire format with the field numbers of xla/service/hlo.proto and
# xla/xla_data.proto below (proto3 field numbers never change meaning; new fields are added).
class Fields:
    """Protobuf field numbers of the XLA messages `_buffers` reads."""

    # BufferAssignmentProto
    LOGICAL_BUFFERS: Final = 1
    BUFFER_ALLOCATIONS: Final = 3
    # LogicalBufferProto (and its Location)
    BUFFER_ID: Final = 1
    BUFFER_SIZE: Final = 2
    BUFFER_DEFINED_AT: Final = 3
    LOCATION_SHAPE_INDEX: Final = 3
    LOCATION_INSTRUCTION_ID: Final = 4
    # BufferAllocationProto (and its Assigned)
    ALLOCATION_INDEX: Final = 1
    ALLOCATION_SIZE: Final = 2
    ALLOCATION_THREAD_LOCAL: Final = 3
    ALLOCATION_ENTRY_PARAMETER: Final = 5
    ALLOCATION_COLOR: Final = 8
    ALLOCATION_ASSIGNED: Final = 9
    ALLOCATION_CONSTANT: Final = 12
    ASSIGNED_BUFFER_ID: Final = 1
    ASSIGNED_OFFSET: Final = 2
    ASSIGNED_SIZE: Final = 3
    # HloModuleProto
    MODULE_COMPUTATIONS: Final = 3
    MODULE_ENTRY_ID: Final = 6
    MODULE_SCHEDULE: Final = 7
    MODULE_ALIASES: Final = 8
    MODULE_STACK_FRAMES: Final = 17
    # HloScheduleProto: map<int64, InstructionSequence> sequences = 1 (entries: key 1, value 2)
    SCHEDULE_SEQUENCES: Final = 1
    SEQUENCE_INSTRUCTION_IDS: Final = 1
    # HloInputOutputAliasProto.entries = 1: AliasEntryProto
    ALIAS_ENTRIES: Final = 1
    ALIAS_OUTPUT_INDEX: Final = 1
    ALIAS_PARAMETER: Final = 2
    # HloComputationProto
    COMPUTATION_NAME: Final = 1
    COMPUTATION_INSTRUCTIONS: Final = 2
    COMPUTATION_ID: Final = 5
    COMPUTATION_ROOT_ID: Final = 6
    # HloInstructionProto
    INSTRUCTION_NAME: Final = 1
    INSTRUCTION_OPCODE: Final = 2
    INSTRUCTION_SHAPE: Final = 3
    INSTRUCTION_METADATA: Final = 7
    INSTRUCTION_PARAMETER_NUMBER: Final = 9
    INSTRUCTION_TUPLE_INDEX: Final = 13
    INSTRUCTION_ID: Final = 35
    INSTRUCTION_OPERANDS: Final = 36
    INSTRUCTION_CALLED: Final = 38
    # ShapeProto
    SHAPE_ELEMENT_TYPE: Final = 2
    SHAPE_DIMENSIONS: Final = 3
    SHAPE_TUPLE_SHAPES: Final = 4
    # OpMetadata: `source_file` / `source_line` up to jax 0.8.x, `stack_frame_id` (an index into
    # the module's StackFrameIndexProto) from jax 0.9
    METADATA_OP_NAME: Final = 2
    METADATA_SOURCE_FILE: Final = 3
    METADATA_SOURCE_LINE: Final = 4
    METADATA_STACK_FRAME: Final = 15
    # StackFrameIndexProto (ids 1-based; 0 is "none")
    FRAMES_FILE_NAMES: Final = 1
    FRAMES_LOCATIONS: Final = 3
    FRAMES_FRAMES: Final = 4
    LOCATION_FILE: Final = 1
    LOCATION_LINE: Final = 3
    FRAME_LOCATION: Final = 1
    FRAME_PARENT: Final = 2


# xla.PrimitiveType (xla_data.proto) -> the dtype JAX names it by; types without one stay XLA's name.
PRIMITIVE_TYPES: Final = {
    1: "bool", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "uint8", 7: "uint16", 8: "uint32",
    9: "uint64", 10: "float16", 11: "float32", 12: "float64", 13: "tuple", 14: "opaque", 15: "complex64",
    16: "bfloat16", 17: "token", 18: "complex128", 19: "float8_e5m2", 20: "float8_e4m3fn", 21: "int4",
    22: "uint4", 23: "float8_e4m3b11fnuz", 24: "float8_e5m2fnuz", 25: "float8_e4m3fnuz", 26: "int2",
    27: "uint2", 28: "float8_e4m3", 29: "float8_e3m4", 30: "float4_e2m1fn", 31: "float8_e8m0fnu",
}  # fmt: skip


F = Fields  # (short: the readers below name many fields)


# -- protobuf wire format ---------------------------------------------------------------
Message = dict[int, list[Any]]  # field number -> values (ints, or memoryviews of nested bytes)


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(data: bytes | memoryview) -> Message:
    """One message's fields: varints and fixed-width values as ints, length-delimited ones
    (strings, nested messages, packed numbers) as memoryviews, each list in wire order."""
    view = data if isinstance(data, memoryview) else memoryview(data)
    out: Message = {}
    i, end = 0, len(view)
    while i < end:
        key = view[i]  # one byte for field numbers below 16, the common case
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(view, i)
        wire = key & 7
        value: Any
        if wire == 0:
            value = view[i]
            if value < 0x80:
                i += 1
            else:
                value, i = _varint(view, i)
        elif wire == 2:
            n = view[i]
            if n < 0x80:
                i += 1
            else:
                n, i = _varint(view, i)
            value, i = view[i : i + n], i + n
        elif wire == 1:
            value, i = int.from_bytes(view[i : i + 8], "little"), i + 8
        elif wire == 5:
            value, i = int.from_bytes(view[i : i + 4], "little"), i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {i}")
        field = key >> 3
        if field in out:
            out[field].append(value)
        else:
            out[field] = [value]
    return out


def ints(message: Message, field: int) -> list[int]:
    """A repeated integer field, packed or not (int64s as two's complement)."""
    out: list[int] = []
    for value in message.get(field, ()):
        if isinstance(value, int):
            out.append(value)
            continue
        i = 0
        while i < len(value):
            n, i = _varint(value, i)
            out.append(n)
    return [n - (1 << 64) if n >= 1 << 63 else n for n in out]


def int_field(message: Message, field: int, default: int = 0) -> int:
    values = message.get(field)
    if not values:
        return default
    n = values[-1]
    return int(n - (1 << 64) if n >= 1 << 63 else n)


def str_field(message: Message, field: int) -> str:
    values = message.get(field)
    return bytes(values[-1]).decode("utf-8", "replace") if values else ""


def message_field(message: Message, field: int) -> Message:
    values = message.get(field)
    return fields(values[-1]) if values else {}


# -- the module -------------------------------------------------------------------------
Index = tuple[int, ...]


@dataclasses.dataclass
class Shape:
    dtype: str
    dims: tuple[int, ...]
    tuple_shapes: "list[Shape]"

    @staticmethod
    def read(message: Message) -> "Shape":
        kind = int_field(message, F.SHAPE_ELEMENT_TYPE)
        dtype = PRIMITIVE_TYPES.get(kind, f"xla type {kind}")
        subs = [Shape.read(fields(s)) for s in message.get(F.SHAPE_TUPLE_SHAPES, ())]
        return Shape(dtype, tuple(ints(message, F.SHAPE_DIMENSIONS)), subs)

    def at(self, index: Index) -> "Shape":
        shape = self
        for i in index:
            shape = shape.tuple_shapes[i]
        return shape

    def indices(self, prefix: Index = ()) -> Iterator[Index]:
        yield prefix
        for i, sub in enumerate(self.tuple_shapes):
            yield from sub.indices((*prefix, i))


@dataclasses.dataclass
class Instruction:
    id: int
    name: str
    opcode: str
    shape: Shape
    operands: list[int]
    called: list[int]
    parameter: int
    tuple_index: int
    raw_metadata: memoryview | None
    computation: int = 0

    @property
    def metadata(self) -> Message:
        return {} if self.raw_metadata is None else fields(self.raw_metadata)


def _instruction(data: memoryview) -> Instruction:
    m = fields(data)
    return Instruction(
        id=int_field(m, F.INSTRUCTION_ID),
        name=str_field(m, F.INSTRUCTION_NAME),
        opcode=str_field(m, F.INSTRUCTION_OPCODE),
        shape=Shape.read(message_field(m, F.INSTRUCTION_SHAPE)),
        operands=ints(m, F.INSTRUCTION_OPERANDS),
        called=ints(m, F.INSTRUCTION_CALLED),
        parameter=int_field(m, F.INSTRUCTION_PARAMETER_NUMBER),
        tuple_index=int_field(m, F.INSTRUCTION_TUPLE_INDEX),
        raw_metadata=m[F.INSTRUCTION_METADATA][-1] if F.INSTRUCTION_METADATA in m else None,
    )


@dataclasses.dataclass
class Module:
    instructions: dict[int, Instruction]
    roots: dict[int, int]  # computation -> root instruction
    parameters: dict[int, dict[int, int]]  # computation -> parameter number -> instruction
    sequences: dict[int, list[int]]  # scheduled computation -> instruction ids in order
    entry: int
    aliases: list[tuple[Index, int]]  # (output index, parameter number)
    frames: Message
    names: dict[int, str] = dataclasses.field(default_factory=dict)  # computation -> its name, as the text names it

    def loop(self, ins: Instruction) -> tuple[int, int]:
        """A `while`'s body and condition (the text's `body=` and `condition=`, which the
        message does not label): the condition is the one whose root is a `pred[]`."""
        a, b = ins.called[0], ins.called[1]
        root = self.instructions.get(self.roots.get(a, -1))
        if root is not None and root.shape.dtype == "bool" and not root.shape.dims and not root.shape.tuple_shapes:
            return b, a
        return a, b

    @staticmethod
    def read(data: bytes) -> "Module":
        m = fields(data)
        sequences = {}
        for entry in message_field(m, F.MODULE_SCHEDULE).get(F.SCHEDULE_SEQUENCES, ()):
            em = fields(entry)
            sequences[int_field(em, 1)] = ints(message_field(em, 2), F.SEQUENCE_INSTRUCTION_IDS)
        instructions: dict[int, Instruction] = {}
        roots: dict[int, int] = {}
        parameters: dict[int, dict[int, int]] = {}
        names: dict[int, str] = {}
        for c in m.get(F.MODULE_COMPUTATIONS, ()):
            cm = fields(c)
            cid = int_field(cm, F.COMPUTATION_ID)
            names[cid] = str_field(cm, F.COMPUTATION_NAME)
            roots[cid] = int_field(cm, F.COMPUTATION_ROOT_ID)
            params = parameters[cid] = {}
            if cid not in sequences:  # fusions, reductions' regions: no live ranges of their own
                continue
            for raw in cm.get(F.COMPUTATION_INSTRUCTIONS, ()):
                ins = _instruction(raw)
                ins.computation = cid
                instructions[ins.id] = ins
                if ins.opcode == "parameter":
                    params[ins.parameter] = ins.id
        aliases = []
        for a in message_field(m, F.MODULE_ALIASES).get(F.ALIAS_ENTRIES, ()):
            am = fields(a)
            aliases.append((tuple(ints(am, F.ALIAS_OUTPUT_INDEX)), int_field(am, F.ALIAS_PARAMETER)))
        return Module(
            instructions, roots, parameters, sequences, int_field(m, F.MODULE_ENTRY_ID), aliases,
            message_field(m, F.MODULE_STACK_FRAMES), names,
        )  # fmt: skip


# Packages whose frames are not the user's code: the op is told by the user's line that led to it.
_LIBRARIES: Final = ("jax", "jaxlib", "flax", "equinox", "optax", "chex", "treeshape")


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in _LIBRARIES:
        file = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(file, str):
            dirs.append(os.path.dirname(file) + os.sep)
    return tuple(dirs)


class Frames:
    """Source locations of instructions: the module's stack frame index (jax 0.9 and newer)
    or the metadata's own file and line (before)."""

    def __init__(self, module: Module) -> None:
        frames = module.frames
        self._files = [bytes(f).decode("utf-8", "replace") for f in frames.get(F.FRAMES_FILE_NAMES, ())]
        self._locations = frames.get(F.FRAMES_LOCATIONS, [])
        self._frames = frames.get(F.FRAMES_FRAMES, [])
        self._libraries = _library_dirs()

    def _user(self, file: str) -> bool:
        return bool(file) and not file.startswith(self._libraries)

    def source(self, metadata: Message) -> str | None:
        frame = int_field(metadata, F.METADATA_STACK_FRAME)
        seen = set()
        while 0 < frame <= len(self._frames) and frame not in seen:
            seen.add(frame)
            fm = fields(self._frames[frame - 1])
            location = int_field(fm, F.FRAME_LOCATION)
            if 0 < location <= len(self._locations):
                lm = fields(self._locations[location - 1])
                file_id = int_field(lm, F.LOCATION_FILE)
                file = self._files[file_id - 1] if 0 < file_id <= len(self._files) else ""
                if self._user(file):
                    return f"{os.path.basename(file)}:{int_field(lm, F.LOCATION_LINE)}"
            frame = int_field(fm, F.FRAME_PARENT)
        file = str_field(metadata, F.METADATA_SOURCE_FILE)
        if self._user(file):
            return f"{os.path.basename(file)}:{int_field(metadata, F.METADATA_SOURCE_LINE)}"
        return None
