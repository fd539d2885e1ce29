"""treeshape: what a JAX program returns, needs and costs, answered before it runs.

Each question in one call (`import treeshape as ts`; the guide of each in `docs/guide/`):

- What a call returns: `ts.out_structure(init, key)`, its output's `Structure` by
  abstract evaluation, cached and safe under `jit`, `vmap`, `grad` and loop bodies.
- The carry a loop needs: `ts.scan_carry(step, init, xs, policy="promote")`, `init`
  converted to the type `step` maps to itself (or a `CarryMismatchError` naming each leaf).
- What a step costs: `ts.cost(train_step, state, batch)`, its FLOPs and bytes per device
  at the peak, from XLA's analysis of the compiled program; nothing runs.
- Whether it fits: `ts.largest_fit(train_step, state, batches, dim="b", budget=16 * 2**30)`,
  the largest batch whose step fits the budget, checked by compiling it.
- How fast: `ts.cost(train_step, state, batch, target="v5e").time`, one step's time on a
  TPU v5e, compiled by libtpu without one.
- The fastest plan: `ts.plan(make, {"remat": ["none", "full"]}, target="v5e")`, the
  choices and batch size of highest throughput that fit.
- Restoring into a changed model: `ts.restore_plan(checkpoint_dir, model)`, every leaf's
  fate from the checkpoint's metadata alone; its `restore()` does exactly that.
- Why it traced again: `step = jax.jit(ts.watch(step))`, then `step.retraces[-1]` names
  the leaf, the cause and the fix.
"""

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any, Final


# `import treeshape` does not import JAX: each public name is imported from its
# module on first use (`__getattr__` below). pytest loads the plugin
# `treeshape.pytest_plugin`, and so this package, before any conftest.py, and a
# conftest must still be able to configure JAX (JAX_PLATFORMS, JAX_ENABLE_X64,
# XLA_FLAGS) before JAX is imported. Type checkers read the imports below.
if TYPE_CHECKING:
    from ._cache import CacheInfo as CacheInfo, cache_info as cache_info, clear_cache as clear_cache
    from ._carry import (
        carry_structure as carry_structure,
        fori_carry as fori_carry,
        scan_carry as scan_carry,
        while_carry as while_carry,
    )
    from ._compat import JaxReleaseError as JaxReleaseError
    from ._cost import (
        BudgetError as BudgetError,
        Buffer as Buffer,
        Cost as Cost,
        Donation as Donation,
        Fit as Fit,
        FitError as FitError,
        KernelTime as KernelTime,
        Phase as Phase,
        PhaseTime as PhaseTime,
        Plan as Plan,
        PlanRow as PlanRow,
        SizeError as SizeError,
        StepTime as StepTime,
        Timeline as Timeline,
        cost as cost,
        largest_fit as largest_fit,
        plan as plan,
        targets as targets,
    )
    from ._display import describe as describe
    from ._errors import (
        CarryMismatchError as CarryMismatchError,
        Mismatch as Mismatch,
        PrecisionWarning as PrecisionWarning,
        StructureMismatchError as StructureMismatchError,
    )
    from ._infer import out_structure as out_structure, structure_of as structure_of
    from ._prefix import check_prefix as check_prefix
    from ._residuals import Residual as Residual, Residuals as Residuals, residuals as residuals
    from ._restore import (
        Restore as Restore,
        RestoreError as RestoreError,
        RestorePlan as RestorePlan,
        restore_plan as restore_plan,
    )
    from ._settle import settle as settle
    from ._structure import Structure as Structure
    from ._tree import StaticRepr as StaticRepr
    from ._watch import Retrace as Retrace, RetraceError as RetraceError, Trace as Trace, watch as watch
    from ._weak import (
        is_weak as is_weak,
        strip_weak_type as strip_weak_type,
        upcast as upcast,
        weak_paths as weak_paths,
    )


try:
    __version__ = importlib.metadata.version("treeshape")
except importlib.metadata.PackageNotFoundError:  # a source tree on the path, never installed
    __version__ = "unknown (not installed)"

# The public names, one line each, and the module each is imported from on first use
# (`__getattr__` below). The imports above say the same to type checkers, which cannot
# read this table; tests/test_architecture.py checks that the two agree.
_MODULES: Final = {
    "BudgetError": "._cost",
    "Buffer": "._cost",
    "CacheInfo": "._cache",
    "CarryMismatchError": "._errors",
    "Cost": "._cost",
    "Donation": "._cost",
    "Fit": "._cost",
    "FitError": "._cost",
    "JaxReleaseError": "._compat",
    "KernelTime": "._cost",
    "Mismatch": "._errors",
    "Phase": "._cost",
    "PhaseTime": "._cost",
    "Plan": "._cost",
    "PlanRow": "._cost",
    "PrecisionWarning": "._errors",
    "Residual": "._residuals",
    "Residuals": "._residuals",
    "Restore": "._restore",
    "RestoreError": "._restore",
    "RestorePlan": "._restore",
    "Retrace": "._watch",
    "RetraceError": "._watch",
    "SizeError": "._cost",
    "StaticRepr": "._tree",
    "StepTime": "._cost",
    "Structure": "._structure",
    "StructureMismatchError": "._errors",
    "Timeline": "._cost",
    "Trace": "._watch",
    "cache_info": "._cache",
    "carry_structure": "._carry",
    "check_prefix": "._prefix",
    "clear_cache": "._cache",
    "cost": "._cost",
    "describe": "._display",
    "fori_carry": "._carry",
    "is_weak": "._weak",
    "largest_fit": "._cost",
    "out_structure": "._infer",
    "plan": "._cost",
    "residuals": "._residuals",
    "restore_plan": "._restore",
    "scan_carry": "._carry",
    "settle": "._settle",
    "strip_weak_type": "._weak",
    "structure_of": "._infer",
    "targets": "._cost",
    "upcast": "._weak",
    "watch": "._watch",
    "weak_paths": "._weak",
    "while_carry": "._carry",
}
__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
