"""`largest_fit` and `Fit`: the largest size of one symbolic dimension for which a
function's compiled program fits a memory budget, found by compiling it (`_cost`) at a
few sizes and reading XLA's own figures, never by extrapolating them.

How a call flows: the inputs are prepared once as `cost` prepares them (split,
flattened, Structures replaced by their trees, donation resolved); their free dimension
names are read (`_dims.free_names`), and at each size the search asks about, the
dimension is bound as the shapes allow (`_request.bind_searched`) and the call's `Cost`
is taken from `_cost.cost_of` (cached, so asking again compiles nothing).

The search (`_search.find_size`) keeps a bracket of the sizes compiled, guesses from
their peaks and is bounded at `ceil(log2(max_size)) + 4` compilations for any curve;
each size is judged against the budget as `_budget` says (the limit, the default budget,
a TPU target's size by libtpu's own peak, `Cost.compiler_peak_bytes`, the host's bytes).
"""

import dataclasses
import html
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import jax

from .._call import Call, abstract_inputs, check_callable, check_donation
from .._dims import free_names
from .._shapes import human_bytes
from .._table import grid, html_grid
from . import _budget, _buffers, _compiles, _deviceless
from ._cost import Cost, check_target, cost_of, exact, prepare
from ._request import BudgetError, bind_searched, check_arguments, check_host_budget, check_names, check_progress
from ._search import far_over, find_size


