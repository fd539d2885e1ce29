"""Every difference between two structures, found without recursion.

Two structures with the same treedef are compared leaf by leaf. Otherwise the
two treedefs are walked side by side with an explicit stack: dict-like nodes
match their children by key, lists and tuples by index, other nodes by
position; a subtree whose treedef is the same on both sides is compared leaf
by leaf without walking it. Leaves are addressed by their offset in the
whole structure's leaves (nothing is sliced or rebuilt per node), and a
leaf's path is written only when the leaf differs. So nesting depth is
limited only by JAX's own flatten, and diffing two trees that differ in one
list's length costs about as much as flattening both.
"""

import bisect
import collections
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu

from . import _nodes, _tree
from ._errors import FieldReprOnly, FieldValue, Mismatch, MismatchKind, StaticReprOnly, StaticValue
from ._leaf import leaf_str, same_type, static_value, varying_axes
from ._nodes import node_type_name
from ._shapes import same_symbolic_shape
from ._tree import Items, StaticRepr, child_texts, clip, clip_items, items_of, key_text, mapping_keys
from ._views import TreeView


def diff_structures(
    expected: TreeView, actual: TreeView, root: str, leaf_index: dict[str, int] | None = None, saved: int = 0
) -> list[Mismatch]:
    """Every difference between two structures, in leaf order: `keystr` paths,
    printed under `root`. `leaf_index`, if given, gets the index (in `expected`'s
    leaves) of each leaf that differs, by its path. `saved` (1 expected, 2 actual)
    names a side that is an orbax checkpoint's metadata tree, whose containers are read
    as those orbax writes for the saved tree's nodes, and whose leaves keep no weak type."""
    out = _Found(root, leaf_index)
    walk = _Walk(expected.leaves, actual.leaves, out)
    if _same_treedef(expected.treedef, actual.treedef):
        differ = _differing(expected.leaves, 0, actual.leaves, 0, len(expected.leaves), saved)
        if differ:
            walk.run(_Run("", [""], [expected.treedef], [0], 0, 0, len(expected.leaves), differ, saved))
    else:
        walk.run(_Pair("", expected.treedef, 0, actual.treedef, 0, saved))
    return list(out)


class _Found(list[Mismatch]):
    """The mismatches found so far, all under one root name."""

    def __init__(self, root: str, leaf_index: dict[str, int] | None = None) -> None:
        super().__init__()
        self.root = root
        self.leaf_index = leaf_index

    def add(self, path: str, kind: MismatchKind, expected: Any, actual: Any) -> None:
        self.append(Mismatch(path, kind, expected, actual, root=self.root))


# -- leaves --------------------------------------------------------------------
def _differing(e_leaves: Sequence[Any], e0: int, a_leaves: Sequence[Any], a0: int, n: int, saved: int = 0) -> list[int]:
    """The offsets `j < n` where leaf `e0 + j` and leaf `a0 + j` differ as `_diff_leaf` tells."""
    sds = jax.ShapeDtypeStruct
    found = []
    for j in range(n):
        e, a = e_leaves[e0 + j], a_leaves[a0 + j]
        if e is a:
            continue
        if isinstance(e, sds) and isinstance(a, sds) and (same_type(e, a) or (saved and _alike_but_weak(e, a))):
            continue
        if not isinstance(e, sds) and not isinstance(a, sds) and static_equal(e, a):
            continue
        found.append(j)
    return found


def _alike_but_weak(e: jax.ShapeDtypeStruct, a: jax.ShapeDtypeStruct) -> bool:
    return e.weak_type != a.weak_type and same_type(e, a.update(weak_type=e.weak_type))


def _diff_leaf(path: str, e: Any, a: Any, out: _Found, index: int, saved: int = 0) -> None:
    """One leaf's differences (`saved`: below a node of a checkpoint's metadata, which keeps no
    weak type, the weak flag is not compared)."""
    if out.leaf_index is not None:
        out.leaf_index[path] = index
    e_array = isinstance(e, jax.ShapeDtypeStruct)
    a_array = isinstance(a, jax.ShapeDtypeStruct)
    if not (e_array and a_array):
        if e_array != a_array:
            out.add(path, "structure", _describe_leaf(e), _describe_leaf(a))
        elif not static_equal(e, a):
            e_text, a_text = value_texts(e, a)
            marker = StaticReprOnly if _holds_repr(e) or _holds_repr(a) else StaticValue
            out.add(path, "structure", marker(f"the static value {e_text}"), marker(f"the static value {a_text}"))
        return
    if not (e.shape == a.shape or same_symbolic_shape(e.shape, a.shape)):
        out.add(path, "shape", e.shape, a.shape)
    if e.dtype != a.dtype:
        out.add(path, "dtype", e.dtype, a.dtype)
    if e.weak_type != a.weak_type and not saved:
        out.add(path, "weak_type", e.weak_type, a.weak_type)
    if varying_axes(e) != varying_axes(a):
        out.add(path, "vma", varying_axes(e), varying_axes(a))


