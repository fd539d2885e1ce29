"""`residuals`, `Residual` and `Residuals`: the values that differentiating a loss saves from
its forward pass for its backward pass, as `jax.ad_checkpoint.print_saved_residuals` lists
them, each with its `checkpoint_name`, the user's line that made it, its bytes and the
memory kind a remat policy keeps it in."""

import dataclasses
import html
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.extend.core import Literal as JaxprLiteral

from . import _compat
from ._cache import has_value
from ._call import (
    abstract_inputs,
    call_path,
    check_callable,
    check_inputs,
    core_name,
    is_abstract,
    note_abstract_scalars,
    split_call,
    with_trees,
)
from ._dtypes import short_dtype
from ._shapes import human_bytes, leaf_nbytes, short_shape
from ._table import grid, html_grid


ResidualKind = Literal["argument", "saved"]


@dataclasses.dataclass(frozen=True)
class Residual:
    """One value that differentiating a loss saves from its forward pass for its backward pass.

    Attributes:
        name: The `jax.ad_checkpoint.checkpoint_name` of the value, else None. A value a
            remat policy offloads is named by the name the policy offloads it by.
        source: `"file.py:LINE"` of the user's code that made it (the line that called the
            function holding it, where JAX records only that); for an argument, its path
            in the call (`args[0]['w']`); `"closed over"` for an array the function closes
            over; None where JAX records nothing (a constant).
        shape: Its shape.
        dtype: Its dtype (a NumPy dtype, or a typed PRNG key's).
        nbytes: Its bytes.
        memory_kind: `"device"`, or the host memory kind a policy offloads it to
            (`"pinned_host"`).
        kind: `"argument"` for an input kept as it is (an argument, or an array the
            function closes over), `"saved"` for a value the forward pass computed.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> r = ts.residuals(lambda x: jnp.sin(x).sum(), jnp.zeros(4, jnp.float32))
        >>> r[0].kind, r[0].shape, r[0].nbytes, r[0].memory_kind
        ('saved', (4,), 16, 'device')
    """

    __module__ = "treeshape"

    name: str | None
    source: str | None
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int
    memory_kind: str
    kind: ResidualKind


_HEADERS: Final = ("name", "source", "shape", "dtype", "kind", "memory", "bytes")


class Residuals(tuple[Residual, ...]):
    """The values [treeshape.residuals][] found: a tuple of [treeshape.Residual][]s, largest first.

    `str()` is a table of them, with the total by memory kind; a notebook shows it as HTML.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> w, x = jnp.zeros((8, 4), jnp.float32), jnp.zeros((2, 8), jnp.float32)
        >>> r = ts.residuals(lambda w, x: jnp.tanh(x @ w).sum(), w, x)
        >>> r.total_bytes, r.bytes_by_kind, r.bytes_by_name
        (256, {'device': 256}, {None: 256})
    """

    __module__ = "treeshape"
    __slots__ = ()

    def __new__(cls, values: Iterable[Residual] = ()) -> "Residuals":
        return super().__new__(cls, values)

    @property
    def total_bytes(self) -> int:
        """The bytes of all the values."""
        return sum(r.nbytes for r in self)

    @property
    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes by memory kind (`"device"`, `"pinned_host"`), most first."""
        return _by(self, lambda r: r.memory_kind)

    @property
    def bytes_by_name(self) -> dict[str | None, int]:
        """Bytes by `checkpoint_name`, the unnamed values under None, most first."""
        return _by(self, lambda r: r.name)

    def _rows(self) -> list[tuple[str, ...]]:
        return [
            (
                "-" if r.name is None else r.name,
                "-" if r.source is None else r.source,
                short_shape(r.shape),
                short_dtype(r.dtype),
                r.kind,
                r.memory_kind,
                human_bytes(r.nbytes),
            )
            for r in self
        ]

    def _total(self) -> str:
        n = len(self)
        kinds = ", ".join(f"{kind} {human_bytes(b)}" for kind, b in self.bytes_by_kind.items())
        line = f"total: {n} value{'' if n == 1 else 's'}, {human_bytes(self.total_bytes)}"
        return line + (f" ({kinds})" if len(self.bytes_by_kind) > 1 else "")

    def __str__(self) -> str:
        return grid(_HEADERS, self._rows(), right=1) + "\n" + self._total()

    def __repr__(self) -> str:
        return f"Residuals({len(self)} value{'' if len(self) == 1 else 's'}, {human_bytes(self.total_bytes)})"

    def _repr_html_(self) -> str:
        page = html_grid(_HEADERS, self._rows(), right=1, css_class="treeshape-residuals")
        return page + f"<p>{html.escape(self._total())}</p>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Residuals, (tuple(self),))


def _by(values: Iterable[Residual], key: Callable[[Residual], Any]) -> dict[Any, int]:
    totals: dict[Any, int] = {}
    for r in values:
        totals[key(r)] = totals.get(key(r), 0) + r.nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


# -- the call -----------------------------------------------------------------------------
class _NotALoss(TypeError):
    """`fn` returned something other than one real floating-point scalar (raised inside the
    trace, told apart from the user's own errors)."""


def _value_text(leaf: Any) -> str:
    dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
    if dtype is None or shape is None:
        return f"{type(leaf).__name__} {leaf!r}"[:80]
    return f"{short_dtype(dtype)}{short_shape(tuple(shape))}"


def _check_loss(out: Any, name: str) -> Any:
    """`out` if it is one real floating-point scalar, else a `_NotALoss` naming what it is."""
    leaves, treedef = jtu.tree_flatten(out)
    if len(leaves) == 1 and jtu.treedef_is_leaf(treedef):
        leaf = leaves[0]
        dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
        if dtype is not None and tuple(shape or ()) == () and jnp.issubdtype(dtype, jnp.floating):
            return leaf
        got = _value_text(leaf)
        if dtype is not None and tuple(shape or ()) != ():
            fix = f"reduce it to the loss (`{name}(...).mean()` or `.sum()`)"
        elif dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
            fix = "return a real loss (`jnp.abs(...)` or `.real` of it), as `jax.grad` needs"
        else:
            fix = "return a floating-point loss (`.astype(jnp.float32)`), as `jax.grad` needs"
    else:
        got = "a pytree of " + ", ".join(_value_text(x) for x in leaves[:4]) + (", ..." if len(leaves) > 4 else "")
        if not leaves:
            got = f"{out!r}"[:80]
        fix = f"for a (loss, aux) pair, pass `lambda *args: {name}(*args)[0]`"
    raise _NotALoss(
        f"treeshape.residuals: `{name}` must return a scalar loss (one real floating-point value) to be "
        f"differentiated, but it returned {got}: {fix}."
    )


def _argument_names(leaves: list[Any], treedef: jtu.PyTreeDef) -> list[str]:
    return [call_path(keys) for keys, _ in jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, leaves))[0]]


