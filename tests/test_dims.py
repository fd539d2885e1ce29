"""Symbolic dimensions (`jax.export` shape polymorphism): one Structure for every batch size.

Oracles: `jax.eval_shape` on the same symbolic inputs, the Structure of a concrete tree
(`structure_of` of arrays of each size), and real `jax.export` runs called at several sizes.
"""

import json
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax import lax
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._cli import main


F32 = jnp.float32
INT = jax.dtypes.canonicalize_dtype(jnp.int_)  # JAX's default int: int32, or int64 with x64 on


def sds(shape, dtype=F32, **kw):
    return jax.ShapeDtypeStruct(shape, dtype, **kw)


def model(x):
    """An output of several dimension expressions of one input's batch size."""
    n = x.shape[0]
    return {"h": jnp.concatenate([x, x]), "mean": x.mean(0), "half": x[: (n + 1) // 2], "n": n}


# -- inference ------------------------------------------------------------------------
def test_out_structure_is_what_eval_shape_gives_with_dimension_expressions():
    (b,) = jax.export.symbolic_shape("b")
    x = sds((b, 3))
    s = ts.out_structure(model, x)
    assert s.tree == jax.eval_shape(model, x)
    assert s.tree["h"].shape == (2 * b, 3)
    assert str(s.tree["half"].shape[0]) == "floordiv(b + 1, 2)"
    assert s.tree["n"] == jax.ShapeDtypeStruct((), INT, weak_type=True)  # a dimension as a value, as JAX types it
    assert s.dims == ("b",)
    assert str(s.size) == "3*floordiv(b + 1, 2) + 6*b + 4"
    assert str(s.nbytes) == "12*floordiv(b + 1, 2) + 24*b + " + str(3 * 4 + INT.itemsize)


def test_structure_of_symbolic_leaves_equals_the_identity_inferred():
    b, s = jax.export.symbolic_shape("b, s")
    tree = {"tokens": sds((b, s), jnp.int32), "mask": sds((b,), bool), "len": s}
    assert ts.structure_of(tree) == ts.out_structure(lambda t: t, tree)
    assert ts.structure_of(tree).dims == ("b", "s")  # leaf order (`len`, `mask`, `tokens`), then axis order
    assert ts.structure_of({"x": sds((2 * b * s + 1,)), "y": sds((s,))}).dims == ("b", "s")


def test_dims_are_in_order_of_first_appearance():
    a, b, c = jax.export.symbolic_shape("a, b, c")
    s = ts.structure_of([sds((c, 2)), sds((a * b,)), sds((3,)), sds((b, c))])
    assert s.dims == ("c", "a", "b")
    assert ts.structure_of(jnp.zeros(3, F32)).dims == ()


def test_inside_jit_the_answer_is_symbolic_too():
    (b,) = jax.export.symbolic_shape("b")
    seen = []

    @jax.jit
    def step(y):
        seen.append(ts.out_structure(lambda t, u: t * u.sum(), sds((b, 3)), y))
        return y

    step(jnp.ones(3, F32))
    assert seen[0].tree == jax.ShapeDtypeStruct((b, 3), F32)


def test_inside_jax_export_every_helper_works_and_runs_at_each_size():
    (b,) = jax.export.symbolic_shape("b")
    seen = {}

    def step(x):
        s = ts.out_structure(lambda v: {"y": v * 2, "m": v.mean(0)}, x)
        seen["out"], seen["read"] = s, ts.structure_of(x)
        init = ts.scan_carry(lambda c, xi: (c + xi.sum(), None), 0, x)  # a weak int accumulator becomes f32
        seen["carry"] = ts.carry_structure(lambda c, xi: (c + xi.sum(), None), 0, x)
        state = ts.settle(lambda st, v: {"acc": st["acc"] + v.sum(), "n": st["n"] + 1}, {"acc": 0.0, "n": 0}, x)
        zeros = s.zeros()  # under the export trace, JAX builds arrays of symbolic shape
        total, _ = lax.scan(lambda c, xi: (c + xi.sum(), None), init, x)
        return zeros["y"] + total + state["acc"] + state["n"]

    exported = jax.export.export(jax.jit(step))(sds((b, 3)))
    assert exported.out_avals[0].shape == (b, 3)
    assert seen["out"].tree["y"].shape == (b, 3)
    assert seen["read"].dims == ("b",)
    assert seen["carry"].leaves[0] == jax.ShapeDtypeStruct((), F32, weak_type=False)
    for n in (1, 5, 8):
        x = jnp.arange(3 * n, dtype=F32).reshape(n, 3)
        np.testing.assert_allclose(exported.call(x), step(x), rtol=1e-6)


def test_carry_structure_of_symbolic_init_and_xs():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.carry_structure(lambda c, x: (c + x, None), sds((3,)), xs=sds((b, 3)))
    assert s.tree == sds((3,))
    s = ts.carry_structure(lambda c, _: (c * 2.0, None), sds((b,)), length=4)
    assert s.tree == sds((b,)) and s.dims == ("b",)
    with pytest.raises(ValueError, match=r"`length=4` disagrees with the leading axis of `xs` \(b"):
        ts.carry_structure(lambda c, x: (c + x, None), sds((3,)), xs=sds((b, 3)), length=4)


# -- bind --------------------------------------------------------------------------------
def test_bind_gives_the_structure_of_concrete_inputs():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.out_structure(model, sds((b, 3)))
    for n in (1, 4, 7):
        assert s.bind(b=n) == ts.out_structure(model, jnp.zeros((n, 3), F32))
        assert s.bind(b=n).dims == ()


def test_bind_some_names_and_leave_the_others_free():
    b, s = jax.export.symbolic_shape("b, s")
    st = ts.structure_of({"x": sds((b, s)), "y": sds((b * s + 1,)), "z": sds((s,))})
    half = st.bind(b=4)
    assert half.dims == ("s",)
    assert [str(leaf.shape) for leaf in half.leaves] == ["(4, s)", "(4*s + 1,)", "(s,)"]
    assert half.bind(s=3) == st.bind(b=4, s=3) == ts.structure_of({"x": sds((4, 3)), "y": sds((13,)), "z": sds((3,))})


def test_bind_keeps_shardings_dtypes_and_static_leaves():
    (b,) = jax.export.symbolic_shape("b", constraints=["mod(b, 4) == 0"])
    mesh = AbstractMesh((4,), ("d",))
    s = ts.structure_of({"x": sds((b, 3), jnp.bfloat16), "act": "relu"}).with_shardings(
        lambda path, leaf: NamedSharding(mesh, P("d"))
    )
    bound = s.bind(b=8)
    assert bound.tree["x"] == sds((8, 3), jnp.bfloat16, sharding=NamedSharding(mesh, P("d")))
    assert bound.tree["act"] == "relu"
    assert bound.nbytes_per_device == 2 * 3 * 2
    assert str(s.nbytes_per_device) == "6*floordiv(b, 4)"  # 2 bytes * 3 * b / 4


def test_bind_errors_name_the_dimension():
    (b,) = jax.export.symbolic_shape("b", constraints=["b >= 4", "b <= 64"])
    s = ts.structure_of({"x": sds((b, 3)), "y": sds((b - 3,))})
    with pytest.raises(ValueError, match=r"'c' is not a free dimension of this structure; its free dimensions are b\."):
        s.bind(c=3)
    with pytest.raises(ValueError, match=r"dimension 'b' cannot be 0: JAX's symbolic dimensions stand for sizes >= 1"):
        s.bind(b=0)
    with pytest.raises(ValueError, match=r"b=2 breaks the constraint 'b >= 4' .*constraints: b >= 4, b <= 64"):
        s.bind(b=2)
    with pytest.raises(ValueError, match=r"b=65 breaks the constraint 'b <= 64'"):
        s.bind(b=65)
    for bad in (2.0, True, "8", None):
        with pytest.raises(TypeError, match=r"the size of dimension 'b' must be an integer"):
            s.bind(b=bad)
    assert s.bind(b=np.int64(5)) == ts.structure_of({"x": sds((5, 3)), "y": sds((2,))})
    with pytest.raises(ValueError, match=r"its free dimensions are none"):
        ts.structure_of(jnp.zeros(2, F32)).bind(b=3)


def test_bind_refuses_a_negative_size_naming_the_leaf():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"ok": sds((b,)), "short": sds((b - 8,))})
    with pytest.raises(ValueError, match=r"b=4 makes tree\['short'\] \(f32\[b - 8\]\) shape \(-4,\)"):
        s.bind(b=4)


