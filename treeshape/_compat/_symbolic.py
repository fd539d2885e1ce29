"""Symbolic dimensions (`jax.export` shape polymorphism): dimension expressions, their
variables, scopes and constraints, their values under a binding.
"""

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import jax
import numpy as np

from ._private import config as _config, shape_poly as _shape_poly


# -- symbolic dimensions (`jax.export` shape polymorphism) ----------------------------
# Public: making and parsing dimension expressions (`jax.export.symbolic_shape`, which
# reads back what `str` of an expression writes), `jax.export.SymbolicScope` and
# `jax.export.is_symbolic_dim`. Not public, on any supported release: an expression's
# variables and scope, its value under a binding, and a scope's constraints. JAX's own
# `Exported.call` does both with the members used below (`_get_vars`, `scope`,
# `_evaluate`, `_explicit_constraints`), which are the same from jax 0.8.0 to 0.10.2.
is_symbolic: Final[Callable[[Any], bool]] = jax.export.is_symbolic_dim
# The class of dimension expressions: as a pytree leaf, JAX takes one as an abstract
# weakly typed integer scalar (`jax.eval_shape(lambda: b)` is `~int32[]`).
SYMBOLIC_DIM_TYPE: Final[type] = type(jax.export.symbolic_shape("d")[0])


def dim_names(d: Any) -> frozenset[str]:
    """The dimension variables a symbolic dimension expression uses (`{"b"}` for `2*b + 1`)."""
    return frozenset(d._get_vars())


def dim_scope(d: Any) -> Any:
    """The `jax.export.SymbolicScope` a symbolic dimension belongs to."""
    return d.scope


def scope_constraints(scope: Any) -> tuple[str, ...]:
    """A scope's constraints as the user wrote them (`("b >= 4",)`), in order, as
    `SymbolicScope` takes them back. JAX adds `2*floordiv(b, 2) == b` just before a
    constraint `mod(b, 2) == 0`, and again when a scope is made from the list: such
    derived constraints are left out."""
    written = _CONSTRAINTS.get(scope)
    if written is None:
        constraints = scope._explicit_constraints
        derived = {i for i in range(len(constraints) - 1) if _derived(constraints[i], constraints[i + 1])}
        written = _CONSTRAINTS[scope] = tuple(c.debug_str for i, c in enumerate(constraints) if i not in derived)
    return written


