"""The accelerators' own facts, one record a chip (`Chip`): the compiler that compiles for
it without it and what that compiler tells of a program (`Compiler`), the clock the
compiler counts its cycles in, peak FLOP/s per dtype, HBM bandwidth, the interconnect's
bandwidth and latency per link, and a TPU's matrix unit and vector lanes, each chip with
its public sources. `_target` carries a chip in each target; the rooms that compile, read
and time a program ask the record, never a platform's name.

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
from typing import Final, Literal


# The compilers' platforms, as `jax.experimental.topologies` names them.
Platform = Literal["cuda", "tpu"]


@dataclasses.dataclass(frozen=True)
class Compiler:
    """A compiler that compiles for a chip without it, and what it tells of a program."""

    platform: Platform  # as `jax.experimental.topologies` names it
    name: str  # as `ts.targets()` says it: "libtpu"
    called: str  # as an error says a target compiles with it: "libtpu", "JAX's CUDA plugin"
    plugin: str  # as an error says it did not start: "libtpu", "CUDA plugin"
    extra: str  # the treeshape extra that installs it: `pip install "treeshape[tpu]"`
    install: str  # what that extra installs for a jaxlib (`{jaxlib}`), and what it needs
    modules: tuple[str, ...]  # the modules, any one of which installs it
    deviceless_from: str | None  # the JAX release from which it compiles without a device, where one needs it
    settings: str  # the environment it starts in without a device
    named_topology: bool  # a target's topology is named after a colon ("v5e:16x16"), not formed from hosts
    dump: str  # the end of the name of its dump of the optimized module with its buffer assignment
    kernels: str  # the end of the name of its dump of the module whose kernels run (text, `.hlo.pb`)
    live_ranges: bool  # it dumps its own schedule's live ranges beside the buffer assignment
    own_peak: bool  # its `memory_analysis()` peak is what the chip holds (it refuses a program past it)
    estimated_cycles: bool  # each kernel of its module carries its `estimated_cycles`
    loop_counts: bool  # its optimized module tells each loop's body and trip count
    host_callbacks: bool  # it compiles a host callback without a device
    whole_memory: bool  # one program may use all of a device's memory (no preallocated fraction)


LIBTPU: Final = Compiler(
    platform="tpu",
    name="libtpu",
    called="libtpu",
    plugin="libtpu",
    extra="tpu",
    install="jax[tpu]=={jaxlib} picks its libtpu",
    modules=("libtpu",),
    deviceless_from=None,
    settings="JAX_PLATFORMS=cpu and TPU_SKIP_MDS_QUERY=1",
    named_topology=True,
    dump=".after_optimizations.hlo.pb",
    kernels=".after_codegen",
    live_ranges=True,
    own_peak=True,
    estimated_cycles=True,
    loop_counts=True,
    host_callbacks=True,
    whole_memory=True,
)
XLA_GPU: Final = Compiler(
    platform="cuda",
    name="XLA:GPU through JAX's CUDA plugin",
    called="JAX's CUDA plugin",
    plugin="CUDA plugin",
    extra="cuda",
    install="jax-cuda12-plugin=={jaxlib}; no CUDA libraries or driver needed",
    modules=("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"),
    deviceless_from="0.10.0",
    settings="JAX_PLATFORMS=cpu",
    named_topology=False,
    dump="gpu_after_optimizations.hlo.pb",
    kernels="gpu_after_optimizations",
    live_ranges=False,
    own_peak=False,
    estimated_cycles=False,
    loop_counts=False,
    host_callbacks=False,
    whole_memory=False,
)


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator's facts: its compiler, clock, peaks, memory and links, and (a TPU)
    the side of its matrix unit's tiles and its vector registers' lanes."""

    name: str  # as `ts.targets()` lists it
    compiler: Compiler
    clock_hz: float | None  # the cycles libtpu's estimates count (TPUs), else None
    peak_flops: Mapping[str, float]  # per second, by "bf16", "f32", "int8", "fp8"
    hbm_bytes_per_second: float
    link_bytes_per_second: float  # one direction of one interconnect link (ICI, NVLink)
    link_latency_seconds: float
    matrix_tile: int | None  # a TPU matrix unit multiplies tiles of this side; None: no tiles counted
    lanes: int | None  # a TPU vector register's lanes; None: no lanes counted
    sources: tuple[str, ...]

    def peak(self, dtype: str) -> float:
        """The peak FLOP/s of a matrix product of `dtype` (a JAX dtype name)."""
        key = {"bfloat16": "bf16", "float16": "bf16", "float32": "f32", "int8": "int8", "uint8": "int8"}.get(dtype)
        if key is None and dtype.startswith("float8"):
            key = "fp8"
        return self.peak_flops.get(key or "bf16", self.peak_flops["bf16"])

    @property
    def estimated(self) -> bool:
        """Whether a step's time is estimated from its compiler's cycles (a TPU's, checked
        against a chip), not only its roofline floor."""
        return self.compiler.estimated_cycles and self.clock_hz is not None


