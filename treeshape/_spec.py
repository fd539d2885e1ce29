"""The command line's argument language: `f32[8,784]`, `~f32[]`, `key<fry>[2]`,
`(f32[2],i32[])`, `0.5`, `True`.

A spec is parsed, never evaluated: array and key specs by regular expressions
and a dtype table, tuples and lists of specs by a small bracket scanner, and
literals by `ast.literal_eval` (which builds constants and containers only,
and runs no code).
"""

import ast
import re
from collections.abc import Iterator
from typing import Any, Final

import jax
import jax.numpy as jnp

from . import _compat
from ._compat import JaxReleaseError
from ._dtypes import key_dtype, key_tags, long_dtype_name
from ._shapes import extent_problem


SPEC_EXAMPLE: Final = "f32[8,784]"

_ARRAY: Final = re.compile(r"\s*(~?)\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[(.*)\]\s*", re.DOTALL)
_KEY: Final = re.compile(r"\s*(~?)\s*key\s*<([^<>]*)>\s*\[(.*)\]\s*", re.DOTALL)
_LOOKS_LIKE_ARRAY: Final = re.compile(r"\s*~?\s*[A-Za-z_][A-Za-z0-9_]*\s*[\[<]")
_DIM: Final = re.compile(r"\s*[0-9]+\s*")
_MAX_DIM: Final = 2**63 - 1  # JAX's dimensions are int64 at most
# Longer literals are refused: `literal_eval` of huge input can exhaust the stack.
_MAX_LITERAL: Final = 10_000
# Tuples and lists of specs nest at most this deep (the scanner recurses).
MAX_DEPTH: Final = 100
_CLOSE: Final = {"(": ")", "[": "]", "{": "}"}


class SpecError(ValueError):
    """A command-line spec cannot be parsed; the message is one line."""


def _quoted(spec: str) -> str:
    text = repr(spec)
    return text if len(text) <= 60 else text[:56] + "...'"


def _dtype(name: str, spec: str) -> Any:
    long = long_dtype_name(name)
    try:
        dtype = jnp.dtype(long)
    except (TypeError, ValueError):
        dtype = None
    # `jnp.dtype` also accepts codes and aliases ("f", "d", "float"): only
    # canonical names (and their short forms) are part of the language.
    if dtype is None or dtype.name != long:
        raise SpecError(
            f"unknown dtype {_quoted(name)} in spec {_quoted(spec)}: use a short name such as "
            "f32, bf16, i32, u8, bool, c64, or a NumPy name such as float32"
        )
    return dtype


class Names:
    """The symbolic scope of one command's specs, made on first use: `f32[b,3] i32[b]` have
    one `b`. Each dimension is read by JAX's parser of dimension expressions, which builds
    expressions and evaluates nothing."""

    def __init__(self) -> None:
        self.scope: Any = None

    def dim(self, text: str, spec: str) -> Any:
        if self.scope is None:
            self.scope = _compat.make_scope()
        try:
            d = _compat.parse_dim(text, self.scope)
        except ValueError:
            raise SpecError(
                f"malformed spec {_quoted(spec)}: dimension {_quoted(text.strip())} is neither a size nor a "
                "dimension name or expression (b, 2*b, b + 1), e.g. f32[b,784]"
            ) from None
        if not _compat.is_symbolic(d) and d < 0:
            raise SpecError(f"malformed spec {_quoted(spec)}: dimension {_quoted(text.strip())} is negative")
        return d


