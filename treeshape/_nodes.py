"""Framework nodes: what the node data of flax.nnx, equinox and flax.struct nodes holds, by name.

A pytree node carries node data (JAX's auxiliary data), which is part of the
tree's structure: two trees whose nodes hold other node data differ, whatever
their leaves. Frameworks keep a model's configuration there, each in its own
layout:

- flax.nnx `Pytree`s (every `nnx.Module`, `nnx.List`, `nnx.Rngs`): the keys of
  the child attributes, then the static attributes' names and values (flax
  0.12.1 on: `(node keys, static names, static values)`; flax 0.12.0:
  `(node keys, ((name, value), ...))`). Names beginning with `_` are nnx's
  own: `_pytree__nodes` mirrors which attributes are children, `_length` an
  `nnx.List`'s length, and the child `_pytree__state` is nnx's bookkeeping.
- flax.nnx `Variable`s (`nnx.Param`, ...): their metadata as sorted
  `(name, value)` pairs; one child, `value`.
- flax.nnx `State` and flax's `FrozenDict`: their sorted keys (dict-like).
- equinox `Module`s: a wrapper slot (equinox's own sentinel, or the
  attributes of a wrapped function), then the values of the static fields
  (`field(static=True)`) in `dataclasses.fields` order; the children are the
  other fields, in that order.
- equinox's `nn.State` (of `eqx.nn.make_with_state`): the keys of the states
  it holds (strings naming each stateful layer's index), one child each.
- Other dataclasses registered as pytree nodes (`flax.struct.dataclass`,
  `jax.tree_util.register_dataclass`): the values of their static fields, in
  the order of their registration, found once per class by flattening a
  probe instance.

`split` tells a node's data by name (for `diff`); `record` and `rebuild`
write it as JSON parts and read it back (for `_json`). Any other node data
that is a dict, a NamedTuple or a dataclass instance is split by its own
names. A framework release that lays its node data out another way makes
`split` return None (the node is then summarised whole) and fails
`tests/test_frameworks.py`, which pins every layout on the installed
releases. flax and equinox are never imported here: a node type is
recognised by the frameworks' public base classes, looked up in
`sys.modules` (a framework whose objects exist has been imported). A node
type is named as users know it by `node_type_name` (orbax's private
`_TreeMetadataImpl` is a `TreeMetadata`).
"""

import dataclasses
import functools as ft
import hashlib
import re
import sys
import types
import weakref
from collections.abc import Iterator, Mapping
from typing import Any, Final

import jax.tree_util as jtu

from . import _compat


Key = Any  # a `jax.tree_util` key: GetAttrKey, DictKey or SequenceKey


@dataclasses.dataclass(frozen=True)
class Split:
    """A node's data, told by name.

    Attributes:
        fields: The public named fields: each field's key (as a path writes
            it: `.out_features`, `['lr']`) and value.
        hidden: Framework-internal data (private names, sentinels, a
            wrapper's attributes), by internal name: compared, never named.
        children: Each child's key, when the node data names the children
            (nnx attributes, equinox fields), else None (children by position).
        ordered: Whether `children` is in the node's own order (else JAX's
            sorted order, as for a dict's keys).
    """

    fields: dict[Key, Any]
    hidden: dict[Any, Any]
    children: tuple[Key, ...] | None
    ordered: bool = True


def key_name(key: Key) -> Any:
    """The name or index inside a key (`GetAttrKey('w')` -> `'w'`, `SequenceKey(3)` -> `3`)."""
    for field in ("name", "key", "idx"):
        if hasattr(key, field):
            return getattr(key, field)
    return key


# The key of a wrapper's one child, the function it wraps: a `ts.watch` of a callable
# pytree flattens so, and a path through it is named as the wrapped function's own.
WRAPPED_KEY: Final = jtu.GetAttrKey("__wrapped__")


def is_private(key: Key) -> bool:
    """A framework's own name (`_pytree__state`, `_length`): never shown in a message."""
    name = key_name(key)
    return isinstance(name, str) and name.startswith("_")


def attr_key(name: Any) -> Key:
    """The key nnx gives an attribute in paths: `.name`, or `[i]` for an `nnx.List` item."""
    return jtu.GetAttrKey(name) if isinstance(name, str) else jtu.SequenceKey(name)


_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+")


def without_address(text: str) -> str:
    """A repr without memory addresses (`<function f.<locals>.g>`): the same in every process."""
    return _ADDRESS.sub("", text)


