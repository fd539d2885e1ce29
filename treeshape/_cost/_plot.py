"""The pictures of a `Timeline` (bytes live over a step's schedule) and of a `Plan`
(throughput against peak), drawn with matplotlib.

matplotlib is optional (the extra `treeshape[plot]`) and imported here only, inside the
functions that draw: nothing else of treeshape needs it.
"""

import io
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from .._shapes import human_bytes
from .._tree import clip
from ._ops import without_jit


if TYPE_CHECKING:
    from matplotlib.axes import Axes


class _Buffer(Protocol):
    """What the picture reads of a `ts.Buffer`."""

    @property
    def nbytes(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def op(self) -> str | None: ...


class _Phase(Protocol):
    """What the picture reads of a `ts.Phase`."""

    @property
    def name(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def stop(self) -> int: ...


class Drawable(Protocol):
    """What the picture reads of a `ts.Timeline` (so that this module needs no timeline)."""

    @property
    def live_bytes(self) -> tuple[int, ...]: ...
    @property
    def by_kind(self) -> Mapping[str, tuple[int, ...]]: ...
    @property
    def peak_step(self) -> int: ...
    def buffers_at(self, step: int) -> tuple[_Buffer, ...]: ...
    def phases(self, depth: int = 1) -> tuple[_Phase, ...]: ...


# Each kind of buffer (`by_kind`) as the picture stacks them, bottom up, and its colour.
_COLORS: Final = {"argument": "#4c72b0", "output": "#55a868", "temporary": "#dd8452", "constant": "#8172b3"}
_NAMED_PHASES: Final = 30  # at most this many phase names along the steps (the widest runs)
_NAME_LENGTH: Final = 40
MISSING: Final = 'matplotlib is not installed; it comes with the extra treeshape[plot]: pip install "treeshape[plot]"'


def _matplotlib() -> None:
    """Import matplotlib, or raise the `ImportError` that names the extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(f"treeshape: Timeline.plot draws with matplotlib, but {MISSING}") from err


def largest_label(buffer: _Buffer) -> str:
    """The name the peak's label gives its largest buffer: its path, else its op (without
    the outermost `jit(...)`), else its kind."""
    if buffer.path is not None:
        return buffer.path
    if buffer.op is not None:
        return clip(without_jit(buffer.op), 60)
    return f"a {buffer.kind} of XLA's own"


def peak_text(timeline: Drawable) -> str:
    """The peak's label: its bytes and step, and its largest buffer."""
    step = timeline.peak_step
    text = f"peak {human_bytes(timeline.live_bytes[step])} at step {step}"
    buffers = timeline.buffers_at(step)
    if buffers:
        largest = max(buffers, key=lambda b: b.nbytes)
        text += f"\nlargest: {largest_label(largest)} ({human_bytes(largest.nbytes)})"
    return text


def plot(timeline: Drawable, ax: "Axes | None" = None, depth: int = 1, budget: float | None = None) -> "Axes":
    """Draw `timeline` on `ax` (a new `Figure`'s, not pyplot's, where None) and return the Axes.

    One stacked area per kind (in `_COLORS` order, each step at x = its number), a marker and
    label at the peak, the phases at `depth` as separators and names, and `budget` as a
    horizontal line.
    """
    _matplotlib()
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(
            f"treeshape: Timeline.plot's ax must be a matplotlib Axes, got {clip(repr(ax), 60)} of type "
            f"{type(ax).__name__}: give a Figure's axes (fig.add_subplot(), plt.subplots()[1]), or None for a new one"
        )
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, numbers.Real) or not math.isfinite(budget) or budget <= 0
    ):
        raise ValueError(f"treeshape: Timeline.plot's budget is bytes, a finite number > 0; got {budget!r}")
    if ax is None:
        ax = Figure(figsize=(10, 4), layout="constrained").add_subplot()
    live = timeline.live_bytes
    n = len(live)
    steps = range(n)
    layers = [timeline.by_kind.get(kind, (0,) * n) for kind in _COLORS]
    labels = [kind if any(layer) else f"_{kind}" for kind, layer in zip(_COLORS, layers, strict=True)]
    ax.stackplot(steps, *layers, labels=labels, colors=list(_COLORS.values()), alpha=0.85, linewidth=0)

    peak_step = timeline.peak_step
    peak = live[peak_step]
    ax.plot([peak_step], [peak], marker="v", color="black", linestyle="none", label="_peak")
    right = peak_step > n / 2  # the label on the side with room
    ax.annotate(
        peak_text(timeline),
        xy=(peak_step, peak),
        xytext=(-8 if right else 8, 6),
        textcoords="offset points",
        ha="right" if right else "left",
        va="bottom",
        fontsize=8,
    )

    for phase in named_phases(timeline.phases(depth), n):
        if phase.start:
            ax.axvline(phase.start, color="grey", linewidth=0.5, alpha=0.6, label="_phase")
        ax.text(
            (phase.start + phase.stop - 1) / 2,
            0.02,
            clip(phase.name, _NAME_LENGTH),
            transform=ax.get_xaxis_transform(),  # x in steps, y in the axes' height
            rotation=90,
            ha="center",
            va="bottom",
            fontsize=7,
            clip_on=True,
            gid="phase",
        )

    top = max(peak, budget or 0)
    if budget is not None:
        ax.axhline(budget, color="#c44e52", linestyle="--", linewidth=1, label=f"budget {human_bytes(budget)}")
    ax.set_xlim(0, max(n - 1, 1))
    ax.set_ylim(0, top * 1.3 if top else 1)
    ax.yaxis.set_major_locator(MultipleLocator(_tick_step(top * 1.3)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: human_bytes(int(y))))
    ax.set_xlabel("step of the schedule (a loop's body appears once)")
    ax.set_ylabel("bytes live, per device")
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncols=5)
    return ax


