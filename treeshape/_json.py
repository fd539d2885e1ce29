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
plain data (also a flax `FrozenDict`) as JSON values, functions and classes by
`"module:qualname"`, anything else by its text (`_nodes.static_text`). Other
custom pytree nodes are refused: their node data cannot be checked when loading.

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
This module does not import `_structure` (which calls it): it works on a
treedef and a tuple of leaves.
"""

import collections
import dataclasses
import enum
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NoReturn

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from . import _compat, _nodes
from ._leaf import (
    extent_problem,
    is_symbolic,
    jax_dtype,
    key_dtype,
    key_dtypes,
    leaf_str,
    manual_axis_sets,
    symbolic_scopes,
)
from ._sharding import split_problem as _split_problem
from ._tree import StaticRepr


VERSION: Final = 1
_WHO: Final = "treeshape.Structure.from_json"
_MAX_DIM: Final = 2**63 - 1  # XLA's dimension sizes are int64
_MAX_INT_VALUE: Final = 10**300  # larger static ints are kept by repr only
_LEAF: Final = "*"
_LEAF_TREEDEF: Final = jtu.tree_structure(0)
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")
_NUMERIC_NAME: Final = re.compile(r"[a-z]+[0-9]*")
_KEY_NAME: Final = re.compile(r"key<[a-z0-9_]+>")


# -- encoding ------------------------------------------------------------------
# `json.dumps(value, allow_nan=False)`, without making a new encoder on every call.
_encode: Final[Callable[[Any], str]] = json.JSONEncoder(allow_nan=False).encode


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _is_namedtuple(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)


def _plain_data(x: Any, where: str) -> Any:
    """A dataclass node's data as JSON: plain values, and tuples/lists of them (tagged)."""
    if type(x) in (str, bool, type(None)) or (type(x) is int and abs(x) < _MAX_INT_VALUE):
        return x
    if type(x) is float and math.isfinite(x):
        return x
    if type(x) in (tuple, list):
        return {type(x).__name__: [_plain_data(item, where) for item in x]}
    raise TypeError(
        f"treeshape.Structure.to_json: the pytree node at {where} has node data of type "
        f"{type(x).__name__} ({_short_repr(x)}), which JSON cannot describe: only str, int, float, "
        "bool, None and tuples or lists of these are supported. Keep such nodes out of the tree, "
        "or pickle the Structure instead (trusted data only)."
    )


def _dict_keys(keys: Sequence[Any], where: str) -> list[Any]:
    for key in keys:
        if type(key) not in (str, int):
            raise TypeError(
                f"treeshape.Structure.to_json: the dict at {where} has a key {_short_repr(key)} of type "
                f"{type(key).__name__}; JSON can describe str and int keys only."
            )
    return list(keys)


