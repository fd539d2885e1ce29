"""The only place treeshape knows how JAX releases differ, and the only use of `jax._src`.

treeshape supports every JAX release from its floor (0.8.0) to the newest.
Each function or constant below either has no public equivalent in JAX, or
is spelled differently across that range; everything else in the package
asks this module. Differences are found by feature detection (`hasattr`,
attribute lookups), never by comparing version strings or matching JAX's
message texts. `tests/test_compat.py` pins the behaviour of each one on the
running release, so an upgrade that changes it fails loudly there instead of
silently elsewhere.

Where a release lacks a feature, only that feature degrades: asking for it
raises `JaxReleaseError`, which names the feature and the first release
that has it.
"""

import contextlib
import functools as ft
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax._src import config as _config, core as _core, dtypes as _dtypes, mesh as _mesh
from jax._src.export import shape_poly as _shape_poly
from jax._src.lax import lax as _lax


class JaxReleaseError(NotImplementedError):
    """A feature that the installed JAX release lacks.

    treeshape works on every JAX release from its floor (0.8.0) to the newest;
    where a release lacks a feature (a PRNG implementation, unreduced or reduced
    manual axes under `jax.shard_map`), only asking for that feature fails, with
    this error. Its message names the feature and the first release that brings
    it; `feature` and `since` hold them.

    Attributes:
        feature: What was asked for, in words (`"the PRNG implementation 'rbg'"`).
        since: The first JAX release that has it (`"0.10.2"`).

    Examples:
        >>> import treeshape as ts
        >>> err = ts.JaxReleaseError("unreduced manual axes", "99.0")
        >>> isinstance(err, NotImplementedError), err.since
        (True, '99.0')
        >>> print(err)
        treeshape: unreduced manual axes needs jax 99.0 or newer; this is jax ... Upgrade JAX ...
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    def __init__(self, feature: str, since: str) -> None:
        super().__init__(
            f"treeshape: {feature} needs jax {since} or newer; this is jax {jax.__version__}. "
            f"Upgrade JAX (`pip install -U 'jax>={since}'`) to use it."
        )
        self.feature, self.since = feature, since


# -- weak types, trace state, tracing context, abstract values --------------------------
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


def abstractify(x: Any) -> Any:
    """The abstract value JAX traces for an array-like input: the same function
    `jax.eval_shape` applies to arrays, NumPy arrays, `ShapeDtypeStruct`s and
    duck arrays (shape, canonical dtype, weak type, sharding, manual axes).

    `jax.typeof` is its public counterpart but rejects `ShapeDtypeStruct`s;
    keying the cache on exactly what tracing sees makes those inputs one entry.
    """
    return _core.shaped_abstractify(x)


@ft.lru_cache(maxsize=4096)  # a tree has few distinct types: reading a big one stays cheap
def from_aval(aval: Any) -> jax.ShapeDtypeStruct:
    """A JAX type as a `ShapeDtypeStruct`: shape, dtype, weak flag, and (on a mesh)
    the sharding with the manual axes, which a manual mesh's values carry only together."""
    if aval.sharding.mesh.empty:
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return shape_dtype_struct(
        aval.shape, aval.dtype, weak_type=aval.weak_type, sharding=aval.sharding, manual_axes=manual_axes(aval)
    )


def abstract_leaf(x: Any) -> jax.ShapeDtypeStruct:
    """What JAX traces for an array-like input (`abstractify`), as a `ShapeDtypeStruct`."""
    return from_aval(abstractify(x))


# -- what a compiled program needs (`ts.cost`) ----------------------------------------
# `jax.stages.Compiled.cost_analysis()` and `.memory_analysis()` are public, but JAX
# documents neither as a stable API: what they return has changed between releases.
# These two functions read them into one shape for every supported release.

