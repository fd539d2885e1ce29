"""The `out_structure` and `ts.cost` caches, whole: each call's key, which answers may
be held, the entries, and their administration (`cache_info`, `clear_cache`).

A key is built from three kinds of parts:

- *values* for what is compared by equality: the abstract value JAX traces
  for each array-like leaf, Python scalars by type, and static values made of
  plain data (`_tree.plain_key`). They may be held strongly: they keep nothing
  alive that the user could free.
- *weak identities* for every other object and every callable: the entry is
  dropped when the object dies, and the object's own `__hash__`/`__eq__` is
  never called.
- the treedefs, the tracing context (`_compat.tracing_context`) and the
  abstract mesh.

A call with a part that fits none of these (an object that cannot be weakly
referenced, a mutable object whose state is not plain) is keyed `NOT_CACHED`:
it still works, it just traces. An answer is held only where the call's
treedefs (and an `out_structure` answer's treedef and static leaves) are plain
data.
"""

import collections
import enum
import operator
import threading
import types
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Final, Generic, NamedTuple, NoReturn, TypeVar

import jax
import jax.tree_util as jtu
import numpy as np

from . import _compat, _tree
from ._call import Call
from ._dtypes import jax_dtype
from ._leaf import (
    ARRAY,
    ARRAY_TYPES,
    DIM,
    KINDS,
    NUMPY,
    OTHER,
    SCALAR,
    SDS,
    as_abstract,
    is_duck_array,
    kind_of,
    static_value,
)
from ._structure import Structure
from ._tree import Strong, calls_python, importable, is_plain, treedef_is_plain


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


def contents_key(x: Any, depth: int, refs: list[Any]) -> Hashable | None:
    """A key for `x` by type and value if `x` is plain data (`_tree.plain_key`); a mutable
    object (a dataclass that is not frozen, an object with attributes, a set, a NumPy array
    of strings or objects) by its type and its current contents, when those are plain: a key
    for the call being made now, which never holds the object itself (nor its class, unless
    that is importable: a local class is appended to `refs` and weakly keyed). None for
    anything else."""
    return _tree.plain_key(x, depth, lambda obj, at: _state_key(obj, at, refs))


def _state_key(x: Any, depth: int, refs: list[Any]) -> Hashable | None:
    """A mutable object's key: its type and its attributes' current values (None if not plain)."""
    if kind_of(type(x)) == ARRAY or is_duck_array(x):
        return None  # its value is not in Python attributes: never keyed by them
    if isinstance(x, np.generic):
        return ("numpy", x.dtype.str, x.tobytes())
    if type(x) is set:
        key = contents_key(frozenset(x), depth + 1, refs)
        return None if key is None else ("set", key)
    if isinstance(x, np.ndarray):
        if x.nbytes > _MAX_ARRAY_KEY_BYTES:
            return None
        contents = static_value(x)
        key = _tree.plain_key(contents, depth + 1)
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
    key = contents_key(tuple(sorted(items.items(), key=lambda item: str(item[0]))), depth + 1, refs)
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
    if type(x) is types.FunctionType:  # its one plain weak reference: equal to the stored one by identity
        refs.append(x)
        return weakref.ref(x)
    if type(x) is types.MethodType:  # made afresh on each attribute access: key its parts
        return (types.MethodType, static_key(x.__func__, refs), static_key(x.__self__, refs))
    callable_ = callable(x) and not calls_python(x)  # an object with a `__call__` method is keyed by its state
    if not callable_:
        key = contents_key(x, 0, refs)
        if key is not None:
            return key
        if _has_state(x):  # its answer may change with its state, which cannot be keyed
            raise Uncacheable
    try:
        ref = weakref.ref(x)
    except TypeError:
        key = _tree.plain_key(x) if callable_ else None  # e.g. a NumPy ufunc
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


# -- leaves -------------------------------------------------------------------------
_INT32_MIN, _INT32_MAX = -(2**31), 2**31


def _scalar_key(x: Any) -> Any:
    cls = type(x)
    if cls is int and not _INT32_MIN <= x < _INT32_MAX:
        return (int, x)  # may not fit the weak int dtype: never share an entry
    return cls


_AVAL: Final = operator.attrgetter("aval")


