"""The search behind `ts.largest_fit`: its answer and its number of compilations, over
peak curves of every shape (lines, steps, quadratics, sawtooth, constant, random and an
adversary that answers so as to keep the larger half), through the search's internal
seam with a fake peak function, and over real programs through `ts.largest_fit`, whose
compilations the `compiles` fixture counts from JAX's own monitoring events."""

import math
import re

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, strategies as st

import treeshape as ts
from treeshape._cost._search import find_size


F32 = jnp.float32
(B,) = jax.export.symbolic_shape("b")


def bound(max_size):
    """At most `ceil(log2(max_size)) + 4` compilations, size 1 included."""
    return math.ceil(math.log2(max_size)) + 4 if max_size > 1 else 1


def run(peak, limit, max_size):
    """`find_size` on `peak`, checked: size 1 first, no size twice, the answer fits next to
    a size that does not (or is max_size). Returns the size and the sizes compiled."""
    asked = []

    def peak_at(n):
        assert 1 <= n <= max_size
        asked.append(n)
        return peak(n)

    size, known = find_size(peak_at, limit, max_size)
    assert asked[0] == 1 and len(asked) == len(set(asked)) == len(known)
    assert known == {n: peak(n) for n in asked}
    assert peak(size) <= limit
    assert size == max_size or (size + 1 in known and peak(size + 1) > limit)
    assert len(asked) <= bound(max_size), (len(asked), bound(max_size))
    return size, asked


