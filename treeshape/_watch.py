"""`ts.watch`: what a function was traced with, each time, and why it was traced again.

A watched function records, whenever a JAX transformation traces it, the
structure of its inputs (arrays by shape, dtype, weak type and sharding, static
arguments by value), the JAX settings that key JAX's tracing cache, and the
user's line that made the call. A retrace is then a diff against the earlier
trace it differs least from. The wrapper adds nothing to the traced program and
is not called at all once JAX has compiled the function.
"""

import dataclasses
import functools as ft
import os
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu

from . import _compat, _nodes
from ._call import wrapper_named
from ._compat import spec_text
from ._diff import diff_structures
from ._errors import FieldValue, Mismatch, MismatchKind, format_report, mismatch_line
from ._structure import Structure


PyTree = Any


@dataclasses.dataclass(frozen=True)
class Trace:
    """What a watched function was traced with, once.

    Attributes:
        index: Its position among the function's traces, 0 first.
        inputs: The [treeshape.Structure][] of `(args, kwargs)` as the
            function received them: arrays by shape, dtype, weak type and
            sharding; static arguments as static leaves; framework node data
            by field name.
        settings: The JAX settings that key JAX's tracing cache, by name
            (`jax_enable_x64`, `jax_default_device`, `mesh`: the abstract
            mesh set with `jax.set_mesh`, ...).
        where: The user's `"file.py:LINE"` that made the call.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> step = ts.watch(lambda x: x * 2)
        >>> _ = jax.jit(step)(jnp.ones(3))
        >>> [trace] = step.traces
        >>> trace.index, trace.inputs, trace.settings["jax_enable_x64"]
        (0, Structure(((f32[3],), {}), 1 leaf, 12 B), False)
    """

    __module__ = "treeshape"

    index: int
    inputs: Structure
    settings: dict[str, Any]
    where: str


@dataclasses.dataclass(frozen=True)
class Retrace:
    """Why a watched function was traced again.

    `str()` is one report: the trace, the earlier trace it differs least from,
    and each difference with its fix.

    Attributes:
        index: The index of the trace that was one too many (1 for the second).
        closest: The earlier [treeshape.Trace][] it differs least from (on a
            tie, the latest).
        mismatches: The differences, each a [treeshape.Mismatch][] with its
            `fix`: in the inputs (paths `args[0]['lr']`, `kwargs['x']`, as
            `ts.out_structure` names inputs), in the settings (kind
            `"setting"`, the path names it), or, when inputs and settings are
            those of `closest`, kind `"function"` (JAX saw a new function) or
            `"cache"` (JAX's caches were cleared since).
        name: The watched function's `__name__`, as the report names it.
        where: The user's `"file.py:LINE"` that made this trace's call.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> step = jax.jit(ts.watch(lambda x: x * 2))
        >>> _ = step(jnp.ones(3)), step(jnp.ones(4))
        >>> [retrace] = step.retraces
        >>> print(retrace.mismatches[0])
        args[0]: expected shape (3,), got (4,).
    """

    __module__ = "treeshape"

    index: int
    closest: Trace
    mismatches: list[Mismatch]
    name: str = dataclasses.field(default="fn", kw_only=True, repr=False)
    where: str = dataclasses.field(default="", kw_only=True, repr=False)

    def __str__(self) -> str:
        header = (
            f"treeshape.watch: `{self.name}` was traced again (trace {self.index}, at {self.where}); "
            f"it differs least from trace {self.closest.index} (at {self.closest.where})"
        )
        return format_report(header, [mismatch_line(m) for m in self.mismatches], "differences")


class RetraceError(RuntimeError):
    """A watched function was traced more often than its `max_traces`.

    Raised by the function [treeshape.watch][] returns, from inside the trace
    that is one too many, so that a test can pin "this step compiles once".
    The message is the [treeshape.Retrace][] report; the report itself is on
    the exception as `err.retrace`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> step = jax.jit(ts.watch(lambda x: x * 2, max_traces=1))
        >>> _ = step(jnp.ones(3))
        >>> try:
        ...     step(jnp.ones(3, jnp.int32))
        ... except ts.RetraceError as err:
        ...     print(err.retrace.mismatches[0])
        args[0]: expected dtype float32, got int32.
    """

    __module__ = "treeshape"

    def __init__(self, message: str, retrace: Retrace) -> None:
        super().__init__(message)
        self.retrace = retrace


