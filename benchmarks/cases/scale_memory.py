"""Case 13, `scale_memory` (group `scale`, issue 9 "Scale"): peak RSS of `structure_of` + `diff` at 1,000,000 leaves.

Two fresh subprocesses (started through `run.py`, as case 7's probes are),
each of which builds the same two trees: the model-like tree of cases 11-12
with 1,000,000 distinct `jax.ShapeDtypeStruct` leaves (`workloads.model_tree`)
and its *grown* copy (new containers around the same leaves, one nested list
one leaf longer: `workloads.grown_tree`). After the build and a
`gc.collect()`, the probe records VmRSS and resets the peak RSS to it
(`echo 5 > /proc/self/clear_refs`, as in case 7); then

- *treeshape*: `s = ts.structure_of(tree)` and `s.diff(grown)` (checked,
  after the reading, to be the one expected mismatch);
- *control*: `jax.tree_util.tree_flatten_with_path` of both trees, both
  results kept alive: the least a diff that reports paths must hold;

and reads VmHWM, the peak RSS since the reset: the interpreter, JAX, both
trees and whatever the operation needed at its peak. Row 1 compares these
peaks: goal treeshape <=2x the control. Row 2 (information) compares what
each side added above the RSS with the trees built, which is where the two
differ (the shared part, ~0.4-0.5 GiB of trees and runtime, dilutes row 1's
ratio).

Why the control is fair: both processes start the same way, warm up the
same code on a 100-leaf tree, build the same trees and are measured the same
way; the control does the walk any path-reporting comparison needs. Under
`--quick`: 10,000 leaves.
"""

import gc
import time
from typing import Any

import treeshape as ts

from harness import Config, Row, at_most, case, k, peak_rss_mb, probe, reset_peak, run_probe, status_mb
from workloads import check_one_mismatch, grown_tree, model_leaves, model_tree, paths_floor


N_LEAVES, N_LEAVES_QUICK = 1_000_000, 10_000


@probe("scale_memory")
def scale_memory_probe(arg: str) -> dict[str, Any]:
    """In a fresh process (`arg` is "treeshape:N" or "control:N"): the peak RSS of one side over N leaves."""
    which, n = arg.split(":")
    small = model_leaves(100, "sds")  # warm up both sides' code paths
    small_grown, _ = grown_tree(small)
    ts.structure_of(model_tree(small)).diff(small_grown)
    paths_floor(model_tree(small), small_grown)

    leaves = model_leaves(int(n), "sds")
    tree = model_tree(leaves)
    grown, path = grown_tree(leaves)
    gc.collect()
    built = status_mb("VmRSS") or 0.0
    reset = reset_peak()
    t0 = time.perf_counter()
    if which == "treeshape":
        s = ts.structure_of(tree)
        result: Any = s.diff(grown)
    elif which == "control":
        result = paths_floor(tree, grown)
    else:
        raise ValueError(f"unknown side {which!r}")
    seconds = time.perf_counter() - t0
    peak = peak_rss_mb()
    after = status_mb("VmRSS") or 0.0
    if which == "treeshape":
        check_one_mismatch(result, path, "structure")
    return {
        "side": which,
        "leaves": len(leaves),
        "method": "VmHWM after clear_refs" if reset else "ru_maxrss (peak not reset)",
        "rss_built": built,
        "peak": peak,
        "rss_after": after,
        "seconds": seconds,
    }


@case("scale_memory", group="scale")
def scale_memory(cfg: Config) -> list[Row]:
    """13. Peak RSS of structure_of + diff at 1M ShapeDtypeStructs vs tree_flatten_with_path of both trees."""
    n = N_LEAVES_QUICK if cfg.quick else N_LEAVES
    control = run_probe("scale_memory", f"control:{n}")
    mine = run_probe("scale_memory", f"treeshape:{n}")
    detail = {"control": control, "treeshape": mine}
    added_control = control["peak"] - control["rss_built"]
    added = mine["peak"] - mine["rss_built"]
    return [
        Row(
            f"13 peak RSS, {k(n)} SDS: structure_of + diff vs flatten_with_path of both",
            control["peak"],
            mine["peak"],
            at_most(2),
            unit="MiB peak",
            note=(
                f"each side in its own subprocess, peak RSS ({mine['method']}) with both trees built "
                f"(VmRSS then: control {control['rss_built']:.0f} MiB, treeshape {mine['rss_built']:.0f} MiB); "
                f"{control['seconds']:.2f} s vs {mine['seconds']:.2f} s"
            ),
            detail=detail,
        ),
        Row(
            f"13 peak RSS added above the built trees, {k(n)} SDS",
            added_control,
            added,
            None,
            unit="MiB",
            measured=added / added_control if added_control > 0 else float("nan"),
            note="the same two subprocesses: peak minus VmRSS after building the trees",
            detail=detail,
        ),
    ]
