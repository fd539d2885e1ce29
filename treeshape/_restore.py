"""Restoring an orbax checkpoint into the model you have: `restore_plan` reads the
checkpoint's metadata alone and says the fate of every leaf; `RestorePlan.restore`
then does exactly that through orbax, and nothing else.

Paths are matched as orbax writes them: each key of a path is read as a name or an
index (`['0']` is `[0]`, `['value']` is an nnx Variable's `.value`, a dict of field
names is the dataclass, namedtuple or module it was written from), so the plan of a
checkpoint of the same model is all "same".
"""

import dataclasses
import html
import os
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._leaf import leaf_str
from ._nodes import key_name
from ._shapes import human_bytes, leaf_nbytes
from ._sharding import per_device_nbytes, spec_str, split_problem
from ._structure import Structure
from ._table import grid, html_grid
from ._tree import keyed_children


PyTree = Any
Fate = Literal["same", "renamed", "cast", "kept", "missing", "reshaped", "uncast", "indivisible", "extra"]
Rename = dict[str, str] | Callable[[str], str | None] | Sequence[tuple[str, str]] | None
_REFUSED: Final = frozenset({"missing", "reshaped", "uncast", "indivisible"})
_FATES: Final = ("same", "renamed", "cast", "kept", "missing", "reshaped", "uncast", "indivisible", "extra")
_WHO: Final = "treeshape.restore_plan"


class RestoreError(ValueError):
    """`RestorePlan.restore()` of a plan that refuses some leaves: nothing was read.

    The message lists the refused entries, each with its reason and what would
    allow it; `entries` holds them as [treeshape.Restore][] values.

    Examples:
        >>> import jax.numpy as jnp, orbax.checkpoint as ocp, tempfile
        >>> import treeshape as ts
        >>> path = tempfile.mkdtemp() + "/ckpt"
        >>> with ocp.StandardCheckpointer() as c:
        ...     c.save(path, {"w": jnp.ones(3)})
        >>> try:
        ...     ts.restore_plan(path, {"w": jnp.zeros(4)}).restore()
        ... except ts.RestoreError as err:
        ...     print(err.entries[0].fate, isinstance(err, ValueError))
        reshaped True
    """

    __module__ = "treeshape"  # as users import it

    def __init__(self, message: str, entries: Sequence["Restore"]) -> None:
        super().__init__(message)
        self.entries = tuple(entries)


@dataclasses.dataclass(frozen=True)
class Restore:
    """The fate of one leaf when a checkpoint is restored into a target.

    Attributes:
        path: The target's keystr path (for an "extra" entry, the checkpoint's).
        fate: "same", "renamed", "cast", "kept", or refused: "missing",
            "reshaped", "uncast", "indivisible"; "extra" for a checkpoint leaf
            no target leaf takes (refused only with `extra="error"`).
        source: The keystr path of the leaf in the checkpoint's metadata tree,
            as orbax writes it (`['layers']['0']['kernel']['value']`), or None.
        saved: The checkpoint's leaf as a `jax.ShapeDtypeStruct`, or None.
        wanted: The target's leaf (with its sharding), or None.
        reason: What is done, or why it is refused and what would allow it.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> entry = ts.Restore("['w']", "cast", "['w']", jax.ShapeDtypeStruct((3,), jnp.bfloat16),
        ...                    jax.ShapeDtypeStruct((3,), jnp.float32), "cast from bfloat16 to float32")
        >>> entry.fate, entry.saved.dtype
        ('cast', dtype(bfloat16))
    """

    __module__ = "treeshape"  # as users import it

    path: str
    fate: Fate
    source: str | None
    saved: jax.ShapeDtypeStruct | None
    wanted: jax.ShapeDtypeStruct | None
    reason: str = ""