def static_equal(e: Any, a: Any) -> bool:
    if e is a:
        return True
    if type(e) is StaticRepr or type(a) is StaticRepr:  # a text loaded from JSON stands for what prints as it
        marker, other = (e, a) if type(e) is StaticRepr else (a, e)
        return marker.__eq__(other) is True
    try:
        return type(e) is type(a) and bool(static_value(e) == static_value(a))
    except Exception:  # an `==` that raises or does not give a bool
        return False


def _subtree_paths(treedef: jtu.PyTreeDef, leaves: Sequence[Any]) -> list[str]:
    flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, leaves))
    return ["".join(map(key_text, path)) for path, _ in flat]


# -- walking two treedefs --------------------------------------------------------
_CONTAINERS: Final = (dict, collections.OrderedDict, collections.defaultdict, list, tuple, type(None))
_SMALL: Final = 64  # a subtree with more leaves is split by its children rather than flattened with paths
_SEQUENCES: Final = (list, tuple)
_LEAF: Final = jtu.tree_structure(0)


def _leaves_only(td: jtu.PyTreeDef) -> bool:
    """Whether every child of the node `td` is one leaf (no child is a node itself, nor None)."""
    return bool(td.num_nodes == td.num_leaves + 1)


def _same_treedef(e: jtu.PyTreeDef, a: jtu.PyTreeDef) -> bool:
    try:
        return bool(e == a)
    except Exception:  # node data whose `==` raises (JAX refuses arrays as node data): walk it
        return False


def _same_data(e: Any, a: Any) -> bool:
    """Two nodes' static data are equal (field by field when their own `==` raises)."""
    try:
        return bool(e == a)
    except Exception:
        e_named, a_named = _named(e), _named(a)
        if e_named is None or a_named is None or e_named.keys() != a_named.keys():
            return static_equal(e, a)
        return all(static_equal(e_named[k], a_named[k]) for k in e_named)


@dataclasses.dataclass
class _Pair:
    """Two subtrees to compare: treedefs and the offsets of their first leaves."""

    path: str
    e_td: jtu.PyTreeDef
    e0: int
    a_td: jtu.PyTreeDef
    a0: int
    saved: int = 0  # below a node read as orbax wrote it: which side is the checkpoint's (1 expected, 2 actual)


@dataclasses.dataclass
class _Run:
    """Consecutive children with the same treedef on both sides (so their leaves
    line up): compared leaf by leaf, paths written only for differing leaves."""

    path: str
    keys: list[str]  # each child's key, as `keystr` writes it
    treedefs: list[jtu.PyTreeDef]
    starts: list[int]  # each child's first leaf, relative to e0
    e0: int
    a0: int
    n: int  # leaves in the run
    differ: list[int] | None = None  # the offsets of differing leaves, when already known
    saved: int = 0  # as `_Pair.saved`


@dataclasses.dataclass
class _Leaves:
    """Differing leaves, with their paths."""

    found: list[tuple[str, int, int]]  # path, expected leaf, actual leaf
    saved: int = 0  # as `_Pair.saved`


@dataclasses.dataclass
class _Add:
    path: str
    expected: Any
    actual: Any


_Task = _Pair | _Run | _Add | _Leaves


