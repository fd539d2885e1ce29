"""The third set of `micro.py`'s microbenchmarks (L): gathers and scatters on tables that
libtpu lays out transposed, one thing varied at a time.

Group L's held-out recsys step (a 1,000,000-row table of 32 f32 lanes) ran its scatter-add
at ~125 ns a row and its gather at ~35 ns a row, 0.52-0.55x the model's rates. libtpu lays
that table out `{0,1:T(8,128)}`: the row index is the minor dimension (the lanes), so one
row is one lane of `ceil(lanes / 8)` tiles of 8 x 128 (4 KiB in f32), not one sublane of
a tile as in the `{1,0}` layout of the second set's fitted tables. The second set's three
slow scatters (`scatter2_t1m_d64`, `scatter2_bag_t1m_d64_*`, ~200 ns a row) had that
layout too. Which layout a table gets is the compiler's choice (the entry layout of an
argument included); these cases only ask for tables of the shapes that get it, and the
modules say what they got.

Run only when named (`micro.py --cases ttable`). Group `ttable`:
- `ttable_scatter_d{8,16,32,64}`: a scatter-add of 16,384 rows into a donated f32 table of
  1,048,576 rows (in place: no table written besides the rows), by lanes: the row's cost
  by the tiles it spans (1, 2, 4, 8);
- `ttable_scatter_d32_n{4k,64k}`: the rows updated, 4,096 and 65,536 (the per-row cost's
  slope);
- `ttable_scatter_t{256k,4m}_d32`: the table's rows (whether the layout, and the cost,
  depends on them);
- `ttable_scatter_bf16_d{32,64}`: bf16 tables (a bf16 tile holds 16 rows of lanes);
- `ttable_scatter_d128`: 128 lanes, laid out `{1,0}` (the fitted emitter, for reference);
- `ttable_gather_*`: the same series for `jnp.take` of 65,536 rows (4,096 and 262,144 in
  `_n*`).

Group `cacheput` (the serving guide's decode step wrote one position of its KV cache at
~14 ns a tile, 56 us a layer's keys at 64 sequences, which the model costed at its bytes,
~1 us: libtpu lays a cache `[b, s, h, k]` out `{1,3,2,0}`, the positions along the lanes,
so one position is one lane of every tile): `lax.dynamic_update_slice_in_dim` of one
position into a donated bf16 cache, in place:
- `cacheput_b{8,16,32,64,128}`: the sequences `b` of a cache `[b, 1024, 8, 64]` (the tiles
  the position spans, `b * 8 * 64 / 8`);
- `cacheput_s{512,4096}_b32`: the cache's positions (the tiles spanned do not change);
- `cacheput_k{32,128}_b32`: the head's width (the tiles a head's position spans);
- `cacheput_f32_b32`: an f32 cache;
- `cacheput_bhsk_b32`: a cache `[b, h, s, k]` (its position a sublane of full tiles, for
  reference).

Imports JAX and `micro_cases` only.
"""

import dataclasses
import math
from typing import Any

from jax import lax
from micro_cases import BF16, F32, I32, Arg, Case, _gather
from micro_cases_k import _rows_label, _scatter


GROUPS_L = ("ttable", "cacheput")
_T = 1048576


def _renamed(case: Case, name: str, varied: str, quick: bool = False) -> Case:
    return dataclasses.replace(case, name=name, group="ttable", varied=varied, quick=quick)


def _scatter_case(varied: str, t: int = _T, n: int = 16384, d: int = 32, dtype: Any = F32) -> Case:
    parts = [f"t{_rows_label(t)}" if t != _T else "", "bf16" if dtype is BF16 else "", f"d{d}"]
    parts.append(f"n{_rows_label(n)}" if n != 16384 else "")
    name = "ttable_scatter_" + "_".join(p for p in parts if p)
    case = _scatter(name, varied, t=t, n=n, d=d, form="donated", dtype=dtype)
    return _renamed(case, name, varied, quick=name == "ttable_scatter_d32")


def _gather_case(varied: str, t: int = _T, n: int = 65536, d: int = 32, dtype: Any = F32) -> Case:
    parts = [f"t{_rows_label(t)}" if t != _T else "", "bf16" if dtype is BF16 else "", f"d{d}"]
    parts.append(f"n{_rows_label(n)}" if n != 65536 else "")
    name = "ttable_gather_" + "_".join(p for p in parts if p)
    case = _gather(name, varied, t=t, n=n, d=d, dtype=dtype)
    return _renamed(case, name, varied, quick=name == "ttable_gather_d32")


def ttable() -> list[Case]:
    cases = []
    for one, n_other in ((_scatter_case, (4096, 65536)), (_gather_case, (4096, 262144))):
        cases += [one("lanes", d=d) for d in (8, 16, 32, 64)]
        cases += [one("rows", n=n) for n in n_other]
        cases += [one("table_rows", t=t) for t in (262144, 4 * _T)]
        cases += [one("dtype", d=d, dtype=BF16) for d in (32, 64)]
        cases.append(one("layout", d=128))
    return cases


def _cacheput(varied: str, b: int = 32, s: int = 1024, k: int = 64, dtype: Any = BF16, bhsk: bool = False) -> Case:
    parts = ["bhsk" if bhsk else "", "f32" if dtype is F32 else "", f"s{s}" if s != 1024 else ""]
    parts += [f"k{k}" if k != 64 else "", f"b{b}"]
    name = "cacheput_" + "_".join(p for p in parts if p)
    h, axis = 8, 2 if bhsk else 1

    def put(cache: Any, new: Any, pos: Any) -> Any:
        return (lax.dynamic_update_slice_in_dim(cache, lax.expand_dims(new, (axis,)), pos, axis=axis),)

    shape = (b, h, s, k) if bhsk else (b, s, h, k)
    written = b * h * k * (2 if dtype is BF16 else 4)
    args = (Arg(shape, dtype, "zeros"), Arg((b, h, k), dtype), Arg((), I32, "const", s // 2))
    params = {"b": b, "positions": s, "heads": h, "head": k, "dtype": "bf16" if dtype is BF16 else "f32"}
    params |= {"layout_asked": "bhsk" if bhsk else "bshk", "tiles_spanned": math.ceil(b * h * k / 8)}
    return Case(
        name, "cacheput", varied, params, put, args, bytes=2 * written, donate=(0,), quick=name == "cacheput_b32"
    )


def cacheput() -> list[Case]:
    cases = [_cacheput("rows", b=b) for b in (8, 16, 32, 64, 128)]
    cases += [_cacheput("positions", s=s) for s in (512, 4096)]
    cases += [_cacheput("head", k=k) for k in (32, 128)]
    return cases + [_cacheput("dtype", dtype=F32), _cacheput("layout", bhsk=True)]


def cases() -> list[Case]:
    """Every case of the third set, in the order `micro.py` runs them (`GROUPS_L`)."""
    out = ttable() + cacheput()
    names = [c.name for c in out]
    assert len(set(names)) == len(names), "case names must be unique"
    return out
