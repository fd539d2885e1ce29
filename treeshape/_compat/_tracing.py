"""Tracing: whether a trace is running, every setting that changes what tracing gives (JAX's
trace-context key, by name and as users set them), how JAX reads a call (one level of a pytree
with each child's key, a `jax.jit` wrapper's static arguments), and JAX's `TypeError` for a
traced shape.
"""

import threading
from collections.abc import Callable, Hashable
from typing import Any, Final

import jax
import jax.tree_util as jtu

from ._private import config as _config, core as _core, util as _util


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


class _ClearCounter:
    """Counts `jax.clear_caches()` calls: JAX clears every cache registered with it there (its
    `util.register_cache`, private: there is no public hook, and a probe that traces again to
    find out is fooled where JAX's caches evict an entry on their own)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def cache_clear(self) -> None:
        with self._lock:
            self.count += 1

    def cache_info(self) -> str:
        return f"treeshape: jax.clear_caches() called {self.count} times"

    def cache_keys(self) -> list[Any]:
        return []


_CLEARS: Final = _ClearCounter()  # held here: JAX registers caches weakly
_util.register_cache(_CLEARS, "treeshape.watch: how many times jax.clear_caches() ran")


def cache_clears() -> int:
    """How many times `jax.clear_caches()` ran since treeshape was imported."""
    return _CLEARS.count


# Settings that change what tracing gives, for a release whose trace-context key has no names.
_NAMED_SETTINGS: Final = (
    "jax_enable_x64",
    "jax_default_device",
    "jax_numpy_dtype_promotion",
    "jax_numpy_rank_promotion",
    "jax_default_matmul_precision",
    "jax_explicit_x64_dtypes",
    "jax_debug_key_reuse",
    "jax_threefry_partitionable",
    "jax_softmax_custom_jvp",
)


def trace_settings() -> dict[str, Any]:
    """JAX's own tracing-cache key (`config.trace_context()`, as `tracing_context` reads
    it) by setting name: `{"jax_enable_x64": False, "abstract_mesh_context_manager": ...,
    "axis_env_state": ..., ...}`.

    `jax.jit` traces a function again when any of these changes. There is no public
    equivalent. From jaxlib 0.8.1 the key's names come with it; before, the settings
    above are read by name, and the whole key is one more entry, `"jax_trace_context"`,
    so a change of any other part of it is still seen.
    """
    values = _config.trace_context()
    names = getattr(_config, "trace_context_names", None)
    if names is not None:
        try:
            return dict(zip(names(), values, strict=True))
        except (NotImplementedError, ValueError):  # a jaxlib without the names
            pass
    states = _config.config_states
    settings = {name: states[name].value for name in _NAMED_SETTINGS if name in states}
    settings["jax_trace_context"] = values
    return settings


# The entries of JAX's trace-context key that users set as something else: the mesh set with
# `jax.set_mesh` (its abstract mesh) and the named axes in scope (`vmap(..., axis_name=)`).
_KEY_ENTRY_NAMES: Final = {"abstract_mesh_context_manager": "mesh", "axis_env_state": "named_axes"}


def named_trace_settings() -> dict[str, Any]:
    """`trace_settings` as users set them: JAX's setting names (`"jax_enable_x64"`, ...),
    plus `"mesh"` (the abstract mesh set with `jax.set_mesh`, or None) and `"named_axes"`
    (`{axis name: size}` of the `vmap` axes in scope, or None) for the key's internal
    entries, whose names and values are JAX's own. A release whose key has no names
    (`trace_settings`) still gives `"mesh"`."""
    settings = {}
    for name, value in trace_settings().items():
        if name == "abstract_mesh_context_manager":
            value = jax.sharding.get_abstract_mesh()
            value = None if value.empty else value
        elif name == "axis_env_state":
            value = dict(getattr(value, "axis_sizes", {})) or None
        settings[_KEY_ENTRY_NAMES.get(name, name)] = value
    if "mesh" not in settings:
        mesh = jax.sharding.get_abstract_mesh()
        settings["mesh"] = None if mesh.empty else mesh
    return settings


def jit_static_arguments(jitted: Any) -> tuple[frozenset[int], frozenset[str]] | None:
    """The `static_argnums` and `static_argnames` of a `jax.jit` wrapper as it applies them
    (to arguments passed by position and by keyword): where only one was given, the other
    is completed through its function's signature. No public API says which; the wrapper
    keeps its settings as `_jit_info` on every supported release. None when that is not
    found."""
    info = getattr(jitted, "_jit_info", None)
    numbers, names = getattr(info, "static_argnums", None), getattr(info, "static_argnames", None)
    if not isinstance(numbers, tuple) or not isinstance(names, tuple):
        return None
    if not all(type(n) is int for n in numbers) or not all(type(n) is str for n in names):
        return None
    return frozenset(numbers), frozenset(names)


def is_traced_shape_error(error: BaseException) -> bool:
    """Whether `error` is JAX's `TypeError` for a shape (or another static value) that
    holds a tracer, as `jnp.zeros(n)` with `n` traced raises it: told by where it was
    raised (inside JAX, with a tracer among that function's values), not by its text."""
    if not isinstance(error, TypeError) or error.__traceback__ is None:
        return False
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    if not str(frame.f_globals.get("__name__", "")).startswith("jax."):
        return False
    for value in frame.f_locals.values():
        values = value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, _core.Tracer) for v in values):
            return True
    return False


# -- trees -----------------------------------------------------------------------------
_flatten_one_level_with_keys: Final[Callable[[Any], Any]] = (
    getattr(jtu, "flatten_one_level_with_keys", None) or jtu.default_registry.flatten_one_level_with_keys
)  # public from jax 0.10.2


def is_namedtuple(node_type: Any) -> bool:
    """Whether JAX flattens instances of `node_type` as a NamedTuple node (children keyed
    by field name)."""
    return (
        isinstance(node_type, type)
        and issubclass(node_type, tuple)
        and isinstance(getattr(node_type, "_fields", None), tuple)
    )


def namedtuple_keys(node_type: type) -> list[Any] | None:
    """The keys JAX's paths give the children of a NamedTuple node type (one
    `GetAttrKey` per field), or None for any other type."""
    if is_namedtuple(node_type):
        return [jtu.GetAttrKey(name) for name in node_type._fields]  # type: ignore[attr-defined]
    return None


def flatten_one_level_with_keys(node: Any) -> tuple[list[tuple[Any, Any]], Hashable]:
    """`(keyed children, node data)` of one pytree node, each child with the key that
    `jax.tree_util.tree_flatten_with_path` gives it.

    `jax.tree_util.flatten_one_level_with_keys` is public from jax 0.10.2
    (`jax.tree_util.default_registry` has it before, and returns None for a
    leaf), and it keys every child of a NamedTuple by the first field's name;
    here each child has its own field's key, as in its paths.

    Raises:
        ValueError: `node` is a leaf.
    """
    out = _flatten_one_level_with_keys(node)
    if out is None:
        raise ValueError(f"can't tree-flatten type: {type(node)}")
    keyed, data = out
    keyed = list(keyed)
    keys = namedtuple_keys(type(node)) if isinstance(node, tuple) else None
    if keys is not None and len(keys) == len(keyed) and all(type(key) is jtu.GetAttrKey for key, _ in keyed):
        keyed = [(key, child) for key, (_, child) in zip(keys, keyed, strict=True)]
    return keyed, data
