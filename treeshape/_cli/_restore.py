"""`treeshape restore-plan`: what restoring an orbax checkpoint into the state `MODULE:ATTR`
builds would do, leaf by leaf, as a table or JSON (exit status 1 when the plan refuses a leaf)."""

import argparse
import json
from typing import Any, TextIO

from ._common import resolve
from ._fail import USER_ERRORS, Fail, one_line


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    restore = sub.add_parser(
        "restore-plan",
        help="print what restoring an orbax CHECKPOINT into MODULE:ATTR's state would do, leaf by leaf",
        description="Read the checkpoint's metadata (no array) and say the fate of every\n"
        "leaf of the state MODULE:ATTR builds (called with no arguments,\n"
        "abstractly): exit status 0 when the plan is ok, 1 when it refuses a leaf.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    restore.add_argument("checkpoint", metavar="CHECKPOINT", help="an orbax checkpoint's directory")
    restore.add_argument("target", metavar="MODULE:ATTR", help="e.g. mypkg.model:init_state")
    restore.add_argument("--json", action="store_true", help='print {"ok": ..., "entries": [...]} instead of a table')
    return restore  # type: ignore[no-any-return]


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    from .._restore import abstract_target, plan_data, restore_plan

    try:
        target = abstract_target(resolve(args.target))
    except Fail as err:
        raise Fail(str(err), 2) from err.__cause__
    except USER_ERRORS as err:
        raise Fail(f"building the target {args.target} failed: {one_line(err)}", 2) from err
    try:
        plan = restore_plan(args.checkpoint, target)
    except (ValueError, TypeError, ImportError) as err:  # the checkpoint or the target cannot be read
        raise Fail(str(err).removeprefix("treeshape.restore_plan: "), 2) from err
    print(json.dumps(plan_data(plan), indent=1) if args.json else str(plan), file=stdout)
    return 0 if plan.ok else 1
