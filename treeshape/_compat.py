"""The only place treeshape touches JAX internals.

Each symbol below has no public equivalent in JAX 0.10.2; `tests/test_compat.py`
pins the behaviour treeshape relies on, so a JAX upgrade that changes it fails
loudly there instead of silently elsewhere.
"""

from typing import Any, Final

import numpy as np
from jax._src import config as _config, core as _core
from jax._src.lax import lax as _lax


def convert_element_type(x: Any, dtype: Any, weak_type: bool) -> Any:
    """`lax.convert_element_type` that can also set the `weak_type` flag.

    The public `lax.convert_element_type` always returns a strongly typed
    array, and `jnp` only makes weak arrays of the default dtypes. A zero carry
    for a weak `float16` leaf (what JAX's own loop-carry promotion produces)
    needs this. When only the flag changes it lowers to a same-dtype convert,
    which XLA removes: no runtime operation.
    """
    return _lax._convert_element_type(x, np.dtype(dtype), weak_type=weak_type)


def at_top_level() -> bool:
    """True when no JAX transformation is tracing (eager execution).

    Used to decide whether a leaf's concrete sharding can be honoured with a
    device placement (under a trace the value is a compile-time constant).
    """
    return bool(_core.trace_state_clean())


def tracing_context() -> tuple[Any, ...]:
    """Every setting that changes what tracing the same function on the same
    inputs gives: JAX's own trace-context key, plus the PRNG settings it omits.

    `jax.jit` keys its tracing cache on `config.trace_context()` (x64 and
    explicit-x64 policy, dtype and rank promotion, key-reuse checking, the
    mesh and abstract-mesh contexts, and the named axes in scope: `vmap` axis
    names and sizes). There is no public equivalent. The PRNG settings below
    change what `jax.random` returns under a trace too (a typed key under
    `jax_enable_custom_prng`, another key shape for another default
    implementation, an error under `jax_legacy_prng_key="error"`) but are not
    part of that key, so they are added here.
    """
    return (
        _config.trace_context(),
        _config.enable_custom_prng.value,
        _config.default_prng_impl.value,
        _config.legacy_prng_key.value,
    )


def abstractify(x: Any) -> Any:
    """The abstract value JAX traces for an array-like input: the same function
    `jax.eval_shape` applies to arrays, NumPy arrays, `ShapeDtypeStruct`s and
    duck arrays (shape, canonical dtype, weak type, sharding, manual axes).

    `jax.typeof` is its public counterpart but rejects `ShapeDtypeStruct`s;
    keying the cache on exactly what tracing sees makes those inputs one entry.
    """
    return _core.shaped_abstractify(x)


# -- what a compiled program needs (`ts.cost`) ----------------------------------------
# `jax.stages.Compiled.cost_analysis()` and `.memory_analysis()` are public, but JAX
# documents neither as a stable API: what they return has changed between releases.
# These two functions read them into one shape for every supported release.

_MEMORY_FIELDS: Final = {
    "argument": "argument_size_in_bytes",
    "output": "output_size_in_bytes",
    "temp": "temp_size_in_bytes",
    "alias": "alias_size_in_bytes",
}


def cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program as one dict (`{}` when the backend gives none).

    Older releases returned a list with one dict per program (one program for everything
    `jit` compiles), jax 0.10.2 the dict itself; a backend without the analysis returns
    `None` or raises.
    """
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # e.g. "cost analysis not implemented" on some plugin backends
        return {}
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return dict(analysis) if isinstance(analysis, dict) else {}


def memory_analysis(compiled: Any) -> dict[str, Any]:
    """The per-device bytes of a compiled program (`argument`, `output`, `temp`, `alias`), each
    as the backend reports it (possibly negative, a sentinel) or `None` when it does not.

    `memory_analysis()` returns a `CompiledMemoryStats` whose `*_size_in_bytes` fields name
    these figures on every supported release (`None` from a backend without the analysis).
    """
    try:
        stats = compiled.memory_analysis()
    except Exception:
        stats = None
    if isinstance(stats, (list, tuple)):  # one entry per program, as cost_analysis once was
        stats = stats[0] if stats else None
    return {name: getattr(stats, field, None) for name, field in _MEMORY_FIELDS.items()}
