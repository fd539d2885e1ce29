"""Values from a Structure: the arrays of `Structure.zeros`, `ones` and `full` (each
leaf's dtype, weak type, PRNG keys, manual axes and placement on its sharding), the
leaves of `Structure.astype`, and the x64 check these share with `upcast`.

It works on what a Structure shows (`StructureView`) and does not import `_structure`,
whose methods call it.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from . import _compat, _sharding
from ._dtypes import is_key_dtype, short_dtype
from ._errors import SHOWN, check_path_leaf_callback, first_few, user_value
from ._leaf import SCALAR_TYPES, leaf_str, varying_axes
from ._nodes import node_type_name
from ._shapes import has_symbolic
from ._tree import node_types
from ._views import StructureView


PyTree = Any


# -- zeros, ones, full -----------------------------------------------------------
def full(structure: StructureView, value: Any) -> PyTree:
    """`structure.full(value)`: `value` checked, then `build`."""
    if not _is_fill_value(value):
        raise TypeError(
            f"treeshape.Structure.full: `value` must be a number or bool scalar (or a 0-d array), got "
            f"{type(value).__name__} {value!r}. For other fills, use `jax.tree.map` over `structure.tree`."
        )
    if jnp.iscomplexobj(value):
        real = [  # what JAX refuses to fill with a complex value (bool takes it: nonzero is True)
            "tree" + path
            for path, leaf in zip(structure.paths, structure.leaves, strict=True)
            if isinstance(leaf, jax.ShapeDtypeStruct)
            and (jnp.issubdtype(leaf.dtype, jnp.integer) or jnp.issubdtype(leaf.dtype, jnp.floating))
        ]
        if real:
            raise TypeError(
                f"treeshape.Structure.full: `value` {user_value(value)} is complex, but {first_few(real)} "
                f"({len(real)} of {len(structure)} leaves) {'is' if len(real) == 1 else 'are'} of an integer or real "
                "floating dtype, which JAX refuses to fill with a complex value (as `jnp.full` does). Fill with a "
                "real value, or make those leaves complex first: `s.astype(jnp.complex64, where=...)`."
            )
    return build(structure, value, "full")


def build(structure: StructureView, value: Any, fn_name: str) -> PyTree:
    """A pytree of arrays of exactly `structure`, filled with `value` (for `Structure.{fn_name}`)."""
    who = f"Structure.{fn_name}"
    check_x64(lambda: structure.paths, structure.leaves, who)
    top = _compat.at_top_level()
    if top and structure.dims:  # under a trace (`jax.export`), JAX builds arrays of symbolic shapes
        dims = structure.dims
        raise ValueError(
            f"treeshape.{who}: the structure has free symbolic dimensions ({', '.join(dims)}; e.g. "
            f"{_first_symbolic(structure)}), and arrays need sizes. Bind them first: "
            f"`structure.bind({', '.join(f'{name}=...' for name in dims)}).{fn_name}()`."
        )
    structure._check_extents(who)
    if top and structure._sharded():
        leaves = _sharding.place(structure, structure._meshes or (), value, fn_name, _filled)
    else:
        leaves = [_filled(x, value, top) if isinstance(x, jax.ShapeDtypeStruct) else x for x in structure.leaves]
    try:
        return jtu.tree_unflatten(structure.treedef, leaves)
    except Exception as e:  # a node type whose unflatten cannot rebuild it from new leaves
        names = ", ".join(node_type_name(t) for t in _node_types(structure.treedef)[:SHOWN]) or "its nodes"
        raise TypeError(
            f"treeshape.{who}: the tree cannot be rebuilt with new leaves: unflattening its nodes ({names}) "
            f"failed with {type(e).__name__}: {e}. Describe a tree whose node types rebuild from any leaves "
            "(their registered unflatten), or build the values from `s.tree` with `jax.tree.map`."
        ) from e


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


def _first_symbolic(structure: StructureView) -> str:
    """The first leaf with a symbolic dimension, as messages show it (`tree['x']: f32[b,3]`)."""
    for path, leaf in zip(structure.paths, structure.leaves, strict=True):
        if isinstance(leaf, jax.ShapeDtypeStruct) and has_symbolic(leaf.shape):
            return f"tree{path}: {leaf_str(leaf)}"
    return ""


def _node_types(treedef: jtu.PyTreeDef) -> list[type]:
    """The custom node types of `treedef`, first seen first (containers and None left out)."""
    found = dict.fromkeys(t for t in node_types(treedef) if t not in (tuple, list, dict, type(None)))
    return list(found)


# -- 64-bit dtypes with x64 off --------------------------------------------------
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
    raise ValueError(_x64_message(who, groups, example))


# -- astype ----------------------------------------------------------------------
def astype(
    structure: StructureView, dtype: Any, where: Callable[[str, jax.ShapeDtypeStruct], bool] | None
) -> tuple[Any, ...]:
    """The leaves of `structure.astype(dtype, where=where)`."""
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
    paths = structure.paths
    before = structure.leaves
    leaves = list(before)
    keys = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.ShapeDtypeStruct) or leaf.dtype == target or not pick(paths[i], leaf):
            continue
        if is_key_dtype(leaf.dtype) or is_key_dtype(target):
            keys.append(f"tree{paths[i]} ({leaf_str(leaf)})")
            continue
        leaves[i] = leaf.update(dtype=target, weak_type=False)
    if keys:
        raise TypeError(
            f"treeshape.Structure.astype: no conversion to or from typed PRNG keys ({short_dtype(target)}): "
            f"{first_few(keys)}. Leave key leaves out with `where=`, or convert explicitly with "
            "`jax.random.key_data` / `jax.random.wrap_key_data`."
        )
    if _narrowed(target):
        converted = [f"tree{paths[i]}" for i, leaf in enumerate(leaves) if leaf is not before[i]]
        if converted:
            narrow = jnp.dtype(jax.dtypes.canonicalize_dtype(target)).name
            raise ValueError(
                f"treeshape.Structure.astype: {target.name} is a 64-bit dtype, but jax_enable_x64 is off, so JAX "
                f"would silently make arrays of it {narrow} (`zeros()` refuses such a Structure). It would convert "
                f"{first_few(converted)}. Turn x64 on first: "
                '`jax.config.update("jax_enable_x64", True)`, or build inside `with jax.enable_x64(True):`; '
                f"or convert to {narrow}."
            )
    return tuple(leaves)


def _x64_message(fn_name: str, groups: dict[str, list[str]], example: str) -> str:
    """Leaves of 64-bit dtypes (`groups`: short dtype -> paths) that JAX cannot hold with x64
    off; `example` is the first such leaf in compact notation."""
    count = sum(len(paths) for paths in groups.values())
    fix = (
        'Turn x64 on first: `jax.config.update("jax_enable_x64", True)`, or build the values inside '
        "`with jax.enable_x64(True):`. Or rebuild the Structure with the dtypes JAX uses with x64 off: "
        "`ts.structure_of(s.tree)`, called with x64 off, makes each 64-bit leaf 32-bit."
    )
    why = (
        "but jax_enable_x64 is off, so JAX would silently make {them} 32-bit and the result would not match "
        "this Structure (one made with x64 on, e.g. unpickled from such a process)."
    )
    if count == 1:
        [[path]] = groups.values()
        return f"treeshape.{fn_name}: {path} is {example}, a 64-bit dtype, {why.format(them='it')}\n\n{fix}"
    lines = []
    for dtype, paths in groups.items():
        shown = first_few(paths, unit=f" ({len(paths)} leaves)")
        lines.append(f"  * {dtype}: {shown}")
    listing = "\n".join(lines)
    return f"treeshape.{fn_name}: {count} leaves have 64-bit dtypes, {why.format(them='them')}\n\n{listing}\n\n{fix}"
