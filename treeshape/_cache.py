"""The `out_structure` cache: keys that are never wrong, entries that keep nothing alive.

A key is built from three kinds of parts:

- *values* for what is compared by equality: abstract values of array inputs,
  and static values made of plain data (numbers, strings, bytes, `None`,
  enums, classes, module-level functions, and tuples / frozensets /
  namedtuples / frozen dataclasses of these). They may be held strongly:
  they keep nothing alive that the user could free.
- *weak identities* for every other object and every callable: the entry is
  dropped when the object dies, and the object's own `__hash__`/`__eq__` is
  never called.
- the tracing context (`_compat.tracing_context`) and the abstract mesh.

Anything that fits none of these (an object that cannot be weakly
referenced, a treedef whose node data is not plain) makes the call
uncacheable: it still works, it just traces.
"""

import builtins
import collections
import gc
import threading
import types
import weakref
from collections.abc import Hashable
from typing import Any, ClassVar, Final, Generic, NamedTuple, NoReturn, TypeVar

import jax
import jax.tree_util as jtu
import numpy as np

from . import _compat, _tree
from ._leaf import ARRAY, is_duck_array, kind_of, static_value
from ._structure import Structure
from ._tree import Strong, calls_python, importable


class Uncacheable(Exception):
    """A part of the call cannot be part of a cache key."""


class _WeakId:
    """A key part compared by identity that does not keep its object alive."""

    __slots__ = ("ref", "ident")

    def __init__(self, ref: "weakref.ref[Any]", ident: int) -> None:
        self.ref, self.ident = ref, ident

    def __hash__(self) -> int:
        return self.ident

    def __eq__(self, other: object) -> bool:
        if type(other) is not _WeakId or other.ident != self.ident:
            return False
        obj = self.ref()
        return obj is not None and obj is other.ref()


# -- plain values ---------------------------------------------------------------
_MAX_ARRAY_KEY_BYTES: Final = 1 << 16  # a larger NumPy array in a static value is not copied into a key


def plain_key(x: Any, depth: int = 0, refs: list[Any] | None = None) -> Hashable | None:
    """A key for `x` by type and value if `x` is plain data (`_tree.plain_key`), else None.

    With `refs` (a list, as `static_key` takes it), a mutable object (a
    dataclass that is not frozen, an object with attributes, a set, a NumPy
    array of strings or objects) is keyed by its type and its current
    contents, when those are plain: a key for the call being made now, which
    never holds the object itself (nor its class, unless that is importable:
    a local class is appended to `refs` and weakly keyed).
    """
    if refs is None:
        return _tree.plain_key(x, depth)
    return _tree.plain_key(x, depth, lambda obj, at: _state_key(obj, at, refs))


def _state_key(x: Any, depth: int, refs: list[Any]) -> Hashable | None:
    """A mutable object's key: its type and its attributes' current values (None if not plain)."""
    if kind_of(type(x)) == ARRAY or is_duck_array(x):
        return None  # its value is not in Python attributes: never keyed by them
    if isinstance(x, np.generic):
        return ("numpy", x.dtype.str, x.tobytes())
    if type(x) is set:
        key = plain_key(frozenset(x), depth + 1, refs)
        return None if key is None else ("set", key)
    if isinstance(x, np.ndarray):
        if x.nbytes > _MAX_ARRAY_KEY_BYTES:
            return None
        contents = static_value(x)
        key = plain_key(contents, depth + 1)
        return None if key is None else ("ndarray", key)
    items: dict[str, Any] = {}
    attributes = getattr(x, "__dict__", None)
    if isinstance(attributes, dict):
        items.update(attributes)
    for klass in type(x).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                items[name] = getattr(x, name)
    if attributes is None and not items:
        return None  # no state Python can see (a C object): keyed by identity
    key = plain_key(tuple(sorted(items.items(), key=lambda item: str(item[0]))), depth + 1, refs)
    if key is None:
        return None
    cls = type(x)
    if importable(cls):
        return (Strong(cls), "state", key)
    refs.append(cls)
    return (_WeakId(weakref.ref(cls), id(cls)), "state", key)