_MEMORY_FIELDS: Final = {
    "argument": "argument_size_in_bytes",
    "output": "output_size_in_bytes",
    "temp": "temp_size_in_bytes",
    "alias": "alias_size_in_bytes",
    "peak": "peak_memory_in_bytes",
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
    as the backend reports it (possibly negative, a sentinel) or `None` when it does not;
    `buffer_assignment`, XLA's buffer assignment (see `Fields`), or `None`; and `live_ranges`,
    the compiler's own schedule and live ranges as it dumps them, where a deviceless compile
    carries them (`_cost._deviceless`), else `None`.

    `memory_analysis()` returns a `CompiledMemoryStats` whose `*_size_in_bytes` fields name
    these figures on every supported release (`None` from a backend without the analysis).
    """
    try:
        stats = compiled.memory_analysis()
    except Exception:
        stats = None
    if isinstance(stats, (list, tuple)):  # one entry per program, as cost_analysis once was
        stats = stats[0] if stats else None
    figures = {name: getattr(stats, field, None) for name, field in _MEMORY_FIELDS.items()}
    assignment = getattr(stats, "serialized_buffer_assignment_proto", None)
    figures["buffer_assignment"] = assignment if isinstance(assignment, bytes) and assignment else None
    live_ranges = getattr(stats, "live_ranges", None)  # a deviceless TPU compile's, from its dump
    figures["live_ranges"] = live_ranges if isinstance(live_ranges, str) and live_ranges else None
    return figures


# -- how many programs XLA compiles ------------------------------------------------------------
# JAX reports each backend compile as this duration event, on every supported release.
_COMPILE_EVENT: Final = "/jax/core/compile/backend_compile_duration"
_counting = threading.local()
_listening: list[bool] = []


def _on_duration(event: str, duration_secs: float, **_: str | int) -> None:
    if event == _COMPILE_EVENT and getattr(_counting, "counts", None):
        for count in _counting.counts:
            count[0] += 1


@contextlib.contextmanager
def counting_compiles() -> Iterator[list[int]]:
    """Count the programs XLA compiles in this thread inside the block (JAX's own compile
    event: the user's program, loop bodies compiled alone, a target's compile): the
    yielded list's one element."""
    if not _listening:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening.append(True)
    count = [0]
    counts = getattr(_counting, "counts", None)
    if counts is None:
        counts = _counting.counts = []
    counts.append(count)
    try:
        yield count
    finally:
        counts.remove(count)


# -- what is at a compiled program's peak (`Cost.buffers`) ---------------------------------
# How JAX names an operation of a jitted function in the program's metadata: the function's
# `jit(name)` (`pjit(name)` in older releases, `pmap(name)` for a `jax.pmap`) and the path
# of transformations and scopes.
JIT_OP_PREFIXES: Final = ("jit(", "pjit(", "pmap(")


def dtype_named(name: str) -> Any:
    """The NumPy dtype that `jax.numpy` names `name` (`"bfloat16"`, `"float8_e4m3fn"`), or
    `name` itself where JAX has no such dtype: a narrow type XLA gains before JAX does
    (every type in `_cost._hlo.PRIMITIVE_TYPES` but `tuple`, `opaque` and `token` is
    named on jax 0.8.0 to 0.10.2)."""
    try:
        return np.dtype(getattr(jax.numpy, name)) if hasattr(jax.numpy, name) else name
    except TypeError:  # a name of something else
        return name


def optimized_module(compiled: Any) -> bytes | None:
    """The compiled (optimized, scheduled) program as a serialized `xla.HloModuleProto`, or
    None where there is not exactly one. `runtime_executable()` is public in `jax.stages`."""
    try:
        modules = compiled.runtime_executable().hlo_modules()
        if len(modules) != 1:
            return None
        data = modules[0].as_serialized_hlo_module_proto()
    except Exception:
        return None
    return data if isinstance(data, bytes) else None


def kept_arguments(compiled: Any, n_arguments: int) -> list[int] | None:
    """The positions (among the `n_arguments` leaves it was lowered with) of the arguments the
    compiled program takes, in parameter order: `jax.jit` leaves out unused ones
    (`keep_unused=False`). No public API says which; JAX's executable keeps the set as
    `_kept_var_idx` on every supported release. None when that is not found."""
    kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
    if not isinstance(kept, (set, frozenset, list, tuple)) or not all(isinstance(i, int) for i in kept):
        return None
    return sorted(i for i in kept if 0 <= i < n_arguments)


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


# `jax.dtypes.TypePromotionError` is public from jax 0.8.1; the class is the same before.
TypePromotionError: Final[type[Exception]] = getattr(jax.dtypes, "TypePromotionError", _dtypes.TypePromotionError)


# -- typed PRNG keys -------------------------------------------------------------------
# JAX's built-in PRNG implementations: the name `jax.random.key(..., impl=)` takes, the
# tag its key dtype prints (`key<fry>`), and the first release that has it.
PRNG_IMPLS: Final = {
    "threefry2x32": ("fry", "0.8.0"),
    "rbg": ("rbg", "0.8.0"),
    "unsafe_rbg": ("urbg", "0.8.0"),
    "threefry4x32": ("fry4", "0.10.2"),
    "philox2x32": ("phx2", "0.10.2"),
    "philox4x32": ("phx4", "0.10.2"),
}


@ft.cache
def key_dtype(impl: str) -> Any:
    """The typed-key dtype of the PRNG implementation `impl` (`"threefry2x32"`), made abstractly.

    `jax.random.key_dtype` from jax 0.10.1; an abstract `jax.random.key` before.

    Raises:
        JaxReleaseError: a built-in implementation that the running release lacks.
        ValueError: a name JAX does not know.
    """
    try:
        if hasattr(jax.random, "key_dtype"):
            return jax.random.key_dtype(impl)
        return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype
    except (ValueError, TypeError, KeyError) as err:
        if impl in PRNG_IMPLS:
            raise JaxReleaseError(f"the PRNG implementation {impl!r}", PRNG_IMPLS[impl][1]) from err
        raise ValueError(f"unknown PRNG implementation {impl!r}") from err


@ft.cache
def key_impls() -> tuple[str, ...]:
    """The built-in PRNG implementations that the running release has."""
    found = []
    for impl in PRNG_IMPLS:
        try:
            key_dtype(impl)
        except JaxReleaseError:
            continue
        found.append(impl)
    return tuple(found)


# -- manual axes under shard_map ------------------------------------------------------
# From jax 0.10.0 a value's manual axes are a `jax.sharding.ManualAxisType`
# (`varying`, `unreduced`, `reduced` axis sets) on `ShapeDtypeStruct`s and
# avals as `.manual_axis_type`. Before, they are `.vma`, a frozenset of the
# varying axes (avals) or None (`ShapeDtypeStruct`s), and manual axes cannot
# be unreduced or reduced. treeshape handles the field's value as opaque
# ("native") and reads it through the functions below.
HAS_MANUAL_AXIS_TYPE: Final = hasattr(jax.sharding, "ManualAxisType")
MANUAL_AXES_FIELD: Final = "manual_axis_type" if HAS_MANUAL_AXIS_TYPE else "vma"
_NO_AXES: Final[frozenset[str]] = frozenset()
UNREDUCED_MANUAL_AXES: Final = "unreduced or reduced manual axes (`jax.sharding.ManualAxisType`)"


# What a `ShapeDtypeStruct` was given as `sharding=` (a `Format`'s sharding): the slot
# `_sharding` on jax 0.8.0 to 0.10.2. The public `sharding` property returns the same object,
# but for a bare `PartitionSpec` (a `NamedSharding` on the mesh in context), and is a Python
# call: `to_json` reads the field of every leaf of a big tree. `sharding` where the slot is gone.
GIVEN_SHARDING_FIELD: Final = (
    "_sharding" if "_sharding" in getattr(jax.ShapeDtypeStruct, "__slots__", ()) else "sharding"
)


def manual_axes(x: Any) -> Any:
    """The native manual-axes value of a `ShapeDtypeStruct` or an aval (None when it has none)."""
    return getattr(x, MANUAL_AXES_FIELD, None)


def axis_sets(x: Any) -> tuple[frozenset[str], frozenset[str], frozenset[str]] | None:
    """`(varying, unreduced, reduced)` manual axes of a `ShapeDtypeStruct` or an aval,
    or None when all three are empty."""
    native = getattr(x, MANUAL_AXES_FIELD, None)
    if native is None:
        return None
    if HAS_MANUAL_AXIS_TYPE:
        if not (native.varying or native.unreduced or native.reduced):
            return None
        return frozenset(native.varying), frozenset(native.unreduced), frozenset(native.reduced)
    return (frozenset(native), _NO_AXES, _NO_AXES) if native else None


def varying_axes(x: Any) -> frozenset[str]:
    """The manual mesh axes a `ShapeDtypeStruct` or an aval varies over (empty outside `shard_map`)."""
    native = getattr(x, MANUAL_AXES_FIELD, None)
    if native is None:
        return _NO_AXES
    return frozenset(native.varying) if HAS_MANUAL_AXIS_TYPE else frozenset(native)


def make_manual_axes(varying: Iterable[str], unreduced: Iterable[str] = (), reduced: Iterable[str] = ()) -> Any:
    """The native manual-axes value for these axis sets (what `ShapeDtypeStruct` takes).

    Raises:
        JaxReleaseError: unreduced or reduced axes, on a release before 0.10.0.
        ValueError: an axis both varying and unreduced or reduced (JAX's own check).
    """
    varying, unreduced, reduced = frozenset(varying), frozenset(unreduced), frozenset(reduced)
    if HAS_MANUAL_AXIS_TYPE:
        return jax.sharding.ManualAxisType(varying=varying, unreduced=unreduced, reduced=reduced)
    if unreduced or reduced:
        raise JaxReleaseError(UNREDUCED_MANUAL_AXES, "0.10.0")
    return varying


def shape_dtype_struct(
    shape: Any, dtype: Any, *, weak_type: bool = False, sharding: Any = None, manual_axes: Any = None
) -> jax.ShapeDtypeStruct:
    """`jax.ShapeDtypeStruct(...)` with a native manual-axes value (`manual_axes(x)`)."""
    if manual_axes is None:
        return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak_type, sharding=sharding)
    return jax.ShapeDtypeStruct(
        shape, dtype, weak_type=weak_type, sharding=sharding, **{MANUAL_AXES_FIELD: manual_axes}
    )