def test_bind_evaluates_large_sizes_exactly():
    b, s = jax.export.symbolic_shape("b, s")
    big = ts.structure_of(sds((4096 * b * s,), jnp.int8)).bind(b=2**20, s=2**20)
    assert big.leaves[0].shape == (4096 * 2**40,)  # JAX's 32-bit dimension arithmetic would wrap around


def test_zeros_of_free_dimensions_names_them_and_bind():
    b, s = jax.export.symbolic_shape("b, s")
    st = ts.structure_of({"x": sds((b, s))})
    for build in (st.zeros, st.ones, lambda: st.full(2)):
        with pytest.raises(ValueError, match=r"free symbolic dimensions \(b, s; e\.g\. tree\['x'\]: f32\[b,s\]\).*"):
            build()
    assert st.bind(b=2, s=3).zeros()["x"].shape == (2, 3)


# -- diff, check, matches, match_dims ---------------------------------------------------------
def test_a_symbolic_structure_matches_trees_of_every_size():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.out_structure(model, sds((b, 3)))
    for n in (1, 2, 5, 8):
        tree = model(jnp.ones((n, 3), F32))
        assert s.diff(tree) == []
        assert s.matches(tree)
        assert s.match_dims(tree) == {"b": n}


def test_expressions_bind_consistently_across_the_tree():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"a": sds((2 * b,)), "b": sds(((b + 1) // 2, 3)), "c": sds((b + 1,)), "d": sds((b,))})
    good = {"a": jnp.zeros(10, F32), "b": jnp.zeros((3, 3), F32), "c": jnp.zeros(6, F32), "d": jnp.zeros(5, F32)}
    assert s.match_dims(good) == {"b": 5}  # told by `2*b` = 10 first
    bad = {**good, "d": jnp.zeros(6, F32)}
    [m] = s.diff(bad)
    assert (m.path, m.kind, m.expected, m.actual) == ("['d']", "shape", (b,), (6,))
    assert m.dims == (("b", 5, "tree['a']"),)
    assert str(m) == "tree['d']: expected shape (b,), got (6,); here b = 6, but b = 5 at tree['a']."
    assert m.here == (("b", "b", 6, 6, 5),)
    with pytest.raises(
        ts.StructureMismatchError, match=r"tree\['d'\].*got \(6,\); here b = 6, but b = 5 at tree\['a'\]\. Give b one"
    ):
        s.check(bad)


def test_a_tree_that_binds_a_name_twice_fails_naming_both_paths_and_sizes():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"x": sds((b, 3)), "y": sds((b,)), "z": sds((b, 2))})
    tree = {"x": jnp.zeros((5, 3), F32), "y": jnp.zeros(6, F32), "z": jnp.zeros((5, 2), F32)}
    with pytest.raises(ts.StructureMismatchError) as info:
        s.match_dims(tree)
    assert [(m.path, m.actual, m.dims) for m in info.value.mismatches] == [("['y']", (6,), (("b", 5, "tree['x']"),))]
    assert "tree['y']: expected shape (b,), got (6,); here b = 6, but b = 5 at tree['x']." in str(info.value)
    assert not s.matches(tree)