# -- reading a checkpoint --------------------------------------------------------------
def _item_directory(path: pathlib.Path) -> pathlib.Path:
    """The item directory of an orbax checkpoint at `path` (a step directory holding one
    item is read as that item; a manager's root directory is refused, naming its steps)."""
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise ValueError(f"{_WHO}: {str(path)!r} {what}: pass the directory of an orbax checkpoint")
    if (path / "_METADATA").is_file():
        return path
    subdirs = sorted(p for p in path.iterdir() if p.is_dir())
    items = [p for p in subdirs if (p / "_METADATA").is_file()]
    if len(items) == 1:
        return items[0]
    steps = [p.name for p in subdirs if p.name.isdigit()]
    if steps:
        shown = ", ".join(sorted(steps, key=int)[-5:])
        raise ValueError(
            f"{_WHO}: {str(path)!r} is a CheckpointManager's directory of steps ({shown}), not one checkpoint: "
            f"pass a step's item directory, e.g. {str(path / steps[-1] / 'default')!r}"
        )
    if items:
        names = ", ".join(p.name for p in items)
        raise ValueError(f"{_WHO}: {str(path)!r} holds several items ({names}): pass one item's directory")
    raise ValueError(f"{_WHO}: {str(path)!r} is not an orbax checkpoint: it has no _METADATA file")


def _read_metadata(path: pathlib.Path) -> Any:
    import orbax.checkpoint as ocp

    try:
        with ocp.PyTreeCheckpointer() as checkpointer:
            item = checkpointer.metadata(path).item_metadata
    except Exception as err:
        raise ValueError(f"{_WHO}: the metadata of the checkpoint {str(path)!r} cannot be read: {err}") from err
    if item is None or getattr(item, "tree", None) is None:
        raise ValueError(
            f"{_WHO}: the metadata of the checkpoint {str(path)!r} cannot be read: orbax finds no pytree metadata "
            "there (its _METADATA file or an array's header is missing or damaged)"
        )
    return item.tree


def _is_metadata(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (jax.Array, np.ndarray))


def _saved_leaf(m: Any) -> jax.ShapeDtypeStruct:
    # Read as JAX will hold it: a Python int saved as int64 is JAX's int without x64.
    return jax.ShapeDtypeStruct(tuple(m.shape), jax.dtypes.canonicalize_dtype(m.dtype))


# -- paths ----------------------------------------------------------------------------
Part = str | int
_TOKEN: Final = re.compile(
    r"\[(?P<q>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]|\[(?P<i>-?\d+)\]|\.(?P<a>[A-Za-z_][A-Za-z_0-9]*)"
)


def _part(key: Any) -> Part:
    """One key as orbax and the target agree on it: a name, or an index (`'3'` is `3`)."""
    key = key_name(key)
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return key if isinstance(key, (int, str)) else str(key)


def _parse(text: str, what: str) -> tuple[Part, ...]:
    """A keystr path (`['a'][0].b`) as its parts."""
    parts: list[Part] = []
    at = 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise ValueError(
                f"{_WHO}: {what} {text!r} is not a keystr path (from {text[at:]!r}): write keys as ['name'], [0] or "
                ".name, e.g. \"['layers'][0]['kernel']\""
            )
        if m.group("q") is not None:
            quote = m.group("q")
            parts.append(_part(re.sub(r"\\(.)", r"\1", quote[1:-1])))
        elif m.group("i") is not None:
            parts.append(int(m.group("i")))
        else:
            parts.append(_part(m.group("a")))
        at = m.end()
    return tuple(parts)


def _tokens(parts: tuple[Part, ...]) -> list[str]:
    """A path's letters and numbers, without case or separators (`Dense_0` and `dense[0]`,
    `EncoderBlock` and `encoder_block` alike; `layers_1_2` and `layers_12` not)."""
    tokens: list[str] = []
    for t in re.findall(r"[a-z]+|\d+", "/".join(str(p).lower() for p in parts)):
        if tokens and t.isalpha() and tokens[-1].isalpha():
            tokens[-1] += t
        else:
            tokens.append(t)
    return tokens


@dataclasses.dataclass
class _Saved:
    source: str
    keys: tuple[Any, ...]
    parts: tuple[Part, ...]
    leaf: jax.ShapeDtypeStruct
    to: tuple[Part, ...]  # the target path it goes to (its own, or where `rename` maps it)
    renamed: bool = False


@dataclasses.dataclass
class _Wanted:
    path: str
    keys: tuple[Any, ...]
    parts: tuple[Part, ...]
    leaf: jax.ShapeDtypeStruct
    value: Any  # the target's own leaf
    concrete: bool
    number: bool  # a Python number: an entry only where the checkpoint holds it


