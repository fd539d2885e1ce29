"""Compact text for leaves: `f32[2,3]`, `~f32[]` (weak), `key<fry>[4]`."""

import functools as ft
from typing import Any

import jax
import numpy as np


_PREFIXES = (("bfloat", "bf"), ("float", "f"), ("uint", "u"), ("int", "i"), ("complex", "c"))


@ft.lru_cache(maxsize=None)
def short_dtype(dtype: Any) -> str:
    """`float32` -> `f32`, `bfloat16` -> `bf16`, `key<fry>` unchanged."""
    name = str(dtype) if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) else np.dtype(dtype).name
    for long, short in _PREFIXES:
        if name.startswith(long):
            return short + name[len(long) :]
    return name


def short_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def varying_axes(leaf: jax.ShapeDtypeStruct) -> frozenset[str]:
    """The manual mesh axes a leaf varies over (empty outside `shard_map`)."""
    mat = leaf.manual_axis_type
    return frozenset(mat.varying) if mat is not None else frozenset()


def leaf_str(leaf: Any) -> str:
    """One leaf in compact notation; static leaves as their `repr`."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        weak = "~" if leaf.weak_type else ""
        text = f"{weak}{short_dtype(leaf.dtype)}{short_shape(leaf.shape)}"
        axes = varying_axes(leaf)
        if axes:
            text += "{V:" + ",".join(sorted(axes)) + "}"
        return text
    text = repr(leaf)
    return text if len(text) <= 40 else text[:37] + "..."


def human_bytes(n: int) -> str:
    """`36 B`, `1.5 KiB`, `64.0 GiB`."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
