"""The command's parser: `build_parser`, its subcommands, options and help texts (the
description, the specs' language and examples, the exit statuses), with usage errors
raised as one-line failures and options and specs taken in any order."""

import argparse
from collections.abc import Sequence
from typing import Any, Final, NoReturn

from . import _cost, _demo, _fit, _inspect, _plan, _residuals, _restore, _targets
from ._arguments import SPECS
from ._fail import Fail


PROG: Final = "treeshape"

_DESCRIPTION: Final = """\
Pytree shape inference for JAX, from the command line.

  treeshape demo                    the built-in example (offline, seconds)
  treeshape inspect MODULE:ATTR ... the output structure of a function
  treeshape cost MODULE:ATTR ...    what its compiled program needs (FLOPs, bytes)
  treeshape fit MODULE:ATTR ... --dim b --budget 16GiB
                                    the largest size of dimension b that fits
  treeshape plan MODULE:MAKE --choice remat=none,full --target v5e
                                    the fastest combination and size that fit
  treeshape residuals MODULE:FN ... what differentiating a loss saves for backward
  treeshape targets                 the accelerators cost/fit --target NAME compile for
  treeshape restore-plan CKPT MODULE:ATTR
                                    what restoring a checkpoint into it would do
"""


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line, like every other error."""

    def error(self, message: str) -> NoReturn:
        raise Fail(f"{message} (see '{self.prog} --help')", 2)


class _SubParser(_Parser):
    """A subcommand parser that lets options and specs come in any order."""

    _intermixed = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixed:  # the inner calls of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        self._intermixed = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False


def build_parser() -> _Parser:
    traceback_help = "on error, also print the Python traceback"
    parser = _Parser(
        prog=PROG,
        description=_DESCRIPTION,
        epilog=SPECS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--traceback", action="store_true", help=traceback_help)
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(_ROOMS) + "}", required=True,
                                parser_class=_SubParser)  # fmt: skip
    for room in _ROOMS.values():
        # Accepted after the subcommand too; SUPPRESS keeps the main parser's value.
        room.declare(sub).add_argument(
            "--traceback", action="store_true", default=argparse.SUPPRESS, help=traceback_help
        )
    return parser


# Each subcommand's room, in the order `--help` lists them: it declares its own parser.
_ROOMS: Final = {
    "demo": _demo,
    "inspect": _inspect,
    "cost": _cost,
    "fit": _fit,
    "plan": _plan,
    "residuals": _residuals,
    "targets": _targets,
    "restore-plan": _restore,
}


def _version() -> str:
    from .. import __version__

    return str(__version__)