def test_match_dims_names_the_size_each_dimension_of_one_leaf_gives_a_name():
    (t,) = jax.export.symbolic_shape("t")
    s = ts.structure_of({"x": sds((2, t, t)), "y": sds((2 * t,))})
    with pytest.raises(ts.StructureMismatchError) as info:
        s.match_dims({"x": jnp.zeros((2, 5, 6), F32), "y": jnp.zeros(10, F32)})
    [m] = info.value.mismatches
    assert m.path == "['x']" and m.dims == (("t", 5, "tree['x'] dimension 1"), ("t", 6, "tree['x'] dimension 2"))
    assert str(info.value).endswith(
        "tree['x']: expected shape (2, t, t), got (2, 5, 6); t = 5 at tree['x'] dimension 1, t = 6 at tree['x'] "
        "dimension 2. Give t one size across the tree."
    )
    assert not s.matches({"x": jnp.zeros((2, 5, 6), F32), "y": jnp.zeros(10, F32)})
    assert s.match_dims({"x": jnp.zeros((2, 5, 5), F32), "y": jnp.zeros(10, F32)}) == {"t": 5}


@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_match_dims_names_the_size_each_conflicting_leaf_gives(jit):
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"x": sds((b, 3)), "y": sds((2 * b,)), "z": sds((2 * b + 1,)), "h": sds(((b + 1) // 2,))})
    tree = {"x": jnp.zeros((5, 3), F32), "y": jnp.zeros(12, F32), "z": jnp.zeros(12, F32), "h": jnp.zeros(4, F32)}

    def run():
        with pytest.raises(ts.StructureMismatchError) as info:
            s.match_dims(tree)
        return str(info.value), info.value.mismatches  # not the error: its traceback holds the trace's frames

    if jit:
        caught = []
        jax.jit(lambda x: (caught.append(run()), x)[1])(1.0)
        [(message, mismatches)] = caught
    else:
        message, mismatches = run()
    assert [(m.path, m.here) for m in mismatches] == [
        ("['h']", (("b", "floordiv(b + 1, 2)", 4, None, 3),)),
        ("['y']", (("b", "2*b", 12, 6, 10),)),
        ("['z']", (("b", "2*b + 1", 12, None, 11),)),
    ]
    assert [str(m) for m in mismatches] == [
        "tree['h']: expected shape (floordiv(b + 1, 2),), got (4,); here floordiv(b + 1, 2) = 4, but b = 5 at "
        "tree['x'], which gives floordiv(b + 1, 2) = 3.",
        "tree['y']: expected shape (2*b,), got (12,); here b = 6 (2*b = 12), but b = 5 at tree['x'].",
        "tree['z']: expected shape (2*b + 1,), got (12,); here 2*b + 1 = 12, but b = 5 at tree['x'], which gives "
        "2*b + 1 = 11.",
    ]
    assert message.endswith(str(mismatches[0]) + " Give b one size across the tree.")


def test_a_min_of_a_name_is_checked_once_the_name_is_bound():
    (b,) = jax.export.symbolic_shape("b")
    (m,) = jax.export.symbolic_shape("min(b, 4)", scope=b.scope)
    s = ts.structure_of({"a": sds((m,)), "z": sds((b,))})
    assert s.match_dims({"a": jnp.zeros(4, F32), "z": jnp.zeros(9, F32)}) == {"b": 9}
    assert s.match_dims({"a": jnp.zeros(2, F32), "z": jnp.zeros(2, F32)}) == {"b": 2}
    [mismatch] = s.diff({"a": jnp.zeros(3, F32), "z": jnp.zeros(9, F32)})
    assert (mismatch.path, mismatch.dims) == ("['a']", (("b", 9, "tree['z']"),))


def test_a_broken_constraint_is_reported_at_the_leaf_that_bound_it():
    (b,) = jax.export.symbolic_shape("b", constraints=["b >= 4"])
    s = ts.structure_of({"x": sds((b, 3)), "y": sds((2 * b,))})
    [m] = s.diff({"x": jnp.zeros((2, 3), F32), "y": jnp.zeros(4, F32)})
    assert (m.path, m.kind, m.constraint, m.dims) == ("['x']", "shape", "b >= 4", (("b", 2, "tree['x']"),))
    assert str(m) == "tree['x']: expected shape (b, 3) with b >= 4, got (2, 3) (b = 2)."
    with pytest.raises(ts.StructureMismatchError, match=r"Pass a tree whose sizes meet b >= 4\."):
        s.match_dims({"x": jnp.zeros((2, 3), F32), "y": jnp.zeros(4, F32)})


def test_a_name_no_leaf_determines_is_never_silently_matched():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"half": sds(((b + 1) // 2,))})  # 3 is floordiv(b + 1, 2) for b = 5 and b = 6
    [m] = s.diff({"half": jnp.zeros(3, F32)})
    assert m.dims == (("b", None, ""),)
    assert str(m) == "tree['half']: expected shape (floordiv(b + 1, 2),), got (3,); no leaf of the tree determines b."
    with pytest.raises(ts.StructureMismatchError, match=r"Bind it first: `structure\.bind\(b=\.\.\.\)`"):
        s.check({"half": jnp.zeros(3, F32)})
    assert s.bind(b=5).matches({"half": jnp.zeros(3, F32)})


def test_other_differences_are_still_reported_with_binding():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"x": sds((b, 3)), "w": sds((3,))})
    found = s.diff({"x": jnp.zeros((5, 3), jnp.int32), "extra": 1})
    assert [(m.path, m.kind) for m in found] == [("['extra']", "structure"), ("['w']", "structure"), ("['x']", "dtype")]
    assert s.match_dims({"x": jnp.zeros((5, 3), jnp.int32), "w": jnp.zeros(3, F32)}) == {"b": 5}  # dtypes are diff's


def test_a_tree_with_symbolic_leaves_compares_by_written_form():
    (b,) = jax.export.symbolic_shape("b")
    (b2,) = jax.export.symbolic_shape("b")  # another scope, the same (no) constraints
    (b3,) = jax.export.symbolic_shape("b", constraints=["b >= 2"])
    s = ts.out_structure(model, sds((b, 3)))
    assert s == ts.out_structure(model, sds((b2, 3)))
    assert hash(s) == hash(ts.out_structure(model, sds((b2, 3))))
    other = ts.out_structure(model, sds((b3, 3)))
    assert s != other
    found = s.diff(other)
    assert {m.path for m in found} == {"['h']", "['half']"}
    assert str(found[0]) == (
        "tree['h']: expected shape (2*b, 3) with constraints (none), got the same dimensions with constraints (b >= 2)."
    )
    assert s != s.bind(b=3)


def test_upcast_towards_a_symbolic_structure_binds_its_names():
    (b,) = jax.export.symbolic_shape("b")
    like = ts.structure_of({"w": sds((b, 3))})
    out = ts.upcast({"w": jnp.ones((5, 3), jnp.bfloat16)}, like, policy="promote")
    assert out["w"].dtype == F32 and out["w"].shape == (5, 3)
    with pytest.raises(ts.StructureMismatchError, match=r"tree\['w'\]: expected shape \(b, 3\), got \(5, 4\)"):
        ts.upcast({"w": jnp.ones((5, 4), jnp.bfloat16)}, like, policy="promote")


@given(
    n=st.integers(1, 64),
    shapes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 4), st.sampled_from([F32, jnp.int8, jnp.bool_])), max_size=8
    ),
)
def test_binding_a_structure_equals_reading_the_tree_of_that_size(n, shapes):
    (b,) = jax.export.symbolic_shape("b")
    scale = {0: lambda d: d, 1: lambda d: 2 * d, 2: lambda d: d + 1, 3: lambda d: 3 * d + 2}
    symbolic = [sds((scale[k](b), w), dtype) for k, w, dtype in shapes]
    concrete = [sds((scale[k](n), w), dtype) for k, w, dtype in shapes]
    s = ts.structure_of(symbolic)
    assert s.bind(**({"b": n} if shapes else {})) == ts.structure_of(concrete)
    assert s.diff(concrete) == []
    assert s.match_dims(concrete) == ({"b": n} if shapes else {})
    if len(shapes) >= 2:  # the first leaf binds b; the last one then disagrees
        wrong = [*concrete[:-1], sds((scale[shapes[-1][0]](n) + 1, shapes[-1][1]), shapes[-1][2])]
        assert [m.kind for m in s.diff(wrong)] == ["shape"]


