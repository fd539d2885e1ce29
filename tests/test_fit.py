"""`ts.largest_fit` against the oracle: XLA's own memory analysis of
`jax.jit(f).lower(concrete inputs).compile()` (peak = arguments + outputs + temporaries
- aliased), searched by plain bisection over the sizes. Programs whose peak is linear in
the size, has steps, grows quadratically or goes up and down; Structures, partials,
donation, margins; the number of compilations (counted by a JAX monitoring listener);
inside `jit` and `vmap`; the table; the errors; the command line."""

import dataclasses
import functools as ft
import html
import math
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import treeshape as ts
from treeshape._cli import main, parse_bytes


F32 = jnp.float32
(B,) = jax.export.symbolic_shape("b")
MAX_COMPILES = 20 + 4  # the bound for the default max_size, 2**20


def oracle_peak(f, *args, **jit_options):
    """The peak XLA reports for `jax.jit(f, **jit_options)` on these concrete-shaped inputs."""
    m = jax.jit(f, **jit_options).lower(*args).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


class Oracle:
    """XLA's peaks for `f` at concrete sizes (`inputs(n)` are the arguments at size `n`),
    each size compiled once."""

    def __init__(self, f, inputs, **jit_options):
        self.peak = ft.cache(lambda n: oracle_peak(f, *inputs(n), **jit_options))

    def largest(self, limit, max_size):
        """The largest size that fits, by plain bisection (for a peak that grows with the size)."""
        lo, hi = 1, max_size + 1
        assert self.peak(1) <= limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.peak(mid) <= limit else (lo, mid)
        return lo

    def check(self, fit, limit, max_size=2**20):
        """XLA says the size fits, and the next one does not (unless it is max_size)."""
        assert self.peak(fit.size) == fit.cost.peak_bytes <= limit
        assert fit.size == max_size or self.peak(fit.size + 1) > limit


def rows(n):
    return (jax.ShapeDtypeStruct((n, 100), F32),)


def double(x):
    return 2 * x


# -- linear programs ----------------------------------------------------------------
@pytest.mark.parametrize("budget", [10_000, 123_457, 10**7])
def test_a_linear_program_takes_four_compilations(compiles, budget):
    fit = ts.largest_fit(double, *rows(B), dim="b", budget=budget)
    assert fit.size == budget // 800  # 400 B in, 400 B out per row
    Oracle(double, rows).check(fit, budget)
    assert fit.compiles == 4  # sizes 1, 64, n and n + 1
    assert len(compiles) - 2 * (fit.size < 2**20) == 4  # the oracle's two, and the search's four
    assert (fit.fixed_bytes, fit.per_unit_bytes, fit.budget, fit.dim) == (0.0, 800.0, budget, "b")


def init(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (64, 32)) * 0.1,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 10)) * 0.1,
    }


