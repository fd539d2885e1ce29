"""Shardings on one host (8 CPU devices from conftest.py): placing values on abstract
meshes, `with_shardings`, `nbytes_per_device` and its table column, carries that join
explicit-axes shardings, and specs kept and printed consistently. The same features
across processes: tests/test_multiprocess.py."""

import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape import _cache
from treeshape._table import html_table


def _mesh(devices=None, kind=AxisType.Explicit):
    devices = jax.devices() if devices is None else devices
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind), devices=devices)


def _put(x, mesh, *spec):
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _params(mesh):
    return {
        "w": _put(jnp.ones((16, 8), jnp.float32), mesh, None, "data"),
        "b": _put(jnp.ones(8, jnp.float32), mesh),
    }


def _shardings(tree):
    return {path: x.sharding for path, x in zip(ts.structure_of(tree).paths, jax.tree.leaves(tree), strict=True)}


# -- 2. no silently dropped sharding ----------------------------------------------------
def test_optimizer_state_lands_on_the_arguments_mesh():
    mesh = _mesh()
    params = _params(mesh)
    s = ts.out_structure(optax.adam(1e-3).init, params)
    assert "P(None, 'data')" in str(s)
    assert s.leaves[2].sharding.mesh == mesh.abstract_mesh  # mu['w'], over the abstract mesh
    for build in (s.zeros, s.ones, lambda: s.full(3)):
        state = build()
        assert state[0].mu["w"].sharding == NamedSharding(mesh, P(None, "data"))
        assert state[0].nu["b"].sharding.mesh == mesh  # replicated over the mesh, not one device
        assert ts.structure_of(state) == s


def test_one_cached_structure_serves_two_concrete_meshes():
    devices = jax.devices()
    mesh_a, mesh_b = _mesh(devices), _mesh(devices[::-1])
    assert mesh_a != mesh_b and mesh_a.abstract_mesh == mesh_b.abstract_mesh

    def f(p):
        return jax.tree.map(lambda x: 2 * x, p)

    s_a = ts.out_structure(f, _params(mesh_a))
    s_b = ts.out_structure(f, _params(mesh_b))
    assert ts.cache_info().hits == 1 and ts.cache_info().misses == 1  # one entry answers both calls
    assert s_a.zeros()["w"].sharding == NamedSharding(mesh_a, P(None, "data"))
    assert s_b.zeros()["w"].sharding == NamedSharding(mesh_b, P(None, "data"))
    assert s_a == s_b and hash(s_a) == hash(s_b) and s_a.leaves == s_b.leaves
    # The meshes travel with each returned copy, never in the cache entry itself.
    (entry,) = [value[0] for value in _cache.CACHE._entries.values()]
    assert entry._meshes is None and entry is not s_a and entry is not s_b
    # The mesh set with `jax.set_mesh` comes first.
    with jax.set_mesh(mesh_b):
        assert s_a.zeros()["w"].sharding == NamedSharding(mesh_b, P(None, "data"))


def test_the_mesh_set_at_call_time_counts_too():
    mesh = _mesh()
    with jax.set_mesh(mesh):
        s = ts.out_structure(lambda: jnp.zeros((8, 4), out_sharding=P("data")))
    assert s.leaves[0].sharding.mesh == mesh.abstract_mesh
    assert s.zeros().sharding == NamedSharding(mesh, P("data", None))


@pytest.mark.parametrize("build", ["zeros", "ones", "full"])
def test_an_unresolvable_abstract_mesh_is_an_error(build):
    s = ts.out_structure(optax.adam(1e-3).init, _params(_mesh()))
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == hash(s) and copy._meshes is None  # pickling drops the meshes
    with pytest.raises(ValueError) as info:
        copy.full(1) if build == "full" else getattr(copy, build)()
    message = str(info.value)
    assert message.startswith(f"treeshape.Structure.{build}: 4 leaves are sharded over an abstract mesh")
    assert "'data': 2, 'model': 4" in message
    assert "tree[0].mu['b'] (f32[8] P())" in message and "tree[0].mu['w']" in message
    assert "jax.set_mesh" in message and "with_shardings" in message and "and 1 more" in message
    assert "Traceback" not in message