class _Walk:
    def __init__(self, e_leaves: tuple[Any, ...], a_leaves: tuple[Any, ...], out: _Found) -> None:
        self.e_leaves, self.a_leaves, self.out = e_leaves, a_leaves, out

    def run(self, first: "_Pair | _Run") -> None:
        stack: list[_Task] = [first]
        while stack:
            task = stack.pop()
            if isinstance(task, _Add):
                self.out.add(task.path, "structure", task.expected, task.actual)
            elif isinstance(task, _Leaves):
                for path, i, j in task.found:
                    _diff_leaf(path, self.e_leaves[i], self.a_leaves[j], self.out, i, task.saved)
            else:
                stack.extend(reversed(self._run(task) if isinstance(task, _Run) else self._pair(task)))

    def _run(self, run: _Run) -> list[_Task]:
        """The differing leaves of a run, child by child: a small child's paths
        written from its own flatten, a big one split into its children."""
        differ = run.differ
        if differ is None:
            differ = _differing(self.e_leaves, run.e0, self.a_leaves, run.a0, run.n, run.saved)
        tasks: list[_Task] = []
        k = 0
        while k < len(differ):
            i = bisect.bisect_right(run.starts, differ[k]) - 1
            start, td = run.starts[i], run.treedefs[i]
            end = start + td.num_leaves
            mine = []
            while k < len(differ) and differ[k] < end:
                mine.append(differ[k] - start)
                k += 1
            e0, a0 = run.e0 + start, run.a0 + start
            path = run.path + run.keys[i]
            if td.num_leaves > _SMALL and _leaves_only(td) and td.node_data()[0] in _SEQUENCES:
                # A long list or tuple of leaves (each child one node): leaf `j` is its child `[j]`.
                tasks.append(_Leaves([(f"{path}[{j}]", e0 + j, a0 + j) for j in mine], run.saved))
            elif td.num_leaves > _SMALL and td.num_nodes > 1:
                keys, children = self._keyed_children(td, e0)
                starts = _starts(children, 0)
                tasks.append(_Run(path, keys, list(children), starts, e0, a0, td.num_leaves, mine, run.saved))
            else:
                paths = _subtree_paths(td, self.e_leaves[e0 : e0 + td.num_leaves])
                tasks.append(_Leaves([(path + paths[j], e0 + j, a0 + j) for j in mine], run.saved))
        return tasks

    def _keyed_children(self, td: jtu.PyTreeDef, e0: int) -> tuple[list[str], list[jtu.PyTreeDef]]:
        """A node's children, each with its key as `keystr` writes it."""
        children = td.children()
        return self._texts(td, self.e_leaves, e0, len(children)), children

    def _describe(self, td: jtu.PyTreeDef, leaves: tuple[Any, ...], start: int) -> str:
        return describe(td, leaves, start)

    def _pair(self, p: _Pair) -> list[_Task]:
        e_td, a_td = p.e_td, p.a_td
        if _same_treedef(e_td, a_td):
            return [_Run(p.path, [""], [e_td], [0], p.e0, p.a0, e_td.num_leaves, saved=p.saved)]
        if p.saved:
            written = self._as_written(p)
            if written is not None:
                return written
        e_leaf, a_leaf = e_td.num_nodes == 1, a_td.num_nodes == 1  # a leaf, None, or an empty container
        if e_leaf and a_leaf and e_td.num_leaves and a_td.num_leaves:
            _diff_leaf(p.path, self.e_leaves[p.e0], self.a_leaves[p.a0], self.out, p.e0, p.saved)
            return []
        e_node = None if e_leaf else e_td.node_data()
        a_node = None if a_leaf else a_td.node_data()
        if e_leaf or a_leaf:  # an empty custom node against one of its type (other data or arity)
            e_data, a_data = e_td.node_data(), a_td.node_data()
            if e_data is not None and a_data is not None and e_data[0] is a_data[0] and e_data[0] not in _CONTAINERS:
                return self._node_data(p, e_data[0], e_data[1], a_data[1])
        if e_node is not None and a_node is not None and e_node[0] is not a_node[0]:
            stood = self._as_checkpointed(p, e_node, a_node)
            if stood is not None:
                return stood
        if e_node is None or a_node is None or e_node[0] is not a_node[0]:
            return [_Add(p.path, self._describe(e_td, self.e_leaves, p.e0), self._describe(a_td, self.a_leaves, p.a0))]
        node_type = e_node[0]
        if node_type in _SEQUENCES and _leaves_only(e_td) and _leaves_only(a_td):
            return self._leaf_sequences(p)
        e_children, a_children = e_td.children(), a_td.children()
        e_keys, a_keys = mapping_keys(node_type, e_node[1]), mapping_keys(node_type, a_node[1])
        if e_keys is not None and a_keys is not None:
            # The same kind of mapping: children matched by key; missing and extra keys reported.
            ordered = node_type is collections.OrderedDict  # JAX keeps its insertion order
            factory: list[_Task] = []
            if node_type is collections.defaultdict and e_node[1][0] is not a_node[1][0]:
                e_text, a_text = _factory_text(e_node[1][0]), _factory_text(a_node[1][0])
                factory = [_Add(p.path + ".default_factory", FieldValue(e_text), FieldValue(a_text))]
            return factory + self._children(p, list(e_keys), list(a_keys), ordered)
        if node_type is list or node_type is tuple:
            # The same sequence type, another length: children matched by index.
            n_e, n_a = len(e_children), len(a_children)
            n = max(n_e, n_a)
            texts = [f"[{i}]" for i in range(n)]  # as `_tree.key_text` writes a sequence's keys
            e_which = [*range(n_e), *[-1] * (n - n_e)]
            a_which = [*range(n_a), *[-1] * (n - n_a)]
            return self._line_up(p, texts, e_children, a_children, e_which, a_which)
        if not _same_data(e_node[1], a_node[1]) or len(e_children) != len(a_children) or _nodes.kind(node_type):
            # The same custom node type with other node data (or arity), or a framework's node (whose
            # own internal children are not named).
            return self._node_data(p, node_type, e_node[1], a_node[1])
        return self._by_position(p)

    def _as_checkpointed(self, p: _Pair, e_node: tuple[type, Any], a_node: tuple[type, Any]) -> list[_Task] | None:
        """A node against a checkpoint's metadata of it, in which orbax writes a flax.nnx `State`
        as a dict, each Variable as a dict `{'value': ...}`, and an nnx or equinox module or a
        registered dataclass (a linen `TrainState`) as a dict of its children's names: each such
        dict read as the node it stands for (children matched by key, the Variable's value to the
        dict's), else None."""
        (e_type, e_aux), (a_type, a_aux) = e_node, a_node
        e_children, a_children = p.e_td.children(), p.a_td.children()
        written = dataclasses.replace(p, saved=1 if e_type is dict else 2)  # the dict is the checkpoint's
        if (e_type is dict and _nodes.is_nnx_state(a_type)) or (a_type is dict and _nodes.is_nnx_state(e_type)):
            return self._children(written, list(mapping_keys(e_type, e_aux)), list(mapping_keys(a_type, a_aux)), False)
        if e_type is dict or a_type is dict:
            e_names = list(e_aux) if e_type is dict else _child_names(e_type, e_aux, len(e_children))
            a_names = list(a_aux) if a_type is dict else _child_names(a_type, a_aux, len(a_children))
            if e_names is not None and a_names is not None and (e_type is not dict or a_type is not dict):
                return self._children(written, e_names, a_names, False)
        variable = _nodes.kind(e_type) == _nodes.NNX_VARIABLE
        one_child = len(e_children) == len(a_children) == 1
        if one_child and (
            (variable and a_type is dict and list(a_aux) == ["value"])
            or (e_type is dict and list(e_aux) == ["value"] and _nodes.kind(a_type) == _nodes.NNX_VARIABLE)
        ):
            key = self._texts(p.e_td, self.e_leaves, p.e0)[0]  # `.value` of a Variable, `['value']` of a dict
            return [_Pair(p.path + key, e_children[0], p.e0, a_children[0], p.a0, 1 if e_type is dict else 2)]
        return None

    def _as_written(self, p: _Pair) -> list[_Task] | None:
        """Below a node read as orbax wrote it (`p.saved` names the checkpoint's side), the
        containers orbax writes for others: a list for a tuple, a dict of field names for a
        namedtuple (an optax state), None for a node that holds nothing (optax's `EmptyState`);
        else None."""
        mine, other = (p.e_td, p.a_td) if p.saved == 1 else (p.a_td, p.e_td)
        mine_data, other_data = mine.node_data(), other.node_data()
        if mine_data is None or other_data is None:
            return None
        (mine_type, mine_aux), other_type = mine_data, other_data[0]
        if mine_type is type(None) and other.num_leaves == 0:
            return []
        if mine_type is list and other_type is tuple and len(mine.children()) == len(other.children()):
            return self._by_position(p)
        if mine_type is dict and _tree.is_namedtuple(other_type) and other_type is not mine_type:
            names = list(other_type._fields)
            return self._children(p, *((list(mine_aux), names) if p.saved == 1 else (names, list(mine_aux))), False)
        return None

    @staticmethod
    def _texts(td: jtu.PyTreeDef, leaves: tuple[Any, ...], start: int, n: int | None = None) -> list[str]:
        """The keys of the `n` children of the node `td` (whose leaves start at `leaves[start]`),
        as `keystr` writes them."""
        return child_texts(td, leaves[start : start + td.num_leaves], n)

    def _by_position(self, p: _Pair) -> list[_Task]:
        """Children of two nodes of one type and arity, lined up by position (keyed as `p.e_td`'s)."""
        keys = self._texts(p.e_td, self.e_leaves, p.e0)
        which = list(range(len(keys)))
        return self._line_up(p, keys, p.e_td.children(), p.a_td.children(), which, which)

    def _node_data(self, p: _Pair, node_type: type, e_aux: Any, a_aux: Any) -> list[_Task]:
        """Two nodes of one custom type whose node data (or arity) differ: each differing field by
        its name, then the children (by name where the node data names them). Node data without
        names is summarised whole, around where it differs; framework-internal data is never
        named, and told only when nothing else tells the difference."""
        e_split, a_split = _nodes.split(node_type, e_aux), _nodes.split(node_type, a_aux)
        arity = len(p.e_td.children()) == len(p.a_td.children())
        whole = _Add(p.path, self._describe(p.e_td, self.e_leaves, p.e0), self._describe(p.a_td, self.a_leaves, p.a0))
        name = _type_name(node_type)
        if e_split is None or a_split is None:
            if not arity:
                return [whole]
            if _same_data(e_aux, a_aux):
                return self._by_position(p)
            expected, actual = _around(value_text(e_aux, _WHOLE), value_text(a_aux, _WHOLE))
            return [
                _Add(p.path, f"{name} with static data {expected}", f"{name} with static data {actual}"),
                *self._by_position(p),
            ]
        e, a = _Side(e_split, p.e_td, p.e0, self.e_leaves), _Side(a_split, p.a_td, p.a0, self.a_leaves)
        fields = list(dict.fromkeys([*e_split.fields, *a_split.fields]))
        out: list[_Task] = []
        for key in fields:
            if key in e_split.fields and key in a_split.fields:
                e_value, a_value = e_split.fields[key], a_split.fields[key]
                if not field_equal(e_value, a_value):
                    e_text, a_text = value_texts(e_value, a_value)
                    out.append(_Add(p.path + key_text(key), _field(e_value, e_text), _field(a_value, a_text)))
                continue
            out.append(_Add(p.path + key_text(key), self._told(e, key), self._told(a, key)))
        hidden = [
            (e_split.hidden.get(k), a_split.hidden.get(k))
            for k in dict.fromkeys([*e_split.hidden, *a_split.hidden])
            if not field_equal(e_split.hidden.get(k), a_split.hidden.get(k))
        ]
        keys_differ = False
        if e.index is None or a.index is None:  # children by position
            if not arity:
                return [*out, whole]
            children = self._by_position(p)
        else:
            skip = set(fields)
            for key in dict.fromkeys([*e.index, *a.index]):  # framework-internal children: never named
                if _nodes.is_private(key) and key not in skip:
                    e_child, a_child = e.child(key), a.child(key)
                    if e_child is None or a_child is None or not _same_treedef(e_child, a_child):
                        hidden.append((_node_text(e_child), _node_text(a_child)))
                        skip.add(key)
            e_keys = [k for k in e.index if k not in skip]
            a_keys = [k for k in a.index if k not in skip]
            keys_differ = set(e_keys) != set(a_keys)
            children = self._by_keys(p, e, a, e_keys, a_keys, e_split.ordered and a_split.ordered)
        if hidden and not out and not keys_differ:
            e_text, a_text = _around(_values_text([x for x, _ in hidden]), _values_text([x for _, x in hidden]))
            e_data, a_data = f"{name} with internal data {e_text}", f"{name} with internal data {a_text}"
            out.append(_Add(p.path, FieldValue(e_data), FieldValue(a_data)))
        return out + children

    def _told(self, side: "_Side", key: Any) -> Any:
        """One side of a field's mismatch: its value in words; or the child of that name (an nnx
        attribute static on one side and a child on the other); or None where it is absent."""
        if key in side.split.fields:
            return FieldValue(value_text(side.split.fields[key]))
        child = side.child(key)
        if child is None:
            return None
        return self._describe(child, side.leaves, side.starts[side.index[key]] if side.index else 0)

    def _by_keys(
        self, p: _Pair, e: "_Side", a: "_Side", e_keys: list[Any], a_keys: list[Any], ordered: bool
    ) -> list[_Task]:
        """Children matched by the keys their node data names (missing and extra ones told by key)."""
        assert e.index is not None and a.index is not None
        keys = list(dict.fromkeys([*e_keys, *a_keys]))
        if not ordered:
            try:
                keys = sorted(keys, key=_key_order)
            except TypeError:  # keys of mixed types: the expected order, then the extra ones
                pass
        e_set, a_set = set(e_keys), set(a_keys)
        return self._line_up(
            p,
            [key_text(k) for k in keys],
            e.td.children(),
            a.td.children(),
            [e.index[k] if k in e_set else -1 for k in keys],
            [a.index[k] if k in a_set else -1 for k in keys],
        )

    def _children(self, p: _Pair, e_keys: list[Any], a_keys: list[Any], ordered: bool) -> list[_Task]:
        """The children of two mappings or sequences, matched by key (`e_keys`, `a_keys`: their
        keys or indices, in their order), in leaf order (sorted keys unless `ordered`). A key
        `str(i)` on one side matches the integer `i` on the other (orbax writes the index or int
        key 3 of an `nnx.List` or an optimizer's `opt_state` as the key `'3'`; `'03'` is a name)."""
        if _digit_keys(e_keys) != _digit_keys(a_keys):
            e_keys, a_keys = _as_indices(e_keys), _as_indices(a_keys)
        e_index = {k: i for i, k in enumerate(e_keys)}
        a_index = {k: i for i, k in enumerate(a_keys)}
        keys = e_keys + [k for k in a_keys if k not in e_index]
        if not ordered:
            try:
                keys = sorted(keys)
            except TypeError:  # keys of mixed types: the expected order, then the extra ones
                pass
        e_texts = self._texts(p.e_td, self.e_leaves, p.e0, len(e_keys))
        a_texts = self._texts(p.a_td, self.a_leaves, p.a0, len(a_keys))
        texts = [e_texts[e_index[k]] if k in e_index else a_texts[a_index[k]] for k in keys]
        e_which = [e_index.get(k, -1) for k in keys]
        a_which = [a_index.get(k, -1) for k in keys]
        return self._line_up(p, texts, p.e_td.children(), p.a_td.children(), e_which, a_which)

    def _leaf_sequences(self, p: _Pair) -> list[_Task]:
        """Two lists (or tuples) of leaves only, of other lengths: the leaves both have, compared
        one by one, then each leaf that only one side has; as `_line_up` lines them up, without
        a treedef, a key and a start per child (a list of 100,000 leaves grown by one)."""
        n_e, n_a = p.e_td.num_leaves, p.a_td.num_leaves
        n = min(n_e, n_a)
        differ = _differing(self.e_leaves, p.e0, self.a_leaves, p.a0, n, p.saved)
        tasks: list[_Task] = [_Leaves([(f"{p.path}[{j}]", p.e0 + j, p.a0 + j) for j in differ], p.saved)]
        for j in range(n, n_e):
            tasks.append(_Add(f"{p.path}[{j}]", self._describe(_LEAF, self.e_leaves, p.e0 + j), None))
        for j in range(n, n_a):
            tasks.append(_Add(f"{p.path}[{j}]", None, self._describe(_LEAF, self.a_leaves, p.a0 + j)))
        return tasks

    def _line_up(
        self,
        p: _Pair,
        keys: list[str],
        e_children: Sequence[jtu.PyTreeDef],
        a_children: Sequence[jtu.PyTreeDef],
        e_which: list[int],
        a_which: list[int],
    ) -> list[_Task]:
        """Tasks for matched children (`e_which[i]`, `a_which[i]`: child indices, -1 if
        absent): consecutive equal children merge into one leaf-by-leaf run."""
        e_starts = _starts(e_children, p.e0)
        a_starts = _starts(a_children, p.a0)
        tasks: list[_Task] = []
        run: _Run | None = None
        for key, ei, ai in zip(keys, e_which, a_which, strict=True):
            if ai < 0:
                tasks.append(_Add(p.path + key, self._describe(e_children[ei], self.e_leaves, e_starts[ei]), None))
                run = None
                continue
            if ei < 0:
                tasks.append(_Add(p.path + key, None, self._describe(a_children[ai], self.a_leaves, a_starts[ai])))
                run = None
                continue
            e_child, a_child = e_children[ei], a_children[ai]
            e0, a0 = e_starts[ei], a_starts[ai]
            if not _same_treedef(e_child, a_child):
                tasks.append(_Pair(p.path + key, e_child, e0, a_child, a0, p.saved))
                run = None
            elif run is not None and run.e0 + run.n == e0 and run.a0 + run.n == a0:
                run.keys.append(key)
                run.treedefs.append(e_child)
                run.starts.append(run.n)
                run.n += e_child.num_leaves
            else:
                run = _Run(p.path, [key], [e_child], [0], e0, a0, e_child.num_leaves, saved=p.saved)
                tasks.append(run)
        return tasks


