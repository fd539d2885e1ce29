"""What a size of `largest_fit`'s dimension is judged by against a budget: the bytes its
peak may take (`limit`: the budget less the margin), the budget where none is given
(`budget_of`: what JAX lets XLA use on a target, `target_budget`, else the device's own
limit), the peak a size is judged by (`judged`: the target's compiler's own where it is
what the chip holds), and the bytes in the host's memory kinds (`host_bytes`) on the
device's scale (`on_device_scale`), so that one number judges both budgets. Figures only:
no program, no search.
"""

import math
from collections.abc import Callable
from typing import Final, Protocol

from . import _target


class Figures(Protocol):
    """The memory figures of a `Cost` that a size is judged by."""

    @property
    def peak_bytes(self) -> int | None: ...
    @property
    def compiler_peak_bytes(self) -> int | None: ...
    @property
    def host_argument_bytes(self) -> int | None: ...
    @property
    def host_output_bytes(self) -> int | None: ...
    @property
    def host_temp_bytes(self) -> int | None: ...
    @property
    def host_alias_bytes(self) -> int | None: ...


# What `Fit.judged_by` says where the target's compiler's own peak judged each size.
JUDGED_BY_OWN_PEAK: Final = "libtpu's own peak (Cost.compiler_peak_bytes, what the chip holds)"


def limit(budget: int, margin: float) -> int:
    """The most bytes the peak may take: `(1 - margin) * budget`, rounded down."""
    return math.floor((1 - margin) * budget)


def judges_by_own_peak(target: str | None) -> bool:
    """Whether a size compiled for `target` is judged by its compiler's own peak (libtpu's:
    what the chip holds; `peak_bytes` counts a donated output twice where libtpu places it
    once), rather than by `peak_bytes`."""
    return target is not None and _target.resolve(target, "largest_fit")[0].chip.compiler.own_peak


def judged(cost: Figures, own_peak: bool) -> int | None:
    """The peak a size is judged by: the compiler's own where `own_peak` and it is known,
    else `peak_bytes`."""
    if own_peak and cost.compiler_peak_bytes is not None:
        return cost.compiler_peak_bytes
    return cost.peak_bytes


def host_bytes(cost: Figures) -> int | None:
    """The bytes in the host's memory kinds: `host_argument_bytes + host_output_bytes +
    host_temp_bytes - host_alias_bytes` (None where one is unknown)."""
    figures = (cost.host_argument_bytes, cost.host_output_bytes, cost.host_temp_bytes, cost.host_alias_bytes)
    if any(n is None for n in figures):
        return None
    argument, output, temp, alias = (int(n or 0) for n in figures)
    return argument + output + temp - alias


def on_device_scale(peak: int, host: int, limit: int, host_limit: int) -> int:
    """The peak, or the host's bytes on the device's scale where those are the larger: over
    `limit` exactly where `host` is over `host_limit`, so that the search judges both
    budgets by one number that grows as both do."""
    return max(peak, -(-host * limit // host_limit))  # (the ceiling, in integers)


def target_budget(target: _target.Target, variable: str | None) -> tuple[int, str]:
    """The memory JAX lets XLA use on one device of the target, and how it was found: on
    NVIDIA the fraction JAX preallocates (`XLA_PYTHON_CLIENT_MEM_FRACTION`, else 0.75), on
    TPU all of it."""
    if target.chip.compiler.whole_memory:
        return target.device_bytes, f"the memory libtpu lets one program use on a {target.label}"
    fraction, said = 0.75, "JAX's default preallocation, 75%"
    if variable is not None and variable.strip():
        try:
            fraction = float(variable)
        except ValueError:
            fraction = math.nan
        if not 0 < fraction <= 1:
            raise ValueError(
                f"treeshape.largest_fit: XLA_PYTHON_CLIENT_MEM_FRACTION={variable!r} is not a fraction in (0, 1]; "
                "set it as JAX reads it (e.g. 0.9), or unset it for JAX's default (0.75)."
            )
        said = f"XLA_PYTHON_CLIENT_MEM_FRACTION={variable.strip()}"
    return math.floor(fraction * target.device_bytes), f"{said} of the {target.label}'s {target.device_bytes:,} B"


def budget_of(
    budget: float | None, target: str | None, variable: str | None, device_bytes: Callable[[], int | None]
) -> tuple[int, str | None]:
    """The bytes one device has (an int), and where `target=` chose them (`None`: given, or
    the device's reported limit, `device_bytes()`: the `Cost` at size 1's, which compiles
    it). `variable`: `XLA_PYTHON_CLIENT_MEM_FRACTION` as the environment gives it."""
    budget_source = None
    if target is not None and budget is None:  # what JAX lets XLA use on that accelerator
        budget, budget_source = target_budget(_target.resolve(target, "largest_fit")[0], variable)
    if budget is None:  # the device's limit, from the `Cost` at size 1 (which the search compiles first)
        budget = device_bytes()
        if budget is None:
            raise ValueError(
                "treeshape.largest_fit: no budget given, and the device reports no memory limit "
                "(Cost.device_bytes is None, as on CPU). Pass the bytes one device has, e.g. budget=16 * 2**30 "
                "for 16 GiB."
            )
    return math.floor(budget), budget_source