# -- one history per watched function ------------------------------------------------
class _History:
    """The traces of one function and why each came again, shared by all its watches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.traces: list[Trace] = []
        self.retraces: list[Retrace] = []
        self.generations: list[int] = []  # how many times JAX's caches were cleared, at each trace


_HISTORIES: dict[tuple[int, ...], tuple[tuple["weakref.ref[Any]", ...], _History]] = {}
_HISTORIES_LOCK: Final = threading.Lock()


def _parts(fn: Callable[..., Any]) -> tuple[Any, ...]:
    """What identifies `fn`: itself, or for a bound method (made afresh on each attribute
    access) its function and instance."""
    return (fn.__func__, fn.__self__) if isinstance(fn, types.MethodType) else (fn,)


def _identity(fn: Callable[..., Any]) -> tuple[int, ...]:
    return tuple(id(part) for part in _parts(fn))


def _history(fn: Callable[..., Any]) -> _History:
    """The history of `fn`, weakly keyed by its parts."""
    objects = _parts(fn)
    key = _identity(fn)

    def forget(_: Any) -> None:
        lock = _HISTORIES_LOCK
        if lock is None:  # the interpreter is shutting down: its module globals are gone
            return
        with lock:
            entry = _HISTORIES.get(key)
            if entry is not None and any(ref() is None for ref in entry[0]):
                del _HISTORIES[key]

    with _HISTORIES_LOCK:
        entry = _HISTORIES.get(key)
        if entry is not None and all(ref() is obj for ref, obj in zip(entry[0], objects, strict=True)):
            return entry[1]
        try:
            refs = tuple(weakref.ref(obj, forget) for obj in objects)
        except TypeError:  # cannot be weakly referenced: this watch keeps its own history
            return _History()
        history = _History()
        _HISTORIES[key] = (refs, history)
        return history


# -- what a trace saw ---------------------------------------------------------------
def _inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Structure:
    """The structure of `(args, kwargs)` under a trace: a tracer (or array) by its type there,
    any other leaf is a static argument, kept as itself (a Python scalar here was passed static)."""
    leaves, treedef = jtu.tree_flatten((args, kwargs))
    described = [_compat.from_aval(jax.typeof(x)) if isinstance(x, jax.Array) else x for x in leaves]
    return Structure(treedef, tuple(described))


_LIBRARIES: Final = ("jax", "jaxlib", "equinox", "flax", "treeshape", "functools", "contextlib", "threading")


def _call_site() -> str:
    """The first frame outside JAX, the frameworks and treeshape: the user's call."""
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] not in _LIBRARIES:
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


# -- why it was traced again -------------------------------------------------------
def _mesh_text(value: Any) -> str:
    if isinstance(value, jax.sharding.AbstractMesh):
        sizes = ", ".join(f"{name!r}: {size}" for name, size in zip(value.axis_names, value.axis_sizes, strict=True))
        types_ = ", ".join(str(t).rsplit(".", 1)[-1] for t in value.axis_types)
        return f"Mesh({sizes}; axis types {types_})"
    return "no mesh" if value is None else repr(value)


def _setting_fix(name: str) -> str:
    if name == "mesh":
        return (
            "JAX traces a function anew for each mesh set with `jax.set_mesh` (its axis names, sizes and types "
            "are part of every value's type): call the jitted function under one mesh, set once around the loop."
        )
    if name == "jax_enable_x64":
        return (
            "x64 changes every dtype JAX gives: set it once at program start "
            '(`jax.config.update("jax_enable_x64", True)`), not around some calls.'
        )
    if name == "named_axes":
        return (
            "The function is traced under other named axes (`vmap(..., axis_name=...)`): call it under the same ones."
        )
    return (
        f"JAX keys its tracing cache on `{name}`: set it once for the whole program (not with a context manager "
        "around some calls)."
    )


def _setting_mismatches(before: dict[str, Any], now: dict[str, Any]) -> list[Mismatch]:
    found = []
    for name in sorted(before.keys() | now.keys(), key=lambda n: (n != "mesh", n != "jax_enable_x64", n)):
        e, a = before.get(name), now.get(name)
        try:
            same = bool(e == a)
        except Exception:  # a value whose `==` raises: told by identity
            same = e is a
        if not same:
            shown = (_mesh_text(e), _mesh_text(a)) if name == "mesh" else (repr(e), repr(a))
            found.append(Mismatch(name, "setting", shown[0], shown[1], root="", fix=_setting_fix(name)))
    if len(found) > 1:  # the whole key (releases without its names) only when no named part tells
        found = [m for m in found if m.path != "jax_trace_context"]
    return found


