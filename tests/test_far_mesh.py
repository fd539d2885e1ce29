"""Costing for a mesh this process does not have: inputs sharded over an `AbstractMesh` of
more devices than the 8 of this test process are compiled for that many simulated CPU devices
in a child process, and checked against a reference: the same step compiled by
`jax.jit(...).lower(...).compile()` over a real mesh of the same shape, in a child process that
has those devices (`far_mesh_programs.py`). Every child is killed on timeout."""

import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from far_mesh_programs import inputs, train_step
from jax import lax
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts


_PROGRAMS = pathlib.Path(__file__).with_name("far_mesh_programs.py")


def _abstract_mesh(axes):
    return AbstractMesh(tuple(axes.values()), tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def _reference(program, axes):
    devices = 1
    for n in axes.values():
        devices *= n
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["PYTHONPATH"] = os.pathsep.join([str(_PROGRAMS.parent), *sys.path])
    done = subprocess.run(
        [sys.executable, str(_PROGRAMS), program, json.dumps(axes)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # subprocess.run kills the child when it runs past this
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reference = json.loads(done.stdout.strip().splitlines()[-1])
    assert reference["devices"] == devices
    return reference


@pytest.fixture
def children(monkeypatch):
    """The child processes started while the test runs."""
    started = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        process = real(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(subprocess, "Popen", popen)
    return started


@pytest.mark.parametrize(
    ("program", "axes"),
    [("fsdp", {"data": 16}), ("tp", {"data": 64, "model": 8})],
    ids=["fsdp-16", "tensor-parallel-512"],
)
def test_figures_per_device_are_those_of_a_real_mesh_of_the_same_shape(program, axes):
    mesh = _abstract_mesh(axes)
    c = ts.cost(train_step, *inputs(program, mesh), donate_argnums=(0, 1))
    reference = _reference(program, axes)
    assert c.argument_bytes == reference["argument"]
    assert c.output_bytes == reference["output"]
    assert c.alias_bytes == reference["alias"]
    assert c.temp_bytes == reference["temp"]
    assert c.peak_bytes == reference["argument"] + reference["output"] + reference["temp"] - reference["alias"]
    assert c.backend == f"cpu x{mesh.size} (simulated)"
    assert "temporaries on the target accelerator may differ" in str(c)
    # what is at the peak comes back from the child too
    assert c.buffers and sum(b.nbytes for b in c.buffers) == c.live_peak_bytes <= c.peak_bytes
    assert c.donation and all(path.startswith(("args[0]", "args[1]")) for path in c.donation)
    assert "simulated" in c._repr_html_()


def test_a_program_compiled_here_names_its_platform_and_devices():
    x = jnp.zeros((8, 4))
    assert ts.cost(lambda x: x * 2, x).backend == "cpu x1"
    mesh = jax.make_mesh((8,), ("d",))
    sharded = jax.device_put(x, NamedSharding(mesh, P("d")))
    c = ts.cost(lambda x: x * 2, sharded)
    assert c.backend == "cpu x8"
    assert "simulated" not in str(c)


def test_asking_again_starts_no_child(children):
    mesh = _abstract_mesh({"data": 16})
    args = inputs("fsdp", mesh)
    first = ts.cost(train_step, *args)
    assert len(children) == 1
    assert all(p.poll() is not None for p in children)  # ended
    again = ts.cost(train_step, *args)
    assert again == first
    assert len(children) == 1


def _layers_step(unroll):
    def loss(ws, x):
        return jnp.mean(lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws, unroll=unroll)[0] ** 2)

    return lambda ws, x: ws - 0.1 * jax.grad(loss)(ws, x)


def test_loops_on_a_far_mesh_count_each_run_as_the_unrolled_program_does(children):
    """The loops of a program the child compiled are read from its optimized module."""
    mesh = _abstract_mesh({"data": 16})
    ws = jax.ShapeDtypeStruct((6, 256, 256), jnp.float32, sharding=NamedSharding(mesh, P(None, "data")))
    x = jax.ShapeDtypeStruct((16 * 8, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    looped, flat = ts.cost(_layers_step(1), ws, x), ts.cost(_layers_step(True), ws, x)
    assert looped.backend == "cpu x16 (simulated)" and looped.exact_flops
    assert looped.flops == pytest.approx(flat.flops, rel=0.02)
    assert flat.bytes_accessed / 2 <= looped.bytes_accessed <= 2 * flat.bytes_accessed
    assert looped.flops > 3 * ts.cost(_layers_step(1), ws.update(shape=(2, 256, 256)), x).flops  # six layers, not two

    def until_small(x):
        return lax.while_loop(lambda x: jnp.sum(x) > 1.0, lambda x: jnp.tanh(x) / 2, x)

    assert not ts.cost(until_small, x).exact_flops  # a trip count known only when it runs
    assert len(children) == 4 and all(p.poll() is not None for p in children)


def test_a_structure_planned_on_an_abstract_mesh_and_read_back_from_json(children):
    mesh = _abstract_mesh({"data": 32})
    params = {"w": jax.ShapeDtypeStruct((1024, 256), jnp.float32)}
    planned = ts.structure_of(params).with_shardings(NamedSharding(mesh, P("data", None)))
    loaded = ts.Structure.from_json(planned.to_json())
    c = ts.cost(lambda p: jax.tree.map(lambda w: w * 2, p), loaded)
    assert c.argument_bytes == 1024 * 256 * 4 // 32
    assert c.output_bytes == 1024 * 256 * 4 // 32
    assert c.backend == "cpu x32 (simulated)"
    assert len(children) == 1


def test_more_than_4096_devices_is_refused_before_any_child_starts(children):
    mesh = _abstract_mesh({"data": 8192})
    x = jax.ShapeDtypeStruct((8192, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match=r"8192 devices.*at most 4096") as e:
        ts.cost(lambda x: x * 2, x)
    assert "args[0]" in str(e.value)
    assert children == []


def test_a_child_past_its_timeout_is_ended_and_reported(children, monkeypatch):
    monkeypatch.setenv("TREESHAPE_SIMULATE_TIMEOUT", "0.05")
    mesh = _abstract_mesh({"data": 16})
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with pytest.raises(RuntimeError, match=r"16 simulated CPU devices ran past its timeout of 0.05 s"):
        ts.cost(lambda x: x * 3, x)
    assert len(children) == 1 and children[0].poll() is not None


def test_a_bad_timeout_setting_is_named(monkeypatch):
    monkeypatch.setenv("TREESHAPE_SIMULATE_TIMEOUT", "soon")
    mesh = _abstract_mesh({"data": 16})
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match=r"TREESHAPE_SIMULATE_TIMEOUT='soon'"):
        ts.cost(lambda x: x * 4, x)


def test_a_child_that_fails_is_a_runtime_error_with_its_reason(children, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_no_such_flag_for_treeshape=1")
    mesh = _abstract_mesh({"data": 16})
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with pytest.raises(RuntimeError, match=r"16 simulated CPU devices failed in a child process") as e:
        ts.cost(lambda x: x * 5, x)
    assert "xla_no_such_flag_for_treeshape" in str(e.value)
    assert all(p.poll() is not None for p in children)


@pytest.fixture(scope="module")
def far_fit(tmp_path_factory):
    """One search on a 16-device abstract mesh, by `ts.largest_fit` and then by the command
    line from the same Structures saved as JSON, with the peaks at the answer and the next
    size. The budget lies between the peaks at b = 1 and b = 16 (the search's first probes,
    compiled here first), and `max_size=16`, so that the search compiles few programs."""
    from treeshape._cli import main

    ts.clear_cache()
    mesh = _abstract_mesh({"data": 16})
    params, opt_state, data = inputs("fsdp", mesh)
    rows = jax.export.symbolic_shape("16*b, 512")  # b rows on each of the 16 devices
    batches = {k: jax.ShapeDtypeStruct(rows, v.dtype, sharding=v.sharding) for k, v in data.items()}

    def peak(b):
        return ts.cost(train_step, params, opt_state, inputs("fsdp", mesh, batch=16 * b)[2]).peak_bytes

    budget = peak(1) + (peak(16) - peak(1)) * 3 // 5
    fit = ts.largest_fit(train_step, params, opt_state, batches, dim="b", budget=budget, max_size=16)
    tmp_path = tmp_path_factory.mktemp("far_fit")
    files = [_saved(tmp_path, n, t) for n, t in (("params", params), ("opt", opt_state), ("batch", data))]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cost_status = main(["cost", "far_mesh_programs:train_step", *files, "--json"])
    shown_cost = json.loads(out.getvalue())
    expected_cost = ts.cost(train_step, params, opt_state, data)
    files[2] = _saved(tmp_path, "batches", batches)
    argv = ["fit", "far_mesh_programs:train_step", *files, "--dim", "b", "--budget", str(budget), "--max-size", "16"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fit_status = main([*argv, "--json", "--no-progress"])
    shown_fit = json.loads(out.getvalue())
    found = {"fit": fit, "budget": budget, "at": peak(fit.size), "after": peak(fit.size + 1)}
    found["shown_after"] = peak(shown_fit["size"] + 1)
    found.update(cost_status=cost_status, shown_cost=shown_cost, expected_cost=expected_cost)
    found.update(fit_status=fit_status, shown_fit=shown_fit)
    ts.clear_cache()
    return found


def test_largest_fit_sizes_a_batch_for_a_far_mesh(far_fit):
    fit, budget = far_fit["fit"], far_fit["budget"]
    assert 1 <= fit.size < 16 and not fit.capped  # the budget is reached inside 1..16
    assert fit.cost.peak_bytes == far_fit["at"] <= budget < far_fit["after"]
    assert fit.cost.backend == "cpu x16 (simulated)"


def test_an_interrupt_while_the_child_compiles_ends_the_child(monkeypatch):
    started = []
    real = subprocess.Popen

    class Interrupted(real):  # type: ignore[misc,valid-type]
        def communicate(self, *args, **kwargs):
            started.append(self)
            raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", Interrupted)
    mesh = _abstract_mesh({"data": 16})
    x = jax.ShapeDtypeStruct((16, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    with pytest.raises(KeyboardInterrupt):
        ts.cost(lambda x: x * 6, x)
    assert len(started) == 1 and started[0].poll() is not None


def test_the_largest_mesh_a_child_simulates():
    # Past 2048 devices XLA's CPU client needs cross-process collectives, which the child
    # gets from a one-process jax.distributed on loopback.
    mesh = _abstract_mesh({"data": 4096})
    w = jax.ShapeDtypeStruct((4096 * 4, 256), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    c = ts.cost(lambda w: w * 2, w)
    assert c.argument_bytes == c.output_bytes == 4 * 256 * 4
    assert c.backend == "cpu x4096 (simulated)"


def _saved(tmp_path, name, tree):
    path = tmp_path / f"{name}.json"
    path.write_text(ts.structure_of(tree).to_json())
    return f"@{path}"


def test_the_command_line_takes_structures_planned_for_a_far_mesh(far_fit):
    shown, expected = far_fit["shown_cost"], far_fit["expected_cost"]
    assert far_fit["cost_status"] == 0
    assert shown["backend"] == "cpu x16 (simulated)"
    assert (shown["argument_bytes"], shown["peak_bytes"]) == (expected.argument_bytes, expected.peak_bytes)

    fit = far_fit["shown_fit"]
    assert far_fit["fit_status"] == 0
    assert fit["cost"]["backend"] == "cpu x16 (simulated)"
    assert fit["cost"]["peak_bytes"] <= far_fit["budget"] < far_fit["shown_after"]
    assert (fit["size"], fit["cost"]["peak_bytes"]) == (far_fit["fit"].size, far_fit["fit"].cost.peak_bytes)


def test_a_missing_or_malformed_structure_file_is_bad_input(tmp_path, capsys):
    from treeshape._cli import main

    assert main(["cost", "jax.numpy:sin", f"@{tmp_path / 'nope.json'}"]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["cost", "jax.numpy:sin", f"@{tmp_path / 'bad.json'}"]) == 2
    assert "is not a Structure's JSON" in capsys.readouterr().err
