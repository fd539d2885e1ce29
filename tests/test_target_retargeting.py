"""`target=` where the user's own code runs: under `jax.set_mesh`, a step that names its
own mesh (`shard_map(mesh=)`, `with_sharding_constraint` or `reshard` onto a sharding of a
`jax.make_mesh` mesh of this process's CPU devices), a `jax.pmap`, a host callback. The
oracles: the same step written over the target topology's own mesh, compiled by the test
itself, and the same step spelled over its inputs' mesh (explicit input shardings)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import cost_figures, memory_figures
from jax.experimental import topologies
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec as P

import treeshape as ts


NEW_ENOUGH = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
needs_cuda_release = pytest.mark.skipif(not NEW_ENOUGH, reason="jax < 0.10: NVIDIA targets are a JaxReleaseError")
AUTO, EXPLICIT = AxisType.Auto, AxisType.Explicit


def _target_devices(target, n):
    if target.startswith("h100"):
        spec = (ts.__path__[0] + "/_cost/specs/h100.txtpb", f"1x1x{n}")
        with open(spec[0]) as f:
            return topologies.get_topology_desc(platform="cuda", target_config=f.read(), topology=spec[1]).devices
    return topologies.get_topology_desc(target, "tpu").devices


def _mesh(devices, axis_type):
    return Mesh(np.array(devices, dtype=object), ("data",), axis_types=(axis_type,))


def _step(kind, mesh):
    """A donated step (w, x) -> (w', h) that shards x's rows over `mesh` by `kind`; with
    `mesh=None`, spelled over the inputs' mesh (PartitionSpecs, shard_map without mesh=)."""

    def layer(x, w):
        return jnp.tanh(x @ w)

    def step(w, x):
        if kind == "shard_map":
            sharded = jax.shard_map(layer, in_specs=(P("data"), P()), out_specs=P("data"), **_on(mesh))
            h = sharded(x, w)
        elif kind == "with_sharding_constraint":
            h = layer(
                jax.lax.with_sharding_constraint(x, P("data") if mesh is None else NamedSharding(mesh, P("data"))), w
            )
        else:
            h = layer(jax.sharding.reshard(x, P("data") if mesh is None else NamedSharding(mesh, P("data"))), w)
        return w - 0.1 * jnp.mean(h), h

    return step


def _on(mesh):
    return {} if mesh is None else {"mesh": mesh}


W = jax.ShapeDtypeStruct((256, 256), jnp.float32)


def _x(n):
    return jax.ShapeDtypeStruct((16 * n, 256), jnp.float32)


# -- a step that names its own mesh ---------------------------------------------------------
CASES = {
    "shard_map-v5e:2x2": ("shard_map", "v5e:2x2", 4, AUTO),
    "with_sharding_constraint-v5e:2x4": ("with_sharding_constraint", "v5e:2x4", 8, AUTO),
    "reshard-v5e:2x2": ("reshard", "v5e:2x2", 4, EXPLICIT),
    "shard_map-h100": pytest.param(("shard_map", "h100", 8, AUTO), marks=needs_cuda_release),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_a_step_that_names_its_own_mesh_compiles_over_the_targets_mesh_of_its_axes(case):
    kind, target, n, axis_type = case
    ours = jax.make_mesh((n,), ("data",), axis_types=(axis_type,))  # this process's CPU devices
    theirs = _mesh(_target_devices(target, n), axis_type)
    if axis_type == AUTO:  # inputs as the user passes them; XLA places them after the step's shardings
        w, x = W, _x(n)
        oracle = jax.jit(_step(kind, theirs), donate_argnums=0).lower(w, x).compile()
    else:  # explicit axes: the inputs' types name the mesh
        w, x = (
            s.update(sharding=NamedSharding(AbstractMesh((n,), ("data",), axis_types=(EXPLICIT,)), P()))
            for s in (W, _x(n))
        )
        placed = [s.update(sharding=NamedSharding(theirs, P())) for s in (w, x)]
        oracle = jax.jit(_step(kind, theirs), donate_argnums=0).lower(*placed).compile()
    c = ts.cost(_step(kind, ours), w, x, donate_argnums=0, target=target)
    assert c.backend == f"{'H100' if target == 'h100' else 'TPU v5e'} x{n} (deviceless)"
    assert cost_figures(c) == memory_figures(oracle.memory_analysis())
    assert c.alias_bytes == 256 * 256 * 4  # the donated weights, reused
    # The same step spelled over its inputs' mesh, the inputs sharded as XLA placed them above.
    mesh = AbstractMesh((n,), ("data",), axis_types=(axis_type,))
    rows = P("data") if axis_type == AUTO else P()
    spelled = ts.cost(
        _step(kind, None),
        W.update(sharding=NamedSharding(mesh, P())),
        _x(n).update(sharding=NamedSharding(mesh, rows)),
        donate_argnums=0,
        target=target,
    )
    assert cost_figures(spelled) == cost_figures(c)


def test_under_set_mesh_the_targets_devices_stand_in_for_the_context_mesh():
    step = _step("reshard", None)  # reshard(x, P("data")): the mesh set with jax.set_mesh
    theirs = _mesh(_target_devices("v5e:2x2", 4), EXPLICIT)
    with jax.set_mesh(jax.make_mesh((4,), ("data",), axis_types=(EXPLICIT,))):
        c = ts.cost(step, W, _x(4), donate_argnums=0, target="v5e")
        fit = ts.largest_fit(
            step,
            W,
            jax.ShapeDtypeStruct((16 * jax.export.symbolic_shape("b")[0], 256), jnp.float32),
            dim="b",
            donate_argnums=0,
            target="v5e",
            budget=2**20,
        )
    with jax.set_mesh(theirs):
        oracle = jax.jit(step, donate_argnums=0).lower(W, _x(4)).compile()
    assert c.backend == "TPU v5e x4 (deviceless)"
    assert cost_figures(c) == memory_figures(oracle.memory_analysis())
    mesh = AbstractMesh((4,), ("data",), axis_types=(EXPLICIT,))
    spelled = ts.cost(
        step,
        W.update(sharding=NamedSharding(mesh, P())),
        _x(4).update(sharding=NamedSharding(mesh, P("data"))),
        donate_argnums=0,
        target="v5e",
    )
    assert cost_figures(spelled) == cost_figures(c)
    # largest_fit under the same mesh: each size compiled over the 4 chips, as ts.cost compiles it.
    assert fit.size > 1 and fit.cost.backend == "TPU v5e x4 (deviceless)"
    with jax.set_mesh(jax.make_mesh((4,), ("data",), axis_types=(EXPLICIT,))):
        assert ts.cost(step, W, _x(fit.size), donate_argnums=0, target="v5e") == fit.cost


def test_largest_fit_of_a_step_that_names_its_own_mesh_compiles_each_size_over_the_targets():
    step = _step("shard_map", jax.make_mesh((4,), ("data",), axis_types=(AUTO,)))
    (b,) = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((16 * b, 256), jnp.float32)
    fit = ts.largest_fit(step, W, x, dim="b", donate_argnums=0, target="v5e:2x2", budget=2**20)
    assert fit.size > 1 and fit.cost.backend == "TPU v5e x4 (deviceless)"
    assert ts.cost(step, W, _x(fit.size), donate_argnums=0, target="v5e:2x2") == fit.cost


# -- jax.pmap --------------------------------------------------------------------------------
PMAPS = {"v5e:2x2": ("v5e:2x2", 4), "h100": pytest.param(("h100", 8), marks=needs_cuda_release)}


@pytest.mark.parametrize("case", list(PMAPS.values()), ids=list(PMAPS))
def test_a_pmap_step_compiles_as_jax_pmap_does_over_the_targets_devices(case):
    target, n = case

    def step(x):
        return jax.lax.psum(jnp.tanh(x), "i")

    x = jax.ShapeDtypeStruct((n, 64, 256), jnp.float32)
    c = ts.cost(jax.pmap(step, axis_name="i"), x, target=target)
    oracle = jax.pmap(step, axis_name="i", devices=_target_devices(target, n)).lower(x).compile()
    assert c.backend.endswith(f" x{n} (deviceless)")
    assert cost_figures(c) == memory_figures(oracle.memory_analysis()) and c.output_bytes == 64 * 256 * 4


def _pmapped_step(w, x):
    h = jnp.tanh(x @ w)
    return w - 0.1 * jax.lax.pmean(x.T @ h, "i"), h


@pytest.mark.parametrize("target", ["v5e", "v5e:4x4"])
def test_a_pmap_over_more_devices_than_this_process_has_compiles_over_the_targets(target, tmp_path):
    """16 devices where this process has 8 (conftest): the pmap maps over the target's, as
    `jax.pmap(f, devices=...)` does, its settings (in_axes, donation) kept, and its ops,
    phases and kernels are named by the user's program (`pmap(step)/...`), as without a target."""
    assert len(jax.devices()) < 16
    settings = {"axis_name": "i", "in_axes": (None, 0), "donate_argnums": 1}
    w, x = jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((16, 32, 256), jnp.float32)
    c = ts.cost(jax.pmap(_pmapped_step, **settings), w, x, target=target)
    devices = topologies.get_topology_desc("v5e:4x4", "tpu").devices
    oracle = jax.pmap(_pmapped_step, devices=devices, **settings).lower(w, x).compile(_dumped_to(tmp_path))
    assert c.backend == "TPU v5e x16 (deviceless)" and cost_figures(c) == memory_figures(oracle.memory_analysis())
    assert c.time is not None
    assert all(k.op.startswith("pmap(_pmapped_step)/") for k in c.time.kernels if k.op is not None)
    if not list(tmp_path.glob("*.after_optimizations-live-range.txt")):  # libtpu 0.0.24 (jax 0.8.0)
        assert c.buffers is None and c.donation is None and c.timeline is None  # never made up
        return
    assert c.donation["args[1]"].reused
    ops = [op for op in c.timeline.ops if op is not None]
    assert ops and all(op.startswith("pmap(_pmapped_step)/") for op in ops)
    phases = {p.name for p in c.timeline.phases(1)}
    assert {"dot_general", "psum"} <= phases and phases == {name for name, _ in c.time.phases(1)} - {
        "between steps",
        "waiting on the host",
    }
    with pytest.raises(ValueError, match=r"the jax\.pmap's mapped axis is sharded over 3 devices, and no v5e topolo"):
        ts.cost(jax.pmap(_pmapped_step, **settings), w, x.update(shape=(3, 32, 256)), target="v5e")


def _dumped_to(directory):
    return {"xla_dump_to": str(directory), "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True}


def test_a_pmap_s_ops_and_phases_are_named_as_without_a_target():
    """Where this process has the devices too, the same names as its own compile gives."""
    x = jax.ShapeDtypeStruct((4, 64, 256), jnp.float32)

    def summed(x):
        return jax.lax.psum(jnp.tanh(x), "i")

    here, there = (
        ts.cost(jax.pmap(summed, axis_name="i"), x),
        ts.cost(jax.pmap(summed, axis_name="i"), x, target="v5e:2x2"),
    )
    assert {k.op for k in there.time.kernels} - {None} <= {"pmap(summed)/tanh", "pmap(summed)/psum"}
    if there.timeline is None:  # libtpu 0.0.24 (jax 0.8.0) writes no live ranges: no buffers made up
        assert there.buffers is None and there.donation is None
        return
    assert (
        set(there.timeline.ops) - {None}
        == set(here.timeline.ops) - {None}
        == {"pmap(summed)/tanh", "pmap(summed)/psum"}
    )
    assert {p.name for p in there.timeline.phases(1)} == {p.name for p in here.timeline.phases(1)}


# -- host callbacks --------------------------------------------------------------------------
def _printing(x):
    jax.debug.print("mean {}", jnp.mean(x))
    return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(x.shape, x.dtype), x) @ x.T


def test_a_host_callback_compiles_for_a_tpu_target_as_it_is():
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    c = ts.cost(_printing, x, target="v5e")
    device = jax.sharding.SingleDeviceSharding(_target_devices("v5e:2x2", 4)[0])
    oracle = jax.jit(_printing).lower(x.update(sharding=device)).compile()
    assert c.backend == "TPU v5e x1 (deviceless)" and cost_figures(c) == memory_figures(oracle.memory_analysis())
    # ... also inside a step that names its own mesh
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AUTO,))
    sharded = ts.cost(
        lambda x: jax.shard_map(_printing, mesh=mesh, in_specs=P("data"), out_specs=P("data"))(x), x, target="v5e"
    )
    assert sharded.backend == "TPU v5e x4 (deviceless)" and sharded.argument_bytes == 128 * 256 * 4 // 4