@dataclasses.dataclass(frozen=True)
class Fit:
    """The largest size of a dimension for which a program fits a memory budget.

    Attributes:
        dim: The name of the symbolic dimension that was searched.
        size: The size found, `n`: the program fits at `n`, and at `n + 1` it does not
            (or `n` is `max_size`).
        cost: The [treeshape.Cost][] of the program at `n`, per device.
        fixed_bytes: The peak bytes that do not grow with the dimension, from the line
            through two sizes compiled: `n` and the largest that fits at most half of it
            (1 and 2 where `n` is 1); `None` if only size 1 was compiled.
        per_unit_bytes: The peak bytes that one more unit of the dimension adds, from
            the same line; `None` if only size 1 was compiled.
        budget: The bytes one device has (given, or the device's reported limit).
        compiles: How many programs the search compiled (cached sizes compile nothing).
        margin: The fraction of `budget` kept free: the peak at `n` is at most
            `(1 - margin) * budget`.
        monotone: `False` where a size compiled has a smaller peak than a smaller size
            compiled (XLA took a cheaper path above some size): then a size larger than
            `n + 1` may fit too, unseen. `True` otherwise.
        capped: `True` where the search stopped at `max_size` (which fits): the budget
            was not reached, and a larger `max_size` may fit more.
        budget_source: Where `target=` chose the budget (e.g. JAX's default
            preallocation, 75% of an H100's memory), else `None`; the table says it.
        judged_by: On a TPU target, the figure each size's peak was judged by: libtpu's
            own peak (`Cost.compiler_peak_bytes`, what the chip holds), not `peak_bytes`
            (which counts a donated output twice there); `None` where `peak_bytes` judged.
        refused_next: Whether the target's compiler refused `size + 1` for want of memory
            (the compiler, not the budget, bounded the size); the table says it.

    Examples:
        >>> import treeshape as ts
        >>> cost = ts.Cost(flops=0.0, bytes_accessed=0, argument_bytes=400, output_bytes=400,
        ...                temp_bytes=0, alias_bytes=0, peak_bytes=800, device_bytes=None)
        >>> fit = ts.Fit(dim="b", size=100, cost=cost, fixed_bytes=0.0, per_unit_bytes=8.0,
        ...              budget=1000, compiles=4, margin=0.2)
        >>> print(fit)
        largest fit        value   exact
        -----------------  ------  -----
        b                  100       100
        peak at b=100      800 B     800
        limit              800 B     800
        budget             1000 B  1,000
        margin             20%
        fixed              0 B         0
        per unit of b      8 B         8
        programs compiled  4
        -----------------  ------  -----
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    dim: str
    size: int
    cost: Cost
    fixed_bytes: float | None
    per_unit_bytes: float | None
    budget: int
    compiles: int
    margin: float = dataclasses.field(default=0.0, kw_only=True)
    monotone: bool = dataclasses.field(default=True, kw_only=True)
    capped: bool = dataclasses.field(default=False, kw_only=True)
    # Where the budget came from when `target=` chose it (None: given, or the device's limit).
    budget_source: str | None = dataclasses.field(default=None, kw_only=True, compare=False)
    # The figure each size's peak was judged by, where not `peak_bytes` (a TPU target's own).
    judged_by: str | None = dataclasses.field(default=None, kw_only=True, compare=False)
    # Whether the target's compiler refused the next size for want of memory (it, not the budget, bounded).
    refused_next: bool = dataclasses.field(default=False, kw_only=True, compare=False)

    def _line_off_the_answer(self) -> float | None:
        """The line `fixed_bytes + per_unit_bytes * n` at the answer where it does not pass near
        the peak there (within `_NEAR`) or has a negative fixed size or slope: the peak does not
        grow in a line (a non-monotone or non-linear peak: a quadratic's line near the answer
        meets n = 0 below zero), and the table shows neither figure. None where the line
        describes the answer, or where there is no line."""
        fixed, per_unit, peak = self.fixed_bytes, self.per_unit_bytes, self._peak()
        if fixed is None or per_unit is None or peak is None:
            return None
        line = fixed + per_unit * self.size
        return None if fixed >= 0 and per_unit >= 0 and abs(line - peak) <= _NEAR * peak else line

    def _source(self) -> list[str]:
        """Where the figures come from, as `str(cost)` says it (a simulated mesh, a target),
        and the time of a step at the answer with its throughput, where known."""
        lines = [line for line in str(self.cost).splitlines() if line.startswith(_COMPILED_FOR)]
        time = self.cost.time
        if time is not None:
            seconds = time.seconds if time.seconds is not None else time.floor_seconds
            rate = f"{self.size / seconds:,.0f} {self.dim} per second" if seconds > 0 else ""
            if time.seconds is None:
                rate = f"at most {rate}"
            lines.append(f"{time.line()}; {rate}" if rate else time.line())
        return lines

    def _peak(self) -> int | None:
        """The peak at the answer by the figure that judged it."""
        return self.cost.compiler_peak_bytes if self.judged_by is not None else self.cost.peak_bytes

    def _notes(self) -> list[str]:
        notes = []
        if self.budget_source is not None:
            notes.append(f"budget: {self.budget_source}")
        if self.judged_by is not None:
            notes.append(
                f"each size judged by {self.judged_by}; peak_bytes (arguments + outputs + temporaries - aliased, "
                f"a donated output counted twice) is {_bytes(self.cost.peak_bytes)} at {self.dim}={self.size}"
            )
        if self.refused_next:
            notes.append(
                f"{self.dim}={self.size + 1} was refused by the target's compiler (out of memory): the compiler, "
                "not the budget, bounded the size"
            )
        line, peak = self._line_off_the_answer(), self._peak()
        if line is not None and peak is not None and abs(line - peak) > _NEAR * peak:
            notes.append(
                f"fixed and per unit are not shown: the line through the sizes compiled gives {_bytes(line)} at "
                f"{self.dim}={self.size}, not its peak of {_bytes(peak)} (the peak does not grow in a line in "
                f"{self.dim})"
            )
        elif line is not None:
            notes.append(
                f"fixed and per unit are not shown: the line through the sizes compiled near {self.dim}={self.size} "
                f"falls below zero toward {self.dim}=0 (the peak does not grow in a line in {self.dim})"
            )
        if self.capped:
            notes.append(
                f"the budget was not reached: {self.dim}={self.size} is max_size, and a larger max_size may fit more"
            )
        if not self.monotone:
            notes.append(
                f"the peak falls somewhere as {self.dim} grows (a size compiled has a smaller peak than a smaller "
                f"one): a {self.dim} larger than {self.size + 1} may fit too"
            )
        return notes

    def _rows(self) -> list[tuple[str, str, str]]:
        limit = _budget.limit(self.budget, self.margin)
        peak = self._peak()
        rows = [
            (self.dim, f"{self.size:,}", exact(self.size)),
            (f"peak at {self.dim}={self.size}", _bytes(peak), exact(peak)),
            ("limit", human_bytes(limit), exact(limit)),
            ("budget", human_bytes(self.budget), exact(self.budget)),
            ("margin", _percent(self.margin), ""),
            ("fixed", _bytes(self.fixed_bytes), exact(self.fixed_bytes)),
            (f"per unit of {self.dim}", _bytes(self.per_unit_bytes), exact(self.per_unit_bytes)),
            ("programs compiled", str(self.compiles), ""),
        ]
        if self._line_off_the_answer() is not None:  # the line is not this answer's: see the note
            rows[5:7] = [("fixed", "not shown", ""), (f"per unit of {self.dim}", "not shown", "")]
        return rows

    def __str__(self) -> str:
        text = grid(_HEADERS, self._rows(), right=1)
        if self.cost.buffers and not self.capped:  # what fills the budget at this size
            text += "\n\n" + _buffers.largest(self.cost.buffers, self.cost.live_peak_bytes, 5)
            text += self._peak_phase()
        return "\n".join([text, *self._source(), *(f"note: {note}" for note in self._notes())])

    def _peak_phase(self) -> str:
        """The line that names the phase of the schedule that holds the peak, where known."""
        timeline = self.cost.timeline
        if timeline is None or not timeline.live_bytes:
            return ""
        phase = next(p for p in timeline.phases() if p.start <= timeline.peak_step < p.stop)
        last = phase.stop - 1
        steps = f"step {last:,}" if last == phase.start else f"steps {phase.start:,}-{last:,}"
        return (
            f"\nthe peak is at step {timeline.peak_step:,} of {len(timeline.live_bytes):,}, in {phase.name} "
            f"({steps} of the schedule)"
        )

    def _repr_html_(self) -> str:
        notes = "".join(f"<p>{html.escape(said)}</p>" for said in self._source())
        notes += "".join(f"<p>note: {html.escape(note)}</p>" for note in self._notes())
        page = html_grid(_HEADERS, self._rows(), right=1, css_class="treeshape-fit")
        if self.cost.buffers and not self.capped:
            page += _buffers.largest_html(self.cost.buffers, self.cost.live_peak_bytes, 5)
            if said := self._peak_phase().strip():
                page += f"<p>{html.escape(said)}</p>"
        return page + notes


_HEADERS: Final = ("largest fit", "value", "exact")
_COMPILED_FOR: Final = "compiled for: "  # the line of `str(cost)` that says where its figures come from
_NEAR: Final = 0.1  # how far (a fraction of the peak) the probes' line may pass from the answer's peak


def _bytes(n: float | None) -> str:
    return "not reported" if n is None else human_bytes(round(n))


def _bytes_exact(n: int) -> str:
    """`800 B`, or `1.0 MiB (1,049,856 B)`."""
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


# -- the steps of largest_fit ------------------------------------------------------
def _check_inputs(fn: Any, dim: Any, budget: Any, margin: Any, max_size: Any, progress: Any) -> None:
    """The errors of `largest_fit`'s own arguments, raised before anything is traced."""
    check_callable(fn, "largest_fit")
    check_arguments(dim, budget, margin, max_size)
    check_progress(progress, "largest_fit")


