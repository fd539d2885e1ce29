"""Restoring an orbax checkpoint into the model you have: `restore_plan` reads the
checkpoint's metadata alone and says the fate of every leaf; `RestorePlan.restore`
then does exactly that through orbax, and nothing else.

Paths are matched as orbax writes them: each key of a path is read as a name or an
index (`['0']` is `[0]`, `['03']` a name, `['value']` is an nnx Variable's `.value`, a
dict of field names is the dataclass, namedtuple or module it was written from), so the
plan of a checkpoint of the same model is all "same". `_checkpoint` reads the checkpoint.
"""

import dataclasses
import html
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._checkpoint import Read, Unreadable, checkpoint_tree, described, is_metadata, keystr, read
from ._diff import as_index
from ._leaf import leaf_str
from ._nodes import key_name
from ._shapes import human_bytes, leaf_nbytes
from ._sharding import per_device_nbytes, spec_str, split_problem
from ._structure import Structure
from ._table import grid, html_grid
from ._tree import clip


PyTree = Any
Fate = Literal["same", "renamed", "cast", "kept", "missing", "reshaped", "uncast", "indivisible", "extra"]
Rename = dict[str, str] | Callable[[str], str | None] | Sequence[tuple[str, str]] | None
_REFUSED: Final = frozenset({"missing", "reshaped", "uncast", "indivisible"})
_FATES: Final = ("same", "renamed", "cast", "kept", "missing", "reshaped", "uncast", "indivisible", "extra")
_WHO: Final = "treeshape.restore_plan"


class RestoreError(ValueError):
    """`RestorePlan.restore()` of a plan that refuses some leaves (nothing was read), or of a
    checkpoint whose array data cannot be read (nothing is returned).

    The message lists the refused entries, each with its reason and what would
    allow it, or names the leaf whose data cannot be read and the directory;
    `entries` holds them as [treeshape.Restore][] values.

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
        reason: What is done, or why it is refused and what would allow it;
            "" for "same", unless the target's Python number (a step, a size)
            is restored from another saved value, which it names.

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


def _saved_leaf(m: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(m.shape), _canonical(m.dtype))


def _canonical(dtype: Any) -> Any:
    """A dtype as JAX will hold it (a Python int saved as int64 is JAX's int without x64)."""
    return dtype if _is_key(dtype) else jax.dtypes.canonicalize_dtype(dtype)


def _is_key(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))


# -- paths ----------------------------------------------------------------------------
Part = str | int
_TOKEN: Final = re.compile(
    r"\[(?P<q>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]|\[(?P<i>-?[0-9]+)\]|\.(?P<a>[A-Za-z_][A-Za-z_0-9]*)"
)


def _part(key: Any) -> Part:
    """One key as orbax and the target agree on it: a name, or an index (`'3'` is `3`; `'03'`
    and `'²'` are names)."""
    key = key_name(key)
    index = as_index(key)
    if index is not None:
        return index
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
    kind: Literal["array", "number", "key"]  # a Python number is an entry only where the checkpoint holds it
    data: jax.ShapeDtypeStruct  # what the checkpoint holds for it: the leaf, or a PRNG key's key data


_RENAMES: Final = (
    "rename= takes a dict from checkpoint path to target path ({\"['Dense_0']\": \"['dense_0']\"}), a callable "
    "from a checkpoint path to a target path or None, or a list of (regex, replacement) pairs applied in order"
)


def _renamer(rename: Rename) -> Callable[[_Saved], tuple[Part, ...] | None]:
    if rename is None:
        return lambda s: None
    if isinstance(rename, dict):
        for k, v in rename.items():
            if not (isinstance(k, str) and isinstance(v, str)):
                raise TypeError(
                    f"{_WHO}: rename has the entry {k!r}: {v!r}, not two keystr paths (strings): {_RENAMES}"
                )
        table = [(_parse(k, "rename key"), _parse(v, "rename value"), k) for k, v in rename.items()]
        table.sort(key=lambda row: -len(row[0]))

        def by_prefix(s: _Saved) -> tuple[Part, ...] | None:
            for prefix, to, _ in table:
                if s.parts[: len(prefix)] == prefix:
                    return to + s.parts[len(prefix) :]
            return None

        return by_prefix
    if callable(rename):
        return _by_call(rename)
    if isinstance(rename, (str, bytes)) or not isinstance(rename, (list, tuple)):
        raise TypeError(f"{_WHO}: rename={clip(repr(rename), 60)} (of type {type(rename).__name__}): {_RENAMES}")
    pairs = []
    for pair in rename:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise TypeError(f"{_WHO}: rename holds {clip(repr(pair), 60)}, not a (regex, replacement) pair: {_RENAMES}")
        try:
            pairs.append((re.compile(pair[0]), pair[1]))
        except re.error as err:
            raise ValueError(f"{_WHO}: rename's pattern {pair[0]!r} is not a regular expression: {err}") from err

    def by_regex(s: _Saved) -> tuple[Part, ...] | None:
        text = s.source
        for pattern, replacement in pairs:
            try:
                text = pattern.sub(replacement, text)
            except (re.error, IndexError) as err:
                raise ValueError(
                    f"{_WHO}: rename's replacement {replacement!r} (for {pattern.pattern!r}) cannot be applied to "
                    f"{text!r}: {err}"
                ) from err
        return None if text == s.source else _parse(text, f"rename of {s.source!r}")

    return by_regex