# -- value semantics, printing, JSON ---------------------------------------------------------
def test_pickle_keeps_the_dimensions():
    (b,) = jax.export.symbolic_shape("b", constraints=["b >= 2"])
    s = ts.out_structure(model, sds((b, 3)))
    loaded = pickle.loads(pickle.dumps(s))
    assert loaded == s and loaded.dims == ("b",)
    assert loaded.bind(b=4) == s.bind(b=4)


def test_every_printer_shows_the_expressions():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"h": sds((2 * b, 3)), "n": sds((3,))})
    assert repr(s) == "Structure({'h': f32[2*b,3], 'n': f32[3]}, 2 leaves, 24*b + 12 B)"
    assert str(s) == (
        "path   shape    dtype        bytes\n"
        "-----  -------  -----  -----------\n"
        "['h']  [2*b,3]  f32         24*b B\n"
        "['n']  [3]      f32           12 B\n"
        "-----  -------  -----  -----------\n"
        "total: 2 leaves, 6*b + 3 elements  24*b + 12 B"
    )
    assert ts.describe(s) == str(s)
    assert '<td style="text-align: left">[2*b,3]</td>' in s._repr_html_() and "24*b + 12 B" in s._repr_html_()
    import treescope  # the test extra installs it

    assert "f32[2*b,3]" in treescope.render_to_text(s)


