"""What the `out_structure` and `cost` caches may hold: a call whose pytree nodes carry
objects that are not plain data is answered, never held, by either cache, also when
`fn` needs the arrays bound in a partial as values."""

import functools as ft
import gc
import weakref

import jax
import jax.numpy as jnp
import pytest

import treeshape as ts


class Meta:
    """Node data that is not plain data (an object with attributes)."""

    def __init__(self, name):
        self.name = name


@jax.tree_util.register_pytree_node_class
class Box:
    def __init__(self, x, meta):
        self.x, self.meta = x, meta

    def tree_flatten(self):
        return (self.x,), self.meta

    @classmethod
    def tree_unflatten(cls, meta, children):
        return cls(children[0], meta)


def _sized(n, box):
    return jnp.zeros(int(n), jnp.float32) + box.x.sum()  # `int(n)`: needs the bound array as a value


def _scaled(scale, box):
    return box.x * scale


# A partial over an array whose value `fn` needs, and one over an array it only traces.
PARTIALS = pytest.mark.parametrize(
    ("fn", "shape"),
    [(ft.partial(_sized, jnp.array(3)), (3,)), (ft.partial(_scaled, jnp.array(2.0)), (4,))],
    ids=["bound-value-needed", "bound-abstract"],
)


def _collected(ref):
    gc.collect()
    return ref() is None


@PARTIALS
def test_out_structure_holds_no_entry_whose_node_data_is_not_plain(fn, shape):
    meta = Meta("w")
    ref = weakref.ref(meta)
    for _ in range(2):
        assert ts.out_structure(fn, Box(jnp.ones(4, jnp.float32), meta)).tree.shape == shape
    info = ts.cache_info()
    assert (info.hits, info.misses, info.size) == (0, 2, 0)
    del meta
    assert _collected(ref)


@PARTIALS
def test_cost_holds_no_entry_whose_node_data_is_not_plain(fn, shape):
    meta = Meta("w")
    ref = weakref.ref(meta)
    # The oracle's own node data: JAX's caches may hold what it compiled (jax 0.8.0 does).
    expected = jax.jit(fn).lower(Box(jnp.ones(4, jnp.float32), Meta("w"))).compile().memory_analysis()
    for _ in range(2):
        cost = ts.cost(fn, Box(jnp.ones(4, jnp.float32), meta))
        assert cost.output_bytes == expected.output_size_in_bytes == 4 * shape[0]
    info = ts.cache_info()
    assert (info.cost_hits, info.cost_misses, info.cost_size) == (0, 2, 0)
    del meta
    jax.clear_caches()  # JAX's own jit caches hold the treedefs of the programs cost compiled
    assert _collected(ref)


def test_the_same_calls_with_plain_node_data_are_held_and_hit():
    box = {"x": jnp.ones(4, jnp.float32)}  # plain nodes: held
    sized = lambda n, box: jnp.zeros(int(n), jnp.float32) + box["x"].sum()  # noqa: E731
    for _ in range(2):
        assert ts.out_structure(ft.partial(sized, jnp.array(3)), box).tree.shape == (3,)
        assert ts.cost(ft.partial(sized, jnp.array(3)), box).output_bytes == 12
    info = ts.cache_info()
    assert (info.hits, info.misses, info.cost_hits, info.cost_misses) == (1, 1, 1, 1)
    # The abstract key's marker and the entry keyed by the bound array's value, in each cache.
    assert (info.size, info.cost_size) == (2, 2)