def static_key(x: Any, refs: list[Any]) -> Hashable:
    """The key part of a static value or callable.

    Plain data is keyed by value, and so is a mutable object whose contents
    are plain (by its state now: mutating it makes the next call another
    entry); callables and objects with no visible state by weak identity
    (appended to `refs`, so the entry dies with them).

    Raises:
        Uncacheable: `x` is a mutable object whose state is not plain data, or
            neither plain nor weakly referenceable.
    """
    if type(x) is types.MethodType:  # made afresh on each attribute access: key its parts
        return (types.MethodType, static_key(x.__func__, refs), static_key(x.__self__, refs))
    callable_ = callable(x) and not calls_python(x)  # an object with a `__call__` method is keyed by its state
    if not callable_:
        key = plain_key(x, refs=refs)
        if key is not None:
            return key
        if _has_state(x):  # its answer may change with its state, which cannot be keyed
            raise Uncacheable
    try:
        ref = weakref.ref(x)
    except TypeError:
        key = plain_key(x) if callable_ else None  # e.g. a NumPy ufunc
        if key is None:
            raise Uncacheable from None
        return key
    refs.append(x)
    return _WeakId(ref, id(x))


def _has_state(x: Any) -> bool:
    """Whether `x` has contents Python can see and change (attributes, slots, array items)."""
    if isinstance(x, (set, np.ndarray)) or isinstance(getattr(x, "__dict__", None), dict):
        return True
    return any(klass.__dict__.get("__slots__") for klass in type(x).__mro__)


# -- tracers hidden in outputs ---------------------------------------------------
_LIMIT: Final = 10_000
_BUILTINS: Final = vars(builtins)
_OPAQUE: Final = (str, bytes, int, float, complex, type, types.ModuleType, types.CodeType, np.ndarray, jax.Array)


def holds_tracer(x: Any) -> bool | None:
    """Whether a tracer is reachable from `x` (an attribute, a closure cell, a
    generator frame, a container...): True, False, or None when `x` reaches
    more objects than can be searched."""
    seen: set[int] = set()
    stack = [x]
    while stack:
        obj = stack.pop()
        if isinstance(obj, jax.core.Tracer):
            return True
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        if type(obj) is dict and ("__builtins__" in obj or obj is _BUILTINS):  # a module's globals
            continue
        seen.add(id(obj))
        if len(seen) > _LIMIT:
            return None
        stack.extend(gc.get_referents(obj))
    return False


# -- the cache -----------------------------------------------------------------
class Counts(NamedTuple):
    """One cache's statistics."""

    hits: int
    misses: int
    size: int
    maxsize: int


