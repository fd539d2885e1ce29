"""Reading a Structure's JSON document (`Structure.from_json`): the format is `_json`'s docstring.

Loading is safe for untrusted text: every field is checked and anything
malformed raises `ValueError` naming where and what; nothing is evaluated,
and no module is imported (named types are looked up in modules already in
`sys.modules`). The values inside the document (node data, static leaves)
are read by `_json_values`.
"""

import collections
import dataclasses
import functools
import itertools
import json
import marshal
import operator
import re
import sys
from collections.abc import Callable
from typing import Any, Final, NoReturn

import jax
import jax.tree_util as jtu

from . import _compat, _json, _nodes, _tree
from ._json import LEAF, VERSION
from ._json_values import (
    MAX_DIM,
    Malformed,
    decode,
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
    type_name,
)
from ._leaf import leaf_str
from ._shapes import extent_problem, is_symbolic
from ._sharding import split_problem as _split_problem


_WHO: Final = "treeshape.Structure.from_json"
_LEAF_TREEDEF: Final = jtu.tree_structure(0)
# Each array record's text but for its path, which tells kinds of leaf apart (`_leaves`).
_kind_text: Final = json.JSONEncoder(sort_keys=True, default=repr).encode  # `repr`: a `_LongInt`


def _reject_constant(name: str) -> NoReturn:
    raise Malformed(f"{name} is not valid JSON")


