"""Leaves: how treeshape tells what a pytree leaf is, what it weighs, and how it is written.

The bottom of the package: everything else builds on these facts about one
leaf. A leaf is an array for JAX (a `jax.Array` or tracer, a NumPy array or
scalar of a dtype JAX holds, a `jax.ShapeDtypeStruct`, a Python scalar, or a
duck array with `.shape` and such a `.dtype`), or a static value. Leaves are
written compactly: `f32[2,3]`, `~f32[]` (weak), `key<fry>[4]`, `f32[8]{V:i}`
(varying over manual axis `i`).
"""

import collections
import functools as ft
import gc
import itertools
import math
import operator
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import _compat
from ._tree import chain_path


# How a leaf is treated, decided once per Python type.
ARRAY = 0  # jax.Array or tracer: abstract, keyed by its aval
NUMPY = 1  # np.ndarray / NumPy scalar: abstract, strong
SDS = 2  # jax.ShapeDtypeStruct: abstract, keyed by itself
SCALAR = 3  # Python bool/int/float/complex: abstract (weak, except bool)
OTHER = 4  # static, unless the instance has .shape and .dtype (duck array)
DIM = 5  # a `jax.export` dimension expression: abstract, a weak integer scalar, as JAX types it

SCALAR_TYPES = (bool, int, float, complex)
KINDS: dict[type, int] = {}


def kind_of(cls: type) -> int:
    kind = KINDS.get(cls)
    if kind is None:
        if issubclass(cls, (jax.Array, jax.core.Tracer)):
            kind = ARRAY
        elif issubclass(cls, (np.ndarray, np.generic)):
            kind = NUMPY
        elif issubclass(cls, jax.ShapeDtypeStruct):
            kind = SDS
        elif cls in SCALAR_TYPES:  # exactly: an IntEnum is an int but stays static
            kind = SCALAR
        elif issubclass(cls, _compat.SYMBOLIC_DIM_TYPE):
            kind = DIM
        else:
            kind = OTHER
        if kind != OTHER or cls.__module__ == "builtins":  # a user's class is not kept alive
            KINDS[cls] = kind
    return kind


_jax_dtypes_seen: dict[Any, bool] = {}


def jax_dtype(dtype: Any) -> bool:
    """Whether JAX can hold an array of `dtype` (numbers, bool, bfloat16, float8, PRNG keys, ...)."""
    try:
        return _jax_dtypes_seen[dtype]
    except (KeyError, TypeError):
        pass
    try:
        ok = any(jnp.issubdtype(dtype, kind) for kind in (jnp.number, jnp.bool_, jax.dtypes.extended))
    except TypeError:  # not a dtype at all
        ok = False
    try:
        _jax_dtypes_seen[dtype] = ok
    except TypeError:
        pass
    return ok


def is_duck_array(x: Any) -> bool:
    """An object JAX takes as an array: `.shape` and a `.dtype` JAX can hold."""
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type) and jax_dtype(x.dtype)


class BadShape(Exception):
    """A leaf's `.shape` that JAX cannot take; `error` is the exception type to raise
    (`ValueError` for a negative size, `TypeError` for anything that is no size)."""

    def __init__(self, shape: Any, problem: str, error: type[Exception]) -> None:
        super().__init__(shape, problem)
        self.shape, self.problem, self.error = shape, problem, error
        self.index = -1  # the leaf's position, set by whoever knows it


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


def sizes(shape: Any) -> bool:
    """Whether `shape` is already what JAX reads: a tuple of ints >= 0 (the fast path)."""
    if type(shape) is not tuple:
        return False
    for d in shape:
        if type(d) is not int or d < 0:
            return False
    return True


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


MAX_EXTENT: Final = 2**63 - 1  # XLA counts elements and bytes in int64
_SURELY_FITS: Final = MAX_EXTENT // 64  # elements of any dtype (a typed PRNG key's data is at most 32 bytes)


@ft.lru_cache(maxsize=4096)  # a tree has few distinct leaf types
def _extent_problem(shape: tuple[Any, ...], dtype: Any) -> str | None:
    itemsize = key_data_bytes(dtype) if is_key_dtype(dtype) else np.dtype(dtype).itemsize
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