def _leaf_keys(leaves: list[Any], concrete_scalars: bool | Sequence[bool], refs: list[Any]) -> Iterable[Any]:
    """Per-leaf key parts: the abstract value JAX traces for an array-like leaf
    (so an array, a NumPy array, a ShapeDtypeStruct and a duck array of one
    type share them), Python scalars by type (or value, when passed
    concrete: all, or per leaf), static values as `static_key` says."""
    kinds = KINDS  # each type's kind, as `kind_of` notes it (read here without a call per leaf)
    out = []
    for i, x in enumerate(leaves):
        kind = kinds.get(type(x))
        if kind is None:
            kind = kind_of(type(x))
        if kind == ARRAY:
            out.append(x.aval)
        elif kind == SCALAR:
            concrete = concrete_scalars if isinstance(concrete_scalars, bool) else concrete_scalars[i]
            out.append((type(x), x) if concrete else _scalar_key(x))
        elif kind == SDS or kind == DIM or (kind == NUMPY and jax_dtype(x.dtype)):
            out.append(_compat.abstractify(x))
        elif kind == OTHER and is_duck_array(x):
            out.append(_compat.abstractify(as_abstract(x)))
        else:
            out.append(static_key(x, refs))
    return out


def has_value(x: Any) -> bool:
    """An array with a value (or a tracer of an enclosing trace), as opposed to a
    `ShapeDtypeStruct` or a duck array, which only describe one."""
    kind = kind_of(type(x))
    return kind == ARRAY or (kind == NUMPY and jax_dtype(x.dtype))


_MAX_VALUE_KEY_BYTES: Final = 1 << 16


def _value_part(x: Any) -> Any:
    """A bound leaf's key part when bound arrays are passed concrete: their value."""
    if not has_value(x) or isinstance(x, jax.core.Tracer):
        return None  # keyed by its abstract value in the call's key
    if x.nbytes > _MAX_VALUE_KEY_BYTES:
        raise Uncacheable
    return (_compat.abstractify(x), np.asarray(x).tobytes())


# -- keys -----------------------------------------------------------------------------
class Key:
    """A cache key that hashes its (long) tuple once, when first asked (a call that finds the
    cache's latest entry needs no hash), with what its entry must not keep alive (`refs`,
    guarded weakly) and the treedefs that must be plain for its entry to be held."""

    __slots__ = ("items", "hash", "refs", "treedefs")

    def __init__(self, items: tuple[Any, ...], refs: list[Any], treedefs: tuple[jtu.PyTreeDef, ...]) -> None:
        self.items, self.refs, self.treedefs = items, refs, treedefs
        self.hash: int | None = None

    def held(self) -> "Key":
        """This key as an entry holds it: without `refs`."""
        key = Key.__new__(Key)
        key.items, key.hash, key.refs, key.treedefs = self.items, hash(self), [], ()
        return key

    def __hash__(self) -> int:
        if self.hash is None:
            self.hash = hash(self.items)  # may raise: a user object's __hash__ in node data
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and hash(self) == hash(other) and self.items == other.items


# The key of a call that is not cached: never found, never stored.
NOT_CACHED: Final = Key((), [], ())


def call_key(call: Call, *extra: Hashable, concrete_scalars: bool | Sequence[bool]) -> Key:
    """The key of `call`: its core function, treedefs, each leaf's part (`_leaf_keys`), the
    tracing context and the abstract mesh, then `extra` (`ts.cost` adds its own); `NOT_CACHED`
    where a part cannot be keyed. `concrete_scalars`: the call's Python scalars (all, or per
    leaf) are passed concrete (to a jitted core, as `Call.concrete_scalars` says), so they
    are keyed by value (bound ones always are)."""
    core, bound_leaves, bound_treedef, call_leaves, call_treedef, types_ = call
    refs: list[Any] = []
    bound: Iterable[Any]
    given: Iterable[Any]
    try:
        if (types_ if types_ is not None else call.leaf_types()) <= ARRAY_TYPES:
            # a model's parameters and batch: one C-level pass each
            bound, given = map(_AVAL, bound_leaves), map(_AVAL, call_leaves)
        else:
            bound = _leaf_keys(bound_leaves, True, refs)
            given = _leaf_keys(call_leaves, concrete_scalars, refs)
        if type(core) is types.FunctionType:  # (`static_key`'s first case, without the call)
            refs.append(core)
            core_part: Hashable = weakref.ref(core)
        else:
            core_part = static_key(core, refs)
        items = (  # the treedefs last: two calls that differ mostly differ in cheaper parts
            core_part,
            *bound,
            *given,
            _compat.tracing_context(),
            jax.sharding.get_abstract_mesh(),
            *extra,
            bound_treedef,
            call_treedef,
        )
        return Key(items, refs, (bound_treedef, call_treedef))
    except Exception:  # Uncacheable, or a user object's `__hash__` failing (node data's: when the key is hashed)
        return NOT_CACHED


