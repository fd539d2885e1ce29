"""Leaves: what a pytree leaf is to JAX, a user's tree read leaf by leaf, and a leaf's text.

A leaf is an array for JAX (a `jax.Array` or tracer, a NumPy array or scalar
of a dtype JAX holds, a `jax.ShapeDtypeStruct`, a Python scalar, or a duck
array with `.shape` and such a `.dtype`), or a static value. `read_leaves`
types each leaf as JAX would, refusing what JAX or XLA cannot take (a Python
int too big, a shape that is no shape, an array too large); `flatten` refuses
a tree that contains itself before JAX's flatten meets it; a tracer leaked
from an earlier trace is refused at top level. Leaves are written compactly:
`f32[2,3]`, `~f32[]` (weak), `key<fry>[4]`, `f32[8]{V:i}` (varying over manual
axis `i`). Dtypes are `_dtypes`'s to know, shapes and their dimensions `_shapes`'s.
"""

import collections
import functools as ft
import gc
import itertools
import operator
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu
import numpy as np

from . import _compat, _nodes
from ._dtypes import jax_dtype, short_dtype
from ._shapes import (
    BadShape,
    check_fits,
    checked_shape,
    extent_problem,
    has_symbolic,
    same_symbolic_shape,
    short_shape,
    sizes,
)
from ._tree import chain_path, clip


# How a leaf is treated, decided once per Python type.
ARRAY = 0  # jax.Array or tracer: abstract, keyed by its aval
NUMPY = 1  # np.ndarray / NumPy scalar: abstract, strong
SDS = 2  # jax.ShapeDtypeStruct: abstract, keyed by itself
SCALAR = 3  # Python bool/int/float/complex: abstract (weak, except bool)
OTHER = 4  # static, unless the instance has .shape and .dtype (duck array)
DIM = 5  # a `jax.export` dimension expression: abstract, a weak integer scalar, as JAX types it

SCALAR_TYPES = (bool, int, float, complex)
KINDS: dict[type, int] = {}
ARRAY_TYPES: set[type] = set()  # the types `kind_of` found ARRAY


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
        if kind == ARRAY:
            ARRAY_TYPES.add(cls)
        if kind != OTHER or cls.__module__ == "builtins":  # a user's class is not kept alive
            KINDS[cls] = kind
    return kind


def is_duck_array(x: Any) -> bool:
    """An object JAX takes as an array: `.shape` and a `.dtype` JAX can hold."""
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type) and jax_dtype(x.dtype)


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


def _recorded_sharding(x: Any) -> jax.sharding.NamedSharding | None:
    """The sharding an orbax checkpoint records for an array it saved (over an abstract mesh of
    the saved axes: the devices need not exist here), or None."""
    found = _nodes.orbax_sharding(getattr(x, "sharding", None))
    if found is None:
        return None
    sizes, names, spec = found
    return jax.sharding.NamedSharding(jax.sharding.AbstractMesh(sizes, names), jax.sharding.PartitionSpec(*spec))


def written_by_orbax(tree: Any, leaves: Sequence[Any]) -> bool:
    """Whether `tree` is an orbax checkpoint's metadata tree as orbax gives it
    (`checkpointer.metadata(path).item_metadata.tree`, `leaves` its leaves): each leaf is
    orbax's metadata of the value saved at that leaf's own path (its `name`, the keys joined
    by dots). Its containers are then the ones orbax writes for the saved tree's nodes (a
    list for a tuple, a dict for a namedtuple, None for an empty state), and its leaves keep
    no weak type. A tree a user built around such leaves (`{"s": [meta["step"]]}`) is not."""
    if not leaves or not all(map(_is_orbax_metadata, leaves)):
        return False
    flat = jtu.tree_flatten_with_path(tree)[0]
    return len(flat) == len(leaves) and all(
        getattr(x, "name", None) == ".".join(str(_nodes.key_name(key)) for key in keys) for keys, x in flat
    )


def _is_orbax_metadata(x: Any) -> bool:
    return type(x).__module__.startswith("orbax.") and isinstance(getattr(x, "name", None), str)


