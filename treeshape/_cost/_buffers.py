"""What is at a compiled program's peak: its buffers, the live set at the peak step of its
schedule, and what became of donated inputs (`Cost.buffers`, `Cost.donation`).

Read from what XLA returns with the compiled program, nothing runs: the buffer assignment
(every logical buffer, its size, defining instruction and place in an allocation) and the
optimized, scheduled module (instructions, operands, schedule, metadata, input/output
aliases). Both are protobuf messages, decoded by `_hlo`. Each value's live range is
`_liveness`'s; the bytes live at each step (`_timeline`), per allocation the union of the
(offset, size) of the live values, give the peak: the first step where they are the most.
"""

import dataclasses
import re
import warnings
from collections.abc import Sequence
from typing import Any, Final

import jax
import numpy as np

from .. import _compat
from .._dtypes import short_dtype
from .._shapes import human_bytes, short_shape
from .._table import Description, grid, html_grid
from . import _liveness, _timeline
from ._hlo import F, Frames, Index, Instruction, Module, fields, int_field, ints, message_field, str_field
from ._liveness import Value
from ._ops import AS_WRITTEN, NO_OP, OpNames, without_jit
from ._timeline import BufferKind


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One buffer live at a compiled program's peak, on one device.

    Attributes:
        nbytes: Its bytes on one device (bytes it shares with a buffer listed before it,
            as an in-place result shares its operand's, are counted there).
        shape: Its shape on one device; None for XLA's table of a tuple's buffers.
        dtype: Its dtype (a NumPy dtype); None for XLA's table of a tuple's buffers.
        kind: `"argument"`, `"output"`, `"temporary"` or `"constant"`.
        path: An argument's input path (`args[0]['params']['w']`), an output's `out`
            path (`out[1]['mu']`), else None.
        op: For a temporary, the operation that makes it, as JAX names it in the
            program's metadata (`jit(step)/transpose(jvp(MLP))/layers_1/dot_general`);
            None for XLA's own buffers (a copy), arguments and outputs.
        source: `"file.py:LINE"` of the user's code that made it, where known.
        donated: For an argument: True if donated and reused for an output, False if
            donated and not reused, None if not donated.
        memory_kind: Where it lives: `"device"` (the chip's memory, counted in
            `live_peak_bytes`), or `"pinned_host"` / `"unpinned_host"` for a buffer in the
            host's memory (an argument or output placed there, a residual a remat policy
            offloads), counted in the `host_*` figures only. `Cost.buffers` lists the
            device's first, then the host's live at the same step.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> c = ts.cost(lambda w, x: jnp.tanh(x @ w), jnp.zeros((256, 512)), jnp.zeros((32, 256)))
        >>> b = c.buffers[0]
        >>> b.kind, b.path, b.shape, b.nbytes
        ('argument', 'args[0]', (256, 512), 524288)
    """

    __module__ = "treeshape"

    nbytes: int
    shape: tuple[int, ...] | None
    dtype: Any
    kind: BufferKind
    path: str | None = None
    op: str | None = None
    source: str | None = None
    donated: bool | None = None
    memory_kind: str = "device"


@dataclasses.dataclass(frozen=True)
class Donation:
    """What became of one donated input leaf.

    Attributes:
        path: The input's path (`args[0]['params']['w']`).
        reused: Whether XLA reused its memory for an output.
        output: That output's path (`out[0]['params']['w']`), else None.
        reason: Where it was not reused, why, and what to do; else None.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> c = ts.cost(lambda w: (w * 2, w.sum()), jnp.zeros((64, 64)), donate_argnums=0)
        >>> c.donation["args[0]"]
        Donation(path='args[0]', reused=True, output='out[0]', reason=None)
    """

    __module__ = "treeshape"

    path: str
    reused: bool
    output: str | None = None
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class Reading:
    """What `read` found: the live set at the peak, its bytes, and the donations."""

    buffers: tuple[Buffer, ...]
    live_peak_bytes: int
    donation: dict[str, Donation]
    timeline: _timeline.Timeline


# -- the buffer assignment -----------------------------------------------------------------
@dataclasses.dataclass
class _Allocation:
    index: int
    size: int
    entry_parameter: bool
    constant: bool
    thread_local: bool
    color: int  # the memory space: 0 is the device's memory; a TPU's on-chip VMEM and SMEM have others

    @property
    def in_device_memory(self) -> bool:
        """Whether the device's memory figures count it: neither thread-local nor on-chip."""
        return not self.thread_local and self.color == 0

    @property
    def in_host_memory(self) -> bool:
        """Whether the host's memory figures count it (XLA's memory space 5, `S(5)`)."""
        return not self.thread_local and self.color == HOST_MEMORY_SPACE


