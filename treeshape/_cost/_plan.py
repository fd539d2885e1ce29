"""`plan`, `Plan` and `PlanRow`: which combination of choices (a rematerialization policy,
a mesh layout, ...) and which size of one dimension make a step fastest on the target
while it fits, each combination compiled by the target's own compiler.

How a call flows: for each combination of `choices` (their product, in order), `make`
builds the step and its arguments; `_fit.search` finds the largest size that fits, as
`largest_fit` does, and keeps the `Cost` of every size it compiled; the sizes below that
largest which are powers of two and were not compiled are compiled too (each once, cached
as `cost` caches it). Each size's throughput is `size / seconds` (`Cost.time`; the
roofline floor where the target has no checked estimate), and the row keeps the size of
highest throughput; with `max_seconds`, of the sizes whose step takes at most that. A
combination that fits at no size (over the budget at size 1, or refused by the target's
compiler for want of memory), or whose step at size 1 already takes longer than
`max_seconds`, is a row of size 0 with its reason (size 1 is always compiled: the search
starts there).
"""

import dataclasses
import html
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .._call import check_donation
from .._shapes import human_bytes
from .._table import grid, html_grid
from . import _compiles, _plot, _target
from ._cost import Cost, check_target
from ._fit import Fit, search
from ._request import BudgetError, check_arguments, check_max_seconds, check_progress


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One combination of a [treeshape.plan][]: its best size and how fast it runs there.

    Attributes:
        choice: The combination, a `dict` from each choice's name to its value.
        size: The size of highest throughput among those compiled up to `largest` and
            the powers of two below it (ties: the larger) whose step takes at most the
            plan's `max_seconds`; 0 where none fits, or none is that fast.
        largest: The largest size that fits, as [treeshape.largest_fit][] finds it; 0
            where none does.
        seconds: The time of one step at `size` (`Cost.time.seconds`, else its
            `floor_seconds`: see `timed`); `None` where none fits.
        throughput: `size / seconds`, units of the dimension per second; 0.0 where none
            fits.
        peak_bytes: The peak at `size` by the figure `largest_fit` judges (libtpu's own
            on a TPU target); `None` where none fits.
        budget: The bytes one device has.
        mfu: The model FLOPs utilization at `size`, where `seconds` is an estimate.
        fit: The [treeshape.Fit][] of the combination, `None` where none fits.
        note: Why none fits (or why size 1 misses `max_seconds`, and its time), or which
            time the throughput is of (`"floor"` where the target has no checked
            estimate); `""` otherwise.

    Examples:
        >>> import treeshape as ts
        >>> row = ts.PlanRow({"remat": "full"}, size=16, largest=64, seconds=0.175, throughput=91.4,
        ...                  peak_bytes=5 * 2**30, budget=16 * 2**30, mfu=0.4, fit=None)
        >>> row.size / row.seconds
        91.42857142857143
    """

    __module__ = "treeshape"

    choice: dict[str, Any]
    size: int
    largest: int
    seconds: float | None
    throughput: float
    peak_bytes: int | None
    budget: int | None
    mfu: float | None
    fit: Fit | None = dataclasses.field(repr=False)
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The combinations of a [treeshape.plan][], fastest first.

    Attributes:
        dim: The dimension sized.
        rows: One [treeshape.PlanRow][] per combination, by throughput, fastest first (ties:
            the smaller peak); combinations that fit at no size last.
        compiles: The programs compiled for the plan, those of combinations that fit at no
            size included (cached sizes compile nothing).
        max_seconds: The longest step a size may take (`None`: no bound).

    Examples:
        >>> import treeshape as ts
        >>> fast = ts.PlanRow({"remat": "full"}, 16, 64, 0.175, 91.4, 5 * 2**30, 16 * 2**30, 0.4, None)
        >>> slow = ts.PlanRow({"remat": "none"}, 8, 11, 0.103, 77.6, 12 * 2**30, 16 * 2**30, 0.3, None)
        >>> plan = ts.Plan("b", (fast, slow))
        >>> plan.best.choice, [r.choice["remat"] for r in plan.pareto]
        ({'remat': 'full'}, ['full'])
        >>> print(plan)
              remat  b   largest  seconds   b/s  peak      MFU  note
        ----  -----  --  -------  --------  ---  --------  ---  ----
        best  full   16  64       175.0 ms  91   5.0 GiB   40%
              none   8   11       103.0 ms  78   12.0 GiB  30%
        ----  -----  --  -------  --------  ---  --------  ---  ----
    """

    __module__ = "treeshape"

    dim: str
    rows: tuple[PlanRow, ...]
    compiles: int = 0
    max_seconds: float | None = None

    @property
    def best(self) -> PlanRow | None:
        """The fastest combination that fits (the first row); `None` where none fits."""
        return self.rows[0] if self.rows and self.rows[0].size > 0 else None

    @property
    def pareto(self) -> tuple[PlanRow, ...]:
        """The rows that fit and that no other row beats on both throughput and peak
        (higher throughput and a smaller peak, or one of them equal), fastest first."""
        fitting = [r for r in self.rows if r.size > 0 and r.peak_bytes is not None]
        return tuple(
            r
            for r in fitting
            if not any(
                o is not r
                and o.throughput >= r.throughput
                and o.peak_bytes <= r.peak_bytes  # type: ignore[operator]
                and (o.throughput > r.throughput or o.peak_bytes < r.peak_bytes)  # type: ignore[operator]
                for o in fitting
            )
        )

    def _table(self) -> tuple[list[str], list[list[str]]]:
        names = list(self.rows[0].choice) if self.rows else []
        head = ["", *names, self.dim, "largest", "seconds", f"{self.dim}/s", "peak", "MFU", "note"]
        rows = []
        for i, r in enumerate(self.rows):
            mark = "best" if i == 0 and r.size > 0 else ""
            values = [_value(r.choice[n]) for n in names]
            seconds = "-" if r.seconds is None else _duration(r.seconds)
            rate = "-" if r.size == 0 else f"{r.throughput:,.0f}"
            peak = "-" if r.peak_bytes is None else human_bytes(r.peak_bytes)
            mfu = "" if r.mfu is None else f"{r.mfu:.0%}"
            note = r.note.split(": ")[0] if r.size == 0 else r.note.split(":")[0]  # the whole of it on the row
            rows.append([mark, *values, f"{r.size:,}", f"{r.largest:,}", seconds, rate, peak, mfu, note])
        return head, rows

    def _bound(self) -> str:
        """The line over the table where the plan has a `max_seconds`, else `""`."""
        if self.max_seconds is None:
            return ""
        return f"max_seconds={self.max_seconds:g}: each row's {self.dim} the fastest whose step takes at most " + (
            _duration(self.max_seconds)
        )

    def _nothing_fits(self) -> str:
        """The line under the table where no combination fits, else `""`."""
        if self.best is not None:
            return ""
        slow = sum(r.largest > 0 for r in self.rows)  # rows of size 0 that fit: too slow at size 1
        if slow and slow == len(self.rows):
            return (
                f"nothing meets max_seconds: at {self.dim}=1 each combination's step takes longer than "
                f"{_duration(self.max_seconds or 0.0)} (each row's note says how long). Make the step faster (a "
                "shorter cache, fewer layers, a larger mesh) or raise max_seconds."
            )
        within = " within max_seconds" if slow else ""
        return (
            f"nothing fits{within}: no combination fits at {self.dim}=1{', or is fast enough there' if slow else ''} "
            "(each row's note says why). Raise the budget, shard over more devices, donate buffers (donate_argnums) "
            "or shrink the step."
        )

    def __str__(self) -> str:
        head, rows = self._table()
        text = grid(head, rows, right=0)
        text = f"{bound}\n{text}" if (bound := self._bound()) else text
        return f"{text}\n{said}" if (said := self._nothing_fits()) else text

    def _repr_html_(self) -> str:
        head, rows = self._table()
        page = html_grid(head, rows, right=0, css_class="treeshape-plan")
        page = f"<p>{html.escape(bound)}</p>{page}" if (bound := self._bound()) else page
        return f"{page}<p>{html.escape(said)}</p>" if (said := self._nothing_fits()) else page

    def plot(self, ax: Any = None) -> Any:
        """Draw throughput against peak bytes with matplotlib (the extra `treeshape[plot]`),
        one point per combination that fits, the Pareto rows joined and the best marked;
        return the `Axes`."""
        return _plot.plot_plan(self, ax=ax)


