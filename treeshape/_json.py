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
`name`, `n` and its node data `aux`, which must be plain data) or `static` (a
node with no children whose node data JSON cannot hold, such as the `GraphDef`
of `nnx.split`: `name` and its node data's text as `data`). flax.nnx
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
This module writes the document (the `treedef` list and the leaf records);
`_json_load` reads it back, and the values inside it (node data, static
leaves) are `_json_values`'. Neither imports `_structure` (which calls them):
they work on a treedef and a tuple of leaves.
"""

import collections
import dataclasses
import itertools
import json
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu

from . import _compat, _nodes, _tree
from ._json_values import (
    NAME,
    dtype_name,
    encode,
    short_repr,
    static_record,
    type_name,
)
from ._leaf import manual_axis_sets
from ._shapes import is_symbolic, symbolic_scopes
from ._tree import as_text


VERSION: Final = 1
LEAF: Final = "*"


# -- the layout ----------------------------------------------------------------
# How `dumps` lays the document out, one treedef entry or leaf record a line (each line
# below is written without its line break); `_json_load` reads a document laid out so
# line by line, with these same texts.
OPEN: Final = "{"
VERSION_LINE: Final = f'  "version": {VERSION},'
CONSTRAINTS_HEAD: Final = '  "constraints": '  # then the constraints' list and a comma
TREEDEF_OPEN: Final = '  "treedef": ['
TREEDEF_CLOSE: Final = "  ],"
LEAVES_OPEN: Final = '  "leaves": ['
NO_LEAVES: Final = LEAVES_OPEN + "]"
LEAVES_CLOSE: Final = "  ]"
CLOSE: Final = "}"
INDENT: Final = "    "  # before each entry of the treedef and leaves lists
SEP: Final = ",\n" + INDENT  # between two entries of those lists
ITEM_SEP: Final = ", "  # inside an entry, as `json.dumps` writes it
KEY_SEP: Final = ": "
PATH_HEAD: Final = "{" + json.dumps("path") + KEY_SEP  # each leaf record up to its path's text


# -- encoding ------------------------------------------------------------------
# `json.dumps(value, allow_nan=False)`, without making a new encoder on every call.
_encode: Final[Callable[[Any], str]] = json.JSONEncoder(allow_nan=False, separators=(ITEM_SEP, KEY_SEP)).encode
_encode_str: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


def _dict_keys(keys: Sequence[Any], where: str) -> list[Any]:
    for key in keys:
        if type(key) not in (str, int):
            raise TypeError(
                f"treeshape.Structure.to_json: the dict at {where} has a key {short_repr(key)} of type "
                f"{type(key).__name__}; JSON can describe str and int keys only."
            )
    return list(keys)


def _factory_name(factory: Any, where: str) -> str:
    """A defaultdict's default factory by name: a class (`from_json` reads no other callable)."""
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if isinstance(factory, type) and NAME.fullmatch(f"{module}:{qualname}"):
        return f"{module}:{qualname}"
    raise TypeError(
        f"treeshape.Structure.to_json: the defaultdict at {where} has the default factory "
        f"{short_repr(factory)}; JSON describes a factory only as a class with a module-level name (such as "
        "list), which is all from_json installs: use such a class, or a dict"
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
        name = None if factory is None else _factory_name(factory, where)
        entry = {"type": "defaultdict", "factory": name, "keys": _dict_keys(keys, where)}
    elif _tree.is_namedtuple(node_type):
        entry = {"type": "namedtuple", "name": type_name(node_type), "n": n}
    elif (described := _nodes.record(node_type, aux)) is not None:  # framework nodes and dataclasses, by name
        kind, parts = described
        written = _encode_parts(parts, where, node_type.__module__)
        entry = {"type": kind, "name": type_name(node_type), "n": n, **written}
    elif n == 0 and isinstance(node_type, type) and not _plain(aux):  # a static node (nnx.split's GraphDef)
        entry = {"type": "static", "name": type_name(node_type), "data": encode(as_text(aux))}
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


def _plain(aux: Any) -> bool:
    """Whether JSON holds node data `aux` as data (a JSON scalar, tuples and lists of them)."""
    try:
        encode(aux, plain_at="")
    except TypeError:
        return False
    return True


class _Frame:
    """A node being written by `_walk`: its children and their paths (the next one at `at`),
    where its own text and paths start, and its last child written whole (to copy it from
    when the next children are equal to it)."""

    __slots__ = ("children", "paths", "at", "node", "path", "first_node", "first_path", "last")

    def __init__(self, children: list[Any], paths: list[str], node: Any, path: str, nodes: int, leaf_paths: int):
        self.children, self.paths, self.at = children, paths, 0
        self.node, self.path = node, path
        self.first_node, self.first_path = nodes, leaf_paths
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


def _walk(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> tuple[list[str], list[str], bool]:
    """The nodes of `treedef` in pre-order, each as its JSON text, every leaf's path, and
    whether every key text in those paths is bare (`_bare`: then so is every path).

    Iterative (no recursion limit), with a stack of `_Frame`s. A big tree
    repeats its subtrees side by side (a model's layers): a run of subtrees
    equal to the sibling written just before them is copied from that one in
    one step, its node texts as they are and its paths under each new prefix
    (a node's text and its children's keys depend only on its type and node
    data, which the treedef's equality compares).
    """
    nodes: list[str] = []
    paths: list[str] = []
    bare = True
    frames = [_Frame([treedef], [""], None, "", 0, 0)]
    while frames:
        frame = frames[-1]
        children, child_paths = frame.children, frame.paths
        while frame.at < len(children):
            node, path = children[frame.at], child_paths[frame.at]
            data = node.node_data()
            if data is None:  # a leaf
                nodes.append(f'"{LEAF}"')
                paths.append(path)
                frame.at += 1
                continue
            node_type, aux = data
            if node_type is type(None):
                nodes.append("null")
                frame.at += 1
                continue
            last = frame.last
            if last is not None and _same(last.node, node):
                start, frame.at = frame.at, frame.at + 1
                while frame.at < len(children) and _same(last.node, children[frame.at]):
                    frame.at += 1
                if last.suffixes is None:
                    last.suffixes = [p[last.cut :] for p in paths[last.paths]]
                nodes.extend(nodes[last.nodes] * (frame.at - start))
                paths.extend([prefix + suffix for prefix in child_paths[start : frame.at] for suffix in last.suffixes])
                continue
            kids = node.children()
            text = _encode_node(node_type, aux, len(kids), path)  # raises for a node JSON cannot describe
            keys = _tree.node_keys(node_type, aux, len(kids))
            if keys is None:  # a node that keys its children its own way: ask the node itself
                first = len(paths)
                keys = _tree.child_keys(node, leaves[first : first + node.num_leaves], len(kids))
            frame.at += 1
            texts = [_tree.key_text(key) for key in keys]
            bare = bare and _bare("".join(texts))
            frames.append(_Frame(kids, [path + text for text in texts], node, path, len(nodes), len(paths)))
            nodes.append(text)
            break  # write its children first, then go on with its siblings
        else:
            frames.pop()
            if frames:  # `frame` is written: its parent's next children may be copies of it
                written = slice(frame.first_node, len(nodes)), slice(frame.first_path, len(paths))
                frames[-1].last = _Written(frame.node, *written, len(frame.path))
    return nodes, paths, bare


def _bare(text: str) -> bool:
    """Whether JSON writes `text` as it is between its quotes (printable ASCII, no quote or backslash)."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


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


# What tells an array leaf's record apart from another's (all but its path): its sharding as
# given (a bare `PartitionSpec` stands for a `NamedSharding`, and is written leaf by leaf).
_ARRAY_FIELDS: Final = operator.attrgetter(
    "shape", "dtype", "weak_type", _compat.GIVEN_SHARDING_FIELD, _compat.MANUAL_AXES_FIELD
)
_BY_LEAF: Final = (jax.sharding.NamedSharding, jax.sharding.PartitionSpec)


def _leaf_text(paths: Sequence[str], leaves: Sequence[Any], bare: bool | None = None) -> tuple[list[str], list[Any]]:
    """The JSON text of the leaves' records (as `json.dumps` writes those of `leaf_records`, one
    a line), in pieces to join, and one leaf of each kind the records tell apart (what
    `_constraints` reads).

    A big tree has few kinds of array leaf: the text after each record's path
    is written once per kind (shape, dtype, weak type, sharding and manual
    axes), and joined with the paths in one go. Static leaves are written one by one.
    """
    if set(map(type, leaves)) == {jax.ShapeDtypeStruct}:
        firsts: dict[Any, int] = {}  # each kind -> the position of its first leaf
        try:  # each leaf's kind by that position: one lookup of its fields per leaf
            codes = list(map(firsts.setdefault, map(_ARRAY_FIELDS, leaves), itertools.count()))
        except Exception:  # a field that cannot be hashed or compared: write each leaf on its own
            firsts = {}
        ones = {i: leaves[i] for i in firsts.values()}  # one leaf of each kind
        # A `NamedSharding` equals another whose spec is written otherwise (`P('x')`, `P(('x',))`).
        if ones and not any(isinstance(kind[3], _BY_LEAF) for kind in firsts):
            head = len(PATH_HEAD) + 2  # `{"path": ""`
            tails = {i: _encode({"path": "", **_array_record(leaf)})[head:] for i, leaf in ones.items()}
            # A path JSON writes as it is (printable ASCII, no quote or backslash) is written without
            # a call per path: its quotes go with the texts around it.
            if bare is None:  # (else: known to the caller, which made the paths)
                bare = _bare("".join(paths))
            quote = '"' if bare else ""
            # each tail with the next record's start
            ends = {i: quote + tail + SEP + PATH_HEAD + quote for i, tail in tails.items()}
            pieces = [PATH_HEAD + quote]
            pieces += itertools.chain.from_iterable(
                zip(paths if bare else map(_encode_str, paths), map(ends.__getitem__, codes), strict=True)
            )
            pieces[-1] = quote + tails[codes[-1]]
            return pieces, list(ones.values())
    lines = [
        _encode({"path": path, **_array_record(leaf)})
        if isinstance(leaf, jax.ShapeDtypeStruct)
        else _encode(static_record(path, leaf))
        for path, leaf in zip(paths, leaves, strict=True)
    ]
    return [SEP.join(lines)], list(leaves)


def dumps(treedef: jtu.PyTreeDef, leaves: Sequence[Any], paths: Sequence[str] | None = None) -> str:
    """The JSON document for a treedef and its leaf descriptions (one node or leaf per line).

    `paths` are the leaves' paths when the caller knows them; else
    they are found while the treedef is written, which costs no more.
    """
    nodes, walked, bare = _walk(treedef, leaves)
    leaf_text, kinds = _leaf_text(walked, leaves, bare) if paths is None else _leaf_text(paths, leaves)
    constraints = _constraints(kinds)
    parts = [OPEN, "\n", VERSION_LINE, "\n"]
    if constraints is not None:
        parts += [CONSTRAINTS_HEAD, _encode(constraints), ",\n"]
    parts += [TREEDEF_OPEN, "\n", INDENT, SEP.join(nodes), "\n", TREEDEF_CLOSE, "\n"]
    if leaves:
        parts += [LEAVES_OPEN, "\n", INDENT]
        parts += leaf_text
        parts += ["\n", LEAVES_CLOSE]
    else:
        parts.append(NO_LEAVES)
    parts += ["\n", CLOSE, "\n"]
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
