"""Memory beyond the chip (section 32): a `Cost`'s bytes in the host's memory kinds, to the
byte libtpu's own for a step that offloads (the oracle is the same step compiled by the test
over the devices of `jax.experimental.topologies`), 0 on the CPU; the host line of
`str(cost)`; and `largest_fit(..., host_budget=)`."""

import json

import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import topologies

import treeshape as ts


HOST_LINE = "host memory (pinned_host, unpinned_host):"
OFFLOAD = jax.checkpoint_policies.save_and_offload_only_these_names(
    names_which_can_be_saved=[],
    names_which_can_be_offloaded=["h"],
    offload_src="device",
    offload_dst="pinned_host",
)


def _to_host(x):
    return jax.device_put(x, jax.memory.Space.Host)


def offloading_step(w, x):
    """Two layers whose activations the policy offloads to pinned host memory (host
    temporaries), and one activation the step itself puts on the host (a host output)."""

    def loss(w):
        layer = jax.checkpoint(lambda x: jnp.tanh(checkpoint_name(jnp.sin(x @ w), "h")) @ w, policy=OFFLOAD)
        return jnp.sum(layer(layer(x)))

    return jax.grad(loss)(w), _to_host(jnp.tanh(x @ w))


def _host_figures(memory):
    return (
        memory.host_argument_size_in_bytes,
        memory.host_output_size_in_bytes,
        memory.host_temp_size_in_bytes,
        memory.host_alias_size_in_bytes,
    )


def _cost_host(c):
    return (c.host_argument_bytes, c.host_output_bytes, c.host_temp_bytes, c.host_alias_bytes)


def _v5e_oracle(fn, *args):
    device = topologies.get_topology_desc("v5e:2x2", "tpu").devices[0]

    def placed(s):  # on the chip, in the memory kind it names
        kind = getattr(s.sharding, "memory_kind", None)
        return s.update(sharding=jax.sharding.SingleDeviceSharding(device, memory_kind=kind))

    return jax.jit(fn).lower(*map(placed, args)).compile().memory_analysis()


W = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
X = jax.ShapeDtypeStruct((512, 1024), jnp.float32)


def test_a_v5e_step_that_offloads_has_libtpus_own_host_figures():
    c = ts.cost(offloading_step, W, X, target="v5e")
    oracle = _v5e_oracle(offloading_step, W, X)
    assert _cost_host(c) == _host_figures(oracle)
    assert c.host_output_bytes == 512 * 1024 * 4  # the activation put on the host
    # the layers' offloaded residuals: both at once (jax 0.10.2's libtpu), or one at a time (0.8.0's)
    assert c.host_temp_bytes in (2 * 512 * 1024 * 4, 512 * 1024 * 4)
    assert (c.argument_bytes, c.temp_bytes) == (oracle.argument_size_in_bytes, oracle.temp_size_in_bytes)
    line = next(line for line in str(c).splitlines() if line.startswith(HOST_LINE))
    temporaries = f"{c.host_temp_bytes // 2**20}.0 MiB"
    assert line == f"{HOST_LINE} arguments 0 B, outputs 2.0 MiB, temporaries {temporaries}, aliased 0 B"
    assert HOST_LINE in c._repr_html_()


def test_without_a_target_the_host_figures_are_0_and_not_shown():
    c = ts.cost(lambda w, x: jnp.tanh(x @ w), W, X)
    assert _cost_host(c) == (0, 0, 0, 0)
    assert HOST_LINE not in str(c)
    # on a target, a step that offloads nothing has none either
    on_v5e = ts.cost(lambda w, x: jnp.tanh(x @ w), W, X, target="v5e")
    assert _cost_host(on_v5e) == (0, 0, 0, 0) and HOST_LINE not in str(on_v5e)


def test_a_cost_made_by_hand_has_no_host_bytes_unless_given():
    c = ts.Cost(
        flops=0.0,
        bytes_accessed=0,
        argument_bytes=8,
        output_bytes=8,
        temp_bytes=0,
        alias_bytes=0,
        peak_bytes=16,
        device_bytes=None,
    )
    assert _cost_host(c) == (0, 0, 0, 0) and HOST_LINE not in str(c)
    host = ts.Cost(**{**c.__dict__, "host_temp_bytes": 3 * 2**20})
    assert f"{HOST_LINE} arguments 0 B, outputs 0 B, temporaries 3.0 MiB, aliased 0 B" in str(host)


def _host_output_step(x):
    """Its host output grows with the batch (4 KiB a row), its device peak too, less."""
    return _to_host(jnp.tanh(x))


def test_largest_fit_judges_the_host_budget_where_given():
    (b,) = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((b, 1024), jnp.float32)
    host_budget = 100 * 4096 + 100
    fit = ts.largest_fit(_host_output_step, x, dim="b", target="v5e", host_budget=host_budget, max_size=4096)

    def host_output(n):  # libtpu's own, for the step at b=n (it pads the rows it puts on the host)
        return _host_figures(_v5e_oracle(_host_output_step, jax.ShapeDtypeStruct((n, 1024), jnp.float32)))[1]

    assert host_output(fit.size) <= host_budget < host_output(fit.size + 1)
    assert fit.cost.host_output_bytes == host_output(fit.size) and 90 <= fit.size <= 100 and not fit.capped
    after = ts.cost(_host_output_step, jax.ShapeDtypeStruct((fit.size + 1, 1024), jnp.float32), target="v5e")
    assert after.compiler_peak_bytes <= fit.budget  # the host's bytes bind, not the device's
    unbounded = ts.largest_fit(_host_output_step, x, dim="b", target="v5e", max_size=4096)
    assert unbounded.size == 4096 and unbounded.capped


