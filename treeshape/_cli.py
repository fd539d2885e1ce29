"""The `treeshape` command: `treeshape demo`, `treeshape inspect`, `treeshape cost` and
`treeshape fit`.

Every failure is one line on stderr (`treeshape: error: ...`, control
characters escaped) and a non-zero exit status: 2 for bad input on the command
line (usage, a malformed spec, an unknown module or attribute, a budget or
sizes that `fit` cannot use), worded with what to type instead, 1 for an error
raised by the user's code (while importing the module, calling the function,
or showing its output), `SystemExit` included. `--traceback` adds the Python
traceback. `KeyboardInterrupt` is left alone.

JAX, and the modules that import it, are imported inside the functions that
need them: `treeshape --help` and usage errors answer without loading JAX,
and the user's module can configure JAX before it is imported.
"""

import argparse
import decimal
import importlib
import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn, TextIO


_PROG: Final = "treeshape"
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")

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


class _Fail(Exception):
    """A failure to report as one line, with an exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one line, like every other error."""

    def error(self, message: str) -> NoReturn:
        raise _Fail(f"{message} (see '{self.prog} --help')", 2)


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


def _parser() -> _Parser:
    traceback_help = "on error, also print the Python traceback"
    parser = _Parser(
        prog=_PROG,
        description=_DESCRIPTION,
        epilog=_SPECS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--traceback", action="store_true", help=traceback_help)
    sub = parser.add_subparsers(
        dest="command",
        metavar="{demo,inspect,cost,fit,targets,restore-plan}",
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
    for subparser in (demo, inspect, cost, fit, targets, restore):
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
    from . import __version__

    return str(__version__)


# The exceptions user code may raise that become a one-line error (KeyboardInterrupt stays as it is).
_USER_ERRORS: Final = (Exception, SystemExit)


def _printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (`\\n`, `\\x1b`), so that
    nothing a user's code writes into a message can corrupt the terminal or add a line. (As the
    table's `printable`, kept here so that the command line starts without importing JAX.)"""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__} whose repr raised>"


def _one_line(err: BaseException) -> str:
    """`TYPE: the first line of the message`, escaped, at most 300 characters; never raises."""
    name = type(err).__name__
    if isinstance(err, SystemExit):
        return f"{name} with code {_printable(_safe_repr(err.code))}"
    try:
        message = str(err)
    except Exception as inner:
        return f"{name} (its message cannot be shown: str() raised {type(inner).__name__})"
    lines = message.strip().splitlines()
    from ._tree import clip

    return clip(_printable(f"{name}: {lines[0].strip()}" if lines else name), 300)


# -- inspect ---------------------------------------------------------------------
def _import(module_name: str) -> Any:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` does: find modules in the working dir
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            where = "looked in the current directory and sys.path"
            raise _Fail(f"no module named {missing!r} ({where})", 2) from err
        raise _Fail(f"importing {module_name!r} failed: {_one_line(err)}", 1) from err
    except _USER_ERRORS as err:
        raise _Fail(f"importing {module_name!r} failed: {_one_line(err)}", 1) from err


def _resolve(target: str) -> Callable[..., Any]:
    module_name, sep, attr = target.partition(":")
    if not (sep and _NAME.fullmatch(module_name) and _NAME.fullmatch(attr)):
        example = "mypkg.model:predict"
        raise _Fail(f"expected MODULE:ATTR such as {example}, got {target!r}", 2)
    obj = _import(module_name)
    done = module_name
    for name in attr.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError as err:
            raise _Fail(f"{done!r} has no attribute {name!r}", 2) from err
        except _USER_ERRORS as err:
            raise _Fail(f"reading {target!r} failed: {_one_line(err)}", 1) from err
        done += (":" if done == module_name else ".") + name
    if not callable(obj):
        raise _Fail(f"{target!r} is a {type(obj).__name__}, not a callable", 2)
    return obj  # type: ignore[no-any-return]


def _arguments(specs: Sequence[str], target: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    from ._spec import Names, SpecError, parse_spec, split_kwarg

    if target is not None and any(split_kwarg(text)[1].startswith("@") for text in specs):
        _resolve(target)  # a Structure's JSON names classes of the modules that MODULE imports

    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    names = Names()  # one symbolic scope for the command: every spec's `b` is the same
    for text in specs:
        name, spec = split_kwarg(text)
        try:
            value = _load_structure(spec[1:]) if spec.startswith("@") else parse_spec(spec, names)
        except SpecError as err:
            raise _Fail(str(err), 2) from err
        if name is None:
            if kwargs:
                raise _Fail(f"positional spec {text!r} after a keyword spec", 2)
            args.append(value)
        elif name in kwargs:
            raise _Fail(f"keyword {name!r} given twice", 2)
        else:
            kwargs[name] = value
    return args, kwargs


def _load_structure(path: str) -> Any:
    """The Structure written with `Structure.to_json` (`@state.json`): shapes, dtypes and
    shardings, also over an abstract mesh of any size; passed to the command's function as
    the tree it describes."""
    from ._spec import SpecError

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as err:
        raise SpecError(f"cannot read {path!r} for @{path}: {err.strerror or err}") from None
    try:
        from ._structure import Structure

        return Structure.from_json(text)
    except ValueError as err:
        raise SpecError(f"@{path} is not a Structure's JSON (Structure.to_json): {_one_line(err)}") from None


def _spec_leaves(value: Any) -> list[Any]:
    """The abstract arrays of one parsed argument: a spec's, or an `@FILE` Structure's."""
    import jax

    from ._spec import abstract_leaves
    from ._structure import Structure

    if isinstance(value, Structure):
        return [leaf for leaf in value.leaves if isinstance(leaf, jax.ShapeDtypeStruct)]
    return abstract_leaves(value)


def _bind(
    fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
    """What to pass to `out_structure`: `fn` and its arguments, or, when some are literals, a
    function of the abstract arguments alone that passes the literals to `fn` as Python values
    (`out_structure` would trace a Python number, as `jax.eval_shape` does)."""
    from ._spec import abstract_leaves, is_abstract, put_back
    from ._structure import Structure

    values = [*args, *kwargs.values()]
    if all(isinstance(value, Structure) or is_abstract(value) for value in values):
        return fn, args, kwargs

    def call(*leaves: Any) -> Any:
        it = iter(leaves)
        filled = [next(it) if isinstance(value, Structure) else put_back(value, it) for value in values]
        return fn(*filled[: len(args)], **dict(zip(kwargs, filled[len(args) :], strict=True)))

    call.__wrapped__ = fn  # type: ignore[attr-defined]  # JAX's messages name `fn`, not `call`
    abstract = [[value] if isinstance(value, Structure) else abstract_leaves(value) for value in values]
    return call, [leaf for leaves in abstract for leaf in leaves], {}


def _as_json(structure: Any) -> list[dict[str, Any]]:
    """The leaf records of `structure.to_json()` (its `"leaves"` array), built by the same code."""
    from ._json import leaf_records

    return leaf_records(structure.paths, structure.leaves)


def _call_target(args: argparse.Namespace, how: Callable[..., Any]) -> Any:
    """`how(fn, *specs)` for the command's `MODULE:ATTR` and specs: what `inspect` and `cost` share."""
    if args.target is None:
        raise _Fail("the following arguments are required: MODULE:ATTR", 2)
    positional, keywords = _arguments(args.specs, args.target)
    fn, positional, keywords = _bind(_resolve(args.target), positional, keywords)
    try:
        return how(fn, *positional, **keywords)
    except _USER_ERRORS as err:
        raise _Fail(f"calling {args.target} failed: {_one_line(err)}", 1) from err


def _inspect(args: argparse.Namespace, stdout: TextIO) -> int:
    from . import describe, out_structure

    if args.json and args.depth is not None:
        raise _Fail("--json prints every leaf and --depth groups them in a table: give one of the two", 2)
    structure = _call_target(args, out_structure)
    try:  # static output leaves are the user's objects: their repr may raise
        if args.depth is not None:
            text = describe(structure, depth=args.depth)
        elif args.json:
            entries = [json.dumps(entry) for entry in _as_json(structure)]
            text = "[\n  " + ",\n  ".join(entries) + "\n]" if entries else "[]"
        else:
            text = str(structure)
        print(text, file=stdout)
    except _USER_ERRORS as err:
        raise _Fail(f"showing the output of {args.target} failed: {_one_line(err)}", 1) from err
    return 0


def _cost(args: argparse.Namespace, stdout: TextIO) -> int:
    from . import cost
    from ._dims import bind_leaves, free_names
    from ._dtypes import short_dtype
    from ._shapes import short_shape

    positional, keywords = _arguments(args.specs, args.target)
    for text, value in zip(args.specs, [*positional, *keywords.values()], strict=True):
        leaves = _spec_leaves(value)
        names = free_names(leaves)
        if names:
            free = [leaf for leaf in leaves if free_names([leaf])][0]
            bound = bind_leaves([free], dict.fromkeys(names, 8))[0][0]
            example = f"{short_dtype(bound.dtype)}{short_shape(bound.shape)}"
            dims = "s " + ", ".join(names) if len(names) > 1 else " " + names[0]
            raise _Fail(
                f"spec {text!r} has the symbolic dimension{dims}, and treeshape cost compiles concrete sizes only: "
                f"give sizes ({example} for {', '.join(f'{name}=8' for name in names)}), or find the largest that "
                f"fits with treeshape fit ... --dim {names[0]} --budget 16GiB",
                2,
            )
    if args.plot is not None:
        _check_plot(args.plot)
    target = _check_target(args.target_name, "cost")
    result = _call_target(args, lambda fn, *a, **k: cost(fn, *a, target=target, **k))
    if args.json:
        data = _json_data(result)
        data["buffers"] = data["buffers"][: args.buffers] if isinstance(data.get("buffers"), list) else None
        data.pop("timeline", None)  # the chart's numbers only when asked for, in their own form
        if args.timeline:
            data["timeline"] = _timeline_data(result.timeline)
        print(json.dumps(data), file=stdout)
    else:
        text = result._text(args.buffers)
        if args.timeline:
            text += "\n\n" + (_NO_TIMELINE if result.timeline is None else str(result.timeline))
        print(text, file=stdout)
    if args.plot is not None:
        _write_plot(result.timeline, args.plot)
    return 0


# -- cost --timeline and --plot ----------------------------------------------------------
_PLOT_FORMATS: Final = (".svg", ".png", ".pdf")
_NO_MATPLOTLIB: Final = (
    'matplotlib is not installed; it comes with the extra treeshape[plot]: pip install "treeshape[plot]"'
)
_NO_TIMELINE: Final = (
    "no timeline: the JAX release or backend that compiled this program does not give XLA's buffer assignment"
)


def _check_plot(path: str) -> None:
    """`--plot FILE`, refused before anything compiles: an extension matplotlib is not asked
    for, or no matplotlib (found without importing it)."""
    import importlib.util

    extension = os.path.splitext(path)[1].lower()
    if extension not in _PLOT_FORMATS:
        allowed = ", ".join(_PLOT_FORMATS)
        raise _Fail(f"--plot {path!r}: the picture's format comes from the file's extension: {allowed}", 2)
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise _Fail(f"--plot draws with matplotlib, but {_NO_MATPLOTLIB}", 2)


def _timeline_data(timeline: Any) -> dict[str, Any] | None:
    """`--json`'s `"timeline"`: bytes live per step, the peak's step, and the phases at depth 1."""
    if timeline is None:
        return None
    return {
        "live_bytes": [int(n) for n in timeline.live_bytes],
        "peak_step": int(timeline.peak_step),
        "phases": [
            {"name": p.name, "start": int(p.start), "stop": int(p.stop), "peak_bytes": int(p.peak_bytes)}
            for p in timeline.phases()
        ],
    }


def _write_plot(timeline: Any, path: str) -> None:
    if timeline is None:
        raise _Fail(f"--plot {path!r}: nothing to draw, {_NO_TIMELINE}", 2)
    try:
        figure = timeline.plot().figure
    except ImportError as err:
        raise _Fail(f"--plot draws with matplotlib, but {_NO_MATPLOTLIB}", 2) from err
    try:
        figure.savefig(path, format=os.path.splitext(path)[1].lower()[1:])
    except OSError as err:
        raise _Fail(f"--plot {path!r}: cannot write the picture: {_one_line(err)}", 2) from err


# -- targets ------------------------------------------------------------------------
# What accelerator plugins that cannot start here print on standard error when JAX starts
# its backends (JAX's CUDA plugin without a driver, libtpu without a TPU): installing the
# `cuda` / `tpu` extras adds no line to a command's output.
_PLUGIN_CHATTER: Final = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|^[IWE]\d{4} [\d:. ]+\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers"
    r"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
    r"|^E\d{4} [\d:. ]+\d+ common_lib\.cc:\d+\] .*TPU_WORKER_HOSTNAMES"
    r"|^=== Source Location Trace: ===$|^learning/\S+/libtpu_init_utils\.cc:\d+$"
    r"|^Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type"
)

_PLUGIN_FAILED: Final = "Jax plugin configuration error: Exception when calling jax_plugins.xla_cuda"
_PLUGIN_FAILED_END: Final = "RuntimeError: Unable to "


def _start_jax() -> None:
    """Start JAX's backends with the start-up chatter of plugins that cannot start here
    left out of standard error (every other line is passed on). Where JAX is started
    already (the command line called in-process), nothing happens."""
    if "jax" in sys.modules:
        return
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import jax

            jax.devices()
        except Exception:  # raised again, with its message, where the command uses JAX
            pass
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", "replace")
    in_block = False  # the CUDA plugin's failed start-up check, logged by JAX with its traceback
    for line in text.splitlines():
        if line.startswith(_PLUGIN_FAILED):
            in_block = True
        elif in_block:
            in_block = not line.startswith(_PLUGIN_FAILED_END)
        elif not _PLUGIN_CHATTER.search(line.strip()):
            print(line, file=sys.stderr)


def _start_for_targets(argv: Sequence[str] | None) -> None:
    """With `--target`, JAX must start on the CPU alone (no accelerator plugin starts its
    devices), which the environment says before JAX is imported; a setting of the user's
    own is kept."""
    words = sys.argv[1:] if argv is None else argv
    if any(w == "--target" or w.startswith("--target=") for w in words):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def _check_target(name: str | None, who: str) -> str | None:
    """`--target NAME` checked before anything is imported or compiled: bad input is exit 2."""
    if name is None:
        return None
    from ._compat import JaxReleaseError
    from ._cost import check_target

    try:
        return check_target(name, who)
    except (ValueError, TypeError, ImportError, JaxReleaseError) as err:
        raise _Fail(f"--target: {str(err).removeprefix(f'treeshape.{who}: ')}", 2) from err


def _targets(stdout: TextIO) -> int:
    from ._cost import targets

    listed = targets()
    width = max(len(name) for name in listed)
    for name, description in listed.items():
        print(f"{name:<{width}}  {description}", file=stdout)
    return 0


def _print(result: Any, as_json: bool, stdout: TextIO, n_buffers: int | None = None) -> None:
    """`result` (a `Cost` or `Fit`) as its table, or as one JSON object of its fields; for a
    `Cost`, with its `n_buffers` largest buffers at the peak."""
    if n_buffers is None:
        print(json.dumps(_json_data(result)) if as_json else str(result), file=stdout)
    elif as_json:
        data = _json_data(result)
        if isinstance(data.get("buffers"), list):
            data["buffers"] = data["buffers"][:n_buffers]
        print(json.dumps(data), file=stdout)
    else:
        print(result._text(n_buffers), file=stdout)


def _json_data(value: Any) -> Any:
    """`value` as JSON data: a dataclass as an object of its fields by name (recursively,
    so that fields added later appear by themselves), tuples and lists as arrays, numbers,
    strings, booleans and `None` as they are; a float that JSON cannot hold (nan, inf) and
    anything else as its `str`."""
    import dataclasses
    import math
    import numbers

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A field neither compared nor shown (a Cost's timeline: `--timeline` adds it) is left out.
        shown = [f for f in dataclasses.fields(value) if f.repr or f.compare]
        return {field.name: _json_data(getattr(value, field.name)) for field in shown}
    if isinstance(value, (list, tuple)):
        return [_json_data(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_data(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else str(value)
    return str(value)


# -- fit -------------------------------------------------------------------------------
_UNITS: Final = {
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_AMOUNT: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_bytes(text: str) -> int:
    """A number of bytes written as `17179869184`, `16GiB`, `1.5 GiB` or `16GB` (units
    B, KiB, MiB, GiB, TiB, and KB, MB, GB, TB in powers of 1000; any case), rounded down.

    Raises:
        ValueError: `text` is none of these, or less than one byte.
    """
    match = _AMOUNT.fullmatch(text)
    unit = match and _UNITS.get(match[2].lower() or "b")
    if not match or unit is None:
        raise ValueError(
            f"malformed amount of bytes {text!r}: expected a number of bytes, or a number and a unit (B, KiB, "
            "MiB, GiB, TiB, KB, MB, GB, TB), e.g. 16GiB"
        )
    amount = int(decimal.Decimal(match[1]) * unit)
    if amount < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return amount


def _amount(n: int) -> str:
    """`512 B`, or `36.8 KiB (37,712 B)`."""
    from ._shapes import human_bytes

    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def _at_least(n: int) -> str:
    """A `--budget` of at least `n` bytes in the largest binary unit it reaches, rounded up
    to a tenth: `36.9KiB` for 37,712."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _UNITS[unit.lower()]
        if n >= size:
            return f"{math.ceil(n * 10 / size) / 10:g}{unit}"
    return str(n)


def _fit(args: argparse.Namespace, stdout: TextIO) -> int:
    import jax

    from . import largest_fit
    from ._cost import BudgetError, SizeError, bind_at, check_arguments, check_names, largest_allowed
    from ._dims import free_names

    try:
        budget = None if args.budget is None else parse_bytes(args.budget)
    except ValueError as err:
        raise _Fail(f"--budget: {err}", 2) from err
    target = _check_target(args.target_name, "largest_fit")
    device = jax.devices()[0]
    stats = device.memory_stats()
    if budget is None and target is None and not (isinstance(stats, dict) and stats.get("bytes_limit")):
        raise _Fail(
            f"--budget is required: the device ({device.platform}) reports no memory limit; e.g. --budget 16GiB", 2
        )
    positional, keywords = _arguments(args.specs, args.target)
    texts = [
        text
        for text, value in zip(args.specs, [*positional, *keywords.values()], strict=True)
        for _ in _spec_leaves(value)
    ]  # the spec of each abstract leaf
    leaves = [leaf for value in [*positional, *keywords.values()] for leaf in _spec_leaves(value)]
    names = free_names(leaves)
    dim = args.dim
    try:
        check_arguments(dim, budget, args.margin, args.max_size)
        check_names(dim, names, command_line=True)
        for n in (1, args.max_size):
            bind_at(dim, n, names, leaves)
    except SizeError as err:
        spec = "the specs" if err.index is None else f"spec {texts[err.index]!r}"
        if err.n == 1:
            fix = f"the search starts at {dim}=1: write {'them' if err.index is None else 'it'} so that {dim} counts "
            fix += f"from 1 (an offset such as {dim}+7, not a difference such as {dim}-8)"
        else:
            fix = f"pass --max-size {largest_allowed(dim, args.max_size, names, leaves)} or less"
        raise _Fail(f"at {dim}={err.n}, {spec} {err}: {fix}", 2) from err
    except (TypeError, ValueError) as err:
        raise _Fail(str(err).removeprefix("treeshape.largest_fit: "), 2) from err
    progress = sys.stderr.isatty() if args.progress is None else args.progress

    def fit(fn: Callable[..., Any], *positional: Any, **keywords: Any) -> Any:
        return largest_fit(
            fn,
            *positional,
            dim=dim,
            budget=budget,
            margin=args.margin,
            max_size=args.max_size,
            progress=progress,
            target=target,
            **keywords,
        )

    try:
        result = _call_target(args, fit)
    except _Fail as err:
        cause = err.__cause__
        if isinstance(cause, BudgetError):
            needed = math.ceil(cause.peak / (1 - args.margin))  # the least budget whose limit holds the peak
            raise _Fail(
                f"even {dim}=1 does not fit: its peak is {_amount(cause.peak)} per device, over the limit of "
                f"{_amount(cause.limit)}: pass --budget {_at_least(needed)} or more"
                f"{' (or a smaller --margin)' if args.margin else ''}",
                2,
            ) from cause
        raise
    _print(result, args.json, stdout)
    return 0


# -- demo --------------------------------------------------------------------------
def _demo(stdout: TextIO) -> int:
    """A 2-layer MLP regression, trained with a hand-written Adam inside `lax.scan`."""
    import textwrap

    import jax
    import jax.numpy as jnp
    from jax import lax

    from . import CarryMismatchError, cache_info, carry_structure, describe, out_structure, scan_carry

    def say(text: str = "") -> None:
        print(text, file=stdout)

    steps_per_scan, scans, batch, features, hidden = 50, 4, 64, 8, 32
    k_data, k_true, k_1, k_2 = jax.random.split(jax.random.key(0), 4)

    # Synthetic data: one batch per scan step, y = sin(x @ v).
    x = jax.random.normal(k_data, (scans, steps_per_scan, batch, features))
    v = jax.random.normal(k_true, (features, 1)) / jnp.sqrt(features)
    y = jnp.sin(x @ v)

    params = {
        "hidden": {
            "w": jax.random.normal(k_1, (features, hidden)) / jnp.sqrt(features),
            "b": jnp.zeros(hidden),
        },
        "out": {
            "w": jax.random.normal(k_2, (hidden, 1)) / jnp.sqrt(hidden),
            "b": jnp.zeros(1),
        },
    }

    def predict(params: Any, x: jax.Array) -> Any:
        h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
        return h @ params["out"]["w"] + params["out"]["b"]

    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> Any:
        return jnp.mean((predict(params, x) - y) ** 2)

    def adam_init(params: Any) -> Any:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return {"count": jnp.zeros((), jnp.int32), "mu": zeros, "nu": zeros}

    def adam_update(grads: Any, state: Any, params: Any, lr: float = 1e-2) -> Any:
        b1, b2, eps = 0.9, 0.999, 1e-8
        count = state["count"] + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
        nu = jax.tree.map(lambda n, g: b2 * n + (1 - b2) * g * g, state["nu"], grads)
        t = count.astype(jnp.float32)

        def step(p: jax.Array, m: jax.Array, n: jax.Array) -> Any:
            m_hat, n_hat = m / (1 - b1**t), n / (1 - b2**t)
            return p - lr * m_hat / (jnp.sqrt(n_hat) + eps)

        new_params = jax.tree.map(step, params, mu, nu)
        return new_params, {"count": count, "mu": mu, "nu": nu}

    def train_step(carry: Any, batch: Any) -> tuple[Any, jax.Array]:
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        params, opt_state = adam_update(grads, opt_state, params)
        return (params, opt_state), loss

    say("treeshape demo: a 2-layer MLP regression trained with a hand-written Adam")
    say()
    say("1. The parameters: ts.describe(params)")
    say(describe(params))
    say()

    opt_structure = out_structure(adam_init, params)
    say("2. The optimizer state, inferred without running adam_init:")
    say("   ts.out_structure(adam_init, params)")
    say(str(opt_structure))
    say()

    # The scan carry: the parameters plus a zero optimizer state whose moments
    # are stored in bfloat16. `train_step` returns them as float32, so this
    # initial carry is not a type `lax.scan` accepts: `scan_carry` says which
    # leaves differ and names the policy that allows the change, and with it
    # converts `init` to the carry type `train_step` maps to itself.
    init = (params, opt_structure.astype(jnp.bfloat16).zeros())
    say("3. The scan carry (params, opt_state), with the moments stored in bfloat16:")
    say("   init = (params, opt_structure.astype(jnp.bfloat16).zeros())")
    say("   ts.scan_carry(train_step, init, xs) raises:")
    try:
        scan_carry(train_step, init, xs=(x[0], y[0]))
    except CarryMismatchError as err:
        for line in f"{type(err).__name__}: {err}".splitlines():
            bullet = " " * (len(line) - len(line.lstrip(" *")))
            say(textwrap.fill(line, 96, initial_indent="   ", subsequent_indent="   " + bullet) if line else "")
    say()
    say('   The fix it names: ts.scan_carry(train_step, init, xs, policy="promote")')
    carry = scan_carry(train_step, init, xs=(x[0], y[0]), policy="promote")
    settled = carry_structure(train_step, init, xs=(x[0], y[0]), policy="promote")
    say(str(settled))
    say(f"   the initial carry matches it: {settled.matches(carry)}")
    say()

    @jax.jit
    def train(carry: Any, xs: Any) -> tuple[Any, jax.Array]:
        return lax.scan(train_step, carry, xs)

    say(f"4. Training: lax.scan over {steps_per_scan} batches, {scans} times")
    for i in range(scans):
        carry, losses = train(carry, (x[i], y[i]))
        first, last = i * steps_per_scan + 1, (i + 1) * steps_per_scan
        say(f"   steps {first:3d}-{last:3d}  mean loss {float(losses.mean()):.4f}")
    say()

    # The same question again is answered from the cache, without tracing.
    out_structure(adam_init, params)
    info = cache_info()
    say("5. The out_structure cache: ts.cache_info()")
    hits, misses = _count(info.hits, "call"), _count(info.misses, "call")
    say(f"   {info}: {hits} answered without tracing, {misses} traced")
    return 0


def _count(n: int, word: str) -> str:
    return f"{n} {word if n == 1 else word + 's'}"


def _restore_plan(args: argparse.Namespace, stdout: TextIO) -> int:
    from ._restore import abstract_target, plan_data, restore_plan

    try:
        target = abstract_target(_resolve(args.target))
    except _Fail as err:
        raise _Fail(str(err), 2) from err.__cause__
    except _USER_ERRORS as err:
        raise _Fail(f"building the target {args.target} failed: {_one_line(err)}", 2) from err
    try:
        plan = restore_plan(args.checkpoint, target)
    except ValueError as err:
        raise _Fail(str(err).removeprefix("treeshape.restore_plan: "), 2) from err
    print(json.dumps(plan_data(plan), indent=1) if args.json else str(plan), file=stdout)
    return 0 if plan.ok else 1


# -- main ----------------------------------------------------------------------------
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
    _start_for_targets(argv)
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exit_:  # --help and --version
            return exit_.code if isinstance(exit_.code, int) else 0
        _start_jax()
        try:
            if args.command == "demo":
                return _demo(sys.stdout)
            if args.command == "cost":
                return _cost(args, sys.stdout)
            if args.command == "fit":
                return _fit(args, sys.stdout)
            if args.command == "restore-plan":
                return _restore_plan(args, sys.stdout)
            if args.command == "targets":
                return _targets(sys.stdout)
            return _inspect(args, sys.stdout)
        except _Fail:
            raise
        except Exception as err:  # a bug of treeshape's own: still one line
            raise _Fail(f"unexpected error: {_one_line(err)}", 1) from err
    except _Fail as err:
        if getattr(args, "traceback", False) and err.__cause__ is not None:
            traceback.print_exception(err.__cause__, file=sys.stderr)
        elif err.status == 1:
            err.args = (f"{err} (rerun with --traceback to see where)",)
        print(f"{_PROG}: error: {_printable(str(err))}", file=sys.stderr)
        return err.status
