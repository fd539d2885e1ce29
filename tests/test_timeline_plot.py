"""The picture of a step's memory over its schedule (`Timeline.plot`, `_repr_html_`) and the
command line's `treeshape cost --timeline` / `--plot FILE`, checked through matplotlib's own
objects (the stacked areas' vertices, the lines, the texts), never pixels."""

import dataclasses
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_one_line_error
from matplotlib.figure import Figure

import treeshape as ts
from treeshape._cli import main
from treeshape._cost import _plot


KINDS = ("argument", "output", "temporary", "constant")
PNG = b"\x89PNG\r\n\x1a\n"


def two_layers(w1, w2, x):
    """The gradient of a two-layer network, each layer in its own scope (a command-line target)."""

    def loss(ws):
        with jax.named_scope("layer1"):
            h = jnp.tanh(x @ ws[0])
        with jax.named_scope("layer2"):
            return jnp.sum(jnp.tanh(h @ ws[1]))

    return jax.grad(loss)((w1, w2))


# f32 as SPECS say, with jax_enable_x64 on or off
ARGS = tuple(jnp.zeros(shape, jnp.float32) for shape in [(512, 1024), (1024, 256), (64, 512)])
SPECS = ["f32[512,1024]", "f32[1024,256]", "f32[64,512]"]
TARGET = "test_timeline_plot:two_layers"


@pytest.fixture(scope="module")
def timeline():
    return ts.cost(two_layers, *ARGS).timeline


def _tops(collection, n):
    """The upper edge of a stacked area at each step 0..n-1: the largest y among its vertices there."""
    vertices = collection.get_paths()[0].vertices
    return [max(y for x, y in vertices if x == step) for step in range(n)]


def _mib(n):
    return f"{n / 2**20:.1f} MiB"


# -- the picture --------------------------------------------------------------------------
def test_the_kinds_are_stacked_in_order_and_add_up_to_the_bytes_live(timeline):
    ax = timeline.plot()
    n = len(timeline.live_bytes)
    areas = ax.collections[:4]
    assert [a.get_label().lstrip("_") for a in areas] == list(KINDS)
    below = np.zeros(n, dtype=np.int64)
    for kind, area in zip(KINDS, areas, strict=True):
        below = below + np.asarray(timeline.by_kind[kind])
        assert _tops(area, n) == below.tolist(), kind
    assert _tops(areas[-1], n) == list(timeline.live_bytes)
    # the legend names the kinds that hold bytes somewhere, and only those
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [k for k in KINDS if any(timeline.by_kind[k])]
    assert "argument" in legend and "output" in legend


def test_the_peak_is_marked_with_its_bytes_and_its_largest_buffer(timeline):
    ax = timeline.plot()
    step = timeline.peak_step
    peak = timeline.live_bytes[step]
    assert peak == max(timeline.live_bytes)
    (marker,) = [line for line in ax.lines if line.get_marker() == "v"]
    assert (list(marker.get_xdata()), list(marker.get_ydata())) == ([step], [peak])
    (label,) = [t for t in ax.texts if t.get_text().startswith("peak ")]
    assert label.xy == (step, peak)
    largest = timeline.buffers_at(step)[0]  # listed largest first
    assert largest.nbytes == max(b.nbytes for b in timeline.buffers_at(step))
    assert label.get_text() == f"peak {_mib(peak)} at step {step}\nlargest: {largest.path} ({_mib(largest.nbytes)})"
    assert ax.get_ylim()[1] > peak  # room above the peak for its label


@pytest.mark.parametrize("depth", [1, 2])
def test_the_phases_are_named_along_the_steps(timeline, depth):
    ax = timeline.plot(depth=depth)
    phases = timeline.phases(depth)
    names = sorted((t.get_position()[0], t.get_text()) for t in ax.texts if t.get_gid() == "phase")
    centers = {((p.start + p.stop - 1) / 2, p.name) for p in phases}
    assert names and set(names) <= centers  # each name at the middle of its phase
    widest = max(phases, key=lambda p: p.stop - p.start)
    assert ((widest.start + widest.stop - 1) / 2, widest.name) in names
    gap = len(timeline.live_bytes) / 45
    assert all(b[0] - a[0] >= gap for a, b in zip(names, names[1:], strict=False))  # never on top of each other
    starts = [line.get_xdata()[0] for line in ax.lines if line.get_label() == "_phase"]
    named_starts = sorted(p.start for p in phases if ((p.start + p.stop - 1) / 2, p.name) in names)
    assert starts == [start for start in named_starts if start]  # a separator before each named phase