# XLA's memory space of the host's memory (`S(5)` in a layout), where both host kinds live.
HOST_MEMORY_SPACE: Final = 5


def _assignment(data: bytes) -> tuple[dict[int, Value], dict[int, _Allocation]]:
    m = fields(data)
    values: dict[int, Value] = {}
    for raw in m.get(F.LOGICAL_BUFFERS, ()):
        b = fields(raw)
        at = message_field(b, F.BUFFER_DEFINED_AT)
        vid = int_field(b, F.BUFFER_ID)
        values[vid] = Value(
            vid,
            int_field(b, F.BUFFER_SIZE),
            int_field(at, F.LOCATION_INSTRUCTION_ID),
            tuple(ints(at, F.LOCATION_SHAPE_INDEX)),
        )
    allocations: dict[int, _Allocation] = {}
    for raw in m.get(F.BUFFER_ALLOCATIONS, ()):
        a = fields(raw)
        index = int_field(a, F.ALLOCATION_INDEX)
        allocations[index] = _Allocation(
            index,
            int_field(a, F.ALLOCATION_SIZE),
            bool(int_field(a, F.ALLOCATION_ENTRY_PARAMETER)),
            bool(int_field(a, F.ALLOCATION_CONSTANT)),
            bool(int_field(a, F.ALLOCATION_THREAD_LOCAL)),
            int_field(a, F.ALLOCATION_COLOR),
        )
        for assigned in a.get(F.ALLOCATION_ASSIGNED, ()):
            s = fields(assigned)
            v = values.get(int_field(s, F.ASSIGNED_BUFFER_ID))
            if v is not None:
                v.allocation, v.offset, v.size = index, int_field(s, F.ASSIGNED_OFFSET), int_field(s, F.ASSIGNED_SIZE)
    return values, allocations


# -- reading a compiled program -------------------------------------------------------------
def read(
    compiled: Any,
    assignment: bytes | None,
    argument_paths: Sequence[str | None],
    output_paths: Sequence[str],
    donated: frozenset[int],
    live_ranges: str | None = None,
    names: OpNames = AS_WRITTEN,
) -> Reading | None:
    """The buffers live at the peak of `compiled` and what became of its donated arguments;
    None where the release or backend does not give the buffer assignment or the module.

    `assignment` is XLA's buffer assignment (`_compat.memory_analysis`), `argument_paths[i]`
    names the program's argument `i` as the user passed it (None for a value the program
    closes over), `output_paths[k]` its output `k`; `donated` holds the positions of the
    donated arguments. `live_ranges` is the compiler's own schedule and live ranges as it
    dumps them (`*-live-range.txt`), where they are read instead of following XLA's rules
    over the module (libtpu schedules work the module does not show). `names` names the
    temporaries' and the steps' ops as the program's own (`_program` gives it).
    """
    module_bytes = _compat.optimized_module(compiled)
    kept = _compat.kept_arguments(compiled, len(argument_paths))
    if assignment is None or module_bytes is None or kept is None:
        return None
    try:
        return _read(
            compiled, assignment, module_bytes, kept, argument_paths, output_paths, donated, live_ranges, names
        )
    except (ValueError, IndexError, KeyError) as err:  # a module this reader does not know: say nothing
        warnings.warn(f"treeshape: could not read the buffers of this program ({err!r})", RuntimeWarning, stacklevel=2)
        return None