def public_name(x: Any) -> tuple[str, str] | None:
    """`(module, qualname)` of a function, class, `jax.custom_jvp`/`custom_vjp` function or
    builtin, as users import it: from the shortest public parent of its module that holds it
    (`("jax.nn", "gelu")` for a function defined in `jax._src.nn.functions`; a function local to
    `optax.chain` is `("optax", "chain.<locals>.init_fn")`), else from another public module of
    its package (`("jax.nn", "logsumexp")`, defined in `jax._src.ops.special`), else its own
    module; None for anything without a module and a name.

    Only modules already imported are read (a module's namespace, never `getattr`), and
    candidates are tried in a fixed order (shorter names first), so the name is the same in
    every process that imported the same modules."""
    module = getattr(x, "__module__", None)
    qualname = getattr(x, "__qualname__", None)
    if qualname is None:  # objects that have a `__name__` only (`jnp.add`, a `jnp.ufunc`)
        qualname = getattr(x, "__name__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or not (callable(x) or isinstance(x, type)):
        return None
    home = _namespace(module)
    if "." in qualname and "<locals>" not in qualname and _attribute_path(home, qualname) is not x:
        qualname = qualname.rsplit(".", 1)[1]  # a qualified name its module does not lead to (`jax.Array`)
    if "." in qualname:  # a method, or a function local to another: found by the module-level object
        head = qualname.split(".", 1)[0]
        owner = home.get(head, _ABSENT)
        if owner is _ABSENT:
            return module, qualname
    else:  # found by itself: its module may hold a wrapper under its name, or a lambda under another
        if home.get(qualname, _ABSENT) is not x:
            qualname = next((name for name, value in list(home.items()) if value is x), qualname)
        head, owner = qualname, x
    for candidate in _candidates(module):
        if _namespace(candidate).get(head, _ABSENT) is owner:
            return candidate, qualname
    return module, qualname


_ABSENT: Final = object()


def _attribute_path(namespace: dict[str, Any], qualname: str) -> Any:
    """What `qualname` names from a module's namespace (class and instance `__dict__`s only, never
    `getattr`), or `_ABSENT`."""
    obj = namespace.get(qualname.split(".", 1)[0], _ABSENT)
    for part in qualname.split(".")[1:]:
        attributes: Any = getattr(obj, "__dict__", None)  # a dict, or a class's mappingproxy
        obj = attributes.get(part, _ABSENT) if isinstance(attributes, Mapping) else _ABSENT
    return obj


def _namespace(module: str) -> dict[str, Any]:
    namespace = getattr(sys.modules.get(module), "__dict__", None)
    return namespace if isinstance(namespace, dict) else {}


def _is_public(part: str) -> bool:
    return not part.startswith("_") or (part.startswith("__") and part.endswith("__"))


def _candidates(module: str) -> Iterator[str]:
    """The modules that may export what `module` defines, in the order they are tried: the
    prefixes of its dotted name without its private parts, shortest first (`jax._src.nn.functions`:
    `jax`, `jax.nn`, `jax.nn.functions`), the other public modules of its package that are
    imported (shallower first, then by name), then `module` itself."""
    parts = [part for part in module.split(".") if _is_public(part)]
    prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
    yield from prefixes  # most objects are found here: the package's modules are listed only if not
    yield from (name for name in _package_modules(module.split(".", 1)[0]) if name not in prefixes)
    yield module


_PACKAGE_MODULES: dict[str, tuple[int, list[str]]] = {}


def _package_modules(package: str) -> list[str]:
    """The imported public modules of `package` (no private part in their names), shallower
    first, then by name; listed again only when modules were imported since."""
    count = len(sys.modules)
    known = _PACKAGE_MODULES.get(package)
    if known is None or known[0] != count:
        names = [name for name in list(sys.modules) if name.startswith(package + ".")]
        public = [name for name in names if all(map(_is_public, name.split(".")))]
        known = _PACKAGE_MODULES[package] = (count, sorted(public, key=lambda name: (name.count("."), name)))
    return known[1]


def _dotted(name: tuple[str, str]) -> str:
    module, qualname = name
    return qualname if module == "builtins" else f"{module}.{qualname}"


def static_text(x: Any) -> str:
    """A static value as messages, tables and JSON print it, never raising: a function, class,
    `custom_jvp`/`custom_vjp` function or builtin by its public import path (`jax.nn.gelu`); a
    `functools.partial`, a bound method, a tuple, list, dict or NamedTuple by those of what it
    holds; anything else by its `repr` without memory addresses, or `<TypeName object (its repr
    raised)>`.

    Examples:
        >>> import functools, jax
        >>> from treeshape._nodes import static_text
        >>> static_text(jax.nn.relu), static_text(functools.partial(jax.nn.gelu, approximate=False))
        ('jax.nn.relu', 'functools.partial(jax.nn.gelu, approximate=False)')
    """
    kind = type(x)
    if kind in (str, int, float, bool, type(None)):
        return repr(x)
    try:
        if isinstance(x, ft.partial):
            parts = [static_text(x.func), *map(static_text, x.args)]
            parts += [f"{key}={static_text(value)}" for key, value in x.keywords.items()]
            return f"{_dotted((kind.__module__, kind.__qualname__))}({', '.join(parts)})"
        if isinstance(x, types.MethodType):
            return f"<bound method {static_text(x.__func__)} of {static_text(x.__self__)}>"
        name = public_name(x)
        if name is not None:
            return _dotted(name)
        told = _optax_text(x) if _compat.is_namedtuple(kind) else ""
        if told:
            return f"{kind.__name__}({told})"
        if _compat.is_namedtuple(kind):
            fields = ", ".join(f"{field}={static_text(value)}" for field, value in zip(x._fields, x, strict=True))
            return f"{kind.__name__}({fields})"
        if kind is tuple:
            return "(" + ", ".join(map(static_text, x)) + ("," if len(x) == 1 else "") + ")"
        if kind is list:
            return "[" + ", ".join(map(static_text, x)) + "]"
        if kind is dict:
            return "{" + ", ".join(f"{static_text(k)}: {static_text(v)}" for k, v in x.items()) + "}"
        return _repr(x)
    except RecursionError:  # a container that holds itself: as Python's repr tells it
        return _repr(x)


# -- optax transformations ---------------------------------------------------------------
_DEEP: Final = 16  # closures followed at most this deep
_HELD: Final = 80  # a held value's text is cut, with a digest of the whole (two values never print alike)


def _optax_text(tx: Any) -> str:
    """What an optax transformation does, as the transformations its `update` closes over, each
    by its maker and the values it holds (`optax.scale_by_adam(b1=0.9, ...), optax.scale(
    step_size=-0.001)`): optax makes every optimizer a `chain` of closures, whose names alone
    are the same for `adam` and `sgd`. "" where `update` is no closure of optax's."""
    update = getattr(tx, "update", None)
    return ", ".join(_made(update, 0, set())) if _is_optax_closure(update) else ""


def _is_optax_closure(fn: Any) -> bool:
    module = str(getattr(fn, "__module__", ""))
    return isinstance(fn, types.FunctionType) and (module == "optax" or module.startswith("optax."))


def _made(fn: Any, depth: int, seen: set[int]) -> list[str]:
    """The transformations an optax closure stands for: a closure that holds only other
    transformations (`chain`, a wrapper) stands for theirs; any other, for its maker and what
    it holds."""
    if id(fn) in seen or depth > _DEEP:
        return ["..."]
    seen.add(id(fn))
    held = [(name, _contents(cell)) for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)]
    inner = [_inner(v) for _, v in held]
    if held and all(parts is not None for parts in inner):
        return [text for parts in inner for part in parts or () for text in _made(part, depth + 1, seen)]
    name = public_name(fn)
    maker = (fn.__qualname__ if name is None else _dotted(name)).split(".<locals>", 1)[0]
    return [f"{maker}({', '.join(f'{k}={_held_text(v, depth, seen)}' for k, v in held)})"]


