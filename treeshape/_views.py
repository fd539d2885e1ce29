"""What the package's modules read of a `Structure` and of a `Cost` that are built on
them (`_diff`, `_compare`, `_sharding`, `_values`, `_table`, `_infer`, the command line):
one declared interface each, the underscore members among them included, so that no
module relies on more (`tests/test_architecture.py` checks every read of an underscore
member outside its own room against these)."""

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import jax.tree_util as jtu


_T = TypeVar("_T")


class TreeView(Protocol):
    """What a diff reads of two trees (a Structure, or one with a binding applied)."""

    @property
    def treedef(self) -> jtu.PyTreeDef: ...

    @property
    def leaves(self) -> tuple[Any, ...]: ...

    @property
    def paths(self) -> tuple[str, ...]: ...


class StructureView(TreeView, Protocol):
    """A `Structure` as the modules below it read it."""

    @property
    def tree(self) -> Any: ...

    @property
    def dims(self) -> tuple[str, ...]: ...

    @property
    def nbytes_per_device(self) -> int: ...

    @property
    def _meshes(self) -> tuple[Any, ...] | None: ...

    def __len__(self) -> int: ...

    def _known_paths(self, head: int, tail: int) -> list[str] | None: ...

    def _check_extents(self, who: str, fix: str = "") -> None: ...

    def _sharded(self) -> bool: ...

    def _memo(self, name: str, compute: Callable[[], _T]) -> _T: ...

    def _on_meshes(self, meshes: tuple[Any, ...] | None) -> Any: ...


class CostView(Protocol):
    """A `Cost` as the command line reads it."""

    def _text(self, n_buffers: int) -> str: ...


def _declared(*views: type) -> frozenset[str]:
    """The underscore members (not dunders, nor `Protocol`'s own) the views declare."""
    own = {n for view in views for n in view.__annotations__} | {n for view in views for n in vars(view)}
    return frozenset(n for n in own if n.startswith("_") and not n.startswith("__") and n[1:2] != "_" and
                     n not in ("_is_protocol", "_abc_impl", "_is_runtime_protocol"))  # fmt: skip


# The underscore members another room may read: the interfaces above, by class.
READ_ELSEWHERE: dict[str, frozenset[str]] = {"Structure": _declared(StructureView), "Cost": _declared(CostView)}