def with_manual_axes(x: jax.ShapeDtypeStruct, manual_axes: Any, **changes: Any) -> jax.ShapeDtypeStruct:
    """`x.update(**changes)` with the native manual-axes value `manual_axes`."""
    updated: jax.ShapeDtypeStruct = x.update(**changes, **{MANUAL_AXES_FIELD: manual_axes})
    return updated


# `lax.pcast(x, axes, to="varying")` from jax 0.8.2; `lax.pvary(x, axes)` before
# (deprecated from 0.8.2 and removed in 0.11): the new name is tried first.
_pcast: Final[Callable[..., Any] | None] = getattr(lax, "pcast", None)
_pvary: Final[Callable[..., Any] | None] = getattr(lax, "pvary", None)


def pcast_varying(x: Any, axes: tuple[str, ...]) -> Any:
    """`x` made varying over the manual mesh axes `axes` (a no-op for axes it already varies over)."""
    if _pcast is not None:
        return _pcast(x, axes, to="varying")
    assert _pvary is not None  # every release has one of the two
    return _pvary(x, axes)


# -- meshes ----------------------------------------------------------------------------
# `jax.sharding.get_mesh` from jax 0.8.1; the same context is read directly before.
_get_mesh: Final[Callable[[], Any]] = getattr(jax.sharding, "get_mesh", _mesh.get_concrete_mesh)