def value_key(key: Key, bound_leaves: list[Any]) -> Key:
    """The key of a call whose bound arrays are passed concrete: `key` with their values
    (`NOT_CACHED` where one is larger than 64 KiB or not addressable here)."""
    if key is NOT_CACHED:
        return NOT_CACHED
    try:
        parts = tuple(_value_part(x) for x in bound_leaves)
        return Key((NEEDS_CONCRETE, key.held(), *parts), key.refs, key.treedefs)
    except Exception:
        return NOT_CACHED


# -- entries --------------------------------------------------------------------------
class _Marker(enum.Enum):
    NEEDS_CONCRETE = "NEEDS_CONCRETE"


# An entry saying that the call's `fn` needs its bound arrays as values: the answer
# is then keyed by those values too (`value_key`), and the entry counts no hit.
NEEDS_CONCRETE: Final = _Marker.NEEDS_CONCRETE

_Value = TypeVar("_Value")


class Cache(Generic[_Value]):
    """A thread-safe LRU map that forgets entries whose objects die; `holdable` says which
    answers it may keep."""

    def __init__(self, maxsize: int, holdable: Callable[[_Value], bool] = lambda _: True) -> None:
        self.maxsize = maxsize
        self._holdable = holdable
        # key -> (value, weakref guards, the stored key: moved by identity on a hit)
        self._entries: collections.OrderedDict[Key, tuple[_Value, list[Any], Key]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._dead: list[Any] = []  # filled by weakref callbacks, purged under the lock
        self._latest: Key | None = None  # the stored key last found or stored (a loop's next call)
        self.hits = 0
        self.misses = 0

    def _purge(self) -> None:
        while self._dead:
            self._entries.pop(self._dead.pop(), None)

    def get(self, key: Key) -> _Value | None:
        """The entry of `key`, or None (a miss, counted; `NOT_CACHED` is always one)."""
        with self._lock:
            if self._dead:
                self._purge()
            latest = self._latest
            try:
                if key is NOT_CACHED:
                    entry = None
                elif latest is not None and latest.items == key.items:  # the same call again: `key` not hashed
                    entry = self._entries.get(latest)  # (by identity; or an equal key stored since)
                else:
                    entry = self._entries.get(key)
            except Exception:  # a user object's __eq__ or __hash__ (in node data)
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._latest = entry[2]
            self._entries.move_to_end(entry[2])  # found by identity: no second key comparison
            if entry[0] is not NEEDS_CONCRETE:  # a lookup on, whose hit or miss is counted next
                self.hits += 1
            return entry[0]

    def put(self, key: Key, value: _Value) -> None:
        """Store `value` under `key`, unless the key is `NOT_CACHED` or the entry may not be held."""
        if key is NOT_CACHED or not all(map(treedef_is_plain, key.treedefs)) or not self._holdable(value):
            return
        try:
            held = key.held()
        except Exception:  # a user object's __hash__ (in node data) failing: not held
            return
        dead = self._dead

        def forget(_: Any) -> None:
            dead.append(held)

        guards = [weakref.ref(obj, forget) for obj in key.refs]
        with self._lock:
            self._purge()
            try:
                self._entries[held] = (value, guards, held)
            except Exception:  # a user object's __eq__ (in node data), on a hash collision
                return
            self._entries.move_to_end(held)
            self._latest = held
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)

    def resize(self, maxsize: int) -> int:
        with self._lock:
            old, self.maxsize = self.maxsize, maxsize
            while len(self._entries) > maxsize:
                self._entries.popitem(last=False)
            return old

    def info(self) -> "Counts":
        with self._lock:
            self._purge()
            return Counts(self.hits, self.misses, len(self._entries), self.maxsize)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._dead.clear()
            self._latest = None
            self.hits = self.misses = 0


def _holdable(answer: Structure | _Marker) -> bool:
    """Whether an `out_structure` answer may be kept: its treedef and static leaves are plain."""
    if answer is NEEDS_CONCRETE:
        return True
    return treedef_is_plain(answer.treedef) and all(
        isinstance(leaf, jax.ShapeDtypeStruct) or is_plain(leaf) for leaf in answer.leaves
    )


CACHE: Cache[Structure | _Marker] = Cache(maxsize=4096, holdable=_holdable)
# `ts.cost`'s answers (small figures, never a compiled program), keyed as `CACHE` is.
COST_CACHE: Cache[Any] = Cache(maxsize=4096)


# -- the cached answer ------------------------------------------------------------
_LOOK_UP: Final = object()


