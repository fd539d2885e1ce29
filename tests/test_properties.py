"""Invariants over random pytrees, dtypes, shapes and weak flags (hypothesis)."""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from helpers import Box, ChexNode, Node, Pair
from hypothesis import given, settings, strategies as st
from jax import lax

import treeshape as ts


DTYPES = [
    jnp.bool_,
    jnp.int4,
    jnp.int8,
    jnp.int16,
    jnp.int32,
    jnp.int64,
    jnp.uint4,
    jnp.uint8,
    jnp.uint16,
    jnp.uint32,
    jnp.uint64,
    jnp.float8_e4m3fn,
    jnp.float8_e5m2,
    jnp.bfloat16,
    jnp.float16,
    jnp.float32,
    jnp.float64,
    jnp.complex64,
    jnp.complex128,
]
KEY_DTYPE = jax.random.key(0).dtype


def _canonical(dtype):
    """The dtype JAX really uses for `dtype` in the current precision mode."""
    return jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)


shapes = st.lists(st.integers(0, 3), min_size=0, max_size=5).map(tuple)


@st.composite
def array_leaves(draw):
    """A ShapeDtypeStruct leaf (cheap), sometimes weak, sometimes a typed key."""
    shape = draw(shapes)
    if draw(st.integers(0, 9)) == 0:
        return jax.ShapeDtypeStruct(shape, KEY_DTYPE)
    dtype = _canonical(draw(st.sampled_from(DTYPES)))
    weak = dtype in (jnp.int32, jnp.float32, jnp.complex64, jnp.int64, jnp.float64) and draw(st.booleans())
    return jax.ShapeDtypeStruct(shape, dtype, weak_type=weak)


keys = st.one_of(
    st.text(alphabet="abcdef", min_size=1, max_size=3),
    st.integers(0, 5),
)


def _containers(children):
    str_dicts = st.dictionaries(st.text(alphabet="abcxyz", min_size=1, max_size=3), children, max_size=3)
    int_dicts = st.dictionaries(st.integers(0, 5), children, max_size=3)
    return st.one_of(
        str_dicts,
        int_dicts,
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        st.tuples(children, children).map(lambda t: Node(*t)),
        st.tuples(children, children).map(lambda t: ChexNode(x=t[0], y=t[1])),
    )


def trees(leaves=None):
    leaves = array_leaves() if leaves is None else leaves
    return st.recursive(st.one_of(leaves, st.none()), _containers, max_leaves=8)


def _has_key_leaf(tree):
    return any(jnp.issubdtype(x.dtype, jax.dtypes.prng_key) for x in jax.tree.leaves(tree))


@given(trees())
def test_zeros_has_its_own_structure(tree):
    # Eager, at top level: no trace to leak from, and the leak checker would compile
    # every jnp.zeros again (it turns JAX's caches off). test_structure runs zeros()
    # under every transformation with the checker on.
    with jax.check_tracer_leaks(False):
        s = ts.structure_of(tree)
        assert ts.structure_of(s.zeros()) == s
        assert ts.structure_of(s.ones()) == s
        assert s.diff(s) == [] and s.matches(s.zeros())


@given(trees())
def test_identity_matches_structure_of_and_eval_shape(tree):
    s = ts.out_structure(lambda t: t, tree)
    assert s == ts.structure_of(tree)
    assert s.tree == jax.eval_shape(lambda t: t, tree)
    assert len(s) == len(jax.tree.leaves(tree))
    assert hash(s) == hash(ts.structure_of(tree))


@given(trees())
def test_x64_structures_report_their_dtypes_honestly(tree):
    with jax.enable_x64(True):
        wide = ts.structure_of(tree)
    narrow = ts.structure_of(tree)
    for a, b in zip(wide.leaves, narrow.leaves, strict=True):
        assert b.dtype == _canonical(a.dtype)  # x32 narrows 64-bit dtypes, x64 keeps them
    assert wide.treedef == narrow.treedef


MUTATIONS = ["shape", "dtype", "weak_type"]