def _value(v: Any) -> str:
    """A choice's value as the user wrote it: `dots` (not `'dots'`), `4x1` for a tuple of
    ints, `bfloat16` for a dtype or scalar type, a function or class by its name."""
    if isinstance(v, str):
        return v
    if isinstance(v, tuple) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "x".join(str(x) for x in v)
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, type) and (issubclass(v, np.generic) or isinstance(getattr(v, "dtype", None), np.dtype)):
        return np.dtype(v).name  # np.float32, jnp.bfloat16
    name = getattr(v, "__name__", None)
    if isinstance(name, str) and callable(v):
        return name
    return str(v)


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def _combinations(choices: Any) -> list[dict[str, Any]]:
    if not isinstance(choices, Mapping) or not choices:
        raise TypeError(
            "treeshape.plan: choices must be a non-empty dict from a name to the values to try, e.g. "
            f'{{"remat": ["none", "dots", "full"]}}; got {type(choices).__name__} {choices!r}.'
        )
    names = list(choices)
    values = []
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise TypeError(f"treeshape.plan: each choice's name must be a keyword of make, got {name!r}.")
        options = choices[name]
        if isinstance(options, (str, bytes)) or not isinstance(options, Iterable):
            raise TypeError(
                f"treeshape.plan: choices[{name!r}] must be a sequence of values to try (a list), got "
                f"{type(options).__name__} {options!r}."
            )
        options = list(options)
        if not options:
            raise ValueError(f"treeshape.plan: choices[{name!r}] is empty; give at least one value.")
        values.append(options)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values)]