def _child_names(node_type: type, aux: Any, n: int) -> list[Any] | None:
    """The names of a module's or registered dataclass's `n` children, in their order, as orbax
    writes them in a checkpoint's dict; None for any other node."""
    if node_type in _CONTAINERS or _tree.is_namedtuple(node_type) or mapping_keys(node_type, aux) is not None:
        return None
    split = _nodes.split(node_type, aux)
    if split is None or split.children is None or len(split.children) != n:
        return None
    names = [_nodes.key_name(k) for k in split.children]
    return names if len(set(names)) == n else None


_INDEX: Final = re.compile(r"0|-?[1-9][0-9]*")


def as_index(key: Any) -> int | None:
    """The integer `i` that a checkpoint's string key stands for where it is `str(i)`, the
    decimal text orbax writes for an index or int key (`'3'`, `'-1'`); None for any other key
    (`'03'`, `'+3'` and `'²'` are names)."""
    return int(key) if isinstance(key, str) and _INDEX.fullmatch(key) else None


def _digit_keys(keys: list[Any]) -> bool:
    return any(as_index(k) is not None for k in keys)


def _as_indices(keys: list[Any]) -> list[Any]:
    """Keys with each `str(i)` read as `i`, unless two keys would then be one."""
    out = [k if as_index(k) is None else as_index(k) for k in keys]
    return out if len(set(out)) == len(out) else keys