class _LongInt:
    """An integer of the document of more digits than Python converts (`sys.set_int_max_str_digits`):
    no field takes it, and each says so, naming the field."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _int(text: str) -> int | _LongInt:
    try:
        return int(text)
    except ValueError:
        return _LongInt(len(text.lstrip("-")))


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


def _factory(name: Any, where: str) -> type:
    """A defaultdict's default factory: a class found by name, never any other callable (a
    loaded tree calls it on a missing key: a document must install no code)."""
    factory = lookup(name, where)
    if not isinstance(factory, type):
        fail(
            where,
            f"{name} names a {type(factory).__name__}, not a class: a defaultdict's factory is read only as a class "
            "(such as builtins:list), never another callable, since the loaded tree would call it",
        )
    if type_name(factory) != name:
        fail(where, f"{name} is not a class defined under that name")
    return factory


def _node(entry: Any, where: str) -> tuple[Any, int, list[Any] | None]:
    """`(node_data, number of children, each child's key)` of one `treedef` entry; node_data and
    keys None is a leaf."""
    if entry == LEAF and type(entry) is str:
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
        factory = None if factory_name is None else _factory(factory_name, f"{where}.factory")
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
    elif kind == "static":  # a node with no children, its node data known by its text
        cls = lookup_type(get(entry, "name", where), f"{where}.name")
        data = decode(get(entry, "data", where), f"{where}.data")
        if type(data) is not _tree.StaticRepr:
            fail(f"{where}.data", f"expected a value's text {{'repr', 'type'}}, got {short_repr(data)}")
        return (cls, data), 0, []
    elif type(kind) is str and kind in _nodes.PARTS:  # (a list from the text would not hash)
        return _framework_node(kind, entry, where)
    else:
        return fail(f"{where}.type", f"unknown node type {short_repr(kind)}")
    return node_data, n, _tree.node_keys(node_data[0], node_data[1], n)


def _framework_node(kind: str, entry: dict[str, Any], where: str) -> tuple[Any, int, list[Any]]:
    """A node whose data `_nodes` writes by name (a flax.nnx or equinox module, a registered
    dataclass): its values decoded here, its node data rebuilt and checked by `_nodes`."""
    cls = lookup_type(get(entry, "name", where), f"{where}.name")
    n = read_int(get(entry, "n", where), f"{where}.n")
    parts: dict[str, Any] = {}
    for part in _nodes.PARTS[kind]:
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

    def paths(self, root: int, head: str = "") -> list[str]:
        """The path of every leaf of subtree `root`, in order, each after `head` (iterative: no depth limit)."""
        known = self.built[root][2]
        if known is not None:
            return list(map(head.__add__, known)) if head else known
        out: list[str] = []
        frames = [(iter(zip(*self.links[root], strict=True)), head)]
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


def _parse(entry: Any, where: str, most: int) -> _Parsed:
    """One `treedef` entry of a list of `most + 1`: no node has more children than the list has
    other entries, which is checked before anything of that size is built."""
    n = entry.get("n") if type(entry) is dict else None
    if type(n) is int and n > most:
        fail(f"{where}.n", f"the node claims {n} children, but only {most} nodes follow it in the treedef at most")
    node_data, n, keys = _node(entry, where)
    return node_data, n, None if keys is None else [_tree.key_text(key) for key in keys]


def _decode_treedef(entries: Any) -> tuple[jtu.PyTreeDef, Callable[[str], list[str]], bool]:
    """Rebuild a treedef from its pre-order node list (`_rebuild`), each distinct entry read once."""
    nodes = read_list(entries, "treedef")
    if not nodes:
        fail("treedef", "expected at least one node")
    ids = _ids(nodes)
    first = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))  # each distinct entry's first index
    distinct: dict[Any, int] = {}
    parsed: list[_Parsed] = []
    for text, i in sorted(first.items(), key=operator.itemgetter(1)):  # in order: the first error is reported
        distinct[text] = len(parsed)
        parsed.append(_parse(nodes[i], f"treedef[{i}]", len(nodes) - 1))
    return _rebuild(parsed, list(map(distinct.__getitem__, ids)))


def _rebuild(parsed: list[_Parsed], order: list[int]) -> tuple[jtu.PyTreeDef, Callable[[str], list[str]], bool]:
    """The treedef whose pre-order entries are `order` (each an index into the distinct entries
    `parsed`); the paths of its leaves in leaf order, each after a given head; and whether
    rebuilding the tree from the treedef could still fail (`_check_rebuilds`).

    A big tree repeats its nodes and subtrees (a model's layers): each distinct
    subtree is built once.
    """
    trees = _Subtrees(parsed)
    try:
        root = _top_down(order, trees)
    except Malformed:
        root = None
    if root is None:
        root = _bottom_up(order, trees)
    treedef, depth, _ = trees.built[root]
    builtin = all(data is None or data[0] in _BUILTIN_NODES for data, _, _ in parsed)
    return treedef, functools.partial(trees.paths, root), not (builtin and depth <= _SHALLOW)


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


def _refuse_long_literal(text: str, where: str) -> None:
    """Refuses an expression holding an integer of more digits than Python converts (JAX's
    parser would call it a syntax error and echo all of it)."""
    limit = sys.get_int_max_str_digits() or sys.maxsize
    for digits in re.findall(r"(?<![A-Za-z_0-9])[0-9]+", text):
        if len(digits) > limit:
            fail(where, f"{short_repr(text)} holds an integer of {len(digits)} digits (a size is at most 2**63 - 1)")


class _Dims:
    """The document's symbolic scope, made on first use from its `"constraints"`, in which
    every dimension written as a string is read (each distinct text once)."""

    def __init__(self, constraints: Any) -> None:
        self.constraints = constraints
        self.scope: Any = None
        self.read_texts: dict[str, Any] = {}

    def read(self, text: str, where: str, path: str) -> Any:
        """Dimension `text` (at `where`, of the leaf at `path`), read in the document's scope."""
        d = self.read_texts.get(text)
        if d is not None:
            return d
        if self.scope is None:
            written = [] if self.constraints is None else read_str_list(self.constraints, "constraints", unique=False)
            for constraint in written:
                _refuse_long_literal(constraint, "constraints")
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
            beyond = _compat.constraint_beyond(written, MAX_DIM)
            if beyond is not None:
                fail(
                    "constraints",
                    f"only sizes beyond {MAX_DIM} (2**63 - 1) satisfy {beyond!r}, and XLA's sizes are 64-bit "
                    "integers, so no array has these shapes: correct or remove that constraint",
                )
            self.scope = scope
        _refuse_long_literal(text, where)
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
                f"the leaf at {path} has the dimension {text!r}, which is below 0 for every size{allowed}dimension "
                "variables are >= 1), so no array has this shape: a dimension is a size >= 0",
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
        dims.read(d, f"{where}.shape[{i}]", record["path"]) if type(d) is str else read_int(d, f"{where}.shape[{i}]")
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
        kind = _kind_text({field: value for field, value in record.items() if field != "path"})
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


# A leaf record's line, as `_json.dumps` lays it out: up to its (bare) path, and after it.
_RECORD_HEAD: Final = _json.INDENT + _json.PATH_HEAD + '"'
_AFTER_PATH: Final = '"' + _json.ITEM_SEP


def _value(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _items(lines: list[str], indent: str) -> dict[str, str] | None:
    """The JSON text of each distinct line of `lines`, its `indent` and comma cut, when they are
    the items of a JSON array one a line (a comma after each but the last); else None."""
    last = lines[-1]
    if last.endswith(",") or lines.count(last) != 1:  # (an earlier line without its comma)
        return None
    texts = {}
    for line in dict.fromkeys(lines):
        if not line.startswith(indent) or not (line == last or line.endswith(",")):
            return None
        texts[line] = line[len(indent) :] if line == last else line[len(indent) : -1]
    return texts


def _bare_paths(parsed: list[_Parsed]) -> bool:
    """Every path of the tree JSON writes as it is (no quote, backslash or control character)."""
    joined = "".join(itertools.chain.from_iterable(keys for _, _, keys in parsed if keys))
    return joined.isprintable() and '"' not in joined and "\\" not in joined


def _read_lines(text: str) -> tuple[jtu.PyTreeDef, tuple[Any, ...]] | None:
    """`(treedef, leaves)` of a document laid out as `_json.dumps` writes it, one treedef entry
    or leaf record a line, else None (then `_decode` reads it, and reports what is wrong).

    JSON strings hold no line break, so each line is a whole entry or record:
    each distinct line is parsed and checked once, and no dict is made per
    record. A record's line must start with the path the treedef gives its
    leaf (when the paths are written as they are: no escapes), so what
    follows the path tells the kinds of leaf apart, and the leaves of a kind
    share one description. Anything unexpected returns None, so a document
    read here gives what `_decode` gives, errors included.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 6 or lines[:2] != [_json.OPEN, _json.VERSION_LINE] or lines[-1] != _json.CLOSE:
        return None
    at, constraints = 2, None
    if lines[at].startswith(_json.CONSTRAINTS_HEAD) and lines[at].endswith(","):
        constraints = _value(lines[at][len(_json.CONSTRAINTS_HEAD) : -1])
        at += 1
    if lines[at] != _json.TREEDEF_OPEN:
        return None
    end = lines.index(_json.TREEDEF_CLOSE)
    entries = lines[at + 1 : end]
    if lines[end + 1 :] == [_json.NO_LEAVES, _json.CLOSE]:
        records = []
    elif lines[end + 1] == _json.LEAVES_OPEN and lines[-2] == _json.LEAVES_CLOSE:
        records = lines[end + 2 : -2]
    else:
        return None
    items = _items(entries, _json.INDENT) if entries else None
    if items is None:
        return None
    index: dict[str, int] = {}
    parsed: list[_Parsed] = []
    for line, entry in items.items():
        index[line] = len(parsed)
        parsed.append(_parse(_value(entry), "", len(entries) - 1))
    treedef, leaf_paths, may_fail = _rebuild(parsed, list(map(index.__getitem__, entries)))
    if len(records) != treedef.num_leaves:
        return None
    leaves: tuple[Any, ...] = ()
    if records:
        if not _bare_paths(parsed):
            return None
        heads = leaf_paths(_RECORD_HEAD)
        if not all(map(str.startswith, records, heads)):
            return None
        kinds = list(map(str.removeprefix, records, heads))  # `", ` and the record's other fields
        del heads
        found = _items(kinds, "")
        if found is None:
            return None
        dims = _Dims(constraints)
        made, read = {}, {}  # each kind's leaf; each text's (the last record's kind has no comma)
        for kind, rest in found.items():
            if rest not in read:
                if not rest.startswith(_AFTER_PATH):
                    return None
                fields = _value("{" + rest[len(_AFTER_PATH) :])
                if type(fields) is not dict or "path" in fields:
                    return None
                read[rest] = _leaf({"path": "", **fields}, "", dims)
            made[kind] = read[rest]
        leaves = tuple(map(made.__getitem__, kinds))
    if may_fail:
        _check_rebuilds(treedef)
    return treedef, leaves


def _decode(text: str | bytes | bytearray) -> tuple[jtu.PyTreeDef, tuple[Any, ...]]:
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        raise Malformed(f"not valid JSON: {err}") from None
    except UnicodeDecodeError as err:
        raise Malformed(f"not valid UTF-8 text: {err}") from None
    except ValueError:  # an integer of more digits than Python converts: read again, to say in which field
        doc = json.loads(text, parse_constant=_reject_constant, parse_int=_int)
    if type(doc) is not dict:
        fail("the document", f"expected a JSON object, got {short_repr(doc)}")
    version = get(doc, "version", "the document")
    if type(version) is not int or version != VERSION:
        fail(
            "version",
            f"this treeshape reads version {VERSION}, got {short_repr(version)} (written by another "
            "treeshape release? regenerate the file with this one)",
        )
    treedef, leaf_paths, may_fail = _decode_treedef(get(doc, "treedef", "the document"))
    paths = leaf_paths("")
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
        try:
            read = _read_lines(text if isinstance(text, str) else bytes(text).decode())
        except (Malformed, ValueError):  # read again by `_decode`, which says what is wrong
            read = None
        return _decode(text) if read is None else read
    except Malformed as err:
        raise ValueError(f"{_WHO}: {err}") from None
    except RecursionError:
        raise ValueError(f"{_WHO}: the JSON is nested too deeply") from None
    except MemoryError:
        raise ValueError(f"{_WHO}: the JSON is too large to load") from None