def current_mesh() -> Any:
    """The concrete mesh set with `jax.set_mesh` (an empty mesh when none is). Top level only."""
    return _get_mesh()


def context_mesh(context: Any) -> Any:
    """The abstract mesh a jaxpr equation was traced under (its `ctx`), which JAX sets
    again when it evaluates or lowers the equation."""
    return context.cur_abstract_mesh


def with_context_mesh(context: Any, mesh: Any) -> Any:
    """A jaxpr equation's context (`eqn.ctx`, a `JaxprEqnContext`, no public type) with
    another abstract mesh, everything else as it was: JAX has no public way to build one.
    A new object: jax 0.10 interns contexts, so one is never changed in place."""
    if mesh is context.cur_abstract_mesh:
        return context
    kind = type(context)
    moved = object.__new__(kind)
    for name in kind.__slots__:
        if name != "__weakref__" and hasattr(context, name):
            object.__setattr__(moved, name, getattr(context, name))
    object.__setattr__(moved, "cur_abstract_mesh", mesh)
    return moved


def spec_entries(spec: Any) -> tuple[Any, ...]:
    """A `PartitionSpec`'s entries, one per leading dimension it names.

    From jax 0.10.0 iterating over or indexing a spec with unreduced or reduced
    axes raises, and `spec.partitions` gives the entries; before, the spec
    iterates over them (and has no `partitions`).
    """
    entries = getattr(spec, "partitions", None)
    return tuple(spec) if entries is None else tuple(entries)