def test_unresolvable_fixes_work():
    mesh = _mesh()
    copy = pickle.loads(pickle.dumps(ts.structure_of(_params(mesh))))
    assert copy.leaves[1].sharding.mesh == mesh.abstract_mesh
    with pytest.raises(ValueError, match=re.escape("tree['w'] (f32[16,8] P(None, 'data')) is sharded")):
        copy.with_shardings({"w": copy.leaves[1].sharding, "b": None}).zeros()
    with jax.set_mesh(mesh):
        assert _shardings(copy.zeros()) == {
            "['b']": NamedSharding(mesh, P()),
            "['w']": NamedSharding(mesh, P(None, "data")),
        }
    other = _mesh(kind=AxisType.Auto)  # another abstract mesh set: no match
    with jax.set_mesh(other), pytest.raises(ValueError, match="abstract mesh"):
        copy.zeros()
    placed = copy.with_shardings(lambda path, leaf: NamedSharding(mesh, P()))
    assert all(x.sharding == NamedSharding(mesh, P()) for x in jax.tree.leaves(placed.zeros()))
    default = copy.with_shardings(None).zeros()
    assert not default["w"].committed


def test_abstract_shardings_under_a_trace_need_no_mesh():
    copy = pickle.loads(pickle.dumps(ts.structure_of(_params(_mesh(kind=AxisType.Auto)))))
    out = jax.jit(lambda: copy.zeros())()  # compile-time constants: nothing to place
    assert ts.structure_of(out) == copy


# -- 3. with_shardings -----------------------------------------------------------------------
def _model():
    return {
        "layers": [{"w": jnp.zeros((16, 8), jnp.float32), "b": jnp.zeros(8, jnp.float32)} for _ in range(2)],
        "step": jnp.zeros((), jnp.int32),
        "act": "relu",
    }


def test_with_shardings_one_sharding_none_and_a_callable():
    mesh = _mesh()
    s = ts.structure_of(_model())
    replicated = NamedSharding(mesh, P())
    every = s.with_shardings(replicated)
    assert every == s and every.leaves[0] == "relu"
    assert all(leaf.sharding is replicated for leaf in every.leaves[1:])
    assert all(leaf.sharding is None for leaf in every.with_shardings(None).leaves[1:])
    seen = []

    def fsdp(path, leaf):  # shard every matrix over 'data', replicate the rest
        seen.append(path)
        return NamedSharding(mesh, P("data")) if len(leaf.shape) == 2 else replicated

    placed = s.with_shardings(fsdp)
    assert seen == [p for p, leaf in zip(s.paths, s.leaves, strict=True) if leaf != "relu"]
    assert "['layers'][0]['w']" in seen
    z = placed.zeros()
    assert z["layers"][1]["w"].sharding == NamedSharding(mesh, P("data"))
    assert z["layers"][1]["b"].sharding == replicated and z["step"].sharding == replicated
    assert z["act"] == "relu" and ts.structure_of(z) == s


def test_with_shardings_pytree_prefix():
    mesh = _mesh()
    s = ts.structure_of(_model())
    rows, cols = NamedSharding(mesh, P("data")), NamedSharding(mesh, P(None, "model"))
    placed = s.with_shardings({"layers": [{"w": cols, "b": None}, rows], "step": None, "act": None})
    by_path = dict(zip(placed.paths, placed.leaves, strict=True))
    assert by_path["['layers'][0]['w']"].sharding is cols and by_path["['layers'][0]['b']"].sharding is None
    assert by_path["['layers'][1]['w']"].sharding is rows and by_path["['layers'][1]['b']"].sharding is rows
    assert by_path["['step']"].sharding is None
    z = placed.zeros()
    assert z["layers"][0]["w"].sharding == cols and z["layers"][1]["b"].sharding == rows


