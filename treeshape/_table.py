"""One table renderer for `str(Structure)`, `ts.describe`, `_repr_html_` and the CLI.

It renders anything shaped like a Structure (paths, leaves and totals), so the
value type can use it without the renderer depending on it.
"""

import dataclasses
import html
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu

from . import _compat
from ._dtypes import short_dtype
from ._leaf import axes_str, varying_axes
from ._nodes import static_text
from ._shapes import count_text, dim_sum, human_bytes, leaf_nbytes, leaf_size, leaf_total, short_shape
from ._sharding import is_partitioned, is_replicated, per_device_nbytes, spec_str
from ._tree import EDGE, StaticRepr, clip, edge_paths, key_text
from ._views import StructureView


class Description(str):
    """The text table of [treeshape.describe][]: a `str`, which a notebook shows as an HTML table."""

    __slots__ = ("_html",)
    _html: Callable[[], str]

    def __new__(cls, text: str, html: Callable[[], str]) -> "Description":
        self = super().__new__(cls, text)
        self._html = html
        return self

    def _repr_html_(self) -> str:
        return self._html()


# -- the table -----------------------------------------------------------------
DEFAULT_MAX_ROWS: Final = EDGE  # a table that is cut shows as many paths at each end as the tree model finds
_HEADERS: Final = ("path", "shape", "dtype", "extra", "bytes")
_ROOT: Final = "(root)"  # the empty path is "": show something


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


_STATIC_WIDTH: Final = 80  # a static value's text in a cell, at most (a public name is always shorter)


def _static_str(leaf: Any) -> str:
    """A static leaf's cell: its type, then its value as messages and JSON print it
    (`static custom_jvp jax.nn.relu`)."""
    if isinstance(leaf, StaticRepr):  # loaded from JSON: its type by name, its value by repr only
        type_name = leaf.type_name.split(":")[-1].split(".")[-1]  # "module:Outer.Color" -> "Color"
        return f"static {type_name} {clip(leaf.text, _STATIC_WIDTH)} (repr from JSON)"
    kind = type(leaf)
    text = static_text(leaf)
    if text == f"<{kind.__module__}.{kind.__qualname__} object>":  # a default repr says no more than its type
        return f"static {kind.__name__}"
    return f"static {kind.__name__} {clip(text, _STATIC_WIDTH)}"


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
        extra.append(axes_str(axes))
    extra_str = " ".join(e for e in extra if e)
    nbytes = human_bytes(leaf_nbytes(leaf))
    device_bytes = human_bytes(per_device_nbytes(leaf)) if per_device else ""
    return (path, short_shape(leaf.shape), dtype, extra_str, nbytes, device_bytes)


def _plural(n: Any, word: str) -> str:
    return f"{count_text(n)} {word}" if n == 1 else f"{count_text(n)} {word}s"


def _totals(leaves: Sequence[Any]) -> tuple[int, int, bool]:
    """The elements and bytes of the array leaves (as `Structure.size` and `nbytes` count them),
    and whether some leaf is split over devices: one pass over the leaves (and `_some_split`'s)."""
    size = nbytes = 0
    itemsize: dict[Any, int] = {}  # dtype -> the bytes of one element
    prod, sds = math.prod, jax.ShapeDtypeStruct  # (names read once: this loop runs per leaf)
    symbolic = False
    for leaf in leaves:
        if isinstance(leaf, sds):
            n = prod(leaf.shape)
            if type(n) is not int:
                symbolic = True
                continue
            size += n
            dtype = leaf.dtype
            element = itemsize.get(dtype)
            if element is None:
                element = itemsize[dtype] = leaf_nbytes(jax.ShapeDtypeStruct((), dtype))
            nbytes += n * element
    split = _some_split(leaves)
    if symbolic:  # expressions add slowly: once per distinct leaf type
        return leaf_total(leaves, leaf_size), leaf_total(leaves, leaf_nbytes), split
    return size, nbytes, split


_GIVEN_SHARDING: Final = operator.attrgetter(_compat.GIVEN_SHARDING_FIELD)


