"""The accelerators `ts.cost(..., target=NAME)` compiles for, without them: their names,
memory and topologies (`targets`, `resolve`, `topology`), the devices of a topology as the
installed compiler describes them (`devices`, through `jax.experimental.topologies`), and
every error a target can raise before anything compiles.

NVIDIA targets are compiled by XLA:GPU through JAX's CUDA plugin, with the device
description XLA's own spec gives that GPU (shipped as `treeshape/_cost/specs/NAME.txtpb`, see
`_spec_text`); TPU targets by libtpu, for its own topology. Nothing here needs a device or
a driver; the compile itself is `_deviceless`.
"""

import dataclasses
import functools
import importlib.metadata
import importlib.util
import math
import os
import re
from pathlib import Path
from typing import Any, Final

import jax

from .. import _compat


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # as `ts.targets()` lists it
    label: str  # as `Cost.backend` names it: "H100", "TPU v5e"
    platform: str  # "cuda" or "tpu"
    device_bytes: int  # the memory one program may use on one device
    description: str


_GIB: Final = 2**30
_TARGETS: Final = {
    t.name: t
    for t in (
        Target("h100", "H100", "cuda", 84_942_979_072, "NVIDIA H100 SXM 80 GB"),
        Target("h100-pcie", "H100 PCIe", "cuda", 84_942_979_072, "NVIDIA H100 PCIe 80 GB"),
        Target("h200", "H200", "cuda", 151_397_597_184, "NVIDIA H200 141 GB"),
        Target("b200", "B200", "cuda", 191_514_411_008, "NVIDIA B200 192 GB"),
        Target("a100-80gb", "A100 80GB", "cuda", 85_100_068_864, "NVIDIA A100 SXM 80 GB"),
        Target("a100-40gb", "A100 40GB", "cuda", 42_331_013_120, "NVIDIA A100 SXM 40 GB"),
        # TPUs: the HBM libtpu's compiler lets one program use (it refuses a larger one).
        Target("v5e", "TPU v5e", "tpu", 16_911_433_728, "Google TPU v5e (v5 lite) 16 GB"),
        Target("v5p", "TPU v5p", "tpu", math.floor(95.74 * _GIB), "Google TPU v5p 95 GB"),
        Target("v6e", "TPU v6e", "tpu", 33_554_432_000, "Google TPU v6e (Trillium) 32 GB"),
    )
}

# NVIDIA: up to 8 devices on one host, else 8 per host.
_GPUS_PER_HOST: Final = 8
MAX_DEVICES: Final = 4096
# TPU: the standard topology of each chip count, as JAX writes it after the colon.
_TPU_2D: Final = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TPU_3D: Final = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
}
_TPU_LARGEST: Final = {"v5e": 256, "v6e": 256, "v5p": 4096}


def targets() -> dict[str, str]:
    """The accelerators `ts.cost`, `ts.largest_fit` and the command line compile for with
    `target=NAME`, on a machine that has none of them.

    NVIDIA targets compile with JAX's CUDA plugin (`pip install "treeshape[cuda]"`; no
    CUDA libraries or driver), TPUs with libtpu (`"treeshape[tpu]"`); JAX must start on
    the CPU alone (`JAX_PLATFORMS=cpu`). A TPU name may carry a topology: `"v5e:16x16"`.

    Returns:
        A dict from each name to a short description with the memory one program may use
        on one device (`Cost.device_bytes`).

    Examples:
        >>> import treeshape as ts
        >>> print(ts.targets()["h100"])
        NVIDIA H100 SXM 80 GB (XLA:GPU through JAX's CUDA plugin; 79.1 GiB per device)
        >>> sorted(ts.targets())[:3]
        ['a100-40gb', 'a100-80gb', 'b200']
    """
    compilers = {"cuda": "XLA:GPU through JAX's CUDA plugin", "tpu": "libtpu"}
    return {
        t.name: f"{t.description} ({compilers[t.platform]}; {t.device_bytes / _GIB:.1f} GiB per device)"
        for t in _TARGETS.values()
    }


def _listed() -> str:
    return ", ".join(f'"{name}"' for name in _TARGETS)


def resolve(name: Any, who: str) -> tuple[Target, str | None]:
    """The target a `target=` names (case-insensitive), and the TPU topology given after a
    colon (`"v5e:16x16"`); a `ValueError` listing `ts.targets()` for anything else."""
    if not isinstance(name, str):
        raise TypeError(f"treeshape.{who}: target must be a name from ts.targets() ({_listed()}), got {name!r}.")
    base, _, shape = name.strip().lower().partition(":")
    target = _TARGETS.get(base)
    if target is None:
        raise ValueError(f"treeshape.{who}: unknown target {name!r}; ts.targets() has {_listed()}.")
    if shape and (target.platform != "tpu" or not re.fullmatch(r"\d+(x\d+){1,2}", shape)):
        example = "v5e:16x16" if target.platform == "tpu" else target.name
        raise ValueError(
            f"treeshape.{who}: target {name!r}: a topology after the colon is a TPU's, as JAX writes it "
            f'(e.g. "{example}"); an NVIDIA target takes its device count from the inputs\' mesh.'
        )
    return target, shape or None


