"""Symbolic dimensions: a Structure's free dimension names, binding them to sizes, and
finding the sizes a concrete tree binds them to.

A `jax.export` dimension expression (`b`, `2*b`, `floordiv(b + 1, 2)`) stands for a
family of sizes. JAX evaluates an expression under a binding (through `_compat`);
this module finds a binding from a tree: every expression that is linear in its one
unbound name (`b`, `2*b + 1`, `b*s` once `s` is known) tells that name's size, which
is then checked against every other dimension that uses it. An expression that never
tells its names (only `floordiv(b + 1, 2)`: both 5 and 6 give 3) leaves them unknown,
and a leaf that needs them is reported, never silently matched.
"""

import dataclasses
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import jax.tree_util as jtu

from . import _compat
from ._diff import diff_structures
from ._errors import Mismatch
from ._leaf import leaf_str
from ._shapes import has_symbolic, is_symbolic, shape_names, sizes as sizes_only, symbolic_scopes
from ._tree import EDGE, edge_paths
from ._views import TreeView


# -- names -----------------------------------------------------------------------
def free_names(leaves: Iterable[Any]) -> tuple[str, ...]:
    """The free dimension names of the array leaves, in order of first appearance (leaf
    order, then axis order)."""
    names: dict[str, None] = {}
    seen: set[Any] = set()  # a big tree has few distinct shapes
    for leaf in leaves:
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        shape = leaf.shape
        if shape not in seen:
            seen.add(shape)
            if has_symbolic(shape):
                names.update(dict.fromkeys(shape_names(shape)))
    return tuple(names)


# -- binding ---------------------------------------------------------------------
def check_sizes(sizes: dict[str, Any], names: Sequence[str], leaves: Sequence[Any], who: str) -> dict[str, int]:
    """`sizes` as ints, checked: known names, integers >= 1, and the constraints of the
    leaves' symbolic scopes.

    Raises:
        ValueError: an unknown name, a size below 1, or a broken constraint.
        TypeError: a size that is not an integer.
    """
    listed = ", ".join(names) if names else "none: its shapes are all concrete"
    unknown = [name for name in sizes if name not in names]
    if unknown:
        raise ValueError(
            f"treeshape.{who}: {', '.join(repr(n) for n in unknown)} is not a free dimension of this structure; "
            f"its free dimensions are {listed}."
        )
    out: dict[str, int] = {}
    for name, size in sizes.items():
        if isinstance(size, bool) or not _is_integer(size):
            raise TypeError(
                f"treeshape.{who}: the size of dimension {name!r} must be an integer, got {type(size).__name__} "
                f"{size!r}."
            )
        out[name] = operator.index(size)
        if out[name] < 1:
            raise ValueError(
                f"treeshape.{who}: dimension {name!r} cannot be {out[name]}: JAX's symbolic dimensions stand for "
                "sizes >= 1."
            )
    for scope in symbolic_scopes(leaves):
        broken = _compat.broken_constraints(scope, out)
        if broken:
            text, used = broken[0]
            given = ", ".join(f"{name}={size}" for name, size in out.items() if name in used)
            raise ValueError(
                f"treeshape.{who}: {given} breaks the constraint {text!r} of the dimensions' symbolic "
                f"scope (its constraints: {', '.join(_compat.scope_constraints(scope))})."
            )
    return out


def _is_integer(x: Any) -> bool:
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


class DimOverflow(ValueError):
    """A binding that makes a dimension larger than 64 bits hold (`index`: the leaf's position)."""

    def __init__(self, leaf: jax.ShapeDtypeStruct, axis: int, sizes: dict[str, int]) -> None:
        given = ", ".join(f"{name}={size}" for name, size in sizes.items())
        self.index = -1
        self.problem = (
            f"{given} makes dimension {axis} ({leaf.shape[axis]}) larger than 2**63 - 1, the most that XLA's 64-bit "
            "sizes hold"
        )
        super().__init__(f"treeshape: {leaf_str(leaf)}: {self.problem}.")


