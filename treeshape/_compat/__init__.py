"""The compatibility wing: the only place treeshape knows how JAX releases differ, and the
only use of `jax._src` (its room `_private` imports JAX's private modules; the other rooms
take them from there).

treeshape supports every JAX release from its floor (0.8.0) to the newest. Each name below
either has no public equivalent in JAX, or is spelled differently across that range;
everything else in the package asks this front. Differences are found by feature detection
(`hasattr`, attribute lookups, what a plugin registered), never by comparing version
strings or matching JAX's message texts. `tests/test_compat.py` pins the behaviour of each
one on the running release, so an upgrade that changes it fails loudly there instead of
silently elsewhere. Where a release lacks a feature, only that feature degrades: asking for
it raises `JaxReleaseError`, which names the feature and the first release that has it.

The rest of the package imports this front, never a room of the wing:

- `_releases`: `JaxReleaseError`;
- `_types`: a value's type: abstract values, `ShapeDtypeStruct`s with their weak flag, given
  sharding and manual axes, typed PRNG keys, `TypePromotionError`;
- `_tracing`: the trace state, the tracing context and its settings, one level of a pytree
  with its keys, a `jax.jit` wrapper's static arguments, the traced-shape `TypeError`, how many
  times `jax.clear_caches()` ran;
- `_meshes`: the `jax.set_mesh` mesh, an equation's context mesh, `PartitionSpec` entries
  and text, `pcast`/`pvary`;
- `_symbolic`: symbolic dimensions (`jax.export` shape polymorphism);
- `_private`: the one module that imports `jax._src`, for the rooms (never the package);
- `_jaxprs`: the forward pass of `jax.vjp` and the values it saves, an equation's user line,
  `checkpoint_name` and the jaxpr it calls, a value's memory kind;
- `_programs`: compiled programs: their analyses, compiles counted, op names, the optimized
  module, simulated devices' compiles, XLA's HLO cost analysis, whether XLA:GPU compiles
  without a GPU, a `jax.pmap` wrapper over other devices.
"""

from ._jaxprs import (
    PASSES_THROUGH as PASSES_THROUGH,
    checkpoint_name_of as checkpoint_name_of,
    inner_jaxpr as inner_jaxpr,
    memory_kind as memory_kind,
    source_line as source_line,
    vjp_forward as vjp_forward,
)
from ._meshes import (
    context_mesh as context_mesh,
    current_mesh as current_mesh,
    pcast_varying as pcast_varying,
    spec_entries as spec_entries,
    spec_text as spec_text,
    with_context_mesh as with_context_mesh,
)
from ._programs import (
    JIT_OP_PREFIXES as JIT_OP_PREFIXES,
    MEMORY_STATS_FIELDS as MEMORY_STATS_FIELDS,
    PmapOver as PmapOver,
    compile_module as compile_module,
    compiles_without_device as compiles_without_device,
    cost_analysis as cost_analysis,
    cuda_starts_without_gpu as cuda_starts_without_gpu,
    dtype_named as dtype_named,
    hlo_text_cost_analysis as hlo_text_cost_analysis,
    kept_arguments as kept_arguments,
    lowered_kept_arguments as lowered_kept_arguments,
    lowered_module as lowered_module,
    memory_analysis as memory_analysis,
    module_cost_analysis as module_cost_analysis,
    optimized_hlo as optimized_hlo,
    optimized_module as optimized_module,
    optimized_module_proto as optimized_module_proto,
    optimized_text as optimized_text,
    pmap_over as pmap_over,
    program_cost_analysis as program_cost_analysis,
)
from ._releases import JaxReleaseError as JaxReleaseError
from ._symbolic import (
    SYMBOLIC_DIM_TYPE as SYMBOLIC_DIM_TYPE,
    always_negative as always_negative,
    broken_constraints as broken_constraints,
    constraint_beyond as constraint_beyond,
    dim_names as dim_names,
    dim_scope as dim_scope,
    evaluate_dim as evaluate_dim,
    is_symbolic as is_symbolic,
    linear_in as linear_in,
    make_scope as make_scope,
    parse_dim as parse_dim,
    scope_constraints as scope_constraints,
    unsatisfiable_constraint as unsatisfiable_constraint,
)
from ._tracing import (
    at_top_level as at_top_level,
    cache_clears as cache_clears,
    flatten_one_level_with_keys as flatten_one_level_with_keys,
    is_namedtuple as is_namedtuple,
    is_traced_shape_error as is_traced_shape_error,
    jit_static_arguments as jit_static_arguments,
    named_trace_settings as named_trace_settings,
    namedtuple_keys as namedtuple_keys,
    trace_settings as trace_settings,
    tracing_context as tracing_context,
)
from ._types import (
    GIVEN_SHARDING_FIELD as GIVEN_SHARDING_FIELD,
    HAS_MANUAL_AXIS_TYPE as HAS_MANUAL_AXIS_TYPE,
    MANUAL_AXES_FIELD as MANUAL_AXES_FIELD,
    PRNG_IMPLS as PRNG_IMPLS,
    UNREDUCED_MANUAL_AXES as UNREDUCED_MANUAL_AXES,
    TypePromotionError as TypePromotionError,
    abstract_leaf as abstract_leaf,
    abstractify as abstractify,
    axis_sets as axis_sets,
    convert_element_type as convert_element_type,
    from_aval as from_aval,
    key_dtype as key_dtype,
    key_impls as key_impls,
    make_manual_axes as make_manual_axes,
    manual_axes as manual_axes,
    shape_dtype_struct as shape_dtype_struct,
    varying_axes as varying_axes,
    with_manual_axes as with_manual_axes,
)
