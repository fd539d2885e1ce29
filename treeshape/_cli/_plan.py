"""`treeshape plan`: the fastest combination of `--choice` values, and its size of `--dim`,
for which the step `MODULE:MAKE` builds fits `--target`, as `ts.Plan`'s table or JSON; each
choice's values read as Python values (`8`, `8x1` a tuple, `0.5`, else a string)."""

import argparse
import json
import re
import sys
from typing import Any, Final, TextIO

from ._common import checked_target, json_data, parse_bytes, resolve, target_problem
from ._fail import USER_ERRORS, Fail, one_line, printable


_TUPLE: Final = re.compile(r"\d+(x\d+)+")


def choice_value(text: str) -> Any:
    """A `--choice` value as Python: `8` an int, `8x1` a tuple of ints, `0.5` a float,
    anything else the string itself."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if _TUPLE.fullmatch(text):
        return tuple(int(part) for part in text.split("x"))
    try:
        return float(text)
    except ValueError:
        return text


def choices(given: list[str]) -> dict[str, list[Any]]:
    """`--choice NAME=V1,V2` options as `ts.plan`'s `choices`; bad input is exit 2."""
    out: dict[str, list[Any]] = {}
    for text in given:
        name, eq, values = text.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier() or not values.strip():
            raise Fail(f"--choice {text!r}: expected NAME=V1,V2,... (a keyword of MAKE and its values), e.g. "
                       "remat=none,dots,full", 2)  # fmt: skip
        if name in out:
            raise Fail(f"--choice {name} is given twice: give its values once, comma-separated", 2)
        out[name] = [choice_value(v.strip()) for v in values.split(",") if v.strip()]
    return out


def _combination(err: BaseException) -> str:
    """`, raised by make(remat=dots)`: the combination `ts.plan` names in its note on an
    error of MAKE or of a combination's step, as the command line gave it; else `""`."""
    notes = getattr(err, "__notes__", None)
    for note in notes if isinstance(notes, list) else ():
        if isinstance(note, str) and note.startswith(_NOTE):
            return f", {printable(note.removeprefix(_NOTE))}"
    return ""


_NOTE: Final = "treeshape.plan: "  # how `ts.plan` begins the note that names a combination


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    plan = sub.add_parser(
        "plan",
        help="print the fastest combination of choices and size for which MODULE:MAKE's step fits a target",
        description="Import MODULE, take MAKE (dotted attributes allowed): called with one\n"
        "keyword per --choice, it returns (step, *args) with the symbolic\n"
        "dimension --dim in the args. Every combination is compiled by the\n"
        "target's own compiler at the sizes the largest fit takes, and ranked\n"
        "by throughput (size per second of a step).",
        epilog="A choice's values are read as Python values: 8 is an int, 8x1 a tuple\n(8, 1), 0.5 a float, "
        "anything else a string (none, dots, full).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("target", metavar="MODULE:MAKE", help="e.g. mypkg.train:make_step")
    plan.add_argument(
        "--choice",
        action="append",
        required=True,
        metavar="NAME=V1,V2,...",
        help="a choice and the values to try, e.g. remat=none,dots,full (repeat for more choices)",
    )
    plan.add_argument("--dim", default="b", metavar="NAME", help="the symbolic dimension to size (default b)")
    plan.add_argument(
        "--target",
        dest="target_name",
        required=True,
        metavar="NAME",
        help="the accelerator (v5e, v5e:2x4, h100, ...: see treeshape targets)",
    )
    plan.add_argument("--budget", metavar="BYTES", help="the memory of one device (default: what JAX lets XLA use)")
    plan.add_argument("--max-size", type=int, default=None, metavar="N", help="the largest size to try")
    plan.add_argument("--donate", type=int, action="append", default=[], metavar="I", help="donate argument I")
    plan.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        metavar="S",
        help="the longest a step may take, in seconds (a latency bound): each row's size the fastest within it",
    )
    plan.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print a line per combination and per compile to stderr (default: when stderr is a terminal)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object of the ts.Plan instead of a table")
    return plan  # type: ignore[no-any-return]


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    from .. import plan
    from .._cost import CountError, TopologyError

    asked = choices(args.choice)
    try:
        budget = None if args.budget is None else parse_bytes(args.budget)
    except ValueError as err:
        raise Fail(f"--budget: {err}", 2) from err
    if args.max_size is not None and args.max_size < 1:
        raise Fail(f"--max-size must be >= 1, got {args.max_size}", 2)
    if args.max_seconds is not None and not 0 < args.max_seconds < float("inf"):
        said = f"--max-seconds must be a positive number of seconds (e.g. 0.02 for 20 ms), got {args.max_seconds}"
        raise Fail(said, 2)
    target = checked_target(args.target_name, "plan")
    make = resolve(args.target)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        result = plan(
            make,
            asked,
            dim=args.dim,
            target=target,
            budget=budget,
            donate_argnums=tuple(args.donate),
            max_size=args.max_size,
            progress=progress,
            max_seconds=args.max_seconds,
        )
    except (TopologyError, CountError) as err:
        raise Fail(target_problem(err), 2) from err
    except USER_ERRORS as err:
        raise Fail(f"planning {args.target} failed{_combination(err)}: {one_line(err)}", 1) from err
    if args.json:
        rows = [{**json_data(row), "fit": None if row.fit is None else json_data(row.fit)} for row in result.rows]
        data = {"dim": result.dim, "compiles": result.compiles, "max_seconds": result.max_seconds, "rows": rows}
        print(json.dumps(data), file=stdout)
    else:
        print(result, file=stdout)
    return 0
