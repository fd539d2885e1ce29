"""`treeshape fit`: the largest size of one symbolic dimension (`--dim`) for which the program
of `MODULE:ATTR` fits a memory budget, as `ts.Fit`'s table or JSON; `--budget`'s amounts of
bytes read (`parse_bytes`), and a budget nothing fits answered with the one that would."""

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, TextIO

from ._arguments import add_json_and_target, call_parser
from ._common import UNITS, arguments, call_target, checked_target, parse_bytes, print_result, spec_leaves
from ._fail import Fail


def _amount(n: int) -> str:
    """`512 B`, or `36.8 KiB (37,712 B)`."""
    from .._shapes import human_bytes

    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def _at_least(n: int) -> str:
    """A `--budget` of at least `n` bytes in the largest binary unit it reaches, rounded up
    to a tenth: `36.9KiB` for 37,712."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = UNITS[unit.lower()]
        if n >= size:
            return f"{math.ceil(n * 10 / size) / 10:g}{unit}"
    return str(n)


def declare(sub: Any) -> argparse.ArgumentParser:
    """This subcommand's parser, its options and help."""
    fit = call_parser(
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
        "--host-budget",
        metavar="BYTES",
        help="the host's memory a size may also take (bytes in pinned_host and unpinned_host, as --budget "
        "reads them), e.g. 64GiB; default: no limit",
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
    add_json_and_target(fit, "ts.Fit")
    return fit


def run(args: argparse.Namespace, stdout: TextIO) -> int:
    import jax

    from .. import largest_fit
    from .._cost import BudgetError, SizeError, check_request

    try:
        budget = None if args.budget is None else parse_bytes(args.budget)
    except ValueError as err:
        raise Fail(f"--budget: {err}", 2) from err
    try:
        host_budget = None if args.host_budget is None else parse_bytes(args.host_budget)
    except ValueError as err:
        raise Fail(f"--host-budget: {err}", 2) from err
    target = checked_target(args.target_name, "largest_fit")
    device = jax.devices()[0]
    stats = device.memory_stats()
    if budget is None and target is None and not (isinstance(stats, dict) and stats.get("bytes_limit")):
        raise Fail(
            f"--budget is required: the device ({device.platform}) reports no memory limit; e.g. --budget 16GiB", 2
        )
    positional, keywords = arguments(args.specs, args.target)
    texts = [
        text
        for text, value in zip(args.specs, [*positional, *keywords.values()], strict=True)
        for _ in spec_leaves(value)
    ]  # the spec of each abstract leaf
    leaves = [leaf for value in [*positional, *keywords.values()] for leaf in spec_leaves(value)]
    dim = args.dim
    try:
        check_request(dim, budget, args.margin, args.max_size, leaves, command_line=True)
    except SizeError as err:
        spec = "the specs" if err.index is None else f"spec {texts[err.index]!r}"
        if err.n == 1:
            fix = f"the search starts at {dim}=1: write {'them' if err.index is None else 'it'} so that {dim} counts "
            fix += f"from 1 (an offset such as {dim}+7, not a difference such as {dim}-8)"
        else:
            fix = f"pass --max-size {err.largest} or less"
        raise Fail(f"at {dim}={err.n}, {spec} {err.problem}: {fix}", 2) from err
    except (TypeError, ValueError) as err:
        raise Fail(str(err).removeprefix("treeshape.largest_fit: "), 2) from err
    progress = sys.stderr.isatty() if args.progress is None else args.progress

    def fit(fn: Callable[..., Any], *positional: Any, **keywords: Any) -> Any:
        return largest_fit(
            fn,
            *positional,
            dim=dim,
            budget=budget,
            margin=args.margin,
            max_size=args.max_size,
            host_budget=host_budget,
            progress=progress,
            target=target,
            **keywords,
        )

    try:
        result = call_target(args, fit)
    except Fail as err:
        cause = err.__cause__
        if isinstance(cause, BudgetError) and cause.peak is None:  # the target's compiler refused size 1
            raise Fail(str(cause).removeprefix("treeshape.largest_fit: "), 2) from cause
        if isinstance(cause, BudgetError) and cause._on_host:
            assert cause.peak is not None  # (the host's bytes at size 1)
            raise Fail(
                f"even {dim}=1 does not fit the host's memory: it takes {_amount(cause.peak)} in host memory kinds, "
                f"over --host-budget {_amount(cause.limit)}: pass --host-budget {_at_least(cause.peak)} or more, or "
                "offload less to the host",
                2,
            ) from cause
        if isinstance(cause, BudgetError) and cause.peak is not None:
            needed = math.ceil(cause.peak / (1 - args.margin))  # the least budget whose limit holds the peak
            raise Fail(
                f"even {dim}=1 does not fit: its peak is {_amount(cause.peak)} per device, over the limit of "
                f"{_amount(cause.limit)}: pass --budget {_at_least(needed)} or more"
                f"{' (or a smaller --margin)' if args.margin else ''}",
                2,
            ) from cause
        raise
    print_result(result, args.json, stdout)
    return 0
