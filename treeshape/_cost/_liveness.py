"""The live ranges of a compiled program's values over its schedule, for `_buffers` and
`_timeline`: XLA's own `HloLiveRange` rules over the optimized, scheduled module (`live_ranges`),
or the compiler's own ranges where it dumps them (`dumped_live_ranges`: libtpu schedules work
the module does not show).

Live ranges follow XLA's `HloLiveRange` on the flattened schedule (a `while`'s condition and
body, a `call`'s or `conditional`'s computations, placed before the instruction): a value
lives from its defining instruction (a computation's parameters from the start of that
computation) to its last use or position (a computation's root: to the end of that
computation; a while's operand: until its loop starts; a loop condition's parameter: until
its body starts; a get-tuple-element uses a tuple's table only, a tuple none of its operands);
an entry parameter that no output reuses lives to the end. `tests/test_buffers.py` and
`tests/test_timeline.py` check these live ranges against those XLA writes with
`--xla_dump_to`, at every step.
"""

import dataclasses
import re
from typing import Final

from ._hlo import Index, Instruction, Module


@dataclasses.dataclass
class Value:
    """One logical buffer of the assignment: its defining instruction and shape index, its
    place (allocation, offset, size), and its live range on the flattened schedule (both
    ends inclusive; -1 where it is not live)."""

    id: int
    size: int
    instruction: int
    index: Index
    allocation: int = -1
    offset: int = 0
    start: int = -1
    end: int = -1


_FLATTENED: Final = frozenset({"call", "conditional"})
# As XLA's dataflow analysis: these read only the top-level (table) buffer of a tuple operand,
# and these use no operand value (they pass them through).
_TOP_LEVEL: Final = frozenset({"get-tuple-element", "copy"})
_PASS_THROUGH: Final = frozenset({"tuple", "domain"})


def _flatten(module: Module) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """The flattened schedule (instruction ids) and each computation's span in it, as
    XLA's `HloLiveRange` flattens it."""
    order: list[int] = []
    spans: dict[int, tuple[int, int]] = {}

    def visit(computation: int) -> None:
        if computation in spans or computation not in module.sequences:
            return
        start = len(order)
        spans[computation] = (start, start)  # guards against cycles
        for iid in module.sequences[computation]:
            ins = module.instructions.get(iid)
            if ins is None:
                continue
            if ins.opcode in _FLATTENED:
                for c in ins.called:
                    visit(c)
            elif ins.opcode == "while":
                body, condition = module.loop(ins)
                visit(condition)
                visit(body)
            order.append(iid)
        spans[computation] = (start, len(order))

    visit(module.entry)
    return order, spans


def _callers(module: Module, order: list[int]) -> dict[int, Instruction]:
    """The instruction that calls each flattened computation (a while's body and condition,
    a call's or a conditional's computations)."""
    callers: dict[int, Instruction] = {}
    for iid in order:
        ins = module.instructions[iid]
        if ins.opcode in _FLATTENED or ins.opcode == "while":
            for c in ins.called:
                callers.setdefault(c, ins)
    return callers


def _value_sets(
    module: Module, order: list[int], defined: dict[tuple[int, Index], int]
) -> dict[int, dict[Index, set[int]]]:
    """Which values each scheduled instruction holds at each shape index: its own where it
    defines one, else what flows into it (tuples, get-tuple-element, bitcasts, loops, calls)."""
    sets: dict[int, dict[Index, set[int]]] = {}
    callers = _callers(module, order)
    empty: set[int] = set()

    def at(iid: int, index: Index) -> set[int]:
        return sets.get(iid, {}).get(index, empty)

    def inflow(ins: Instruction, index: Index) -> set[int]:
        op = ins.opcode
        if op == "parameter":
            caller = callers.get(ins.computation)
            if caller is None:
                return empty
            if caller.opcode == "while":
                return at(caller.operands[0], index) if caller.operands else empty
            if caller.opcode == "conditional":
                branch = caller.called.index(ins.computation)
                return at(caller.operands[branch + 1], index) if branch + 1 < len(caller.operands) else empty
            return at(caller.operands[ins.parameter], index) if ins.parameter < len(caller.operands) else empty
        if op == "get-tuple-element":
            return at(ins.operands[0], (ins.tuple_index, *index))
        if op == "tuple":
            return at(ins.operands[index[0]], index[1:]) if index else empty
        if op == "while":  # what the body returns (its parameter holds what comes in)
            body, _ = module.loop(ins)
            return at(module.roots.get(body, -1), index)
        if op in _FLATTENED:
            return set().union(*(at(module.roots.get(c, -1), index) for c in ins.called))
        return at(ins.operands[0], index) if ins.operands else empty

    for iid in order:
        ins = module.instructions[iid]
        held: dict[Index, set[int]] = {}
        for index in ins.shape.indices():
            value = defined.get((iid, index))
            held[index] = {value} if value is not None else set(inflow(ins, index))
        sets[iid] = held
    return sets


