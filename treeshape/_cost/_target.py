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

from .. import _compat, _quiet
from ._chips import CHIPS, Chip


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # as `ts.targets()` lists it
    label: str  # as `Cost.backend` names it: "H100", "TPU v5e"
    chip: Chip  # its facts, and the compiler that compiles for it (libtpu, or XLA:GPU through JAX's CUDA plugin)
    device_bytes: int  # the memory one program may use on one device
    description: str


_GIB: Final = 2**30
_TARGETS: Final = {
    t.name: t
    for t in (
        Target("h100", "H100", CHIPS["h100"], 84_942_979_072, "NVIDIA H100 SXM 80 GB"),
        Target("h100-pcie", "H100 PCIe", CHIPS["h100-pcie"], 84_942_979_072, "NVIDIA H100 PCIe 80 GB"),
        Target("h200", "H200", CHIPS["h200"], 151_397_597_184, "NVIDIA H200 141 GB"),
        Target("b200", "B200", CHIPS["b200"], 191_514_411_008, "NVIDIA B200 192 GB"),
        Target("a100-80gb", "A100 80GB", CHIPS["a100-80gb"], 85_100_068_864, "NVIDIA A100 SXM 80 GB"),
        Target("a100-40gb", "A100 40GB", CHIPS["a100-40gb"], 42_331_013_120, "NVIDIA A100 SXM 40 GB"),
        # TPUs: the HBM libtpu's compiler lets one program use (it refuses a larger one).
        Target("v5e", "TPU v5e", CHIPS["v5e"], 16_911_433_728, "Google TPU v5e (v5 lite) 16 GB"),
        Target("v5p", "TPU v5p", CHIPS["v5p"], math.floor(95.74 * _GIB), "Google TPU v5p 95 GB"),
        Target("v6e", "TPU v6e", CHIPS["v6e"], 33_554_432_000, "Google TPU v6e (Trillium) 32 GB"),
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
    return {
        t.name: f"{t.description} ({t.chip.compiler.name}; {t.device_bytes / _GIB:.1f} GiB per device)"
        for t in _TARGETS.values()
    }


def _listed() -> str:
    return ", ".join(f'"{name}"' for name in _TARGETS)


def resolve(name: Any, who: str) -> tuple[Target, str | None]:
    """The target a `target=` names (case-insensitive), and the TPU topology given after a
    colon (`"v5e:16x16"`), as given; a `ValueError` listing `ts.targets()` for anything
    else. A topology libtpu cannot lay out is `topology`'s error, which knows the inputs'
    device count and names the topologies of it."""
    if not isinstance(name, str):
        raise TypeError(f"treeshape.{who}: target must be a name from ts.targets() ({_listed()}), got {name!r}.")
    base, colon, shape = name.strip().lower().partition(":")
    target = _TARGETS.get(base)
    if target is None:
        raise ValueError(f"treeshape.{who}: unknown target {name!r}; ts.targets() has {_listed()}.")
    if colon and not target.chip.compiler.named_topology:
        raise ValueError(
            f"treeshape.{who}: target {name!r}: a topology after the colon is a TPU's, as JAX writes it "
            f'(e.g. "v5e:16x16"); an NVIDIA target takes its device count from the inputs\' mesh.'
        )
    return target, shape if colon else None


class TopologyError(ValueError):
    """A TPU topology after the colon that is malformed or that libtpu cannot lay out
    (`topology`), named with the topologies of the inputs' device count."""


def _tpu_problem(target: Target, shape: str) -> tuple[str, int | None] | None:
    """Why `shape` is no topology libtpu lays out for `target`, and its chips where it
    counts them; None where it is one. libtpu places v5e and v6e chips in hosts of 2x2 (a
    slice is 1x1, or AxB with both sides even), v5p chips in hosts of 2x2x1 (AxBxC with A
    and B even)."""
    sides = 3 if target.name == "v5p" else 2
    form = "AxBxC" if sides == 3 else "AxB"
    if not shape:
        return f"gives no topology after the colon: a {target.name} topology is {form} as JAX writes it.", None
    parts = shape.split("x")
    if not all(re.fullmatch(r"[0-9]+", p) and int(p) >= 1 for p in parts):
        return (
            f"is no {target.name} topology: a topology is {form}, its sides whole numbers of at least 1, as JAX "
            "writes it.",
            None,
        )
    dims = [int(p) for p in parts]
    chips = math.prod(dims)
    if len(dims) != sides:
        return f"has {len(dims)} sides; a {target.name} topology has {sides} ({form}).", chips
    if chips > _TPU_LARGEST[target.name]:
        return f"has {chips} chips; a {target.name} slice has at most {_TPU_LARGEST[target.name]}.", None
    if not _laid_out(target, dims):
        rule = (
            "in hosts of 2x2x1 chips, so the first two sides of AxBxC are even"
            if sides == 3
            else "in hosts of 2x2 chips, so a slice is 1x1 or AxB with both sides even"
        )
        return f"is no topology libtpu can lay out: it places {target.name} chips {rule}.", chips
    return None


def _no_topology(target: Target, shape: str, count: int, where: str, who: str) -> TopologyError | None:
    """The error of a topology `_tpu_problem` refuses, naming the topologies of the inputs'
    `count` devices (and of the chips the topology counts, where those differ); else None."""
    found = _tpu_problem(target, shape)
    if found is None:
        return None
    problem, chips = found
    own = (
        f" {_choices(target, chips)}" if chips is not None and chips != count and _tpu_topologies(target, chips) else ""
    )
    devices = f"{count} device{'s' if count != 1 else ''}"
    listed = _tpu_topologies(target, count)
    standard = (_TPU_3D if target.name == "v5p" else _TPU_2D).get(count)
    if listed:
        shown = ", ".join(f'"{target.name}:{s}"' for s in listed[:6]) + (", ..." if len(listed) > 6 else "")
        alone = f' (or "{target.name}" alone, for the standard {standard})' if standard else ""
        fix = f"For {where}, on {devices}: {shown}{alone}."
    else:
        fix = f"No {target.name} topology has {count} chips, the devices of {where} ({_examples(target)})."
    return TopologyError(f"treeshape.{who}: target '{target.name}:{shape}' {problem}{own} {fix}")


def _tpu_topologies(target: Target, chips: int) -> list[str]:
    """`_topologies`, none for a count out of the target's range."""
    return _topologies(target, chips) if 1 <= chips <= _TPU_LARGEST[target.name] else []


def _laid_out(target: Target, dims: list[int]) -> bool:
    if target.name == "v5p":
        return dims[0] % 2 == 0 and dims[1] % 2 == 0
    return dims == [1, 1] or all(d % 2 == 0 for d in dims)


def _topologies(target: Target, chips: int) -> list[str]:
    """The topologies of `chips` chips libtpu lays out for `target`, the standard one first."""
    divisors = [d for d in range(1, chips + 1) if chips % d == 0]
    if target.name == "v5p":
        found = [f"{a}x{b}x{chips // (a * b)}" for a in divisors for b in divisors if chips % (a * b) == 0]
    else:
        found = [f"{a}x{chips // a}" for a in divisors]
    found = [s for s in found if _laid_out(target, [int(d) for d in s.split("x")])]
    standard = (_TPU_3D if target.name == "v5p" else _TPU_2D).get(chips)
    return sorted(found, key=lambda s: s != standard)


def _choices(target: Target, chips: int) -> str:
    """The topologies of `chips` chips, as a sentence: the first few, the standard one first."""
    found = _topologies(target, chips) if 1 <= chips <= _TPU_LARGEST[target.name] else []
    if not found:
        return f"No {target.name} topology has {chips} chips ({_examples(target)})."
    shown = ", ".join(f'"{target.name}:{s}"' for s in found[:6]) + (", ..." if len(found) > 6 else "")
    return f"The {target.name} topologies of {chips} chip{'s' if chips != 1 else ''}: {shown}."


def _examples(target: Target) -> str:
    standard = _TPU_3D if target.name == "v5p" else _TPU_2D
    shown = [(n, s) for n, s in standard.items() if n > 1][:2] + [max(standard.items())]
    return "e.g. " + ", ".join(f'"{target.name}:{s}" for {n} chips' for n, s in shown)


def check_installed(target: Target, who: str) -> None:
    """An `ImportError` naming the extra to install where the target's compiler is missing,
    a `JaxReleaseError` where this JAX release cannot compile for it without a device."""
    jaxlib, compiler = _version("jaxlib"), target.chip.compiler
    if not any(_found(module) for module in compiler.modules):
        installs = compiler.install.format(jaxlib=jaxlib)
        raise ImportError(
            f'treeshape.{who}: target="{target.name}" compiles with {compiler.called}, which is not installed. '
            f'pip install "treeshape[{compiler.extra}]" (for jaxlib {jaxlib}: {installs}).'
        )
    if compiler.deviceless_from is not None:  # (JAX's CUDA plugin: from 0.10.0, a GPU's backend starts without one)
        with _quiet.quiet():  # (a compile: XLA's log lines)
            compiles = _compat.cuda_starts_without_gpu() and _compat.compiles_without_device(
                devices(target.name, "1x1x1")[0]
            )
        if not compiles:
            raise _compat.JaxReleaseError("compiling for an NVIDIA GPU without one (target=)", compiler.deviceless_from)


def _found(module: str) -> bool:
    """Whether `module` can be imported; a package missing above it (no `jax_plugins` at
    all) is no error."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class CountError(ValueError):
    """A device count that a target cannot form (`topology`)."""


def topology(target: Target, shape: str | None, count: int, where: str, who: str) -> str:
    """The topology to compile `count` devices for: `1xHOSTSxPER_HOST` on NVIDIA, the
    given or standard `AxB[xC]` on TPU; a `CountError` naming both where they disagree, a
    `TopologyError` naming those of `count` for a TPU topology that is none."""
    if not target.chip.compiler.named_topology:
        if count > MAX_DEVICES:
            raise CountError(
                f"treeshape.{who}: {where} is sharded over {count} devices; target {target.name!r} compiles for at "
                f"most {MAX_DEVICES}. Plan on a mesh of at most {MAX_DEVICES} devices."
            )
        if count <= _GPUS_PER_HOST:
            return f"1x1x{count}"
        if count % _GPUS_PER_HOST:
            raise CountError(
                f"treeshape.{who}: {where} is sharded over {count} devices; target {target.name!r} has "
                f"{_GPUS_PER_HOST} GPUs per host, so a count above {_GPUS_PER_HOST} must be a multiple of it "
                f"(e.g. {count // _GPUS_PER_HOST * _GPUS_PER_HOST or _GPUS_PER_HOST} or "
                f"{(count // _GPUS_PER_HOST + 1) * _GPUS_PER_HOST})."
            )
        return f"1x{count // _GPUS_PER_HOST}x{_GPUS_PER_HOST}"
    largest = _TPU_LARGEST[target.name]
    if shape is not None and (error := _no_topology(target, shape, count, where, who)) is not None:
        raise error
    if shape is not None:  # well formed and laid out
        chips = math.prod(int(d) for d in shape.split("x"))
        if chips != count:
            fix = (
                f"Give a topology of {count} chips, or a mesh of {chips} devices. {_choices(target, count)}"
                if count <= _TPU_LARGEST[target.name] and _topologies(target, count)
                else f"No {target.name} topology has {count} chips: plan on a mesh of {chips} devices."
            )
            raise CountError(
                f"treeshape.{who}: target '{target.name}:{shape}' has {chips} chips, and {where} is sharded over "
                f"{count} devices. {fix}"
            )
        return shape
    standards = _TPU_3D if target.name == "v5p" else _TPU_2D
    standard = standards.get(count)
    if standard is None or count > largest:
        counts = ", ".join(str(n) for n in standards)
        if 1 <= count <= largest and _topologies(target, count):
            raise CountError(
                f"treeshape.{who}: {where} is sharded over {count} devices, which is no standard {target.name} "
                f"topology (those have {counts} chips). Name one: {_choices(target, count)}"
            )
        raise CountError(
            f"treeshape.{who}: {where} is sharded over {count} devices, and no {target.name} topology has {count} "
            f"chips (the standard ones have {counts}; at most {largest}). Plan on a mesh of one of those counts."
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
    """The devices of a target's topology, as the installed compiler describes them, with
    what the compiler (libtpu at its start) and JAX's backends, where they start here, log
    on standard error left out (`_quiet`).

    A field of the shipped spec that the installed plugin does not know (an older plugin
    than XLA's spec) is left out, and the spec read again."""
    import jax

    with _quiet.quiet():
        try:
            jax.devices()  # JAX's backends, started here rather than in the user's trace
        except Exception:  # raised again, with its message, where the program uses them
            pass
        return _devices(name, shape)


def _devices(name: str, shape: str) -> tuple[Any, ...]:
    from jax.experimental import topologies

    target = _TARGETS[name]
    compiler = target.chip.compiler
    try:
        if compiler.named_topology:
            # Compiling needs no TPU: libtpu's lock on the TPU (one process at a time) would
            # only keep two processes (two commands, a test and its subprocess) from compiling.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
            # libtpu takes a slice of one chip only as a host of one chip.
            extra = {"chips_per_host_bounds": (1, 1, 1)} if shape == "1x1" else {}
            topology = topologies.get_topology_desc(f"{name}:{shape}", compiler.platform, **extra)
            return tuple(topology.devices)
        text = _spec_text(name)
        try:
            topology = topologies.get_topology_desc(platform=compiler.platform, target_config=text, topology=shape)
        except Exception as e:
            # The plugin logs which field it does not know, and raises only "Failed to parse".
            if "Failed to parse" not in str(e):
                raise
            for field in NEWER_FIELDS:
                text = _without_field(text, field)
            topology = topologies.get_topology_desc(platform=compiler.platform, target_config=text, topology=shape)
        return tuple(topology.devices)
    except Exception as e:
        if compiler.named_topology and "INVALID_ARGUMENT" in str(e):  # it started, and refused this layout
            chips = math.prod(int(d) for d in shape.split("x"))
            raise ValueError(
                f'treeshape: target="{name}:{shape}": libtpu cannot lay out this topology ({_first_line(e)}). '
                f"{_choices(target, chips)}"
            ) from None
        raise RuntimeError(
            f'treeshape: target="{name}": the {compiler.plugin} is '
            f"installed but did not start ({type(e).__name__}: {_first_line(e)}). Set {compiler.settings} in the "
            "environment before JAX first uses a device (before the Python process starts, or before "
            "`import jax`); no driver or accelerator is needed."
        ) from None


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else ""