def test_with_shardings_keeps_the_meshes_of_the_call():
    mesh = _mesh()
    s = ts.out_structure(lambda p: p, _params(mesh))
    assert s.with_shardings(lambda path, leaf: leaf.sharding).zeros()["w"].sharding.mesh == mesh


def test_with_shardings_prefix_mismatch_names_the_path():
    mesh = _mesh()
    s = ts.structure_of(_model())
    sh = NamedSharding(mesh, P())
    with pytest.raises(ValueError) as info:
        s.with_shardings({"layers": [sh], "step": sh, "act": None})
    message = str(info.value)
    assert message.startswith("treeshape.Structure.with_shardings: `shardings` is not a prefix")
    assert "at tree['layers'] it has a list with 1 children, where the tree has a list with 2 children" in message
    with pytest.raises(ValueError, match=re.escape("at the top it has a dict with keys ['layers']")):
        s.with_shardings({"layers": sh})
    with pytest.raises(ValueError, match=re.escape("at tree['step'] it has a tuple")):
        s.with_shardings({"layers": sh, "step": (sh,), "act": None})


def test_with_shardings_rejects_values_that_are_not_shardings():
    s = ts.structure_of(_model())
    with pytest.raises(TypeError) as info:
        s.with_shardings({"layers": P("data"), "step": 3, "act": None})
    message = str(info.value)
    assert "2 values are not shardings" in message
    assert "shardings['layers'] is a PartitionSpec P('data',)" in message and "shardings['step'] is int 3" in message
    assert "NamedSharding(mesh, spec)" in message
    with pytest.raises(TypeError, match=re.escape("`shardings(\"['step']\", leaf)` is str 'x'")):
        s.with_shardings(lambda path, leaf: "x" if path == "['step']" else None)


def test_with_shardings_that_do_not_fit_name_every_leaf():
    mesh = _mesh()
    s = ts.structure_of({"odd": jnp.zeros((3, 8), jnp.float32), "n": jnp.zeros((), jnp.int32), "ok": jnp.zeros(4)})
    with pytest.raises(ValueError) as info:
        s.with_shardings(NamedSharding(mesh, P("data")))
    message = str(info.value)
    assert message.startswith("treeshape.Structure.with_shardings: 2 shardings do not fit their leaves")
    assert "tree['n'] (i32[]): its spec P('data',) has 1 entry, but the leaf is a scalar" in message
    assert "tree['odd'] (f32[3,8]): dimension 0 (size 3) would be split 2 ways over mesh axes ('data',)" in message
    assert "tree['ok']" not in message
    with pytest.raises(ValueError, match=re.escape("has 3 entries, but the leaf is of rank 2")):
        s.with_shardings({"odd": NamedSharding(mesh, P(None, None, "model")), "n": None, "ok": None})
    with pytest.raises(ValueError, match=re.escape("split 8 ways over mesh axes ('data', 'model')")):
        s.with_shardings({"odd": NamedSharding(mesh, P(("data", "model"))), "n": None, "ok": None})
    fits = s.with_shardings({"odd": NamedSharding(mesh, P(None, ("data", "model"))), "n": None, "ok": None})
    assert fits.zeros()["odd"].sharding.shard_shape((3, 8)) == (3, 1)


def test_with_shardings_and_nbytes_per_device_in_every_context(in_context):
    mesh = _mesh(kind=AxisType.Auto)

    def body(x):
        s = ts.structure_of({"x": x, "m": jnp.zeros((8, 4), jnp.float32)})
        split = s.with_shardings(lambda path, leaf: NamedSharding(mesh, P("model")) if leaf.shape == (8, 4) else None)
        assert split == s and split.nbytes_per_device == s.nbytes - 8 * 4 * 4 + 2 * 4 * 4
        assert ts.structure_of(split.zeros()) == s  # at top level placed; under a trace Auto axes are not types
        return x

    in_context(body, jnp.ones(3, jnp.float32))


