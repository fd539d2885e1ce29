"""Shardings: placing top-level values on their meshes (also across processes),
`Structure.with_shardings`, per-device bytes, and the sharding part of a loop
carry's type.

JAX's own shardings and `jax.distributed` do all the distributed work; this
module only decides which sharding each leaf gets and asks JAX to honour it.
"""

import functools as ft
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu
import numpy as np

from . import _compat, _tree
from ._compat import spec_text
from ._errors import SHOWN, check_path_leaf_callback, first_few
from ._leaf import leaf_str
from ._shapes import is_symbolic, leaf_nbytes
from ._tree import clip
from ._views import StructureView


PyTree = Any
_P = jax.sharding.PartitionSpec
_UNRESOLVED: Final = object()


# -- specs -----------------------------------------------------------------------
def _entry_names(entry: Any) -> tuple[str, ...]:
    """The mesh axis names one spec entry partitions a dimension over."""
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, tuple):
        return tuple(a for a in entry if isinstance(a, str))
    return ()


def _normal_entry(entry: Any) -> Any:
    """`('d',)` and `'d'` split a dimension alike: one spelling for each."""
    if isinstance(entry, tuple) and len(entry) == 1:
        return entry[0]
    return entry


def normalized_spec(spec: Any, rank: int) -> Any:
    """`spec` with one entry per dimension: `P('d')` and `P('d', None)` of a rank-2 leaf are
    the same spec, and print the same."""
    given = _compat.spec_entries(spec)
    entries = [_normal_entry(e) for e in given] + [None] * (rank - len(given))
    extra = {}
    for name in ("unreduced", "reduced"):
        value = getattr(spec, name, None)
        if value:
            extra[name] = value
    return _P(*entries, **extra)


def spec_str(sharding: Any, rank: int) -> str:
    """A sharding's `PartitionSpec`, one entry per dimension, when it names a mesh axis; else ""."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return ""
    names_an_axis = any(entry is not None for entry in _compat.spec_entries(spec)) or bool(
        getattr(spec, "unreduced", None) or getattr(spec, "reduced", None)
    )
    return spec_text(normalized_spec(spec, rank)) if names_an_axis else ""


def _mesh_sizes(mesh: Any) -> dict[str, int]:
    return dict(mesh.shape)


def _device_count(sharding: Any) -> int:
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None:
        return int(mesh.size)
    try:
        return len(sharding.device_set)
    except Exception:  # a sharding that cannot list its devices
        return 1


def shard_shape(leaf: jax.ShapeDtypeStruct) -> tuple[int, ...]:
    """The shape of the largest shard of `leaf` on one device (its whole shape if unsharded)."""
    sharding, shape = leaf.sharding, tuple(leaf.shape)
    if sharding is None:
        return shape
    if isinstance(sharding, jax.sharding.NamedSharding):
        sizes = _mesh_sizes(sharding.mesh)
        out = list(shape)
        for d, entry in enumerate(_compat.spec_entries(sharding.spec)[: len(shape)]):
            ways = math.prod(sizes.get(name, 1) for name in _entry_names(entry))
            # A padded last shard is as large as the others; a symbolic size is divisible (`_fit_problem`).
            out[d] = shape[d] // ways if is_symbolic(shape[d]) else -(-shape[d] // ways)
        return tuple(out)
    try:
        return tuple(sharding.shard_shape(shape))
    except Exception:  # a sharding that does not fit: count the leaf whole
        return shape


def is_partitioned(leaf: Any) -> bool:
    """Whether a leaf's sharding splits it, so that a device holds less than all of it."""
    return isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None and shard_shape(leaf) != leaf.shape


def is_replicated(leaf: Any) -> bool:
    """Whether a leaf's sharding puts a whole copy on each of several devices."""
    if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.sharding is None:
        return False
    return shard_shape(leaf) == tuple(leaf.shape) and _device_count(leaf.sharding) > 1


def per_device_nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    """The bytes of `leaf`'s largest shard (its whole size when unsharded)."""
    shape = shard_shape(leaf)
    if shape == tuple(leaf.shape):
        return leaf_nbytes(leaf)
    return leaf_nbytes(jax.ShapeDtypeStruct(shape, leaf.dtype))