def _inner(x: Any) -> list[Any] | None:
    """The `update` closures a held value is made of (a transformation's, or a tuple of closures), or None."""
    if _compat.is_namedtuple(type(x)) and _is_optax_closure(getattr(x, "update", None)):
        return [x.update]
    return list(x) if type(x) in (tuple, list) and all(map(_is_optax_closure, x)) else None


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def _held_text(value: Any, depth: int, seen: set[int]) -> str:
    if _is_optax_closure(value) and value.__closure__:  # (a schedule): whole, never cut inside its calls
        return ", ".join(_made(value, depth + 1, seen))
    if type(value) in (tuple, list) and value and all(_is_optax_closure(v) and v.__closure__ for v in value):
        told = ", ".join(", ".join(_made(v, depth + 1, seen)) for v in value)  # (`join_schedules`' schedules)
        return f"[{told}]" if type(value) is list else f"({told}{',' if len(value) == 1 else ''})"
    text = static_text(value)
    return text if len(text) <= _HELD else f"{text[: _HELD - 16]}...#{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def by_text(x: Any) -> bool:
    """Whether a static value is told by its text where it meets one loaded from JSON: a value
    whose `==` is its identity (a function, closure, class, `functools.partial`, `custom_jvp`,
    jitted function), a builtin or bound method, or a NamedTuple of these (an optax
    `GradientTransformation`), or the node data of a static pytree node (`nnx.split`'s
    `GraphDef`). Two such values that are `==` print alike, so their text may stand for them
    (and hash them); no other value is, as its own `==` may ignore some of its text.
    """
    kind = type(x)
    if kind in _SCALARS:
        return False
    if isinstance(x, (types.BuiltinFunctionType, types.MethodType)):
        return True
    eq: Any = kind.__eq__
    if eq is object.__eq__ and callable(x):
        return True
    if _compat.is_namedtuple(kind):
        return len(x) > 0 and all(map(by_text, x))
    return _is_static_node(x)


