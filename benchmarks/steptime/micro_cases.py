"""The microbenchmarks of `micro.py`: small steps, each varying one thing, by kind of kernel.

Each `Case` is one jitted function of a few arrays (`args`, built on the device by
`make`), the one thing it varies (`varied`, with all its parameters in `params`), and
what a user expects it to cost: `flops` and `bytes`, the least HBM traffic (each input
read once, each output written once; a gather's and a scatter's rows as they touch them).
A case with `donate` returns the new values of the donated arguments, in order, and the
next run takes them (a cache updated in place). `tpu_only` cases (Pallas TPU kernels)
neither lower nor run on a CPU. Imports JAX and NumPy only.

The groups, in the order `micro.py` runs them: matmul, gather, scatter, scan (associative
scans, cumulative sums, segment sums), pallas, host (copies between the device and pinned
host memory inside the step), movement (slices, pads, concatenations, transposes,
`dynamic_update_slice`), elementwise, reduce.
"""

import dataclasses
import functools as ft
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


KiB, MiB = 1024, 1024 * 1024
F32, BF16, I32, I8 = jnp.float32, jnp.bfloat16, jnp.int32, jnp.int8
GROUPS = ("matmul", "gather", "scatter", "scan", "pallas", "host", "movement", "elementwise", "reduce")


@dataclasses.dataclass(frozen=True)
class Arg:
    """An argument: its shape and dtype, how `make` fills it, where it lives.

    init: normal (integers: uniform in [-100, 100)), zeros, uniform (integers in [0, high)),
    sorted (the same, sorted), unique (a permutation of [0, high), its first entries;
    unique_sorted: those sorted), same
    (all zero), few (integers in [0, 8): few hot rows), const (every entry `high`)."""

    shape: tuple[int, ...]
    dtype: Any = F32
    init: str = "normal"
    high: int = 0
    memory: str = "device"  # or "pinned_host"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _size(self.dtype)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # [a-z0-9_]: the jitted function's name, so its module is jit_<name>
    group: str
    varied: str  # the one parameter this case varies within its series
    params: dict[str, Any]
    fn: Callable[..., Any]
    args: tuple[Arg, ...]
    flops: float = 0.0
    bytes: float = 0.0
    transcendentals: float = 0.0
    donate: tuple[int, ...] = ()
    tpu_only: bool = False
    quick: bool = False  # one of `--quick`'s few cases

    def named(self) -> Callable[..., Any]:
        """`fn` under the case's own name (the module's and the profile's)."""

        @ft.wraps(self.fn)
        def step(*args: Any) -> Any:
            return self.fn(*args)

        step.__name__ = step.__qualname__ = self.name
        return step


def make(args: tuple[Arg, ...]) -> tuple[Any, ...]:
    """The arguments' values (traced under `jax.jit`, with the arguments' shardings as its
    out_shardings)."""
    key = jax.random.key(0)
    return tuple(_value(jax.random.fold_in(key, i), a) for i, a in enumerate(args))


def _value(key: Any, a: Arg) -> Any:
    size, integer = math.prod(a.shape), jnp.issubdtype(a.dtype, jnp.integer)
    if a.init == "zeros" or a.init == "same":
        return jnp.zeros(a.shape, a.dtype)
    if a.init == "const":
        return jnp.full(a.shape, a.high, a.dtype)
    if a.init == "normal":
        if integer:
            return jax.random.randint(key, a.shape, -100, 100, I32).astype(a.dtype)
        return jax.random.normal(key, a.shape, F32).astype(a.dtype)
    if a.init in ("uniform", "sorted", "few"):
        x = jax.random.randint(key, a.shape, 0, 8 if a.init == "few" else a.high, I32)
        return (jnp.sort(x.reshape(-1)).reshape(a.shape) if a.init == "sorted" else x).astype(a.dtype)
    if a.init in ("unique", "unique_sorted"):
        assert size <= a.high, (a, "unique indices need at most `high` of them")
        x = jax.random.permutation(key, a.high)[:size]
        return (jnp.sort(x) if a.init == "unique_sorted" else x).reshape(a.shape).astype(a.dtype)
    raise ValueError(f"Arg.init {a.init!r}")


def _size(dtype: Any) -> int:
    return int(np.dtype(dtype).itemsize)


def _dt(dtype: Any) -> str:
    return str(np.dtype(dtype).name)


# -- matrix products --------------------------------------------------------------------------
def _mm(name: str, varied: str, m: int, k: int, n: int, dtype: Any = BF16, **kw: Any) -> Case:
    precision, quick = kw.get("precision"), kw.get("quick", False)
    out = I32 if dtype == I8 else dtype

    def f(x: Any, w: Any) -> Any:
        return jnp.dot(x, w, precision=precision, preferred_element_type=I32 if dtype == I8 else None)

    params = {"m": m, "k": k, "n": n, "dtype": _dt(dtype), "precision": str(precision)}
    args = (Arg((m, k), dtype), Arg((k, n), dtype))
    cost: dict[str, Any] = {"flops": 2 * m * k * n, "bytes": (m * k + k * n) * _size(dtype) + m * n * _size(out)}
    return Case(name, "matmul", varied, params, f, args, **cost, quick=quick)