# -- placing values at top level ------------------------------------------------------
def same_axes(a: Any, b: Any) -> bool:
    """Whether two meshes (abstract or concrete) have the same axis names, sizes and types.

    An abstract mesh read from JSON or planned by hand with `AbstractMesh` knows no
    device kind, so it never equals a concrete mesh's `abstract_mesh`; placing values
    needs only the axes to agree.
    """
    return (a.axis_names, a.axis_sizes, tuple(a.axis_types)) == (b.axis_names, b.axis_sizes, tuple(b.axis_types))


def abstract_mesh_of(sharding: Any) -> Any:
    mesh = getattr(sharding, "mesh", None)
    return mesh if isinstance(mesh, jax.sharding.AbstractMesh) else None


def has_abstract_mesh(structure: StructureView) -> bool:
    """Whether some array leaf's sharding names an abstract mesh (which needs a concrete one)."""
    return any(
        isinstance(leaf, jax.ShapeDtypeStruct) and abstract_mesh_of(leaf.sharding) is not None
        for leaf in structure.leaves
    )


def concrete_meshes(trees: Sequence[Any]) -> tuple[Any, ...]:
    """The concrete meshes that arrays (and `ShapeDtypeStruct`s) among `trees`' leaves are
    placed on, plus the mesh set with `jax.set_mesh`, first seen first, one per abstract mesh."""
    found: dict[Any, Any] = {}
    current = _compat.current_mesh()
    candidates = [] if current.empty else [current]
    for tree in trees:
        for x in jtu.tree_leaves(tree):
            if isinstance(x, jax.core.Tracer) or not isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
                continue
            mesh = getattr(x.sharding, "mesh", None)
            if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty:
                candidates.append(mesh)
    for mesh in candidates:
        found.setdefault(mesh.abstract_mesh, mesh)
    return tuple(found.values())


def resolved(sharding: Any, meshes: Sequence[Any]) -> Any:
    """`sharding` over the `jax.set_mesh` mesh or one of `meshes` when it names an abstract
    mesh with their axes (itself when it names none), else None."""
    found = _resolve(sharding, meshes)
    return None if found is _UNRESOLVED else found


def _resolve(sharding: Any, meshes: Sequence[Any]) -> Any:
    """A concrete sharding for `sharding`: itself, or over the `jax.set_mesh` mesh or one of
    `meshes` when it names an abstract mesh (else `_UNRESOLVED`)."""
    abstract = abstract_mesh_of(sharding)
    if abstract is None:
        return sharding
    current = _compat.current_mesh()
    choices = ([] if current.empty else [current]) + list(meshes)
    for mesh in choices:
        if same_axes(mesh, abstract):
            return jax.sharding.NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)
    return _UNRESOLVED


def _mesh_str(mesh: Any) -> str:
    axes = ", ".join(f"{name!r}: {size}" for name, size in _mesh_sizes(mesh).items())
    kinds = sorted({kind.name for kind in mesh.axis_types})
    return f"{axes}; {'/'.join(kinds)}"


class _Fill:
    """A fill value as a cache key: by type and exact value (`0.0` and `-0.0` differ)."""

    __slots__ = ("value", "key")

    def __init__(self, value: Any) -> None:
        if isinstance(value, jax.Array):
            value = np.asarray(value)
        if isinstance(value, (np.ndarray, np.generic)):
            key: Any = (np.dtype(value.dtype).name, np.asarray(value).tobytes())
        else:
            key = (type(value), repr(value))
        self.value, self.key = value, key

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Fill) and other.key == self.key


@ft.lru_cache(maxsize=32)
def _constructor(
    leaves: tuple[jax.ShapeDtypeStruct, ...], shardings: tuple[Any, ...], fill: _Fill, filled: Callable[..., Any]
) -> Callable[[], list[Any]]:
    """One jitted function that makes every leaf directly on its sharding: each process
    computes only its own shards, and no process holds a whole global array."""

    def build() -> list[Any]:
        return [filled(leaf, fill.value, False) for leaf in leaves]

    return jax.jit(build, out_shardings=list(shardings))