def spec_text(spec: Any) -> str:
    """A `PartitionSpec` as the newest JAX prints it, `P('d', None)`, on every release
    (before jax 0.9.1 its repr is `PartitionSpec('d', None)`)."""
    text = "P(" + repr(spec_entries(spec))[1:-1]
    unreduced, reduced = getattr(spec, "unreduced", None), getattr(spec, "reduced", None)
    extra = [f"{name}={set(axes)!r}" for name, axes in (("unreduced", unreduced), ("reduced", reduced)) if axes]
    if extra:
        text += ("" if text == "P(" else " " if text.endswith(",") else ", ") + ", ".join(extra)
    return text + ")"


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


# -- symbolic dimensions (`jax.export` shape polymorphism) ----------------------------
# Public: making and parsing dimension expressions (`jax.export.symbolic_shape`, which
# reads back what `str` of an expression writes), `jax.export.SymbolicScope` and
# `jax.export.is_symbolic_dim`. Not public, on any supported release: an expression's
# variables and scope, its value under a binding, and a scope's constraints. JAX's own
# `Exported.call` does both with the members used below (`_get_vars`, `scope`,
# `_evaluate`, `_explicit_constraints`), which are the same from jax 0.8.0 to 0.10.2.
is_symbolic: Final[Callable[[Any], bool]] = jax.export.is_symbolic_dim
# The class of dimension expressions: as a pytree leaf, JAX takes one as an abstract
# weakly typed integer scalar (`jax.eval_shape(lambda: b)` is `~int32[]`).
SYMBOLIC_DIM_TYPE: Final[type] = type(jax.export.symbolic_shape("d")[0])


def dim_names(d: Any) -> frozenset[str]:
    """The dimension variables a symbolic dimension expression uses (`{"b"}` for `2*b + 1`)."""
    return frozenset(d._get_vars())


def dim_scope(d: Any) -> Any:
    """The `jax.export.SymbolicScope` a symbolic dimension belongs to."""
    return d.scope


def scope_constraints(scope: Any) -> tuple[str, ...]:
    """A scope's constraints as the user wrote them (`("b >= 4",)`), in order, as
    `SymbolicScope` takes them back. JAX adds `2*floordiv(b, 2) == b` just before a
    constraint `mod(b, 2) == 0`, and again when a scope is made from the list: such
    derived constraints are left out."""
    written = _CONSTRAINTS.get(scope)
    if written is None:
        constraints = scope._explicit_constraints
        derived = {i for i in range(len(constraints) - 1) if _derived(constraints[i], constraints[i + 1])}
        written = _CONSTRAINTS[scope] = tuple(c.debug_str for i, c in enumerate(constraints) if i not in derived)
    return written


# A scope's constraints never change once it is made; comparing big trees asks often.
_CONSTRAINTS: Final[weakref.WeakKeyDictionary[Any, tuple[str, ...]]] = weakref.WeakKeyDictionary()


def _derived(c: Any, then: Any) -> bool:
    """Whether constraint `c` is the one JAX derives from `then`, a `mod(e, k) == 0`:
    `k*floordiv(e, k) == e`, made and listed just before it."""
    eq = _shape_poly.Comparator.EQ
    if c.cmp != eq or then.cmp != eq or then.e2 != 0 or not is_symbolic(then.e1):
        return False
    factor = then.e1._to_factor()
    return factor is not None and factor.operation == "mod" and bool(c.e2 == factor.operands[0])


