"""How JAX names the operations of a compiled program, told once for the cost wing.

JAX writes each operation's name into the program's metadata (`op_name`): under the
jitted function's own `jit(name)` (`_compat.JIT_OP_PREFIXES`: `pjit(name)` in older
releases, `pmap(name)`), the path of transformations and scopes
(`jit(step)/transpose(jvp(MLP))/layers_1/dot_general`). XLA joins the names of what it
fuses with `;`, and names a multi-output fusion's or a combined collective's members as a
group in parentheses. A name that does not start so is XLA's own (a copy XLA makes of a
parameter keeps the parameter's name, `dynamic[2]`).

`OpNames` is one program's rule, which `_program` gives the program it compiles: where
`ts.cost` jitted its own program around the user's jit wrapper, the outer `jit(...)` is
ours and each op is named without it, as the user's own program names it (and, for a
`jax.pmap` wrapper, `pmap(name)/...` for the `jit(...)/shard_map` JAX 0.8+ compiles it
through). Buffers, timeline steps and kernels are named by it as they are read.
"""

import dataclasses
import re
from typing import Final

from .. import _compat


# What a step, buffer or kernel without an op of the user's program is called in tables.
NO_OP: Final = "(XLA's own)"

# How JAX 0.8+ compiles a `jax.pmap`: through its own `jit(_fun)/shard_map` (`jit(call_wrapped)` on 0.8.0).
_PMAP_HEAD: Final = re.compile(r"p?jit\([^()/]*\)/shard_map(?=/|$)")


def is_jitted(name: str) -> bool:
    """Whether `name` starts with a jitted function's own `jit(...)` (`pjit(...)`, `pmap(...)`)."""
    return name.startswith(_compat.JIT_OP_PREFIXES)


def without_jit(op: str) -> str:
    """`op` without its outermost `jit(...)`, where something follows it."""
    head, _, rest = op.partition("/")
    return rest if is_jitted(head) and rest else op


def first_name(op: str) -> str:
    """The first of the names `op` joins: a fusion's metadata joins several with `;`; a
    combined collective's, and a multi-output fusion's, are a group in parentheses (after the
    outermost `jit(...)/`, if any), separated by commas or colons."""
    name = op.split(";")[0].strip()
    head, slash, rest = name.partition("/")
    if is_jitted(head) and rest.startswith("("):
        return head + slash + _first_in_group(rest)
    return _first_in_group(name) if name.startswith("(") else name


def _first_in_group(group: str) -> str:
    """`(a/b:c/d)` or `(a, b)` -> `a/b` / `a`: the first member, parentheses inside kept."""
    depth = 0
    for i, char in enumerate(group[1:], 1):
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0 and char in "),:":
            return group[1:i].strip()
    return group[1:].strip()


def phase_name(op: str, depth: int) -> str:
    """`op`'s first name (a fusion's metadata joins several with `;`, a combined
    collective's in parentheses) without its outermost `jit(...)`, to `depth` components."""
    return "/".join(without_jit(first_name(op)).split("/")[:depth])


@dataclasses.dataclass(frozen=True)
class OpNames:
    """How one compiled program's ops are named: as its metadata names them, or, where
    `around` (`ts.cost` jitted its program around the user's own jit wrapper), as the
    wrapper's own program names them: without our outermost `jit(...)`, and for the
    `jax.pmap` wrapper of the function named `pmap`, `pmap(name)/...`."""

    around: bool = False
    pmap: str | None = None

    def op(self, name: str) -> str | None:
        """The op that makes a value or runs a kernel, from its metadata's `name`: None
        where XLA made it, or where the name is the wrapper's call itself (no operation of
        the program the wrapper compiles: a constant XLA broadcasts before a loop)."""
        return self._own(name) if is_jitted(name) else None

    def step(self, name: str) -> str | None:
        """The op of a step of the schedule: None where the metadata names no operation
        under the outermost `jit(...)` (a parameter's names its input)."""
        first = first_name(name)  # a fusion's or a combined collective's first
        return self._own(name) if is_jitted(first) and "/" in first else None

    def _own(self, op: str) -> str | None:
        """`op` as the user's program names it, each name `;` joins."""
        if not self.around:
            return op
        names = op.split(";")
        own = [self._own_name(name) for name in names]
        return None if own[0] is None else ";".join(o or n for o, n in zip(own, names, strict=True))

    def _own_name(self, name: str) -> str | None:
        head, _, rest = name.partition("/")
        if not (is_jitted(head) and is_jitted(rest)):
            return name
        if self.pmap is not None:
            rest = _PMAP_HEAD.sub(f"pmap({self.pmap})", rest, count=1)
        return rest if "/" in rest else None


# The ops of a program the user's own jit compiles itself, or of a function `ts.cost` jits.
AS_WRITTEN: Final = OpNames()