def extent_message(who: str, where: str, leaf: jax.ShapeDtypeStruct, problem: str, fix: str = "") -> str:
    """The message for a leaf too large for XLA (`extent_problem`), at `where`."""
    fix = fix or "No device holds such an array: check its shape, or split it into smaller leaves."
    return (
        f"treeshape.{who}: {where} ({leaf_str(leaf)}) {problem}, the most that XLA's 64-bit sizes hold (it would "
        f"abort the process on it). {fix}"
    )


def as_abstract(x: Any) -> jax.ShapeDtypeStruct:
    """A duck array as the `ShapeDtypeStruct` JAX would see (its `.sharding`
    kept only if it is a JAX sharding).

    Raises:
        BadShape: its `.shape` is not a sequence of integers >= 0.
    """
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
        sharding = None
    return jax.ShapeDtypeStruct(
        checked_shape(x.shape), x.dtype, weak_type=bool(getattr(x, "weak_type", False)), sharding=sharding
    )


def checked_sds(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """A `ShapeDtypeStruct` whose shape JAX can take, with its sizes as ints (raises `BadShape`)."""
    return x if sizes(x.shape) else x.update(shape=checked_shape(x.shape))


@ft.lru_cache(maxsize=4096)  # a tree has few distinct types: reading a big one stays cheap
def from_aval(aval: Any) -> jax.ShapeDtypeStruct:
    """A JAX type as a `ShapeDtypeStruct`: shape, dtype, weak flag, and (on a mesh)
    the sharding with the manual axes, which a manual mesh's values carry only together."""
    if aval.sharding.mesh.empty:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return _compat.shape_dtype_struct(
        aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=aval.sharding, manual_axes=_compat.manual_axes(aval)
    )


@ft.lru_cache(maxsize=4096)
def _unsharded(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


class TooLarge(Exception):
    """A leaf too large for XLA (`extent_problem`), at position `index` of the leaves read."""

    def __init__(self, index: int, leaf: jax.ShapeDtypeStruct, problem: str) -> None:
        super().__init__(index, leaf, problem)
        self.index, self.leaf, self.problem = index, leaf, problem


def _check_fits(leaf: Any, index: int, fits: set[tuple[Any, Any]]) -> None:
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
            _check_fits(leaf, i, fits)


class IntTooBig(OverflowError):
    """A Python int leaf that no JAX integer of the default width holds."""

    def __init__(self, index: int, value: int, bits: int) -> None:
        super().__init__(index, value, bits)
        self.index, self.value, self.bits = index, value, bits


def read_leaves(
    leaves: list[Any], top_level: bool, sharded_symbolic: list[tuple[int, jax.ShapeDtypeStruct]] | None = None
) -> list[Any]:
    """Each leaf's description, read without tracing: what `jax.eval_shape` of the
    identity gives (a `ShapeDtypeStruct` typed as JAX types the leaf: canonical
    dtype, Python `int`/`float`/`complex` weak), static leaves as themselves.

    At top level (`top_level`: no trace is running) a committed array takes its
    concrete sharding, and a `ShapeDtypeStruct` or duck array keeps its
    sharding as given. Under a trace, a leaf takes the type JAX gives it there
    (its sharding and manual axes included).

    Raises:
        IntTooBig: a Python int that does not fit the default integer width.
        BadShape: a `ShapeDtypeStruct` or duck array whose shape JAX cannot take
            (with its `index`).
        TooLarge: an array leaf too large for XLA (`extent_problem`).

    The `ShapeDtypeStruct`s and duck arrays (as given, with their index) that have
    both symbolic dimensions and a sharding, whose divisibility is `_sharding`'s to
    check, are appended to `sharded_symbolic`, when given.
    """
    kinds = KINDS
    out: list[Any] = []
    append = out.append
    canonical: dict[Any, Any] = {}  # dtype -> its canonical dtype
    scalars: dict[type, jax.ShapeDtypeStruct] = {}
    placed: dict[tuple[Any, Any], jax.ShapeDtypeStruct] = {}
    int_range: tuple[int, int] | None = None
    shapes_ok: set[Any] = set()  # shapes with symbolic sizes, already checked
    fits: set[tuple[Any, Any]] = set()  # (shape, dtype) that XLA can hold
    for i, x in enumerate(leaves):
        cls = type(x)
        kind = kinds.get(cls)
        if kind is None:
            kind = kind_of(cls)
        if kind == ARRAY:
            aval = x.aval
            if not top_level:
                traced = from_aval(aval)
                if (aval.shape, aval.dtype) not in fits:  # a tracer may be larger than any array
                    _check_fits(traced, i, fits)
                append(traced)
            elif not isinstance(x, jax.core.Tracer) and x.committed:
                sharding = x.sharding
                key = (aval, sharding)
                sds = placed.get(key)
                if sds is None:
                    sds = placed[key] = jax.ShapeDtypeStruct(
                        aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=sharding
                    )
                append(sds)
            else:
                append(_unsharded(aval))
        elif kind == SDS:
            if not sizes(x.shape) and x.shape not in shapes_ok:
                try:
                    shape = checked_shape(x.shape)
                except BadShape as e:
                    e.index = i
                    raise
                if shape == x.shape and type(x.shape) is tuple:  # symbolic sizes: as they are
                    shapes_ok.add(shape)
                else:
                    x = x.update(shape=shape)
            if x.sharding is not None and sharded_symbolic is not None and x.shape in shapes_ok:
                sharded_symbolic.append((i, x))
            if (x.shape, x.dtype) not in fits:
                _check_fits(x, i, fits)
            if not top_level:
                append(from_aval(_compat.abstractify(x)))
                continue
            dtype = x.dtype
            to = canonical.get(dtype)
            if to is None:
                to = canonical[dtype] = jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)
            append(x if to == dtype else x.update(dtype=to))
        elif kind == SCALAR:
            sds = scalars.get(cls)
            if sds is None:
                sds = scalars[cls] = from_aval(jax.typeof(cls()))
            if cls is int:
                if int_range is None:
                    bits = 8 * np.dtype(sds.dtype).itemsize
                    int_range = (-(2 ** (bits - 1)), 2 ** (bits - 1))
                if not int_range[0] <= x < int_range[1]:
                    raise IntTooBig(i, x, 8 * np.dtype(sds.dtype).itemsize)
            append(sds)
        elif kind == NUMPY:
            append(from_aval(jax.typeof(x)) if jax_dtype(x.dtype) else x)  # strings, objects: static
        elif kind == DIM:
            append(from_aval(_compat.abstractify(x)))
        elif is_duck_array(x):
            try:
                abstract = as_abstract(x)
            except BadShape as e:
                e.index = i
                raise
            _check_fits(abstract, i, fits)
            if abstract.sharding is not None and sharded_symbolic is not None and has_symbolic(abstract.shape):
                sharded_symbolic.append((i, abstract))
            if not top_level:
                append(from_aval(_compat.abstractify(abstract)))
            else:
                to = jax.dtypes.canonicalize_dtype(abstract.dtype, allow_extended_dtype=True)
                append(abstract if to == abstract.dtype else abstract.update(dtype=to))
        else:
            append(x)
    return out


def refuse_leaked_tracers(leaves: Sequence[Any], fn_name: str) -> None:
    """At top level (no trace running), any tracer among `leaves` leaked from an
    earlier trace: raise JAX's `UnexpectedTracerError` for it, as `lax.scan` would,
    rather than hand it back inside a result."""
    if not any(isinstance(x, jax.core.Tracer) for x in leaves) or not _compat.at_top_level():
        return
    for x in leaves:
        if isinstance(x, jax.core.Tracer):
            jax.lax.stop_gradient(x)  # JAX's own error, which says where the tracer was made
            raise jax.errors.UnexpectedTracerError(
                f"treeshape.{fn_name}: a {type(x).__name__} of type {x.aval} was passed at top level, where no "
                "JAX transformation is running: it escaped an earlier trace (a side effect kept a reference to "
                "an intermediate value). Return it from the transformed function instead."
            )


# -- trees that contain themselves ----------------------------------------------------
# The containers a cycle is looked for through, and how each one holds its children.
# JAX's flatten of a tree that contains itself through a dict fails in its C++ code and
# leaves the interpreter's recursion depth behind (every later call then fails), so
# trees are walked for cycles before JAX flattens them.
_VALUES: Final[dict[type, Callable[[Any], Iterable[Any]]]] = {
    dict: dict.values,
    collections.OrderedDict: dict.values,
    collections.defaultdict: dict.values,
    list: iter,
    tuple: iter,
}


def cycle_problem(tree: Any, root: str) -> str | None:
    """Why JAX cannot flatten `tree` (paths printed under `root`), where it would fail
    in a way that breaks the interpreter: the tree contains itself (through dicts, lists
    and tuples), or it is nested more deeply than the recursion limit; None otherwise.

    A cycle through another node type makes JAX's flatten fail cleanly (a RecursionError).
    """
    containers = _VALUES
    if type(tree) not in containers:
        return None
    # Level by level, each level's containers found in one call into the interpreter's C
    # code: a tree's levels end. One deeper than JAX flattens, or whose levels keep
    # growing past any model's (a cycle through two children doubles them), is walked
    # depth first, which tells a cycle from a shared subtree.
    level, depth, reached = [tree], 0, 0
    limit = sys.getrecursionlimit()
    is_container = containers.__contains__
    while level:
        children = gc.get_referents(*level)
        level = list(itertools.compress(children, map(is_container, map(type, children))))
        depth, reached = depth + 1, reached + len(level)
        if depth >= limit or reached > _MANY_CONTAINERS:
            break
    else:
        return None
    found = _find_cycle(tree)
    if found is not None:
        path, ancestor = found
        return (
            f"{root}{path} is {root}{ancestor} itself: the pytree contains itself, and JAX cannot flatten it. "
            "Keep that reference out of the tree (it cycles back to one of its own parents)"
        )
    if depth >= limit:
        return (
            f"it is nested more deeply than JAX can flatten ({limit} levels or more, the interpreter's recursion "
            "limit). Flatten it into fewer levels"
        )
    return None


_MANY_CONTAINERS: Final = 10**7


def refuse_cycles(tree: Any, who: str, root: str) -> None:
    """Raise a `ValueError` (naming `treeshape.{who}` and the path under `root`) for a tree
    that JAX's flatten cannot take and would leave the interpreter broken by
    (`cycle_problem`); call it before flattening a tree that comes from the user."""
    problem = cycle_problem(tree, root)
    if problem is not None:
        raise ValueError(f"treeshape.{who}: {problem}.")


def flatten(tree: Any, who: str, root: str, checked: bool = False) -> tuple[list[Any], Any]:
    """`jax.tree_util.tree_flatten(tree)` of a user's tree; a `ValueError` for one that
    contains itself or is nested too deeply (`refuse_cycles`, unless `checked` says it
    was called already, and JAX's own failure for a cycle through a custom node)."""
    if not checked:
        refuse_cycles(tree, who, root)
    try:
        return jtu.tree_flatten(tree)
    except (RecursionError, SystemError):  # through a node type of the user's: JAX's C++ code gave up
        raise ValueError(
            f"treeshape.{who}: {root} cannot be flattened: one of its custom pytree nodes contains itself, or the "
            "tree is nested more deeply than JAX can flatten. Keep such references out of the tree."
        ) from None


def _find_cycle(tree: Any) -> tuple[str, str] | None:
    """`find_cycle`, depth first (telling a cycle from a shared subtree)."""
    values = _VALUES
    ancestors = [tree]
    on_path = {id(tree)}
    done: set[int] = set()
    stack = [iter([c for c in values[type(tree)](tree) if type(c) in values])]
    while stack:
        for child in stack[-1]:
            i = id(child)
            if i in done:
                continue
            if i in on_path:
                return chain_path([*ancestors, child]), chain_path(ancestors[: [id(a) for a in ancestors].index(i) + 1])
            inner = [c for c in values[type(child)](child) if type(c) in values]
            if not inner:  # most containers hold only leaves
                done.add(i)
                continue
            on_path.add(i)
            ancestors.append(child)
            stack.append(iter(inner))
            break
        else:
            stack.pop()
            i = id(ancestors.pop())
            on_path.discard(i)
            done.add(i)
    return None


# -- nodes ---------------------------------------------------------------------------
_TYPING_BASES: Final = frozenset({"Protocol", "Generic", "object"})


def node_type_name(cls: type) -> str:
    """A node type as users know it: its first public class (orbax's private
    `_TreeMetadataImpl` is a `TreeMetadata`)."""
    for klass in cls.__mro__:
        if not klass.__name__.startswith("_") and klass.__name__ not in _TYPING_BASES:
            return klass.__name__
    return cls.__name__


def wrapper_hint(cls: type) -> str | None:
    """What to pass instead of a node that wraps the tree a user means (a checkpoint's
    metadata object around its tree of array metadata), or None."""
    if cls.__module__.startswith("orbax.") and node_type_name(cls) == "TreeMetadata":
        return (
            "an orbax checkpoint's metadata (a TreeMetadata), which wraps the tree it describes: pass its "
            "`.tree` instead, e.g. `ts.structure_of(checkpointer.metadata(path).item_metadata.tree)`"
        )
    return None


def static_value(leaf: Any) -> Any:
    """What a static leaf is compared by: a NumPy array (of strings, objects) by
    its dtype, shape and contents, anything else by itself."""
    if isinstance(leaf, np.ndarray):
        contents = tuple(leaf.ravel().tolist()) if leaf.dtype.hasobject else leaf.tobytes()
        return (leaf.dtype.str, leaf.shape, contents)
    return leaf


# -- typed PRNG keys -----------------------------------------------------------------
@ft.cache
def key_data_bytes(dtype: Any) -> int:
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
    return int(math.prod(data.shape) * np.dtype(data.dtype).itemsize)


@ft.cache
def is_key_dtype(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))


