"""The tree model: pytree nodes, the keys of their children, paths, and plain data.

Every module that walks a tree asks here (JSON, diff, the table, the cache key,
the tracer search, cycle paths), so this is where treeshape learns a new kind
of node:

- node kinds: `None`, lists and tuples (children keyed `[i]`), dicts,
  `OrderedDict` and `defaultdict` (`['k']`), namedtuples (`.field`, one
  `GetAttrKey` per field), framework nodes (flax.nnx, equinox, registered
  dataclasses: their keys come from `_nodes.split`), and any other
  registered node (keyed as JAX's own `tree_flatten_with_path` keys it);
- a child's key as `jax.tree_util.keystr` writes it, and paths built from them;
- plain data: values compared by value that may be held (the cache keys them,
  static values print them);
- `StaticRepr`, a static value known only by its text.

JAX's own facts (which types JAX treats as namedtuple nodes, keyed flattening
on every release) come from `_compat`.
"""

import collections
import dataclasses
import enum
import itertools
import sys
import types
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np

from . import _compat, _nodes


class StaticRepr:
    """A static leaf loaded from JSON: known only by its type's name and its `repr`.

    JSON keeps `str`, `int`, `float`, `bool` and `None` static leaves as
    themselves, and functions and classes of imported modules by name; any
    other static value (an enum, a closure, an object) is stored as its text
    (its `repr` without memory addresses, a function inside it by its import
    path) and loaded back as this marker, whose `repr` is that text: the
    value itself is never rebuilt from its text (untrusted input). It equals
    another marker with the same type name and text, and every live value
    compared by identity that prints as it (a function, a closure, a
    `functools.partial`, a bound method, a NamedTuple of functions such as an
    optax `GradientTransformation`), so a Structure loaded from JSON equals
    the tree it was written from; two live values still compare by their own
    `==`.

    Attributes:
        type_name: The original value's type, as `"module:qualname"`.
        text: The original value's text, as tables and messages print it.

    Examples:
        >>> import treeshape as ts
        >>> marker = ts.StaticRepr("enum:Color", "<Color.RED: 1>")
        >>> marker
        <Color.RED: 1>
        >>> marker == ts.StaticRepr("enum:Color", "<Color.RED: 1>")
        True
        >>> import functools, jax
        >>> pool = functools.partial(jax.nn.gelu, approximate=False)
        >>> ts.StaticRepr("functools:partial", "functools.partial(jax.nn.gelu, approximate=False)") == pool
        True
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    __slots__ = ("type_name", "text")

    type_name: str
    text: str

    def __init__(self, type_name: str, text: str) -> None:
        object.__setattr__(self, "type_name", type_name)
        object.__setattr__(self, "text", text)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("treeshape StaticRepr markers are immutable")

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        if type(other) is StaticRepr:
            return self.type_name == other.type_name and self.text == other.text
        if _nodes.by_text(other):  # a function-like live value: the text it would be written as
            return self == as_text(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((StaticRepr, self.type_name, self.text))

    def __reduce__(self) -> tuple[Any, ...]:
        return (StaticRepr, (self.type_name, self.text))


def as_text(x: Any) -> StaticRepr:
    """`x` as JSON keeps a value it does not write as itself or by name: its type's name and text."""
    kind = type(x)
    return StaticRepr(f"{kind.__module__}:{kind.__qualname__}", _nodes.static_text(x))


# -- node kinds and their children's keys ----------------------------------------------
is_namedtuple: Final[Callable[[Any], bool]] = _compat.is_namedtuple
keyed_children: Final = _compat.flatten_one_level_with_keys  # `(keyed children, node data)` of a node


def key_text(key: Any) -> str:
    """One key as `jax.tree_util.keystr` writes it in a path (`[0]`, `['w']`, `.field`)."""
    kind = type(key)
    if kind is jtu.SequenceKey:
        return f"[{key.idx}]"
    if kind is jtu.DictKey:
        return f"[{key.key!r}]"
    if kind is jtu.GetAttrKey:
        return f".{key.name}"
    return jtu.keystr((key,))


