"""treeshape in several processes joined by `jax.distributed` (CPU, gloo collectives).

Each test starts N copies of `multiprocess_worker.py` (two CPU devices each, a global
mesh over all of them) on a free 127.0.0.1 port, with a hard timeout; every process
group is killed in a `finally`, so a hang or a failure can never stall CI. The workers
check global `structure_of`, `zeros/ones/full` on shardings that span processes (every
dtype, typed keys, weak types), `with_shardings`, abstract meshes, `scan_carry` in a
jitted step and in `shard_map`, and train a data-parallel optax model whose losses must
equal this process's single-device reference.
"""

import importlib.util
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import train_step
from jax import lax


_WORKER = pathlib.Path(__file__).with_name("multiprocess_worker.py")
_TIMEOUT = 120.0  # seconds for the whole group; a normal run takes a few


def _worker_module():
    spec = importlib.util.spec_from_file_location("multiprocess_worker", _WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """This environment without the 8-device XLA_FLAGS of conftest.py (each worker sets its
    own two CPU devices); JAX_ENABLE_X64 passes through, so the workers run in CI's mode."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run_workers(n: int, tmp_path: pathlib.Path) -> list[str]:
    """Start `n` worker processes, wait for all (killing every group on the first failure or
    at the timeout), and return their outputs."""
    port = _free_port()
    logs = [tmp_path / f"worker{i}.log" for i in range(n)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, log in enumerate(logs):
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, str(_WORKER), str(port), str(n), str(i)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=_clean_env(),
                        cwd=tmp_path,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + _TIMEOUT
        timed_out = False
        while True:
            codes = [p.poll() for p in procs]  # every process, each time
            if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    outputs = [log.read_text(errors="replace") for log in logs]
    codes = [p.returncode for p in procs]
    if any(code != 0 for code in codes):
        report = "\n".join(
            f"--- process {i} (exit {c}):\n{out[-3000:]}" for i, (c, out) in enumerate(zip(codes, outputs, strict=True))
        )
        what = f"timed out after {_TIMEOUT:.0f} s" if timed_out else "failed (the others were killed)"
        pytest.fail(f"{n} processes: a worker {what}:\n{report}")
    return outputs


def _reference_losses() -> np.ndarray:
    """The same training in this one process, on one device, without treeshape."""
    worker = _worker_module()
    xs, ys, params = worker.training_data()
    opt = optax.adam(1e-2)
    step = train_step(opt)
    params = jax.tree.map(jnp.asarray, params)
    _, losses = jax.jit(lambda p, s, xs, ys: lax.scan(step, (p, s), (xs, ys)))(params, opt.init(params), xs, ys)
    return np.asarray(losses)


@pytest.mark.parametrize("n", [2, 4], ids=["2_processes", "4_processes"])
def test_treeshape_across_processes(n, tmp_path):
    outputs = _run_workers(n, tmp_path)
    results = []
    for i, out in enumerate(outputs):
        lines = out.splitlines()
        for check in ["structure_of", "fills", "with_shardings", "abstract_meshes", "scan_carry_in_jit"]:
            assert f"ok {check}" in lines, f"process {i}: {check} did not run:\n{out}"
        assert "ok scan_carry_in_shard_map" in lines
        done = [line for line in lines if line.startswith("done ")]
        assert len(done) == 1, out
        results.append(json.loads(done[0][len("done ") :]))
    assert [r["process"] for r in results] == list(range(n))
    losses = [r["losses"] for r in results]
    assert all(loss == losses[0] for loss in losses)  # every process sees the same global result
    reference = _reference_losses()
    assert len(losses[0]) == len(reference) == 10
    np.testing.assert_allclose(losses[0], reference, rtol=1e-5, atol=1e-6)
    assert losses[0][-1] < losses[0][0]  # it trains
