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

Nothing is compiled: parsing and analysing a body takes milliseconds.
"""

import dataclasses
import math
import operator
import re
from collections.abc import Iterator, Sequence
from typing import Final

from ._hlo_text import (
    GET,
    Computation,
    Instruction,
    Module,
    constant,
    cost as text_cost,
    element,
    elements,
    op_of,
    parse,
    shape_end,
    source_of,
)


def counted(module: Module, parent: Computation, loop: Instruction) -> int | None:
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
    start = op_of(loop)[1]
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


_BRANCHES: Final = re.compile(r"\b(?:branch_computations|true_computation|false_computation)=(\{[^}]*\}|%[^\s,]+)")


def _branches(instruction: Instruction) -> list[str]:
    """A conditional's branches, in order (none for any other instruction)."""
    if op_of(instruction)[0] != "conditional":
        return []
    return [n for group in _BRANCHES.findall(instruction.text) for n in re.findall(r"%([^\s,{}]+)", group)]


def _whiles(
    module: Module, start: str, branches: bool = True
) -> Iterator[tuple[Computation, Instruction, str, int | None]]:
    """The `while` loops that `start` runs, itself or through what it calls (not inside
    another loop's body; nor inside a conditional's branch, where `branches` is False):
    each with the computation holding it, its body and trip count."""
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        computation = module.computations[name]
        skipped = set() if branches else {b for i in computation.instructions for b in _branches(i)}
        todo += [called for called in computation.called(loops=False) if called not in skipped]
        for loop, body, trips in computation.whiles():
            yield computation, loop, body, trips if trips is not None else counted(module, computation, loop)


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
    top = list(_whiles(module, module.entry))
    same = lengths[0] if len(set(lengths)) == 1 and len(top) == len(lengths) else None
    read = _missed_from(module, module.entry, same, True)
    return None if read is None else LoopsRead(*read)


def _conditionals(module: Module, start: str) -> Iterator[list[str]]:
    """The branches of each conditional that `start` runs, itself or through what it calls
    (not inside a loop's body or another conditional's branch)."""
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        computation = module.computations[name]
        found = [_branches(i) for i in computation.instructions]
        yield from (branches for branches in found if branches)
        skipped = {b for branches in found for b in branches}
        todo += [called for called in computation.called(loops=False) if called not in skipped]


def _missed_from(module: Module, start: str, same: int | None, at_top: bool) -> tuple[float, float, bool] | None:
    """What XLA's analysis misses of the loops one run of `start` runs (`same` and `at_top`
    as `missed` reads the program's own level), and whether every trip count was known. XLA
    counts each conditional as its most costly branch (each figure's), with each loop in it
    once: what it misses is the most costly branch with its loops counted, less that."""
    flops = accessed = 0.0
    exact = True
    # (what runs the loops: the program, a branch or a loop's body; how often; at the top?)
    todo = [(start, 1, at_top)]
    while todo:
        name, runs, at_top = todo.pop()
        for branches in _conditionals(module, name):
            once = [cost for cost in (text_cost(module.text(b)) for b in branches) if cost is not None]
            read = [r for r in (_missed_from(module, b, same, at_top) for b in branches) if r is not None]
            if len(once) != len(branches) or len(read) != len(branches):
                return None
            full = [(o[0] + r[0], o[1] + r[1]) for o, r in zip(once, read, strict=True)]
            flops += runs * (max(f for f, _ in full) - max(f for f, _ in once))
            accessed += runs * (max(b for _, b in full) - max(b for _, b in once))
            exact = exact and all(r[2] for r in read)
        for computation, loop, body, trips in _whiles(module, name, branches=False):
            trips = same if trips is None and at_top else trips
            cost = text_cost(module.text(body))
            if cost is None:
                return None
            if trips is None:
                exact = False
                continue
            flops += runs * (trips - 1) * cost[0]
            accessed += runs * (trips - 1) * cost[1]
            todo.append((body, runs * trips, False))
            unread = _unread(computation, loop) if at_top else None
            last = _without_results(module.computations[body], unread) if unread else None
            if last is not None:
                cut = text_cost(module.text(body, last))
                if cut is None:
                    exact = False
                else:
                    flops -= max(cost[0] - cut[0], 0.0)
                    accessed -= max(cost[1] - cut[1], 0.0)
    return flops, accessed, exact
