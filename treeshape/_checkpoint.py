"""Reading an orbax checkpoint, for `restore_plan`: the item directory a path names, its
metadata tree (or one passed in), and the leaves a restore takes, read in one orbax call,
each onto its sharding. orbax is imported only here, and only when a checkpoint is read."""

import os
import pathlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np

from ._nodes import key_name
from ._tree import clip, keyed_children


def keystr(keys: Sequence[Any]) -> str:
    """A path as `jax.tree_util.keystr` writes it, `(root)` for the root."""
    return jtu.keystr(tuple(keys)) if keys else "(root)"


def described(x: Any) -> str:
    """A value the user passed, in a message: its repr, cut, and its type."""
    return f"{clip(repr(x), 60)} (of type {type(x).__name__})"


def orbax(who: str) -> Any:
    """`orbax.checkpoint`, or the ImportError that names the package to install."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:
        raise ImportError(
            f"{who} reads orbax checkpoints with orbax-checkpoint, which cannot be imported ({err}): "
            "pip install orbax-checkpoint"
        ) from err
    return ocp


# -- what a checkpoint is -----------------------------------------------------------------
def item_directory(path: pathlib.Path, who: str) -> pathlib.Path:
    """The item directory of an orbax checkpoint at `path` (a step directory holding one
    item is read as that item; a manager's root directory is refused, naming its latest
    step's item)."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ValueError(f"{who}: {str(path)!r} {what}: pass the directory of an orbax checkpoint")
    if (path / "_METADATA").is_file():
        return path
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    items = [p for p in subdirs if (p / "_METADATA").is_file()]
    if len(items) == 1:
        return items[0]
    steps = sorted((p for p in subdirs if p.name.isascii() and p.name.isdigit()), key=lambda p: int(p.name))
    if steps:
        shown = ("..., " if len(steps) > 5 else "") + ", ".join(p.name for p in steps[-5:])
        inside = [p for p in sorted(steps[-1].iterdir()) if p.is_dir() and (p / "_METADATA").is_file()]
        example = next((p for p in inside if p.name == "default"), inside[0] if inside else steps[-1])
        raise ValueError(
            f"{who}: {str(path)!r} is a CheckpointManager's directory of steps ({shown}), not one checkpoint: "
            f"pass a step's item directory, e.g. the latest step's {str(example)!r}"
        )
    if items:
        names = ", ".join(p.name for p in items)
        raise ValueError(f"{who}: {str(path)!r} holds several items ({names}): pass one item's directory")
    raise ValueError(f"{who}: {str(path)!r} is not an orbax checkpoint: it has no _METADATA file")


def read_metadata(path: pathlib.Path, who: str) -> Any:
    ocp = orbax(who)
    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            item = checkpointer.metadata(path).item_metadata
    except Exception as err:
        raise ValueError(f"{who}: the metadata of the checkpoint {str(path)!r} cannot be read: {err}") from err
    if item is None or getattr(item, "tree", None) is None:
        raise ValueError(
            f"{who}: the metadata of the checkpoint {str(path)!r} cannot be read: orbax finds no pytree metadata "
            "there (its _METADATA file or an array's header is missing or damaged)"
        )
    return item.tree


def is_metadata(x: Any) -> bool:
    """An array's metadata (orbax's `ArrayMetadata`, a `ShapeDtypeStruct`), never an array."""
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (jax.Array, np.ndarray, np.generic))


def _is_orbax(x: Any) -> bool:
    """One of orbax's metadata values (its `StringMetadata` of a saved string has no shape)."""
    return type(x).__module__.startswith("orbax.")


