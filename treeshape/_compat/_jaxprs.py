"""Jaxprs as a derivative's forward pass reads them: the forward of `jax.vjp` and the values
it keeps for the backward pass (`vjp_forward`), the user's line of an equation
(`source_line`), the memory kind of a value (`memory_kind`), the `checkpoint_name` an
equation gives (`checkpoint_name_of`), the equations that hand a value on unchanged
(`PASSES_THROUGH`) and the jaxpr an equation calls whose outputs are its own (`inner_jaxpr`).
"""

import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import jax

from ._private import core as _core


class Forward(NamedTuple):
    """The forward pass of `jax.vjp(fn, *leaves)` as a jaxpr, and the values it saves."""

    jaxpr: Any  # a `jax.extend.core.Jaxpr`; its closed-over values dropped
    residuals: list[Any]  # its outputs that the backward pass takes: `Var`s and `Literal`s


def vjp_forward(fn: Callable[..., Any], leaves: Sequence[Any]) -> Forward:
    """The jaxpr of `jax.vjp(fn, *leaves)` (one trace, nothing runs), and which of its
    outputs are the residuals: the leaves of the function `jax.vjp` returns, last, as
    `jax.ad_checkpoint.print_saved_residuals` reads them. The closed jaxpr's constants (an
    enclosing trace's tracers, where `fn` closes over them) are not kept."""
    closed, shapes = jax.make_jaxpr(lambda *x: jax.vjp(fn, *x), return_shape=True)(*leaves)
    n_res = len(jax.tree_util.tree_leaves(shapes[1]))
    jaxpr = closed.jaxpr
    outvars = list(jaxpr.outvars)
    return Forward(jaxpr, outvars[len(outvars) - n_res :])


# `summarize` (public in `jax.extend.source_info_util`) writes the user's frame of an
# equation as `file:line:column (function)` (`file:line (function)` in some releases).
_SUMMARY: Final = re.compile(r"(?P<file>.+?):(?P<line>\d+)(?::\d+)? \(.*\)")
_PACKAGE: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_line(eqn: Any) -> str | None:
    """`file.py:LINE` of the user's code that made `eqn`, or None where JAX recorded no
    user frame (an equation JAX adds, as its offload copies, or one made in treeshape)."""
    from jax.extend import source_info_util  # (importing `jax.extend` takes 60 ms: only here)

    try:
        text = source_info_util.summarize(eqn.source_info)
    except Exception:  # a release whose summary cannot read this equation's frames
        return None
    found = _SUMMARY.fullmatch(text)
    if found is None or os.path.abspath(found["file"]).startswith(_PACKAGE + os.sep):
        return None
    return f"{os.path.basename(found['file'])}:{found['line']}"


def memory_kind(aval: Any) -> str:
    """The memory kind a value of abstract type `aval` lives in: `"device"`, or the host
    kind JAX gives its host memory space (`"pinned_host"`). JAX names a memory space's kind
    only in its private `core.mem_space_to_kind`; a release without memory spaces in its
    types has the device alone."""
    space = getattr(aval, "memory_space", None)
    to_kind = getattr(_core, "mem_space_to_kind", None)
    if space is None or to_kind is None:
        return "device"
    try:
        return str(to_kind(space))
    except AssertionError:  # `MemorySpace.Any`: no kind of its own
        return "device"


def checkpoint_name_of(eqn: Any) -> str | None:
    """The name `jax.ad_checkpoint.checkpoint_name` gives the value `eqn` makes, or None:
    the primitive `name`, or (where JAX has it) its checkpoint-name primitive of the kind
    that JAX calls through `call_hi_primitive`, which keeps the name in its `params`."""
    if eqn.primitive.name == "name":
        name = eqn.params.get("name")
        return name if isinstance(name, str) else None
    called = eqn.params.get("_prim")
    if called is not None and type(called).__name__ == "CheckpointName":
        name = getattr(called, "params", {}).get("name")
        return name if isinstance(name, str) else None
    return None


# Equations whose output i is their input i, unchanged for what is saved: JAX's listing
# looks through `reduce_precision` (what a remat policy's saved values pass through), and a
# policy's offload is a `device_put` of the value to the host.
PASSES_THROUGH: Final = frozenset({"reduce_precision", "device_put"})


def inner_jaxpr(eqn: Any) -> Any:
    """The jaxpr `eqn` calls whose outputs are `eqn`'s own, one for one (a `jax.jit`'s, a
    `scan`'s body: carries then stacked outputs), or None."""
    inner = eqn.params.get("jaxpr")
    inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's
    if inner is None or not hasattr(inner, "eqns") or len(inner.outvars) != len(eqn.outvars):
        return None
    return inner
