"""The accelerators' own figures, as their makers publish them: the clock the compiler
counts its cycles in, peak FLOP/s per dtype, HBM bandwidth, and the interconnect's
bandwidth and latency per link. Data only, each chip with its public sources; `_time`
reads them to put a step's kernels in seconds.

A TPU's clock is not on its data sheet; it is its bf16 peak over what its matrix units do
per cycle (v5e: 4 units of 128x128 multiply-adds, 197 TFLOP/s -> 1.50 GHz; v5p: two cores
of 4 such units, 459 -> 1.75 GHz; v6e: 4 units of 256x256, 918 -> 1.75 GHz), which libtpu's
own estimates confirm: an 8192x8192x8192 bf16 matmul is estimated at 88% (v5e) and 90% (v5p)
of that peak per cycle, and ran at 85% on a real v5e (167 TFLOP/s).

`f32` is a matrix product at JAX's default precision (one bf16 pass on a TPU, TF32 on an
NVIDIA GPU); a dtype without a figure is counted at the bf16 peak, so that a floor stays
a floor.
"""

import dataclasses
from collections.abc import Mapping
from typing import Final


@dataclasses.dataclass(frozen=True)
class Chip:
    clock_hz: float | None  # the cycles libtpu's estimates count (TPUs), else None
    peak_flops: Mapping[str, float]  # per second, by "bf16", "f32", "int8", "fp8"
    hbm_bytes_per_second: float
    link_bytes_per_second: float  # one direction of one interconnect link (ICI, NVLink)
    link_latency_seconds: float
    sources: tuple[str, ...]

    def peak(self, dtype: str) -> float:
        """The peak FLOP/s of a matrix product of `dtype` (a JAX dtype name)."""
        key = {"bfloat16": "bf16", "float16": "bf16", "float32": "f32", "int8": "int8", "uint8": "int8"}.get(dtype)
        if key is None and dtype.startswith("float8"):
            key = "fp8"
        return self.peak_flops.get(key or "bf16", self.peak_flops["bf16"])


_TPU_DOCS: Final = "https://cloud.google.com/tpu/docs/"
_SCALING_BOOK: Final = "https://jax-ml.github.io/scaling-book/tpus/ (ICI bandwidth per link, ~1 us per hop)"
_NVIDIA: Final = "https://www.nvidia.com/en-us/data-center/"

CHIPS: Final[dict[str, Chip]] = {
    "v5e": Chip(
        1.5e9,
        {"bf16": 197e12, "f32": 197e12, "int8": 394e12},
        819e9,
        4.5e10,
        1e-6,
        (_TPU_DOCS + "v5e", _SCALING_BOOK),
    ),
    "v5p": Chip(
        1.75e9,
        {"bf16": 459e12, "f32": 459e12, "int8": 918e12},
        2765e9,
        9e10,
        1e-6,
        (_TPU_DOCS + "v5p", _SCALING_BOOK),
    ),
    "v6e": Chip(
        1.75e9,
        {"bf16": 918e12, "f32": 918e12, "int8": 1836e12},
        1640e9,
        9e10,
        1e-6,
        (_TPU_DOCS + "v6e", _SCALING_BOOK),
    ),
    # NVIDIA: dense tensor-core peaks; NVLink per link one way (NVLink 4: 18 links of 25 GB/s
    # each way on H100/H200; NVLink 3: 12 on A100; NVLink 5: 18 of 50 GB/s on B200).
    "h100": Chip(
        None,
        {"bf16": 989.4e12, "f32": 494.7e12, "int8": 1978.9e12, "fp8": 1978.9e12},
        3.35e12,
        25e9,
        2e-6,
        (_NVIDIA + "h100/",),
    ),
    "h100-pcie": Chip(
        None,
        {"bf16": 756e12, "f32": 378e12, "int8": 1513e12, "fp8": 1513e12},
        2.0e12,
        25e9,
        2e-6,
        (_NVIDIA + "h100/",),
    ),
    "h200": Chip(
        None,
        {"bf16": 989.4e12, "f32": 494.7e12, "int8": 1978.9e12, "fp8": 1978.9e12},
        4.8e12,
        25e9,
        2e-6,
        (_NVIDIA + "h200/",),
    ),
    "b200": Chip(
        None,
        {"bf16": 2.25e15, "f32": 1.1e15, "int8": 4.5e15, "fp8": 4.5e15},
        8.0e12,
        50e9,
        2e-6,
        (_NVIDIA + "dgx-b200/",),
    ),
    "a100-80gb": Chip(
        None,
        {"bf16": 312e12, "f32": 156e12, "int8": 624e12},
        2.039e12,
        25e9,
        2e-6,
        (_NVIDIA + "a100/",),
    ),
    "a100-40gb": Chip(
        None,
        {"bf16": 312e12, "f32": 156e12, "int8": 624e12},
        1.555e12,
        25e9,
        2e-6,
        (_NVIDIA + "a100/",),
    ),
}
