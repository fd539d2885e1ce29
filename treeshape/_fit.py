"""`largest_fit` and `Fit`: the largest size of one symbolic dimension for which a
function's compiled program fits a memory budget, found by compiling it (`_cost`) at a
few sizes and reading XLA's own figures, never by extrapolating them.

How a call flows: the inputs are prepared once as `cost` prepares them (split,
flattened, Structures replaced by their trees, donation resolved); their free dimension
names are read (`_dims.free_names`), and at each size the search asks about, the
dimension is bound (`_dims.check_sizes`, `_dims.bind_leaves`) and the call's `Cost` is
taken from `_cost.cost_of` (cached, so asking again compiles nothing).

The search (`_search`) keeps a bracket: `lo`, the largest size compiled that fits, and
`hi`, the smallest size above it compiled that does not (`max_size + 1` until one is
found), and compiles only sizes strictly between them; it ends when `hi == lo + 1` (or
`lo == max_size`), so the answer fits and the next size was compiled and does not. Sizes
are chosen by lines through compiled peaks: a line that is right lands on the answer
`n`, and the next line, through `n`, on `n + 1`, so a program whose peak is linear in
the size takes 4 compilations (sizes 1, 64, `n`, `n + 1`). For other curves (steps from
padding, a quadratic in a sequence length) the lines are safeguarded: doubling after
`_LINE_STEPS` of them while no size is known not to fit, then the Illinois rule and the
ITP method's projection, so that the search never takes more than
`2 * ceil(log2(max_size)) + 10` compilations.
"""

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from ._cost import Cost, cost_of, exact, prepare
from ._dims import DimOverflow, bind_leaves, check_sizes, free_names
from ._infer import Call, abstract_inputs, check_callable, input_path
from ._leaf import TooLarge, check_extents, human_bytes, leaf_str
from ._sharding import split_problem
from ._table import grid, html_grid


# The second probe: large enough that XLA's small-size effects (minimum buffer sizes,
# other kernels for a single row) do not distort the line, small enough to compile fast.
_SECOND_PROBE: Final = 64
# Sizes chosen by a line before the search falls back to doubling, while no size is
# known not to fit.
_LINE_STEPS: Final = 4
# Compilations allowed beyond bisection's once the answer is bracketed.
_SLACK: Final = 4


