"""XLA's optimized HLO as text (what `Compiled.as_text()` returns and compilers dump):
its computations and instructions (`parse`), an instruction's shape, opcode, operands and
attributes, the arrays of a shape (their type, bytes and memory space), a value traced
back through copies and bitcasts, a computation made a module of its own
(`Module.text`) or an instruction alone (`Module.alone`), and XLA's HLO cost analysis
of such a module (`cost`); the one reader of a `while`'s text (`loop_of`: its body,
condition and `known_trip_count`) and of a call's or conditional's computations
(`branches`), and the readers of the attributes a kernel's cost depends on (a product's
dimensions, labels and window, a collective's groups, pairs and channel, a backend
config's cycles, scoped memory and cost estimate). Read by `_hlo_loops` (a program's
loops, and the one walk through them), `_layout` (a layout's strides and tiles) and
`_kernels` (a program's kernels, which reads no text of its own). Nothing compiles.
"""

import dataclasses
import functools
import math
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

    @property
    def opcode(self) -> str:
        """Its opcode (`fusion`, `while`, ...), as the protobuf reader's `_hlo.Instruction` names it."""
        return self.parts[0]

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

    def loops(self) -> Iterator["Loop"]:
        """Its `while` instructions' loops (`loop_of`), in its order."""
        for instruction in self.instructions:
            loop = loop_of(instruction)
            if loop is not None:
                yield loop


@dataclasses.dataclass(frozen=True)
class Loop:
    """A `while` instruction as its text tells it: the computation it runs as its body, its
    condition, and the trip count XLA's loop analysis recorded (`known_trip_count`; None
    where it recorded none: `_hlo_loops.counted` may still count it)."""

    instruction: Instruction
    body: str
    condition: str | None
    known: int | None


_BODY: Final = re.compile(r"\bbody=%([^\s,]+)")
_CONDITION: Final = re.compile(r"\bcondition=%([^\s,]+)")
# The computations a `call` (`to_apply`) or a `conditional` (its branches, in order) runs.
_BRANCHES: Final = re.compile(
    r"\b(?:to_apply|branch_computations|true_computation|false_computation)=(\{[^}]*\}|%[^\s,]+)"
)


def loop_of(instruction: Instruction) -> Loop | None:
    """The loop a `while` instruction runs; None for any other instruction (and for a
    `while` whose body its text does not name). The one reader of a loop's text."""
    if instruction.parts[0] != "while":
        return None
    body, condition = _BODY.search(instruction.text), _CONDITION.search(instruction.text)
    trips = _TRIPS.search(instruction.text)
    if body is None:
        return None
    return Loop(
        instruction,
        body.group(1),
        condition.group(1) if condition is not None else None,
        int(trips.group(1)) if trips is not None else None,
    )


def branches(instruction: Instruction) -> list[str]:
    """The computations a `call` runs, or a `conditional`'s branches in order (none for any
    other instruction's attributes)."""
    return [n for group in _BRANCHES.findall(instruction.parts[2]) for n in re.findall(r"%([^\s,{}]+)", group)]


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    computations: dict[str, Computation]  # in the text's order (each after those it calls)
    entry: str
    devices: int = 1  # its header's partitions times replicas

    def alone(self, computation: Computation, instruction: Instruction) -> str | None:
        """A module whose entry runs `instruction` (of `computation`) alone, on parameters
        shaped as its operands (None where an operand is not in `computation`)."""
        opcode, operands, attributes = instruction.parts
        named = computation.named
        shapes = []
        for operand in operands:
            source = named.get(operand)
            if source is None:
                return None
            shapes.append(source.shape)
        attributes = re.sub(r",\s*control-predecessors=\{[^}]*\}", "", attributes)
        signature = ", ".join(f"p{i}: {s}" for i, s in enumerate(shapes))
        body = [f"  %p{i} = {s} parameter({i})" for i, s in enumerate(shapes)]
        operand_list = ", ".join(f"%p{i}" for i in range(len(shapes)))
        body.append(f"  ROOT %kernel = {instruction.shape} {opcode}({operand_list}){attributes}")
        called = CALLS.search(attributes)
        head = self.text(called.group(1)).replace("ENTRY ", "", 1) if called else f"HloModule {self.name}\n"
        entry = f"ENTRY %kernel.entry ({signature}) -> {instruction.shape} {{\n" + "\n".join(body) + "\n}\n"
        return re.sub(r",? stack_frame_id=\d+", "", head + "\n" + entry)

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
    devices = math.prod(int(n) for n in re.findall(r"\b(?:num_partitions|replica_count)=(\d+)", lines[0]))
    return Module(name, computations, entry, devices)


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


