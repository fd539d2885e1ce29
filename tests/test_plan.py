"""`ts.plan`: the fastest combination of choices that fits, each combination searched as
`largest_fit` searches it (the oracle: `largest_fit` and `cost` themselves, asked after the
plan, compiling nothing), ranked by the throughput `Cost.time` gives."""

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import matplotlib
import pytest

import treeshape as ts
from treeshape._cli import main


matplotlib.use("Agg")
BUDGET = 6 * 2**20
MAX = 64
(B,) = jax.export.symbolic_shape("b")


@functools.cache  # the same step for a combination: asked again, it is a cache hit
def make(width, remat="none"):
    """A donated SGD step of two tanh layers of `width`, with a batch of `b` rows."""

    def layer(h, w):
        return jnp.tanh(h @ w)

    if remat == "full":
        layer = jax.checkpoint(layer)

    def step(ws, x):
        def loss(ws):
            return jnp.mean(layer(layer(x, ws[0]), ws[1]).astype(jnp.float32) ** 2)

        g = jax.grad(loss)(ws)
        return [w - 0.1 * d for w, d in zip(ws, g, strict=True)]

    ws = [jax.ShapeDtypeStruct((width, width), jnp.bfloat16)] * 2
    return step, ws, jax.ShapeDtypeStruct((B, width), jnp.bfloat16)


CHOICES = {"width": [256, 512, 2048]}  # 2048: its weights alone are over the budget


@pytest.fixture(scope="module")
def planned():
    return ts.plan(make, CHOICES, target="v5e", budget=BUDGET, donate_argnums=0, max_size=MAX)


def test_each_row_is_largest_fit_and_cost_of_its_combination(compiles):
    planned = ts.plan(make, {"width": [256, 512]}, target="v5e", budget=BUDGET, donate_argnums=0, max_size=MAX)
    compiles.clear()
    fitting = [r for r in planned.rows if r.size > 0]
    assert {r.choice["width"] for r in fitting} == {256, 512}
    for row in fitting:
        step, ws, x = make(**row.choice)
        fit = ts.largest_fit(step, ws, x, dim="b", target="v5e", budget=BUDGET, donate_argnums=0, max_size=MAX)
        assert (row.largest, row.fit) == (fit.size, dataclasses.replace(fit, compiles=row.fit.compiles))
        at_size = ts.cost(step, ws, x.update(shape=(row.size, x.shape[1])), donate_argnums=0, target="v5e")
        assert row.seconds == at_size.time.seconds and row.mfu == at_size.time.mfu
        assert row.throughput == pytest.approx(row.size / row.seconds)
        assert row.peak_bytes == at_size.compiler_peak_bytes <= BUDGET and row.budget == BUDGET
        assert 1 <= row.size <= row.largest and row.note == ""
    assert compiles == []  # the plan compiled all of it: asked after it, nothing compiles


def test_a_combination_that_fits_at_no_size_is_a_row_with_its_reason(planned):
    last = planned.rows[-1]
    assert last.choice == {"width": 2048} and (last.size, last.largest, last.fit, last.seconds) == (0, 0, None, None)
    assert last.throughput == 0.0 and "even b=1 does not fit" in last.note


def test_rows_fastest_first_the_best_and_the_pareto_rows(planned):
    fitting = [r for r in planned.rows if r.size > 0]
    assert [r.throughput for r in fitting] == sorted((r.throughput for r in fitting), reverse=True)
    assert planned.best is planned.rows[0]
    for r in planned.pareto:
        assert not any(
            o.throughput >= r.throughput and o.peak_bytes <= r.peak_bytes and o is not r
            and (o.throughput > r.throughput or o.peak_bytes < r.peak_bytes)
            for o in fitting
        )  # fmt: skip
    assert planned.best in planned.pareto


