"""A `largest_fit` request checked, before anything compiles: its own arguments
(`check_arguments`, `check_progress`), the one free dimension it searches (`check_names`),
the sizes the inputs' shapes allow (`bind_at`, `largest_allowed`, `check_request`; and
`bind_searched`, a search's size bound with its error told by the input's path), and
the errors a search raises where a size does not fit: `FitError`, `SizeError` (a size the
shapes do not allow) and `BudgetError` (even size 1 does not fit). `plan` checks its own
arguments with the same functions, each error naming the function asked."""

import math
import numbers
from collections.abc import Sequence
from typing import Any, Final

from .._call import input_path
from .._dims import DimOverflow, bind_leaves, check_sizes, free_names
from .._leaf import leaf_str
from .._shapes import extent_problem
from .._sharding import split_problem


class FitError(ValueError):
    """What [treeshape.largest_fit][] and [treeshape.plan][] raise where a size does not
    fit: a [treeshape.SizeError][] (a size of the dimension that the inputs' shapes do not
    allow) or a [treeshape.BudgetError][] (even size 1 does not fit). A `ValueError`, as
    before it had a name.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")
        >>> x = jax.ShapeDtypeStruct((b, 1024), jnp.float32)  # 8 KiB per row, in and out
        >>> try:
        ...     ts.largest_fit(jnp.tanh, x, dim="b", budget=4096)
        ... except ts.FitError as e:
        ...     print(type(e).__name__, isinstance(e, ValueError))
        BudgetError True
    """

    __module__ = "treeshape"


class SizeError(FitError):
    """A size of the searched dimension that the inputs' shapes do not allow: a negative
    size at `n`, more elements or bytes than XLA counts, or a sharding that does not divide
    it (raised before that size compiles).

    Attributes:
        n: The size.
        index: The input leaf at fault (in the order of the call's flattened inputs);
            `None` for a broken constraint of the dimension's symbolic scope.
        problem: What is wrong at `n`, without the function's name or the fix.
        fix: The fix for a sharding that does not divide, else `""`.
        largest: The largest size the shapes allow, where known, else `None`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")
        >>> x = jax.ShapeDtypeStruct((b - 8, 100), jnp.float32)  # negative at b = 1
        >>> try:
        ...     ts.largest_fit(jnp.tanh, x, dim="b", budget=2**20)
        ... except ts.SizeError as e:
        ...     print(e.n, e.problem)
        1 has a negative size ((b - 8, 100) gives (-7, 100))
    """

    __module__ = "treeshape"

    def __init__(self, message: str, n: int, index: int | None, fix: str = "", problem: str | None = None) -> None:
        super().__init__(message)
        self.n, self.index, self.fix = n, index, fix
        self.problem = message if problem is None else problem
        self.largest: int | None = None  # the largest size the shapes allow, where `check_request` found it


class BudgetError(FitError):
    """Even size 1 does not fit: its peak bytes per device are over the limit (the budget
    less the margin), or the target's compiler refuses it for want of memory.

    Attributes:
        peak: The peak bytes per device at size 1; `None` where the target's compiler
            refused it (libtpu does, past a chip's memory), its peak unknown.
        limit: The bytes the peak may take: `(1 - margin) * budget`.

    Where it is the host's memory that size 1 does not fit (`largest_fit(...,
    host_budget=)`), `peak` is its host bytes and `limit` the host budget.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> (b,) = jax.export.symbolic_shape("b")
        >>> x = jax.ShapeDtypeStruct((b, 1024), jnp.float32)
        >>> try:
        ...     ts.largest_fit(jnp.tanh, x, dim="b", budget=4096)
        ... except ts.BudgetError as e:
        ...     print(e.peak, e.limit)
        8192 4096
    """

    __module__ = "treeshape"
    _on_host = False  # whether it is the host's memory (the command line's advice names its option)

    def __init__(self, message: str, peak: int | None, limit: int) -> None:
        super().__init__(message)
        self.peak, self.limit = peak, limit


