"""`Cost.time` of kernels that XLA's cost analysis cannot see into or types by their result:
custom calls (a Pallas kernel, with or without its `cost_estimate`, JAX's splash attention,
a linear-algebra call), and matrix products whose operands are narrower than their result.
The oracles are the kernels' own figures (the FLOPs and bytes a `cost_estimate` states, the
bytes of their operands and results) and the chips' published peaks."""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash,
    splash_attention_mask as masks,
)

import treeshape as ts


NEW_ENOUGH = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
needs_cuda_release = pytest.mark.skipif(not NEW_ENOUGH, reason="jax < 0.10: NVIDIA targets are a JaxReleaseError")
# The chips' published peaks (FLOP/s) and HBM bandwidths (bytes/s).
V5E_BF16, V5E_INT8, V5E_HBM = 197e12, 394e12, 819e9
H100_BF16, H100_FP8, H100_HBM = 989.4e12, 1978.9e12, 3.35e12
N, BLOCK = 1024, 256
MATMUL_BYTES = 3 * N * N * 2  # a bf16 product's two operands and its result
CALIBRATION = Path(ts.__file__).parent / "_cost" / "calibration" / "v5e.json"


def _matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def pallas_matmul(a, b, cost_estimate=None):
    """A blocked bf16 matmul written with Pallas for a TPU: a grid over the output's blocks
    and the contraction's, accumulated in VMEM."""
    extra = {} if cost_estimate is None else {"cost_estimate": cost_estimate}
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((N, N), jnp.bfloat16),
        grid=(N // BLOCK, N // BLOCK, N // BLOCK),
        in_specs=[
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, k)),
            pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((BLOCK, BLOCK), jnp.float32)],
        **extra,
    )(a, b)


def _custom_calls(t):
    return [k for k in t.kernels if k.kind == "custom call"]


def _never_negative(t):
    assert t.floor_seconds > 0
    assert all(k.seconds >= 0 and k.flops >= 0 and k.bytes_accessed >= 0 for k in t.kernels), t.kernels


def _calibrated(name):
    """A number of the v5e's calibration table, as the table holds it (never restated here)."""
    return json.loads(CALIBRATION.read_text())["numbers"][name]["value"]


# The blocks the pipeline copies: each operand's block at every grid step (each changes
# with the contraction's index), the output's once for each of its blocks.
STEPS = (N // BLOCK) ** 3
COPIED = STEPS * 2 * BLOCK * BLOCK * 2 + (N // BLOCK) ** 2 * BLOCK * BLOCK * 2


def test_a_pallas_kernel_is_costed_from_its_body_over_its_grid():
    x = jax.ShapeDtypeStruct((N, N), jnp.bfloat16)
    t = ts.cost(jax.jit(pallas_matmul), x, x, target="v5e").time
    (kernel,) = _custom_calls(t)
    assert kernel.op.endswith("pallas_call") and kernel.runs == 1
    # its body's product over the grid, the blocks its pipeline copies (0.6: 0 FLOPs, its operands' bytes)
    assert (kernel.flops, kernel.bytes_accessed) == (2 * N**3, COPIED)
    work = max(
        2 * N**3 / (V5E_BF16 * _calibrated("pallas_mxu_efficiency")),
        COPIED / (V5E_HBM * _calibrated("hbm_efficiency")),
    )
    steps = STEPS * _calibrated("pallas_step_seconds")
    run = _calibrated("hbm_cycles_per_run") / 1.5e9  # (a v5e's clock)
    assert kernel.seconds == pytest.approx(work + steps + run, rel=1e-6)
    assert "custom call" not in t.source and t.checked == pytest.approx(1.0)
    _never_negative(t)


def test_a_pallas_kernel_with_a_cost_estimate_is_costed_by_it_and_its_grid():
    x = jax.ShapeDtypeStruct((N, N), jnp.bfloat16)
    estimate = pl.CostEstimate(flops=2 * N**3, transcendentals=0, bytes_accessed=MATMUL_BYTES)
    t = ts.cost(jax.jit(lambda a, b: pallas_matmul(a, b, estimate)), x, x, target="v5e").time
    (kernel,) = _custom_calls(t)
    assert (kernel.flops, kernel.bytes_accessed) == (2 * N**3, MATMUL_BYTES)
    work = max(
        2 * N**3 / (V5E_BF16 * _calibrated("pallas_mxu_efficiency")),
        MATMUL_BYTES / (V5E_HBM * _calibrated("hbm_efficiency")),
    )
    # each grid step's cost besides, which the estimate knows nothing of (a 128-wide blocked
    # product of 4096 ran 12x its estimate's time on the chip)
    steps = STEPS * _calibrated("pallas_step_seconds")
    run = _calibrated("hbm_cycles_per_run") / 1.5e9
    assert kernel.seconds == pytest.approx(work + steps + run, rel=1e-6)
    assert kernel.seconds >= 2 * N**3 / V5E_BF16 and t.floor_seconds >= 2 * N**3 / V5E_BF16
    assert "custom call" not in t.source and t.checked == pytest.approx(1.0)
    _never_negative(t)


def test_a_custom_call_without_figures_is_costed_by_its_bytes_and_not_counted_as_measured():
    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    t = ts.cost(jax.jit(jnp.linalg.cholesky), x, target="v5e").time
    # libtpu's `Cholesky` custom calls: costed by their bytes, a kind the chip did not measure
    assert re.search(r"costed by their bytes alone: .*\d+ custom calls? without figures", t.source)
    assert 0.9 < t.checked < 1.0
    assert "; over 99% of this step in kinds measured there;" in t.source
    _never_negative(t)


def test_a_step_with_pallas_splash_attention_has_a_time():
    # Its kernel's metadata spans several lines of the dumped module (0.6: `time` None).
    heads, length, width = 2, 512, 128
    mask = masks.MultiHeadMask([masks.CausalMask((length, length)) for _ in range(heads)])
    attention = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1)
    x = jax.ShapeDtypeStruct((heads, length, width), jnp.bfloat16)
    with jax.enable_x64(False):  # JAX's splash kernel does not lower with x64 on (i32 * i64 in its body)
        c = ts.cost(jax.jit(lambda q, k, v: attention(q, k, v)), x, x, x, target="v5e")
    assert c.time is not None
    kernels = [k for k in _custom_calls(c.time) if k.op.endswith("pallas_call")]
    assert len(kernels) == 1
    # q, k and v read and the output written, at least (its mask's blocks and more besides)
    assert kernels[0].bytes_accessed >= 4 * heads * length * width * 2
    # costed from its body over its grid (0.6: by its bytes alone): its two products per block
    assert kernels[0].flops >= 4 * heads * length * length * width / 2
    assert "custom call" not in c.time.source and c.time.checked == pytest.approx(1.0)
    assert c.time.floor_seconds <= c.time.seconds
    _never_negative(c.time)


def test_a_linear_algebra_call_on_a_tpu_is_costed_by_its_bytes_and_said_so():
    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    t = ts.cost(jax.jit(jnp.linalg.cholesky), x, target="v5e").time
    # libtpu factors it in blocks, a custom call each (`Cholesky`, and the inverses of the
    # diagonal blocks), among the fusions that update the rest: the line's kernels together
    assert re.search(r"costed by their bytes alone: .*\d+ custom calls? without figures", t.source)
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.seconds)
    _never_negative(t)


