"""`Cost.time`: the time of one run on a target, before it runs. The oracles are libtpu's
own dump of the same compile (its `estimated_cycles`, each loop body counted by its trip
count), XLA's cost analysis, and the chips' published figures; the estimate itself was
checked on a real v5e (docs/guide/time.md)."""

import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import topologies
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts
from treeshape._cli import main


NEW_ENOUGH = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)
needs_cuda_release = pytest.mark.skipif(not NEW_ENOUGH, reason="jax < 0.10: NVIDIA targets are a JaxReleaseError")
V5E_BF16 = 197e12
V5E_CLOCK = 1.5e9
LENGTH = 5


def scanned(w, x):
    """A donated SGD step of LENGTH layers under `lax.scan`, a matmul outside."""

    def loss(w):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w["layers"])
        return jnp.mean((h @ w["out"]).astype(jnp.float32) ** 2)

    g = jax.grad(loss)(w)
    return jax.tree.map(lambda p, d: p - 0.1 * d, w, g)


def scanned_inputs(width=512, batch=256):
    w = {
        "layers": jax.ShapeDtypeStruct((LENGTH, width, width), jnp.bfloat16),
        "out": jax.ShapeDtypeStruct((width, 128), jnp.bfloat16),
    }
    return w, jax.ShapeDtypeStruct((batch, width), jnp.bfloat16)


def _cycles_with_loops(text):
    """libtpu's estimated cycles of a dumped module: the entry's kernels once, each loop's
    body LENGTH times and its condition LENGTH + 1 times (the test's loops all run LENGTH)."""
    computations = dict(re.findall(r"^(?:ENTRY )?%(\S+) \(.*?\{\n(.*?)\n\}", text, flags=re.M | re.S))
    entry = re.search(r"^ENTRY %(\S+) ", text, flags=re.M)[1]

    def cycles(name, runs):
        total = 0.0
        for line in computations[name].splitlines():
            found = re.search(r'"estimated_cycles":"(\d+)"', line)
            total += runs * int(found[1]) if found else 0
            loop = re.search(r"condition=%([^\s,]+), body=%([^\s,]+)", line)
            if loop:
                total += cycles(loop[2], runs * LENGTH) + cycles(loop[1], runs * (LENGTH + 1))
        return total

    return cycles(entry, 1)


def test_compiler_seconds_are_libtpus_own_cycles_with_each_loop_counted(tmp_path):
    w, x = scanned_inputs()
    c = ts.cost(scanned, w, x, donate_argnums=0, target="v5e")
    device = jax.sharding.SingleDeviceSharding(topologies.get_topology_desc("v5e:2x2", "tpu").devices[0])
    placed = jax.tree.map(lambda s: s.update(sharding=device), (w, x))
    options = {"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True}
    jax.jit(scanned, donate_argnums=0).lower(*placed).compile(options)
    (dumped,) = tmp_path.glob("*after_codegen.txt")
    assert c.time.compiler_seconds == pytest.approx(_cycles_with_loops(dumped.read_text()) / V5E_CLOCK, rel=1e-12)
    # By op and source line: the body's matmul forward (LENGTH runs) and its two gradients
    # (2 * LENGTH); each loop's condition's kernels LENGTH + 1 times each.
    body = {k.op: k for k in c.time.kernels if k.op and "/while/body/" in k.op and k.kind == "matmul"}
    assert sorted(k.runs for k in body.values()) == [LENGTH, 2 * LENGTH]
    condition = [k.runs for k in c.time.kernels if k.op and "/while/cond/" in k.op]
    assert condition and all(runs % (LENGTH + 1) == 0 for runs in condition)


def test_a_kernel_in_a_loop_inside_a_loops_body_runs_as_often_as_both_trip_counts_say():
    """A `fori_loop` of 3 in a `scan` of 5: the inner body's kernels run 15 times, the inner
    condition's 4 x 5, the outer body's own 5 and its condition's 6; each kernel once where
    the loops around it run it."""

    def nested(w, x):
        def outer(h, _):
            return jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), h), None

        return jax.lax.scan(outer, x, length=5)[0]

    w, x = jax.ShapeDtypeStruct((256, 256), jnp.float32), jax.ShapeDtypeStruct((64, 256), jnp.float32)
    # (x32: under jax_enable_x64 the loops' int64 counters are not yet read as trip counts)
    with jax.enable_x64(False):
        c = ts.cost(nested, w, x, target="v5e")
    # each kernel by (the loop bodies around it, in a condition?, its op's own name)
    runs = {
        (k.op.count("/while/body/"), "/while/cond/" in k.op, k.op.rsplit("/", 1)[-1]): k.runs
        for k in c.time.kernels
        if k.op
    }
    assert runs[2, False, "dot_general"] == 15
    assert runs[2, False, "add"] == 15  # (the inner counter)
    assert runs[1, True, "lt"] == 20
    assert runs[1, False, "add"] == 5 and runs[0, True, "lt"] == 6
    assert c.exact_flops and c.flops >= 15 * 2 * 64 * 256 * 256


