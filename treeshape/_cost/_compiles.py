"""How many programs a call of the cost wing compiled: each place that compiles one says
so (`compiled`), and a search counts what its sizes compiled (`counting`), loop bodies
compiled alone included. Counted where treeshape asks XLA for a program, so that the count
does not depend on whether JAX answered from a cache of its own."""

import contextlib
import threading
from collections.abc import Iterator


_counting = threading.local()


def compiled(n: int = 1) -> None:
    """`n` programs were compiled in this thread."""
    for count in getattr(_counting, "counts", ()):
        count[0] += n


@contextlib.contextmanager
def counting() -> Iterator[list[int]]:
    """Count the programs compiled in this thread inside the block: the yielded list's one
    element."""
    count = [0]
    counts = getattr(_counting, "counts", None)
    if counts is None:
        counts = _counting.counts = []
    counts.append(count)
    try:
        yield count
    finally:
        # By identity: a block nested in another (a search inside a plan) may hold an equal count.
        del counts[next(i for i, c in enumerate(counts) if c is count)]