def _renamer(rename: Rename) -> Callable[[_Saved], tuple[Part, ...] | None]:
    if rename is None:
        return lambda s: None
    if isinstance(rename, dict):
        table = [(_parse(k, "rename key"), _parse(v, "rename value"), k) for k, v in rename.items()]
        table.sort(key=lambda row: -len(row[0]))

        def by_prefix(s: _Saved) -> tuple[Part, ...] | None:
            for prefix, to, _ in table:
                if s.parts[: len(prefix)] == prefix:
                    return to + s.parts[len(prefix) :]
            return None

        return by_prefix
    if callable(rename):
        fn = rename

        def by_call(s: _Saved) -> tuple[Part, ...] | None:
            out = fn(s.source)
            return None if out is None or out == s.source else _parse(out, f"rename({s.source!r})")

        return by_call
    pairs = [(re.compile(p), r) for p, r in rename]

    def by_regex(s: _Saved) -> tuple[Part, ...] | None:
        text = s.source
        for pattern, replacement in pairs:
            text = pattern.sub(replacement, text)
        return None if text == s.source else _parse(text, f"rename of {s.source!r}")

    return by_regex


def _cast_rule(cast: Any) -> Callable[[Any, Any], bool]:
    if cast == "error":
        return lambda saved, wanted: False
    if cast == "allow":

        def same_kind(saved: Any, wanted: Any) -> bool:
            return any(
                jnp.issubdtype(saved, kind) and jnp.issubdtype(wanted, kind)
                for kind in (jnp.floating, jnp.integer, jnp.complexfloating)
            )

        return same_kind
    if isinstance(cast, (set, frozenset, list, tuple)):
        pairs = {(jnp.dtype(a), jnp.dtype(b)) for a, b in cast}
        return lambda saved, wanted: (jnp.dtype(saved), jnp.dtype(wanted)) in pairs
    raise ValueError(f"{_WHO}: cast={cast!r} is not one of 'error', 'allow' or a set of (saved, wanted) dtype pairs")


def _keystr(keys: Sequence[Any]) -> str:
    return jtu.keystr(tuple(keys)) if keys else "(root)"


def _target_leaves(target: Any) -> tuple[list[tuple[tuple[Any, ...], Any]], Any]:
    tree = target.tree if isinstance(target, Structure) else target
    return jtu.tree_flatten_with_path(tree)


def _wanted(keys: tuple[Any, ...], x: Any) -> _Wanted | None:
    """A target leaf to restore, or None for a static one (a string, a function, a flag)."""
    path = _keystr(keys)
    if isinstance(x, jax.ShapeDtypeStruct):
        leaf = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return _Wanted(path, keys, tuple(map(_part, keys)), leaf, x, False, False)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        sharding = x.sharding if isinstance(x, jax.Array) else None
        leaf = jax.ShapeDtypeStruct(np.shape(x), jax.dtypes.canonicalize_dtype(x.dtype), sharding=sharding)
        return _Wanted(path, keys, tuple(map(_part, keys)), leaf, x, True, False)
    if type(x) in (int, float, complex):
        leaf = jax.ShapeDtypeStruct((), jnp.asarray(x).dtype)
        return _Wanted(path, keys, tuple(map(_part, keys)), leaf, x, True, True)
    return None


