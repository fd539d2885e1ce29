"""`Cost.buffers`, `Cost.donation`, `Cost.breakdown`: what is at a program's peak.

The oracle is XLA's own account of the same compiled program: the programs of
`buffer_programs.py` are costed in a child process whose XLA_FLAGS make XLA dump, for
each, its buffer assignment (allocations, each value's offset and size), the live range
of every value on the flattened schedule, and the optimized HLO (each instruction's
metadata). From those files alone the live set at the peak step is computed (per
allocation, the union of the bytes of the values live at a step; shared bytes once, the
value defined last listed) and compared with what `ts.cost` read from the compiled
program.
"""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


HERE = pathlib.Path(__file__).parent


# -- XLA's dump ----------------------------------------------------------------------------
@dataclasses.dataclass
class DumpedValue:
    id: int
    name: str  # instruction{index}, as the live-range file names it
    allocation: int
    offset: int
    size: int
    shape: tuple[int, ...] | None  # None: a tuple
    start: int = -1
    end: int = -1


_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(r"^ value: <(\d+) ([^\s{]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_RANGE = re.compile(r"^    (\S+\{[\d,]*\}):(\d+)-(\d+)$")
_MAX = re.compile(r"^HloLiveRange \(max (\d+)\):")


def _dims(shape_text: str) -> tuple[int, ...] | None:
    if shape_text.startswith("("):  # a tuple: XLA's table of its buffers
        return None
    match = re.match(r"^[a-z0-9]+\[([\d,]*)\]", shape_text)
    if match is None:
        return ()
    return tuple(int(d) for d in match.group(1).split(",") if d)


def read_dump(directory: pathlib.Path, name: str) -> tuple[dict[str, DumpedValue], int, dict[int, str], str]:
    """The values of program `name` (by instruction{index}) with their live ranges, the
    schedule's end, each allocation's description, and the optimized HLO text.

    The live ranges are XLA's own (its `-live-range.txt`) where XLA writes them (jax 0.9
    and newer); before, they follow XLA's rules from what XLA wrote: each value's
    positions and uses, and the schedule of the optimized HLO (`live_ranges_from_uses`)."""
    stem = sorted(directory.glob(f"module_*.jit_{name}.cpu_after_optimizations-buffer-assignment.txt"))[-1]
    prefix = str(stem)[: -len("-buffer-assignment.txt")]
    values: dict[str, DumpedValue] = {}
    allocations: dict[int, str] = {}
    allocation = -1
    text = stem.read_text()
    for line in text.splitlines():
        if m := _ALLOCATION.match(line):
            allocation = int(m.group(1))
            allocations[allocation] = m.group(3)
        elif m := _VALUE.match(line):
            key = m.group(2) + (m.group(3) or "{}")
            shape = _dims(m.group(6))
            values[key] = DumpedValue(int(m.group(1)), key, allocation, int(m.group(5)), int(m.group(4)), shape)
        elif line.startswith("Total bytes used"):
            break
    hlo = pathlib.Path(prefix + ".txt").read_text()
    live_range = pathlib.Path(prefix + "-live-range.txt")
    if not live_range.exists():
        values_file = pathlib.Path(prefix + "-buffer-assignment-values.txt")
        used = values_file.read_text() if values_file.exists() else text.split("Used values:", 1)[1]
        return values, live_ranges_from_uses(values, used, hlo), allocations, hlo
    end_time = -1
    for line in live_range.read_text().splitlines():
        if m := _MAX.match(line):
            end_time = int(m.group(1))
        elif (m := _RANGE.match(line)) and m.group(1) in values:
            values[m.group(1)].start, values[m.group(1)].end = int(m.group(2)), int(m.group(3))
        elif line.startswith("  Live ranges at"):
            break
    return values, end_time, allocations, hlo


_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^  (ROOT )?%(\S+) = (.*)$")
_OPCODE = re.compile(r"\s([a-z][a-z0-9-]*)\(")
_CALLED = re.compile(r"(?:condition|body|to_apply|true_computation|false_computation)=%([\w.-]+)")
_USED_VALUE = re.compile(r"^<(\d+) ([^\s{]+)(\{[\d,]*\})?(?: \(phi\))? @\d+>$")


def live_ranges_from_uses(values: dict[str, DumpedValue], used: str, hlo: str) -> int:
    """Set each value's live range from XLA's positions and uses of it and the optimized
    HLO's schedule, by XLA's `HloLiveRange` rules: the schedule flattened (a while's
    condition and body, a call's computation, before the instruction), a value live from its
    definition (a parameter from its computation's start) to its last position (a root: its
    computation's end) or use (a while's operand: until the loop starts), a while
    condition's parameter until the body starts, an entry parameter that no output
    aliases to the end. On jax 0.10.2 this gives XLA's own live ranges of every program of
    `buffer_programs.py`. Returns the schedule's end."""
    computations: dict[str, list[tuple[str, str, list[str], bool]]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        if m := _COMPUTATION.match(line):
            current = computations.setdefault(m.group(2), [])
            entry = m.group(2) if m.group(1) else entry
        elif current is not None and (m := _INSTRUCTION.match(line)):
            rhs = m.group(3)
            opcode = _OPCODE.search(" " + rhs)
            called = _CALLED.findall(rhs)
            if "branch_computations={" in rhs:
                called += re.findall(r"%([\w.-]+)", rhs.split("branch_computations={", 1)[1].split("}", 1)[0])
            current.append((m.group(2), opcode.group(1) if opcode else "", called, bool(m.group(1))))
    time: dict[str, int] = {}
    spans: dict[str, tuple[int, int]] = {}
    parent: dict[str, str] = {}
    roots: set[str] = set()

    body_of: dict[str, str] = {}  # a while's condition -> its body

    def flatten(computation: str) -> None:
        start = len(time)
        for instruction, opcode, called, root in computations[computation]:
            if opcode == "while":
                condition = [c for c in called if "condition=%" + c in hlo]
                for c in sorted(called, key=lambda c: c not in condition):
                    flatten(c)
                body_of.update({c: b for c in condition for b in called if b not in condition})
            elif opcode in ("call", "conditional"):
                for c in called:
                    flatten(c)
            time[instruction], parent[instruction] = len(time), computation
            if root:
                roots.add(instruction)
        spans[computation] = (start, len(time))

    flatten(entry)
    while_start = {
        i: min(spans[c][0] for c in called)
        for comp in computations.values()
        for i, opcode, called, _ in comp
        if opcode == "while" and called
    }
    header = hlo.split("\n", 1)[0]
    aliased = {int(p) for p in re.findall(r"\{[\d,]*\}: \((\d+), \{[\d,]*\}, (?:may|must)-alias\)", header)}
    parameters = {i: int(n) for i, n in re.findall(r"^  %(\S+) = .* parameter\((\d+)\)", hlo, re.M)}
    by_id = {v.id: v for v in values.values()}
    value, section = None, ""
    end_time = len(time)
    for line in used.splitlines():
        if m := _USED_VALUE.match(line):
            value = by_id.get(int(m.group(1)))
            name = m.group(2)
            if value is not None and name in time:
                entry_parameter = name in parameters and parent[name] == entry
                value.start = spans[parent[name]][0] if name in parameters else time[name]
                value.end = spans[parent[name]][1] if name in roots else time[name]
                if entry_parameter and parameters[name] not in aliased:
                    value.end = end_time
                if name in parameters and parent[name] in body_of:  # XLA keeps a condition's
                    value.end = spans[body_of[parent[name]]][0]  # parameter until the body starts
            section = ""
        elif line.strip() in ("positions:", "uses:"):
            section = line.strip()
        elif line.startswith("  ") and value is not None and value.start >= 0:
            where = line.strip().split(",")[0].split(" ")[0]
            if where not in time:
                continue
            if section == "positions:":
                value.end = max(value.end, spans[parent[where]][1] if where in roots else time[where])
            elif section == "uses:":
                value.end = max(value.end, while_start.get(where, time[where]))
    return end_time


def peak_from_live_ranges(values: dict[str, DumpedValue], end_time: int, allocations: dict[int, str]):
    """The live set at the peak step, computed from XLA's live ranges and allocations alone."""
    ranged = [v for v in values.values() if v.start >= 0 and "thread-local" not in allocations[v.allocation]]
    best, best_listed = -1, []
    for t in range(end_time + 1):
        live = sorted((v for v in ranged if v.start <= t <= v.end), key=lambda v: (-v.start, -v.id))
        covered: dict[int, np.ndarray] = {}
        total, listed = 0, []
        for v in live:
            size = max((w.offset + w.size for w in ranged if w.allocation == v.allocation), default=0)
            mask = covered.setdefault(v.allocation, np.zeros(size, bool))
            new = int((~mask[v.offset : v.offset + v.size]).sum())
            mask[v.offset : v.offset + v.size] = True
            if new:
                total += new
                listed.append((v, new))
        if total > best:
            best, best_listed = total, listed
    return best, best_listed


def op_names(hlo_text: str) -> dict[str, str]:
    """Each instruction of the optimized HLO by name: its metadata's op_name."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%(\S+) = .*?metadata=\{op_name=\"([^\"]*)\"", hlo_text, re.M):
        out[m.group(1)] = m.group(2)
    return out


# -- the child process ----------------------------------------------------------------------
def run_with_xla_dump(script: pathlib.Path, dump: pathlib.Path) -> object:
    """Run `script` (it prints JSON as its last line) in a child process whose XLA dumps
    every compiled program's text into `dump`; what it printed."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text").strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,  # subprocess.run kills the child when this runs out
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child process costing the programs ran out of time: {e}")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    """What `ts.cost` reports for each program of `buffer_programs.py`, and XLA's dump directory."""
    dump = tmp_path_factory.mktemp("xla_dump")
    return run_with_xla_dump(HERE / "buffer_programs.py", dump), dump


def _shape_of(b):
    return None if b["shape"] is None else tuple(b["shape"])


PROGRAMS = [
    "optax_step",
    "nnx_grads",
    "eqx_grads",
    "plain_grads",
    "remat_grads",
    "scan_grads",
    "sharded_step",
    "cast_step",
]


@pytest.mark.parametrize("name", PROGRAMS)
def test_live_set_is_xla_s(costed, name):
    """Bytes at the peak, and the buffers listed (size and shape), as XLA's live ranges and
    buffer assignment give them."""
    reports, dump = costed
    ours = reports[name]
    values, end_time, allocations, _ = read_dump(dump, name)
    peak, listed = peak_from_live_ranges(values, end_time, allocations)
    assert ours["live_peak_bytes"] == peak
    assert sum(b["nbytes"] for b in ours["buffers"]) == peak
    assert ours["live_peak_bytes"] <= ours["peak_bytes"]
    assert sorted((b["nbytes"], str(_shape_of(b))) for b in ours["buffers"]) == sorted(
        (n, str(v.shape)) for v, n in listed
    )
    assert all((b["shape"] is None) == (b["dtype"] == "None") for b in ours["buffers"])
    sizes = [b["nbytes"] for b in ours["buffers"]]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_oracle_s_own_live_ranges_are_xla_s(costed, name):
    """Where XLA writes its live ranges, the rules the oracle follows where it does not
    (`live_ranges_from_uses`, from XLA's positions and uses) give the same ones."""
    _, dump = costed
    values, end_time, _, hlo = read_dump(dump, name)
    stem = str(sorted(dump.glob(f"module_*.jit_{name}.cpu_after_optimizations-buffer-assignment.txt"))[-1])
    used = pathlib.Path(stem.replace("-buffer-assignment.txt", "-buffer-assignment-values.txt"))
    if not pathlib.Path(stem.replace("-buffer-assignment.txt", "-live-range.txt")).exists():
        pytest.skip("XLA writes no live ranges on this release: the oracle's rules are what there is")
    fresh = {k: DumpedValue(v.id, v.name, v.allocation, v.offset, v.size, v.shape) for k, v in values.items()}
    assert live_ranges_from_uses(fresh, used.read_text(), hlo) == end_time
    assert {k: (v.start, v.end) for k, v in fresh.items()} == {k: (v.start, v.end) for k, v in values.items()}


@pytest.mark.parametrize("name", [p for p in PROGRAMS if p != "cast_step"])  # cast_step: no temporaries
def test_ops_and_sources_are_the_program_metadata_s(costed, name):
    """A temporary's op is the op_name XLA's optimized HLO gives an instruction of the program;
    its source is the line of `buffer_programs.py` that made it."""
    reports, dump = costed
    *_, hlo = read_dump(dump, name)
    names = set(op_names(hlo).values())
    temporaries = [b for b in reports[name]["buffers"] if b["kind"] == "temporary" and b["op"] is not None]
    assert temporaries
    for b in temporaries:
        assert b["op"] in names
        assert b["op"].startswith(f"jit({name})/")
        assert b["path"] is None
    sources = [b["source"] for b in temporaries if b["source"] is not None]
    assert sources and all(re.fullmatch(r"buffer_programs\.py:\d+", s) for s in sources)


def test_equinox_module_names_are_in_ops(costed):
    reports, _ = costed
    ops = [b["op"] for b in reports["eqx_grads"]["buffers"] if b["op"]]
    assert any("eqx.nn.Linear" in op for op in ops)


def test_arguments_and_outputs_are_named_by_their_paths(costed):
    reports, _ = costed
    params = {f"layer{i}": {"w": 0, "b": 0} for i in range(3)}
    inputs = {"args[0]" + jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    optax_buffers = reports["optax_step"]["buffers"]
    arguments = {b["path"] for b in optax_buffers if b["kind"] == "argument"}
    assert arguments <= inputs | {"args[1][0].count", "args[2]", "args[3]"} | {
        f"args[1][0].{m}" + p[len("args[0]") :] for m in ("mu", "nu") for p in inputs
    }
    outputs = [b["path"] for b in optax_buffers if b["kind"] == "output"]
    assert any(p.startswith("out[0]['layer") for p in outputs)
    assert all(p == "out" or p.startswith("out[") for p in outputs)
    nnx_paths = {b["path"] for b in reports["nnx_grads"]["buffers"] if b["path"]}
    assert any(p.startswith("args[0]['encoder']['kernel']") or p.startswith("args[0]['decoder']") for p in nnx_paths)


def test_donated_state_is_reused_leaf_by_leaf(costed):
    reports, _ = costed
    r = reports["optax_step"]
    assert len(r["donation"]) == 3 * 2 * 3 + 1  # params, mu and nu of 3 layers (w, b), and the count
    assert all(reused and reason is None for _, reused, _, reason in r["donation"].values())
    assert r["donation"]["args[0]['layer1']['w']"][2] == "out[0]['layer1']['w']"
    assert r["donation"]["args[1][0].count"][2] == "out[1][0].count"
    leaf_bytes = 3 * (256 * 256 + 256) * 4 * 3 + 4  # f32 params, mu, nu; an int32 count
    assert r["alias_bytes"] == leaf_bytes


def test_donation_that_cannot_be_reused_says_why(costed):
    reports, _ = costed
    r = reports["cast_step"]
    assert set(r["donation"]) == {"args[0]['w']", "args[0]['b']"}
    for key, (path, reused, output, reason) in r["donation"].items():
        assert path == key and not reused and output is None
        assert "no output has its size on each device" in reason
    assert r["alias_bytes"] == 0
    assert {b["path"]: b["donated"] for b in r["buffers"] if b["kind"] == "argument"} == {
        "args[0]['w']": False,
        "args[0]['b']": False,
        "args[1]": None,
    }


# -- in this process -------------------------------------------------------------------------
def _step(w, x):
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)


W, X = jax.ShapeDtypeStruct((128, 256), jnp.float32), jax.ShapeDtypeStruct((64, 128), jnp.float32)


def test_unused_and_taken_donations_say_why():
    c = ts.cost(lambda w, v: v * 2, W, jnp.zeros(3), donate_argnums=0)
    assert not c.donation["args[0]"].reused
    assert "does not use it" in c.donation["args[0]"].reason
    with pytest.warns(UserWarning, match="donated buffers were not usable"):  # JAX's own, as jax.jit warns
        c = ts.cost(lambda a, b: a + b, jnp.zeros(3, jnp.float32), jnp.zeros(3, jnp.float32), donate_argnums=(0, 1))
    assert [d.reused for d in c.donation.values()] == [True, False]
    assert "already reuses another donated input" in c.donation["args[1]"].reason
    assert c.alias_bytes == 12
    assert ts.cost(_step, W, X).donation == {}


def test_an_output_of_another_sharding_is_named():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    replicated = jax.ShapeDtypeStruct((256, 512), jnp.float32, sharding=NamedSharding(mesh, P()))

    def reshard(w):
        return jax.lax.with_sharding_constraint(w * 2, NamedSharding(mesh, P("d", None)))

    c = ts.cost(reshard, replicated, donate_argnums=0)
    d = c.donation["args[0]"]
    assert (d.reused, d.output) == (False, None)
    assert "(out) has another sharding" in d.reason
    assert c.alias_bytes == 0


def test_breakdown_groups_as_describe_does():
    params = {"enc": {"w": W, "b": jax.ShapeDtypeStruct((256,), jnp.float32)}, "head": W}

    def loss(p, x):
        return jnp.sum(jnp.tanh(x @ p["enc"]["w"] + p["enc"]["b"]) @ p["head"].T)

    c = ts.cost(jax.grad(loss), params, X)
    total = sum(b.nbytes for b in c.buffers)
    assert total == c.live_peak_bytes <= c.peak_bytes
    rows = [line.split() for line in c.breakdown().splitlines()[2:-2]]  # between the rules
    assert sum(int(row[-3]) for row in rows) == len(c.buffers)
    assert c.breakdown().splitlines()[-1].split()[1] == str(len(c.buffers))
    by_arg = str(c.breakdown(depth=1))
    assert "args[0] " in by_arg and "args[0]['enc']" not in by_arg
    two = str(c.breakdown(depth=2))
    assert "args[0]['enc']" in two and "args[0]['enc']['w']" not in two
    assert ts.cost(jax.grad(loss), params, X).breakdown(depth=1) == by_arg
    assert c.breakdown(depth=0).splitlines()[-1].split()[-2:] == c.breakdown().splitlines()[-1].split()[-2:]
    assert "<table" in c.breakdown(depth=1)._repr_html_()
    with pytest.raises(ValueError, match="depth must be"):
        c.breakdown(depth=-1)


def test_str_adds_the_five_largest_buffers():
    c = ts.cost(_step, W, X)
    text = str(c)
    assert text.startswith("per device")
    largest = text.split("\n\n", 1)[1]
    assert f"of {len(c.buffers)} buffers live at the peak" in largest
    assert "args[0]" in largest and "f32[128,256]" in largest
    assert "<table" in c._repr_html_() and "args[0]" in c._repr_html_()


def test_a_cost_built_by_hand_has_no_buffers():
    c = ts.Cost(1.0, 2, 3, 4, 5, 0, 12, None)
    assert (c.buffers, c.donation, c.live_peak_bytes) == (None, None, None)
    assert "buffers" not in str(c)
    with pytest.raises(ValueError, match="no buffers"):
        c.breakdown()


def test_checkpoint_shrinks_what_a_scan_over_layers_keeps():
    def block(x, p):
        return x + jax.nn.gelu(x @ p["up"]) @ p["down"]

    def make_step(layer):
        def loss(params, x):
            x, _ = jax.lax.scan(lambda x, p: (layer(x, p), None), x, params)
            return jnp.mean(x**2)

        return jax.grad(loss)

    params = {
        "up": jax.ShapeDtypeStruct((4, 64, 256), jnp.float32),
        "down": jax.ShapeDtypeStruct((4, 256, 64), jnp.float32),
    }
    x = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    plain = ts.cost(make_step(block), params, x)
    remat = ts.cost(make_step(jax.checkpoint(block)), params, x)
    assert remat.live_peak_bytes < plain.live_peak_bytes
    kept = lambda c: [b for b in c.buffers if b.kind == "temporary" and b.shape == (4, 256, 256)]  # noqa: E731
    assert kept(plain) and not kept(remat)  # the wide activations of every layer, kept for the backward pass
    assert all("/while" in b.op for b in kept(plain))


def test_inside_jit_a_closed_over_value_has_no_path():
    @jax.jit
    def outer(w, x):
        c = ts.cost(lambda x: jnp.tanh(x @ w), x)
        assert c.buffers is not None and c.live_peak_bytes > 0
        assert {b.path for b in c.buffers if b.kind == "argument"} <= {"args[0]", None}
        return x

    outer(jnp.zeros((128, 256)), jnp.zeros((64, 128)))


def _mlp(w1, w2, x):
    return jnp.tanh(x @ w1) @ w2


def test_largest_fit_names_what_fills_the_budget():
    w1, w2 = jax.ShapeDtypeStruct((784, 512), jnp.float32), jax.ShapeDtypeStruct((512, 10), jnp.float32)
    x = jax.ShapeDtypeStruct((jax.export.symbolic_shape("b")[0], 784), jnp.float32)
    fit = ts.largest_fit(_mlp, w1, w2, x, dim="b", budget=4 * 2**20)
    largest = str(fit).split("\n\n", 1)[1]
    assert f"of {len(fit.cost.buffers)} buffers live at the peak" in largest
    assert f"f32[{fit.size},784]" in largest and "args[2]" in largest
    with pytest.raises(ValueError, match=r"Largest at the peak: args\[0\] \(f32\[784,512\], 1.5 MiB\), args\[1\]"):
        ts.largest_fit(_mlp, w1, w2, x, dim="b", budget=2**20)


def test_command_line_lists_the_largest_buffers(capsys):
    from treeshape._cli import main

    expected = ts.cost(
        jnp.matmul, jax.ShapeDtypeStruct((8, 784), jnp.float32), jax.ShapeDtypeStruct((784, 10), jnp.float32)
    )
    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]"]) == 0
    assert capsys.readouterr().out.strip() == str(expected)
    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", "--buffers", "1"]) == 0
    one = capsys.readouterr().out.strip()
    assert one.split("\n\n")[1].splitlines()[0] == "1 of 3 buffers live at the peak: 30.6 KiB of 55.4 KiB"
    assert one.splitlines()[-2].startswith("args[1]              argument  f32[784,10]")
    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", "--buffers", "0"]) == 0
    assert "buffers" not in capsys.readouterr().out
    assert main(["cost", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", "--buffers", "-1"]) == 2


@settings(max_examples=15)  # each example compiles a program
@given(
    batch=st.integers(1, 64),
    widths=st.lists(st.integers(1, 96), min_size=2, max_size=5),
    donate=st.booleans(),
)
def test_the_live_set_adds_up_whatever_the_mlp(batch, widths, donate):
    params = [
        {"w": jax.ShapeDtypeStruct((a, b), jnp.float32), "b": jax.ShapeDtypeStruct((b,), jnp.float32)}
        for a, b in zip(widths[:-1], widths[1:], strict=False)
    ]

    def sgd(params, x):
        def loss(params):
            h = x
            for p in params:
                h = jnp.tanh(h @ p["w"] + p["b"])
            return jnp.sum(h**2)

        grads = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    c = ts.cost(sgd, params, jax.ShapeDtypeStruct((batch, widths[0]), jnp.float32), donate_argnums=0 if donate else ())
    sizes = [b.nbytes for b in c.buffers]
    assert sum(sizes) == c.live_peak_bytes <= c.peak_bytes
    assert sizes == sorted(sizes, reverse=True) and all(n > 0 for n in sizes)
    leaves = {f"args[0][{i}]['{k}']" for i in range(len(params)) for k in "wb"}
    for b in c.buffers:
        assert b.path is None or b.path in leaves | {"args[1]", "out"} or b.path.startswith("out[")
        assert (b.donated is not None) == (donate and b.kind == "argument" and b.path in leaves)
    if donate:
        assert set(c.donation) == leaves
        reused = [p for p, d in c.donation.items() if d.reused]
        assert c.alias_bytes == sum(4 * np.prod(eval_shape_of(params, p)) for p in reused)
    else:
        assert c.donation == {}


def eval_shape_of(params, path):
    (i, key) = re.fullmatch(r"args\[0\]\[(\d+)\]\['(\w)'\]", path).groups()
    return params[int(i)][key].shape


def test_a_donated_buffer_reused_for_an_output_of_another_shape_of_its_bytes():
    def flip(a, b):
        return a.reshape(64) + 1, (b.reshape(8, 8) * 2).astype(jnp.int32), b.sum()

    a, b = jax.ShapeDtypeStruct((8, 8), jnp.float32), jax.ShapeDtypeStruct((64,), jnp.float32)
    c = ts.cost(flip, a, b, donate_argnums=(0, 1))
    assert (
        c.alias_bytes
        == jax.jit(flip, donate_argnums=(0, 1)).lower(a, b).compile().memory_analysis().alias_size_in_bytes
    )
    assert c.alias_bytes == 2 * 256  # XLA reuses each for an output of its bytes, of another shape (and dtype)
    assert all(d.reused and d.reason is None for d in c.donation.values())
    with pytest.warns(UserWarning, match="donated buffers were not usable"):  # JAX's own, as jax.jit warns
        one = ts.cost(lambda a, b: a.reshape(64) + b, a, b, donate_argnums=(0, 1))
    [unused] = [d for d in one.donation.values() if not d.reused]
    assert "every output of its size on each device (out) already reuses another donated input" in unused.reason


def test_an_output_of_another_sharding_on_a_simulated_mesh_is_named_as_the_inputs_counterpart():
    mesh = jax.sharding.AbstractMesh((512,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    replicated = NamedSharding(mesh, P())
    params = {k: jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=replicated) for k in ("b", "w")}

    def step(params):  # `out['b']` (replicated, the size of `w` on each device) takes `b`'s buffer
        return {"b": params["b"] * 2, "w": jax.sharding.reshard(params["w"] * 2, NamedSharding(mesh, P("d", None)))}

    c = ts.cost(step, params, donate_argnums=0)
    assert c.backend == "cpu x512 (simulated)"
    assert c.donation["args[0]['b']"].output == "out['b']"
    d = c.donation["args[0]['w']"]
    assert not d.reused
    assert "(out['w']) has another sharding" in d.reason and "already reuses" not in d.reason
