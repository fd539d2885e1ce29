"""The search behind `largest_fit`: the largest size `n` whose peak, as a callback
compiles it, is within a limit while `n + 1`'s is not, in at most `ceil(log2(max_size)) + 4`
compilations for any curve (`find_size`), with the guesses that make a line take 4
(`_guess`) and how a size the target's compiler fails on is judged by the sizes below it
(`far_over`). Knows nothing of programs: sizes and peaks only.

The search keeps a bracket: `lo`, the largest size compiled that fits, and `hi`, the
smallest size above it compiled that does not (`max_size + 1` until one is found), and
compiles only sizes strictly between them; it ends when `hi == lo + 1` (or `lo ==
max_size`), so the answer fits and the next size was compiled and does not. Sizes are
guessed from compiled peaks (`_guess`): from size 1 alone the next is at most 4x it (one
size says nothing of how the peak grows, and a far size is a slow compile, on a target a
slow refusal), and a line through sizes 1 and 4 that is right says where the peak passes
the budget, so a program whose peak is linear in the size takes 4 compilations (sizes 1,
4, `n + 1`, `n`); a power law through the bracket's ends follows
a quadratic, and plateaus (padding) are split at round sizes. Each guess is held in a
window that bounds the search for any curve at `ceil(log2(max_size)) + 4` compilations,
3 more than bisection (the proof is `find_size`'s docstring).
"""

import math
from collections.abc import Callable
from typing import Final


# How far past the largest size compiled a guess not on a line through sizes compiled may
# reach: from size 1 alone (no line yet), the second probe is this far.
_REACH: Final = 4
# The second probe: 4x size 1, as far as one size lets a guess reach.
SECOND_PROBE: Final = _REACH
# Where sizes 1 and 4 have the same peak, the size tried next: past the padding of small
# sizes to a tile of rows (8 to 32 on a TPU), which hides how the peak grows; the search
# tries `max_size` only where the peak has not grown by then either.
_PAST_PADDING: Final = 64
# Compilations allowed beyond bisection's (`1 + ceil(log2(max_size))`, size 1 included).
_SLACK: Final = 3


def rising(peaks: dict[int, int], b: int) -> tuple[int, int]:
    """The two sizes whose line extrapolates past `b`: the largest below `b` and `b`; or
    size 1 and `b` where the peak falls between those two (XLA changed kernels between
    them), so that a dip between neighbours is not read as a peak that stops growing."""
    a = max(m for m in peaks if m < b)
    return (a, b) if peaks[b] > peaks[a] or a == 1 else (1, b)


def far_over(n: int, judged: dict[int, int | None], limit: int) -> tuple[float, int, int] | None:
    """The peak at `n` on the line through two sizes below it (`_rising`), and those sizes,
    where that puts `n` a quarter or more over `limit` (a size the target's compiler fails
    on, judged by the peaks of the sizes it compiled); else None."""
    peaks = {m: p for m, p in judged.items() if m < n and p is not None}
    if len(peaks) < 2:
        return None
    a, b = rising(peaks, max(peaks))
    if peaks[b] <= peaks[a]:
        return None
    peak = peaks[b] + (peaks[b] - peaks[a]) / (b - a) * (n - b)
    return (peak, a, b) if peak >= 1.25 * limit else None


class _Bracket:
    """The search's state: the peaks compiled so far (`known`, in the order compiled),
    `lo` (the largest size compiled that fits), `hi` (the smallest size above `lo`
    compiled that does not; `max_size + 1` until there is one) and `left`, how many
    more sizes the search may compile."""

    def __init__(
        self, peak_at: Callable[[int], int], limit: int, max_size: int, refused: Callable[[int], bool]
    ) -> None:
        self.peak_at, self.limit, self.max_size, self.refused = peak_at, limit, max_size, refused
        self.known = {1: peak_at(1)}
        self.lo, self.hi = 1, max_size + 1
        self.left = (max_size - 1).bit_length() + _SLACK  # ceil(log2(max_size)) + _SLACK

    def compile(self, n: int) -> None:
        """Compile size `n` (in `(lo, hi)`)."""
        self.known[n] = peak = self.peak_at(n)
        if peak <= self.limit:
            self.lo = n
        else:
            self.hi = n
        self.left -= 1

    def spare(self) -> int:
        """Compilations left beyond the `ceil(log2(hi - lo))` that bisection would need."""
        return self.left - (self.hi - self.lo - 1).bit_length()