# -- the plan -------------------------------------------------------------------------
def restore_plan(
    checkpoint: Any,
    target: PyTree,
    /,
    *,
    rename: Rename = None,
    missing: Literal["error", "keep"] = "error",
    extra: Literal["ignore", "error"] = "ignore",
    cast: Literal["error", "allow"] | set[tuple[Any, Any]] = "error",
) -> "RestorePlan":
    """Say what restoring an orbax checkpoint into `target` would do, every leaf at once.

    Only the checkpoint's metadata is read (never an array chunk). Paths match as
    orbax writes them (`['0']` is `[0]`, `['value']` an nnx Variable's value).

    Args:
        checkpoint: An orbax checkpoint's item directory (a step directory of one
            item is read as that item), or its metadata tree.
        target: What the state should become: arrays or abstract leaves (an
            `nnx.State`, an nnx or equinox module, linen parameters, an optax
            state, a dict of those) or a [treeshape.Structure][]. Its shardings
            say where each leaf goes.
        rename: Checkpoint path (or path prefix) to target path, as a dict; a
            callable from a checkpoint path to a target path or None; or a list
            of `(regex, replacement)` pairs applied in order.
        missing: "error", or "keep" the target's own array where the
            checkpoint has no leaf.
        extra: "ignore" or refuse ("error") checkpoint leaves no target leaf takes.
        cast: "error", "allow" (floating to floating, integer to integer), or a
            set of `(saved, wanted)` dtype pairs.

    Returns:
        A [treeshape.RestorePlan][]: one [treeshape.Restore][] per target leaf,
        then the checkpoint's unused leaves.

    Raises:
        ValueError: `checkpoint` is not an orbax checkpoint, or its metadata
            cannot be read; `rename` maps two checkpoint leaves to one target
            path, or to a path the target lacks.

    Examples:
        >>> import jax, jax.numpy as jnp, orbax.checkpoint as ocp, tempfile
        >>> import treeshape as ts
        >>> path = tempfile.mkdtemp() + "/ckpt"
        >>> with ocp.StandardCheckpointer() as c:
        ...     c.save(path, {"Dense_0": {"kernel": jnp.ones((2, 3))}})
        >>> model = {"dense_0": {"kernel": jnp.zeros((2, 3))}, "bias": jnp.zeros(3)}
        >>> plan = ts.restore_plan(path, model)
        >>> plan.ok
        False
        >>> print(plan.problems[1].reason)
        the checkpoint has no leaf here; rename={"['Dense_0']": "['dense_0']"} would take
        the checkpoint's ['Dense_0']['kernel']
        >>> plan = ts.restore_plan(path, model, rename={"['Dense_0']": "['dense_0']"}, missing="keep")
        >>> [(e.path, e.fate) for e in plan.entries]
        [("['bias']", 'kept'), ("['dense_0']['kernel']", 'renamed')]
        >>> plan.restore()["dense_0"]["kernel"].sum()
        Array(6., dtype=float32)
    """
    if missing not in ("error", "keep"):
        raise ValueError(f"{_WHO}: missing={missing!r} is not one of 'error', 'keep'")
    if extra not in ("error", "ignore"):
        raise ValueError(f"{_WHO}: extra={extra!r} is not one of 'error', 'ignore'")
    allowed = _cast_rule(cast)
    directory: pathlib.Path | None = None
    if isinstance(checkpoint, (str, os.PathLike)):
        directory = _item_directory(pathlib.Path(os.fspath(checkpoint)))
        tree = _read_metadata(directory)
    else:
        tree = getattr(checkpoint, "tree", checkpoint)  # a TreeMetadata, or the tree it wraps
    flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=_is_metadata)
    saved = [_Saved(_keystr(k), k, tuple(map(_part, k)), _saved_leaf(m), tuple(map(_part, k))) for k, m in flat]
    if directory is None:
        found = {str(getattr(m, "directory", "") or "") for _, m in flat} - {""}
        directory = pathlib.Path(found.pop()) if len(found) == 1 else None
    target_flat, treedef = _target_leaves(target)
    wanted_all = [_wanted(tuple(k), x) for k, x in target_flat]
    wanted = [w for w in wanted_all if w is not None]
    by_parts = {w.parts: w for w in wanted}

    renamer = _renamer(rename)
    for s in saved:
        to = renamer(s)
        if to is not None:
            if to not in by_parts:
                raise ValueError(
                    f"{_WHO}: rename maps the checkpoint's {s.source} to {_text(to)}, which the target lacks"
                )
            s.to, s.renamed = to, True
    taken: dict[tuple[Part, ...], _Saved] = {}
    for s in saved:
        other = taken.get(s.to)
        if other is not None and (s.renamed or other.renamed):
            raise ValueError(
                f"{_WHO}: rename maps two checkpoint leaves to the target's {_text(s.to)}: {other.source} and "
                f"{s.source}"
            )
        taken.setdefault(s.to, s)

    entries: list[Restore] = []
    sources: dict[str, str] = {}  # target path -> checkpoint source, for restore()
    used: set[str] = set()
    for w in wanted:
        hit = taken.get(w.parts)
        if hit is None and w.number:
            continue  # a Python number the checkpoint does not hold is a static field
        entry = _entry(w, hit, missing, allowed)
        entries.append(entry)
        if hit is not None:
            used.add(hit.source)
            if entry.fate not in _REFUSED:
                sources[w.path] = hit.source
    extras = [s for s in saved if s.source not in used]
    alike: dict[Any, list[_Saved]] = {}
    for s in extras:
        alike.setdefault((tuple(_tokens(s.parts)), s.leaf.shape, s.leaf.dtype), []).append(s)
    by_path = {w.path: w for w in wanted}
    entries = [_suggest(e, by_path[e.path], alike) if e.fate == "missing" else e for e in entries]
    for s in extras:
        reason = "no target leaf takes it: not read"
        if extra == "error":
            reason += " (refused: extra='error'); rename it onto a target path, or pass extra='ignore'"
        entries.append(Restore(s.source, "extra", s.source, s.leaf, None, reason))
    return RestorePlan(entries, extra, directory, tree, treedef, target_flat, sources)