def _batched(name: str, varied: str, b: int, i: int, j: int, k: int, spec: str = "bij,bjk->bik") -> Case:
    def f(x: Any, y: Any) -> Any:
        return jnp.einsum(spec, x, y)

    y_shape = (b, j, k) if spec == "bij,bjk->bik" else (b, k, j)
    params = {"batch": b, "i": i, "j": j, "k": k, "spec": spec, "dtype": "bfloat16"}
    cost: dict[str, Any] = {"flops": 2 * b * i * j * k, "bytes": 2 * b * (i * j + j * k + i * k)}
    return Case(name, "matmul", varied, params, f, (Arg((b, i, j), BF16), Arg(y_shape, BF16)), **cost)


def _fused_mm(n: int) -> Case:
    def f(x: Any, w: Any, b: Any) -> Any:
        return jax.nn.relu(x @ w + b)

    args = (Arg((n, n), BF16), Arg((n, n), BF16), Arg((n,), BF16))
    params = {"m": n, "k": n, "n": n, "epilogue": "bias+relu"}
    cost: dict[str, Any] = {"flops": 2 * n**3 + 2 * n * n, "bytes": 2 * (3 * n * n + n)}
    return Case(f"mm_bias_relu_{n}", "matmul", "epilogue", params, f, args, **cost)