def mapping_keys(node_type: type, aux: Any) -> Any:
    """The keys of a dict-like node (dict, OrderedDict, defaultdict, nnx.State, FrozenDict),
    from its node data; None for any other node."""
    if node_type is dict or node_type is collections.OrderedDict:
        return aux
    if node_type is collections.defaultdict:
        return aux[1]
    if node_type is list or node_type is tuple or node_type is type(None):
        return None
    return _nodes.mapping_keys(node_type, aux)


def node_keys(node_type: type, aux: Any, n: int) -> list[Any] | None:
    """The keys of the `n` children of a node (type and node data), read from the node data
    alone; None where only the node itself can tell (`child_keys` rebuilds it then)."""
    if node_type is list or node_type is tuple:
        return [jtu.SequenceKey(i) for i in range(n)]
    if node_type is dict or node_type is collections.OrderedDict:
        return [jtu.DictKey(k) for k in aux]
    if node_type is collections.defaultdict:
        return [jtu.DictKey(k) for k in aux[1]]
    keys = _compat.namedtuple_keys(node_type)
    if keys is not None:
        return keys
    split = _nodes.split(node_type, aux)  # a framework node names its children in its node data
    if split is not None and split.children is not None and len(split.children) == n:
        return list(split.children)
    return None


def child_keys(node: jtu.PyTreeDef, leaves: Sequence[Any], n: int | None = None) -> list[Any]:
    """The keys of the `n` children of `node` (a treedef whose root is a node, `leaves` its
    own leaves), as `jax.tree_util.tree_flatten_with_path` gives them."""
    if node.num_nodes == 1:  # no children (a static node, whose data may be known by its text only)
        return []
    node_type, aux = node.node_data()
    if n is None and node_type not in _KEYED_BY_DATA and not is_namedtuple(node_type):
        n = len(node.children())  # a list's length, or a framework node's arity to check its keys against
    keys = node_keys(node_type, aux, -1 if n is None else n)
    if keys is not None:
        return keys
    keyed, _ = keyed_children(node.unflatten(leaves))  # a registered node keys its children its own way
    return [key for key, _ in keyed]


def child_texts(node: jtu.PyTreeDef, leaves: Sequence[Any], n: int | None = None) -> list[str]:
    """The keys of the children of `node`, as `keystr` writes each in a path."""
    node_type = node.node_data()[0]
    if node_type is list or node_type is tuple:  # the common long node: no key object per child
        return [f"[{i}]" for i in range(len(node.children()) if n is None else n)]
    return [key_text(key) for key in child_keys(node, leaves, n)]


_KEYED_BY_DATA: Final = frozenset({dict, collections.OrderedDict, collections.defaultdict})


# -- paths ---------------------------------------------------------------------------------
def children(path: str, x: Any, backwards: bool = False) -> Iterator[tuple[str, Any]]:
    """The children of node `x` with their paths (under `path`), in JAX's order or backwards
    (lazily for lists and tuples, however long they are).

    Raises:
        ValueError: `x` is a leaf.
    """
    kind = type(x)
    if kind is dict:
        ordered = sorted(x)  # JAX's order (a user's dict need not be in it; a rebuilt one is)
        keys = reversed(ordered) if backwards else iter(ordered)
        return ((f"{path}[{key!r}]", x[key]) for key in keys)
    if kind is list or kind is tuple:
        indices = range(len(x) - 1, -1, -1) if backwards else range(len(x))
        return ((f"{path}[{i}]", x[i]) for i in indices)
    keyed, _ = keyed_children(x)
    items = [(path + key_text(key), child) for key, child in keyed]
    return reversed(items) if backwards else iter(items)


def nodes(tree: Any, root: str = "") -> Iterator[tuple[str, Any, Any]]:
    """Every node of `tree` in pre-order, as `(path, node, node data)`; leaves are skipped.
    Iterative: no recursion limit."""
    stack: list[tuple[str, Any]] = [(root, tree)]
    while stack:
        path, node = stack.pop()
        try:
            keyed, aux = keyed_children(node)
        except ValueError:  # a leaf
            continue
        yield path, node, aux
        stack.extend((path + key_text(key), child) for key, child in reversed(list(keyed)))


_NO_LEAF: Final = object()


