"""`Cost.timeline`: the bytes live at each step of a compiled program's schedule.

The oracle is XLA's own account of the same compiled program: the programs of
`timeline_programs.py` are costed in a child process whose XLA_FLAGS make XLA dump its
buffer assignment, the live range of every value on the flattened schedule (its
`-live-range.txt`, with the instruction sequence that numbers the steps) and the
optimized HLO. From those files alone (read by `test_buffers.read_dump`, which on a
release that writes no live ranges follows XLA's rules from its positions and uses) the
bytes live at every step are computed, per allocation the union of the live values'
bytes, and compared with what `ts.cost` read from the compiled program.
"""

import dataclasses
import pathlib
import re
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from test_buffers import op_names, read_dump, run_with_xla_dump

import treeshape as ts


HERE = pathlib.Path(__file__).parent
F32 = jnp.float32


@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    """What `cost.timeline` says of each program of `timeline_programs.py`, and XLA's dump."""
    dump = tmp_path_factory.mktemp("xla_dump")
    return run_with_xla_dump(HERE / "timeline_programs.py", dump), dump


PROGRAMS = [
    "mlp_step",
    "optax_update",
    "scan_layers",
    "scan_layers_long",
    "while_carry",
    "nested_loops",
    "cond_step",
    "sharded_step",
]


def xla_live(dump, name, steps):
    """Per step, the bytes live and the values holding them (each with the bytes it adds, the
    one defined last first), from XLA's live ranges and buffer assignment alone."""
    values, end_time, allocations, _ = read_dump(dump, name)
    assert end_time == steps  # the time after the last step ends the entry's parameters and outputs
    ranged = [v for v in values.values() if v.start >= 0 and "thread-local" not in allocations[v.allocation]]
    extent = {}
    for v in ranged:
        extent[v.allocation] = max(extent.get(v.allocation, 0), v.offset + v.size)
    out = []
    for t in range(steps):
        covered = {a: np.zeros(n, bool) for a, n in extent.items()}
        total, listed = 0, []
        for v in sorted(ranged, key=lambda v: (-v.start, -v.id)):
            if v.start <= t <= min(v.end, steps - 1):  # time `steps` is no step: live at the last
                mask = covered[v.allocation][v.offset : v.offset + v.size]
                new = int((~mask).sum())
                mask[:] = True
                if new:
                    total += new
                    listed.append((new, v.shape))
        out.append((total, listed))
    return out


def _shape(b):
    return None if b[1] is None else tuple(b[1])


