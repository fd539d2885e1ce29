"""Scale: `structure_of` reads each leaf's type and
agrees with `out_structure(lambda t: t, tree)` everywhere; `diff`/`check`/`matches`
stay exact on trees as deep as JAX flattens and on 100,000-leaf trees.

- `structure_of(tree) == out_structure(lambda t: t, tree)`, leaf by leaf, over
  random trees of every kind of leaf, at top level and under `jit`, `vmap` and
  `shard_map` (with varying axes); the same exception when one raises.
- Deep trees: nested lists and dicts almost as deep as `jax.tree_util` accepts
  (measured, not assumed), differing at the bottom.
- Large trees: one difference among 100,000 leaves is reported exactly once.
- The diff oracle: `helpers.diff_structures` (the 0.1 recursive algorithm,
  frozen) gives the exact mismatch list that `diff`, `check` and `matches`
  must agree with, on random pairs of trees and with `ignore=`.

Tracer leaks are checked around every test (the autouse `_no_tracer_leaks`
fixture of conftest.py); the dtypes expected follow `jax_enable_x64` (CI runs
this file with x64 off and on).
"""

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest
from helpers import diff_structures, pcast_varying, varying
from hypothesis import assume, event, given, settings, strategies as st
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._compat import flatten_one_level_with_keys as _flatten_one_level_with_keys
from treeshape._diff import value_text, value_texts
from treeshape._leaf import leaf_str


X64 = jax.config.jax_enable_x64
SDS = jax.ShapeDtypeStruct
KEY_DTYPE = jax.random.key(0).dtype
NT = collections.namedtuple("NT", "left right")

