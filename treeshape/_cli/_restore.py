"""`treeshape restore-plan`: what restoring an orbax checkpoint into the state `MODULE:ATTR`
builds would do, leaf by leaf, as a table or JSON (exit status 1 when the plan refuses a leaf)."""

import argparse
import json
from typing import TextIO

from ._common import resolve
from ._fail import USER_ERRORS, Fail, one_line


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