def _is_static_node(x: Any) -> bool:
    """Whether `x` is a pytree node with no children that is its own node data (`nnx.split`'s
    `GraphDef`, any `jax.tree_util.register_static` class): never a leaf, so never hashed as one."""
    try:
        treedef: jtu.PyTreeDef = jtu.tree_structure(x)
        data = treedef.node_data()
        return treedef.num_leaves == 0 and treedef.num_nodes == 1 and data is not None and data[1] is x
    except Exception:  # a node whose flattening raises
        return False


_SCALARS: Final = (str, int, float, bool, type(None))


def _repr(x: Any) -> str:
    try:
        return without_address(repr(x))
    except Exception:  # a user object whose repr raises: still told by its type
        return f"<{type(x).__qualname__} object (its repr raised)>"


def is_sentinel(x: Any) -> bool:
    """equinox's private marker for a field that holds nothing (`MISSING`)."""
    return is_sentinel_type(type(x))


def is_sentinel_type(cls: type) -> bool:
    return cls.__name__ == "_Missing" and cls.__module__.startswith("equinox.")


# -- recognising a framework's node types ------------------------------------------------
def _base(module: str, name: str) -> type | None:
    cls = getattr(sys.modules.get(module), name, None)
    return cls if isinstance(cls, type) else None


def frozen_dict_type() -> type | None:
    """flax's `FrozenDict`, if flax is imported."""
    return _base("flax.core", "FrozenDict")


def is_nnx_state(cls: type) -> bool:
    return _subclass(cls, "flax.nnx", "State")


def is_frozen_dict(cls: type) -> bool:
    return _subclass(cls, "flax.core", "FrozenDict")


def _subclass(cls: type, module: str, name: str) -> bool:
    base = _base(module, name)
    try:
        return base is not None and issubclass(cls, base)
    except TypeError:
        return False


NNX: Final = "nnx"
NNX_VARIABLE: Final = "nnx_variable"
NNX_INTERNAL: Final = "nnx_internal"
KEYED: Final = "keyed"
EQUINOX: Final = "equinox"
EQUINOX_STATE: Final = "equinox_state"
DATACLASS: Final = "dataclass"
# Each kind of node data that `record` writes and `rebuild` reads back, with the JSON parts of
# its treedef entry in the order `_json_load` reads them (`wrapper` may be left out). A new
# kind is taught here, in `kind`, `record` and `rebuild`; the JSON writer and reader ask this.
PARTS: Final[dict[str, tuple[str, ...]]] = {
    DATACLASS: ("fields",),
    NNX: ("keys", "static"),
    NNX_VARIABLE: ("fields",),
    KEYED: ("keys",),
    NNX_INTERNAL: ("aux",),
    EQUINOX: ("fields", "wrapper"),
    EQUINOX_STATE: ("keys",),
}
_KINDS: "weakref.WeakKeyDictionary[type, str | None]" = weakref.WeakKeyDictionary()


def kind(cls: type) -> str | None:
    """Which layout `cls`'s node data has (one of the constants above), or None."""
    try:
        return _KINDS[cls]
    except (KeyError, TypeError):
        pass
    found: str | None = None
    if _subclass(cls, "flax.nnx", "Pytree"):
        found = NNX
    elif _subclass(cls, "flax.nnx", "Variable"):
        found = NNX_VARIABLE
    elif _subclass(cls, "flax.nnx", "State") or _subclass(cls, "flax.core", "FrozenDict"):
        found = KEYED
    elif cls.__name__ == "PytreeState" and cls.__module__.startswith("flax.nnx."):
        found = NNX_INTERNAL
    elif _subclass(cls, "equinox", "Module"):
        found = EQUINOX
    elif _subclass(cls, "equinox.nn", "State"):
        found = EQUINOX_STATE
    elif dataclasses.is_dataclass(cls) and _probe(cls) is not None:
        found = DATACLASS
    try:
        _KINDS[cls] = found
    except TypeError:  # not weakly referenceable
        pass
    return found


