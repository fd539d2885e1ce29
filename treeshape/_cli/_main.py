"""`main`: the command line run, from its arguments to its exit status; the subcommand's
room called, and every failure printed as one line (`--traceback` adds the traceback)."""

import sys
import traceback
from collections.abc import Sequence

from . import _cost, _demo, _fit, _inspect, _plan, _residuals, _restore, _targets
from ._fail import Fail, one_line, printable
from ._parser import PROG, build_parser
from ._start import start_for_targets, start_jax


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `treeshape` command line and return its exit status.

    Args:
        argv: The arguments after the program name (default: `sys.argv[1:]`).

    Returns:
        0 on success, 2 for bad command-line input (usage, a malformed spec,
        an unknown module or attribute), 1 when the inspected module or
        function raises.

    Examples:
        >>> from treeshape._cli import main
        >>> main(["inspect", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]"])
        path    shape   dtype  bytes
        ------  ------  -----  -----
        (root)  [8,10]  f32    320 B
        ------  ------  -----  -----
        total: 1 leaf, 80 elements  320 B
        0
    """
    args = None
    start_for_targets(argv)
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exit_:  # --help and --version
            return exit_.code if isinstance(exit_.code, int) else 0
        start_jax()
        try:
            if args.command == "demo":
                return _demo.run(sys.stdout)
            if args.command == "cost":
                return _cost.run(args, sys.stdout)
            if args.command == "fit":
                return _fit.run(args, sys.stdout)
            if args.command == "plan":
                return _plan.run(args, sys.stdout)
            if args.command == "residuals":
                return _residuals.run(args, sys.stdout)
            if args.command == "restore-plan":
                return _restore.run(args, sys.stdout)
            if args.command == "targets":
                return _targets.run(sys.stdout)
            return _inspect.run(args, sys.stdout)
        except Fail:
            raise
        except Exception as err:  # a bug of treeshape's own: still one line
            raise Fail(f"unexpected error: {one_line(err)}", 1) from err
    except Fail as err:
        if getattr(args, "traceback", False) and err.__cause__ is not None:
            traceback.print_exception(err.__cause__, file=sys.stderr)
        elif err.status == 1:
            err.args = (f"{err} (rerun with --traceback to see where)",)
        print(f"{PROG}: error: {printable(str(err))}", file=sys.stderr)
        return err.status