def _read(
    compiled: Any,
    assignment: bytes,
    module_bytes: bytes,
    kept: list[int],
    argument_paths: Sequence[str | None],
    output_paths: Sequence[str],
    donated: frozenset[int],
    live_ranges: str | None,
    names: OpNames,
) -> Reading:
    module = Module.read(module_bytes)
    values, allocations = _assignment(assignment)
    if live_ranges is None:
        order, sets = _liveness.live_ranges(module, values)
    else:
        order, sets = _liveness.dumped_live_ranges(module, values, live_ranges)
    entry_root = module.instructions.get(module.roots.get(module.entry, -1))
    outputs = _outputs(module, entry_root, values, sets)
    reused = {kept[p]: index for index, p in module.aliases if p < len(kept)}
    frames = Frames(module)
    sources: dict[int, str | None] = {}

    host_kinds = _host_kinds(compiled)

    def buffer(v: Value) -> Buffer:
        """`v` as a Buffer of all its bytes."""
        ins = module.instructions[v.instruction]
        shape = ins.shape.at(v.index)
        table = bool(shape.tuple_shapes) or shape.dtype == "tuple"  # XLA's table of a tuple's buffers
        dims, dtype = (None, None) if table else (shape.dims, _dtype(shape.dtype))
        on_host = allocations[v.allocation].in_host_memory
        if ins.opcode == "parameter" and ins.computation == module.entry:
            arg = kept[ins.parameter] if ins.parameter < len(kept) else -1
            path = argument_paths[arg] if 0 <= arg < len(argument_paths) else None
            was = (arg in reused) if arg in donated else None
            where = host_kinds[0].get(arg, _PINNED) if on_host else "device"
            return Buffer(v.size, dims, dtype, "argument", path, donated=was, memory_kind=where)
        if v.id in outputs:
            index = outputs[v.id]
            path = "out" if not index and entry_root is not None and entry_root.shape.tuple_shapes else None
            where = host_kinds[1].get(index[0] if index else 0, _PINNED) if on_host else "device"
            return Buffer(v.size, dims, dtype, "output", path or _output_path(index, output_paths), memory_kind=where)
        if allocations[v.allocation].constant or ins.opcode == "constant":
            return Buffer(v.size, dims, dtype, "constant")
        op = names.op(str_field(ins.metadata, F.METADATA_OP_NAME))
        if op and ins.id not in sources:
            sources[ins.id] = frames.source(ins.metadata)
        source, where = (sources.get(ins.id) if op else None), (_PINNED if on_host else "device")
        return Buffer(v.size, dims, dtype, "temporary", op=op, source=source, memory_kind=where)

    def lives(where: str) -> list[_timeline.Live]:
        return [
            _timeline.Live(v.start, v.end, (v.start, v.id), v.allocation, v.offset, v.size, buffer(v))
            for v in values.values()
            if v.start >= 0 and v.allocation in allocations and getattr(allocations[v.allocation], where)
        ]

    steps = len(order)
    ops = [_step_op(module.instructions.get(iid), names) for iid in order]
    timeline = _timeline.build(lives("in_device_memory"), steps, ops)
    buffers = timeline.buffers_at(timeline.peak_step) if steps else ()
    if steps:  # the host's buffers live at the device's peak follow the device's
        buffers += _timeline.listed_buffers(_timeline.live_at(lives("in_host_memory"), timeline.peak_step)[1])
    peak = timeline.live_bytes[timeline.peak_step] if steps else 0
    donation = _donations(module, compiled, kept, reused, argument_paths, output_paths, donated, sets, values)
    return Reading(buffers, peak, donation, timeline)