def _rooted(m: Mismatch) -> Mismatch:
    """A mismatch inside `(args, kwargs)` with its path as `out_structure` names inputs,
    `args[0]['lr']` / `kwargs['x']` (the path itself, as a setting's is its name: no root)."""
    root = "args" if m.path.startswith("[0]") else "kwargs"
    return dataclasses.replace(m, path=root + m.path[3:], root="")


def _sharding_mismatches(before: Trace, now: Structure) -> list[Mismatch]:
    """Leaves at the same path whose shardings differ (explicit mesh axes: part of the type):
    by spec, or by mesh (then both told as text, `P() on Mesh('data': 8; ...)`, with the fix)."""
    old = dict(zip(before.inputs.paths, before.inputs.leaves, strict=True))
    found = []
    for path, leaf in zip(now.paths, now.leaves, strict=True):
        earlier = old.get(path)
        if not (isinstance(leaf, jax.ShapeDtypeStruct) and isinstance(earlier, jax.ShapeDtypeStruct)):
            continue
        e, a = _spec(earlier), _spec(leaf)
        mesh_e, mesh_a = _leaf_mesh(earlier), _leaf_mesh(leaf)
        if _mesh_text(mesh_e) != _mesh_text(mesh_a):
            fix = _mesh_fix(mesh_e is None, f"trace {before.index}", spec_text(a))
            found.append(Mismatch(path, "sharding", _placed_text(e, mesh_e), _placed_text(a, mesh_a), fix=fix))
        elif e != a:
            found.append(Mismatch(path, "sharding", e, a))
    return found


def _leaf_mesh(leaf: jax.ShapeDtypeStruct) -> Any:
    """The mesh of a traced leaf's sharding; None for an array of one device (no mesh)."""
    mesh = getattr(leaf.sharding, "mesh", None)
    return None if mesh is None or mesh.empty else mesh


def _placed_text(spec: Any, mesh: Any) -> str:
    if mesh is None:
        return "of no mesh (one device's array)"
    return f"{spec_text(spec)} on {_mesh_text(mesh)}"


def _spec(leaf: jax.ShapeDtypeStruct) -> Any:
    """The leaf's partition spec with one entry per dimension (`P('d')` of a matrix is `P('d', None)`)."""
    spec = getattr(leaf.sharding, "spec", None)
    entries = () if spec is None else _compat.spec_entries(spec)
    return jax.sharding.PartitionSpec(*entries, *[None] * (len(leaf.shape) - len(entries)))


def _input_fix(m: Mismatch, before: Trace, dtype: Any) -> str:
    """The remedy for one difference in the inputs, as a user acts on it in a training loop
    (`dtype`: the leaf's dtype now, if it is an array)."""
    at = f"trace {before.index}"
    if m.kind == "weak_type":
        made = f"`jnp.asarray(x, jnp.{dtype})`"
        if m.expected:
            return (
                f"It was a Python scalar (weakly typed) at {at} and is an array now: JAX traces the two apart. Make "
                f"it an array from the start ({made} where the state is built), so every step passes the same type."
            )
        return (
            f"It was an array at {at} and is a Python scalar (weakly typed) now: JAX traces the two apart. Pass an "
            f"array every time ({made}), not a Python number."
        )
    if m.kind == "dtype":
        return (
            f"Each dtype is traced and compiled anew: keep it {m.expected} from step to step "
            f"(`.astype({m.expected})` where it changes, e.g. what the step returns)."
        )
    if m.kind == "shape":
        return (
            f"Each shape is traced and compiled anew: pad or bucket it to {m.expected} (e.g. drop or pad the last "
            "partial batch), or expect one compilation per shape."
        )
    if m.kind == "sharding":
        return (
            f"Under explicit mesh axes a sharding is part of the type, traced anew: place it as at {at} "
            f"(`jax.sharding.reshard(x, {spec_text(m.expected)})` or `jax.device_put` before the call)."
        )
    if m.kind == "vma":
        return "It varies over other manual axes than before: give it the same ones (`jax.lax.pcast`) on every call."
    if isinstance(m.expected, FieldValue) or isinstance(m.actual, FieldValue):
        return (
            "This field is static node data (an equinox `eqx.field(static=True)`, a flax.nnx attribute that is "
            "not a Variable): each value traces anew. Keep it fixed, or hold a value that changes in an array "
            "(an `nnx.Variable` / an array field)."
        )
    e, a = str(m.expected), str(m.actual)
    if e.startswith("the static value ") != a.startswith("the static value ") and "None" not in (e, a):
        return (
            f"It was {m.expected} at {at} and is {m.actual} now: a non-array argument is static (under "
            "`eqx.filter_jit`, or marked static), traced anew for each value, and an array is traced by its "
            "type. Pass an array every time (`jnp.asarray(x)`)."
        )
    if e.startswith("the static value ") and a.startswith("the static value "):
        return (
            "A static argument (`static_argnums` / `static_argnames`, or a non-array under `eqx.filter_jit`) "
            "traces anew for each value: keep it fixed, or pass it as an array (`jnp.asarray(x)`) if it changes "
            "from call to call."
        )
    if m.actual is None:
        return f"It was there at {at} and is missing now: pass the same keys on every call."
    if m.expected is None:
        return f"It is new since {at}: create every key up front, so every call has the same keys."
    if e == "None" or a == "None":
        return (
            f"It was {m.expected} at {at} and is {m.actual} now: make it an array from the start (e.g. "
            "zeros of its final shape), so every call has the same tree."
        )
    return (
        "The containers differ (a list is not a tuple to JAX, nor one node type another): build this part the "
        "same way on every call (e.g. `tuple(...)` where a step returns a list)."
    )