def _starts(children: Sequence[jtu.PyTreeDef], first: int) -> list[int]:
    starts = []
    for child in children:
        starts.append(first)
        first += child.num_leaves
    return starts


class _Side:
    """One side of a node whose data differs: its data by name, and its children by key."""

    def __init__(self, split: _nodes.Split, td: jtu.PyTreeDef, first: int, leaves: tuple[Any, ...]) -> None:
        self.split, self.td, self.leaves = split, td, leaves
        children = td.children()
        self.starts = _starts(children, first)
        keys = split.children
        self.index = None if keys is None or len(keys) != len(children) else {k: i for i, k in enumerate(keys)}

    def child(self, key: Any) -> jtu.PyTreeDef | None:
        i = None if self.index is None else self.index.get(key)
        return None if i is None else self.td.children()[i]


def _key_order(key: Any) -> tuple[int, Any]:
    """The order nnx and JAX give keys: integers first, then names."""
    name = _nodes.key_name(key)
    return (0, name) if isinstance(name, int) else (1, name)


# -- describing what differs -------------------------------------------------------
def describe(td: jtu.PyTreeDef, leaves: Sequence[Any], start: int) -> str:
    """The subtree `td`, whose leaves start at `leaves[start]`, in words (`a dict with keys ['b', 'w']`)."""
    return _describe_node(td, leaves[start] if td.num_leaves == 1 and td.num_nodes == 1 else None)