def check_installed(target: Target, who: str) -> None:
    """An `ImportError` naming the extra to install where the target's compiler is missing,
    a `JaxReleaseError` where this JAX release cannot compile for it without a device."""
    jaxlib = _version("jaxlib")
    if target.platform == "cuda":
        if not any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)):
            raise ImportError(
                f'treeshape.{who}: target="{target.name}" compiles with JAX\'s CUDA plugin, which is not installed. '
                f'pip install "treeshape[cuda]" (for jaxlib {jaxlib}: jax-cuda12-plugin=={jaxlib}; no CUDA '
                "libraries or driver needed)."
            )
        if _release() < (0, 10):
            raise _compat.JaxReleaseError("compiling for an NVIDIA GPU without one (target=)", "0.10.0")
    elif importlib.util.find_spec("libtpu") is None:
        raise ImportError(
            f'treeshape.{who}: target="{target.name}" compiles with libtpu, which is not installed. '
            f'pip install "treeshape[tpu]" (for jaxlib {jaxlib}: jax[tpu]=={jaxlib} picks its libtpu).'
        )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _release() -> tuple[int, int]:
    major, minor = (int(p) for p in jax.__version__.split(".")[:2])
    return major, minor


def topology(target: Target, shape: str | None, count: int, where: str, who: str) -> str:
    """The topology to compile `count` devices for: `1xHOSTSxPER_HOST` on NVIDIA, the
    given or standard `AxB[xC]` on TPU; a `ValueError` naming both where they disagree."""
    if target.platform == "cuda":
        if count > MAX_DEVICES:
            raise ValueError(
                f"treeshape.{who}: {where} is sharded over {count} devices; target {target.name!r} compiles for at "
                f"most {MAX_DEVICES}. Plan on a mesh of at most {MAX_DEVICES} devices."
            )
        if count <= _GPUS_PER_HOST:
            return f"1x1x{count}"
        if count % _GPUS_PER_HOST:
            raise ValueError(
                f"treeshape.{who}: {where} is sharded over {count} devices; target {target.name!r} has "
                f"{_GPUS_PER_HOST} GPUs per host, so a count above {_GPUS_PER_HOST} must be a multiple of it "
                f"(e.g. {count // _GPUS_PER_HOST * _GPUS_PER_HOST or _GPUS_PER_HOST} or "
                f"{(count // _GPUS_PER_HOST + 1) * _GPUS_PER_HOST})."
            )
        return f"1x{count // _GPUS_PER_HOST}x{_GPUS_PER_HOST}"
    largest = _TPU_LARGEST[target.name]
    if shape is not None:
        chips = math.prod(int(d) for d in shape.split("x"))
        if chips > largest:
            raise ValueError(
                f"treeshape.{who}: target '{target.name}:{shape}' has {chips} chips; a {target.name} slice has at "
                f"most {largest}."
            )
        if chips != count:
            raise ValueError(
                f"treeshape.{who}: target '{target.name}:{shape}' has {chips} chips, and {where} is sharded over "
                f"{count} devices. Give a topology of {count} chips, or a mesh of {chips} devices."
            )
        return shape
    standard = (_TPU_3D if target.name == "v5p" else _TPU_2D).get(count)
    if standard is None or count > largest:
        example = "v5p:2x2x4" if target.name == "v5p" else "v5e:4x8"
        raise ValueError(
            f"treeshape.{who}: {where} is sharded over {count} devices, which is no standard {target.name} topology "
            f"(at most {largest} chips: {', '.join(str(n) for n in (_TPU_3D if target.name == 'v5p' else _TPU_2D))}). "
            f'Name one: target="{target.name}:AxB" (e.g. "{example}").'
        )
    return standard


# Fields of the shipped specs that an older CUDA plugin does not know (jax 0.8.0's has no
# thread_dim_limit_*): left out where that plugin cannot parse the spec with them.
NEWER_FIELDS: Final = ["thread_dim_limit_x", "thread_dim_limit_y", "thread_dim_limit_z"]


@functools.cache
def _spec_text(name: str) -> str:
    return (Path(__file__).parent / "specs" / f"{name}.txtpb").read_text()


def _without_field(text: str, field: str) -> str:
    """The spec less every line that sets `field` (a scalar field: one line each)."""
    return "".join(line for line in text.splitlines(keepends=True) if not re.match(rf"\s*{field}\s*:", line))


@functools.cache
def devices(name: str, shape: str) -> tuple[Any, ...]:
    """The devices of a target's topology, as the installed compiler describes them.

    A field of the shipped spec that the installed plugin does not know (an older plugin
    than XLA's spec) is left out, and the spec read again."""
    from jax.experimental import topologies

    target = _TARGETS[name]
    try:
        if target.platform == "tpu":
            # Compiling needs no TPU: libtpu's lock on the TPU (one process at a time) would
            # only keep two processes (two commands, a test and its subprocess) from compiling.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            # libtpu takes a slice of one chip only as a host of one chip.
            extra = {"chips_per_host_bounds": (1, 1, 1)} if shape in ("1x1", "1x1x1") else {}
            topology = topologies.get_topology_desc(f"{name}:{shape}", "tpu", **extra)
            return tuple(topology.devices)
        text = _spec_text(name)
        try:
            topology = topologies.get_topology_desc(platform="cuda", target_config=text, topology=shape)
        except Exception as e:
            # The plugin logs which field it does not know, and raises only "Failed to parse".
            if "Failed to parse" not in str(e):
                raise
            for field in NEWER_FIELDS:
                text = _without_field(text, field)
            topology = topologies.get_topology_desc(platform="cuda", target_config=text, topology=shape)
        return tuple(topology.devices)
    except Exception as e:
        setting = "JAX_PLATFORMS=cpu" + (" and TPU_SKIP_MDS_QUERY=1" if target.platform == "tpu" else "")
        raise RuntimeError(
            f'treeshape: target="{name}": the {"CUDA plugin" if target.platform == "cuda" else "libtpu"} is '
            f"installed but did not start ({type(e).__name__}: {_first_line(e)}). Set {setting} in the "
            "environment before JAX first uses a device (before the Python process starts, or before "
            "`import jax`); no driver or accelerator is needed."
        ) from None


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else ""