_PINNED: Final = "pinned_host"  # what a remat policy offloads to, and a host buffer of unknown kind


def _host_kinds(compiled: Any) -> tuple[dict[int, str], dict[int, str]]:
    """The host memory kind of each argument and output the program places in the host's
    memory, by position, as its shardings say."""
    found: list[dict[int, str]] = []
    for name in ("input_shardings", "output_shardings"):
        try:
            shardings = jax.tree_util.tree_leaves(getattr(compiled, name))
        except Exception:  # a release or backend without them: the host kind is pinned_host's
            shardings = []
        kinds = (getattr(s, "memory_kind", None) for s in shardings)
        found.append({i: k for i, k in enumerate(kinds) if k in ("pinned_host", "unpinned_host")})
    return found[0], found[1]


def _step_op(ins: Instruction | None, names: OpNames) -> str | None:
    """The op of a step, as `names` names it (None for a parameter's: its name is the input's)."""
    if ins is None or ins.opcode == "parameter":
        return None
    return names.step(str_field(ins.metadata, F.METADATA_OP_NAME))


_dtype: Final = _compat.dtype_named


def _outputs(
    module: Module, root: Instruction | None, values: dict[int, Value], sets: dict[int, dict[Index, set[int]]]
) -> dict[int, Index]:
    """The values the program returns (other than its arguments), each by its index in the result."""
    if root is None:
        return {}
    out: dict[int, Index] = {}
    for index, held in sets.get(root.id, {}).items():
        for vid in held:
            if module.instructions[values[vid].instruction].opcode != "parameter":
                out.setdefault(vid, index)
    return out


def _output_path(index: Index, output_paths: Sequence[str]) -> str:
    if not index:
        return output_paths[0] if len(output_paths) == 1 else "out"
    return output_paths[index[0]] if index[0] < len(output_paths) else "out"


def _donations(
    module: Module,
    compiled: Any,
    kept: list[int],
    reused: dict[int, Index],
    argument_paths: Sequence[str | None],
    output_paths: Sequence[str],
    donated: frozenset[int],
    sets: dict[int, dict[Index, set[int]]],
    values: dict[int, Value],
) -> dict[str, Donation]:
    """Each donated argument by path: the output that reuses it, or why none does."""
    entry = module.instructions.get(module.roots.get(module.entry, -1))
    if entry is None:
        return {}
    if entry.shape.tuple_shapes:
        results = [(k, s) for k, s in enumerate(entry.shape.tuple_shapes)]
    else:
        results = [(0, entry.shape)]
    parameters = module.parameters.get(module.entry, {})
    position = {arg: p for p, arg in enumerate(kept)}
    taken = {index[0] if index else 0 for index in reused.values()}
    root_sets = sets.get(entry.id, {})
    out: dict[str, Donation] = {}
    for arg in sorted(donated):
        path = argument_paths[arg] if arg < len(argument_paths) else None
        if path is None:
            continue
        if arg in reused:
            index = reused[arg]
            out[path] = Donation(path, True, _output_path(index, output_paths))
            continue
        if arg not in position:
            reason = (
                "fn does not use it, so jax.jit leaves it out of the program and there is no buffer "
                "to reuse: drop the donation, or the argument"
            )
            out[path] = Donation(path, False, reason=reason)
            continue
        param = module.instructions[parameters[position[arg]]]
        own = {vid for held in sets.get(param.id, {}).values() for vid in held}
        shape = param.shape
        size = _size(shape)
        # XLA reuses a donated buffer for an output of the same bytes on each device, of any shape.
        fits = [k for k, s in results if size is not None and _size(s) == size]
        unchanged = [k for k, _ in results if root_sets.get((k,) if entry.shape.tuple_shapes else (), set()) & own]
        what = f"{_short(shape.dtype)}[{','.join(map(str, shape.dims))}]"
        resharded = None if unchanged else _resharded(compiled, arg, shape, results, output_paths, path)
        if unchanged:
            reason = (
                f"it is also an output, unchanged ({_output_path((unchanged[0],), output_paths)} returns it as "
                "it is), so that output is its buffer already: nothing is saved by donating it"
            )
        elif resharded is not None:
            reason = (
                "its counterpart among the outputs of its shape and dtype "
                f"({_output_path((resharded,), output_paths)}) has another sharding, so its buffer on each device "
                "has another size: give that output the input's sharding (out_shardings, or "
                "jax.lax.with_sharding_constraint)"
            )
        elif not fits:
            reason = (
                f"no output has its size on each device ({what}, {size} B): XLA reuses a donated buffer only "
                "for an output of the same size"
            )
        elif all(k in taken for k in fits):
            names = ", ".join(_output_path((k,), output_paths) for k in fits)
            reason = f"every output of its size on each device ({names}) already reuses another donated input"
        else:
            reason = "XLA did not reuse it (its buffer is still needed when the output is written)"
        out[path] = Donation(path, False, reason=reason)
    return out


