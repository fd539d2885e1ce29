"""`ts.describe`: any pytree (or Structure) as the table `str(Structure)` shows."""

from typing import Any

from ._infer import structure_of
from ._structure import Structure
from ._table import DEFAULT_MAX_ROWS, table


PyTree = Any


def describe(tree_or_structure: PyTree, *, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Describe a pytree (or a [treeshape.Structure][]) as an aligned table.

    The same table as `str(structure)`: one row per leaf with its path, shape,
    dtype (`~` marks a weak type, as JAX prints it), an *extra* column (the
    sharding's `PartitionSpec`, one entry per dimension, the manual mesh axes
    `{V:i}` a leaf varies over under `shard_map`, or `static TYPE` for a static
    leaf; left out when every row is empty) and its size in bytes, then a total
    row with the number of leaves, elements and bytes. When some leaf is split
    over devices, a *per device* column shows each leaf's largest shard and
    the total [treeshape.Structure.nbytes_per_device][], and leaves copied
    whole onto several devices say "replicated". Long trees show their first
    and last rows around a `... N more leaves` line; the total always counts
    every leaf.

    Args:
        tree_or_structure: A [treeshape.Structure][], or any pytree that
            [treeshape.structure_of][] accepts (arrays, tracers,
            `jax.ShapeDtypeStruct`s, scalars, static values).
        max_rows: Show at most this many leaf rows (`None`: all of them).

    Returns:
        The table, as lines joined by newlines (no trailing newline).

    Raises:
        ValueError: `max_rows` is negative.

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
    """
    if isinstance(tree_or_structure, Structure):
        structure = tree_or_structure
    else:
        structure = structure_of(tree_or_structure)
    return table(structure, max_rows)
