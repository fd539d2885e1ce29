"""The second set of `micro.py`'s microbenchmarks (K): the kinds the model still misses on
group K's held-out steps (docs/guide/time.md, "Group K"), one thing varied at a time.

Run only when named (`micro.py --cases scatter2,stride,layout,mm_f32,flash2`); a plain
`micro.py` runs the first set (`micro_cases.py`) alone. The cases are `micro_cases.Case`s
and cost as those do: `flops`, and `bytes` the least HBM traffic (each input read once,
each output written once; a scatter's rows as it touches them). The groups, in the
order they run, and the question each series answers:

- `scatter2`: scatter-adds into large tables. A scatter's per-row cost grows past ~50,000
  table rows: 2.0-2.3x where libtpu's emitter is staged (the scatter fusion's
  `used_scoped_memory_configs` of 1-16 MB), ~12x where it is not (136 KB); the first set
  measured tables of 16,384 and 262,144 rows only. Which of the table's rows, the rows
  updated, the row's width and dtype, and the form of the step picks the emitter, and
  what each costs a row:
  - `scatter2_t{16k,64k,128k,256k,1m}`: table rows 16,384-1,048,576 at 16,384 updated
    rows of 128 f32 lanes (the table, zeros, built in the step as a gather's gradient
    builds it): where the per-row cost rises past ~50,000 rows, and whether it rises
    again past 262,144;
  - `scatter2_t256k_n{4k,32k,64k,128k}`: rows updated 4,096-131,072 into 262,144
    (with `scatter2_t256k`, 16,384), and 262,144 into 1,048,576
    (`scatter2_t1m_n256k`, a quarter of the table as at `scatter2_t256k_n64k`): the
    per-row cost's slope in the rows, and whether the emitter changes with them;
  - `scatter2_t256k_d{64,256,512}`: rows of 64-512 f32 lanes (with `scatter2_t256k`,
    128), and 64 lanes into 1,048,576 (`scatter2_t1m_d64`): the per-row cost by the
    row's bytes in a large table;
  - `scatter2_t256k_bf16_d{128,256}`: bf16 rows of 256 and 512 bytes (against the f32
    rows of the same lanes and of the same bytes);
  - `scatter2_t{256k,1m}_donated`: the table an argument, updated in place (an
    optimizer's or a cache's update: no zeros written), against `scatter2_t256k` and
    `scatter2_t1m`;
  - `scatter2_take_grad_t1m`: the gradient of `jnp.take` (the form a model's embedding
    has) into 1,048,576 rows, against `scatter2_t1m`;
  - `scatter2_bag_*`: the embedding bag's gradient (the gradient of `jnp.take` of a
    [rows, bag] id array, summed over the bag, as recsys has it: 64 f32 lanes, bags of
    24): into 1,048,576 rows at 2,048 and 8,192 bags (49,152 and 196,608 rows updated)
    and at 128 lanes, into 400,000 rows (recsys's largest table) at 8,192 bags, and into
    16,384 rows (the small table's emitter, for reference).

  As libtpu 0.0.42.1 compiles them for a v5e (deviceless), the scatter is staged (1-16
  MB) at `t16k`, `t64k`, `t256k_n64k`, `t256k_n128k`, `t1m_n256k`, `t1m_d64` and every
  bag but `bag_t1m_d128_n2k`, and unstaged (136 KB, 68-544 KB by the row's bytes) in
  the rest: both emitters at several table sizes.

- `stride`: strided slices, which the first set's one case (`slice_strided`, 64 MiB)
  ran at 0.05x their bytes' time:
  - `stride_minor_{f32,bf16}_*`: `x[:, ::2]` (1,024 lanes to 512), 4-64 MiB, by size
    and dtype;
  - `stride_major_{f32,bf16}_*`: `x[::2]` (every other row), 4-64 MiB;
  - `stride_odd_{f32,bf16}_*`: `x[..., 1::2]` of a (b, t, 256) array (the odd lanes, as
    an interleaved rotary embedding takes them), 16 and 64 MiB;
  - `stride_split_axis{0,1}_*`: `lax.associative_scan`'s even/odd split alone (not in a
    scan): `x[0:-1:2]` and `x[1::2]` of a (t, 512) array along axis 0 (a scan over rows)
    and of a (8, t, 256) array along axis 1 (an SSM's scan over time), 16 and 64 MiB;
  - `stride_pairsum_axis{0,1}_16mib`: the scan's combine of the two halves as it runs
    (`x[0:-1:2] + x[1::2]`, one fusion);
  - `stride_interleave_axis{0,1}_16mib`: the scan's last step, two halves interleaved
    (each padded with zeros between its rows, `lax.pad`'s interior padding, and added).

- `layout`: layout copies and transposes. Group K's wavenet ran its 238 layout copies
  in VMEM 3.4x faster than the rate fixed for layout copies (0.5 TB/s); which sizes and
  shapes run at which rate:
  - `layout_t2d_f32_*`: `x.T` of a 2-D f32 array of 64 KiB-128 MiB (small enough for
    VMEM up to 8 MiB, then 32 and 128 MiB; at the top of the program each is one
    `copy` from HBM to HBM);
  - `layout_t2d_bf16_*`: the same in bf16, 1 and 32 MiB;
  - `layout_swap01_f32_*`: `jnp.swapaxes(x, 0, 1)` of (s, h, d) (the minor dimension
    kept: a copy of whole rows), 1 and 32 MiB;
  - `layout_btc_{f32,bf16}_*`: (b, t, c) to (b, c, t), as a convolution over time
    written channels-first needs, 256 KiB-64 MiB;
  - `layout_loop_btc_*`: that transpose of a loop's carry, 16 trips of a `fori_loop`,
    64 KiB-64 MiB: two layout copies a trip, in VMEM up to 8 MiB (the carry stays
    there), between VMEM and HBM at 64 MiB (as libtpu 0.0.42.1 compiles them).

- `mm_f32`: f32 matrix products by precision, 1024-4096 square:
  `mm_f32_prec_{default,highest}_*` (one bf16 pass against libtpu's most passes),
  `mm_f32_prec_high_2048` (`Precision.HIGH`), and `mm_f32_ref_bf16_2048` (bf16
  operands, for reference): how many MXU passes each precision costs.

- `flash2`: `jax.experimental.pallas.ops.tpu.flash_attention` (b 2, h 8, d 128, bf16)
  at sequence 1024-4096, causal and not, forward and backward (`jax.grad`):
  `flash2_s{s}_{causal,full}_{fwd,grad}`: what the causal mask saves of each, and the
  backward's cost against the forward's. Pallas TPU kernels (`tpu_only`).

Imports JAX and `micro_cases` only.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from micro_cases import BF16, F32, I32, Arg, Case, MiB, _dt, _flash, _label, _mm, _size


GROUPS_K = ("scatter2", "stride", "layout", "mm_f32", "flash2")


# -- scatter-adds into large tables -----------------------------------------------------------
_T, _N, _D = 262144, 16384, 128  # the series' base: table rows, rows updated, f32 lanes


def _rows_label(n: int) -> str:
    """1048576: "1m", 16384: "16k", 400000: "400k"."""
    if n % 1048576 == 0:
        return f"{n // 1048576}m"
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n // 1000}k"


def _scatter(name: str, varied: str, t: int = _T, n: int = _N, d: int = _D, **kw: Any) -> Case:
    """Rows added into a table: `form` "zeros" (a table of zeros built in the step, as a
    gather's gradient builds it), "donated" (the table an argument, updated in place),
    "take_grad" (`jax.grad` of `jnp.take`) or "bag_grad" (of `jnp.take` of [n, bag] ids,
    summed over the bag): n * bag rows updated."""
    form, dtype, bag = kw.get("form", "zeros"), kw.get("dtype", F32), kw.get("bag", 1)
    row, updated = d * _size(dtype), n * bag
    ids = Arg((n, bag) if form == "bag_grad" else (n,), I32, "uniform", t)

    def into_zeros(u: Any, i: Any) -> Any:
        return jnp.zeros((t, d), dtype).at[i].add(u)

    def in_place(x: Any, u: Any, i: Any) -> Any:
        return (x.at[i].add(u),)

    def loss(x: Any, i: Any, w: Any) -> Any:
        rows = jnp.take(x, i, axis=0)
        return jnp.sum((rows.sum(axis=1) if form == "bag_grad" else rows) * w)

    def grad(x: Any, i: Any, w: Any) -> Any:
        return jax.grad(loss)(x, i, w)

    table_arg, updates = Arg((t, d), dtype), Arg((n, d), dtype)
    forms: dict[str, Callable[..., Any]] = {"zeros": into_zeros, "donated": in_place}
    f = forms.get(form, grad)
    args = {"zeros": (updates, ids), "donated": (table_arg, updates, ids)}.get(form, (table_arg, ids, updates))
    donate = (0,) if form == "donated" else ()
    how = {"zeros": "add", "donated": "add", "take_grad": "grad of take", "bag_grad": "grad of take, bag sum"}[form]
    params = {"table_rows": t, "rows": updated, "lanes": d, "row_bytes": row, "dist": "uniform", "how": how}
    params |= {"dtype": _dt(dtype), "donated": form == "donated", "bag": bag if form == "bag_grad" else None}
    # the table written (not when donated), the updates read once, each updated row read and written
    table = 0 if form == "donated" else t * row
    cost: dict[str, Any] = {"flops": updated * d, "bytes": table + n * row + 2 * updated * row + 4 * updated}
    return Case(name, "scatter2", varied, params, f, args, **cost, donate=donate, quick=kw.get("quick", False))


def _bag(t: int, n: int, d: int = 64, bag: int = 24) -> Case:
    name = f"scatter2_bag_t{_rows_label(t)}_d{d}_n{_rows_label(n)}"
    return _scatter(name, "bag", t, n, d, form="bag_grad", bag=bag)


def scatter2() -> list[Case]:
    cases = [_scatter(f"scatter2_t{_rows_label(t)}", "table_rows", t=t) for t in (16384, 65536, 131072, _T, 1048576)]
    cases[3] = dataclasses.replace(cases[3], quick=True)
    cases += [_scatter(f"scatter2_t256k_n{_rows_label(n)}", "rows", n=n) for n in (4096, 32768, 65536, 131072)]
    cases.append(_scatter("scatter2_t1m_n256k", "rows", t=1048576, n=262144))
    cases += [_scatter(f"scatter2_t256k_d{d}", "lanes", d=d) for d in (64, 256, 512)]
    cases.append(_scatter("scatter2_t1m_d64", "lanes", t=1048576, d=64))
    cases += [_scatter(f"scatter2_t256k_bf16_d{d}", "dtype", d=d, dtype=BF16) for d in (128, 256)]
    cases += [_scatter(f"scatter2_t{_rows_label(t)}_donated", "form", t=t, form="donated") for t in (_T, 1048576)]
    cases.append(_scatter("scatter2_take_grad_t1m", "form", t=1048576, form="take_grad"))
    cases += [_bag(1048576, 2048), _bag(1048576, 8192), _bag(1048576, 2048, d=128), _bag(400000, 8192)]
    cases.append(_bag(16384, 2048))
    return cases


# -- strided slices, layout copies ------------------------------------------------------------
def _moved(name: str, group: str, varied: str, f: Callable[..., Any], args: tuple[Arg, ...], **kw: Any) -> Case:
    """A case that moves bytes: its inputs read once, its outputs written once."""
    out = jax.eval_shape(f, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args))
    written = sum(math.prod(o.shape) * _size(o.dtype) for o in jax.tree.leaves(out))
    params = {"bytes": sum(a.nbytes for a in args), "shape": list(args[0].shape), "dtype": _dt(args[0].dtype)}
    params |= kw.get("params", {})
    flops = kw.get("flops_per_out", 0) * written // _size(args[0].dtype)
    nbytes = kw.get("trips", 1) * (sum(a.nbytes for a in args) + written)
    return Case(name, group, varied, params, f, args, flops=flops, bytes=nbytes, quick=kw.get("quick", False))


def _short(dtype: Any) -> str:
    return "f32" if dtype == F32 else "bf16"


def _split(axis: int) -> Callable[..., Any]:
    """`lax.associative_scan`'s split of `x` along `axis`: its even rows (the last left
    out) and its odd rows."""

    def f(x: Any) -> Any:
        even = lax.slice_in_dim(x, 0, x.shape[axis] - 1, stride=2, axis=axis)
        return even, lax.slice_in_dim(x, 1, None, stride=2, axis=axis)

    return f


def _pairsum(axis: int) -> Callable[..., Any]:
    """The scan's combine of the two halves (`fn(x[0:-1:2], x[1::2])` with fn = add)."""
    split = _split(axis)

    def f(x: Any) -> Any:
        even, odd = split(x)
        return even + odd

    return f


