"""`treeshape cost`: what the compiled program of `MODULE:ATTR` needs on the specs (symbolic
dimensions refused with the `fit` to use instead), as `ts.Cost`'s table or JSON, with the
bytes live over the schedule (`--timeline`) and their picture (`--plot FILE`)."""

import argparse
import json
import os
from typing import Any, Final, TextIO

from ._arguments import add_json_and_target, call_parser, depth
from ._common import arguments, call_target, checked_target, json_data, spec_leaves
from ._fail import Fail, one_line


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    cost = call_parser(
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
        type=depth,
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
    add_json_and_target(cost, "ts.Cost")
    return cost


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    from .. import cost
    from .._dims import bind_leaves, free_names
    from .._dtypes import short_dtype
    from .._shapes import short_shape

    positional, keywords = arguments(args.specs, args.target)
    for text, value in zip(args.specs, [*positional, *keywords.values()], strict=True):
        leaves = spec_leaves(value)
        names = free_names(leaves)
        if names:
            free = [leaf for leaf in leaves if free_names([leaf])][0]
            bound = bind_leaves([free], dict.fromkeys(names, 8))[0][0]
            example = f"{short_dtype(bound.dtype)}{short_shape(bound.shape)}"
            dims = "s " + ", ".join(names) if len(names) > 1 else " " + names[0]
            raise Fail(
                f"spec {text!r} has the symbolic dimension{dims}, and treeshape cost compiles concrete sizes only: "
                f"give sizes ({example} for {', '.join(f'{name}=8' for name in names)}), or find the largest that "
                f"fits with treeshape fit ... --dim {names[0]} --budget 16GiB",
                2,
            )
    if args.plot is not None:
        _check_plot(args.plot)
    target = checked_target(args.target_name, "cost")
    result = call_target(args, lambda fn, *a, **k: cost(fn, *a, target=target, **k))
    if args.json:
        data = json_data(result)
        data["buffers"] = data["buffers"][: args.buffers] if isinstance(data.get("buffers"), list) else None
        data.pop("timeline", None)  # the chart's numbers only when asked for, in their own form
        if args.timeline:
            data["timeline"] = _timeline_data(result.timeline)
        print(json.dumps(data), file=stdout)
    else:
        text = result._text(args.buffers)
        if args.timeline:
            text += "\n\n" + (_NO_TIMELINE if result.timeline is None else str(result.timeline))
        if args.time:
            text += "\n\n" + (_NO_TIME if result.time is None else str(result.time))
        print(text, file=stdout)
    if args.plot is not None:
        _write_plot(result.timeline, args.plot)
    return 0


# -- --timeline and --plot ----------------------------------------------------------------
_PLOT_FORMATS: Final = (".svg", ".png", ".pdf")
_NO_MATPLOTLIB: Final = (
    'matplotlib is not installed; it comes with the extra treeshape[plot]: pip install "treeshape[plot]"'
)
_NO_TIMELINE: Final = (
    "no timeline: the JAX release or backend that compiled this program does not give XLA's buffer assignment"
)


_NO_TIME: Final = "no time: a step's time is known for a named accelerator only (--target NAME)"


def _check_plot(path: str) -> None:
    """`--plot FILE`, refused before anything compiles: an extension matplotlib is not asked
    for, or no matplotlib (found without importing it)."""
    import importlib.util

    extension = os.path.splitext(path)[1].lower()
    if extension not in _PLOT_FORMATS:
        allowed = ", ".join(_PLOT_FORMATS)
        raise Fail(f"--plot {path!r}: the picture's format comes from the file's extension: {allowed}", 2)
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise Fail(f"--plot draws with matplotlib, but {_NO_MATPLOTLIB}", 2)


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
        raise Fail(f"--plot {path!r}: nothing to draw, {_NO_TIMELINE}", 2)
    try:
        figure = timeline.plot().figure
    except ImportError as err:
        raise Fail(f"--plot draws with matplotlib, but {_NO_MATPLOTLIB}", 2) from err
    try:
        figure.savefig(path, format=os.path.splitext(path)[1].lower()[1:])
    except OSError as err:
        raise Fail(f"--plot {path!r}: cannot write the picture: {one_line(err)}", 2) from err