def find_size(
    peak_at: Callable[[int], int],
    limit: int,
    max_size: int,
    on_step: Callable[[int, int, int, int], None] | None = None,
    refused: Callable[[int], bool] = lambda n: False,
) -> tuple[int, dict[int, int]]:
    """The size `n` in `1..max_size` with `peak_at(n) <= limit` and `peak_at(n + 1) > limit`
    (or `n == max_size`), and the peak of every size compiled on the way, in order. Size 1
    must fit. `on_step(n, peak, lo, hi)` is called after each size compiled past size 1.

    Each step compiles one size strictly between `lo` and `hi`, so no size is compiled
    twice. The size is the one `_guess` picks, held inside a window that bounds the number
    of compilations whatever the curve. The invariant is `hi - lo <= 2**left`, with `left`
    the compilations the search may still make. It holds at the start: `hi - lo =
    max_size <= 2**ceil(log2(max_size)) <= 2**left`. A step compiles a size `n` in
    `[hi - 2**(left - 1), lo + 2**(left - 1)]`; that window is not empty (it is `2**left -
    (hi - lo) >= 0` wide) and, while `hi - lo >= 2`, holds a size strictly between `lo`
    and `hi` (`left >= 1` then, so each end is at least one size inside). Whether `n`
    fits or not, the new bracket (`lo..n` or `n..hi`) is at most `2**(left - 1)` wide,
    with `left - 1` compilations left: the invariant holds again. So when `left` reaches
    0, `hi - lo <= 1` and the search has ended. With size 1, that is at most
    `1 + ceil(log2(max_size)) + _SLACK` compilations: `_SLACK` more than bisection, for
    guesses that miss. Where the guesses are right the window never binds; where they
    are wrong it closes in on the middle (once `hi - lo == 2**left`, the midpoint alone).
    """
    s = _Bracket(peak_at, limit, max_size, refused)
    while s.hi - s.lo > 1:
        reach = 2 ** (s.left - 1)  # the bracket after this step is at most this wide
        n = min(max(_guess(s), s.hi - reach, s.lo + 1), s.lo + reach, s.hi - 1)
        s.compile(n)
        if on_step is not None:
            on_step(n, s.known[n], s.lo, s.hi)
    return s.lo, s.known