def _interleave(axis: int) -> Callable[..., Any]:
    """The scan's last step: `a`'s rows at the even places of `axis`, `b`'s at the odd
    (each padded with zeros between its rows, then added)."""

    def f(a: Any, b: Any) -> Any:
        zero = jnp.zeros((), a.dtype)
        a_pad = [(0, 1, 1) if k == axis else (0, 0, 0) for k in range(a.ndim)]
        b_pad = [(1, 0, 1) if k == axis else (0, 0, 0) for k in range(b.ndim)]
        return lax.pad(a, zero, a_pad) + lax.pad(b, zero, b_pad)

    return f


def _stride(kind: str, nbytes: int, dtype: Any = F32) -> Case:
    """`kind`'s strided slice of an array of `nbytes` (or, for an interleave, two halves)."""

    def rows2(lanes: int) -> tuple[int, ...]:
        return nbytes // (lanes * _size(dtype)), lanes

    def rows3(b: int, lanes: int) -> tuple[int, ...]:
        return b, nbytes // (b * lanes * _size(dtype)), lanes

    specs: dict[str, tuple[Callable[..., Any], tuple[int, ...], int]] = {  # fn, shape, axis
        "minor": (lambda x: x[:, ::2], rows2(1024), 1),
        "major": (lambda x: x[::2], rows2(1024), 0),
        "odd": (lambda x: x[..., 1::2], rows3(8, 256), 2),
        "split_axis0": (_split(0), rows2(512), 0),
        "split_axis1": (_split(1), rows3(8, 256), 1),
        "pairsum_axis0": (_pairsum(0), rows2(512), 0),
        "pairsum_axis1": (_pairsum(1), rows3(8, 256), 1),
        "interleave_axis0": (_interleave(0), rows2(512), 0),
        "interleave_axis1": (_interleave(1), rows3(8, 256), 1),
    }
    f, shape, axis = specs[kind]
    args: tuple[Arg, ...] = (Arg(shape, dtype),)
    if kind.startswith("interleave"):  # two halves, together `nbytes`
        half = tuple(s // 2 if k == axis else s for k, s in enumerate(shape))
        args = (Arg(half, dtype), Arg(half, dtype))
    name = f"stride_{kind}_{_short(dtype)}_{_label(nbytes)}"
    varied = "dtype" if dtype != F32 else ("bytes" if kind in ("minor", "major", "odd") else "op")
    adds = 1 if kind.startswith(("pairsum", "interleave")) else 0
    params = {"op": kind, "axis": axis}
    return _moved(
        name, "stride", varied, f, args, params=params, flops_per_out=adds, quick=name == "stride_minor_f32_16mib"
    )


def stride() -> list[Case]:
    cases = []
    for kind in ("minor", "major"):
        cases += [_stride(kind, s) for s in (4 * MiB, 16 * MiB, 64 * MiB)]
        cases.append(_stride(kind, 16 * MiB, BF16))
    cases += [_stride("odd", s) for s in (16 * MiB, 64 * MiB)]
    cases.append(_stride("odd", 16 * MiB, BF16))
    cases += [_stride(f"split_axis{a}", s) for a in (0, 1) for s in (16 * MiB, 64 * MiB)]
    cases += [_stride(f"{kind}_axis{a}", 16 * MiB) for kind in ("pairsum", "interleave") for a in (0, 1)]
    return cases


_TRIPS = 16


def _layout(kind: str, shape: tuple[int, ...], dtype: Any = F32) -> Case:
    """`kind`'s transpose of an array of `shape`: 2-D `.T`, `swapaxes(x, 0, 1)` of (s, h,
    d), (b, t, c) to (b, c, t), or that in a `fori_loop` of `_TRIPS` trips (t == c)."""
    fns: dict[str, tuple[Callable[..., Any], list[int]]] = {
        "t2d": (lambda x: x.T, [1, 0]),
        "swap01": (lambda x: jnp.swapaxes(x, 0, 1), [1, 0, 2]),
        "btc": (lambda x: jnp.swapaxes(x, 1, 2), [0, 2, 1]),
        "loop_btc": (lambda x: lax.fori_loop(0, _TRIPS, lambda i, y: jnp.swapaxes(y, 1, 2), x), [0, 2, 1]),
    }
    f, perm = fns[kind]
    args = (Arg(shape, dtype),)
    nbytes = args[0].nbytes
    loop = kind.startswith("loop")
    name = f"layout_{kind}_{_short(dtype)}_{_label(nbytes)}" if not loop else f"layout_{kind}_{_label(nbytes)}"
    varied = "dtype" if dtype != F32 else "bytes"
    params = {"perm": perm, "where": "fori_loop" if loop else "top", "trips": _TRIPS if loop else 1}
    quick = name == "layout_t2d_f32_1mib"
    return _moved(name, "layout", varied, f, args, params=params, trips=_TRIPS if loop else 1, quick=quick)


def layout() -> list[Case]:
    cases = [_layout("t2d", s) for s in ((128, 128), (512, 512), (1024, 2048), (2048, 4096), (4096, 8192))]
    cases += [_layout("t2d", s, BF16) for s in ((512, 1024), (4096, 4096))]
    cases += [_layout("swap01", s) for s in ((128, 16, 128), (4096, 16, 128))]
    cases += [_layout("btc", s) for s in ((4, 128, 128), (8, 1024, 256), (16, 2048, 512))]
    cases += [_layout("btc", s, BF16) for s in ((4, 8192, 128), (16, 8192, 256))]  # wavenet's, bf16: 8 and 64 MiB
    cases += [_layout("loop_btc", s) for s in ((1, 128, 128), (4, 256, 256), (8, 512, 512), (16, 1024, 1024))]
    return cases


# -- f32 matrix products by precision -------------------------------------------------------------
def mm_f32() -> list[Case]:
    cases = []
    for n in (1024, 2048, 4096):
        for name, precision in (("default", lax.Precision.DEFAULT), ("highest", lax.Precision.HIGHEST)):
            c = _mm(
                f"mm_f32_prec_{name}_{n}", "precision" if name == "highest" else "n", n, n, n, F32, precision=precision
            )
            cases.append(c)
    cases.append(_mm("mm_f32_prec_high_2048", "precision", 2048, 2048, 2048, F32, precision=lax.Precision.HIGH))
    cases.append(_mm("mm_f32_ref_bf16_2048", "dtype", 2048, 2048, 2048, BF16))
    return [dataclasses.replace(c, group="mm_f32", quick=c.name == "mm_f32_prec_highest_2048") for c in cases]


# -- Pallas flash attention ---------------------------------------------------------------------------
def flash2() -> list[Case]:
    cases = []
    for grad in (False, True):
        for causal in (True, False):
            for s in (1024, 2048, 4096):
                c = _flash(s, causal=causal, grad=grad)
                name = f"flash2_s{s}_{'causal' if causal else 'full'}_{'grad' if grad else 'fwd'}"
                varied = "length" if causal and not grad else ("causal" if not causal else "grad")
                cases.append(
                    dataclasses.replace(
                        c, name=name, group="flash2", varied=varied, quick=name == "flash2_s2048_causal_fwd"
                    )
                )
    return cases


def cases() -> list[Case]:
    """Every case of the second set, in the order `micro.py` runs them (`GROUPS_K`)."""
    builders: dict[str, Callable[[], list[Case]]] = {
        "scatter2": scatter2,
        "stride": stride,
        "layout": layout,
        "mm_f32": mm_f32,
        "flash2": flash2,
    }
    out = [c for g in GROUPS_K for c in builders[g]()]
    names = [c.name for c in out]
    assert len(set(names)) == len(names), "case names must be unique"
    assert all(c.name.startswith(c.group + "_") for c in out), "a case's name starts with its group's"
    return out