def limits(draw, peak, max_size):
    """A limit that size 1 fits: a peak hit exactly (at 1, at max_size, at a size drawn),
    or a value between peaks."""
    kind = draw(st.sampled_from(["at 1", "at max_size", "at a size", "between"]))
    if kind == "at 1":
        return peak(1)
    if kind == "at max_size":
        return max(peak(1), peak(max_size))
    n = draw(st.integers(1, max_size))
    return max(peak(1), peak(n) + (draw(st.integers(0, max(0, peak(n) // 2))) if kind == "between" else 0))


@st.composite
def curves(draw):
    """`(name, peak, limit, max_size)` for a curve of a drawn family."""
    max_size = draw(st.one_of(st.just(2**20), st.integers(1, 2**24)))
    fixed = draw(st.integers(0, 10**9))
    per = draw(st.integers(1, 10**4))
    family = draw(st.sampled_from(["linear", "steps", "pow2 steps", "quadratic", "cubic", "sawtooth", "constant"]))
    if family == "linear":
        peak = lambda n: fixed + per * n  # noqa: E731
    elif family == "steps":  # padding to a tile of `tile` rows
        tile = draw(st.sampled_from([8, 64, 128, 1000]))
        peak = lambda n: fixed + per * n + per * tile * -(-n // tile)  # noqa: E731
    elif family == "pow2 steps":  # padding to a power of two
        peak = lambda n: fixed + per * (1 << (n - 1).bit_length())  # noqa: E731
    elif family == "quadratic":
        quad = draw(st.integers(1, 100))
        peak = lambda n: fixed + per * n + quad * n * n  # noqa: E731
    elif family == "cubic":
        peak = lambda n: fixed + n**3  # noqa: E731
    elif family == "sawtooth":  # not monotone
        period = draw(st.integers(2, 1000))
        peak = lambda n: fixed + per * n + per * 50 * ((n * 37) % period)  # noqa: E731
    else:
        peak = lambda n: fixed  # noqa: E731
    return family, peak, limits(draw, peak, max_size), max_size


@given(curves())
def test_every_curve_is_answered_within_the_bound(curve):
    family, peak, limit, max_size = curve
    size, asked = run(peak, limit, max_size)
    if family == "linear":
        assert len(asked) <= 4
        assert size == min(max_size, (limit - peak(0)) // (peak(1) - peak(0)))
    if family == "constant":
        assert size == max_size and len(asked) <= 4  # sizes 1, 4, 64 and max_size


@given(st.integers(1, 2**30), st.data())
def test_random_peaks_are_answered_within_the_bound(max_size, data):
    """Peaks drawn at random as the search asks (monotone or not): any curve at all."""
    monotone = data.draw(st.booleans())
    drawn = {}

    def peak(n):
        if n not in drawn:
            if monotone:
                below = max((p for m, p in drawn.items() if m < n), default=0)
                above = min((p for m, p in drawn.items() if m > n), default=below + 10**6)
                drawn[n] = data.draw(st.integers(below, above))
            else:
                drawn[n] = data.draw(st.integers(0, 10**6))
        return drawn[n]

    limit = max(peak(1), data.draw(st.integers(0, 10**6)))
    run(peak, limit, max_size)


@pytest.mark.parametrize("max_size", [1, 2, 3, 64, 65, 1000, 2**20, 2**20 + 1, 2**40])
def test_an_adversary_that_keeps_the_larger_half(max_size):
    """Each size fits or not so as to leave the wider bracket: the worst case of any search.
    The bound holds, 3 above bisection's count."""
    lo, hi = 1, max_size + 1

    def peak(n):
        nonlocal lo, hi
        if n == 1:
            return 0
        if hi - n >= n - lo:
            lo = n
            return 0
        hi = n
        return 2

    _, asked = run(peak, 1, max_size)
    assert len(asked) >= 1 + math.ceil(math.log2(max_size))  # no search does better against it: bisection's count


def test_the_default_max_size_is_answered_in_at_most_24_for_steps():
    """Padding to a power of two, the budget between two steps: 24 at most where the
    search of 0.3 took 27."""
    peak = lambda n: 4096 * (1 << (n - 1).bit_length())  # noqa: E731
    for answer in (2**k for k in range(6, 20)):
        size, asked = run(peak, 4096 * answer + 1000, 2**20)
        assert size == answer


def test_a_line_is_answered_in_four():
    """Sizes 1, 4, the size past where the line reaches the budget, and the one before."""
    peak = lambda n: 1000 + 800 * n  # noqa: E731
    size, asked = run(peak, 1000 + 800 * 70_000 + 799, 2**20)
    assert size == 70_000
    assert asked == [1, 4, 70_001, 70_000]


@pytest.mark.parametrize("max_size", [2, 3, 4, 1000, 2**20])
def test_from_one_size_the_next_is_at_most_four_times_it(max_size):
    """One size says nothing of how the peak grows (a line needs two): the second size is
    4 (or max_size, if smaller), never 64, which for a step of a few GiB per unit is a far
    and slow compile (on a target, a slow refusal) whatever the budget."""
    gib = 2**30
    size, asked = run(lambda n: 3 * gib * n, 10 * gib, max_size)
    assert asked[1] == min(4, max_size) and size == min(3, max_size)


def test_a_peak_padded_at_small_sizes_is_followed_past_the_padding():
    """At least 16 rows (a tile of bf16 rows on a TPU): sizes 1 and 4 have the same peak,
    which says nothing of its growth. The search tries 64, past the padding, and follows
    the line from there: never max_size, and within 8 compilations."""
    peak = lambda n: 10**6 + 8192 * max(n, 16)  # noqa: E731
    size, asked = run(peak, peak(5000) + 100, 2**20)
    assert size == 5000 and asked[:3] == [1, 4, 64] and 2**20 not in asked and len(asked) <= 8


def test_a_dip_between_neighbours_is_not_read_as_a_peak_that_stops_growing():
    """XLA:GPU planned the guide's 124M step for 64 H100s at 58.9 GiB for b = 64 and 58.2
    GiB for b = 65: a line through those two falls. The search then follows the line
    from below (doubling where the line proved short), not max_size, where XLA:GPU fails
    outright on the size."""
    gib = 2**30

    def peak(n):
        return int((1.8 + 0.9 * (n - 1)) * gib) - (gib if n % 5 == 0 else 0)

    assert peak(65) < peak(64)
    size, asked = run(peak, int(59.3 * gib), 2**20)
    assert asked[:3] == [1, 4, 65] and 2**20 not in asked
    assert size == 65 and len(asked) <= 6


# -- real programs through ts.largest_fit --------------------------------------------
def oracle_peak(f, *args):
    m = jax.jit(f).lower(*args).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def padded(x):
    """Rows padded to a multiple of 64: a peak with steps."""
    return jnp.pad(x, ((0, -x.shape[0] % 64), (0, 0))) * 2


def outer(x):
    """A peak quadratic in the size."""
    return x[:, None] * x[None, :]


def double(x):
    return 2 * x


@pytest.mark.parametrize(
    "f, inputs, budget",
    [
        (double, lambda n: (jax.ShapeDtypeStruct((n, 100), F32),), 123_457),
        (padded, lambda n: (jax.ShapeDtypeStruct((n, 16), F32),), 10**8),
        (padded, lambda n: (jax.ShapeDtypeStruct((n, 16), F32),), 1_100_000),
        (outer, lambda n: (jax.ShapeDtypeStruct((n,), F32),), 10**8),
    ],
    ids=["linear", "steps-large", "steps-small", "quadratic"],
)
def test_real_programs_within_the_bound(compiles, f, inputs, budget):
    fit = ts.largest_fit(f, *inputs(B), dim="b", budget=budget)
    assert fit.compiles == len(compiles) <= 24
    if f is double:
        assert fit.compiles == 4
    assert oracle_peak(f, *inputs(fit.size)) == fit.cost.peak_bytes <= budget
    assert oracle_peak(f, *inputs(fit.size + 1)) > budget
    assert (fit.monotone, fit.capped) == (True, False)


def test_a_program_that_fits_at_max_size_is_capped(compiles):
    fit = ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=10**9, max_size=5000)
    assert (fit.size, fit.capped, fit.monotone, fit.compiles, len(compiles)) == (5000, True, True, 3, 3)


def test_a_cheaper_path_above_some_size_is_not_monotone():
    """Where a larger size compiled has a smaller peak than a smaller one, `monotone` is
    False; XLA's own peaks say so."""

    def saw(x):
        n = x.shape[0]
        return x * 2, jnp.ones(((n * 37) % 101) * 64, F32) * x.sum()

    inputs = lambda n: (jax.ShapeDtypeStruct((n,), F32),)  # noqa: E731
    fit = ts.largest_fit(saw, *inputs(B), dim="b", budget=20_000, max_size=3000)
    assert not fit.monotone
    assert "may fit too" in str(fit)


def test_progress_is_a_line_as_each_compilation_starts_one_as_it_ends_and_a_summary(capsys, compiles):
    fit = ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=123_457, progress=True)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 2 * fit.compiles + 1 and fit.compiles == len(compiles) == 4
    starts, ends = lines[0:8:2], lines[1:8:2]
    assert starts == [f"treeshape.largest_fit: b={n}: compiling" for n in (1, 4, 155, 154)]
    assert ends[0].startswith("treeshape.largest_fit: b=1: peak 800 B, fits; the answer is in 1..1048576; ")
    assert ends[1].startswith("treeshape.largest_fit: b=4: peak 3.1 KiB (3,200 B), fits; the answer is in 4..1048576; ")
    assert ends[2].startswith(
        "treeshape.largest_fit: b=155: peak 121.1 KiB (124,000 B), over the limit of 123,457 B; the answer is in "
        "4..154; "
    )
    assert ends[3].startswith("treeshape.largest_fit: b=154: peak 120.3 KiB (123,200 B), fits; the answer is 154; ")
    assert all(re.search(r"; \d+\.\d\d s$", line) for line in ends)
    assert re.fullmatch(
        r"treeshape.largest_fit: b=154 fits \(peak 123,200 B, limit 123,457 B\) and b=155 does not; "
        r"4 programs compiled in \d+\.\d s",
        lines[8],
    )
    again = ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=123_457, progress=True)
    assert again.compiles == 0 and len(capsys.readouterr().err.splitlines()) == 1  # the summary alone
    ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=123_456)
    assert capsys.readouterr() == ("", "")


def test_progress_when_nothing_fits(capsys):
    with pytest.raises(ValueError, match="even b=1 does not fit"):
        ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=100, progress=True)
    start, line = capsys.readouterr().err.splitlines()
    assert start == "treeshape.largest_fit: b=1: compiling"
    assert line.startswith("treeshape.largest_fit: b=1: peak 800 B, over the limit of 100 B; the answer is none; ")


def test_progress_must_be_a_bool():
    with pytest.raises(TypeError, match="progress must be True or False, got str 'yes'"):
        ts.largest_fit(double, jax.ShapeDtypeStruct((B, 100), F32), dim="b", budget=10**6, progress="yes")


def test_sizes_xla_cannot_count_are_refused_before_compiling(compiles):
    big = jax.ShapeDtypeStruct((B, 2**40, 1024), F32)
    message = (
        "treeshape.largest_fit: at b=1048576, args[0] (f32[1048576,1099511627776,1024]) has "
        "1,180,591,620,717,411,303,424 elements, more than 2**63 - 1. The search tries sizes up to "
        "max_size=1048576: pass max_size=2047, which they allow."
    )
    with pytest.raises(ValueError) as info:
        ts.largest_fit(lambda x: x * 2, big, dim="b", budget=10**9)
    assert str(info.value) == message
    assert compiles == []


def test_a_guess_off_the_probes_line_never_reaches_past_four_times_the_largest_size():
    """A curve that bends down (the line through the two largest sizes that fit is short
    each time): the search's next size is the line's own guess, or at most 4x the largest
    size compiled so far, so that no far guess costs a slow compile (or a slow refusal)."""

    def peak(n):
        return int(1e6 * (1 + n**0.5))

    limit, max_size = peak(200_000), 2**20
    size, asked = run(peak, limit, max_size)
    assert size == 200_000
    for i in range(2, len(asked)):
        fitting = sorted(n for n in asked[:i] if peak(n) <= limit)
        if len(fitting) < 2 or any(peak(n) > limit for n in asked[:i]):
            continue  # bracketed: the window bounds it
        a, b = fitting[-2:]
        on_line = b + (limit - peak(b)) * (b - a) // (peak(b) - peak(a)) + 1
        left = (max_size - 1).bit_length() + 3 - (i - 1)  # compilations left before this one
        window = max_size + 1 - 2 ** (left - 1)
        assert asked[i] <= 4 * b + 1 or asked[i] in (on_line, window), (asked[: i + 1], on_line, window)
