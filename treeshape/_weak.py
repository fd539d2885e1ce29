"""Weak types: `is_weak`, `weak_paths`, `strip_weak_type`, `upcast`, and the
dtype-change rules shared with loop carries."""

import functools as ft
from typing import Any, Final, Literal, get_args

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax

from . import _compat, _dims
from ._diff import diff_structures
from ._dtypes import is_key_dtype, key_impl_name, short_dtype
from ._errors import Mismatch, StructureMismatchError, format_report, key_change_fix, mismatch_line, policy_fix
from ._leaf import ARRAY, DIM, NUMPY, SCALAR, SCALAR_TYPES, flatten, kind_of, refuse_cycles, refuse_leaked_tracers
from ._structure import PyTree, Structure, read_structure
from ._values import check_x64


# The carry policies (the API's table): which leaves may change dtype to reach a loop body's type.
Policy = Literal["weak", "promote", "cast"]
POLICIES: Final[tuple[Policy, ...]] = get_args(Policy)


def check_policy(policy: str, fn_name: str) -> None:
    if policy not in POLICIES:
        allowed = ", ".join(repr(p) for p in POLICIES)
        raise ValueError(
            f"treeshape.{fn_name}: unknown policy {policy!r}; use one of {allowed}: "
            '"weak" changes only weakly typed leaves (JAX\'s own loop-carry rule), '
            '"promote" also strong leaves whose dtype promotes to the target, '
            '"cast" any leaf to any dtype.'
        )


