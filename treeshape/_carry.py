"""Loop carries that type-check: `carry_structure`, `scan_carry`, `while_carry`, `fori_carry`.

The loop's own checks (`xs`, `length`, a scan body's pair, `fori_loop`'s bounds) are here;
the carry type is `_fixpoint`'s fixed point of the body."""

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from . import _compat
from ._errors import user_value
from ._fixpoint import abstract_tree, convert_init, fixed_point, sub_structure
from ._infer import out_structure
from ._leaf import leaf_str
from ._structure import PyTree, Structure
from ._tree import clip
from ._weak import Policy


def _one_step(leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The value of one scan step of `leaf`: its leading axis removed."""
    sharding = leaf.sharding
    if sharding is not None and hasattr(sharding, "spec"):
        given = _compat.spec_entries(sharding.spec)
        spec = given + (None,) * (len(leaf.shape) - len(given))
        sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))
    else:
        sharding = None
    step: jax.ShapeDtypeStruct = leaf.update(shape=leaf.shape[1:], sharding=sharding)
    return step


def _check_length(length: Any, fn_name: str) -> int | None:
    """`length` as an int, checked as `lax.scan` would: a concrete integer >= 0 (or None).

    Integers only (`operator.index`: Python and NumPy ints, `bool`, concrete
    integer scalar arrays); `lax.scan` itself calls `int()`, so it would also
    take a float and silently truncate it.
    """
    if length is None:
        return None
    if isinstance(length, jax.core.Tracer):
        traced = leaf_str(_compat.from_aval(jax.typeof(length)))
        raise TypeError(_length_type_message(fn_name, length, traced))
    try:
        n = operator.index(length)
    except TypeError:
        raise TypeError(_length_type_message(fn_name, length, None)) from None
    if n < 0:
        raise ValueError(
            f"treeshape.{fn_name}: `length` must be an int >= 0 (the number of steps, as for `lax.scan`), "
            f"got {n}. Pass 0 or more."
        )
    return n


def _length_type_message(fn_name: str, length: object, traced: str | None) -> str:
    """`length` is not an int (`traced`: its type when it is a tracer)."""
    if traced is not None:
        return (
            f"treeshape.{fn_name}: `length` must be a concrete int >= 0, as for `lax.scan`, but it is a traced "
            f"{traced} here. Pass a Python int (for an argument of a jitted function, mark it static with "
            "`static_argnames`), or use `lax.while_loop` and `ts.while_carry` for a number of steps known "
            "only at run time."
        )
    return (
        f"treeshape.{fn_name}: `length` must be an int >= 0 (the number of steps, as for `lax.scan`), "
        f"got {type(length).__name__} {clip(repr(length), 40)}. Pass the number of steps as an int, e.g. `length=3`."
    )


def _x_slices(xs: PyTree, length: Any, fn_name: str) -> PyTree:
    """The abstract value `body` sees for one step of `xs`, checking lengths as `lax.scan` does."""
    length = _check_length(length, fn_name)
    treedef, paths, leaves = abstract_tree(xs, "xs", fn_name)
    if not leaves:
        if length is None:
            raise ValueError(
                f"treeshape.{fn_name}: `xs` has no arrays to scan over, so `length` must be given "
                "(as for `lax.scan`): pass `length=N`."
            )
        return xs
    for i, leaf in enumerate(leaves):
        if not leaf.shape:
            raise ValueError(
                f"treeshape.{fn_name}: {paths.where(i)} is a scalar ({leaf_str(leaf)}), but every leaf of `xs` "
                "needs a leading axis to scan over."
            )
    sizes = {leaf.shape[0] for leaf in leaves}
    if len(sizes) > 1:
        listing = ", ".join(f"{paths.where(i)} has {leaf.shape[0]}" for i, leaf in enumerate(leaves))
        raise ValueError(
            f"treeshape.{fn_name}: the leaves of `xs` must share one leading axis size; {listing}. "
            "Make them all the same length."
        )
    (size,) = sizes
    if length is not None and length != size:
        raise ValueError(
            f"treeshape.{fn_name}: `length={length}` disagrees with the leading axis of `xs` ({size}, "
            f"e.g. {paths.where(0)}: {leaf_str(leaves[0])}). Drop `length` or make them agree."
        )
    return jtu.tree_unflatten(treedef, [_one_step(leaf) for leaf in leaves])


def _scan_step(body: Callable[..., Any], x: PyTree, fn_name: str) -> Callable[[PyTree], Structure]:
    def step(carry: PyTree) -> Structure:
        out = out_structure(body, carry, x)
        node = None if jtu.treedef_is_leaf(out.treedef) else out.treedef.node_data()
        if node is None or node[0] not in (tuple, list) or len(out.treedef.children()) != 2:
            raise TypeError(
                f"treeshape.{fn_name}: a scan body must return a pair `(carry, y)`, as for `lax.scan`, "
                f"but `body` returned {out!r}. Return `new_carry, y` (use `None` for no `y`)."
            )
        return sub_structure(out, 0)

    return step


def carry_structure(
    body: Callable[..., Any],
    init: PyTree,
    xs: PyTree = None,
    *,
    length: int | None = None,
    policy: Policy = "weak",
) -> Structure:
    """Find the carry type for which `lax.scan(body, carry, xs, length=length)` type-checks.

    A fixed point: `body` is evaluated abstractly (through
    [treeshape.out_structure][]: cached, safe under any transformation) from
    `init`'s types, and each input leaf joined with its output leaf under
    `policy` until nothing changes (one trace when `init` already is a fixed
    point, one more per promotion step). Under `jax.shard_map`, a leaf whose
    output varies over manual mesh axes is made varying over them too.

    Args:
        body: A `lax.scan` body, `body(carry, x) -> (carry, y)`.
        init: The initial carry: a pytree of arrays, tracers or Python scalars.
        xs: The values to scan over (leading axis), or `None`.
        length: The number of steps; required when `xs` is `None`.
        policy: Which leaves may change dtype to reach the body's type:

            - `"weak"` (default): only weakly typed leaves (Python scalars,
              weak arrays), to the dtype JAX's weak-type promotion gives;
            - `"promote"`: also strong leaves, where
              `jnp.promote_types(src, dst) == dst`;
            - `"cast"`: any leaf, to any dtype.

    Returns:
        The carry's [treeshape.Structure][], with `init`'s treedef.

    Raises:
        CarryMismatchError: no fixed point exists under `policy`; lists every
            offending leaf with its input and output types and the fix.
        TypeError: `body` does not return a pair `(carry, y)`.
        ValueError: `xs` is `None` without `length`, `length` disagrees with
            `xs`, or `policy` is unknown.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> def body(total, x):
        ...     return total + x, None
        >>> xs = jnp.ones(4, jnp.int8)
        >>> ts.carry_structure(body, 0, xs)  # a Python int meets int8
        Structure(i8[], 1 leaf, 1 B)
    """
    return fixed_point(
        "carry_structure",
        _scan_step(body, _x_slices(xs, length, "carry_structure"), "carry_structure"),
        init,
        policy,
    )


def scan_carry(
    body: Callable[..., Any],
    init: PyTree,
    xs: PyTree = None,
    *,
    length: int | None = None,
    policy: Policy = "weak",
) -> PyTree:
    """Convert `init` to the carry type `lax.scan(body, ...)` needs.

    The values of `init` converted to [treeshape.carry_structure][]'s types:
    the dtype casts `policy` allows, and `lax.pcast(..., to="varying")` where
    the body's carry varies over manual mesh axes. Leaves that need no change
    are returned as they are.

    Args:
        body: A `lax.scan` body, `body(carry, x) -> (carry, y)`.
        init: The initial carry values.
        xs: The values to scan over, or `None`.
        length: The number of steps; required when `xs` is `None`.
        policy: `"weak"` (default), `"promote"` or `"cast"`, as in
            [treeshape.carry_structure][].

    Returns:
        A pytree like `init`, ready to be the initial carry of `lax.scan`.

    Raises:
        CarryMismatchError: no fixed point exists under `policy`.
        TypeError: `body` does not return a pair `(carry, y)`.
        ValueError: `xs`/`length` are inconsistent, or `policy` is unknown.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> def body(acc, x):
        ...     return acc + x, acc
        >>> xs = jnp.ones(3, jnp.float32)
        >>> init = ts.scan_carry(body, jnp.zeros((), jnp.bfloat16), xs, policy="promote")
        >>> init.dtype
        dtype('float32')
        >>> jax.lax.scan(body, init, xs)[0]
        Array(3., dtype=float32)
    """
    fn_name = "scan_carry"
    step = _scan_step(body, _x_slices(xs, length, fn_name), fn_name)
    return convert_init(init, fixed_point(fn_name, step, init, policy), fn_name)


def while_carry(body: Callable[[PyTree], PyTree], init: PyTree, *, policy: Policy = "weak") -> PyTree:
    """Convert `init` to the carry type a `lax.while_loop` body `body(carry) -> carry` needs.

    As [treeshape.scan_carry][], for `lax.while_loop(cond, body, init)`.

    Args:
        body: The loop body, `body(carry) -> carry`.
        init: The initial carry values.
        policy: `"weak"` (default), `"promote"` or `"cast"`, as in
            [treeshape.carry_structure][].

    Returns:
        A pytree like `init`, ready for `lax.while_loop`.

    Raises:
        CarryMismatchError: no fixed point exists under `policy`.
        ValueError: `policy` is unknown.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> body = lambda c: (c[0] + 1, c[1] * 0.5)
        >>> init = ts.while_carry(body, (0, jnp.int32(8)), policy="promote")
        >>> jax.lax.while_loop(lambda c: c[0] < 3, body, init)
        (Array(3, dtype=int32, weak_type=True), Array(1., dtype=float32))
    """
    fn_name = "while_carry"

    def step(carry: PyTree) -> Structure:
        return out_structure(body, carry)

    return convert_init(init, fixed_point(fn_name, step, init, policy), fn_name)


def fori_carry(
    body: Callable[[Any, PyTree], PyTree],
    init: PyTree,
    *,
    lower: Any = 0,
    upper: Any = 1,
    policy: Policy = "weak",
) -> PyTree:
    """Convert `init` to the carry type a `lax.fori_loop` body `body(i, carry) -> carry` needs.

    As [treeshape.scan_carry][], for `lax.fori_loop(lower, upper, body, init)`.
    The index `i` has the type `lax.fori_loop` gives it for these bounds: a
    weak `int32` when both are concrete, the bounds' dtype when they are
    traced (e.g. arguments of a jitted function).

    Args:
        body: The loop body, `body(i, carry) -> carry`.
        init: The initial carry values.
        lower: The lower bound you will pass to `lax.fori_loop` (a value or a
            tracer); only its type matters.
        upper: The upper bound, likewise.
        policy: `"weak"` (default), `"promote"` or `"cast"`, as in
            [treeshape.carry_structure][].

    Returns:
        A pytree like `init`, ready for `lax.fori_loop`.

    Raises:
        CarryMismatchError: no fixed point exists under `policy`.
        TypeError: the bounds are not integer scalars, or have different
            integer types `lax.fori_loop` would reject.
        ValueError: `policy` is unknown.

    Warns:
        PrecisionWarning: a Python float accumulator in `init` settles on a
            float narrower than 32 bits (see [treeshape.PrecisionWarning][]).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> body = lambda i, c: c + 0.5  # an int32 counter turned into float
        >>> init = ts.fori_carry(body, jnp.int32(0), policy="promote")
        >>> jax.lax.fori_loop(0, 4, body, init)
        Array(2., dtype=float32)
    """
    fn_name = "fori_carry"
    index = _fori_index(lower, upper, fn_name)

    def step(carry: PyTree) -> Structure:
        return out_structure(body, index, carry)

    return convert_init(init, fixed_point(fn_name, step, init, policy), fn_name)


def _fori_index(lower: Any, upper: Any, fn_name: str) -> jax.ShapeDtypeStruct:
    """The abstract index `lax.fori_loop(lower, upper, ...)` passes to its body."""
    bounds = []
    for name, bound in (("lower", lower), ("upper", upper)):
        try:
            aval = jax.typeof(bound)
        except TypeError:
            aval = None
        if aval is None or aval.shape != () or not jnp.issubdtype(aval.dtype, jnp.integer):
            what = user_value(bound, f"a {type(bound).__name__}" if aval is None else leaf_str(_compat.from_aval(aval)))
            raise TypeError(
                f"treeshape.{fn_name}: `{name}` must be an integer scalar (a Python int, or an int array or tracer "
                f"of shape ()), as for `lax.fori_loop`, got {what}. Pass the bound you will pass to `lax.fori_loop`."
            )
        bounds.append(aval)
    lo, hi = bounds
    if not isinstance(lower, jax.core.Tracer) and not isinstance(upper, jax.core.Tracer):
        # Concrete bounds: `lax.fori_loop` runs a scan over a Python int counter.
        return jax.ShapeDtypeStruct((), jnp.result_type(int), weak_type=True)
    # Traced bounds: a while loop whose counter starts as `lower`, converted to the
    # bounds' common dtype (a weak bound takes the other's).
    if lo.dtype == hi.dtype:
        return jax.ShapeDtypeStruct((), lo.dtype, weak_type=lo.weak_type)
    signed = jnp.issubdtype(lo.dtype, jnp.signedinteger) and jnp.issubdtype(hi.dtype, jnp.signedinteger)
    if signed and lo.weak_type and not hi.weak_type:
        return jax.ShapeDtypeStruct((), hi.dtype)
    if signed and hi.weak_type and not lo.weak_type:
        return jax.ShapeDtypeStruct((), lo.dtype)
    raise TypeError(
        f"treeshape.{fn_name}: `lower` ({leaf_str(lo)}) and `upper` ({leaf_str(hi)}) have different integer types, "
        "which `lax.fori_loop` rejects too. Give both bounds one dtype (e.g. `upper.astype(lower.dtype)`)."
    )
