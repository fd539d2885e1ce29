"""`ts.check_prefix`: is one pytree a tree prefix of another (partition specs, `in_axes`, masks)?"""

import dataclasses
from typing import Any, Final

import jax
import jax.tree_util as jtu

from ._compat import spec_text
from ._diff import diff_structures
from ._errors import MAX_WHERE, Mismatch, StructureMismatchError, merged_lines
from ._structure import Structure, read_structure
from ._tree import clip


PyTree = Any

_WHO: Final = "treeshape.check_prefix"
_MAX_LINES: Final = 20  # places a message lists before "... and N more"


class _PrefixLeaf:
    """A leaf of the prefix, as it reads in a message (`0`, `None`, `P('d', None)`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        if isinstance(self.value, jax.sharding.PartitionSpec):
            return spec_text(self.value)
        return repr(self.value)


def _is_prefix_leaf(x: Any) -> bool:
    return x is None or isinstance(x, jax.sharding.PartitionSpec)


def check_prefix(prefix: PyTree, tree: PyTree) -> None:
    """Check that `prefix` is a tree prefix of `tree`, listing every place where it is not.

    A tree prefix is what `jax.vmap`'s `in_axes`, `jax.jit`'s `in_shardings`
    and `out_shardings`, an optax mask or a tree of per-layer learning rates
    must be: the containers of `tree` down to some depth, each leaf of
    `prefix` (a number, a bool, `None`, a `PartitionSpec`, any value) standing
    for the whole subtree of `tree` at its path. Above its leaves, `prefix`
    must have the same node types, dict keys, lengths and node data as
    `tree`. JAX reports the first place where this fails, in words that
    changed between releases; this reports every place at once, by path.

    Args:
        prefix: The prefix pytree. `None` and `PartitionSpec`s are leaves
            here (as in `in_axes` and shardings), not empty nodes. Where
            `tree` is a tuple (a function's arguments), a top-level list is
            read as a tuple, as `jax.vmap` reads `in_axes` and `jax.jit`
            its `in_shardings`.
        tree: The full pytree: arrays, tracers, `ShapeDtypeStruct`s, static
            values, or a [treeshape.Structure][].

    Returns:
        None, when `prefix` is a tree prefix of `tree`.

    Raises:
        StructureMismatchError: listing each place where `prefix` is not a
            tree prefix of `tree` (kind `"structure"`, paths rooted at
            `prefix`): what the tree has there (`expected`: keys, lengths,
            node types, leaves) and what the prefix has (`actual`); an entry
            the prefix lacks is `missing`, one the tree lacks `unexpected`.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> import treeshape as ts
        >>> params = {"dense": {"b": jnp.zeros(2), "w": jnp.zeros((4, 2))}, "head": [jnp.zeros(2), jnp.zeros(2)]}
        >>> ts.check_prefix({"dense": P("d"), "head": None}, params)  # each leaf stands for a whole subtree
        >>> ts.check_prefix({"dense": {"w": P("d")}, "head": [None, None, None]}, params)
        Traceback (most recent call last):
        ...
        treeshape.StructureMismatchError: treeshape.check_prefix: `prefix` is not a tree prefix of `tree`;
        2 differences:
        <BLANKLINE>
          * prefix['dense']['b']: missing from the prefix; the tree has f32[2] here.
          * prefix['head'][2]: not in the tree; the prefix has None here.
        <BLANKLINE>
        Each leaf of `prefix` (a value, None or a PartitionSpec) stands for the whole subtree of `tree` at
        its path; above its leaves, `prefix` must have the containers of `tree`.
    """
    actual = read_structure(tree, "check_prefix")
    as_arguments = type(prefix) is list and _is_tuple(actual.treedef)
    if as_arguments:  # `jax.vmap` and `jax.jit` read a top-level list as the tuple of arguments
        prefix = tuple(prefix)
    keyed, prefix_def = jtu.tree_flatten_with_path(prefix, is_leaf=_is_prefix_leaf)
    if _same(prefix_def, actual.treedef):  # `tree`'s own containers, all the way down
        return None
    leaves = tuple(_PrefixLeaf(leaf) for _, leaf in keyed)
    at_leaves = {jtu.keystr(path): leaf for (path, _), leaf in zip(keyed, leaves, strict=True)}
    found = [
        # A prefix leaf stands for whatever `tree` has at its path: only an entry `tree` lacks differs
        # there, and it is told as the user wrote it.
        m if m.path not in at_leaves else dataclasses.replace(m, actual=repr(at_leaves[m.path]))
        for m in diff_structures(actual, Structure(prefix_def, leaves), "prefix")
        if m.path not in at_leaves or m.expected is None
    ]
    if found:
        header = f"{_WHO}: `prefix` is not a tree prefix of `tree`"
        rule = (
            "Each leaf of `prefix` (a value, None or a PartitionSpec) stands for the whole subtree of `tree` at "
            "its path; above its leaves, `prefix` must have the containers of `tree`."
        )
        if as_arguments:
            rule += (
                " (The top-level list of `prefix` was read as a tuple, as `jax.vmap` reads `in_axes` and `jax.jit` "
                "its shardings against the tuple of arguments.)"
            )
        raise StructureMismatchError(_listing_message(header, found, rule), found)
    return None


def _what(m: Mismatch) -> str:
    """One place where `prefix` is not a tree prefix of `tree`, in words."""
    if m.expected is None:
        return f"not in the tree; the prefix has {m.actual} here."
    if m.actual is None:
        return f"missing from the prefix; the tree has {m.expected} here."
    return f"the tree has {m.expected} here, the prefix {m.actual}."


def _listing_message(header: str, mismatches: list[Mismatch], rule: str) -> str:
    """`header`, then each mismatch as one line told by `_what` (entries at consecutive
    indices merged, at most `_MAX_LINES` lines), then `rule`, the one fix they share."""
    lines = merged_lines(mismatches, _what)
    if len(lines) == 1:
        where, told, _ = lines[0]
        return f"{header}: {clip(where, MAX_WHERE)}: {told}\n\n{rule}"
    bullets = [f"  * {clip(where, MAX_WHERE)}: {told}" for where, told, _ in lines[:_MAX_LINES]]
    if len(lines) > _MAX_LINES:
        bullets.append(f"  * ... and {len(lines) - _MAX_LINES} more (every one is on the exception's `.mismatches`)")
    return f"{header}; {len(mismatches)} differences:\n\n" + "\n".join(bullets) + f"\n\n{rule}"


def _is_tuple(treedef: jtu.PyTreeDef) -> bool:
    """Whether the root of `treedef` is a plain tuple (as a function's arguments are)."""
    data = treedef.node_data()
    return data is not None and data[0] is tuple


def _same(a: jtu.PyTreeDef, b: jtu.PyTreeDef) -> bool:
    try:
        return bool(a == b)
    except Exception:  # node data whose `==` raises: compared field by field by the diff
        return False
