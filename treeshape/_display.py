"""One table renderer for `str(Structure)`, `describe`, `_repr_html_` and the CLI.

Also the compact leaf notation used everywhere else: `f32[2,3]`, `~f32[]`
(weak), `key<fry>[4]`, `f32[8]{V:i}` (varying over manual axis `i`).
"""

import dataclasses
import functools as ft
import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._sharding import is_partitioned, is_replicated, per_device_nbytes, spec_str


if TYPE_CHECKING:
    from ._structure import Structure

PyTree = Any

_PREFIXES = (
    ("bfloat", "bf"),
    ("float", "f"),
    ("uint", "u"),
    ("int", "i"),
    ("complex", "c"),
)


@ft.cache
def short_dtype(dtype: Any) -> str:
    """`float32` -> `f32`, `bfloat16` -> `bf16`, `key<fry>` unchanged."""
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        name = str(dtype)
    else:
        name = np.dtype(dtype).name
    for long, short in _PREFIXES:
        if name.startswith(long):
            return short + name[len(long) :]
    return name


def short_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def varying_axes(leaf: jax.ShapeDtypeStruct) -> frozenset[str]:
    """The manual mesh axes a leaf varies over (empty outside `shard_map`)."""
    mat = leaf.manual_axis_type
    return frozenset(mat.varying) if mat is not None else frozenset()


def _axes_str(axes: frozenset[str]) -> str:
    return "{V:" + ",".join(sorted(axes)) + "}"


def leaf_str(leaf: Any) -> str:
    """One leaf in compact notation; static leaves as their `repr`."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        weak = "~" if leaf.weak_type else ""
        text = f"{weak}{short_dtype(leaf.dtype)}{short_shape(leaf.shape)}"
        axes = varying_axes(leaf)
        if axes:
            text += _axes_str(axes)
        return text
    text = repr(leaf)
    return text if len(text) <= 40 else text[:37] + "..."


def human_bytes(n: int) -> str:
    """`36 B`, `1.5 KiB`, `64.0 GiB`."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


# -- the table -----------------------------------------------------------------
DEFAULT_MAX_ROWS: Final = 50
_HEADERS: Final = ("path", "shape", "dtype", "extra", "bytes")
_ROOT: Final = "(root)"  # keystr of the empty path is "": show something
_LEAF_TREEDEF: Final = jtu.tree_structure(0)


_PER_DEVICE: Final = "per device"


@dataclasses.dataclass(frozen=True)
class _Table:
    """The cells of a table, shared by the text and HTML renderers."""

    rows: list[tuple[str, str, str, str, str, str]]  # path, shape, dtype, extra, bytes, per device
    cut_at: int | None  # index in `rows` where "... N more leaves" goes
    hidden: int  # how many leaves the cut hides
    total: str  # "total: 2 leaves, 9 elements"
    total_bytes: str
    show_extra: bool
    total_per_device: str | None  # set (and a "per device" column shown) when some leaf is split

    @property
    def columns(self) -> list[int]:
        cols = [0, 1, 2, 3, 4] if self.show_extra else [0, 1, 2, 4]
        return cols + [5] if self.total_per_device is not None else cols


def _static_str(leaf: Any) -> str:
    kind = type(leaf).__name__
    name = getattr(leaf, "__qualname__", None) or getattr(leaf, "__name__", None)
    if callable(leaf) and isinstance(name, str):
        return f"static {kind} {name}"
    text = repr(leaf)
    if " at 0x" in text:  # a default repr: the address is noise
        return f"static {kind}"
    return f"static {kind} {leaf_str(leaf)}"


def _leaf_nbytes(leaf: jax.ShapeDtypeStruct) -> int:
    from ._structure import Structure

    # One source of truth for bytes (typed PRNG keys count their key data).
    return Structure(_LEAF_TREEDEF, (leaf,)).nbytes


