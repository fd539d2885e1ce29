"""Structures as JSON text: `Structure.to_json` / `Structure.from_json`, and `treeshape inspect --json`.

The document is one JSON object:

```json
{
  "version": 1,
  "treedef": [{"type": "dict", "keys": ["b", "w"]}, "*", "*"],
  "leaves": [
    {"path": "['b']", "shape": [3], "dtype": "float32", "weak_type": false},
    {"path": "['w']", "shape": [2, 3], "dtype": "bfloat16", "weak_type": false}
  ]
}
```

`treedef` lists the nodes in pre-order, flat (no nesting, so no depth limit):
`"*"` is a leaf, `null` is `None`, and a container is an object whose `type`
is `list`/`tuple` (with `n` children), `dict`/`OrderedDict`/`defaultdict`
(with its `keys`, and a defaultdict's `factory`), `namedtuple` (with `name`,
`"module:qualname"`, and `n`) or `dataclass` (a dataclass registered as a
pytree node: `jax.tree_util.register_dataclass`, chex or flax.struct; with
`name`, `n` and its node data `aux`, which must be plain data). flax.nnx
modules, variables and states, equinox modules and `eqx.nn.State`, and
registered dataclasses are written with their node data by name (`_nodes.record`):
values as `_json_values` writes them (plain data as JSON values, functions and
classes by `"module:qualname"`, anything else by its text). Other custom pytree
nodes are refused: their node data cannot be checked when loading.

`leaves` holds one record per leaf, in leaf order: an array leaf's `path`,
`shape`, `dtype` and `weak_type`, plus `sharding` (a `NamedSharding`'s spec
and abstract mesh) and `vma` (manual axes under `shard_map`) when it has them;
a static leaf has `shape`, `dtype` and `weak_type` `null`, its `repr` as
`static`, its type's `"module:qualname"` as `type`, and, for `str`, `int`,
`float`, `bool` and `None`, the `value` itself. `treeshape inspect --json`
prints exactly this list.

Loading is safe for untrusted text: every field is checked and anything
malformed raises `ValueError`; nothing is evaluated, and no module is
imported (named types are looked up in modules already in `sys.modules`).
This module owns the document (the `treedef` list and the leaf records); the
values inside it (node data, static leaves) are `_json_values`'. It does not
import `_structure` (which calls it): it works on a treedef and a tuple of leaves.
"""

import collections
import dataclasses
import itertools
import json
import marshal
import operator
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NoReturn

import jax
import jax.tree_util as jtu

from . import _compat, _nodes, _tree
from ._json_values import (
    MAX_DIM,
    NAME,
    Malformed,
    decode,
    dtype_name,
    encode,
    fail,
    get,
    lookup,
    lookup_type,
    read_bool,
    read_dtype,
    read_int,
    read_list,
    read_static,
    read_str,
    read_str_list,
    short_repr,
    static_record,
    type_name,
)
from ._leaf import leaf_str, manual_axis_sets
from ._shapes import extent_problem, is_symbolic, symbolic_scopes
from ._sharding import split_problem as _split_problem


VERSION: Final = 1
_WHO: Final = "treeshape.Structure.from_json"
_LEAF: Final = "*"
_LEAF_TREEDEF: Final = jtu.tree_structure(0)


# -- encoding ------------------------------------------------------------------
# `json.dumps(value, allow_nan=False)`, without making a new encoder on every call.
_encode: Final[Callable[[Any], str]] = json.JSONEncoder(allow_nan=False).encode
_encode_str: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


def _dict_keys(keys: Sequence[Any], where: str) -> list[Any]:
    for key in keys:
        if type(key) not in (str, int):
            raise TypeError(
                f"treeshape.Structure.to_json: the dict at {where} has a key {short_repr(key)} of type "
                f"{type(key).__name__}; JSON can describe str and int keys only."
            )
    return list(keys)


def _callable_name(factory: Any, where: str) -> str:
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and NAME.fullmatch(f"{module}:{qualname}"):
        return f"{module}:{qualname}"
    raise TypeError(
        f"treeshape.Structure.to_json: the defaultdict at {where} has the default factory "
        f"{short_repr(factory)}, which has no module-level name; JSON can describe a named factory only."
    )


def _encode_node(node_type: type, aux: Any, n: int, path: str) -> str:
    """The JSON text of one container node (`n` children, at `path`) of the `treedef` list."""
    where = "tree" + path
    if node_type is list or node_type is tuple:
        return f'{{"type": "{node_type.__name__}", "n": {n}}}'
    if node_type is dict:
        return '{"type": "dict", "keys": ' + _encode(_dict_keys(aux, where)) + "}"
    entry: dict[str, Any]
    if node_type is collections.OrderedDict:
        entry = {"type": "OrderedDict", "keys": _dict_keys(aux, where)}
    elif node_type is collections.defaultdict:
        factory, keys = aux
        name = None if factory is None else _callable_name(factory, where)
        entry = {"type": "defaultdict", "factory": name, "keys": _dict_keys(keys, where)}
    elif _tree.is_namedtuple(node_type):
        entry = {"type": "namedtuple", "name": type_name(node_type), "n": n}
    elif (described := _nodes.record(node_type, aux)) is not None:  # framework nodes and dataclasses, by name
        kind, parts = described
        written = _encode_parts(parts, where, node_type.__module__)
        entry = {"type": kind, "name": type_name(node_type), "n": n, **written}
    elif isinstance(node_type, type) and dataclasses.is_dataclass(node_type):
        entry = {"type": "dataclass", "name": type_name(node_type), "n": n, "aux": encode(aux, plain_at=where)}
    else:
        raise TypeError(
            f"treeshape.Structure.to_json: the pytree node at {where} is a {node_type.__qualname__}, which JSON "
            "cannot describe: only dicts (also OrderedDict and defaultdict), lists, tuples, None, namedtuples, "
            "dataclasses registered as pytree nodes (flax.struct too), flax.nnx modules, variables and states, "
            "and equinox modules and states are supported. Pickle the Structure instead (trusted data only)."
        )
    return _encode(entry)