def _describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf_str(leaf)
    return f"the static value {value_text(leaf)}"


def _describe_node(treedef: jtu.PyTreeDef, leaf: Any) -> str:
    """A subtree in words; `leaf` is its one leaf when the subtree is a leaf."""
    data = treedef.node_data()
    if data is None:  # a leaf
        return _describe_leaf(leaf)
    node_type, aux = data
    if node_type is type(None):
        return "None"
    if _nodes.is_sentinel_type(node_type):  # equinox's marker of a field that holds nothing
        return "nothing"
    n = len(treedef.children())
    if n == 0:  # told apart from None
        return f"an empty {node_type.__name__}"
    keys = mapping_keys(node_type, aux)
    if keys is not None:
        return f"{_type_name(node_type)} with keys {_short(list(keys), 120)}"
    if _nodes.kind(node_type) in (_nodes.NNX, _nodes.EQUINOX):  # a module: its attributes by name
        split = _nodes.split(node_type, aux)
        names = [] if split is None or split.children is None else split.children
        shown = [_nodes.key_name(k) for k in names if not _nodes.is_private(k)]
        if shown:
            return f"{_type_name(node_type)} with children {_short(shown, 120)}"
    return f"{_type_name(node_type)} with {n} {'child' if n == 1 else 'children'}"