def bind_leaf(leaf: Any, sizes: dict[str, int]) -> Any:
    """An array leaf with the named dimensions replaced by their sizes (others kept).

    Raises:
        DimOverflow: a dimension evaluates past 64 bits.
    """
    if not isinstance(leaf, jax.ShapeDtypeStruct) or not has_symbolic(leaf.shape):
        return leaf
    shape = []
    for axis, d in enumerate(leaf.shape):
        try:
            shape.append(_compat.evaluate_dim(d, sizes))
        except OverflowError:
            raise DimOverflow(leaf, axis, sizes) from None
    return leaf.update(shape=tuple(shape))


def bind_leaves(leaves: Sequence[Any], sizes: dict[str, int]) -> tuple[list[Any], list[int]]:
    """Every leaf bound, and the indices of leaves whose bound shape has a negative size
    (`b - 8` with `b = 4`). A big tree has few distinct leaf types: each is bound once.

    Raises:
        DimOverflow: a dimension evaluates past 64 bits (with the leaf's `index`).
    """
    done: dict[Any, tuple[Any, bool]] = {}  # leaf type -> its bound leaf, and whether a size is negative
    by_id: dict[int, tuple[Any, bool]] = {}  # the same by leaf object (often one object per type)
    out: list[Any] = []
    negative: list[int] = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.ShapeDtypeStruct) or sizes_only(leaf.shape):
            out.append(leaf)
            continue
        entry = by_id.get(id(leaf))
        if entry is None:
            key = (leaf.shape, leaf.dtype, leaf.weak_type, leaf.sharding, _compat.manual_axes(leaf))
            entry = done.get(key)
            if entry is None:
                try:
                    bound = bind_leaf(leaf, sizes)
                except DimOverflow as e:
                    e.index = i
                    raise
                entry = done[key] = (bound, any(not is_symbolic(d) and d < 0 for d in bound.shape))
            by_id[id(leaf)] = entry
        if entry[1]:
            negative.append(i)
        out.append(entry[0])
    return out, negative


# -- finding a binding ---------------------------------------------------------------
@dataclasses.dataclass
class Binding:
    """The sizes a tree binds the free names to, and for each name the leaf (index)
    and axis that told it."""

    sizes: dict[str, int]
    sources: dict[str, tuple[int, int]]
    scopes: list[Any]  # the symbolic scopes of the expressions that told them


def _equations(e_leaves: Sequence[Any], a_leaves: Sequence[Any], pairs: Iterable[tuple[int, int]]) -> Iterator[Any]:
    """`(expression, size, leaf, axis)` for each symbolic dimension of an expected leaf
    whose actual leaf has a concrete size there (each distinct pair of expression and size once)."""
    seen: set[tuple[Any, int]] = set()
    seen_shapes: set[tuple[Any, Any]] = set()  # a big tree has few distinct pairs of shapes
    for i, j in pairs:
        e, a = e_leaves[i], a_leaves[j]
        if not (isinstance(e, jax.ShapeDtypeStruct) and isinstance(a, jax.ShapeDtypeStruct)):
            continue
        shapes = (e.shape, a.shape)
        if shapes in seen_shapes:
            continue
        seen_shapes.add(shapes)
        if len(e.shape) != len(a.shape) or not has_symbolic(e.shape):
            continue
        for axis, (d, size) in enumerate(zip(e.shape, a.shape, strict=True)):
            if is_symbolic(d) and not is_symbolic(size) and (d, size) not in seen:
                seen.add((d, size))
                yield d, size, i, axis


def _solve_one(d: Any, size: int, name: str, known: dict[str, int]) -> int | None:
    """The size of `name` for which `d` (whose other names are `known`) is `size`, when
    `d` is then linear in it (`k*name + c`), as JAX's own solver reads equations: an
    expression such as `min(b, 4)` or `floordiv(b + 1, 2)` has several solutions, so
    it tells nothing (it is checked once the name is bound)."""
    linear = _compat.linear_in(_compat.evaluate_dim(d, known), name)
    if linear is None:
        return None
    k, c = linear
    if (size - c) % k or (size - c) // k < 1:
        return None
    return (size - c) // k