def _guess(s: _Bracket) -> int:
    """The size to compile next, from the peaks compiled so far (`find_size` holds it in its
    window).

    1. The second probe, `SECOND_PROBE` (4: from one size, at most 4x it).
    2. Until a size does not fit: one past where the line through the two largest sizes
       that fit reaches the limit, so that a line that is right is checked by that size
       (which does not fit) and then the size before it. Where the peak has not grown,
       `_PAST_PADDING` (padding to a tile hides the growth of small sizes), then
       `max_size`. A line that proved short (a curve that bends down) gives way to the
       power law through those sizes, or to doubling, whichever is further, but never
       past `_REACH` times the largest size compiled where the line stops short of it
       (a far guess on a curve is a slow compile, and on a target a slow refusal).
    3. Between `lo` and `hi`: where the curve `peak(1) + c * (n**p - 1)` through both
       reaches the limit (a line for `p == 1`, as for most programs; `p` near 2 for
       attention scores quadratic in a sequence length); `lo + 1` when that is `lo`.
       Where the target's compiler refused `hi` (its peak is not known), where the line
       through the two largest sizes that fit reaches the limit, if inside the bracket
       (the refusal agrees with it), else halfway.
       Where `hi` moved twice in a row, `lo` may be stale (a kink between them, where
       XLA changes kernels): the line through the two sizes compiled last, if lower.
       Where the guess is next to an end whose peak another size shares (a plateau:
       padding to a tile), the roundest size in the bracket instead (the edges of
       padding are multiples of powers of two). With little to spare
       (`_Bracket.spare() <= 1`), an eighth of the way toward the nearer end, so that
       the outcome expected leaves the shorter side.
    """
    known, lo, hi, limit = s.known, s.lo, s.hi, s.limit
    if len(known) == 1:
        return SECOND_PROBE
    if hi > s.max_size:  # no size is known not to fit: every size compiled fits
        a, b = rising(known, b=max(known))
        rise = known[b] - known[a]
        if rise <= 0:  # no growth: past small sizes' padding, then the largest size
            return _PAST_PADDING if b < _PAST_PADDING else s.max_size
        n = b + (limit - known[b]) * (b - a) // rise
        if len(known) > 2 and n > b:  # the last line was short
            # A curve or doubling, never past 4x the largest size compiled (that line says fits).
            n = max(n, min(_power_law(known[1], a, known[a], b, known[b], limit) or n, _REACH * b), 2 * b)
        return n + 1
    if s.refused(hi):  # the compiler refused `hi`: no peak to draw a line to
        below = {m: p for m, p in known.items() if m <= lo}
        if len(below) > 1:  # the line through the sizes that fit, where it ends inside the bracket
            a, b = rising(below, lo)
            if known[b] > known[a] and lo < (n := b + (limit - known[b]) * (b - a) // (known[b] - known[a])) < hi:
                return n
        return (lo + hi) // 2
    line = lo + (limit - known[lo]) * (hi - lo) // (known[hi] - known[lo])
    curve = _power_law(known[1], lo, known[lo], hi, known[hi], limit)
    n = line if curve is None or abs(curve - line) <= 2 else curve  # where it is a line, the exact integer one
    a, b = list(known)[-2:]
    if a > 1 and known[a] > known[b] > limit:
        # `hi` moved twice, so `lo` may be stale (a kink between them, as where XLA changes
        # kernels): the line through the two sizes compiled last, where it is lower.
        n = min(n, max(b + (limit - known[b]) * (b - a) // (known[b] - known[a]), lo))
    on_plateau = [any(m != end and known[m] == known[end] for m in known) for end in (lo, hi)]
    if (on_plateau[0] and min(n, line) <= lo + 1) or (on_plateau[1] and max(n, line) >= hi - 1):
        return _roundest(lo, hi)
    if n <= lo:
        return lo + 1
    if s.spare() <= 1 and lo + 1 < n < hi - 1:
        return n + max(1, (n - lo) // 8) if n - lo <= hi - n else n - max(1, (hi - n) // 8)
    return n


def _power_law(peak_1: int, lo: int, peak_lo: int, hi: int, peak_hi: int, limit: int) -> int | None:
    """Where `peak(n) = peak_1 + c * (n**p - 1)`, through `(lo, peak_lo)` and `(hi, peak_hi)`,
    reaches `limit` (rounded down); `None` where no such curve rises through them."""
    if not (1 < lo < hi and peak_1 < peak_lo < peak_hi):
        return None
    log_lo, log_hi = math.log(lo), math.log(hi)
    target = math.log((peak_hi - peak_1) / (peak_lo - peak_1))

    def ratio(p: float) -> float:  # log((hi**p - 1) / (lo**p - 1)), increasing in p
        return math.log(math.expm1(p * log_hi)) - math.log(math.expm1(p * log_lo))

    a, b = 1e-3, 8.0
    try:
        if not ratio(a) < target < ratio(b):
            return None
        for _ in range(60):  # bisection of p, to float precision
            a, b = (a, (a + b) / 2) if ratio((a + b) / 2) >= target else ((a + b) / 2, b)
        p = (a + b) / 2
        x = 1 + (limit - peak_1) / (peak_lo - peak_1) * math.expm1(p * log_lo)
        return math.floor(math.exp(min(math.log(x) / p, 60.0)))
    except (OverflowError, ValueError):
        return None


def _roundest(lo: int, hi: int) -> int:
    """The roundest size strictly between `lo` and `hi` (`hi - lo >= 2`): the multiple of
    the largest power of two."""
    a, b = lo + 1, hi - 1
    step = 1 << b.bit_length()
    while -(-a // step) * step > b:
        step //= 2
    return -(-a // step) * step