def _said(choice: Mapping[str, Any]) -> str:
    """The combination as the user wrote it: `remat=dots, mesh=4x1`."""
    return ", ".join(f"{k}={_value(v)}" for k, v in choice.items())


def _made(make: Callable[..., Any], choice: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """`make(**choice)` as `(step, args)`; its errors named by the combination."""
    try:
        made = make(**choice)
    except Exception as e:
        e.add_note(f"treeshape.plan: raised by make({_said(choice)})")
        raise
    if not isinstance(made, (tuple, list)) or not made or not callable(made[0]):
        raise TypeError(
            f"treeshape.plan: make({_said(choice)}) must return (step, *args) with step callable, as largest_fit "
            f"takes them; got {type(made).__name__}."
        )
    return made[0], tuple(made[1:])


def _seconds(cost: Cost) -> tuple[float | None, bool]:
    """The time of one step, and whether it is the estimate (else the floor)."""
    if cost.time is None:
        return None, False
    if cost.time.seconds is not None:
        return cost.time.seconds, True
    return cost.time.floor_seconds, False


def _row(
    choice: dict[str, Any],
    fit: Fit,
    costs: dict[int, Cost],
    judged: Callable[[Cost], int | None],
    max_seconds: float | None,
    dim: str,
) -> PlanRow:
    """The row of one combination: of the sizes costed up to `fit.size` whose step takes at
    most `max_seconds`, the one of highest throughput (ties: the larger); a row of size 0
    where size 1 (always costed: the search starts there) takes longer."""
    best: tuple[float, int] | None = None
    estimated = True
    for n, cost in costs.items():
        if n > fit.size:
            continue
        seconds, estimate = _seconds(cost)
        if seconds is None or seconds <= 0 or (max_seconds is not None and seconds > max_seconds):
            continue
        estimated = estimated and estimate
        key = (n / seconds, n)
        if best is None or key > best:
            best = key
    if best is None and max_seconds is not None and 1 in costs and (one := _seconds(costs[1]))[0] is not None:
        return _too_slow(choice, fit, one, max_seconds, dim)
    if best is None:
        raise ValueError("treeshape.plan: no size has a time; pass target= an accelerator of ts.targets()")
    throughput, size = best
    cost = costs[size]
    seconds, _ = _seconds(cost)
    mfu = cost.time.mfu if cost.time is not None else None
    note = "" if estimated else "floor: the roofline floor's time (no estimate checked on this target)"
    return PlanRow(choice, size, fit.size, seconds, throughput, judged(cost), fit.budget, mfu, fit, note)


def _too_slow(
    choice: dict[str, Any], fit: Fit, one: tuple[float | None, bool], max_seconds: float, dim: str
) -> PlanRow:
    """The row of a combination that fits but whose step at size 1 takes longer than
    `max_seconds`: size 0, its `largest` and `fit` kept, the note saying how long and what to do."""
    seconds, estimate = one
    assert seconds is not None
    which = "" if estimate else " (the roofline floor's time: no estimate checked on this target)"
    note = (
        f"even {dim}=1 is slower than max_seconds: its step takes {_duration(seconds)}{which}, over max_seconds="
        f"{max_seconds:g} ({_duration(max_seconds)}). {dim}=1 is the smallest size: make the step itself faster (a "
        "shorter cache, fewer layers, a smaller model, a larger mesh or a faster target) or raise max_seconds."
    )
    return PlanRow(choice, 0, fit.size, None, 0.0, None, fit.budget, None, fit, note)


def _powers_below(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length()) if 1 << k < n]