# Each example traces a few times (the contexts also run shard_map eagerly).
FEW = settings(max_examples=max(50, settings().max_examples // 4), deadline=None)
SOME = settings(max_examples=max(100, settings().max_examples // 2), deadline=None)


def _canonical(dtype: Any) -> Any:
    """The dtype JAX really uses for `dtype` with the current `jax_enable_x64`."""
    return jax.dtypes.canonicalize_dtype(dtype, allow_extended_dtype=True)


def _varying(leaf: jax.ShapeDtypeStruct) -> frozenset[str]:
    return varying(leaf)


def _activation(x: Any) -> Any:
    """A module-level function: a static leaf."""
    return x


class Duck:
    """Not an array, but `.shape` and `.dtype` (as orbax metadata has): an abstract leaf."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)


# Static leaves are shared objects: both answers must hand back the very same object.
STATICS = ("relu", _activation, np.array(["a", "bc"]))


# == 1. structure_of equals the identity out_structure ==================================
@dataclasses.dataclass(eq=False)
class Leaf:
    """How to make one leaf (a pytree leaf itself: not a registered node).

    `route` says how a context hands an array-like leaf in: 0 as an argument of
    the transformation (a tracer), 1 closed over, 2 (shard_map) closed over and
    made varying with `lax.pcast`.
    """

    kind: str
    shape: tuple[int, ...] = ()
    dtype: Any = None
    weak: bool = False
    value: Any = None
    route: int = 0

    @property
    def array_like(self) -> bool:
        """A leaf that can be an argument of a transformation."""
        return self.kind in ("array", "weak", "key", "numpy", "npscalar")


def _make(leaf: Leaf) -> Any:
    kind = leaf.kind
    if kind == "array":
        return jnp.asarray(np.zeros(leaf.shape, leaf.dtype))  # (jnp.zeros would compile for each shape)
    if kind == "weak":
        # A weak array, made the public way: filled from a Python scalar (as
        # `jnp.asarray(1.0)` is weak; `.astype` and `lax.convert_element_type` make strong ones).
        return jnp.full(leaf.shape, leaf.value)
    if kind == "key":
        return jax.random.key(0) if leaf.shape == () else jax.random.split(jax.random.key(0), leaf.shape)
    if kind == "numpy":
        return np.zeros(leaf.shape, leaf.dtype)
    if kind == "npscalar":
        return np.dtype(leaf.dtype).type(1)
    if kind == "sds":
        return SDS(leaf.shape, leaf.dtype, weak_type=leaf.weak)
    if kind == "duck":
        return Duck(leaf.shape, leaf.dtype)
    return leaf.value  # python, static, overflow


_PYTHON_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


def _expected(leaf: Leaf) -> tuple[tuple[int, ...], Any, bool] | None:
    """`(shape, dtype, weak_type)` that JAX gives the leaf, or None for a static one."""
    kind = leaf.kind
    if kind in ("array", "numpy", "duck"):
        return leaf.shape, _canonical(leaf.dtype), False
    if kind == "npscalar":
        return (), _canonical(leaf.dtype), False
    if kind == "weak":
        return leaf.shape, _canonical(_PYTHON_DTYPES[type(leaf.value)]), True
    if kind == "key":
        return leaf.shape, KEY_DTYPE, False
    if kind == "sds":
        return leaf.shape, _canonical(leaf.dtype), leaf.weak
    if kind == "python":
        return (), _canonical(_PYTHON_DTYPES[type(leaf.value)]), type(leaf.value) is not bool
    return None


ARRAY_DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64]
if X64:
    ARRAY_DTYPES += [jnp.float64, jnp.int64]  # with x64 off, asking for these warns (an error here)
NUMPY_DTYPES = [np.float64, np.int64, np.float32, np.int32, np.uint8, np.bool_, np.float16, np.complex128]
SDS_DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32, jnp.float64, jnp.int64, jnp.complex64, KEY_DTYPE]
WEAKABLE = (jnp.float32, jnp.int32, jnp.float64, jnp.int64, jnp.complex64)

shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
routes = st.integers(0, 2)
small_python = st.one_of(
    st.integers(-1000, 1000),
    st.floats(-10, 10, allow_nan=False),
    st.booleans(),
    st.complex_numbers(max_magnitude=10, allow_nan=False, allow_infinity=False),
)


@st.composite
def _sds_leaf(draw: Any) -> Leaf:
    dtype = draw(st.sampled_from(SDS_DTYPES))
    weak = dtype in WEAKABLE and draw(st.booleans())
    return Leaf("sds", draw(shapes), dtype, weak)


leaf_recipes = st.one_of(
    st.builds(lambda s, d, r: Leaf("array", s, d, route=r), shapes, st.sampled_from(ARRAY_DTYPES), routes),
    st.builds(lambda s, v, r: Leaf("weak", s, value=v, route=r), shapes, st.sampled_from([0, 0.0, 0j]), routes),
    st.builds(lambda s, r: Leaf("key", s, route=r), st.sampled_from([(), (2,)]), routes),
    st.builds(lambda v: Leaf("python", value=v), small_python),
    st.builds(lambda s, d, r: Leaf("numpy", s, d, route=r), shapes, st.sampled_from(NUMPY_DTYPES), routes),
    st.builds(lambda d, r: Leaf("npscalar", (), d, route=r), st.sampled_from(NUMPY_DTYPES), routes),
    _sds_leaf(),
    st.builds(lambda s, d: Leaf("duck", s, d), shapes, st.sampled_from([np.float64, np.float32, jnp.bfloat16])),
    st.builds(lambda v: Leaf("static", value=v), st.sampled_from(STATICS)),
)


def _recipe_containers(children: Any) -> Any:
    return st.one_of(
        st.dictionaries(st.text(alphabet="abcxyz", min_size=1, max_size=3), children, max_size=3),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.builds(NT, children, children),
    )


def recipe_trees(leaves: Any = leaf_recipes) -> Any:
    empty = st.sampled_from([None, "list", "dict", "tuple"]).map(lambda k: {"list": [], "dict": {}, "tuple": ()}.get(k))
    return st.recursive(st.one_of(leaves, empty), _recipe_containers, max_leaves=10)


# -- the contexts ------------------------------------------------------------------------
# Each runs `check(tree)` where `tree` is the recipes' tree as seen in that context,
# and returns what leaf i must read as there: `(shape, dtype, weak_type, varying axes)`,
# or None for a static leaf (which must come back as the very object in the tree).
Expected = tuple[tuple[int, ...], Any, bool, frozenset[str]] | None
Check = Callable[[Any], None]


def _expectations(flat: list[Leaf], varying: Callable[[Leaf], bool] = lambda _: False) -> list[Expected]:
    out: list[Expected] = []
    for leaf in flat:
        e = _expected(leaf)
        out.append(None if e is None else (*e, frozenset({"i"}) if varying(leaf) else frozenset()))
    return out


def _run_top(recipes: Any, check: Check) -> list[Expected]:
    check(jax.tree.map(_make, recipes))
    return _expectations(jax.tree.leaves(recipes))


def _run_jit(recipes: Any, check: Check) -> list[Expected]:
    """Array-like leaves of route 0 (and Python scalars) are jit arguments; the rest is closed over."""
    flat, treedef = jax.tree.flatten(recipes)
    values = [_make(leaf) for leaf in flat]
    passed = [i for i, leaf in enumerate(flat) if (leaf.array_like and leaf.route == 0) or leaf.kind == "python"]
    ran = []

    def traced(args: list[Any]) -> None:
        inner = list(values)
        for i, arg in zip(passed, args, strict=True):
            inner[i] = arg
        check(jax.tree.unflatten(treedef, inner))
        ran.append(True)

    jax.jit(traced)([values[i] for i in passed])
    assert ran == [True]
    return _expectations(flat)


def _stacked(leaf: Leaf, n: int) -> Any:
    """`n` copies of an array-like leaf, stacked on a new leading axis (of the same JAX type)."""
    shape = (n, *leaf.shape)
    if leaf.kind in ("numpy", "npscalar"):
        return np.zeros(shape, leaf.dtype)
    if leaf.kind == "array":
        return jnp.asarray(np.zeros(shape, leaf.dtype))
    if leaf.kind == "weak":
        return jnp.full(shape, leaf.value)
    assert leaf.kind == "key"
    return jax.random.split(jax.random.key(0), shape)


def _run_vmap(recipes: Any, check: Check, jitted: bool = False) -> list[Expected]:
    """Array-like leaves of route 0 are batched (two examples); the rest is closed over.
    Eager, or traced under `jit` when `jitted`."""
    flat, treedef = jax.tree.flatten(recipes)
    values = [_make(leaf) for leaf in flat]
    batched = [i for i, leaf in enumerate(flat) if leaf.array_like and leaf.route == 0]
    ran = []

    def per_example(anchor: Any, args: list[Any]) -> Any:
        inner = list(values)
        for i, arg in zip(batched, args, strict=True):
            inner[i] = arg
        check(jax.tree.unflatten(treedef, inner))
        ran.append(True)
        return anchor

    f = jax.vmap(per_example)
    args = (np.zeros(2, np.float32), [_stacked(flat[i], 2) for i in batched])
    jax.jit(f).trace(*args) if jitted else f(*args)
    assert ran == [True]
    return _expectations(flat)


def _run_shard_map(recipes: Any, check: Check, jitted: bool = False) -> list[Expected]:
    """Under `shard_map` over 8 devices: array-like leaves of route 0 are per-shard
    values (varying over 'i'), route 1 closed over (invariant), route 2 closed over
    and made varying with `lax.pcast`; the rest is closed over. Eager, or traced
    under `jit` when `jitted`."""
    mesh = jax.make_mesh((8,), ("i",))
    flat, treedef = jax.tree.flatten(recipes)
    values = [_make(leaf) for leaf in flat]
    sharded = [i for i, leaf in enumerate(flat) if leaf.array_like and leaf.route == 0]
    pcast = [i for i, leaf in enumerate(flat) if leaf.array_like and leaf.route == 2]
    ran = []

    def per_shard(anchor: Any, args: list[Any]) -> Any:
        inner = list(values)
        for i, arg in zip(sharded, args, strict=True):
            inner[i] = arg[0]  # this shard's (1, *shape) block -> the leaf's own shape
        for i in pcast:
            inner[i] = pcast_varying(values[i], "i")
        check(jax.tree.unflatten(treedef, inner))
        ran.append(True)
        return anchor

    f = jax.shard_map(per_shard, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    args = jax.device_put(
        (np.zeros(8, np.float32), [_stacked(flat[i], 8) for i in sharded]), NamedSharding(mesh, P("i"))
    )
    jax.jit(f).trace(*args) if jitted else f(*args)
    assert ran == [True]
    return _expectations(flat, lambda leaf: leaf.array_like and leaf.route != 1)


CONTEXTS: dict[str, Callable[[Any, Check], list[Expected]]] = {
    "top": _run_top,
    "jit": _run_jit,
    "vmap": _run_vmap,
    "jit_vmap": lambda recipes, check: _run_vmap(recipes, check, jitted=True),
    "shard_map": _run_shard_map,
    "jit_shard_map": lambda recipes, check: _run_shard_map(recipes, check, jitted=True),
}


def _both_agree(recipes: Any, context: str) -> None:
    seen: list[tuple[ts.Structure, ts.Structure, list[Any]]] = []

    def check(tree: Any) -> None:
        mine = ts.structure_of(tree)
        truth = ts.out_structure(lambda t: t, tree)
        # What the leaves were, for the static ones' identity (tracers are not kept).
        leaves = [None if isinstance(x, jax.core.Tracer) else x for x in jax.tree.leaves(tree)]
        seen.append((mine, truth, leaves))

    expected = CONTEXTS[context](recipes, check)
    [(mine, truth, originals)] = seen
    assert mine == truth
    assert hash(mine) == hash(truth)
    assert mine.treedef == truth.treedef == jax.tree.structure(recipes)  # one `Leaf` per leaf
    assert mine.paths == truth.paths
    assert len(mine.leaves) == len(expected)
    for path, m, t, e, original in zip(mine.paths, mine.leaves, truth.leaves, expected, originals, strict=True):
        if e is None:  # static: the very object, in both
            assert m is original and t is original, path
            continue
        assert isinstance(m, SDS) and isinstance(t, SDS), path
        assert (m.shape, m.dtype, m.weak_type, _varying(m)) == e, (path, m)
        assert (t.shape, t.dtype, t.weak_type, _varying(t)) == e, (path, t)


@FEW
@given(recipe_trees())
def test_structure_of_equals_identity_out_structure_at_top_level(recipes):
    _both_agree(recipes, "top")


@FEW
@given(recipe_trees())
def test_structure_of_equals_identity_out_structure_under_jit(recipes):
    _both_agree(recipes, "jit")


@FEW
@given(recipe_trees(), st.sampled_from(["vmap", "jit_vmap"]))
def test_structure_of_equals_identity_out_structure_under_vmap(recipes, context):
    _both_agree(recipes, context)


@FEW
@given(recipe_trees(), st.sampled_from(["shard_map", "jit_shard_map"]))
def test_structure_of_equals_identity_out_structure_under_shard_map(recipes, context):
    _both_agree(recipes, context)


# -- the same error ----------------------------------------------------------------------
BIG = 2**64  # fits neither the int32 (x64 off) nor the int64 (x64 on) that JAX gives Python ints

overflow_leaves = st.builds(lambda v: Leaf("overflow", value=v), st.sampled_from([BIG, -BIG, 2**70]))


Raised = tuple[type[BaseException], str] | None


def _raised(fn: Callable[[], Any]) -> Raised:
    """What `fn()` raised, as `(type, message)`, or None (the exception itself is
    not kept: its traceback holds the trace's frames, a tracer leak)."""
    try:
        fn()
    except Exception as e:
        return type(e), str(e)
    return None


def _errors_in(context: str, recipes: Any) -> tuple[Raised, Raised]:
    """What `structure_of` and the identity `out_structure` raise on the tree in `context`."""
    errors: list[tuple[Raised, Raised]] = []

    def check(tree: Any) -> None:
        errors.append((_raised(lambda: ts.structure_of(tree)), _raised(lambda: ts.out_structure(lambda t: t, tree))))

    CONTEXTS[context](recipes, check)
    [(mine, truth)] = errors
    return mine, truth


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_a_python_int_too_large_raises_overflow_error_from_both(context):
    recipes = {"a": [Leaf("python", value=1), Leaf("overflow", value=BIG)], "b": Leaf("array", (2,), jnp.float32)}
    for raised in _errors_in(context, recipes):
        assert raised is not None
        kind, message = raised
        assert kind is OverflowError
        assert "['a'][1]" in message and str(BIG) in message


@FEW
@given(
    recipe_trees(st.one_of(leaf_recipes, overflow_leaves)).filter(
        lambda t: any(isinstance(x, Leaf) and x.kind == "overflow" for x in jax.tree.leaves(t))
    ),
    st.sampled_from(list(CONTEXTS)),
)
def test_when_one_raises_both_raise_the_same_error(recipes, context):
    paths = [
        jtu.keystr(path)
        for path, leaf in jtu.tree_flatten_with_path(recipes)[0]
        if isinstance(leaf, Leaf) and leaf.kind == "overflow"
    ]
    mine, truth = _errors_in(context, recipes)
    assert mine is not None and truth is not None, (mine, truth)
    assert mine[0] is truth[0] is OverflowError
    for _, message in (mine, truth):
        assert any(path in message for path in paths), (message, paths)


# -- shardings at top level ----------------------------------------------------------------
def test_top_level_committed_arrays_and_sharded_shape_dtype_structs_keep_their_shardings():
    mesh = jax.make_mesh((8,), ("x",))
    committed = NamedSharding(mesh, P("x"))
    given_spec = NamedSharding(mesh, P("x", None))
    over_abstract = NamedSharding(mesh.abstract_mesh, P(None, "x"))
    tree = {
        "a": jax.device_put(jnp.zeros((8, 2), jnp.float32), committed),
        "b": jnp.zeros(3, jnp.float32),
        "c": SDS((8, 4), jnp.float32, sharding=given_spec),
        "d": SDS((2, 8), jnp.bfloat16, sharding=over_abstract),
    }
    s = ts.structure_of(tree)
    assert s == ts.out_structure(lambda t: t, tree)  # equality ignores shardings
    a, _, c, d = s.leaves
    assert a.sharding == committed and a.sharding.mesh == mesh
    assert c.sharding == given_spec and tuple(c.sharding.spec) == ("x", None)
    assert d.sharding == over_abstract and isinstance(d.sharding.mesh, jax.sharding.AbstractMesh)
    with jax.set_mesh(mesh):  # `d` names the abstract mesh: placed on the mesh set here
        zeros = s.zeros()
    assert zeros["a"].sharding == committed
    assert zeros["c"].sharding == given_spec
    assert zeros["d"].sharding == NamedSharding(mesh, P(None, "x"))


# -- a tree of ShapeDtypeStructs only ------------------------------------------------------
def _read(tree: Any) -> tuple[Any, ...]:
    """What `structure_of` gives for `tree`: its leaves as `(shape, dtype, weak_type)`, or the error."""
    try:
        s = ts.structure_of(tree)
    except Exception as e:
        return type(e), str(e)
    assert s == ts.out_structure(lambda t: t, tree)
    return tuple((x.shape, x.dtype, x.weak_type) if isinstance(x, SDS) else x for x in s.leaves)


def test_a_tree_of_only_shape_dtype_structs_is_read_as_one_with_another_leaf():
    """A tree whose leaves are all `ShapeDtypeStruct`s is read without a loop over them (a
    big tree has few distinct shapes and dtypes): each leaf the loop would convert, check or
    refuse is read as in a tree that has another leaf too (which the loop reads)."""
    (b,) = jax.export.symbolic_shape("b")
    mesh = jax.make_mesh((8,), ("x",))
    split = NamedSharding(mesh, P("x"))
    f32, f64 = np.dtype("float32"), np.dtype("float64")
    cases = {
        "concrete": ([SDS((2, 3), f32), SDS((), jnp.int32, weak_type=True)], None),
        "float64": ([SDS((2,), f64), SDS((3,), f32)], None),
        "NumPy int size": ([SDS((np.int64(3), 2), f32), SDS((8, 2), f32, sharding=split)], None),
        "bool size": ([SDS((True, 2), f32), SDS((1, 2), f32)], None),
        "empty": ([SDS((0, 4), f32), SDS((0,), jnp.bfloat16)], None),
        "symbolic": ([SDS((b, 3), f32), SDS((2 * b,), jnp.bfloat16)], None),
        "symbolic, sharded": ([SDS((8, 3), f32, sharding=split), SDS((b, 3), f32, sharding=split)], "[1]"),
        "NumPy int size, sharded": ([SDS((5,), f32), SDS((np.int64(5),), f32, sharding=split)], "[1]"),
        "negative size": ([SDS((2,), f32), SDS((-1, 3), f32)], "[1]"),
        "too large": ([SDS((2,), f32), SDS((2**40, 2**30), f32)], "[1]"),
    }
    for name, (leaves, raises_at) in cases.items():
        alone, beside = _read(leaves), _read([*leaves, "relu"])
        if raises_at is None:
            assert beside[-1] == "relu", name
            assert alone == beside[:-1], name
            assert alone[0][1] == _canonical(leaves[0].dtype), name
        else:
            assert alone == beside and alone[0] is ValueError, (name, alone)
            assert alone[1].startswith("treeshape.structure_of: ") and f"tree{raises_at}" in alone[1], name
    s = ts.structure_of([SDS((b, 3), f32), SDS((2,), f32)])
    assert s.leaves[0].shape == (b, 3) and s.dims == ("b",)
    # A bare PartitionSpec as the sharding: JAX reads it on the mesh in context, and refuses it without one.
    by_spec = [SDS((8, 2), f32, sharding=P("x")), SDS((2,), f32)]
    alone, beside = _read(by_spec), _read([*by_spec, "relu"])
    assert alone == beside and alone[0] is TypeError and "context mesh cannot be empty" in alone[1]
    with jax.set_mesh(mesh):
        assert _read(by_spec) == _read([*by_spec, "relu"])[:-1]
        assert ts.structure_of(by_spec).leaves[0].sharding == split


# == 2. Deep trees ================================================================================
# How deep a tree JAX flattens is not a constant: with Python 3.11, `tree_flatten`
# (C++) counts each level against Python's recursion limit (1000 by default), from
# the caller's own stack depth. Measured from a test here (pytest's stack is ~33
# frames deep), JAX 0.10.2 flattens nested lists of 959 levels and fails from
# 960, whatever the node types; 0.1's `structure_of` reached 946 (13 frames of its
# own) and its diff only ~470 (two frames per level). So each test measures the
# limit from where it stands and goes `_MARGIN` levels under it, for treeshape's
# own frames: about 935 levels under pytest (depths of 950-980 need a shallower
# caller). A run where JAX accepts more (a raised recursion limit, Python 3.12's
# separate C limit) is capped at `_DEEPEST` levels to keep the test quick.
_MARGIN = 25
_DEEPEST = 2000


def _nested_lists(depth: int) -> Any:
    tree: Any = jnp.zeros(1, jnp.float32)
    for _ in range(depth):
        tree = [tree]
    return tree


def _flatten_limit() -> int:
    """The most levels of nested lists `jax.tree_util.tree_flatten` accepts when called from the caller's frame."""
    lo, hi = 1, _DEEPEST + _MARGIN
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            jtu.tree_flatten(_nested_lists(mid))
        except (RecursionError, SystemError):  # SystemError: nanobind's wrapper around a RecursionError
            hi = mid - 1
        else:
            lo = mid
    return lo


def _depth_here() -> int:
    depth = _flatten_limit() - _MARGIN
    assert depth >= 800, f"JAX flattens only {depth + _MARGIN} levels here: too shallow to test deep trees"
    return depth


W, B = SDS((2, 3), jnp.float32), SDS((3,), jnp.float32)


def _deep(depth: int, bottom: Any, dicts: bool) -> tuple[Any, str]:
    """`bottom` under `depth` levels of one-element lists (alternating with one-key
    dicts when `dicts`), and the `keystr` path to `bottom`."""
    tree, path = bottom, ""
    for level in range(depth):
        if dicts and level % 2:
            tree, path = {"k": tree}, "['k']" + path
        else:
            tree, path = [tree], "[0]" + path
    return tree, path


def _assert_diff(s: ts.Structure, other: Any, expected: list[ts.Mismatch]) -> None:
    """`diff`, `check` and `matches` of `s` against the tree `other` and its Structure, all giving `expected`."""
    for tree in (other, ts.structure_of(other)):
        assert s.diff(tree) == expected
        assert s.matches(tree) is (not expected)
        if expected:
            with pytest.raises(ts.StructureMismatchError) as info:
                s.check(tree)
            assert list(info.value.mismatches) == expected
        else:
            assert s.check(tree) is None


@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "lists_and_dicts"])
def test_deep_tree_structure_of_and_equal_diff(dicts):
    depth = _depth_here()
    tree, path = _deep(depth, {"w": jnp.zeros((2, 3), jnp.float32), "b": jnp.zeros(3, jnp.float32)}, dicts)
    s = ts.structure_of(tree)
    assert len(s) == 2
    assert s.paths == (path + "['b']", path + "['w']")
    assert s.leaves == (B, W)
    assert s == ts.structure_of(_deep(depth, {"w": W, "b": B}, dicts)[0])
    _assert_diff(s, _deep(depth, {"w": W, "b": B}, dicts)[0], [])


@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "lists_and_dicts"])
def test_deep_tree_a_leaf_shape_changed_at_the_bottom(dicts):
    depth = _depth_here()
    tree, path = _deep(depth, {"w": W, "b": B}, dicts)
    other, _ = _deep(depth, {"w": SDS((2, 4), jnp.float32), "b": B}, dicts)
    s = ts.structure_of(tree)
    _assert_diff(s, other, [ts.Mismatch(path + "['w']", "shape", (2, 3), (2, 4))])
    assert s.diff(other, ignore={"shape"}) == [] and s.matches(other, ignore=("shape",))


@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "lists_and_dicts"])
def test_deep_tree_a_list_one_longer_or_shorter_at_the_bottom(dicts):
    depth = _depth_here()
    tree, path = _deep(depth - 1, [{"w": W, "b": B}], dicts)
    longer, _ = _deep(depth - 1, [{"w": W, "b": B}, B], dicts)
    s = ts.structure_of(tree)
    _assert_diff(s, longer, [ts.Mismatch(path + "[1]", "structure", None, "f32[3]")])
    # ... and the other way round: the longer one's structure misses an element.
    _assert_diff(ts.structure_of(longer), tree, [ts.Mismatch(path + "[1]", "structure", "f32[3]", None)])