def matmul() -> list[Case]:
    cases = [_mm(f"mm_bf16_{n}", "n", n, n, n, quick=n == 1024) for n in (128, 256, 512, 1024, 2048, 4096, 8192)]
    cases += [_mm(f"mm_f32_{n}", "dtype", n, n, n, F32) for n in (256, 1024, 2048, 4096)]
    cases.append(_mm("mm_f32_highest_2048", "precision", 2048, 2048, 2048, F32, precision=lax.Precision.HIGHEST))
    cases += [_mm(f"mm_int8_{n}", "dtype", n, n, n, I8) for n in (1024, 4096, 8192)]
    for d in (96, 200, 640, 1000, 2000):  # tile fill: one dimension off the 128 grid, the others 2048
        cases.append(_mm(f"mm_fill_m{d}", "m", d, 2048, 2048))
        if d != 2000:
            cases.append(_mm(f"mm_fill_k{d}", "k", 2048, d, 2048))
            cases.append(_mm(f"mm_fill_n{d}", "n", 2048, 2048, d))
    cases += [_mm(f"mm_skinny_m{m}", "m", m, 4096, 4096) for m in (1, 8, 32)]  # a decode step's weight reads
    cases.append(_mm("mm_mlp_up", "shape", 8192, 1024, 4096))
    cases.append(_mm("mm_mlp_down", "shape", 8192, 4096, 1024))
    for t in (16, 32, 64, 128, 256, 512):  # batched small tiles, 2^31 FLOPs each
        cases.append(_batched(f"bmm_tile{t}", "tile", 2**30 // t**3, t, t, t))
    for d in (64, 128):  # attention's scores: (B*H, S, D) x (B*H, S, D) -> (B*H, S, S)
        cases.append(_batched(f"bmm_scores_d{d}", "head_dim", 64, 1024, d, 1024, "bij,bkj->bik"))
    cases.append(_fused_mm(4096))
    return cases


# -- gathers and scatters ---------------------------------------------------------------------
_T, _N, _D = 16384, 16384, 128  # a series' base: table rows, lookups, f32 lanes (512-byte rows)


def _gather(name: str, varied: str, t: int = _T, n: int = _N, d: int = _D, **kw: Any) -> Case:
    dist, form, dtype = kw.get("dist", "uniform"), kw.get("form", "take"), kw.get("dtype", F32)
    if form == "take":
        f = lambda x, i: jnp.take(x, i, axis=0)
    elif form == "take_clip":
        f = lambda x, i: jnp.take(x, i, axis=0, mode="clip")
    else:
        f = lambda x, i: x[i]
    row = d * _size(dtype)
    params = {"table_rows": t, "rows": n, "lanes": d, "row_bytes": row, "dist": dist, "form": form, "dtype": _dt(dtype)}
    args = (Arg((t, d), dtype), Arg((n,), I32, dist, t))
    return Case(name, "gather", varied, params, f, args, bytes=2 * n * row + 4 * n, quick=kw.get("quick", False))


def _bag(name: str, t: int, n: int, bag: int, d: int, dtype: Any) -> Case:
    def f(x: Any, i: Any) -> Any:
        return jnp.take(x, i, axis=0).sum(axis=1)

    row = d * _size(dtype)
    params = {"table_rows": t, "rows": n * bag, "bag": bag, "lanes": d, "row_bytes": row, "dtype": _dt(dtype)}
    args = (Arg((t, d), dtype), Arg((n, bag), I32, "uniform", t))
    return Case(name, "gather", "bag", params, f, args, flops=n * bag * d, bytes=(n * bag + n) * row + 4 * n * bag)


def gather() -> list[Case]:
    cases = [_gather(f"gather_row{d * 4}b", "row_bytes", d=d, quick=d == _D) for d in (32, 64, 128, 512, 4096)]
    cases += [_gather(f"gather_rows{n}", "rows", n=n) for n in (1024, 131072, 1048576)]
    cases += [_gather(f"gather_table{t}", "table_rows", t=t) for t in (1024, 262144, 1048576)]
    cases += [_gather(f"gather_{dist}", "dist", dist=dist) for dist in ("unique", "same", "few", "sorted")]
    cases += [_gather(f"gather_{form}", "form", form=form) for form in ("take_clip", "getitem")]
    cases.append(_gather("gather_bf16_row2048b", "dtype", d=1024, dtype=BF16))
    cases.append(_bag("gather_bag16", 65536, 4096, 16, 256, F32))
    cases.append(_gather("gather_vocab50k_bf16", "table_rows", t=50304, n=8192, d=1024, dtype=BF16))
    return cases


def _scatter(name: str, varied: str, t: int = _T, n: int = _N, d: int = _D, **kw: Any) -> Case:
    """Rows added into a table of zeros (as a gather's gradient is), or `set`."""
    dist, how, dtype, flags = kw.get("dist", "uniform"), kw.get("how", "add"), kw.get("dtype", F32), kw.get("flags")
    extra: dict[str, Any] = {"indices_are_sorted": True, "unique_indices": True} if flags else {}

    def f(u: Any, i: Any) -> Any:
        ref = jnp.zeros((t, d), dtype).at[i]
        return ref.add(u, **extra) if how == "add" else ref.set(u, **extra)

    row = d * _size(dtype)
    params = {"table_rows": t, "rows": n, "lanes": d, "row_bytes": row, "dist": dist, "how": how}
    params |= {"dtype": _dt(dtype), "sorted_unique_flags": bool(flags)}
    args = (Arg((n, d), dtype), Arg((n,), I32, dist, t))
    cost: dict[str, Any] = {"flops": n * d if how == "add" else 0, "bytes": t * row + 3 * n * row + 4 * n}
    return Case(name, "scatter", varied, params, f, args, **cost, quick=kw.get("quick", False))


def _scatter_in_place() -> Case:
    def f(x: Any, u: Any, i: Any) -> Any:
        return (x.at[i].add(u),)

    params = {"table_rows": _T, "rows": _N, "lanes": _D, "row_bytes": 4 * _D, "dist": "uniform", "how": "add"}
    args = (Arg((_T, _D)), Arg((_N, _D)), Arg((_N,), I32, "uniform", _T))
    cost: dict[str, Any] = {"flops": _N * _D, "bytes": 3 * _N * 4 * _D + 4 * _N}
    return Case("scatter_donated", "scatter", "in_place", params, f, args, **cost, donate=(0,))


def _take_grad() -> Case:
    def loss(x: Any, i: Any, w: Any) -> Any:
        return jnp.sum(jnp.take(x, i, axis=0) * w)

    def f(x: Any, i: Any, w: Any) -> Any:
        return jax.grad(loss)(x, i, w)

    params = {"table_rows": _T, "rows": _N, "lanes": _D, "row_bytes": 4 * _D, "dist": "uniform", "how": "grad of take"}
    args = (Arg((_T, _D)), Arg((_N,), I32, "uniform", _T), Arg((_N, _D)))
    cost: dict[str, Any] = {"flops": 2 * _N * _D, "bytes": _T * 4 * _D + 3 * _N * 4 * _D + 4 * _N}
    return Case("scatter_take_grad", "scatter", "form", params, f, args, **cost)


def scatter() -> list[Case]:
    cases = [_scatter(f"scatter_row{d * 4}b", "row_bytes", d=d, quick=d == _D) for d in (32, 64, 128, 512, 4096)]
    cases += [_scatter(f"scatter_rows{n}", "rows", n=n) for n in (1024, 131072, 1048576)]
    cases += [_scatter(f"scatter_table{t}", "table_rows", t=t) for t in (1024, 262144)]
    cases += [_scatter(f"scatter_{dist}", "dist", dist=dist) for dist in ("unique", "same", "few", "sorted")]
    cases.append(_scatter("scatter_unique_sorted", "dist", dist="unique_sorted"))
    cases.append(_scatter("scatter_unique_sorted_flags", "flags", dist="unique_sorted", flags=True))
    cases.append(_scatter("scatter_set", "how", how="set"))
    cases.append(_scatter("scatter_bf16_row2048b", "dtype", d=1024, dtype=BF16))
    cases += [_scatter_in_place(), _take_grad()]
    return cases


# -- associative scans, cumulative sums, segment sums ----------------------------------------
def _ascan(name: str, t: int, d: int, quick: bool = False) -> Case:
    def f(x: Any) -> Any:
        return lax.associative_scan(jnp.add, x, axis=0)

    params = {"length": t, "lanes": d, "op": "add", "axis": 0}
    return Case(name, "scan", "length", params, f, (Arg((t, d)),), flops=t * d, bytes=8 * t * d, quick=quick)


def _ssm(name: str, b: int, t: int, d: int) -> Case:
    """A selective-scan SSM's recurrence h_t = a_t h_{t-1} + b_t, over time (axis 1)."""

    def combine(c1: Any, c2: Any) -> Any:
        return c1[0] * c2[0], c2[0] * c1[1] + c2[1]

    def f(a: Any, x: Any) -> Any:
        return lax.associative_scan(combine, (a, x), axis=1)[1]

    params = {"batch": b, "length": t, "lanes": d, "op": "a*h+b", "axis": 1}
    cost: dict[str, Any] = {"flops": 3 * b * t * d, "bytes": 12 * b * t * d}
    return Case(name, "scan", "length", params, f, (Arg((b, t, d)), Arg((b, t, d))), **cost)


def _cumsum(name: str, axis: int) -> Case:
    def f(x: Any) -> Any:
        return jnp.cumsum(x, axis=axis)

    params = {"length": 4096, "lanes": 512, "op": "cumsum", "axis": axis}
    return Case(name, "scan", "axis", params, f, (Arg((4096, 512)),), flops=4096 * 512, bytes=8 * 4096 * 512)


def _segment(name: str, varied: str, e: int = 131072, d: int = 128, segments: int = 16384, **kw: Any) -> Case:
    dist, op = kw.get("dist", "uniform"), kw.get("op", "sum")

    def f(x: Any, i: Any) -> Any:
        call = jax.ops.segment_sum if op == "sum" else jax.ops.segment_max
        return call(x, i, num_segments=segments, indices_are_sorted=dist == "sorted")

    params = {"edges": e, "lanes": d, "segments": segments, "dist": dist, "op": op}
    args = (Arg((e, d)), Arg((e,), I32, dist, segments))
    cost: dict[str, Any] = {"flops": e * d, "bytes": 4 * (2 * e * d + segments * d + e)}
    return Case(name, "scan", varied, params, f, args, **cost, quick=kw.get("quick", False))


def scan() -> list[Case]:
    cases = [_ascan(f"ascan_t{t}", t, 512, quick=t == 1024) for t in (256, 1024, 4096, 16384)]
    cases += [_ssm(f"ascan_ssm_t{t}", 8, t, 256) for t in (256, 1024, 4096)]
    cases += [_cumsum("cumsum_axis0", 0), _cumsum("cumsum_axis1", 1)]
    cases += [_segment(f"segsum_e{e}", "edges", e=e, quick=e == 131072) for e in (16384, 131072, 1048576)]
    cases += [_segment(f"segsum_d{d}", "lanes", d=d) for d in (16, 512)]
    cases.append(_segment("segsum_sorted", "dist", dist="sorted"))
    cases.append(_segment("segsum_seg16", "segments", segments=16))
    cases.append(_segment("segmax", "op", op="max"))
    return cases


# -- Pallas TPU kernels ---------------------------------------------------------------------
def _pallas_matmul(n: int, block: int, estimate: bool, quick: bool = False) -> Case:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    steps = n // block

    def kernel(x_ref: Any, y_ref: Any, o_ref: Any, acc_ref: Any) -> None:
        @pl.when(pl.program_id(2) == 0)
        def _() -> None:
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=F32)

        @pl.when(pl.program_id(2) == steps - 1)
        def _() -> None:
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    flops, nbytes = 2 * n**3, 2 * 3 * n * n
    params = pltpu.CompilerParams
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n, n), BF16),
        grid=(steps, steps, steps),
        in_specs=[
            pl.BlockSpec((block, block), lambda i, j, k: (i, k)),
            pl.BlockSpec((block, block), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((block, block), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((block, block), F32)],
        compiler_params=params(dimension_semantics=("parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0, bytes_accessed=nbytes) if estimate else None,
    )
    name = f"pallas_mm_{n}_b{block}" + ("_est" if estimate else "")
    varied = "n" if block == 512 else "block"
    p = {"m": n, "k": n, "n": n, "block": block, "grid": [steps] * 3, "cost_estimate": estimate, "dtype": "bfloat16"}
    args = (Arg((n, n), BF16), Arg((n, n), BF16))
    return Case(name, "pallas", varied, p, call, args, flops=flops, bytes=nbytes, tpu_only=True, quick=quick)


def _pallas_add(rows: int, cols: int, block: int | None) -> Case:
    from jax.experimental import pallas as pl

    def kernel(x_ref: Any, y_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref[...] + y_ref[...]

    if block is None:  # no grid: the whole arrays copied into VMEM
        call = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), F32))
    else:
        spec = pl.BlockSpec((block, cols), lambda i: (i, 0))
        shape = jax.ShapeDtypeStruct((rows, cols), F32)
        call = pl.pallas_call(kernel, out_shape=shape, grid=(rows // block,), in_specs=[spec, spec], out_specs=spec)
    name = f"pallas_add_{rows * cols * 4 // MiB}mib_" + (f"b{block}" if block else "nogrid")
    params = {"rows": rows, "lanes": cols, "block_rows": block, "grid": rows // block if block else None}
    args = (Arg((rows, cols)), Arg((rows, cols)))
    cost: dict[str, Any] = {"flops": rows * cols, "bytes": 12 * rows * cols}
    return Case(name, "pallas", "block_rows", params, call, args, **cost, tpu_only=True)


def _flash(s: int, causal: bool = True, grad: bool = False, b: int = 2, h: int = 8, d: int = 128) -> Case:
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    scale = d**-0.5

    def forward(q: Any, k: Any, v: Any) -> Any:
        return flash_attention(q, k, v, causal=causal, sm_scale=scale)

    def f(q: Any, k: Any, v: Any) -> Any:
        if not grad:
            return forward(q, k, v)
        return jax.grad(lambda *a: forward(*a).astype(F32).sum(), argnums=(0, 1, 2))(q, k, v)

    share = 0.5 if causal else 1.0
    flops = 4 * b * h * s * s * d * share * (3.5 if grad else 1.0)  # backward: 2.5x the forward's products
    name = f"flash_s{s}" + ("" if causal else "_full") + ("_grad" if grad else "")
    params = {"batch": b, "heads": h, "length": s, "head_dim": d, "causal": causal, "grad": grad, "dtype": "bfloat16"}
    qkv = tuple(Arg((b, h, s, d), BF16) for _ in range(3))
    varied = "grad" if grad else ("length" if causal else "causal")
    cost: dict[str, Any] = {
        "flops": flops,
        "bytes": 2 * b * h * s * d * (10 if grad else 4),
        "transcendentals": b * h * s * s * share,
    }
    return Case(name, "pallas", varied, params, f, qkv, **cost, tpu_only=True)


def pallas() -> list[Case]:
    cases = [_pallas_matmul(n, 512, True, quick=n == 1024) for n in (1024, 2048, 4096)]
    cases += [_pallas_matmul(n, 512, False) for n in (1024, 2048, 4096)]
    cases += [_pallas_matmul(4096, b, True) for b in (128, 256)]
    cases += [_pallas_add(16384, 256, b) for b in (64, 512, 2048)]
    cases.append(_pallas_add(1024, 256, None))
    cases += [_flash(s) for s in (512, 1024, 2048, 4096)]
    cases.append(_flash(2048, causal=False))
    cases += [_flash(s, grad=True) for s in (1024, 4096)]
    return cases


# -- data movement --------------------------------------------------------------------------
def _move(name: str, varied: str, f: Callable[..., Any], args: tuple[Arg, ...], out: int, **params: Any) -> Case:
    return Case(name, "movement", varied, params, f, args, bytes=sum(a.nbytes for a in args) + out)


def _kv(name: str, s: int, donate: bool = True, layout: str = "bshd", b: int = 8, h: int = 16, d: int = 128) -> Case:
    """A decode step's cache write: one token at position s // 2 into a bf16 cache."""
    cache = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    token = (b, 1, h, d) if layout == "bshd" else (b, h, 1, d)

    def f(c: Any, x: Any, pos: Any) -> Any:
        at = (0, pos, 0, 0) if layout == "bshd" else (0, 0, pos, 0)
        return (lax.dynamic_update_slice(c, x, at),)

    params = {"batch": b, "length": s, "heads": h, "head_dim": d, "layout": layout, "donated": donate}
    args = (Arg(cache, BF16), Arg(token, BF16), Arg((), I32, "const", s // 2))
    varied = "donated" if not donate else ("length" if layout == "bshd" else "layout")
    nbytes = 2 * 2 * b * h * d if donate else 2 * 2 * b * s * h * d  # the token read and written, or the cache copied
    return Case(name, "movement", varied, params, f, args, bytes=nbytes, donate=(0,) if donate else ())


def _kv_loop(s: int = 4096, steps: int = 16, b: int = 8, h: int = 16, d: int = 128) -> Case:
    def f(c: Any, x: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            token = lax.dynamic_slice_in_dim(x, i, 1, axis=1)
            return lax.dynamic_update_slice(c, token, (0, s // 2 + i, 0, 0))

        return (lax.fori_loop(0, steps, body, c),)

    params = {"batch": b, "length": s, "heads": h, "head_dim": d, "layout": "bshd", "donated": True, "trips": steps}
    args = (Arg((b, s, h, d), BF16), Arg((b, steps, h, d), BF16))
    return Case("dus_kv_loop16", "movement", "loop", params, f, args, bytes=4 * b * steps * h * d, donate=(0,))


def _slice_loop(rows: int = 1024, cols: int = 1024, steps: int = 16) -> Case:
    def f(x: Any) -> Any:
        body = lambda i, acc: acc + lax.dynamic_slice_in_dim(x, i * rows, rows, axis=0)
        return lax.fori_loop(0, steps, body, jnp.zeros((rows, cols), F32))

    params = {"rows": rows, "lanes": cols, "trips": steps}
    cost: dict[str, Any] = {"flops": steps * rows * cols, "bytes": 4 * (steps + 1) * rows * cols}
    return Case("dslice_loop16", "movement", "loop", params, f, (Arg((steps * rows, cols)),), **cost)


def _scan_ys(rows: int = 1024, cols: int = 1024, steps: int = 16) -> Case:
    def f(c: Any) -> Any:
        return lax.scan(lambda c, _: (c * 0.5 + 1.0, c), c, None, length=steps)[1]

    params = {"rows": rows, "lanes": cols, "trips": steps}
    cost: dict[str, Any] = {"flops": 2 * steps * rows * cols, "bytes": 4 * (steps + 1) * rows * cols}
    return Case("dus_scan_ys16", "movement", "loop", params, f, (Arg((rows, cols)),), **cost)


def movement() -> list[Case]:
    r, big = 16384, Arg((16384, 1024))  # 64 MiB of f32
    cases = [_kv(f"dus_kv_s{s}", s) for s in (1024, 4096, 8192)]
    cases[0] = dataclasses.replace(cases[0], quick=True)
    cases += [_kv("dus_kv_s4096_copy", 4096, donate=False), _kv("dus_kv_bhsd_s4096", 4096, layout="bhsd")]
    cases += [_kv_loop(), _slice_loop(), _scan_ys()]
    cases += [
        _move("slice_minor_half", "axis", lambda x: x[:, :512], (big,), 32 * MiB, axis=1, size=64 * MiB),
        _move("slice_major", "axis", lambda x: x[1:-1], (big,), 64 * MiB, axis=0, size=64 * MiB),
        _move("slice_strided", "stride", lambda x: x[:, ::2], (big,), 32 * MiB, axis=1, stride=2, size=64 * MiB),
        _move(
            "pad_minor_1000",
            "axis",
            lambda x: jnp.pad(x, ((0, 0), (0, 24))),
            (Arg((r, 1000)),),
            64 * MiB,
            axis=1,
            lanes=1000,
        ),
        _move("pad_major", "axis", lambda x: jnp.pad(x, ((8, 8), (0, 0))), (big,), 64 * MiB + 64 * KiB, axis=0),
        _move(
            "concat2_minor",
            "axis",
            lambda a, b: jnp.concatenate([a, b], 1),
            (Arg((r, 512)),) * 2,
            64 * MiB,
            axis=1,
            pieces=2,
        ),
        _move(
            "concat2_major",
            "axis",
            lambda a, b: jnp.concatenate([a, b], 0),
            (Arg((r // 2, 1024)),) * 2,
            64 * MiB,
            axis=0,
            pieces=2,
        ),
        _move(
            "concat8_minor",
            "pieces",
            lambda *a: jnp.concatenate(a, 1),
            (Arg((r, 128)),) * 8,
            64 * MiB,
            axis=1,
            pieces=8,
        ),
        _move("transpose_f32_4096", "size", lambda x: x.T, (Arg((4096, 4096)),), 64 * MiB, dtype="float32"),
        _move("transpose_f32_1024", "size", lambda x: x.T, (Arg((1024, 1024)),), 4 * MiB, dtype="float32"),
        _move("transpose_bf16_4096", "dtype", lambda x: x.T, (Arg((4096, 4096), BF16),), 32 * MiB, dtype="bfloat16"),
        _move(
            "transpose_bshd_bhsd",
            "perm",
            lambda x: x.transpose(0, 2, 1, 3),
            (Arg((8, 2048, 16, 128), BF16),),
            64 * MiB,
            perm=[0, 2, 1, 3],
        ),
        _move(
            "transpose_bsd_bds",
            "perm",
            lambda x: x.transpose(0, 2, 1),
            (Arg((16, 1024, 1024)),),
            64 * MiB,
            perm=[0, 2, 1],
        ),
        _move(
            "reshape_relayout",
            "shape",
            lambda x: x.reshape(8000, 1024),
            (Arg((8192, 1000)),),
            8000 * 4096,
            shape_in=[8192, 1000],
            shape_out=[8000, 1024],
        ),
    ]
    return cases


# -- elementwise work and reductions -------------------------------------------------------
def _rows(nbytes: int, lanes: int, dtype: Any = F32) -> int:
    return max(1, nbytes // (lanes * _size(dtype)))


def _ew(name: str, varied: str, nbytes: int, lanes: int = 128, dtype: Any = F32, op: str = "axpb", **kw: Any) -> Case:
    shape = (_rows(nbytes, lanes, dtype), lanes)
    n, size = math.prod(shape), _size(dtype)
    fns: dict[str, tuple[Callable[..., Any], int, int, int]] = {
        "axpb": (lambda x: x * 1.5 + 0.5, 1, 2, 0),  # (fn, inputs, flops per element, transcendentals per element)
        "exp": (jnp.exp, 1, 0, 1),
        "tanh": (jnp.tanh, 1, 0, 1),
        "bcast": (lambda x, r: x + r, 1, 1, 0),
        "fma3": (lambda x, y, z: x * y + z, 3, 2, 0),
    }
    f, inputs, flops, trans = fns[op]
    args = tuple(Arg(shape, dtype) for _ in range(inputs)) + ((Arg((lanes,), dtype),) if op == "bcast" else ())
    params = {"bytes": n * size, "rows": shape[0], "lanes": lanes, "dtype": _dt(dtype), "op": op, "where": "top"}
    cost: dict[str, Any] = {"flops": flops * n, "transcendentals": trans * n, "bytes": (inputs + 1) * n * size}
    return Case(name, "elementwise", varied, params, f, args, **cost, quick=kw.get("quick", False))


def _ew_loop(name: str, nbytes: int, trips: int = 16) -> Case:
    shape = (_rows(nbytes, 128), 128)

    def f(x: Any) -> Any:
        return lax.fori_loop(0, trips, lambda i, x: x * 1.0001 + i.astype(F32) * 1e-3, x)

    n = math.prod(shape)
    params = {"bytes": 4 * n, "rows": shape[0], "lanes": 128, "op": "axpb", "where": "fori_loop", "trips": trips}
    return Case(name, "elementwise", "bytes", params, f, (Arg(shape),), flops=2 * n * trips, bytes=8 * n * trips)


def _ew_scan(name: str, nbytes: int, trips: int = 16) -> Case:
    shape = (_rows(nbytes, 128), 128)

    def f(c: Any, xs: Any) -> Any:
        return lax.scan(lambda c, x: (c * 0.5 + x, None), c, xs)[0]

    n = math.prod(shape)
    params = {"bytes": 4 * n, "rows": shape[0], "lanes": 128, "op": "c*0.5+x_t", "where": "scan", "trips": trips}
    cost: dict[str, Any] = {"flops": 2 * n * trips, "bytes": 12 * n * trips}
    return Case(name, "elementwise", "bytes", params, f, (Arg(shape), Arg((trips, *shape))), **cost)


def elementwise() -> list[Case]:
    sizes = (KiB, 16 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
    cases = [_ew(f"ew_{_label(s)}", "bytes", s, quick=s == 16 * MiB) for s in sizes]
    cases += [_ew(f"ew_16mib_lanes{n}", "lanes", 16 * MiB, n) for n in (64, 256, 1000)]
    cases.append(_ew("ew_16mib_bf16", "dtype", 16 * MiB, dtype=BF16))
    cases += [_ew(f"ew_16mib_{op}", "op", 16 * MiB, op=op) for op in ("exp", "tanh", "bcast", "fma3")]
    cases += [_ew_loop(f"ew_loop_{_label(s)}", s) for s in (4 * KiB, 64 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB)]
    cases += [_ew_scan(f"ew_scan_{_label(s)}", s) for s in (64 * KiB, 4 * MiB)]
    return cases


def _label(nbytes: int) -> str:
    return f"{nbytes // MiB}mib" if nbytes >= MiB else f"{nbytes // KiB}kib"


def _red(name: str, varied: str, nbytes: int, lanes: int = 128, axis: Any = -1, **kw: Any) -> Case:
    op, dtype = kw.get("op", "sum"), kw.get("dtype", F32)
    shape = (_rows(nbytes, lanes, dtype), lanes)
    fns: dict[str, Callable[..., Any]] = {
        "sum": lambda x: jnp.sum(x, axis=axis, dtype=F32),
        "max": lambda x: jnp.max(x, axis=axis),
        "log_softmax": lambda x: jax.nn.log_softmax(x, axis=axis),
    }
    n = math.prod(shape)
    kept = n if op == "log_softmax" else (1 if axis is None else n // shape[axis])
    params = {"bytes": n * _size(dtype), "rows": shape[0], "lanes": lanes, "axis": axis, "op": op}
    params |= {"dtype": _dt(dtype), "where": "top"}
    softmax = op == "log_softmax"
    cost: dict[str, Any] = {"flops": n * (4 if softmax else 1), "transcendentals": 2 * n if softmax else 0}
    cost["bytes"] = n * _size(dtype) + 4 * kept
    return Case(name, "reduce", varied, params, fns[op], (Arg(shape, dtype),), **cost, quick=kw.get("quick", False))


def _red_loop(name: str, nbytes: int, trips: int = 16) -> Case:
    shape = (_rows(nbytes, 128), 128)

    def f(x: Any) -> Any:
        def body(i: Any, c: Any) -> Any:
            x, acc = c
            return x * 0.999, acc + jnp.sum(x, axis=-1)

        return lax.fori_loop(0, trips, body, (x, jnp.zeros(shape[:1], F32)))

    n = math.prod(shape)
    params = {"bytes": 4 * n, "rows": shape[0], "lanes": 128, "axis": -1, "op": "sum", "where": "fori_loop"}
    params["trips"] = trips
    return Case(name, "reduce", "bytes", params, f, (Arg(shape),), flops=2 * n * trips, bytes=8 * n * trips)


def reduce() -> list[Case]:
    m16 = 16 * MiB
    cases = [_red(f"sum_lanes{n}", "lanes", m16, n, quick=n == 128) for n in (64, 128, 256, 1000)]
    cases += [_red(f"sum_major_lanes{n}", "axis", m16, n, axis=0) for n in (128, 1000)]
    cases += [_red(f"sum_all_{_label(s)}", "bytes", s, axis=None) for s in (KiB, 64 * KiB, MiB, m16, 256 * MiB)]
    cases.append(_red("max_lanes1000", "op", m16, 1000, op="max"))
    cases.append(_red("log_softmax_lanes1000", "op", m16, 1000, op="log_softmax"))
    cases.append(_red("sum_bf16_lanes1000", "dtype", m16, 1000, dtype=BF16))
    cases += [_red_loop(f"sum_loop_{_label(s)}", s) for s in (64 * KiB, 4 * MiB, 64 * MiB)]
    return cases


# -- copies between the device and pinned host memory --------------------------------------
def _to(space: str, dev: Any) -> Any:
    """Where `jax.device_put` inside a jitted step sends an array: `jax.memory.Space` where
    JAX has it, else a single-device sharding with that memory kind."""
    spaces = getattr(getattr(jax, "memory", None), "Space", None)
    if spaces is not None:
        return spaces.Host if space == "pinned_host" else spaces.Device
    return jax.sharding.SingleDeviceSharding(dev, memory_kind=space)


def host(dev: Any) -> list[Case]:
    def d2h(x: Any) -> Any:
        return jax.device_put(x, _to("pinned_host", dev))

    def h2d(x: Any) -> Any:
        return jax.device_put(x, _to("device", dev))

    def both(x: Any, y: Any) -> Any:
        return d2h(x), h2d(y)

    def beside(put: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x, w, y: (x @ w, put(y))

    cases = []
    for s in (MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        a = Arg((s // 4 // 1024, 1024))
        p = {"bytes": s, "direction": "device_to_host", "beside": None}
        cases.append(Case(f"d2h_{_label(s)}", "host", "bytes", p, d2h, (a,), bytes=s, quick=s == 16 * MiB))
        p = {"bytes": s, "direction": "host_to_device", "beside": None}
        a = dataclasses.replace(a, memory="pinned_host")
        cases.append(Case(f"h2d_{_label(s)}", "host", "bytes", p, h2d, (a,), bytes=s, quick=s == 16 * MiB))
    s, n = 64 * MiB, 4096
    mm = (Arg((n, n), BF16), Arg((n, n), BF16))
    y, yh = Arg((s // 4096, 1024)), Arg((s // 4096, 1024), memory="pinned_host")
    beside_mm = {"bytes": s, "beside": f"bf16 matmul {n}"}
    cost: dict[str, Any] = {"flops": 2 * n**3, "bytes": s + 6 * n * n}
    p_d2h, p_h2d = {**beside_mm, "direction": "device_to_host"}, {**beside_mm, "direction": "host_to_device"}
    cases.append(Case("d2h_64mib_beside_mm", "host", "beside", p_d2h, beside(d2h), (*mm, y), **cost))
    cases.append(Case("h2d_64mib_beside_mm", "host", "beside", p_h2d, beside(h2d), (*mm, yh), **cost))
    p = {"bytes": s, "direction": "both", "beside": None}
    cases.append(Case("d2h_h2d_64mib", "host", "direction", p, both, (y, yh), bytes=2 * s))
    return cases


def cases(dev: Any) -> list[Case]:
    """Every case, in the order `micro.py` runs them (the groups of `GROUPS`)."""
    builders = {g: globals()[g] for g in GROUPS if g != "host"} | {"host": lambda: host(dev)}
    out = [c for g in GROUPS for c in builders[g]()]
    names = [c.name for c in out]
    assert len(set(names)) == len(names), "case names must be unique"
    return out


SELFTEST = ("mm_bf16_1024", "gather_row512b", "pallas_mm_1024_b512_est")