def _encode_parts(parts: dict[str, Any], where: str, home: str) -> dict[str, Any]:
    """A framework node's parts (`_nodes.record`) as JSON: keys as they are, values by `encode`
    (`home`: the node class's module, whose globals may name its default values)."""
    out: dict[str, Any] = {}
    for part, value in parts.items():
        if part == "keys":
            out[part] = _dict_keys(value, where)
        elif part == "static":  # [[name, value], ...]: nnx names may be integers (an nnx.List's items)
            out[part] = [[name, encode(item, home)] for name, item in value]
        elif part == "fields":
            out[part] = {name: encode(item, home) for name, item in value.items()}
        else:
            out[part] = encode(value, home, plain_at=where if part == "aux" else None)
    return out


class _Frame:
    """A node being written by `_walk`: its children still to write, where its own text and paths
    start, and its last child written whole (to copy it from when the next child is equal)."""

    __slots__ = ("children", "node", "path", "first_node", "first_path", "last")

    def __init__(self, children: Iterator[tuple[jtu.PyTreeDef, str]], node: Any, path: str, nodes: int, paths: int):
        self.children, self.node, self.path = children, node, path
        self.first_node, self.first_path = nodes, paths
        self.last: _Written | None = None


class _Written:
    """A subtree `_walk` has written whole: its treedef, where its node texts are, and the paths
    of its leaves below it (read from the written paths when a sibling first copies it)."""

    __slots__ = ("node", "nodes", "paths", "cut", "suffixes")

    def __init__(self, node: jtu.PyTreeDef, nodes: slice, paths: slice, cut: int) -> None:
        self.node, self.nodes, self.paths, self.cut = node, nodes, paths, cut
        self.suffixes: list[str] | None = None


def _same(a: jtu.PyTreeDef, b: jtu.PyTreeDef) -> bool:
    try:
        return bool(a == b)
    except Exception:  # node data whose `==` raises: write the subtree out (and report it there)
        return False