# -- what an instruction's text says of it --------------------------------------------------
# (each reader as the grammar of XLA's text writes it; `_kernels` reads kernels from them)
_NO_COMMENTS: Final = re.compile(r"/\*.*?\*/")


def array_dims(shape: str) -> Iterator[tuple[str, list[int], str]]:
    """Each array of a shape's text: its XLA type, dimensions and layout (`{1,0:T(8,128)}`,
    `""` where none is written)."""
    for kind, dims, layout in ARRAY.findall(_NO_COMMENTS.sub("", shape)):
        yield kind, [int(d) for d in dims.split(",") if d], layout


def dims_of(instruction: Instruction | None) -> list[int] | None:
    """The dimensions of an instruction's (first) result array; None where it has none."""
    if instruction is None:
        return None
    found = ARRAY.search(_NO_COMMENTS.sub("", instruction.shape))
    return [int(d) for d in found.group(2).split(",") if d] if found else None


def types(shape: str) -> list[str]:
    """Each array of a shape's text as `bf16[512,512]`."""
    return [f"{kind}[{dims}]" for kind, dims, _ in ARRAY.findall(_NO_COMMENTS.sub("", shape))]


_MINOR: Final = re.compile(r"\{(\d+)")  # a layout's first dimension: its minor one


def minor(layout: str) -> int | None:
    """The minor dimension a layout (`{1,0:T(8,128)}`) names first; None where it names none."""
    found = _MINOR.match(layout)
    return int(found.group(1)) if found else None


_HOST_SPACE: Final = re.compile(r"S\(5\)")  # the host's pinned memory, in a TPU's layouts


def host_arrays(shape: str) -> list[tuple[str, str, bool]]:
    """Each array of a shape's text: its XLA type, its dimensions' text (`512,512`; `` for
    a scalar) and whether its layout puts it in the host's memory (`S(5)`)."""
    found = ARRAY.findall(_NO_COMMENTS.sub("", shape))
    return [(kind, dims, _HOST_SPACE.search(layout or "") is not None) for kind, dims, layout in found]


_NAMES: Final = {"pred": "bool", "bf16": "bfloat16", "f": "float", "s": "int", "u": "uint", "c": "complex"}


def dtype_name(kind: str) -> str:
    """The JAX dtype name of an XLA type (`bf16` -> `bfloat16`, `s8` -> `int8`,
    `f8e4m3fn` -> `float8_e4m3fn`), the name itself where it is not one."""
    if kind in _NAMES:
        return _NAMES[kind]
    typed = re.fullmatch(r"([fsuc])(\d+)(\w*)", kind)
    if typed is None:
        return kind
    prefix, bits, rest = typed.groups()
    return _NAMES[prefix] + bits + (f"_{rest}" if rest else "")


def fused(module: Module, attributes: str) -> Computation | None:
    """The computation that attributes' `calls=` names (a fusion's, an asynchronous start's),
    where the module holds it."""
    called = CALLS.search(attributes)
    return module.computations.get(called.group(1)) if called is not None else None


def ints_of(attributes: str, name: str) -> list[int] | None:
    """An attribute that lists integers (`slice_sizes={1,128}`); None where it is not written."""
    found = re.search(rf"\b{name}=\{{([\d,]*)\}}", attributes)
    return [int(d) for d in found.group(1).split(",") if d] if found else None


def int_of(attributes: str, name: str) -> int | None:
    """An integer attribute (`index_vector_dim=1`); None where it is not written."""
    found = re.search(rf"\b{name}=(\d+)", attributes)
    return int(found.group(1)) if found else None


_DOT_DIMS: Final = re.compile(r"\b(lhs_contracting|rhs_contracting|lhs_batch|rhs_batch)_dims=\{([\d,]*)\}")
_LABELS: Final = re.compile(r"\bdim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW: Final = re.compile(r"\bwindow=\{[^}]*\}")
_PRECISION: Final = re.compile(r"\boperand_precision=\{([a-z,]*)\}")


def dot_dims(attributes: str) -> dict[str, list[int]]:
    """A dot's contracting and batch dimensions (`lhs_contracting`, ..., `rhs_batch`)."""
    return {name: [int(d) for d in text.split(",") if d] for name, text in _DOT_DIMS.findall(attributes)}