@ft.lru_cache(maxsize=4096)
def _unsharded(aval: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


class IntTooBig(OverflowError):
    """A Python int leaf that no JAX integer of the default width holds."""

    def __init__(self, index: int, value: int, bits: int) -> None:
        super().__init__(index, value, bits)
        self.index, self.value, self.bits = index, value, bits


_SHAPE: Final = operator.attrgetter("shape")
_DTYPE: Final = operator.attrgetter("dtype")
_GIVEN_SHARDING: Final = operator.attrgetter(_compat.GIVEN_SHARDING_FIELD)
_SPEC: Final = jax.sharding.PartitionSpec


def _given_as_read(leaves: list[Any], sharded_symbolic: bool) -> bool:
    """Whether `read_leaves` at top level describes each of `leaves` as itself, told in a
    few passes of C code over the leaves and then per distinct shape and dtype (a big tree
    has few), instead of a Python loop over the leaves: every leaf is a
    `jax.ShapeDtypeStruct` (not a subclass) of a canonical dtype whose dimensions are ints
    >= 0 or symbolic (each checked by its type, so no shape stands for an equal one of
    other types), that XLA can hold with any of the dtypes present, and none given a bare
    `PartitionSpec` as its sharding (which JAX's `sharding` reads on the mesh in context, and
    refuses without one); where a shape is symbolic and `sharded_symbolic` leaves are
    collected, no leaf has a sharding. False leaves them to the loop, which also names a
    leaf that JAX or XLA cannot take."""
    sds = jax.ShapeDtypeStruct
    if type(leaves[0]) is not sds or len(set(map(type, leaves))) != 1:
        return False
    try:  # the shardings as given, read from their field (the `sharding` property is a call)
        unsharded = operator.countOf(map(_GIVEN_SHARDING, leaves), None) == len(leaves)
        if not unsharded and any(map(isinstance, map(_GIVEN_SHARDING, leaves), itertools.repeat(_SPEC))):
            return False
    except Exception:  # (where JAX's field is the property itself)
        return False
    shapes = list(map(_SHAPE, leaves))
    dim_types = set(map(type, itertools.chain.from_iterable(shapes)))
    dim_types.discard(int)
    if not all(issubclass(t, _compat.SYMBOLIC_DIM_TYPE) for t in dim_types):
        return False  # a NumPy integer, a bool, a float: the loop checks (or converts) it
    dtypes = set(map(_DTYPE, leaves))
    if any(jax.dtypes.canonicalize_dtype(d, allow_extended_dtype=True) != d for d in dtypes):
        return False
    symbolic = False
    for shape in set(shapes):
        if type(shape) is not tuple:
            return False
        if not sizes(shape):
            try:
                if checked_shape(shape) != shape:
                    return False
            except BadShape:
                return False
            symbolic = True
        if any(extent_problem(shape, d) is not None for d in dtypes):
            return False
    return not (symbolic and sharded_symbolic and not unsharded)


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
    if top_level and leaves and _given_as_read(leaves, sharded_symbolic is not None):
        return leaves  # (a tree of `ShapeDtypeStruct`s, as `jax.eval_shape` returns it: no loop)
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
                traced = _compat.from_aval(aval)
                if (aval.shape, aval.dtype) not in fits:  # a tracer may be larger than any array
                    check_fits(traced, i, fits)
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
                check_fits(x, i, fits)
            if not top_level:
                append(_compat.abstract_leaf(x))
                continue
            dtype = x.dtype
            to = canonical.get(dtype)
            if to is None:
                to = canonical[dtype] = jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)
            append(x if to == dtype else x.update(dtype=to))
        elif kind == SCALAR:
            sds = scalars.get(cls)
            if sds is None:
                sds = scalars[cls] = _compat.from_aval(jax.typeof(cls()))
            if cls is int:
                if int_range is None:
                    bits = 8 * np.dtype(sds.dtype).itemsize
                    int_range = (-(2 ** (bits - 1)), 2 ** (bits - 1))
                if not int_range[0] <= x < int_range[1]:
                    raise IntTooBig(i, x, 8 * np.dtype(sds.dtype).itemsize)
            append(sds)
        elif kind == NUMPY:
            append(_compat.from_aval(jax.typeof(x)) if jax_dtype(x.dtype) else x)  # strings, objects: static
        elif kind == DIM:
            append(_compat.abstract_leaf(x))
        elif is_duck_array(x):
            try:
                abstract = as_abstract(x)
            except BadShape as e:
                e.index = i
                raise
            if abstract.sharding is None and top_level:
                abstract = abstract.update(sharding=_recorded_sharding(x))
            check_fits(abstract, i, fits)
            if abstract.sharding is not None and sharded_symbolic is not None and has_symbolic(abstract.shape):
                sharded_symbolic.append((i, abstract))
            if not top_level:
                append(_compat.abstract_leaf(abstract))
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
    if type(tree) not in _CONTAINERS:
        return None
    depth = _walk([tree], 0, None)
    if not depth:
        return None
    limit = sys.getrecursionlimit()
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
_CHUNK: Final = 2048  # containers whose children are found and typed in one go