def _short(dtype: str) -> str:
    d = _dtype(dtype)
    return short_dtype(d) if isinstance(d, np.dtype) else dtype


def _size(shape: Any) -> int | None:
    """The bytes of an array shape on one device (None for a tuple or an unknown dtype)."""
    d = _dtype(shape.dtype)
    if shape.tuple_shapes or not isinstance(d, np.dtype):
        return None
    return int(np.prod(shape.dims, dtype=np.int64)) * d.itemsize


def _resharded(
    compiled: Any, arg: int, shape: Any, results: list[tuple[int, Any]], output_paths: Sequence[str], path: str
) -> int | None:
    """The input's counterpart among the outputs of its global shape and dtype (among
    several, the one whose path ends as the input's does: `out[0]['w']` for
    `args[0]['w']`) if it has another shape on each device (another sharding), else None."""
    try:
        arg_info = jax.tree_util.tree_leaves(compiled.args_info)[arg]
        out_info = jax.tree_util.tree_leaves(compiled.out_info)
    except Exception:
        return None
    found = [
        k
        for k, s in results
        if k < len(out_info) and out_info[k].shape == arg_info.shape and out_info[k].dtype == arg_info.dtype
    ]
    keys = _KEY.findall(path)

    def shared(k: int) -> int:
        theirs, n = _KEY.findall(_output_path((k,), output_paths)), 0
        while n < min(len(keys) - 1, len(theirs)) and keys[-1 - n] == theirs[-1 - n]:  # never the argument's position
            n += 1
        return n

    counterpart = max(found, key=shared, default=None)
    if counterpart is None:
        return None
    theirs = dict(results)[counterpart]
    return counterpart if (theirs.dims, theirs.dtype) != (shape.dims, shape.dtype) else None


# -- tables -----------------------------------------------------------------------------------
_KEY: Final = re.compile(r"\[(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\]]*)\]|\.[A-Za-z_]\w*")


def _label(b: Buffer) -> str:
    return b.path or b.op or ("(constant)" if b.kind == "constant" else NO_OP)


def _group(b: Buffer, depth: int | None) -> str:
    """The group of `b` to `depth` levels: a path's root (`args`, `out`) and first `depth`
    keys, or an op's first `depth` levels after its outermost `jit(...)`."""
    if b.path is not None:
        if depth is None:
            return b.path
        first = _KEY.search(b.path)
        root = b.path if first is None else b.path[: first.start()]
        return root + "".join(_KEY.findall(b.path[len(root) :])[:depth])
    if b.op is not None:
        op = without_jit(b.op.split(";")[0])  # a fusion's metadata may join several ops
        return op if depth is None else "/".join(op.split("/")[: max(depth, 1)])
    return "(constants)" if b.kind == "constant" else NO_OP