def _by_call(fn: Callable[[str], str | None]) -> Callable[[_Saved], tuple[Part, ...] | None]:
    def by_call(s: _Saved) -> tuple[Part, ...] | None:
        try:
            out = fn(s.source)
        except Exception as err:
            err.add_note(
                f"(raised by rename({s.source!r}), which treeshape.restore_plan calls for each checkpoint path)"
            )
            raise
        if out is not None and not isinstance(out, str):
            raise TypeError(
                f"{_WHO}: rename({s.source!r}) returned {described(out)}: a rename callable returns a target's "
                "keystr path (a str) or None"
            )
        return None if out is None or out == s.source else _parse(out, f"rename({s.source!r})")

    return by_call


_CASTS: Final = (
    "cast= takes 'error', 'allow' (floating to floating, integer to integer) or a set of (saved, wanted) dtype "
    "pairs, e.g. {('bfloat16', 'float32')}"
)


def _cast_rule(cast: Any) -> Callable[[Any, Any], bool]:
    if isinstance(cast, str):
        if cast == "error":
            return lambda saved, wanted: False
        if cast == "allow":
            return _same_kind
        raise ValueError(f"{_WHO}: cast={cast!r} is not one of 'error', 'allow': {_CASTS}")
    if not isinstance(cast, (set, frozenset, list, tuple)):
        raise TypeError(f"{_WHO}: cast={clip(repr(cast), 60)} (of type {type(cast).__name__}): {_CASTS}")
    pairs = set()
    for pair in cast:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"{_WHO}: cast holds {clip(repr(pair), 60)}, not a (saved, wanted) pair: {_CASTS}")
        try:
            pairs.add((jnp.dtype(pair[0]), jnp.dtype(pair[1])))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{_WHO}: cast holds {pair!r}, which is not two dtypes ({err}): {_CASTS}") from err
    return lambda saved, wanted: (jnp.dtype(saved), jnp.dtype(wanted)) in pairs


def _same_kind(saved: Any, wanted: Any) -> bool:
    return any(
        jnp.issubdtype(saved, kind) and jnp.issubdtype(wanted, kind)
        for kind in (jnp.floating, jnp.integer, jnp.complexfloating)
    )


def _target_leaves(target: Any) -> tuple[list[tuple[tuple[Any, ...], Any]], Any]:
    tree = target.tree if isinstance(target, Structure) else target
    return jtu.tree_flatten_with_path(tree)


def _wanted(keys: tuple[Any, ...], x: Any) -> _Wanted | None:
    """A target leaf to restore, or None for a static one (a string, a function, a flag)."""
    path, parts = keystr(keys), tuple(map(_part, keys))
    if type(x) in (int, float, complex):
        leaf = jax.ShapeDtypeStruct((), jax.dtypes.canonicalize_dtype(np.dtype(type(x))))
        return _Wanted(path, keys, parts, leaf, x, True, "number", leaf)
    if isinstance(x, jax.ShapeDtypeStruct):
        leaf, concrete = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), False
    elif isinstance(x, (jax.Array, np.ndarray, np.generic)):
        sharding = x.sharding if isinstance(x, jax.Array) else None
        leaf, concrete = jax.ShapeDtypeStruct(np.shape(x), _canonical(x.dtype), sharding=sharding), True
    else:
        return None
    if not _is_key(leaf.dtype):
        return _Wanted(path, keys, parts, leaf, x, concrete, "array", leaf)
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    data = jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding)
    return _Wanted(path, keys, parts, leaf, x, concrete, "key", data)