# Each built-in PRNG implementation's tag, the name its key dtype prints (`key<fry>`).
KEY_TAGS: Final = {tag: impl for impl, (tag, _) in _compat.PRNG_IMPLS.items()}


def key_dtype(name: str) -> Any:
    """The key dtype of a PRNG implementation named as `jax.random.key` takes it
    (`"threefry2x32"`) or by its tag (`"fry"`, as in `key<fry>`).

    Raises:
        JaxReleaseError: a built-in implementation that the running JAX lacks.
        ValueError: no implementation of that name.
    """
    return _compat.key_dtype(KEY_TAGS.get(name, name))


def key_dtypes() -> dict[str, Any]:
    """Every key dtype the running JAX has, by the name it prints (`"key<fry>"`)."""
    return {str(dtype): dtype for dtype in map(_compat.key_dtype, _compat.key_impls())}


def key_tags() -> tuple[str, ...]:
    """The tags of the PRNG implementations the running JAX has, `fry` first (JAX's default)."""
    return tuple(_compat.PRNG_IMPLS[impl][0] for impl in _compat.key_impls())


@ft.cache
def key_impl_name(dtype: Any) -> str:
    """The `impl=` name of a typed PRNG key dtype, as `jax.random.key` takes it ("" for others)."""
    if not is_key_dtype(dtype):
        return ""
    names: list[str] = []

    def read(key: Any) -> None:
        names.append(str(jax.random.key_impl(key)))

    jax.eval_shape(read, jax.ShapeDtypeStruct((), dtype))
    return names[0]