def _walk(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> tuple[list[str], list[str]]:
    """The nodes of `treedef` in pre-order, each as its JSON text, and every leaf's path.

    Iterative (no recursion limit), with a stack of `_Frame`s. A big tree
    repeats its subtrees side by side (a model's layers): a subtree equal to
    the sibling written just before it is copied from that one, its node texts
    as they are and its paths under the new prefix (a node's text and its
    children's keys depend only on its type and node data, which the
    treedef's equality compares).
    """
    nodes: list[str] = []
    paths: list[str] = []
    frames = [_Frame(iter([(treedef, "")]), None, "", 0, 0)]
    while frames:
        frame = frames[-1]
        for node, path in frame.children:
            data = node.node_data()
            if data is None:  # a leaf
                nodes.append(f'"{_LEAF}"')
                paths.append(path)
                continue
            node_type, aux = data
            if node_type is type(None):
                nodes.append("null")
                continue
            last = frame.last
            if last is not None and _same(last.node, node):
                if last.suffixes is None:
                    last.suffixes = [p[last.cut :] for p in paths[last.paths]]
                nodes.extend(nodes[last.nodes])
                paths.extend(map(path.__add__, last.suffixes))
                continue
            children = node.children()
            text = _encode_node(node_type, aux, len(children), path)  # raises for a node JSON cannot describe
            keys = _tree.node_keys(node_type, aux, len(children))
            if keys is None:  # a node that keys its children its own way: ask the node itself
                first = len(paths)
                keys = _tree.child_keys(node, leaves[first : first + node.num_leaves], len(children))
            child_paths = zip(children, [path + _tree.key_text(key) for key in keys], strict=True)
            frames.append(_Frame(child_paths, node, path, len(nodes), len(paths)))
            nodes.append(text)
            break  # write its children first, then go on with its siblings
        else:
            frames.pop()
            if frames:  # `frame` is written: its parent's next child may be a copy of it
                written = slice(frame.first_node, len(nodes)), slice(frame.first_path, len(paths))
                frames[-1].last = _Written(frame.node, *written, len(frame.path))
    return nodes, paths


def _sharding_record(sharding: Any) -> dict[str, Any] | None:
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    mesh = sharding.mesh
    mesh = mesh if isinstance(mesh, jax.sharding.AbstractMesh) else mesh.abstract_mesh
    spec = sharding.spec
    entries: list[Any] = []
    for entry in _compat.spec_entries(spec):
        if entry is None or isinstance(entry, str):
            entries.append(entry)
        elif entry is jax.sharding.PartitionSpec.UNCONSTRAINED:
            entries.append({"unconstrained": True})
        else:
            entries.append(list(entry))
    record: dict[str, Any] = {
        "spec": entries,
        "mesh": {
            "axis_names": list(mesh.axis_names),
            "axis_sizes": list(mesh.axis_sizes),
            "axis_types": [t.name for t in mesh.axis_types],
        },
    }
    for field in ("unreduced", "reduced"):
        axes = getattr(spec, field, None)
        if axes:
            record[field] = sorted(axes)
    return record


def _vma_record(leaf: jax.ShapeDtypeStruct) -> dict[str, list[str]] | None:
    sets = manual_axis_sets(leaf)
    if sets is None:
        return None
    varying, unreduced, reduced = sets
    return {"varying": sorted(varying), "unreduced": sorted(unreduced), "reduced": sorted(reduced)}


def _array_record(leaf: jax.ShapeDtypeStruct) -> dict[str, Any]:
    """An array leaf's record after its path: `shape`, `dtype`, `weak_type`, and `sharding` and `vma` if it has them."""
    record: dict[str, Any] = {
        "shape": [str(d) if is_symbolic(d) else int(d) for d in leaf.shape],
        "dtype": dtype_name(leaf.dtype),
        "weak_type": bool(leaf.weak_type),
    }
    sharding = _sharding_record(leaf.sharding)
    if sharding is not None:
        record["sharding"] = sharding
    vma = _vma_record(leaf)
    if vma is not None:
        record["vma"] = vma
    return record


def leaf_records(paths: Sequence[str], leaves: Sequence[Any]) -> list[dict[str, Any]]:
    """One JSON record per leaf: `path`, `shape`, `dtype`, `weak_type`, and more where it applies.

    The `"leaves"` array of `Structure.to_json`, and what `treeshape inspect
    --json` prints.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from treeshape._json import leaf_records
        >>> for record in leaf_records(["['n']", "['w']"], [jax.ShapeDtypeStruct((2,), jnp.bfloat16), "relu"]):
        ...     print(record)
        {'path': "['n']", 'shape': [2], 'dtype': 'bfloat16', 'weak_type': False}
        {'path': "['w']", 'shape': None, 'dtype': None, 'weak_type': None, 'static': "'relu'", 'type': 'builtins:str',
         'value': 'relu'}
    """
    return [
        {"path": path, **_array_record(leaf)} if isinstance(leaf, jax.ShapeDtypeStruct) else static_record(path, leaf)
        for path, leaf in zip(paths, leaves, strict=True)
    ]


# What tells an array leaf's record apart from another's (all but its path).
_ARRAY_FIELDS: Final = operator.attrgetter("shape", "dtype", "weak_type", "sharding", _compat.MANUAL_AXES_FIELD)
_PATH_HEAD: Final = '{"path": '


_SEP: Final = ",\n    "  # between two entries of the document's lists


def _leaf_text(paths: Sequence[str], leaves: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """The JSON text of the leaves' records (as `json.dumps` writes those of `leaf_records`, one
    a line), in pieces to join, and one leaf of each kind the records tell apart (what
    `_constraints` reads).

    A big tree has few kinds of array leaf: the text after each record's path
    is written once per kind (shape, dtype, weak type, sharding and manual
    axes), and joined with the paths in one go. Static leaves are written one by one.
    """
    if set(map(type, leaves)) == {jax.ShapeDtypeStruct}:
        try:
            kinds = list(map(_ARRAY_FIELDS, leaves))
            ones = dict(zip(kinds, leaves, strict=True))  # one leaf of each kind
        except Exception:  # a field that cannot be hashed or compared: write each leaf on its own
            ones = None
        # A `NamedSharding` equals another whose spec is written otherwise (`P('x')`, `P(('x',))`).
        if ones is not None and not any(isinstance(kind[3], jax.sharding.NamedSharding) for kind in ones):
            head = len(_PATH_HEAD) + 2  # `{"path": ""`
            tails = {kind: _encode({"path": "", **_array_record(leaf)})[head:] for kind, leaf in ones.items()}
            # A path JSON writes as it is (printable ASCII, no quote or backslash) is written without
            # a call per path: its quotes go with the texts around it.
            joined = "".join(paths)
            bare = joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined
            quote = '"' if bare else ""
            # each tail with the next record's start
            ends = {kind: quote + tail + _SEP + _PATH_HEAD + quote for kind, tail in tails.items()}
            pieces = [_PATH_HEAD + quote]
            pieces += itertools.chain.from_iterable(
                zip(paths if bare else map(_encode_str, paths), map(ends.__getitem__, kinds), strict=True)
            )
            pieces[-1] = quote + tails[kinds[-1]]
            return pieces, list(ones.values())
    lines = [
        _encode({"path": path, **_array_record(leaf)})
        if isinstance(leaf, jax.ShapeDtypeStruct)
        else _encode(static_record(path, leaf))
        for path, leaf in zip(paths, leaves, strict=True)
    ]
    return [_SEP.join(lines)], list(leaves)


def dumps(treedef: jtu.PyTreeDef, leaves: Sequence[Any], paths: Sequence[str] | None = None) -> str:
    """The JSON document for a treedef and its leaf descriptions (one node or leaf per line).

    `paths` are the leaves' paths when the caller knows them; else
    they are found while the treedef is written, which costs no more.
    """
    nodes, walked = _walk(treedef, leaves)
    leaf_text, kinds = _leaf_text(walked if paths is None else paths, leaves)
    constraints = _constraints(kinds)
    parts = ["{\n", f'  "version": {VERSION},\n']
    if constraints is not None:
        parts.append(f'  "constraints": {_encode(constraints)},\n')
    parts += ['  "treedef": [\n    ', _SEP.join(nodes), '\n  ],\n  "leaves": [']
    if leaves:
        parts.append("\n    ")
        parts += leaf_text
        parts.append("\n  ")
    parts.append("]\n}\n")
    return "".join(parts)  # one copy of a text that may be large


def _constraints(leaves: Sequence[Any]) -> list[str] | None:
    """The constraints of the one symbolic scope of the leaves' dimensions (None when every
    shape is concrete): a loaded document reads all its dimensions in one scope."""
    scopes = symbolic_scopes(leaves)
    if not scopes:
        return None
    written = {_compat.scope_constraints(scope) for scope in scopes}
    if len(written) > 1:
        shown = " and ".join(f"[{', '.join(c)}]" for c in sorted(written))
        raise TypeError(
            "treeshape.Structure.to_json: the shapes hold symbolic dimensions of scopes with different "
            f"constraints ({shown}); a document reads all of them in one scope. Make them with one "
            "`jax.export.symbolic_shape` call (or one `scope=`)."
        )
    return list(written.pop())


# -- decoding --------------------------------------------------------------------
def _reject_constant(name: str) -> NoReturn:
    raise Malformed(f"{name} is not valid JSON")


def _keys(x: Any, where: str, sort_as_jax: bool) -> list[Any]:
    keys = read_list(x, where)
    for i, key in enumerate(keys):
        if type(key) not in (str, int):
            fail(f"{where}[{i}]", f"dict keys must be strings or integers, got {short_repr(key)}")
    if len(set(keys)) != len(keys):
        fail(where, "dict keys must be unique")
    if sort_as_jax:
        try:
            order = sorted(keys)  # JAX orders a dict's keys with Python's own sort
        except TypeError:  # keys JAX cannot sort (strings mixed with integers)
            fail(where, "JAX cannot order these dict keys (strings mixed with integers)")
        if order != keys:
            fail(where, f"dict keys must be in JAX's sorted order, {short_repr(order)}")
    return keys


def _node(entry: Any, where: str) -> tuple[Any, int, list[Any] | None]:
    """`(node_data, number of children, each child's key)` of one `treedef` entry; node_data and
    keys None is a leaf."""
    if entry == _LEAF and type(entry) is str:
        return None, 0, None
    if entry is None:
        return (type(None), None), 0, []
    if type(entry) is not dict:
        return fail(where, f"expected '*', null or a node object, got {short_repr(entry)}")
    kind = get(entry, "type", where)
    node_data: tuple[Any, Any]
    if kind in ("list", "tuple"):
        n = read_int(get(entry, "n", where), f"{where}.n")
        node_data = ((list if kind == "list" else tuple), None)
    elif kind == "dict":
        keys = _keys(get(entry, "keys", where), f"{where}.keys", sort_as_jax=True)
        node_data, n = (dict, keys), len(keys)
    elif kind == "OrderedDict":
        keys = _keys(get(entry, "keys", where), f"{where}.keys", sort_as_jax=False)
        node_data, n = (collections.OrderedDict, tuple(keys)), len(keys)
    elif kind == "defaultdict":
        keys = _keys(get(entry, "keys", where), f"{where}.keys", sort_as_jax=True)
        factory_name = get(entry, "factory", where)
        factory = None if factory_name is None else lookup(factory_name, f"{where}.factory")
        if factory is not None and not callable(factory):
            fail(f"{where}.factory", f"{factory_name} is not callable")
        node_data, n = (collections.defaultdict, (factory, tuple(keys))), len(keys)
    elif kind == "namedtuple":
        cls = lookup_type(get(entry, "name", where), f"{where}.name")
        if not _tree.is_namedtuple(cls):
            fail(f"{where}.name", f"{type_name(cls)} is not a namedtuple class")
        n = read_int(get(entry, "n", where), f"{where}.n")
        fields = _tree.node_keys(cls, None, n) or []
        if n != len(fields):
            fail(f"{where}.n", f"{type_name(cls)} has {len(fields)} fields, not {n}")
        node_data = (cls, None)
    elif kind == "dataclass" and "fields" not in entry:  # node data as a tuple (written before fields by name)
        cls = lookup_type(get(entry, "name", where), f"{where}.name")
        if not dataclasses.is_dataclass(cls):
            fail(f"{where}.name", f"{type_name(cls)} is not a dataclass")
        aux = decode(get(entry, "aux", where), f"{where}.aux", plain=True)
        n = read_int(get(entry, "n", where), f"{where}.n")
        return (cls, aux), n, _check_dataclass_node(cls, aux, n, where)
    elif kind in _FRAMEWORK_KINDS:
        return _framework_node(kind, entry, where)
    else:
        return fail(f"{where}.type", f"unknown node type {short_repr(kind)}")
    return node_data, n, _tree.node_keys(node_data[0], node_data[1], n)


_FRAMEWORK_KINDS: Final = (
    _nodes.DATACLASS,
    _nodes.NNX,
    _nodes.NNX_VARIABLE,
    _nodes.KEYED,
    _nodes.NNX_INTERNAL,
    _nodes.EQUINOX,
    _nodes.EQUINOX_STATE,
)
_PARTS: Final = {
    _nodes.DATACLASS: ("fields",),
    _nodes.NNX: ("keys", "static"),
    _nodes.NNX_VARIABLE: ("fields",),
    _nodes.KEYED: ("keys",),
    _nodes.NNX_INTERNAL: ("aux",),
    _nodes.EQUINOX: ("fields", "wrapper"),
    _nodes.EQUINOX_STATE: ("keys",),
}


def _framework_node(kind: str, entry: dict[str, Any], where: str) -> tuple[Any, int, list[Any]]:
    """A node whose data `_nodes` writes by name (a flax.nnx or equinox module, a registered
    dataclass): its values decoded here, its node data rebuilt and checked by `_nodes`."""
    cls = lookup_type(get(entry, "name", where), f"{where}.name")
    n = read_int(get(entry, "n", where), f"{where}.n")
    parts: dict[str, Any] = {}
    for part in _PARTS[kind]:
        at = f"{where}.{part}"
        if part == "wrapper":
            if part in entry:
                parts[part] = decode(entry[part], at)
        elif part == "keys":
            parts[part] = read_list(get(entry, part, where), at)
        elif part == "static":
            pairs = read_list(get(entry, part, where), at)
            parts[part] = [list(_pair(pair, f"{at}[{i}]")) for i, pair in enumerate(pairs)]
        elif part == "fields":
            fields = get(entry, part, where)
            if type(fields) is not dict:
                fail(at, f"expected an object, got {short_repr(fields)}")
            parts[part] = {name: decode(value, f"{at}.{name}") for name, value in fields.items()}
        else:
            parts[part] = decode(get(entry, part, where), at, plain=True)
    try:
        aux, keys = _nodes.rebuild(kind, cls, parts, n)
    except (ValueError, TypeError, KeyError) as err:
        fail(where, f"cannot rebuild this {type_name(cls)}: {err}")
    return (cls, aux), n, keys


def _pair(x: Any, where: str) -> tuple[Any, Any]:
    """A `[name, value]` pair of an nnx node's static attributes, its value decoded."""
    if type(x) is not list or len(x) != 2:
        fail(where, f"expected [name, value], got {short_repr(x)}")
    return x[0], decode(x[1], f"{where}[1]")


def _check_dataclass_node(cls: type, aux: Any, n: int, where: str) -> list[Any]:
    """Check a dataclass node's arity and node data against the registration, before JAX sees them;
    its children's keys.

    JAX's own unflatten of a dataclass node trusts both (and may crash on a
    wrong count), so they are compared with the node JAX makes for a probe
    instance: built without calling `__init__`, every field set to `None`.
    The probe's children are keyed as the registration keys them.
    """
    try:
        probe: Any = object.__new__(cls)
        for field in dataclasses.fields(cls):
            object.__setattr__(probe, field.name, None)
        probe_def: jtu.PyTreeDef = jtu.tree_structure(probe)
    except Exception as err:
        fail(f"{where}.name", f"cannot check the pytree dataclass {type_name(cls)}: {type(err).__name__}: {err}")
    if probe_def.num_nodes == 1 and probe_def.num_leaves == 1:
        fail(f"{where}.name", f"{type_name(cls)} is not registered as a pytree node")
    probe_type, probe_aux = probe_def.node_data()
    if probe_type is not cls:
        fail(f"{where}.name", f"{type_name(cls)} does not flatten to a node of its own type")
    expected_n = len(probe_def.children())
    if n != expected_n:
        fail(f"{where}.n", f"{type_name(cls)} has {expected_n} pytree children, not {n}")
    same_kind = type(aux) is type(probe_aux)
    if not same_kind or (isinstance(aux, (tuple, list)) and len(aux) != len(probe_aux)):
        fail(f"{where}.aux", f"{type_name(cls)} has node data like {short_repr(probe_aux)}, not {short_repr(aux)}")
    keyed, _ = _tree.keyed_children(probe)
    return [key for key, _ in keyed]


# Node types whose rebuilding runs no user code (no constructor that may reject a leaf).
_BUILTIN_NODES: Final = frozenset({list, tuple, dict, collections.OrderedDict, collections.defaultdict, type(None)})
_SHALLOW: Final = 100  # JAX rebuilds trees of builtin nodes this deep without reaching its own depth limit
_SMALL: Final = 64  # a subtree with at most this many leaves keeps their paths (each big one is written once)
_Parsed = tuple[Any, int, list[str] | None]  # a treedef entry: node data, number of children, their keys' texts


def _ids(nodes: list[Any]) -> list[bytes] | list[str]:
    """A text per treedef entry that tells apart every two different JSON values (1, 1.0, true)."""
    try:
        return list(map(marshal.dumps, nodes))
    except ValueError:  # nested more deeply than marshal goes
        return list(map(repr, nodes))


class _Subtrees:
    """The distinct subtrees of a treedef being rebuilt (an entry and its children's subtrees),
    each built once; 0 is a leaf. A small subtree keeps the paths of its leaves below it; the
    paths of a big one are written once, from the top (`paths`)."""

    def __init__(self, parsed: list[_Parsed]) -> None:
        self.parsed = parsed
        self.max_depth = sys.getrecursionlimit()
        # (treedef, depth, the paths below it if it is small), and (its children's keys, their subtrees)
        self.built: list[tuple[jtu.PyTreeDef, int, list[str] | None]] = [(_LEAF_TREEDEF, 1, [""])]
        self.links: list[tuple[list[str], tuple[int, ...]]] = [([], ())]
        self.made: dict[tuple[int, tuple[int, ...]], int] = {}

    def make(self, entry: int, kids: tuple[int, ...], where: str) -> int:
        """The subtree of distinct entry `entry` (at `where`) over the subtrees `kids`."""
        found = self.made.get((entry, kids))
        if found is not None:
            return found
        node_data, _, keys = self.parsed[entry]
        children = [self.built[k] for k in kids]
        depth = 1 + max((d for _, d, _ in children), default=0)
        # JAX flattens (and so rebuilds paths for) trees only as deep as Python's recursion limit,
        # and deeper ones can crash its C++ code: refuse them before building anything deep.
        if depth > self.max_depth:
            fail("treedef", f"the tree is nested more deeply than JAX can flatten ({self.max_depth} levels)")
        try:
            node = jtu.PyTreeDef.from_node_data_and_children(
                jtu.default_registry, node_data, [child for child, _, _ in children]
            )
        except (RuntimeError, TypeError, ValueError) as err:
            fail(where, f"cannot rebuild this node: {err}")
        paths: list[str] | None = None
        if node.num_leaves <= _SMALL:  # so are its children
            paths = []
            for key, (_, _, below) in zip(keys or [], children, strict=True):
                paths.extend(map(key.__add__, below or []))
        self.made[(entry, kids)] = len(self.built)
        self.built.append((node, depth, paths))
        self.links.append((keys or [], kids))
        return len(self.built) - 1

    def paths(self, root: int) -> list[str]:
        """The path of every leaf of subtree `root`, in order (iterative: no depth limit)."""
        known = self.built[root][2]
        if known is not None:
            return known
        out: list[str] = []
        frames = [(iter(zip(*self.links[root], strict=True)), "")]
        while frames:
            children, prefix = frames[-1]
            for key, kid in children:
                below = self.built[kid][2]
                if below is None:  # a big subtree: its children, under this path
                    frames.append((iter(zip(*self.links[kid], strict=True)), prefix + key))
                    break
                out.extend(map((prefix + key).__add__, below))
            else:
                frames.pop()
        return out


def _top_down(order: list[int], trees: _Subtrees) -> int | None:
    """The root subtree of the entries `order` (each a distinct entry's index), read from the top:
    a child whose entries repeat those of the sibling before it is that sibling's subtree, found
    by one comparison (a model's layers). None for anything irregular, which `_bottom_up` reads
    and reports as it always has."""
    stack: list[list[Any]] = []  # nodes being read: [entry, n, children's subtrees, start, last child's span]
    pos = 0
    while True:
        start = pos
        subtree = None
        if stack and stack[-1][2]:
            first, end = stack[-1][4]
            if order[pos : pos + end - first] == order[first:end]:
                subtree, pos = stack[-1][2][-1], pos + end - first
        if subtree is None:
            if pos == len(order):
                return None
            entry = order[pos]
            pos += 1
            node_data, n, _ = trees.parsed[entry]
            if node_data is None:
                subtree = 0
            elif n:
                stack.append([entry, n, [], start, None])
                continue
            else:
                subtree = trees.make(entry, (), "")
        while stack:  # `subtree` (from `start` to `pos`) is finished: the next child of its parent
            frame = stack[-1]
            frame[2].append(subtree)
            frame[4] = (start, pos)
            if len(frame[2]) < frame[1]:
                break
            stack.pop()
            start, subtree = frame[3], trees.make(frame[0], tuple(frame[2]), "")
        else:
            return subtree if pos == len(order) else None


def _bottom_up(order: list[int], trees: _Subtrees) -> int:
    """The root subtree of the entries `order`, built from the last entry back with an explicit
    stack; a malformed list is reported at the entry where it shows."""
    stack: list[int] = []  # the finished subtrees, the next on top
    for i in range(len(order) - 1, -1, -1):
        node_data, n, _ = trees.parsed[order[i]]
        if node_data is None:
            stack.append(0)
            continue
        if n > len(stack):
            fail(f"treedef[{i}]", f"the node has {n} children but only {len(stack)} nodes follow it")
        kids = tuple(reversed(stack[len(stack) - n :]))
        del stack[len(stack) - n :]
        stack.append(trees.make(order[i], kids, f"treedef[{i}]"))
    if len(stack) != 1:
        fail("treedef", f"the nodes form {len(stack)} trees, not one (a count `n` or a key list is wrong)")
    return stack[0]


def _decode_treedef(entries: Any) -> tuple[jtu.PyTreeDef, list[str], bool]:
    """Rebuild a treedef from its pre-order node list; the path of each of its leaves, in leaf
    order; and whether rebuilding the tree from the treedef could still fail (`_check_rebuilds`).

    A big tree repeats its nodes and subtrees (a model's layers): each distinct
    entry is read once, and each distinct subtree is built once.
    """
    nodes = read_list(entries, "treedef")
    if not nodes:
        fail("treedef", "expected at least one node")
    ids = _ids(nodes)
    first = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))  # each distinct entry's first index
    distinct: dict[Any, int] = {}
    parsed: list[_Parsed] = []
    for text, i in sorted(first.items(), key=operator.itemgetter(1)):  # in order: the first error is reported
        node_data, n, keys = _node(nodes[i], f"treedef[{i}]")
        distinct[text] = len(parsed)
        parsed.append((node_data, n, None if keys is None else [_tree.key_text(key) for key in keys]))
    order = list(map(distinct.__getitem__, ids))
    trees = _Subtrees(parsed)
    try:
        root = _top_down(order, trees)
    except Malformed:
        root = None
    if root is None:
        root = _bottom_up(order, trees)
    treedef, depth, _ = trees.built[root]
    paths = trees.paths(root)
    builtin = all(data is None or data[0] in _BUILTIN_NODES for data, _, _ in parsed)
    return treedef, paths, not (builtin and depth <= _SHALLOW)


