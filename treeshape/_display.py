"""`ts.describe`: any pytree (or Structure) as the table `str(Structure)` shows."""

from typing import Any

import numpy as np

from ._structure import Structure, read_structure
from ._table import DEFAULT_MAX_ROWS, Description, depth_table, html_depth_table, html_table, table


PyTree = Any


def describe(tree_or_structure: PyTree, *, depth: int | None = None, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Describe a pytree (or a [treeshape.Structure][]) as an aligned table.

    Without `depth`, the table of `str(structure)`: one row per leaf (path, shape, dtype,
    an *extra* column for shardings and static values, bytes, and bytes per device where
    some leaf is sharded), then a total row. With `depth=N`, memory by module: one row
    per path prefix of `N` keys, with its leaves, parameters and bytes. The columns are
    those of [Reading a structure](../guide/structures.md#reading-a-structure) and
    [Memory by module](../guide/structures.md#memory-by-module-describe-depthn). In a
    notebook the returned string shows as the same table in HTML.

    Args:
        tree_or_structure: A [treeshape.Structure][], or any pytree that
            [treeshape.structure_of][] accepts (arrays, tracers,
            `jax.ShapeDtypeStruct`s, scalars, static values).
        depth: Group the leaves by the first `depth` keys of their paths
            (`0`: one row for the whole tree); `None`: a row per leaf.
        max_rows: Show at most this many rows (`None`: all of them).

    Returns:
        The table, as lines joined by newlines (no trailing newline): a `str`
        that also has `_repr_html_`.

    Raises:
        ValueError: `max_rows` is negative, or `depth` is not an int >= 0.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> params = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3)}
        >>> print(ts.describe({"params": params, "step": 0}))
        path             shape  dtype  bytes
        ---------------  -----  -----  -----
        ['params']['b']  [3]    f32     12 B
        ['params']['w']  [2,3]  bf16    12 B
        ['step']         []     ~i32     4 B
        ---------------  -----  -----  -----
        total: 3 leaves, 10 elements    28 B
        >>> model = {"encoder": {"w": jnp.zeros((64, 64)), "b": jnp.zeros(64)}, "head": jnp.zeros((64, 10))}
        >>> print(ts.describe(model, depth=1))
        path         leaves  params     bytes
        -----------  ------  ------  --------
        ['encoder']       2   4,160  16.2 KiB
        ['head']          1     640   2.5 KiB
        -----------  ------  ------  --------
        total             3   4,800  18.8 KiB
    """
    depth = _count("depth", depth, "how many keys of each path make a row; None: a row per leaf")
    max_rows = _count("max_rows", max_rows, "how many rows to show; None: all of them")
    if isinstance(tree_or_structure, Structure):
        structure = tree_or_structure
    else:
        structure = read_structure(tree_or_structure, "describe")
    if depth is None:
        return Description(table(structure, max_rows), lambda: html_table(structure, max_rows))
    by_depth: int = depth
    return Description(
        depth_table(structure, by_depth, max_rows), lambda: html_depth_table(structure, by_depth, max_rows)
    )


def _count(name: str, value: Any, meaning: str) -> int | None:
    """`value` of the argument `name` as an int >= 0 (or None); else a ValueError that says so."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0:
        return int(value)
    raise ValueError(
        f"treeshape.describe: `{name}` must be None or an int >= 0 ({meaning}), got {type(value).__name__} {value!r}."
    )
