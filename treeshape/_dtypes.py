"""Dtypes: which dtypes JAX holds, typed PRNG key dtypes, an element's bytes, and short names.

A leaf's dtype is one JAX can hold (numbers, bool, bfloat16, float8, PRNG
keys) or the leaf is static. A typed PRNG key dtype (`key<fry>`) is an
extended dtype: its element's bytes are those of its key data, and its
implementation is named as `jax.random.key` takes it (`threefry2x32`) or by
the tag it prints (`fry`). Dtypes are written short, both ways: `float32` <->
`f32`, `bfloat16` <-> `bf16`.
"""

import functools as ft
import math
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat


_jax_dtypes_seen: dict[Any, bool] = {}


def jax_dtype(dtype: Any) -> bool:
    """Whether JAX can hold an array of `dtype` (numbers, bool, bfloat16, float8, PRNG keys, ...)."""
    try:
        return _jax_dtypes_seen[dtype]
    except (KeyError, TypeError):
        pass
    try:
        ok = any(jnp.issubdtype(dtype, kind) for kind in (jnp.number, jnp.bool_, jax.dtypes.extended))
    except TypeError:  # not a dtype at all
        ok = False
    try:
        _jax_dtypes_seen[dtype] = ok
    except TypeError:
        pass
    return ok


# -- typed PRNG keys -----------------------------------------------------------------
@ft.cache
def _key_data_bytes(dtype: Any) -> int:
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
    return int(math.prod(data.shape) * np.dtype(data.dtype).itemsize)


@ft.cache
def is_key_dtype(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))


def element_bytes(dtype: Any) -> int:
    """The bytes of one element of `dtype` (of a typed PRNG key: its key data's)."""
    return _key_data_bytes(dtype) if is_key_dtype(dtype) else np.dtype(dtype).itemsize


# Each built-in PRNG implementation's tag, the name its key dtype prints (`key<fry>`).
_KEY_TAGS: Final = {tag: impl for impl, (tag, _) in _compat.PRNG_IMPLS.items()}


def key_dtype(name: str) -> Any:
    """The key dtype of a PRNG implementation named as `jax.random.key` takes it
    (`"threefry2x32"`) or by its tag (`"fry"`, as in `key<fry>`).

    Raises:
        JaxReleaseError: a built-in implementation that the running JAX lacks.
        ValueError: no implementation of that name.
    """
    return _compat.key_dtype(_KEY_TAGS.get(name, name))


def key_dtypes() -> dict[str, Any]:
    """Every key dtype the running JAX has, by the name it prints (`"key<fry>"`)."""
    return {str(dtype): dtype for dtype in map(_compat.key_dtype, _compat.key_impls())}


def key_tags() -> tuple[str, ...]:
    """The tags of the PRNG implementations the running JAX has, `fry` first (JAX's default)."""
    return tuple(_compat.PRNG_IMPLS[impl][0] for impl in _compat.key_impls())


@ft.cache
def key_impl_name(dtype: Any) -> str:
    """The `impl=` name of a typed PRNG key dtype, as `jax.random.key` takes it ("" for others)."""
    if not is_key_dtype(dtype):
        return ""
    names: list[str] = []

    def read(key: Any) -> None:
        names.append(str(jax.random.key_impl(key)))

    jax.eval_shape(read, jax.ShapeDtypeStruct((), dtype))
    return names[0]


# -- short names -----------------------------------------------------------------------
# Short dtype names: each long prefix and its short form (`bfloat16` <-> `bf16`),
# in the order both directions must try them.
_DTYPE_PREFIXES: Final = (
    ("bfloat", "bf"),
    ("float", "f"),
    ("uint", "u"),
    ("int", "i"),
    ("complex", "c"),
)


@ft.cache
def short_dtype(dtype: Any) -> str:
    """`float32` -> `f32`, `bfloat16` -> `bf16`, `key<fry>` unchanged."""
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        name = str(dtype)
    else:
        name = np.dtype(dtype).name
    for long, short in _DTYPE_PREFIXES:
        if name.startswith(long):
            return short + name[len(long) :]
    return name


def long_dtype_name(name: str) -> str:
    """A short dtype name in full (`bf16` -> `bfloat16`, `u8` -> `uint8`); other names unchanged."""
    for long, short in _DTYPE_PREFIXES:
        rest = name[len(short) :]
        if name.startswith(short) and rest[:1].isdigit():
            return long + rest
    return name