def test_the_kernels_sum_to_seconds_above_the_floor_and_flops_at_peak():
    w, x = scanned_inputs()
    c = ts.cost(scanned, w, x, donate_argnums=0, target="v5e")
    t = c.time
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.seconds, rel=1e-9)
    assert c.flops / V5E_BF16 <= t.floor_seconds <= t.seconds
    # Each loop counted by its trip count, as `cost` counts it (which also takes off what an
    # unrolled program drops from a loop's last run: the kernels run it as compiled).
    assert c.flops <= sum(k.flops for k in t.kernels) <= 1.1 * c.flops
    assert t.mfu == pytest.approx(c.flops / (t.seconds * V5E_BF16))
    assert list(t.kernels) == sorted(t.kernels, key=lambda k: -k.seconds)
    # every kernel of a plain scanned MLP is of a kind the chip measured
    assert t.checked == pytest.approx(1.0)
    said = "libtpu's cost model, corrected per kind of kernel as measured on a v5e; 100% of this step in kinds measured"
    assert t.source.startswith(said + " there")
    line = next(line for line in str(c).splitlines() if line.startswith("time "))
    assert re.fullmatch(r"time \S+ (ms|us) per step on TPU v5e \(libtpu's cost model, .*\), MFU \d+%", line)
    table = str(t).splitlines()
    assert table[0] == line and table[2].split() == ["kernel", "source", "runs", "seconds", "share"]
    assert any("test_step_time.py:" in row for row in table)


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _flops_per_second(channels, batch, target="v5e"):
    """A 3x3 convolution of `channels` in and out over 64x64 images, as `seconds` costs it."""
    x = jax.ShapeDtypeStruct((batch, 64, 64, channels), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((3, 3, channels, channels), jnp.bfloat16)
    (conv,) = [k for k in ts.cost(_conv, x, w, target=target).time.kernels if k.kind == "convolution"]
    return conv.flops / conv.seconds  # (the line's: its kernels' FLOPs over their time)


def test_a_narrow_convolution_runs_at_its_share_of_the_matrix_units_tiles():
    # A v5e multiplies 128x128 tiles: a 3x3 convolution of 32 channels contracts over 288
    # (its taps times its channels: three quarters of three tiles) into half of a tile's
    # columns (as the chip measured it, up to 64 output features cost the same), so the same
    # FLOPs take several times longer than at 128 channels (the chip: 0.28-0.29 of the peak
    # at 32 channels forward, 0.64-0.89 at 128 and more).
    narrow, wide = _flops_per_second(32, batch=64), _flops_per_second(128, batch=16)
    assert wide >= 0.5 * V5E_BF16
    assert narrow <= wide / 3


def test_a_v6e_counts_a_narrow_convolution_in_its_256_wide_tiles():
    # A v6e's matrix units multiply 256x256 tiles (a v5e's, 128x128): the 3x3 convolution of
    # 32 channels contracts over 288 (0.5625 of two tiles) into an eighth of a tile's columns
    # (counted at twice theirs: a quarter), a fill of 0.14 there, 0.375 on a v5e; one of 256
    # channels fills its tiles on both. The narrow one's share of the wide one's rate is at
    # most its fill.
    narrow, wide = _flops_per_second(32, batch=64, target="v6e"), _flops_per_second(256, batch=8, target="v6e")
    assert wide >= 0.5 * 918e12
    assert narrow / wide <= 0.5625 * 0.25
    v5e_narrow, v5e_wide = _flops_per_second(32, batch=64), _flops_per_second(256, batch=8)
    assert narrow / wide < 0.75 * v5e_narrow / v5e_wide


def _dumped_cycles(fn, *args, tmp_path):
    """libtpu's `estimated_cycles` of each instruction of `fn`'s optimized module, compiled
    for a v5e as `ts.cost` compiles it."""
    return {name: cycles for name, (cycles, _) in _dumped(fn, *args, tmp_path=tmp_path).items()}


def _dumped(fn, *args, tmp_path):
    """libtpu's `estimated_cycles` of each instruction of `fn`'s optimized module (compiled
    for a v5e as `ts.cost` compiles it), and whether it writes several results."""
    device = jax.sharding.SingleDeviceSharding(topologies.get_topology_desc("v5e:2x2", "tpu").devices[0])
    placed = jax.tree.map(lambda s: s.update(sharding=device), args)
    jax.jit(fn).lower(*placed).compile({"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True})
    (dumped,) = tmp_path.glob("*after_codegen.txt")
    found = re.findall(r'^\s*(?:ROOT )?%(\S+) = (\(?).*"estimated_cycles":"(\d+)"', dumped.read_text(), flags=re.M)
    return {name: (int(cycles), tuple_ == "(") for name, tuple_, cycles in found}


def test_a_convolutions_weight_gradient_is_at_libtpus_estimate_as_the_chip_measured_it(tmp_path):
    # Measured on the chip: libtpu's estimate of a weight gradient (its window, the images,
    # spans more than its output, the kernel) is 0.95x the chip's time, where the roofline
    # the forward convolution takes can be 1.6x too fast.
    x = jax.ShapeDtypeStruct((64, 32, 32, 128), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((3, 3, 128, 128), jnp.bfloat16)

    def weight_gradient(x, w):
        return jax.grad(lambda w: _conv(x, w).astype(jnp.float32).sum())(w)

    cycles = _dumped_cycles(weight_gradient, x, w, tmp_path=tmp_path)
    (conv,) = [k for k in ts.cost(weight_gradient, x, w, target="v5e").time.kernels if k.kind == "convolution"]
    assert conv.seconds == pytest.approx(1.05 * cycles[conv.name] / V5E_CLOCK, rel=1e-9)


def test_gathers_and_scatters_are_costed_per_slice_as_the_chip_ran_them():
    # libtpu writes no estimate of a gather or a scatter. The chip picked a label's logit in
    # 10-14 ns (a loss's take_along_axis), an embedding row in 3.2-3.7 ns, and scattered
    # a gradient's rows into a table at its HBM time plus 75 GB/s of the rows.
    labels = jax.ShapeDtypeStruct((16384,), jnp.int32)
    logits = jax.ShapeDtypeStruct((16384, 1000), jnp.float32)

    def picked(logits, labels):
        return jnp.take_along_axis(logits, labels[:, None], axis=1).sum()

    (pick,) = [k for k in ts.cost(picked, logits, labels, target="v5e").time.kernels if k.kind == "gather"]
    assert 16384 * 10e-9 <= pick.seconds <= 16384 * 20e-9

    table = jax.ShapeDtypeStruct((32000, 1024), jnp.bfloat16)
    tokens = jax.ShapeDtypeStruct((8, 1024), jnp.int32)

    def embedded(table, tokens):
        return jax.grad(lambda t: t[tokens].astype(jnp.float32).sum())(table)

    kernels = ts.cost(embedded, table, tokens, target="v5e").time.kernels
    (scatter,) = [k for k in kernels if k.kind == "scatter"]
    table_bytes, rows_bytes = 32000 * 1024 * 2, 8 * 1024 * 1024 * 2
    assert scatter.seconds >= table_bytes / 819e9 + rows_bytes / 100e9
    assert scatter.seconds <= 2 * (table_bytes / 670e9 + rows_bytes / 75e9)


def _attention_gradient(q, k, v):
    def attention(q):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0, axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v).sum()

    return jax.grad(attention)(q)


def test_small_batched_products_whose_operands_stay_in_vmem_run_at_the_chips_rate_per_product():
    # Measured on the chip: attention's products over 64 tokens and 64-wide heads, their
    # operands in VMEM, took 12-16 ns each (bf16 and f32 alike), 3x faster than the fill of
    # their tiles says; 256 tokens, 48-49 ns each.
    x = jax.ShapeDtypeStruct((96, 3, 64, 64), jnp.float32)
    products = [
        k for k in ts.cost(_attention_gradient, x, x, x, target="v5e").time.kernels if k.kind == "batched matmul"
    ]
    assert len(products) >= 2
    for k in products:
        assert 96 * 3 * 10e-9 <= k.seconds <= 96 * 3 * 16e-9, k


def test_a_reduction_over_half_a_vector_registers_lanes_runs_at_half_the_rate():
    # Measured on the chip: reductions whose largest array is 64 wide (a softmax over 64
    # tokens) ran at half the rate of 128-wide ones, per byte, in VMEM.
    rates = []
    for tokens in (64, 128):
        x = jax.ShapeDtypeStruct((48, 3, tokens, 64), jnp.float32)
        kernels = ts.cost(_attention_gradient, x, x, x, target="v5e").time.kernels
        (softmax,) = [k for k in kernels if k.kind == "reduction" and k.op.endswith("/sub")]
        rates.append(softmax.bytes_accessed / softmax.seconds)
    assert rates[1] >= 1.4 * rates[0]


def _norm_then_linear_gradient(p, x):
    """A layer norm, then a linear layer of 128 features, differentiated: XLA fuses the norm
    into both products, and the forward one with the activation's derivative."""

    def loss(p):
        mean = x.mean(-1, keepdims=True)
        normed = (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
        return jnp.tanh(normed @ p["w"] + p["b"]).sum()

    return jax.grad(loss)(p)


def _norm_then_linear_inputs():
    p = {"w": jax.ShapeDtypeStruct((128, 128), jnp.float32), "b": jax.ShapeDtypeStruct((128,), jnp.float32)}
    return p, jax.ShapeDtypeStruct((2048, 128), jnp.float32)


def test_a_product_fused_with_its_neighbours_work_runs_between_its_roofline_and_libtpus_estimate(tmp_path):
    # Measured on the chip: a product of 128 features with a layer norm fused in ran at
    # 0.3-0.9x libtpu's estimate, up to 6x its roofline; one with other results besides (a
    # norm's statistics' gradients, an activation's derivative) at 0.83x the estimate,
    # summed over the 80 steps.
    p, x = _norm_then_linear_inputs()
    products = _dumped(_norm_then_linear_gradient, p, x, tmp_path=tmp_path)
    kernels = ts.cost(_norm_then_linear_gradient, p, x, target="v5e").time.kernels
    costed = [(k, *products[k.name]) for k in kernels if k.kind == "matmul" and k.runs == 1 and k.name in products]
    several = [(k, cycles) for k, cycles, is_tuple in costed if is_tuple]
    alone = [
        (k, cycles) for k, cycles, is_tuple in costed if not is_tuple and cycles / V5E_CLOCK > 4 * k.flops / V5E_BF16
    ]
    assert several and alone
    for k, cycles in several:
        assert k.seconds == pytest.approx(0.83 * cycles / V5E_CLOCK, rel=1e-9)
    for k, cycles in alone:  # (its roofline is at least its FLOPs at 0.8 of the peak)
        estimate, roofline = cycles / V5E_CLOCK, k.flops / (0.8 * V5E_BF16)
        assert roofline**0.85 * estimate**0.15 <= k.seconds < estimate


def _gru_gradient(p, xs):
    """A GRU cell scanned over `xs`, its loss differentiated: the loop's body runs small
    products and small elementwise kernels, its arrays in VMEM."""
    hidden = p["wh"].shape[0]
    wx, wh = p["wx"].astype(jnp.bfloat16), p["wh"].astype(jnp.bfloat16)

    def loss(p):
        def cell(h, x):
            gx = (x.astype(jnp.bfloat16) @ wx).astype(jnp.float32) + p["b"]
            gh = (h.astype(jnp.bfloat16) @ wh).astype(jnp.float32)
            r = jax.nn.sigmoid(gx[:, :hidden] + gh[:, :hidden])
            z = jax.nn.sigmoid(gx[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])
            h = (1 - z) * jnp.tanh(gx[:, 2 * hidden :] + r * gh[:, 2 * hidden :]) + z * h
            return h, h

        _, hs = jax.lax.scan(cell, jnp.zeros((xs.shape[1], hidden)), xs)
        return jnp.mean(hs**2)

    return jax.grad(loss)(p)


def _gru_time():
    hidden, features = 384, 64
    p = {
        "wx": jax.ShapeDtypeStruct((features, 3 * hidden), jnp.float32),
        "wh": jax.ShapeDtypeStruct((hidden, 3 * hidden), jnp.float32),
        "b": jax.ShapeDtypeStruct((3 * hidden,), jnp.float32),
    }
    return ts.cost(_gru_gradient, p, jax.ShapeDtypeStruct((128, 32, features), jnp.float32), target="v5e").time


def test_a_loop_bodys_kernel_that_reads_only_the_loops_counter_from_hbm_pays_no_latency():
    # Measured on the chip: a GRU's body writing its step's outputs into the stacked ones
    # (in VMEM; only the loop's counter in HBM) took 0.02-0.1 us a run, where a run that
    # reads or writes HBM in a loop's body costs 0.2 us besides its bytes.
    t = _gru_time()
    stacked = [k for k in t.kernels if k.op and "/while/body/" in k.op and k.op.endswith("/dynamic_update_slice")]
    assert stacked
    for k in stacked:
        assert k.seconds / k.runs < 300 / V5E_CLOCK, k


def test_a_loop_bodys_small_kernels_in_vmem_move_their_bytes_faster_than_the_top_levels():
    # Measured on the chip: a recurrent cell's elementwise kernels in VMEM, each under 1 MiB
    # a run, moved 7-17 TB/s (at the top of a program: 2-4 TB/s).
    t = _gru_time()
    body = [k for k in t.kernels if k.op and "transpose(jvp())/while/body/" in k.op and k.op.endswith("/mul")]
    assert body
    for k in body:
        assert k.bytes_accessed / k.seconds > 4e12, k


def _scanned_sine(length):
    def f(h, xs):
        h = h * 2.0
        h, _ = jax.lax.scan(lambda h, x: (jnp.sin(h) * x, None), h, xs)
        return jnp.cos(h)

    h, xs = jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((length, 8, 128), jnp.float32)
    return ts.cost(f, h, xs, target="v5e").time


def test_the_chip_idles_between_kernels_at_the_top_of_a_program_and_not_in_a_loops_body():
    # Measured on the chip: a step's time less its kernels' time in a profile is 0.23 ms and
    # 0.4 us for each kernel at the top of the program, nothing for a loop body's kernels.
    short, long = _scanned_sine(10), _scanned_sine(1000)
    gaps = []
    for t in (short, long):
        (between,) = [k for k in t.kernels if k.name == "between kernels"]
        assert between.kind == "launch" and between.op is None and between.runs >= 2  # (the multiply, the cosine)
        assert between.seconds == pytest.approx(between.runs * 600 / V5E_CLOCK)
        gaps.append(between)
    assert gaps[0] == gaps[1]  # none for a loop's runs, however many


def test_a_run_that_reads_device_memory_pays_its_latency_and_one_in_vmem_does_not():
    # Measured on the chip: a small kernel that reads or writes HBM took 0.4-0.6 us a run
    # besides its bytes; one whose operands stay in VMEM 0.01-0.05 us.
    t = _scanned_sine(1000)
    body = {k.op.rsplit("/", 1)[-1]: k for k in t.kernels if k.op and "/while/body/" in k.op}
    reads_xs, counter = body["mul"], body["add"]  # a slice of `xs` from HBM; the loop's counter(s)
    assert reads_xs.seconds / reads_xs.runs >= 0.15e-6
    assert counter.seconds / counter.runs <= 0.05e-6


class _Layer:
    """A pytree node registered outside JAX's own containers, as an equinox Module or an
    nnx Variable is: flattening it runs Python."""

    def __init__(self, w):
        self.w = w


jax.tree_util.register_pytree_node(_Layer, lambda layer: ((layer.w,), None), lambda _, children: _Layer(*children))


def _tiny_step(state, x):
    return jax.tree.map(lambda w: w * 0.9 + x, state), x


def test_a_step_shorter_than_its_hosts_call_waits_on_the_host():
    # Measured on the chip's host (benchmarks/steptime/host_calls.py, no compile beside the
    # calls): a call took 0.20 ms, 0.92 us for each array passed in, 3.9 us for each array
    # returned and 1.8 us for each node of a registered pytree type, in or out; a step whose
    # kernels take less runs at that pace.
    x = jax.ShapeDtypeStruct((), jnp.float32)
    as_dicts = {"layers": [{"w": jax.ShapeDtypeStruct((8,), jnp.float32)} for _ in range(100)]}
    as_nodes = {"layers": [_Layer(jax.ShapeDtypeStruct((8,), jnp.float32)) for _ in range(100)]}
    times = []
    for state in (as_dicts, as_nodes):
        t = ts.cost(_tiny_step, state, x, target="v5e").time
        arrays_in = arrays_out = 100 + 1
        nodes = 0 if state is as_dicts else 2 * 100
        host = 0.2017e-3 + arrays_in * 0.9231e-6 + arrays_out * 3.942e-6 + nodes * 1.783e-6
        (waiting,) = [k for k in t.kernels if k.name == "waiting on the host"]
        assert waiting.kind == "launch" and waiting.seconds > 0
        assert t.seconds == pytest.approx(host, rel=1e-9)
        assert sum(k.seconds for k in t.kernels) == pytest.approx(t.seconds, rel=1e-9)
        times.append(t.seconds)
    assert times[1] > times[0]
    # a step whose kernels take longer does not wait
    long = ts.cost(scanned, *scanned_inputs(batch=4096), target="v5e").time
    assert not [k for k in long.kernels if k.name == "waiting on the host"]


def test_phases_are_named_as_the_timeline_names_them_and_add_up():
    def f(x):
        with jax.named_scope("first"):
            x = jnp.sin(x) @ x
        with jax.named_scope("second"):
            return jnp.cos(x) @ x

    x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    c = ts.cost(f, x, target="v5e")
    phases = c.time.phases()
    # named tuples, as the timeline's phases are
    assert all(type(p) is ts.PhaseTime for p in phases) and ts.PhaseTime._fields == ("name", "seconds")
    names = [p.name for p in phases]
    # (the runtime's time between two steps is a phase of its own, the last)
    assert names[:2] == ["first", "second"] and names[-1] == "between steps"
    if c.timeline is not None:  # (none from the libtpu of jax 0.8.0)
        assert {p.name for p in c.timeline.phases()} <= set(names) | {"(XLA's own)"}
    assert sum(p.seconds for p in phases) == pytest.approx(c.time.seconds)
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        c.time.phases(0)


@needs_cuda_release
def test_an_nvidia_target_gives_its_floor_and_no_estimate():
    w, x = scanned_inputs()
    c = ts.cost(scanned, w, x, donate_argnums=0, target="h100")
    t = c.time
    assert t.seconds is None and t.compiler_seconds is None and t.mfu is None
    assert c.flops / 989.4e12 <= t.floor_seconds
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.floor_seconds, rel=1e-9)
    assert "roofline floor only" in t.source
    assert "time at least" in str(c)


V5E_LINK = 4.5e10  # bytes per second, one way, of one ICI link (the scaling book)
V5E_HOP = 1e-6


def _ring(n, nbytes, passes=1):
    """The standard ring's time of a collective over n devices: (n-1)/n of the whole
    array's bytes over one link, n-1 hops (an all-reduce: two passes)."""
    return passes * ((n - 1) / n * nbytes / V5E_LINK + (n - 1) * V5E_HOP)


def _fsdp_forward(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return x


def test_an_fsdp_step_pays_for_gathering_each_layers_weights_over_the_interconnect():
    # Eight v5e chips, each holding an eighth of each of 4 layers' 1024x1024 weights: each
    # layer's matrix is gathered whole before its product (libtpu writes the group by mesh
    # axes, `mesh['axis_0'=8,'axis_1'=1] {'axis_0'}`, and fuses a gather's transfers into
    # the products that run while it lasts): 2 MiB over the ring each, 48 us, where the
    # products take a few us.
    mesh = AbstractMesh((8,), ("fsdp",), axis_types=(AxisType.Auto,))
    layers, width = 4, 1024
    rows = NamedSharding(mesh, P("fsdp", None))
    params = [jax.ShapeDtypeStruct((width, width), jnp.bfloat16, sharding=rows)] * layers
    x = jax.ShapeDtypeStruct((8 * 64, width), jnp.bfloat16, sharding=rows)
    t = ts.cost(_fsdp_forward, params, x, target="v5e:2x4").time
    gathers = layers * _ring(8, width * width * 2)
    assert gathers + 0.23e-3 <= t.seconds <= 1.2 * (gathers + 0.23e-3)  # (each gather counted once)
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.seconds, rel=1e-9)


def test_a_collective_over_one_axis_of_a_mesh_is_costed_over_that_axis():
    # An all-reduce over the 2 devices of the `data` axis of a 2x4 mesh: libtpu writes its
    # group by mesh axes; 4 MiB a device, twice over the link.
    mesh = AbstractMesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    x = jax.ShapeDtypeStruct((2, 4 * 2**20), jnp.float32, sharding=NamedSharding(mesh, P("data", "model")))
    t = ts.cost(lambda x: x.sum(0), x, target="v5e:2x4").time
    (reduced,) = [k for k in t.kernels if k.kind == "collective"]
    assert reduced.seconds == pytest.approx(_ring(2, 2**20 * 4, passes=2), rel=1e-9)


def test_a_collective_permute_is_costed_over_its_link():
    # Each of 8 devices sends its 512 KiB block to the next: one link, one hop.
    mesh = AbstractMesh((8,), ("d",), axis_types=(AxisType.Explicit,))
    ring = [(i, (i + 1) % 8) for i in range(8)]
    shifted = jax.shard_map(lambda x: jax.lax.ppermute(x, "d", ring), in_specs=P("d"), out_specs=P("d"))
    x = jax.ShapeDtypeStruct((8 * 128, 1024), jnp.float32, sharding=NamedSharding(mesh, P("d")))
    t = ts.cost(shifted, x, target="v5e:2x4").time
    (permute,) = [k for k in t.kernels if k.kind == "collective"]
    assert permute.seconds == pytest.approx(128 * 1024 * 4 / V5E_LINK + V5E_HOP, rel=1e-9)


@needs_cuda_release
def test_an_nvidia_steps_kernels_sum_to_its_floor_with_its_asynchronous_collectives():
    # XLA:GPU runs an FSDP step's reduce-scatter asynchronously (an `async-start` that
    # wraps it): a collective, in the floor and in the kernels alike.
    mesh = AbstractMesh((8,), ("fsdp",), axis_types=(AxisType.Auto,))

    def step(params, x):
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(lambda p: _fsdp_forward(p, x).sum())(params))

    params = [jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp", None)))] * 3
    x = jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp", None)))
    t = ts.cost(step, params, x, donate_argnums=0, target="h100").time
    assert t.seconds is None
    assert sum(k.seconds for k in t.kernels) == pytest.approx(t.floor_seconds, rel=1e-9)
    assert "collective" in {k.kind for k in t.kernels} and "async copy" not in {k.kind for k in t.kernels}


def _branches(i, x):
    """Three branches: a product, a sine, and two products (the most costly), chosen at run time."""
    return jax.lax.switch(i, [lambda x: x @ x, jnp.sin, lambda x: (x @ x) @ x], x)


@pytest.mark.parametrize("target", ["v5e", pytest.param("h100", marks=needs_cuda_release)])
def test_a_conditional_counts_its_most_costly_branch(target):
    i, x = jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    t = ts.cost(_branches, i, x, target=target).time
    ops = {k.op for k in t.kernels if k.op and "/cond/" in k.op}
    assert ops and all("/branch_2_fun/" in op for op in ops)
    (products,) = [k for k in t.kernels if k.op and k.op.endswith("branch_2_fun/dot_general")]
    assert products.runs == 2
    assert "each conditional counted at its most costly branch" in t.source
    assert "loop of unknown trip count" not in t.source
    total = t.seconds if t.seconds is not None else t.floor_seconds
    assert sum(k.seconds for k in t.kernels) == pytest.approx(total, rel=1e-9)


def test_the_cpu_without_a_target_has_no_time():
    w, x = scanned_inputs(width=64, batch=8)
    assert ts.cost(scanned, w, x).time is None


def test_a_chip_never_measured_says_its_correction_came_from_a_v5e():
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16)
    t = ts.cost(lambda a: a @ a, x, target="v6e").time
    assert "measured on a v5e (this chip is not measured)" in t.source
    assert t.floor_seconds <= t.seconds


def test_asking_again_compiles_nothing(compiles):
    w, x = scanned_inputs(width=128, batch=64)
    first = ts.cost(scanned, w, x, target="v5e")
    before = len(compiles)
    again = ts.cost(scanned, w, x, target="v5e")
    assert len(compiles) == before and again.time == first.time


def test_the_command_line_prints_the_kernels_and_the_json(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "timed.py").write_text("import jax.numpy as jnp\n\ndef f(a, b):\n    return jnp.tanh(a @ b)\n")
    assert main(["cost", "timed:f", "bf16[512,512]", "bf16[512,512]", "--target", "v5e", "--time"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^time \S+ us per step on TPU v5e", out, flags=re.M)
    assert re.search(r"^kernel +source +runs +seconds +share$", out, flags=re.M)
    assert main(["cost", "timed:f", "bf16[512,512]", "bf16[512,512]", "--target", "v5e", "--json"]) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    assert {"seconds", "compiler_seconds", "floor_seconds", "mfu", "source", "kernels", "checked"} == set(time)
    assert time["checked"] == pytest.approx(1.0) and "100% of this step in kinds measured there" in time["source"]
    assert sum(k["seconds"] for k in time["kernels"]) == pytest.approx(time["seconds"])
