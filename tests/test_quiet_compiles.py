"""No line of the accelerators' own logging (libtpu's start-up on a machine without a TPU,
XLA's from inside its compilers, JAX's CUDA plugin without a driver) reaches standard
error from `ts.cost(target=)`, `largest_fit`, `plan` or the command line, while the
user's own lines (Python `logging`, absl's, prints to stderr from inside the costed
function) still show, in order. Each check is a fresh process: libtpu logs at its start."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest


REPO = Path(__file__).parent.parent
NEW_ENOUGH = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)  # NVIDIA targets from 0.10
# What the accelerators' logging writes: a C++ log line (absl's, glog's, TSL's prefix), and
# the lines libtpu and absl print without one.
NATIVE = re.compile(
    r"^[IWEF]\d{4} [\d:. ]+\d+ \S+\.(cc|h):\d+\]|^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+\.(cc|h):\d+\]"
    r"|TPU_WORKER_HOSTNAMES|stack_frame_id|InitGoogle|absl::InitializeLog|libtpu|Source Location Trace|host bounds"
)
USER = [
    "WARNING:root:the user's logging, from inside the step",
    "the user's print, from inside the step",
    "WARNING:absl:the user's absl logging, from inside the step",
]

STEP = """
import logging, sys
import jax, jax.numpy as jnp
from absl import logging as absl_logging

def step(w, x):
    logging.warning("the user's logging, from inside the step")
    print("the user's print, from inside the step", file=sys.stderr)
    absl_logging.warning("the user's absl logging, from inside the step")

    def layer(h, w):
        return jnp.tanh(h @ w), None

    return jax.grad(lambda w: jnp.sum(jax.lax.scan(layer, x, w)[0]))(w)
"""

LIBRARY = """
jax.devices()  # the user's own start of JAX: what that logs is JAX's, not treeshape's
print("<<treeshape>>", file=sys.stderr, flush=True)
import treeshape as ts

w = jax.ShapeDtypeStruct((2, 128, 128), jnp.float32)
(b,) = jax.export.symbolic_shape("b")
batch = jax.ShapeDtypeStruct((b, 128), jnp.float32)
for target in sys.argv[1:]:
    cost = ts.cost(step, w, jax.ShapeDtypeStruct((64, 128), jnp.float32), target=target)
    fit = ts.largest_fit(step, w, batch, dim="b", target=target, budget=2**22, max_size=64)
    plan = ts.plan(lambda n: (step, w.update(shape=(n, 128, 128)), batch), {"n": [1]}, target=target,
                   budget=2**22, max_size=64)
    print("<<done>>", target, cost.time is not None, fit.size, plan.best is not None, file=sys.stderr, flush=True)
try:  # refused inside the compiler: standard error is the user's again after it
    ts.cost(jnp.tanh, jax.ShapeDtypeStruct((2**17, 2**16), jnp.float32), target="v5e")
except ValueError as e:
    print("<<refused>>", type(e).__name__, file=sys.stderr, flush=True)
"""


def _env(**settings):
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return {**env, **{k: v for k, v in settings.items() if v is not None}}


def _checked(stderr, after=None):
    """The lines of `stderr` (after the line `after`), none of them the accelerators'."""
    lines = stderr.splitlines()
    lines = lines[lines.index(after) + 1 :] if after is not None else lines
    assert [line for line in lines if NATIVE.search(line)] == []
    return lines


@pytest.mark.parametrize("platforms", ["cpu", None], ids=["JAX_PLATFORMS=cpu", "JAX_PLATFORMS unset"])
def test_cost_fit_and_plan_for_a_target_write_none_of_the_compilers_lines(platforms):
    targets = ["v5e", "h100"] if platforms == "cpu" and NEW_ENOUGH else ["v5e"]
    script = textwrap.dedent(STEP) + textwrap.dedent(LIBRARY)
    result = subprocess.run(
        [sys.executable, "-c", script, *targets],
        env=_env(JAX_PLATFORMS=platforms),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    lines = _checked(result.stderr, after="<<treeshape>>")
    done = [line.split() for line in lines if line.startswith("<<done>>")]
    assert [(t, costed, int(size) > 1, best) for _, t, costed, size, best in done] == [
        (t, "True", True, "True") for t in targets
    ]
    # The user's lines, each time the step is traced, in the order it writes them.
    user = [line for line in lines if line in USER]
    assert len(user) >= 3 * 3 * len(targets) and user == USER * (len(user) // 3)
    assert lines[-1] == "<<refused>> OutOfMemory"


def test_the_command_line_with_a_target_writes_only_the_users_lines(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(STEP))
    result = subprocess.run(
        [sys.executable, "-m", "treeshape", "cost", "model:step", "f32[2,128,128]", "f32[64,128]", "--target", "v5e"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "compiled for: TPU v5e x1 (deviceless)" in result.stdout
    assert _checked(result.stderr) == USER
