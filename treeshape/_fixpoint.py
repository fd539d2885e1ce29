"""The fixed point of a tree's types under an abstract step: the loop carries' (`_carry`)
and a train step's state (`_settle`). Each input leaf is joined with the step's output leaf
under a policy until nothing changes; what cannot be joined is reported by path with its
fix; then the initial values are converted to the settled types."""

import functools as ft
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from . import _compat
from ._compat import spec_text
from ._diff import diff_structures
from ._dtypes import key_impl_name, short_dtype
from ._errors import (
    CarryMismatchError,
    Line,
    Mismatch,
    MismatchKind,
    PrecisionWarning,
    carry_shape_fix,
    carry_sharding_fix,
    carry_structure_fix,
    carry_vma_fix,
    format_report,
    key_change_fix,
    policy_fix,
)
from ._leaf import SCALAR_TYPES, flatten, leaf_str, refuse_leaked_tracers, varying_axes
from ._shapes import has_symbolic, shape_names
from ._sharding import carry_spec, reshard, spec_value
from ._structure import PyTree, Structure
from ._weak import Policy, allowing_policy, check_policy, convert, dtype_change_allowed, key_change


_MAX_STEPS: Final = 32


class Roles(NamedTuple):
    """Who is who in a fixed point: the loop carries' names and rules (the defaults), or
    another client's (`ts.settle`: a train step's `state`, where the weak flag follows the output)."""

    root: str = "carry"  # the root name of paths in messages, and the value's name
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


def structure_as_values_message(fn_name: str, where: str, needs: str) -> str:
    """A `Structure` passed where a tree of values (or of abstract values) is needed.

    `needs` is what the callee takes there: "values" (arrays, e.g. a carry to convert)
    or "abstract" (arrays or `ShapeDtypeStruct`s)."""
    fix = "`s.zeros()` (arrays of that structure)" + (
        " or `s.tree` (its `ShapeDtypeStruct`s)" if needs == "abstract" else ""
    )
    return (
        f"treeshape.{fn_name}: {where} is a treeshape.Structure, a description of a tree rather than a tree of "
        f"{'arrays' if needs == 'values' else 'arrays or abstract values'}. Pass {fix} instead."
    )


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
    return _compat.from_aval(aval)


def abstract_tree(tree: PyTree, root: str, fn_name: str) -> tuple[jtu.PyTreeDef, _Paths, list[Any]]:
    """`tree`'s treedef, its leaves' paths under `root`, and each leaf's abstract value."""
    leaves, treedef = flatten(tree, fn_name, root)
    refuse_leaked_tracers(leaves, fn_name)
    paths = _Paths(tree, root)
    return treedef, paths, [_abstract_leaf(x, ft.partial(paths.where, i), fn_name) for i, x in enumerate(leaves)]


def sub_structure(s: Structure, index: int) -> Structure:
    """The Structure of child `index` of `s`'s root node (the carry of a scan body's `(carry, y)`)."""
    children = s.treedef.children()
    start = sum(child.num_leaves for child in children[:index])
    child = children[index]
    return Structure(child, s.leaves[start : start + child.num_leaves])


def fixed_point(
    fn_name: str,
    step: Callable[[PyTree], Structure],
    init: PyTree,
    policy: Policy,
    roles: Roles = CARRY,
) -> Structure:
    """Evaluate `step` from `init`'s types, joining input and output types until stable."""
    check_policy(policy, fn_name)
    root, fn = roles.root, roles.fn
    treedef, paths, carry = abstract_tree(init, root, fn_name)
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
        warnings.warn(PrecisionWarning(_narrowing_message(fn_name, narrowed, roles.init)), stacklevel=4)


def _narrowing_message(fn_name: str, leaves: Sequence[tuple[str, str, str]], init: str) -> str:
    """Weak float leaves (where, from, to) that settle on a float narrower than 32 bits."""
    where, src, dst = leaves[0]
    if len(leaves) == 1:
        what = f"{where} ({src} -> {dst}) starts as a weakly typed float (a Python scalar) and takes"
    else:
        what = (
            f"{len(leaves)} leaves (e.g. {where}: {src} -> {dst}) start as weakly typed floats (Python scalars) "
            "and take"
        )
    return (
        f"treeshape.{fn_name}: {what} the body's narrower dtype, as JAX's weak-type rule says; accumulating "
        "in it loses precision fast (a thousand 1.001s sum to 256 in bfloat16). To accumulate in float32, "
        f"start from `jnp.float32(0)` in `{init}`."
    )


def _structure_mismatches(
    current: Structure, out: Structure, paths: _Paths, policy: Policy, roles: Roles
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
    paths: Sequence[str] | _Paths, carry: list[Any], out: list[Any], policy: Policy, roles: Roles
) -> tuple[list[Any], list[Mismatch], list[Line]]:
    """Each carry leaf joined with the body's output leaf, or why it cannot be."""
    joined: list[Any] = []
    mismatches: list[Mismatch] = []
    lines: list[Line] = []
    for i, (c, o) in enumerate(zip(carry, out, strict=True)):
        if c == o:  # the common case: nothing to join
            joined.append(c)
            continue
        failures: list[tuple[MismatchKind, Any, Any, str]] = []  # kind, expected, actual, fix
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


def _symbolic_names(leaves: Sequence[Any]) -> Iterator[str]:
    """The names of the symbolic dimensions of `leaves`' shapes, in order."""
    for leaf in leaves:
        shape = getattr(leaf, "shape", ())
        if isinstance(shape, tuple) and has_symbolic(shape):
            yield from shape_names(shape)


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
            names = list(dict.fromkeys(_symbolic_names(leaves)))
            if names:  # `zeros()` needs sizes: `bind` gives them
                sizes = ", ".join(f"{n}=..." for n in names)
                raise TypeError(
                    f"treeshape.{fn_name}: `{roles.init}` holds a jax.ShapeDtypeStruct, which has no value to "
                    f"convert, of symbolic dimensions ({', '.join(names)}): bind them to sizes and build values "
                    f"with {build.replace('.zeros()`', f'.bind({sizes}).zeros()`')} instead."
                )
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