def place(
    structure: StructureView, meshes: Sequence[Any], value: Any, fn_name: str, filled: Callable[..., Any]
) -> list[Any]:
    """The leaves of `structure.zeros()` (etc.) at top level, each on its sharding.

    Shardings over an abstract mesh are resolved to the `jax.set_mesh` mesh, else to a
    mesh in `meshes` (those of the `out_structure` call that made it); if neither fits, `ValueError`.
    StructureView whose sharding spans devices of other processes are built by one jitted
    function with those `out_shardings`; the others directly, as `lax.full` does.
    """
    leaves = structure.leaves
    shardings: list[Any] = []
    unresolved: list[int] = []
    for i, leaf in enumerate(leaves):
        sharding = leaf.sharding if isinstance(leaf, jax.ShapeDtypeStruct) else None
        if sharding is not None:
            sharding = _resolve(sharding, meshes)
            if sharding is _UNRESOLVED:
                unresolved.append(i)
        shardings.append(sharding)
    if unresolved:
        paths = ["tree" + structure.paths[i] for i in unresolved]
        first = leaves[unresolved[0]]
        example = f"{leaf_str(first)} {spec_str(first.sharding, len(first.shape)) or 'P()'}"
        raise ValueError(_unresolved_mesh_message(f"Structure.{fn_name}", paths, example, first.sharding.mesh))
    out = list(leaves)
    remote: list[int] = []
    for i, (leaf, sharding) in enumerate(zip(leaves, shardings, strict=True)):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            continue
        if sharding is not None and not sharding.is_fully_addressable:
            remote.append(i)
        else:
            out[i] = filled(leaf, value, True, sharding)
    if remote:
        build = _constructor(
            tuple(leaves[i].update(sharding=None) for i in remote),
            tuple(shardings[i] for i in remote),
            _Fill(value),
            filled,
        )
        for i, x in zip(remote, build(), strict=True):
            out[i] = x
    return out


def _unresolved_mesh_message(fn_name: str, paths: Sequence[str], example: str, abstract: Any) -> str:
    """StructureView sharded over an abstract mesh that no concrete mesh in sight matches."""
    mesh = _mesh_str(abstract)
    if len(paths) == 1:
        what = f"{paths[0]} ({example}) is sharded over an abstract mesh ({mesh})"
    else:
        listed = first_few([f"{paths[0]} ({example})", *paths[1:SHOWN]], len(paths))
        what = f"{len(paths)} leaves are sharded over an abstract mesh ({mesh}): {listed}"
    current = _compat.current_mesh()
    if not current.empty and (current.axis_names, current.axis_sizes) == (abstract.axis_names, abstract.axis_sizes):
        return (
            f"treeshape.{fn_name}: {what}, and the mesh set with `jax.set_mesh` ({_mesh_str(current)}) has "
            "these axes of other axis types. Make the types agree: plan with "
            "`AbstractMesh(sizes, names, axis_types=...)` of the set mesh's types (or its `mesh.abstract_mesh`), "
            "or set a mesh of the Structure's types."
        )
    where = (
        "none is set with `jax.set_mesh`"
        if current.empty
        else f"the one set with `jax.set_mesh` has {_mesh_str(current)}"
    )
    return (
        f"treeshape.{fn_name}: {what}; no concrete mesh "
        f"with those axes is known here: {where}, and this Structure does not come "
        "from an `out_structure` call whose arguments live on such a mesh (e.g. it was unpickled or read "
        "from JSON). treeshape does not drop a sharding silently. Either build the values inside "
        "`with jax.set_mesh(mesh):`, or give the leaves concrete shardings first: "
        "`s.with_shardings(NamedSharding(mesh, P(...)))` (a callable `(path, leaf) -> Sharding` picks one "
        "per leaf; `s.with_shardings(None)` keeps JAX's default placement)."
    )


# -- with_shardings ------------------------------------------------------------------
def _is_sharding_leaf(x: Any) -> bool:
    return x is None or isinstance(x, jax.sharding.Sharding)


def _what(x: Any) -> str:
    spec = isinstance(x, jax.sharding.PartitionSpec)
    text = clip(spec_text(x) if spec else repr(x), 60)
    kind = "a PartitionSpec" if spec else type(x).__name__
    return f"{kind} {text}"