def _split_dims(dims: str) -> list[str]:
    """`dims` split at its commas outside brackets (`floordiv(b, 2),3` is two dimensions)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(dims):
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(dims[start:i])
            start = i + 1
    return [*parts, dims[start:]]


def _shape(dims: str, spec: str, names: Names) -> tuple[Any, ...]:
    if dims.strip() == "":
        return ()
    shape: list[Any] = []
    for part in _split_dims(dims):
        if not _DIM.fullmatch(part):
            if not part.strip():
                raise SpecError(
                    f"malformed spec {_quoted(spec)}: dimensions must be sizes or names separated by commas, "
                    f"e.g. {SPEC_EXAMPLE} or f32[b,784]"
                )
            shape.append(names.dim(part, spec))
            continue
        digits = part.strip().lstrip("0") or "0"
        # Checked before `int()`, which refuses more than 4,300 digits with a ValueError.
        if len(digits) > len(str(_MAX_DIM)) or int(digits) > _MAX_DIM:
            shown = digits if len(digits) <= 20 else f"{digits[:10]}... ({len(digits):,} digits)"
            raise SpecError(f"malformed spec {_quoted(spec)}: dimension {shown} is too large (at most 2**63 - 1)")
        shape.append(int(digits))
    return tuple(shape)


def _check_size(shape: tuple[Any, ...], dtype: Any, spec: str) -> None:
    """Refuse an array XLA cannot count (it would abort the process when compiling it)."""
    least = [1 if _compat.is_symbolic(d) else d for d in shape]  # a symbolic size is at least 1
    problem = extent_problem(tuple(least), dtype)
    if problem is not None:
        at_least = " even at size 1" if len(least) and any(_compat.is_symbolic(d) for d in shape) else ""
        raise SpecError(f"spec {_quoted(spec)}{at_least} {problem} (XLA would abort on it): use smaller sizes")


def _check_64_bit(dtype: Any, spec: str) -> None:
    canonical = jax.dtypes.canonicalize_dtype(dtype)
    if canonical != dtype:
        raise SpecError(
            f"spec {_quoted(spec)} asks for {dtype.name}, but 64-bit types are off in JAX (it would silently "
            f"become {canonical.name}): set JAX_ENABLE_X64=1, or use a 32-bit dtype"
        )


def _array(weak: str, name: str, dims: str, spec: str, names: Names) -> jax.ShapeDtypeStruct:
    dtype = _dtype(name, spec)
    if weak and not jnp.issubdtype(dtype, jnp.number):
        raise SpecError(
            f"malformed spec {_quoted(spec)}: '~' (weak type) applies to numeric dtypes only, as in ~f32[] or ~i32[]"
        )
    shape = _shape(dims, spec, names)
    _check_64_bit(dtype, spec)
    _check_size(shape, dtype, spec)
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=bool(weak))


def _key(weak: str, name: str, dims: str, spec: str, names: Names) -> jax.ShapeDtypeStruct:
    if weak:
        raise SpecError(f"malformed spec {_quoted(spec)}: a PRNG key has no weak type, drop the '~'")
    try:  # abstractly: no key is made
        dtype = key_dtype(name.strip())
    except JaxReleaseError as err:
        raise SpecError(f"spec {_quoted(spec)}: {err}") from err
    except ValueError as err:
        tags = key_tags()
        raise SpecError(
            f"unknown PRNG implementation {_quoted(name)} in spec {_quoted(spec)}: use key<{tags[0]}> (JAX's "
            f"default), {', '.join(f'key<{tag}>' for tag in tags[1:])}, or an implementation's name "
            "(key<threefry2x32>)"
        ) from err
    shape = _shape(dims, spec, names)
    _check_size(shape, dtype, spec)
    return jax.ShapeDtypeStruct(shape, dtype)


def _single(spec: str, names: Names) -> Any:
    """An array spec, a key spec or a literal (no tuple or list holding specs)."""
    match = _KEY.fullmatch(spec)
    if match is not None:
        return _key(match.group(1), match.group(2), match.group(3), spec, names)
    match = _ARRAY.fullmatch(spec)
    if match is not None:
        return _array(match.group(1), match.group(2), match.group(3), spec, names)
    if _LOOKS_LIKE_ARRAY.match(spec):
        raise SpecError(f"malformed spec {_quoted(spec)}: expected DTYPE[DIMS], e.g. {SPEC_EXAMPLE}")
    if spec.lstrip().startswith("~"):
        raise SpecError(f"malformed spec {_quoted(spec)}: '~' marks a weak array spec, e.g. ~f32[]")
    if len(spec) <= _MAX_LITERAL:
        try:
            return ast.literal_eval(spec.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    raise SpecError(
        f"malformed spec {_quoted(spec)}: expected DTYPE[DIMS] (e.g. {SPEC_EXAMPLE}) "
        "or a Python literal (e.g. 0.5, 3, True)"
    )


# -- tuples and lists of specs: `(f32[2],i32[])`, `[bf16[3], (0.5, key<fry>[])]` ------------
def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _item_end(text: str, i: int) -> int:
    """Where the item starting at `i` ends: the next `,` or unmatched closing bracket outside
    brackets and quotes (so `f32[2,3]`, `'a,b'` and `{'k': (1, 2)}` are one item each)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "'\"":
            i += 1
            while i < len(text) and text[i] != c:
                i += 2 if text[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return len(text)


def _value(text: str, i: int, depth: int, spec: str, names: Names) -> tuple[Any, int]:
    """The value starting at `text[i]` and the index after it."""
    i = _skip_space(text, i)
    if i >= len(text) or text[i] not in "([":
        end = _item_end(text, i)
        item = text[i:end].strip()
        if not item:
            raise SpecError(f"malformed spec {_quoted(spec)}: an empty item at position {i}")
        try:
            return _single(item, names), end
        except SpecError as err:
            raise SpecError(f"{err} (an item of {_quoted(spec)})") from None
    if depth >= MAX_DEPTH:
        raise SpecError(f"malformed spec {_quoted(spec)}: tuples and lists nest more than {MAX_DEPTH} deep")
    close = _CLOSE[text[i]]
    items: list[Any] = []
    comma = False
    i += 1
    while True:
        i = _skip_space(text, i)
        if i < len(text) and text[i] == close:
            break
        item, i = _value(text, i, depth + 1, spec, names)
        items.append(item)
        i = _skip_space(text, i)
        comma = i < len(text) and text[i] == ","
        if comma:
            i += 1
        elif i >= len(text) or text[i] != close:
            found = f"{text[i]!r}" if i < len(text) else "the end"
            raise SpecError(f"malformed spec {_quoted(spec)}: expected ',' or {close!r}, found {found}")
    if close == ")":  # `(x)` is x, as in Python; `(x,)` and `()` are tuples
        return (items[0] if len(items) == 1 and not comma else tuple(items)), i + 1
    return items, i + 1


def _container(spec: str, names: Names) -> Any:
    value, end = _value(spec, 0, 0, spec, names)
    rest = spec[end:].strip()
    if rest:
        raise SpecError(f"malformed spec {_quoted(spec)}: unexpected {_quoted(rest)} after the closing bracket")
    return value


def parse_spec(spec: str, names: Names | None = None) -> Any:
    """Parse one command-line argument spec into an argument.

    `DTYPE[DIMS]` becomes a `jax.ShapeDtypeStruct` (an abstract argument):
    `DTYPE` is a short name (`f32`, `bf16`, `i32`, `u8`, `bool`, `c64`, ...)
    or a NumPy name (`float32`), and `DIMS` is a comma-separated list of
    sizes, empty for a scalar; a size may be a symbolic dimension, a name
    or an expression as `jax.export` writes it (`f32[b,784]`, `i32[2*b]`),
    read in the scope of `names` (one per command, so that every spec's `b`
    is the same). `~DTYPE[DIMS]` is weakly typed (`~f32[]` is
    how JAX types a traced Python float). `key<IMPL>[DIMS]` is an array of
    typed PRNG keys (`key<fry>[2]`, `key<rbg>[]`, `key<unsafe_rbg>[3]`). A
    tuple or list of specs (`(f32[2],i32[])`, nested as deep as needed) is a
    tuple or list of their values. Anything else must be a Python literal
    (`0`, `0.5`, `True`, `'relu'`, `(1, 2)`, `None`), returned as the value
    itself, to be passed to the function concretely. Nothing is evaluated as
    code, and a 64-bit dtype with JAX's 64-bit mode off is an error (JAX
    would silently make it 32-bit).

    Args:
        spec: The text of one argument.
        names: The symbolic scope of the command's specs (a new one if None).

    Returns:
        A `jax.ShapeDtypeStruct`, a literal's value, or a tuple or list of
        those.

    Raises:
        SpecError: `spec` is none of these forms; the message is one line.

    Examples:
        >>> from treeshape._spec import parse_spec
        >>> parse_spec("f32[8,784]")
        ShapeDtypeStruct(shape=(8, 784), dtype=float32)
        >>> parse_spec("~f32[]")
        ShapeDtypeStruct(shape=(), dtype=float32, weak_type=True)
        >>> parse_spec("key<fry>[2]")
        ShapeDtypeStruct(shape=(2,), dtype=key<fry>)
        >>> parse_spec("f32[b,784]")
        ShapeDtypeStruct(shape=(b, 784), dtype=float32)
        >>> parse_spec("(bf16[3], 0)")
        (ShapeDtypeStruct(shape=(3,), dtype=bfloat16), 0)
        >>> parse_spec("0.5"), parse_spec("True")
        (0.5, True)
        >>> try:
        ...     parse_spec("f32[8,")
        ... except ValueError as err:
        ...     print(err)
        malformed spec 'f32[8,': expected DTYPE[DIMS], e.g. f32[8,784]
    """
    names = Names() if names is None else names
    if not spec.lstrip().startswith(("(", "[")):
        return _single(spec, names)
    if len(spec) > _MAX_LITERAL:
        raise SpecError(f"malformed spec {_quoted(spec)}: longer than {_MAX_LITERAL:,} characters")
    try:  # a literal tuple or list, exactly as Python reads it
        return ast.literal_eval(spec.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _container(spec, names)


def abstract_leaves(value: Any, depth: int = 0) -> list[jax.ShapeDtypeStruct]:
    """The `jax.ShapeDtypeStruct`s in a parsed spec (inside its tuples and lists), in order.

    Examples:
        >>> from treeshape._spec import abstract_leaves, parse_spec
        >>> abstract_leaves(parse_spec("(f32[2], [0.5, i32[]])"))
        [ShapeDtypeStruct(shape=(2,), dtype=float32), ShapeDtypeStruct(shape=(), dtype=int32)]
    """
    if isinstance(value, jax.ShapeDtypeStruct):
        return [value]
    if type(value) not in (tuple, list) or depth > MAX_DEPTH:  # deeper holds literals only
        return []
    return [leaf for item in value for leaf in abstract_leaves(item, depth + 1)]


def is_abstract(value: Any, depth: int = 0) -> bool:
    """Whether a parsed spec holds no literal: `ShapeDtypeStruct`s in tuples and lists only."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return True
    if type(value) not in (tuple, list) or depth > MAX_DEPTH:
        return False
    return all(is_abstract(item, depth + 1) for item in value)


def put_back(value: Any, leaves: Iterator[Any], depth: int = 0) -> Any:
    """`value` with its `abstract_leaves` replaced, in order, by the items of `leaves`."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return next(leaves)
    if type(value) not in (tuple, list) or depth > MAX_DEPTH:
        return value
    return type(value)(put_back(item, leaves, depth + 1) for item in value)


def split_kwarg(arg: str) -> tuple[str | None, str]:
    """Split `NAME=SPEC` into `(NAME, SPEC)`; a positional spec gives `(None, arg)`.

    Examples:
        >>> from treeshape._spec import split_kwarg
        >>> split_kwarg("x=f32[3]"), split_kwarg("f32[3]"), split_kwarg("'a=b'")
        (('x', 'f32[3]'), (None, 'f32[3]'), (None, "'a=b'"))
    """
    name, sep, value = arg.partition("=")
    if sep and name.isidentifier():
        return name, value
    return None, arg