def loss_fn(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def sgd_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    return jtu.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss


def batch_at(n):
    return {"x": jax.ShapeDtypeStruct((n, 64), F32), "y": jax.ShapeDtypeStruct((n, 10), F32)}


def test_a_train_step_with_structures_and_donation(compiles):
    params = ts.out_structure(init, jax.random.key(0))  # never allocated
    batch = ts.structure_of(batch_at(B))
    assert batch.dims == ("b",)
    budget = 100_000
    inputs = lambda n: (params.tree, batch_at(n))  # noqa: E731
    compiles.clear()  # the key made for `init` compiled programs too
    plain = ts.largest_fit(sgd_step, params, batch, dim="b", budget=budget)
    donated = ts.largest_fit(sgd_step, params, batch, dim="b", budget=budget, donate_argnums=0)
    assert len(compiles) == plain.compiles + donated.compiles
    assert plain.compiles <= 8 and donated.compiles <= 8
    Oracle(sgd_step, inputs).check(plain, budget)
    Oracle(sgd_step, inputs, donate_argnums=0).check(donated, budget)
    assert donated.size > plain.size
    assert (plain.cost.alias_bytes, donated.cost.alias_bytes) == (0, params.nbytes)
    assert plain.per_unit_bytes > (64 + 10) * 4  # at least an input row
    by_name = ts.largest_fit(sgd_step, params, batch, dim="b", budget=budget, donate_argnames="params")
    assert by_name == dataclasses.replace(donated, compiles=0)  # the same programs, from the cache


# -- other curves: steps, quadratic, up and down ------------------------------------------
def padded(x):
    """Rows padded to a multiple of 64: a peak with steps."""
    return jnp.pad(x, ((0, -x.shape[0] % 64), (0, 0))) * 2


def outer(x):
    """A peak quadratic in the size."""
    return x[:, None] * x[None, :]


@pytest.mark.parametrize(
    "f, inputs, budget",
    [
        (padded, lambda n: (jax.ShapeDtypeStruct((n, 16), F32),), 1_000_000),
        (padded, lambda n: (jax.ShapeDtypeStruct((n, 16), F32),), 1_100_000),
        (outer, lambda n: (jax.ShapeDtypeStruct((n,), F32),), 1_000_000),
        (outer, lambda n: (jax.ShapeDtypeStruct((n,), F32),), 123_456_789),
    ],
    ids=["steps-at-an-edge", "steps-inside", "quadratic", "quadratic-large"],
)
def test_nonlinear_programs_equal_the_oracle(f, inputs, budget):
    fit = ts.largest_fit(f, *inputs(B), dim="b", budget=budget)
    oracle = Oracle(f, inputs)
    assert fit.size == oracle.largest(budget, 2**15)
    oracle.check(fit, budget)
    assert fit.compiles <= MAX_COMPILES


def test_a_peak_that_goes_up_and_down():
    """Where the peak is not monotone, the size found fits, the next does not, and no
    larger size the search compiled fit."""
    seen = []

    def saw(x):
        seen.append(x.shape[0])
        n = x.shape[0]
        return x * 2, jnp.ones(((n * 37) % 101) * 64, F32) * x.sum()

    inputs = lambda n: (jax.ShapeDtypeStruct((n,), F32),)  # noqa: E731
    for budget in (20_000, 40_000):
        ts.clear_cache()
        seen.clear()
        fit = ts.largest_fit(saw, *inputs(B), dim="b", budget=budget, max_size=3000)
        compiled = list(seen)  # one trace per compilation
        assert fit.compiles == len(compiled) <= 12 + 4
        oracle = Oracle(saw, inputs)
        peaks = [oracle.peak(n) for n in sorted(compiled)]
        assert fit.monotone is (peaks == sorted(peaks))
        oracle.check(fit, budget, max_size=3000)
        assert max(n for n in compiled if oracle.peak(n) <= budget) == fit.size
        if fit.size < 3000:  # a larger size, past one that does not fit, fits: not the largest of all
            assert any(oracle.peak(n) <= budget for n in range(fit.size + 2, fit.size + 20))


# -- inputs as ts.cost takes them --------------------------------------------------------
def layer(w, x):
    return jnp.tanh(x @ w)


W = jax.ShapeDtypeStruct((256, 64), F32)


def test_partials_keywords_and_the_cache(compiles):
    first = ts.largest_fit(layer, W, jax.ShapeDtypeStruct((B, 256), F32), dim="b", budget=2**20)
    assert first.compiles == len(compiles) > 0
    inputs = lambda n: (W, jax.ShapeDtypeStruct((n, 256), F32))  # noqa: E731
    Oracle(layer, inputs).check(first, 2**20)
    again = ts.largest_fit(layer, W, jax.ShapeDtypeStruct((B, 256), F32), dim="b", budget=2**20)
    assert again == dataclasses.replace(first, compiles=0)  # every size answered from the cache
    for fn, args, kwargs in [
        (ft.partial(layer, W), (jax.ShapeDtypeStruct((B, 256), F32),), {}),
        (jtu.Partial(layer, W), (jax.ShapeDtypeStruct((B, 256), F32),), {}),
        (ft.partial(layer, x=jax.ShapeDtypeStruct((B, 256), F32)), (W,), {}),  # the dimension in a partial
        (layer, (), {"w": W, "x": jax.ShapeDtypeStruct((B, 256), F32)}),
    ]:
        fit = ts.largest_fit(fn, *args, dim="b", budget=2**20, **kwargs)
        assert (fit.size, fit.cost) == (first.size, first.cost)


def test_margin_keeps_part_of_the_budget_free():
    inputs = (W, jax.ShapeDtypeStruct((B, 256), F32))
    fit = ts.largest_fit(layer, *inputs, dim="b", budget=2**20, margin=0.25)
    same = ts.largest_fit(layer, *inputs, dim="b", budget=math.floor(0.75 * 2**20))
    assert fit.size == same.size < ts.largest_fit(layer, *inputs, dim="b", budget=2**20).size
    assert fit.cost.peak_bytes <= 0.75 * 2**20
    assert (fit.budget, fit.margin) == (2**20, 0.25)


def test_max_size():
    fit = ts.largest_fit(double, *rows(B), dim="b", budget=10**9, max_size=1000)
    assert (fit.size, fit.compiles) == (1000, 3)  # sizes 1, 64 and 1000: it fits at max_size
    small = ts.largest_fit(double, *rows(B), dim="b", budget=10**9, max_size=40)
    assert (small.size, small.compiles, small.per_unit_bytes) == (40, 1, 800.0)  # 1 (cached) and 40
    ts.clear_cache()
    one = ts.largest_fit(double, *rows(B), dim="b", budget=10**9, max_size=1)
    assert (one.size, one.compiles, one.fixed_bytes, one.per_unit_bytes) == (1, 1, None, None)


def test_the_default_budget_is_the_devices_limit(monkeypatch):
    device_type = type(jax.devices()[0])
    monkeypatch.setattr(device_type, "memory_stats", lambda self: {"bytes_limit": 10**6})
    fit = ts.largest_fit(double, *rows(B), dim="b")
    assert (fit.budget, fit.size, fit.cost.device_bytes) == (10**6, 1250, 10**6)


@pytest.mark.parametrize(
    "transform",
    [
        pytest.param(lambda body, t: jax.jit(body)(t), id="jit"),
        pytest.param(lambda body, t: jax.vmap(body)(jnp.stack([t, t])), id="vmap"),
    ],
)
def test_inside_a_transformation(transform):
    """A tracer closed over is an argument of the program, per example under vmap."""
    found = []

    def body(t):
        found.append(ts.largest_fit(lambda x: x * t, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=10**5))
        return t

    transform(body, jnp.ones(100, F32))
    top = ts.largest_fit(lambda x, t: x * t, *rows(B), jax.ShapeDtypeStruct((100,), F32), dim="b", budget=10**5)
    assert (found[0].size, found[0].cost) == (top.size, top.cost)
    assert top.size == (10**5 - 400) // 800


# -- the table ---------------------------------------------------------------------
def test_table_notes_say_what_the_search_did():
    cost = ts.Cost(
        flops=0.0,
        bytes_accessed=0,
        argument_bytes=400,
        output_bytes=400,
        temp_bytes=0,
        alias_bytes=0,
        peak_bytes=800,
        device_bytes=None,
    )
    plain = ts.Fit(dim="b", size=100, cost=cost, fixed_bytes=0.0, per_unit_bytes=8.0, budget=1000, compiles=4)
    assert (plain.monotone, plain.capped) == (True, False)  # the fields added later have defaults
    assert "note" not in str(plain) and "<p>" not in plain._repr_html_()
    both = dataclasses.replace(plain, monotone=False, capped=True)
    notes = str(both).splitlines()[-2:]
    assert notes == [
        "note: the budget was not reached: b=100 is max_size, and a larger max_size may fit more",
        "note: the peak falls somewhere as b grows (a size compiled has a smaller peak than a smaller one): a b "
        "larger than 101 may fit too",
    ]
    assert both._repr_html_().endswith(
        "<p>note: the peak falls somewhere as b grows (a size compiled has a smaller peak than a smaller one): a b "
        "larger than 101 may fit too</p>"
    )


def test_table_and_html():
    fit = ts.largest_fit(double, *rows(B), dim="b", budget=123_457, margin=0.1)
    lines = str(fit).splitlines()
    assert lines[0].split() == ["largest", "fit", "value", "exact"]
    assert lines[2].split() == ["b", "138", "138"]  # floor(0.9 * 123457 / 800)
    assert lines[3].split()[:3] == ["peak", "at", "b=138"] and lines[3].endswith("110,400")
    assert lines[4].endswith("111,111") and lines[5].endswith("123,457")
    assert lines[6].split() == ["margin", "10%"]
    assert lines[8].split() == ["per", "unit", "of", "b", "800", "B", "800"]
    assert lines[9].split() == ["programs", "compiled", "4"]
    html = fit._repr_html_()
    assert html.startswith('<table class="treeshape-fit"') and "110,400" in html


# -- errors --------------------------------------------------------------------------
def test_the_dimension_must_be_the_only_free_one():
    x = jax.ShapeDtypeStruct((B, 256), F32)
    with pytest.raises(
        ValueError, match=r"dim='c' is not a free dimension of the inputs; their free dimensions are b\."
    ):
        ts.largest_fit(layer, W, x, dim="c", budget=2**20)
    (b, s) = jax.export.symbolic_shape("b, s")
    two = ts.structure_of({"tokens": jax.ShapeDtypeStruct((b, s), jnp.int32)})
    with pytest.raises(
        ValueError, match=r"free dimensions are b, s, and only dim='b' is searched.*s\.bind\(s=\.\.\.\)"
    ):
        ts.largest_fit(lambda t: t["tokens"] * 2, two, dim="b", budget=2**20)
    fit = ts.largest_fit(lambda t: t["tokens"] * 2, two.bind(s=128), dim="b", budget=2**20)
    assert fit.size == 2**20 // (128 * 4 * 2)
    with pytest.raises(ValueError, match=r"no free dimension.*jax\.export\.symbolic_shape\('b'\)"):
        ts.largest_fit(layer, W, jax.ShapeDtypeStruct((8, 256), F32), dim="b", budget=2**20)


def test_no_budget_on_cpu():
    with pytest.raises(
        ValueError, match=r"no budget given, and the device reports no memory limit.*budget=16 \* 2\*\*30"
    ):
        ts.largest_fit(double, *rows(B), dim="b")


def test_a_program_that_does_not_fit_at_size_one():
    peak = oracle_peak(layer, W, jax.ShapeDtypeStruct((1, 256), F32))
    message = (
        f"even b=1 does not fit: peak {peak / 1024:.1f} KiB ({peak:,} B) per device > limit 900 B (900 B: budget "
        "1000 B less a 10% margin). Raise the budget"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        ts.largest_fit(layer, W, jax.ShapeDtypeStruct((B, 256), F32), dim="b", budget=1000, margin=0.1)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"dim": 3}, TypeError, "dim must be the name of a symbolic dimension (a str such as 'b'), got int 3"),
        ({"budget": "16GiB"}, TypeError, "budget must be a number, got str '16GiB'"),
        ({"budget": 0}, ValueError, "budget must be a number of bytes >= 1"),
        ({"budget": float("inf")}, ValueError, "budget must be a number of bytes >= 1"),
        ({"margin": 1.0}, ValueError, "margin must be the fraction of the budget kept free, in [0, 1)"),
        ({"margin": -0.1}, ValueError, "in [0, 1)"),
        ({"margin": True}, TypeError, "margin must be a number, got bool True"),
        ({"max_size": 0}, ValueError, "max_size must be >= 1"),
        ({"max_size": 1e6}, TypeError, "max_size must be an int >= 1, got float 1000000.0"),
    ],
)
def test_bad_arguments(options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ts.largest_fit(double, *rows(B), **{"dim": "b", "budget": 10**6, **options})


def test_sizes_the_shapes_do_not_allow():
    (c,) = jax.export.symbolic_shape("c", constraints=["c <= 100"])
    with pytest.raises(
        ValueError, match=r"c=1048576 breaks the constraint 'c <= 100'.*pass max_size=100, which they allow"
    ):
        ts.largest_fit(double, jax.ShapeDtypeStruct((c, 100), F32), dim="c", budget=10**9)
    fit = ts.largest_fit(double, jax.ShapeDtypeStruct((c, 100), F32), dim="c", budget=10**9, max_size=100)
    assert fit.size == 100
    with pytest.raises(
        ValueError, match=re.escape("at b=1, args[0] has a negative size ((b - 8, 100) gives (-7, 100))")
    ):
        ts.largest_fit(double, jax.ShapeDtypeStruct((B - 8, 100), F32), dim="b", budget=10**9)


def test_what_does_not_fit_is_a_fit_error_users_can_catch():
    """`ts.FitError`, public, is the base of the `SizeError` (a size the shapes do not allow)
    and the `BudgetError` (even size 1 does not fit) that largest_fit raises."""
    assert issubclass(ts.SizeError, ts.FitError) and issubclass(ts.BudgetError, ts.FitError)
    assert issubclass(ts.FitError, ValueError)
    with pytest.raises(ts.BudgetError) as over:
        ts.largest_fit(layer, W, jax.ShapeDtypeStruct((B, 256), F32), dim="b", budget=1000, margin=0.1)
    peak = oracle_peak(layer, W, jax.ShapeDtypeStruct((1, 256), F32))
    assert (over.value.peak, over.value.limit) == (peak, 900)
    with pytest.raises(ts.SizeError) as negative:
        ts.largest_fit(double, jax.ShapeDtypeStruct((B - 8, 100), F32), dim="b", budget=10**9)
    assert (negative.value.n, negative.value.index) == (1, 0)
    assert negative.value.problem == "has a negative size ((b - 8, 100) gives (-7, 100))"
    (c,) = jax.export.symbolic_shape("c", constraints=["c <= 100"])
    with pytest.raises(ts.FitError) as constrained:
        ts.largest_fit(double, jax.ShapeDtypeStruct((c, 100), F32), dim="c", budget=10**9)
    assert type(constrained.value) is ts.SizeError and constrained.value.largest == 100


def test_a_size_one_the_targets_compiler_refuses_is_a_budget_error():
    """libtpu refuses 16 GiB of argument on a v5e (15.75 GiB): even b=1 does not fit, its
    peak unknown, and the command line says so as bad input."""
    x = jax.ShapeDtypeStruct((B, 2**17, 2**15), F32)
    with pytest.raises(ts.BudgetError, match=r"^treeshape\.largest_fit: even b=1 does not fit: the program does") as e:
        ts.largest_fit(jnp.sin, x, dim="b", target="v5e", max_size=4)
    assert e.value.peak is None and e.value.limit == 16_911_433_728
    assert "TPU v5e's compiler refuses it (" in str(e.value)


@pytest.mark.parametrize("bad", [1.5, "0", (0, 1.5), True, (True,), [0, "1"]])
def test_donate_argnums_of_another_type_is_a_type_error_naming_it(bad, compiles):
    """In cost, largest_fit and plan alike, before anything compiles (a float was a raw
    `'float' object is not iterable` from deep inside)."""
    x = jax.ShapeDtypeStruct((B, 100), F32)
    expected = r"^treeshape\.{}: donate_argnums must be an int or a sequence of ints \(positions of the arguments"
    with pytest.raises(TypeError, match=expected.format("cost")):
        ts.cost(double, jax.ShapeDtypeStruct((8, 100), F32), donate_argnums=bad)
    with pytest.raises(TypeError, match=expected.format("largest_fit")):
        ts.largest_fit(double, x, dim="b", budget=10**6, donate_argnums=bad)
    with pytest.raises(TypeError, match=expected.format("plan")):
        ts.plan(lambda n: (double, x), {"n": [1]}, target="v5e", donate_argnums=bad)
    with pytest.raises(
        TypeError, match=r"^treeshape\.largest_fit: donate_argnames must be a str or a sequence of strs"
    ):
        ts.largest_fit(double, x, dim="b", budget=10**6, donate_argnames=0)
    assert compiles == []


def test_donate_argnums_as_jax_jit_takes_them():
    """An int, a sequence of ints (NumPy's too), None for none."""
    import numpy as np

    fits = [ts.largest_fit(double, *rows(B), dim="b", budget=2**20, donate_argnums=d) for d in (None, 0, [np.int64(0)])]
    assert fits[0].size < fits[1].size == fits[2].size and fits[1].cost.donation == fits[2].cost.donation


def test_errors_of_fn_propagate():
    with pytest.raises(TypeError, match="callable"):
        ts.largest_fit(3, *rows(B), dim="b", budget=10**6)

    def broken(x):
        raise KeyError("the user's own")

    with pytest.raises(KeyError, match="the user's own"):
        ts.largest_fit(broken, *rows(B), dim="b", budget=10**6)


# -- command line -------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("17179869184", 16 * 2**30),
        ("16GiB", 16 * 2**30),
        ("16 gib", 16 * 2**30),
        ("1.5GiB", 3 * 2**29),
        ("512MiB", 2**29),
        ("64KiB", 2**16),
        ("2TiB", 2**41),
        ("16GB", 16 * 10**9),
        ("80 GB", 80 * 10**9),
        ("1.5KB", 1500),
        ("100MB", 10**8),
        ("1TB", 10**12),
        ("100B", 100),
    ],
)
def test_budgets_with_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "16GiG"], "--budget: malformed amount of bytes '16GiG': expected a number of bytes, or a number"),
        (["--budget", "0.1B"], "--budget: '0.1B' is less than one byte"),
        (["--budget", "1MiB", "--margin", "1.5"], "margin must be the fraction of the budget kept free, in [0, 1)"),
        (["--budget", "1MiB"], "dim='b', but the inputs have no free dimension. Give the dimension to search a name"),
        ([], "--budget is required: the device (cpu) reports no memory limit; e.g. --budget 16GiB"),
        (None, "the following arguments are required: --dim"),
    ],
)
def test_command_line_bad_input(capsys, argv, message):
    dim = [] if argv is None else ["--dim", "b"]
    argv = argv or []
    assert main(["fit", "jax.numpy:matmul", "f32[8,784]", "f32[784,10]", *dim, *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("treeshape: error: ") and len(err.splitlines()) == 1
    assert message in err


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "treeshape", *argv], capture_output=True, text=True, timeout=300)


