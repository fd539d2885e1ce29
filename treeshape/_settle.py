"""Train steps that compile once: `settle`."""

from collections.abc import Callable
from typing import Any, Final

import jax
import jax.tree_util as jtu

from ._fixpoint import Roles, convert_init, fixed_point, structure_as_values_message, sub_structure
from ._infer import out_structure
from ._leaf import OTHER, kind_of
from ._structure import PyTree, Structure
from ._weak import Policy


_FN_NAME: Final = "settle"
# A train step's state: paths under `state`, the function is `step`, and, unlike a loop
# carry, the weak flag follows the output (`jax.jit` keys on it) and every leaf becomes a
# `jax.Array` (`jax.jit` keys Python and NumPy values apart from arrays).
_STATE: Final = Roles(root="state", fn="step", init="state", weak_from_output=True, as_arrays=True)


def _new_state(out: Structure, treedef: jtu.PyTreeDef) -> Structure:
    """The new state in `step`'s output: the whole output if it has the state's tree
    structure, else the first element of a tuple or list."""
    if out.treedef == treedef:
        return out
    node = None if jtu.treedef_is_leaf(out.treedef) else out.treedef.node_data()
    if node is not None and node[0] in (tuple, list) and out.treedef.children():
        return sub_structure(out, 0)
    raise TypeError(
        f"treeshape.settle: `step` must return the new state (a pytree with the same structure as `state`), "
        f"or a tuple or list whose first element is the new state, such as `(state, loss)`; but it returned "
        f"{out!r}. Return the new state first."
    )


def _check_leaves(state: PyTree) -> None:
    """Reject static leaves (a str, a callable) as `jax.jit` would, with the path."""
    for x in jtu.tree_leaves(state):
        if kind_of(type(x)) != OTHER:
            continue
        try:
            jax.typeof(x)
        except TypeError:
            flat, _ = jtu.tree_flatten_with_path(state)
            path = next(jtu.keystr(p) for p, leaf in flat if leaf is x)
            if isinstance(x, Structure):
                raise TypeError(structure_as_values_message("settle", "state" + path, "values")) from None
            raise TypeError(
                f"treeshape.settle: state{path} is a {type(x).__name__}, but a jitted step's state must "
                "hold arrays or Python scalars only (jax.jit rejects other values). Keep static values "
                "out of the state: close over them in `step`, or pass them as static arguments."
            ) from None


def settle(step: Callable[..., Any], state: PyTree, /, *args: Any, policy: Policy = "weak", **kwargs: Any) -> PyTree:
    """Convert `state` to the type `step` maps to itself, so a jitted `step` compiles once.

    A train step often returns its state with other types than it received (moments
    that start `bfloat16` come back `float32`), and `jax.jit(step)` then compiles again
    on the second call. `settle` finds the state type that `step` maps to itself, as the
    loop carries do (each leaf joined under `policy` until nothing changes), and returns
    `state`'s values converted to it, every leaf a `jax.Array`: see [the
    guide](../guide/settle.md#policies-and-errors) for how it differs from a loop carry.

    Args:
        step: The train step, `step(state, *args, **kwargs)`. It returns the new state,
            or a tuple or list that starts with it (e.g. `(state, loss)`).
        state: The initial state: a pytree of arrays, tracers or Python scalars (no
            static values, as for `jax.jit`).
        *args: The other arguments of `step` (e.g. a batch): anything `out_structure`
            accepts.
        policy: `"weak"` (default), `"promote"` or `"cast"`, as in
            [treeshape.carry_structure][] (`"promote"` for mixed precision).
        **kwargs: Keyword arguments of `step`, any name but `policy` (`step=` and
            `state=` too: `settle`'s own first two are positional-only).

    Returns:
        A pytree like `state`, of `jax.Array`s (or tracers) whose types `step` returns
        unchanged.

    Raises:
        CarryMismatchError: no fixed point exists under `policy`; lists every
            offending leaf by path under `state` (`state['opt'].mu['w']`),
            its input and output types, and the fix.
        TypeError: `step` is not callable, returns neither a state nor a
            tuple or list starting with one, or `state` holds a static value.
        ValueError: `policy` is unknown.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> def train_step(state, x):
        ...     mu = 0.9 * state["mu"] + x  # bf16 meets f32: f32
        ...     return {"mu": mu, "step": state["step"] + jnp.int32(1)}, mu.sum()
        >>> state = {"mu": jnp.zeros(2, jnp.bfloat16), "step": 0}
        >>> x = jnp.ones(2, jnp.float32)
        >>> state = ts.settle(train_step, state, x, policy="promote")
        >>> state
        {'mu': Array([0., 0.], dtype=float32), 'step': Array(0, dtype=int32)}
        >>> jitted = jax.jit(train_step)
        >>> for _ in range(3):
        ...     state, loss = jitted(state, x)  # one compilation for all three calls
        >>> state["step"], loss
        (Array(3, dtype=int32), Array(5.42, dtype=float32))
    """
    if not callable(step):
        raise TypeError(f"treeshape.settle: `step` must be callable, got {type(step).__name__}.")
    _check_leaves(state)
    treedef = jtu.tree_structure(state)

    def evaluate(current: PyTree) -> Structure:
        return _new_state(out_structure(step, current, *args, **kwargs), treedef)

    settled = fixed_point(_FN_NAME, evaluate, state, policy, _STATE)
    return convert_init(state, settled, _FN_NAME, _STATE)
