"""`Structure` and `Mismatch`: immutable descriptions of pytrees and their differences."""

import collections
import dataclasses
import functools as ft
import math
from collections.abc import Iterator
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from . import _compat
from ._display import human_bytes, leaf_str, varying_axes
from ._errors import StructureMismatchError, format_mismatches


PyTree = Any


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One difference between an expected structure and an actual tree.

    Attributes:
        path: Where, as a root name plus a `jax.tree_util.keystr` path, e.g.
            `tree['w']` or `carry[1]['opt_state'].mu['w']`.
        kind: One of `"structure"`, `"shape"`, `"dtype"`, `"weak_type"`,
            `"vma"`.
        expected: The expected value: a shape tuple, a dtype, a weak flag, a
            frozenset of manual axes, or (for `"structure"`) a description of
            the expected node or leaf; `None` when the entry is extra.
        actual: The actual value, as `expected`; `None` when it is missing.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> s = ts.structure_of({"w": jnp.zeros((2, 3))})
        >>> [m] = s.diff({"w": jnp.zeros((3, 2))})
        >>> print(m)
        tree['w']: expected shape (2, 3), got (3, 2).
    """

    path: str
    kind: str
    expected: Any
    actual: Any

    def __str__(self) -> str:
        where, e, a = self.path, self.expected, self.actual
        if self.kind == "shape":
            return f"{where}: expected shape {e}, got {a}."
        if self.kind == "dtype":
            return f"{where}: expected dtype {e}, got {a}."
        if self.kind == "weak_type":
            return f"{where}: expected a {_weakness(e)} typed leaf, got a {_weakness(a)} typed one."
        if self.kind == "vma":
            return f"{where}: expected a leaf varying over manual axes {_axes(e)}, got {_axes(a)}."
        if a is None:
            return f"{where}: missing; expected {e}."
        if e is None:
            return f"{where}: unexpected extra entry {a}."
        return f"{where}: expected {e}, got {a}."


def _weakness(weak: bool) -> str:
    return "weakly" if weak else "strongly"


def _axes(axes: frozenset[str]) -> str:
    return "{" + ", ".join(repr(a) for a in sorted(axes)) + "}" if axes else "{} (none)"


def _leaf_key(leaf: Any) -> tuple[Any, ...]:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        mat = leaf.manual_axis_type
        axes = None
        if mat is not None and (mat.varying or mat.unreduced or mat.reduced):
            axes = (frozenset(mat.varying), frozenset(mat.unreduced), frozenset(mat.reduced))
        return (True, leaf.shape, leaf.dtype, leaf.weak_type, axes)
    return (False, type(leaf), leaf)


@ft.cache
def _key_data_bytes(dtype: Any) -> int:
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
    return int(math.prod(data.shape) * np.dtype(data.dtype).itemsize)


@ft.cache
def _is_key_dtype(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))


def _leaf_nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    size: int = math.prod(leaf.shape)
    if _is_key_dtype(leaf.dtype):
        return size * _key_data_bytes(leaf.dtype)
    itemsize: int = np.dtype(leaf.dtype).itemsize
    return size * itemsize


def _as_abstract_mesh(mesh: Any) -> Any:
    return mesh if isinstance(mesh, jax.sharding.AbstractMesh) else mesh.abstract_mesh


def _top_level_sharding(sharding: Any) -> Any:
    """The concrete sharding to place a top-level leaf with, or None (default placement)."""
    if sharding is None:
        return None
    mesh = getattr(sharding, "mesh", None)
    if isinstance(mesh, jax.sharding.AbstractMesh):
        concrete = jax.sharding.get_mesh()
        if concrete.empty or concrete.abstract_mesh != mesh:
            return None
        return jax.sharding.NamedSharding(concrete, sharding.spec)
    return sharding


def _spec_axes(spec: Any) -> set[str]:
    axes: set[str] = set()
    for entry in spec:
        if isinstance(entry, str):
            axes.add(entry)
        elif isinstance(entry, tuple):
            axes.update(a for a in entry if isinstance(a, str))
    return axes


def _traced_sharding(sharding: Any) -> Any:
    """Under a trace, the sharding that is part of the leaf's type, or None.

    With `Explicit` mesh axes the sharding is part of an array's type (a scan
    carry must keep it), so a leaf sharded over explicit axes is built with
    it, unless another mesh is in context. Auto and manual axes are not part
    of the type.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    mesh = _as_abstract_mesh(sharding.mesh)
    current = jax.sharding.get_abstract_mesh()
    if not current.empty and current != mesh:
        return None
    explicit = {
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
        if kind == jax.sharding.AxisType.Explicit
    }
    if not _spec_axes(sharding.spec) & explicit:
        return None
    return jax.sharding.NamedSharding(mesh, sharding.spec)


