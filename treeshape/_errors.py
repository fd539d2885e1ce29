"""treeshape's exceptions, and the only place mismatch data becomes prose."""

from collections.abc import Sequence
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from ._structure import Mismatch


class StructureMismatchError(TypeError):
    """A pytree does not have the expected structure.

    Raised by [treeshape.Structure.check][] (and the functions built on it).
    The message lists every difference, in leaf order, each naming the pytree
    path, the expected and the actual value, and how to fix it. The same data
    is on the exception as `err.mismatches`, a list of [treeshape.Mismatch][].

    It subclasses `TypeError`, the exception JAX raises for the same kind of
    mistake, so existing `except TypeError` handlers keep working.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> expected = ts.structure_of({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
        >>> try:
        ...     expected.check({"w": jnp.zeros((3, 2)), "b": jnp.zeros(3, jnp.int32)})
        ... except ts.StructureMismatchError as err:
        ...     print(err)
        ...     print([(m.path, m.kind) for m in err.mismatches])
        treeshape.Structure.check: the tree does not match; 2 differences:
        <BLANKLINE>
          * tree['b']: expected dtype float32, got int32. Convert it with `.astype(float32)`.
          * tree['w']: expected shape (2, 3), got (3, 2). Make this leaf shape (2, 3).
        [("tree['b']", 'dtype'), ("tree['w']", 'shape')]
    """

    def __init__(self, message: str, mismatches: Sequence["Mismatch"] = ()) -> None:
        super().__init__(message)
        self.mismatches: list[Mismatch] = list(mismatches)


class CarryMismatchError(StructureMismatchError):
    """No loop-carry type is a fixed point of the loop body under the policy.

    Raised by [treeshape.carry_structure][] and the `*_carry` functions. The
    message names every offending carry leaf by path (`carry[1]['mu']`), its
    input and output types, why the policy forbids the change, and the fix: the
    policy that would allow it, or the shape `body` should return.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> def body(carry, x):
        ...     return {"acc": carry["acc"] + x}, None  # bf16 + f32 -> f32
        >>> init = {"acc": jnp.zeros(3, jnp.bfloat16)}
        >>> try:
        ...     ts.scan_carry(body, init, jnp.ones((4, 3)))
        ... except ts.CarryMismatchError as err:
        ...     print(err.mismatches[0])
        ...     print(str(err).split(". ", 1)[1])
        carry['acc']: expected dtype bfloat16, got float32.
        The dtypes differ and the leaf is strongly typed, so policy="weak" may not change it; policy="promote" would ...
        >>> ts.scan_carry(body, init, jnp.ones((4, 3)), policy="promote")["acc"].dtype
        dtype('float32')
    """


def fix_for(m: "Mismatch") -> str:
    """The sentence that tells the user how to repair one mismatch."""
    if m.kind == "shape":
        return f"Make this leaf shape {m.expected}."
    if m.kind == "dtype":
        if _is_key(m.expected):
            return f"Make it a typed PRNG key array of dtype {m.expected} (e.g. with `jax.random.wrap_key_data`)."
        if _is_key(m.actual):
            return f"Pass numeric data of dtype {m.expected} (e.g. `jax.random.key_data(...)`), not PRNG keys."
        return f"Convert it with `.astype({m.expected})`."
    if m.kind == "weak_type":
        if m.expected:
            return "Build it from a Python scalar, or convert the expected side with `ts.strip_weak_type`."
        return "Make it strong with `ts.strip_weak_type`, or pass a typed array instead of a Python scalar."
    if m.kind == "vma":
        missing = sorted(set(m.expected) - set(m.actual))
        if missing:
            return f'Apply `jax.lax.pcast(x, {tuple(missing)!r}, to="varying")` to it.'
        return "It varies over more manual axes than expected: reduce it (e.g. `jax.lax.psum`) or expect those axes."
    if m.actual is None:
        return "Add this entry."
    if m.expected is None:
        return "Remove this entry."
    return "Make both trees use the same containers (same node types, keys and lengths)."


def _is_key(dtype: object) -> bool:
    return str(dtype).startswith("key<")


def format_mismatches(header: str, mismatches: Sequence["Mismatch"]) -> str:
    """`header` plus one sentence (or one bullet per mismatch) with its fix."""
    lines = [f"{m} {fix_for(m)}" for m in mismatches]
    if len(lines) == 1:
        return f"{header}: {lines[0]}"
    count = f"{len(lines)} differences"
    return f"{header}; {count}:\n\n" + "\n".join(f"  * {line}" for line in lines)


# -- dtype policies (upcast and loop carries) ----------------------------------
def format_lines(header: str, lines: Sequence[str], what: str) -> str:
    """`header: line` for one line, else `header; N <what>s differ:` and bullets."""
    if len(lines) == 1:
        return f"{header}: {lines[0]}"
    return f"{header}; {len(lines)} {what} differ:\n\n" + "\n".join(f"  * {line}" for line in lines)


def policy_fix(src: str, src_weak: bool, dst: str, policy: str, allowing: str | None) -> str:
    """Why `policy` forbids a dtype change from `src` to `dst`, and which policy allows it."""
    strength = "weakly typed" if src_weak else "strongly typed"
    if allowing is None:
        return f'policy="{policy}" may not change it.'
    reason = {
        "promote": f"{src} promotes to {dst}",
        "cast": f"an explicit cast from {src} to {dst}",
    }.get(allowing, "")
    if src_weak:
        why = f"JAX's weak-type promotion of a {strength} {src} with {dst} does not give {dst}"
    else:
        why = f"the leaf is {strength}"
    return f'The dtypes differ and {why}, so policy="{policy}" may not change it; policy="{allowing}" would ({reason}).'


def carry_shape_fix(shape: tuple[int, ...]) -> str:
    return f"The shapes differ, and no policy changes a shape: make `body` return shape {shape} here."


def carry_vma_fix(in_axes: frozenset[str], out_axes: frozenset[str]) -> str:
    extra = tuple(sorted(in_axes - out_axes))
    return (
        f"`body` returns a value that varies over fewer manual axes than the carry ({extra} missing), "
        f'and no policy removes axes from a carry: apply `jax.lax.pcast(..., {extra!r}, to="varying")` '
        "to that output inside `body`."
    )


def carry_structure_fix() -> str:
    return "No policy changes the tree structure: make `body` return a carry with the same containers as `init`."
