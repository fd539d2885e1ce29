"""The only place treeshape touches JAX internals.

Each symbol below has no public equivalent in JAX 0.10.2; `tests/test_compat.py`
pins the behaviour treeshape relies on, so a JAX upgrade that changes it fails
loudly there instead of silently elsewhere.
"""

from typing import Any

import numpy as np
from jax._src import core as _core
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