def _filled(leaf: jax.ShapeDtypeStruct, value: Any, top: bool) -> Any:
    dtype = leaf.dtype
    sharding = _top_level_sharding(leaf.sharding) if top else _traced_sharding(leaf.sharding)
    if _is_key_dtype(dtype):
        x = jnp.zeros(leaf.shape, dtype)  # keys from zero key data, whatever `value` is
        if sharding is not None:
            x = jax.device_put(x, sharding) if top else jax.sharding.reshard(x, sharding)
    else:
        x = lax.full(leaf.shape, value, dtype, sharding=sharding)
        if leaf.weak_type:
            x = _compat.convert_element_type(x, dtype, weak_type=True)
    axes = varying_axes(leaf)
    if axes:
        x = lax.pcast(x, tuple(sorted(axes)), to="varying")
    return x


def _is_fill_value(value: Any) -> bool:
    if isinstance(value, (bool, int, float, complex, np.number, np.bool_)):
        return True
    return isinstance(value, (jax.Array, np.ndarray)) and value.ndim == 0


class _Text:
    """A placeholder leaf whose repr is the given text (for one-line reprs)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        from treescope import rendering_parts

        return rendering_parts.text(self.text)


_MAX_REPR = 120


class Structure:
    """The structure of a pytree: its treedef plus one description per leaf.

    Array leaves are described by `jax.ShapeDtypeStruct`s (shape, dtype,
    `weak_type`, and `sharding` / `manual_axis_type` where JAX reports them);
    any other leaf (a string, a callable, an object) is a *static* leaf, kept
    as-is. A Structure is an immutable value: equality and hashing cover the
    treedef, the static leaves and each array leaf's shape, dtype, `weak_type`
    and manual axes (not its sharding), and it pickles.

    Build one with [treeshape.out_structure][] or [treeshape.structure_of][].

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> s = ts.structure_of({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
        >>> s
        Structure({'b': f32[3], 'w': f32[2,3]}, 2 leaves, 36 B)
        >>> s.paths
        ("['b']", "['w']")
        >>> s.zeros()["w"].shape
        (2, 3)
    """

    __slots__ = ("_treedef", "_leaves", "_cache")

    _treedef: jtu.PyTreeDef
    _leaves: tuple[Any, ...]
    _cache: dict[str, Any]

    def __init__(self, treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> None:
        if treedef.num_leaves != len(leaves):
            raise ValueError(f"treedef has {treedef.num_leaves} leaves, got {len(leaves)} descriptions")
        object.__setattr__(self, "_treedef", treedef)
        object.__setattr__(self, "_leaves", tuple(leaves))
        object.__setattr__(self, "_cache", {})

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"treeshape.Structure is immutable; cannot assign {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"treeshape.Structure is immutable; cannot delete {name!r}")

    def _memo(self, name: str, compute: Any) -> Any:
        try:
            return self._cache[name]
        except KeyError:
            value = self._cache[name] = compute()
            return value

    # -- the description ---------------------------------------------------
    @property
    def treedef(self) -> jtu.PyTreeDef:
        """The `jax.tree_util.PyTreeDef`."""
        return self._treedef

    @property
    def leaves(self) -> tuple[Any, ...]:
        """One `jax.ShapeDtypeStruct` per array leaf; static leaves as-is."""
        return self._leaves

    @property
    def paths(self) -> tuple[str, ...]:
        """One `jax.tree_util.keystr` path per leaf, in leaf order."""

        def compute() -> tuple[str, ...]:
            flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(self._treedef, self._leaves))
            return tuple(jtu.keystr(path) for path, _ in flat)

        paths: tuple[str, ...] = self._memo("paths", compute)
        return paths

    @property
    def tree(self) -> PyTree:
        """The pytree of `jax.ShapeDtypeStruct`s (static leaves as-is).

        Equal to what `jax.eval_shape` returns for the same call.
        """
        return jtu.tree_unflatten(self._treedef, self._leaves)  # fresh: callers may mutate it

    def _array_leaves(self) -> Iterator[jax.ShapeDtypeStruct]:
        return (leaf for leaf in self._leaves if isinstance(leaf, jax.ShapeDtypeStruct))

    def __len__(self) -> int:
        return len(self._leaves)

    @property
    def size(self) -> int:
        """Total number of elements of the array leaves (one per PRNG key)."""
        size: int = self._memo("size", lambda: sum(math.prod(leaf.shape) for leaf in self._array_leaves()))
        return size

    @property
    def nbytes(self) -> int:
        """Total bytes of the array leaves (PRNG keys: the bytes of their key data)."""
        nbytes: int = self._memo("nbytes", lambda: sum(_leaf_nbytes(leaf) for leaf in self._array_leaves()))
        return nbytes

    # -- building values ---------------------------------------------------
    def full(self, value: Any) -> PyTree:
        """Build a pytree of arrays of exactly this structure, filled with `value`.

        Each array keeps its leaf's shape, dtype, `weak_type` and, under
        `jax.shard_map`, its manual axes (`lax.pcast(..., to="varying")`).
        Typed PRNG-key leaves get keys made from zero key data; static leaves
        are returned as-is. At top level a leaf with a concrete sharding is
        placed with it, and one whose sharding names an abstract mesh is placed
        on the mesh set with `jax.set_mesh` (default placement otherwise).
        Under `jit` the arrays are compile-time constants, exactly like
        hand-written `jnp.full`; a leaf sharded over `Explicit` mesh axes
        keeps that sharding, which is part of its type there (so the result
        type-checks as a `lax.scan` carry).

        Args:
            value: The fill value, converted to each leaf's dtype.

        Returns:
            A pytree with this structure's treedef.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of((jnp.zeros(2, jnp.int32), 1.0))
            >>> s.full(7)
            (Array([7, 7], dtype=int32), Array(7., dtype=float32, weak_type=True))
        """
        if not _is_fill_value(value):
            raise TypeError(
                f"treeshape.Structure.full: `value` must be a number or bool scalar (or a 0-d array), got "
                f"{type(value).__name__} {value!r}. For other fills, use `jax.tree.map` over `structure.tree`."
            )
        top = _compat.at_top_level()
        leaves = [_filled(x, value, top) if isinstance(x, jax.ShapeDtypeStruct) else x for x in self._leaves]
        return jtu.tree_unflatten(self._treedef, leaves)

    def zeros(self) -> PyTree:
        """Build a pytree of zeros of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of({"count": 0, "mu": jnp.ones(2)}).zeros()
            {'count': Array(0, dtype=int32, weak_type=True), 'mu': Array([0., 0.], dtype=float32)}
        """
        return self.full(0)

    def ones(self) -> PyTree:
        """Build a pytree of ones of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of([jnp.zeros(2, jnp.bfloat16)]).ones()
            [Array([1, 1], dtype=bfloat16)]
        """
        return self.full(1)

    # -- comparing -----------------------------------------------------------
    def diff(self, tree: PyTree) -> list[Mismatch]:
        """List every difference between this structure and `tree`, in leaf order.

        Compares the tree structure (missing and extra dict keys, different
        node types, different lengths), then each leaf's shape, dtype,
        `weak_type` and manual axes (kind `"vma"`). Sharding is not compared.

        Args:
            tree: A pytree of arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy
                or Python scalars and static values, or another Structure.

        Returns:
            A list of [treeshape.Mismatch][], empty when `tree` matches.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of({"w": jnp.zeros(3), "b": jnp.zeros(3)})
            >>> for m in s.diff({"w": jnp.zeros(3, jnp.int32)}):
            ...     print(m)
            tree['b']: missing; expected f32[3].
            tree['w']: expected dtype float32, got int32.
        """
        return diff_structures(self, _as_structure(tree), "tree")

    def matches(self, tree: PyTree) -> bool:
        """Return `True` iff `self.diff(tree)` is empty.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of(jnp.zeros(3)).matches(jnp.ones(3))
            True
        """
        return not self.diff(tree)

    def check(self, tree: PyTree) -> None:
        """Raise if `tree` does not match this structure.

        Args:
            tree: As for [treeshape.Structure.diff][].

        Raises:
            StructureMismatchError: listing every mismatch, each with its
                path, expected and actual value, and a fix.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of({"w": jnp.zeros(3)}).check({"w": jnp.zeros(4)})
            Traceback (most recent call last):
            ...
            treeshape._errors.StructureMismatchError: treeshape.Structure.check: the tree does not match:
            tree['w']: expected shape (3,), got (4,). Make this leaf shape (3,).
        """
        mismatches = self.diff(tree)
        if mismatches:
            header = "treeshape.Structure.check: the tree does not match"
            raise StructureMismatchError(format_mismatches(header, mismatches), mismatches)

    # -- value semantics -----------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        return self._memo("key", lambda: (self._treedef, tuple(_leaf_key(leaf) for leaf in self._leaves)))  # type: ignore[no-any-return]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Structure):
            return NotImplemented
        return self is other or self._key() == other._key()

    def __hash__(self) -> int:
        def compute() -> int:
            treedef, keys = self._key()
            # An unhashable static leaf (compared by `==` only) hashes by its type.
            return hash((treedef, tuple(k if _hashable(k) else (False, k[1]) for k in keys)))

        value: int = self._memo("hash", compute)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        # Devices do not pickle: a concrete sharding travels as its abstract
        # form (a NamedSharding keeps its spec over the abstract mesh). Equality
        # ignores sharding, so the copy is equal to the original.
        return (Structure, (self._treedef, tuple(_picklable_leaf(leaf) for leaf in self._leaves)))

    def __str__(self) -> str:
        from ._display import table

        return table(self)

    def _repr_html_(self) -> str:
        from ._display import html_table

        return html_table(self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Render in treescope (when it is installed) as a foldable tree of compact leaves."""
        from treescope import repr_lib

        compact = jtu.tree_unflatten(self._treedef, [_Text(leaf_str(leaf)) for leaf in self._leaves])
        summary = {"tree": compact, "leaves": len(self), "size": self.size, "nbytes": _Text(human_bytes(self.nbytes))}
        return repr_lib.render_object_constructor(type(self), summary, path, subtree_renderer)

    def __repr__(self) -> str:
        try:
            body = repr(jtu.tree_unflatten(self._treedef, [_Text(leaf_str(leaf)) for leaf in self._leaves]))
        except Exception:  # a custom node that rejects placeholder leaves
            body = str(self._treedef)
        body = " ".join(body.split())
        if len(body) > _MAX_REPR:
            body = body[: _MAX_REPR - 3] + "..."
        n = len(self)
        return f"Structure({body}, {n} {'leaf' if n == 1 else 'leaves'}, {human_bytes(self.nbytes)})"


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _picklable_leaf(leaf: Any) -> Any:
    if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.sharding is None:
        return leaf
    sharding = leaf.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):
        if isinstance(sharding.mesh, jax.sharding.AbstractMesh):
            return leaf
        abstract = jax.sharding.NamedSharding(sharding.mesh.abstract_mesh, sharding.spec)
        return leaf.update(sharding=abstract)
    return leaf.update(sharding=None)


def _as_structure(tree: PyTree) -> Structure:
    if isinstance(tree, Structure):
        return tree
    from ._infer import abstract_structure_of

    return abstract_structure_of(tree)


# -- diff ----------------------------------------------------------------------
def diff_structures(expected: Structure, actual: Structure, root: str) -> list[Mismatch]:
    """Every difference between two structures, with paths under `root`."""
    if _equal(expected, actual):  # the common case, and cheap: keys are memoised per Structure
        return []
    out: list[Mismatch] = []
    if expected.treedef == actual.treedef:
        for path, e, a in zip(expected.paths, expected.leaves, actual.leaves, strict=True):
            _diff_leaf(root + path, e, a, out)
    else:
        _diff_nodes(expected.treedef, expected.leaves, actual.treedef, actual.leaves, root, out)
    return out


def _equal(a: Structure, b: Structure) -> bool:
    try:
        return a == b
    except Exception:  # static leaves (e.g. NumPy arrays) whose `==` is not a bool
        return False


def _diff_leaf(path: str, e: Any, a: Any, out: list[Mismatch]) -> None:
    e_array = isinstance(e, jax.ShapeDtypeStruct)
    a_array = isinstance(a, jax.ShapeDtypeStruct)
    if not (e_array and a_array):
        if e_array != a_array or not _static_equal(e, a):
            out.append(Mismatch(path, "structure", _describe_leaf(e), _describe_leaf(a)))
        return
    if e.shape != a.shape:
        out.append(Mismatch(path, "shape", e.shape, a.shape))
    if e.dtype != a.dtype:
        out.append(Mismatch(path, "dtype", e.dtype, a.dtype))
    if e.weak_type != a.weak_type:
        out.append(Mismatch(path, "weak_type", e.weak_type, a.weak_type))
    if varying_axes(e) != varying_axes(a):
        out.append(Mismatch(path, "vma", varying_axes(e), varying_axes(a)))


def _static_equal(e: Any, a: Any) -> bool:
    try:
        return type(e) is type(a) and bool(e == a)
    except Exception:
        return e is a


def _describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf_str(leaf)
    return f"the static value {leaf_str(leaf)}"


def _describe_node(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...], with_data: bool = False) -> str:
    if jtu.treedef_is_leaf(treedef):
        return _describe_leaf(leaves[0]) if leaves else "None"
    node_type, aux = treedef.node_data()
    keys = _mapping_keys(node_type, aux)
    if keys is not None:
        return f"{_type_name(node_type)} with keys {list(keys)}"
    if with_data:
        return f"{_type_name(node_type)} with static data {aux!r}"
    n = len(treedef.children())
    return f"{_type_name(node_type)} with {n} {'child' if n == 1 else 'children'}"