@needs_cuda_release
def test_a_host_callback_for_an_nvidia_target_is_refused_naming_it(compiles):
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    with pytest.raises(ValueError, match=r"'h100': the step holds a host callback \(jax\.debug\.print, jax\.pure_cal"):
        ts.cost(_printing, x, target="h100")
    with pytest.raises(ValueError, match='a TPU target, e.g. target="v5e", compiles it'):
        ts.largest_fit(_printing, x.update(shape=(jax.export.symbolic_shape("b")[0], 256)), dim="b", target="h100")
    assert compiles == []


# -- what cannot move ------------------------------------------------------------------------
def test_a_step_over_other_devices_than_its_inputs_is_a_value_error_naming_both(compiles):
    cpus = jax.devices()
    inputs = Mesh(np.array(cpus[4:8]), ("data",), axis_types=(AUTO,))
    step = _step("shard_map", Mesh(np.array(cpus[:4]), ("data",), axis_types=(AUTO,)))
    x = _x(4).update(sharding=NamedSharding(inputs, P("data")))
    with pytest.raises(
        ValueError,
        match=r"an input's mesh is over devices \[4, 5, 6, 7\] and the mesh of the step's "
        r"shard_map over \[0, 1, 2, 3\].*jax\.shard_map without mesh=",
    ):
        ts.cost(step, W.update(sharding=NamedSharding(inputs, P())), x, target="v5e")
    assert compiles == []


def test_a_step_whose_own_mesh_no_target_topology_has_names_that_mesh(compiles):
    step = _step("shard_map", jax.make_mesh((6,), ("data",), axis_types=(AUTO,)))
    with pytest.raises(ValueError, match=r"the mesh of the step's shard_map is sharded over 6 devices, and no v5e "):
        ts.cost(step, W, _x(6), target="v5e")
    with pytest.raises(
        ValueError, match=r"'v5e:2x2' has 4 chips, and the mesh of the step's shard_map is sharded over 6"
    ):
        ts.cost(step, W, _x(6), target="v5e:2x2")
    assert compiles == []
