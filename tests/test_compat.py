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