def test_sums_over_several_scopes_print_too():
    (b,) = jax.export.symbolic_shape("b")
    (c,) = jax.export.symbolic_shape("c")  # another scope: JAX cannot add b and c
    s = ts.structure_of([sds((b, 3)), sds((c,))])
    assert str(s.size) == "c + 3*b" and str(s.nbytes) == "4*c + 12*b"
    assert str(s).endswith("total: 2 leaves, c + 3*b elements  4*c + 12*b B")
    assert ts.Structure.from_json(s.to_json()) == s


def test_json_keeps_expressions_and_constraints_in_one_scope():
    (b,) = jax.export.symbolic_shape("b", constraints=["b >= 4", "mod(b, 2) == 0"])
    s = ts.out_structure(model, sds((b, 3)))
    doc = json.loads(s.to_json())
    assert doc["constraints"] == ["b >= 4", "mod(b, 2) == 0"]  # as written (not what JAX derives)
    assert [leaf["shape"] for leaf in doc["leaves"]] == [["2*b", 3], ["floordiv(b + 1, 2)", 3], [3], []]
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s and hash(loaded) == hash(s) and s.diff(loaded) == []
    assert loaded.to_json() == s.to_json()
    # One snapshot checks trees of every batch size, and its constraints still hold.
    for n in (4, 6, 10):
        assert loaded.match_dims(model(jnp.ones((n, 3), F32))) == {"b": n}
    [m] = loaded.diff(model(jnp.ones((2, 3), F32)))
    assert m.constraint == "b >= 4"
    with pytest.raises(ValueError, match=r"breaks the constraint 'mod\(b, 2\) == 0'"):
        loaded.bind(b=5)