def _key_impl(x: Any) -> Any:
    """The PRNG implementation of a key array, or of an abstract one."""
    if isinstance(x, jax.Array):
        return jax.random.key_impl(x)
    found: list[Any] = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)), jax.ShapeDtypeStruct(x.shape, x.dtype))
    return found[0]


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

    Reads the checkpoint's metadata (never an array chunk) and the saved values of
    the target's Python numbers. Paths match as orbax writes them (`['3']` is `[3]`,
    `['value']` an nnx Variable's value); a PRNG key takes the key data orbax writes.

    Args:
        checkpoint: An orbax checkpoint's item directory (a step directory of one
            item is read as that item), or its metadata tree.
        target: What the state should become: arrays or abstract leaves (an
            `nnx.State`, an nnx or equinox module, linen parameters, an optax
            state, a dict of those) or a [treeshape.Structure][], whose
            shardings say where each leaf goes.
        rename: Checkpoint path (or path prefix) to target path, as a dict; a
            callable from a checkpoint path to a target path or None; or a list
            of `(regex, replacement)` pairs applied in order.
        missing: "error", or "keep" the target's own array where it has none.
        extra: "ignore" or refuse ("error") checkpoint leaves no target leaf takes.
        cast: "error", "allow" (floating to floating, integer to integer), or a
            set of `(saved, wanted)` dtype pairs.

    Returns:
        A [treeshape.RestorePlan][]: one [treeshape.Restore][] per target leaf,
        then the checkpoint's unused leaves.

    Raises:
        ValueError: `checkpoint` is no orbax checkpoint, or `rename` maps two
            leaves to one target path (or to none); a bad `rename` or `cast` value.
        TypeError: `target` holds no array, `checkpoint` is neither a directory
            nor metadata, or `rename` or `cast` is of another form.
        ImportError: orbax-checkpoint cannot be imported.

    Examples:
        >>> import jax, jax.numpy as jnp, orbax.checkpoint as ocp, tempfile
        >>> import treeshape as ts
        >>> path = tempfile.mkdtemp() + "/ckpt"
        >>> with ocp.StandardCheckpointer() as c:
        ...     c.save(path, {"Dense_0": {"kernel": jnp.ones((2, 3))}})
        >>> model = {"dense_0": {"kernel": jnp.zeros((2, 3))}, "bias": jnp.zeros(3)}
        >>> plan = ts.restore_plan(path, model)
        >>> print(plan.ok, plan.problems[1].reason)
        False the checkpoint has no leaf here; rename={"['Dense_0']": "['dense_0']"} would take
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
    renamer = _renamer(rename)
    target_flat, treedef = _target_leaves(target)
    wanted = [w for w in (_wanted(tuple(k), x) for k, x in target_flat) if w is not None]
    if not any(w.kind != "number" for w in wanted):
        raise TypeError(
            f"{_WHO}: target is {described(target)}, which holds no array leaf: pass what the state should become, "
            "a pytree of arrays or jax.ShapeDtypeStruct leaves (an nnx.State or module, an equinox module, linen "
            "parameters, an optax state, a dict of those) or a treeshape.Structure"
        )
    tree, directory = checkpoint_tree(checkpoint, _WHO)
    flat, _ = jtu.tree_flatten_with_path(tree, is_leaf=is_metadata)
    saved = [
        _Saved(keystr(k), k, tuple(map(_part, k)), _saved_leaf(m), tuple(map(_part, k)))
        for k, m in flat
        if is_metadata(m)  # orbax's metadata of a string has no shape: a target's strings are its own
    ]
    taken = _taken(saved, renamer, {w.parts for w in wanted})
    entries: list[Restore] = []
    sources: dict[str, str] = {}  # target path -> checkpoint source, for restore()
    for w in wanted:
        hit = taken.get(w.parts)
        if hit is None and w.kind == "number":
            continue  # a Python number the checkpoint does not hold is a static field
        entry = _entry(w, hit, missing, allowed)
        entries.append(entry)
        if hit is not None and entry.fate not in _REFUSED:
            sources[w.path] = hit.source
    used = {e.source for e in entries}
    extras = [s for s in saved if s.source not in used]
    alike: dict[Any, list[_Saved]] = {}
    for s in extras:
        alike.setdefault((tuple(_tokens(s.parts)), s.leaf.shape, s.leaf.dtype), []).append(s)
    by_path = {w.path: w for w in wanted}
    entries = [_suggest(e, by_path[e.path], alike) if e.fate == "missing" else e for e in entries]
    numbers = _numbers(directory, tree, [(e, by_path[e.path]) for e in entries if e.path in sources])
    entries = [_told(e, by_path[e.path], numbers) if e.path in numbers else e for e in entries]
    for s in extras:
        reason = "no target leaf takes it: not read"
        if extra == "error":
            reason += " (refused: extra='error'); rename it onto a target path, or pass extra='ignore'"
        entries.append(Restore(s.source, "extra", s.source, s.leaf, None, reason))
    made = _Made(directory, tree, treedef, target_flat, sources, by_path, numbers)
    return RestorePlan(entries, extra, made)