class _Probes:
    """One `largest_fit` call's inputs, prepared as `cost` prepares them, with `dim` bound
    and compiled at the sizes the search asks about: `costs` (each size's `Cost`, compiled
    or from the cache) and `seconds` (how long each size compiled in this call took).
    Sizes 1 and `max_size` are checked against the shapes before anything compiles."""

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dim: str,
        max_size: int,
        donate_argnums: int | Sequence[int],
        donate_argnames: str | Iterable[str],
        target: str | None,
    ) -> None:
        call, donated = prepare(fn, args, kwargs, donate_argnums, donate_argnames, "largest_fit")
        self.call, self.donated, self.dim, self.max_size, self.target = call, donated, dim, max_size, target
        self.leaves = abstract_inputs(call.bound_leaves + call.call_leaves, call.treedef, "largest_fit")
        self.names = free_names(self.leaves)
        check_names(dim, self.names)
        self.costs: dict[int, Cost] = {}
        self.seconds: dict[int, float] = {}
        self.refused: dict[int, tuple[str, float]] = {}  # sizes the target's compiler took no program of
        self.programs = 0  # compiled by this call: each size's, and loop bodies compiled alone
        self.progress = False
        self.host_limit: int | None = None  # the host's bytes a size may take (`host_budget`), None: any
        self.own_peak = _budget.judges_by_own_peak(target)
        self.bind(1)
        self.bind(max_size)  # before compiling anything

    def bind(self, n: int) -> list[Any]:
        """The leaves with `dim` bound to `n`; an error at a size the shapes do not allow."""
        return bind_searched(self.dim, n, self.max_size, self.names, self.leaves, self.call.treedef)

    def cost_at(self, n: int) -> Cost:
        """The `Cost` at size `n`, compiled once (and timed) or taken from the cache."""
        if n not in self.costs:
            bound = self.bind(n)
            call, n_bound = self.call, len(self.call.bound_leaves)
            call_n = Call(call.core, bound[:n_bound], call.bound_treedef, bound[n_bound:], call.call_treedef)
            began = time.perf_counter()
            with _compiles.counting() as programs:
                try:
                    self.costs[n], compiled = cost_of(
                        call_n, self.donated, self.target, "largest_fit", lambda: self._starting(n)
                    )
                finally:
                    self.programs += programs[0]
            if compiled:
                self.seconds[n] = time.perf_counter() - began
        return self.costs[n]

    def _starting(self, n: int) -> None:
        """The progress line of a compile as it starts (not for a size from the cache)."""
        if self.progress:
            where = f" for {self.target!r}" if self.target is not None else ""
            print(f"treeshape.largest_fit: {self.dim}={n}: compiling{where}", file=sys.stderr, flush=True)

    def unknown_peak(self, n: int) -> bool:
        """Whether the target's compiler refused size `n` for want of memory (no peak known)."""
        return n in self.refused and "out of memory" in self.refused[n][0]

    def judged(self, cost: Cost) -> int | None:
        """The peak a size is judged by: libtpu's own on a TPU target, else `peak_bytes`."""
        return _budget.judged(cost, self.own_peak)

    def peak_at(self, n: int, limit: int) -> int:
        """The peak bytes at size `n`; `limit + 1` (does not fit) where the target's compiler
        refuses the size, or fails on one far over the limit."""
        began = time.perf_counter()
        try:
            peak = self.judged(self.cost_at(n))
        except _deviceless.OutOfMemory as e:  # the target's compiler refuses it: it does not fit
            self.refused[n] = (f"the {self.target!r} compiler refuses it (out of memory)", time.perf_counter() - began)
            if n == 1:  # nothing fits: a BudgetError, its peak unknown
                said = str(e).removeprefix("treeshape: ")  # what the compiler said, and the fix
                raise BudgetError(
                    f"treeshape.largest_fit: even {self.dim}=1 does not fit: {said}", None, limit
                ) from None
            return limit + 1
        except jax.errors.JaxRuntimeError as e:
            failed = time.perf_counter() - began
            # XLA:GPU may fail outright on a size far over what a device holds (no tiling
            # for its dots: "Couldn't find output tile sizes"). Such a size does not fit
            # where the line through two smaller sizes that compile puts it well over the
            # limit (with one known below, the size halfway is compiled for the second);
            # anything else is the compiler's error.
            estimate = None if self.target is None else self._judge_failed_size(n, limit)
            if estimate is None:
                fitting = max((m for m, c in self.costs.items() if (self.judged(c) or 0) <= limit), default=None)
                if self.target is not None and fitting is not None:
                    e.add_note(
                        f"treeshape.largest_fit: the {self.target!r} compiler failed at {self.dim}={n}, which the "
                        "sizes below it that compile do not put well over the budget: whether it fits is not known. "
                        f"Pass a max_size below {n} to search below it ({self.dim}={fitting} is the largest size "
                        "compiled that fits)."
                    )
                raise
            on_line, a, b = estimate
            line = f"the line through {self.dim}={a} and {b} puts its peak at {human_bytes(math.ceil(on_line))}"
            self.refused[n] = (f"the {self.target!r} compiler fails on it; {line}", failed)
            return math.ceil(on_line)
        if peak is None:
            raise ValueError(
                f"treeshape.largest_fit: the backend reports no peak for the program at {self.dim}={n} "
                "(Cost.peak_bytes is None: a memory figure is missing), so no size can be checked against the budget."
            )
        if self.host_limit is None:
            return peak
        host = _budget.host_bytes(self.costs[n])
        if host is None:
            raise ValueError(
                f"treeshape.largest_fit: the backend reports no host memory figures for the program at {self.dim}={n} "
                "(a Cost.host_*_bytes is None), so no size can be checked against host_budget. Pass host_budget=None."
            )
        return _budget.on_device_scale(peak, host, limit, self.host_limit)

    def over_host(self, n: int) -> bool:
        """Whether size `n` (compiled) is over `host_limit`."""
        host = _budget.host_bytes(self.costs[n]) if n in self.costs else None
        return self.host_limit is not None and host is not None and host > self.host_limit

    def device_peaks(self, sizes: Iterable[int]) -> dict[int, int]:
        """The device's peak of each of `sizes` compiled (a refused size has none)."""
        judged = {n: self.judged(self.costs[n]) for n in sizes if n in self.costs and n not in self.refused}
        return {n: p for n, p in judged.items() if p is not None}

    def _judge_failed_size(self, n: int, limit: int) -> tuple[float, int, int] | None:
        """The peak at `n` by the line through sizes below it that compile, where that is
        well over `limit` (`_far_over`), compiling halfway to the largest known below when
        fewer than two are known; else None."""
        below = [m for m, c in self.costs.items() if m < n and self.judged(c) is not None]
        if len(below) == 1 and max(below) < (half := (max(below) + n) // 2):
            try:
                self.cost_at(half)
            except (jax.errors.JaxRuntimeError, _deviceless.OutOfMemory):
                return None
        return far_over(n, {m: self.judged(c) for m, c in self.costs.items()}, limit)


def _report_size(probes: _Probes, limit: int, n: int, peak: int, lo: int, hi: int) -> None:
    """The progress line of size `n` (only if this call compiled it), with the range the
    answer is known to be in (`lo < 1`: none); or of a size the target's compiler refused."""
    dim, max_size = probes.dim, probes.max_size
    answer = "none" if lo < 1 else f"{lo}" if hi - lo <= 1 or lo == max_size else f"in {lo}..{hi - 1}"
    if n in probes.seconds:
        verdict = "fits" if peak <= limit else f"over the limit of {limit:,} B"
        if probes.over_host(n):
            verdict = f"host {_budget.host_bytes(probes.costs[n]):,} B over host_budget {probes.host_limit:,} B"
        peak = probes.device_peaks([n]).get(n, peak)
        said, seconds = f"peak {_bytes_exact(peak)}, {verdict}", probes.seconds[n]
    elif n in probes.refused:
        reason, seconds = probes.refused[n]
        said = f"{reason}: does not fit"
    else:
        return
    print(
        f"treeshape.largest_fit: {dim}={n}: {said}; the answer is {answer}; {seconds:.2f} s",
        file=sys.stderr,
        flush=True,
    )


def _check_size_one(
    probes: _Probes, budget: int, margin: float, limit: int, report: Callable[[int, int, int, int], None] | None
) -> None:
    """Raise `BudgetError` where even size 1 does not fit (with its largest buffers), or
    where the target's compiler refuses it."""
    try:
        peak = probes.peak_at(1, limit)
    except BudgetError:
        if report is not None:
            report(1, limit + 1, 0, 1)  # (its progress line says the compiler refused it)
        raise
    if peak > limit and probes.over_host(1):
        if report is not None:
            report(1, peak, 0, 1)
        host, host_limit = _budget.host_bytes(probes.costs[1]), probes.host_limit
        assert host is not None and host_limit is not None  # (`over_host`)
        error = BudgetError(
            f"treeshape.largest_fit: even {probes.dim}=1 does not fit the host's memory: {human_bytes(host)} "
            f"({host:,} B) in host memory kinds > host_budget {human_bytes(host_limit)} ({host_limit:,} B). Raise "
            "host_budget, or offload less to the host (a remat policy that saves on the device).",
            host,
            host_limit,
        )
        error._on_host = True
        raise error
    if peak > limit:
        if report is not None:
            report(1, peak, 0, 1)
        dim, buffers = probes.dim, probes.costs[1].buffers
        kept = f" less a {_percent(margin)} margin" if margin else ""
        raise BudgetError(
            f"treeshape.largest_fit: even {dim}=1 does not fit: peak {human_bytes(peak)} ({peak:,} B) per device > "
            f"limit {human_bytes(limit)} ({limit:,} B: budget {human_bytes(budget)}{kept}). Raise the budget, "
            "shard over more devices, donate buffers (donate_argnums) or shrink the program."
            + (f" Largest at the peak: {_buffers.named(buffers)}." if buffers else ""),
            peak,
            limit,
        )
    if report is not None:
        report(1, peak, 1, probes.max_size + 1)


def _fit(
    probes: _Probes, size: int, known: dict[int, int], budget: int, margin: float, budget_source: str | None
) -> Fit:
    """The answer: `size`, its `Cost`, the line through two sizes compiled (`_line`), and
    whether the peaks `known` grow with the size."""
    # (the device's peaks: `known` holds the host's bytes on their scale where they are the larger)
    peaks = {n: p for n, p in known.items() if n not in probes.refused}
    if probes.host_limit is not None:
        peaks = probes.device_peaks(peaks)
    fixed, per_unit = _line(size, peaks, _budget.limit(budget, margin))
    own = probes.costs[size].compiler_peak_bytes  # (libtpu's, where it judged)
    ordered = sorted(peaks)  # a refused size has no peak
    monotone = all(peaks[a] <= peaks[b] for a, b in zip(ordered, ordered[1:], strict=False))
    return Fit(
        probes.dim,
        size,
        probes.costs[size],
        fixed,
        per_unit,
        budget,
        probes.programs,
        margin=margin,
        monotone=monotone,
        capped=size == probes.max_size,
        budget_source=budget_source,
        judged_by=_budget.JUDGED_BY_OWN_PEAK if probes.own_peak and own is not None else None,
        refused_next=size + 1 in probes.refused and "out of memory" in probes.refused[size + 1][0],
    )


def _line(size: int, peaks: dict[int, int], limit: int) -> tuple[float | None, float | None]:
    """`fixed_bytes` and `per_unit_bytes`: the line through the answer and the largest size
    compiled that fits at most half of it (a span wide enough that small sizes' padding
    does not tilt it, and near the answer); at size 1, through 1 and the size above it.
    `(None, None)` where no second size has a peak."""
    if size > 1:
        other = max(n for n, p in peaks.items() if n <= size // 2 and p <= limit)  # (size 1 fits)
    else:
        other = min((n for n in peaks if n > size), default=size)
    if other == size:
        return None, None
    per_unit = (peaks[size] - peaks[other]) / (size - other)
    return peaks[size] - per_unit * size, per_unit


def _report_fit(fit: Fit, peak: int, limit: int, refused: int, seconds: float) -> None:
    """The progress summary line: the answer, and the programs compiled (and sizes the
    target's compiler refused) in `seconds`."""
    dim, size = fit.dim, fit.size
    after = "is max_size: the budget was not reached" if fit.capped else f"{dim}={size + 1} does not"
    also = f", {refused} size{'s' if refused != 1 else ''} refused by the compiler" if refused else ""
    print(
        f"treeshape.largest_fit: {dim}={size} fits (peak {peak:,} B, limit {limit:,} B) and {after}; "
        f"{fit.compiles} programs compiled{also} in "
        f"{seconds:.1f} s",
        file=sys.stderr,
        flush=True,
    )


# -- the public function -------------------------------------------------------
def largest_fit(
    fn: Callable[..., Any],
    /,
    *args: Any,
    dim: str,
    budget: float | None = None,
    margin: float = 0.0,
    max_size: int = 2**20,
    donate_argnums: int | Sequence[int] = (),
    donate_argnames: str | Iterable[str] = (),
    progress: bool = False,
    target: str | None = None,
    host_budget: float | None = None,
    **kwargs: Any,
) -> Fit:
    """Find the largest size of dimension `dim` for which `fn`'s compiled program fits `budget`.

    The largest `n` in `1..max_size` for which [treeshape.cost][]`(fn, *args, **kwargs)`,
    with `dim` bound to `n`, has `peak_bytes <= (1 - margin) * budget`: the largest batch
    a device can take. The answer is XLA's, not an extrapolation: the program is compiled
    at `n`, which fits, and at `n + 1`, which does not (unless `n == max_size`), in at most
    `ceil(log2(max_size)) + 4` compilations, each cached as `cost` caches it. How it
    searches: [The largest batch that fits](../guide/fit.md#the-largest-batch-that-fits).

    Args:
        fn: Any callable `cost` takes.
        *args: As for `cost`; with `kwargs` they hold the symbolic dimension `dim`
            (`(b,) = jax.export.symbolic_shape("b")`), and no other free one.
        dim: The name of the symbolic dimension to size.
        budget: The bytes one device has; by default the device's reported memory limit
            (required where there is none, as on CPU), or what JAX lets XLA use on `target`.
        margin: The fraction of `budget` to keep free, in `[0, 1)`.
        max_size: The largest size to consider.
        donate_argnums: As for `cost`.
        donate_argnames: As for `cost`.
        progress: Print a line to standard error per size compiled, and a summary.
        target: As for `cost`; a size its compiler refuses for want of memory does not fit.
        host_budget: Where given, a size fits only where also `host_argument_bytes +
            host_output_bytes + host_temp_bytes - host_alias_bytes <= host_budget`.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Fit][].

    Raises:
        TypeError: `fn` is not callable, or an argument has the wrong type.
        ValueError: an argument is out of range, `dim` is not the inputs' one free dimension,
            no budget is known, size 1 does not fit, a size the shapes do not allow, or no
            memory figures ([the cases](../guide/fit.md#its-arguments-and-errors)).

    Errors raised by `fn` itself propagate unchanged.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")  # the batch size, free
        >>> def mlp(w1, w2, x):
        ...     return jax.nn.relu(x @ w1) @ w2
        >>> w1 = jax.ShapeDtypeStruct((784, 256), jnp.float32)
        >>> w2 = jax.ShapeDtypeStruct((256, 10), jnp.float32)
        >>> x = jax.ShapeDtypeStruct((b, 784), jnp.float32)
        >>> fit = ts.largest_fit(mlp, w1, w2, x, dim="b", budget=2**20)  # 1 MiB
        >>> fit.size, fit.cost.peak_bytes, fit.compiles <= 8, fit.monotone, fit.capped
        (56, 1048256, True, True, False)
    """
    _check_inputs(fn, dim, budget, margin, max_size, progress)
    check_host_budget(host_budget)
    donate_argnums, donate_argnames = check_donation(donate_argnums, donate_argnames, "largest_fit")
    target = check_target(target, "largest_fit")
    return search(
        fn,
        args,
        kwargs,
        dim,
        budget,
        margin,
        int(max_size),
        donate_argnums,
        donate_argnames,
        progress,
        target,
        host_budget=host_budget,
    )[0]


def search(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dim: str,
    budget: float | None,
    margin: float,
    max_size: int,
    donate_argnums: int | Sequence[int],
    donate_argnames: str | Iterable[str],
    progress: bool,
    target: str | None,
    host_budget: float | None = None,
) -> tuple[Fit, "Sizes"]:
    """`largest_fit` of checked arguments, and the sizes it compiled (to cost more sizes
    of the same call, as `ts.plan` does)."""
    start = time.perf_counter()
    probes = _Probes(fn, args, kwargs, dim, max_size, donate_argnums, donate_argnames, target)
    probes.progress = progress
    probes.host_limit = None if host_budget is None else math.floor(host_budget)
    variable = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    budget, budget_source = _budget.budget_of(budget, target, variable, lambda: probes.cost_at(1).device_bytes)
    limit = _budget.limit(budget, margin)
    report = (lambda n, peak, lo, hi: _report_size(probes, limit, n, peak, lo, hi)) if progress else None
    _check_size_one(probes, budget, margin, limit, report)
    size, known = find_size(lambda n: probes.peak_at(n, limit), limit, max_size, report, probes.unknown_peak)
    fit = _fit(probes, size, known, budget, margin, budget_source)
    if progress:
        peak = probes.device_peaks([size]).get(size, known[size])
        _report_fit(fit, peak, limit, len(probes.refused), time.perf_counter() - start)
    return fit, Sizes(probes)


class Sizes:
    """The sizes one `largest_fit` search compiled, and a way to cost more of the same call."""

    def __init__(self, probes: _Probes) -> None:
        self._probes = probes

    @property
    def costs(self) -> dict[int, Cost]:
        """Each size compiled (or found in the cache) by the search, and its `Cost`."""
        return dict(self._probes.costs)

    @property
    def programs(self) -> int:
        """The programs compiled so far, loop bodies compiled alone included."""
        return self._probes.programs

    def cost_at(self, n: int) -> Cost:
        """The `Cost` at size `n` (cached: a size the search compiled compiles nothing)."""
        return self._probes.cost_at(n)


# `Fit.__module__` is "treeshape", so doctest would not find its docstring in this module.
__test__ = {"Fit": Fit}
