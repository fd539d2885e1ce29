"""`treeshape targets`: the accelerators that `cost` and `fit` compile for with `--target NAME`."""

import argparse
from typing import Any, TextIO


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    targets = sub.add_parser(
        "targets",
        help="list the accelerators that cost and fit compile for with --target NAME",
        description="List the accelerators that `treeshape cost ... --target NAME` and\n"
        "`treeshape fit ... --target NAME` compile for, without one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return targets  # type: ignore[no-any-return]


def run(stdout: TextIO) -> int:
    from .._cost import targets

    listed = targets()
    width = max(len(name) for name in listed)
    for name, description in listed.items():
        print(f"{name:<{width}}  {description}", file=stdout)
    return 0