def test_a_rows_size_is_the_fastest_of_those_compiled_and_the_powers_of_two_below(planned):
    for row in (r for r in planned.rows if r.size > 0):
        step, ws, x = make(**row.choice)
        sizes = {row.largest} | {2**k for k in range(row.largest.bit_length()) if 2**k < row.largest}
        rates = {
            n: n / ts.cost(step, ws, x.update(shape=(n, x.shape[1])), donate_argnums=0, target="v5e").time.seconds
            for n in sizes
        }
        assert rates[row.size] >= max(rates.values()) * (1 - 1e-12)


def test_compiles_at_most_largest_fits_and_one_per_power_of_two():
    jax.clear_caches()
    ts.clear_cache()
    p = ts.plan(make, {"width": [256]}, target="v5e", budget=BUDGET, donate_argnums=0, max_size=MAX)
    (row,) = p.rows
    powers = sum(1 for k in range(row.largest.bit_length()) if 2**k < row.largest)
    assert row.fit.compiles <= p.compiles <= row.fit.compiles + 2 * powers  # (a body compiled alone counts too)


def test_the_table_the_page_and_the_picture(planned):
    text = str(planned).splitlines()
    assert text[0].split()[:4] == ["width", "b", "largest", "seconds"] and text[2].startswith("best")
    assert "2048" in text[-2] and "even b=1" in text[-2]
    assert "<table" in planned._repr_html_()
    ax = planned.plot()
    assert ax.get_xlabel() == "peak memory per device (GiB)" and len(ax.collections) >= 2
    with pytest.raises(TypeError, match="Plan.plot's ax must be a matplotlib Axes"):
        planned.plot(ax="axes")


def test_progress_names_each_combination_and_compile(capsys):
    ts.plan(make, {"width": [256], "remat": ["full"]}, target="v5e", budget=BUDGET, max_size=8, progress=True)
    err = capsys.readouterr().err
    assert "treeshape.plan: [1/1] width=256, remat=full" in err
    assert "treeshape.largest_fit: b=1: compiling for 'v5e'" in err and "treeshape.plan: best width=256" in err


def test_an_error_in_make_names_the_combination():
    def broken(width):
        if width == 512:
            raise KeyError("no such layer")
        return make(width)

    with pytest.raises(KeyError, match="no such layer") as caught:
        ts.plan(broken, {"width": [256, 512]}, target="v5e", budget=BUDGET, max_size=8)
    assert "treeshape.plan: raised by make(width=512)" in caught.value.__notes__


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="pass target= one of"):
        ts.plan(make, CHOICES)
    with pytest.raises(TypeError, match=r"^treeshape\.plan: dim must be the name of a symbolic dimension"):
        ts.plan(make, CHOICES, target="v5e", dim=1)
    with pytest.raises(ValueError, match=r"^treeshape\.plan: budget must be a number of bytes >= 1"):
        ts.plan(make, CHOICES, target="v5e", budget=-1)
    with pytest.raises(TypeError, match=r"^treeshape\.plan: budget must be a number, got str"):
        ts.plan(make, CHOICES, target="v5e", budget="16GiB")
    with pytest.raises(ValueError, match=r"^treeshape\.plan: max_size must be >= 1"):
        ts.plan(make, CHOICES, target="v5e", max_size=0)
    with pytest.raises(TypeError, match=r"^treeshape\.plan: progress must be True or False, got str 'yes'"):
        ts.plan(make, CHOICES, target="v5e", progress="yes")  # as largest_fit takes it
    with pytest.raises(TypeError, match=r"^treeshape\.plan: donate_argnums must be an int or a sequence of ints"):
        ts.plan(make, CHOICES, target="v5e", donate_argnums=1.5)
    with pytest.raises(TypeError, match="choices must be a non-empty dict"):
        ts.plan(make, [("width", [256])], target="v5e")
    with pytest.raises(ValueError, match=r"choices\['width'\] is empty"):
        ts.plan(make, {"width": []}, target="v5e")
    with pytest.raises(TypeError, match=r"choices\['width'\] must be a sequence"):
        ts.plan(make, {"width": "256"}, target="v5e")
    with pytest.raises(TypeError, match="make must be callable"):
        ts.plan(None, CHOICES, target="v5e")