@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "lists_and_dicts"])
def test_deep_tree_a_dict_key_missing_at_the_bottom(dicts):
    depth = _depth_here()
    tree, path = _deep(depth, {"w": W, "b": B}, dicts)
    other, _ = _deep(depth, {"w": W}, dicts)
    s = ts.structure_of(tree)
    _assert_diff(s, other, [ts.Mismatch(path + "['b']", "structure", "f32[3]", None)])
    _assert_diff(ts.structure_of(other), tree, [ts.Mismatch(path + "['b']", "structure", None, "f32[3]")])


@pytest.mark.parametrize("dicts", [False, True], ids=["lists", "lists_and_dicts"])
def test_deep_tree_a_node_type_changed_at_the_bottom(dicts):
    depth = _depth_here()
    tree, path = _deep(depth - 1, [W, B], dicts)
    other, _ = _deep(depth - 1, (W, B), dicts)
    _assert_diff(
        ts.structure_of(tree),
        other,
        [ts.Mismatch(path, "structure", "a list with 2 children", "a tuple with 2 children")],
    )


# == 3. Large trees ==============================================================================
# One diff, one check and one matches per direction (each walks 100,000 leaves).
N = 100_000
F2 = SDS((2,), jnp.float32)


def _assert_one_diff(s: ts.Structure, other: Any, expected: list[ts.Mismatch]) -> None:
    assert s.diff(other) == expected
    assert s.matches(other) is (not expected)
    with pytest.raises(ts.StructureMismatchError) as info:
        s.check(ts.structure_of(other))
    assert list(info.value.mismatches) == expected