@dataclasses.dataclass(frozen=True)
class Fit:
    """The largest size of a dimension for which a program fits a memory budget.

    Attributes:
        dim: The name of the symbolic dimension that was searched.
        size: The size found, `n`: the program fits at `n`, and at `n + 1` it does not
            (or `n` is `max_size`).
        cost: The [treeshape.Cost][] of the program at `n`, per device.
        fixed_bytes: The peak bytes that do not grow with the dimension, from the line
            through the two probes (sizes 1 and 64, or `max_size` if smaller); `None`
            if only size 1 was compiled.
        per_unit_bytes: The peak bytes that one more unit of the dimension adds, from
            the same line; `None` if only size 1 was compiled.
        budget: The bytes one device has (given, or the device's reported limit).
        compiles: How many programs the search compiled (cached sizes compile nothing).
        margin: The fraction of `budget` kept free: the peak at `n` is at most
            `(1 - margin) * budget`.

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

    def _rows(self) -> list[tuple[str, str, str]]:
        limit = _limit(self.budget, self.margin)
        peak = self.cost.peak_bytes
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
        return rows

    def __str__(self) -> str:
        return grid(_HEADERS, self._rows(), right=1)

    def _repr_html_(self) -> str:
        return html_grid(_HEADERS, self._rows(), right=1, css_class="treeshape-fit")


_HEADERS: Final = ("largest fit", "value", "exact")


def _bytes(n: float | None) -> str:
    return "not reported" if n is None else human_bytes(round(n))


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _limit(budget: int, margin: float) -> int:
    """The most bytes the peak may take: `(1 - margin) * budget`, rounded down."""
    return math.floor((1 - margin) * budget)


# -- arguments ---------------------------------------------------------------------
def _real(value: Any, what: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"treeshape.largest_fit: {what} must be a number, got {type(value).__name__} {value!r} ({example})."
        )
    return float(value)


def check_arguments(dim: Any, budget: Any, margin: Any, max_size: Any) -> None:
    """Raise `TypeError` / `ValueError` for a `largest_fit` argument of the wrong type or range."""
    if not isinstance(dim, str):
        raise TypeError(
            f"treeshape.largest_fit: dim must be the name of a symbolic dimension (a str such as 'b'), got "
            f"{type(dim).__name__} {dim!r}."
        )
    if budget is not None:
        example = "e.g. budget=16 * 2**30 for 16 GiB"
        if not math.isfinite(_real(budget, "budget", example)) or budget < 1:
            raise ValueError(
                f"treeshape.largest_fit: budget must be a number of bytes >= 1 ({example}), got {budget!r}."
            )
    example = "e.g. margin=0.1 keeps 10% of the budget free"
    if not 0 <= _real(margin, "margin", example) < 1:
        raise ValueError(
            f"treeshape.largest_fit: margin must be the fraction of the budget kept free, in [0, 1) ({example}), "
            f"got {margin!r}."
        )
    if isinstance(max_size, bool) or not isinstance(max_size, numbers.Integral):
        raise TypeError(
            f"treeshape.largest_fit: max_size must be an int >= 1, got {type(max_size).__name__} {max_size!r}."
        )
    if max_size < 1:
        raise ValueError(
            f"treeshape.largest_fit: max_size must be >= 1 (a dimension's sizes start at 1), got {max_size}."
        )


def check_names(dim: str, names: Sequence[str], command_line: bool = False) -> None:
    """`dim` must be the only free dimension of the inputs (`names`); the fixes are told
    in Python, or for `command_line` in specs."""
    if not names:
        symbolic = (
            f"a name in a spec, such as f32[{dim},784]"
            if command_line
            else f"a symbolic size: `({dim},) = jax.export.symbolic_shape({dim!r})`, then inputs such as "
            f"`jax.ShapeDtypeStruct(({dim}, 784), jnp.float32)`"
        )
        raise ValueError(
            f"treeshape.largest_fit: dim={dim!r}, but the inputs have no free dimension. Give the dimension to "
            f"search {symbolic}."
        )
    listed = ", ".join(names)
    if dim not in names:
        raise ValueError(
            f"treeshape.largest_fit: dim={dim!r} is not a free dimension of the inputs; their free dimensions are "
            f"{listed}. Pass one of them as dim."
        )
    others = [name for name in names if name != dim]
    if others:
        bind = ", ".join(f"{name}=..." for name in others)
        sizes = (
            "concrete sizes in the specs" if command_line else f"`s.bind({bind})` for a Structure, or concrete shapes"
        )
        raise ValueError(
            f"treeshape.largest_fit: the inputs' free dimensions are {listed}, and only dim={dim!r} is searched. "
            f"Give the others sizes first: {sizes}."
        )


# -- the search --------------------------------------------------------------------
class _Bracket:
    """The search's state: the peaks compiled so far, `lo` (the largest size compiled that
    fits) and `hi` (the smallest size above `lo` compiled that does not; `max_size + 1`
    until there is one). Sizes are compiled strictly between them only."""

    def __init__(self, peak_at: Callable[[int], int], limit: int, max_size: int) -> None:
        self.peak_at, self.limit = peak_at, limit
        self.known = {1: peak_at(1)}
        self.lo, self.hi = 1, max_size + 1

    def compile(self, n: int) -> bool:
        """Compile size `n` (in `(lo, hi)`); whether it fits."""
        self.known[n] = peak = self.peak_at(n)
        if peak <= self.limit:
            self.lo = n
            return True
        self.hi = n
        return False

    def clamp(self, n: int) -> int:
        return min(max(n, self.lo + 1), self.hi - 1)


def _search(peak_at: Callable[[int], int], limit: int, max_size: int) -> tuple[int, dict[int, int]]:
    """The size `n` in `1..max_size` with `peak_at(n) <= limit` and `peak_at(n + 1) > limit`
    (or `n == max_size`), and every peak compiled on the way. Size 1 must fit.

    1. Probes: size 1 and `_SECOND_PROBE`.
    2. Until a size does not fit: the line through the two largest sizes that fit says
       where the peak reaches `limit` (`_LINE_STEPS` times), then doubling.
    3. Between `lo` and `hi`: the line through both (regula falsi, with the Illinois
       rule: an end kept twice in a row counts half, so that the sizes do not creep up
       from one side; and where `lo` was kept twice and `hi > 4 * lo`, at least their
       geometric mean, for curves that bend up), held within `[hi - 2**k, lo + 2**k]`
       for a `k` that drops by one each step (the projection of the ITP method), so that
       this phase takes at most `ceil(log2(hi - lo)) + _SLACK` compilations whatever
       the curve.
    """
    s = _Bracket(peak_at, limit, max_size)
    if max_size > 1:
        s.compile(min(_SECOND_PROBE, max_size))
    steps = 0
    while s.hi - s.lo > 1 and s.hi > max_size:
        a, b = sorted(n for n in s.known if n <= s.lo)[-2:]  # every size compiled that fits is <= lo
        rise, run = s.known[b] - s.known[a], b - a
        if steps >= _LINE_STEPS:
            n = 2 * s.lo
        elif rise <= 0:  # no growth: try the largest size
            n = max_size
        else:
            n = s.lo + (limit - s.known[s.lo]) * run // rise
        s.compile(s.clamp(n))
        steps += 1
    if s.hi - s.lo <= 1:
        return s.lo, s.known
    k = math.ceil(math.log2(s.hi - s.lo)) + _SLACK  # the bracket is at most 2**k wide
    weight_lo = weight_hi = 1  # Illinois: an end kept twice in a row counts half as much
    last: bool | None = None
    while s.hi - s.lo > 1:
        below = (limit - s.known[s.lo]) * weight_hi  # >= 0: how far lo's peak is under the limit
        above = (s.known[s.hi] - limit) * weight_lo  # > 0: how far hi's is over
        n = s.lo + below * (s.hi - s.lo) // (below + above)
        if weight_hi > 1 and s.hi > 4 * s.lo:  # a curve that bends up (a quadratic) far from hi
            n = max(n, math.isqrt(s.lo * s.hi))
        k -= 1
        n = min(max(n, s.hi - 2**k), s.lo + 2**k)  # leaves a bracket at most 2**k wide
        fits = s.compile(s.clamp(n))
        if fits:
            weight_lo, weight_hi = 1, weight_hi * 2 if last else 1
        else:
            weight_lo, weight_hi = weight_lo * 2 if last is False else 1, 1
        last = fits
    return s.lo, s.known


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
    **kwargs: Any,
) -> Fit:
    """Find the largest size of dimension `dim` for which `fn`'s compiled program fits `budget`.

    The largest `n` in `1..max_size` for which [treeshape.cost][]`(fn, *args, **kwargs)`,
    with `dim` bound to `n`, has `peak_bytes <= (1 - margin) * budget`: the largest batch
    (or sequence length, or number of parallel starts) a device can take. The inputs are
    taken as `cost` takes them (arrays, `jax.ShapeDtypeStruct`s, Structures, static
    values, bound in a `functools.partial` / `jax.tree_util.Partial`, donation included),
    and hold the symbolic dimension `dim` (`(b,) = jax.export.symbolic_shape("b")`,
    `jax.ShapeDtypeStruct((b, 784), jnp.float32)`, or a Structure of such leaves).

    The answer is XLA's, not an extrapolation: the program is compiled at `n`, which fits,
    and at `n + 1`, which does not (unless `n == max_size`). Two probes (sizes 1 and 64)
    give a line, `fixed_bytes + per_unit_bytes * n`, which says where to look; the
    compilations at the sizes it picks check it. A program whose peak is linear in `n`
    takes 4 compilations (at most 8); one whose peak has steps or grows faster than
    linearly gets a few more, and never more than `2 * ceil(log2(max_size)) + 10` (50).
    Each size's `Cost` is cached as `cost` caches it, so asking again compiles nothing.

    The search compiles only sizes between the largest size seen to fit and the smallest
    above it seen not to, so `n` is the largest size it saw fit, next to one that does
    not. When the peak grows with the size (as it does for almost every program), that
    is the largest size that fits. Where XLA's peak falls somewhere as the size grows
    (another layout at a larger size), a larger size past one that does not fit may fit
    too, unseen.

    Args:
        fn: Any callable `cost` takes.
        *args: As for `cost`; together with `kwargs` they hold the free dimension `dim`,
            and no other.
        dim: The name of the symbolic dimension to size.
        budget: The bytes one device has. Defaults to the device's reported memory limit
            ([treeshape.Cost][]`.device_bytes`); required where there is none (CPU).
        margin: The fraction of `budget` to keep free, in `[0, 1)` (for the runtime,
            fragmentation): `0.1` fits the peak within 90% of it.
        max_size: The largest size to consider.
        donate_argnums: As for `cost`.
        donate_argnames: As for `cost`.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Fit][]: the size, the `Cost` there, the probes' line, the budget and
        the number of programs compiled.

    Raises:
        TypeError: `fn` is not callable, or `dim`, `budget`, `margin` or `max_size` has the
            wrong type.
        ValueError: `budget`, `margin` or `max_size` is out of range; `dim` is not a free
            dimension of the inputs, or others are free too; no `budget` is given and the
            device reports no limit; the program does not fit even at size 1 (the message
            gives its peak and the limit); a size breaks a constraint of the dimension's
            symbolic scope; or the backend reports no memory figures.

    Errors raised by `fn` itself propagate unchanged.

    Examples:
        >>> import jax
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")  # the batch size, free
        >>> def mlp(w1, w2, x):
        ...     return jax.nn.relu(x @ w1) @ w2
        >>> w1 = jax.ShapeDtypeStruct((784, 256), jnp.float32)
        >>> w2 = jax.ShapeDtypeStruct((256, 10), jnp.float32)
        >>> x = jax.ShapeDtypeStruct((b, 784), jnp.float32)
        >>> fit = ts.largest_fit(mlp, w1, w2, x, dim="b", budget=2**20)  # 1 MiB
        >>> fit.size, fit.cost.peak_bytes, fit.compiles <= 8
        (56, 1048256, True)
        >>> ts.cost(mlp, w1, w2, jax.ShapeDtypeStruct((57, 784), jnp.float32)).peak_bytes > 2**20
        True
    """
    check_callable(fn, "largest_fit")
    check_arguments(dim, budget, margin, max_size)
    max_size = int(max_size)
    call, donated = prepare(fn, args, kwargs, donate_argnums, donate_argnames, "largest_fit")
    leaves = abstract_inputs(call.bound_leaves + call.call_leaves, call.treedef, "largest_fit")
    names = free_names(leaves)
    check_names(dim, names)
    n_bound = len(call.bound_leaves)
    costs: dict[int, Cost] = {}
    compiles = 0

    def bind_at(n: int) -> list[Any]:
        """The leaves with `dim` bound to `n`; an error at a size the shapes do not allow."""
        if n == 1:
            fix = f"The search starts at {dim}=1, so the shapes must allow it: write them so that {dim} counts from 1"
            fix += f" (an offset such as `{dim} + 7`, not a difference such as `{dim} - 8` or a lower bound)."
        else:
            fix = f"The search tries sizes up to max_size={max_size}: pass a max_size that the shapes allow."
        try:
            sizes = check_sizes({dim: n}, names, leaves, "largest_fit")
        except ValueError as e:
            raise ValueError(f"{e} {fix}") from None
        try:
            bound, negative = bind_leaves(leaves, sizes)
            check_extents(bound)
        except (DimOverflow, TooLarge) as e:
            problem = e.problem if isinstance(e, DimOverflow) else f"{leaf_str(e.leaf)} {e.problem}"
            where = input_path(leaves, call.treedef, e.index)
            raise ValueError(f"treeshape.largest_fit: at {dim}={n}, {where}: {problem}. {fix}") from None
        for i, leaf in enumerate(bound):  # a size the mesh does not divide: JAX's IndivisibleError otherwise
            unfit = split_problem(leaf) if leaf is not leaves[i] and hasattr(leaf, "sharding") else None
            if unfit is not None:
                where = input_path(leaves, call.treedef, i)
                raise ValueError(f"treeshape.largest_fit: at {dim}={n}, the sharding of {where} does not fit: {unfit}.")
        if negative:
            i = negative[0]
            raise ValueError(
                f"treeshape.largest_fit: at {dim}={n}, {input_path(leaves, call.treedef, i)} has a negative size "
                f"({leaves[i].shape} gives {bound[i].shape}). {fix}"
            )
        return bound

    bind_at(max_size)  # before compiling anything

    def cost_at(n: int) -> Cost:
        nonlocal compiles
        if n not in costs:
            bound = bind_at(n)
            call_n = Call(call.core, bound[:n_bound], call.bound_treedef, bound[n_bound:], call.call_treedef)
            costs[n], compiled = cost_of(call_n, donated)
            compiles += compiled
        return costs[n]

    first = cost_at(1)
    if budget is None:
        if first.device_bytes is None:
            raise ValueError(
                "treeshape.largest_fit: no budget given, and the device reports no memory limit "
                "(Cost.device_bytes is None, as on CPU). Pass the bytes one device has, e.g. budget=16 * 2**30 "
                "for 16 GiB."
            )
        budget = first.device_bytes
    budget = math.floor(budget)  # an int
    limit = _limit(budget, margin)

    def peak_at(n: int) -> int:
        peak = cost_at(n).peak_bytes
        if peak is None:
            raise ValueError(
                f"treeshape.largest_fit: the backend reports no peak for the program at {dim}={n} "
                "(Cost.peak_bytes is None: a memory figure is missing), so no size can be checked against the budget."
            )
        return peak

    peak = peak_at(1)
    if peak > limit:
        kept = f" less a {_percent(margin)} margin" if margin else ""
        raise ValueError(
            f"treeshape.largest_fit: even {dim}=1 does not fit: peak {human_bytes(peak)} ({peak:,} B) per device > "
            f"limit {human_bytes(limit)} ({limit:,} B: budget {human_bytes(budget)}{kept}). Raise the budget, "
            "shard over more devices, donate buffers (donate_argnums) or shrink the program."
        )
    size, known = _search(peak_at, limit, max_size)
    probe = min(_SECOND_PROBE, max_size)
    fixed = per_unit = None
    if probe > 1:
        per_unit = (known[probe] - known[1]) / (probe - 1)
        fixed = known[1] - per_unit
    return Fit(dim, size, costs[size], fixed, per_unit, budget, compiles, margin=margin)


# `Fit.__module__` is "treeshape", so doctest would not find its docstring in this module.
__test__ = {"Fit": Fit}