def _walk(level: list[Any], depth: int, reached: set[type] | None) -> int:
    """Walk the containers of `level` (at `depth` below a root) and all below them, level by
    level; 0 when the levels end (the types of what they hold then added to `reached`), else
    the depth where the walk stopped: a tree that deep, or that large, may contain itself.

    Each level's containers are found in one call into the interpreter's C code: a tree's
    levels end. One deeper than JAX flattens, or whose levels keep growing past any model's
    (a cycle through two children doubles them), is then walked depth first by
    `_find_cycle`, which tells a cycle from a shared subtree."""
    limit = sys.getrecursionlimit()
    count = len(level) if depth else 0  # containers reached below the root
    types: set[type] = set()
    referents, containers = gc.get_referents, _CONTAINERS
    while level:
        if len(level) <= _CHUNK:  # (`_containers`, inlined: a small tree's walk is mostly its levels)
            children = referents(*level)
            here = set(map(type, children))
            types |= here
            if here <= containers:
                level = children
            else:
                level = [] if here.isdisjoint(containers) else [x for x in children if type(x) in containers]
        else:  # a wide level, a chunk at a time: its children are typed while still in the CPU's caches
            below: list[Any] = []
            for start in range(0, len(level), _CHUNK):
                below += _containers(referents(*level[start : start + _CHUNK]), types)
            level = below
        depth, count = depth + 1, count + len(level)
        if depth >= limit or count > _MANY_CONTAINERS:
            return depth
    if reached is not None:
        reached |= types
    return 0


def _containers(children: list[Any], types: set[type]) -> list[Any]:
    """The containers among `children`, the types of all of them added to `types` (one C-level
    pass; a second, over the children, only for a level that mixes containers and leaves)."""
    containers = _CONTAINERS
    here = set(map(type, children))
    types |= here
    if here <= containers:  # (most levels: all containers, or none)
        return children
    if here.isdisjoint(containers):
        return []
    return [x for x in children if type(x) in containers]


def walk_call(parts: list[Any], reached: set[type]) -> bool:
    """Whether `cycle_problem` of the tuple of `parts` (a call's arguments, keyword arguments and
    bound ones: each a tuple or dict) finds nothing, walked from the parts (the tuple holding
    them is new: no cycle passes through it); the types reached are added to `reached`."""
    return not _walk(parts, 1, reached)


_CONTAINERS: Final = frozenset(_VALUES)
_PLAIN_CONTAINERS: Final = frozenset((dict, list, tuple))


def walked_leaf_types(reached: set[type]) -> frozenset[type] | None:
    """The types of a tree's leaves, from the types its walk reached (`walk_call`), where
    those tell them: the tree is dicts, lists and tuples of arrays (which are unhashable, so
    no key: each is a leaf); None for any other tree."""
    types = reached - _PLAIN_CONTAINERS
    if types <= ARRAY_TYPES or all(kind_of(t) == ARRAY for t in types):
        return frozenset(types)
    return None


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
        flat: tuple[list[Any], Any] = jtu.default_registry.flatten(tree)  # `jtu.tree_flatten`, one call less
        return flat
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


def static_value(leaf: Any) -> Any:
    """What a static leaf is compared by: a NumPy array (of strings, objects) by
    its dtype, shape and contents, anything else by itself."""
    if isinstance(leaf, np.ndarray):
        contents = tuple(leaf.ravel().tolist()) if leaf.dtype.hasobject else leaf.tobytes()
        return (leaf.dtype.str, leaf.shape, contents)
    return leaf


# -- notation --------------------------------------------------------------------------
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
    return clip(repr(leaf), 40)


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