def _text(parts: tuple[Part, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f"[{p!r}]" for p in parts)


def _entry(w: _Wanted, s: _Saved | None, missing: str, allowed: Callable[[Any, Any], bool]) -> Restore:
    if s is None:
        if missing == "keep" and w.concrete:
            return Restore(w.path, "kept", None, None, w.leaf, "not in the checkpoint: the target's own value is kept")
        if missing == "keep":
            why = (
                "the checkpoint has no leaf here, and missing='keep' keeps only arrays, not an abstract leaf: pass a "
                "target with an array here (the model itself, not an abstract one)"
            )
            return Restore(w.path, "missing", None, None, w.leaf, why)
        return Restore(w.path, "missing", None, None, w.leaf, "the checkpoint has no leaf here")
    a, b = leaf_str(s.leaf), leaf_str(w.leaf)
    if tuple(s.leaf.shape) != tuple(w.leaf.shape):
        why = (
            f"the checkpoint holds {a} at {s.source}, the target wants {b}: a restore never reshapes; give the "
            f"model shape {tuple(s.leaf.shape)} here, or leave this leaf out of the target"
        )
        return Restore(w.path, "reshaped", s.source, s.leaf, w.leaf, why)
    problem = split_problem(w.leaf)
    if problem is not None:
        spec = spec_str(w.leaf.sharding, len(w.leaf.shape)) or repr(w.leaf.sharding)
        why = f"the target's sharding {spec} does not divide {b}: {problem}; choose a spec whose mesh axes divide it"
        return Restore(w.path, "indivisible", s.source, s.leaf, w.leaf, why)
    origin = f"from {s.source}" if s.renamed else ""
    if s.leaf.dtype != w.leaf.dtype:
        saved_name, wanted_name = jnp.dtype(s.leaf.dtype).name, jnp.dtype(w.leaf.dtype).name
        if allowed(s.leaf.dtype, w.leaf.dtype):
            why = f"{origin + ', ' if origin else ''}cast from {saved_name} to {wanted_name}"
            return Restore(w.path, "cast", s.source, s.leaf, w.leaf, why)
        fix = f'cast={{("{saved_name}", "{wanted_name}")}}'
        if _cast_rule("allow")(s.leaf.dtype, w.leaf.dtype):
            fix = f"cast='allow' or {fix}"
        why = f"the checkpoint holds {a} at {s.source}, the target wants {b}; {fix} would cast it"
        return Restore(w.path, "uncast", s.source, s.leaf, w.leaf, why)
    if s.renamed:
        return Restore(w.path, "renamed", s.source, s.leaf, w.leaf, origin)
    return Restore(w.path, "same", s.source, s.leaf, w.leaf, "")


def _suggest(entry: Restore, w: _Wanted, alike: dict[Any, list[_Saved]]) -> Restore:
    """A missing entry's reason, with the one `rename` entry that would take it, where one
    unused checkpoint leaf of its type differs from it only in case, separators or numbering
    (`alike`: the unused leaves by their path's tokens, shape and dtype)."""
    found = alike.get((tuple(_tokens(w.parts)), w.leaf.shape, w.leaf.dtype), [])
    if len(found) != 1:
        hint = ", or rename a checkpoint leaf onto it" if "missing=" in entry.reason else ""
        hint = hint or "; rename a checkpoint leaf onto it, or missing='keep'"
        return dataclasses.replace(entry, reason=entry.reason + hint)
    s = found[0]
    n = 0  # the length of the common tail
    while n < min(len(s.parts), len(w.parts)) - 1 and s.parts[-1 - n] == w.parts[-1 - n]:
        n += 1
    old, new = _keystr(s.keys[: len(s.keys) - n]), _keystr(w.keys[: len(w.keys) - n])
    hint = f'; rename={{"{old}": "{new}"}} would take the checkpoint\'s {s.source}'
    return dataclasses.replace(entry, reason=entry.reason + hint)


def _shown(leaf: jax.ShapeDtypeStruct | None) -> str:
    return "-" if leaf is None else leaf_str(leaf)


class RestorePlan:
    """What restoring a checkpoint into a target would do: one [treeshape.Restore][] per
    target leaf (target order), then the checkpoint's unused leaves ("extra").

    Attributes:
        entries: Every entry.
        ok: No entry is refused.
        problems: The refused entries.
        nbytes: The bytes of the restored state.
        nbytes_per_device: Its bytes per device, on the target's shardings.

    Examples:
        >>> import jax.numpy as jnp, orbax.checkpoint as ocp, tempfile
        >>> import treeshape as ts
        >>> path = tempfile.mkdtemp() + "/ckpt"
        >>> with ocp.StandardCheckpointer() as c:
        ...     c.save(path, {"w": jnp.ones((2, 3)), "step": jnp.int32(7)})
        >>> plan = ts.restore_plan(path, {"w": jnp.zeros((2, 3), jnp.bfloat16)}, cast="allow")
        >>> print(plan)
        restore plan: 1 cast, 1 extra; ok; 12 B (12 B per device)
        path      fate   saved     wanted     reason
        --------  -----  --------  ---------  ---------------------------------
        ['w']     cast   f32[2,3]  bf16[2,3]  cast from float32 to bfloat16
        ['step']  extra  i32[]     -          no target leaf takes it: not read
        --------  -----  --------  ---------  ---------------------------------
        >>> plan.restore()["w"].dtype
        dtype(bfloat16)
    """

    __module__ = "treeshape"  # as users import it

    def __init__(
        self,
        entries: list[Restore],
        extra: str,
        directory: pathlib.Path | None,
        metadata: Any,
        treedef: Any,
        target_flat: list[tuple[Any, Any]],
        sources: dict[str, str],
    ) -> None:
        self.entries = tuple(entries)
        self.problems = tuple(e for e in self.entries if e.fate in _REFUSED or (e.fate == "extra" and extra == "error"))
        self.ok = not self.problems
        wanted = [e.wanted for e in self.entries if e.wanted is not None]
        self.nbytes = sum(leaf_nbytes(w) for w in wanted)
        self.nbytes_per_device = sum(per_device_nbytes(w) for w in wanted)
        self._directory, self._metadata, self._treedef = directory, metadata, treedef
        self._target_flat, self._sources = target_flat, sources

    def __repr__(self) -> str:
        return f"RestorePlan({self._counts()}, {'ok' if self.ok else 'refused'})"

    def _counts(self) -> str:
        counts = {f: sum(e.fate == f for e in self.entries) for f in _FATES}
        return ", ".join(f"{n} {f}" for f, n in counts.items() if n)

    def _rows(self) -> list[list[str]]:
        return [[e.path, e.fate, _shown(e.saved), _shown(e.wanted), e.reason] for e in self.entries if e.fate != "same"]

    def __str__(self) -> str:
        head = (
            f"restore plan: {self._counts()}; {'ok' if self.ok else f'{len(self.problems)} refused'}; "
            f"{human_bytes(self.nbytes)} ({human_bytes(self.nbytes_per_device)} per device)"
        )
        rows = self._rows()
        return head if not rows else head + "\n" + grid(["path", "fate", "saved", "wanted", "reason"], rows, right=0)

    def _repr_html_(self) -> str:
        head = html.escape(str(self).split("\n")[0])
        return f"<p>{head}</p>" + html_grid(
            ["path", "fate", "saved", "wanted", "reason"], self._rows(), right=0, css_class="treeshape-restore-plan"
        )

    def restore(self) -> PyTree:
        """Restore the checkpoint as this plan says, through orbax.

        Returns:
            The target's pytree type, each leaf the checkpoint's value placed on the
            target's sharding (cast where the plan says), or the target's own value
            where "kept".

        Raises:
            RestoreError: the plan refuses some leaves (nothing is read).
            ValueError: the plan's figures are for an abstract mesh, or the
                checkpoint's directory is unknown.

        Examples:
            See [treeshape.restore_plan][].
        """
        if not self.ok:
            lines = [f"  * {e.path}: {e.fate}: {e.reason}." for e in self.problems]
            message = f"treeshape.RestorePlan.restore: the plan refuses {len(self.problems)} " + (
                "leaf; nothing was read:\n" if len(self.problems) == 1 else "leaves; nothing was read:\n"
            )
            raise RestoreError(message + "\n".join(lines), self.problems)
        entries = {e.path: e for e in self.entries if e.fate != "extra"}
        for e in entries.values():
            sharding = e.wanted.sharding if e.wanted is not None else None
            if sharding is not None and isinstance(getattr(sharding, "mesh", None), jax.sharding.AbstractMesh):
                raise ValueError(
                    f"treeshape.RestorePlan.restore: {e.path} is sharded over an abstract mesh, which holds no "
                    "array: give the target a NamedSharding over a real mesh (jax.make_mesh)"
                )
        values = self._read(entries)
        leaves = []
        for keys, x in self._target_flat:
            path = _keystr(tuple(keys))
            entry = entries.get(path)
            if entry is None or entry.fate == "kept":
                leaves.append(x)
                continue
            value = values[self._sources[path]]
            if entry.fate == "cast":
                assert entry.wanted is not None
                value = value.astype(entry.wanted.dtype)
            leaves.append(value)
        return jtu.tree_unflatten(self._treedef, leaves)

    def _read(self, entries: dict[str, Restore]) -> dict[str, Any]:
        """The checkpoint leaves the entries take, each read once onto its target sharding."""
        wanted = {self._sources[p]: e for p, e in entries.items() if p in self._sources}
        if not wanted:
            return {}
        if self._directory is None:
            raise ValueError(
                "treeshape.RestorePlan.restore: the checkpoint's directory is unknown: make the plan from the "
                "checkpoint's directory"
            )
        import orbax.checkpoint as ocp

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
            e = wanted.get(_keystr(keys)) if node is not None else None
            if e is None or e.saved is None or e.wanted is None:
                return None
            sharding = e.wanted.sharding if e.wanted.sharding is not None else default
            return 0, ocp.ArrayRestoreArgs(sharding=sharding, global_shape=tuple(e.saved.shape))

        built = build((), self._metadata)
        assert built is not None
        item, restore_args = built
        with ocp.PyTreeCheckpointer() as checkpointer:
            restored = checkpointer.restore(
                self._directory,
                args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
            )
        flat, _ = jtu.tree_flatten_with_path(restored)
        return {_keystr(k): v for k, v in flat if _keystr(k) in wanted}


# -- the command line ---------------------------------------------------------------------
def abstract_target(fn: Callable[[], Any]) -> Any:
    """`fn()` built abstractly (`jax.eval_shape`: nothing allocated), its static leaves kept."""
    built: list[tuple[Any, list[Any]]] = []

    def arrays() -> list[Any]:
        leaves, treedef = jtu.tree_flatten(fn())
        built.append((treedef, [None if isinstance(x, jax.Array) else x for x in leaves]))
        return [x if isinstance(x, jax.Array) else None for x in leaves]

    abstract = jax.eval_shape(arrays)
    treedef, static = built[0]
    return jtu.tree_unflatten(treedef, [a if s is None else s for a, s in zip(abstract, static, strict=True)])


def plan_data(plan: RestorePlan) -> dict[str, Any]:
    """The plan as JSON data: `{"ok": bool, "entries": [...]}`, each entry by field."""

    def leaf(x: jax.ShapeDtypeStruct | None) -> dict[str, Any] | None:
        return None if x is None else {"shape": list(x.shape), "dtype": jnp.dtype(x.dtype).name}

    entries = [
        {
            "path": e.path,
            "fate": e.fate,
            "source": e.source,
            "saved": leaf(e.saved),
            "wanted": leaf(e.wanted),
            "reason": e.reason,
        }
        for e in plan.entries
    ]
    return {"ok": plan.ok, "entries": entries}


__test__ = {"Restore": Restore, "RestoreError": RestoreError, "RestorePlan": RestorePlan}