def test_the_command_line_plans_and_prints_json(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "planned.py").write_text(
        "import jax, jax.numpy as jnp\n"
        "(b,) = jax.export.symbolic_shape('b')\n"
        "def make(width):\n"
        "    step = lambda w, x: jnp.tanh(x @ w)\n"
        "    return step, jax.ShapeDtypeStruct((width, width), jnp.bfloat16), "
        "jax.ShapeDtypeStruct((b, width), jnp.bfloat16)\n"
    )
    argv = ["plan", "planned:make", "--choice", "width=128,256", "--target", "v5e", "--budget", "4MiB"]
    assert main([*argv, "--max-size", "16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dim"] == "b" and [sorted(r["choice"]) for r in data["rows"]] == [["width"], ["width"]]
    assert all(math.isclose(r["throughput"], r["size"] / r["seconds"]) for r in data["rows"])
    assert main(["plan", "planned:make", "--choice", "width", "--target", "v5e"]) == 2
    assert "expected NAME=V1,V2" in capsys.readouterr().err


def test_a_combination_the_compiler_refuses_at_size_one_is_a_row_with_the_refusal(compiles):
    """libtpu refuses a step whose weights alone (16 GiB) are over a v5e's memory, at size 1:
    that combination is a row of size 0 whose note is the refusal, and the other rows stay."""

    def make_rows(rows):
        w = jax.ShapeDtypeStruct((rows, 2**15), jnp.float32)
        x = jax.ShapeDtypeStruct((B, 2**15), jnp.float32)
        return (lambda w, x: jnp.sin(w).sum() + x.sum()), w, x

    p = ts.plan(make_rows, {"rows": [128, 2**17]}, target="v5e", max_size=4)
    fits, refused = p.rows
    assert fits.choice == {"rows": 128} and fits.size == 4 and p.best is fits
    assert refused.choice == {"rows": 2**17} and (refused.size, refused.largest, refused.fit) == (0, 0, None)
    assert refused.note.startswith("even b=1 does not fit: the program does not fit on TPU v5e x1: ")
    assert "TPU v5e's compiler refuses it (" in refused.note and "memory" in refused.note
    assert refused.budget == 16_911_433_728
    # sizes 1, 4 and 2 of the combination that fits; the one libtpu refused is no program (as Fit counts it)
    assert p.compiles == 3 == len(compiles) - 1


def test_where_nothing_fits_best_is_none_the_table_says_so_and_every_compile_counts(compiles):
    jax.clear_caches()
    ts.clear_cache()
    p = ts.plan(make, {"width": [2048]}, target="v5e", budget=BUDGET, donate_argnums=0, max_size=MAX)
    (row,) = p.rows
    assert row.size == 0 and p.best is None and p.pareto == ()
    assert p.compiles == len(compiles) == 1  # size 1, over the budget: compiled, and counted
    text = str(p)
    assert text.splitlines()[2].split()[:3] == ["2048", "0", "0"]  # no row marked best
    assert text.splitlines()[-1].startswith("nothing fits: no combination fits at b=1 (each row's note says why)")
    assert "nothing fits" in p._repr_html_()


@functools.cache
def make_stream(width):
    """A donated elementwise step over `b` rows of `width` floats: its time on a v5e grows
    with `b` (1.0 ms at b=64 for width 2**20) once past the host's time to call a step."""
    return (lambda x: jnp.sin(x) * 2), jax.ShapeDtypeStruct((B, width), jnp.float32)


def test_max_seconds_makes_a_rows_size_the_fastest_whose_step_is_that_fast():
    unbounded = ts.plan(make_stream, {"width": [2**20]}, target="v5e", donate_argnums=0, max_size=MAX)
    bounded = ts.plan(make_stream, {"width": [2**20]}, target="v5e", donate_argnums=0, max_size=MAX, max_seconds=5e-4)
    (free,), (row,) = unbounded.rows, bounded.rows
    assert (free.size, free.largest) == (64, 64) and free.seconds > 5e-4 and unbounded.max_seconds is None
    assert (row.size, row.largest) == (16, 64) and bounded.max_seconds == 5e-4
    assert row.fit == dataclasses.replace(free.fit, compiles=row.fit.compiles)  # (the second plan: cache hits)
    step, x = make_stream(2**20)
    seconds = {
        n: ts.cost(step, x.update(shape=(n, 2**20)), donate_argnums=0, target="v5e").time.seconds
        for n in (1, 2, 4, 8, 16, 32, 64)
    }
    assert row.seconds == seconds[16] <= 5e-4 < seconds[32]  # 32 and 64 are faster per row, and too slow
    assert row.throughput == max(n / s for n, s in seconds.items() if s <= 5e-4) < free.throughput
    head = "max_seconds=0.0005: each row's b the fastest whose step takes at most 500.0 us"
    assert str(bounded).splitlines()[0] == head
    assert str(bounded).splitlines()[1].split()[:2] == ["width", "b"] and "max_seconds" not in str(unbounded)
    assert "max_seconds=0.0005" in bounded._repr_html_()


def test_a_combination_slower_than_max_seconds_at_size_one_is_a_row_of_size_0_saying_so():
    p = ts.plan(make_stream, {"width": [2**24, 2**20]}, target="v5e", donate_argnums=0, max_size=8, max_seconds=4e-4)
    fast, slow = p.rows
    assert fast.choice == {"width": 2**20} and fast.size == 8 and p.best is fast
    step, x = make_stream(2**24)
    one = ts.cost(step, x.update(shape=(1, 2**24)), donate_argnums=0, target="v5e").time.seconds
    assert one > 4e-4
    assert slow.choice == {"width": 2**24} and (slow.size, slow.seconds, slow.throughput) == (0, None, 0.0)
    assert slow.largest == 8 and slow.fit.size == 8  # it fits: only the bound rules it out
    assert slow.note == (
        f"even b=1 is slower than max_seconds: its step takes {one * 1e6:.1f} us, over max_seconds=0.0004 "
        "(400.0 us). b=1 is the smallest size: make the step itself faster (a shorter cache, fewer layers, a "
        "smaller model, a larger mesh or a faster target) or raise max_seconds."
    )
    assert str(p).splitlines()[-2].split()[:3] == ["16777216", "0", "8"]
    assert "even b=1 is slower than max_seconds" in str(p).splitlines()[-2]
    none = ts.plan(make_stream, {"width": [2**24]}, target="v5e", donate_argnums=0, max_size=8, max_seconds=4e-4)
    assert none.best is None and str(none).splitlines()[-1].startswith(
        "nothing meets max_seconds: at b=1 each combination's step takes longer than 400.0 us"
    )


@pytest.mark.parametrize("bad", [0, -0.01, math.nan, math.inf])
def test_max_seconds_must_be_a_positive_finite_number(bad):
    with pytest.raises(ValueError, match=r"^treeshape\.plan: max_seconds must be a positive, finite number of seconds"
                       ) as caught:  # fmt: skip
        ts.plan(make, CHOICES, target="v5e", max_seconds=bad)
    assert f"got {bad!r}" in str(caught.value) and "e.g. max_seconds=0.02 for 20 ms a step" in str(caught.value)
    for wrong in ("20ms", True):
        with pytest.raises(TypeError, match=rf"^treeshape\.plan: max_seconds must be a number, got \w+ {wrong!r}"):
            ts.plan(make, CHOICES, target="v5e", max_seconds=wrong)


def make_typed(dtype, layout, remat):
    """A step whose choices are a dtype, a tuple and a string (`layout` and `remat` unused)."""
    del layout, remat
    return (
        (lambda w, x: jnp.tanh(x @ w)),
        jax.ShapeDtypeStruct((256, 256), dtype),
        jax.ShapeDtypeStruct((B, 256), dtype),
    )


def test_choice_values_print_as_written(capsys):
    choices = {"dtype": [jnp.bfloat16], "layout": [(4, 1)], "remat": ["dots"]}
    p = ts.plan(make_typed, choices, target="v5e", max_size=2, progress=True)
    err = capsys.readouterr().err
    assert str(p).splitlines()[2].split()[:4] == ["best", "bfloat16", "4x1", "dots"]
    assert "treeshape.plan: [1/1] dtype=bfloat16, layout=4x1, remat=dots\n" in err
    assert "treeshape.plan: best dtype=bfloat16, layout=4x1, remat=dots at b=2 (" in err


def test_the_command_line_names_the_combination_make_raised_for(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_plan.py").write_text("def make(remat, mesh):\n    raise KeyError(f'no layer for {remat}')\n")
    argv = ["plan", "broken_plan:make", "--choice", "remat=dots", "--choice", "mesh=4x1", "--target", "v5e"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "treeshape: error: planning broken_plan:make failed, raised by make(remat=dots, mesh=4x1): "
        "KeyError: 'no layer for dots'"
    )


def serving_model():
    """The serving guide's decode step (docs/guide/serving.md, the block defining
    `make_decode`), as the guide and benchmarks/steptime/serving.py run it."""
    import pathlib
    import re

    page = (pathlib.Path(__file__).parents[1] / "docs" / "guide" / "serving.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.DOTALL | re.MULTILINE)
    (code,) = [block for block in blocks if "def make_decode(" in block]
    namespace = {"__name__": "serving_model"}
    exec(compile(code, "<guide/serving.md: make_decode>", "exec"), namespace)
    return namespace


def test_a_decode_step_planned_over_its_cache_length_sequences_tokens_a_second_and_the_caches_bytes():
    """A decode step (bf16 weights, per layer a [b, cache, heads, d_head] KV cache written by
    dynamic_update_slice, donated) planned over the cache length: each row's largest the most
    sequences that fit at that length, its throughput tokens a second (b / seconds: a token
    for each sequence a step), and the KV cache at the fit's peak by pytree path."""
    model = serving_model()
    make_decode, config = model["make_decode"], model["CONFIG"]
    budget, caches = 128 * 2**20, [1024, 4096]
    p = ts.plan(make_decode, {"cache": caches}, target="v5e", budget=budget, donate_argnums=1, max_size=16)
    rows = {r.choice["cache"]: r for r in p.rows}
    for cache, row in rows.items():
        step, params, kv, tokens, pos = make_decode(cache)
        fit = ts.largest_fit(step, params, kv, tokens, pos, dim="b", target="v5e", budget=budget, donate_argnums=1,
                             max_size=16)  # fmt: skip
        assert row.largest == fit.size and 1 <= row.size <= row.largest
        at_size = ts.cost(*make_decode(cache, row.size), donate_argnums=1, target="v5e")
        assert row.seconds == at_size.time.seconds and row.throughput == pytest.approx(row.size / row.seconds)
        if jax.__version_info__ < (0, 9):  # (the libtpu of jax 0.8.0 writes no live ranges: no buffers, never made up)
            assert row.fit.cost.buffers is None and row.fit.cost.donation is None
            continue
        # the cache at the fit's peak, by path: each layer's keys and values, `largest` sequences, reused in place
        layer_bytes = fit.size * cache * config["heads"] * config["d_head"] * 2
        cache_buffers = [b for b in row.fit.cost.buffers if b.path and b.path.startswith(("args[1]", "out[1]"))]
        assert {b.shape for b in cache_buffers} == {(fit.size, cache, config["heads"], config["d_head"])}
        assert all(b.nbytes == layer_bytes for b in cache_buffers) and len(cache_buffers) == 2 * config["layers"]
        leaves = [f"args[1][{i}]['{kv}']" for i in range(config["layers"]) for kv in "kv"]
        assert sorted(row.fit.cost.donation) == leaves
        assert all(d.reused for d in row.fit.cost.donation.values())
    assert rows[1024].largest > rows[4096].largest >= 1  # a longer cache, fewer sequences
