"""What a call of a jitted step asks of the host: its arrays (each dispatched on the way
in and wrapped on the way out) and the nodes of its pytrees whose flattening runs Python
(every type registered outside JAX's own containers: an nnx `State` and its `Variable`s,
an equinox `Module`), which `_time` prices as a v5e's host measured them."""

import collections
from collections.abc import Iterable
from typing import Any, Final

import jax.tree_util as jtu

from .._tree import node_types


# The containers JAX flattens in C++ (a namedtuple too).
_BUILTIN: Final = frozenset({tuple, list, dict, type(None), collections.OrderedDict, collections.defaultdict})


def tree_counts(trees: Iterable[jtu.PyTreeDef]) -> tuple[int, int]:
    """The leaves of `trees` and their nodes of types registered outside JAX's own
    containers."""
    leaves = nodes = 0
    for tree in trees:
        leaves += tree.num_leaves
        nodes += sum(not _builtin(kind) for kind in node_types(tree))
    return leaves, nodes


def _builtin(kind: Any) -> bool:
    return kind in _BUILTIN or (isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"))