def mapping_keys(cls: type, aux: Any) -> tuple[Any, ...] | None:
    """The keys of a dict-like framework node (`nnx.State`, `FrozenDict`), else None."""
    return aux if type(aux) is tuple and kind(cls) == KEYED else None


# -- flax.nnx ------------------------------------------------------------------------
_MIRROR: Final = "_pytree__nodes"  # nnx's record of which attributes are children


def _nnx_parts(aux: Any) -> tuple[tuple[Any, ...], list[tuple[Any, Any]]] | None:
    """`(node keys, [(static name, value), ...])` from either nnx layout, or None."""
    if type(aux) is not tuple or not all(type(part) is tuple for part in aux):
        return None
    if len(aux) == 3 and len(aux[1]) == len(aux[2]):  # flax 0.12.1 on
        return aux[0], list(zip(aux[1], aux[2], strict=True))
    if len(aux) == 2 and all(type(pair) is tuple and len(pair) == 2 for pair in aux[1]):  # flax 0.12.0
        return aux[0], list(aux[1])
    return None


def _nnx_mirror(cls: type, size: int, node_keys: Any, static_names: Any) -> Any:
    """nnx's record of which attributes are children (`_pytree__nodes`) as the keys give it: each
    child attribute True, each static one False (flax 0.12.1 on names an `nnx.List` item `'0'`,
    flax 0.12.0 `0`), in the mapping type nnx keeps it in."""
    name = str if size == 3 else (lambda key: key)
    mirror = {name(key): True for key in node_keys} | {name(key): False for key in static_names}
    mirror_type: Any = type(getattr(cls, _MIRROR, None))
    return mirror_type(mirror) if issubclass(mirror_type, Mapping) else mirror


def _mirror_part(value: Any, derived: Any) -> Any:
    """The mirror as JSON writes it: null when the keys give it, else as a dict."""
    if isinstance(value, Mapping) and dict(value) == dict(derived):
        return None
    return dict(value) if isinstance(value, Mapping) else value


def _nnx_layout_size(cls: type) -> int:
    """How many parts the running flax's nnx node data has (3, or 2 before flax 0.12.1): the
    node data of an instance with no attributes, made without calling `__init__`."""
    _, aux = _compat.flatten_one_level_with_keys(object.__new__(cls))
    if type(aux) is not tuple or len(aux) not in (2, 3):
        raise ValueError(f"{cls.__qualname__} has node data of an unknown layout")
    return len(aux)


# -- equinox -------------------------------------------------------------------------
def _eqx_fields(cls: type) -> tuple[list[str], list[str]]:
    """An equinox Module's (static field names, child field names), in `dataclasses.fields` order."""
    static: list[str] = []
    dynamic: list[str] = []
    for field in dataclasses.fields(cls):
        (static if field.metadata.get("static", False) else dynamic).append(field.name)
    return static, dynamic


def _eqx_sentinel(cls: type) -> Any:
    """equinox's sentinel for an empty wrapper slot: the first part of the node data of an
    instance with no attributes (the sentinel itself, or a tuple of sentinels)."""
    _, aux = _compat.flatten_one_level_with_keys(object.__new__(cls))
    first = aux[0] if type(aux) is tuple and aux else None
    sentinel = first[0] if type(first) is tuple and first else first
    if not is_sentinel(sentinel):
        raise ValueError(f"{cls.__qualname__} has node data of an unknown layout")
    return sentinel