def dim_labels(attributes: str) -> tuple[str, str, str] | None:
    """A convolution's `dim_labels` (input, kernel, output: `b01f`, `01io`, `b01f`)."""
    found = _LABELS.search(attributes)
    return None if found is None else (found.group(1), found.group(2), found.group(3))


def window(attributes: str) -> str | None:
    """A convolution's `window={...}` as written."""
    found = _WINDOW.search(attributes)
    return found.group(0) if found else None


def operand_precision(attributes: str) -> set[str]:
    """A matrix product's operand precisions as written (`{highest,default}`)."""
    found = _PRECISION.search(attributes)
    return set(found.group(1).split(",")) if found else set()


_CYCLES: Final = re.compile(r'"estimated_cycles":"(\d+)"')
_SCOPED: Final = re.compile(r'"used_scoped_memory_configs":\[([^\]]*)\]')
_TARGET: Final = re.compile(r'\bcustom_call_target="([^"]*)"')
_COST_ESTIMATE: Final = re.compile(r'"cost_estimate":\{([^{}]*)\}')
_ESTIMATED: Final = re.compile(r'"(flops|bytes_accessed)":"?(\d+)')


def estimated_cycles(attributes: str) -> float | None:
    """The compiler's estimate of a kernel's cycles, where its backend config holds one
    (libtpu's `estimated_cycles`)."""
    found = _CYCLES.search(attributes)
    return float(found.group(1)) if found else None


def scoped_bytes(attributes: str) -> int:
    """The scoped VMEM a kernel uses, as its backend config says (0 where it says none)."""
    found = _SCOPED.search(attributes)
    return sum(int(n) for n in re.findall(r'"size":"(\d+)"', found.group(1))) if found else 0


def custom_call_target(attributes: str) -> str | None:
    found = _TARGET.search(attributes)
    return found.group(1) if found else None


def cost_estimate(attributes: str) -> dict[str, str]:
    """A Pallas kernel's own `cost_estimate` in its backend config: its `flops` and
    `bytes_accessed` as written (none where it holds none)."""
    estimate = _COST_ESTIMATE.search(attributes)
    return dict(_ESTIMATED.findall(estimate.group(1))) if estimate else {}


# A collective's groups, as XLA writes them: listed (`{{0,1},{2,3}}`, `{}` for every device),
# in iota form (`[2,4]<=[8]`, `[4,2]<=[2,4]T(1,0)`: 2 groups of 4, 4 of 2), or by mesh axes
# (`mesh['x'=2,'y'=4] {'y'}`; a sub-axis `'y':(1)2`; the mesh may name its `device_ids=(...)`).
_GROUPS: Final = re.compile(
    r"replica_groups=(\{\}|\{[^=]*?\}\}|\[[\d,]+\]<=\[[\d,]+\]|"
    r"mesh\[([^\]]*)\](?:, device_ids=\((?:[^()]|\([^()]*\))*\))? \{([^}]*)\})"
)
_MESH_AXIS: Final = re.compile(r"'?([^'=,]+)'?=(\d+)")
_AXIS_REF: Final = re.compile(r"'?([^':,]+)'?(?::\(\d+\)(\d+))?")
_PAIRS: Final = re.compile(r"\bsource_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_CHANNEL: Final = re.compile(r"\bchannel_id=(\d+)")


def group_size(attributes: str, everyone: int) -> int:
    """The size of a collective's groups (`everyone`: the program's devices, which `{}` names)."""
    groups = _GROUPS.search(attributes)
    if groups is None:
        return 1
    text = groups.group(1)
    if text == "{}":
        return everyone
    if text.startswith("["):  # iota form: [groups,size]<=[devices]
        return int(text[1:].split("]")[0].split(",")[-1])
    if text.startswith("mesh"):  # the grouped axes' sizes (a sub-axis's own) multiplied
        sizes = {name.strip(): int(size) for name, size in _MESH_AXIS.findall(groups.group(2))}
        axes = _AXIS_REF.findall(groups.group(3))
        return math.prod(int(sub) if sub else sizes.get(name.strip(), 1) for name, sub in axes)
    first = re.search(r"\{\{([^}]*)\}", text)
    return len(first.group(1).split(",")) if first and first.group(1) else 1


def permute_pairs(attributes: str) -> list[tuple[str, str]] | None:
    """A collective permute's (source, target) pairs; None where they are not written."""
    pairs = _PAIRS.search(attributes)
    return None if pairs is None else re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))


def channel(attributes: str) -> str | None:
    """A collective's `channel_id`, which its start, done and fused parts share."""
    found = _CHANNEL.search(attributes)
    return found.group(1) if found else None