def _mesh_fix(was_unplaced: bool, at: str, spec: str) -> str:
    """The remedy for a leaf whose sharding's mesh changed since trace `at` (`was_unplaced`:
    it had none then), `spec` its partition spec now."""
    if was_unplaced:
        return (
            f"It was made outside the mesh at {at} (an array of one device, e.g. `jnp.float32(0)` before "
            "`jax.set_mesh`) and is on the mesh now (a step's output is): the mesh is part of its type under "
            "explicit axes, so JAX traced anew. Make it under `jax.set_mesh(mesh)`, or put it onto its sharding "
            f"before the loop: `x = jax.device_put(x, NamedSharding(mesh, {spec}))`."
        )
    return (
        f"Its mesh is not the one of {at}: under explicit mesh axes the mesh is part of its type, traced anew. "
        f"Put it on one mesh before the loop (`x = jax.device_put(x, NamedSharding(mesh, {spec}))`), and make "
        "new arrays under `jax.set_mesh(mesh)`."
    )


def _differences(before: Trace, now: Trace) -> list[Mismatch]:
    found = _setting_mismatches(before.settings, now.settings)
    inputs = diff_structures(before.inputs, now.inputs, "tree") + _sharding_mismatches(before, now.inputs)
    if inputs:
        dtypes = {
            path: getattr(leaf, "dtype", None) for path, leaf in zip(now.inputs.paths, now.inputs.leaves, strict=True)
        }
        for m in inputs:
            found.append(dataclasses.replace(_rooted(m), fix=m.fix or _input_fix(m, before, dtypes.get(m.path))))
    return found


def _retrace(name: str, history: _History, now: Trace, generation: int) -> Retrace:
    best: tuple[int, int, list[Mismatch]] | None = None
    for i, before in enumerate(history.traces):
        differences = _differences(before, now)
        if best is None or len(differences) <= len(best[2]):
            best = (i, len(differences), differences)
    assert best is not None
    i, _, mismatches = best
    closest = history.traces[i]
    if not mismatches:
        kind: MismatchKind
        if history.generations[i] != generation:
            fix = (
                "JAX's caches were cleared since that trace (`jax.clear_caches()`, or a library that calls it), "
                "so JAX traced and compiled it again: clear them only where a recompilation is meant."
            )
            kind = "cache"
        else:
            fix = (
                "JAX saw a new function: the jitted function was built again (a `jax.jit(...)`, "
                "`functools.partial` or lambda made inside the loop, or a new `ts.watch` each time). Build it "
                "once, outside the loop, and call that."
            )
            kind = "function"
        mismatches = [Mismatch("", kind, closest.where, now.where, root=name, fix=fix)]
    return Retrace(now.index, closest, mismatches, name=name, where=now.where)


# -- the wrapper ---------------------------------------------------------------------
class _Seen(NamedTuple):
    """What one trace saw, before it is known to succeed."""

    inputs: Structure
    settings: dict[str, Any]
    where: str
    generation: int  # how many times JAX's caches were cleared so far (`_compat.cache_clears`)


