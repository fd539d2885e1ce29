"""Shapes: their sizes as JAX takes them, symbolic dimensions, sums of sizes, and what XLA holds.

A dimension is an int >= 0, or a `jax.export` dimension expression (`b`,
`2*b + 1`) of a symbolic scope that may constrain it (`b >= 4`). A shape is
checked as JAX reads it (`checked_shape`), compared and hashed with its
symbolic dimensions by written form (`same_symbolic_shape`, `shape_key`),
summed across scopes (`dim_sum`), and refused when XLA's 64-bit sizes cannot
hold it (`extent_problem`). Shapes, counts and byte counts are written here
too (`[2,3]`, `1,024`, `1.5 KiB`, symbolic ones as JAX writes them).
"""

import functools as ft
import math
import operator
import re
from collections.abc import Sequence
from typing import Any, Final

import jax

from . import _compat
from ._dtypes import element_bytes, jax_dtype


# -- sizes as JAX takes them --------------------------------------------------------------
def sizes(shape: Any) -> bool:
    """Whether `shape` is already what JAX reads: a tuple of ints >= 0 (the fast path)."""
    if type(shape) is not tuple:
        return False
    for d in shape:
        if type(d) is not int or d < 0:
            return False
    return True


class BadShape(Exception):
    """A leaf's `.shape` that JAX cannot take; `error` is the exception type to raise
    (`ValueError` for a negative size, `TypeError` for anything that is no size)."""

    def __init__(self, shape: Any, problem: str, error: type[Exception]) -> None:
        super().__init__(shape, problem)
        self.shape, self.problem, self.error = shape, problem, error
        self.index = -1  # the leaf's position, set by whoever knows it


def bad_shape_message(fn_name: str, where: str, shape: Any, problem: str) -> str:
    """A leaf with `.shape` and `.dtype` whose shape JAX cannot take."""
    return (
        f"treeshape.{fn_name}: {where} has shape {shape!r}, which is not a sequence of integer sizes >= 0: "
        f"{problem}. Give it integer sizes (a `jax.ShapeDtypeStruct((8, 3), jnp.float32)`, or an object whose "
        "`.shape` is a tuple of ints), or keep it out of the tree if it is not an array."
    )


def _dimension(d: Any, axis: int, shape: Any) -> Any:
    if jax.export.is_symbolic_dim(d):
        return d
    if isinstance(d, (float, complex, str, bytes)) or d is None:
        raise BadShape(shape, f"dimension {axis} is {d!r}, a {type(d).__name__}", TypeError)
    try:
        size = operator.index(d)  # int, bool (0 or 1, as JAX reads it), NumPy and JAX integers
    except Exception:
        raise BadShape(shape, f"dimension {axis} is {d!r}, a {type(d).__name__}, not an integer", TypeError) from None
    if size < 0:
        raise BadShape(shape, f"dimension {axis} is {size}, and sizes must be >= 0", ValueError)
    return size


def checked_shape(shape: Any) -> tuple[Any, ...]:
    """`shape` as JAX reads it: a tuple of integers >= 0 (or symbolic dimensions).

    Raises:
        BadShape: `shape` is not a sequence, or a dimension is not such an integer.
    """
    if sizes(shape):
        return tuple(shape)
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        what = f"the string {shape!r}" if isinstance(shape, (str, bytes)) else repr(shape)
        raise BadShape(shape, f"it is {what}, not a sequence of sizes", TypeError)
    return tuple(_dimension(d, axis, shape) for axis, d in enumerate(shape))