def test_command_line():
    result = _cli("fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", "1MiB")
    assert result.returncode == 0, result.stderr
    x, w = jax.ShapeDtypeStruct((B, 784), F32), jax.ShapeDtypeStruct((784, 10), F32)
    assert result.stdout.strip() == str(ts.largest_fit(jnp.matmul, x, w, dim="b", budget=2**20))


def test_command_line_names(capsys):
    assert main(["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "c", "--budget", "1MiB"]) == 2
    assert "dim='c' is not a free dimension of the inputs; their free dimensions are b" in capsys.readouterr().err
    assert main(["fit", "jax.numpy:add", "f32[b,s]", "f32[b,s]", "--dim", "b", "--budget", "1MiB"]) == 2
    assert "Give the others sizes first: concrete sizes in the specs" in capsys.readouterr().err
    assert main(["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", "1KiB"]) == 2
    peak = oracle_peak(jnp.matmul, jax.ShapeDtypeStruct((1, 784), F32), jax.ShapeDtypeStruct((784, 10), F32))
    assert capsys.readouterr().err == (
        f"treeshape: error: even b=1 does not fit: its peak is {peak / 1024:.1f} KiB ({peak:,} B) per device, over "
        f"the limit of 1.0 KiB (1,024 B): pass --budget {math.ceil(peak * 10 / 1024) / 10:g}KiB or more\n"
    )
    budget = f"{math.ceil(peak * 10 / 1024) / 10:g}KiB"  # the budget it names fits
    assert main(["fit", "jax.numpy:matmul", "f32[b,784]", "f32[784,10]", "--dim", "b", "--budget", budget]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[0] == "b"  # size 1 fits, perhaps more


# -- what the table says of its figures -------------------------------------------------
def test_a_peak_that_does_not_grow_in_a_line_shows_no_fixed_or_per_unit_figure():
    """A b x b output: the line through the answer and a size compiled below it meets b = 0
    below zero, so the table shows neither figure, and says why."""
    fit = ts.largest_fit(lambda x: x @ x.T, jax.ShapeDtypeStruct((B, 64), F32), dim="b", budget=2**22)
    peak = fit.cost.peak_bytes
    assert fit.size > 64 and peak >= 4 * fit.size**2  # the b x b output: quadratic in b
    assert fit.fixed_bytes < 0 and fit.fixed_bytes + fit.per_unit_bytes * fit.size == peak
    text = str(fit)
    assert re.search(r"^fixed +not shown$", text, flags=re.MULTILINE)
    assert re.search(r"^per unit of b +not shown$", text, flags=re.MULTILINE)
    [note] = [line for line in text.splitlines() if line.startswith("note: fixed")]
    assert note == (
        f"note: fixed and per unit are not shown: the line through the sizes compiled near b={fit.size} falls below "
        "zero toward b=0 (the peak does not grow in a line in b)"
    )
    assert "fixed -" not in text and "not shown" in fit._repr_html_()
    off = dataclasses.replace(fit, fixed_bytes=1000.0, per_unit_bytes=100.0)  # a line far below the answer
    assert re.search(r"note: fixed and per unit are not shown: the line through the sizes compiled gives [\d.]+ KiB "
                     rf"at b={fit.size}, not its peak of [\d.]+ MiB \(the peak", str(off))  # fmt: skip


def test_a_negative_fixed_size_is_never_shown_and_a_line_near_the_answer_is():
    cost = ts.Cost(
        flops=0.0,
        bytes_accessed=0,
        argument_bytes=400,
        output_bytes=400,
        temp_bytes=0,
        alias_bytes=0,
        peak_bytes=800,
        device_bytes=None,
    )
    near = ts.Fit(dim="b", size=100, cost=cost, fixed_bytes=20.0, per_unit_bytes=7.5, budget=1000, compiles=4)
    assert re.search(r"^fixed +20 B +20$", str(near), flags=re.MULTILINE) and "note" not in str(near)
    negative = dataclasses.replace(near, fixed_bytes=-249_141.0, per_unit_bytes=2_499.0)  # through 800 B at b=100
    assert re.search(r"^fixed +not shown$", str(negative), flags=re.MULTILINE) and "-249" not in str(negative)


def test_the_table_says_where_its_figures_come_from_as_the_cost_does():
    cost = ts.Cost(
        flops=0.0,
        bytes_accessed=0,
        argument_bytes=400,
        output_bytes=400,
        temp_bytes=0,
        alias_bytes=0,
        peak_bytes=800,
        device_bytes=None,
        backend="cpu x32 (simulated)",
    )
    fit = ts.Fit(dim="b", size=100, cost=cost, fixed_bytes=0.0, per_unit_bytes=8.0, budget=1000, compiles=4)
    [said] = [line for line in str(cost).splitlines() if line.startswith("compiled for: ")]
    assert said.startswith("compiled for: cpu x32 (simulated): ")
    assert said in str(fit).splitlines() and html.escape(said) in fit._repr_html_()
    local = dataclasses.replace(fit, cost=dataclasses.replace(cost, backend="cpu x8"))
    assert "compiled for" not in str(local) and "compiled for" not in str(local.cost)


def test_the_hosts_bytes_are_over_the_device_limit_on_its_scale_exactly_where_over_host_budget():
    # One number judges both budgets: the host's bytes scaled to the device's limit (rounded
    # up) pass it exactly where they pass the host budget; the larger of the two is judged.
    from treeshape._cost import _budget

    limit, host_limit = 1000, 64
    scaled = {host: _budget.on_device_scale(0, host, limit, host_limit) for host in range(1, 200)}
    assert all((scaled[host] > limit) == (host > host_limit) for host in scaled)
    assert _budget.on_device_scale(900, 32, limit, host_limit) == 900  # the device's peak, the larger
    assert _budget.limit(1000, 0.15) == 850 and _budget.limit(999, 0.5) == 499
