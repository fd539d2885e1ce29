"""Pin the JAX-internal behaviour `treeshape._compat` relies on, so an upgrade fails here first."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeshape as ts
from treeshape import _compat
from treeshape._cost import _target


_PACKAGE = pathlib.Path(ts.__file__).parent


def test_only_one_module_imports_jax_internals():
    importers = [
        str(path.relative_to(_PACKAGE))
        for path in sorted(_PACKAGE.rglob("*.py"))
        if re.search(r"^\s*(from|import)\s+jax\._src", path.read_text(), re.M)
    ]
    assert importers == ["_compat/_private.py"]


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.int8, jnp.uint32, jnp.complex64, jnp.float32])
def test_convert_element_type_sets_the_weak_flag(dtype):
    x = jnp.arange(3).astype(dtype)
    weak = _compat.convert_element_type(x, dtype, weak_type=True)
    assert (jax.typeof(weak).dtype, jax.typeof(weak).weak_type) == (jnp.dtype(dtype), True)
    np.testing.assert_array_equal(np.asarray(weak), np.asarray(x))
    strong = _compat.convert_element_type(weak, dtype, weak_type=False)
    assert not jax.typeof(strong).weak_type
    # Under a trace too; the same-dtype convert it lowers to is removed by XLA.
    jaxpr = jax.make_jaxpr(lambda y: _compat.convert_element_type(y, dtype, weak_type=True))(x)
    assert jaxpr.out_avals[0].weak_type
    assert _hlo_ops(lambda y: _compat.convert_element_type(y, dtype, weak_type=True), x) == _hlo_ops(lambda y: y, x)


def _hlo_ops(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return sorted(re.findall(r"= \S+ ([a-z][\w-]*)\(", text))


def test_convert_element_type_changes_dtype():
    out = _compat.convert_element_type(jnp.ones(2, jnp.int32), jnp.float16, weak_type=True)
    assert (out.dtype, out.weak_type) == (jnp.float16, True)


def test_at_top_level():
    assert _compat.at_top_level()
    seen = []

    def record(x):
        seen.append(_compat.at_top_level())
        return x

    jax.jit(record)(jnp.ones(2))
    jax.vmap(record)(jnp.ones(2))
    jax.grad(lambda x: record(x).sum())(jnp.ones(2))
    jax.make_jaxpr(lambda x: record(x))(jnp.ones(2))  # a new function: jit's trace cache would answer
    jax.lax.scan(lambda c, _: (record(c), None), jnp.ones(2), length=1)
    mesh = jax.make_mesh((8,), ("i",))
    x = jax.device_put(jnp.ones(8), jax.NamedSharding(mesh, jax.P("i")))
    jax.shard_map(record, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"))(x)
    assert seen == [False] * 6
    assert _compat.at_top_level()


def test_tracing_context_changes_with_every_setting_that_changes_tracing():
    base = _compat.tracing_context()
    assert _compat.tracing_context() == base
    for context in (
        jax.enable_custom_prng(True),
        jax.default_prng_impl("rbg"),
        jax.legacy_prng_key("error"),
        jax.debug_key_reuse(True),
        jax.numpy_dtype_promotion("strict"),
        jax.numpy_rank_promotion("raise"),
        jax.enable_x64(not jax.config.jax_enable_x64),
    ):
        with context:
            assert _compat.tracing_context() != base
    assert _compat.tracing_context() == base
    seen = []
    jax.vmap(lambda x: seen.append(_compat.tracing_context()) or x, axis_name="i")(jnp.ones((2, 1)))
    jax.vmap(lambda x: seen.append(_compat.tracing_context()) or x, axis_name="i")(jnp.ones((3, 1)))
    jax.vmap(lambda x: seen.append(_compat.tracing_context()) or x, axis_name="j")(jnp.ones((2, 1)))
    jax.vmap(lambda x: seen.append(_compat.tracing_context()) or x)(jnp.ones((2, 1)))
    assert len({seen[0], seen[1], seen[2], base}) == 4
    assert seen[3] == base  # an unnamed vmap axis cannot be referred to: not part of the context
    hash(base)


def test_trace_settings_name_the_settings_jax_keys_its_tracing_cache_on():
    base = _compat.trace_settings()
    assert base["jax_enable_x64"] == jax.config.jax_enable_x64
    assert _compat.trace_settings() == base
    for name, context in (
        ("jax_enable_x64", jax.enable_x64(not jax.config.jax_enable_x64)),
        ("jax_numpy_dtype_promotion", jax.numpy_dtype_promotion("strict")),
        ("jax_numpy_rank_promotion", jax.numpy_rank_promotion("raise")),
        ("jax_default_matmul_precision", jax.default_matmul_precision("highest")),
    ):
        with context:
            settings = _compat.trace_settings()
        changed = {key for key in base if settings.get(key) != base[key]}
        assert name in changed and changed <= {name, "jax_trace_context"}
    # The whole key, by name or (releases without its names) as one more entry: nothing missed.
    assert "jax_trace_context" in base or len(base) == len(_compat.tracing_context()[0])


def test_cache_clears_counts_each_jax_clear_caches_and_nothing_else():
    before = _compat.cache_clears()
    for _ in range(3):  # tracing, compiling and evicting never count
        jax.jit(lambda x: x + 1)(jnp.ones(2))
        jax.eval_shape(jnp.sin, jnp.ones(3))
    assert _compat.cache_clears() == before
    jax.clear_caches()
    jax.clear_caches()
    assert _compat.cache_clears() == before + 2


def test_abstractify_gives_one_aval_for_every_kind_of_array_input():
    class Duck:
        shape, dtype = (3,), np.dtype("float32")

    avals = {
        _compat.abstractify(x)
        for x in (jnp.ones(3, jnp.float32), np.ones(3, np.float32), jax.ShapeDtypeStruct((3,), jnp.float32), Duck())
    }
    assert avals == {jax.typeof(jnp.ones(3, jnp.float32))}
    weak = _compat.abstractify(jax.ShapeDtypeStruct((), jnp.float32, weak_type=True))
    assert weak == jax.typeof(jnp.asarray(1.0)).update(dtype=jnp.float32) and weak.weak_type
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    sharded = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=jax.NamedSharding(mesh, jax.P("d")))
    placed = jax.device_put(jnp.ones(8, jnp.float32), jax.NamedSharding(mesh, jax.P("d")))
    assert _compat.abstractify(sharded) == jax.typeof(placed) != jax.typeof(jnp.ones(8, jnp.float32))


# -- what differs between releases ------------------------------------------------------
def _mesh(name):
    return jax.make_mesh((8,), (name,), axis_types=(jax.sharding.AxisType.Explicit,))


def test_manual_axes_are_read_and_made_alike_on_every_release():
    mesh = _mesh("i")
    seen = {}

    def body(x):
        seen["invariant"] = _compat.axis_sets(jax.typeof(jnp.zeros(())))
        y = _compat.pcast_varying(jnp.zeros(()), ("i",))
        seen["aval"] = jax.typeof(y)
        seen["sds"] = jax.eval_shape(lambda: y)
        return x

    x = jax.device_put(jnp.ones(8), jax.NamedSharding(mesh, jax.P("i")))
    jax.shard_map(body, mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P("i"))(x)
    varying = frozenset({"i"})
    assert _compat.varying_axes(seen["aval"]) == varying
    assert _compat.axis_sets(seen["aval"]) == (varying, frozenset(), frozenset())
    assert seen["invariant"] is None
    assert _compat.varying_axes(jax.ShapeDtypeStruct((2,), jnp.float32)) == frozenset()
    assert _compat.manual_axes(jax.ShapeDtypeStruct((2,), jnp.float32)) is None
    native = _compat.make_manual_axes({"i"})
    sds = _compat.shape_dtype_struct((2,), jnp.float32, manual_axes=native)
    assert _compat.axis_sets(sds) == (varying, frozenset(), frozenset())
    assert _compat.varying_axes(_compat.with_manual_axes(sds, _compat.make_manual_axes({"j"}))) == {"j"}
    assert getattr(sds, _compat.MANUAL_AXES_FIELD) is not None


def test_unreduced_manual_axes_need_jax_0_10():
    if _compat.HAS_MANUAL_AXIS_TYPE:
        native = _compat.make_manual_axes({"i"}, unreduced={"j"})
        assert isinstance(native, jax.sharding.ManualAxisType)
        assert (native.varying, native.unreduced, native.reduced) == ({"i"}, {"j"}, frozenset())
        with pytest.raises(ValueError):  # JAX's own rule: an axis cannot be both
            _compat.make_manual_axes({"i"}, unreduced={"i"})
    else:
        with pytest.raises(ts.JaxReleaseError, match=r"unreduced or reduced manual axes .* jax 0\.10\.0"):
            _compat.make_manual_axes({"i"}, unreduced={"j"})


def test_a_missing_feature_is_the_public_release_error():
    err = ts.JaxReleaseError("the PRNG implementation 'x'", "0.10.2")
    assert isinstance(err, NotImplementedError) and type(err).__module__ == "treeshape"
    assert (err.feature, err.since) == ("the PRNG implementation 'x'", "0.10.2")
    assert str(err) == (
        f"treeshape: the PRNG implementation 'x' needs jax 0.10.2 or newer; this is jax {jax.__version__}. "
        "Upgrade JAX (`pip install -U 'jax>=0.10.2'`) to use it."
    )


def test_current_mesh_is_the_set_mesh():
    assert _compat.current_mesh().empty
    mesh = _mesh("d")
    with jax.set_mesh(mesh):
        assert _compat.current_mesh() == mesh
    assert _compat.current_mesh().empty


def test_an_equations_context_takes_another_mesh_and_keeps_the_rest():
    """`ts.cost(..., target=)` moves a traced step onto the target's devices; each equation's
    context names the mesh JAX sets again when it evaluates or lowers the equation."""
    mesh = _mesh("d")
    with jax.set_mesh(mesh):
        context = jax.make_jaxpr(lambda x: x * 2)(jnp.ones(4)).eqns[0].ctx
    other = jax.sharding.AbstractMesh(mesh.axis_sizes, mesh.axis_names, axis_types=mesh.axis_types)
    moved = _compat.with_context_mesh(context, other)
    assert _compat.context_mesh(context) == mesh.abstract_mesh  # the original is as it was
    assert _compat.context_mesh(moved) is other and moved is not context
    assert (moved.compute_type, moved.threefry_partitionable) == (context.compute_type, context.threefry_partitionable)
    assert _compat.with_context_mesh(context, _compat.context_mesh(context)) is context
    with moved.manager:  # JAX sets it as the mesh of the equation
        assert jax.sharding.get_abstract_mesh() is other


def test_flatten_one_level_with_keys_keys_each_child_as_its_path_does():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    for node in (Pair(1, 2), {"x": 1, "y": (2,)}, [1, 2], (1,), None):
        keyed, _ = _compat.flatten_one_level_with_keys(node)
        paths = [
            path[0]
            for path, _ in jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x, node=node: x is not node)[0]
        ]
        assert [key for key, _ in keyed] == paths
    keyed, data = _compat.flatten_one_level_with_keys(Pair(1, 2))
    assert [jax.tree_util.keystr((key,)) for key, _ in keyed] == [".a", ".b"] and [c for _, c in keyed] == [1, 2]
    assert _compat.namedtuple_keys(Pair) == [jax.tree_util.GetAttrKey("a"), jax.tree_util.GetAttrKey("b")]
    assert _compat.namedtuple_keys(tuple) is None
    for leaf in (1, jnp.ones(2), "s"):
        with pytest.raises(ValueError):
            _compat.flatten_one_level_with_keys(leaf)


def test_spec_entries_also_with_unreduced_axes():
    P = jax.sharding.PartitionSpec
    assert _compat.spec_entries(P("d", None)) == ("d", None)
    assert _compat.spec_entries(P()) == ()
    assert _compat.spec_entries(P(("a", "b"), unreduced={"c"})) == (("a", "b"),)


def test_type_promotion_error_is_what_strict_promotion_raises():
    with jax.numpy_dtype_promotion("strict"), pytest.raises(_compat.TypePromotionError):
        jnp.ones(2, jnp.bfloat16) + jnp.ones(2, jnp.float16)


def test_traced_shape_errors_are_told_by_where_they_are_raised():
    caught = []
    for fn in (lambda n: jnp.zeros(n), lambda n: jnp.ones((n, 2)), lambda n: jnp.zeros(2) + "s"):
        try:
            jax.eval_shape(fn, 3)
        except TypeError as e:
            caught.append(_compat.is_traced_shape_error(e))
    assert caught == [True, True, False]
    assert not _compat.is_traced_shape_error(ValueError("Shapes must be 1D sequences of concrete values"))


def test_prng_implementations_of_this_release():
    impls = _compat.key_impls()
    assert impls[0] == "threefry2x32" and {"rbg", "unsafe_rbg"} <= set(impls)
    for impl, (tag, _) in _compat.PRNG_IMPLS.items():
        if impl in impls:
            dtype = _compat.key_dtype(impl)
            assert str(dtype) == f"key<{tag}>"
            assert jax.random.key(0, impl=impl).dtype == dtype
            assert str(jax.random.key_impl(jax.random.key(0, impl=impl))) == impl
        else:  # a built-in implementation of a newer release
            with pytest.raises(ts.JaxReleaseError, match=f"'{impl}' needs jax 0.10.2 or newer"):
                _compat.key_dtype(impl)
            with pytest.raises((ValueError, TypeError, KeyError)):
                jax.random.key(0, impl=impl)
    with pytest.raises(ValueError, match="unknown PRNG implementation 'bogus'"):
        _compat.key_dtype("bogus")


# -- symbolic dimensions ------------------------------------------------------------------
def test_a_dimension_expression_reads_back_from_its_written_form_in_a_new_scope():
    b, s = jax.export.symbolic_shape("b, s", constraints=["b >= 2"])
    (m,) = jax.export.symbolic_shape("min(b, 4)", scope=b.scope)
    scope = _compat.make_scope(_compat.scope_constraints(b.scope))
    for d in (b, 2 * b + 1, (b + 1) // 2, b * s, m, b % 3, 4 * b - s):
        again = _compat.parse_dim(str(d), scope)
        assert str(again) == str(d) and _compat.dim_scope(again) is scope
        assert _compat.dim_names(again) == _compat.dim_names(d)
    assert _compat.dim_names(b * s + 1) == {"b", "s"}
    assert _compat.parse_dim("3", scope) == 3
    for bad in ("b, s", "", "(b", "b +", "1e9", "__import__('os')"):
        with pytest.raises(ValueError):
            _compat.parse_dim(bad, scope)


def test_evaluate_dim_binds_some_or_all_names_with_64_bit_arithmetic():
    b, s = jax.export.symbolic_shape("b, s")
    assert _compat.evaluate_dim(2 * b + 1, {"b": 5}) == 11 and type(_compat.evaluate_dim(b, {"b": 5})) is int
    assert _compat.evaluate_dim((b + 1) // 2, {"b": 6}) == 3
    assert _compat.evaluate_dim(b % 3, {"b": 7}) == 1
    (m,) = jax.export.symbolic_shape("max(b, 4)", scope=b.scope)
    assert [_compat.evaluate_dim(m, {"b": n}) for n in (2, 9)] == [4, 9]
    partly = _compat.evaluate_dim(b * s + 3, {"b": 2})
    assert str(partly) == "2*s + 3" and _compat.dim_scope(partly) is b.scope
    assert _compat.evaluate_dim(4096 * b * s, {"b": 2**20, "s": 2**20}) == 4096 * 2**40
    assert _compat.evaluate_dim(7, {"b": 1}) == 7 and _compat.evaluate_dim(b, {}) is b


def test_scope_constraints_are_as_written_and_rebuild_the_same_scope():
    (b,) = jax.export.symbolic_shape("b", constraints=["b >= 4", "mod(b, 2) == 0", "b <= 1024"])
    written = ("b >= 4", "mod(b, 2) == 0", "b <= 1024")
    assert _compat.scope_constraints(b.scope) == written  # not the `2*floordiv(b, 2) == b` JAX derives
    assert _compat.scope_constraints(_compat.make_scope(written)) == written
    assert _compat.scope_constraints(jax.export.symbolic_shape("c")[0].scope) == ()
    with pytest.raises(ValueError):
        _compat.make_scope(["b >="])


def test_broken_constraints_are_decided_only_for_bound_names():
    b, s = jax.export.symbolic_shape("b, s", constraints=["b >= 4", "mod(s, 2) == 0", "b + s <= 10"])
    assert _compat.broken_constraints(b.scope, {"b": 3}) == [("b >= 4", {"b"})]
    assert _compat.broken_constraints(b.scope, {"s": 3}) == [("mod(s, 2) == 0", {"s"})]
    assert _compat.broken_constraints(b.scope, {"b": 8, "s": 4}) == [("b + s <= 10", {"b", "s"})]
    assert _compat.broken_constraints(b.scope, {"b": 4, "s": 6}) == []


def test_constraint_beyond_finds_the_constraint_that_only_sizes_above_the_limit_satisfy():
    limit = 2**63 - 1
    assert _compat.constraint_beyond([f"b >= {2**70}"], limit) == f"b >= {2**70}"
    assert _compat.constraint_beyond(["b >= 4", f"c >= {2**63}"], limit) == f"c >= {2**63}"
    assert _compat.constraint_beyond(["b >= 2*c", f"c >= {2**62}"], limit) is None  # c may be 2**62, b 2**63
    assert _compat.constraint_beyond([f"b <= {2**70}", "b >= 4"], limit) is None  # undecided: JAX's error is caught
    assert _compat.constraint_beyond([], limit) is None


def test_always_negative_decides_only_what_every_allowed_size_gives():
    scope = _compat.make_scope(["b <= 3"])
    assert _compat.always_negative(_compat.parse_dim("b - 5", scope))
    assert not _compat.always_negative(_compat.parse_dim("b - 3", scope))  # 0 at b = 3
    free = _compat.make_scope()
    assert _compat.always_negative(_compat.parse_dim("-b", free))
    assert not _compat.always_negative(_compat.parse_dim("b - 5", free))  # undecided: JAX's error is caught


def test_unsatisfiable_constraint_is_the_first_that_contradicts_the_ones_before_it():
    assert _compat.unsatisfiable_constraint(["b >= 10", "c >= 2", "b <= 5"]) == "b <= 5"
    assert _compat.unsatisfiable_constraint(["b + c <= 1"]) == "b + c <= 1"  # each variable is >= 1
    assert _compat.unsatisfiable_constraint(["b >= 4", "mod(b, 2) == 0", "b <= 5"]) is None  # b = 4
    assert _compat.unsatisfiable_constraint([]) is None


def test_linear_in_reads_k_times_a_name_plus_a_constant():
    b, s = jax.export.symbolic_shape("b, s")
    assert _compat.linear_in(b, "b") == (1, 0)
    assert _compat.linear_in(3 * b - 2, "b") == (3, -2)
    (m,) = jax.export.symbolic_shape("min(b, 4)", scope=b.scope)
    for d in ((b + 1) // 2, m, b * s, b * b, b % 2):
        assert _compat.linear_in(d, "b") is None
    assert _compat.linear_in(s + 1, "b") is None and _compat.linear_in(5, "b") is None


def test_a_dimension_expression_is_an_abstract_weak_integer_for_jax():
    (b,) = jax.export.symbolic_shape("b")
    assert isinstance(b, _compat.SYMBOLIC_DIM_TYPE) and isinstance(2 * b, _compat.SYMBOLIC_DIM_TYPE)
    assert _compat.is_symbolic(b) and not _compat.is_symbolic(3)
    assert jax.eval_shape(lambda: b) == jax.ShapeDtypeStruct((), jax.dtypes.canonicalize_dtype(int), weak_type=True)
    assert _compat.abstractify(b) == jax.typeof(jnp.asarray(1))  # what tracing gives it: ~int32[] (x64: ~int64[])


def test_kept_arguments_leave_out_what_the_program_does_not_use():
    compiled = jax.jit(lambda a, b, c: a + c).lower(1.0, 2.0, 3.0).compile()
    assert _compat.kept_arguments(compiled, 3) == [0, 2]
    assert _compat.kept_arguments(object(), 3) is None


def test_jit_static_arguments_are_the_wrappers_own_one_side_completed_through_its_signature():
    def f(x, n, *, mode="tile"):
        return x

    assert _compat.jit_static_arguments(jax.jit(f, static_argnames=("n", "mode"))) == ({1}, {"n", "mode"})
    assert _compat.jit_static_arguments(jax.jit(f, static_argnums=1)) == ({1}, {"n"})
    assert _compat.jit_static_arguments(jax.jit(f, static_argnums=1, static_argnames="mode")) == ({1}, {"mode"})
    assert _compat.jit_static_arguments(jax.jit(f)) == (set(), set())
    assert _compat.jit_static_arguments(f) is None


@pytest.mark.parametrize(
    "dtype", [jnp.bool_, jnp.int8, jnp.int32, jnp.uint8, jnp.float16, jnp.bfloat16, jnp.float32, jnp.complex64]
)
def test_the_compiled_program_gives_its_buffer_assignment_and_module(dtype):
    """XLA's messages read with the field numbers of `_hlo.Fields`: the entry parameter of
    this dtype and shape, its logical buffer and its allocation."""
    from treeshape._cost._buffers import _assignment
    from treeshape._cost._hlo import Module as _Module

    compiled = jax.jit(lambda x: (x, x.sum())).lower(jax.ShapeDtypeStruct((3, 5), dtype)).compile()
    assignment = _compat.memory_analysis(compiled)["buffer_assignment"]
    module = _compat.optimized_module(compiled)
    assert isinstance(assignment, bytes) and isinstance(module, bytes)
    m = _Module.read(module)
    (parameter,) = [m.instructions[i] for i in m.parameters[m.entry].values()]
    assert (parameter.opcode, parameter.parameter) == ("parameter", 0)
    assert (parameter.shape.dtype, parameter.shape.dims) == (np.dtype(dtype).name, (3, 5))
    assert m.sequences[m.entry][0] in m.instructions and m.roots[m.entry] in m.instructions
    values, allocations = _assignment(assignment)
    (value,) = [v for v in values.values() if v.instruction == parameter.id]
    assert value.size == 15 * np.dtype(dtype).itemsize and allocations[value.allocation].entry_parameter


def test_the_optimized_text_of_a_program_is_costed_as_the_program():
    """A compiled program's optimized HLO text, parsed again by jaxlib and costed by XLA's HLO
    cost analysis, gives the figures XLA gives the program (a loop body is costed so)."""
    compiled = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(jnp.ones((8, 16)), jnp.ones((16, 4))).compile()
    text = _compat.optimized_text(compiled)
    assert text is not None and text.startswith("HloModule ")
    own, from_text = _compat.program_cost_analysis(compiled), _compat.hlo_text_cost_analysis(text)
    assert from_text["flops"] == own["flops"] >= 2 * 8 * 16 * 4
    assert from_text["bytes accessed"] == own["bytes accessed"]
    assert _compat.module_cost_analysis(compiled)["flops"] == own["flops"]
    assert _compat.hlo_text_cost_analysis("HloModule nothing") == {}
    assert _compat.optimized_text(object()) is None


def test_named_trace_settings_tell_the_mesh_and_the_named_axes_as_users_set_them():
    base = _compat.named_trace_settings()
    assert base["mesh"] is None and base["jax_enable_x64"] == jax.config.jax_enable_x64
    seen = []
    jax.vmap(lambda x: seen.append(_compat.named_trace_settings()) or x, axis_name="b")(jnp.ones((2, 1)))
    if "jax_trace_context" in base:  # a release whose trace-context key has no names: the axes are in the whole key
        assert "named_axes" not in seen[0] and seen[0]["jax_trace_context"] != base["jax_trace_context"]
    else:
        assert base["named_axes"] is None and seen[0]["named_axes"] == {"b": 2}
    with jax.set_mesh(jax.make_mesh((1,), ("x",))):
        mesh = _compat.named_trace_settings()["mesh"]
    assert isinstance(mesh, jax.sharding.AbstractMesh) and (mesh.axis_names, mesh.axis_sizes) == (("x",), (1,))


def test_jax_names_the_operations_of_a_jitted_function_after_it():
    from treeshape._cost._hlo import Fields, Module, str_field

    def step(x):
        return jnp.sin(x) * 2

    compiled = jax.jit(step).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).compile()
    module = Module.read(_compat.optimized_module(compiled))
    names = {i.opcode: str_field(i.metadata, Fields.METADATA_OP_NAME) for i in module.instructions.values()}
    assert names["fusion"].startswith(_compat.JIT_OP_PREFIXES) and names["fusion"].endswith("(step)/mul")
    assert not names["parameter"].startswith(_compat.JIT_OP_PREFIXES)  # a parameter keeps the argument's name


def test_a_pmap_wrapper_s_settings_are_read_and_it_maps_over_other_devices():
    def step(scale, w, x):
        return w - scale * jax.lax.pmean(x.sum(0), "j"), x * 2

    settings = {"axis_name": "j", "in_axes": (None, None, 0), "static_broadcasted_argnums": 0, "donate_argnums": 2}
    pmapped = jax.pmap(step, **settings)
    found = _compat.pmap_over(pmapped)
    assert found is not None and found.static == (0,) and found.donated == (2,)  # (JAX counts 2 as dynamic 1)
    w, x = jax.ShapeDtypeStruct((8,), jnp.float32), jax.ShapeDtypeStruct((3, 5, 8), jnp.float32)
    assert found.size((0.5, w, x), {}) == 3
    devices = jax.devices()[-3:]
    ours = jax.make_jaxpr(lambda w, x: found.over(devices)(0.5, w, x))(w, x)
    theirs = jax.make_jaxpr(lambda w, x: jax.pmap(step, devices=devices, **settings)(0.5, w, x))(w, x)
    assert str(ours) == str(theirs) and "donated_invars=(False, True)" in str(ours)
    (mapped,) = ours.jaxpr.eqns[0].params["jaxpr"].eqns
    assert list(mapped.params["mesh"].devices.flat) == devices
    assert _compat.pmap_over(jax.jit(step)) is None and _compat.pmap_over(step) is None


@pytest.mark.parametrize("name", ["bool", "int4", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex128"])
def test_dtype_named_gives_the_dtype_jax_numpy_names(name):
    assert _compat.dtype_named(name) == np.dtype(getattr(jnp, name)) and _compat.dtype_named(name).name == name


def test_dtype_named_keeps_a_name_jax_numpy_has_no_dtype_for():
    assert _compat.dtype_named("token") == "token" and _compat.dtype_named("xla type 99") == "xla type 99"


def test_the_given_sharding_field_of_a_shape_dtype_struct_holds_what_sharding_returns():
    mesh = jax.make_mesh((1,), ("x",))
    named = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    for given in (None, named, jax.sharding.SingleDeviceSharding(jax.devices()[0])):
        leaf = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=given)
        assert getattr(leaf, _compat.GIVEN_SHARDING_FIELD) is leaf.sharding is given
    # A bare PartitionSpec is kept as given; `sharding` makes it a NamedSharding on the mesh in context.
    spec = jax.sharding.PartitionSpec("x")
    leaf = jax.ShapeDtypeStruct((2,), jnp.float32, sharding=spec)
    with jax.set_mesh(mesh):
        assert leaf.sharding == jax.sharding.NamedSharding(mesh, spec)
    assert getattr(leaf, _compat.GIVEN_SHARDING_FIELD) is spec  # (the slot, on every supported release)


def test_the_cuda_plugin_starts_and_compiles_a_matrix_product_without_a_gpu_from_jax_0_10():
    """JAX kept to the CPU (tests/conftest.py, which also lets jax 0.8.0's plugin start without
    CUDA's libraries): XLA:GPU describes an H100's topology, and from jax 0.10.0 compiles a
    matrix product for it without one; jax 0.8.0's wants autotuning results from the GPU."""
    assert _compat.cuda_starts_without_gpu()
    (h100,) = _target.devices("h100", "1x1x1")
    new_enough = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
    assert _compat.compiles_without_device(h100) is new_enough
    x = jax.ShapeDtypeStruct((16, 16), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(h100))
    try:
        jax.jit(jnp.dot).lower(x, x).compile()
    except jax.errors.JaxRuntimeError:  # "Expect autotune result cache hit for deviceless compilation"
        compiled = False
    else:
        compiled = True
    assert compiled is new_enough


# -- jaxprs as a derivative's forward pass reads them (`ts.residuals`) ----------------------
def _offloading_forward():
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["h"],
        offload_src="device",
        offload_dst="pinned_host",
    )

    def loss(x):
        h = checkpoint_name(jnp.sin(x), "h")  # the named line
        return jnp.tanh(h).sum()

    return _compat.vjp_forward(jax.checkpoint(loss, policy=policy), [jax.ShapeDtypeStruct((3,), jnp.float32)])


