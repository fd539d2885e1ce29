"""Values built from a Structure (`zeros`, `ones`, `full`) and `astype`: the refusals
whose messages no other test pins word for word."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treeshape as ts


@jtu.register_pytree_node_class
class Described:
    """A node that holds only descriptions: its unflatten refuses an array."""

    def __init__(self, leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            raise ValueError("Described holds a ShapeDtypeStruct")
        self.leaf = leaf

    def tree_flatten(self):
        return (self.leaf,), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_a_tree_whose_nodes_refuse_arrays_is_a_type_error_naming_the_node(jit):
    s = ts.structure_of({"d": Described(jax.ShapeDtypeStruct((2,), jnp.float32))})
    with pytest.raises(TypeError) as info:
        jax.jit(s.zeros)() if jit else s.zeros()
    assert str(info.value) == (
        "treeshape.Structure.zeros: the tree cannot be rebuilt with new leaves: unflattening its nodes (Described) "
        "failed with ValueError: Described holds a ShapeDtypeStruct. Describe a tree whose node types rebuild from "
        "any leaves (their registered unflatten), or build the values from `s.tree` with `jax.tree.map`."
    )
    assert isinstance(info.value.__cause__, ValueError)


def test_a_complex_fill_names_the_first_three_real_leaves_and_how_many():
    s = ts.structure_of(
        {"a": jnp.zeros(3), "b": jnp.zeros(2, jnp.int32), "c": jnp.zeros(1), "d": jnp.zeros(1, bool), "e": jnp.zeros(4)}
    )
    with pytest.raises(TypeError) as info:
        s.full(1j)
    assert str(info.value) == (
        "treeshape.Structure.full: `value` 1j is complex, but tree['a'], tree['b'], tree['c'] and 1 more (4 of 5 "
        "leaves) are of an integer or real floating dtype, which JAX refuses to fill with a complex value (as "
        "`jnp.full` does). Fill with a real value, or make those leaves complex first: "
        "`s.astype(jnp.complex64, where=...)`."
    )
    assert s.astype(jnp.complex64, where=lambda path, leaf: path != "['d']").full(1j)["d"].all()


def test_astype_to_or_from_a_key_dtype_names_each_key_leaf():
    s = ts.structure_of({"k": jax.random.key(0), "k2": jax.random.key(1), "w": jnp.zeros(2)})
    with pytest.raises(TypeError) as info:
        s.astype(jnp.float32, where=lambda path, leaf: True)
    assert str(info.value) == (
        "treeshape.Structure.astype: no conversion to or from typed PRNG keys (f32): tree['k'] (key<fry>[]), "
        "tree['k2'] (key<fry>[]). Leave key leaves out with `where=`, or convert explicitly with "
        "`jax.random.key_data` / `jax.random.wrap_key_data`."
    )