def plan(
    make: Callable[..., Any],
    choices: Mapping[str, Sequence[Any]],
    *,
    dim: str = "b",
    target: str | None = None,
    budget: float | None = None,
    donate_argnums: int | Sequence[int] = (),
    donate_argnames: str | Iterable[str] = (),
    max_size: int | None = None,
    progress: bool = False,
    max_seconds: float | None = None,
) -> Plan:
    """The fastest combination of `choices` that fits, with its size: each combination
    compiled by the target's own compiler at the sizes [treeshape.largest_fit][] searches.

    For each combination of `choices` (their product), `make(**combination)` returns
    `(step, *args)`, the arguments holding the symbolic dimension `dim` as `largest_fit`
    takes them. The row's `largest` is `largest_fit`'s answer; its `size` is, of the sizes
    compiled up to `largest` and the powers of two below it, the one of highest
    throughput (`size / seconds`, seconds from [treeshape.StepTime][]) whose step takes at
    most `max_seconds`: the largest batch is not always the fastest. [The fastest
    plan](../guide/plan.md), [serving](../guide/serving.md).

    Args:
        make: Called with one keyword per choice; returns `(step, *args)`.
        choices: A dict from each choice's name to the values to try.
        dim: The symbolic dimension to size.
        target: An accelerator from [treeshape.targets][] (required: the time of a step
            is known for an accelerator).
        budget: As for `largest_fit`.
        donate_argnums: As for `largest_fit`, for every combination's step.
        donate_argnames: As for `largest_fit`.
        max_size: The largest size to consider (`largest_fit`'s default where `None`).
        progress: Print a line to standard error per combination and per compile.
        max_seconds: The longest a step may take (a latency bound); a combination whose
            step takes longer at size 1 is a row of size 0 saying so.

    Returns:
        A [treeshape.Plan][].

    Raises:
        TypeError: `make` is not callable, `choices` is not a dict of sequences, or an
            argument has the wrong type (`progress` a bool, `donate_argnums` ints).
        ValueError: no `target`, an empty choice, `max_seconds` not positive, or what
            `largest_fit` raises for a combination (but a [treeshape.BudgetError][]:
            even size 1 not fitting, a row). Errors of `make` or a step propagate, with
            a note naming the combination.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")
        >>> def make(width):
        ...     w = jax.ShapeDtypeStruct((512, width), jnp.bfloat16)
        ...     x = jax.ShapeDtypeStruct((b, 512), jnp.bfloat16)
        ...     return (lambda w, x: jnp.tanh(x @ w).sum()), w, x
        >>> p = ts.plan(make, {"width": [256, 2048]}, target="v5e", max_size=8)
        >>> p.best.choice, p.best.size, [r.largest for r in p.rows]
        ({'width': 256}, 8, [8, 8])
    """
    if not callable(make):
        raise TypeError(f"treeshape.plan: make must be callable, got {type(make).__name__} {make!r}.")
    combinations = _combinations(choices)
    if target is None:
        raise ValueError(
            "treeshape.plan: a plan ranks by the time of a step on an accelerator; pass target= one of "
            f"{', '.join(repr(t) for t in _target.targets())}."
        )
    check_arguments(dim, budget, 0.0, 2**20 if max_size is None else max_size, "plan")
    check_progress(progress, "plan")
    check_max_seconds(max_seconds, "plan")
    donate_argnums, donate_argnames = check_donation(donate_argnums, donate_argnames, "plan")
    target = check_target(target, "plan")
    largest = 2**20 if max_size is None else int(max_size)
    start = time.perf_counter()
    rows = []
    with _compiles.counting() as programs:  # every program, those of combinations that fit nowhere too
        for i, choice in enumerate(combinations):
            if progress:
                print(f"treeshape.plan: [{i + 1}/{len(combinations)}] {_said(choice)}", file=sys.stderr, flush=True)
            step, args = _made(make, choice)
            try:
                fit, sizes = search(step, args, {}, dim, budget, 0.0, largest, donate_argnums, donate_argnames,
                                    progress, target)  # fmt: skip
            except BudgetError as e:  # even size 1 does not fit (or the target's compiler refuses it)
                note = str(e).removeprefix("treeshape.largest_fit: ")
                rows.append(PlanRow(choice, 0, 0, None, 0.0, None, e.limit, None, None, note))
                continue
            except Exception as e:
                e.add_note(f"treeshape.plan: for the combination {_said(choice)}")
                raise
            for n in _powers_below(fit.size):
                if n not in sizes.costs:
                    sizes.cost_at(n)
            judged = (lambda c: c.compiler_peak_bytes) if fit.judged_by is not None else (lambda c: c.peak_bytes)
            rows.append(_row(choice, fit, sizes.costs, judged, max_seconds, dim))
    rows.sort(key=lambda r: (r.size == 0, -r.throughput, r.peak_bytes if r.peak_bytes is not None else 0))
    out = Plan(dim, tuple(rows), programs[0], None if max_seconds is None else float(max_seconds))
    if progress:
        best = out.best
        said = "nothing fits" if best is None else f"best {_said(best.choice)} at {dim}={best.size} "
        said += "" if best is None else f"({best.throughput:,.0f} {dim}/s)"
        print(
            f"treeshape.plan: {said}; {programs[0]} programs compiled in {time.perf_counter() - start:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return out


# The public classes report module `treeshape`, so doctest would not find their examples here.
__test__ = {"Plan": Plan, "PlanRow": PlanRow}