# -- 4. nbytes_per_device and the table ---------------------------------------------------------
def test_nbytes_per_device():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    key = jax.random.key(0).dtype
    s = ts.structure_of(
        {
            "w": jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P(("data", "model")))),
            "e": jax.ShapeDtypeStruct((10, 4), jnp.bfloat16, sharding=NamedSharding(mesh, P("model"))),  # uneven
            "r": jax.ShapeDtypeStruct((5,), jnp.float32, sharding=NamedSharding(mesh, P())),
            "k": jax.ShapeDtypeStruct((8,), key, sharding=NamedSharding(mesh, P("model"))),
            "plain": jnp.zeros(3, jnp.int8),
            "name": "static",
        }
    )
    # w: 2 of 16 rows; e: ceil(10 / 4) = 3 rows; r: replicated, whole; k: 2 keys of 8 B; plain: whole.
    assert s.nbytes_per_device == 2 * 8 * 4 + 3 * 4 * 2 + 5 * 4 + 2 * 8 + 3
    assert s.nbytes == 16 * 8 * 4 + 10 * 4 * 2 + 5 * 4 + 8 * 8 + 3
    unsharded = ts.structure_of({"a": jnp.zeros((4, 4)), "n": 1})
    assert unsharded.nbytes_per_device == unsharded.nbytes
    assert ts.structure_of(jax.device_put(jnp.zeros(8, jnp.float32), jax.devices()[3])).nbytes_per_device == 32


def test_table_shows_per_device_bytes_when_a_leaf_is_split():
    mesh = _mesh()
    s = ts.out_structure(optax.adam(1e-3).init, _params(mesh))
    assert str(s) == ts.describe(s)
    assert str(s) == (
        "path         shape   dtype  extra              bytes  per device\n"
        "-----------  ------  -----  ---------------  -------  ----------\n"
        "[0].count    []      i32                         4 B         4 B\n"
        "[0].mu['b']  [8]     f32    replicated          32 B        32 B\n"
        "[0].mu['w']  [16,8]  f32    P(None, 'data')    512 B       256 B\n"
        "[0].nu['b']  [8]     f32    replicated          32 B        32 B\n"
        "[0].nu['w']  [16,8]  f32    P(None, 'data')    512 B       256 B\n"
        "-----------  ------  -----  ---------------  -------  ----------\n"
        "total: 5 leaves, 273 elements                1.1 KiB       580 B"
    )
    html = html_table(s)
    assert '<th style="text-align: right">per device</th>' in html
    assert '<th style="text-align: right">1.1 KiB</th><th style="text-align: right">580 B</th>' in html
    assert '<td style="text-align: left">replicated</td>' in html and 'colspan="4"' in html


def test_table_without_a_split_leaf_has_no_per_device_column():
    mesh = _mesh()
    replicated_only = {"b": _put(jnp.ones(8, jnp.float32), mesh), "n": jnp.zeros(2, jnp.float32)}
    assert ts.describe(replicated_only) == (
        "path   shape  dtype  bytes\n"
        "-----  -----  -----  -----\n"
        "['b']  [8]    f32     32 B\n"
        "['n']  [2]    f32      8 B\n"
        "-----  -----  -----  -----\n"
        "total: 2 leaves, 10 elements  40 B"
    )


def test_table_cut_keeps_both_totals():
    mesh = AbstractMesh((4,), ("fsdp",))
    tree = [jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))] * 6
    assert ts.describe(tree, max_rows=2) == (
        "path  shape        dtype  extra               bytes  per device\n"
        "----  -----------  -----  ---------------  --------  ----------\n"
        "[0]   [1024,1024]  bf16   P('fsdp', None)   2.0 MiB   512.0 KiB\n"
        "... 4 more leaves\n"
        "[5]   [1024,1024]  bf16   P('fsdp', None)   2.0 MiB   512.0 KiB\n"
        "----  -----------  -----  ---------------  --------  ----------\n"
        "total: 6 leaves, 6,291,456 elements        12.0 MiB     3.0 MiB"
    )


