"""The loops of a compiled program, read from its optimized HLO text: what XLA's cost
analysis misses of them by counting each `while` body once.

A scan that XLA partitions across devices as it sees fit (`Auto` mesh axes) has a cost
per device only inside the program, and a program compiled for a far mesh (in a child
process) has its devices nowhere else, so their loops are read there: each `while` of the optimized
module whose trip count XLA knows (`known_trip_count`, which XLA's loop analysis records
on every backend treeshape compiles for) has its body costed alone, as a module of its
own with that body as its entry, by the same HLO cost analysis, and counted as often as
it runs (a loop inside it, as often as the loops around it run). A loop that XLA unrolls
itself keeps a body of several copies and a trip count divided as much, so it is still
counted right.

An unrolled program drops from a loop's last run what nothing reads after the loop (the
gradient of a train step's first input, carried out of the backward scan): that part of
the body, found by removing what only that result needs, is taken off once.

Nothing is compiled: parsing and analysing a body takes milliseconds.
"""

import dataclasses
import math
import operator
import re
from collections.abc import Iterator, Sequence
from typing import Final

from .. import _compat


_HEADER: Final = re.compile(r"^(ENTRY )?%([^\s(]+) \(.*\{$")
_INSTRUCTION: Final = re.compile(r"^\s*(ROOT )?%([^\s=]+) = (.*)$")
_CALLED: Final = re.compile(
    r"\b(calls|to_apply|body|condition|branch_computations|called_computations|"
    r"true_computation|false_computation)=(\{[^}]*\}|%[^\s,]+)"
)
_NAME: Final = re.compile(r"%([^\s,(){}]+)")
_TRIPS: Final = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_GET: Final = re.compile(r"get-tuple-element\(%([^\s,)]+)\), index=(\d+)")


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    text: str  # everything after `name = `
    root: bool

    def operands(self) -> Iterator[str]:
        """The names this instruction mentions outside its called computations (its operands
        and control predecessors, and names in metadata, which match no instruction)."""
        yield from _NAME.findall(_CALLED.sub("", self.text))


@dataclasses.dataclass(frozen=True)
class _Computation:
    name: str
    signature: str  # the line that opens it, without `ENTRY `
    instructions: tuple[_Instruction, ...]

    def called(self, loops: bool) -> Iterator[str]:
        """The computations it calls: `loops=False` leaves out loop bodies and conditions."""
        for instruction in self.instructions:
            for kind, names in _CALLED.findall(instruction.text):
                if loops or kind not in ("body", "condition"):
                    yield from _NAME.findall(names)

    def whiles(self) -> Iterator[tuple[_Instruction, str, int | None]]:
        """Its `while` instructions: each with its body and trip count (None: not known)."""
        for instruction in self.instructions:
            shape_end = _shape_end(instruction.text)
            if instruction.text[shape_end:].startswith(" while("):
                body = re.search(r"\bbody=%([^\s,]+)", instruction.text)
                trips = _TRIPS.search(instruction.text)
                if body is not None:
                    yield instruction, body.group(1), int(trips.group(1)) if trips else None


@dataclasses.dataclass(frozen=True)
class _Module:
    name: str
    computations: dict[str, _Computation]  # in the text's order (each after those it calls)
    entry: str

    def text(self, entry: str, replaced: _Computation | None = None) -> str:
        """A module of its own: `entry` (as `replaced`, where given) and what it calls."""
        keep, todo = set(), [entry]
        while todo:
            name = todo.pop()
            if name not in keep and name in self.computations:
                keep.add(name)
                todo += self.computations[name].called(loops=True)
        lines = [f"HloModule {self.name}", ""]
        for name, computation in self.computations.items():
            if name not in keep:
                continue
            if name == entry and replaced is not None:
                computation = replaced
            lines.append(("ENTRY " if name == entry else "") + computation.signature)
            for i in computation.instructions:
                lines.append(f"  {'ROOT ' if i.root else ''}%{i.name} = {i.text}")
            lines += ["}", ""]
        # Stack frames live in the module's header, which this module does not have.
        return re.sub(r",? stack_frame_id=\d+", "", "\n".join(lines))


def _parse(text: str) -> _Module | None:
    """The computations of an optimized module's text, or None where it is not as expected."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("HloModule "):
        return None
    name = lines[0].split()[1].rstrip(",")
    computations: dict[str, _Computation] = {}
    entry = None
    current: tuple[str, str, list[_Instruction]] | None = None
    for line in lines[1:]:
        if current is None:
            header = _HEADER.match(line)
            if header is not None:
                current = (header.group(2), line.removeprefix("ENTRY "), [])
                entry = header.group(2) if header.group(1) else entry
            continue
        if line == "}":
            computations[current[0]] = _Computation(current[0], current[1], tuple(current[2]))
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match is None:
            return None
        current[2].append(_Instruction(match.group(2), match.group(3), bool(match.group(1))))
    if entry is None or current is not None:
        return None
    return _Module(name, computations, entry)


def _outside_brackets(text: str, chars: str) -> Iterator[int]:
    """The positions in `text` of any of `chars` outside (), [] and {}."""
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in chars and depth == 0:
            yield i


def _shape_end(text: str) -> int:
    """Where an instruction's shape (`f32[8]{0}`, a tuple `(s32[], f32[8]{0})`) ends in `text`."""
    return next(_outside_brackets(text, " "), len(text))


