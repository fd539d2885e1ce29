"""Loop carries that type-check: `carry_structure`, `scan_carry`, `while_carry`, `fori_carry`."""

import functools as ft
import operator
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from . import _compat
from ._diff import diff_structures
from ._dtypes import key_impl_name, short_dtype
from ._errors import (
    CarryMismatchError,
    Line,
    Mismatch,
    PrecisionWarning,
    carry_shape_fix,
    carry_sharding_fix,
    carry_structure_fix,
    carry_vma_fix,
    fori_bound_message,
    fori_bounds_message,
    format_report,
    key_change_fix,
    length_negative_message,
    length_type_message,
    narrowing_message,
    policy_fix,
    structure_as_values_message,
)
from ._infer import out_structure
from ._leaf import SCALAR_TYPES, flatten, from_aval, leaf_str, refuse_leaked_tracers, spec_text, varying_axes
from ._sharding import carry_spec, reshard, spec_value
from ._structure import PyTree, Structure
from ._weak import (
    allowing_policy,
    check_policy,
    convert,
    dtype_change_allowed,
    key_change,
)


_MAX_STEPS: Final = 32
_ROOT: Final = "carry"


class Roles(NamedTuple):
    """Who is who in a fixed point: the loop carries' names and rules, or another client's
    (`ts.settle`: a train step's `state`, where the weak flag follows the output)."""

    root: str = _ROOT  # the root name of paths in messages, and the value's name
    fn: str = "body"  # the function's name in messages
    init: str = "init"  # the initial value's name in messages
    weak_from_output: bool = False  # a leaf whose only difference is its weak flag takes the output's
    as_arrays: bool = False  # `convert_init` makes every leaf a jax.Array (no Python or NumPy scalars)


CARRY: Final = Roles()


class _Paths:
    """The `keystr` path of each leaf of `tree`, computed only when an error needs one;
    `where(i)` is the path under the root name, as messages print it."""

    def __init__(self, tree: PyTree, root: str) -> None:
        self._tree, self.root = tree, root
        self._paths: list[str] | None = None

    def _all(self) -> list[str]:
        if self._paths is None:
            flat, _ = jtu.tree_flatten_with_path(self._tree)
            self._paths = [jtu.keystr(path) for path, _ in flat]
        return self._paths

    def __getitem__(self, i: int) -> str:
        return self._all()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def where(self, i: int) -> str:
        return self.root + self._all()[i]


