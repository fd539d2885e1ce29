"""What a Pallas kernel does, read from the program's jaxpr: its grid, the FLOPs of its body's
matrix products over the grid, and the bytes its pipeline copies in and out, a block each
time the block's index changes. `_time` costs a Pallas kernel's custom call by these (a
grid step's cost besides, as the chip measured) where the compiled module alone says only
its operands' bytes, or a `cost_estimate` that knows nothing of its grid.

A kernel is found in the module by its operands' and results' types
(`signature`), as the optimized module writes them (`bf16[512,512]`).
"""

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, Final

import jax
import numpy as np


# The custom call a Pallas TPU kernel compiles to (Mosaic's), as the optimized module names it.
CUSTOM_CALL: Final = '"tpu_custom_call"'


@dataclasses.dataclass(frozen=True)
class Work:
    """One run of a Pallas kernel: its grid's steps, its body's matrix-product FLOPs over
    them, and the bytes its pipeline copies between HBM and VMEM."""

    steps: int
    flops: float
    bytes_copied: float


_XLA_TYPES: Final = {
    "bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "int8": "s8", "int16": "s16",
    "int32": "s32", "int64": "s64", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "pred",
}  # fmt: skip


def _typed(aval: Any) -> str:
    name = np.dtype(aval.dtype).name
    return f"{_XLA_TYPES.get(name, name)}[{','.join(str(d) for d in aval.shape)}]"


def signature(operands: list[str], results: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A kernel's key: its operands' and results' types (`bf16[512,512]`), in order."""
    return tuple(operands), tuple(results)


def _jaxprs(value: Any) -> Iterator[Any]:
    """The jaxprs a parameter holds (a closed one's inner jaxpr)."""
    items = value if isinstance(value, (tuple, list)) else (value,)
    for item in items:
        inner = getattr(item, "jaxpr", item)
        if hasattr(inner, "eqns"):
            yield inner


def _body_flops(jaxpr: Any) -> float:
    """The matrix-product FLOPs of one run of a kernel's body (a loop inside it by its trip
    count, each branch of a conditional counted)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
            continue
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for name, value in eqn.params.items():
            if name in ("jaxpr", "branches", "body_jaxpr", "cond_jaxpr"):
                total += times * sum(_body_flops(inner) for inner in _jaxprs(value))
    return total


def _depends_on(index_map: Any) -> set[int]:
    """The grid axes (positions of the index map's inputs) its block index depends on."""
    jaxpr = getattr(index_map, "jaxpr", index_map)
    needed = {id(v) for v in jaxpr.outvars if hasattr(v, "aval") and not hasattr(v, "val")}
    for eqn in reversed(jaxpr.eqns):
        if any(id(v) in needed for v in eqn.outvars):
            needed |= {id(v) for v in eqn.invars if not hasattr(v, "val")}
    return {i for i, v in enumerate(jaxpr.invars) if id(v) in needed}


# The most grid steps whose blocks' indices are evaluated (`_changes`); over it, a block is
# counted as copied whenever an axis its index depends on moves.
_EVALUATED_STEPS: Final = 1 << 20


def _changes(index_map: Any, grid: tuple[int, ...]) -> int | None:
    """How often a block's index changes as the grid runs in order (its first step counted),
    from its index map evaluated at every step; None where it takes more than the grid's
    indices (scalars prefetched, unknown here) or the grid is too large."""
    jaxpr = getattr(index_map, "jaxpr", index_map)
    steps = math.prod(grid)
    if len(jaxpr.invars) != len(grid) or steps > _EVALUATED_STEPS or not grid:
        return None
    indices = [a.reshape(-1).astype(np.int32) for a in np.indices(grid)]
    consts = list(getattr(index_map, "consts", ()))
    with jax.ensure_compile_time_eval():
        outs = jax.vmap(lambda *i: jax.core.eval_jaxpr(jaxpr, consts, *i))(*indices)
    blocks = np.stack([np.broadcast_to(np.asarray(o), (steps,)) for o in outs], axis=1)
    return 1 + int(np.count_nonzero(np.any(blocks[1:] != blocks[:-1], axis=1)))


def _pipelined(block_aval: Any) -> bool:
    """Whether the pipeline copies the block into VMEM (not a ref left in HBM: `pl.ANY`)."""
    space = str(getattr(block_aval, "memory_space", "") or "").lower()
    return not any(word in space for word in ("any", "hbm", "semaphore", "smem"))


def _work(eqn: Any) -> Work | None:
    grid_mapping = eqn.params.get("grid_mapping")
    body = eqn.params.get("jaxpr")
    if grid_mapping is None or body is None:
        return None
    grid = tuple(d if isinstance(d, int) else 1 for d in getattr(grid_mapping, "grid", ()))
    steps = math.prod(grid)
    copied = 0.0
    for mapping in getattr(grid_mapping, "block_mappings", ()):
        aval = getattr(mapping, "block_aval", None) or getattr(mapping, "transformed_block_aval", None)
        shape = getattr(aval, "shape", None)
        if aval is None or shape is None:
            continue
        if not _pipelined(aval):
            array = getattr(mapping, "array_aval", None)
            copied += math.prod(array.shape) * np.dtype(array.dtype).itemsize if array is not None else 0
            continue
        changes = _changes(mapping.index_map_jaxpr, grid)
        if changes is None:  # (its inputs: the grid's indices, then any scalars prefetched)
            axes = {a for a in _depends_on(mapping.index_map_jaxpr) if a < len(grid)}
            changes = math.prod(grid[: max(axes) + 1]) if axes else 1
        copied += changes * math.prod(shape) * np.dtype(aval.dtype).itemsize
    inner = getattr(body, "jaxpr", body)
    return Work(steps=steps, flops=steps * _body_flops(inner), bytes_copied=copied)


def kernels(jaxpr: Any) -> dict[tuple[tuple[str, ...], tuple[str, ...]], Work]:
    """Every Pallas kernel of `jaxpr` (and of the jaxprs in its equations' parameters: a
    kernel under `jit`, `custom_vjp`, a loop), by its `signature`; None where JAX's
    `pallas_call` holds its grid otherwise than as read here."""
    found: dict[tuple[tuple[str, ...], tuple[str, ...]], Work] = {}
    seen: set[int] = set()
    stack = [jaxpr]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for eqn in current.eqns:
            if eqn.primitive.name == "pallas_call":
                try:
                    work = _work(eqn)
                except (AttributeError, TypeError, ValueError):
                    work = None
                if work is not None:
                    key = signature([_typed(v.aval) for v in eqn.invars], [_typed(v.aval) for v in eqn.outvars])
                    found.setdefault(key, work)
                continue
            for value in eqn.params.values():
                stack.extend(_jaxprs(value))
    return found