def _leaf_paths(tree: Any, leaves: Sequence[Any], backwards: bool) -> Iterator[str]:
    """The path of each leaf of `tree` (whose leaves are `leaves`, in order), from the first
    leaf on or from the last one back, found as the caller reads them: the rest of the tree is
    never visited."""
    order = reversed(leaves) if backwards else iter(leaves)
    expected = next(order, _NO_LEAF)  # the leaf the walk meets next
    frames = [iter([("", tree)])]  # for each node being walked, its children still to visit
    while frames:
        for path, x in frames[-1]:
            if x is expected:
                yield path
                expected = next(order, _NO_LEAF)
                continue
            try:
                below = children(path, x, backwards)
            except ValueError:  # not a node after all: a leaf that the tree's nodes rebuilt as another object
                yield path
                continue
            frames.append(below)
            break  # visit its children first, then go on with its siblings
        else:
            frames.pop()


EDGE: Final = 50  # how many paths at each end a table that is cut can show


def edge_paths(tree: Any, leaves: Sequence[Any], n: int = EDGE) -> tuple[list[str], list[str]]:
    """The paths of the first `n` leaves of `tree` and of the last `n` (last first), found
    from each end of the tree without visiting the rest: what a cut table shows. `leaves`
    are `tree`'s own leaves, in order (the tree a Structure was read from, or one rebuilt)."""
    first = list(itertools.islice(_leaf_paths(tree, leaves, backwards=False), n))
    last = list(itertools.islice(_leaf_paths(tree, leaves, backwards=True), n))
    return first, last


def chain_path(chain: Sequence[Any]) -> str:
    """The path along a chain of dicts, lists and tuples, each a child of the one before."""
    parts: list[str] = []
    for parent, child in zip(chain, chain[1:], strict=False):
        items = parent.items() if isinstance(parent, dict) else enumerate(parent)
        key = next(k for k, v in items if v is child)
        parts.append(f"[{key!r}]" if isinstance(parent, dict) else f"[{key}]")
    return "".join(parts)


# -- plain data --------------------------------------------------------------------------
class Strong:
    """A key part compared by identity that holds its object (classes, enum members and
    module-level functions: they live as long as their module)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return type(other) is Strong and other.obj is self.obj


_BY_VALUE: Final = frozenset({int, bool, str, bytes, type(None)})
_MAX_DEPTH: Final = 32
# JAX's own immutable value types, safe to hold and to compare with their own `==`.
_JAX_VALUES: Final = (
    jax.sharding.Mesh,
    jax.sharding.AbstractMesh,
    jax.sharding.Sharding,
    jax.sharding.PartitionSpec,
    np.dtype,
)
# Node types whose node data is plain whatever it holds (the keys of a dict are its own).
_PLAIN_NODES: Final = frozenset({tuple, list, dict, collections.OrderedDict})

StateKey = Callable[[Any, int], "Hashable | None"]  # keys a mutable object by its contents (the cache's)


def importable(fn: Any) -> bool:
    """True for an object reachable as `module.qualname`: it lives as long as its module."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    qualname = getattr(fn, "__qualname__", None)
    if module is None or not isinstance(qualname, str) or "<" in qualname:
        return False
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def calls_python(x: Any) -> bool:
    """Whether `x` is an instance of a class with a `__call__` method written in Python
    (whose answers may depend on the instance's attributes), as opposed to a function."""
    return callable(x) and not isinstance(x, type) and isinstance(type(x).__call__, types.FunctionType)