def checkpoint_tree(checkpoint: Any, who: str) -> tuple[Any, pathlib.Path | None]:
    """The metadata tree of `checkpoint` (a directory, or a metadata tree), and its directory
    (None where a metadata tree does not say it).

    Raises:
        TypeError: `checkpoint` is neither.
        ValueError: the directory is not an orbax checkpoint, or its metadata cannot be read.
    """
    if isinstance(checkpoint, (str, bytes, os.PathLike)):
        directory = item_directory(pathlib.Path(os.fsdecode(checkpoint)), who)
        return read_metadata(directory, who), directory
    tree = getattr(checkpoint, "tree", checkpoint)  # a TreeMetadata or a Structure, or the tree itself
    flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=is_metadata)
    bad = next(((k, x) for k, x in flat if not (is_metadata(x) or _is_orbax(x))), None)
    if bad is not None or not flat:
        held = "" if bad is None or not bad[0] else f", holding {described(bad[1])} at {keystr(bad[0])}"
        raise TypeError(
            f"{who}: checkpoint is {described(checkpoint)}{held}, neither a checkpoint's directory nor its "
            "metadata tree: pass the directory (a str or pathlib.Path), or the metadata orbax reads "
            "(checkpointer.metadata(path).item_metadata)"
        )
    found = {str(getattr(m, "directory", "") or "") for _, m in flat} - {""}
    return tree, pathlib.Path(found.pop()) if len(found) == 1 else None


# -- reading leaves ---------------------------------------------------------------------
class Read(NamedTuple):
    """A checkpoint leaf to read: its saved shape, and where it goes (a sharding, None for the
    default device; `number`: as a NumPy scalar, for a Python number)."""

    shape: tuple[int, ...]
    sharding: Any
    number: bool


class Unreadable(Exception):
    """A read that orbax failed: `source` is the first leaf that cannot be read alone (None if
    each reads alone), `error` orbax's own."""

    def __init__(self, source: str | None, error: Exception) -> None:
        super().__init__(source, error)
        self.source, self.error = source, error


def read(directory: pathlib.Path, metadata: Any, reads: dict[str, Read], who: str) -> dict[str, Any]:
    """The leaves `reads` names (by their keystr path in `metadata`), each read once, in one
    orbax restore.

    Raises:
        Unreadable: orbax cannot read them (a leaf's array data is missing or damaged).
    """
    if not reads:
        return {}
    ocp = orbax(who)
    try:
        return _read_some(ocp, directory, metadata, reads)
    except Exception as err:
        raise Unreadable(_first_unreadable(ocp, directory, metadata, reads), err) from err


def _first_unreadable(ocp: Any, directory: pathlib.Path, metadata: Any, reads: dict[str, Read]) -> str | None:
    """The first leaf of `reads` that cannot be read alone, found by halving."""
    sources = list(reads)
    while sources:
        half = sources[: max(1, len(sources) // 2)]
        try:
            _read_some(ocp, directory, metadata, {s: reads[s] for s in half})
        except Exception:
            if len(half) == 1:
                return half[0]
            sources = half
            continue
        sources = sources[len(half) :]
    return None


def _read_some(ocp: Any, directory: pathlib.Path, metadata: Any, reads: dict[str, Read]) -> dict[str, Any]:
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

    def build(keys: tuple[Any, ...], node: Any) -> tuple[Any, Any] | None:
        if isinstance(node, (dict, list, tuple)):
            kids = [(key, build((*keys, key), v)) for key, v in keyed_children(node)[0]]
            if all(v is None for _, v in kids):
                return None
            if isinstance(node, dict):
                kept = {key_name(key): v for key, v in kids if v is not None}
                return {k: v[0] for k, v in kept.items()}, {k: v[1] for k, v in kept.items()}
            return [None if v is None else v[0] for _, v in kids], [None if v is None else v[1] for _, v in kids]
        wanted = reads.get(keystr(keys)) if node is not None else None
        if wanted is None:
            return None
        if wanted.number:
            return 0, ocp.RestoreArgs(restore_type=np.ndarray)
        sharding = wanted.sharding if wanted.sharding is not None else default
        return 0, ocp.ArrayRestoreArgs(sharding=sharding, global_shape=wanted.shape)

    built = build((), metadata)
    assert built is not None
    item, restore_args = built
    with ocp.PyTreeCheckpointer() as checkpointer:
        restored = checkpointer.restore(
            directory, args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True)
        )
    flat, _ = jtu.tree_flatten_with_path(restored)
    return {keystr(k): v for k, v in flat if keystr(k) in reads}