def _mapping_keys(node_type: type, aux: Any) -> Any:
    """The keys of a dict-like node (dict, OrderedDict, defaultdict), else None."""
    if node_type is dict or node_type is collections.OrderedDict:
        return aux
    if node_type is collections.defaultdict:
        return aux[1]
    return None


def _type_name(node_type: type) -> str:
    name = node_type.__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _child_keys(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> list[Any]:
    node_type, _ = treedef.node_data()
    if issubclass(node_type, tuple) and hasattr(node_type, "_fields"):
        # flatten_one_level_with_keys names every namedtuple child after the
        # first field in JAX 0.10.2; the fields are the keys.
        return [jtu.GetAttrKey(name) for name in node_type._fields]
    keyed, _ = jtu.flatten_one_level_with_keys(jtu.tree_unflatten(treedef, leaves))
    return [key for key, _ in keyed]


def _split(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> list[tuple[jtu.PyTreeDef, tuple[Any, ...]]]:
    parts = []
    start = 0
    for child in treedef.children():
        parts.append((child, leaves[start : start + child.num_leaves]))
        start += child.num_leaves
    return parts


def _diff_nodes(
    e_td: jtu.PyTreeDef,
    e_leaves: tuple[Any, ...],
    a_td: jtu.PyTreeDef,
    a_leaves: tuple[Any, ...],
    path: str,
    out: list[Mismatch],
) -> None:
    if e_td == a_td:
        sub = Structure(e_td, e_leaves)
        for p, e, a in zip(sub.paths, e_leaves, a_leaves, strict=True):
            _diff_leaf(path + p, e, a, out)
        return
    e_leaf, a_leaf = jtu.treedef_is_leaf(e_td), jtu.treedef_is_leaf(a_td)
    if e_leaf and a_leaf and e_leaves and a_leaves:
        _diff_leaf(path, e_leaves[0], a_leaves[0], out)
        return
    e_node = None if e_leaf else e_td.node_data()
    a_node = None if a_leaf else a_td.node_data()
    if e_node is None or a_node is None or e_node[0] is not a_node[0]:
        out.append(Mismatch(path, "structure", _describe_node(e_td, e_leaves), _describe_node(a_td, a_leaves)))
        return
    node_type = e_node[0]
    e_keys, a_keys = _mapping_keys(node_type, e_node[1]), _mapping_keys(node_type, a_node[1])
    if e_keys is not None and a_keys is not None:
        # Same kind of mapping: match children by key, report missing and extra keys.
        e_children = dict(zip(e_keys, _split(e_td, e_leaves), strict=True))
        a_children = dict(zip(a_keys, _split(a_td, a_leaves), strict=True))
        ordered = node_type is collections.OrderedDict  # JAX keeps its insertion order
        _diff_children(e_children, a_children, jtu.DictKey, path, out, ordered)
        return
    if node_type is list or node_type is tuple:
        # Same sequence type, different lengths: match children by index.
        e_items = dict(enumerate(_split(e_td, e_leaves)))
        a_items = dict(enumerate(_split(a_td, a_leaves)))
        _diff_children(e_items, a_items, jtu.SequenceKey, path, out)
        return
    if e_node != a_node or len(e_td.children()) != len(a_td.children()):
        # The same custom node type with other static data (or arity).
        with_data = len(e_td.children()) == len(a_td.children())
        out.append(
            Mismatch(
                path,
                "structure",
                _describe_node(e_td, e_leaves, with_data),
                _describe_node(a_td, a_leaves, with_data),
            )
        )
        return
    keys = _child_keys(e_td, e_leaves)
    for key, (e_sub, e_sub_leaves), (a_sub, a_sub_leaves) in zip(
        keys, _split(e_td, e_leaves), _split(a_td, a_leaves), strict=True
    ):
        _diff_nodes(e_sub, e_sub_leaves, a_sub, a_sub_leaves, path + jtu.keystr((key,)), out)


_Children = dict[Any, tuple[jtu.PyTreeDef, tuple[Any, ...]]]


def _diff_children(
    expected: _Children, actual: _Children, make_key: Any, path: str, out: list[Mismatch], ordered: bool = False
) -> None:
    """Diff children matched by key, in leaf order: shared ones recursively,
    missing and extra ones as one structure mismatch each."""
    keys = list(expected) + [k for k in actual if k not in expected]
    if not ordered:
        try:
            keys = sorted(keys)
        except TypeError:  # keys of mixed types: keep the expected order, then the extra ones
            pass
    for key in keys:
        sub_path = path + jtu.keystr((make_key(key),))
        if key not in actual:
            out.append(Mismatch(sub_path, "structure", _describe_node(*expected[key]), None))
        elif key not in expected:
            out.append(Mismatch(sub_path, "structure", None, _describe_node(*actual[key])))
        else:
            _diff_nodes(*expected[key], *actual[key], sub_path, out)