@needs_cuda_release
def test_a_linear_algebra_call_on_an_nvidia_gpu_is_floored_at_its_bytes():
    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    t = ts.cost(jax.jit(jnp.linalg.cholesky), x, target="h100").time
    (call,) = _custom_calls(t)  # cuSOLVER's factorization: its matrix read and written
    assert call.bytes_accessed >= 2 * 256 * 256 * 4
    assert call.seconds >= call.bytes_accessed / H100_HBM
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.floor_seconds)
    _never_negative(t)


def test_an_int8_products_floor_is_at_the_int8_peak():
    n = 4096
    x = jax.ShapeDtypeStruct((n, n), jnp.int8)
    c = ts.cost(jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.int32)), x, x, target="v5e")
    t = c.time
    (product,) = [k for k in t.kernels if k.kind == "matmul"]
    assert t.floor_seconds == pytest.approx(2 * n**3 / V5E_INT8)  # (0.6: at the bf16 peak, 2x)
    # at libtpu's own estimate or below (0.6: its floor at the bf16 peak, 1.9x that)
    assert product.seconds <= t.compiler_seconds


@needs_cuda_release
@pytest.mark.parametrize(
    ("dtype", "peak"), [(jnp.bfloat16, H100_BF16), (jnp.float8_e4m3fn, H100_FP8)], ids=["bf16", "fp8"]
)
def test_a_products_floor_on_an_h100_is_at_its_operands_peak_not_its_results(dtype, peak):
    n = 4096
    x = jax.ShapeDtypeStruct((n, n), dtype)
    c = ts.cost(jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32)), x, x, target="h100")
    assert c.time.floor_seconds == pytest.approx(2 * n**3 / peak)  # (0.6: at the f32 peak)


def _clamped_copy(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def test_a_pallas_block_is_counted_each_time_its_index_changes():
    # A causal kernel's trick: past the diagonal its input's index stays put, and its
    # pipeline copies nothing new (0.7 before this: a copy at every step).
    n, block = 8, 128
    x = jax.ShapeDtypeStruct((n * block, block), jnp.float32)

    def kernel(x):
        return pl.pallas_call(
            _clamped_copy,
            out_shape=jax.ShapeDtypeStruct((n * n * block, block), jnp.float32),
            grid=(n, n),
            in_specs=[pl.BlockSpec((block, block), lambda i, j: (jnp.minimum(i, j), 0))],
            out_specs=pl.BlockSpec((block, block), lambda i, j: (i * n + j, 0)),
        )(x)

    with jax.enable_x64(False):  # (Mosaic takes no 64-bit block index: a literal 0 is one under x64)
        t = ts.cost(jax.jit(kernel), x, target="v5e").time
    (call,) = _custom_calls(t)
    indices = [min(i, j) for i in range(n) for j in range(n)]
    changes = 1 + sum(a != b for a, b in zip(indices[:-1], indices[1:], strict=True))
    assert changes < n * n
    assert call.bytes_accessed == (changes + n * n) * block * block * 4