def _node(x: Any) -> tuple[Any, list[tuple[Any, Any]]] | None:
    """`(node type and static data, keyed children)` of a pytree node, or None for a leaf."""
    if _is_sharding_leaf(x):
        return None
    try:
        keyed, aux = _tree.keyed_children(x)
    except ValueError:  # a leaf
        return None
    return (type(x), aux), list(keyed)


def _node_str(x: Any) -> str:
    node = _node(x)
    if node is None:
        return "a leaf" if not _is_sharding_leaf(x) else _what(x)
    (kind, _), keyed = node
    if isinstance(x, dict):
        return f"a {kind.__name__} with keys {sorted(x, key=repr)}"
    return f"a {kind.__name__} with {len(keyed)} children"


def _prefix_mismatch(prefix: Any, tree: Any) -> tuple[str, str, str]:
    """Where `prefix` stops being a prefix of `tree`: (keystr path, prefix's node, tree's node)."""
    stack = [("", prefix, tree)]
    while stack:
        path, p, t = stack.pop()
        p_node = _node(p)
        if p_node is None:
            continue
        t_node = _node(t)
        if t_node is None or p_node[0] != t_node[0] or len(p_node[1]) != len(t_node[1]):
            return path, _node_str(p), _node_str(t)
        pairs = zip(p_node[1], t_node[1], strict=True)
        stack.extend(reversed([(path + _tree.key_text(pk), pc, tc) for (pk, pc), (_, tc) in pairs]))
    return "", _node_str(prefix), _node_str(tree)


def _fit_problem(leaf: jax.ShapeDtypeStruct, sharding: Any) -> str | None:
    """Why `sharding` cannot shard `leaf` (rank, divisibility), or None if it can."""
    shape = tuple(leaf.shape)
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = _compat.spec_entries(sharding.spec)
        if len(spec) > len(shape):
            what = "a scalar, whose spec must be P() (replicated)" if not shape else f"of rank {len(shape)}"
            entries = f"{len(spec)} {'entry' if len(spec) == 1 else 'entries'}"
            return f"its spec {spec_text(sharding.spec)} has {entries}, but the leaf is {what}"
        sizes = _mesh_sizes(sharding.mesh)
        for d, entry in enumerate(spec):
            names = _entry_names(entry)
            ways = math.prod(sizes.get(name, 1) for name in names)
            if ways > 1 and is_symbolic(shape[d]) and is_symbolic(shape[d] % ways):
                text = str(shape[d])
                multiple = f"`{ways}*{text}`" if text.isidentifier() else f"a multiple of {ways}"
                return (
                    f"dimension {d} (size {shape[d]}) would be split {ways} ways over mesh axes {names}, which "
                    f"divides {shape[d]} only for some sizes: constrain it, e.g. "
                    f'`jax.export.symbolic_shape(..., constraints=["mod({shape[d]}, {ways}) == 0"])`, or write the '
                    f"dimension as {multiple}"
                )
            if ways > 1 and shape[d] % ways:
                return (
                    f"dimension {d} (size {shape[d]}) would be split {ways} ways over mesh axes {names}, "
                    f"which does not divide {shape[d]}"
                )
        return None
    try:
        sharding.shard_shape(shape)
    except Exception as err:  # JAX's own check, for other kinds of sharding
        return str(err).split("\n")[0]
    return None


def split_problem(leaf: jax.ShapeDtypeStruct) -> str | None:
    """Why a leaf's own sharding does not divide its shape (a symbolic dimension split
    without a constraint that makes it divide, or a size the mesh does not divide), or
    None; as `with_shardings` checks a new sharding."""
    if leaf.sharding is None:
        return None
    return _fit_problem(leaf, leaf.sharding)


def split_message(who: str, where: str, leaf: jax.ShapeDtypeStruct, problem: str) -> str:
    """A leaf whose sharding does not divide it (`split_problem`), at `where`."""
    spec = spec_str(leaf.sharding, len(leaf.shape)) or repr(leaf.sharding)
    return (
        f"treeshape.{who}: the sharding of {where} ({leaf_str(leaf)}, {spec}) does not fit it: {problem}. "
        "JAX would refuse it once the dimension has a size (an IndivisibleError)."
    )