# -- 5. carries join explicit-axes shardings ---------------------------------------------------
def test_scan_carry_takes_the_bodys_sharding():
    mesh = _mesh()
    init = _put(jnp.zeros((8, 3), jnp.float32), mesh)  # replicated
    xs = jnp.ones((4, 8, 3), jnp.float32)
    rows = NamedSharding(mesh, P("data"))

    def body(c, x):
        return jax.sharding.reshard(c + x, rows), None

    with pytest.raises(TypeError, match=re.escape("float32[8@data,3]")):
        lax.scan(body, init, xs)  # what treeshape fixes
    s = ts.carry_structure(body, init, xs)
    assert s.leaves[0].sharding.spec == P("data", None) and s.leaves[0].sharding.mesh == mesh.abstract_mesh
    carry = ts.scan_carry(body, init, xs)
    assert carry.sharding == NamedSharding(mesh, P("data", None))
    out, _ = lax.scan(body, carry, xs)
    np.testing.assert_array_equal(out, np.full((8, 3), 4.0))

    @jax.jit
    def run(init, xs):
        carry = ts.scan_carry(body, init, xs)
        return lax.scan(body, carry, xs)[0]

    assert run(init, xs).sharding == NamedSharding(mesh, P("data", None))


def test_while_and_fori_carries_take_the_bodys_sharding():
    mesh = _mesh()
    init = (_put(jnp.zeros((8, 4), jnp.float32), mesh), 0)
    with jax.set_mesh(mesh):

        def step(c):
            return jax.sharding.reshard(c[0] + 1, P(None, "model")), c[1] + 1

        carry = ts.while_carry(step, init)
        assert carry[0].sharding == NamedSharding(mesh, P(None, "model"))
        out = lax.while_loop(lambda c: c[1] < 3, step, carry)
        np.testing.assert_array_equal(out[0], np.full((8, 4), 3.0))
        carry = ts.fori_carry(lambda i, c: step(c), init)
        assert lax.fori_loop(0, 2, lambda i, c: step(c), carry)[0].sharding.spec == P(None, "model")


def test_a_sharding_that_never_settles_is_a_carry_mismatch():
    mesh = _mesh()
    init = {"x": _put(jnp.zeros((8, 8), jnp.float32), mesh)}

    def flip(c, _):
        spec = jax.typeof(c["x"]).sharding.spec
        new = P(None, "data") if spec[0] == "data" else P("data", None)
        return {"x": jax.sharding.reshard(c["x"], NamedSharding(mesh, new))}, None

    with pytest.raises(ts.CarryMismatchError) as info:
        ts.scan_carry(flip, init, length=2)
    err = info.value
    assert isinstance(err, TypeError)
    [m] = err.mismatches
    assert (m.path, m.kind, m.expected, m.actual) == ("['x']", "sharding", P(None, "data"), P("data", None))
    assert str(m) == "carry['x']: expected sharding P(None, 'data'), got P('data', None)."
    message = str(err)
    assert "carry['x']: input f32[8,8] sharded P(None, 'data'), output sharded P('data', None)" in message
    assert "P(None, None) -> P('data', None) -> P(None, 'data') -> P('data', None)" in message
    assert "jax.sharding.reshard(x, P(...))" in message


def test_auto_axes_are_not_part_of_the_carry_type():
    mesh = _mesh(kind=AxisType.Auto)
    init = _put(jnp.zeros((8, 3), jnp.float32), mesh)

    def body(c, x):
        return lax.with_sharding_constraint(c + x, NamedSharding(mesh, P("data"))), None

    carry = ts.scan_carry(body, init, jnp.ones((2, 8, 3), jnp.float32))
    assert carry is init