def _row(path: str, leaf: Any, per_device: bool) -> tuple[str, str, str, str, str, str]:
    """One leaf's cells; with `per_device`, its largest shard's bytes, and "replicated" for a
    leaf copied whole onto several devices."""
    path = path or _ROOT
    if not isinstance(leaf, jax.ShapeDtypeStruct):
        return (path, "", "", _static_str(leaf), "", "")
    dtype = ("~" if leaf.weak_type else "") + short_dtype(leaf.dtype)
    extra = [spec_str(leaf.sharding, len(leaf.shape))]
    if per_device and not extra[0] and is_replicated(leaf):
        extra[0] = "replicated"
    axes = varying_axes(leaf)
    if axes:
        extra.append(_axes_str(axes))
    extra_str = " ".join(e for e in extra if e)
    nbytes = human_bytes(_leaf_nbytes(leaf))
    device_bytes = human_bytes(per_device_nbytes(leaf)) if per_device else ""
    return (path, short_shape(leaf.shape), dtype, extra_str, nbytes, device_bytes)


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _build(structure: "Structure", max_rows: int | None) -> _Table:
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be None or >= 0, got {max_rows}")
    n = len(structure)
    indices: Sequence[int] = range(n)
    cut_at: int | None = None
    hidden = 0
    if max_rows is not None and n > max_rows:
        head = (max_rows + 1) // 2
        tail = max_rows - head
        indices = [*range(head), *range(n - tail, n)]
        cut_at, hidden = head, n - max_rows
    paths, leaves = structure.paths, structure.leaves
    per_device = structure._sharded() and any(is_partitioned(leaf) for leaf in leaves)
    rows = [_row(paths[i], leaves[i], per_device) for i in indices]
    leaf_word = "leaf" if n == 1 else "leaves"
    total = f"total: {n:,} {leaf_word}, {_plural(structure.size, 'element')}"
    return _Table(
        rows=rows,
        cut_at=cut_at,
        hidden=hidden,
        total=total,
        total_bytes=human_bytes(structure.nbytes),
        show_extra=any(row[3] for row in rows),
        total_per_device=human_bytes(structure.nbytes_per_device) if per_device else None,
    )


def _more(hidden: int) -> str:
    return f"... {hidden:,} more {'leaf' if hidden == 1 else 'leaves'}"


