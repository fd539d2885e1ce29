"""A value's type as JAX reads and builds it: the abstract value JAX traces for an input, a
JAX type as a `ShapeDtypeStruct` (its weak flag, its given sharding, its manual axes), a
conversion that sets the weak flag, the dtypes of typed PRNG keys, and `TypePromotionError`.
"""

import functools as ft
from collections.abc import Iterable
from typing import Any, Final

import jax
import numpy as np

from ._private import core as _core, dtypes as _dtypes, lax as _lax
from ._releases import JaxReleaseError


def convert_element_type(x: Any, dtype: Any, weak_type: bool) -> Any:
    """`lax.convert_element_type` that can also set the `weak_type` flag.

    The public `lax.convert_element_type` always returns a strongly typed
    array, and `jnp` only makes weak arrays of the default dtypes. A zero carry
    for a weak `float16` leaf (what JAX's own loop-carry promotion produces)
    needs this. When only the flag changes it lowers to a same-dtype convert,
    which XLA removes: no runtime operation.
    """
    return _lax._convert_element_type(x, np.dtype(dtype), weak_type=weak_type)


def abstractify(x: Any) -> Any:
    """The abstract value JAX traces for an array-like input: the same function
    `jax.eval_shape` applies to arrays, NumPy arrays, `ShapeDtypeStruct`s and
    duck arrays (shape, canonical dtype, weak type, sharding, manual axes).

    `jax.typeof` is its public counterpart but rejects `ShapeDtypeStruct`s;
    keying the cache on exactly what tracing sees makes those inputs one entry.
    """
    return _core.shaped_abstractify(x)


@ft.lru_cache(maxsize=4096)  # a tree has few distinct types: reading a big one stays cheap
def from_aval(aval: Any) -> jax.ShapeDtypeStruct:
    """A JAX type as a `ShapeDtypeStruct`: shape, dtype, weak flag, and (on a mesh)
    the sharding with the manual axes, which a manual mesh's values carry only together."""
    if aval.sharding.mesh.empty:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return shape_dtype_struct(
        aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=aval.sharding, manual_axes=manual_axes(aval)
    )


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    """What JAX traces for an array-like input (`abstractify`), as a `ShapeDtypeStruct`."""
    return from_aval(abstractify(x))


# `jax.dtypes.TypePromotionError` is public from jax 0.8.1; the class is the same before.
TypePromotionError: Final[type[Exception]] = getattr(jax.dtypes, "TypePromotionError", _dtypes.TypePromotionError)


# -- typed PRNG keys -------------------------------------------------------------------
# JAX's built-in PRNG implementations: the name `jax.random.key(..., impl=)` takes, the
# tag its key dtype prints (`key<fry>`), and the first release that has it.
PRNG_IMPLS: Final = {
    "threefry2x32": ("fry", "0.8.0"),
    "rbg": ("rbg", "0.8.0"),
    "unsafe_rbg": ("urbg", "0.8.0"),
    "threefry4x32": ("fry4", "0.10.2"),
    "philox2x32": ("phx2", "0.10.2"),
    "philox4x32": ("phx4", "0.10.2"),
}


@ft.cache
def key_dtype(impl: str) -> Any:
    """The typed-key dtype of the PRNG implementation `impl` (`"threefry2x32"`), made abstractly.

    `jax.random.key_dtype` from jax 0.10.1; an abstract `jax.random.key` before.

    Raises:
        JaxReleaseError: a built-in implementation that the running release lacks.
        ValueError: a name JAX does not know.
    """
    try:
        if hasattr(jax.random, "key_dtype"):
            return jax.random.key_dtype(impl)
        return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype
    except (ValueError, TypeError, KeyError) as err:
        if impl in PRNG_IMPLS:
            raise JaxReleaseError(f"the PRNG implementation {impl!r}", PRNG_IMPLS[impl][1]) from err
        raise ValueError(f"unknown PRNG implementation {impl!r}") from err


@ft.cache
def key_impls() -> tuple[str, ...]:
    """The built-in PRNG implementations that the running release has."""
    found = []
    for impl in PRNG_IMPLS:
        try:
            key_dtype(impl)
        except JaxReleaseError:
            continue
        found.append(impl)
    return tuple(found)