_SHORT: Final = 60


def value_text(value: Any, limit: int = _SHORT) -> str:
    """A static value in a message (a static leaf, a node-data field): as `_nodes.static_text`
    tells it (a function by its public import path, `jax.nn.relu`), equinox's marker of an
    empty slot as "nothing", cut to `limit` characters."""
    if _nodes.is_sentinel(value):
        return "nothing"
    if isinstance(value, StaticRepr):
        return _cut(value.text, limit)
    return _cut(_nodes.static_text(value), limit)


def value_texts(e: Any, a: Any) -> tuple[str, str]:
    """Two static values that differ, in words, cut around where they differ."""
    return _around(value_text(e, 1000), value_text(a, 1000))


def field_equal(e: Any, a: Any) -> bool:
    """Two node-data values are equal as the treedefs that hold them compare them (`==`, as
    static leaves are compared): a value loaded from JSON by its repr equals only a live value
    compared by identity that prints as it, so `diff` finds a difference exactly where `==`
    does; mappings and tuples item by item."""
    if static_equal(e, a):
        return True
    if isinstance(e, StaticRepr) or isinstance(a, StaticRepr):
        return False
    if isinstance(e, Mapping) and isinstance(a, Mapping):
        try:
            return e.keys() == a.keys() and all(field_equal(e[k], a[k]) for k in e)
        except Exception:
            return False
    if type(e) is type(a) and type(e) in (tuple, list):
        return len(e) == len(a) and all(map(field_equal, e, a))
    return False


_ALIKE: Final = 1000  # two values that print alike are shown whole up to this length (an optax chain is)