def _breakdown_rows(buffers: Sequence[Buffer], depth: int | None) -> list[list[str]]:
    if depth is not None and (type(depth) is not int or depth < 0):
        raise ValueError(f"depth must be None or an int >= 0 (how many levels make a group), got {depth!r}")
    groups: dict[str, list[int]] = {}
    for b in buffers:
        g = groups.setdefault(_group(b, depth), [0, 0])
        g[0] += 1
        g[1] += b.nbytes
    ordered = sorted(groups.items(), key=lambda kv: -kv[1][1])
    rows = [[name, f"{n:,}", human_bytes(nbytes)] for name, (n, nbytes) in ordered]
    rows.append(["total", f"{len(buffers):,}", human_bytes(sum(b.nbytes for b in buffers))])
    return rows


_BREAKDOWN_HEADERS: Final = ("group", "buffers", "bytes")


def breakdown(buffers: Sequence[Buffer], depth: int | None) -> str:
    """The buffers grouped to `depth` levels, largest group first, as [Cost.breakdown][]."""
    rows = _breakdown_rows(buffers, depth)
    lines = grid(_BREAKDOWN_HEADERS, rows, right=2).split("\n")
    text = "\n".join([*lines[:-2], lines[-1], lines[-2]])  # the rule above the total row
    return Description(text, lambda: html_grid(_BREAKDOWN_HEADERS, rows, right=2, css_class="treeshape-cost"))


_LARGEST_HEADERS: Final = ("largest at the peak", "kind", "shape", "bytes")


def _type_str(b: Buffer) -> str:
    if b.shape is None:
        return "tuple table"
    dtype = short_dtype(b.dtype) if isinstance(b.dtype, np.dtype) else str(b.dtype)
    return f"{dtype}{short_shape(b.shape)}"


def _largest_rows(buffers: Sequence[Buffer], n: int) -> list[list[str]]:
    return [[_label(b), b.kind, _type_str(b), human_bytes(b.nbytes)] for b in buffers[:n]]


def on_device(buffers: Sequence[Buffer]) -> list[Buffer]:
    """The buffers in the device's memory (those `live_peak_bytes` counts)."""
    return [b for b in buffers if b.memory_kind == "device"]


def largest(buffers: Sequence[Buffer], live_peak_bytes: int | None, n: int) -> str:
    """The `n` largest buffers on the device at the peak, as a small table under a line that
    says their share, and a line for the host's buffers live there too."""
    device = on_device(buffers)
    shown = sum(b.nbytes for b in device[:n])
    head = f"{min(n, len(device))} of {len(device)} buffers live at the peak: {human_bytes(shown)}"
    if live_peak_bytes:
        head += f" of {human_bytes(live_peak_bytes)}"
    text = head + "\n" + grid(_LARGEST_HEADERS, _largest_rows(device, n), right=1)
    host = [b for b in buffers if b.memory_kind != "device"]
    if host:
        kinds = ", ".join(sorted({b.memory_kind for b in host}))
        text += f"\nand {len(host)} in the host's memory ({kinds}): {human_bytes(sum(b.nbytes for b in host))}"
    return text


def largest_html(buffers: Sequence[Buffer], live_peak_bytes: int | None, n: int) -> str:
    return html_grid(_LARGEST_HEADERS, _largest_rows(on_device(buffers), n), right=1, css_class="treeshape-cost")


def named(buffers: Sequence[Buffer], n: int = 3) -> str:
    """The `n` largest device buffers in words, for a message: `args[0]['w'] (f32[512,512], 1.0 MiB), ...`."""
    parts = []
    for b in on_device(buffers)[:n]:
        label = _label(b)
        label = "a buffer of XLA's own" if label == NO_OP else label
        parts.append(f"{label} ({_type_str(b)}, {human_bytes(b.nbytes)})")
    return ", ".join(parts)


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Buffer": Buffer, "Donation": Donation}