def _some_split(leaves: Sequence[Any]) -> bool:
    """Whether some leaf is split over devices. A leaf's `sharding` (a property of JAX's that
    costs a call) is read only where one was given, found in one C-level pass over the leaves."""
    try:
        if operator.countOf(map(_GIVEN_SHARDING, leaves), None) == len(leaves):
            return False
    except Exception:  # a static leaf (it has no such field)
        pass
    sds = jax.ShapeDtypeStruct
    return any(is_partitioned(leaf) for leaf in leaves if isinstance(leaf, sds) and leaf.sharding is not None)


def _shown_paths(structure: StructureView, head: int, tail: int) -> list[str]:
    """The paths of the first `head` and the last `tail` leaves, without the paths of the others:
    known to a Structure read from a tree, else found in the tree rebuilt once."""
    known = structure._known_paths(head, tail)
    if known is not None:
        return known
    leaves = structure.leaves
    first, last = edge_paths(jtu.tree_unflatten(structure.treedef, leaves), leaves, max(head, tail))
    return first[:head] + last[:tail][::-1]


def _build(structure: StructureView, max_rows: int | None) -> _Table:
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be None or >= 0, got {max_rows}")
    n = len(structure)
    leaves = structure.leaves
    indices: Sequence[int] = range(n)
    cut_at: int | None = None
    hidden = 0
    if max_rows is not None and n > max_rows:
        head = (max_rows + 1) // 2
        tail = max_rows - head
        indices = [*range(head), *range(n - tail, n)]
        cut_at, hidden = head, n - max_rows
        paths: Sequence[str] = _shown_paths(structure, head, tail)
    else:
        paths = structure.paths
    size, nbytes, per_device = _totals(leaves)
    rows = [_row(path, leaves[i], per_device) for path, i in zip(paths, indices, strict=True)]
    leaf_word = "leaf" if n == 1 else "leaves"
    total = f"total: {n:,} {leaf_word}, {_plural(size, 'element')}"
    return _Table(
        rows=rows,
        cut_at=cut_at,
        hidden=hidden,
        total=total,
        total_bytes=human_bytes(nbytes),
        show_extra=any(row[3] for row in rows),
        total_per_device=human_bytes(structure.nbytes_per_device) if per_device else None,
    )


def _more(hidden: int) -> str:
    return f"... {hidden:,} more {'leaf' if hidden == 1 else 'leaves'}"