def test_100k_leaves_one_shape_changed():
    w, b = jnp.zeros((4, 4), jnp.float32), jnp.zeros(4, jnp.float32)
    tree = {"layers": [{"w": w, "b": b} for _ in range(N // 2)]}
    other = {"layers": [{"w": SDS((4, 4), jnp.float32), "b": SDS((4,), jnp.float32)} for _ in range(N // 2)]}
    other["layers"][31_337]["w"] = SDS((4, 5), jnp.float32)
    s = ts.structure_of(tree)
    assert len(s) == N and s.paths[-1] == "['layers'][49999]['w']"
    _assert_one_diff(s, other, [ts.Mismatch("['layers'][31337]['w']", "shape", (4, 4), (4, 5))])
    other["layers"][31_337]["w"] = SDS((4, 4), jnp.float32)
    assert s.diff(other) == [] and s.matches(other)


def test_100k_flat_list_against_one_more():
    tree = [jnp.zeros(2, jnp.float32)] * N
    longer = [F2] * (N + 1)
    s = ts.structure_of(tree)
    _assert_one_diff(s, longer, [ts.Mismatch("[100000]", "structure", None, "f32[2]")])
    [m] = s.diff(longer)
    assert str(m) == "tree[100000]: unexpected extra entry f32[2]."
    # ... and the other way round: one missing.
    assert ts.structure_of(longer).diff(tree) == [ts.Mismatch("[100000]", "structure", "f32[2]", None)]


def test_100k_flat_list_and_a_long_tuple_with_leaves_changed_in_place():
    tree = {"xs": [F2] * N, "ys": (F2,) * 1000, "z": [F2] * 3}
    other = {"xs": [F2] * N, "ys": list(tree["ys"]), "z": [F2] * 3}
    other["xs"][0] = SDS((3,), jnp.float32)
    other["xs"][64] = SDS((2,), jnp.bfloat16)
    other["xs"][31_337] = "relu"
    other["xs"][N - 1] = SDS((2,), jnp.float32, weak_type=True)
    other["ys"][999] = SDS((), jnp.int32)
    other["ys"] = tuple(other["ys"])
    expected = [
        ts.Mismatch("['xs'][0]", "shape", (2,), (3,)),
        ts.Mismatch("['xs'][64]", "dtype", jnp.dtype("float32"), jnp.dtype("bfloat16")),
        ts.Mismatch("['xs'][31337]", "structure", "f32[2]", "the static value 'relu'"),
        ts.Mismatch("['xs'][99999]", "weak_type", False, True),
        ts.Mismatch("['ys'][999]", "shape", (2,), ()),
        ts.Mismatch("['ys'][999]", "dtype", jnp.dtype("float32"), jnp.dtype("int32")),
    ]
    s = ts.structure_of(tree)
    _assert_one_diff(s, other, expected)
    assert [str(m) for m in s.diff(other)][2] == "tree['xs'][31337]: expected f32[2], got the static value 'relu'."
    assert ts.structure_of(other).diff(tree)[0] == ts.Mismatch("['xs'][0]", "shape", (3,), (2,))


def test_lists_and_tuples_of_leaves_of_other_lengths_agree_with_the_reference_diff():
    leaves = [F2, SDS((3,), jnp.bfloat16), "relu", SDS((), jnp.int32, weak_type=True)] * 30
    changed = list(leaves)
    changed[1] = SDS((3,), jnp.float32)
    changed[2] = "gelu"
    changed[7] = F2
    for kind in (list, tuple):
        for a, b in [(leaves, changed[:-5]), (leaves[:-1], changed), (leaves[:3], changed), (leaves, leaves[:1])]:
            tree, other = {"xs": kind(a), "n": F2}, {"xs": kind(b), "n": F2}
            assert _assert_as_reference(ts.structure_of(tree), other, set()), (kind, len(a), len(b))
            _assert_as_reference(ts.structure_of(other), tree, {"dtype"})
    grown = [F2] * N
    longer = [*grown[:31_337], SDS((2,), jnp.int32), *grown[31_337:]]  # one leaf in the middle: every later one moves
    found = ts.structure_of(grown).diff(longer)
    assert found[0] == ts.Mismatch("[31337]", "dtype", jnp.dtype("float32"), jnp.dtype("int32"))
    assert found[-1] == ts.Mismatch("[100000]", "structure", None, "f32[2]") and len(found) == 2


def test_100k_nested_list_grown_by_one_leaf():
    tree = [[F2] * 1000 for _ in range(N // 1000)]
    grown = [list(row) for row in tree]
    grown[57].append(SDS((), jnp.int32))
    _assert_one_diff(ts.structure_of(tree), grown, [ts.Mismatch("[57][1000]", "structure", None, "i32[]")])


def test_100k_key_dict_one_key_missing_and_one_extra():
    tree = {f"k{i:06d}": F2 for i in range(N)}
    other = dict(tree)
    del other["k031337"]
    other["k031336x"] = F2  # sorts before the missing key: mismatches come in key order
    expected = [
        ts.Mismatch("['k031336x']", "structure", None, "f32[2]"),
        ts.Mismatch("['k031337']", "structure", "f32[2]", None),
    ]
    _assert_one_diff(ts.structure_of(tree), other, expected)


# == 4. The diff oracle ==========================================================================
@dataclasses.dataclass
class DNode:
    """A dataclass node: `a` and `b` are children, `tag` is static (node data)."""

    a: Any
    b: Any
    tag: str


jtu.register_dataclass(DNode, data_fields=["a", "b"], meta_fields=["tag"])


@dataclasses.dataclass(frozen=True)
class Meta:
    """Node data with fields (a long `name` makes its repr too long for a message)."""

    name: str
    sizes: tuple[int, ...]
    flag: bool


@jtu.register_pytree_node_class
class CNode:
    """A class node with any number of children and a `Meta` as its static data."""

    def __init__(self, children: list[Any], meta: Meta) -> None:
        self.children = children
        self.meta = meta

    def tree_flatten(self) -> tuple[tuple[Any, ...], Meta]:
        return tuple(self.children), self.meta

    @classmethod
    def tree_unflatten(cls, meta: Meta, children: Any) -> "CNode":
        return cls(list(children), meta)


class Weird:
    """A static leaf whose `==` raises."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("no comparing Weirds")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "Weird()"


LONG = "encoder/layers/attention/query_projection/kernel_initializer"
METAS = [Meta("conv", (3, 3), False), Meta(LONG, (4, 8, 8), True), Meta(LONG, (4, 8, 16), True)]
WEIRD = Weird()
DIFF_STATICS = [*STATICS, np.array(["a", "c"]), np.array([1, "x"], dtype=object), "gelu", WEIRD, Weird()]
DIFF_DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32, jnp.uint8, jnp.bool_, KEY_DTYPE]

diff_leaves = st.one_of(
    st.builds(
        lambda shape, dtype, weak: SDS(shape, dtype, weak_type=weak and dtype in WEAKABLE),
        st.lists(st.integers(1, 3), max_size=2).map(tuple),
        st.sampled_from(DIFF_DTYPES),
        st.booleans(),
    ),
    st.sampled_from(["zeros", "bf16", "weak", "key"]).map(
        lambda k: {
            "zeros": lambda: jnp.zeros(2, jnp.float32),
            "bf16": lambda: jnp.zeros((2, 3), jnp.bfloat16),
            "weak": lambda: jnp.asarray(1.0),
            "key": lambda: jax.random.key(0),
        }[k]()
    ),
    st.sampled_from([0, 1.5, True, 2j, np.float32(1)]),
    st.sampled_from(DIFF_STATICS),
)
_str_keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)


def _diff_containers(children: Any) -> Any:
    return st.one_of(
        st.dictionaries(_str_keys, children, max_size=3),
        st.dictionaries(st.integers(0, 5), children, max_size=3),
        st.dictionaries(_str_keys, children, max_size=3).map(collections.OrderedDict),
        st.dictionaries(_str_keys, children, max_size=3).map(lambda d: collections.defaultdict(int, d)),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.builds(NT, children, children),
        st.builds(DNode, children, children, st.sampled_from(["x", "y"])),
        st.builds(CNode, st.lists(children, max_size=3), st.sampled_from(METAS)),
    )


_EMPTIES = {"none": lambda: None, "list": list, "dict": dict, "tuple": tuple}
diff_trees = st.recursive(
    st.one_of(diff_leaves, st.sampled_from(list(_EMPTIES)).map(lambda k: _EMPTIES[k]())),
    _diff_containers,
    max_leaves=10,
)


# A tree's nodes, addressed by the child keys from the root: this file's containers only.
def _children(node: Any) -> list[tuple[Any, Any]]:
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, (list, tuple)):  # also NT
        return list(enumerate(node))
    if isinstance(node, DNode):
        return [("a", node.a), ("b", node.b)]
    if isinstance(node, CNode):
        return list(enumerate(node.children))
    return []


def _with_child(node: Any, key: Any, child: Any) -> Any:
    if isinstance(node, collections.defaultdict):
        new = collections.defaultdict(node.default_factory, node)
    elif isinstance(node, dict):
        new = type(node)(node)
    elif isinstance(node, NT):
        return node._replace(**{node._fields[key]: child})
    elif isinstance(node, tuple):
        return tuple(child if i == key else x for i, x in enumerate(node))
    elif isinstance(node, list):
        new = list(node)
    elif isinstance(node, DNode):
        return dataclasses.replace(node, **{key: child})
    else:
        return CNode([child if i == key else x for i, x in enumerate(node.children)], node.meta)
    new[key] = child
    return new


def _positions(tree: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    for key, child in _children(tree):
        out += _positions(child, (*at, key))
    return out


def _get(tree: Any, at: tuple[Any, ...]) -> Any:
    for key in at:
        tree = dict(_children(tree))[key]
    return tree


def _put(tree: Any, at: tuple[Any, ...], new: Any) -> Any:
    if not at:
        return new
    return _with_child(tree, at[0], _put(dict(_children(tree))[at[0]], at[1:], new))


def _abstract(leaf: Any) -> jax.ShapeDtypeStruct | None:
    """An array-like leaf's JAX type (by `jax.eval_shape`), or None for a static one."""
    if isinstance(leaf, SDS):
        return leaf
    if isinstance(leaf, (jax.Array, np.generic, bool, int, float, complex)):
        out: jax.ShapeDtypeStruct = jax.eval_shape(lambda x: x, leaf)
        return out
    return None


@st.composite
def _mutation(draw: Any, node: Any) -> Any:
    """`node` changed in one way that its kind allows."""
    generic = ["none", "empty", "leaf"]
    ways = []
    spec = _abstract(node) if not _children(node) and node is not None else None
    if spec is not None:
        ways += ["shape", "dtype"] + ([] if spec.dtype == KEY_DTYPE else ["weak_type"])
    elif not _children(node) and node is not None and not isinstance(node, (list, tuple, dict)):
        ways += ["static"]
    if isinstance(node, dict):
        ways += ["add_key", "to_ordered"] + (["del_key", "rename_key"] if node else [])
    if isinstance(node, (list, tuple)) and not isinstance(node, NT):
        ways += ["grow", "retype"] + (["shrink"] if node else [])
    if isinstance(node, NT):
        ways += ["to_tuple"]
    if isinstance(node, DNode):
        ways += ["tag"]
    if isinstance(node, CNode):
        ways += ["meta", "grow_node"]
    # Mostly a change that this kind of node allows, else a replacement by anything.
    way = draw(st.sampled_from(ways if ways and draw(st.integers(0, 3)) else generic))
    if way == "none":
        return None
    if way == "empty":
        return draw(st.sampled_from([[], {}, ()]))
    if way == "leaf":
        return draw(diff_leaves)
    if way == "shape":
        assert spec is not None
        return spec.update(shape=(*spec.shape, 2))
    if way == "dtype":
        assert spec is not None
        return spec.update(dtype=jnp.int8 if spec.dtype != jnp.int8 else jnp.uint8, weak_type=False)
    if way == "weak_type":
        assert spec is not None
        return spec.update(weak_type=not spec.weak_type)
    if way == "static":
        others = [x for x in [*DIFF_STATICS, np.array(["a", "bc"]), SDS((), jnp.float32)] if x is not node]
        return draw(st.sampled_from(others))  # a NumPy array of equal contents is an equal static value
    if way in ("add_key", "del_key", "rename_key"):
        keys = list(node)
        changed = node
        if way != "add_key":
            changed = _with_child(node, keys[0], node[keys[0]])  # a copy, of the same mapping type
            old_key = draw(st.sampled_from(keys))
            value = changed.pop(old_key)
            if way == "del_key":
                return changed
        # A key of the same type as the others (JAX cannot sort mixed keys), sorting
        # before or after them; maybe an existing one.
        ints = bool(keys) and isinstance(keys[0], int)
        new_key = draw(st.sampled_from([0, 3, 9] if ints else ["a", "b", "q", "zz"]))
        return _with_child(changed, new_key, value if way == "rename_key" else draw(diff_leaves))
    if way == "to_ordered":
        return dict(node) if isinstance(node, collections.OrderedDict) else collections.OrderedDict(node)
    if way == "grow":
        return type(node)([*node, draw(diff_leaves)])
    if way == "shrink":
        return type(node)(list(node)[:-1])
    if way == "retype":
        return tuple(node) if isinstance(node, list) else list(node)
    if way == "to_tuple":
        return tuple(node)
    if way == "tag":
        return dataclasses.replace(node, tag=node.tag + "'")
    if way == "meta":
        return CNode(node.children, draw(st.sampled_from([m for m in METAS if m != node.meta])))
    return CNode([*node.children, draw(diff_leaves)], node.meta)  # grow_node


@st.composite
def tree_pairs(draw: Any) -> tuple[Any, Any]:
    """A random tree and a copy with 1 to 3 random changes (which may cancel out)."""
    tree = draw(diff_trees)
    other = tree
    for _ in range(draw(st.integers(1, 3))):
        positions = _positions(other)
        leaves = [at for at in positions if _abstract(_get(other, at)) is not None]
        nodes = [at for at in positions if _children(_get(other, at))]
        # A third each: a leaf, a node with children, anywhere.
        at = draw(st.sampled_from(draw(st.sampled_from([x for x in (leaves, nodes, positions) if x]))))
        other = _put(other, at, draw(_mutation(_get(other, at))))
    return tree, other


ignores = st.sets(st.sampled_from(["weak_type", "vma", "sharding", "dtype", "shape"]))


def _field_differences(e_td: Any, a_td: Any, path: str) -> tuple[Any, list[ts.Mismatch]]:
    """What `diff` adds to the 0.1 reference: wherever the two trees (walked as the reference
    walks them) have custom nodes of one type with other node data (a `DNode`'s `tag`, a
    `CNode`'s `Meta`), each differing field, by its name, as a mismatch of its own; and `a_td`
    with such nodes given `e_td`'s data where their arities agree, so that the reference then
    compares their children (which `diff` does too)."""
    if e_td == a_td or e_td.node_data() is None or a_td.node_data() is None:
        return a_td, []
    (e_type, e_aux), (a_type, a_aux) = e_td.node_data(), a_td.node_data()
    e_children, a_children = e_td.children(), a_td.children()
    if e_type is not a_type:
        return a_td, []
    found: list[ts.Mismatch] = []
    aux = a_aux
    if e_type in (DNode, CNode) and e_aux != a_aux:
        e_fields = {"tag": e_aux[0]} if e_type is DNode else dataclasses.asdict(e_aux)
        a_fields = {"tag": a_aux[0]} if e_type is DNode else dataclasses.asdict(a_aux)
        found = [
            ts.Mismatch(f"{path}.{name}", "structure", *value_texts(e_fields[name], a_fields[name]))
            for name in e_fields
            if e_fields[name] != a_fields[name]
        ]
        if len(e_children) != len(a_children):  # then the reference (and diff) tell the node whole
            return a_td, found
        aux = e_aux
    if e_type in (dict, collections.OrderedDict, collections.defaultdict):
        e_keys = e_aux if e_type is not collections.defaultdict else e_aux[1]
        a_keys = a_aux if e_type is not collections.defaultdict else a_aux[1]
        pairs = [(a_keys.index(k), e_keys.index(k), f"[{k!r}]") for k in a_keys if k in e_keys]
    elif e_type in (list, tuple) or len(e_children) == len(a_children):
        keyed, _ = _flatten_one_level_with_keys(jtu.tree_unflatten(e_td, [0] * e_td.num_leaves))
        keys = [jtu.keystr((key,)) for key, _ in keyed]
        pairs = [(i, i, keys[i]) for i in range(min(len(e_children), len(a_children)))]
    else:
        pairs = []
    children = list(a_children)
    for ai, ei, key in pairs:
        children[ai], more = _field_differences(e_children[ei], a_children[ai], path + key)
        found += more
    node = jtu.PyTreeDef.from_node_data_and_children(jtu.default_registry, (a_type, aux), children)
    return node, found


def _static_as_now(m: ts.Mismatch) -> ts.Mismatch:
    """The reference's mismatch with each static leaf told as `diff` tells it now: a function by
    its import path (`test_scale._activation`), not its repr (which had a memory address)."""
    texts = {f"the static value {leaf_str(v)}": f"the static value {value_text(v)}" for v in DIFF_STATICS}
    return dataclasses.replace(m, expected=texts.get(m.expected, m.expected), actual=texts.get(m.actual, m.actual))


def _faces_a_dict(e_td: Any, a_td: Any) -> bool:
    """Whether a `DNode` and a dict stand at one path of the two trees (walked as the reference
    walks them). `diff` reads such a dict as the node written in a checkpoint's layout, by its
    children's names (section 25; tested in test_orbax.py and test_restore.py), which the 0.1
    reference predates: such pairs are outside what it can tell."""
    if e_td.node_data() is None or a_td.node_data() is None:
        return False
    (e_type, e_aux), (a_type, a_aux) = e_td.node_data(), a_td.node_data()
    if {e_type, a_type} == {DNode, dict}:
        return True
    e_children, a_children = e_td.children(), a_td.children()
    if e_type is dict and a_type is dict:
        pairs = [(e_children[list(e_aux).index(k)], a_children[i]) for i, k in enumerate(a_aux) if k in e_aux]
    elif e_type is a_type and (len(e_children) == len(a_children) or e_type in (list, tuple)):
        pairs = list(zip(e_children, a_children, strict=False))  # lists of two lengths: their common prefix
    else:
        return False
    return any(_faces_a_dict(e, a) for e, a in pairs)


def _assert_as_reference(s: ts.Structure, other: Any, ignore: set[str]) -> list[ts.Mismatch]:
    actual = ts.structure_of(other)
    if _faces_a_dict(s.treedef, actual.treedef):
        assume(False)  # inside @given only: no other caller builds such a pair
    equalised, fields = _field_differences(s.treedef, actual.treedef, "")
    reference = [_static_as_now(m) for m in diff_structures(s, ts.Structure(equalised, actual.leaves), "tree")]
    reference += fields
    expected = [m for m in reference if m.kind not in ignore]
    # The fields come first at their node, before its children: the order is pinned in
    # tests/test_frameworks.py; here, with fields, the same mismatches in any order.
    arrange = (lambda ms: sorted(ms, key=repr)) if fields else list
    assert arrange(s.diff(other, ignore=ignore)) == arrange(expected)
    assert arrange(s.diff(actual, ignore=ignore)) == arrange(expected)
    assert s.matches(other, ignore=ignore) is (not expected)
    if expected:
        with pytest.raises(ts.StructureMismatchError) as info:
            s.check(other, ignore=ignore)
        assert arrange(info.value.mismatches) == arrange(expected)
    else:
        assert s.check(other, ignore=ignore) is None
    return reference


@SOME
@given(tree_pairs(), ignores)
def test_diff_check_and_matches_agree_with_the_reference_diff(pair, ignore):
    tree, other = pair
    s = ts.structure_of(tree)
    assert s.diff(tree) == [] and s.matches(tree) and s.check(tree) is None
    reference = _assert_as_reference(s, other, set())
    if ignore:
        _assert_as_reference(s, other, ignore)
    # The reverse direction is another pair of the same kind.
    _assert_as_reference(ts.structure_of(other), tree, ignore)
    assert all(m.root == "tree" for m in reference)
    event(f"mismatch kinds: {sorted({m.kind for m in reference})}")
    event(f"mismatches: {min(len(reference), 3)}{'+' if len(reference) >= 3 else ''}")


def test_varying_axes_differences_agree_with_the_reference_under_shard_map():
    mesh = jax.make_mesh((8,), ("i",))
    seen = []

    def per_shard(x: Any) -> Any:
        inv = jnp.zeros(2, jnp.float32)
        tree = {"x": x, "inv": inv, "p": pcast_varying(inv, "i"), "s": lax.psum(x, "i")}
        other = {
            "x": lax.psum(x, "i"),
            "inv": pcast_varying(inv, "i"),
            "p": jnp.zeros(3, jnp.float32),
            "s": x,
        }
        s = ts.structure_of(tree)
        reference = diff_structures(s, ts.structure_of(other), "tree")
        for ignore in (set(), {"vma"}, {"shape", "vma"}):
            _assert_as_reference(s, other, ignore)
        seen.append(reference)
        return x

    xs = jax.device_put(jnp.zeros(16, jnp.float32), NamedSharding(mesh, P("i")))
    jax.shard_map(per_shard, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(xs)
    i, none = frozenset({"i"}), frozenset()
    assert seen == [
        [
            ts.Mismatch("['inv']", "vma", none, i),
            ts.Mismatch("['p']", "shape", (2,), (3,)),
            ts.Mismatch("['p']", "vma", i, none),
            ts.Mismatch("['s']", "vma", none, i),
            ts.Mismatch("['x']", "vma", i, none),
        ]
    ]


# Two trees drawn independently from a few keys, leaves and node types: they often
# share most of their structure, and differ in many places at once (interleaved
# missing and extra keys, lists of other lengths, nodes of other types).
_few_leaves = st.sampled_from(
    [F2, SDS((2,), jnp.bfloat16), SDS((3,), jnp.float32), SDS((), jnp.float32, weak_type=True), "relu", None]
)


def _few_containers(children: Any) -> Any:
    few_keys = st.sampled_from(["a", "b", "c", "d"])
    return st.one_of(
        st.dictionaries(few_keys, children, max_size=4),
        st.dictionaries(few_keys, children, max_size=4).map(collections.OrderedDict),
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.builds(NT, children, children),
        st.builds(DNode, children, children, st.sampled_from(["x", "y"])),
        st.builds(CNode, st.lists(children, max_size=3), st.sampled_from(METAS)),
    )


few_trees = st.recursive(_few_leaves, _few_containers, max_leaves=8)
# Roots of one type, so that the two trees are compared below the root.
few_roots = st.sampled_from([dict, list]).flatmap(
    lambda root: (
        st.tuples(*[st.dictionaries(st.sampled_from("abcd"), few_trees, max_size=4)] * 2)
        if root is dict
        else st.tuples(*[st.lists(few_trees, max_size=4)] * 2)
    )
)


@SOME
@given(few_roots, ignores)
def test_diff_of_independent_trees_agrees_with_the_reference_diff(pair, ignore):
    tree, other = pair
    reference = _assert_as_reference(ts.structure_of(tree), other, set())
    _assert_as_reference(ts.structure_of(tree), other, ignore)
    event(f"mismatches: {min(len(reference), 5)}{'+' if len(reference) >= 5 else ''}")


def test_structure_of_a_structure_is_that_structure():
    # Idempotent, as weak_paths / strip_weak_type / upcast take a Structure as their tree.
    s = ts.structure_of({"w": jnp.zeros((2, 3), jnp.bfloat16), "step": 0})
    assert ts.structure_of(s) is s
    assert ts.structure_of(s).diff({"w": jnp.zeros((2, 3), jnp.bfloat16), "step": 1}) == []
    # Inside a tree read by structure_of, a Structure is a static leaf like any other object;
    # as an input of out_structure, it stands for the tree it describes (as for ts.cost).
    outer = ts.structure_of({"s": s})
    assert outer.leaves == (s,)
    assert ts.out_structure(lambda t: t, {"s": s}) == ts.structure_of({"s": s.tree})


def _mixed_tree(x: Any) -> Any:
    """Traced values of several kinds next to static and concrete ones."""
    return {
        "x": x,
        "weak": x * 2.0 if jnp.issubdtype(x.dtype, jnp.floating) else x,
        "bf16": x.astype(jnp.bfloat16),
        "n": 3,
        "lr": 0.1,
        "np": np.float64(1.0),
        "sds": SDS((2,), np.float64, weak_type=True),
        "act": "relu",
        "key": jax.random.key(0),
        "none": None,
    }


def _agree_here(x: Any, seen: list[bool]) -> None:
    tree = _mixed_tree(x)
    mine, truth = ts.structure_of(tree), ts.out_structure(lambda t: t, tree)
    assert mine == truth
    for m, t in zip(mine.leaves, truth.leaves, strict=True):
        if isinstance(t, SDS):
            assert (m.shape, m.dtype, m.weak_type, _varying(m)) == (t.shape, t.dtype, t.weak_type, _varying(t))
        else:
            assert m is t
    seen.append(True)


@pytest.mark.parametrize(
    "transform",
    ["grad", "jvp", "vjp", "scan", "while_loop", "fori_loop", "cond", "checkpoint", "custom_vjp", "hessian"],
)
def test_structure_of_equals_identity_out_structure_under_other_transformations(transform):
    seen: list[bool] = []
    x = jnp.ones(3, jnp.float32)

    def probe(v):
        _agree_here(v, seen)
        return jnp.sum(v * v)

    if transform == "grad":
        jax.grad(probe)(x)
    elif transform == "jvp":
        jax.jvp(probe, (x,), (x,))
    elif transform == "vjp":
        jax.vjp(probe, x)
    elif transform == "hessian":
        jax.hessian(probe)(x)
    elif transform == "scan":
        lax.scan(lambda c, xi: (c + probe(xi), None), 0.0, jnp.ones((4, 3), jnp.float32))
    elif transform == "while_loop":
        lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + probe(c[2]), c[2]), (0, 0.0, x))
    elif transform == "fori_loop":
        lax.fori_loop(0, 2, lambda i, c: c + probe(x * i), 0.0)
    elif transform == "cond":
        lax.cond(x[0] > 0, probe, lambda v: jnp.sum(v), x)
    elif transform == "checkpoint":
        jax.grad(jax.checkpoint(probe))(x)
    else:

        @jax.custom_vjp
        def f(v):
            return probe(v)

        f.defvjp(lambda v: (probe(v), v), lambda v, g: (g * v,))
        jax.grad(f)(x)
    assert seen  # the probe ran under the transformation