@st.composite
def mutated(draw):
    """A tree, a copy with one leaf changed in one way, that leaf's path and the kind."""
    tree = draw(trees())
    leaves, treedef = jax.tree.flatten(tree)
    if not leaves:
        tree = {"only": jax.ShapeDtypeStruct((2,), jnp.float32)}
        leaves, treedef = jax.tree.flatten(tree)
    i = draw(st.integers(0, len(leaves) - 1))
    leaf = leaves[i]
    kind = draw(st.sampled_from(MUTATIONS))
    if kind == "shape":
        new = leaf.update(shape=(*leaf.shape, 1))
    elif kind == "dtype":
        new = leaf.update(dtype=jnp.int8 if leaf.dtype != jnp.int8 else jnp.uint8, weak_type=False)
        if leaf.weak_type:
            kind = ("dtype", "weak_type")
    else:
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            new, kind = leaf.update(shape=(*leaf.shape, 2)), "shape"
        else:
            new = leaf.update(weak_type=not leaf.weak_type)
    path = jtu.keystr(jtu.tree_flatten_with_path(tree)[0][i][0])
    return tree, jax.tree.unflatten(treedef, [new if j == i else x for j, x in enumerate(leaves)]), path, kind


@given(mutated())
def test_a_single_leaf_mutation_is_reported_exactly(case):
    tree, changed, path, kind = case
    kinds = kind if isinstance(kind, tuple) else (kind,)
    diff = ts.structure_of(tree).diff(changed)
    assert [(m.where, m.kind) for m in diff] == [("tree" + path, k) for k in kinds]


@st.composite
def node_mutations(draw):
    """A dict tree with one key renamed, added or removed, or one node's type changed."""
    inner = draw(trees())
    tree = {"k": inner, "z": jax.ShapeDtypeStruct((1,), jnp.float32)}
    how = draw(st.sampled_from(["rename", "add", "remove", "retype"]))
    if how == "rename":
        return tree, {"k2": inner, "z": tree["z"]}, [("tree['k']", "structure"), ("tree['k2']", "structure")]
    if how == "add":
        return tree, {**tree, "new": tree["z"]}, [("tree['new']", "structure")]
    if how == "remove":
        return tree, {"k": inner}, [("tree['z']", "structure")]
    return tree, {"k": Box(inner), "z": [tree["z"]]}, [("tree['k']", "structure"), ("tree['z']", "structure")]


@given(node_mutations())
def test_a_node_mutation_is_reported_by_path(case):
    tree, changed, expected = case
    assert [(m.where, m.kind) for m in ts.structure_of(tree).diff(changed)] == expected


small_leaves = st.builds(
    lambda shape, dtype, weak: jnp.zeros(shape, dtype) if not weak else jnp.full(shape, 0.0),
    st.lists(st.integers(0, 2), max_size=2).map(tuple),
    st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32]),
    st.booleans(),
)


# The two properties below make real arrays and compile: a quarter of the profile's examples
# (at least 50), as test_scale's and test_cost_loops' slow properties run.
SLOW = settings(max_examples=max(50, settings().max_examples // 4))


@SLOW
@given(trees(small_leaves), st.sampled_from(["weak", "promote", "cast"]))
def test_upcast_is_idempotent(tree, policy):
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), tree)
    try:
        once = ts.upcast(tree, like, policy=policy)
    except ts.StructureMismatchError as err:
        assert policy != "cast"
        assert all(m.kind == "dtype" for m in err.mismatches)
        return
    twice = ts.upcast(once, like, policy=policy)
    assert all(a is b for a, b in zip(jax.tree.leaves(twice), jax.tree.leaves(once), strict=True))
    assert ts.structure_of(twice) == ts.structure_of(once)
    assert [x.dtype for x in jax.tree.leaves(once)] == [jnp.float32] * len(jax.tree.leaves(tree))


@SLOW
@given(trees(small_leaves), st.sampled_from(["weak", "promote", "cast"]), st.booleans())
def test_scan_carry_runs_with_the_types_it_announced(tree, policy, under_jit):
    # The body adds a float32 step to every leaf: what may change depends on the policy.
    def body(carry, x):
        return jax.tree.map(lambda c: (c + x).astype(jnp.float32) if c.dtype != jnp.int32 else c, carry), x

    xs = jnp.ones(3, jnp.float32)

    def run(tree, xs):
        try:
            announced = ts.carry_structure(body, tree, xs, policy=policy)
        except ts.CarryMismatchError as err:
            assert policy != "cast"
            assert all(m.kind == "dtype" for m in err.mismatches)
            return None
        carry = ts.scan_carry(body, tree, xs, policy=policy)
        assert ts.structure_of(carry) == announced
        final, _ = lax.scan(body, carry, xs)
        assert [m.kind for m in announced.diff(final) if m.kind != "weak_type"] == []
        return final

    if under_jit:
        jax.jit(run)(tree, xs)
    else:
        run(tree, xs)


def test_hypothesis_profile_is_loaded():
    from hypothesis import settings

    assert settings().max_examples >= 100
    assert np.isfinite(settings().max_examples)