def _sharding(x: Any, where: str) -> Any:
    if type(x) is not dict:
        return fail(where, f"expected an object, got {short_repr(x)}")
    mesh = get(x, "mesh", where)
    if type(mesh) is not dict:
        fail(f"{where}.mesh", f"expected an object, got {short_repr(mesh)}")
    names = read_str_list(get(mesh, "axis_names", f"{where}.mesh"), f"{where}.mesh.axis_names")
    sizes = [
        read_int(s, f"{where}.mesh.axis_sizes[{i}]", low=1)
        for i, s in enumerate(read_list(get(mesh, "axis_sizes", f"{where}.mesh"), f"{where}.mesh.axis_sizes"))
    ]
    types = read_str_list(get(mesh, "axis_types", f"{where}.mesh"), f"{where}.mesh.axis_types", unique=False)
    if not len(names) == len(sizes) == len(types):
        fail(f"{where}.mesh", "axis_names, axis_sizes and axis_types must have the same length")
    kinds = {kind.name: kind for kind in jax.sharding.AxisType}
    for i, t in enumerate(types):
        if t not in kinds:
            fail(f"{where}.mesh.axis_types[{i}]", f"expected one of {sorted(kinds)}, got {short_repr(t)}")
    entries: list[Any] = []
    for i, entry in enumerate(read_list(get(x, "spec", where), f"{where}.spec")):
        at = f"{where}.spec[{i}]"
        if entry is None:
            entries.append(None)
        elif type(entry) is dict and entry == {"unconstrained": True}:
            entries.append(jax.sharding.PartitionSpec.UNCONSTRAINED)
        elif type(entry) is list:
            entries.append(tuple(read_str_list(entry, at)))
        else:
            entries.append(read_str(entry, at))
    extra = {
        field: frozenset(read_str_list(x[field], f"{where}.{field}"))
        for field in ("unreduced", "reduced")
        if field in x
    }
    try:
        abstract = jax.sharding.AbstractMesh(tuple(sizes), tuple(names), axis_types=tuple(kinds[t] for t in types))
        return jax.sharding.NamedSharding(abstract, jax.sharding.PartitionSpec(*entries, **extra))
    except (ValueError, TypeError) as err:
        return fail(where, f"not a valid sharding: {err}")