# -- registered dataclasses ------------------------------------------------------------
class _Marker:
    """A probe's field value: tells which field each part of the node data is."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_PROBES: "weakref.WeakKeyDictionary[type, tuple[tuple[str, ...], tuple[Key, ...]] | None]" = weakref.WeakKeyDictionary()


def _probe(cls: type) -> tuple[tuple[str, ...], tuple[Key, ...]] | None:
    """A registered dataclass's (static field names in node data order, child keys): from the
    node JAX makes of an instance whose every field is a marker (built without `__init__`).
    None when the node data is anything but those fields' values."""
    try:
        return _PROBES[cls]
    except (KeyError, TypeError):
        pass
    found: tuple[tuple[str, ...], tuple[Key, ...]] | None = None
    try:
        probe: Any = object.__new__(cls)
        for field in dataclasses.fields(cls):
            object.__setattr__(probe, field.name, _Marker(field.name))
        keyed, aux = _compat.flatten_one_level_with_keys(probe)
        if type(aux) is tuple and all(type(part) is _Marker for part in aux):
            found = tuple(part.name for part in aux), tuple(key for key, _ in keyed)
    except Exception:  # not a pytree node, or a flatten that needs real values: opaque
        found = None
    try:
        _PROBES[cls] = found
    except TypeError:
        pass
    return found


# -- split: node data by name, for diffs -----------------------------------------------
def split(cls: type, aux: Any) -> Split | None:
    """`aux`, the node data of a node of type `cls`, told by name; None when it has no names
    (an opaque object, a tuple without names)."""
    layout = kind(cls)
    try:
        if layout == NNX:
            return _split_nnx(aux)
        if layout == NNX_VARIABLE:
            return _split_pairs(aux, (jtu.GetAttrKey("value"),))
        if layout == KEYED:
            keys = mapping_keys(cls, aux)
            return None if keys is None else Split({}, {}, tuple(jtu.DictKey(k) for k in keys), ordered=False)
        if layout == EQUINOX:
            return _split_equinox(cls, aux)
        if layout == DATACLASS:
            return _split_dataclass(cls, aux)
        if layout == EQUINOX_STATE and type(aux) is tuple:  # the keys name equinox's own indices: internal
            return Split({}, {"keys": aux}, tuple(jtu.FlattenedIndexKey(i) for i in range(len(aux))))
    except Exception:  # a layout this module does not know: told whole
        return None
    return _split_named(aux)


def _fields_and_hidden(named: list[tuple[Any, Any]], key: Any) -> tuple[dict[Key, Any], dict[Any, Any]]:
    fields: dict[Key, Any] = {}
    hidden: dict[Any, Any] = {}
    for name, value in named:
        if is_private(name):
            if name != _MIRROR:  # the mirror of the child keys is told as the children themselves
                hidden[name] = value
        else:
            fields[key(name)] = value
    return fields, hidden


def _split_nnx(aux: Any) -> Split | None:
    parts = _nnx_parts(aux)
    if parts is None:
        return None
    node_keys, static = parts
    fields, hidden = _fields_and_hidden(static, attr_key)
    return Split(fields, hidden, tuple(attr_key(k) for k in node_keys), ordered=False)


def _split_pairs(aux: Any, children: tuple[Key, ...]) -> Split | None:
    if type(aux) is not tuple or not all(type(p) is tuple and len(p) == 2 and type(p[0]) is str for p in aux):
        return None
    fields, hidden = _fields_and_hidden(list(aux), jtu.GetAttrKey)
    return Split(fields, hidden, children)


def _split_equinox(cls: type, aux: Any) -> Split | None:
    static, dynamic = _eqx_fields(cls)
    if type(aux) is not tuple or len(aux) != 1 + len(static):
        return None
    fields, hidden = _fields_and_hidden(list(zip(static, aux[1:], strict=True)), jtu.GetAttrKey)
    wrapper = aux[0]  # a wrapped function's attributes; equinox's sentinel (or only sentinels) if it wraps none
    if type(wrapper) is tuple and wrapper and all(is_sentinel(part) for part in wrapper):
        wrapper = wrapper[0]
    hidden["wrapper"] = wrapper
    return Split(fields, hidden, tuple(jtu.GetAttrKey(name) for name in dynamic))


def _split_dataclass(cls: type, aux: Any) -> Split | None:
    probe = _probe(cls)
    if probe is None or type(aux) is not tuple or len(aux) != len(probe[0]):
        return None
    fields, hidden = _fields_and_hidden(list(zip(probe[0], aux, strict=True)), jtu.GetAttrKey)
    return Split(fields, hidden, probe[1])


def _split_named(aux: Any) -> Split | None:
    """Node data that names its own parts: a dict, a NamedTuple or a dataclass instance."""
    if type(aux) is dict:
        return Split({jtu.DictKey(k): v for k, v in aux.items()}, {}, None)
    if _compat.is_namedtuple(type(aux)):
        return Split({jtu.GetAttrKey(name): v for name, v in zip(aux._fields, aux, strict=True)}, {}, None)
    if dataclasses.is_dataclass(aux) and not isinstance(aux, type):
        named = [(f.name, getattr(aux, f.name, None)) for f in dataclasses.fields(aux)]
        fields, hidden = _fields_and_hidden(named, jtu.GetAttrKey)
        return Split(fields, hidden, None)
    return None