def with_shardings(structure: StructureView, shardings: Any) -> list[Any]:
    """The leaves of `structure.with_shardings(shardings)` (see there)."""
    leaves = structure.leaves
    paths = structure.paths
    if _is_sharding_leaf(shardings):
        per_leaf: list[Any] = [shardings] * len(leaves)
        where = ["`shardings`"] * len(leaves)
    elif callable(shardings) and jtu.treedef_is_leaf(jtu.tree_structure(shardings)):
        check_path_leaf_callback(shardings, "Structure.with_shardings", "a `Sharding` or None")
        per_leaf, where = [], []
        for path, leaf in zip(paths, leaves, strict=True):
            per_leaf.append(shardings(path, leaf) if isinstance(leaf, jax.ShapeDtypeStruct) else None)
            where.append(f"`shardings({path!r}, leaf)`")
    else:
        p_leaves, p_treedef_ = jtu.tree_flatten_with_path(shardings, is_leaf=_is_sharding_leaf)
        p_treedef: jtu.PyTreeDef = p_treedef_
        tree = structure.tree
        try:
            subtrees = p_treedef.flatten_up_to(tree)
        except (ValueError, TypeError):
            path, expected, actual = _prefix_mismatch(shardings, tree)
            raise ValueError(_shardings_prefix_message("tree" + path, expected, actual)) from None
        per_leaf, where = [], []
        for (p_path, value), sub in zip(p_leaves, subtrees, strict=True):
            sub_treedef: jtu.PyTreeDef = jtu.tree_structure(sub)
            n = sub_treedef.num_leaves
            per_leaf += [value] * n
            where += [f"shardings{jtu.keystr(p_path)}" if p_path else "`shardings`"] * n
        if len(per_leaf) != len(leaves):  # a static leaf that flattens differently: be safe
            raise ValueError(_shardings_prefix_message("tree", _node_str(shardings), _node_str(tree)))
    wrong = [
        (where[i], _what(s), isinstance(s, jax.sharding.PartitionSpec))
        for i, s in enumerate(per_leaf)
        if isinstance(leaves[i], jax.ShapeDtypeStruct) and not _is_sharding_leaf(s)
    ]
    if wrong:
        raise TypeError(_shardings_type_message(list(dict.fromkeys(wrong))))
    out, unfit = [], []
    for path, leaf, sharding in zip(paths, leaves, per_leaf, strict=True):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            out.append(leaf)
            continue
        problem = None if sharding is None else _fit_problem(leaf, sharding)
        if problem is not None:
            unfit.append(f"tree{path} ({leaf_str(leaf)}): {problem}")
        elif sharding is not leaf.sharding:
            leaf = leaf.update(sharding=sharding)
        out.append(leaf)
    if unfit:
        raise ValueError(_shardings_unfit_message(unfit))
    return out


def _shardings_prefix_message(path: str, expected: str, actual: str) -> str:
    """`with_shardings` got a pytree that is not a prefix of the structure's tree."""
    where = "the top" if path == "tree" else path
    return (
        f"treeshape.Structure.with_shardings: `shardings` is not a prefix of the structure's tree: at {where} "
        f"it has {expected}, where the tree has {actual}. Give one `Sharding` (or `None`) per subtree, in "
        "containers like the tree's (the same dict keys and lengths), or one `Sharding` for every leaf, or a "
        "callable `(path, leaf) -> Sharding | None`."
    )


def _shardings_type_message(wrong: Sequence[tuple[str, str, bool]]) -> str:
    """`with_shardings` values that are not shardings: (where, what it is, is a PartitionSpec)."""
    lines = [f"{where} is {what}" for where, what, _ in wrong]
    fix = "Each value must be a `jax.sharding.Sharding` (e.g. `NamedSharding(mesh, P('data'))`) or `None`."
    if any(is_spec for _, _, is_spec in wrong):
        fix += " A PartitionSpec needs its mesh: wrap it as `NamedSharding(mesh, spec)`."
    if len(lines) == 1:
        return f"treeshape.Structure.with_shardings: {lines[0]}, not a sharding. {fix}"
    listing = "\n".join(f"  * {line}" for line in lines)
    return f"treeshape.Structure.with_shardings: {len(lines)} values are not shardings:\n\n{listing}\n\n{fix}"


