"""What the subcommands that call `MODULE:ATTR` share: the module imported and the attribute
resolved (`resolve`), the specs parsed into the function's arguments (`arguments`, `@FILE`
Structures loaded, `spec_leaves`), the function called on them (`call_target`), `--target
NAME` checked (`checked_target`), and a result printed as its table or as JSON
(`print_result`, `json_data`)."""

import argparse
import decimal
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

from ._fail import USER_ERRORS, Fail, one_line


_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _import(module_name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does: find modules in the working dir
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            where = "looked in the current directory and sys.path"
            raise Fail(f"no module named {missing!r} ({where})", 2) from err
        raise Fail(f"importing {module_name!r} failed: {one_line(err)}", 1) from err
    except USER_ERRORS as err:
        raise Fail(f"importing {module_name!r} failed: {one_line(err)}", 1) from err


def resolve(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not (sep and _NAME.fullmatch(module_name) and _NAME.fullmatch(attr)):
        example = "mypkg.model:predict"
        raise Fail(f"expected MODULE:ATTR such as {example}, got {target!r}", 2)
    obj = _import(module_name)
    done = module_name
    for name in attr.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError as err:
            raise Fail(f"{done!r} has no attribute {name!r}", 2) from err
        except USER_ERRORS as err:
            raise Fail(f"reading {target!r} failed: {one_line(err)}", 1) from err
        done += (":" if done == module_name else ".") + name
    if not callable(obj):
        raise Fail(f"{target!r} is a {type(obj).__name__}, not a callable", 2)
    return obj  # type: ignore[no-any-return]


def arguments(specs: Sequence[str], target: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    from .._spec import Names, SpecError, parse_spec, split_kwarg

    if target is not None and any(split_kwarg(text)[1].startswith("@") for text in specs):
        resolve(target)  # a Structure's JSON names classes of the modules that MODULE imports

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    names = Names()  # one symbolic scope for the command: every spec's `b` is the same
    for text in specs:
        name, spec = split_kwarg(text)
        try:
            value = _load_structure(spec[1:]) if spec.startswith("@") else parse_spec(spec, names)
        except SpecError as err:
            raise Fail(str(err), 2) from err
        if name is None:
            if kwargs:
                raise Fail(f"positional spec {text!r} after a keyword spec", 2)
            args.append(value)
        elif name in kwargs:
            raise Fail(f"keyword {name!r} given twice", 2)
        else:
            kwargs[name] = value
    return args, kwargs


def _load_structure(path: str) -> Any:
    """The Structure written with `Structure.to_json` (`@state.json`): shapes, dtypes and
    shardings, also over an abstract mesh of any size; passed to the command's function as
    the tree it describes."""
    from .._spec import SpecError

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as err:
        raise SpecError(f"cannot read {path!r} for @{path}: {err.strerror or err}") from None
    try:
        from .._structure import Structure

        return Structure.from_json(text)
    except ValueError as err:
        raise SpecError(f"@{path} is not a Structure's JSON (Structure.to_json): {one_line(err)}") from None


def spec_leaves(value: Any) -> list[Any]:
    """The abstract arrays of one parsed argument: a spec's, or an `@FILE` Structure's."""
    import jax

    from .._spec import abstract_leaves
    from .._structure import Structure

    if isinstance(value, Structure):
        return [leaf for leaf in value.leaves if isinstance(leaf, jax.ShapeDtypeStruct)]
    return abstract_leaves(value)


def _bind(
    fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    """What to pass to `out_structure`: `fn` and its arguments, or, when some are literals, a
    function of the abstract arguments alone that passes the literals to `fn` as Python values
    (`out_structure` would trace a Python number, as `jax.eval_shape` does)."""
    from .._spec import abstract_leaves, is_abstract, put_back
    from .._structure import Structure

    values = [*args, *kwargs.values()]
    if all(isinstance(value, Structure) or is_abstract(value) for value in values):
        return fn, args, kwargs

    def call(*leaves: Any) -> Any:
        it = iter(leaves)
        filled = [next(it) if isinstance(value, Structure) else put_back(value, it) for value in values]
        return fn(*filled[: len(args)], **dict(zip(kwargs, filled[len(args) :], strict=True)))

    call.__wrapped__ = fn  # type: ignore[attr-defined]  # JAX's messages name `fn`, not `call`
    abstract = [[value] if isinstance(value, Structure) else abstract_leaves(value) for value in values]
    return call, [leaf for leaves in abstract for leaf in leaves], {}


def call_target(args: argparse.Namespace, how: Callable[..., Any]) -> Any:
    """`how(fn, *specs)` for the command's `MODULE:ATTR` and specs: what `inspect` and `cost` share."""
    if args.target is None:
        raise Fail("the following arguments are required: MODULE:ATTR", 2)
    from .._cost import CountError, TopologyError

    positional, keywords = arguments(args.specs, args.target)
    fn, positional, keywords = _bind(resolve(args.target), positional, keywords)
    try:
        return how(fn, *positional, **keywords)
    except (TopologyError, CountError) as err:
        raise Fail(target_problem(err), 2) from err
    except USER_ERRORS as err:
        raise Fail(f"calling {args.target} failed: {one_line(err)}", 1) from err


def target_problem(err: Exception) -> str:
    """A `--target` the inputs' devices cannot be laid out on (a malformed or impossible TPU
    topology, a count the target cannot form), as the command says it: bad input, exit 2."""
    text = one_line(err).removeprefix(f"{type(err).__name__}: ")
    return "--target: " + re.sub(r"^treeshape\.[a-z_]+: ", "", text)


def checked_target(name: str | None, who: str) -> str | None:
    """`--target NAME` checked before anything is imported or compiled: bad input is exit 2."""
    if name is None:
        return None
    from .._compat import JaxReleaseError
    from .._cost import check_target

    try:
        return check_target(name, who)
    except (ValueError, TypeError, ImportError, JaxReleaseError) as err:
        raise Fail(f"--target: {str(err).removeprefix(f'treeshape.{who}: ')}", 2) from err


def print_result(result: Any, as_json: bool, stdout: TextIO) -> None:
    """`result` (a `Fit`) as its table, or as one JSON object of its fields."""
    print(json.dumps(json_data(result)) if as_json else str(result), file=stdout)


def json_data(value: Any) -> Any:
    """`value` as JSON data: a dataclass as an object of its fields by name (recursively,
    so that fields added later appear by themselves), tuples and lists as arrays, numbers,
    strings, booleans and `None` as they are; a float that JSON cannot hold (nan, inf) and
    anything else as its `str`."""
    import dataclasses
    import math
    import numbers

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A field neither compared nor shown (a Cost's timeline: `--timeline` adds it) is left
        # out, unless it asks to be written (`metadata={"json": True}`: a Cost's time).
        shown = [f for f in dataclasses.fields(value) if f.repr or f.compare or f.metadata.get("json")]
        return {field.name: json_data(getattr(value, field.name)) for field in shown}
    if isinstance(value, (list, tuple)):
        return [json_data(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_data(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else str(value)
    return str(value)


# -- amounts of bytes (--budget) ---------------------------------------------------------
UNITS: Final = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_AMOUNT: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_bytes(text: str) -> int:
    """A number of bytes written as `17179869184`, `16GiB`, `1.5 GiB` or `16GB` (units
    B, KiB, MiB, GiB, TiB, and KB, MB, GB, TB in powers of 1000; any case), rounded down.

    Raises:
        ValueError: `text` is none of these, or less than one byte.
    """
    match = _AMOUNT.fullmatch(text)
    unit = match and UNITS.get(match[2].lower() or "b")
    if not match or unit is None:
        raise ValueError(
            f"malformed amount of bytes {text!r}: expected a number of bytes, or a number and a unit (B, KiB, "
            "MiB, GiB, TiB, KB, MB, GB, TB), e.g. 16GiB"
        )
    amount = int(decimal.Decimal(match[1]) * unit)
    if amount < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return amount
