"""Case 7, `memory`: inferring a 64 GiB output adds (almost) nothing to peak RSS.

In a fresh subprocess per side, `ts.out_structure` / `jax.eval_shape` of
`lambda a, b: jnp.tanh(a @ b)` on `ShapeDtypeStruct`s f32[131072,4096] and
f32[4096,131072], whose output is f32[131072,131072] = 64 GiB. The probe
warms up the tracing machinery on small shapes, resets the peak RSS to the
current RSS (`echo 5 > /proc/self/clear_refs`), then reads `VmHWM` from
`/proc/self/status` before and after the call. Goal: <200 MB added.

Why it is a fair and a working measurement: each side runs alone in its own
process, after the same warm-up. A third subprocess, the *control*, really
allocates 256 MiB and must show about +256 MiB, proving the probe can see
memory. `ru_maxrss` alone is not enough here: it never decreases and, in a
child started by the benchmark, already starts at the parent's size (the
high-water mark of the process it was forked from), so it hides any growth
below that (the JSON records it too: the control shows about +70 MiB by
`ru_maxrss` for +260 MiB real).
"""

import gc
import math
import resource
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import treeshape as ts

from harness import Config, Goal, Row, case, peak_rss_mb, probe, reset_peak, run_probe, status_mb


BIG = 2**17  # a (BIG, BIG) float32 matrix is 64 GiB
CONTROL_MIB = 256


def _control(fn: Callable[..., Any], a: Any, b: Any) -> Any:
    """Not an inference: really allocate CONTROL_MIB, to show the probe sees memory."""
    n = CONTROL_MIB * 2**20 // 4
    return jnp.ones(n, jnp.float32).block_until_ready()


SIDES: dict[str, Callable[..., Any]] = {
    "eval_shape": jax.eval_shape,
    "treeshape": ts.out_structure,
    "control": _control,
}


@probe("memory")
def memory_probe(which: str) -> dict[str, Any]:
    """In a fresh process: peak RSS added by inferring a 64 GiB matmul's output."""
    infer = SIDES[which]
    fn = lambda a, b: jnp.tanh(a @ b)  # noqa: E731
    small = jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32)
    jax.eval_shape(fn, *small)  # warm up the tracing machinery
    ts.out_structure(fn, *small)
    jax.block_until_ready(jnp.ones(8) + 1)
    gc.collect()
    # The peak so far (imports, start-up) may exceed the current RSS, and would
    # hide growth below it: reset it to the current RSS where Linux allows.
    reset = reset_peak()
    before = peak_rss_mb()
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = infer(fn, jax.ShapeDtypeStruct((BIG, 4096), jnp.float32), jax.ShapeDtypeStruct((4096, BIG), jnp.float32))
    after = peak_rss_mb()
    maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tree = out.tree if isinstance(out, ts.Structure) else out
    return {
        "method": "VmHWM after clear_refs" if reset else "ru_maxrss",
        "before": before,
        "after": after,
        "rss_after": status_mb("VmRSS") or 0.0,
        "ru_maxrss_before": maxrss_before,
        "ru_maxrss_after": maxrss_after,
        "output_gib": math.prod(tree.shape) * tree.dtype.itemsize / 2**30,
    }


@case("memory")
def memory(cfg: Config) -> list[Row]:
    """7. Inferring a 64 GiB output adds (almost) nothing to peak RSS."""
    base, mine = run_probe("memory", "eval_shape"), run_probe("memory", "treeshape")
    control = run_probe("memory", "control")
    added_base = base["after"] - base["before"]
    added = mine["after"] - mine["before"]
    added_control = control["after"] - control["before"]
    return [
        Row(
            f"7 peak RSS added, {mine['output_gib']:.0f} GiB matmul output",
            added_base,
            added,
            Goal("<", 200e6 / 2**20, "<200 MB added"),
            unit="MiB",
            measured=added,
            measured_unit="MiB",
            note=(
                "baseline: jax.eval_shape; each side in its own subprocess, "
                f"peak RSS ({mine['method']}) before/after the call; control: "
                f"really allocating {CONTROL_MIB} MiB adds +{added_control:.0f} MiB"
            ),
            detail={"eval_shape": base, "treeshape": mine, "control": control},
        )
    ]