def _taken(
    saved: list[_Saved], renamer: Callable[[_Saved], tuple[Part, ...] | None], targets: set[tuple[Part, ...]]
) -> dict[tuple[Part, ...], _Saved]:
    """The checkpoint leaf each target path takes (where `rename` maps it, else its own path)."""
    for s in saved:
        to = renamer(s)
        if to is not None:
            if to not in targets:
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
    return taken


def _numbers(directory: pathlib.Path | None, tree: Any, taken: list[tuple[Restore, _Wanted]]) -> dict[str, Any]:
    """The saved values of the target's Python numbers (a step, a size), by target path, as the
    target's Python type: scalars, read with the plan (where its directory is known)."""
    numbers = [e for e, w in taken if w.kind == "number"]
    if not numbers or directory is None:
        return {}
    values = _read(directory, tree, numbers, {e.source: True for e in numbers}, _WHO)
    return {e.path: type(w.value)(np.asarray(values[e.path]).item()) for e, w in taken if w.kind == "number"}


def _told(entry: Restore, w: _Wanted, numbers: dict[str, Any]) -> Restore:
    """A Python number's entry, naming the saved value where it differs from the target's."""
    value = numbers[entry.path]
    if type(value) is type(w.value) and value == w.value:
        return entry
    said = f"the checkpoint holds {value!r} where the target holds {w.value!r}: restored as {value!r}"
    return dataclasses.replace(entry, reason=f"{entry.reason}; {said}" if entry.reason else said)


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
    # A PRNG key is restored from the key data orbax writes for it (or from a key, in a metadata tree).
    data = w.leaf if _is_key(s.leaf.dtype) else w.data
    a, b = leaf_str(s.leaf), leaf_str(data)
    if w.kind == "key" and data is w.data:
        b = f"{b}, the key data of its PRNG key {leaf_str(w.leaf)}"
    if tuple(s.leaf.shape) != tuple(data.shape):
        fix = f"give the model shape {tuple(s.leaf.shape)} here, or leave this leaf out of the target"
        if w.kind == "key":
            fix = "the checkpoint holds no key data for this key: leave it out of the target, or missing='keep' it"
        why = f"the checkpoint holds {a} at {s.source}, the target wants {b}: a restore never reshapes; {fix}"
        return Restore(w.path, "reshaped", s.source, s.leaf, w.leaf, why)
    problem = split_problem(w.leaf)
    if problem is not None:
        spec = spec_str(w.leaf.sharding, len(w.leaf.shape)) or repr(w.leaf.sharding)
        why = f"the target's sharding {spec} does not divide {b}: {problem}; choose a spec whose mesh axes divide it"
        return Restore(w.path, "indivisible", s.source, s.leaf, w.leaf, why)
    origin = f"from {s.source}" if s.renamed else ""
    if s.leaf.dtype != data.dtype:
        saved_name, wanted_name = jnp.dtype(s.leaf.dtype).name, jnp.dtype(data.dtype).name
        if allowed(s.leaf.dtype, data.dtype):
            why = f"{origin + ', ' if origin else ''}cast from {saved_name} to {wanted_name}"
            return Restore(w.path, "cast", s.source, s.leaf, w.leaf, why)
        fix = f'cast={{("{saved_name}", "{wanted_name}")}}'
        if _same_kind(s.leaf.dtype, data.dtype):
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
    found = alike.get((tuple(_tokens(w.parts)), w.data.shape, w.data.dtype), [])
    if len(found) != 1:
        hint = ", or rename a checkpoint leaf onto it" if "missing=" in entry.reason else ""
        hint = hint or "; rename a checkpoint leaf onto it, or missing='keep'"
        return dataclasses.replace(entry, reason=entry.reason + hint)
    s = found[0]
    n = 0  # the length of the common tail
    while n < min(len(s.parts), len(w.parts)) - 1 and s.parts[-1 - n] == w.parts[-1 - n]:
        n += 1
    old, new = keystr(s.keys[: len(s.keys) - n]), keystr(w.keys[: len(w.keys) - n])
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

    def __init__(self, entries: list[Restore], extra: str, made: "_Made") -> None:
        self.entries = tuple(entries)
        self.problems = tuple(e for e in self.entries if e.fate in _REFUSED or (e.fate == "extra" and extra == "error"))
        self.ok = not self.problems
        wanted = [e.wanted for e in self.entries if e.wanted is not None]
        self.nbytes = sum(leaf_nbytes(w) for w in wanted)
        self.nbytes_per_device = sum(per_device_nbytes(w) for w in wanted)
        self._made = made

    def __repr__(self) -> str:
        return f"RestorePlan({self._counts()}, {'ok' if self.ok else 'refused'})"

    def _counts(self) -> str:
        counts = {f: sum(e.fate == f for e in self.entries) for f in _FATES}
        return ", ".join(f"{n} {f}" for f, n in counts.items() if n)

    def _rows(self) -> list[list[str]]:
        shown = [e for e in self.entries if e.fate != "same" or e.reason]  # a number's other value is told
        return [[e.path, e.fate, _shown(e.saved), _shown(e.wanted), e.reason] for e in shown]

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
            RestoreError: the plan refuses some leaves (nothing is read), or
                a leaf's array data cannot be read (the plan read metadata only).
            ValueError: the plan's figures are for an abstract mesh, or the
                checkpoint's directory is unknown.
            ImportError: orbax-checkpoint cannot be imported.

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
        made = self._made
        taken = [e for p, e in entries.items() if p in made.sources and p not in made.numbers]
        numbers = {e.source: made.wanted[e.path].kind == "number" for e in taken}
        values = _read(made.directory, made.metadata, taken, numbers, "treeshape.RestorePlan.restore")
        leaves = []
        for keys, x in made.target_flat:
            path = keystr(tuple(keys))
            entry = entries.get(path)
            if entry is None or entry.fate == "kept":
                leaves.append(x)
            elif path in made.numbers:
                leaves.append(made.numbers[path])
            else:
                leaves.append(_restored(values[path], entry, made.wanted[path]))
        return jtu.tree_unflatten(made.treedef, leaves)