def plain_key(x: Any, depth: int = 0, state: StateKey | None = None) -> Hashable | None:
    """A key for `x` by type and value if `x` is plain data, else None.

    Plain data is immutable and compared by value: numbers, strings, bytes,
    `None`, enums, classes, modules, module-level functions, JAX's meshes,
    shardings, specs and dtypes, and tuples, frozensets, namedtuples and frozen
    dataclasses of these. Keys differ wherever the values could behave
    differently: `1`, `True` and `1.0` are three keys, and so are `0.0` and
    `-0.0`. No user `__hash__` or `__eq__` is called.

    `state`, when given, keys any other object (by its contents, say) or
    returns None; it is called with the object and the depth it was met at.
    """
    cls = type(x)
    if cls in _BY_VALUE:
        return (cls, x)
    if cls is float:
        return (float, x.hex())
    if cls is complex:
        return (complex, x.real.hex(), x.imag.hex())
    if depth >= _MAX_DEPTH:
        return None
    if cls is tuple or cls is frozenset or (issubclass(cls, tuple) and is_namedtuple(cls)):
        parts = []
        for item in x:
            key = plain_key(item, depth + 1, state)
            if key is None:
                return None
            parts.append(key)
        return (Strong(cls), frozenset(parts) if cls is frozenset else tuple(parts))
    if isinstance(x, (type, enum.Enum, types.ModuleType)):
        return Strong(x)
    if isinstance(x, _JAX_VALUES):  # immutable, compared by value by JAX itself
        return (Strong(cls), x)
    params = getattr(cls, "__dataclass_params__", None)
    if params is not None and params.frozen and params.eq:
        try:
            values = tuple(getattr(x, f.name) for f in dataclasses.fields(x))
        except AttributeError:  # a field left unset
            return None
        key = plain_key(values, depth + 1, state)
        return None if key is None else (Strong(cls), key)
    if callable(x) and not calls_python(x):
        return Strong(x) if importable(x) else None
    if state is not None:
        return state(x, depth)
    return None


def is_plain(x: Any) -> bool:
    """Whether `x` is plain data (see `plain_key`)."""
    return plain_key(x) is not None


def treedef_is_plain(treedef: jtu.PyTreeDef) -> bool:
    """Whether every node's static data is plain (so the treedef may be held and compared)."""
    stack = [treedef]
    while stack:
        td = stack.pop()
        data = td.node_data()
        if data is None:  # a leaf
            continue
        if data[0] not in _PLAIN_NODES and plain_key(data[1]) is None:
            return False
        stack.extend(td.children())
    return True


# -- text --------------------------------------------------------------------------------
def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, ending in `...` where it was longer: how long a value
    prints in a message, a table cell or a `repr`."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Items(NamedTuple):
    """A call or container in text split at its top-level items: `head` (up to its opening
    bracket, `optax.scale(`), `items` (`step_size=-0.1`, ...) and `tail` (its closing bracket)."""

    head: str
    items: list[str]
    tail: str


_CLOSING: Final = {"(": ")", "[": "]", "{": "}"}


def items_of(text: str) -> Items | None:
    """`text` as a call or container (`Head(a, b=[1, 2], 'c, d')`) split into its top-level
    items at `, ` (brackets and quoted strings kept whole); None where it is no such text
    (the bracket that closes its first one is not its last character)."""
    first = next((i for i, c in enumerate(text) if c in _CLOSING), -1)
    if first < 0 or not text.endswith(_CLOSING[text[first]]):
        return None
    found, depth, quote, start, i = [], 0, "", first + 1, first
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _CLOSING:
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return None
        elif depth == 1 and text.startswith(", ", i):
            found.append(text[start:i])
            start = i + 2
        i += 1
    if depth != 0 or quote:
        return None
    last = text[start:-1]
    return Items(text[: first + 1], [*found, last] if found or last else [], text[-1])


def clip_items(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters where it is longer, never inside an item of a
    call or container: its first items, then `...` (`optax.chain(optax.scale(step_size=-0.1),
    ...)`), an item too long itself cut so within it; any other text as `clip` cuts it."""
    if len(text) <= limit:
        return text
    split = items_of(text)
    if split is None or not split.items:
        return clip(text, limit)
    head, items, tail = split
    room = limit - len(head) - len(tail) - len(", ...")
    kept: list[str] = []
    for item in items:
        if sum(len(k) + 2 for k in kept) + len(item) > room:
            break
        kept.append(item)
    if not kept:
        kept = [clip_items(items[0], max(room, 12))]
    return head + ", ".join(kept) + (", ..." if len(kept) < len(items) else "") + tail


def node_types(treedef: Any) -> Iterator[type]:
    """The type of each node of a `PyTreeDef` (containers and `None` among them, leaves
    not), first seen first."""
    stack = [treedef]
    while stack:
        node = stack.pop()
        data = node.node_data()
        if data is None:
            continue
        yield data[0]
        stack.extend(reversed(node.children()))


# StaticRepr reports module `treeshape`, so doctest would not look for its example here.
__test__ = {"StaticRepr": StaticRepr}
