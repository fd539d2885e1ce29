"""XLA's optimized HLO as text (what `Compiled.as_text()` returns and compilers dump):
its computations and instructions (`parse`), an instruction's shape, opcode, operands and
attributes, the arrays of a shape (their type, bytes and memory space), a value traced
back through copies and bitcasts, a computation made a module of its own
(`Module.text`), and XLA's HLO cost analysis of such a module (`cost`). Read by
`_hlo_loops` (a program's loops), `_layout` and `_kernels` (a program's kernels).
Nothing compiles.
"""

import dataclasses
import functools
import re
from collections.abc import Iterator
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
CALLS: Final = re.compile(r"\bcalls=%([^\s,]+)")  # the computation a fusion or call runs
GET: Final = re.compile(r"get-tuple-element\(%([^\s,)]+)\), index=(\d+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    text: str  # everything after `name = `
    root: bool

    @functools.cached_property
    def parts(self) -> tuple[str, tuple[str, ...], str]:
        """Its opcode, operand names and the attributes after them (`op_of`), read once:
        every reader of a kernel asks."""
        rest = self.text[shape_end(self.text) :].lstrip()
        opcode, _, rest = rest.partition("(")
        depth, end = 1, len(rest)
        for i, c in enumerate(rest):
            depth += c in "([{"
            depth -= c in ")]}"
            if depth == 0:
                end = i
                break
        return opcode, tuple(_NAME.findall(re.sub(r"/\*.*?\*/", "", rest[:end]))), rest[end + 1 :]

    @functools.cached_property
    def shape(self) -> str:
        """Its shape's text (`f32[8]{0}`, a tuple `(s32[], f32[8]{0})`)."""
        return self.text[: shape_end(self.text)]

    def operands(self) -> Iterator[str]:
        """The names this instruction mentions outside its called computations (its operands
        and control predecessors, and names in metadata, which match no instruction)."""
        yield from _NAME.findall(_CALLED.sub("", self.text))


@dataclasses.dataclass(frozen=True)
class Computation:
    name: str
    signature: str  # the line that opens it, without `ENTRY `
    instructions: tuple[Instruction, ...]

    @functools.cached_property
    def named(self) -> dict[str, Instruction]:
        """Its instructions by name (read once: each kernel of a large program asks)."""
        return {i.name: i for i in self.instructions}

    def called(self, loops: bool) -> Iterator[str]:
        """The computations it calls: `loops=False` leaves out loop bodies and conditions."""
        for instruction in self.instructions:
            for kind, names in _CALLED.findall(instruction.text):
                if loops or kind not in ("body", "condition"):
                    yield from _NAME.findall(names)

    def whiles(self) -> Iterator[tuple[Instruction, str, int | None]]:
        """Its `while` instructions: each with its body and trip count (None: not known)."""
        for instruction in self.instructions:
            end = shape_end(instruction.text)
            if instruction.text[end:].startswith(" while("):
                body = re.search(r"\bbody=%([^\s,]+)", instruction.text)
                trips = _TRIPS.search(instruction.text)
                if body is not None:
                    yield instruction, body.group(1), int(trips.group(1)) if trips else None


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    computations: dict[str, Computation]  # in the text's order (each after those it calls)
    entry: str

    def text(self, entry: str, replaced: Computation | None = None) -> str:
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


def parse(text: str) -> Module | None:
    """The computations of an optimized module's text, or None where it is not one (no
    `HloModule` line, no entry). An instruction's text may span several lines: a Pallas
    kernel's `kernel_metadata` holds a JSON value with newlines, which XLA prints as is;
    a line that starts no instruction continues the one before it, and so does a `}` that
    closes a bracket that instruction opened."""
    lines = text.replace("\r\n", "\n").split("\n")  # (metadata may hold any other line break)
    if not lines or not lines[0].startswith("HloModule "):
        return None
    name = lines[0].split()[1].rstrip(",")
    computations: dict[str, Computation] = {}
    entry = None
    current: tuple[str, str, list[Instruction]] | None = None
    for line in lines[1:]:
        if current is None:
            header = _HEADER.match(line)
            if header is not None:
                current = (header.group(2), line.removeprefix("ENTRY "), [])
                entry = header.group(2) if header.group(1) else entry
            continue
        instructions = current[2]
        if line == "}" and not (instructions and _unclosed(instructions[-1].text)):
            computations[current[0]] = Computation(current[0], current[1], tuple(instructions))
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match is not None:
            instructions.append(Instruction(match.group(2), match.group(3), bool(match.group(1))))
        elif instructions:  # the instruction before it goes on
            last = instructions[-1]
            instructions[-1] = Instruction(last.name, last.text + "\n" + line, last.root)
        elif line.strip():
            return None
    if entry is None or current is not None:
        return None
    return Module(name, computations, entry)


_QUOTED: Final = re.compile(r'"(?:[^"\\]|\\.)*"')


def _unclosed(text: str) -> bool:
    """Whether `text` opens more brackets than it closes, outside its quoted strings."""
    bare = _QUOTED.sub("", text)
    return sum(bare.count(c) for c in "([{") > sum(bare.count(c) for c in ")]}")


def outside_brackets(text: str, chars: str) -> Iterator[int]:
    """The positions in `text` of any of `chars` outside (), [] and {}."""
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c in chars and depth == 0:
            yield i


def shape_end(text: str) -> int:
    """Where an instruction's shape (`f32[8]{0}`, a tuple `(s32[], f32[8]{0})`) ends in `text`."""
    return next(outside_brackets(text, " "), len(text))


def elements(shape: str) -> list[str]:
    """The element shapes of a tuple shape `(s32[], /*index=1*/f32[8]{0})`."""
    inner = re.sub(r"/\*.*?\*/", "", shape)[1:-1]
    cuts = [-1, *outside_brackets(inner, ","), len(inner)]
    return [inner[start + 1 : end].strip() for start, end in zip(cuts, cuts[1:], strict=False)]


def op_of(instruction: Instruction) -> tuple[str, tuple[str, ...], str]:
    """An instruction's opcode, operand names and the attributes after them."""
    return instruction.parts


def source_of(computation: Computation, name: str) -> Instruction | None:
    """The instruction that computes `name`'s value, through copies and bitcasts."""
    named = computation.named
    for _ in range(16):
        instruction = named.get(name)
        if instruction is None:
            return None
        opcode, operands, _ = op_of(instruction)
        if opcode not in ("copy", "bitcast", "convert") or len(operands) != 1:
            return instruction
        name = operands[0]
    return None


def constant(computation: Computation, name: str) -> int | None:
    instruction = source_of(computation, name)
    if instruction is None:
        return None
    opcode, _, _ = op_of(instruction)
    value = re.search(r" constant\((-?\d+)\)", instruction.text)
    return int(value.group(1)) if opcode == "constant" and value else None


def element(computation: Computation, name: str) -> int | None:
    """Which element of the computation's parameter `name` is, where it is one."""
    instruction = source_of(computation, name)
    got = GET.search(instruction.text) if instruction is not None else None
    parameter = next((i.name for i in computation.instructions if " parameter(0)" in i.text), None)
    return int(got.group(2)) if got is not None and got.group(1) == parameter else None


# An array of a shape's text: its XLA type, dimensions and layout (`bf16[512,512]{1,0:T(8,128)(2,1)}`).
ARRAY: Final = re.compile(r"\b(pred|[a-z]+\d+[a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
_BITS: Final = re.compile(r"[a-z]+(\d+)")  # an XLA type's bits: `bf16`, `s32`, `f8e4m3fn`, `f4e2m1fn`


def itemsize(kind: str) -> int:
    """The bytes of one element of an XLA type (a narrow one's as one byte: a TPU holds
    them unpacked)."""
    bits = _BITS.match(kind)
    return 1 if kind == "pred" or bits is None else max(int(bits.group(1)) // 8, 1)


def arrays(shape: str) -> Iterator[tuple[str, int, bool]]:
    """Each array of a shape's text: its XLA type, bytes, and whether it is in device memory
    (not in a TPU's VMEM or SMEM, which a layout's `S(n)` names)."""
    for kind, dims, layout in ARRAY.findall(re.sub(r"/\*.*?\*/", "", shape)):
        count = 1
        for d in dims.split(","):
            count *= int(d) if d else 1
        yield kind, count * itemsize(kind), re.search(r"S\((\d+)\)", layout or "") is None


def shape_bytes(instruction: Instruction | None) -> int:
    """The bytes of an instruction's result (0 for none)."""
    return 0 if instruction is None else sum(b for _, b, _ in arrays(instruction.shape))


def cost(text: str) -> tuple[float, float] | None:
    analysis = _compat.hlo_text_cost_analysis(text)
    flops, accessed = analysis.get("flops"), analysis.get("bytes accessed")
    if not isinstance(flops, (int, float)) or not isinstance(accessed, (int, float)):
        return None
    return float(flops), float(accessed)