def solve(e_leaves: Sequence[Any], a_leaves: Sequence[Any], pairs: Iterable[tuple[int, int]]) -> Binding:
    """The sizes that the actual leaves bind the expected leaves' names to. The first
    dimension (in leaf order) that tells a name's size binds it; the other dimensions
    are checked against the binding by the caller."""
    pending = list(_equations(e_leaves, a_leaves, pairs))
    binding = Binding({}, {}, [])
    progress = True
    while pending and progress:
        progress = False
        unsolved = []
        for d, size, i, axis in pending:
            unknown = _compat.dim_names(d) - binding.sizes.keys()
            if len(unknown) == 1:
                (name,) = unknown
                value = _solve_one(d, size, name, binding.sizes)
                if value is not None:
                    binding.sizes[name] = value
                    binding.sources[name] = (i, axis)
                    scope = _compat.dim_scope(d)
                    if all(scope is not known for known in binding.scopes):
                        binding.scopes.append(scope)
                    progress = True
                    continue
            if unknown:
                unsolved.append((d, size, i, axis))
        pending = unsolved
    return binding


# -- comparing a symbolic structure with a tree ------------------------------------------
@dataclasses.dataclass
class _Bound:
    """The expected structure with the binding applied (paths are the original's)."""

    original: TreeView
    leaves: tuple[Any, ...]

    @property
    def treedef(self) -> jtu.PyTreeDef:
        return self.original.treedef

    @property
    def paths(self) -> tuple[str, ...]:
        return self.original.paths


def _same_treedef(expected: TreeView, actual: TreeView) -> bool:
    try:
        return bool(expected.treedef == actual.treedef)
    except Exception:  # node data whose `==` raises
        return False


def _pairs(expected: TreeView, actual: TreeView) -> Iterable[tuple[int, int]]:
    """The leaves of both at one place: by index when the treedefs are equal, else by path."""
    if _same_treedef(expected, actual):
        return ((i, i) for i in range(len(expected.leaves)))
    where = {path: j for j, path in enumerate(actual.paths)}
    return ((i, where[path]) for i, path in enumerate(expected.paths) if path in where)


def _bound_for_diff(expected: TreeView, actual: TreeView, sizes: dict[str, int]) -> list[Any]:
    """The expected leaves bound, for comparing with `actual`. With the treedefs equal, a
    leaf whose bound type is the actual leaf's is that leaf itself (sharding takes no part
    in a diff): a big tree then makes no new leaf where it matches."""
    e_leaves, a_leaves = expected.leaves, actual.leaves
    if not _same_treedef(expected, actual):
        return bind_leaves(e_leaves, sizes)[0]
    shapes: dict[Any, tuple[Any, ...]] = {}  # symbolic shape -> bound shape
    out: list[Any] = []
    for e, a in zip(e_leaves, a_leaves, strict=True):
        if not isinstance(e, jax.ShapeDtypeStruct) or sizes_only(e.shape):
            out.append(e)
            continue
        shape = shapes.get(e.shape)
        if shape is None:
            shape = shapes[e.shape] = bind_leaf(e, sizes).shape
        if (
            isinstance(a, jax.ShapeDtypeStruct)
            and shape == a.shape
            and e.dtype == a.dtype
            and e.weak_type == a.weak_type
            and _compat.manual_axes(e) == _compat.manual_axes(a)
        ):
            out.append(a)
        else:
            out.append(e.update(shape=shape))
    return out


def _path_at(expected: TreeView, i: int) -> str:
    """The path of leaf `i`, without the paths of all leaves when it is among the first ones
    (the leaf that binds a name usually is)."""
    if i < EDGE:
        return edge_paths(jtu.tree_unflatten(expected.treedef, expected.leaves), expected.leaves, i + 1)[0][i]
    return expected.paths[i]