def _abstract_leaf(x: Any, where: Callable[[], str], fn_name: str) -> jax.ShapeDtypeStruct:
    """A leaf's abstract value (shape, dtype, weak flag, sharding, manual axes), without tracing."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if isinstance(x, Structure):
        needs = "abstract" if fn_name == "carry_structure" else "values"
        raise TypeError(structure_as_values_message(fn_name, where(), needs))
    try:
        aval = jax.typeof(x)
    except TypeError:
        raise TypeError(
            f"treeshape.{fn_name}: {where()} is a {type(x).__name__}, but loop carries and scanned "
            "values must be arrays or Python scalars. Keep static values out of the carry "
            "(close over them in `body` instead)."
        ) from None
    return from_aval(aval)


def _abstract_tree(tree: PyTree, root: str, fn_name: str) -> tuple[jtu.PyTreeDef, _Paths, list[Any]]:
    leaves, treedef = flatten(tree, fn_name, root)
    refuse_leaked_tracers(leaves, fn_name)
    paths = _Paths(tree, root)
    return treedef, paths, [_abstract_leaf(x, ft.partial(paths.where, i), fn_name) for i, x in enumerate(leaves)]


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
        traced = leaf_str(_abstract_leaf(length, lambda: "`length`", fn_name))
        raise TypeError(length_type_message(fn_name, length, traced))
    try:
        n = operator.index(length)
    except TypeError:
        raise TypeError(length_type_message(fn_name, length, None)) from None
    if n < 0:
        raise ValueError(length_negative_message(fn_name, n))
    return n


def _x_slices(xs: PyTree, length: Any, fn_name: str) -> PyTree:
    """The abstract value `body` sees for one step of `xs`, checking lengths as `lax.scan` does."""
    length = _check_length(length, fn_name)
    treedef, paths, leaves = _abstract_tree(xs, "xs", fn_name)
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


def sub_structure(s: Structure, index: int) -> Structure:
    children = s.treedef.children()
    start = sum(child.num_leaves for child in children[:index])
    child = children[index]
    return Structure(child, s.leaves[start : start + child.num_leaves])


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


def fixed_point(
    fn_name: str,
    step: Callable[[PyTree], Structure],
    init: PyTree,
    policy: str,
    roles: Roles = CARRY,
) -> Structure:
    """Evaluate `step` from `init`'s types, joining input and output types until stable."""
    check_policy(policy, fn_name)
    root, fn = roles.root, roles.fn
    treedef, paths, carry = _abstract_tree(init, root, fn_name)
    header = f'treeshape.{fn_name}: no {root} type is a fixed point of `{fn}` under policy="{policy}"'
    specs_seen: dict[int, list[Any]] = {}  # leaf index -> the explicit-axes specs it has had
    start = carry
    for _ in range(_MAX_STEPS):
        out = step(jtu.tree_unflatten(treedef, carry))
        current = Structure(treedef, tuple(carry))
        if out.treedef != treedef:
            mismatches, lines = _structure_mismatches(current, out, paths, policy, roles)
            raise CarryMismatchError(format_report(header, lines, "places differ"), mismatches)
        joined, mismatches, lines = _join(paths, carry, list(out.leaves), policy, roles)
        if mismatches:
            raise CarryMismatchError(format_report(header, lines, "leaves differ"), mismatches)
        if joined == carry:
            _warn_narrowed_accumulators(fn_name, paths, start, carry, roles)
            return current
        mismatches, lines = _sharding_cycles(paths, carry, joined, specs_seen, roles)
        if mismatches:
            raise CarryMismatchError(format_report(header, lines, "leaves differ"), mismatches)
        carry = joined
    raise CarryMismatchError(
        f"treeshape.{fn_name}: the {root} type did not settle within {_MAX_STEPS} evaluations of `{fn}` "
        f'under policy="{policy}" (`{fn}` keeps changing a dtype, e.g. casting back and forth). '
        f"Last {root}: {Structure(treedef, tuple(carry))!r}. Make `{fn}` return a fixed dtype for every leaf."
    )


def _warn_narrowed_accumulators(fn_name: str, paths: _Paths, start: list[Any], carry: list[Any], roles: Roles) -> None:
    """Warn where a weak float leaf (a Python `0.0` accumulator) ends as a float
    narrower than 32 bits: JAX's weak-type rule gives it the body's dtype, and
    sums in bfloat16 or float16 lose precision fast."""
    narrowed = [
        (paths.where(i), leaf_str(s), leaf_str(c))
        for i, (s, c) in enumerate(zip(start, carry, strict=True))
        if s.weak_type
        and s.dtype != c.dtype
        and jnp.issubdtype(s.dtype, jnp.floating)
        and jnp.issubdtype(c.dtype, jnp.floating)
        and jnp.dtype(c.dtype).itemsize < 4
    ]
    if narrowed:
        warnings.warn(PrecisionWarning(narrowing_message(fn_name, narrowed, roles.init)), stacklevel=4)


def _structure_mismatches(
    current: Structure, out: Structure, paths: _Paths, policy: str, roles: Roles = CARRY
) -> tuple[list[Mismatch], list[Line]]:
    """Everything that differs when `body` changes the carry's tree structure: the
    structural differences, and the leaves that also differ where both trees agree."""
    root = roles.root
    carry_at = dict(zip(paths, current.leaves, strict=True))
    out_at = dict(zip(out.paths, out.leaves, strict=True))
    mismatches: list[Mismatch] = []
    lines: list[Line] = []
    joined_paths = set()
    for m in diff_structures(current, out, root):
        if m.kind == "structure":
            mismatches.append(m)
            lines.append((m.where, m.what, carry_structure_fix(roles.fn, roles.init, root)))
        elif m.path not in joined_paths:
            joined_paths.add(m.path)
            _, leaf_mismatches, leaf_lines = _join([m.path], [carry_at[m.path]], [out_at[m.path]], policy, roles)
            mismatches += leaf_mismatches
            lines += leaf_lines
    return mismatches, lines