def _vma(x: Any, where: str) -> Any:
    if type(x) is not dict:
        return fail(where, f"expected an object, got {short_repr(x)}")
    sets = {
        field: frozenset(read_str_list(get(x, field, where), f"{where}.{field}"))
        for field in ("varying", "unreduced", "reduced")
    }
    try:
        return _compat.make_manual_axes(**sets)
    except ValueError as err:
        return fail(where, f"not valid manual axes: {err}")
    except _compat.JaxReleaseError as err:
        return fail(where, str(err))


class _Dims:
    """The document's symbolic scope, made on first use from its `"constraints"`, in which
    every dimension written as a string is read (each distinct text once)."""

    def __init__(self, constraints: Any) -> None:
        self.constraints = constraints
        self.scope: Any = None
        self.read_texts: dict[str, Any] = {}

    def read(self, text: str, where: str) -> Any:
        d = self.read_texts.get(text)
        if d is not None:
            return d
        if self.scope is None:
            written = [] if self.constraints is None else read_str_list(self.constraints, "constraints", unique=False)
            try:
                unsatisfiable = _compat.unsatisfiable_constraint(written)
                scope = _compat.make_scope(written)
            except Exception as err:  # JAX's parser: ValueError, or tokenize's TokenError
                fail("constraints", f"not valid constraints of a symbolic scope: {err}")
            if unsatisfiable is not None:
                before = written[: written.index(unsatisfiable)]
                together = f" together with {', '.join(map(repr, before))}" if before else ""
                fail(
                    "constraints",
                    f"no size satisfies {unsatisfiable!r}{together} (dimension variables are >= 1), so no array "
                    "has these shapes: correct or remove that constraint",
                )
            self.scope = scope
        try:
            d = _compat.parse_dim(text, self.scope)
        except ValueError as err:
            fail(where, str(err))
        if not is_symbolic(d) and not 0 <= d <= MAX_DIM:
            fail(where, f"expected a size >= 0, got {short_repr(text)}")
        if is_symbolic(d) and _compat.always_negative(d):
            listed = ", ".join(_compat.scope_constraints(self.scope))
            allowed = f" the constraints allow ({listed}; " if listed else " ("
            fail(
                where,
                f"the dimension {text!r} is below 0 for every size{allowed}dimension variables are >= 1), so no "
                "array has this shape: a dimension is a size >= 0",
            )
        self.read_texts[text] = d
        return d