class _Watched:
    """`fn`, recording each trace (see `watch`)."""

    def __init__(self, fn: Callable[..., Any], max_traces: int | None) -> None:
        ft.update_wrapper(self, fn)
        self._fn = fn
        self._max_traces = max_traces
        self._history = _history(fn)
        # The history's own lists, updated in place: `jax.jit` and `nnx.jit` copy a
        # function's attributes onto the jitted one, so `jax.jit(watched).traces` works.
        self.traces: list[Trace] = self._history.traces
        self.retraces: list[Retrace] = self._history.retraces
        self._name = getattr(fn, "__name__", None) or type(fn).__name__
        # Told by identity (a bound method by its function and instance), as the history is:
        # the function's own `__eq__` and `__hash__` are never called.
        self._identity = _identity(fn) + (max_traces,)
        self._hash = hash(self._identity)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _compat.at_top_level():  # not a trace (JAX calls this only when it traces)
            return self._fn(*args, **kwargs)
        seen = _Seen(_inputs(args, kwargs), _compat.named_trace_settings(), _call_site(), _compat.cache_clears())
        if self._max_traces is not None:
            self._check_max_traces(seen, self._max_traces)
        out = self._fn(*args, **kwargs)
        self._record(seen)  # only a trace that succeeded: JAX keeps nothing of one that raised
        return out

    def _check_max_traces(self, seen: "_Seen", max_traces: int) -> None:
        history = self._history
        with history.lock:
            if len(history.traces) < max_traces:
                return
            trace = Trace(len(history.traces), seen.inputs, seen.settings, seen.where)
            retrace = _retrace(self._name, history, trace, seen.generation)
        times = "once" if max_traces == 1 else f"{max_traces} times"
        raise RetraceError(
            f"treeshape.watch: `{self._name}` may be traced at most {times} (max_traces={max_traces}), "
            f"and this is trace {trace.index + 1}.\n\n{retrace}",
            retrace,
        )

    def _record(self, seen: "_Seen") -> None:
        history = self._history
        with history.lock:
            trace = Trace(len(history.traces), seen.inputs, seen.settings, seen.where)
            if history.traces:
                history.retraces.append(_retrace(self._name, history, trace, seen.generation))
            history.traces.append(trace)
            history.generations.append(seen.generation)

    def __eq__(self, other: object) -> bool:
        # Watches of one function are one function to a cache that holds an earlier
        # one (`eqx.filter_jit` keys on its static function): a new watch adds no trace.
        if other is self:
            return True
        if type(other) is not type(self) or other._hash != self._hash:
            return False
        return other._identity == self._identity  # ids of objects both hold alive: the same objects

    def __hash__(self) -> int:
        return self._hash

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else ft.partial(self, instance)

    def __repr__(self) -> str:
        return f"<treeshape.watch of {self._name}: {len(self._history.traces)} traces>"


class _Meta(NamedTuple):
    """What a watch of a callable pytree keeps beside the pytree: the node data of its
    own node (no array: `eqx.filter_jit` hashes it as a static value)."""

    history: _History
    identity: tuple[Any, ...]
    name: str
    max_traces: int | None
    wrapped: tuple[tuple[str, Any], ...]  # `__name__`, `__doc__`, ... as `update_wrapper` copies them

    def __eq__(self, other: object) -> bool:
        return type(other) is _Meta and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)


class _WatchedTree(_Watched):
    """A watch of a callable pytree (an equinox module, a `jax.tree_util.Partial`): itself
    that pytree, its one child, so that a jit keeps the pytree's arrays arguments of the
    program."""

    def __init__(self, fn: Callable[..., Any], max_traces: int | None) -> None:
        ft.update_wrapper(self, fn, updated=())  # never the pytree's fields: its arrays belong to the child
        self._fn = fn
        self._max_traces = max_traces
        self._history = _history(fn)
        self.traces = self._history.traces
        self.retraces = self._history.retraces
        self._name = getattr(fn, "__name__", None) or type(fn).__name__
        self._identity = _identity(fn) + (max_traces,)
        self._hash = hash(self._identity)

    def _meta(self) -> _Meta:
        wrapped = tuple((a, getattr(self, a)) for a in ft.WRAPPER_ASSIGNMENTS if a in vars(self))
        return _Meta(self._history, self._identity, self._name, self._max_traces, wrapped)

    @classmethod
    def _rebuilt(cls, meta: _Meta, fn: Any) -> "_WatchedTree":
        new = object.__new__(cls)
        for attribute, value in meta.wrapped:
            setattr(new, attribute, value)
        new.__wrapped__ = fn  # type: ignore[attr-defined]
        new._fn, new._max_traces, new._history = fn, meta.max_traces, meta.history
        new.traces, new.retraces = meta.history.traces, meta.history.retraces
        new._name, new._identity, new._hash = meta.name, meta.identity, hash(meta.identity)
        return new


