"""`Structure`: the immutable description of a pytree (its treedef and one
description per leaf), and `read_structure`, which reads one from an existing
tree without tracing."""

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, Final, NoReturn

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from . import _compat, _dims, _json, _sharding
from ._diff import diff_structures, static_equal
from ._errors import (
    Mismatch,
    StructureMismatchError,
    astype_key_message,
    astype_x64_message,
    bad_shape_message,
    check_path_leaf_callback,
    complex_fill_message,
    format_mismatches,
    free_dims_message,
    int_too_big_message,
    is_static,
    unflatten_message,
    x64_message,
)
from ._leaf import (
    SCALAR_TYPES,
    BadShape,
    IntTooBig,
    TooLarge,
    check_extents,
    extent_message,
    flatten,
    has_symbolic,
    human_bytes,
    is_key_dtype,
    leaf_nbytes,
    leaf_size,
    leaf_str,
    leaf_total,
    manual_axis_sets,
    read_leaves,
    same_type,
    shape_key,
    short_dtype,
    static_value,
    varying_axes,
    wrapper_hint,
)
from ._table import DEFAULT_MAX_ROWS, html_table, table
from ._tree import edge_paths


PyTree = Any


IGNORABLE: Final = ("weak_type", "vma", "sharding", "dtype", "shape", "static")


def _ignored(ignore: Collection[str], fn_name: str) -> frozenset[str]:
    kinds = frozenset((ignore,) if isinstance(ignore, str) else ignore)
    unknown = kinds - set(IGNORABLE)
    if unknown:
        allowed = ", ".join(repr(k) for k in IGNORABLE)
        raise ValueError(
            f"treeshape.Structure.{fn_name}: `ignore` takes mismatch kinds among {allowed}; got "
            f"{', '.join(repr(k) for k in sorted(unknown, key=repr))}. (Tree structure differences are never ignored.)"
        )
    return kinds


def _same_leaf(e: Any, a: Any) -> bool:
    """Leaf equality for `==`: array leaves by shape, dtype, weak type and manual
    axes (not sharding), static leaves as `diff` compares them."""
    if e is a:
        return True
    sds = jax.ShapeDtypeStruct
    if isinstance(e, sds):
        return isinstance(a, sds) and same_type(e, a)
    return not isinstance(a, sds) and static_equal(e, a)


def _leaf_hash(leaf: Any) -> int:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return hash((shape_key(leaf.shape), leaf.dtype, leaf.weak_type, manual_axis_sets(leaf)))
    try:
        return hash((type(leaf), static_value(leaf)))
    except Exception:  # unhashable (compared by `==` only), or a `__hash__` that raises: by its type
        return hash(type(leaf))


def _filled(leaf: jax.ShapeDtypeStruct, value: Any, top: bool, placement: Any = None) -> Any:
    """One leaf's value: at top level placed with `placement` (a concrete sharding that
    `_sharding.place` resolved, or None for default placement), under a trace with the
    sharding that is part of its type."""
    dtype = leaf.dtype
    sharding = placement if top else _sharding.traced_sharding(leaf.sharding)
    if is_key_dtype(dtype):
        x = jnp.zeros(leaf.shape, dtype)  # keys from zero key data, whatever `value` is
        if sharding is not None:
            x = jax.device_put(x, sharding) if top else jax.sharding.reshard(x, sharding)
    else:
        if dtype == np.bool_ and jnp.iscomplexobj(value):  # as `jnp.full` reads it, without NumPy's warning
            value = value != 0
        x = lax.full(leaf.shape, value, dtype, sharding=sharding)
        if leaf.weak_type:
            x = _compat.convert_element_type(x, dtype, weak_type=True)
    axes = varying_axes(leaf)
    if axes:
        x = _compat.pcast_varying(x, tuple(sorted(axes)))
    return x


def _is_fill_value(value: Any) -> bool:
    if isinstance(value, (*SCALAR_TYPES, np.number, np.bool_)):
        return True
    return isinstance(value, (jax.Array, np.ndarray)) and value.ndim == 0


def _narrowed(dtype: Any) -> bool:
    """Whether JAX would make arrays of `dtype` narrower (a 64-bit dtype with x64 off)."""
    if jax.enable_x64.value or jnp.issubdtype(dtype, jax.dtypes.extended):
        return False
    if jax.dtypes.canonicalize_dtype(dtype) == dtype:
        return False
    # "allow": JAX keeps explicitly requested 64-bit dtypes even with x64 off. A config
    # option read by its public name (`jax.config` sets these attributes dynamically).
    mode = jax.config.jax_explicit_x64_dtypes  # type: ignore[attr-defined]
    return str(getattr(mode, "name", mode)).upper() != "ALLOW"