def test_a_real_programs_interleaved_phases_are_named_sparsely():
    """A train step's depth-1 phases interleave in runs of a few steps: the picture names at
    most 30, spread along the schedule, not one per run."""

    def step(w, x):
        def loss(w):
            for i in range(6):
                with jax.named_scope(f"block_{i}"):
                    x_ = jnp.tanh(x @ w) + x
            return (x_ * x_).sum()

        return jax.grad(loss)(w)

    t = ts.cost(step, jnp.zeros((64, 64)), jnp.zeros((32, 64))).timeline
    ax = t.plot()
    names = [x.get_text() for x in ax.texts if x.get_gid() == "phase"]
    assert 0 < len(names) <= min(30, len(t.phases()))
    assert len([line for line in ax.lines if line.get_label() == "_phase"]) <= len(names)


class _Phase(NamedTuple):
    name: str
    start: int
    stop: int
    peak_bytes: int


@dataclasses.dataclass(frozen=True)
class _ManyPhases:
    """A timeline of 40 phases of widths 1..40 (the picture reads a timeline through a protocol)."""

    live_bytes: tuple = tuple(range(1, 821))
    by_kind: dict = dataclasses.field(default_factory=lambda: {"temporary": tuple(range(1, 821))})
    peak_step: int = 819

    def buffers_at(self, step):
        return ()

    def phases(self, depth=1):
        stops = np.cumsum(np.arange(1, 41)).tolist()
        return tuple(_Phase(f"block{i}", a, b, b) for i, (a, b) in enumerate(zip([0, *stops[:-1]], stops, strict=True)))


def test_more_phases_than_fit_name_the_widest():
    ax = _plot.plot(_ManyPhases())
    names = [t.get_text() for t in ax.texts if t.get_gid() == "phase"]
    # the widest first, at most 30, none within 820 / 45 steps of another: blocks 20-39 are
    # each at least 20 steps from the next, narrower ones only where there is room
    assert set(names) >= {f"block{i}" for i in range(20, 40)} and len(names) <= 30
    assert len([line for line in ax.lines if line.get_label() == "_phase"]) == len(names)  # each named phase's start
    assert ax.texts[0].get_text() == "peak 820 B at step 819"  # no buffers: no largest


def test_a_budget_is_a_line_at_its_bytes(timeline):
    budget = 8 * 2**20
    ax = timeline.plot(budget=budget)
    (line,) = [line for line in ax.lines if line.get_label().startswith("budget")]
    assert list(line.get_ydata()) == [budget, budget] and line.get_label() == "budget 8.0 MiB"
    assert ax.get_ylim()[1] > budget > max(timeline.live_bytes)
    assert not [line for line in timeline.plot().lines if line.get_label().startswith("budget")]
    for bad in (-1, 0, "8GiB", True, float("nan"), float("inf"), np.float32("nan")):
        with pytest.raises(ValueError, match="budget is bytes, a finite number > 0"):
            timeline.plot(budget=bad)
    assert timeline.plot(budget=np.int64(budget)).get_ylim() == ax.get_ylim()


def test_plot_on_something_not_an_axes_names_ax(timeline):
    figure = Figure()
    for bad in (figure, "ax", [figure.add_subplot()]):
        with pytest.raises(TypeError, match=r"Timeline\.plot's ax must be a matplotlib Axes, got .* of type "):
            timeline.plot(ax=bad)


def test_plot_draws_on_the_axes_given_and_touches_no_pyplot(timeline):
    ax = Figure().add_subplot()
    assert timeline.plot(ax=ax) is ax and len(ax.collections) == 4
    own = timeline.plot()
    assert own is not ax and type(own.figure) is Figure


def test_repr_html_is_matplotlibs_svg(timeline):
    page = timeline._repr_html_()
    root = ET.fromstring(page)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert f"peak {_mib(max(timeline.live_bytes))} at step {timeline.peak_step}" in page  # matplotlib's text comments
    assert timeline._repr_html_() == page  # the same picture, the same text


