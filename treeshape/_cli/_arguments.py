"""What the subcommands' parsers share: the specs' language and examples (`SPECS`), a
parser for a subcommand that calls `MODULE:ATTR` on specs (`call_parser`), `--json` and
`--target` as `cost` and `fit` take them, and the argument types (`depth`). Loads nothing
but argparse, so that `--help` stays fast."""

import argparse
from typing import Any, Final


SPECS: Final = """\
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


def call_parser(sub: Any, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subcommand that calls MODULE:ATTR on specs (`inspect`, `cost`, `fit`)."""
    parser = sub.add_parser(
        name, help=summary, description=description, epilog=SPECS, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?", metavar="MODULE:ATTR", help=f"e.g. {example}")
    parser.add_argument("specs", nargs="*", metavar="SPEC | NAME=SPEC", help="the function's arguments")
    return parser  # type: ignore[no-any-return]


def add_json_and_target(subparser: argparse.ArgumentParser, what: str) -> None:
    """`--json` (the fields of `what`) and `--target NAME`, as `cost` and `fit` take them."""
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


def depth(text: str) -> int:
    """`--depth N`: an integer >= 0 (argparse reports anything else as a usage error)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)