def checked_sds(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """A `ShapeDtypeStruct` whose shape JAX can take, with its sizes as ints (raises `BadShape`)."""
    return x if sizes(x.shape) else x.update(shape=checked_shape(x.shape))


def short_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# -- what XLA holds ----------------------------------------------------------------------
MAX_EXTENT: Final = 2**63 - 1  # XLA counts elements and bytes in int64


_SURELY_FITS: Final = MAX_EXTENT // 64  # elements of any dtype (a typed PRNG key's data is at most 32 bytes)


@ft.lru_cache(maxsize=4096)  # a tree has few distinct leaf types
def _extent_problem(shape: tuple[Any, ...], dtype: Any) -> str | None:
    itemsize = element_bytes(dtype)
    product = itemsize
    for axis, d in enumerate(shape):
        if is_symbolic(d):  # a size for each binding: checked once bound
            return None
        product *= d
        if product > MAX_EXTENT:
            return _too_large(shape, itemsize, axis, product)
    return None


def _too_large(shape: tuple[int, ...], itemsize: int, axis: int, product: int) -> str:
    elements = math.prod(shape)
    if elements > MAX_EXTENT:
        return f"has {elements:,} elements, more than 2**63 - 1"
    if elements:
        return f"takes {elements * itemsize:,} bytes ({elements:,} elements of {itemsize} B), more than 2**63 - 1"
    return (
        f"has no elements, but its dimensions up to axis {axis} come to {product:,} bytes, more than 2**63 - 1 "
        "(XLA multiplies them in order, before it reaches the 0)"
    )


def extent_problem(shape: tuple[Any, ...], dtype: Any) -> str | None:
    """Why XLA cannot hold an array of `shape` and `dtype`, or None when it can.

    XLA multiplies a shape's element size by its dimensions, in order, in 64-bit
    integers, and on an overflow aborts the whole process (a notebook kernel
    dies): every prefix of that product must fit in 63 bits. Symbolic shapes are
    checked once bound.
    """
    if sizes(shape) and 0 < math.prod(shape) <= _SURELY_FITS:  # the fast path: any dtype fits
        return None
    return _extent_problem(shape, dtype)


class TooLarge(Exception):
    """A leaf too large for XLA (`extent_problem`), at position `index` of the leaves read."""

    def __init__(self, index: int, leaf: jax.ShapeDtypeStruct, problem: str) -> None:
        super().__init__(index, leaf, problem)
        self.index, self.leaf, self.problem = index, leaf, problem


def check_fits(leaf: Any, index: int, fits: set[tuple[Any, Any]]) -> None:
    """Raise `TooLarge` for an array leaf XLA cannot hold, else note its shape and dtype in `fits`."""
    problem = extent_problem(leaf.shape, leaf.dtype)
    if problem is not None:
        sds = leaf if isinstance(leaf, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
        raise TooLarge(index, sds, problem)
    fits.add((leaf.shape, leaf.dtype))


def check_extents(leaves: Sequence[Any]) -> None:
    """Refuse the first array leaf among `leaves` (`ShapeDtypeStruct`s, arrays, tracers,
    duck arrays; others are skipped) that XLA cannot hold (`extent_problem`).

    Raises:
        TooLarge: naming its index.
    """
    fits: set[tuple[Any, Any]] = set()  # a big tree has few distinct leaf types
    for i, leaf in enumerate(leaves):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if type(shape) is tuple and dtype is not None and (shape, dtype) not in fits and jax_dtype(dtype):
            check_fits(leaf, i, fits)


# -- symbolic dimensions -----------------------------------------------------------------
# A dimension is an int, or a `jax.export` dimension expression (`b`, `2*b + 1`) of a
# symbolic scope that may constrain it (`b >= 4`). Two expressions of different scopes
# never compare equal in JAX; Structures compare them by their written form and their
# scopes' constraints, so that a Structure loaded from JSON (a scope of its own) equals
# the one it was saved from.
is_symbolic = _compat.is_symbolic


_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def has_symbolic(shape: tuple[Any, ...]) -> bool:
    """Whether a shape holds a symbolic dimension (the fast path: a tuple of ints)."""
    return not sizes(shape) and any(is_symbolic(d) for d in shape)


def dim_key(d: Any) -> Any:
    """What a dimension is compared and hashed by: an int as itself, an expression by
    its written form and its scope's constraints."""
    if not is_symbolic(d):
        return d
    return (str(d), _compat.scope_constraints(_compat.dim_scope(d)))


def same_symbolic_shape(e: tuple[Any, ...], a: tuple[Any, ...]) -> bool:
    """Two shapes that JAX calls unequal but that are the same family of shapes: equal
    dimension by dimension in written form, in scopes with the same constraints."""
    if len(e) != len(a) or not (has_symbolic(e) and has_symbolic(a)):
        return False
    return _same_symbolic(e, a)


@ft.lru_cache(maxsize=1024)  # comparing two big trees compares few distinct pairs of shapes
def _same_symbolic(e: tuple[Any, ...], a: tuple[Any, ...]) -> bool:
    return all(x == y or dim_key(x) == dim_key(y) for x, y in zip(e, a, strict=True))


def shape_key(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """A shape as Structures hash it (see `dim_key`)."""
    return tuple(map(dim_key, shape)) if has_symbolic(shape) else shape


def shape_names(shape: tuple[Any, ...]) -> list[str]:
    """The dimension variables of a shape, in order of first appearance (axis by axis,
    then as written: `b*s` gives `b`, `s`)."""
    names: list[str] = []
    for d in shape:
        if is_symbolic(d):
            used = _compat.dim_names(d)
            names.extend(n for n in _IDENTIFIER.findall(str(d)) if n in used and n not in names)
    return names


def constraints_text(shape: tuple[Any, ...]) -> str:
    """The constraints of the symbolic scope of a shape, as written (`b >= 4, b <= 64`),
    or "" when it has none (or no symbolic dimension)."""
    for d in shape:
        if is_symbolic(d):
            return ", ".join(_compat.scope_constraints(_compat.dim_scope(d)))
    return ""


def symbolic_scopes(leaves: Any) -> list[Any]:
    """The distinct symbolic scopes of the array leaves' dimensions, first seen first."""
    found: dict[int, Any] = {}
    seen: set[Any] = set()  # a big tree has few distinct shapes
    for leaf in leaves:
        if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.shape in seen:
            continue
        seen.add(leaf.shape)
        if has_symbolic(leaf.shape):
            for d in leaf.shape:
                if is_symbolic(d):
                    scope = _compat.dim_scope(d)
                    found.setdefault(id(scope), scope)
    return list(found.values())


def dim_sum(values: Any) -> Any:
    """The sum of sizes: an int, or (when some are symbolic) a dimension expression.

    Expressions of different symbolic scopes cannot be added in JAX: they are read
    again, by their written form, in one new scope with all of the scopes'
    constraints (as `from_json` would read them); should those constraints not
    make one scope, the sum is its written form, a `str`.
    """
    total = 0
    symbolic: list[Any] = []
    for v in values:
        if type(v) is int:
            total += v
        elif is_symbolic(v):
            symbolic.append(v)
        else:
            total += int(v)
    if not symbolic:
        return total
    scopes = {id(_compat.dim_scope(d)): _compat.dim_scope(d) for d in symbolic}
    if len(scopes) > 1:
        constraints = dict.fromkeys(c for scope in scopes.values() for c in _compat.scope_constraints(scope))
        try:
            scope = _compat.make_scope(constraints)
            symbolic = [_compat.parse_dim(str(d), scope) for d in symbolic]
        except ValueError:
            return " + ".join([*map(str, symbolic), *([str(total)] if total else [])])
    out = symbolic[0]
    for d in symbolic[1:]:
        out = out + d
    return out + total


# -- sizes of leaves ---------------------------------------------------------------------
def leaf_size(leaf: jax.ShapeDtypeStruct) -> Any:
    """A leaf's number of elements (one per PRNG key): an int, or an expression."""
    return math.prod(leaf.shape)


def leaf_nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    size: int = math.prod(leaf.shape)
    return size * element_bytes(leaf.dtype)


def leaf_total(leaves: Any, measure: Any) -> Any:
    """`measure(leaf)` summed over the array leaves (`dim_sum`); a symbolic measure is taken
    once per distinct leaf type and multiplied by its count (expressions add slowly)."""
    total = 0
    symbolic: dict[Any, list[Any]] = {}  # (shape, dtype, sharding) -> [a leaf, how many]
    for leaf in leaves:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        if sizes(leaf.shape) or not has_symbolic(leaf.shape):
            total += measure(leaf)
            continue
        key = (leaf.shape, leaf.dtype, leaf.sharding)
        entry = symbolic.get(key)
        if entry is None:
            symbolic[key] = [leaf, 1]
        else:
            entry[1] += 1
    if not symbolic:
        return total
    return dim_sum([total, *(count * measure(leaf) for leaf, count in symbolic.values())])


def count_text(n: Any) -> str:
    """A count with thousands separators (`1,024`), or a symbolic one as JAX writes it (`8*b`)."""
    return str(n) if is_symbolic(n) else f"{n:,}"


def human_bytes(n: Any) -> str:
    """`36 B`, `1.5 KiB`, `64.0 GiB`; a symbolic count as JAX writes it (`40*b + 12 B`)."""
    if is_symbolic(n):
        return f"{n} B"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