@pytest.mark.parametrize("name", PROGRAMS)
def test_bytes_live_at_every_step_are_xla_s(costed, name):
    reports, dump = costed
    ours = reports[name]
    theirs = xla_live(dump, name, len(ours["live_bytes"]))
    assert ours["live_bytes"] == [total for total, _ in theirs]
    assert max(ours["live_bytes"]) == ours["live_peak_bytes"] == ours["live_bytes"][ours["peak_step"]]
    assert ours["peak_step"] == ours["live_bytes"].index(max(ours["live_bytes"]))
    kinds = ours["by_kind"]
    assert sorted(kinds) == ["argument", "constant", "output", "temporary"]
    assert [sum(k) for k in zip(*kinds.values(), strict=True)] == ours["live_bytes"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_buffers_at_a_step_are_xla_s(costed, name):
    reports, dump = costed
    ours = reports[name]
    theirs = xla_live(dump, name, len(ours["live_bytes"]))
    for step, buffers in ours["buffers_at"].items():
        expected = sorted((n, str(shape)) for n, shape in theirs[int(step)][1])
        assert sorted((b[0], str(_shape(b))) for b in buffers) == expected, step
        assert [b[0] for b in buffers] == sorted((b[0] for b in buffers), reverse=True)
        kinds = {k: v[int(step)] for k, v in ours["by_kind"].items()}
        assert {k: sum(b[0] for b in buffers if b[2] == k) for k in kinds} == kinds
    assert ours["buffers_at"][str(ours["peak_step"])] == ours["buffers"]


def _sequence(dump, name):
    """XLA's numbering of the steps (its `HloLiveRange` instruction sequence), where written."""
    stem = sorted(dump.glob(f"module_*.jit_{name}.cpu_after_optimizations-live-range.txt"))
    if not stem:
        return None
    return re.findall(r"^    \d+:(\S+)$", stem[-1].read_text().split("BufferLiveRange", 1)[0], re.M)


@pytest.mark.parametrize("name", PROGRAMS)
def test_each_step_s_op_is_its_instruction_s(costed, name):
    """The op of step t is the metadata of the instruction XLA numbers t (where XLA writes
    its numbering), and the phases cover the steps in order, named by those ops."""
    reports, dump = costed
    ours = reports[name]
    n = len(ours["ops"])
    sequence = _sequence(dump, name)
    if sequence is not None:  # jax 0.9 and newer
        assert len(sequence) == n
        names = op_names(read_dump(dump, name)[3])
        parameters = set(re.findall(r"^\s*%(\S+) = [^=]*? parameter\(", read_dump(dump, name)[3], re.M))
        for t, op in enumerate(ours["ops"]):
            said = names.get(sequence[t])
            if op is not None:
                assert said == op, t
            else:  # no operation under the outermost jit(...): a parameter, or XLA's own
                assert sequence[t] in parameters or said is None or "/" not in said.split(";")[0], t
    for depth in ("1", "2"):
        phases = ours["phases"][depth]
        assert phases[0][1] == 0 and phases[-1][2] == n
        assert all(a[2] == b[1] for a, b in zip(phases, phases[1:], strict=False))
        assert all(a[0] != b[0] for a, b in zip(phases, phases[1:], strict=False))
        for name_, start, stop, peak in phases:
            assert peak == max(ours["live_bytes"][start:stop])
            for op in ours["ops"][start:stop]:
                if op is not None:
                    assert "/".join(op.split("/")[1:][: int(depth)]) == name_


def test_an_mlp_s_phases_are_its_layers_forward_and_backward(costed):
    reports, _ = costed
    ours = reports["mlp_step"]
    one = [p[0] for p in ours["phases"]["1"]]
    assert one[:3] == ["jvp(layers_0)", "jvp(layers_1)", "jvp(layers_2)"]
    assert {"transpose(jvp(layers_2))", "transpose(jvp(layers_1))", "transpose(jvp(layers_0))"} <= set(one)
    assert one.index("transpose(jvp(layers_2))") < one.index("transpose(jvp(layers_0))")
    two = {p[0] for p in ours["phases"]["2"]}
    assert {"jvp(layers_0)/dot_general", "jvp(layers_0)/tanh", "transpose(jvp(layers_1))/dot_general"} <= two
    chart = ours["chart"].splitlines()
    assert len(chart) == len(ours["phases"]["1"]) + 1 <= 24
    marked = [line for line in chart if line.endswith("<- peak")]
    peak = ours["peak_step"]
    (holder,) = [p for p in ours["phases"]["1"] if p[1] <= peak < p[2]]
    assert len(marked) == 1 and f" {holder[0]} " in marked[0]
    assert f"at step {peak} ({holder[0]})" in chart[0]


def test_a_scan_s_body_appears_once_whatever_its_trip_count(costed):
    reports, _ = costed
    four, sixteen = reports["scan_layers"], reports["scan_layers_long"]
    assert len(four["live_bytes"]) == len(sixteen["live_bytes"])
    renamed = [None if op is None else op.replace("scan_layers_long", "scan_layers") for op in sixteen["ops"]]
    assert four["ops"] == renamed
    # The stacked weights and their gradient: 12 more layers of 256 KiB each, all live at the peak.
    assert sixteen["live_peak_bytes"] - four["live_peak_bytes"] >= 2 * 12 * 256 * 256 * 4
    assert any("while/body" in op for op in four["ops"] if op)


def test_a_sharded_step_is_counted_per_device(costed):
    reports, _ = costed
    ours = reports["sharded_step"]
    args = [b for b in ours["buffers"] if b[2] == "argument"]
    assert sorted(_shape(b) for b in args) == [(8, 256), (256, 64)]  # x and w, one device's shards


def test_a_donated_update_reuses_its_inputs(costed):
    reports, _ = costed
    ours = reports["optax_update"]
    # params and both moments donated: their outputs take their buffers, so at no step are
    # both an input leaf and its output live apart. Without donation, more would be.
    undonated = ts.cost(
        lambda p, s, g: _optax_update(p, s, g),
        {"w": jax.ShapeDtypeStruct((512, 512), F32), "b": jax.ShapeDtypeStruct((512,), F32)},
        _adam_state(),
        {"w": jax.ShapeDtypeStruct((512, 512), F32), "b": jax.ShapeDtypeStruct((512,), F32)},
    )
    assert ours["live_peak_bytes"] < undonated.live_peak_bytes


def _optax_update(p, s, g):
    import optax

    updates, s = optax.adam(1e-3).update(g, s, p)
    return optax.apply_updates(p, updates), s


def _adam_state():
    import optax

    params = {"w": jax.ShapeDtypeStruct((512, 512), F32), "b": jax.ShapeDtypeStruct((512,), F32)}
    return jax.eval_shape(optax.adam(1e-3).init, params)


# -- in this process ---------------------------------------------------------------------------
def _deep(n):
    def step(ws, x):
        def loss(ws):
            h = x
            for i, w in enumerate(ws):
                with jax.named_scope(f"block_{i}"):
                    h = jnp.sin(h @ w)
            return jnp.sum(h**2)

        return jax.grad(loss)(ws)

    return ts.cost(step, [jax.ShapeDtypeStruct((128, 128), F32)] * n, jax.ShapeDtypeStruct((32, 128), F32))


def test_a_chart_of_many_phases_takes_equal_runs_of_steps_in_24_lines():
    t = _deep(30).timeline
    assert len(t.phases()) > 23
    lines = str(t).splitlines()
    assert len(lines) <= 24
    n = len(t.live_bytes)
    width = -(-n // 23)
    rows = lines[1:]
    assert len(rows) == -(-n // width)
    marked = [k for k, line in enumerate(rows) if line.endswith("<- peak")]
    assert marked == [t.peak_step // width]
    bars = [line.split()[-1] if not line.endswith("<- peak") else line.split()[-3] for line in rows]
    assert bars[marked[0]] == "#" * 30


def test_buffers_at_a_step_out_of_range_names_the_length():
    t = _deep(2).timeline
    n = len(t.live_bytes)
    for step in (n, -1, n + 5):
        with pytest.raises(IndexError, match=rf"outside this timeline's {n} steps: give 0 <= step < {n}"):
            t.buffers_at(step)
    assert t.buffers_at(n - 1) and t.buffers_at(0)


def test_buffers_at_takes_any_integral_step_and_refuses_others():
    t = _deep(2).timeline
    at_peak = t.buffers_at(t.peak_step)
    assert t.buffers_at(np.argmax(t.live_bytes)) == at_peak
    assert t.buffers_at(np.int64(t.peak_step)) == t.buffers_at(np.int32(t.peak_step)) == at_peak
    for bad in (0.5, float(t.peak_step), "3", None, True, np.float64(1)):
        with pytest.raises(TypeError, match=r"step must be an integer, 0 <= step < \d+ \(a Python or NumPy int\)"):
            t.buffers_at(bad)


def test_phases_depth_must_be_a_positive_int():
    t = _deep(2).timeline
    for depth in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="depth must be an int >= 1"):
            t.phases(depth)


def test_the_timeline_is_none_exactly_where_the_buffers_are():
    by_hand = ts.Cost(1.0, 1, 1, 1, 0, 0, 2, None)
    assert by_hand.buffers is None and by_hand.timeline is None
    c = _deep(2)
    assert c.buffers is not None and c.timeline is not None
    assert c == dataclasses.replace(c, timeline=None) and hash(c) == hash(dataclasses.replace(c, timeline=None))
    assert "timeline=" not in repr(c)


def test_largest_fit_carries_the_timeline_and_names_the_phase_of_its_peak():
    def mlp(w1, w2, x):
        with jax.named_scope("hidden"):
            h = jnp.tanh(x @ w1)
        with jax.named_scope("head"):
            return h @ w2

    w1, w2 = jax.ShapeDtypeStruct((784, 512), F32), jax.ShapeDtypeStruct((512, 10), F32)
    x = jax.ShapeDtypeStruct((jax.export.symbolic_shape("b")[0], 784), F32)
    fit = ts.largest_fit(mlp, w1, w2, x, dim="b", budget=4 * 2**20)
    t = fit.cost.timeline
    assert max(t.live_bytes) == fit.cost.live_peak_bytes and t.buffers_at(t.peak_step) == fit.cost.buffers
    phase = next(p for p in t.phases() if p.start <= t.peak_step < p.stop)
    assert phase.name in ("hidden", "head")
    said = f"the peak is at step {t.peak_step} of {len(t.live_bytes)}, in {phase.name} "
    assert said in str(fit) and said in fit._repr_html_()
    capped = ts.largest_fit(mlp, w1, w2, x, dim="b", budget=2**40, max_size=8)
    assert capped.capped and "the peak is at step" not in str(capped)


def test_a_wrapper_s_own_jit_names_the_ops():
    @jax.jit
    def step(w, x):
        with jax.named_scope("layer"):
            return jnp.tanh(x @ w)

    t = ts.cost(step, jnp.zeros((64, 64)), jnp.zeros((8, 64))).timeline
    assert all(op.startswith("jit(step)/layer/") for op in t.ops if op is not None)
    assert [p.name for p in t.phases()] == ["layer"]


def test_a_program_jitted_around_the_user_s_jit_names_every_op_as_the_user_s_own_program():
    """Where `ts.cost` adds a donation, it jits its own program around the user's `jax.jit`
    wrapper (the outer `jit(step)` is ours): the buffers, the steps of the timeline and the
    kernels of its time are named as the wrapper's own program names them, as they are read
    (the same compile for v5e: the same names, sources, phases and seconds)."""

    def step(w, xs):
        def loss(w):
            def body(total, x):
                with jax.named_scope("layer"):
                    return total + jnp.sum(jnp.tanh(x @ w) ** 2), None

            return jax.lax.scan(body, 0.0, xs)[0]

        return w - 0.1 * jax.grad(loss)(w)

    w, xs = jax.ShapeDtypeStruct((128, 128), F32), jax.ShapeDtypeStruct((4, 16, 128), F32)
    jitted = jax.jit(step, donate_argnums=0)
    # (x32: under jax_enable_x64 the two programs' scan counters are named apart, not yet read)
    with jax.enable_x64(False):
        own = ts.cost(jitted, w, xs, target="v5e")  # the wrapper's own program
        around = ts.cost(jitted, w, xs, donate_argnums=0, target="v5e")  # ours, around it
    assert around == own and around.time.seconds == own.time.seconds
    steps: list = []
    if own.timeline is not None:  # (none from the libtpu of jax 0.8.0, which writes no live ranges)
        assert around.timeline.ops == own.timeline.ops and around.timeline.phases() == own.timeline.phases()
        assert [(b.op, b.source) for b in around.buffers] == [(b.op, b.source) for b in own.buffers]
        steps = list(around.timeline.ops)
    kernels = [(k.op, k.source, k.name, k.kind, k.runs, k.seconds) for k in around.time.kernels]
    assert kernels == [(k.op, k.source, k.name, k.kind, k.runs, k.seconds) for k in own.time.kernels]
    assert around.time.schedule == own.time.schedule
    ops = [op for op in steps if op] + [k.op for k in around.time.kernels if k.op]
    assert ops and all(op.startswith("jit(step)/") and "jit(step)/jit(step)" not in op for op in ops)
    assert any("/layer/" in op for op in ops)


def test_a_pmapped_step_s_ops_are_its_program_s_and_its_phases_as_under_jit():
    def step(w, x):
        def loss(w):
            with jax.named_scope("layer"):
                return jnp.sum(jnp.tanh(x @ w) ** 2)

        return jax.grad(loss)(w)

    w, x = jax.ShapeDtypeStruct((64, 64), F32), jax.ShapeDtypeStruct((8, 64), F32)
    jitted = ts.cost(jax.jit(step), w, x).timeline
    pmapped = jax.pmap(step)  # named `pmap(step)/...` by the user's function (jax 0.8.0's wrapper is `wrapped`)
    c = ts.cost(pmapped, *(jax.ShapeDtypeStruct((2, *a.shape), F32) for a in (w, x)))
    ops = [op for op in c.timeline.ops if op is not None] + [b.op for b in c.buffers if b.op is not None]
    assert ops and all(op.startswith("pmap(step)/") for op in ops)
    assert [p.name for p in c.timeline.phases()] == [p.name for p in jitted.phases()]
    assert [p.name for p in jitted.phases()] == ["jvp(layer)", "transpose(jvp(layer))"]


def _far_step(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


def test_a_simulated_mesh_has_its_timeline_per_device():
    from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

    mesh = AbstractMesh((16,), ("d",), axis_types=(AxisType.Auto,))
    w = jax.ShapeDtypeStruct((256, 512), F32, sharding=NamedSharding(mesh, P(None, "d")))
    x = jax.ShapeDtypeStruct((64, 256), F32, sharding=NamedSharding(mesh, P("d", None)))
    c = ts.cost(_far_step, w, x)
    assert c.backend == "cpu x16 (simulated)"
    t = c.timeline
    assert max(t.live_bytes) == c.live_peak_bytes and t.buffers_at(t.peak_step) == c.buffers
    at_start = t.buffers_at(0)
    assert sorted(b.shape for b in at_start if b.kind == "argument") == [(4, 256), (256, 32)]  # one device's shards
    assert all(t.by_kind["argument"][s] == (4 * 256 + 256 * 32) * 4 for s in range(len(t.live_bytes)))


@pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 10),
    reason="jax < 0.10: NVIDIA targets are a JaxReleaseError",
)
def test_a_target_s_program_has_its_timeline():
    c = ts.cost(_far_step, jax.ShapeDtypeStruct((256, 512), F32), jax.ShapeDtypeStruct((64, 256), F32), target="h100")
    assert c.backend == "H100 x1 (deviceless)"
    t = c.timeline
    assert max(t.live_bytes) == c.live_peak_bytes and t.buffers_at(t.peak_step) == c.buffers
    assert [sum(k) for k in zip(*t.by_kind.values(), strict=True)] == list(t.live_bytes)
    assert {p.name for p in t.phases()} <= {"jvp()", "transpose(jvp())"}


@settings(max_examples=15, deadline=None)
@given(
    depth=st.integers(1, 4),
    width=st.sampled_from([16, 48, 128]),
    batch=st.integers(1, 33),
    donate=st.booleans(),
    scan=st.booleans(),
)
def test_the_timeline_adds_up_whatever_the_step(depth, width, batch, donate, scan):
    """At every step the kinds add up to the bytes live, the buffers live add up to them, and
    the peak is the first step with the most, the one `Cost.buffers` lists."""

    def loss(ws, x):
        if scan:
            x, _ = jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)
        else:
            for i in range(depth):
                with jax.named_scope(f"layers_{i}"):
                    x = jnp.tanh(x @ ws[i])
        return jnp.mean(x**2)

    def step(ws, x):
        value, grads = jax.value_and_grad(loss)(ws, x)
        return ws - 0.1 * grads, value

    ws = jax.ShapeDtypeStruct((depth, width, width), F32)
    c = ts.cost(step, ws, jax.ShapeDtypeStruct((batch, width), F32), donate_argnums=(0,) if donate else ())
    t = c.timeline
    n = len(t.live_bytes)
    assert len(t.ops) == n and all(len(v) == n for v in t.by_kind.values())
    assert tuple(t.by_kind) == typing.get_args(typing.get_type_hints(ts.Buffer)["kind"])  # every kind, in order
    assert [sum(k) for k in zip(*t.by_kind.values(), strict=True)] == list(t.live_bytes)
    assert t.peak_step == t.live_bytes.index(max(t.live_bytes)) and max(t.live_bytes) == c.live_peak_bytes
    assert t.buffers_at(t.peak_step) == c.buffers
    for s in {0, n // 2, n - 1}:
        assert sum(b.nbytes for b in t.buffers_at(s)) == t.live_bytes[s]
    assert t.by_kind["argument"][0] == (batch * width + depth * width * width) * 4  # both inputs, from the start
    phases = t.phases()
    assert phases[0].start == 0 and phases[-1].stop == n and len(str(t).splitlines()) <= 24


def test_a_grouped_op_is_named_by_its_first_member():
    """XLA names a multi-output fusion `jit(step)/(a:b:c)` and a combined collective
    `(a, b)`: the phase is the first member's, its own parentheses kept (seen on the
    "Will it fit?" guide's scanned train step)."""
    ops = (
        None,
        "jit(step)/(transpose(jvp())/scatter-add:transpose(jvp())/reduce_sum:jvp()/reduce_sum)",
        "(jvp(block)/all-gather, jvp(block)/all-gather)",
        "jit(step)/jvp()/(dot_general:reduce_sum)",
        "jit(step)/add;jit(step)/mul",
    )
    live = (1, 3, 2, 5, 4)
    t = ts.Timeline(live_bytes=live, by_kind={"temporary": live}, ops=ops, peak_step=3)
    assert t.phases() == (
        ts.Phase("transpose(jvp())", 0, 2, 3),
        ts.Phase("jvp(block)", 2, 3, 2),
        ts.Phase("jvp()", 3, 4, 5),
        ts.Phase("add", 4, 5, 4),
    )
    assert t.phases(depth=2)[2] == ts.Phase("jvp()/(dot_general:reduce_sum)", 3, 4, 5)