def _leaf(record: Any, where: str, dims: _Dims) -> Any:
    if type(record) is not dict:
        return fail(where, f"expected an object, got {short_repr(record)}")
    read_str(get(record, "path", where), f"{where}.path")
    if "static" in record:
        return read_static(record, where)
    shape = tuple(
        dims.read(d, f"{where}.shape[{i}]") if type(d) is str else read_int(d, f"{where}.shape[{i}]")
        for i, d in enumerate(read_list(get(record, "shape", where), f"{where}.shape"))
    )
    dtype = read_dtype(get(record, "dtype", where), f"{where}.dtype")
    weak = read_bool(get(record, "weak_type", where), f"{where}.weak_type")
    sharding = _sharding(record["sharding"], f"{where}.sharding") if record.get("sharding") is not None else None
    vma = _vma(record["vma"], f"{where}.vma") if record.get("vma") is not None else None
    problem = extent_problem(shape, dtype)  # XLA would abort the process on such a leaf
    if problem is not None:
        fail(f"{where}.shape", f"the leaf at {record['path']} {problem}, the most that XLA's 64-bit sizes hold")
    leaf = _compat.shape_dtype_struct(shape, dtype, weak_type=weak, sharding=sharding, manual_axes=vma)
    problem = _split_problem(leaf) if sharding is not None and any(map(is_symbolic, shape)) else None
    if problem is not None:  # as `with_shardings` checks a sharding
        fail(f"{where}.sharding", f"it does not fit the leaf at {record['path']} ({leaf_str(leaf)}): {problem}")
    return leaf