def _elements(shape: str) -> list[str]:
    """The element shapes of a tuple shape `(s32[], /*index=1*/f32[8]{0})`."""
    inner = re.sub(r"/\*.*?\*/", "", shape)[1:-1]
    cuts = [-1, *_outside_brackets(inner, ","), len(inner)]
    return [inner[start + 1 : end].strip() for start, end in zip(cuts, cuts[1:], strict=False)]


def _op(instruction: _Instruction) -> tuple[str, list[str], str]:
    """An instruction's opcode, operand names and the attributes after them."""
    rest = instruction.text[_shape_end(instruction.text) :].lstrip()
    opcode, _, rest = rest.partition("(")
    depth, end = 1, len(rest)
    for i, c in enumerate(rest):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 0:
            end = i
            break
    return opcode, _NAME.findall(re.sub(r"/\*.*?\*/", "", rest[:end])), rest[end + 1 :]


def _source(computation: _Computation, name: str) -> _Instruction | None:
    """The instruction that computes `name`'s value, through copies and bitcasts."""
    named = {i.name: i for i in computation.instructions}
    for _ in range(16):
        instruction = named.get(name)
        if instruction is None:
            return None
        opcode, operands, _ = _op(instruction)
        if opcode not in ("copy", "bitcast", "convert") or len(operands) != 1:
            return instruction
        name = operands[0]
    return None


def _constant(computation: _Computation, name: str) -> int | None:
    instruction = _source(computation, name)
    if instruction is None:
        return None
    opcode, _, _ = _op(instruction)
    value = re.search(r" constant\((-?\d+)\)", instruction.text)
    return int(value.group(1)) if opcode == "constant" and value else None


def _element(computation: _Computation, name: str) -> int | None:
    """Which element of the computation's parameter `name` is, where it is one."""
    instruction = _source(computation, name)
    got = _GET.search(instruction.text) if instruction is not None else None
    parameter = next((i.name for i in computation.instructions if " parameter(0)" in i.text), None)
    return int(got.group(2)) if got is not None and got.group(1) == parameter else None


def _counted(module: _Module, parent: _Computation, loop: _Instruction) -> int | None:
    """How often a `while` whose trip count XLA did not record runs, where its condition
    compares a counter element with a constant and its body steps that element by a
    constant (as a scan's loop is lowered), read from its condition, body and start."""
    condition = re.search(r"\bcondition=%([^\s,]+)", loop.text)
    body = re.search(r"\bbody=%([^\s,]+)", loop.text)
    if condition is None or body is None:
        return None
    cond, step = module.computations.get(condition.group(1)), module.computations.get(body.group(1))
    if cond is None or step is None:
        return None
    test = next((i for i in cond.instructions if i.root), None)
    direction = re.search(r"direction=(LT|LE|GT|GE|NE)\b", test.text) if test is not None else None
    if test is None or direction is None or _op(test)[0] != "compare" or len(_op(test)[1]) != 2:
        return None
    left, right = _op(test)[1]
    op = direction.group(1).lower()
    if _element(cond, left) is None:
        left, right, op = right, left, FLIPPED[op]
    counter, end = _element(cond, left), _constant(cond, right)
    root = next((i for i in step.instructions if i.root), None)
    if counter is None or end is None or root is None or _op(root)[0] != "tuple":
        return None
    update = _source(step, _op(root)[1][counter])
    if update is None or _op(update)[0] not in ("add", "subtract") or len(_op(update)[1]) != 2:
        return None
    a, b = _op(update)[1]
    by = _constant(step, b) if _element(step, a) == counter else None
    if by is None and _op(update)[0] == "add" and _element(step, b) == counter:
        by = _constant(step, a)
    if by is None:
        return None
    start = _op(loop)[1]
    init = _source(parent, start[0]) if len(start) == 1 else None
    if init is None or _op(init)[0] != "tuple" or counter >= len(_op(init)[1]):
        return None
    first = _constant(parent, _op(init)[1][counter])
    if first is None:
        return None
    return runs(first, by if _op(update)[0] == "add" else -by, end, op)


FLIPPED: Final = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "ne": "ne"}


def runs(start: int, by: int, end: int, op: str) -> int | None:
    """How often `i = start; while i OP end: i += by` runs its body (None: forever)."""
    holds = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "ne": operator.ne}[op]
    if not holds(start, end):
        return 0
    if op == "ne":
        gap = end - start
        return gap // by if by and gap % by == 0 and gap // by > 0 else None
    towards = by > 0 if op in ("lt", "le") else by < 0
    if not towards:
        return None
    gap, by = abs(end - start), abs(by)
    return gap // by + 1 if op in ("le", "ge") else math.ceil(gap / by)