def leaf_nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    size: int = math.prod(leaf.shape)
    if is_key_dtype(leaf.dtype):
        return size * key_data_bytes(leaf.dtype)
    itemsize: int = np.dtype(leaf.dtype).itemsize
    return size * itemsize


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


def leaf_size(leaf: jax.ShapeDtypeStruct) -> Any:
    """A leaf's number of elements (one per PRNG key): an int, or an expression."""
    return math.prod(leaf.shape)


def count_text(n: Any) -> str:
    """A count with thousands separators (`1,024`), or a symbolic one as JAX writes it (`8*b`)."""
    return str(n) if is_symbolic(n) else f"{n:,}"


# -- notation --------------------------------------------------------------------------
# Short dtype names: each long prefix and its short form (`bfloat16` <-> `bf16`),
# in the order both directions must try them.
DTYPE_PREFIXES: Final = (
    ("bfloat", "bf"),
    ("float", "f"),
    ("uint", "u"),
    ("int", "i"),
    ("complex", "c"),
)


@ft.cache
def short_dtype(dtype: Any) -> str:
    """`float32` -> `f32`, `bfloat16` -> `bf16`, `key<fry>` unchanged."""
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        name = str(dtype)
    else:
        name = np.dtype(dtype).name
    for long, short in DTYPE_PREFIXES:
        if name.startswith(long):
            return short + name[len(long) :]
    return name