# A scope's constraints never change once it is made; comparing big trees asks often.
_CONSTRAINTS: Final[weakref.WeakKeyDictionary[Any, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def _derived(c: Any, then: Any) -> bool:
    """Whether constraint `c` is the one JAX derives from `then`, a `mod(e, k) == 0`:
    `k*floordiv(e, k) == e`, made and listed just before it."""
    eq = _shape_poly.Comparator.EQ
    if c.cmp != eq or then.cmp != eq or then.e2 != 0 or not is_symbolic(then.e1):
        return False
    factor = then.e1._to_factor()
    return factor is not None and factor.operation == "mod" and bool(c.e2 == factor.operands[0])


def make_scope(constraints: Iterable[str] = ()) -> Any:
    """A new `jax.export.SymbolicScope` with these constraints.

    Raises:
        ValueError: a constraint JAX cannot parse or that can never hold.
    """
    try:
        return jax.export.SymbolicScope(tuple(constraints))
    except NotImplementedError as err:  # e.g. two equality constraints with the same left side
        raise ValueError(str(err)) from None


def unsatisfiable_constraint(constraints: Sequence[str]) -> str | None:
    """The first of `constraints` (as written) that no sizes satisfy together with the ones
    before it, else None. JAX finds such a contradiction only when it first decides a
    comparison of a dimension variable in the scope (its `ValueError`, "Unsatisfiable
    constraint"), so each constraint's variables are compared once, in scopes made of the
    constraints up to it.

    Raises:
        ValueError: a constraint JAX cannot parse or that can never hold (`make_scope`).
    """
    for i, written in enumerate(constraints):
        scope = make_scope(constraints[: i + 1])
        constraint = scope._explicit_constraints[-1]
        for name in sorted(dim_names(constraint.diff) if is_symbolic(constraint.diff) else ()):
            try:
                bool(parse_dim(name, scope) >= 0)
            except ValueError:  # "Unsatisfiable constraint: ..."
                return written
    return None


def constraint_beyond(constraints: Sequence[str], limit: int) -> str | None:
    """The first of `constraints` (as written) after which some dimension variable it names is
    above `limit` for every size the constraints up to it allow (`b >= 2**70` against 64-bit
    sizes), else None. The constraints are satisfiable (`unsatisfiable_constraint`)."""
    for i, written in enumerate(constraints):
        scope = make_scope(constraints[: i + 1])
        constraint = scope._explicit_constraints[-1]
        for name in sorted(dim_names(constraint.diff) if is_symbolic(constraint.diff) else ()):
            try:
                if bool(parse_dim(name, scope) > limit):
                    return written
            except _shape_poly.InconclusiveDimensionOperation:  # sizes at or below the limit are allowed
                continue
    return None


def always_negative(d: Any) -> bool:
    """Whether the symbolic dimension `d` is below 0 for every size its scope's constraints allow.
    (JAX's error for an undecided comparison is not in `jax.errors` on jax 0.8.0; its class in
    `shape_poly` is the one raised on every release.)"""
    try:
        return bool(d < 0)
    except _shape_poly.InconclusiveDimensionOperation:  # below 0 for some sizes only
        return False


def parse_dim(text: str, scope: Any) -> Any:
    """One dimension expression written as JAX writes it (`"2*b + 1"`), read in `scope`.

    Raises:
        ValueError: a text that is not exactly one dimension expression.
    """
    try:
        dims = jax.export.symbolic_shape(text, scope=scope)
    except Exception as err:  # JAX's parser raises ValueError; `tokenize` a TokenError for a lone "("
        raise ValueError(f"{text!r} is not a dimension expression: {err}") from None
    if len(dims) != 1:
        raise ValueError(f"{text!r} is {len(dims)} dimensions, not one")
    return dims[0]


def evaluate_dim(d: Any, sizes: Mapping[str, int]) -> Any:
    """`d` with the dimension variables named in `sizes` replaced by those integers: an
    `int` when that binds all of its variables, else an expression of the others (in
    `d`'s scope, which keeps its constraints). Integers are returned as they are.

    JAX evaluates in its dimension dtype (int32 with x64 off), which would wrap around
    for large products: evaluation runs with 64-bit integers, and the result is a
    Python int.

    Raises:
        OverflowError: a step of the evaluation does not fit in 64 bits (NumPy would
            wrap it around, with a warning, into a wrong and often negative size).
    """
    if not is_symbolic(d):
        return d
    names = d._get_vars()
    if not names & sizes.keys():
        return d
    scope = d.scope
    env = {name: sizes[name] if name in sizes else _shape_poly._DimExpr._from_var(name, scope) for name in names}
    try:
        with _config.enable_x64(True), np.errstate(over="raise"):
            value = d._evaluate(env)
    except (FloatingPointError, OverflowError):
        raise OverflowError(f"{d} does not fit in 64 bits") from None
    return value if is_symbolic(value) else int(value)


def linear_in(d: Any, name: str) -> tuple[int, int] | None:
    """`(k, c)` when the expression `d` is `k*name + c` with `k != 0` (each of its terms is
    a constant or `name` itself), else None: the equations JAX's own solver for
    `Exported.call` reads a dimension variable from."""
    if not is_symbolic(d):
        return None
    k = c = 0
    for term, coeff in d._sorted_terms:
        if term.is_constant:
            c += int(coeff)
        elif term.to_var() == name:
            k += int(coeff)
        else:
            return None
    return (k, c) if k else None


def broken_constraints(scope: Any, sizes: Mapping[str, int]) -> list[tuple[str, frozenset[str]]]:
    """The constraints of `scope` that `sizes` breaks, each as written and with the
    names it uses; a constraint on names that `sizes` leaves free is not decided, so
    not listed."""
    broken = []
    for constraint in scope._explicit_constraints:
        diff = evaluate_dim(constraint.diff, sizes)
        if is_symbolic(diff):
            continue
        holds = diff == 0 if constraint.cmp == _shape_poly.Comparator.EQ else diff >= 0
        if not holds:
            names = dim_names(constraint.diff) if is_symbolic(constraint.diff) else frozenset()
            broken.append((constraint.debug_str, names))
    if len(broken) > 1:  # a constraint JAX derived is told as the user's own
        written = set(scope_constraints(scope))
        broken = [b for b in broken if b[0] in written] or broken
    return broken
