"""`Cost.time` per kind of kernel (section 31): copies between device and host memory at the
host link's rate, less the work beside them; gathers and scatters per row by their rows'
bytes and their table's rows (and a scatter by the emitter libtpu picks); strided slices
and layout copies at the rates measured for them; `StepTime.checked`, the share of a step in kinds the chip
measured; and the calibration table every number comes from. The oracles are the table's
own numbers (read from it, never restated) and the arrays' bytes."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import treeshape as ts


ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = Path(ts.__file__).parent / "_cost" / "calibration" / "v5e.json"
TABLE = json.loads(CALIBRATION.read_text())
V5E_CLOCK = 1.5e9


def number(name):
    return TABLE["numbers"][name]["value"]


def _to_host(x):
    return jax.device_put(x, jax.memory.Space.Host)


def _copies(t):
    return [k for k in t.kernels if k.kind == "async copy"]


def test_every_number_of_the_calibration_says_where_it_came_from():
    assert TABLE["chip"] == "v5e" and TABLE["rebuilt_by"] == "benchmarks/steptime/calibrate.py"
    for name, entry in TABLE["numbers"].items():
        assert entry["value"] > 0, name
        assert entry["unit"] and entry["from"].startswith(("micro: ", "profiles: ")), name
        assert entry["summary"] in TABLE["summaries"], name
        assert entry["libtpu"] and entry["date"], name
        assert (ROOT / "benchmarks" / "steptime" / "measured" / entry["summary"]).is_file(), name


def test_the_calibration_is_the_one_its_summaries_give():
    check = [sys.executable, str(ROOT / "benchmarks" / "steptime" / "calibrate.py"), "--check"]
    done = subprocess.run(check, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_copy_to_the_host_runs_at_the_host_links_rate():
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)  # 16 MiB
    t = ts.cost(jax.jit(_to_host), x, target="v5e").time
    copied = max(_copies(t), key=lambda k: k.seconds)
    # (0.6: at HBM's rate and 15% of it exposed, 4 us for what the chip moved in 1.1 ms)
    assert copied.seconds == pytest.approx(16 * 2**20 / number("host_bytes_per_second.device_to_host"), rel=0.01)
    assert t.checked == pytest.approx(1.0)


def test_a_copy_to_the_host_beside_a_product_takes_what_the_product_does_not_hide():
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    alone = ts.cost(jax.jit(_to_host), x, target="v5e").time
    both = ts.cost(jax.jit(lambda w, x: (w @ w, _to_host(x))), w, x, target="v5e").time
    product = next(k for k in both.kernels if k.kind == "matmul")
    moved = max(_copies(alone), key=lambda k: k.seconds).seconds
    hidden = sum(k.seconds for k in _copies(both))
    assert hidden == pytest.approx(moved - product.seconds, rel=0.02)
    # the chip ran the two together as long as the copy alone
    assert both.seconds == pytest.approx(alone.seconds, rel=0.02)


def _gather_row_seconds(table_rows, width, dtype=jnp.float32):
    table = jax.ShapeDtypeStruct((table_rows, width), dtype)
    ids = jax.ShapeDtypeStruct((16384,), jnp.int32)
    t = ts.cost(jax.jit(lambda t, i: jnp.take(t, i, axis=0)), table, ids, target="v5e").time
    (gather,) = [k for k in t.kernels if k.kind == "gather"]
    return gather.seconds / 16384


def test_a_gathered_row_costs_more_from_a_table_of_many_rows():
    small, large = number("gather_seconds_per_row.small_table"), number("gather_seconds_per_row.large_table")
    run = number("hbm_cycles_per_run") / V5E_CLOCK / 16384
    # (with the indices' clamp XLA fuses in: a few percent)
    assert _gather_row_seconds(16384, 128) == pytest.approx(small + run, rel=0.05)
    assert _gather_row_seconds(262144, 128) == pytest.approx(large + run, rel=0.05)
    # between the two, by the log of the table's rows
    middle = _gather_row_seconds(65536, 128)
    assert middle == pytest.approx(small * (large / small) ** 0.5 + run, rel=0.05)


def test_a_wide_gathered_row_costs_its_bytes():
    wide = 4096 * 4
    row = (wide - number("gather_row_knee_bytes")) / number("gather_row_bytes_per_second")
    run = number("hbm_cycles_per_run") / V5E_CLOCK / 16384
    assert _gather_row_seconds(16384, 4096) == pytest.approx(row + run, rel=0.05)


def _scatter_row_seconds(dtype, width):
    table = jax.ShapeDtypeStruct((16384, width), dtype)
    rows = jax.ShapeDtypeStruct((16384, width), dtype)
    ids = jax.ShapeDtypeStruct((16384,), jnp.int32)
    t = ts.cost(jax.jit(lambda t, i, r: t.at[i].add(r)), table, ids, rows, target="v5e").time
    (scatter,) = [k for k in t.kernels if k.kind == "scatter"]
    return scatter.seconds


def test_a_scatter_adds_its_rows_element_by_element():
    # a bf16 row of 1024 elements costs as an f32 row of 1024 elements, not as one of 512
    # (the chip: 0.49 ms and 0.31 ms for 2048-byte rows)
    assert _scatter_row_seconds(jnp.bfloat16, 1024) == pytest.approx(_scatter_row_seconds(jnp.float32, 1024), rel=0.3)
    assert _scatter_row_seconds(jnp.bfloat16, 1024) > 1.3 * _scatter_row_seconds(jnp.float32, 512)


def _scatter_into_zeros_seconds(table_rows, rows):
    ids = jax.ShapeDtypeStruct((rows,), jnp.int32)
    updates = jax.ShapeDtypeStruct((rows, 128), jnp.float32)  # 512-byte rows
    step = jax.jit(lambda u, i: jnp.zeros((table_rows, 128), jnp.float32).at[i].add(u))
    (scatter,) = [k for k in ts.cost(step, updates, ids, target="v5e").time.kernels if k.kind == "scatter"]
    return scatter.seconds


HBM = 819e9 * number("hbm_efficiency")  # (the v5e's bandwidth, as much of it as the chip reached)
RUN = number("hbm_cycles_per_run") / V5E_CLOCK


def test_a_scatter_into_a_table_larger_than_vmem_costs_what_its_emitter_does():
    # libtpu adds a few rows into a large table one by one in place in HBM (the chip: 16,384
    # rows into 262,144 in 1.2 ms, 73 ns a row, zeros written apart), and stages many (65,536
    # in 0.79 ms): 0.6 costed both at the one rate
    in_place = number("scatter_in_place_row_seconds") + 512 / number("scatter_in_place_row_bytes_per_second")
    staged_row = number("scatter_seconds_per_row") + 512 / number("scatter_row_bytes_per_second")
    staged_row *= number("scatter_large_table_factor")

    def staged(rows):
        return 262144 * 512 / HBM + rows * staged_row + RUN

    few, many = _scatter_into_zeros_seconds(262144, 16384), _scatter_into_zeros_seconds(262144, 65536)
    assert few == pytest.approx(16384 * in_place + RUN, rel=0.02) or few == pytest.approx(staged(16384), rel=0.02)
    assert many == pytest.approx(staged(65536), rel=0.02)
    assert many / 65536 < few / 16384 / 4 or few == pytest.approx(staged(16384), rel=0.02)


def _indexed_kernel(kind, lanes, table_rows=1048576, dtype=jnp.float32):
    table = jax.ShapeDtypeStruct((table_rows, lanes), dtype)
    ids = jax.ShapeDtypeStruct((16384,), jnp.int32)
    if kind == "scatter":  # an optimizer's update of a donated table: each row added in place
        rows = jax.ShapeDtypeStruct((16384, lanes), dtype)
        step, args = jax.jit(lambda t, r, i: t.at[i].add(r), donate_argnums=0), (table, rows, ids)
    else:
        step, args = jax.jit(lambda t, i: jnp.take(t, i, axis=0)), (table, ids)
    (kernel,) = [k for k in ts.cost(step, *args, target="v5e").time.kernels if k.kind == kind]
    return kernel.seconds


@pytest.mark.parametrize("lanes", [16, 32])
def test_a_table_laid_out_transposed_costs_a_row_by_the_tiles_it_spans(lanes):
    # libtpu lays a million-row table of fewer than 128 lanes out with its rows along the
    # lanes: a row is one lane of lanes / 8 tiles (the chip: a scatter's row 100 ns at 16
    # lanes, 126 ns at 32; a gather's 35 ns at 32 from HBM), where 0.6 costed 67 ns and 7.6 ns
    tiles = lanes // 8
    scatter_row = number("scatter_in_place_row_seconds") + tiles * number("scatter_transposed_tile_seconds")
    assert _indexed_kernel("scatter", lanes) == pytest.approx(16384 * scatter_row + RUN, rel=0.02)
    gather_row = tiles * number("gather_transposed_tile_seconds.hbm")
    gathered = _indexed_kernel("gather", lanes)
    in_vmem = number("gather_transposed_row_seconds.vmem") + tiles * number("gather_transposed_tile_seconds.vmem")
    # (a table that fits is prefetched into VMEM, where its rows cost less)
    assert gathered in (pytest.approx(16384 * gather_row + RUN, rel=0.02), pytest.approx(16384 * in_vmem, rel=0.1))
    # a table of 128 lanes is laid out row by row: its row costs its bytes, not tiles
    assert _indexed_kernel("scatter", 128) == pytest.approx(
        16384 * (number("scatter_in_place_row_seconds") + 512 / number("scatter_in_place_row_bytes_per_second")) + RUN,
        rel=0.02,
    )


def _cache_write_seconds(head):
    """The kernel that writes one position of a donated bf16 KV cache [64, 1024, 8, head]."""
    cache = jax.ShapeDtypeStruct((64, 1024, 8, head), jnp.bfloat16)
    new, pos = jax.ShapeDtypeStruct((64, 8, head), jnp.bfloat16), jax.ShapeDtypeStruct((), jnp.int32)
    step = jax.jit(lambda c, k, p: lax.dynamic_update_slice_in_dim(c, k[:, None], p, axis=1), donate_argnums=0)
    kernels = ts.cost(step, cache, new, pos, target="v5e").time.kernels
    return max(k.seconds for k in kernels if k.kind == "data movement")


def test_a_cache_position_written_along_the_lanes_costs_each_tile_it_spans():
    # libtpu lays a cache [b, s, h, 64] out with its positions along the lanes: one position
    # written is one lane of each of b * h * 64 / 8 tiles (the chip: 56.6 us at b = 64, where
    # the model costed its 64 KiB at ~1 us); a head of 128 lanes lies row by row and costs its bytes
    tiles = 64 * 8 * 64 // 8
    assert _cache_write_seconds(64) == pytest.approx(tiles * number("update_lane_tile_seconds") + RUN, rel=0.05)
    assert _cache_write_seconds(128) < 5e-6


def _moved_seconds(f, shape):
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    return sum(k.seconds for k in ts.cost(jax.jit(f), x, target="v5e").time.kernels if k.kind != "launch")


def test_a_strided_slice_runs_at_the_rate_measured_for_its_stride():
    nbytes = 4096 * 1024 * 4  # the operand each slice spans
    # (`lax.slice_in_dim`: `x[:, ::2]` is a strided slice from jax 0.9, a gather before)
    every_other_lane = lambda x: jax.lax.slice_in_dim(x, 0, None, stride=2, axis=1)  # noqa: E731
    every_other_row = lambda x: jax.lax.slice_in_dim(x, 0, None, stride=2, axis=0)  # noqa: E731
    lanes = _moved_seconds(every_other_lane, (4096, 1024))  # (0.6: its bytes at HBM's rate, 0.05x)
    rows = _moved_seconds(every_other_row, (4096, 1024))  # over sublanes
    assert lanes == pytest.approx(nbytes / number("strided_bytes_per_second.lanes") + RUN, rel=0.02)
    assert rows == pytest.approx(nbytes / number("strided_bytes_per_second.sublanes") + RUN, rel=0.02)
    half = _moved_seconds(lambda x: x[:2048], (4096, 1024))  # no stride: its bytes at HBM's rate
    assert half == pytest.approx(nbytes / HBM + RUN, rel=0.02)
    assert half < rows < lanes


def test_a_layout_copy_between_hbm_and_vmem_runs_at_hbms_pace():
    # a loop transposing its carry: the carry copied into VMEM and back out around the loop
    # (the chip: 14.4 us each for 8 MiB, where 0.6 added VMEM's time to HBM's: 29.8 us), and
    # two copies a trip in VMEM at the rate measured for them in a loop
    def transpose_in_a_loop(x):
        # (an int32 counter under x64 too: an int64 one is laid out, and copied, otherwise)
        return jax.lax.fori_loop(jnp.int32(0), jnp.int32(16), lambda i, y: jnp.swapaxes(y, 1, 2), x)

    x = jax.ShapeDtypeStruct((8, 512, 512), jnp.float32)
    t = ts.cost(jax.jit(transpose_in_a_loop), x, target="v5e").time
    (around,) = [k for k in t.kernels if k.kind == "copy" and k.runs == 2]
    assert around.seconds == pytest.approx(2 * (8 * 2**20 / HBM + RUN), rel=0.02)
    inside = [k for k in t.kernels if k.kind == "copy" and k.runs >= 32]  # (XLA's own, the counter's with them)
    vmem_run = number("vmem_cycles_per_run") / V5E_CLOCK
    in_vmem = 32 * (16 * 2**20 / number("loop_vmem_bytes_per_second.copy") + vmem_run)
    assert sum(k.seconds for k in inside) == pytest.approx(in_vmem, rel=0.02)


def _product_seconds(dtype, precision=None, context=None):
    x = jax.ShapeDtypeStruct((2048, 2048), dtype)

    def product(a, b):
        return jnp.matmul(a, b, precision=precision)

    if context is None:
        t = ts.cost(jax.jit(product), x, x, target="v5e").time
    else:
        with jax.default_matmul_precision(context):
            t = ts.cost(jax.jit(product), x, x, target="v5e").time
    return sum(k.seconds for k in t.kernels if k.kind == "matmul")


FLOPS_AT_PEAK = 2 * 2048**3 / 197e12  # the v5e's bf16 peak


@pytest.mark.parametrize(("precision", "passes"), [("highest", "f32_passes.highest"), ("high", "f32_passes.high")])
def test_an_f32_product_at_a_higher_precision_takes_the_matrix_units_passes(precision, passes):
    # (0.6: HIGHEST at 1.44x the default's time, where the chip took 5.6x; 0.25x its 0.57 ms)
    said = getattr(jax.lax.Precision, precision.upper())
    assert _product_seconds(jnp.float32, said) == pytest.approx(number(passes) * FLOPS_AT_PEAK, rel=0.02)
    # the same as a context sets it
    assert _product_seconds(jnp.float32, context=precision) == pytest.approx(_product_seconds(jnp.float32, said))
    # one pass at the default, and for bf16 operands at any precision
    default = _product_seconds(jnp.float32)
    assert default < 2 * FLOPS_AT_PEAK < number(passes) * FLOPS_AT_PEAK
    assert _product_seconds(jnp.bfloat16, said) == pytest.approx(_product_seconds(jnp.bfloat16), rel=0.05)


def test_a_chip_the_calibration_did_not_measure_has_nothing_checked():
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    t = ts.cost(jax.jit(lambda w: jnp.tanh(w @ w)), w, target="v6e").time
    assert t.seconds is not None and t.checked == 0.0
    assert "this chip is not measured" in t.source


def test_a_step_without_an_estimate_has_nothing_checked():
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    try:
        t = ts.cost(jax.jit(lambda w: jnp.tanh(w @ w)), w, target="h100").time
    except ts.JaxReleaseError:
        pytest.skip("this JAX release compiles for no NVIDIA target")
    assert t.seconds is None and t.checked == 0.0


def test_the_guide_states_the_calibrations_numbers():
    guide = (ROOT / "docs" / "guide" / "time.md").read_text()
    said = {
        f"{number('gather_seconds_per_row.small_table') * 1e9:.1f} ns from a table",
        f"{number('gather_seconds_per_row.large_table') * 1e9:.1f} ns from one of",
        f"at {number('gather_row_bytes_per_second') / 1e9:.0f} GB/s",
        f"each row at {number('scatter_seconds_per_row') * 1e9:.1f} ns",
        f"elements at {number('scatter_row_bytes_per_second') / 1e9:.0f} GB/s",
        f"{number('scatter_large_table_factor'):.2f}x slower a row",
        f"at {number('scatter_in_place_row_seconds') * 1e9:.0f} ns a row",
        f"and its bytes at {number('scatter_in_place_row_bytes_per_second') / 1e9:.0f} GB/s",
        f"over lanes at {number('strided_bytes_per_second.lanes') / 1e9:.0f} GB/s",
        f"over sublanes at {number('strided_bytes_per_second.sublanes') / 1e9:.0f} GB/s",
        f"copies at {number('loop_vmem_bytes_per_second.copy') / 1e12:.1f} TB/s",
        f"({number('host_bytes_per_second.device_to_host') / 1e9:.1f} GB/s to the host",
        f"{number('host_bytes_per_second.host_to_device') / 1e9:.1f} GB/s from it",
        f"at {number('pallas_mxu_efficiency'):.0%} of the peak",
        f"plus {number('pallas_step_seconds') * 1e6:.2f} us for each step",
        f"`Precision.HIGHEST` at {number('f32_passes.highest'):.2f}x the time of its FLOPs",
        f"`HIGH` at {number('f32_passes.high'):.2f}x",
        f"each read and written: {number('update_lane_tile_seconds') * 1e9:.1f} ns a tile",
        f"took {number('host_call_seconds') * 1e3:.2f} ms a call",
        f"{number('host_input_seconds') * 1e6:.2f} us for each array",
        f"{number('host_output_seconds') * 1e6:.1f} us for each array returned",
    }
    missing = [s for s in said if " ".join(s.split()) not in " ".join(guide.split())]
    assert not missing, missing