def _callable_name(factory: Any, where: str) -> str:
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and _NAME.fullmatch(f"{module}:{qualname}"):
        return f"{module}:{qualname}"
    raise TypeError(
        f"treeshape.Structure.to_json: the defaultdict at {where} has the default factory "
        f"{_short_repr(factory)}, which has no module-level name; JSON can describe a named factory only."
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
    elif _is_namedtuple(node_type):
        entry = {"type": "namedtuple", "name": _type_name(node_type), "n": n}
    elif (described := _nodes.record(node_type, aux)) is not None:  # framework nodes and dataclasses, by name
        kind, parts = described
        written = _encode_parts(parts, where, node_type.__module__)
        entry = {"type": kind, "name": _type_name(node_type), "n": n, **written}
    elif isinstance(node_type, type) and dataclasses.is_dataclass(node_type):
        entry = {"type": "dataclass", "name": _type_name(node_type), "n": n, "aux": _plain_data(aux, where)}
    else:
        raise TypeError(
            f"treeshape.Structure.to_json: the pytree node at {where} is a {node_type.__qualname__}, which JSON "
            "cannot describe: only dicts (also OrderedDict and defaultdict), lists, tuples, None, namedtuples, "
            "dataclasses registered as pytree nodes (flax.struct too), flax.nnx modules, variables and states, "
            "and equinox modules and states are supported. Pickle the Structure instead (trusted data only)."
        )
    return _encode(entry)


def _encode_parts(parts: dict[str, Any], where: str, home: str) -> dict[str, Any]:
    """A framework node's parts (`_nodes.record`) as JSON: keys as they are, values by `_value`
    (`home`: the node class's module, whose globals may name its default values)."""
    out: dict[str, Any] = {}
    for part, value in parts.items():
        if part == "keys":
            out[part] = _dict_keys(value, where)
        elif part == "static":  # [[name, value], ...]: nnx names may be integers (an nnx.List's items)
            out[part] = [[name, _value(item, home)] for name, item in value]
        elif part == "fields":
            out[part] = {name: _value(item, home) for name, item in value.items()}
        elif part == "aux":
            out[part] = _plain_data(value, where)
        else:
            out[part] = _value(value, home)
    return out


def _value(x: Any, home: str = "") -> Any:
    """A node-data value as JSON: plain data as itself, tuples, lists and dicts tagged, a dtype by
    name, a function or class by `module:qualname`, anything else by its repr (no memory address)."""
    kind = type(x)
    if kind in (str, bool, type(None)) or (kind is int and abs(x) < _MAX_INT_VALUE):
        return x
    if kind is float and not math.isnan(x):  # NaN, equal to no other NaN, is kept by its repr (as below)
        return x if math.isfinite(x) else {"float": repr(x)}
    if kind is tuple or kind is list:
        return {kind.__name__: [_value(item, home) for item in x]}
    if kind is dict and all(type(k) in (str, int) for k in x):
        return {"dict": [[k, _value(v, home)] for k, v in x.items()]}
    if _nodes.is_frozen_dict(kind) and all(type(k) in (str, int) for k in x):
        return {"frozendict": [[k, _value(v, home)] for k, v in x.items()]}
    if isinstance(x, np.dtype) and jax_dtype(x):
        return {"dtype": _dtype_name(x)}
    if isinstance(x, enum.Enum) and kind.__members__.get(x.name) is x:
        enum_name = object_name(kind)  # `jax.lax.Precision.HIGHEST`: by its class's name and its own
        if enum_name is not None:
            return {"enum": enum_name, "member": x.name}
    name = object_name(x) or _global_name(x, home)
    if name is not None:
        return {"name": name}
    if kind is StaticRepr:
        return {"repr": x.text, "type": x.type_name}
    return {"repr": _nodes.static_text(x), "type": _type_name(kind)}


def object_name(x: Any) -> str | None:
    """`"module:qualname"` of a function or class where users import it from (`"jax.nn:gelu"`,
    as `_nodes.public_name` finds it) that this name finds again in `sys.modules` (so loading
    gives back the same object), else None."""
    found = _nodes.public_name(x)
    if found is None:
        return None
    name = ":".join(found)
    try:
        if _NAME.fullmatch(name) and _lookup(name, "") is x:
            return name
    except _Malformed:
        pass
    return None


def _global_name(x: Any, home: str) -> str | None:
    """`"home:name"` for a function that module `home` holds as a global (a class's default, such
    as flax.nnx.Linear's `default_kernel_init`, a closure with no name of its own), else None."""
    if not home or not callable(x) or isinstance(x, type):
        return None
    namespace = getattr(sys.modules.get(home), "__dict__", {})
    found = next((name for name, value in list(namespace.items()) if value is x), None)
    return f"{home}:{found}" if found is not None and _NAME.fullmatch(f"{home}:{found}") else None


def _child_keys(node: jtu.PyTreeDef, node_type: type, aux: Any, n: int, leaves: Sequence[Any], first: int) -> list[str]:
    """How `jax.tree_util.keystr` writes the key of each of the `n` children of `node` (node data
    `(node_type, aux)`, its leaves from `leaves[first]` on) in a path."""
    if node_type is list or node_type is tuple:
        return [f"[{i}]" for i in range(n)]
    if node_type is dict or node_type is collections.OrderedDict:
        return [f"[{key!r}]" for key in aux]
    if node_type is collections.defaultdict:
        return [f"[{key!r}]" for key in aux[1]]
    keys = _compat.namedtuple_keys(node_type)
    if keys is not None:
        return [jtu.keystr((key,)) for key in keys]
    split = _nodes.split(node_type, aux)  # a framework node names its children in its node data
    if split is not None and split.children is not None and len(split.children) == n:
        return [jtu.keystr((key,)) for key in split.children]
    # Any other node (a registered dataclass) names its children as its registration says.
    keyed, _ = _compat.flatten_one_level_with_keys(node.unflatten(leaves[first : first + node.num_leaves]))
    return [jtu.keystr((key,)) for key, _ in keyed]


class _Frame:
    """A node being written by `_walk`: its children still to write, where its own text and paths
    start, and its last child written whole (to copy it from when the next child is equal)."""

    __slots__ = ("children", "node", "path", "first_node", "first_path", "last")

    def __init__(self, children: Iterator[tuple[jtu.PyTreeDef, str]], node: Any, path: str, nodes: int, paths: int):
        self.children, self.node, self.path = children, node, path
        self.first_node, self.first_path = nodes, paths
        self.last: tuple[jtu.PyTreeDef, int, int, int, int, int] | None = None


def _same(a: jtu.PyTreeDef, b: jtu.PyTreeDef) -> bool:
    try:
        return bool(a == b)
    except Exception:  # node data whose `==` raises: write the subtree out (and report it there)
        return False


def _walk(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> tuple[list[str], list[str]]:
    """The nodes of `treedef` in pre-order, each as its JSON text, and every leaf's `keystr` path.

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
            if last is not None and _same(last[0], node):
                _, n0, n1, p0, p1, cut = last
                nodes.extend(nodes[n0:n1])
                paths.extend([path + p[cut:] for p in paths[p0:p1]])
                continue
            children = node.children()
            text = _encode_node(node_type, aux, len(children), path)  # raises for a node JSON cannot describe
            keys = _child_keys(node, node_type, aux, len(children), leaves, len(paths))
            child_paths = zip(children, [path + key for key in keys], strict=True)
            frames.append(_Frame(child_paths, node, path, len(nodes), len(paths)))
            nodes.append(text)
            break  # write its children first, then go on with its siblings
        else:
            frames.pop()
            if frames:  # `frame` is written: its parent's next child may be a copy of it
                end = (len(nodes), len(paths))
                frames[-1].last = (frame.node, frame.first_node, end[0], frame.first_path, end[1], len(frame.path))
    return nodes, paths


def _short_repr(x: Any) -> str:
    try:
        text = repr(x)
    except Exception:
        text = f"<{type(x).__name__} object>"
    return text if len(text) <= 60 else text[:57] + "..."


def _dtype_name(dtype: Any) -> str:
    if jnp.issubdtype(dtype, jax.dtypes.extended):
        return str(dtype)
    return str(np.dtype(dtype).name)


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
        "dtype": _dtype_name(leaf.dtype),
        "weak_type": bool(leaf.weak_type),
    }
    sharding = _sharding_record(leaf.sharding)
    if sharding is not None:
        record["sharding"] = sharding
    vma = _vma_record(leaf)
    if vma is not None:
        record["vma"] = vma
    return record


def _static_record(path: str, leaf: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"path": path, "shape": None, "dtype": None, "weak_type": None}
    if type(leaf) is StaticRepr:
        return {**record, "static": leaf.text, "type": leaf.type_name}
    record.update(static=_nodes.static_text(leaf), type=_type_name(type(leaf)))
    name = object_name(leaf)
    if name is not None:  # a function or class: found again by this name when loading, if imported
        record["name"] = name
    kind = type(leaf)
    if (
        kind in (str, bool, type(None))
        or (kind is int and abs(leaf) < _MAX_INT_VALUE)
        or (kind is float and math.isfinite(leaf))
    ):
        record["value"] = leaf
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
        {"path": path, **_array_record(leaf)} if isinstance(leaf, jax.ShapeDtypeStruct) else _static_record(path, leaf)
        for path, leaf in zip(paths, leaves, strict=True)
    ]


def _leaf_lines(paths: Sequence[str], leaves: Sequence[Any]) -> list[str]:
    """The JSON text of each leaf's record, as `json.dumps` writes the records of `leaf_records`.

    The common leaf, an array with no `NamedSharding` and no manual axes, is
    written straight from its shape, dtype and weak flag.
    """
    dtype_names: dict[Any, str] = {}  # dtype -> its name as a JSON string
    lines: list[str] = []
    for path, leaf in zip(paths, leaves, strict=True):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            lines.append(_encode(_static_record(path, leaf)))
        elif _compat.manual_axes(leaf) is None and not isinstance(leaf.sharding, jax.sharding.NamedSharding):
            dtype = leaf.dtype
            name = dtype_names.get(dtype)
            if name is None:
                name = dtype_names[dtype] = _encode(_dtype_name(dtype))
            shape = ", ".join([_encode(str(d)) if is_symbolic(d) else str(int(d)) for d in leaf.shape])
            weak = "true" if leaf.weak_type else "false"
            lines.append(f'{{"path": {_encode(path)}, "shape": [{shape}], "dtype": {name}, "weak_type": {weak}}}')
        else:
            lines.append(_encode({"path": path, **_array_record(leaf)}))
    return lines


def dumps(treedef: jtu.PyTreeDef, leaves: Sequence[Any], paths: Sequence[str] | None = None) -> str:
    """The JSON document for a treedef and its leaf descriptions (one node or leaf per line).

    `paths` are the leaves' `keystr` paths when the caller knows them; else
    they are found while the treedef is written, which costs no more.
    """
    nodes, walked = _walk(treedef, leaves)
    leaf_lines = _leaf_lines(walked if paths is None else paths, leaves)
    node_text = ",\n    ".join(nodes)
    leaf_text = ",\n    ".join(leaf_lines)
    constraints = _constraints(leaves)
    return (
        "{\n"
        f'  "version": {VERSION},\n'
        + ("" if constraints is None else f'  "constraints": {_encode(constraints)},\n')
        + f'  "treedef": [\n    {node_text}\n  ],\n'
        f'  "leaves": [{f"{chr(10)}    {leaf_text}{chr(10)}  " if leaf_lines else ""}]\n'
        "}\n"
    )


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
class _Malformed(Exception):
    """Raised inside the decoder; `loads` turns it into one ValueError."""


def _fail(where: str, message: str) -> NoReturn:
    raise _Malformed(f"{where}: {message}")


def _reject_constant(name: str) -> NoReturn:
    raise _Malformed(f"{name} is not valid JSON")


def _get(record: dict[str, Any], key: str, where: str) -> Any:
    if key not in record:
        _fail(where, f"missing the key {key!r}")
    return record[key]


def _int(x: Any, where: str, low: int = 0, high: int = _MAX_DIM) -> int:
    if type(x) is not int or not low <= x <= high:
        _fail(where, f"expected an integer in [{low}, {high}], got {_short_repr(x)}")
    return int(x)


def _str(x: Any, where: str) -> str:
    if type(x) is not str:
        _fail(where, f"expected a string, got {_short_repr(x)}")
    return str(x)


def _list(x: Any, where: str) -> list[Any]:
    if type(x) is not list:
        _fail(where, f"expected a list, got {_short_repr(x)}")
    return list(x)


def _str_list(x: Any, where: str, unique: bool = True) -> list[str]:
    items = [_str(item, f"{where}[{i}]") for i, item in enumerate(_list(x, where))]
    if unique and len(set(items)) != len(items):
        _fail(where, f"names must be unique, got {_short_repr(items)}")
    return items


def _lookup(name: Any, where: str) -> Any:
    """The object named `"module:qualname"`, from a module that is already imported."""
    text = _str(name, where)
    if not _NAME.fullmatch(text):
        _fail(where, f"expected a name 'module:qualname', got {_short_repr(text)}")
    module_name, qualname = text.split(":", 1)
    module = sys.modules.get(module_name)
    if module is None:
        _fail(
            where,
            f"{text} names the module {module_name!r}, which is not imported; import it before loading "
            "(treeshape never imports a module named in JSON)",
        )
    obj: Any = module
    for part in qualname.split("."):
        namespace: Any = getattr(obj, "__dict__", None)  # not getattr(obj, part): it may import
        if not isinstance(namespace, dict) and not hasattr(namespace, "get"):
            _fail(where, f"{text} is not defined in {module_name!r}")
        if part not in namespace:
            _fail(where, f"{text} is not defined in {module_name!r}")
        obj = namespace[part]
    return obj


def _lookup_type(name: Any, where: str) -> type:
    cls = _lookup(name, where)
    if not isinstance(cls, type) or _type_name(cls) != name:
        _fail(where, f"{name} is not a class defined under that name")
    return cls


def _data(x: Any, where: str) -> Any:
    """Decode a dataclass node's plain data (the inverse of `_plain_data`)."""
    if type(x) in (str, bool, int, float, type(None)):
        return x
    if type(x) is dict and len(x) == 1:
        [(tag, items)] = x.items()
        if tag in ("tuple", "list"):
            values = [_data(item, f"{where}[{i}]") for i, item in enumerate(_list(items, where))]
            return tuple(values) if tag == "tuple" else values
    return _fail(where, f"expected plain data (a JSON scalar or {{'tuple'|'list': [...]}}), got {_short_repr(x)}")


def _keys(x: Any, where: str, sort_as_jax: bool) -> list[Any]:
    keys = _list(x, where)
    for i, key in enumerate(keys):
        if type(key) not in (str, int):
            _fail(f"{where}[{i}]", f"dict keys must be strings or integers, got {_short_repr(key)}")
    if len(set(keys)) != len(keys):
        _fail(where, "dict keys must be unique")
    if sort_as_jax:
        try:
            order = sorted(keys)  # JAX orders a dict's keys with Python's own sort
        except TypeError:  # keys JAX cannot sort (strings mixed with integers)
            _fail(where, "JAX cannot order these dict keys (strings mixed with integers)")
        if order != keys:
            _fail(where, f"dict keys must be in JAX's sorted order, {_short_repr(order)}")
    return keys


def _dict_child_keys(keys: Sequence[Any]) -> list[str]:
    return [f"[{key!r}]" for key in keys]


def _node(entry: Any, where: str) -> tuple[Any, int, list[str] | None]:
    """`(node_data, number of children, each child's key as a path writes it)` of one `treedef`
    entry; node_data and keys None is a leaf."""
    if entry == _LEAF and type(entry) is str:
        return None, 0, None
    if entry is None:
        return (type(None), None), 0, []
    if type(entry) is not dict:
        return _fail(where, f"expected '*', null or a node object, got {_short_repr(entry)}")
    kind = _get(entry, "type", where)
    if kind in ("list", "tuple"):
        n = _int(_get(entry, "n", where), f"{where}.n")
        return ((list if kind == "list" else tuple), None), n, [f"[{i}]" for i in range(n)]
    if kind == "dict":
        keys = _keys(_get(entry, "keys", where), f"{where}.keys", sort_as_jax=True)
        return (dict, keys), len(keys), _dict_child_keys(keys)
    if kind == "OrderedDict":
        keys = _keys(_get(entry, "keys", where), f"{where}.keys", sort_as_jax=False)
        return (collections.OrderedDict, tuple(keys)), len(keys), _dict_child_keys(keys)
    if kind == "defaultdict":
        keys = _keys(_get(entry, "keys", where), f"{where}.keys", sort_as_jax=True)
        factory_name = _get(entry, "factory", where)
        factory = None if factory_name is None else _lookup(factory_name, f"{where}.factory")
        if factory is not None and not callable(factory):
            _fail(f"{where}.factory", f"{factory_name} is not callable")
        return (collections.defaultdict, (factory, tuple(keys))), len(keys), _dict_child_keys(keys)
    if kind == "namedtuple":
        cls = _lookup_type(_get(entry, "name", where), f"{where}.name")
        if not _is_namedtuple(cls):
            _fail(f"{where}.name", f"{_type_name(cls)} is not a namedtuple class")
        n = _int(_get(entry, "n", where), f"{where}.n")
        fields = cls._fields  # type: ignore[attr-defined]
        if n != len(fields):
            _fail(f"{where}.n", f"{_type_name(cls)} has {len(fields)} fields, not {n}")
        return (cls, None), n, [f".{name}" for name in fields]
    if kind == "dataclass" and "fields" not in entry:  # node data as a tuple (written before fields by name)
        cls = _lookup_type(_get(entry, "name", where), f"{where}.name")
        if not dataclasses.is_dataclass(cls):
            _fail(f"{where}.name", f"{_type_name(cls)} is not a dataclass")
        aux = _data(_get(entry, "aux", where), f"{where}.aux")
        n = _int(_get(entry, "n", where), f"{where}.n")
        return (cls, aux), n, _check_dataclass_node(cls, aux, n, where)
    if kind in _FRAMEWORK_KINDS:
        return _framework_node(kind, entry, where)
    return _fail(f"{where}.type", f"unknown node type {_short_repr(kind)}")


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


def _framework_node(kind: str, entry: dict[str, Any], where: str) -> tuple[Any, int, list[str]]:
    """A node whose data `_nodes` writes by name (a flax.nnx or equinox module, a registered
    dataclass): its values decoded here, its node data rebuilt and checked by `_nodes`."""
    cls = _lookup_type(_get(entry, "name", where), f"{where}.name")
    n = _int(_get(entry, "n", where), f"{where}.n")
    parts: dict[str, Any] = {}
    for part in _PARTS[kind]:
        at = f"{where}.{part}"
        if part == "wrapper":
            if part in entry:
                parts[part] = _decode_value(entry[part], at)
        elif part == "keys":
            parts[part] = _list(_get(entry, part, where), at)
        elif part == "static":
            pairs = _list(_get(entry, part, where), at)
            parts[part] = [list(_pair(pair, f"{at}[{i}]")) for i, pair in enumerate(pairs)]
        elif part == "fields":
            fields = _get(entry, part, where)
            if type(fields) is not dict:
                _fail(at, f"expected an object, got {_short_repr(fields)}")
            parts[part] = {name: _decode_value(value, f"{at}.{name}") for name, value in fields.items()}
        else:
            parts[part] = _data(_get(entry, part, where), at)
    try:
        aux, keys = _nodes.rebuild(kind, cls, parts, n)
    except (ValueError, TypeError, KeyError) as err:
        _fail(where, f"cannot rebuild this {_type_name(cls)}: {err}")
    return (cls, aux), n, [jtu.keystr((key,)) for key in keys]


def _pair(x: Any, where: str) -> tuple[Any, Any]:
    """A `[name, value]` pair of an nnx node's static attributes, its value decoded."""
    if type(x) is not list or len(x) != 2:
        _fail(where, f"expected [name, value], got {_short_repr(x)}")
    return x[0], _decode_value(x[1], f"{where}[1]")


def _decode_value(x: Any, where: str) -> Any:
    """A node-data value written by `_value`: nothing is evaluated, a name is looked up among the
    modules already imported, and a value kept by its repr comes back as a `StaticRepr`."""
    if type(x) in (str, bool, int, float, type(None)):
        return x
    if type(x) is dict and set(x) == {"repr", "type"}:
        type_name = _str(x["type"], f"{where}.type")
        if not _NAME.fullmatch(type_name):
            _fail(f"{where}.type", f"expected a name 'module:qualname', got {_short_repr(type_name)}")
        return StaticRepr(type_name, _str(x["repr"], f"{where}.repr"))
    if type(x) is dict and set(x) == {"enum", "member"}:
        return _enum_member(x["enum"], x["member"], where)
    if type(x) is dict and len(x) == 1:
        [(tag, value)] = x.items()
        if tag in ("tuple", "list"):
            items = [_decode_value(item, f"{where}[{i}]") for i, item in enumerate(_list(value, f"{where}.{tag}"))]
            return tuple(items) if tag == "tuple" else items
        if tag in ("dict", "frozendict"):
            at = f"{where}.{tag}"
            pairs = [_dict_item(item, f"{at}[{i}]") for i, item in enumerate(_list(value, at))]
            if len({(type(k), k) for k, _ in pairs}) != len(pairs):
                _fail(at, "dict keys must be unique")
            return dict(pairs) if tag == "dict" else _frozen_dict(pairs, at)
        if tag == "float" and value in ("inf", "-inf"):
            return float(value)
        if tag == "dtype":
            return _dtype(value, f"{where}.dtype")
        if tag == "name":
            return _named(value, f"{where}.name")
    return _fail(where, f"expected a value as to_json writes node data, got {_short_repr(x)}")


def _enum_member(name: Any, member: Any, where: str) -> Any:
    """The member `member` of the enum class `name`, from a module already imported (read from
    the class's members: no code runs)."""
    cls = _lookup(name, f"{where}.enum")
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        _fail(f"{where}.enum", f"{name} is not an enum class")
    found = cls.__members__.get(_str(member, f"{where}.member"))
    if found is None:
        _fail(f"{where}.member", f"{name} has no member {_short_repr(member)}")
    return found


def _frozen_dict(pairs: list[tuple[Any, Any]], where: str) -> Any:
    """A flax `FrozenDict` of these items (node data of a flax model, which has imported flax)."""
    frozen_dict = _nodes.frozen_dict_type()
    if frozen_dict is None:
        _fail(where, "a flax FrozenDict, but flax.core is not imported; import it before loading")
    return frozen_dict(dict(pairs))


def _named(name: Any, where: str) -> Any:
    """The function or class `name` (`"module:qualname"`, or `"module:global"` for a lambda bound
    to a module global), from a module already imported."""
    found = _lookup(name, where)
    if not (callable(found) or isinstance(found, type)):
        _fail(where, f"{name} is not a function or class")
    return found


def _dict_item(x: Any, where: str) -> tuple[Any, Any]:
    if type(x) is not list or len(x) != 2 or type(x[0]) not in (str, int):
        _fail(where, f"expected [key, value] with a string or integer key, got {_short_repr(x)}")
    return x[0], _decode_value(x[1], f"{where}[1]")


def _check_dataclass_node(cls: type, aux: Any, n: int, where: str) -> list[str]:
    """Check a dataclass node's arity and node data against the registration, before JAX sees them;
    its children's keys, as a path writes them.

    JAX's own unflatten of a dataclass node trusts both (and may crash on a
    wrong count), so they are compared with the node JAX makes for a probe
    instance: built without calling `__init__`, every field set to `None`.
    The probe's children are named as the registration names them.
    """
    try:
        probe: Any = object.__new__(cls)
        for field in dataclasses.fields(cls):
            object.__setattr__(probe, field.name, None)
        probe_def: jtu.PyTreeDef = jtu.tree_structure(probe)
    except Exception as err:
        _fail(f"{where}.name", f"cannot check the pytree dataclass {_type_name(cls)}: {type(err).__name__}: {err}")
    if probe_def.num_nodes == 1 and probe_def.num_leaves == 1:
        _fail(f"{where}.name", f"{_type_name(cls)} is not registered as a pytree node")
    probe_type, probe_aux = probe_def.node_data()
    if probe_type is not cls:
        _fail(f"{where}.name", f"{_type_name(cls)} does not flatten to a node of its own type")
    expected_n = len(probe_def.children())
    if n != expected_n:
        _fail(f"{where}.n", f"{_type_name(cls)} has {expected_n} pytree children, not {n}")
    same_kind = type(aux) is type(probe_aux)
    if not same_kind or (isinstance(aux, (tuple, list)) and len(aux) != len(probe_aux)):
        _fail(f"{where}.aux", f"{_type_name(cls)} has node data like {_short_repr(probe_aux)}, not {_short_repr(aux)}")
    keyed, _ = _compat.flatten_one_level_with_keys(probe)
    return [jtu.keystr((key,)) for key, _ in keyed]


def _decode_treedef(entries: Any) -> tuple[jtu.PyTreeDef, list[str]]:
    """Rebuild a treedef from its pre-order node list, bottom-up with an explicit stack; and the
    `keystr` path of each of its leaves, in leaf order."""
    nodes = _list(entries, "treedef")
    if not nodes:
        _fail("treedef", "expected at least one node")
    # Pre-order with known arities: read every node, then build from the last one back.
    parsed = [_node(entry, f"treedef[{i}]") for i, entry in enumerate(nodes)]
    # JAX flattens (and so rebuilds paths for) trees only as deep as Python's recursion limit,
    # and deeper ones can crash its C++ code: refuse them before building anything deep.
    max_depth = sys.getrecursionlimit()
    built: list[tuple[jtu.PyTreeDef, int]] = []  # finished subtrees and their depths, the next on top
    for i in range(len(parsed) - 1, -1, -1):
        node_data, n, _ = parsed[i]
        if node_data is None:
            built.append((_LEAF_TREEDEF, 1))
            continue
        if n > len(built):
            _fail(f"treedef[{i}]", f"the node has {n} children but only {len(built)} nodes follow it")
        children = [built.pop() for _ in range(n)]
        depth = 1 + max((d for _, d in children), default=0)
        if depth > max_depth:
            _fail("treedef", f"the tree is nested more deeply than JAX can flatten ({max_depth} levels)")
        try:
            node = jtu.PyTreeDef.from_node_data_and_children(
                jtu.default_registry, node_data, [child for child, _ in children]
            )
        except (RuntimeError, TypeError, ValueError) as err:
            _fail(f"treedef[{i}]", f"cannot rebuild this node: {err}")
        built.append((node, depth))
    if len(built) != 1:
        _fail("treedef", f"the nodes form {len(built)} trees, not one (a count `n` or a key list is wrong)")
    # The paths, top-down in pre-order: the paths of the nodes still to come, the next on top.
    paths: list[str] = []
    pending = [""]
    for _, _, keys in parsed:
        path = pending.pop()
        if keys is None:
            paths.append(path)
        else:
            pending.extend([path + key for key in reversed(keys)])
    return built[0][0], paths


_dtype_table: dict[str, Any] = {}


def _dtypes() -> dict[str, Any]:
    """Every dtype name JAX can hold: NumPy and ml_dtypes types, and the built-in PRNG key types."""
    if not _dtype_table:
        table: dict[str, Any] = {}
        for name in dir(jnp):
            obj = getattr(jnp, name)
            dtype = getattr(obj, "dtype", None)
            if isinstance(obj, type) and isinstance(dtype, np.dtype) and dtype.kind != "O":
                table[dtype.name] = dtype
        table.update(key_dtypes())
        _dtype_table.update(table)
    return _dtype_table


def _dtype(x: Any, where: str) -> Any:
    name = _str(x, where)
    dtype = _dtypes().get(name)
    if dtype is None and _NUMERIC_NAME.fullmatch(name):
        try:  # other NumPy numeric types (e.g. float128); the regex keeps out dtype mini-languages
            candidate = np.dtype(name)
        except TypeError:
            candidate = None
        if candidate is not None and candidate.name == name and candidate.kind in "biufc":
            dtype = candidate
    if dtype is None and _KEY_NAME.fullmatch(name):
        try:  # a key type of a release newer than this one: say which
            key_dtype(name[4:-1])
        except _compat.JaxReleaseError as err:
            _fail(where, str(err))
        except ValueError:
            pass
    if dtype is None:
        _fail(where, f"unknown dtype {_short_repr(name)}")
    return dtype


def _bool(x: Any, where: str) -> bool:
    if type(x) is not bool:
        _fail(where, f"expected true or false, got {_short_repr(x)}")
    return bool(x)


def _sharding(x: Any, where: str) -> Any:
    if type(x) is not dict:
        return _fail(where, f"expected an object, got {_short_repr(x)}")
    mesh = _get(x, "mesh", where)
    if type(mesh) is not dict:
        _fail(f"{where}.mesh", f"expected an object, got {_short_repr(mesh)}")
    names = _str_list(_get(mesh, "axis_names", f"{where}.mesh"), f"{where}.mesh.axis_names")
    sizes = [
        _int(s, f"{where}.mesh.axis_sizes[{i}]", low=1)
        for i, s in enumerate(_list(_get(mesh, "axis_sizes", f"{where}.mesh"), f"{where}.mesh.axis_sizes"))
    ]
    types = _str_list(_get(mesh, "axis_types", f"{where}.mesh"), f"{where}.mesh.axis_types", unique=False)
    if not len(names) == len(sizes) == len(types):
        _fail(f"{where}.mesh", "axis_names, axis_sizes and axis_types must have the same length")
    kinds = {kind.name: kind for kind in jax.sharding.AxisType}
    for i, t in enumerate(types):
        if t not in kinds:
            _fail(f"{where}.mesh.axis_types[{i}]", f"expected one of {sorted(kinds)}, got {_short_repr(t)}")
    entries: list[Any] = []
    for i, entry in enumerate(_list(_get(x, "spec", where), f"{where}.spec")):
        at = f"{where}.spec[{i}]"
        if entry is None:
            entries.append(None)
        elif type(entry) is dict and entry == {"unconstrained": True}:
            entries.append(jax.sharding.PartitionSpec.UNCONSTRAINED)
        elif type(entry) is list:
            entries.append(tuple(_str_list(entry, at)))
        else:
            entries.append(_str(entry, at))
    extra = {
        field: frozenset(_str_list(x[field], f"{where}.{field}")) for field in ("unreduced", "reduced") if field in x
    }
    try:
        abstract = jax.sharding.AbstractMesh(tuple(sizes), tuple(names), axis_types=tuple(kinds[t] for t in types))
        return jax.sharding.NamedSharding(abstract, jax.sharding.PartitionSpec(*entries, **extra))
    except (ValueError, TypeError) as err:
        return _fail(where, f"not a valid sharding: {err}")


def _vma(x: Any, where: str) -> Any:
    if type(x) is not dict:
        return _fail(where, f"expected an object, got {_short_repr(x)}")
    sets = {
        field: frozenset(_str_list(_get(x, field, where), f"{where}.{field}"))
        for field in ("varying", "unreduced", "reduced")
    }
    try:
        return _compat.make_manual_axes(**sets)
    except ValueError as err:
        return _fail(where, f"not valid manual axes: {err}")
    except _compat.JaxReleaseError as err:
        return _fail(where, str(err))


def _static(record: dict[str, Any], where: str) -> Any:
    for field in ("shape", "dtype", "weak_type"):
        if record.get(field) is not None:
            _fail(f"{where}.{field}", "a static leaf has no shape, dtype or weak_type (expected null)")
    text = _str(_get(record, "static", where), f"{where}.static")
    type_name = _str(_get(record, "type", where), f"{where}.type")
    if "value" in record:
        value = record["value"]
        expected = {
            "builtins:str": str,
            "builtins:int": int,
            "builtins:float": float,
            "builtins:bool": bool,
            "builtins:NoneType": type(None),
        }.get(type_name)
        if expected is None or type(value) is not expected:
            _fail(f"{where}.value", f"a value of type {type_name} cannot be {_short_repr(value)}")
        return value
    if type_name == "builtins:float" and text in ("nan", "inf", "-inf"):
        return float(text)
    if "name" in record:  # a function or class: itself if its module is imported, else known by its repr
        try:
            return _named(record["name"], f"{where}.name")
        except _Malformed:
            if not _NAME.fullmatch(_str(record["name"], f"{where}.name")):
                raise
    return StaticRepr(type_name, text)


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
            written = [] if self.constraints is None else _str_list(self.constraints, "constraints", unique=False)
            try:
                unsatisfiable = _compat.unsatisfiable_constraint(written)
                self.scope = _compat.make_scope(written)
            except Exception as err:  # JAX's parser: ValueError, or tokenize's TokenError
                _fail("constraints", f"not valid constraints of a symbolic scope: {err}")
            if unsatisfiable is not None:
                before = written[: written.index(unsatisfiable)]
                together = f" together with {', '.join(map(repr, before))}" if before else ""
                _fail(
                    "constraints",
                    f"no size satisfies {unsatisfiable!r}{together} (dimension variables are >= 1), so no array "
                    "has these shapes: correct or remove that constraint",
                )
        try:
            d = _compat.parse_dim(text, self.scope)
        except ValueError as err:
            _fail(where, str(err))
        if not is_symbolic(d) and not 0 <= d <= _MAX_DIM:
            _fail(where, f"expected a size >= 0, got {_short_repr(text)}")
        if is_symbolic(d) and _compat.always_negative(d):
            listed = ", ".join(_compat.scope_constraints(self.scope))
            allowed = f" the constraints allow ({listed}; " if listed else " ("
            _fail(
                where,
                f"the dimension {text!r} is below 0 for every size{allowed}dimension variables are >= 1), so no "
                "array has this shape: a dimension is a size >= 0",
            )
        self.read_texts[text] = d
        return d


def _leaf(record: Any, where: str, dims: _Dims) -> Any:
    if type(record) is not dict:
        return _fail(where, f"expected an object, got {_short_repr(record)}")
    _str(_get(record, "path", where), f"{where}.path")
    if "static" in record:
        return _static(record, where)
    shape = tuple(
        dims.read(d, f"{where}.shape[{i}]") if type(d) is str else _int(d, f"{where}.shape[{i}]")
        for i, d in enumerate(_list(_get(record, "shape", where), f"{where}.shape"))
    )
    dtype = _dtype(_get(record, "dtype", where), f"{where}.dtype")
    weak = _bool(_get(record, "weak_type", where), f"{where}.weak_type")
    sharding = _sharding(record["sharding"], f"{where}.sharding") if record.get("sharding") is not None else None
    vma = _vma(record["vma"], f"{where}.vma") if record.get("vma") is not None else None
    problem = extent_problem(shape, dtype)  # XLA would abort the process on such a leaf
    if problem is not None:
        _fail(f"{where}.shape", f"the leaf at {record['path']} {problem}, the most that XLA's 64-bit sizes hold")
    leaf = _compat.shape_dtype_struct(shape, dtype, weak_type=weak, sharding=sharding, manual_axes=vma)
    problem = _split_problem(leaf) if sharding is not None and any(map(is_symbolic, shape)) else None
    if problem is not None:  # as `with_shardings` checks a sharding
        _fail(f"{where}.sharding", f"it does not fit the leaf at {record['path']} ({leaf_str(leaf)}): {problem}")
    return leaf


def _plain_type(record: Any) -> tuple[tuple[int | str, ...], str, bool] | None:
    """`(shape, dtype name, weak_type)` of the record of an array leaf with no sharding and no manual
    axes whose fields have the right JSON types; else None. Their values are checked by `_leaf`."""
    if type(record) is not dict or "static" in record or type(record.get("path")) is not str:
        return None
    if record.get("sharding") is not None or record.get("vma") is not None:
        return None
    shape, dtype, weak = record.get("shape"), record.get("dtype"), record.get("weak_type")
    if type(shape) is not list or type(dtype) is not str or type(weak) is not bool:
        return None
    for d in shape:
        if type(d) is not int and type(d) is not str:
            return None
    return tuple(shape), dtype, weak


def _leaves(records: list[Any], dims: _Dims) -> tuple[Any, ...]:
    """The leaf descriptions of `records`. Plain array leaves of one type share one (immutable)
    `ShapeDtypeStruct`, checked once: a big tree has few leaf types."""
    made: dict[tuple[tuple[int | str, ...], str, bool], Any] = {}
    out: list[Any] = []
    for i, record in enumerate(records):
        key = _plain_type(record)
        if key is None:
            out.append(_leaf(record, f"leaves[{i}]", dims))
            continue
        leaf = made.get(key)
        if leaf is None:
            leaf = made[key] = _leaf(record, f"leaves[{i}]", dims)
        out.append(leaf)
    return tuple(out)


def _check_rebuilds(treedef: jtu.PyTreeDef) -> None:
    """The tree can be rebuilt from its treedef: JAX's unflatten calls the constructors of its
    namedtuple and dataclass nodes, which may reject placeholder leaves."""
    try:
        treedef.unflatten(range(treedef.num_leaves))
    except (RecursionError, SystemError):  # JAX's own depth limit (raised from its C++ code)
        _fail("treedef", "the tree is nested more deeply than JAX can flatten")
    except Exception as err:  # a dataclass whose __init__ rejects placeholder leaves
        _fail("treedef", f"the tree cannot be rebuilt: {type(err).__name__}: {err}")


def _decode(text: str | bytes | bytearray) -> tuple[jtu.PyTreeDef, tuple[Any, ...]]:
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise _Malformed(f"not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise _Malformed(f"not valid UTF-8 text: {err}") from None
    if type(doc) is not dict:
        _fail("the document", f"expected a JSON object, got {_short_repr(doc)}")
    version = _get(doc, "version", "the document")
    if type(version) is not int or version != VERSION:
        _fail(
            "version",
            f"this treeshape reads version {VERSION}, got {_short_repr(version)} (written by another "
            "treeshape release? regenerate the file with this one)",
        )
    treedef, paths = _decode_treedef(_get(doc, "treedef", "the document"))
    records = _list(_get(doc, "leaves", "the document"), "leaves")
    if len(records) != treedef.num_leaves:
        _fail("leaves", f"the treedef has {treedef.num_leaves} leaves, but there are {len(records)} records")
    leaves = _leaves(records, _Dims(doc.get("constraints")))
    _check_rebuilds(treedef)
    # Each record's `path` is where the treedef puts that leaf (a hand-edited file may disagree).
    for i, (path, record) in enumerate(zip(paths, records, strict=True)):
        if record["path"] != path:
            _fail(f"leaves[{i}].path", f"the treedef puts leaf {i} at {path!r}, not {_short_repr(record['path'])}")
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
    except _Malformed as err:
        raise ValueError(f"{_WHO}: {err}") from None
    except RecursionError:
        raise ValueError(f"{_WHO}: the JSON is nested too deeply") from None
    except MemoryError:
        raise ValueError(f"{_WHO}: the JSON is too large to load") from None


# The public classes report module `treeshape`, so doctest would not look for their examples here.