# -- record and rebuild: node data as JSON parts, and back ---------------------------------
def record(cls: type, aux: Any) -> tuple[str, dict[str, Any]] | None:
    """The JSON kind of a framework node and its parts by name (values as they are; the
    caller writes them), or None for node data this module cannot describe."""
    layout = kind(cls)
    if layout == NNX:
        parts = _nnx_parts(aux)
        if parts is None:
            return None
        node_keys, static = parts
        mirror = _nnx_mirror(cls, len(aux), node_keys, [name for name, _ in static])
        pairs = [[name, _mirror_part(value, mirror) if name == _MIRROR else value] for name, value in static]
        return NNX, {"keys": list(node_keys), "static": pairs}
    if layout == NNX_VARIABLE and _split_pairs(aux, ()) is not None:
        return NNX_VARIABLE, {"fields": dict(aux)}
    if layout == KEYED and type(aux) is tuple:
        return KEYED, {"keys": list(aux)}
    if layout == NNX_INTERNAL:
        return NNX_INTERNAL, {"aux": aux}
    if layout == EQUINOX:
        names, _ = _eqx_fields(cls)
        if type(aux) is not tuple or len(aux) != 1 + len(names):
            return None
        named: dict[str, Any] = {"fields": dict(zip(names, aux[1:], strict=True))}
        if not is_sentinel(aux[0]):
            named["wrapper"] = aux[0]
        return EQUINOX, named
    if layout == DATACLASS:
        probe = _probe(cls)
        if probe is None or type(aux) is not tuple or len(aux) != len(probe[0]):
            return None
        return DATACLASS, {"fields": dict(zip(probe[0], aux, strict=True))}
    if layout == EQUINOX_STATE and type(aux) is tuple:
        return EQUINOX_STATE, {"keys": list(aux)}
    return None


_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _name(x: Any, ints: bool = False) -> Any:
    """An attribute name from JSON: an identifier, not a dunder (`__class__`); or, where
    `ints`, an int >= 0 (an `nnx.List` item)."""
    if ints and type(x) is int and x >= 0:
        return x
    if type(x) is not str or not _IDENTIFIER.fullmatch(x) or (x.startswith("__") and x.endswith("__")):
        raise ValueError(f"{x!r} is not an attribute name")
    return x


def _unique(names: list[Any], what: str) -> list[Any]:
    if len({(type(n), n) for n in names}) != len(names):
        raise ValueError(f"the {what} must be unique")
    return names


def rebuild(layout: str, cls: type, parts: dict[str, Any], n: int) -> tuple[Any, list[Key]]:
    """The node data of a node of type `cls` from its JSON parts (decoded values), and its
    children's keys, checked against the class before JAX sees them.

    Raises:
        ValueError: the parts do not fit the class (the message says how).
    """
    if kind(cls) != layout:
        raise ValueError(f"{cls.__module__}:{cls.__qualname__} is not a node of kind {layout!r}")
    if layout == NNX:
        return _rebuild_nnx(cls, parts, n)
    if layout == NNX_VARIABLE:
        fields = parts["fields"]
        if not isinstance(fields, dict) or n != 1:
            raise ValueError("an nnx Variable has one child and its metadata by name")
        return tuple(sorted((_name(k), v) for k, v in fields.items())), [jtu.GetAttrKey("value")]
    if layout == KEYED:
        keys = _unique(list(parts["keys"]), "keys")
        if any(type(k) not in (str, int) for k in keys) or len(keys) != n:
            raise ValueError(f"expected {n} keys, each a string or an integer")
        try:
            in_order = sorted(keys) == keys
        except TypeError:
            in_order = False
        if not in_order:
            raise ValueError("the keys must be in sorted order")
        return tuple(keys), [jtu.DictKey(k) for k in keys]
    if layout == NNX_INTERNAL:
        aux = parts["aux"]
        if type(aux) is not tuple or not all(type(x) is bool for x in aux) or n != 0:
            raise ValueError("nnx's internal state is a tuple of booleans, with no children")
        return aux, []
    if layout == EQUINOX_STATE:
        keys = _unique(list(parts["keys"]), "state keys")
        if any(type(k) not in (str, int) for k in keys) or len(keys) != n:
            raise ValueError(f"expected {n} state keys, each a string or an integer")
        return tuple(keys), [jtu.FlattenedIndexKey(i) for i in range(n)]
    if layout == EQUINOX:
        static, dynamic = _eqx_fields(cls)
        fields = parts["fields"]
        if not isinstance(fields, dict) or sorted(fields) != sorted(static) or n != len(dynamic):
            raise ValueError(f"an {cls.__qualname__} has the static fields {static} and {len(dynamic)} children")
        wrapper = parts.get("wrapper")
        if wrapper is None:
            wrapper = _eqx_sentinel(cls)
        elif type(wrapper) is not tuple:
            raise ValueError("an equinox wrapper is a tuple")
        return (wrapper, *[fields[name] for name in static]), [jtu.GetAttrKey(name) for name in dynamic]
    probe = _probe(cls)  # DATACLASS
    fields = parts["fields"]
    if probe is None or not isinstance(fields, dict) or sorted(fields) != sorted(probe[0]) or n != len(probe[1]):
        expected = [] if probe is None else list(probe[0])
        raise ValueError(f"{cls.__qualname__} has the static fields {expected} and other children")
    return tuple(fields[name] for name in probe[0]), list(probe[1])