def test_json_refuses_scopes_with_different_constraints():
    (b,) = jax.export.symbolic_shape("b")
    (c,) = jax.export.symbolic_shape("c", constraints=["c >= 2"])
    with pytest.raises(TypeError, match=r"scopes with different constraints \(\[\] and \[c >= 2\]\)"):
        ts.structure_of([sds((b,)), sds((c,))]).to_json()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["leaves"][0].update(shape=["b +", 3]), r"leaves\[0\]\.shape\[0\]: 'b \+' is not a dimension"),
        (lambda d: d["leaves"][0].update(shape=["b, c", 3]), r"leaves\[0\]\.shape\[0\]: 'b, c' is 2 dimensions"),
        (lambda d: d["leaves"][0].update(shape=["-3", 3]), r"leaves\[0\]\.shape\[0\]: expected a size >= 0"),
        (lambda d: d["leaves"][0].update(shape=["__import__('os')", 3]), r"not a dimension expression"),
        (lambda d: d.update(constraints=["b >="]), r"constraints: not valid constraints"),
        (lambda d: d.update(constraints=[3]), r"constraints\[0\]: expected a string"),
        (lambda d: d.update(constraints="b >= 4"), r"constraints: expected a list"),
    ],
)
def test_malformed_symbolic_json_is_a_value_error(edit, message):
    (b,) = jax.export.symbolic_shape("b")
    doc = json.loads(ts.structure_of([sds((b, 3))]).to_json())
    edit(doc)
    with pytest.raises(ValueError, match=message):
        ts.Structure.from_json(json.dumps(doc))


