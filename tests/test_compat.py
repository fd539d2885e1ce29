"""Pin the JAX-internal behaviour `treeshape._compat` relies on, so an upgrade fails here first."""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from treeshape import _compat


_PACKAGE = pathlib.Path(_compat.__file__).parent


def test_only_compat_imports_jax_internals():
    offenders = [
        path.name
        for path in sorted(_PACKAGE.glob("*.py"))
        if path.name != "_compat.py" and re.search(r"^\s*(from|import)\s+jax\._src", path.read_text(), re.M)
    ]
    assert offenders == []


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
        with pytest.raises(_compat.JaxFeatureMissing, match=r"unreduced or reduced manual axes .* jax 0\.10\.0"):
            _compat.make_manual_axes({"i"}, unreduced={"j"})


def test_current_mesh_is_the_set_mesh():
    assert _compat.current_mesh().empty
    mesh = _mesh("d")
    with jax.set_mesh(mesh):
        assert _compat.current_mesh() == mesh
    assert _compat.current_mesh().empty


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
            with pytest.raises(_compat.JaxFeatureMissing, match=f"'{impl}' needs jax 0.10.2 or newer"):
                _compat.key_dtype(impl)
            with pytest.raises((ValueError, TypeError, KeyError)):
                jax.random.key(0, impl=impl)
    with pytest.raises(ValueError, match="unknown PRNG implementation 'bogus'"):
        _compat.key_dtype("bogus")
