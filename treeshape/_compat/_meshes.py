"""Meshes and partition specs: the mesh set with `jax.set_mesh`, the abstract mesh a jaxpr
equation was traced under (and one moved to another), a `PartitionSpec`'s entries and its
text as the newest JAX prints it, and a value made varying over manual mesh axes.
"""

from collections.abc import Callable
from typing import Any, Final

import jax
from jax import lax

from ._private import mesh as _mesh


# `lax.pcast(x, axes, to="varying")` from jax 0.8.2; `lax.pvary(x, axes)` before
# (deprecated from 0.8.2 and removed in 0.11): the new name is tried first.
_pcast: Final[Callable[..., Any] | None] = getattr(lax, "pcast", None)
_pvary: Final[Callable[..., Any] | None] = getattr(lax, "pvary", None)


def pcast_varying(x: Any, axes: tuple[str, ...]) -> Any:
    """`x` made varying over the manual mesh axes `axes` (a no-op for axes it already varies over)."""
    if _pcast is not None:
        return _pcast(x, axes, to="varying")
    assert _pvary is not None  # every release has one of the two
    return _pvary(x, axes)


# -- meshes ----------------------------------------------------------------------------
# `jax.sharding.get_mesh` from jax 0.8.1; the same context is read directly before.
_get_mesh: Final[Callable[[], Any]] = getattr(jax.sharding, "get_mesh", _mesh.get_concrete_mesh)


def current_mesh() -> Any:
    """The concrete mesh set with `jax.set_mesh` (an empty mesh when none is). Top level only."""
    return _get_mesh()


def context_mesh(context: Any) -> Any:
    """The abstract mesh a jaxpr equation was traced under (its `ctx`), which JAX sets
    again when it evaluates or lowers the equation."""
    return context.cur_abstract_mesh


def with_context_mesh(context: Any, mesh: Any) -> Any:
    """A jaxpr equation's context (`eqn.ctx`, a `JaxprEqnContext`, no public type) with
    another abstract mesh, everything else as it was: JAX has no public way to build one.
    A new object: jax 0.10 interns contexts, so one is never changed in place."""
    if mesh is context.cur_abstract_mesh:
        return context
    kind = type(context)
    moved = object.__new__(kind)
    for name in kind.__slots__:
        if name != "__weakref__" and hasattr(context, name):
            object.__setattr__(moved, name, getattr(context, name))
    object.__setattr__(moved, "cur_abstract_mesh", mesh)
    return moved


def spec_entries(spec: Any) -> tuple[Any, ...]:
    """A `PartitionSpec`'s entries, one per leading dimension it names.

    From jax 0.10.0 iterating over or indexing a spec with unreduced or reduced
    axes raises, and `spec.partitions` gives the entries; before, the spec
    iterates over them (and has no `partitions`).
    """
    entries = getattr(spec, "partitions", None)
    return tuple(spec) if entries is None else tuple(entries)


def spec_text(spec: Any) -> str:
    """A `PartitionSpec` as the newest JAX prints it, `P('d', None)`, on every release
    (before jax 0.9.1 its repr is `PartitionSpec('d', None)`)."""
    text = "P(" + repr(spec_entries(spec))[1:-1]
    unreduced, reduced = getattr(spec, "unreduced", None), getattr(spec, "reduced", None)
    extra = [f"{name}={set(axes)!r}" for name, axes in (("unreduced", unreduced), ("reduced", reduced)) if axes]
    if extra:
        text += ("" if text == "P(" else " " if text.endswith(",") else ", ") + ", ".join(extra)
    return text + ")"
