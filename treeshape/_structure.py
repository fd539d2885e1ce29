"""`Structure`: the immutable description of a pytree (its treedef and one
description per leaf), and `read_structure`, which reads one from an existing
tree without tracing."""

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

import jax
import jax.tree_util as jtu

from . import _compare, _compat, _dims, _json, _json_load, _sharding, _values
from ._compare import Ignorable
from ._errors import (
    Mismatch,
    StructureMismatchError,
    format_mismatches,
)
from ._leaf import (
    IntTooBig,
    extent_message,
    flatten,
    int_too_big_message,
    leaf_str,
    read_leaves,
    written_by_orbax,
)
from ._nodes import wrapper_hint
from ._shapes import (
    BadShape,
    TooLarge,
    bad_shape_message,
    check_extents,
    human_bytes,
    leaf_nbytes,
    leaf_size,
    leaf_total,
)
from ._table import DEFAULT_MAX_ROWS, html_table, table
from ._tree import edge_paths


PyTree = Any
_T = TypeVar("_T")


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

    Array leaves are `jax.ShapeDtypeStruct`s; any other leaf (a string, a
    callable, an object) is a *static* leaf, kept as-is. A Structure is an
    immutable value: equality and hashing cover the treedef, the static leaves
    and each array leaf's shape, dtype, `weak_type` and manual axes (not its
    sharding), and it pickles. Build one with [treeshape.out_structure][] or
    [treeshape.structure_of][].

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.structure_of({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
        Structure({'b': f32[3], 'w': f32[2,3]}, 2 leaves, 36 B)
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    __slots__ = ("_treedef", "_leaves", "_cache", "_meshes")

    _treedef: jtu.PyTreeDef
    _leaves: tuple[Any, ...]
    _cache: dict[str, Any]
    # Concrete meshes of the `out_structure` call that made this Structure, for
    # placing leaves sharded over their abstract meshes. Set per call on a copy
    # (never on a cached entry); not compared, hashed or pickled.
    _meshes: tuple[Any, ...] | None

    def __init__(self, treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> None:
        if treedef.num_leaves != len(leaves):
            raise ValueError(f"treedef has {treedef.num_leaves} leaves, got {len(leaves)} descriptions")
        object.__setattr__(self, "_treedef", treedef)
        object.__setattr__(self, "_leaves", tuple(leaves))
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_meshes", None)

    def _on_meshes(self, meshes: tuple[Any, ...] | None) -> "Structure":
        """A copy that places abstract-mesh shardings on `meshes` (same value, same memo)."""
        copy = Structure.__new__(Structure)
        object.__setattr__(copy, "_treedef", self._treedef)
        object.__setattr__(copy, "_leaves", self._leaves)
        object.__setattr__(copy, "_cache", dict(self._cache))
        object.__setattr__(copy, "_meshes", meshes)
        return copy

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"treeshape.Structure is immutable; cannot assign {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise dataclasses.FrozenInstanceError(f"treeshape.Structure is immutable; cannot delete {name!r}")

    def _memo(self, name: str, compute: Callable[[], _T]) -> _T:
        try:
            known: _T = self._cache[name]
        except KeyError:
            known = self._cache[name] = compute()
        return known

    def _known_paths(self, head: int, tail: int) -> list[str] | None:
        """The paths of the first `head` and last `tail` leaves, if known without rebuilding
        the tree (all paths memoised, or the ends noted when it was read from a tree)."""
        paths = self._cache.get("paths")
        if paths is not None:
            return [*paths[:head], *paths[len(paths) - tail :]]
        edges = self._cache.get("edges")
        if edges is None or head > len(edges[0]) or tail > len(edges[1]):
            return None
        first: list[str] = edges[0][:head]
        last: list[str] = edges[1][:tail]
        return first + last[::-1]

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

        return self._memo("paths", compute)

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
        size: int = self._memo("size", lambda: leaf_total(self._leaves, leaf_size))
        return size

    @property
    def nbytes(self) -> int:
        """Total bytes of the array leaves (PRNG keys: the bytes of their key data)."""
        nbytes: int = self._memo("nbytes", lambda: leaf_total(self._leaves, leaf_nbytes))
        return nbytes

    @property
    def nbytes_per_device(self) -> int:
        """Bytes the array leaves put on the most loaded device, from their shardings.

        Each leaf counts its largest shard (`Sharding.shard_shape`); one
        without a sharding, or replicated, counts whole. Exact (up to XLA's
        padding) when every leaf is on one mesh, else an upper bound; equal to
        `nbytes` when nothing is split.

        Examples:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
            >>> import treeshape as ts
            >>> fsdp = NamedSharding(AbstractMesh((4,), ("fsdp",)), P("fsdp"))
            >>> s = ts.structure_of({"w": jnp.zeros((1024, 256)), "b": jnp.zeros(256)})
            >>> s = s.with_shardings({"w": fsdp, "b": None})
            >>> s.nbytes, s.nbytes_per_device
            (1049600, 263168)
        """
        per_device: int = self._memo("nbytes_per_device", lambda: leaf_total(self._leaves, _sharding.per_device_nbytes))
        return per_device

    # -- symbolic dimensions -------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        """The free dimension names of the shapes, in order of first appearance.

        Shapes may hold `jax.export` symbolic dimensions (`b`, `2*b`): then
        the Structure describes one shape per size of each name.

        Examples:
            >>> import jax
            >>> import treeshape as ts
            >>> b, s = jax.export.symbolic_shape("b, s")
            >>> ts.structure_of({"tokens": jax.ShapeDtypeStruct((b, s), "int32")}).dims
            ('b', 's')
        """
        return self._memo("dims", lambda: _dims.free_names(self._leaves))

    def bind(self, /, **sizes: int) -> "Structure":
        """Return the structure with the named dimensions replaced by sizes.

        Names left out stay free. Expressions evaluate as JAX evaluates them
        (`2*b` with `b=32` is `64`), and the sizes are checked against the
        constraints of the dimensions' symbolic scope.

        Args:
            **sizes: A size (an integer >= 1) for each name to bind, e.g. `b=32`.

        Returns:
            A new [treeshape.Structure][]; its `dims` are the names left free.

        Raises:
            ValueError: a name not among `self.dims`, a size below 1, a size
                that breaks a constraint, or sizes that make a dimension
                negative, too large, or one its sharding's mesh does not divide.
            TypeError: a size that is not an integer.

        Examples:
            >>> import jax
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> (b,) = jax.export.symbolic_shape("b", constraints=["b >= 4"])
            >>> s = ts.out_structure(lambda x: jnp.concatenate([x, x]), jax.ShapeDtypeStruct((b, 3), jnp.float32))
            >>> s
            Structure(f32[2*b,3], 1 leaf, 24*b B)
            >>> s.bind(b=32)
            Structure(f32[64,3], 1 leaf, 768 B)
        """
        checked = _dims.check_sizes(sizes, self.dims, self._leaves, "Structure.bind")
        if not checked:
            return self
        given = ", ".join(f"{name}={size}" for name, size in checked.items())
        smaller = "Choose smaller sizes (or check the shape: a dimension multiplied twice?)."
        try:
            leaves, negative = _dims.bind_leaves(self._leaves, checked)
        except _dims.DimOverflow as e:
            where = f"tree{self.paths[e.index]} ({leaf_str(self._leaves[e.index])})"
            raise ValueError(f"treeshape.Structure.bind: at {where}, {e.problem}. {smaller}") from None
        if negative:
            i = negative[0]
            raise ValueError(
                f"treeshape.Structure.bind: {given} makes tree{self.paths[i]} ({leaf_str(self._leaves[i])}) "
                f"shape {leaves[i].shape}, with a negative size. Choose sizes for which every dimension is >= 0."
            )
        bound = self._with_leaves(leaves)
        bound._check_extents("Structure.bind", f"At {given}, {smaller[0].lower()}{smaller[1:]}")
        for i, (before, after) in enumerate(zip(self._leaves, leaves, strict=True)):
            if after is not before and isinstance(after, jax.ShapeDtypeStruct) and after.sharding is not None:
                problem = _sharding.split_problem(after)
                if problem is not None:
                    where = f"tree{self.paths[i]} ({leaf_str(before)} at {given})"
                    raise ValueError(
                        f"treeshape.Structure.bind: {given} makes a size the mesh does not divide: the sharding of "
                        f"{where} does not fit it: {problem}. Choose a size the mesh divides, or constrain the "
                        "dimension so that every size does (`mod(b, 2) == 0`)."
                    )
        return bound

    def match_dims(self, tree: PyTree) -> dict[str, int]:
        """Return the sizes that `tree` binds this structure's dimension names to.

        The first leaf whose dimension tells a name's size (`b` from 5, also
        from `2*b` or `b + 1`) binds it; every other use must agree. Only
        shapes and the tree structure are compared.

        Args:
            tree: A pytree of arrays or `jax.ShapeDtypeStruct`s.

        Returns:
            Each free name's size (`{"b": 5}`), in the order of `self.dims`.

        Raises:
            StructureMismatchError: a name takes two sizes, a size breaks a
                constraint, no leaf tells a name's size, or another shape or
                the tree structure differs.

        Examples:
            >>> import jax
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> (b,) = jax.export.symbolic_shape("b")
            >>> x, y = jax.ShapeDtypeStruct((b, 3), jnp.float32), jax.ShapeDtypeStruct((2 * b,), jnp.int32)
            >>> s = ts.structure_of({"x": x, "y": y})
            >>> s.match_dims({"x": jnp.zeros((5, 3)), "y": jnp.zeros(10, jnp.int32)})
            {'b': 5}
        """
        binding, found = _dims.match(self, read_structure(tree, "Structure.match_dims"), "tree")
        problems = [m for m in found if m.kind in ("shape", "structure")]
        if problems:
            header = "treeshape.Structure.match_dims: the tree does not fit"
            raise StructureMismatchError(format_mismatches(header, problems), problems)
        return {name: binding.sizes[name] for name in self.dims if name in binding.sizes}

    # -- building values -----------------------------------------------------
    def full(self, value: Any) -> PyTree:
        """Build a pytree of arrays of exactly this structure, filled with `value`.

        Each array has its leaf's shape, dtype, `weak_type` and manual axes;
        typed PRNG-key leaves are keys from zero key data, static leaves are
        returned as they are. At top level each leaf is placed on its sharding
        (an abstract mesh's on the `jax.set_mesh` mesh, else on the mesh of the
        [treeshape.out_structure][] call that made it). See
        [the guide](../guide/structures.md#building-values).

        Args:
            value: A number or bool scalar (or a 0-d array), converted to each
                leaf's dtype.

        Returns:
            A pytree with this structure's treedef.

        Raises:
            TypeError: `value` is not such a scalar, or is complex for an
                integer or real leaf; or the tree's nodes cannot be rebuilt.
            ValueError: a leaf is 64-bit while `jax_enable_x64` is off, the
                structure has free dimensions, or no mesh in sight has a leaf's
                abstract mesh (the message names the leaves and the fix).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of((jnp.zeros(2, jnp.int32), 1.0))
            >>> s.full(7)
            (Array([7, 7], dtype=int32), Array(7., dtype=float32, weak_type=True))
        """
        return _values.full(self, value)

    def zeros(self) -> PyTree:
        """Build a pytree of zeros of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of({"count": 0, "mu": jnp.ones(2)}).zeros()
            {'count': Array(0, dtype=int32, weak_type=True), 'mu': Array([0., 0.], dtype=float32)}
        """
        return _values.build(self, 0, "zeros")

    def ones(self) -> PyTree:
        """Build a pytree of ones of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of([jnp.zeros(2, jnp.bfloat16)]).ones()
            [Array([1, 1], dtype=bfloat16)]
        """
        return _values.build(self, 1, "ones")

    def _check_extents(self, who: str, fix: str = "") -> None:
        """Refuse a leaf too large for XLA, which would abort the process (checked once)."""
        if self._cache.get("extents_checked"):
            return
        try:
            check_extents(self._leaves)
        except TooLarge as e:
            raise ValueError(extent_message(who, "tree" + self.paths[e.index], e.leaf, e.problem, fix)) from None
        self._cache["extents_checked"] = True

    def _sharded(self) -> bool:
        """Whether some array leaf has a sharding (so top-level values need placing)."""
        sharded = self._cache.get("sharded")  # (read on every `out_structure` call)
        if sharded is None:
            sharded = self._cache["sharded"] = any(leaf.sharding is not None for leaf in self._array_leaves())
        return sharded

    def _with_leaves(self, leaves: Sequence[Any]) -> "Structure":
        """The same treedef (and meshes of its call) with new leaf descriptions."""
        return Structure(self._treedef, tuple(leaves))._on_meshes(self._meshes)

    # -- new leaf types --------------------------------------------------------
    def with_shardings(self, shardings: Any) -> "Structure":
        """Return the same structure with new shardings on its array leaves.

        For placing values (`s.with_shardings(...).zeros()`) and for
        [treeshape.Structure.nbytes_per_device][]. The result equals `self`.

        Args:
            shardings: One of:

                - a `jax.sharding.Sharding`: for every array leaf;
                - `None`: drop every sharding (JAX's default placement);
                - a pytree prefix of `self.tree` whose leaves are `Sharding`s
                  or `None`: each applies to every array leaf below it;
                - a callable `(path, leaf) -> Sharding | None`, called once per
                  array leaf with its `keystr` path (as in `self.paths`) and
                  its `jax.ShapeDtypeStruct`.

        Returns:
            A new [treeshape.Structure][].

        Raises:
            ValueError: `shardings` is not a prefix of `self.tree` (the message
                names the first place they differ), or a sharding does not fit
                its leaf (too many spec entries, or a dimension the mesh axes do
                not divide); every such leaf is named.
            TypeError: a value is neither a `Sharding` nor `None` (e.g. a bare
                `PartitionSpec`, which needs a mesh: `NamedSharding(mesh, spec)`).

        Examples:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
            >>> import treeshape as ts
            >>> mesh = AbstractMesh((4,), ("fsdp",))
            >>> s = ts.structure_of({"w": jnp.zeros((512, 128)), "b": jnp.zeros(128)})
            >>> def fsdp(path, leaf):  # shard every matrix over 'fsdp', replicate the rest
            ...     return NamedSharding(mesh, P("fsdp") if len(leaf.shape) == 2 else P())
            >>> s.with_shardings(fsdp).nbytes_per_device
            66048
            >>> ts.structure_of({"b": jnp.zeros(3)}).with_shardings(NamedSharding(mesh, P("fsdp")))
            Traceback (most recent call last):
            ...
            ValueError: treeshape.Structure.with_shardings: the sharding does not fit tree['b'] (f32[3]): ...
        """
        return self._with_leaves(_sharding.with_shardings(self, shardings))

    def astype(self, dtype: Any, *, where: Callable[[str, jax.ShapeDtypeStruct], bool] | None = None) -> "Structure":
        """Return the same structure with `dtype` on its floating array leaves (or on those `where` picks).

        A converted leaf keeps its shape, sharding and manual axes, and becomes
        strongly typed (as `x.astype(dtype)` does).

        Args:
            dtype: The new dtype; a Python type (`float`, `int`, `complex`,
                `bool`) is JAX's default dtype of that kind.
            where: A callable `(path, leaf) -> bool` that picks the array leaves
                to convert (`path` as in `self.paths`). By default, every leaf
                of a floating dtype.

        Returns:
            A new [treeshape.Structure][].

        Raises:
            TypeError: `dtype` is not a dtype, or a typed PRNG key would be
                converted.
            ValueError: `dtype` is 64-bit and `jax_enable_x64` is off.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> params = {"w": jnp.zeros((2, 3), jnp.bfloat16), "step": jnp.int32(0)}
            >>> ts.structure_of(params).astype(jnp.float32)
            Structure({'step': i32[], 'w': f32[2,3]}, 2 leaves, 28 B)
            >>> ts.structure_of(params).astype(jnp.int8, where=lambda path, leaf: path == "['step']")
            Structure({'step': i8[], 'w': bf16[2,3]}, 2 leaves, 13 B)
        """
        return self._with_leaves(_values.astype(self, dtype, where))

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> str:
        """Describe this structure as a stable JSON document (one node or leaf per line).

        The format is described in [the guide](../guide/structures.md#structures-as-json).

        Returns:
            The JSON text; `Structure.from_json(s.to_json()) == s` unless a
            static value is kept by its text only (a closure, an object).

        Raises:
            TypeError: the tree holds what JSON cannot describe (a dict key
                that is not a `str` or `int`, or a custom pytree node of
                another kind); the message names where.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> print(ts.structure_of([jnp.zeros((2, 3), jnp.bfloat16)]).to_json())
            {
              "version": 1,
              "treedef": [
                {"type": "list", "n": 1},
                "*"
              ],
              "leaves": [
                {"path": "[0]", "shape": [2, 3], "dtype": "bfloat16", "weak_type": false}
              ]
            }
        """
        known = self._cache.get("paths")  # the walk that writes the nodes finds the paths anyway
        return _json.dumps(self._treedef, self._leaves, known)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Structure":
        """Read a structure written by [treeshape.Structure.to_json][].

        Safe for untrusted text (unlike `pickle`): every field is checked,
        nothing is evaluated and no module is imported; named node types are
        looked up among the modules already imported.

        Args:
            text: The JSON document (`str`, or UTF-8 `bytes`).

        Returns:
            The Structure. Shardings come back over abstract meshes.

        Raises:
            ValueError: `text` is not valid JSON, has another `"version"`, a
                field is malformed (the message says which and why), or a named
                type is not defined in an imported module.
            TypeError: `text` is not a `str`, `bytes` or `bytearray`.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of({"b": jnp.zeros(3), "w": jnp.zeros((2, 3))})
            >>> ts.Structure.from_json(s.to_json()) == s
            True
        """
        treedef, leaves = _json_load.loads(text)
        return cls(treedef, leaves)

    # -- comparing -----------------------------------------------------------
    def diff(self, tree: PyTree, *, ignore: Ignorable | Collection[Ignorable] = ()) -> list[Mismatch]:
        """List every difference between this structure and `tree`, in leaf order.

        Compares the tree structure, then each leaf's shape, dtype,
        `weak_type` and manual axes (kind `"vma"`); not shardings.

        Args:
            tree: A pytree of arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy
                or Python scalars and static values, or another Structure.
            ignore: Mismatch kinds to leave out: any of `"weak_type"`,
                `"vma"`, `"sharding"`, `"dtype"`, `"shape"`, and `"static"`
                (static leaves and the static fields of framework and
                dataclass nodes). Container keys and node types are always
                compared.

        Returns:
            A list of [treeshape.Mismatch][], empty when `tree` matches.

        Raises:
            ValueError: `ignore` names another kind.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of({"w": jnp.zeros(3), "b": jnp.zeros(3)})
            >>> for m in s.diff({"w": jnp.zeros(3, jnp.int32)}):
            ...     print(m)
            tree['b']: missing; expected f32[3].
            tree['w']: expected dtype float32, got int32.
            >>> ts.structure_of({"step": 0}).diff({"step": jnp.int32(0)}, ignore={"weak_type"})
            []
        """
        kinds = _compare.ignored(ignore, "diff")
        return _compare.diff(self, read_structure(tree, "Structure.diff"), kinds)

    def matches(self, tree: PyTree, *, ignore: Ignorable | Collection[Ignorable] = ()) -> bool:
        """Return `True` iff `self.diff(tree, ignore=ignore)` is empty.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of(jnp.zeros(3)).matches(jnp.ones(3))
            True
        """
        return not self.diff(tree, ignore=ignore)

    def check(self, tree: PyTree, *, ignore: Ignorable | Collection[Ignorable] = ()) -> None:
        """Raise if `tree` does not match this structure.

        Args:
            tree: As for [treeshape.Structure.diff][].
            ignore: Mismatch kinds to leave out, as for
                [treeshape.Structure.diff][].

        Raises:
            StructureMismatchError: listing every mismatch with its path,
                expected and actual value and a fix (all on `err.mismatches`).
            ValueError: `ignore` names another kind.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of({"w": jnp.zeros(3)}).check({"w": jnp.zeros(4)})
            Traceback (most recent call last):
            ...
            treeshape.StructureMismatchError: treeshape.Structure.check: the tree does not match:
            tree['w']: expected shape (3,), got (4,). Make this leaf shape (3,).
        """
        mismatches = self.diff(tree, ignore=ignore)
        if mismatches:
            header = "treeshape.Structure.check: the tree does not match"
            raise StructureMismatchError(format_mismatches(header, mismatches), mismatches)

    # -- value semantics -----------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Structure):
            return NotImplemented
        if self is other:
            return True
        if len(self._leaves) != len(other._leaves):
            return False
        hashes = self._cache.get("hash"), other._cache.get("hash")
        if hashes[0] is not None and hashes[1] is not None and hashes[0] != hashes[1]:
            return False
        return _compare.equal(self, other)

    def __hash__(self) -> int:
        return self._memo("hash", lambda: _compare.hash_of(self._treedef, self._leaves))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Structure, _compare.pickled(self._treedef, self._leaves))

    def __str__(self) -> str:
        return table(self)

    def _repr_html_(self) -> str:
        return html_table(self)

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """Render in treescope (when it is installed) as a foldable tree of compact leaves."""
        from treescope import repr_lib

        compact = jtu.tree_unflatten(self._treedef, [_Text(leaf_str(leaf)) for leaf in self._leaves])
        size = self.size if type(self.size) is int else _Text(str(self.size))  # a symbolic size by its expression
        summary = {"tree": compact, "leaves": len(self), "size": size, "nbytes": _Text(human_bytes(self.nbytes))}
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


def read_structure(tree: PyTree, fn_name: str, root: str = "tree") -> Structure:
    """`tree`'s structure, read leaf by leaf without tracing (`_leaf.read_leaves`);
    a Structure is returned as it is."""
    if isinstance(tree, Structure):
        return tree
    hint = wrapper_hint(type(tree))
    if hint is not None:  # its nodes describe the tree but cannot rebuild it: no Structure would work
        raise TypeError(f"treeshape.{fn_name}: {root} is {hint}.")
    leaves, treedef = flatten(tree, fn_name, root)

    def where(i: int) -> str:  # the path of leaf `i`, only for a message
        return root + jtu.keystr(jtu.tree_flatten_with_path(tree)[0][i][0])

    sharded_symbolic: list[tuple[int, jax.ShapeDtypeStruct]] = []
    try:
        described = read_leaves(leaves, _compat.at_top_level(), sharded_symbolic)
    except IntTooBig as e:
        raise OverflowError(int_too_big_message(fn_name, where(e.index), e.value, e.bits)) from None
    except BadShape as e:
        raise e.error(bad_shape_message(fn_name, where(e.index), e.shape, e.problem)) from None
    except TooLarge as e:
        raise ValueError(extent_message(fn_name, where(e.index), e.leaf, e.problem)) from None
    for i, leaf in sharded_symbolic:  # as `with_shardings` checks a sharding
        problem = _sharding.split_problem(leaf)
        if problem is not None:
            raise ValueError(_sharding.split_message(fn_name, where(i), leaf, problem))
    structure = Structure(treedef, tuple(described))
    if written_by_orbax(tree, leaves):  # compared as the tree it was written from (`_compare.diff`)
        structure._cache["orbax"] = True
    if len(leaves) > DEFAULT_MAX_ROWS:  # its table will be cut: note the paths it shows, from the tree at hand
        structure._cache["edges"] = edge_paths(tree, leaves)
    return structure


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Structure": Structure}