# -- the cache --------------------------------------------------------------------------------
def test_the_cache_keeps_scopes_and_concrete_sizes_apart():
    (b,) = jax.export.symbolic_shape("b")
    (b4,) = jax.export.symbolic_shape("b", constraints=["b >= 4"])
    f = lambda x: x[:4]  # the size of the slice depends on the scope's constraints
    free = ts.out_structure(f, sds((b, 3)))
    constrained = ts.out_structure(f, sds((b4, 3)))
    assert str(free.leaves[0].shape[0]) == "min(b, 4)"
    assert constrained.leaves[0].shape == (4, 3)  # with b >= 4, min(b, 4) is 4
    assert ts.out_structure(f, jnp.zeros((2, 3), F32)).leaves[0].shape == (2, 3)
    assert ts.cache_info().misses == 3
    assert ts.out_structure(f, sds((b, 3))) == free
    assert ts.cache_info().hits == 1
    assert ts.out_structure(f, sds((b, 3))).leaves[0].shape[0].scope is b.scope


# -- sharding ----------------------------------------------------------------------------------
def test_splitting_a_symbolic_size_needs_a_divisibility_constraint():
    (b,) = jax.export.symbolic_shape("b")
    mesh = AbstractMesh((4,), ("d",))
    with pytest.raises(ValueError, match=r'divides b only for some sizes: constrain it, e\.g\. .*"mod\(b, 4\) == 0"'):
        ts.structure_of([sds((b, 3))]).with_shardings(NamedSharding(mesh, P("d")))
    (c,) = jax.export.symbolic_shape("c", constraints=["mod(c, 4) == 0"])
    s = ts.structure_of([sds((c, 3))]).with_shardings(NamedSharding(mesh, P("d")))
    assert str(s.nbytes_per_device) == "3*c"
    assert "P('d', None)" in str(s) and "3*c B" in str(s)


# -- the command line ---------------------------------------------------------------------
def test_cli_specs_take_names_and_expressions(capsys):
    assert main(["inspect", "jax.numpy:concatenate", "(f32[b,3],f32[b,3])", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"path": "", "shape": ["2*b", 3], "dtype": "float32", "weak_type": False}
    ]
    assert main(["inspect", "jax.numpy:add", "f32[b]", "f32[c]"]) == 1  # one scope per command: b is not c
    assert "incompatible shapes for broadcasting: (b,), (c,)" in capsys.readouterr().err
    assert main(["inspect", "jax.numpy:matmul", "f32[floordiv(b, 2),784]", "f32[784,10]"]) == 0
    out = capsys.readouterr().out
    assert "[floordiv(b, 2),10]" in out and "40*floordiv(b, 2) B" in out
    assert main(["inspect", "jax.numpy:add", "f32[b+]", "f32[3]"]) == 2
    assert capsys.readouterr().err.strip() == (
        "treeshape: error: malformed spec 'f32[b+]': dimension 'b+' is neither a size nor a dimension name or "
        "expression (b, 2*b, b + 1), e.g. f32[b,784]"
    )


def test_a_concrete_leaf_of_a_bound_shape_is_told_as_itself():
    (b,) = jax.export.symbolic_shape("b")
    s = ts.structure_of({"x": sds((b, 3)), "y": sds((5, 3)), "z": sds((2 * b - 5, 3))})
    found = s.diff({"x": sds((5, 3)), "y": sds((6, 3)), "z": sds((6, 3))})
    assert [(m.path, m.expected, m.dims) for m in found] == [
        ("['y']", (5, 3), ()),
        ("['z']", (2 * b - 5, 3), (("b", 5, "tree['x']"),)),
    ]


def test_memory_by_module_sums_symbolic_sizes():
    (b,) = jax.export.symbolic_shape("b")
    (c,) = jax.export.symbolic_shape("c")  # another scope
    tree = {"enc": {"x": sds((b, 3)), "z": sds((c,)), "w": sds((3, 3))}, "dec": {"y": sds((2 * b,))}}
    assert ts.describe(tree, depth=1) == (
        "path     leaves       params              bytes\n"
        "-------  ------  -----------  -----------------\n"
        "['dec']       1          2*b              8*b B\n"
        "['enc']       3  c + 3*b + 9  4*c + 12*b + 36 B\n"
        "-------  ------  -----------  -----------------\n"
        "total         4  c + 5*b + 9  4*c + 20*b + 36 B"
    )


# -- a sharding that splits a symbolic dimension ------------------------------------------
_MESH2 = AbstractMesh((2,), ("d",))