def _join(
    paths: Sequence[str] | _Paths, carry: list[Any], out: list[Any], policy: str, roles: Roles = CARRY
) -> tuple[list[Any], list[Mismatch], list[Line]]:
    """Each carry leaf joined with the body's output leaf, or why it cannot be."""
    joined: list[Any] = []
    mismatches: list[Mismatch] = []
    lines: list[Line] = []
    for i, (c, o) in enumerate(zip(carry, out, strict=True)):
        if c == o:  # the common case: nothing to join
            joined.append(c)
            continue
        failures: list[tuple[str, Any, Any, str]] = []  # kind, expected, actual, fix
        new = c
        if not isinstance(o, jax.ShapeDtypeStruct):
            fix = carry_structure_fix(roles.fn, roles.init, roles.root)
            failures.append(("structure", leaf_str(c), f"the static value {leaf_str(o)}", fix))
        else:
            if c.shape != o.shape:
                failures.append(("shape", c.shape, o.shape, carry_shape_fix(c.shape, o.shape, roles.fn, roles.init)))
            if c.dtype != o.dtype:
                if dtype_change_allowed(c.dtype, c.weak_type, o.dtype, policy):
                    new = new.update(dtype=o.dtype, weak_type=o.weak_type if roles.weak_from_output else False)
                else:
                    src, dst = short_dtype(c.dtype), short_dtype(o.dtype)
                    if key_change(c.dtype, o.dtype):
                        impls = key_impl_name(c.dtype), key_impl_name(o.dtype)
                        fix = key_change_fix(src, dst, *impls, True, roles.fn, roles.init)
                    else:
                        allowing = allowing_policy(c.dtype, c.weak_type, o.dtype)
                        fix = policy_fix(src, c.weak_type, dst, policy, allowing)
                    failures.append(("dtype", c.dtype, o.dtype, fix))
            elif roles.weak_from_output and c.weak_type != o.weak_type:
                new = new.update(weak_type=o.weak_type)
            c_axes, o_axes = varying_axes(c), varying_axes(o)
            if c_axes - o_axes:
                failures.append(("vma", c_axes, o_axes, carry_vma_fix(c_axes, o_axes, roles.fn)))
            elif o_axes - c_axes and c.shape == o.shape:
                # (With another shape the leaf is a mismatch anyway, and the
                # output's sharding, of another rank, does not fit it.)
                new = _compat.with_manual_axes(new, _compat.manual_axes(o), sharding=o.sharding)
            if c.shape == o.shape and carry_spec(new) != carry_spec(o):
                # Explicit mesh axes are part of the type (`f32[8@d,3]`): take the output's.
                new = new.update(sharding=o.sharding)
        for kind, expected, actual, fix in failures:
            m = Mismatch(paths[i], kind, expected, actual, root=roles.root)
            mismatches.append(m)
            lines.append((m.where, f"input {leaf_str(c)}, output {leaf_str(o)}.", fix))
        joined.append(new)
    return joined, mismatches, lines


def _sharding_cycles(
    paths: Sequence[str] | _Paths, carry: list[Any], joined: list[Any], seen: dict[int, list[Any]], roles: Roles
) -> tuple[list[Mismatch], list[Line]]:
    """Leaves whose explicit-axes sharding comes back to one they had before: the body
    keeps changing it, so no sharding is a fixed point (kind `"sharding"`)."""
    mismatches: list[Mismatch] = []
    lines: list[Line] = []
    for i, (c, new) in enumerate(zip(carry, joined, strict=True)):
        if c is new:
            continue
        before, after = carry_spec(c), carry_spec(new)
        if before == after:
            continue
        history = seen.setdefault(i, [before])
        if after not in history:
            history.append(after)
            continue
        rank = len(c.shape)
        m = Mismatch(paths[i], "sharding", spec_value(before, rank), spec_value(after, rank), root=roles.root)
        mismatches.append(m)
        texts = [spec_text(spec_value(spec, rank)) for spec in (*history, after)]
        fix = carry_sharding_fix(texts, roles.fn)
        lines.append(
            (
                m.where,
                f"input {leaf_str(c)} sharded {spec_text(m.expected)}, output sharded {spec_text(m.actual)}.",
                fix,
            )
        )
    return mismatches, lines