def _shardings_unfit_message(lines: Sequence[str]) -> str:
    """Shardings that do not fit their leaves (rank, divisibility): one line per leaf."""
    fix = (
        "Give such leaves a spec with at most one entry per dimension, over mesh axes whose sizes divide "
        "that dimension (`None` replicates a dimension), or `None` (a callable `(path, leaf) -> Sharding | "
        "None` can choose by `leaf.shape`)."
    )
    if len(lines) == 1:
        return f"treeshape.Structure.with_shardings: the sharding does not fit {lines[0]}. {fix}"
    listing = "\n".join(f"  * {line}" for line in lines)
    return f"treeshape.Structure.with_shardings: {len(lines)} shardings do not fit their leaves:\n\n{listing}\n\n{fix}"


# -- shardings that are part of a type (explicit mesh axes) ------------------------------
def _explicit_axes(mesh: Any) -> set[str]:
    return {
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types, strict=True)
        if kind == jax.sharding.AxisType.Explicit
    }


def traced_sharding(sharding: Any) -> Any:
    """Under a trace, the sharding that is part of a leaf's type, or None.

    With `Explicit` mesh axes the sharding is part of an array's type (a scan
    carry must keep it), so a leaf sharded over explicit axes is built with
    it, unless another mesh is in context. Auto and manual axes are not part
    of the type.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    mesh = sharding.mesh if isinstance(sharding.mesh, jax.sharding.AbstractMesh) else sharding.mesh.abstract_mesh
    current = jax.sharding.get_abstract_mesh()
    if not current.empty:
        if not same_axes(current, mesh):
            return None
        mesh = current
    explicit = _explicit_axes(mesh)
    if not any(name in explicit for entry in _compat.spec_entries(sharding.spec) for name in _entry_names(entry)):
        return None
    return jax.sharding.NamedSharding(mesh, sharding.spec)


def carry_spec(leaf: Any) -> tuple[Any, ...] | None:
    """The part of a leaf's sharding that is part of its type (explicit mesh axes), one entry
    per dimension; None when it names no explicit axis."""
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return None
    explicit = _explicit_axes(sharding.mesh)
    if not explicit:
        return None
    entries = []
    for entry in _compat.spec_entries(normalized_spec(sharding.spec, len(leaf.shape))):
        names = tuple(name for name in _entry_names(entry) if name in explicit)
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return tuple(entries) if any(e is not None for e in entries) else None


def reshard(x: Any, want: jax.ShapeDtypeStruct, fn_name: str, where: Callable[[], str]) -> Any:
    """`x` resharded to `want`'s sharding (over an abstract mesh), at top level or under a trace."""
    sharding = want.sharding
    if _compat.at_top_level():
        have = getattr(x, "sharding", None)
        mesh = getattr(have, "mesh", None)
        meshes = (mesh,) if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty else ()
        concrete = _resolve(sharding, meshes)
        if concrete is _UNRESOLVED:
            rank = len(want.shape)
            raise ValueError(_carry_reshard_message(fn_name, where(), spec_text(spec_value(carry_spec(want), rank))))
        sharding = concrete
    return jax.sharding.reshard(x, sharding)


def _set_mesh_text() -> str:
    current = _compat.current_mesh()
    return (
        "no mesh is set"
        if current.empty
        else f"the mesh set with `jax.set_mesh` ({_mesh_str(current)}) is not its mesh"
    )


def _carry_reshard_message(fn_name: str, where: str, spec: str) -> str:
    """`init` must move to an explicit-axes sharding but no concrete mesh is in sight."""
    return (
        f"treeshape.{fn_name}: {where} must be resharded to {spec} (the body returns it so, and explicit "
        f"mesh axes are part of a carry's type), but it is not placed on a mesh and {_set_mesh_text()}. Call it "
        "inside `with jax.set_mesh(mesh):`, or place the initial value on the mesh first "
        "(`jax.device_put(x, NamedSharding(mesh, P()))`)."
    )


def spec_value(spec: tuple[Any, ...] | None, rank: int) -> Any:
    """A carry spec (`carry_spec`) as a `PartitionSpec` with one entry per dimension."""
    return _P(*(spec if spec is not None else (None,) * rank))