_PLAIN_FIELDS: Final = tuple(map(operator.itemgetter, ("path", "shape", "dtype", "weak_type")))


def _plain_leaves(records: list[Any], constraints: Any, paths: list[str]) -> tuple[Any, ...] | None:
    """The leaf descriptions of `records` when every record is a plain array leaf's (`path`,
    `shape`, `dtype` and `weak_type` only) of fields of the right JSON types, its path the
    one in `paths` (where the treedef puts it), else None (then `_leaves` reads them one by
    one, and says which is wrong).

    Read in bulk, at C speed: each kind of leaf (shape, dtype, weak type) is
    read and checked once, and its one `ShapeDtypeStruct` (immutable) is
    shared by the leaves of that kind: a big tree has few kinds of leaf. A
    field is type-checked by column only where equality would hide a wrong
    type (`1 == 1.0 == True`): a path equal to a `str` is one, and a dtype of
    a kind is read (and so checked) by `_leaf`.
    """
    try:
        if set(map(len, records)) != {4}:  # with the four fields read below: those and no others
            return None
        columns = [list(map(field, records)) for field in _PLAIN_FIELDS]
    except (KeyError, TypeError):  # a record that is not an object, or lacks a field
        return None
    if columns[0] != paths:
        return None
    shapes, weaks = columns[1], columns[3]
    if set(map(type, shapes)) != {list} or set(map(type, weaks)) != {bool}:
        return None
    if not set(map(type, itertools.chain.from_iterable(shapes))) <= {int, str}:  # no bool or float passes for an int
        return None
    kinds = list(zip(map(tuple, shapes), columns[2], weaks, strict=True))
    del columns, shapes, weaks
    try:
        made = dict.fromkeys(kinds)
    except TypeError:  # a dtype that is a list or an object
        return None
    dims = _Dims(constraints)
    for kind in made:
        shape, dtype, weak = kind
        try:
            made[kind] = _leaf({"path": "", "shape": list(shape), "dtype": dtype, "weak_type": weak}, "", dims)
        except Malformed:
            return None
    return tuple(map(made.__getitem__, kinds))