def make_scope(constraints: Iterable[str] = ()) -> Any:
    """A new `jax.export.SymbolicScope` with these constraints.

    Raises:
        ValueError: a constraint JAX cannot parse or that can never hold.
    """
    try:
        return jax.export.SymbolicScope(tuple(constraints))
    except NotImplementedError as err:  # e.g. two equality constraints with the same left side
        raise ValueError(str(err)) from None


def unsatisfiable_constraint(constraints: Sequence[str]) -> str | None:
    """The first of `constraints` (as written) that no sizes satisfy together with the ones
    before it, else None. JAX finds such a contradiction only when it first decides a
    comparison of a dimension variable in the scope (its `ValueError`, "Unsatisfiable
    constraint"), so each constraint's variables are compared once, in scopes made of the
    constraints up to it.

    Raises:
        ValueError: a constraint JAX cannot parse or that can never hold (`make_scope`).
    """
    for i, written in enumerate(constraints):
        scope = make_scope(constraints[: i + 1])
        constraint = scope._explicit_constraints[-1]
        for name in sorted(dim_names(constraint.diff) if is_symbolic(constraint.diff) else ()):
            try:
                bool(parse_dim(name, scope) >= 0)
            except ValueError:  # "Unsatisfiable constraint: ..."
                return written
    return None


def constraint_beyond(constraints: Sequence[str], limit: int) -> str | None:
    """The first of `constraints` (as written) after which some dimension variable it names is
    above `limit` for every size the constraints up to it allow (`b >= 2**70` against 64-bit
    sizes), else None. The constraints are satisfiable (`unsatisfiable_constraint`)."""
    for i, written in enumerate(constraints):
        scope = make_scope(constraints[: i + 1])
        constraint = scope._explicit_constraints[-1]
        for name in sorted(dim_names(constraint.diff) if is_symbolic(constraint.diff) else ()):
            try:
                if bool(parse_dim(name, scope) > limit):
                    return written
            except _shape_poly.InconclusiveDimensionOperation:  # sizes at or below the limit are allowed
                continue
    return None


def always_negative(d: Any) -> bool:
    """Whether the symbolic dimension `d` is below 0 for every size its scope's constraints allow.
    (JAX's error for an undecided comparison is not in `jax.errors` on jax 0.8.0; its class in
    `shape_poly` is the one raised on every release.)"""
    try:
        return bool(d < 0)
    except _shape_poly.InconclusiveDimensionOperation:  # below 0 for some sizes only
        return False


def parse_dim(text: str, scope: Any) -> Any:
    """One dimension expression written as JAX writes it (`"2*b + 1"`), read in `scope`.

    Raises:
        ValueError: a text that is not exactly one dimension expression.
    """
    try:
        dims = jax.export.symbolic_shape(text, scope=scope)
    except Exception as err:  # JAX's parser raises ValueError; `tokenize` a TokenError for a lone "("
        raise ValueError(f"{text!r} is not a dimension expression: {err}") from None
    if len(dims) != 1:
        raise ValueError(f"{text!r} is {len(dims)} dimensions, not one")
    return dims[0]


def evaluate_dim(d: Any, sizes: Mapping[str, int]) -> Any:
    """`d` with the dimension variables named in `sizes` replaced by those integers: an
    `int` when that binds all of its variables, else an expression of the others (in
    `d`'s scope, which keeps its constraints). Integers are returned as they are.

    JAX evaluates in its dimension dtype (int32 with x64 off), which would wrap around
    for large products: evaluation runs with 64-bit integers, and the result is a
    Python int.

    Raises:
        OverflowError: a step of the evaluation does not fit in 64 bits (NumPy would
            wrap it around, with a warning, into a wrong and often negative size).
    """
    if not is_symbolic(d):
        return d
    names = d._get_vars()
    if not names & sizes.keys():
        return d
    scope = d.scope
    env = {name: sizes[name] if name in sizes else _shape_poly._DimExpr._from_var(name, scope) for name in names}
    try:
        with _config.enable_x64(True), np.errstate(over="raise"):
            value = d._evaluate(env)
    except (FloatingPointError, OverflowError):
        raise OverflowError(f"{d} does not fit in 64 bits") from None
    return value if is_symbolic(value) else int(value)