def _rebuild_nnx(cls: type, parts: dict[str, Any], n: int) -> tuple[Any, list[Key]]:
    keys = _unique([_name(k, ints=True) for k in parts["keys"]], "attribute names")
    static = parts["static"]
    if len(keys) != n or type(static) is not list or not all(type(p) is list and len(p) == 2 for p in static):
        raise ValueError(f"expected {n} child attribute names and a list of [name, value] pairs")
    names = _unique([_name(name, ints=True) for name, _ in static], "attribute names")
    if set(names) & set(keys):
        raise ValueError("an attribute is both a child and static")
    values = [value for _, value in static]
    size = _nnx_layout_size(cls)
    if _MIRROR in names:
        at = names.index(_MIRROR)
        if values[at] is None:  # written as null: what the keys say
            values[at] = _nnx_mirror(cls, size, keys, names)
        elif isinstance(values[at], dict):  # as written, in the mapping type nnx keeps it in
            mirror_type: Any = type(getattr(cls, _MIRROR, None))
            values[at] = mirror_type(values[at]) if issubclass(mirror_type, Mapping) else values[at]
        else:
            raise ValueError(f"{_MIRROR} is a mapping, or null")
    if size == 3:
        aux: Any = (tuple(keys), tuple(names), tuple(values))
    else:
        aux = (tuple(keys), tuple(zip(names, values, strict=True)))
    return aux, [attr_key(k) for k in keys]


# -- node types ---------------------------------------------------------------------
_TYPING_BASES: Final = frozenset({"Protocol", "Generic", "object"})


def node_type_name(cls: type) -> str:
    """A node type as users know it: its first public class (orbax's private
    `_TreeMetadataImpl` is a `TreeMetadata`)."""
    for klass in cls.__mro__:
        if not klass.__name__.startswith("_") and klass.__name__ not in _TYPING_BASES:
            return klass.__name__
    return cls.__name__


def orbax_sharding(meta: Any) -> tuple[tuple[int, ...], tuple[str, ...], tuple[Any, ...]] | None:
    """The mesh (axis sizes and names) and partition spec that orbax's `NamedShardingMetadata`
    records for a saved array (a checkpoint's `ArrayMetadata.sharding`), or None."""
    cls = type(meta)
    if not cls.__module__.startswith("orbax.") or node_type_name(cls) != "NamedShardingMetadata":
        return None
    try:
        sizes = tuple(int(n) for n in meta.shape)
        names = tuple(str(a) for a in meta.axis_names)
        spec = tuple(e if e is None or isinstance(e, str) else tuple(map(str, e)) for e in meta.partition_spec)
    except (AttributeError, TypeError, ValueError):
        return None
    return (sizes, names, spec) if len(sizes) == len(names) else None


def wrapper_hint(cls: type) -> str | None:
    """What to pass instead of a node that wraps the tree a user means (a checkpoint's
    metadata object around its tree of array metadata), or None."""
    if cls.__module__.startswith("orbax.") and node_type_name(cls) == "TreeMetadata":
        return (
            "an orbax checkpoint's metadata (a TreeMetadata), which wraps the tree it describes: pass its "
            "`.tree` instead, e.g. `ts.structure_of(checkpointer.metadata(path).item_metadata.tree)`"
        )
    return None