def printable(text: str) -> str:
    """A cell with control characters from user reprs escaped (`\\n`, `\\x1b`): one line, no
    terminal codes."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def table(structure: StructureView, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """Render `structure` as an aligned text table (what `str(structure)` shows).

    Columns: path, shape, dtype (`~` marks weak), extra (sharding spec,
    "replicated", manual axes `{V:i}`, static leaf type; omitted when empty for
    every row), bytes and, when some leaf is split over devices, per device.
    The last row is the exact total, whatever `max_rows` hides.
    """
    t = _build(structure, max_rows)
    cols = t.columns
    headers = [(*_HEADERS, _PER_DEVICE)[c] for c in cols]
    rows = [[printable(row[c]) for c in cols] for row in t.rows]
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


def html_table(structure: StructureView, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
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


# -- small tables of figures (`ts.Cost`) -----------------------------------------
def grid(headers: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1) -> str:
    """An aligned text table of `rows` under `headers`, the last `right` columns flush right,
    with the rules and cell escaping of [table][]."""
    cells = [[printable(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    first_right = len(headers) - right

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if i >= first_right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:]), rule])


def html_grid(headers: Sequence[str], rows: Sequence[Sequence[str]], right: int = 1, css_class: str = "") -> str:
    """The cells of [grid][] as an HTML table, escaped, in the style of [html_table][]."""
    esc = html.escape
    first_right = len(headers) - right

    def cells(values: Sequence[str], tag: str) -> str:
        parts = [f"<{tag}{_RIGHT if i >= first_right else _LEFT}>{esc(v)}</{tag}>" for i, v in enumerate(values)]
        return "<tr>" + "".join(parts) + "</tr>"

    body = "".join(cells(row, "td") for row in rows)
    return (
        f'<table class="{esc(css_class)}" style="{_CSS}">'
        f"<thead>{cells(headers, 'th')}</thead><tbody>{body}</tbody></table>"
    )


# -- memory by module: one row per path prefix (`ts.describe(..., depth=N)`) --------------
@dataclasses.dataclass
class _Group:
    """The leaves under one path prefix: how many, their elements, bytes and bytes per device."""

    path: str
    leaves: int = 0
    params: Any = 0
    nbytes: Any = 0
    per_device: Any = 0


def _groups(structure: StructureView, depth: int) -> tuple[list[_Group], bool]:
    """One group per path prefix of `depth` keys (a leaf shallower than that is its own), in tree
    order; and whether some leaf is split over devices."""
    if type(depth) is not int or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (how many keys of each path make a row), got {depth!r}")
    flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(structure.treedef, structure.leaves))
    groups: list[_Group] = []
    head: tuple[Any, ...] | None = None
    split = False
    for (keys, _), leaf in zip(flat, structure.leaves, strict=True):
        if keys[:depth] != head or not groups:
            head = keys[:depth]
            groups.append(_Group("".join(map(key_text, head)) or _ROOT))
        group = groups[-1]
        group.leaves += 1
        if isinstance(leaf, jax.ShapeDtypeStruct):
            group.params = _add(group.params, math.prod(leaf.shape))
            group.nbytes = _add(group.nbytes, leaf_nbytes(leaf))
            group.per_device = _add(group.per_device, per_device_nbytes(leaf))
            split = split or (leaf.sharding is not None and is_partitioned(leaf))
    return groups, split


def _add(a: Any, b: Any) -> Any:
    """`a + b` for sizes: ints, or expressions (perhaps of several symbolic scopes)."""
    return a + b if type(a) is int and type(b) is int else dim_sum((a, b))


def _group_cells(
    structure: StructureView, depth: int, max_rows: int | None
) -> tuple[list[str], list[list[str]], int | None, str]:
    """The headers and rows (the total last) of the table by path prefix, where the rows are cut
    (`max_rows`), and the line that says how many rows the cut hides."""
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be None or >= 0, got {max_rows}")
    groups, split = _groups(structure, depth)
    headers = ["path", "leaves", "params", "bytes"] + ([_PER_DEVICE] if split else [])

    def cells(g: _Group) -> list[str]:
        row = [g.path, count_text(g.leaves), count_text(g.params), human_bytes(g.nbytes)]
        return row + ([human_bytes(g.per_device)] if split else [])

    shown: list[_Group] = groups
    cut_at: int | None = None
    more = ""
    if max_rows is not None and len(groups) > max_rows:
        cut_at = (max_rows + 1) // 2
        hidden = len(groups) - max_rows
        more = f"... {hidden:,} more {'row' if hidden == 1 else 'rows'}"
        shown = [*groups[:cut_at], *groups[len(groups) - (max_rows - cut_at) :]]
    total = _Group("total", len(structure.leaves))
    total.params, total.nbytes, _ = _totals(structure.leaves)
    total.per_device = structure.nbytes_per_device
    return headers, [*map(cells, shown), cells(total)], cut_at, more


def depth_table(structure: StructureView, depth: int, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """The leaves, elements and bytes of `structure` by path prefix of `depth` keys, as text."""
    headers, rows, cut_at, more = _group_cells(structure, depth, max_rows)
    lines = grid(headers, rows, right=len(headers) - 1).split("\n")
    lines = [*lines[:-2], lines[-1], lines[-2]]  # the rule above the total row
    if cut_at is not None:
        lines.insert(2 + cut_at, more)
    return "\n".join(lines)


def html_depth_table(structure: StructureView, depth: int, max_rows: int | None = DEFAULT_MAX_ROWS) -> str:
    """[depth_table][] as HTML."""
    headers, rows, cut_at, more = _group_cells(structure, depth, max_rows)
    page = html_grid(headers, rows, right=len(headers) - 1, css_class="treeshape-structure")
    if cut_at is None:
        return page
    row_start = [i for i in range(len(page)) if page.startswith("<tr>", i)][1 + cut_at]  # after the header row
    line = f'<tr><td colspan="{len(headers)}"{_LEFT}>{html.escape(more)}</td></tr>'
    return page[:row_start] + line + page[row_start:]