def _leaves(records: list[Any], constraints: Any) -> tuple[Any, ...]:
    """The leaf descriptions of `records`, read one by one. Array leaves with the same record
    but for the path share one (immutable) `ShapeDtypeStruct`, checked once."""
    dims = _Dims(constraints)
    made: dict[str, Any] = {}
    out: list[Any] = []
    for i, record in enumerate(records):
        where = f"leaves[{i}]"
        if type(record) is not dict or "static" in record:
            out.append(_leaf(record, where, dims))
            continue
        read_str(get(record, "path", where), f"{where}.path")
        kind = _encode({field: value for field, value in sorted(record.items()) if field != "path"})
        leaf = made.get(kind)
        if leaf is None:
            leaf = made[kind] = _leaf(record, where, dims)
        out.append(leaf)
    return tuple(out)


def _check_rebuilds(treedef: jtu.PyTreeDef) -> None:
    """The tree can be rebuilt from its treedef: JAX's unflatten calls the constructors of its
    namedtuple and dataclass nodes, which may reject placeholder leaves."""
    try:
        treedef.unflatten(range(treedef.num_leaves))
    except (RecursionError, SystemError):  # JAX's own depth limit (raised from its C++ code)
        fail("treedef", "the tree is nested more deeply than JAX can flatten")
    except Exception as err:  # a dataclass whose __init__ rejects placeholder leaves
        fail("treedef", f"the tree cannot be rebuilt: {type(err).__name__}: {err}")


def _decode(text: str | bytes | bytearray) -> tuple[jtu.PyTreeDef, tuple[Any, ...]]:
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise Malformed(f"not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise Malformed(f"not valid UTF-8 text: {err}") from None
    if type(doc) is not dict:
        fail("the document", f"expected a JSON object, got {short_repr(doc)}")
    version = get(doc, "version", "the document")
    if type(version) is not int or version != VERSION:
        fail(
            "version",
            f"this treeshape reads version {VERSION}, got {short_repr(version)} (written by another "
            "treeshape release? regenerate the file with this one)",
        )
    treedef, paths, may_fail = _decode_treedef(get(doc, "treedef", "the document"))
    records = read_list(get(doc, "leaves", "the document"), "leaves")
    if len(records) != treedef.num_leaves:
        fail("leaves", f"the treedef has {treedef.num_leaves} leaves, but there are {len(records)} records")
    plain = _plain_leaves(records, doc.get("constraints"), paths)
    leaves = _leaves(records, doc.get("constraints")) if plain is None else plain
    if may_fail:
        _check_rebuilds(treedef)
    # Each record's `path` is where the treedef puts that leaf (a hand-edited file may disagree).
    if plain is None:
        for i, (path, record) in enumerate(zip(paths, records, strict=True)):
            if record["path"] != path:
                fail(f"leaves[{i}].path", f"the treedef puts leaf {i} at {path!r}, not {short_repr(record['path'])}")
    return treedef, leaves


def loads(text: str | bytes | bytearray) -> tuple[jtu.PyTreeDef, tuple[Any, ...]]:
    """Decode a document written by `dumps` into `(treedef, leaves)`.

    Raises:
        TypeError: `text` is not `str`, `bytes` or `bytearray`.
        ValueError: anything malformed, with where and what.
    """
    if not isinstance(text, (str, bytes, bytearray)):
        raise TypeError(f"{_WHO}: expected the JSON text as a str, got {type(text).__name__}")
    try:
        return _decode(text)
    except Malformed as err:
        raise ValueError(f"{_WHO}: {err}") from None
    except RecursionError:
        raise ValueError(f"{_WHO}: the JSON is nested too deeply") from None
    except MemoryError:
        raise ValueError(f"{_WHO}: the JSON is too large to load") from None
