"""`treeshape residuals`: the values that differentiating the loss `MODULE:FN` on the specs
saves for its backward pass (`ts.residuals`), as its table or as JSON records."""

import argparse
import json
from typing import Any, TextIO

from ._arguments import call_parser
from ._common import call_target, json_data


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    residuals = call_parser(
        sub,
        "residuals",
        "print what differentiating the loss MODULE:FN saves for its backward pass",
        "Import MODULE, take FN (dotted attributes allowed), a loss returning\n"
        "one floating-point scalar, and print the values that differentiating\n"
        "it on the given abstract arguments saves from its forward pass for\n"
        "its backward pass, largest first: name, source line, shape, dtype,\n"
        "kind and memory kind. One trace: nothing runs, nothing compiles.",
        "mypkg.model:loss",
    )
    residuals.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {name, source, shape, dtype, nbytes, memory_kind, kind} instead of a table",
    )
    return residuals


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    from .. import residuals

    found = call_target(args, residuals)
    if args.json:
        entries = [json.dumps(json_data(value)) for value in found]
        print("[\n  " + ",\n  ".join(entries) + "\n]" if entries else "[]", file=stdout)
    else:
        print(str(found), file=stdout)
    return 0