def _check_differentiable(leaves: list[Any], traced: list[bool], paths: list[str], name: str) -> None:
    """Refuse a call with no floating-point input: nothing to differentiate, nothing saved."""
    inputs = [(p, x) for p, x, t in zip(paths, leaves, traced, strict=True) if t]
    if any(jnp.issubdtype(_compat.abstractify(x).dtype, jnp.inexact) for _, x in inputs):
        return
    given = ", ".join(f"{p}: {_value_text(_compat.abstractify(x))}" for p, x in inputs[:4]) or "none"
    raise TypeError(
        f"treeshape.residuals: no argument of `{name}` can be differentiated (the arrays it is given: {given}); "
        "differentiation saves values for floating-point inputs only. Pass the parameters as arguments "
        f"(`ts.residuals({name}, params, batch)`), not closed over or bound in a partial."
    )


def residuals(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Residuals:
    """Find the values that differentiating `fn` saves from its forward pass for its backward pass.

    One trace of `jax.vjp(fn, *args, **kwargs)` (no FLOPs, no device memory, no
    compilation): the same values as `jax.ad_checkpoint.print_saved_residuals` lists,
    with the `checkpoint_name`s, lines, bytes and memory kinds of a remat policy's
    choices (`jax.checkpoint(..., policy=...)`, values it offloads to the host included).
    Safe under `jax.jit` and `vmap` (tracers as arguments; under `vmap`, one example's).
    See [What a policy saves](../guide/residuals.md).

    Args:
        fn: The loss: a callable returning one real floating-point scalar.
        *args: Pytrees of arrays, tracers, `jax.ShapeDtypeStruct`s (nothing runs) or
            Python scalars, all differentiated, as JAX's listing does; or static values.
            Arrays bound in a partial, or closed over, are constants, as in `jax.vjp`.
        **kwargs: As `args`.

    Returns:
        [treeshape.Residuals][], largest first.

    Raises:
        TypeError: `fn` does not return a real floating-point scalar, or no argument is a
            floating-point array.

    Errors raised by `fn` itself propagate unchanged, with a note.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> def loss(w, x):
        ...     return jnp.tanh(x @ w).sum()
        >>> r = ts.residuals(loss, jax.ShapeDtypeStruct((8, 4), jnp.float32), jnp.zeros((2, 8), jnp.float32))
        >>> [(v.kind, v.shape) for v in r]
        [('argument', (8, 4)), ('argument', (2, 8)), ('saved', (2, 4)), ('saved', (2, 4))]
    """
    check_callable(fn, "residuals")
    call = with_trees(split_call(fn, args, kwargs, "residuals"))
    treedef, n_bound = call.treedef, len(call.bound_leaves)
    leaves = abstract_inputs(call.bound_leaves + call.call_leaves, treedef, "residuals")
    concrete = call.concrete()
    # Arrays bound in a partial are the function's constants, as `jax.vjp` of the partial
    # takes them; abstract ones (a `ShapeDtypeStruct`) can only be traced.
    traced = [
        is_abstract(x, c) and not (i < n_bound and has_value(x))
        for i, (x, c) in enumerate(zip(leaves, concrete, strict=True))
    ]
    check_inputs(leaves, traced, treedef, "residuals")
    paths = _argument_names(leaves, treedef)
    name = core_name(call.core, leaves[:n_bound])
    _check_differentiable(leaves, traced, paths, name)
    core = call.core

    def flat(*inputs: Any) -> Any:
        it = iter(inputs)
        full = [next(it) if t else x for x, t in zip(leaves, traced, strict=True)]
        (bound, bound_kw), (given, given_kw) = jtu.tree_unflatten(treedef, full)
        return _check_loss(core(*bound, *given, **{**bound_kw, **given_kw}), name)

    flat.__name__ = flat.__qualname__ = name
    try:
        forward = _compat.vjp_forward(flat, [x for x, t in zip(leaves, traced, strict=True) if t])
    except _NotALoss as e:
        raise TypeError(str(e)) from None
    except Exception as e:
        if isinstance(e, TypeError):
            note_abstract_scalars(e, core, leaves, traced, treedef, who="residuals")
        e.add_note(f"treeshape.residuals: raised while tracing `jax.vjp` of `{name}` on abstract inputs")
        raise
    arguments = [p for p, t in zip(paths, traced, strict=True) if t]
    found = _read(forward.jaxpr, forward.residuals, arguments)
    return Residuals(sorted(found, key=lambda r: -r.nbytes))


# -- reading the forward jaxpr ---------------------------------------------------------------
def _residual(aval: Any, name: str | None, source: str | None, kind: ResidualKind) -> Residual:
    shape = tuple(aval.shape)
    nbytes = leaf_nbytes(jax.ShapeDtypeStruct(shape, aval.dtype))
    return Residual(name, source, shape, aval.dtype, nbytes, _compat.memory_kind(aval), kind)


def _read(jaxpr: Any, outvars: list[Any], arguments: list[str]) -> list[Residual]:
    """One `Residual` per value in JAX's listing order: literals, constants, arguments, then
    the equations' outputs in program order."""
    literals = [v for v in outvars if isinstance(v, JaxprLiteral)]
    wanted = _looked_through(jaxpr, outvars)
    found = [_residual(v.aval, None, None, "saved") for v in literals]
    found += [_residual(v.aval, None, "closed over", "argument") for v in jaxpr.constvars if v in wanted]
    found += [
        _residual(v.aval, None, p, "argument") for v, p in zip(jaxpr.invars, arguments, strict=True) if v in wanted
    ]
    producers = _producers(jaxpr)
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            if v in wanted:
                name, source = _origin(v, producers)
                found.append(_residual(v.aval, name, source, "saved"))
    return found


def _producers(jaxpr: Any) -> dict[Any, tuple[Any, int]]:
    """Each variable `jaxpr`'s equations make: the equation and which of its outputs it is."""
    return {v: (eqn, i) for eqn in jaxpr.eqns for i, v in enumerate(eqn.outvars)}


def _looked_through(jaxpr: Any, outvars: list[Any]) -> set[Any]:
    """The variables the saved values are counted as, as JAX's listing counts them: through
    a `reduce_precision` that a remat policy's saved values pass (no other equation)."""
    through = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns if e.primitive.name == "reduce_precision"}
    return {through.get(v, v) for v in outvars if not isinstance(v, JaxprLiteral)}


_MAX_DEPTH: Final = 64


def _origin(v: Any, producers: dict[Any, tuple[Any, int]]) -> tuple[str | None, str | None]:
    """The `checkpoint_name` and user line of a saved value: followed back through the
    equations that hand it on unchanged (an offload's copy, `reduce_precision`) and into the
    jaxpr an equation calls (a `jax.jit`, a `scan` body), to the equation that made it; the
    line is the innermost one JAX recorded on the way."""
    name, source = None, None
    for _ in range(_MAX_DEPTH):
        found = None if isinstance(v, JaxprLiteral) else producers.get(v)
        if found is None:
            break
        eqn, i = found
        source = _compat.source_line(eqn) or source
        name = _compat.checkpoint_name_of(eqn)
        if name is not None:
            break
        if eqn.primitive.name in _compat.PASSES_THROUGH and i < len(eqn.invars):
            v = eqn.invars[i]
            continue
        inner = _compat.inner_jaxpr(eqn)
        if inner is None:
            break
        v, producers = inner.outvars[i], _producers(inner)
    return name, source


__test__ = {"Residual": Residual, "Residuals": Residuals}
