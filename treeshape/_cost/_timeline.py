"""How a compiled program's memory rises and falls over its schedule (`Cost.timeline`).

A step is one instruction of the flattened schedule (XLA's `HloLiveRange` numbering: a
loop's condition and body, a called computation, in place), a point of the program, not
a unit of time: a loop body appears once however often it runs. The bytes live at each
step are counted as at the peak (`_buffers`): per allocation, the union of the (offset,
size) of the values live there; bytes several live values share belong to the one
defined last. They are computed by one sweep over the live ranges' starts and ends, each
allocation cut at its values' offsets (never steps times values).
"""

import bisect
import dataclasses
import html
import operator
from collections.abc import Sequence
from typing import Any, Final, Literal, NamedTuple, get_args

from .._shapes import human_bytes
from . import _plot  # it imports matplotlib only when a picture is drawn
from ._ops import NO_OP, phase_name


# What a buffer holds (`Buffer.kind`), the kinds a timeline counts its bytes by.
BufferKind = Literal["argument", "output", "temporary", "constant"]
KINDS: Final[tuple[BufferKind, ...]] = get_args(BufferKind)


class Phase(NamedTuple):
    """A run of consecutive steps of a [treeshape.Timeline][] under one module path.

    Attributes:
        name: The steps' op without its outermost `jit(...)`, to `depth` path components
            (`transpose(jvp(MLP))/layers_1` at depth 2).
        start: Its first step.
        stop: The step after its last.
        peak_bytes: The most bytes live at one of its steps.

    Examples:
        >>> import treeshape as ts
        >>> ts.Phase("layers_0", 0, 12, 4096).stop
        12
    """

    name: str
    start: int
    stop: int
    peak_bytes: int


Phase.__module__ = "treeshape"


class Live(NamedTuple):
    """One value with its live range on the flattened schedule (both ends inclusive) and
    its place: `key` orders values by definition (the one defined last owns shared bytes),
    `buffer` is its [treeshape.Buffer][] with all its bytes."""

    start: int
    end: int
    key: tuple[int, int]
    allocation: int
    offset: int
    size: int
    buffer: Any


def live_at(values: Sequence[Live], t: int) -> tuple[int, list[tuple[Live, int]]]:
    """The distinct bytes live at step `t` and the values that hold them, each with the bytes
    it adds (per allocation, the value defined last first)."""
    live = sorted((v for v in values if v.start <= t <= v.end), key=lambda v: v.key, reverse=True)
    covered: dict[int, list[tuple[int, int]]] = {}
    total = 0
    listed = []
    for v in live:
        spans = covered.setdefault(v.allocation, [])
        new = _uncovered(spans, v.offset, v.offset + v.size)
        if new:
            spans.append((v.offset, v.offset + v.size))
            total += new
            listed.append((v, new))
    return total, listed


