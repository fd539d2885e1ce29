"""Mismatches, treeshape's exceptions, the fixes, and the report formatting every message
shares (grouping, line limits, "the first three, then N more"). A message about one check's
input lives beside that check."""

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import jax

from ._compat import spec_text
from ._shapes import constraints_text
from ._tree import clip


def _spec(x: Any) -> Any:
    """A `PartitionSpec` as every release prints it alike (`P('d', None)`); anything else as itself."""
    return spec_text(x) if isinstance(x, jax.sharding.PartitionSpec) else x


# What a `Mismatch` is a difference of (`Mismatch.kind`).
MismatchKind = Literal["structure", "shape", "dtype", "weak_type", "vma", "sharding", "setting", "function", "cache"]


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One difference between an expected structure and an actual tree.

    Attributes:
        path: Where: the `jax.tree_util.keystr` path of the leaf or node, as
            in `Structure.paths` and `ts.weak_paths` (`"['w']"`, `""` for the
            root itself).
        kind: One of `"structure"`, `"shape"`, `"dtype"`, `"weak_type"`,
            `"vma"`, `"sharding"` (loop carries and `ts.watch` under explicit
            mesh axes), and, for a retrace `ts.watch` reports, `"setting"` (a
            JAX setting, named by `path`), `"function"` (the same inputs and
            settings, a new function) or `"cache"` (JAX's caches were cleared).
        expected: The expected value: a shape tuple, a dtype, a weak flag, a
            frozenset of manual axes, a `PartitionSpec` (for `"sharding"`,
            one entry per dimension; text naming the spec and the mesh where
            `ts.watch` saw the leaf's mesh change), or (for `"structure"`) a
            description of the expected node or leaf; `None` when the entry
            is extra.
        actual: The actual value, as `expected`; `None` when it is missing.
        root: The name messages print before `path`: `tree` for a compared
            tree, `carry` for a loop carry, `state` for a train state.
        dims: For a `"shape"` mismatch of a leaf with symbolic dimensions
            compared with a concrete tree: each dimension name of the leaf
            that another leaf bound, as `(name, size, where it was bound)`
            (`("b", 5, "tree['x']")`), or `(name, None, "")` for a name that
            no leaf of the tree determines.
        constraint: For a `"shape"` mismatch: the constraint of the
            symbolic scope that the tree's sizes break (`"b >= 4"`), else `""`.
        fix: The remedy in words, where the producer works it out from more
            than the mismatch itself (`ts.watch` sets it for each mismatch it
            reports); `""` when the message derives it from the mismatch.
        here: For a `"shape"` mismatch with `dims`: what this leaf's own
            sizes say of each name bound elsewhere, as `(name, expression,
            size, name's size here, what the binding gives)`:
            `("b", "2*b", 12, 6, 10)` for `2*b` of size 12 where `b = 5`
            (the name's size here is `None` when no integer gives it).

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> s = ts.structure_of({"w": jnp.zeros((2, 3))})
        >>> [m] = s.diff({"w": jnp.zeros((3, 2))})
        >>> m.path, m.kind, m.expected, m.actual
        ("['w']", 'shape', (2, 3), (3, 2))
        >>> m.path in s.paths
        True
        >>> print(m)
        tree['w']: expected shape (2, 3), got (3, 2).
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    path: str
    kind: MismatchKind
    expected: Any
    actual: Any
    root: str = dataclasses.field(default="tree", kw_only=True)
    dims: tuple[tuple[str, int | None, str], ...] = dataclasses.field(default=(), kw_only=True)
    constraint: str = dataclasses.field(default="", kw_only=True)
    fix: str = dataclasses.field(default="", kw_only=True)
    here: tuple[tuple[str, str, int, int | None, int], ...] = dataclasses.field(default=(), kw_only=True)

    @property
    def where(self) -> str:
        """The root name and the path, as messages print them (`tree['w']`)."""
        return self.root + self.path

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" if self.where else self.what[:1].upper() + self.what[1:]

    @property
    def what(self) -> str:
        """The difference, without the path (`expected shape (2, 3), got (3, 2).`)."""
        e, a = self.expected, self.actual
        if self.kind == "shape":
            return _shape_what(self)
        if self.kind == "dtype":
            return f"expected dtype {e}, got {a}."
        if self.kind == "weak_type":
            return f"expected a {_weakness(e)} typed leaf, got a {_weakness(a)} typed one."
        if self.kind == "vma":
            return f"expected a leaf varying over manual axes {_axes(e)}, got {_axes(a)}."
        if self.kind == "sharding":
            return f"expected sharding {_spec(e)}, got {_spec(a)}."
        if self.kind == "setting":
            return f"expected {e}, got {a}."
        if self.kind in ("function", "cache"):
            return f"traced again with the inputs and settings of the trace at {e} (this trace is at {a})."
        if a is None:
            return f"missing; expected {e}."
        if e is None:
            return f"unexpected extra entry {a}."
        if _print_alike(self) or (isinstance(e, FieldValue) and e == a):
            if isinstance(e, ReprOnly) or isinstance(a, ReprOnly):
                return (
                    f"expected {e}, got one that prints the same but is not equal (a value loaded from JSON is known "
                    "by its repr only)."
                )
            return f"expected {e}, got another value that prints the same (the two are not equal)."
        return f"expected {e}, got {a}."


def _shape_what(m: Mismatch) -> str:
    e, a = m.expected, m.actual
    if m.constraint:
        given = ", ".join(f"{name} = {size}" for name, size, _ in m.dims)
        return f"expected shape {e} with {m.constraint}, got {a} ({given})."
    here = {told[0]: told for told in m.here}
    bound = [_bound_what(name, size, where, here.get(name)) for name, size, where in m.dims if size is not None]
    unknown = [name for name, size, _ in m.dims if size is None]
    notes = []
    if bound:
        notes.append(first_few(bound))
    if unknown:
        notes.append(f"no leaf of the tree determines {' or '.join(unknown)}")
    if notes:
        return f"expected shape {e}, got {a}; {'; '.join(notes)}."
    if str(e) == str(a):  # written alike: symbolic dimensions of scopes with other constraints
        return (
            f"expected shape {e} with constraints {_constraints(e)}, got the same dimensions with constraints "
            f"{_constraints(a)}."
        )
    return f"expected shape {e}, got {a}."


def _bound_what(name: str, size: int, where: str, told: tuple[str, str, int, int | None, int] | None) -> str:
    """A name bound elsewhere, and (when this leaf tells it) the size this leaf gives it."""
    if told is None:
        return f"{name} = {size} at {where}"
    _, expression, actual, value, predicted = told
    if value is None:
        return f"here {expression} = {actual}, but {name} = {size} at {where}, which gives {expression} = {predicted}"
    here = f"{name} = {value}" if expression == name else f"{name} = {value} ({expression} = {actual})"
    return f"here {here}, but {name} = {size} at {where}"


def _constraints(shape: Any) -> str:
    text = constraints_text(shape) if isinstance(shape, tuple) else ""
    return f"({text})" if text else "(none)"


class FieldValue(str):
    """A static field's value, in words, as a `Mismatch` holds it (`"8"`, `"'sgd'"`, `"jax.nn.relu"`):
    the mismatch is about node data (a framework's static field), not about a leaf or a container.
    Equal to the plain string."""

    __slots__ = ()


class StaticValue(str):
    """A static leaf, in words, as a `Mismatch` holds it (`"the static value jax.nn.gelu"`). Equal to
    the plain string."""

    __slots__ = ()


class ReprOnly(str):
    """Marks a static value (a `FieldValue` or `StaticValue`) that holds one loaded from JSON, which
    knows it by its repr only: it equals no live value."""

    __slots__ = ()


class FieldReprOnly(ReprOnly, FieldValue):
    __slots__ = ()


class StaticReprOnly(ReprOnly, StaticValue):
    __slots__ = ()


def is_static(m: Mismatch) -> bool:
    """Whether `m` is only about static values (a static leaf, a static field or a framework's
    internal node data, on both sides), which `ignore={"static"}` leaves out."""
    static = (FieldValue, StaticValue)
    return m.kind == "structure" and isinstance(m.expected, static) and isinstance(m.actual, static)


def _print_alike(m: Mismatch) -> bool:
    """Two static leaves that differ but are written alike: typically one was loaded from JSON,
    which keeps such a value (an enum, an object) by its repr only."""
    e = m.expected
    return m.kind == "structure" and e == m.actual and isinstance(e, str) and e.startswith("the static value ")


def _weakness(weak: bool) -> str:
    return "weakly" if weak else "strongly"


def _axes(axes: frozenset[str]) -> str:
    return "{" + ", ".join(repr(a) for a in sorted(axes)) + "}" if axes else "{} (none)"


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
        [("['b']", 'dtype'), ("['w']", 'shape')]
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    def __init__(self, message: str, mismatches: Sequence[Mismatch] = ()) -> None:
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

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)


class PrecisionWarning(UserWarning):
    """A loop carry will accumulate in a float narrower than 32 bits.

    Emitted by the carry functions ([treeshape.carry_structure][],
    [treeshape.scan_carry][], ...) when a weakly typed float leaf of `init`
    (a Python `0.0` accumulator) takes the body's `bfloat16` or `float16`
    dtype, as JAX's weak-type rule says it must. Summing a thousand `1.001`s
    in `bfloat16` gives `256`: start such an accumulator from
    `jnp.float32(0)` to sum in `float32`. It is a `UserWarning`, so the usual
    `warnings` filters apply.

    Examples:
        >>> import warnings
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> xs = jnp.ones(1000, jnp.bfloat16)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     init = ts.scan_carry(lambda total, x: (total + x, None), 0.0, xs)
        >>> init.dtype, caught[0].category.__name__
        (dtype(bfloat16), 'PrecisionWarning')
        >>> ts.scan_carry(lambda total, x: (total + x, None), jnp.float32(0), xs).dtype
        dtype('float32')
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)


def fix_for(m: Mismatch) -> str:
    """The sentence that tells the user how to repair one mismatch."""
    if m.kind == "shape":
        if m.constraint:
            return f"Pass a tree whose sizes meet {m.constraint}."
        if any(size is None for _, size, _ in m.dims):
            names = [name for name, size, _ in m.dims if size is None]
            return f"Bind it first: `structure.bind({', '.join(f'{n}=...' for n in names)})`."
        if m.dims:
            return f"Give {', '.join(dict.fromkeys(name for name, _, _ in m.dims))} one size across the tree."
        if str(m.expected) == str(m.actual):
            return "Make both from one symbolic scope, or from scopes with the same constraints."
        return f"Make this leaf shape {m.expected}."
    if m.kind == "dtype":
        if _is_key(m.expected):
            return f"Make it a typed PRNG key array of dtype {m.expected} (e.g. with `jax.random.wrap_key_data`)."
        if _is_key(m.actual):
            return f"Pass numeric data of dtype {m.expected} (e.g. `jax.random.key_data(...)`), not PRNG keys."
        return f"Convert it with `.astype({m.expected})`."
    if m.kind == "weak_type":
        if m.expected:
            return "Build it from a Python scalar, or compare with `ignore={'weak_type'}`."
        return "Make it strong with `ts.strip_weak_type`, or compare with `ignore={'weak_type'}`."
    if m.kind == "vma":
        missing = sorted(set(m.expected) - set(m.actual))
        if missing:
            return f'Apply `jax.lax.pcast(x, {tuple(missing)!r}, to="varying")` to it.'
        return "It varies over more manual axes than expected: reduce it (e.g. `jax.lax.psum`) or expect those axes."
    if m.kind == "sharding":
        return f"Reshard it with `jax.sharding.reshard(x, {_spec(m.expected)})`."
    if isinstance(m.expected, FieldValue) or isinstance(m.actual, FieldValue):
        return (
            "A static field is part of the tree structure (node data, not a leaf): build both with the same value, "
            "or compare with `ignore={'static'}`."
        )
    if m.actual is None:
        return "Add this entry."
    if m.expected is None:
        return "Remove this entry."
    if _print_alike(m) and (isinstance(m.expected, ReprOnly) or isinstance(m.actual, ReprOnly)):
        return (
            "JSON brings back str, int, float, bool and None static leaves, and functions and classes of imported "
            "modules, as themselves; compare with `ignore={'static'}` to leave static values out."
        )
    if _print_alike(m):
        return "Pass an equal value (static leaves compare by `==`), or compare with `ignore={'static'}`."
    return "Make both trees use the same containers (same node types, keys and lengths)."


def _is_key(dtype: object) -> bool:
    return str(dtype).startswith("key<")


# -- reports: one sentence, or bullets; leaves that fail alike grouped ----------------
Line = tuple[str, str, str]  # (where: root + path, what differs, the fix)
_MAX_LINE: Final = 300  # characters: a message stays readable for trees of any size
MAX_WHERE: Final = 100
SHOWN: Final = 3  # the paths (or fields) a message names before "and N more"


def first_few(items: Sequence[str], total: int | None = None, unit: str = "") -> str:
    """`a, b, c and 4 more`: the first `SHOWN` of `items`, then how many of the
    `total` (default `len(items)`) are left out, with `unit` after "more"."""
    total = len(items) if total is None else total
    text = ", ".join(items[:SHOWN])
    return text + (f" and {total - SHOWN} more{unit}" if total > SHOWN else "")


def mismatch_line(m: Mismatch) -> Line:
    return (m.where, m.what, m.fix or fix_for(m))


def format_mismatches(header: str, mismatches: Sequence[Mismatch]) -> str:
    """`header` plus one sentence (or one bullet per mismatch) with its fix; entries missing (or
    extra) at consecutive indices under one node are one line (`layers: entries 12-15 missing`)."""
    return format_report(header, merged_lines(mismatches), "differences")


_INDEXED: Final = re.compile(r"(?P<parent>.*)\[(?P<quote>'?)(?P<n>[0-9]+)(?P=quote)\]")


def _entry(m: Mismatch) -> tuple[str, str, int, bool] | None:
    """`(where the parent is, quote, index, missing)` for a missing or extra entry at an integer
    index (`[12]`, or a dict key `['12']`, as orbax writes layer numbers), else None."""
    if m.kind != "structure" or (m.expected is None) == (m.actual is None):
        return None
    found = _INDEXED.fullmatch(m.path)
    if found is None:
        return None
    return m.root + found["parent"], found["quote"], int(found["n"]), m.actual is None


def merged_lines(mismatches: Sequence[Mismatch], what: Callable[[Mismatch], str] | None = None) -> list[Line]:
    """One report line per mismatch (`what(m)` telling it, else its own text and fix); entries
    missing (or extra) at consecutive indices under one node are one line."""
    lines: list[Line] = []
    i = 0
    while i < len(mismatches):
        first = _entry(mismatches[i])
        run = 1
        while first is not None and i + run < len(mismatches):
            entry = _entry(mismatches[i + run])
            if entry is None or entry[:2] != first[:2] or entry[3] != first[3] or entry[2] != first[2] + run:
                break
            run += 1
        if run == 1 or first is None:
            m = mismatches[i]
            lines.append(mismatch_line(m) if what is None else (m.where, what(m), ""))
        else:
            lines.append(_range_line(first, mismatches[i : i + run]))
        i += run
    return lines


def _range_line(first: tuple[str, str, int, bool], run: Sequence[Mismatch]) -> Line:
    where, quote, n, missing = first
    span = f"{quote}{n}{quote}-{quote}{n + len(run) - 1}{quote}"
    described = [m.expected if missing else m.actual for m in run]
    each = "each" if all(d == described[0] for d in described) else "the first"
    if missing:
        return (
            where,
            f"entries {span} missing ({len(run)} of them); {each} expected {described[0]}.",
            "Add these entries.",
        )
    return where, f"entries {span} unexpected ({len(run)} of them); {each} {described[0]}.", "Remove these entries."


def format_report(header: str, lines: Sequence[Line], noun: str) -> str:
    """`header: sentence` for one difference, else `header; N <noun>:` and one
    bullet per way of failing: leaves that fail the same way (the same fix) are
    one bullet naming the first few paths and the count."""
    groups: dict[str, list[Line]] = {}
    for line in lines:
        groups.setdefault(line[2], []).append(line)
    bullets = [_group_line(group) for group in groups.values()]
    if len(lines) == 1:
        return (
            f"{header}: {bullets[0]}" if len(header) + 2 + len(bullets[0]) <= _MAX_LINE else f"{header}:\n{bullets[0]}"
        )
    return f"{header}; {len(lines)} {noun}:\n\n" + "\n".join(f"  * {b}" for b in bullets)


def _group_line(group: Sequence[Line]) -> str:
    where, what, fix = group[0]
    if len(group) == 1:
        return f"{clip(where, MAX_WHERE)}: {what} {fix}"
    shown = first_few([clip(w, MAX_WHERE // 2) for w, _, _ in group[:SHOWN]], len(group))
    first = f"{clip(where, MAX_WHERE // 2)}: {what}" if len(group) > 1 else ""
    return f"{len(group)} leaves fail alike ({shown}); e.g. {first} {fix}"


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


def carry_shape_fix(shape: tuple[int, ...], out_shape: tuple[int, ...], fn: str = "body", init: str = "init") -> str:
    if not shape and out_shape:  # a scalar start (a Python `0.0` accumulator) meeting arrays
        return (
            f"The shapes differ, and no policy changes a shape: give `{init}` shape {out_shape} here "
            f"(e.g. `jnp.zeros({out_shape})` instead of a scalar), or make `{fn}` return shape ()."
        )
    return f"The shapes differ, and no policy changes a shape: make `{fn}` return shape {shape} here."


def carry_vma_fix(in_axes: frozenset[str], out_axes: frozenset[str], fn: str = "body") -> str:
    extra = tuple(sorted(in_axes - out_axes))
    return (
        f"`{fn}` returns a value that varies over fewer manual axes than the carry ({extra} missing), "
        f'and no policy removes axes from a carry: apply `jax.lax.pcast(..., {extra!r}, to="varying")` '
        f"to that output inside `{fn}`."
    )


def carry_structure_fix(fn: str = "body", init: str = "init", noun: str = "carry") -> str:
    return f"No policy changes the tree structure: make `{fn}` return a {noun} with the same containers as `{init}`."


# -- typed PRNG keys (upcast and loop carries) ---------------------------------
def key_change_fix(
    src: str, dst: str, src_impl: str, dst_impl: str, in_loop: bool, fn: str = "body", init: str = "init"
) -> str:
    """Why no policy changes a dtype from `src` to `dst` when a typed PRNG key is involved, and
    what to do instead. `in_loop`: `src` is the input of the loop function `fn`, `dst` its output
    (else `src` is the tree's dtype and `dst` the target's, as in `upcast`)."""
    src_key, dst_key = _is_key(src), _is_key(dst)
    if src_key and dst_key:
        what = "converts between PRNG key implementations"
        if in_loop:
            todo = (
                f'start from {dst} keys (`jax.random.key(seed, impl="{dst_impl}")`), or make `{fn}` return {src} keys.'
            )
        else:
            todo = f'make these keys with `jax.random.key(seed, impl="{dst_impl}")`, or expect {src} keys here.'
    elif src_key:
        what = "turns a typed PRNG key into another dtype"
        if in_loop:
            todo = (
                f"make `{fn}` return {src} keys here (rewrap raw key data inside `{fn}` with "
                f'`jax.random.wrap_key_data(data, impl="{src_impl}")`), or carry the raw data '
                f"throughout (`jax.random.key_data(key)` in `{init}`, rewrapped inside `{fn}`)."
            )
        else:
            todo = (
                "take the raw key data explicitly with `jax.random.key_data(...)` (a trailing axis more), "
                f"or expect {src} keys here."
            )
    else:
        what = "turns another dtype into a typed PRNG key"
        if in_loop:
            todo = (
                f'start from {dst} keys (`jax.random.wrap_key_data(data, impl="{dst_impl}")` for raw key '
                f"data), or make `{fn}` return raw key data with `jax.random.key_data(...)`."
            )
        else:
            todo = (
                f'wrap raw key data explicitly with `jax.random.wrap_key_data(data, impl="{dst_impl}")`, '
                f'or make keys with `jax.random.key(seed, impl="{dst_impl}")`.'
            )
    return f'The dtypes differ, and no policy {what} (not even policy="cast"): {todo}'


# -- 64-bit dtypes with x64 off ------------------------------------------------
# -- a loop carry's sharding --------------------------------------------------------------
def carry_sharding_fix(history: Sequence[str], fn: str = "body") -> str:
    """A carry leaf whose sharding keeps changing from one evaluation of `fn` to the next."""
    return (
        f"`{fn}` changes this leaf's sharding on every pass ({' -> '.join(history)}), so no sharding is a "
        f"fixed point (explicit mesh axes are part of a carry's type). Give it one sharding at the end of "
        f"`{fn}`: `jax.sharding.reshard(x, P(...))`."
    )


def check_path_leaf_callback(fn: Callable[..., Any], who: str, returns: str) -> None:
    """Refuse, before calling it, a user callback that cannot be called as `fn(path, leaf)`
    (a TypeError from inside a callback that can be is the user's own, and propagates)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: it tells for itself
        return
    try:
        signature.bind("['w']", None)
    except TypeError:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"treeshape.{who}: the callable {name}{signature} is called as `fn(path, leaf)`, with `path` the "
            f"leaf's keystr path (`\"['w']\"`, as in `s.paths`) and `leaf` its `jax.ShapeDtypeStruct`, and returns "
            f"{returns}; it cannot take those two arguments. Write it as `lambda path, leaf: ...`."
        ) from None


def user_value(x: Any, typed: str | None = None) -> str:
    """A user's value as they wrote it (`0.5`, `'a'`), with how JAX types it where that helps;
    a tracer by its type alone."""
    if isinstance(x, jax.core.Tracer):
        return f"a traced {typed}" if typed else "a tracer"
    text = clip(repr(x), 60)
    return f"{text} ({typed})" if typed else text


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {
    "Mismatch": Mismatch,
    "StructureMismatchError": StructureMismatchError,
    "CarryMismatchError": CarryMismatchError,
    "PrecisionWarning": PrecisionWarning,
}