def check_x64(paths: Callable[[], Sequence[str]], leaves: Sequence[Any], who: str) -> None:
    """Refuse to build values for 64-bit leaves that JAX would silently make 32-bit (x64 off).

    `paths()` gives the leaves' paths (only needed for the message); `who` is the
    caller as the message names it (`Structure.zeros`, `upcast`).
    """
    if jax.enable_x64.value:
        return
    dtypes = {leaf.dtype for leaf in leaves if isinstance(leaf, jax.ShapeDtypeStruct)}
    wide = {d for d in dtypes if _narrowed(d)}
    if not wide:
        return
    groups: dict[str, list[str]] = {}
    example = ""
    for path, leaf in zip(paths(), leaves, strict=True):
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.dtype in wide:
            example = example or leaf_str(leaf)
            groups.setdefault(("~" if leaf.weak_type else "") + short_dtype(leaf.dtype), []).append("tree" + path)
    raise ValueError(x64_message(who, groups, example))


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

    def _memo(self, name: str, compute: Any) -> Any:
        try:
            return self._cache[name]
        except KeyError:
            value = self._cache[name] = compute()
            return value

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

        Each leaf counts the bytes of its largest shard (`Sharding.shard_shape`;
        typed PRNG keys by their key data); a leaf without a sharding counts
        whole, as does a replicated one. This is the memory a sharded
        optimizer state or model takes on each device: with every leaf on one
        mesh it is exact (up to XLA's padding and layout), otherwise an upper
        bound. `str(s)` shows it per leaf when some leaf is split.

        Returns:
            The bytes, as an `int` (equal to `nbytes` when nothing is split).

        Examples:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
            >>> import treeshape as ts
            >>> mesh = AbstractMesh((4,), ("fsdp",))  # 4 devices (an abstract mesh: sizes only)
            >>> s = ts.structure_of({"w": jnp.zeros((1024, 256)), "b": jnp.zeros(256)})
            >>> s = s.with_shardings({"w": NamedSharding(mesh, P("fsdp")), "b": None})
            >>> s.nbytes, s.nbytes_per_device
            (1049600, 263168)
        """
        per_device: int = self._memo("nbytes_per_device", lambda: leaf_total(self._leaves, _sharding.per_device_nbytes))
        return per_device

    # -- symbolic dimensions -------------------------------------------------
    @property
    def dims(self) -> tuple[str, ...]:
        """The free dimension names of the shapes, in order of first appearance.

        Shapes may hold `jax.export` symbolic dimensions (`b`, `2*b`,
        `floordiv(b + 1, 2)`): then the Structure describes a whole family of
        shapes, one per size of each name. Empty when every shape is concrete.

        Examples:
            >>> import jax
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> b, s = jax.export.symbolic_shape("b, s")
            >>> batch = {"tokens": jax.ShapeDtypeStruct((b, s), jnp.int32), "mask": jax.ShapeDtypeStruct((b,), bool)}
            >>> ts.structure_of(batch).dims
            ('b', 's')
        """
        dims: tuple[str, ...] = self._memo("dims", lambda: _dims.free_names(self._leaves))
        return dims

    def _example_symbolic(self) -> str:
        """The first leaf with a symbolic dimension, as messages show it (`tree['x']: f32[b,3]`)."""
        for path, leaf in zip(self.paths, self._leaves, strict=True):
            if isinstance(leaf, jax.ShapeDtypeStruct) and has_symbolic(leaf.shape):
                return f"tree{path}: {leaf_str(leaf)}"
        return ""

    def bind(self, **sizes: int) -> "Structure":
        """Return the structure with the named dimensions replaced by sizes.

        Some names may be bound and others left free. Expressions are
        evaluated as JAX evaluates them (`2*b` with `b=32` is `64`), and the
        sizes are checked against the constraints of the dimensions' symbolic
        scope (`jax.export.symbolic_shape("b", constraints=["b >= 4"])`).

        Args:
            **sizes: A size (an integer >= 1) for each name to bind, e.g. `b=32`.

        Returns:
            A new [treeshape.Structure][]; its `dims` are the names left free.

        Raises:
            ValueError: a name that is not among `self.dims` (the message lists
                them), a size below 1, a size that breaks a constraint of the
                symbolic scope (named in the message), or a dimension that the
                sizes make negative (named by its path).
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
            >>> s.bind(b=2)
            Traceback (most recent call last):
            ...
            ValueError: treeshape.Structure.bind: b=2 breaks the constraint 'b >= 4' of the dimensions' symbolic ...
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
        bound = Structure(self._treedef, tuple(leaves))._on_meshes(self._meshes)
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

        Each name takes one size across the whole tree: the first leaf (in
        leaf order) whose dimension tells it binds it (`b` from a size 5,
        also from `2*b` or `b + 1`), and every other dimension that uses the
        name must agree (`2*b` must then be 10). Only shapes are compared: a
        dtype or weak-type difference is [treeshape.Structure.diff][]'s.

        Args:
            tree: A pytree of arrays or `jax.ShapeDtypeStruct`s (as for
                [treeshape.Structure.diff][]).

        Returns:
            A dict from each free name to its size (`{"b": 5}`), in the order
            of `self.dims`; empty for a structure without free names.

        Raises:
            StructureMismatchError: a name takes two sizes (the message names
                both leaves and both sizes), a size breaks a constraint of the
                symbolic scope, no leaf of `tree` tells a name's size, or
                another shape or the tree structure differs.

        Examples:
            >>> import jax
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> (b,) = jax.export.symbolic_shape("b")
            >>> x, y = jax.ShapeDtypeStruct((b, 3), jnp.float32), jax.ShapeDtypeStruct((2 * b,), jnp.int32)
            >>> s = ts.structure_of({"x": x, "y": y})
            >>> s.match_dims({"x": jnp.zeros((5, 3)), "y": jnp.zeros(10, jnp.int32)})
            {'b': 5}
            >>> s.match_dims({"x": jnp.zeros((5, 3)), "y": jnp.zeros(12, jnp.int32)})
            Traceback (most recent call last):
            ...
            treeshape.StructureMismatchError: treeshape.Structure.match_dims: the tree does not fit: tree['y']:
            expected shape (2*b,), got (12,); here b = 6 (2*b = 12), but b = 5 at tree['x']. Give b one size
            across the tree.
        """
        binding, found = _dims.match(self, read_structure(tree, "Structure.match_dims"), "tree")
        problems = [m for m in found if m.kind in ("shape", "structure")]
        if problems:
            header = "treeshape.Structure.match_dims: the tree does not fit"
            raise StructureMismatchError(format_mismatches(header, problems), problems)
        return {name: binding.sizes[name] for name in self.dims if name in binding.sizes}

    # -- building values ---------------------------------------------------
    def full(self, value: Any) -> PyTree:
        """Build a pytree of arrays of exactly this structure, filled with `value`.

        Each array keeps its leaf's shape, dtype, `weak_type` and, under
        `jax.shard_map`, its manual axes (`lax.pcast(..., to="varying")`).
        Typed PRNG-key leaves get keys made from zero key data; static leaves
        are returned as-is. At top level a leaf with a concrete sharding is
        placed with it, also when it spans several processes (each process
        creates only its own shards). One whose sharding names an abstract
        mesh is placed on the mesh set with `jax.set_mesh`, else, for a
        Structure returned by [treeshape.out_structure][], on the mesh of that
        call's arguments; a sharding is never dropped silently.
        Under `jit` the arrays are compile-time constants, exactly like
        hand-written `jnp.full`; a leaf sharded over `Explicit` mesh axes
        keeps that sharding, which is part of its type there (so the result
        type-checks as a `lax.scan` carry).

        Args:
            value: The fill value, converted to each leaf's dtype.

        Returns:
            A pytree with this structure's treedef.

        Raises:
            TypeError: `value` is not a number or bool scalar, or it is complex
                and some leaves are integer or real floating (which JAX
                refuses to fill with it; bool leaves take it, nonzero as
                `True`, as in `jnp.full`).
            ValueError: a leaf has a 64-bit dtype but `jax_enable_x64` is off
                (a Structure made with x64 on, e.g. unpickled from such a
                process), so JAX would silently make it 32-bit; the message
                names the leaves and the fix. Or, at top level, a leaf is
                sharded over an abstract mesh that neither `jax.set_mesh` nor
                the `out_structure` call provides (e.g. an unpickled
                Structure): the message names the leaves and the fixes,
                `jax.set_mesh` and [treeshape.Structure.with_shardings][].

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
        if jnp.iscomplexobj(value):
            real = [  # what JAX refuses to fill with a complex value (bool takes it: nonzero is True)
                "tree" + path
                for path, leaf in zip(self.paths, self._leaves, strict=True)
                if isinstance(leaf, jax.ShapeDtypeStruct)
                and (jnp.issubdtype(leaf.dtype, jnp.integer) or jnp.issubdtype(leaf.dtype, jnp.floating))
            ]
            if real:
                raise TypeError(complex_fill_message(value, real, len(self)))
        return self._build(value, "full")

    def _build(self, value: Any, fn_name: str) -> PyTree:
        check_x64(lambda: self.paths, self._leaves, f"Structure.{fn_name}")
        top = _compat.at_top_level()
        if top and self.dims:  # under a trace (`jax.export`), JAX builds arrays of symbolic shapes
            raise ValueError(free_dims_message(f"Structure.{fn_name}", self.dims, self._example_symbolic()))
        self._check_extents(f"Structure.{fn_name}")
        if top and self._sharded():
            leaves = _sharding.place(self, self._meshes or (), value, fn_name, _filled)
        else:
            leaves = [_filled(x, value, top) if isinstance(x, jax.ShapeDtypeStruct) else x for x in self._leaves]
        try:
            return jtu.tree_unflatten(self._treedef, leaves)
        except Exception as e:  # a node type whose unflatten cannot rebuild it from new leaves
            raise TypeError(unflatten_message(f"Structure.{fn_name}", _node_types(self._treedef), e)) from e

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
        sharded: bool = self._memo("sharded", lambda: any(leaf.sharding is not None for leaf in self._array_leaves()))
        return sharded

    def zeros(self) -> PyTree:
        """Build a pytree of zeros of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of({"count": 0, "mu": jnp.ones(2)}).zeros()
            {'count': Array(0, dtype=int32, weak_type=True), 'mu': Array([0., 0.], dtype=float32)}
        """
        return self._build(0, "zeros")

    def ones(self) -> PyTree:
        """Build a pytree of ones of exactly this structure (see [treeshape.Structure.full][]).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of([jnp.zeros(2, jnp.bfloat16)]).ones()
            [Array([1, 1], dtype=bfloat16)]
        """
        return self._build(1, "ones")

    def with_shardings(self, shardings: Any) -> "Structure":
        """Return the same structure with new shardings on its array leaves.

        For placing values (`s.with_shardings(...).zeros()`), for memory
        planning ([treeshape.Structure.nbytes_per_device][]) and for
        Structures whose shardings name an abstract mesh (unpickled, read
        from JSON). Shapes, dtypes, weak types and static leaves are kept, so
        the result equals `self` (equality ignores shardings).

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
            ValueError: `shardings` is a pytree that is not a prefix of
                `self.tree` (the message names the first place where they
                differ), or a sharding does not fit its leaf: a spec with more
                entries than the leaf has dimensions, or a dimension not
                divisible by the mesh axes it is split over. Every such leaf
                is named by its path.
            TypeError: a value is neither a `Sharding` nor `None` (e.g. a bare
                `PartitionSpec`, which needs a mesh: `NamedSharding(mesh, spec)`).

        Examples:
            >>> import jax.numpy as jnp
            >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
            >>> import treeshape as ts
            >>> mesh = AbstractMesh((4,), ("fsdp",))
            >>> params = {"w": jnp.zeros((512, 128)), "b": jnp.zeros(128)}
            >>> def fsdp(path, leaf):  # shard every matrix over 'fsdp', replicate the rest
            ...     return NamedSharding(mesh, P("fsdp") if len(leaf.shape) == 2 else P())
            >>> print(ts.structure_of(params).with_shardings(fsdp))
            path   shape      dtype  extra                bytes  per device
            -----  ---------  -----  ---------------  ---------  ----------
            ['b']  [128]      f32    replicated           512 B       512 B
            ['w']  [512,128]  f32    P('fsdp', None)  256.0 KiB    64.0 KiB
            -----  ---------  -----  ---------------  ---------  ----------
            total: 2 leaves, 65,664 elements          256.5 KiB    64.5 KiB
            >>> ts.structure_of({"b": jnp.zeros(3)}).with_shardings(NamedSharding(mesh, P("fsdp")))
            Traceback (most recent call last):
            ...
            ValueError: treeshape.Structure.with_shardings: the sharding does not fit tree['b'] (f32[3]): ...
        """
        leaves = _sharding.with_shardings(self, shardings)
        return Structure(self._treedef, tuple(leaves))._on_meshes(self._meshes)

    def astype(self, dtype: Any, *, where: Callable[[str, jax.ShapeDtypeStruct], bool] | None = None) -> "Structure":
        """Return the same structure with `dtype` on its floating array leaves (or on those `where` picks).

        For mixed precision: float32 accumulators for bfloat16 parameters are
        `ts.structure_of(params).astype(jnp.float32).zeros()`. A converted
        leaf keeps its shape, sharding and manual axes and becomes strongly
        typed (as `x.astype(dtype)` does); other leaves are kept as they are.

        Args:
            dtype: The new dtype (e.g. `jnp.float32`, `jnp.bfloat16`); a Python
                type (`float`, `int`, `complex`, `bool`) is JAX's default dtype
                of that kind, as in `jnp.zeros(3, float)`.
            where: Which array leaves to convert: a callable `(path, leaf) ->
                bool`, called with each array leaf's `keystr` path (as in
                `self.paths`) and its `jax.ShapeDtypeStruct`. By default,
                every leaf of a floating dtype.

        Returns:
            A new [treeshape.Structure][].

        Raises:
            TypeError: `dtype` is not a dtype, or a typed PRNG key would be
                converted (to or from a key dtype: use
                `jax.random.key_data` / `jax.random.wrap_key_data`); the
                message names the leaves by path.
            ValueError: `dtype` is 64-bit and `jax_enable_x64` is off, so JAX
                would make the arrays 32-bit (as `zeros()` refuses); the
                message names the leaves and the fix.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> params = {"w": jnp.zeros((2, 3), jnp.bfloat16), "step": jnp.int32(0)}
            >>> ts.structure_of(params).astype(jnp.float32)
            Structure({'step': i32[], 'w': f32[2,3]}, 2 leaves, 28 B)
            >>> ts.structure_of(params).astype(jnp.int8, where=lambda path, leaf: path == "['step']")
            Structure({'step': i8[], 'w': bf16[2,3]}, 2 leaves, 13 B)
        """
        try:  # a Python type is JAX's default dtype of its kind, as in `jnp.zeros(3, float)`
            python_type = any(dtype is t for t in SCALAR_TYPES)  # by identity: `np.dtype("float64") == float`
            target = jax.dtypes.canonicalize_dtype(dtype) if python_type else jnp.dtype(dtype)
        except TypeError:
            raise TypeError(
                f"treeshape.Structure.astype: `dtype` must be a dtype (e.g. jnp.float32), got "
                f"{type(dtype).__name__} {dtype!r}."
            ) from None
        if where is not None:
            check_path_leaf_callback(where, "Structure.astype", "whether to convert the leaf")
        pick = where if where is not None else lambda _, leaf: bool(jnp.issubdtype(leaf.dtype, jnp.floating))
        paths = self.paths
        leaves = list(self._leaves)
        keys = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.dtype == target or not pick(paths[i], leaf):
                continue
            if is_key_dtype(leaf.dtype) or is_key_dtype(target):
                keys.append(f"tree{paths[i]} ({leaf_str(leaf)})")
                continue
            leaves[i] = leaf.update(dtype=target, weak_type=False)
        if keys:
            raise TypeError(astype_key_message(keys, short_dtype(target)))
        if _narrowed(target):
            converted = [f"tree{paths[i]}" for i, leaf in enumerate(leaves) if leaf is not self._leaves[i]]
            if converted:
                narrow = jnp.dtype(jax.dtypes.canonicalize_dtype(target)).name
                raise ValueError(astype_x64_message(converted, target.name, narrow))
        return Structure(self._treedef, tuple(leaves))._on_meshes(self._meshes)

    # -- JSON ------------------------------------------------------------------
    def to_json(self) -> str:
        """Describe this structure as a stable JSON document (one node or leaf per line).

        A JSON object with a top-level `"version"`, the tree's nodes in
        pre-order (`"treedef"`: `"*"` for a leaf, `null` for `None`, and
        dicts, lists, tuples and namedtuples by name; registered dataclasses
        such as `flax.struct`'s, flax.nnx modules, variables and states, and
        equinox modules with their static fields by name), and one record per leaf
        (`"leaves"`, what `treeshape inspect --json` prints): `path`, `shape`,
        `dtype` and `weak_type`, plus the `sharding` (a `NamedSharding`'s spec
        and abstract mesh) and `vma` (manual axes) where a leaf has them.
        Static leaves of type `str`, `int`, `float`, `bool` and `None` are
        stored as themselves, any other by its `repr` (and loaded back as a
        marker with that repr, which compares unequal to the live value).

        Returns:
            The JSON text; [treeshape.Structure.from_json][] reads it back:
            `Structure.from_json(s.to_json()) == s` for trees of dicts (str or
            int keys), lists, tuples, `None` and namedtuples.

        Raises:
            TypeError: the tree holds something JSON cannot describe: a dict
                key that is not a `str` or `int`, or a custom pytree node of
                another kind (a `jax.tree_util.Partial`, a class registered
                with its own flatten function).

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of({"step": 0, "w": jnp.zeros((2, 3), jnp.bfloat16)})
            >>> print(s.to_json())
            {
              "version": 1,
              "treedef": [
                {"type": "dict", "keys": ["step", "w"]},
                "*",
                "*"
              ],
              "leaves": [
                {"path": "['step']", "shape": [], "dtype": "int32", "weak_type": true},
                {"path": "['w']", "shape": [2, 3], "dtype": "bfloat16", "weak_type": false}
              ]
            }
        """
        known = self._cache.get("paths")  # the walk that writes the nodes finds the paths anyway
        return _json.dumps(self._treedef, self._leaves, known)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Structure":
        """Read a structure written by [treeshape.Structure.to_json][].

        Safe for untrusted text: every field is checked, nothing is evaluated
        and no module is imported. A namedtuple (or other node type) is looked
        up by name among the modules already in `sys.modules`; a static leaf
        stored by its `repr` comes back as a marker whose `repr` is that text.
        A leaf's sharding comes back over an abstract mesh of the same axes.
        (Unlike this, `pickle` runs code chosen by whoever wrote the data:
        never unpickle untrusted input.)

        Args:
            text: The JSON document (`str`, or UTF-8 `bytes`).

        Returns:
            The Structure: `Structure.from_json(s.to_json()) == s`.

        Raises:
            ValueError: `text` is not valid JSON, has another `"version"`, or
                any field is malformed (the message says which and why), or a
                named type is not defined in an imported module.
            TypeError: `text` is not a `str`, `bytes` or `bytearray`.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> s = ts.structure_of({"b": jnp.zeros(3), "w": jnp.zeros((2, 3))})
            >>> ts.Structure.from_json(s.to_json()) == s
            True
            >>> ts.Structure.from_json('{"version": 99}')
            Traceback (most recent call last):
            ...
            ValueError: treeshape.Structure.from_json: version: this treeshape reads version 1, got 99 ...
        """
        treedef, leaves = _json.loads(text)
        return cls(treedef, leaves)

    # -- comparing -----------------------------------------------------------
    def diff(self, tree: PyTree, *, ignore: Collection[str] = ()) -> list[Mismatch]:
        """List every difference between this structure and `tree`, in leaf order.

        Compares the tree structure (missing and extra dict keys, different
        node types, different lengths), then each leaf's shape, dtype,
        `weak_type` and manual axes (kind `"vma"`). Sharding is not compared.

        Args:
            tree: A pytree of arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy
                or Python scalars and static values, or another Structure.
            ignore: Mismatch kinds to leave out: any of `"weak_type"`,
                `"vma"`, `"sharding"`, `"dtype"`, `"shape"` (e.g. a restored
                checkpoint's step counter is strong where a fresh Python `0`
                is weak: `ignore={"weak_type"}`), and `"static"`: static
                leaves and the static fields of framework and dataclass
                nodes (a flax `TrainState`'s `tx` and `apply_fn`, nnx and
                equinox static attributes); container keys, node types and
                shapes are still compared.

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
        kinds = _ignored(ignore, "diff")
        other = read_structure(tree, "Structure.diff")
        found = _dims.match(self, other, "tree")[1] if self.dims else diff_structures(self, other, "tree")
        if "static" in kinds:  # static leaves and fields differ as "structure": told apart by their values
            found = [m for m in found if not is_static(m)]
        return [m for m in found if m.kind not in kinds] if kinds else found

    def matches(self, tree: PyTree, *, ignore: Collection[str] = ()) -> bool:
        """Return `True` iff `self.diff(tree, ignore=ignore)` is empty.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> ts.structure_of(jnp.zeros(3)).matches(jnp.ones(3))
            True
        """
        return not self.diff(tree, ignore=ignore)

    def check(self, tree: PyTree, *, ignore: Collection[str] = ()) -> None:
        """Raise if `tree` does not match this structure.

        Args:
            tree: As for [treeshape.Structure.diff][].
            ignore: Mismatch kinds to leave out, as for
                [treeshape.Structure.diff][].

        Raises:
            StructureMismatchError: listing every mismatch, each with its
                path, expected and actual value, and a fix (leaves that fail
                the same way are grouped; every mismatch is on
                `err.mismatches`).
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
        try:
            same_treedef = bool(self._treedef == other._treedef)
        except Exception:  # node data JAX cannot compare (e.g. an array): as `diff` compares it
            return not diff_structures(self, other, "tree")
        return same_treedef and all(map(_same_leaf, self._leaves, other._leaves))

    def __hash__(self) -> int:
        def compute() -> int:
            try:
                treedef_hash = hash(self._treedef)
            except Exception:  # node data that cannot be hashed: the shape of the tree
                treedef_hash = hash((self._treedef.num_nodes, self._treedef.num_leaves))
            return hash((treedef_hash, tuple(map(_leaf_hash, self._leaves))))

        value: int = self._memo("hash", compute)
        return value

    def __reduce__(self) -> tuple[Any, ...]:
        # Devices do not pickle: a concrete sharding travels as its abstract
        # form (a NamedSharding keeps its spec over the abstract mesh). Equality
        # ignores sharding, so the copy is equal to the original.
        return (Structure, (self._treedef, tuple(_picklable_leaf(leaf) for leaf in self._leaves)))

    def __str__(self) -> str:
        return table(self)

    def _repr_html_(self) -> str:
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


def _node_types(treedef: jtu.PyTreeDef) -> list[type]:
    """The custom node types of `treedef`, first seen first (containers and None left out)."""
    found: dict[type, None] = {}
    stack = [treedef]
    while stack:
        td = stack.pop()
        data = td.node_data()
        if data is None:
            continue
        if data[0] not in (tuple, list, dict, type(None)):
            found.setdefault(data[0])
        stack.extend(reversed(td.children()))
    return list(found)


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


def read_structure(tree: PyTree, fn_name: str, root: str = "tree") -> Structure:
    """`tree`'s structure, read leaf by leaf without tracing (`_leaf.read_leaves`);
    a Structure is returned as it is."""
    if isinstance(tree, Structure):
        return tree
    hint = wrapper_hint(type(tree))
    if hint is not None:  # its nodes describe the tree but cannot rebuild it: no Structure would work
        raise TypeError(f"treeshape.{fn_name}: {root} is {hint}.")
    leaves, treedef = flatten(tree, fn_name, root)
    sharded_symbolic: list[tuple[int, jax.ShapeDtypeStruct]] = []
    try:
        described = read_leaves(leaves, _compat.at_top_level(), sharded_symbolic)
    except IntTooBig as e:
        path = jtu.keystr(jtu.tree_flatten_with_path(tree)[0][e.index][0])
        raise OverflowError(int_too_big_message(fn_name, root + path, e.value, e.bits)) from None
    except BadShape as e:
        path = jtu.keystr(jtu.tree_flatten_with_path(tree)[0][e.index][0])
        raise e.error(bad_shape_message(fn_name, root + path, e.shape, e.problem)) from None
    except TooLarge as e:
        path = jtu.keystr(jtu.tree_flatten_with_path(tree)[0][e.index][0])
        raise ValueError(extent_message(fn_name, root + path, e.leaf, e.problem)) from None
    for i, leaf in sharded_symbolic:  # as `with_shardings` checks a sharding
        problem = _sharding.split_problem(leaf)
        if problem is not None:
            path = jtu.keystr(jtu.tree_flatten_with_path(tree)[0][i][0])
            raise ValueError(_sharding.split_message(fn_name, root + path, leaf, problem))
    structure = Structure(treedef, tuple(described))
    if len(leaves) > DEFAULT_MAX_ROWS:  # its table will be cut: note the paths it shows, from the tree at hand
        structure._cache["edges"] = edge_paths(tree, leaves)
    return structure


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Structure": Structure}