jtu.register_pytree_with_keys(
    _WatchedTree,
    lambda w: (((_nodes.WRAPPED_KEY, w._fn),), w._meta()),
    lambda meta, children: _WatchedTree._rebuilt(meta, *children),
    flatten_func=lambda w: ((w._fn,), w._meta()),
)


def watch(fn: Callable[..., Any], /, *, max_traces: int | None = None) -> Callable[..., Any]:
    """Wrap `fn` to record what each JAX trace of it saw, and say why it was traced again.

    Use it inside any jit (`jax.jit(ts.watch(step))`, `eqx.filter_jit`,
    `nnx.jit`, or as a decorator under them; `ts.watch(jax.jit(step))`, which
    sees no trace, warns). The wrapper calls `fn`
    unchanged, adds nothing to the compiled program, and is not called at all
    once JAX has compiled it. Watches of the same `fn` share one history. A
    trace that raised (in `fn`, or `RetraceError`) is not recorded: JAX keeps
    nothing of it, so the next call traces again.

    JAX traces again for a new input type (shape, dtype, weak type, sharding
    under explicit mesh axes), a new static value or tree structure, a new
    setting (`jax_enable_x64`, the mesh), a newly built function, or after its
    caches were cleared. Under `Auto` mesh axes a new sharding recompiles
    *without* tracing, so a watch does not see it.

    Args:
        fn: The function to watch (what you would pass to `jax.jit`).
        max_traces: If given, the trace after the `max_traces`-th raises
            [treeshape.RetraceError][], from inside that trace (traces
            counted over every watch of `fn`, which share one history).

    A callable pytree (an equinox module, a `jax.tree_util.Partial`) gives a
    watch that is that pytree (its one child, `__wrapped__`): under
    `eqx.filter_jit`, or passed to a `jax.jit` function, its arrays stay
    arguments of the program, as without the watch.

    Returns:
        A callable like `fn`, with `.traces` (a list of [treeshape.Trace][])
        and `.retraces` (a list of [treeshape.Retrace][], one per trace after
        the first).

    Raises:
        TypeError: `fn` is not callable.
        ValueError: `max_traces` is not an int >= 1.
        RetraceError: (from the returned function) more traces than `max_traces`.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> @jax.jit
        ... @ts.watch
        ... def step(state, lr):
        ...     return {"w": state["w"] - lr * state["w"]}
        >>> state = step({"w": jnp.ones(3)}, 0.1)
        >>> state = step(state, jnp.float32(0.1))
        >>> print(step.retraces[0])  # doctest: +ELLIPSIS
        treeshape.watch: `step` was traced again (trace 1, at ...); it differs least from trace 0 (at ...):
        args[1]: expected a weakly typed leaf, got a strongly typed one. It was a Python scalar ...
    """
    if not callable(fn):
        raise TypeError(f"treeshape.watch: `fn` must be callable (the function to jit), got {type(fn).__name__}.")
    if max_traces is not None and (type(max_traces) is not int or max_traces < 1):
        raise ValueError(
            f"treeshape.watch: `max_traces` must be an int >= 1 (how many traces are allowed) or None, "
            f"got {max_traces!r}."
        )
    wrapper = wrapper_named(fn)
    if wrapper is not None:
        name = getattr(fn, "__name__", None) or "step"
        warnings.warn(
            f"treeshape.watch: `{name}` is already wrapped by `{wrapper}`: a watch around it is called only "
            f"outside any trace, so it sees none of that wrapper's traces. Watch the function inside it: "
            f"`{wrapper}(ts.watch({name}))` (under a `@{wrapper}` decorator, put `@ts.watch` below it).",
            UserWarning,
            stacklevel=2,
        )
    if type(fn) not in (types.FunctionType, types.MethodType, ft.partial) and not jtu.treedef_is_leaf(
        jtu.tree_structure(fn)
    ):
        return _WatchedTree(fn, max_traces)  # a callable pytree: the watch is that pytree
    return _Watched(fn, max_traces)


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Trace": Trace, "Retrace": Retrace, "RetraceError": RetraceError}