# -- manual axes under shard_map ------------------------------------------------------
# From jax 0.10.0 a value's manual axes are a `jax.sharding.ManualAxisType`
# (`varying`, `unreduced`, `reduced` axis sets) on `ShapeDtypeStruct`s and
# avals as `.manual_axis_type`. Before, they are `.vma`, a frozenset of the
# varying axes (avals) or None (`ShapeDtypeStruct`s), and manual axes cannot
# be unreduced or reduced. treeshape handles the field's value as opaque
# ("native") and reads it through the functions below.
HAS_MANUAL_AXIS_TYPE: Final = hasattr(jax.sharding, "ManualAxisType")
MANUAL_AXES_FIELD: Final = "manual_axis_type" if HAS_MANUAL_AXIS_TYPE else "vma"
_NO_AXES: Final[frozenset[str]] = frozenset()
UNREDUCED_MANUAL_AXES: Final = "unreduced or reduced manual axes (`jax.sharding.ManualAxisType`)"


# What a `ShapeDtypeStruct` was given as `sharding=` (a `Format`'s sharding): the slot
# `_sharding` on jax 0.8.0 to 0.10.2. The public `sharding` property returns the same object,
# but for a bare `PartitionSpec` (a `NamedSharding` on the mesh in context), and is a Python
# call: `to_json` reads the field of every leaf of a big tree. `sharding` where the slot is gone.
GIVEN_SHARDING_FIELD: Final = (
    "_sharding" if "_sharding" in getattr(jax.ShapeDtypeStruct, "__slots__", ()) else "sharding"
)


def manual_axes(x: Any) -> Any:
    """The native manual-axes value of a `ShapeDtypeStruct` or an aval (None when it has none)."""
    return getattr(x, MANUAL_AXES_FIELD, None)


def axis_sets(x: Any) -> tuple[frozenset[str], frozenset[str], frozenset[str]] | None:
    """`(varying, unreduced, reduced)` manual axes of a `ShapeDtypeStruct` or an aval,
    or None when all three are empty."""
    native = getattr(x, MANUAL_AXES_FIELD, None)
    if native is None:
        return None
    if HAS_MANUAL_AXIS_TYPE:
        if not (native.varying or native.unreduced or native.reduced):
            return None
        return frozenset(native.varying), frozenset(native.unreduced), frozenset(native.reduced)
    return (frozenset(native), _NO_AXES, _NO_AXES) if native else None


def varying_axes(x: Any) -> frozenset[str]:
    """The manual mesh axes a `ShapeDtypeStruct` or an aval varies over (empty outside `shard_map`)."""
    native = getattr(x, MANUAL_AXES_FIELD, None)
    if native is None:
        return _NO_AXES
    return frozenset(native.varying) if HAS_MANUAL_AXIS_TYPE else frozenset(native)


def make_manual_axes(varying: Iterable[str], unreduced: Iterable[str] = (), reduced: Iterable[str] = ()) -> Any:
    """The native manual-axes value for these axis sets (what `ShapeDtypeStruct` takes).

    Raises:
        JaxReleaseError: unreduced or reduced axes, on a release before 0.10.0.
        ValueError: an axis both varying and unreduced or reduced (JAX's own check).
    """
    varying, unreduced, reduced = frozenset(varying), frozenset(unreduced), frozenset(reduced)
    if HAS_MANUAL_AXIS_TYPE:
        return jax.sharding.ManualAxisType(varying=varying, unreduced=unreduced, reduced=reduced)
    if unreduced or reduced:
        raise JaxReleaseError(UNREDUCED_MANUAL_AXES, "0.10.0")
    return varying


def shape_dtype_struct(
    shape: Any, dtype: Any, *, weak_type: bool = False, sharding: Any = None, manual_axes: Any = None
) -> jax.ShapeDtypeStruct:
    """`jax.ShapeDtypeStruct(...)` with a native manual-axes value (`manual_axes(x)`)."""
    if manual_axes is None:
        return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak_type, sharding=sharding)
    return jax.ShapeDtypeStruct(
        shape, dtype, weak_type=weak_type, sharding=sharding, **{MANUAL_AXES_FIELD: manual_axes}
    )


def with_manual_axes(x: jax.ShapeDtypeStruct, manual_axes: Any, **changes: Any) -> jax.ShapeDtypeStruct:
    """`x.update(**changes)` with the native manual-axes value `manual_axes`."""
    updated: jax.ShapeDtypeStruct = x.update(**changes, **{MANUAL_AXES_FIELD: manual_axes})
    return updated