def test_the_vjp_forward_ends_with_its_residuals_and_an_offload_reads_as_pinned_host():
    forward = _offloading_forward()
    assert forward.jaxpr.outvars[-len(forward.residuals) :] == forward.residuals
    kinds = sorted(_compat.memory_kind(v.aval) for v in forward.residuals)
    assert kinds == ["device", "pinned_host"]  # tanh's derivative, and the offloaded `h`
    (offload,) = [e for e in forward.jaxpr.eqns if e.primitive.name == "device_put"]
    assert offload.primitive.name in _compat.PASSES_THROUGH
    (named,) = [e for e in forward.jaxpr.eqns if e.outvars[0] is offload.invars[0]]
    assert _compat.checkpoint_name_of(named) == "h"
    assert _compat.checkpoint_name_of(offload) is None
    line = next(
        i for i, text in enumerate(pathlib.Path(__file__).read_text().splitlines(), 1) if "# the named line" in text
    )
    assert _compat.source_line(named) == f"test_compat.py:{line}"


def test_an_equation_that_calls_a_jaxpr_hands_on_its_outputs_one_for_one():
    closed = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x) + jax.lax.scan(lambda c, y: (c, c * y), x, x)[1])(jnp.ones(3))
    calls = {e.primitive.name: e for e in closed.jaxpr.eqns if _compat.inner_jaxpr(e) is not None}
    assert set(calls) == {"jit", "scan"}
    for eqn in calls.values():
        assert len(_compat.inner_jaxpr(eqn).outvars) == len(eqn.outvars)
    assert all(_compat.inner_jaxpr(e) is None for e in closed.jaxpr.eqns if e.primitive.name in ("add", "mul"))