def test_largest_fit_says_when_even_size_1_is_over_the_host_budget():
    (b,) = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((b, 1024), jnp.float32)
    with pytest.raises(ts.BudgetError, match=r"even b=1 does not fit the host's memory: 4.0 KiB \(4,096 B\)") as info:
        ts.largest_fit(_host_output_step, x, dim="b", target="v5e", host_budget=4000)
    assert (info.value.peak, info.value.limit) == (4096, 4000)


@pytest.mark.parametrize(
    ("host_budget", "error", "said"),
    [
        (0, ValueError, r"host_budget must be a number of bytes >= 1 \(e.g. host_budget=64 \* 2\*\*30"),
        (float("inf"), ValueError, "host_budget must be a number of bytes >= 1"),
        ("1GiB", TypeError, r"host_budget must be a number, got str '1GiB'"),
    ],
)
def test_largest_fit_refuses_a_host_budget_that_is_not_bytes(host_budget, error, said):
    (b,) = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((b, 4), jnp.float32)
    with pytest.raises(error, match=said):
        ts.largest_fit(jnp.tanh, x, dim="b", budget=2**20, host_budget=host_budget)


# The libtpu of jax 0.8.0 writes no live ranges, so a TPU target's buffers are unknown there (None).
TPU_BUFFERS = jax.__version_info__ >= (0, 9)


def test_the_buffers_at_the_peak_say_which_memory_holds_them():
    c = ts.cost(offloading_step, W, X, target="v5e")
    if not TPU_BUFFERS:
        assert c.buffers is None
        return
    device = [b for b in c.buffers if b.memory_kind == "device"]
    host = [b for b in c.buffers if b.memory_kind != "device"]
    assert c.buffers[: len(device)] == tuple(device)  # the device's first, then the host's
    assert sum(b.nbytes for b in device) == c.live_peak_bytes
    # the offloaded activations, live on the host at the device's peak: within the host's temporaries
    assert host and {(b.kind, b.memory_kind, b.shape) for b in host} == {("temporary", "pinned_host", (512, 1024))}
    assert sum(b.nbytes for b in host) <= c.host_temp_bytes
    n = len(host)
    assert f"\nand {n} in the host's memory (pinned_host): {n * 2}.0 MiB" in str(c)
    assert c.breakdown(depth=0).splitlines()[-1].split()[:2] == ["total", str(len(device))]  # the device's
    on_cpu = ts.cost(offloading_step, W, X)
    assert {b.memory_kind for b in on_cpu.buffers} == {"device"}


def _pinned(shape, mesh=None, spec=None):
    if mesh is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    else:
        sharding = jax.sharding.NamedSharding(mesh, spec, memory_kind="pinned_host")
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)


def _from_host(w, x):
    return jnp.tanh(x @ jax.device_put(w, jax.memory.Space.Device))


def test_an_argument_placed_in_pinned_host_stays_there_on_the_target():
    w = _pinned((1024, 1024))
    c = ts.cost(_from_host, w, X, target="v5e")
    oracle = _v5e_oracle(_from_host, w, X)
    assert _cost_host(c) == _host_figures(oracle) and c.host_argument_bytes == 1024 * 1024 * 4
    assert c.argument_bytes == oracle.argument_size_in_bytes == 512 * 1024 * 4  # x alone on the device
    if not TPU_BUFFERS:
        return
    (held,) = [b for b in c.buffers if b.memory_kind != "device"]
    assert (held.kind, held.path, held.memory_kind, held.nbytes) == ("argument", "args[0]", "pinned_host", 4 * 2**20)


def test_an_argument_sharded_over_an_abstract_mesh_in_pinned_host_stays_there():
    mesh = jax.sharding.AbstractMesh((4,), ("x",))
    P = jax.sharding.PartitionSpec
    w = _pinned((1024, 1024), mesh, P("x"))
    x = jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, P("x")))
    c = ts.cost(_from_host, w, x, target="v5e:2x2")
    assert (c.host_argument_bytes, c.argument_bytes) == (1024 * 1024 * 4 // 4, 512 * 1024 * 4 // 4)


def test_the_command_line_fits_a_host_budget(capsys):
    from treeshape.__main__ import main

    argv = ["fit", "test_host_memory:_host_output_step", "f32[b,1024]", "--dim", "b", "--target", "v5e"]
    assert main([*argv, "--host-budget", "400KiB", "--max-size", "4096", "--json"]) == 0
    (b,) = jax.export.symbolic_shape("b")
    x = jax.ShapeDtypeStruct((b, 1024), jnp.float32)
    fit = ts.largest_fit(_host_output_step, x, dim="b", target="v5e", host_budget=400 * 1024, max_size=4096)
    assert json.loads(capsys.readouterr().out)["size"] == fit.size < 100
    assert main([*argv, "--host-budget", "1KiB"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "even b=1 does not fit the host's memory: it takes 4.0 KiB (4,096 B) in host memory kinds, over "
            "--host-budget 1.0 KiB (1,024 B): pass --host-budget 4KiB or more, or offload less to the host"
        )
    )
    assert main([*argv, "--host-budget", "lots"]) == 2
    assert "--host-budget: malformed amount of bytes 'lots'" in capsys.readouterr().err
