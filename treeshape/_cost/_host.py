"""What a call of a jitted step asks of the host: its arrays in (each dispatched) and out
(each wrapped), and the nodes of its pytrees whose flattening runs Python (every type
registered outside JAX's own containers: an nnx `State` and its `Variable`s, an equinox
`Module`), which `_time` prices as a v5e's host measured them."""

import collections
from collections.abc import Iterable
from typing import Any, Final

import jax.tree_util as jtu

from .._tree import node_types


# The containers JAX flattens in C++ (a namedtuple too).
_BUILTIN: Final = frozenset({tuple, list, dict, type(None), collections.OrderedDict, collections.defaultdict})


def tree_counts(inputs: jtu.PyTreeDef, outputs: Iterable[jtu.PyTreeDef]) -> tuple[int, int, int]:
    """The leaves of `inputs`, the leaves of `outputs`, and the nodes of both of types
    registered outside JAX's own containers."""
    trees = [inputs, *outputs]
    nodes = sum(not _builtin(kind) for tree in trees for kind in node_types(tree))
    return inputs.num_leaves, sum(tree.num_leaves for tree in trees[1:]), nodes


def _builtin(kind: Any) -> bool:
    return kind in _BUILTIN or (isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"))