def _cost(text: str) -> tuple[float, float] | None:
    analysis = _compat.hlo_text_cost_analysis(text)
    flops, accessed = analysis.get("flops"), analysis.get("bytes accessed")
    if not isinstance(flops, (int, float)) or not isinstance(accessed, (int, float)):
        return None
    return float(flops), float(accessed)


def _unread(computation: _Computation, loop: _Instruction) -> set[int] | None:
    """The results of `loop` that nothing in `computation` reads (None: all may be read)."""
    if loop.root:
        return None
    read: set[int] = set()
    for instruction in computation.instructions:
        if instruction is loop or f"%{loop.name}" not in instruction.text:
            continue
        got = _GET.search(instruction.text)
        if got is None or got.group(1) != loop.name or instruction.text.count(f"%{loop.name}") != 1:
            return None  # the whole tuple is used
        read.add(int(got.group(2)))
    shape = loop.text[: _shape_end(loop.text)]
    return set(range(len(_elements(shape)))) - read if shape.startswith("(") else None


def _without_results(body: _Computation, unread: set[int]) -> _Computation | None:
    """`body` with each result in `unread` passed through from its input unchanged and what
    only it needed removed: the body's last run as an unrolled program runs it."""
    root = next((i for i in body.instructions if i.root), None)
    parameter = next((i for i in body.instructions if " parameter(0)" in i.text), None)
    if root is None or parameter is None:
        return None
    end = _shape_end(root.text)
    shape, rest = root.text[:end], root.text[end:]
    if not rest.startswith(" tuple(") or not shape.startswith("("):
        return None
    close = rest.index(")")
    operands = [o.strip() for o in rest[len(" tuple(") : close].split(",")]
    elements = _elements(shape)
    if len(operands) != len(elements):
        return None
    added = []
    for k in sorted(unread):
        name = f"unread.result.{k}"
        added.append(_Instruction(name, f"{elements[k]} get-tuple-element(%{parameter.name}), index={k}", False))
        operands[k] = f"%{name}"
    new_root = _Instruction(root.name, f"{shape} tuple({', '.join(operands)}){rest[close + 1 :]}", True)
    everything = {i.name: i for i in (*body.instructions, *added) if i is not root}
    everything[root.name] = new_root
    needed, todo = set(), [root.name]
    while todo:
        name = todo.pop()
        if name in needed or name not in everything:
            continue
        needed.add(name)
        todo += everything[name].operands()
    kept = [i for i in body.instructions if i is not root and (i.name in needed or " parameter(" in i.text)]
    return dataclasses.replace(body, instructions=(*kept, *added, new_root))


@dataclasses.dataclass(frozen=True)
class LoopsRead:
    """What XLA's analysis misses of a compiled program's loops, and whether every trip
    count was known (`exact`)."""

    flops: float
    bytes_accessed: float
    exact: bool


def _whiles(module: _Module, start: str) -> Iterator[tuple[_Computation, _Instruction, str, int | None]]:
    """The `while` loops that `start` runs, itself or through what it calls (not inside
    another loop's body): each with the computation holding it, its body and trip count."""
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        computation = module.computations[name]
        todo += computation.called(loops=False)
        for loop, body, trips in computation.whiles():
            yield computation, loop, body, trips if trips is not None else _counted(module, computation, loop)


def missed(text: str, lengths: Sequence[int] = ()) -> LoopsRead | None:
    """What XLA's cost analysis of the compiled program whose optimized HLO is `text` misses
    by counting each `while` body once (None where the text or a body cannot be read).

    `lengths` are the trip counts of the program's own loops as it was traced (scans, in
    any order): where they are all the same and the module holds as many loops at its own
    level, a loop of that level whose trip count the module does not tell runs that often
    (libtpu counts a 64-bit loop counter in two 32-bit halves)."""
    module = _parse(text)
    if module is None:
        return None
    flops = accessed = 0.0
    exact = True
    top = list(_whiles(module, module.entry))
    same = lengths[0] if len(set(lengths)) == 1 and len(top) == len(lengths) else None
    # (computation holding the loop, the loop, its body, trip count, how often it starts, at the top?)
    todo = [(*found, 1, True) for found in top]
    while todo:
        computation, loop, body, trips, runs, at_top = todo.pop()
        trips = same if trips is None and at_top else trips
        cost = _cost(module.text(body))
        if cost is None:
            return None
        if trips is None:
            exact = False
            continue
        flops += runs * (trips - 1) * cost[0]
        accessed += runs * (trips - 1) * cost[1]
        todo += [(*found, runs * trips, False) for found in _whiles(module, body)]
        unread = _unread(computation, loop) if at_top else None
        last = _without_results(module.computations[body], unread) if unread else None
        if last is not None:
            cut = _cost(module.text(body, last))
            if cut is None:
                exact = False
            else:
                flops -= max(cost[0] - cut[0], 0.0)
                accessed -= max(cost[1] - cut[1], 0.0)
    return LoopsRead(flops, accessed, exact)