def _abstract(x: Any) -> Any:
    """The abstract value of an array-like leaf, or None for a static leaf."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if kind_of(type(x)) in (ARRAY, NUMPY, SCALAR, DIM):
        try:
            return jax.typeof(x)
        except TypeError:  # a NumPy array of strings or objects: a static value
            return None
    return None


def is_weak(x: Any) -> bool:
    """Return whether `x` is weakly typed (a Python scalar or an array derived from one).

    Args:
        x: An array, tracer, `jax.ShapeDtypeStruct` or Python scalar, or a
            [treeshape.Structure][] of one leaf (as for its leaf).

    Returns:
        `True` for Python `int`/`float`/`complex` and weak arrays; `False` for
        `bool`, NumPy values and strong arrays.

    Raises:
        TypeError: `x` is none of the above (for a Structure of several
            leaves, use [treeshape.weak_paths][]).

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.is_weak(1.0), ts.is_weak(jnp.asarray(1.0)), ts.is_weak(jnp.float32(1.0))
        (True, True, False)
        >>> ts.is_weak(ts.structure_of(0))
        True
    """
    if isinstance(x, Structure):
        if len(x) != 1:
            raise TypeError(
                f"treeshape.is_weak: expected a single leaf, got a Structure of {len(x)} leaves. "
                "Use ts.weak_paths(structure) for the paths of its weak leaves."
            )
        (x,) = x.leaves
    refuse_leaked_tracers([x], "is_weak")
    aval = _abstract(x)
    if aval is None:
        raise TypeError(
            f"treeshape.is_weak: expected an array, tracer, jax.ShapeDtypeStruct or Python "
            f"scalar, got {type(x).__name__}. Use ts.weak_paths(tree) for a whole pytree."
        )
    return bool(aval.weak_type)


def weak_paths(tree: PyTree) -> list[str]:
    """List the `jax.tree_util.keystr` paths of the weakly typed leaves of `tree`.

    `tree` may also be a [treeshape.Structure][]. Static leaves (strings,
    callables, ...) are never weak.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.weak_paths({"lr": 0.1, "w": jnp.ones(2), "step": jnp.asarray(0)})
        ["['lr']", "['step']"]
        >>> ts.weak_paths(ts.structure_of({"lr": 0.1, "w": jnp.ones(2)}))
        ["['lr']"]
    """
    if isinstance(tree, Structure):
        return [p for p, leaf in zip(tree.paths, tree.leaves, strict=True) if _weak_leaf(leaf)]
    refuse_cycles(tree, "weak_paths", "tree")
    try:
        flat, _ = jtu.tree_flatten_with_path(tree)
    except (RecursionError, SystemError):  # a custom node that contains itself: JAX's C++ code gave up
        flatten(tree, "weak_paths", "tree", checked=True)  # raises the ValueError that says so
        raise
    refuse_leaked_tracers([x for _, x in flat], "weak_paths")
    paths = []
    for path, x in flat:
        aval = _abstract(x)
        if aval is not None and aval.weak_type:
            paths.append(jtu.keystr(path))
    return paths


def _weak_leaf(leaf: Any) -> bool:
    return isinstance(leaf, jax.ShapeDtypeStruct) and leaf.weak_type


def _make_strong(x: Any) -> Any:
    aval = _abstract(x)
    if aval is None or not aval.weak_type:
        return x
    if isinstance(x, jax.ShapeDtypeStruct):
        return x.update(weak_type=False)
    return lax.convert_element_type(x, aval.dtype)


def strip_weak_type(tree: PyTree) -> PyTree:
    """Make every weakly typed leaf of `tree` strong, keeping its value and dtype.

    Python scalars become strong arrays of JAX's default dtype for them, weak
    arrays and tracers are converted (a no-op at run time), weak
    `jax.ShapeDtypeStruct`s get `weak_type=False`. Useful to give a jitted
    function one stable signature whether its inputs come weak or strong. A
    [treeshape.Structure][] gives a Structure whose leaves are all strong.

    Examples:
        >>> import treeshape as ts
        >>> ts.strip_weak_type({"lr": 0.1, "name": "adam"})
        {'lr': Array(0.1, dtype=float32), 'name': 'adam'}
        >>> ts.strip_weak_type(ts.structure_of({"step": 0}))
        Structure({'step': i32[]}, 1 leaf, 4 B)
    """
    if isinstance(tree, Structure):
        leaves = tuple(leaf.update(weak_type=False) if _weak_leaf(leaf) else leaf for leaf in tree.leaves)
        return Structure(tree.treedef, leaves)
    flat, treedef = flatten(tree, "strip_weak_type", "tree")
    refuse_leaked_tracers(flat, "strip_weak_type")
    return jtu.tree_unflatten(treedef, [_make_strong(x) for x in flat])


# -- dtype changes -------------------------------------------------------------
_KIND_SCALARS: Final = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


@ft.cache
def weak_result(src: Any, dst: Any) -> Any:
    """The dtype JAX gives a weak value of dtype `src` meeting dtype `dst`:
    the result type of a Python scalar of `src`'s kind with `dst` (None if JAX
    refuses, as in strict promotion mode)."""
    kind = np.dtype(src).kind if not jnp.issubdtype(src, jax.dtypes.prng_key) else None
    if kind not in _KIND_SCALARS or jnp.issubdtype(dst, jax.dtypes.prng_key):
        return None
    try:
        return jnp.result_type(_KIND_SCALARS[kind], dst)
    except Exception:  # TypePromotionError under jax_numpy_dtype_promotion="strict"
        return None


@ft.cache
def _promotes(src: Any, dst: Any) -> bool:
    try:
        return bool(jnp.promote_types(src, dst) == dst)
    except Exception:
        return False


def key_change(src: Any, dst: Any) -> bool:
    """Whether a change from dtype `src` to `dst` touches a typed PRNG key: to or from a key
    dtype, or between key implementations. No policy allows one."""
    return bool(src != dst and (is_key_dtype(src) or is_key_dtype(dst)))


def dtype_change_allowed(src: Any, src_weak: bool, dst: Any, policy: Policy) -> bool:
    """Whether `policy` lets a leaf of dtype `src` take dtype `dst`."""
    if key_change(src, dst):
        return False
    if policy == "cast":
        return True
    if src_weak and weak_result(src, dst) == dst:
        return True
    return policy == "promote" and _promotes(src, dst)


def allowing_policy(src: Any, src_weak: bool, dst: Any) -> Policy | None:
    """The first (least permissive) policy that allows the change."""
    for policy in POLICIES:
        if dtype_change_allowed(src, src_weak, dst, policy):
            return policy
    return None  # a change that touches a typed PRNG key (see `key_change`)


def convert(x: Any, dtype: Any, weak_type: bool) -> Any:
    """`x` as an array of `dtype` with the given weak flag (a no-op when it already is)."""
    aval = jax.typeof(x)
    if aval.dtype == dtype and aval.weak_type == weak_type and not isinstance(x, (int, float, complex)):
        return x
    return _compat.convert_element_type(x, dtype, weak_type=weak_type)


# -- upcast --------------------------------------------------------------------
def upcast(tree: PyTree, like: Structure | PyTree, *, policy: Policy = "weak") -> PyTree:
    """Convert `tree` to the dtypes of `like`, as far as `policy` allows.

    Leaves whose dtype already matches are returned unchanged; a converted leaf
    takes `like`'s dtype and weak flag.

    Args:
        tree: A pytree of arrays, tracers or Python scalars (static leaves are
            kept and must equal `like`'s; `jax.ShapeDtypeStruct` leaves come
            back as `ShapeDtypeStruct`s of the new dtypes), or a
            [treeshape.Structure][] (then the result is the converted Structure).
        like: A [treeshape.Structure][] or a pytree of arrays or
            `jax.ShapeDtypeStruct`s with the same structure and shapes.
        policy: Which leaves may change dtype:

            - `"weak"` (default): only weakly typed leaves, to the dtype JAX's
              weak-type promotion gives;
            - `"promote"`: also strong leaves, where
              `jnp.promote_types(src, dst) == dst`;
            - `"cast"`: any leaf, to any dtype.

    Returns:
        `tree` with `like`'s dtypes.

    Raises:
        StructureMismatchError: the structures or shapes differ, or `policy`
            forbids a dtype change; the message lists every offending leaf
            (dtype problems together with structure and shape problems).
        ValueError: `policy` is not one of the three above.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> like = {"lr": jnp.zeros((), jnp.bfloat16), "w": jnp.zeros(2, jnp.float32)}
        >>> ts.upcast({"lr": 0.5, "w": jnp.ones(2, jnp.bfloat16)}, like, policy="promote")
        {'lr': Array(0.5, dtype=bfloat16), 'w': Array([1., 1.], dtype=float32)}
        >>> ts.upcast(ts.structure_of({"lr": 0.5}), like={"lr": jnp.zeros((), jnp.bfloat16)})
        Structure({'lr': bf16[]}, 1 leaf, 2 B)
    """
    check_policy(policy, "upcast")
    for part in (tree, like):
        if not isinstance(part, Structure):
            refuse_leaked_tracers(jtu.tree_leaves(part), "upcast")
    target = read_structure(like, "upcast", "like")
    source = read_structure(tree, "upcast")
    source_at = dict(zip(source.paths, source.leaves, strict=True))
    mismatches: list[Mismatch] = []
    lines = []
    found = _dims.match(target, source, "tree")[1] if target.dims else diff_structures(target, source, "tree")
    for m in found:
        if m.kind == "dtype":
            have = source_at[m.path]
            if dtype_change_allowed(have.dtype, have.weak_type, m.expected, policy):
                continue
            src, dst = short_dtype(have.dtype), short_dtype(m.expected)
            if key_change(have.dtype, m.expected):
                fix = key_change_fix(src, dst, key_impl_name(have.dtype), key_impl_name(m.expected), False)
            else:
                fix = policy_fix(
                    src, have.weak_type, dst, policy, allowing_policy(have.dtype, have.weak_type, m.expected)
                )
            lines.append((m.where, m.what, fix))
        elif m.kind in ("structure", "shape"):
            lines.append(mismatch_line(m))
        else:  # a weak flag or manual axes: `upcast` sets the flag, and does not change axes
            continue
        mismatches.append(m)
    if mismatches:
        header = f'treeshape.upcast: the tree cannot be converted to the target under policy="{policy}"'
        raise StructureMismatchError(format_report(header, lines, "leaves differ"), mismatches)
    if isinstance(tree, Structure):
        return Structure(
            source.treedef,
            tuple(
                have.update(dtype=want.dtype, weak_type=want.weak_type)
                if isinstance(want, jax.ShapeDtypeStruct) and want.dtype != have.dtype
                else have
                for want, have in zip(target.leaves, source.leaves, strict=True)
            ),
        )
    leaves = jtu.tree_leaves(tree)
    converted = [
        isinstance(want, jax.ShapeDtypeStruct) and (want.dtype != have.dtype or type(x) in SCALAR_TYPES)
        for x, want, have in zip(leaves, target.leaves, source.leaves, strict=True)
    ]
    check_x64(
        lambda: [p for p, c in zip(target.paths, converted, strict=True) if c],
        [want for want, c in zip(target.leaves, converted, strict=True) if c],
        "upcast",
    )
    out = [_convert_leaf(x, want) if c else x for x, want, c in zip(leaves, target.leaves, converted, strict=True)]
    return jtu.tree_unflatten(source.treedef, out)


def _convert_leaf(x: Any, want: jax.ShapeDtypeStruct) -> Any:
    if isinstance(x, jax.ShapeDtypeStruct):  # abstract in, abstract out (its sharding kept), as for a Structure
        return x.update(dtype=want.dtype, weak_type=want.weak_type)
    return convert(x, want.dtype, want.weak_type)
