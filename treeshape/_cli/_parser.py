"""The command's parser: `build_parser`, its subcommands, options and help texts (the
description, the specs' language and examples, the exit statuses), with usage errors
raised as one-line failures and options and specs taken in any order."""

import argparse
from collections.abc import Sequence
from typing import Any, Final, NoReturn

from ._fail import Fail


PROG: Final = "treeshape"

_DESCRIPTION: Final = """\
Pytree shape inference for JAX, from the command line.

  treeshape demo                    the built-in example (offline, seconds)
  treeshape inspect MODULE:ATTR ... the output structure of a function
  treeshape cost MODULE:ATTR ...    what its compiled program needs (FLOPs, bytes)
  treeshape fit MODULE:ATTR ... --dim b --budget 16GiB
                                    the largest size of dimension b that fits
  treeshape targets                 the accelerators cost/fit --target NAME compile for
  treeshape restore-plan CKPT MODULE:ATTR
                                    what restoring a checkpoint into it would do
"""

_SPECS: Final = """\
specs:
  Each argument after MODULE:ATTR is one argument of the function,
  positional (SPEC) or keyword (NAME=SPEC). A SPEC is parsed, never run:

    DTYPE[DIMS]   an abstract array: a jax.ShapeDtypeStruct, no memory is
                  allocated. f32[8,784]  bf16[]  i32[3]  u8[2,2]  bool[4]
                  DTYPE is a short name (f16 f32 f64 bf16 i8 i16 i32 i64
                  u8 u16 u32 u64 c64 c128 bool) or a NumPy name (float32,
                  float8_e4m3fn, ...); DIMS are sizes, [] for a scalar.
    ~DTYPE[DIMS]  the same, weakly typed: ~f32[] is a traced Python float,
                  ~i32[] a traced Python int.
    key<IMPL>[DIMS]
                  typed PRNG keys: key<fry>[2], key<rbg>[], key<unsafe_rbg>[3]
    (SPEC,...)    a tuple (or [SPEC,...] a list) of specs, nested as deep as
                  needed: (f32[2],i32[]) is one argument, a pair.
    LITERAL       a Python literal, passed to the function as the Python
                  value itself (concrete): 0, 0.5, True, 'relu', (1, 2),
                  None. For an abstract scalar, use f32[] or ~f32[].
    @FILE         the tree of a Structure saved with Structure.to_json:
                  shapes, dtypes and shardings, also over an AbstractMesh
                  larger than this machine (compiled for simulated devices).

  64-bit dtypes need JAX_ENABLE_X64=1, as everywhere in JAX: without it, a
  64-bit spec is an error. MODULE is imported from the current directory or
  sys.path; ATTR may be dotted (Model.apply). Quote specs with brackets,
  parentheses, < > or spaces in your shell.

examples:
  treeshape inspect mypkg.model:predict 'f32[8,784]'
  treeshape inspect mypkg.model:init_state 'bf16[1024,1024]' step=0
  treeshape inspect jax.nn:softmax 'f32[4,10]' axis=0
  treeshape inspect jax.numpy:matmul 'f32[8,784]' 'f32[784,10]' --json
  treeshape inspect mypkg.model:init_params 'key<fry>[]' --depth 1
  treeshape cost jax.numpy:matmul 'f32[8,784]' 'f32[784,10]'
  treeshape fit jax.numpy:matmul 'f32[b,784]' 'f32[784,10]' --dim b --budget 1MiB

output: a table (the first and last 25 rows of a tree of more than 50
leaves, and an exact total), with --depth N one row per path prefix of N
keys (leaves, parameters, bytes), or with --json every leaf as JSON; for cost,
the table of ts.Cost (FLOPs, bytes accessed, and per device the bytes of
arguments, outputs, temporaries, aliased buffers and the peak); for fit,
the table of ts.Fit (the size, the peak there, the budget, the probes' line
and the number of programs compiled), with progress on stderr when it is a
terminal (--progress, --no-progress). For cost and fit, --json prints one
JSON object of the ts.Cost or ts.Fit fields instead. cost --timeline adds
the bytes live over the program's schedule, phase by phase (and "timeline"
to --json); cost --plot FILE draws them (.svg, .png, .pdf; needs matplotlib:
pip install "treeshape[plot]").

exit status: 0 on success, 2 for bad command-line input (usage, specs,
unknown module or attribute, a spec larger than XLA counts in 63 bits,
symbolic dimensions in cost, a --plot FILE of another format or without
matplotlib, a budget nothing fits or a dimension out of range in fit), 1
when the module or the function raises (SystemExit included) or its output
cannot be shown.
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
        epilog=_SPECS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--traceback", action="store_true", help=traceback_help)
    sub = parser.add_subparsers(
        dest="command",
        metavar="{demo,inspect,cost,fit,plan,targets,restore-plan}",
        required=True,
        parser_class=_SubParser,
    )
    demo = sub.add_parser(
        "demo",
        help="run the built-in example: a small model's structures, carry and training",
        description="Infer a small MLP's parameter and optimizer-state structures,\n"
        "build the scan carry, train it for a few scan steps and print the\n"
        "cache figures. Offline, a few seconds, no arguments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect = _call_parser(
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
        type=_depth,
        metavar="N",
        help="one row per path prefix of N keys (memory by module): leaves, parameters, bytes",
    )
    cost = _call_parser(
        sub,
        "cost",
        "print what the compiled program of MODULE:ATTR needs on abstract arguments",
        "Import MODULE, take ATTR (dotted attributes allowed), compile it\n"
        "for the given abstract arguments (nothing runs, no input memory is\n"
        "allocated) and print XLA's figures: FLOPs, bytes accessed, and per\n"
        "device the bytes of arguments, outputs, temporaries and the peak.",
        "mypkg.model:train_step",
    )
    cost.add_argument(
        "--buffers",
        type=_depth,
        default=5,
        metavar="N",
        help="list the N largest buffers live at the peak under the figures (default 5; 0: none)",
    )
    cost.add_argument(
        "--timeline",
        action="store_true",
        help="print the bytes live over the program's schedule, phase by phase, after the table "
        '(with --json: add "timeline")',
    )
    cost.add_argument(
        "--time",
        action="store_true",
        help="print the ten largest kernels of the step's time after the table (with --target; "
        '--json always adds "time" there)',
    )
    cost.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the bytes live over the schedule into FILE (.svg, .png or .pdf); needs matplotlib: "
        'pip install "treeshape[plot]"',
    )
    fit = _call_parser(
        sub,
        "fit",
        "print the largest size of a dimension for which MODULE:ATTR's program fits a budget",
        "Import MODULE, take ATTR (dotted attributes allowed), and find the\n"
        "largest size of the symbolic dimension --dim (a name in the specs,\n"
        "f32[b,784]) for which its compiled program's peak bytes per device\n"
        "fit the budget: checked by compiling at that size and the next.",
        "mypkg.model:train_step",
    )
    fit.add_argument("--dim", required=True, metavar="NAME", help="the symbolic dimension to size, e.g. b")
    fit.add_argument(
        "--budget",
        metavar="BYTES",
        help="the memory of one device: bytes, or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, "
        "TB), e.g. 16GiB; default: the limit the device reports (none on CPU)",
    )
    fit.add_argument(
        "--margin", type=float, default=0.0, metavar="FRACTION", help="the fraction of the budget to keep free"
    )
    fit.add_argument("--max-size", type=int, default=2**20, metavar="N", help="the largest size to try")
    fit.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print a line per size compiled to stderr (default: when stderr is a terminal)",
    )
    for subparser, what in ((cost, "ts.Cost"), (fit, "ts.Fit")):
        subparser.add_argument(
            "--json", action="store_true", help=f"print one JSON object of the {what} fields instead of a table"
        )
        subparser.add_argument(
            "--target",
            dest="target_name",
            metavar="NAME",
            help="compile with that accelerator's own compiler, without one (h100, v5e, v5e:16x16, ...: "
            "see treeshape targets); fit's default budget is then the memory JAX lets XLA use there",
        )
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
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print a line per combination and per compile to stderr (default: when stderr is a terminal)",
    )
    plan.add_argument("--json", action="store_true", help="print one JSON object of the ts.Plan instead of a table")
    targets = sub.add_parser(
        "targets",
        help="list the accelerators that cost and fit compile for with --target NAME",
        description="List the accelerators that `treeshape cost ... --target NAME` and\n"
        "`treeshape fit ... --target NAME` compile for, without one.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    for subparser in (demo, inspect, cost, fit, plan, targets, restore):
        # Accepted after the subcommand too; SUPPRESS keeps the main parser's value.
        subparser.add_argument(
            "--traceback",
            action="store_true",
            default=argparse.SUPPRESS,
            help=traceback_help,
        )
    return parser


def _call_parser(sub: Any, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subcommand that calls MODULE:ATTR on specs (`inspect`, `cost`, `fit`)."""
    parser = sub.add_parser(
        name, help=summary, description=description, epilog=_SPECS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?", metavar="MODULE:ATTR", help=f"e.g. {example}")
    parser.add_argument("specs", nargs="*", metavar="SPEC | NAME=SPEC", help="the function's arguments")
    return parser  # type: ignore[no-any-return]


def _depth(text: str) -> int:
    """`--depth N`: an integer >= 0 (argparse reports anything else as a usage error)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def _version() -> str:
    from .. import __version__

    return str(__version__)