def _split_b(constraints=()):
    (b,) = jax.export.symbolic_shape("b", constraints=list(constraints))
    return b, sds((b, 3), sharding=NamedSharding(_MESH2, P("d")))


@pytest.mark.parametrize("jit", [False, True], ids=["top", "jit"])
def test_a_sharding_that_splits_a_symbolic_dimension_is_checked_on_entry(jit):
    _, x = _split_b()
    calls = {
        "structure_of": (lambda: ts.structure_of({"x": x}), "tree['x']"),
        "out_structure": (lambda: ts.out_structure(lambda t: t, {"x": x}), "args[0]['x']"),
    }
    for who, (call, where) in calls.items():
        with pytest.raises(ValueError) as info:
            jax.jit(lambda v, call=call: (call(), v)[1])(1.0) if jit else call()
        assert str(info.value) == (
            f"treeshape.{who}: the sharding of {where} (f32[b,3], P('d', None)) does not fit it: dimension 0 (size "
            "b) would be split 2 ways over mesh axes ('d',), which divides b only for some sizes: constrain it, "
            'e.g. `jax.export.symbolic_shape(..., constraints=["mod(b, 2) == 0"])`, or write the dimension as '
            "`2*b`. JAX would refuse it once the dimension has a size (an IndivisibleError)."
        )
    # with_shardings says the same of the same leaf
    with pytest.raises(ValueError, match=r"which divides b only for some sizes: constrain it"):
        ts.structure_of({"x": x.update(sharding=None)}).with_shardings(NamedSharding(_MESH2, P("d")))


def test_a_constraint_or_a_multiple_makes_it_divide_and_bind_refuses_other_sizes():
    b, x = _split_b(["mod(b, 2) == 0"])
    s = ts.structure_of({"x": x})
    assert s.bind(b=4).tree["x"] == jax.ShapeDtypeStruct((4, 3), F32, sharding=NamedSharding(_MESH2, P("d")))
    with pytest.raises(ValueError, match=r"^treeshape\.Structure\.bind: b=3 breaks the constraint 'mod\(b, 2\) == 0'"):
        s.bind(b=3)
    (c,) = jax.export.symbolic_shape("c")
    doubled = ts.structure_of({"x": sds((2 * c, 3), sharding=NamedSharding(_MESH2, P("d")))})
    assert doubled.bind(c=3).tree["x"].shape == (6, 3)
    assert ts.Structure.from_json(doubled.to_json()) == doubled
    # JSON: a document whose sharding splits `b` unconstrained names the leaf
    text = doubled.to_json().replace('"2*c"', '"c"')
    with pytest.raises(ValueError) as info:
        ts.Structure.from_json(text)
    assert str(info.value).startswith(
        "treeshape.Structure.from_json: leaves[0].sharding: it does not fit the leaf at ['x'] (f32[c,3]): "
        "dimension 0 (size c) would be split 2 ways"
    )


def test_largest_fit_names_the_leaf_whose_split_would_not_divide():
    mesh = jax.make_mesh((2,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    (b,) = jax.export.symbolic_shape("b")
    step = lambda t: t * 2  # noqa: E731
    x = sds((b, 64), sharding=NamedSharding(mesh, P("d")))
    with pytest.raises(ValueError, match=r"^treeshape\.largest_fit: the sharding of args\[0\] \(f32\[b,64\]"):
        ts.largest_fit(step, x, dim="b", budget=2**16)
    fit = ts.largest_fit(step, x.update(shape=(2 * b, 64)), dim="b", budget=2**16)  # written as 2*b: it divides
    assert fit.size >= 1
    oracle = jax.jit(step).lower(sds((2 * fit.size, 64), sharding=NamedSharding(mesh, P("d")))).compile()
    assert oracle.memory_analysis().output_size_in_bytes == fit.cost.output_bytes


@pytest.mark.parametrize("name", ["self", "sizes", "b"])
def test_a_dimension_may_have_any_name(name):
    (d,) = jax.export.symbolic_shape(name)
    s = ts.out_structure(lambda x: x * 2, jax.ShapeDtypeStruct((d, 3), jnp.float32))
    assert s.bind(**{name: 5}) == ts.out_structure(lambda x: x * 2, jax.ShapeDtypeStruct((5, 3), jnp.float32))