def _uncovered(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How many bytes of [lo, hi) none of `spans` covers."""
    cuts = sorted((max(a, lo), min(b, hi)) for a, b in spans if a < hi and b > lo)
    free, at = 0, lo
    for a, b in cuts:
        if a > at:
            free += a - at
        at = max(at, b)
    return free + max(0, hi - at)


def listed_buffers(listed: list[tuple[Live, int]]) -> tuple[Any, ...]:
    """The live set's buffers, each with the bytes it adds, largest first."""
    out = [v.buffer if v.buffer.nbytes == n else dataclasses.replace(v.buffer, nbytes=n) for v, n in listed]
    out.sort(key=lambda b: -b.nbytes)
    return tuple(out)


def sweep(values: Sequence[Live], steps: int) -> tuple[list[int], dict[BufferKind, list[int]]]:
    """The distinct bytes live at each of `steps` steps, and those bytes by the kind of the
    value that owns them, by one pass over the values' starts and ends."""
    starting: list[list[int]] = [[] for _ in range(steps + 1)]
    ending: list[list[int]] = [[] for _ in range(steps + 1)]
    by_allocation: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        if v.size <= 0 or v.start >= steps or v.end < v.start:
            continue
        starting[v.start].append(i)
        ending[min(v.end, steps - 1) + 1].append(i)
        by_allocation.setdefault(v.allocation, []).append(i)
    # Each allocation cut at its values' offsets: a value covers segments [first, last).
    segments: dict[int, tuple[int, int]] = {}
    lengths: list[int] = []
    for members in by_allocation.values():
        cuts = sorted({c for i in members for c in (values[i].offset, values[i].offset + values[i].size)})
        index = {c: len(lengths) + k for k, c in enumerate(cuts)}
        lengths.extend(b - a for a, b in zip(cuts, cuts[1:], strict=False))
        lengths.append(0)  # keeps each allocation's indices apart
        for i in members:
            segments[i] = (index[values[i].offset], index[values[i].offset + values[i].size])
    holders: list[list[int]] = [[] for _ in lengths]
    kinds = [values[i].buffer.kind for i in range(len(values))]
    total = 0
    kind_total = dict.fromkeys(KINDS, 0)
    live = [0] * steps
    by_kind = {k: [0] * steps for k in KINDS}

    def owner(held: list[int]) -> int:
        return max(held, key=lambda j: values[j].key)

    for t in range(steps):
        for i in ending[t]:
            first, last = segments[i]
            for s in range(first, last):
                held = holders[s]
                was = owner(held) if len(held) > 1 else i
                held.remove(i)
                if not held:
                    total -= lengths[s]
                    kind_total[kinds[i]] -= lengths[s]
                elif was == i:
                    kind_total[kinds[i]] -= lengths[s]
                    kind_total[kinds[owner(held)]] += lengths[s]
        for i in starting[t]:
            first, last = segments[i]
            for s in range(first, last):
                held = holders[s]
                if not held:
                    total += lengths[s]
                    kind_total[kinds[i]] += lengths[s]
                else:
                    was = owner(held)
                    if values[i].key > values[was].key:
                        kind_total[kinds[was]] -= lengths[s]
                        kind_total[kinds[i]] += lengths[s]
                held.append(i)
        live[t] = total
        for k in KINDS:
            by_kind[k][t] = kind_total[k]
    return live, by_kind


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A compiled program's memory on one device, step by step over its schedule.

    A step is an instruction of the flattened schedule (numbered as XLA's `HloLiveRange`
    numbers it: each loop's condition and body and each called computation in place), a
    point of the program, not a unit of time: a loop's body appears once, however many
    times it runs. Bytes live at a step are counted as `Cost.live_peak_bytes` counts them.

    Attributes:
        live_bytes: The distinct bytes live at each step.
        by_kind: `"argument"`, `"output"`, `"temporary"`, `"constant"` to their bytes at
            each step (shared bytes belong to the value defined last); they add up to
            `live_bytes`.
        ops: The op of each step's instruction, as `Buffer.op` names it; None where the
            metadata names no operation (parameters, XLA's own tuples and copies).
        peak_step: The first step with the most bytes live (`cost.live_peak_bytes`).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> def step(w, x):
        ...     with jax.named_scope("layer"):
        ...         return jnp.tanh(x @ w).sum()
        >>> t = ts.cost(step, jnp.zeros((256, 256)), jnp.zeros((64, 256))).timeline
        >>> max(t.live_bytes) == t.live_bytes[t.peak_step]
        True
        >>> sum(b.nbytes for b in t.buffers_at(t.peak_step)) == max(t.live_bytes)
        True
        >>> [p.name for p in t.phases()]
        ['layer']
    """

    __module__ = "treeshape"

    live_bytes: tuple[int, ...]
    by_kind: dict[str, tuple[int, ...]] = dataclasses.field(hash=False)
    ops: tuple[str | None, ...]
    peak_step: int
    _values: tuple[Live, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def buffers_at(self, step: int) -> tuple[Any, ...]:
        """The [treeshape.Buffer][]s live at `step`, listed as `Cost.buffers` lists them
        at the peak: bytes shared by several belong to the one defined last, largest first.

        Raises:
            TypeError: `step` is not an integer (a Python or NumPy one, as
                `operator.index` takes).
            IndexError: `step` is outside `0 <= step < len(live_bytes)`.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> c = ts.cost(lambda w, x: jnp.tanh(x @ w), jnp.zeros((64, 64)), jnp.zeros((8, 64)))
            >>> c.timeline.buffers_at(c.timeline.peak_step) == c.buffers
            True
        """
        n = len(self.live_bytes)
        try:
            if isinstance(step, bool):
                raise TypeError
            at = operator.index(step)
        except TypeError:
            raise TypeError(
                f"step must be an integer, 0 <= step < {n} (a Python or NumPy int), got {step!r} of type "
                f"{type(step).__name__}: give the step's number, such as timeline.peak_step"
            ) from None
        if not 0 <= at < n:
            raise IndexError(f"step {at} is outside this timeline's {n} steps: give 0 <= step < {n}")
        return listed_buffers(live_at(self._values, at)[1])

    def phases(self, depth: int = 1) -> tuple[Phase, ...]:
        """The runs of consecutive steps whose op, without its outermost `jit(...)`, shares
        its first `depth` path components; steps without an op join the run before them.

        Raises:
            ValueError: `depth` is not an int >= 1.

        Examples:
            >>> import jax, jax.numpy as jnp
            >>> import treeshape as ts
            >>> def f(x):
            ...     with jax.named_scope("a"):
            ...         x = jnp.sin(x) @ x
            ...     with jax.named_scope("b"):
            ...         return jnp.cos(x) @ x
            >>> [p.name for p in ts.cost(f, jnp.zeros((64, 64))).timeline.phases()]
            ['a', 'b']
        """
        if type(depth) is not int or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (how many path components name a phase), got {depth!r}")
        names: list[str | None] = [None if op is None else phase_name(op, depth) for op in self.ops]
        first = next((name for name in names if name is not None), NO_OP)
        out: list[Phase] = []
        current, start = first, 0
        for t, name in enumerate(names):
            if name is not None and name != current:
                if t > start:
                    out.append(Phase(current, start, t, max(self.live_bytes[start:t])))
                current, start = name, t
        if len(names) > start:
            out.append(Phase(current, start, len(names), max(self.live_bytes[start:])))
        return tuple(out)

    def __str__(self) -> str:
        return chart(self)

    def plot(self, ax: Any = None, depth: int = 1, budget: int | None = None) -> Any:
        """Draw the bytes live over the steps with matplotlib (the extra `treeshape[plot]`),
        stacked by kind, the peak and the phases at `depth` marked, `budget` as a line;
        return the `Axes`."""
        return _plot.plot(self, ax=ax, depth=depth, budget=budget)

    def _repr_html_(self) -> str:
        svg = _plot.html(self)
        return svg if svg is not None else f"<pre>{html.escape(chart(self))}</pre>"


_ROWS: Final = 23  # and a header: at most 24 lines
_BAR: Final = 30


def chart(t: Timeline) -> str:
    """The timeline for a terminal: one row per depth-1 phase (or per equal run of steps
    where there are more), its steps, name, peak bytes and a bar, the peak's row marked."""
    n = len(t.live_bytes)
    if n == 0:
        return "memory over the schedule: no steps"
    peak = t.live_bytes[t.peak_step]
    phases = t.phases()
    if len(phases) <= _ROWS:
        rows = [(p.start, p.stop, p.name, p.peak_bytes) for p in phases]
    else:
        width = -(-n // _ROWS)
        rows = []
        for start in range(0, n, width):
            stop = min(n, start + width)
            top = max(range(start, stop), key=lambda s: (t.live_bytes[s], -s))
            rows.append((start, stop, _holding(phases, top).name, t.live_bytes[top]))
    held = _holding(phases, t.peak_step).name
    head = f"memory over the schedule: {n:,} steps, peak {human_bytes(peak)} at step {t.peak_step:,} ({held})"
    steps = [f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b, _, _ in rows]
    named = [_clip(name, 40) for _, _, name, _ in rows]
    sizes = [human_bytes(nbytes) for *_, nbytes in rows]
    ws, wn, wb = max(map(len, steps)), max(map(len, named)), max(map(len, sizes))
    lines = [head]
    for (a, b, _, nbytes), s, name, size in zip(rows, steps, named, sizes, strict=True):
        bar = "#" * (round(_BAR * nbytes / peak) if peak else 0)
        mark = " <- peak" if a <= t.peak_step < b else ""
        lines.append(f"{s:>{ws}}  {name:<{wn}}  {size:>{wb}}  {bar}{mark}".rstrip())
    return "\n".join(lines)


def _holding(phases: Sequence[Phase], step: int) -> Phase:
    """The phase of `phases` (in order, covering every step) that holds `step`."""
    return phases[bisect.bisect_right([p.start for p in phases], step) - 1]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def build(values: Sequence[Live], steps: int, ops: Sequence[str | None]) -> Timeline:
    """The timeline of `steps` steps of these live values."""
    live, by_kind = sweep(values, steps)
    peak_step = max(range(steps), key=lambda s: (live[s], -s)) if steps else 0
    return Timeline(tuple(live), {k: tuple(v) for k, v in by_kind.items()}, tuple(ops), peak_step, tuple(values))


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Timeline": Timeline, "Phase": Phase}