def named_phases(phases: Sequence[_Phase], steps: int) -> list[_Phase]:
    """The phases named in the picture: the widest first, at most `_NAMED_PHASES`, each name
    at least `steps / (1.5 * _NAMED_PHASES)` steps from the others (a real program's phases
    interleave in runs of a few steps: naming them all would be a grey blur)."""
    gap = steps / (1.5 * _NAMED_PHASES)
    named: list[_Phase] = []
    for phase in sorted(phases, key=lambda p: p.stop - p.start, reverse=True):
        middle = (phase.start + phase.stop - 1) / 2
        if all(abs(middle - (p.start + p.stop - 1) / 2) >= gap for p in named):
            named.append(phase)
            if len(named) == _NAMED_PHASES:
                break
    return sorted(named, key=lambda p: p.start)


def _tick_step(top: float) -> float:
    """A step between the y axis' ticks, in whole binary units (256 KiB, 1 MiB, 2 GiB), for
    about four to eight ticks up to `top` bytes."""
    unit = 1
    while unit * 1024 <= top:
        unit *= 1024
    for factor in (0.125, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        if top / (factor * unit) <= 8:
            return max(factor * unit, 1)
    return 1024.0 * unit


def html(timeline: Drawable) -> str | None:
    """The picture as SVG text (for `_repr_html_`), or None where matplotlib is missing."""
    try:
        _matplotlib()
    except ImportError:
        return None
    from matplotlib import rc_context

    ax = plot(timeline)
    figure: Any = ax.figure
    out = io.StringIO()
    with rc_context({"svg.hashsalt": "treeshape"}):  # the same picture, the same text
        figure.savefig(out, format="svg", metadata={"Date": None})
    figure.clear()
    text = out.getvalue()
    return text[text.find("<svg") :]


class _Row(Protocol):
    """What the plan's picture reads of a `ts.PlanRow`."""

    @property
    def choice(self) -> dict[str, Any]: ...
    @property
    def size(self) -> int: ...
    @property
    def throughput(self) -> float: ...
    @property
    def peak_bytes(self) -> int | None: ...


class Planned(Protocol):
    """What the plan's picture reads of a `ts.Plan`."""

    @property
    def dim(self) -> str: ...
    @property
    def rows(self) -> tuple[_Row, ...]: ...
    @property
    def pareto(self) -> tuple[_Row, ...]: ...


def plot_plan(plan: Planned, ax: "Axes | None" = None) -> "Axes":
    """Throughput against peak bytes, one point per combination that fits (labelled with
    its choices and size), the Pareto rows joined, the best marked; the `Axes`."""
    try:
        from matplotlib.axes import Axes
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(f"treeshape: Plan.plot draws with matplotlib, but {MISSING}") from err
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(
            f"treeshape: Plan.plot's ax must be a matplotlib Axes, got {clip(repr(ax), 60)} of type "
            f"{type(ax).__name__}: give a Figure's axes (fig.add_subplot(), plt.subplots()[1]), or None for a new one"
        )
    if ax is None:
        ax = Figure(figsize=(7, 4.5), layout="constrained").add_subplot()
    fitting = [r for r in plan.rows if r.size > 0 and r.peak_bytes is not None]
    gib = 2**30
    for r in fitting:
        ax.scatter([r.peak_bytes / gib], [r.throughput], color="#4c72b0", zorder=3)  # type: ignore[operator]
        label = ", ".join(f"{v}" for v in r.choice.values()) + f" ({plan.dim}={r.size})"
        ax.annotate(label, (r.peak_bytes / gib, r.throughput), fontsize=8, xytext=(4, 4),  # type: ignore[operator]
                    textcoords="offset points")  # fmt: skip
    front = sorted(plan.pareto, key=lambda r: r.peak_bytes or 0)
    if len(front) > 1:
        ax.plot([r.peak_bytes / gib for r in front], [r.throughput for r in front], color="#55a868",  # type: ignore[operator]
                label="Pareto front", zorder=2)  # fmt: skip
    if fitting:
        best = fitting[0]
        ax.scatter([best.peak_bytes / gib], [best.throughput], s=160, facecolors="none",  # type: ignore[operator]
                   edgecolors="#c44e52", linewidths=2, label="best", zorder=4)  # fmt: skip
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel(f"{plan.dim} per second")
    ax.set_title("throughput against peak, one point per combination")
    ax.legend(loc="best", fontsize=8)
    return ax
