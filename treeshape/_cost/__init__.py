"""The cost wing: what a call's compiled program costs, before it runs.

`cost` compiles the program the user's own `jax.jit` would compile for a call's abstract
inputs (for this process's devices, a mesh it does not have, or a named accelerator) and
reads XLA's figures: FLOPs and bytes with every loop counted by its trip count, memory, the
buffers at the peak and the donations, and on a named accelerator the time of one run.
`largest_fit` searches the largest size of one symbolic dimension whose program fits a
budget. `targets` lists the accelerators.

The rest of the package imports this front, never a room of the wing:

- `_cost`: `cost` and `Cost`, the call prepared, keyed, compiled and read;
- `_program`: the program itself, as the user's jit wrapper compiles it;
- `_loops` and `_hlo_loops`: what XLA's analysis misses of loop bodies run many times
  (from the traced program, or read from the compiled one);
- `_hlo`, `_liveness` and `_buffers`: the compiled module, its values' live ranges and the
  buffer assignment, read;
- `_per_device`, `_simulate`, `_target`, `_deviceless`: where it compiles (one device's
  program inside `shard_map`, a far mesh in a child process, a named accelerator);
- `_timeline`: `Timeline` and `Phase`, the bytes live over the schedule;
- `_kernels`, `_layout`, `_chips` and `_time`: the kernels of the module the target's
  compiler dumped (what their operands' layouts say of their access), each chip's record
  (its compiler and figures), and `StepTime`, the time of one run (by kernel,
  `KernelTime`, and by phase, `PhaseTime`);
- `_request`, `_budget` and `_fit`: a `largest_fit` request checked and its sizes bound
  (and `FitError`, `SizeError`, `BudgetError`), what a size is judged by against a budget,
  then `largest_fit` and `Fit`;
- `_plan`: `plan`, `Plan` and `PlanRow`, the fastest combination of choices that fits.
"""

from ._buffers import Buffer as Buffer, Donation as Donation
from ._cost import Cost as Cost, check_target as check_target, cost as cost
from ._fit import Fit as Fit, largest_fit as largest_fit
from ._plan import Plan as Plan, PlanRow as PlanRow, plan as plan
from ._request import (
    BudgetError as BudgetError,
    FitError as FitError,
    SizeError as SizeError,
    check_request as check_request,
)
from ._target import CountError as CountError, TopologyError as TopologyError, targets as targets
from ._time import KernelTime as KernelTime, PhaseTime as PhaseTime, StepTime as StepTime
from ._timeline import Phase as Phase, Timeline as Timeline