def match(expected: TreeView, actual: TreeView, root: str) -> tuple[Binding, list[Mismatch]]:
    """The binding `actual` gives `expected`'s free names, and every difference between
    them once bound: a leaf whose sizes disagree with the binding names where each of
    its names was bound; a broken constraint is reported at the leaf that bound it; a
    name no leaf tells leaves the leaves that use it unmatched."""
    e_leaves = expected.leaves
    binding = solve(e_leaves, actual.leaves, _pairs(expected, actual))
    bound_leaves = _bound_for_diff(expected, actual, binding.sizes)
    index: dict[str, int] = {}
    found = diff_structures(_Bound(expected, tuple(bound_leaves)), actual, root, index)
    source_paths: dict[str, str] = {}

    def where(name: str) -> str:
        if name not in source_paths:
            source_paths[name] = root + _path_at(expected, binding.sources[name][0])
        return source_paths[name]

    out: list[Mismatch] = []
    for scope in binding.scopes:
        for constraint, used in _compat.broken_constraints(scope, binding.sizes):
            names = sorted(used, key=lambda n: binding.sources[n])  # first bound first
            i = binding.sources[names[0]][0]
            j = next(j for k, j in _pairs(expected, actual) if k == i)
            given = tuple((n, binding.sizes[n], where(n)) for n in names)
            e, a = e_leaves[i], actual.leaves[j]
            path = where(names[0])[len(root) :]
            out.append(Mismatch(path, "shape", e.shape, a.shape, root=root, dims=given, constraint=constraint))
    for m in found:
        if m.kind != "shape":
            out.append(m)
            continue
        shape = e_leaves[index[m.path]].shape
        told = [d for d, size in zip(shape, m.actual, strict=False) if not is_symbolic(size)]  # by the tree's sizes
        if len(shape) != len(m.actual) or not has_symbolic(tuple(told)):
            out.append(dataclasses.replace(m, expected=shape))
            continue
        dims: tuple[tuple[str, int | None, str], ...] = tuple(
            (n, binding.sizes[n], where(n)) if n in binding.sizes else (n, None, "")
            for n in shape_names(tuple(told))
            if n not in binding.sizes or binding.sources[n][0] != index[m.path]  # not the leaf that bound it
        )
        here = tuple(
            said
            for name, size, _ in dims
            if size is not None and (said := _told_here(shape, m.actual, name, binding.sizes)) is not None
        )
        dims += _own_conflicts(shape, m.actual, binding, index[m.path], root + m.path)
        out.append(dataclasses.replace(m, expected=shape, dims=dims, here=here))
    return binding, out


def _own_conflicts(
    shape: tuple[Any, ...], actual: tuple[Any, ...], binding: Binding, leaf: int, where: str
) -> tuple[tuple[str, int, str], ...]:
    """For each name this leaf bound itself (`t` at dimension 1) that another of its dimensions
    gives another size (`t` is 6 at dimension 2): the size each of these occurrences gives, as
    `(name, size, "where dimension k")`, the binding's first."""
    out: list[tuple[str, int, str]] = []
    for name, (i, axis) in binding.sources.items():
        if i != leaf:
            continue
        given = []
        for k, (d, size) in enumerate(zip(shape, actual, strict=True)):
            if k == axis or not is_symbolic(d) or is_symbolic(size) or name not in _compat.dim_names(d):
                continue
            value = _solve_one(d, size, name, {n: v for n, v in binding.sizes.items() if n != name})
            if value is not None and value != binding.sizes[name]:
                given.append((name, value, f"{where} dimension {k}"))
        if given:
            out += [(name, binding.sizes[name], f"{where} dimension {axis}"), *given]
    return tuple(out)


def _told_here(
    shape: tuple[Any, ...], actual: tuple[Any, ...], name: str, sizes: dict[str, int]
) -> tuple[str, str, int, int | None, int] | None:
    """What a leaf's own sizes say of `name` (bound to `sizes[name]` elsewhere): the first
    dimension that uses it and disagrees with the binding, as `(name, expression, size,
    the name's size for it or None, the size the binding gives)`."""
    others = {k: v for k, v in sizes.items() if k != name}
    for d, size in zip(shape, actual, strict=True):
        if not is_symbolic(d) or is_symbolic(size) or name not in _compat.dim_names(d):
            continue
        if not _compat.dim_names(d) <= sizes.keys():
            continue
        try:
            predicted = _compat.evaluate_dim(d, sizes)
        except OverflowError:
            continue
        if predicted != size:
            return name, str(d), size, _solve_one(d, size, name, others), predicted
    return None