@dataclasses.dataclass
class _Made:
    """What a plan was made from, for its restore."""

    directory: pathlib.Path | None
    metadata: Any  # the checkpoint's metadata tree
    treedef: Any
    target_flat: list[tuple[Any, Any]]
    sources: dict[str, str]  # target path -> the checkpoint source it takes
    wanted: dict[str, _Wanted]  # by target path
    numbers: dict[str, Any]  # the saved values of the target's Python numbers, read with the plan


def _read(
    directory: pathlib.Path | None, metadata: Any, entries: list[Restore], numbers: dict[Any, bool], who: str
) -> dict[str, Any]:
    """The checkpoint leaves the entries take, by target path, each read once onto its target's
    sharding (`numbers`: by source, whether it is read as a Python number).

    Raises:
        RestoreError: a leaf's array data cannot be read (naming the first such leaf).
    """
    if not entries:
        return {}
    if directory is None:
        raise ValueError(f"{who}: the checkpoint's directory is unknown: make the plan from the checkpoint's directory")
    reads = {}
    for e in entries:
        assert e.source is not None and e.saved is not None and e.wanted is not None
        reads[e.source] = Read(tuple(e.saved.shape), e.wanted.sharding, numbers[e.source])
    try:
        values = read(directory, metadata, reads, who)
    except Unreadable as err:
        bad = [e for e in entries if e.source == err.source]
        where = f"the array data of {bad[0].path} (the checkpoint's {bad[0].source})" if bad else "its array data"
        first = (str(err.error).strip().splitlines() or [type(err.error).__name__])[0]
        seen = (
            "The plan reads the checkpoint's metadata only, so it could not see this"
            if who != _WHO
            else "The plan reads the values of the target's Python numbers (and only metadata for the rest)"
        )
        raise RestoreError(
            f"{who}: {where} cannot be read from {str(directory)!r} ({type(err.error).__name__}: {clip(first, 120)}). "
            f"{seen}: the checkpoint's array files are missing or damaged; restore another checkpoint (an earlier "
            "step), or save this one again",
            bad,
        ) from err.error
    return {e.path: values[e.source] for e in entries if e.source is not None}


def _restored(value: Any, entry: Restore, w: _Wanted) -> Any:
    """A leaf as read, as the plan says it is restored: cast, a PRNG key from its key data, a Python number."""
    if w.kind == "key" and _is_key(value.dtype):
        value = jax.random.key_data(value)  # orbax rebuilds the key it wrote: the target's kind of key is made below
    if entry.fate == "cast":
        value = value.astype(w.data.dtype)
    if w.kind == "key":
        return jax.random.wrap_key_data(value, impl=_key_impl(w.value))
    if w.kind == "number":
        return type(w.value)(np.asarray(value).item())
    return value


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