# -- arguments ---------------------------------------------------------------------
def _real(value: Any, what: str, example: str, who: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"treeshape.{who}: {what} must be a number, got {type(value).__name__} {value!r} ({example}).")
    return float(value)


def check_host_budget(host_budget: Any, who: str = "largest_fit") -> None:
    """Raise `TypeError` / `ValueError` for a `host_budget` that is not `None` or a number of bytes >= 1."""
    if host_budget is None:
        return
    example = "e.g. host_budget=64 * 2**30 for 64 GiB of host memory"
    if not math.isfinite(_real(host_budget, "host_budget", example, who)) or host_budget < 1:
        raise ValueError(
            f"treeshape.{who}: host_budget must be a number of bytes >= 1 ({example}), or None for no limit on "
            f"the host's memory, got {host_budget!r}."
        )


def check_arguments(dim: Any, budget: Any, margin: Any, max_size: Any, who: str = "largest_fit") -> None:
    """Raise `TypeError` / `ValueError` for an argument of `largest_fit` (or of `who`, which
    takes them as it does) of the wrong type or range."""
    if not isinstance(dim, str):
        raise TypeError(
            f"treeshape.{who}: dim must be the name of a symbolic dimension (a str such as 'b'), got "
            f"{type(dim).__name__} {dim!r}."
        )
    if budget is not None:
        example = "e.g. budget=16 * 2**30 for 16 GiB"
        if not math.isfinite(_real(budget, "budget", example, who)) or budget < 1:
            raise ValueError(f"treeshape.{who}: budget must be a number of bytes >= 1 ({example}), got {budget!r}.")
    example = "e.g. margin=0.1 keeps 10% of the budget free"
    if not 0 <= _real(margin, "margin", example, who) < 1:
        raise ValueError(
            f"treeshape.{who}: margin must be the fraction of the budget kept free, in [0, 1) ({example}), "
            f"got {margin!r}."
        )
    if isinstance(max_size, bool) or not isinstance(max_size, numbers.Integral):
        raise TypeError(f"treeshape.{who}: max_size must be an int >= 1, got {type(max_size).__name__} {max_size!r}.")
    if max_size < 1:
        raise ValueError(f"treeshape.{who}: max_size must be >= 1 (a dimension's sizes start at 1), got {max_size}.")


def check_progress(progress: Any, who: str) -> None:
    """`progress` must be a bool (`largest_fit`'s and `plan`'s alike)."""
    if not isinstance(progress, bool):
        raise TypeError(f"treeshape.{who}: progress must be True or False, got {type(progress).__name__} {progress!r}.")