def linear_in(d: Any, name: str) -> tuple[int, int] | None:
    """`(k, c)` when the expression `d` is `k*name + c` with `k != 0` (each of its terms is
    a constant or `name` itself), else None: the equations JAX's own solver for
    `Exported.call` reads a dimension variable from."""
    if not is_symbolic(d):
        return None
    k = c = 0
    for term, coeff in d._sorted_terms:
        if term.is_constant:
            c += int(coeff)
        elif term.to_var() == name:
            k += int(coeff)
        else:
            return None
    return (k, c) if k else None


def broken_constraints(scope: Any, sizes: Mapping[str, int]) -> list[tuple[str, frozenset[str]]]:
    """The constraints of `scope` that `sizes` breaks, each as written and with the
    names it uses; a constraint on names that `sizes` leaves free is not decided, so
    not listed."""
    broken = []
    for constraint in scope._explicit_constraints:
        diff = evaluate_dim(constraint.diff, sizes)
        if is_symbolic(diff):
            continue
        holds = diff == 0 if constraint.cmp == _shape_poly.Comparator.EQ else diff >= 0
        if not holds:
            names = dim_names(constraint.diff) if is_symbolic(constraint.diff) else frozenset()
            broken.append((constraint.debug_str, names))
    if len(broken) > 1:  # a constraint JAX derived is told as the user's own
        written = set(scope_constraints(scope))
        broken = [b for b in broken if b[0] in written] or broken
    return broken


# -- compiling for simulated devices (`_simulate`) --------------------------------------
# A program lowered here over an abstract mesh larger than this process is compiled in a
# child process with that many simulated CPU devices. JAX has no public API that compiles a
# lowered module apart from the function it was traced from (`jax.export` drops the abstract
# mesh's shardings on 0.10.2, and serializing an export needs flatbuffers), so these use
# JAX's own compile path: the same functions `jax.jit(...).lower(...).compile()` calls.

MEMORY_STATS_FIELDS: Final = (*_MEMORY_FIELDS.values(), "generated_code_size_in_bytes")

# XLA's CPU client gives device ids of one process 11 bits; a device count above this makes
# it refuse the program ("Multiprocess computations aren't implemented on the CPU backend")
# unless the process has cross-process collectives, which a one-process `jax.distributed`
# gives it.
_CPU_DEVICES_PER_PROCESS: Final = 2048


def lowered_module(lowered: Any) -> bytes:
    """A lowered program (`jax.stages.Lowered`) as StableHLO bytecode, with its locations (so
    the compiled program's metadata keeps the user's op names and source lines)."""
    from jax._src.interpreters import mlir

    module = lowered.compiler_ir("stablehlo")
    return bytes(mlir.module_to_bytecode(module))


def compile_module(module: bytes, devices: int) -> Any:
    """Compile StableHLO bytecode for `devices` CPU devices (this process must have them) with
    the options `jax.jit` compiles a partitioned program with: one replica, one partition per
    device (as the module's `mhlo.num_partitions` says), SPMD partitioning."""
    if devices > _CPU_DEVICES_PER_PROCESS:
        import socket

        with socket.socket() as s:  # a free loopback port for a coordinator of this process only
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax.extend import backend as jax_backend

    cpus = jax.devices("cpu")
    if len(cpus) < devices:
        raise RuntimeError(f"this process has {len(cpus)} CPU devices, not {devices}")
    context = mlir.make_ir_context()
    with context:
        parsed = mlir.ir.Module.parse(module)  # type: ignore[attr-defined]
        attributes = parsed.operation.attributes
        partitions = _int_attribute(attributes, "mhlo.num_partitions", 1)
        replicas = _int_attribute(attributes, "mhlo.num_replicas", 1)
        chosen = cpus[: partitions * replicas]
        assignment = np.array(chosen).reshape(replicas, partitions)
        options = compiler.get_compile_options(
            num_replicas=replicas, num_partitions=partitions, device_assignment=assignment
        )
        backend = jax_backend.get_backend("cpu")
        return compiler.backend_compile_and_load(backend, parsed, compiler.xc.DeviceList(tuple(chosen)), options, [])  # type: ignore[attr-defined]