class CacheInfo(Counts):
    """Statistics of the caches that [treeshape.clear_cache][] empties.

    A named tuple of the `out_structure` cache's four fields, `(hits, misses,
    size, maxsize)`, as `functools.lru_cache` reports them (so `hits, misses,
    size, maxsize = ts.cache_info()` unpacks it), plus three attributes for the
    cache of [treeshape.cost][] (also behind [treeshape.largest_fit][]), whose
    bound is the same `maxsize`.

    Attributes:
        hits: Calls to `out_structure` answered without tracing.
        misses: Calls to `out_structure` that traced.
        size: Entries held by the `out_structure` cache.
        maxsize: The bound of each cache (entries).
        cost_hits: Calls to `ts.cost` answered without compiling.
        cost_misses: Calls to `ts.cost` that compiled (or could not be cached).
        cost_size: Entries held by the `ts.cost` cache.

    Examples:
        >>> import treeshape as ts
        >>> ts.clear_cache()
        >>> info = ts.cache_info()
        >>> info
        CacheInfo(hits=0, misses=0, size=0, maxsize=4096, cost_hits=0, cost_misses=0, cost_size=0)
        >>> hits, misses, size, maxsize = info
        >>> info.cost_misses
        0
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    cost_hits: int
    cost_misses: int
    cost_size: int
    _COST_FIELDS: ClassVar[tuple[str, ...]] = ("cost_hits", "cost_misses", "cost_size")

    def __new__(
        cls,
        hits: int,
        misses: int,
        size: int,
        maxsize: int,
        cost_hits: int = 0,
        cost_misses: int = 0,
        cost_size: int = 0,
    ) -> "CacheInfo":
        self = super().__new__(cls, hits, misses, size, maxsize)
        self.__dict__.update(cost_hits=cost_hits, cost_misses=cost_misses, cost_size=cost_size)
        return self

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"treeshape.CacheInfo is immutable; cannot assign {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"treeshape.CacheInfo is immutable; cannot delete {name!r}")

    def _costs(self) -> tuple[int, int, int]:
        return (self.cost_hits, self.cost_misses, self.cost_size)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CacheInfo) and self._costs() != other._costs():
            return False
        return tuple.__eq__(self, other)  # NotImplemented for a non-tuple

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = Counts.__hash__

    def __repr__(self) -> str:
        fields = {**self._asdict(), **dict(zip(self._COST_FIELDS, self._costs(), strict=True))}
        return "CacheInfo(" + ", ".join(f"{name}={value!r}" for name, value in fields.items()) + ")"


class Key:
    """A cache key that hashes its (long) tuple once."""

    __slots__ = ("items", "hash")

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items
        self.hash = hash(items)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.hash == other.hash and self.items == other.items


def context_key() -> tuple[Any, ...]:
    """Everything outside the arguments that can change a traced result."""
    return (_compat.tracing_context(), jax.sharding.get_abstract_mesh())


# An entry saying that the call's `fn` needs its bound arrays as values: the answer
# is then keyed by those values too (see `_infer`).
NEEDS_CONCRETE: Final = Structure(jtu.tree_structure(None), ())


_Value = TypeVar("_Value")


class Cache(Generic[_Value]):
    """A thread-safe LRU map that forgets entries whose objects die."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        # key -> (value, weakref guards, the stored key: moved by identity on a hit)
        self._entries: collections.OrderedDict[Key, tuple[_Value, list[Any], Key]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._dead: list[Any] = []  # filled by weakref callbacks, purged under the lock
        self.hits = 0
        self.misses = 0

    def _purge(self) -> None:
        while self._dead:
            self._entries.pop(self._dead.pop(), None)

    def get(self, key: Key) -> _Value | None:
        with self._lock:
            self._purge()
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(entry[2])  # found by identity: no second key comparison
            if entry[0] is not NEEDS_CONCRETE:  # a lookup on, whose hit or miss is counted next
                self.hits += 1
            return entry[0]

    def put(self, key: Key, value: _Value, objects: list[Any]) -> None:
        dead = self._dead

        def forget(_: Any) -> None:
            dead.append(key)

        guards = [weakref.ref(obj, forget) for obj in objects]
        with self._lock:
            self._purge()
            self._entries[key] = (value, guards, key)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def resize(self, maxsize: int) -> int:
        with self._lock:
            old, self.maxsize = self.maxsize, maxsize
            while len(self._entries) > maxsize:
                self._entries.popitem(last=False)
            return old

    def miss(self) -> None:
        with self._lock:
            self.misses += 1

    def info(self) -> Counts:
        with self._lock:
            self._purge()
            return Counts(self.hits, self.misses, len(self._entries), self.maxsize)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._dead.clear()
            self.hits = self.misses = 0


CACHE: Cache[Structure] = Cache(maxsize=4096)
# `ts.cost`'s answers (small figures, never a compiled program), keyed as `CACHE` is.
COST_CACHE: Cache[Any] = Cache(maxsize=4096)


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"CacheInfo": CacheInfo}