def _around(expected: str, actual: str, limit: int = _SHORT) -> tuple[str, str]:
    """Two texts that differ, each cut to about `limit` characters around the first place where
    they differ (never a cut-off start that is the same on both sides, never inside an item of a
    call or container: the item that differs is shown whole, `optax.chain(..., optax.scale(
    step_size=-0.001))`); texts that are the same (two values that print alike) whole, up to a
    longer limit."""
    if expected == actual:
        return _cut(expected, _ALIKE), _cut(actual, _ALIKE)
    if len(expected) <= limit and len(actual) <= limit:
        return _cut(expected, limit), _cut(actual, limit)
    by_items = _around_items(expected, actual, limit)
    if by_items is not None:
        return by_items
    first = next((i for i, (x, y) in enumerate(zip(expected, actual, strict=False)) if x != y), None)
    if first is None:
        first = min(len(expected), len(actual))
    start = max(0, first - limit // 3)

    def cut(text: str) -> str:
        part = text[start : start + limit]
        return ("..." if start else "") + part + ("..." if start + limit < len(text) else "")

    return cut(expected), cut(actual)


def _around_items(expected: str, actual: str, limit: int) -> tuple[str, str] | None:
    """Two calls or containers in text (`_tree.items_of`) told by the first item where they
    differ, whole (or, when long, itself told so), the items around it as `...`: the same call
    `Head(..., item, ...)` on both sides; calls of two heads each cut at an item. None where
    either text is no call or container."""
    e, a = items_of(expected), items_of(actual)
    if e is None or a is None:
        return None
    if e.head != a.head or e.tail != a.tail:
        return clip_items(expected, limit), clip_items(actual, limit)
    n = min(len(e.items), len(a.items))
    i = next((k for k in range(n) if e.items[k] != a.items[k]), n)
    if i == n:  # one has more items: each told from the last item both have
        return _told_from(e, max(i - 1, 0), limit), _told_from(a, max(i - 1, 0), limit)
    e_item, a_item = e.items[i], a.items[i]
    if max(len(e_item), len(a_item)) > limit:
        e_item, a_item = _around(e_item, a_item, limit)

    def told(side: Items, item: str) -> str:
        return side.head + ("..., " if i else "") + item + (", ..." if i + 1 < len(side.items) else "") + side.tail

    return told(e, e_item), told(a, a_item)


def _told_from(side: Items, first: int, limit: int) -> str:
    """A call or container in text from its item `first` on, cut at an item after about `limit`
    characters (`('a', ..., 'y', 'z')` from `'y'`)."""
    shown = clip_items(side.head + ", ".join(side.items[first:]) + side.tail, limit + len(side.head))
    return shown if not first else side.head + "..., " + shown[len(side.head) :]


def _factory_text(factory: Any) -> str:
    """A defaultdict's default factory, by its name (`builtins.list`), or `None`."""
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else clip(repr(factory), 60)


def _field(value: Any, text: str) -> FieldValue:
    """A field's value in words, marked when it holds a value loaded from JSON by its repr only."""
    return FieldReprOnly(text) if _holds_repr(value) else FieldValue(text)


def _holds_repr(value: Any) -> bool:
    if isinstance(value, StaticRepr):
        return True
    if type(value) in (tuple, list):
        return any(map(_holds_repr, value))
    if type(value) is dict:
        return any(map(_holds_repr, value.values()))
    return False


def _values_text(values: list[Any]) -> str:
    texts = [value_text(v) if not isinstance(v, _NodeText) else v.text for v in values]
    return texts[0] if len(texts) == 1 else "(" + ", ".join(texts) + ")"


class _NodeText:
    """A framework-internal child, in words (its node data), for an internal-data mismatch."""

    def __init__(self, text: str) -> None:
        self.text = text


def _node_text(td: jtu.PyTreeDef | None) -> _NodeText:
    if td is None:
        return _NodeText("nothing")
    data = td.node_data()
    return _NodeText("a leaf" if data is None else _cut(_nodes.static_text(data[1])))


def _named(data: Any) -> dict[str, Any] | None:
    """A node's static data as named fields, where it has them."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return {f.name: getattr(data, f.name, None) for f in dataclasses.fields(data)}
    if _tree.is_namedtuple(type(data)):
        return dict(zip(data._fields, data, strict=True))
    if isinstance(data, (tuple, list)):
        return {f"[{i}]": item for i, item in enumerate(data)}
    if isinstance(data, dict):
        return {repr(k): v for k, v in data.items()}
    attributes = getattr(data, "__dict__", None)
    return dict(attributes) if isinstance(attributes, dict) else None


_WHOLE: Final = 100_000  # node data told around where it differs, from up to this much of its text


def _short(value: Any, limit: int = _SHORT) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return _cut(text, limit)


def _cut(text: str, limit: int = _SHORT) -> str:
    return clip_items(" ".join(text.split()), limit)


def _type_name(node_type: type) -> str:
    name = node_type_name(node_type)
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"