def _int_attribute(attributes: Any, name: str, default: int) -> int:
    from jax._src.interpreters import mlir

    if name not in attributes:
        return default
    return int(mlir.ir.IntegerAttr(attributes[name]).value)  # type: ignore[attr-defined]


def optimized_hlo(compiled: Any) -> str:
    """The optimized HLO text of a loaded executable (what `Compiled.as_text()` gives)."""
    modules = compiled.hlo_modules()
    return "\n\n".join(m.to_string() for m in modules)


def optimized_module_proto(loaded: Any) -> bytes | None:
    """The optimized module of a loaded executable as a serialized `xla.HloModuleProto` (what
    `optimized_module` reads from a `jax.stages.Compiled`), or None where there is not one."""
    try:
        modules = loaded.hlo_modules()
        data = modules[0].as_serialized_hlo_module_proto() if len(modules) == 1 else None
    except Exception:
        return None
    return data if isinstance(data, bytes) else None


def lowered_kept_arguments(lowered: Any) -> Any:
    """The positions of the arguments a lowered program keeps (`jax.jit` leaves out unused
    ones), as `kept_arguments` reads them from a compiled one; None where not found."""
    kept = getattr(getattr(lowered, "_lowering", None), "compile_args", {}).get("kept_var_idx")
    return kept if isinstance(kept, (set, frozenset)) else None


# -- compiling for an accelerator this machine does not have (`target=`) ---------------------
def _hlo_cost_analysis() -> Any:
    """jaxlib's private `hlo_module_cost_analysis(client, module)`: XLA's HLO cost analysis of
    a module, run by a client of this process (no public API runs it on a module)."""
    from jax._src import lib

    analyse = getattr(getattr(lib, "_jax", None), "hlo_module_cost_analysis", None)
    return analyse if analyse is not None else lib.xla_client._xla.hlo_module_cost_analysis  # type: ignore[attr-defined]


def module_cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's HLO cost analysis of a compiled program's optimized module, run by this
    process's CPU client (`{}` where not found). A deviceless XLA:GPU compile answers
    `cost_analysis()` with None; the same analysis over the module it optimized gives its
    FLOPs and bytes."""
    try:
        from jax.extend import backend as jax_backend

        modules = compiled.runtime_executable().hlo_modules()
        if len(modules) != 1:
            return {}
        analysis = _hlo_cost_analysis()(jax_backend.get_backend("cpu"), modules[0])
    except Exception:
        return {}
    return dict(analysis) if isinstance(analysis, dict) else {}


def program_cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled program: the backend's own, else (a deviceless
    XLA:GPU compile gives none) that of the module it optimized."""
    return cost_analysis(compiled) or module_cost_analysis(compiled)


def hlo_text_cost_analysis(text: str) -> dict[str, Any]:
    """XLA's HLO cost analysis of a module given as HLO text (`{}` where it cannot be read):
    a loop body of an optimized program, made a module of its own (`_cost._hlo_loops`).
    jaxlib's private `hlo_module_from_text` is the only parser of that text."""
    try:
        from jax._src import lib
        from jax.extend import backend as jax_backend

        parse = getattr(getattr(lib.xla_client, "hlo", None), "hlo_module_from_text", None)  # type: ignore[attr-defined]
        if parse is None:  # jaxlib before 0.10 keeps it in `_xla`
            parse = lib.xla_client._xla.hlo_module_from_text  # type: ignore[attr-defined]
        module = parse(text)
        analysis = _hlo_cost_analysis()(jax_backend.get_backend("cpu"), module)
    except Exception:
        return {}
    return dict(analysis) if isinstance(analysis, dict) else {}


def optimized_text(compiled: Any) -> str | None:
    """The optimized HLO text of a compiled program (`Compiled.as_text()`, public), or None."""
    try:
        text = compiled.as_text()
    except Exception:
        return None
    return text if isinstance(text, str) and text else None


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"JaxReleaseError": JaxReleaseError}
