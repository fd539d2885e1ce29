"""The command line's argument language: `f32[8,784]`, `bf16[]`, `0.5`, `True`.

A spec is parsed, never evaluated: array specs by a regular expression and a
dtype table, literals by `ast.literal_eval` (which builds constants and
containers only, and runs no code).
"""

import ast
import re
from typing import Any, Final

import jax
import jax.numpy as jnp


SPEC_EXAMPLE: Final = "f32[8,784]"

# Short name prefixes, as `treeshape` prints dtypes (`f32`, `bf16`, `u8`).
_SHORT: Final = (
    ("bf", "bfloat"),
    ("f", "float"),
    ("i", "int"),
    ("u", "uint"),
    ("c", "complex"),
)
_ARRAY: Final = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\[(.*)\]\s*")
_LOOKS_LIKE_ARRAY: Final = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*\[")
_DIM: Final = re.compile(r"\s*[0-9]+\s*")
# Longer literals are refused: `literal_eval` of huge input can exhaust the stack.
_MAX_LITERAL: Final = 10_000


class SpecError(ValueError):
    """A command-line spec cannot be parsed; the message is one line."""


def _quoted(spec: str) -> str:
    text = repr(spec)
    return text if len(text) <= 60 else text[:56] + "...'"


def _dtype(name: str, spec: str) -> Any:
    long = name
    for short, full in _SHORT:
        rest = name[len(short) :]
        if name.startswith(short) and rest[:1].isdigit():
            long = full + rest
            break
    try:
        dtype = jnp.dtype(long)
    except TypeError:
        dtype = None
    # `jnp.dtype` also accepts codes and aliases ("f", "d", "float"): only
    # canonical names (and their short forms) are part of the language.
    if dtype is None or dtype.name != long:
        raise SpecError(
            f"unknown dtype {name!r} in spec {_quoted(spec)}: use a short name such as "
            "f32, bf16, i32, u8, bool, c64, or a NumPy name such as float32"
        )
    return dtype


def _array(name: str, dims: str, spec: str) -> jax.ShapeDtypeStruct:
    dtype = _dtype(name, spec)
    if dims.strip() == "":
        shape: tuple[int, ...] = ()
    else:
        parts = dims.split(",")
        if not all(_DIM.fullmatch(p) for p in parts):
            raise SpecError(
                f"malformed spec {_quoted(spec)}: dimensions must be non-negative "
                f"integers separated by commas, e.g. {SPEC_EXAMPLE}"
            )
        shape = tuple(int(p) for p in parts)
    return jax.ShapeDtypeStruct(shape, dtype)


def parse_spec(spec: str) -> Any:
    """Parse one command-line argument spec into an abstract argument.

    `DTYPE[DIMS]` becomes a `jax.ShapeDtypeStruct`: `DTYPE` is a short name
    (`f32`, `bf16`, `i32`, `u8`, `bool`, `c64`, ...) or a NumPy name
    (`float32`), and `DIMS` is a comma-separated list of sizes, empty for a
    scalar. Anything else must be a Python literal (`0.5`, `3`, `True`,
    `'relu'`, `(1, 2)`), returned as the value itself, so that `out_structure`
    types it as JAX does (`0.5` and `3` weak, `True` strong). Nothing is
    evaluated as code.

    Args:
        spec: The text of one argument.

    Returns:
        A `jax.ShapeDtypeStruct` or the literal's value.

    Raises:
        SpecError: `spec` is neither form; the message is one line.

    Examples:
        >>> from treeshape._spec import parse_spec
        >>> parse_spec("f32[8,784]")
        ShapeDtypeStruct(shape=(8, 784), dtype=float32)
        >>> parse_spec("bf16[]")
        ShapeDtypeStruct(shape=(), dtype=bfloat16)
        >>> parse_spec("0.5"), parse_spec("True")
        (0.5, True)
        >>> try:
        ...     parse_spec("f32[8,")
        ... except ValueError as err:
        ...     print(err)
        malformed spec 'f32[8,': expected DTYPE[DIMS], e.g. f32[8,784]
    """
    match = _ARRAY.fullmatch(spec)
    if match is not None:
        return _array(match.group(1), match.group(2), spec)
    if _LOOKS_LIKE_ARRAY.match(spec):
        raise SpecError(f"malformed spec {_quoted(spec)}: expected DTYPE[DIMS], e.g. {SPEC_EXAMPLE}")
    if len(spec) <= _MAX_LITERAL:
        try:
            return ast.literal_eval(spec.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    raise SpecError(
        f"malformed spec {_quoted(spec)}: expected DTYPE[DIMS] (e.g. {SPEC_EXAMPLE}) "
        "or a Python literal (e.g. 0.5, 3, True)"
    )


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