def test_without_matplotlib_plot_names_the_extra(timeline, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r'pip install "treeshape\[plot\]"'):
        timeline.plot()
    assert "<svg" not in timeline._repr_html_()


def test_nothing_else_of_treeshape_imports_matplotlib():
    code = (
        "import sys, jax.numpy as jnp, treeshape as ts\n"
        "c = ts.cost(lambda w, x: jnp.tanh(x @ w), jnp.zeros((256, 512)), jnp.zeros((32, 256)))\n"
        "t = c.timeline\n"
        "str(c), str(t), t.phases(), t.buffers_at(t.peak_step), c.breakdown(1)\n"
        "assert 'matplotlib' not in sys.modules, 'imported before drawing'\n"
        "t._repr_html_()\n"
        "assert 'matplotlib' in sys.modules and 'matplotlib.pyplot' not in sys.modules\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


# -- the command line -----------------------------------------------------------------------
def test_cost_timeline_prints_the_chart_after_the_table(capsys):
    assert main(["cost", TARGET, *SPECS, "--timeline"]) == 0
    out, err = capsys.readouterr()
    cost = ts.cost(two_layers, *ARGS)
    assert err == "" and out == f"{cost}\n\n{cost.timeline}\n"


def test_cost_json_has_the_timeline_only_when_asked(capsys):
    cost = ts.cost(two_layers, *ARGS)
    timeline = cost.timeline
    assert main(["cost", TARGET, *SPECS, "--json"]) == 0
    assert "timeline" not in json.loads(capsys.readouterr().out)
    assert main(["cost", TARGET, *SPECS, "--json", "--timeline"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    data = json.loads(out)
    assert data["timeline"] == {
        "live_bytes": list(timeline.live_bytes),
        "peak_step": timeline.peak_step,
        "phases": [
            {"name": p.name, "start": p.start, "stop": p.stop, "peak_bytes": p.peak_bytes} for p in timeline.phases()
        ],
    }
    assert data["peak_bytes"] == cost.peak_bytes and data["timeline"]["phases"][0]["start"] == 0


@pytest.mark.parametrize("extension, magic", [(".svg", None), (".png", PNG), (".pdf", b"%PDF-")])
def test_cost_plot_writes_the_picture_in_the_extensions_format(tmp_path, capsys, extension, magic):
    path = tmp_path / f"memory{extension}"
    assert main(["cost", TARGET, *SPECS, "--plot", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out == f"{ts.cost(two_layers, *ARGS)}\n"  # the table, as without --plot
    data = path.read_bytes()
    if magic is None:
        assert ET.fromstring(data).tag == "{http://www.w3.org/2000/svg}svg"
        assert b"peak " in data
    else:
        assert data.startswith(magic) and len(data) > 1000


def test_cost_plot_refuses_another_extension_before_compiling(tmp_path, capsys):
    path = tmp_path / "memory.jpg"
    assert main(["cost", TARGET, *SPECS, "--plot", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not path.exists()
    assert_one_line_error(err, "the picture's format comes from the file's extension: .svg, .png, .pdf")


def test_cost_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "memory.svg"
    assert main(["cost", TARGET, *SPECS, "--plot", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not path.exists()
    assert_one_line_error(
        err, 'matplotlib is not installed; it comes with the extra treeshape[plot]: pip install "treeshape[plot]"'
    )


def test_cost_without_buffers_says_there_is_no_timeline(tmp_path, capsys, monkeypatch):
    real = ts.cost

    def without_buffers(*args, **kwargs):
        cost = real(*args, **kwargs)
        unknown = {f.name: None for f in dataclasses.fields(cost) if f.name in ("buffers", "donation", "timeline")}
        return dataclasses.replace(cost, **unknown)

    monkeypatch.setattr(ts, "cost", without_buffers)
    assert main(["cost", TARGET, *SPECS, "--timeline"]) == 0
    out = capsys.readouterr().out
    message = "no timeline: the JAX release or backend that compiled this program does not give XLA's buffer assignment"
    assert out.endswith(f"\n\n{message}\n")
    assert main(["cost", TARGET, *SPECS, "--timeline", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["timeline"] is None
    path = tmp_path / "memory.svg"
    assert main(["cost", TARGET, *SPECS, "--plot", str(path)]) == 2
    assert_one_line_error(capsys.readouterr().err, f"nothing to draw, {message}")
    assert not path.exists()
