"""`treeshape inspect`: the output structure of `MODULE:ATTR` on the specs, as a table, by
path prefix (`--depth N`) or as the JSON leaf records (`--json`)."""

import argparse
import json
from typing import Any, TextIO

from ._arguments import call_parser, depth
from ._common import call_target
from ._fail import USER_ERRORS, Fail, one_line


def _as_json(structure: Any) -> list[dict[str, Any]]:
    """The leaf records of `structure.to_json()` (its `"leaves"` array), built by the same code."""
    from .._json import leaf_records

    return leaf_records(structure.paths, structure.leaves)


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    inspect = call_parser(
        sub,
        "inspect",
        "print the output structure of MODULE:ATTR called on abstract arguments",
        "Import MODULE, take ATTR (dotted attributes allowed) and print\n"
        "the structure of its output for the given abstract arguments: no\n"
        "FLOPs, no device memory, no compilation.",
        "mypkg.model:predict",
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of {path, shape, dtype, weak_type} instead of a table",
    )
    inspect.add_argument(
        "--depth",
        type=depth,
        metavar="N",
        help="one row per path prefix of N keys (memory by module): leaves, parameters, bytes",
    )
    return inspect


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    from .. import describe, out_structure

    if args.json and args.depth is not None:
        raise Fail("--json prints every leaf and --depth groups them in a table: give one of the two", 2)
    structure = call_target(args, out_structure)
    try:  # static output leaves are the user's objects: their repr may raise
        if args.depth is not None:
            text = describe(structure, depth=args.depth)
        elif args.json:
            entries = [json.dumps(entry) for entry in _as_json(structure)]
            text = "[\n  " + ",\n  ".join(entries) + "\n]" if entries else "[]"
        else:
            text = str(structure)
        print(text, file=stdout)
    except USER_ERRORS as err:
        raise Fail(f"showing the output of {args.target} failed: {one_line(err)}", 1) from err
    return 0