def long_dtype_name(name: str) -> str:
    """A short dtype name in full (`bf16` -> `bfloat16`, `u8` -> `uint8`); other names unchanged."""
    for long, short in DTYPE_PREFIXES:
        rest = name[len(short) :]
        if name.startswith(short) and rest[:1].isdigit():
            return long + rest
    return name


def short_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# The manual mesh axes a leaf (or aval) varies over, empty outside `shard_map`; and all
# its manual axis sets `(varying, unreduced, reduced)`, None when it has none.
varying_axes = _compat.varying_axes
manual_axis_sets = _compat.axis_sets


def same_type(e: jax.ShapeDtypeStruct, a: jax.ShapeDtypeStruct) -> bool:
    """Whether two array leaves have one type as Structures compare them: shape, dtype,
    weak flag and manual axes (not sharding)."""
    return (
        (e.shape == a.shape or same_symbolic_shape(e.shape, a.shape))
        and e.dtype == a.dtype
        and e.weak_type == a.weak_type
        and (_compat.manual_axes(e) is _compat.manual_axes(a) or manual_axis_sets(e) == manual_axis_sets(a))
    )


def axes_str(axes: frozenset[str]) -> str:
    return "{V:" + ",".join(sorted(axes)) + "}"


def leaf_str(leaf: Any) -> str:
    """One leaf in compact notation; static leaves as their `repr`."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        weak = "~" if leaf.weak_type else ""
        text = f"{weak}{short_dtype(leaf.dtype)}{short_shape(leaf.shape)}"
        axes = varying_axes(leaf)
        if axes:
            text += axes_str(axes)
        return text
    text = repr(leaf)
    return text if len(text) <= 40 else text[:37] + "..."


def spec_text(spec: Any) -> str:
    """A `PartitionSpec` as the newest JAX prints it, `P('d', None)`, on every release
    (before jax 0.9.1 its repr is `PartitionSpec('d', None)`)."""
    text = "P(" + repr(_compat.spec_entries(spec))[1:-1]
    unreduced, reduced = getattr(spec, "unreduced", None), getattr(spec, "reduced", None)
    extra = [f"{name}={set(axes)!r}" for name, axes in (("unreduced", unreduced), ("reduced", reduced)) if axes]
    if extra:
        text += ("" if text == "P(" else " " if text.endswith(",") else ", ") + ", ".join(extra)
    return text + ")"


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


def int_too_big_message(fn_name: str, where: str, value: int, bits: int) -> str:
    other = (
        "bind it with `functools.partial` so it stays a concrete Python value"
        if fn_name == "out_structure"
        else "keep it out of the tree (a Python int leaf is an array to JAX)"
    )
    return (
        f"treeshape.{fn_name}: {where} is the Python int {value}, which does not fit the int{bits} JAX gives "
        f"Python ints. Pass it as a typed array (e.g. `np.int64({value})` with jax_enable_x64 on), or {other}."
    )


def bad_shape_message(fn_name: str, where: str, shape: Any, problem: str) -> str:
    """A leaf with `.shape` and `.dtype` whose shape JAX cannot take."""
    return (
        f"treeshape.{fn_name}: {where} has shape {shape!r}, which is not a sequence of integer sizes >= 0: "
        f"{problem}. Give it integer sizes (a `jax.ShapeDtypeStruct((8, 3), jnp.float32)`, or an object whose "
        "`.shape` is a tuple of ints), or keep it out of the tree if it is not an array."
    )
