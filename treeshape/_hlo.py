"""XLA's HLO module as treeshape reads it, from the bytes XLA returns with a compiled
program: a reader of protobuf wire format (`fields`, `ints`, `int_field`, ...), and the
optimized, scheduled module (`Module`: its instructions with their shapes, operands and
called computations, each computation's root and parameters, the schedule, the
input/output aliases and the stack frames), decoded with the field numbers that
`_compat.Fields` pins. No Python module ships to decode these messages.
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

from . import _compat
from ._compat import Fields as F


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
        dtype = _compat.PRIMITIVE_TYPES.get(kind, f"xla type {kind}")
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
        for c in m.get(F.MODULE_COMPUTATIONS, ()):
            cm = fields(c)
            cid = int_field(cm, F.COMPUTATION_ID)
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
            message_field(m, F.MODULE_STACK_FRAMES),
        )  # fmt: skip