def _printable(text: str) -> str:
    """A cell with control characters from user reprs escaped (`\\n`, `\\x1b`): one line, no
    terminal codes."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(structure: "Structure", max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Render `structure` as an aligned text table (what `str(structure)` shows).

    Columns: path, shape, dtype (`~` marks weak), extra (sharding spec,
    "replicated", manual axes `{V:i}`, static leaf type; omitted when empty for
    every row), bytes and, when some leaf is split over devices, per device.
    The last row is the exact total, whatever `max_rows` hides.
    """
    t = _build(structure, max_rows)
    cols = t.columns
    headers = [(*_HEADERS, _PER_DEVICE)[c] for c in cols]
    rows = [[_printable(row[c]) for c in cols] for row in t.rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    right = 1 if t.total_per_device is None else 2  # the right-aligned byte columns, at the end
    widths[-right] = max(widths[-right], len(t.total_bytes))
    if t.total_per_device is not None:
        widths[-1] = max(widths[-1], len(t.total_per_device))
    # The total row: its label, then the total bytes flush right under the
    # bytes column, or two spaces after a label too long for that.
    head = widths[: len(widths) - right + 1]
    full = sum(head) + 2 * (len(head) - 1)
    full = max(full, len(t.total) + 2 + len(t.total_bytes))

    def line(cells: list[str]) -> str:
        left = "  ".join(c.ljust(w) for c, w in zip(cells[:-right], widths, strict=False))
        tail = "  ".join(c.rjust(w) for c, w in zip(cells[-right:], widths[-right:], strict=True))
        return (left + "  " + tail).rstrip()

    rule = "  ".join("-" * w for w in widths)
    out = [line(headers), rule]
    for i, row in enumerate(rows):
        if i == t.cut_at:
            out.append(_more(t.hidden))
        out.append(line(row))
    if t.cut_at is not None and t.cut_at == len(rows):
        out.append(_more(t.hidden))
    out.append(rule)
    total = t.total + t.total_bytes.rjust(full - len(t.total))
    if t.total_per_device is not None:
        total += "  " + t.total_per_device.rjust(widths[-1])
    out.append(total)
    return "\n".join(out)


_CSS: Final = "font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; border-collapse: collapse"
_LEFT: Final = ' style="text-align: left"'
_RIGHT: Final = ' style="text-align: right"'


def html_table(structure: "Structure", max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Render `structure` as an HTML table: the cells of [table][], escaped."""
    t = _build(structure, max_rows)
    cols = t.columns
    right = 1 if t.total_per_device is None else 2  # the right-aligned byte columns, at the end
    esc = html.escape

    def cells(values: list[str], tag: str) -> str:
        first_right = len(values) - right
        parts = [f"<{tag}{_RIGHT if i >= first_right else _LEFT}>{esc(v)}</{tag}>" for i, v in enumerate(values)]
        return "<tr>" + "".join(parts) + "</tr>"

    more = f'<tr><td colspan="{len(cols)}"{_LEFT}>{esc(_more(t.hidden))}</td></tr>'
    body = []
    for i, row in enumerate(t.rows):
        if i == t.cut_at:
            body.append(more)
        body.append(cells([row[c] for c in cols], "td"))
    if t.cut_at is not None and t.cut_at == len(t.rows):
        body.append(more)
    per_device = "" if t.total_per_device is None else f"<th{_RIGHT}>{esc(t.total_per_device)}</th>"
    total = (
        f'<tr><th colspan="{len(cols) - right}"{_LEFT}>{esc(t.total)}</th><th{_RIGHT}>{esc(t.total_bytes)}</th>'
        f"{per_device}</tr>"
    )
    return (
        f'<table class="treeshape-structure" style="{_CSS}">'
        f"<thead>{cells([(*_HEADERS, _PER_DEVICE)[c] for c in cols], 'th')}</thead>"
        f"<tbody>{''.join(body)}</tbody>"
        f"<tfoot>{total}</tfoot></table>"
    )


def describe(tree_or_structure: PyTree, *, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Describe a pytree (or a [treeshape.Structure][]) as an aligned table.

    The same table as `str(structure)`: one row per leaf with its path, shape,
    dtype (`~` marks a weak type, as JAX prints it), an *extra* column (the
    sharding's `PartitionSpec`, one entry per dimension, the manual mesh axes
    `{V:i}` a leaf varies over under `shard_map`, or `static TYPE` for a static
    leaf; left out when every row is empty) and its size in bytes, then a total
    row with the number of leaves, elements and bytes. When some leaf is split
    over devices, a *per device* column shows each leaf's largest shard and
    the total [treeshape.Structure.nbytes_per_device][], and leaves copied
    whole onto several devices say "replicated". Long trees show their first
    and last rows around a `... N more leaves` line; the total always counts
    every leaf.

    Args:
        tree_or_structure: A [treeshape.Structure][], or any pytree that
            [treeshape.structure_of][] accepts (arrays, tracers,
            `jax.ShapeDtypeStruct`s, scalars, static values).
        max_rows: Show at most this many leaf rows (`None`: all of them).

    Returns:
        The table, as lines joined by newlines (no trailing newline).

    Raises:
        ValueError: `max_rows` is negative.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> params = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3)}
        >>> print(ts.describe({"params": params, "step": 0}))
        path             shape  dtype  bytes
        ---------------  -----  -----  -----
        ['params']['b']  [3]    f32     12 B
        ['params']['w']  [2,3]  bf16    12 B
        ['step']         []     ~i32     4 B
        ---------------  -----  -----  -----
        total: 3 leaves, 10 elements    28 B
    """
    from ._infer import structure_of
    from ._structure import Structure

    if isinstance(tree_or_structure, Structure):
        structure = tree_or_structure
    else:
        structure = structure_of(tree_or_structure)
    return table(structure, max_rows)