def test_an_unplaced_init_that_must_be_resharded_names_the_fix():
    mesh = _mesh()

    def body(c, x):
        return {"acc": jax.sharding.reshard(c["acc"] + x, NamedSharding(mesh, P("data")))}, None

    with pytest.raises(ValueError) as info:
        ts.scan_carry(body, {"acc": jnp.zeros((8, 3), jnp.float32)}, jnp.ones((2, 8, 3), jnp.float32))
    message = str(info.value)
    assert message.startswith("treeshape.scan_carry: carry['acc'] must be resharded to P('data', None)")
    assert "jax.set_mesh" in message
    with jax.set_mesh(mesh):
        carry = ts.scan_carry(body, {"acc": jnp.zeros((8, 3), jnp.float32)}, jnp.ones((2, 8, 3), jnp.float32))
    assert carry["acc"].sharding == NamedSharding(mesh, P("data", None))


# -- 6. consistent specs ------------------------------------------------------------------------
@pytest.mark.parametrize("abstract", [False, True], ids=["mesh", "abstract_mesh"])
@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit], ids=["auto", "explicit"])
def test_structure_of_keeps_the_spec_given(kind, abstract):
    mesh = _mesh(kind=kind)
    mesh = mesh.abstract_mesh if abstract else mesh
    sharding = NamedSharding(mesh, P("data"))
    s = ts.structure_of({"x": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=sharding)})
    assert s.leaves[0].sharding == sharding and s.leaves[0].sharding.spec == P("data")
    assert "P('data', None)" in str(s)


def test_equal_specs_print_alike():
    mesh = AbstractMesh((2, 4), ("data", "model"))

    def leaf(*spec):
        return jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=NamedSharding(mesh, P(*spec)))

    text = ts.describe(
        {"a": leaf("data"), "b": leaf("data", None), "c": leaf(("data",), None), "d": leaf(None, "model")}
    )
    rows = [line.split()[3:5] for line in text.splitlines()[2:6]]
    assert rows == [["P('data',", "None)"]] * 3 + [["P(None,", "'model')"]]


# -- abstract meshes that know no device kind (from JSON, or planned by hand) ----------
@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("source", ["json", "abstract_mesh"])
def test_a_structure_over_a_device_free_abstract_mesh_is_placed_on_the_set_mesh(kind, source):
    mesh = _mesh(kind=kind)
    if source == "json":
        s = ts.Structure.from_json(ts.structure_of(_params(mesh)).to_json())
    else:
        planned = AbstractMesh((2, 4), ("data", "model"), axis_types=(kind, kind))
        s = ts.structure_of(
            {
                "b": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(planned, P())),
                "w": jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(planned, P(None, "data"))),
            }
        )
    assert s.leaves[1].sharding.mesh.abstract_device is None  # no device kind: never equal to a concrete one's
    with jax.set_mesh(mesh):
        top = s.zeros()
        jitted = jax.jit(s.ones)()
    for tree, fill in [(top, 0.0), (jitted, 1.0)]:
        assert tree["w"].sharding.mesh is mesh or tree["w"].sharding.mesh == mesh
        assert np.array_equal(np.asarray(tree["w"]), np.full((16, 8), fill, np.float32))
    assert top["w"].sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data")), 2)
    assert top["b"].sharding.is_equivalent_to(NamedSharding(mesh, P()), 1)
    if kind == AxisType.Explicit:  # the sharding is part of the traced type too
        assert jitted["w"].sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data")), 2)
    assert s.matches(top)


@pytest.mark.parametrize("kind", [AxisType.Auto, AxisType.Explicit])
def test_a_device_free_abstract_mesh_with_other_axes_is_still_refused(kind):
    s = ts.Structure.from_json(ts.structure_of(_params(_mesh(kind=kind))).to_json())
    other = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind))  # same names, other sizes
    with jax.set_mesh(other), pytest.raises(ValueError, match=r"tree\['w'\].*jax.set_mesh"):
        s.zeros()
    flipped = AxisType.Auto if kind == AxisType.Explicit else AxisType.Explicit  # same sizes, other types
    with jax.set_mesh(_mesh(kind=flipped)), pytest.raises(ValueError, match=r"tree\['w'\]") as info:
        s.zeros()
    assert f"('data': 2, 'model': 4; {flipped.name}) has these axes of other axis types" in str(info.value)
    assert "no concrete mesh" not in str(info.value) and "none is set" not in str(info.value)