def live_ranges(module: Module, values: dict[int, Value]) -> tuple[list[int], dict[int, dict[Index, set[int]]]]:
    """Set each value's live range (start, end) on the flattened schedule, as XLA's
    `HloLiveRange` does; return that schedule (its end time is its length) and the values
    each instruction holds."""
    order, spans = _flatten(module)
    time = {iid: t for t, iid in enumerate(order)}
    defined = {(v.instruction, v.index): v.id for v in values.values()}
    sets = _value_sets(module, order, defined)
    end_time = len(order)
    aliased = {p for _, p in module.aliases}
    body_of = {}  # a while's condition -> its body
    for ins in map(module.instructions.__getitem__, order):
        if ins.opcode == "while":
            body, condition = module.loop(ins)
            if body in spans:
                body_of[condition] = body
    root_of = {root: c for c, root in module.roots.items()}
    for v in values.values():
        t = time.get(v.instruction)
        if t is None:
            continue
        ins = module.instructions[v.instruction]
        v.start = spans[ins.computation][0] if ins.opcode == "parameter" else t
        v.end = t
        if ins.opcode == "parameter" and ins.computation == module.entry and ins.parameter not in aliased:
            v.end = end_time
        elif ins.opcode == "parameter" and ins.computation in body_of:  # XLA keeps a loop condition's
            v.end = max(v.end, spans[body_of[ins.computation]][0])  # parameter until its body starts
    for iid in order:
        t = time[iid]
        ins = module.instructions[iid]
        computation = root_of.get(iid)
        position_time = spans[computation][1] if computation in spans else t
        for held in sets[iid].values():
            for vid in held:
                v = values[vid]
                if v.start >= 0 and position_time > v.end:
                    v.end = position_time
        if ins.opcode == "call" and all(c in spans for c in ins.called):
            continue  # its uses are those of the called computation's instructions
        if ins.opcode in _PASS_THROUGH:
            continue  # a tuple holds its operands' values (a position), it uses none
        use_time = t
        if ins.opcode == "while":  # a while's operand is used until its loop starts
            use_time = min((spans[c][0] for c in ins.called if c in spans), default=t)
        for operand in ins.operands:
            for index, held in sets.get(operand, {}).items():
                if index and ins.opcode in _TOP_LEVEL:
                    continue  # it reads the tuple's table only: the elements it holds are positions
                for vid in held:
                    v = values[vid]
                    if v.start >= 0 and use_time > v.end:
                        v.end = use_time
    return order, sets


_SEQUENCE_STEP: Final = re.compile(r"^    (\d+):(\S+)$")
_VALUE_RANGE: Final = re.compile(r"^    (\S+)\{([\d,]*)\}:(\d+)-(\d+)$")


def dumped_live_ranges(
    module: Module, values: dict[int, Value], text: str
) -> tuple[list[int], dict[int, dict[Index, set[int]]]]:
    """Set each value's live range from the compiler's own dump (its `HloLiveRange`: the
    instruction sequence, then each value's `name{index}:start-end`); return that sequence
    as instruction ids (-1 for a name the module does not hold) and the values each
    instruction holds, as `live_ranges` does. A value the dump does not list is not live."""
    ids = {ins.name: ins.id for ins in module.instructions.values()}
    by_position = {(v.instruction, v.index): v for v in values.values()}
    sets = _value_sets(module, _flatten(module)[0], {position: v.id for position, v in by_position.items()})
    for v in values.values():
        v.start = v.end = -1
    order: list[int] = []
    section = ""
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("    "):
            section = line.strip()
        elif section == "InstructionSequence:" and (step := _SEQUENCE_STEP.match(line)):
            order.append(ids.get(step.group(2), -1))
        elif section == "BufferLiveRange:" and (found := _VALUE_RANGE.match(line)):
            index = tuple(int(i) for i in found.group(2).split(",") if i)
            held = by_position.get((ids.get(found.group(1), -1), index))
            if held is not None:
                held.start, held.end = int(found.group(3)), int(found.group(4))
    if not order:
        raise ValueError("the dumped live ranges hold no instruction sequence")
    return order, sets