def answer(
    cache: Cache[Any],
    key: Key,
    bound_leaves: list[Any],
    evaluate: Callable[[bool], _Value],
    looked_up: Any = _LOOK_UP,
) -> tuple[_Value, bool]:
    """The answer to a call keyed `key` (`out_structure`'s, `cost`'s), and whether it was
    evaluated now (False: found in `cache`).

    `evaluate(close_bound)` computes it: first with the bound arrays abstract. Where
    that fails as JAX fails where a value is needed (a `TypeError` or `IndexError`: a
    size, an `int()`, a slice) and some bound leaf has a value, it is evaluated again
    with `close_bound=True` (the bound arrays passed concrete, as `jax.eval_shape` and
    `jax.jit` of the partial itself take them): `key` then holds `NEEDS_CONCRETE`, and
    the answer is stored under a key of those values (`value_key`; small arrays only),
    looked up first on the calls after. Any other error is the caller's to raise.

    `looked_up`: what `cache.get(key)` gave, where the caller looked first (a hit then needs
    no `evaluate` built); by default it is looked up here.
    """
    hit = cache.get(key) if looked_up is _LOOK_UP else looked_up
    if hit is not None and hit is not NEEDS_CONCRETE:
        return hit, False
    if hit is NEEDS_CONCRETE:
        return _with_bound_values(cache, key, bound_leaves, evaluate, look_up=True)
    try:
        value = evaluate(False)
    except (TypeError, IndexError):
        if not any(has_value(x) for x in bound_leaves):
            raise
        retry = True
    else:
        retry = False
    if retry:  # outside the handler: an error now is the user's, not a consequence of the first
        found = _with_bound_values(cache, key, bound_leaves, evaluate, look_up=False)
        cache.put(key, NEEDS_CONCRETE)  # (only once the values answer: else the next call tries again)
        return found
    cache.put(key, value)
    return value, True


def _with_bound_values(
    cache: Cache[Any], key: Key, bound_leaves: list[Any], evaluate: Callable[[bool], _Value], look_up: bool
) -> tuple[_Value, bool]:
    """The answer with the bound arrays passed concrete, keyed by their values on top of
    `key`; looked up first with `look_up` (not on the first call, whose miss is counted)."""
    values = value_key(key, bound_leaves)
    if look_up:
        hit = cache.get(values)
        if hit is not None and hit is not NEEDS_CONCRETE:
            return hit, False
    value = evaluate(True)
    cache.put(values, value)
    return value, True


# -- administration -------------------------------------------------------------------
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

    # `ts.cost`'s counts: attributes beside the four fields (which stay `out_structure`'s)
    cost_hits: int
    cost_misses: int
    cost_size: int

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
        vars(self).update(cost_hits=cost_hits, cost_misses=cost_misses, cost_size=cost_size)
        return self

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"treeshape.CacheInfo is immutable; cannot assign {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"treeshape.CacheInfo is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:  # equal to a plain tuple of its four fields, as before
        return (not isinstance(other, CacheInfo) or vars(self) == vars(other)) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = Counts.__hash__

    def __repr__(self) -> str:
        return f"CacheInfo({', '.join(f'{k}={v!r}' for k, v in {**self._asdict(), **vars(self)}.items())})"


def cache_info() -> CacheInfo:
    """Return the statistics of every cache that [treeshape.clear_cache][] empties.

    Returns:
        A [treeshape.CacheInfo][]: `(hits, misses, size, maxsize)` of the
        `out_structure` cache, with `cost_hits`, `cost_misses` and
        `cost_size` for the cache of [treeshape.cost][] (also behind
        [treeshape.largest_fit][]).

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.clear_cache()
        >>> f = lambda x: x * 2
        >>> _ = ts.out_structure(f, jnp.ones(3))
        >>> _ = ts.out_structure(f, jnp.zeros(3))  # same abstract input: a hit
        >>> _ = ts.cost(f, jnp.ones(3))
        >>> ts.cache_info()
        CacheInfo(hits=1, misses=1, size=1, maxsize=4096, cost_hits=0, cost_misses=1, cost_size=1)
    """
    cost_hits, cost_misses, cost_size, _ = COST_CACHE.info()
    return CacheInfo(*CACHE.info(), cost_hits, cost_misses, cost_size)


def clear_cache() -> None:
    """Empty the `out_structure` cache and `cost`'s, and reset their counts (see [treeshape.cache_info][]).

    Examples:
        >>> import treeshape as ts
        >>> ts.clear_cache()
        >>> ts.cache_info().size
        0
    """
    CACHE.clear()
    COST_CACHE.clear()


def set_cache_maxsize(maxsize: int) -> int:
    """Bound both caches to `maxsize` entries (evicting the oldest); return the old bound.

    Private (tests and benchmarks): the public default stays 4096.
    """
    if not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"treeshape: the cache maxsize must be an int >= 0, got {maxsize!r}")
    COST_CACHE.resize(maxsize)
    return CACHE.resize(maxsize)


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"CacheInfo": CacheInfo}