_TPU_DOCS: Final = "https://cloud.google.com/tpu/docs/"
_SCALING_BOOK: Final = "https://jax-ml.github.io/scaling-book/tpus/ (ICI bandwidth per link, ~1 us per hop)"
# The TPU architecture page: a matrix unit (MXU) is a systolic array of 128x128 multiply-adds
# before v6e, of 256x256 on v6e; a vector register is 8 sublanes of 128 lanes.
_TPU_ARCHITECTURE: Final = _TPU_DOCS + "system-architecture-tpu-vm (matrix units: 128x128, 256x256 on v6e)"
_NVIDIA: Final = "https://www.nvidia.com/en-us/data-center/"

CHIPS: Final[dict[str, Chip]] = {
    "v5e": Chip(
        "v5e",
        LIBTPU,
        clock_hz=1.5e9,
        peak_flops={"bf16": 197e12, "f32": 197e12, "int8": 394e12},
        hbm_bytes_per_second=819e9,
        link_bytes_per_second=4.5e10,
        link_latency_seconds=1e-6,
        matrix_tile=128,
        lanes=128,
        sources=(_TPU_DOCS + "v5e", _SCALING_BOOK, _TPU_ARCHITECTURE),
    ),
    "v5p": Chip(
        "v5p",
        LIBTPU,
        clock_hz=1.75e9,
        peak_flops={"bf16": 459e12, "f32": 459e12, "int8": 918e12},
        hbm_bytes_per_second=2765e9,
        link_bytes_per_second=9e10,
        link_latency_seconds=1e-6,
        matrix_tile=128,
        lanes=128,
        sources=(_TPU_DOCS + "v5p", _SCALING_BOOK, _TPU_ARCHITECTURE),
    ),
    "v6e": Chip(
        "v6e",
        LIBTPU,
        clock_hz=1.75e9,
        peak_flops={"bf16": 918e12, "f32": 918e12, "int8": 1836e12},
        hbm_bytes_per_second=1640e9,
        link_bytes_per_second=9e10,
        link_latency_seconds=1e-6,
        matrix_tile=256,
        lanes=128,
        sources=(_TPU_DOCS + "v6e", _SCALING_BOOK, _TPU_ARCHITECTURE),
    ),
    # NVIDIA: dense tensor-core peaks; NVLink per link one way (NVLink 4: 18 links of 25 GB/s
    # each way on H100/H200; NVLink 3: 12 on A100; NVLink 5: 18 of 50 GB/s on B200).
    "h100": Chip(
        "h100",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 989.4e12, "f32": 494.7e12, "int8": 1978.9e12, "fp8": 1978.9e12},
        hbm_bytes_per_second=3.35e12,
        link_bytes_per_second=25e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "h100/",),
    ),
    "h100-pcie": Chip(
        "h100-pcie",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 756e12, "f32": 378e12, "int8": 1513e12, "fp8": 1513e12},
        hbm_bytes_per_second=2.0e12,
        link_bytes_per_second=25e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "h100/",),
    ),
    "h200": Chip(
        "h200",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 989.4e12, "f32": 494.7e12, "int8": 1978.9e12, "fp8": 1978.9e12},
        hbm_bytes_per_second=4.8e12,
        link_bytes_per_second=25e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "h200/",),
    ),
    "b200": Chip(
        "b200",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 2.25e15, "f32": 1.1e15, "int8": 4.5e15, "fp8": 4.5e15},
        hbm_bytes_per_second=8.0e12,
        link_bytes_per_second=50e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "dgx-b200/",),
    ),
    "a100-80gb": Chip(
        "a100-80gb",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 312e12, "f32": 156e12, "int8": 624e12},
        hbm_bytes_per_second=2.039e12,
        link_bytes_per_second=25e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "a100/",),
    ),
    "a100-40gb": Chip(
        "a100-40gb",
        XLA_GPU,
        clock_hz=None,
        peak_flops={"bf16": 312e12, "f32": 156e12, "int8": 624e12},
        hbm_bytes_per_second=1.555e12,
        link_bytes_per_second=25e9,
        link_latency_seconds=2e-6,
        matrix_tile=None,
        lanes=None,
        sources=(_NVIDIA + "a100/",),
    ),
}