def convert_init(init: PyTree, carry: Structure, fn_name: str, roles: Roles = CARRY) -> PyTree:
    """`init`'s values with `carry`'s dtypes and manual axes (and with `roles.as_arrays`, every
    leaf a `jax.Array` with `carry`'s weak flag: `jax.jit` keys Python and NumPy values apart
    from arrays, and weak arrays apart from strong ones)."""
    leaves, treedef = jtu.tree_flatten(init)
    out: list[Any] = []
    for x, want in zip(leaves, carry.leaves, strict=True):
        if isinstance(x, jax.ShapeDtypeStruct):
            build = "`ts.carry_structure(...).zeros()`"
            if roles.as_arrays:
                build = f"`ts.structure_of({roles.init}).zeros()`"
            raise TypeError(
                f"treeshape.{fn_name}: `{roles.init}` holds a jax.ShapeDtypeStruct, which has no value to "
                f"convert. Build values with {build} instead."
            )
        if roles.as_arrays and not isinstance(x, jax.Array):
            x = jnp.asarray(x)
        have = jax.typeof(x)
        if have.dtype != want.dtype or (have.weak_type != want.weak_type and type(x) not in SCALAR_TYPES):
            x = convert(x, want.dtype, want.weak_type)
        missing = varying_axes(want) - varying_axes(have)
        if missing:
            x = _compat.pcast_varying(x, tuple(sorted(missing)))
        if carry_spec(want) != carry_spec(have):  # explicit mesh axes: part of the type
            x = reshard(x, want, fn_name, ft.partial(_Paths(init, roles.root).where, len(out)))
        out.append(x)
    return jtu.tree_unflatten(treedef, out)


def carry_structure(
    body: Callable[..., Any],
    init: PyTree,
    xs: PyTree = None,
    *,
    length: int | None = None,
    policy: str = "weak",
) -> Structure:
    """Find the carry type for which `lax.scan(body, carry, xs, length=length)` type-checks.

    Starts from `init`'s abstract types, evaluates `body` abstractly (through
    [treeshape.out_structure][], so it is cached and safe under any
    transformation), joins each input leaf with the matching output leaf under
    `policy`, and repeats until nothing changes: one trace of `body` when
    `init` already is a fixed point, one more per promotion step. Unlike JAX's
    own two-pass weak-type promotion, this reaches a true fixed point. Under
    `jax.shard_map`, a leaf whose output varies over manual mesh axes is made
    varying over them too.

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
    policy: str = "weak",
) -> PyTree:
    """Convert `init` to the carry type `lax.scan(body, ...)` needs.

    The values of `init` converted to [treeshape.carry_structure][]'s types:
    the dtype casts `policy` allows, and `lax.pcast(..., to="varying")` where
    the body's carry varies over manual mesh axes. Leaves that need no change
    are returned as they are. The result can be passed straight to `lax.scan`.

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


def while_carry(body: Callable[[PyTree], PyTree], init: PyTree, *, policy: str = "weak") -> PyTree:
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
    policy: str = "weak",
) -> PyTree:
    """Convert `init` to the carry type a `lax.fori_loop` body `body(i, carry) -> carry` needs.

    As [treeshape.scan_carry][], for `lax.fori_loop(lower, upper, body, init)`.
    The index `i` has the type `lax.fori_loop` gives it for these bounds: a
    weak `int32` when both are concrete (Python ints or arrays), the bounds'
    dtype when they are traced (e.g. arguments of a jitted function), as
    `lax.fori_loop` itself decides.

    Args:
        body: The loop body, `body(i, carry) -> carry`.
        init: The initial carry values.
        lower: The loop's lower bound, as it will be passed to `lax.fori_loop`
            (a value or a tracer); only its type matters.
        upper: The loop's upper bound, likewise.
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
            raise TypeError(
                fori_bound_message(fn_name, name, bound, None if aval is None else leaf_str(from_aval(aval)))
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
    raise TypeError(fori_bounds_message(fn_name, leaf_str(lo), leaf_str(hi)))
