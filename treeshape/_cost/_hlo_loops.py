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

XLA's analysis counts a conditional as its most costly branch (each figure's), a loop in
it once: what it misses there is the most costly branch with its loops counted, less that
(never the loops of every branch).

The one walk through a module's loops and calls is here too (`walk`: each instruction in
schedule order with how often it runs), which `_kernels` reads each kernel on.

Nothing is compiled: parsing and analysing a body takes milliseconds.
"""

import dataclasses
import math
import operator
import re
import typing
from collections.abc import Iterator, Sequence
from typing import Final

from ._hlo_text import (
    GET,
    Computation,
    Instruction,
    Loop,
    Module,
    branches,
    constant,
    cost as text_cost,
    element,
    elements,
    loop_of,
    op_of,
    parse,
    shape_end,
    source_of,
)


def counted(module: Module, parent: Computation, loop: Loop) -> int | None:
    """How often a `while` whose trip count XLA did not record runs, where its condition
    compares a counter element with a constant and its body steps that element by a
    constant (as a scan's loop is lowered), read from its condition, body and start."""
    if loop.condition is None:
        return None
    cond, step = module.computations.get(loop.condition), module.computations.get(loop.body)
    if cond is None or step is None:
        return None
    test = next((i for i in cond.instructions if i.root), None)
    direction = re.search(r"direction=(LT|LE|GT|GE|NE)\b", test.text) if test is not None else None
    if test is None or direction is None or op_of(test)[0] != "compare" or len(op_of(test)[1]) != 2:
        return None
    left, right = op_of(test)[1]
    op = direction.group(1).lower()
    if element(cond, left) is None:
        left, right, op = right, left, FLIPPED[op]
    counter, end = element(cond, left), constant(cond, right)
    root = next((i for i in step.instructions if i.root), None)
    if counter is None or end is None or root is None or op_of(root)[0] != "tuple":
        return None
    update = source_of(step, op_of(root)[1][counter])
    if update is None or op_of(update)[0] not in ("add", "subtract") or len(op_of(update)[1]) != 2:
        return None
    a, b = op_of(update)[1]
    by = constant(step, b) if element(step, a) == counter else None
    if by is None and op_of(update)[0] == "add" and element(step, b) == counter:
        by = constant(step, a)
    if by is None:
        return None
    start = op_of(loop.instruction)[1]
    init = source_of(parent, start[0]) if len(start) == 1 else None
    if init is None or op_of(init)[0] != "tuple" or counter >= len(op_of(init)[1]):
        return None
    first = constant(parent, op_of(init)[1][counter])
    if first is None:
        return None
    return runs(first, by if op_of(update)[0] == "add" else -by, end, op)


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


def _unread(computation: Computation, loop: Instruction) -> set[int] | None:
    """The results of `loop` that nothing in `computation` reads (None: all may be read)."""
    if loop.root:
        return None
    read: set[int] = set()
    for instruction in computation.instructions:
        if instruction is loop or f"%{loop.name}" not in instruction.text:
            continue
        got = GET.search(instruction.text)
        if got is None or got.group(1) != loop.name or instruction.text.count(f"%{loop.name}") != 1:
            return None  # the whole tuple is used
        read.add(int(got.group(2)))
    shape = loop.text[: shape_end(loop.text)]
    return set(range(len(elements(shape)))) - read if shape.startswith("(") else None


def _without_results(body: Computation, unread: set[int]) -> Computation | None:
    """`body` with each result in `unread` passed through from its input unchanged and what
    only it needed removed: the body's last run as an unrolled program runs it."""
    root = next((i for i in body.instructions if i.root), None)
    parameter = next((i for i in body.instructions if " parameter(0)" in i.text), None)
    if root is None or parameter is None:
        return None
    end = shape_end(root.text)
    shape, rest = root.text[:end], root.text[end:]
    if not rest.startswith(" tuple(") or not shape.startswith("("):
        return None
    close = rest.index(")")
    operands = [o.strip() for o in rest[len(" tuple(") : close].split(",")]
    parts = elements(shape)
    if len(operands) != len(parts):
        return None
    added = []
    for k in sorted(unread):
        name = f"unread.result.{k}"
        added.append(Instruction(name, f"{parts[k]} get-tuple-element(%{parameter.name}), index={k}", False))
        operands[k] = f"%{name}"
    new_root = Instruction(root.name, f"{shape} tuple({', '.join(operands)}){rest[close + 1 :]}", True)
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


@dataclasses.dataclass(frozen=True)
class Step:
    """One instruction as a run of a module reaches it (`walk`)."""

    computation: Computation  # that holds it
    instruction: Instruction
    runs: int  # how often it runs in one run of the walk's start (a loop's body as often as the loop)
    at_top: bool  # outside every loop's body and condition (as the walk's start is, where it says so)
    branch: tuple[tuple[int, int], ...]  # (conditional, branch) of each conditional holding it, in walk order
    counted: bool  # every loop around it has a trip count (else each was walked as if it ran once)
    condition: bool  # in a loop's condition
    loop: Loop | None  # the loop it runs, for a `while`
    trips: int | None  # that loop's trip count: known, counted (`counted`), or the walk's `same` at the top


def walk(module: Module, start: str | None = None, same: int | None = None, at_top: bool = True) -> Iterator[Step]:
    """Each instruction that one run of `start` (the module's entry) runs, in schedule order,
    with how often it runs: the body of a `while` as often as its trip count says (XLA's
    `known_trip_count`, else counted from its condition, body and start (`counted`), else, at
    the top, `same`: the program's own loops as traced), its condition once more, each
    walked where the loop runs (the body first), a loop inside them as often again; a
    loop whose count is not known as if once. A `call`'s computation and each branch of a
    `conditional` (numbered in walk order in `Step.branch`; one run takes one branch) are
    walked where they run too. The one walk through a module's loops and calls: `_kernels`
    reads each kernel on it, and `missed` each loop."""
    conditionals = 0
    # (computation, its next instruction, runs, at the top?, branches, counted?, in a condition?)
    stack: list[tuple[Computation, int, int, bool, tuple[tuple[int, int], ...], bool, bool]] = []

    def push(name: str | None, *context: typing.Any) -> None:
        if name is not None and name in module.computations:
            stack.append((module.computations[name], 0, *context))

    push(module.entry if start is None else start, 1, at_top, (), True, False)
    while stack:
        computation, i, runs, top, branch, known, condition = stack.pop()
        if i >= len(computation.instructions):
            continue
        stack.append((computation, i + 1, runs, top, branch, known, condition))
        instruction = computation.instructions[i]
        loop = loop_of(instruction)
        trips = None
        if loop is not None:
            trips = loop.known if loop.known is not None else counted(module, computation, loop)
            trips = same if trips is None and top else trips
        yield Step(computation, instruction, runs, top, branch, known, condition, loop, trips)
        if loop is not None:  # (pushed last: walked first, the condition after it)
            times, now = (trips, known) if trips is not None else (1, False)
            push(loop.condition, runs * (times + 1), False, branch, now, True)
            push(loop.body, runs * times, False, branch, now, False)
        elif instruction.parts[0] in ("call", "conditional"):
            names = branches(instruction)
            conditionals += instruction.parts[0] == "conditional"
            for index in reversed(range(len(names))):
                marked = branch + ((conditionals, index),) if instruction.parts[0] == "conditional" else branch
                push(names[index], runs, top, marked, known, condition)


def missed(text: str, lengths: Sequence[int] = ()) -> LoopsRead | None:
    """What XLA's cost analysis of the compiled program whose optimized HLO is `text` misses
    by counting each `while` body once (None where the text or a body cannot be read).

    `lengths` are the trip counts of the program's own loops as it was traced (scans, in
    any order): where they are all the same and the module holds as many loops at its own
    level, a loop of that level whose trip count the module does not tell runs that often
    (libtpu counts a 64-bit loop counter in two 32-bit halves)."""
    module = parse(text)
    if module is None:
        return None
    top = sum(1 for step in walk(module) if step.loop is not None and step.at_top)
    same = lengths[0] if len(set(lengths)) == 1 and top == len(lengths) else None
    read = _missed_from(module, module.entry, same, True)
    return None if read is None else LoopsRead(*read)


def _missed_from(module: Module, start: str, same: int | None, at_top: bool) -> tuple[float, float, bool] | None:
    """What XLA's analysis misses of the loops one run of `start` runs (`same` and `at_top`
    as `missed` reads the program's own level), and whether every trip count was known. XLA
    counts each conditional as its most costly branch (each figure's), with each loop in it
    once: what it misses is the most costly branch with its loops counted, less that."""
    flops = accessed = 0.0
    exact = True
    for step in walk(module, start, same, at_top):
        if step.branch or not step.counted or step.condition:  # (a branch's loops: with its conditional)
            continue
        if step.instruction.parts[0] == "conditional":
            names = branches(step.instruction)
            once = [cost for cost in (text_cost(module.text(b)) for b in names) if cost is not None]
            read = [r for r in (_missed_from(module, b, same, step.at_top) for b in names) if r is not None]
            if len(once) != len(names) or len(read) != len(names):
                return None
            full = [(o[0] + r[0], o[1] + r[1]) for o, r in zip(once, read, strict=True)]
            flops += step.runs * (max(f for f, _ in full) - max(f for f, _ in once))
            accessed += step.runs * (max(b for _, b in full) - max(b for _, b in once))
            exact = exact and all(r[2] for r in read)
        if step.loop is None:
            continue
        cost = text_cost(module.text(step.loop.body))
        if cost is None:
            return None
        if step.trips is None:
            exact = False
            continue
        flops += step.runs * (step.trips - 1) * cost[0]
        accessed += step.runs * (step.trips - 1) * cost[1]
        unread = _unread(step.computation, step.instruction) if step.at_top else None
        last = _without_results(module.computations[step.loop.body], unread) if unread else None
        if last is not None:
            cut = text_cost(module.text(step.loop.body, last))
            if cut is None:
                exact = False
            else:
                flops -= max(cost[0] - cut[0], 0.0)
                accessed -= max(cost[1] - cut[1], 0.0)
    return flops, accessed, exact