def check_max_seconds(max_seconds: Any, who: str = "plan") -> None:
    """Raise `TypeError` / `ValueError` for a `max_seconds` that is not `None` or a positive,
    finite number of seconds."""
    if max_seconds is None:
        return
    example = "e.g. max_seconds=0.02 for 20 ms a step, or None for no bound"
    if not math.isfinite(_real(max_seconds, "max_seconds", example, who)) or max_seconds <= 0:
        raise ValueError(
            f"treeshape.{who}: max_seconds must be a positive, finite number of seconds, the longest a step may "
            f"take ({example}), got {max_seconds!r}."
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


# -- sizes the shapes allow -------------------------------------------------------------
def bind_at(dim: str, n: int, names: Sequence[str], leaves: Sequence[Any]) -> list[Any]:
    """`leaves` with `dim` bound to `n`.

    Raises:
        SizeError: `n` breaks a constraint of the dimension's symbolic scope, or makes a
            size negative, or an array XLA cannot count (which would end the process).
    """
    try:
        sizes = check_sizes({dim: n}, names, leaves, "largest_fit")
    except ValueError as e:
        raise SizeError(str(e).removeprefix("treeshape.largest_fit: "), n, None) from None
    try:
        bound, negative = bind_leaves(leaves, sizes)
    except DimOverflow as e:
        raise SizeError(e.problem, n, e.index) from None
    if negative:
        i = negative[0]
        raise SizeError(f"has a negative size ({leaves[i].shape} gives {bound[i].shape})", n, i)
    for i, leaf in enumerate(bound):
        if leaf is leaves[i]:
            continue
        problem = extent_problem(leaf.shape, leaf.dtype)
        if problem is not None:  # XLA would abort the process on it
            raise SizeError(f"({leaf_str(leaf)}) {problem}", n, i)
        unfit = split_problem(leaf) if hasattr(leaf, "sharding") else None
        if unfit is not None:  # JAX's IndivisibleError otherwise
            raise SizeError(f"has a sharding that does not fit: {unfit}", n, i, fix=_SPLIT_FIX.format(dim=dim))
    return bound


_SPLIT_FIX: Final = (
    "Write the dimension so that every size divides (`8*{dim}` for 8 devices, {dim} then counting the rows on "
    "each device), or constrain it (`mod({dim}, 8) == 0`) and search a multiple."
)


def largest_allowed(dim: str, max_size: int, names: Sequence[str], leaves: Sequence[Any]) -> int:
    """The largest size in `1..max_size` that `bind_at` allows, size 1 allowed (for a fix
    to suggest: the sizes an array grows with are allowed up to some size)."""
    lo, hi = 1, max_size
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            bind_at(dim, mid, names, leaves)
        except SizeError:
            hi = mid - 1
        else:
            lo = mid
    return lo


def bind_searched(
    dim: str, n: int, max_size: int, names: Sequence[str], leaves: Sequence[Any], treedef: Any
) -> list[Any]:
    """`bind_at` for a search of sizes `1..max_size`, its `SizeError` told as the user wrote
    the inputs (the flat `leaves` of the call `treedef`): the input at fault by its path,
    and the fix (a sharding's; for size 1, shapes that count from 1; else the largest
    `max_size` the shapes allow, its `largest`)."""
    try:
        return bind_at(dim, n, names, leaves)
    except SizeError as e:
        where = "" if e.index is None else f"at {dim}={n}, {input_path(list(leaves), treedef, e.index)} "
        largest = None
        if e.fix:
            fix = e.fix
        elif n == 1:
            fix = f"The search starts at {dim}=1, so the shapes must allow it: write them so that {dim} counts "
            fix += f"from 1 (an offset such as `{dim} + 7`, not a difference such as `{dim} - 8` or a lower bound)."
        else:
            largest = largest_allowed(dim, max_size, names, leaves)
            fix = f"The search tries sizes up to max_size={max_size}: pass max_size={largest}, which they allow."
        error = SizeError(f"treeshape.largest_fit: {where}{str(e).rstrip('.')}. {fix}", n, e.index, e.fix, e.problem)
        error.largest = largest
        raise error from None


def check_request(
    dim: Any, budget: Any, margin: Any, max_size: Any, leaves: Sequence[Any], command_line: bool = False
) -> None:
    """A `largest_fit` request checked before anything is traced or compiled: its arguments,
    `dim` the only free dimension of `leaves` (the abstract inputs), and sizes 1 and
    `max_size` allowed by their shapes (the command line checks its specs so, before it
    imports the user's module; fixes are told in specs for `command_line`).

    Raises:
        TypeError, ValueError: an argument of the wrong type or range, or a wrong `dim`.
        SizeError: the shapes refuse size 1 or `max_size`; for `max_size`, its `largest`
            is the largest size they allow.
    """
    check_arguments(dim, budget, margin, max_size)
    names = free_names(leaves)
    check_names(dim, names, command_line)
    for n in (1, max_size):
        try:
            bind_at(dim, n, names, leaves)
        except SizeError as e:
            if n != 1:
                e.largest = largest_allowed(dim, max_size, names, leaves)
            raise


# The public classes report module `treeshape`, so doctest would not find their examples here.
__test__ = {"FitError": FitError, "SizeError": SizeError, "BudgetError": BudgetError}
