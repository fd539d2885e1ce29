"""`out_structure` (one abstract evaluation, cached) and `structure_of` (read without tracing)."""

import functools as ft
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
import numpy as np

from . import _cache, _compat, _sharding, _tree
from ._cache import CACHE, NEEDS_CONCRETE, CacheInfo, Key, static_key
from ._leaf import (
    ARRAY,
    DIM,
    NUMPY,
    OTHER,
    SCALAR,
    SDS,
    BadShape,
    TooLarge,
    as_abstract,
    bad_shape_message,
    check_extents,
    checked_sds,
    cycle_problem,
    extent_message,
    flatten,
    int_too_big_message,
    is_duck_array,
    jax_dtype,
    kind_of,
    refuse_cycles,
    sizes,
)
from ._structure import PyTree, Structure, read_structure


_INT32_MIN, _INT32_MAX = -(2**31), 2**31


def _scalar_key(x: Any) -> Any:
    cls = type(x)
    if cls is int and not _INT32_MIN <= x < _INT32_MAX:
        return (int, x)  # may not fit the weak int dtype: never share an entry
    return cls


def _call_key(leaves: list[Any], concrete_scalars: bool, refs: list[Any]) -> list[Any]:
    """Per-leaf key parts: the abstract value JAX traces for an array-like leaf
    (so an array, a NumPy array, a ShapeDtypeStruct and a duck array of one
    type share them), Python scalars by type (or value, when passed
    concrete), static values as `_cache.static_key` says."""
    out = []
    for x in leaves:
        kind = kind_of(type(x))
        if kind == ARRAY:
            out.append(x.aval)
        elif kind == SCALAR:
            out.append((type(x), x) if concrete_scalars else _scalar_key(x))
        elif kind == SDS or kind == DIM or (kind == NUMPY and jax_dtype(x.dtype)):
            out.append(_compat.abstractify(x))
        elif kind == OTHER and is_duck_array(x):
            out.append(_compat.abstractify(as_abstract(x)))
        else:
            out.append(static_key(x, refs))
    return out


def is_abstract(x: Any, concrete_scalars: bool) -> bool:
    kind = kind_of(type(x))
    if kind == SCALAR:
        return not concrete_scalars
    if kind == NUMPY:  # a NumPy array of strings or objects is a static value
        return jax_dtype(x.dtype)
    if kind == OTHER:
        return is_duck_array(x)
    return True


# -- callables -----------------------------------------------------------------
def _call_pytree(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _split_callable(fn: Any) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Write `fn` as `core(*bound, *args, **{**bound_kw, **kwargs})`.

    `bound`/`bound_kw` hold the callable's own state (a partial's arguments, a
    bound method's `self`, a callable pytree itself): passed to `core` as
    inputs, so a partial rebuilt on every call shares one cache entry and no
    tracer is ever closed over.
    """
    if type(fn) is types.FunctionType:
        return fn, (), {}
    if isinstance(fn, ft.partial):
        core, bound, bound_kw = _split_callable(fn.func)
        return core, bound + tuple(fn.args), {**bound_kw, **fn.keywords}
    if type(fn) is types.MethodType:
        core, bound, bound_kw = _split_callable(fn.__func__)
        return core, (*bound, fn.__self__), bound_kw
    if not isinstance(fn, types.BuiltinFunctionType) and not jtu.treedef_is_leaf(jtu.tree_structure(fn)):
        return _call_pytree, (fn,), {}
    return fn, (), {}


# -- the cache -----------------------------------------------------------------
def cache_info() -> CacheInfo:
    """Return the statistics of every cache that [treeshape.clear_cache][] empties.

    A named tuple `(hits, misses, size, maxsize)` of the `out_structure` cache,
    with `cost_hits`, `cost_misses` and `cost_size` for the cache of
    [treeshape.cost][] (also behind [treeshape.largest_fit][]).

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.clear_cache()
        >>> f = lambda x: x * 2
        >>> _ = ts.out_structure(f, jnp.ones(3))
        >>> _ = ts.out_structure(f, jnp.zeros(3))  # same abstract input: a hit
        >>> _ = ts.cost(f, jnp.ones(3))
        >>> ts.cache_info()
        CacheInfo(hits=1, misses=1, size=1, maxsize=4096, cost_hits=0, cost_misses=1, cost_size=1)
    """
    cost_hits, cost_misses, cost_size, _ = _cache.COST_CACHE.info()
    return CacheInfo(*CACHE.info(), cost_hits, cost_misses, cost_size)


def clear_cache() -> None:
    """Empty the `out_structure` cache and `cost`'s, and reset their counts (see [treeshape.cache_info][]).

    Examples:
        >>> import treeshape as ts
        >>> ts.clear_cache()
        >>> ts.cache_info().size
        0
    """
    CACHE.clear()
    _cache.COST_CACHE.clear()


def set_cache_maxsize(maxsize: int) -> int:
    """Bound the cache (and `cost`'s) to `maxsize` entries (evicting the oldest); return the old bound.

    Private (tests and benchmarks): the public default stays 4096.
    """
    if not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"treeshape: the cache maxsize must be an int >= 0, got {maxsize!r}")
    _cache.COST_CACHE.resize(maxsize)
    return CACHE.resize(maxsize)


# -- inference -----------------------------------------------------------------
def input_path(leaves: list[Any], treedef: jtu.PyTreeDef, i: int) -> str:
    """Leaf `i` of the call as the user wrote it: `args[0]['w']`, `kwargs['n']`, or
    `the bound args[1]` for a value bound in a partial."""
    keys = jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, leaves))[0][i][0]
    # keys: (bound or call, args or kwargs, ...)
    root = ("the bound " if keys[0] == jtu.SequenceKey(0) else "") + (
        "args" if keys[1] == jtu.SequenceKey(0) else "kwargs"
    )
    return root + jtu.keystr(tuple(keys[2:]))


def abstract_inputs(leaves: list[Any], treedef: jtu.PyTreeDef, fn_name: str = "out_structure") -> list[Any]:
    """The leaves with duck arrays as `ShapeDtypeStruct`s, every described shape checked
    (named by path: JAX's own error would name a treeshape wrapper, or none at all): sizes
    that JAX takes, that XLA can hold, and shardings that divide them."""
    out = list(leaves)
    for i, x in enumerate(leaves):
        kind = kind_of(type(x))
        try:
            if kind == OTHER and is_duck_array(x):
                out[i] = as_abstract(x)
            elif kind == SDS:
                out[i] = checked_sds(x)
        except BadShape as e:
            where = input_path(leaves, treedef, i)
            raise e.error(bad_shape_message(fn_name, where, e.shape, e.problem)) from None
    try:
        check_extents(out)
    except TooLarge as e:
        raise ValueError(extent_message(fn_name, input_path(leaves, treedef, e.index), e.leaf, e.problem)) from None
    check_splits(out, treedef, fn_name)
    return out


def check_splits(leaves: list[Any], treedef: jtu.PyTreeDef, fn_name: str) -> None:
    """Refuse a `ShapeDtypeStruct` whose sharding splits a symbolic dimension that it does not
    always divide, as `with_shardings` refuses it (a cache key need not cover shardings)."""
    if jax.ShapeDtypeStruct not in map(type, leaves):  # a C-level scan: every call runs this
        return
    for i, x in enumerate(leaves):
        if type(x) is jax.ShapeDtypeStruct and x.sharding is not None and not sizes(x.shape):
            problem = _sharding.split_problem(x)
            if problem is not None:
                raise ValueError(_sharding.split_message(fn_name, input_path(leaves, treedef, i), x, problem))


def check_inputs(
    leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef, fn_name: str = "out_structure"
) -> None:
    """Name the path of a Python int JAX cannot type (instead of JAX's bare OverflowError):
    it is an abstract input by contract, and no JAX integer holds it."""
    bits = 64 if jax.enable_x64.value else 32
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1)
    for i, (x, a) in enumerate(zip(leaves, abstract, strict=True)):
        if not (a and type(x) is int) or low <= x < high:
            continue
        raise OverflowError(int_too_big_message(fn_name, input_path(leaves, treedef, i), x, bits))


def is_output_array(x: Any, kind: int) -> bool:
    """Whether an output leaf is an array for JAX (the rest are kept as static leaves)."""
    if kind == ARRAY or kind == SCALAR or kind == DIM:
        return True
    if kind == NUMPY:
        return jax_dtype(x.dtype)
    return kind == OTHER and is_duck_array(x)


def _evaluate(
    core: Callable[..., Any],
    n_concrete: int,
    bound_leaves: list[Any],
    call_leaves: list[Any],
    treedef: jtu.PyTreeDef,
    close_bound: bool = False,
) -> Structure:
    """Abstractly evaluate `core` on the given leaves (one `jax.eval_shape` trace).

    Python scalars among the first `n_concrete` leaves are passed concrete, and
    with `close_bound` so are the bound arrays and tracers (closed over, as
    `jax.eval_shape` of the partial itself passes them).
    """
    leaves = abstract_inputs(bound_leaves + call_leaves, treedef)
    n_bound = len(bound_leaves)
    abstract = [
        is_abstract(x, i < n_concrete) and not (close_bound and i < n_bound and has_value(x))
        for i, x in enumerate(leaves)
    ]
    check_inputs(leaves, abstract, treedef)
    if type(core) is _JITTED and not bound_leaves and treedef.children()[0] == _EMPTY_BOUND:
        # A jitted function on its own: exactly `jax.eval_shape`, which asks the
        # jitted function for its output info (so its `out_shardings` show).
        (args, kwargs) = jtu.tree_unflatten(treedef, leaves)[1]
        out = jax.eval_shape(core, *args, **kwargs)
        out_leaves, out_treedef = jtu.tree_flatten(out)
        return Structure(out_treedef, tuple(out_leaves))
    out_info: list[Any] = []

    args, kwargs, bound_named = dynamic_arguments(core, leaves, abstract, treedef)
    order = list(bound_named)

    def traced(args: Any, kwargs: Any, **bound_named: Any) -> list[Any]:
        it = iter(jtu.tree_leaves(([bound_named[name] for name in order], args, kwargs)))
        full = [next(it) if a else x for x, a in zip(leaves, abstract, strict=True)]
        (bound, bound_kw), (args, kwargs) = jtu.tree_unflatten(treedef, full)
        out = core(*bound, *args, **{**bound_kw, **kwargs})
        out_leaves, out_treedef = jtu.tree_flatten(out)
        traced_out = []
        descriptions: list[Any] = []
        for x in out_leaves:
            if is_output_array(x, kind_of(type(x))):
                descriptions.append(_TRACED)
                traced_out.append(x)
            else:  # a ShapeDtypeStruct describes itself; other leaves are static
                descriptions.append(x)
        # Checked while the trace is alive, and nothing that holds a tracer is
        # kept: it must not outlive the trace (the leak checker would see it).
        escapes = _tracer_escapes(out, out_treedef, descriptions)
        out_info[:] = [escapes] if escapes else [out_treedef, descriptions]
        return [] if escapes else traced_out

    # JAX's own messages then name the user's function and the arguments as
    # they were passed (`args[1]`, `kwargs['train']`), not this wrapper.
    traced.__wrapped__ = core  # type: ignore[attr-defined]
    traced.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        _CALL_PARAMETERS + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in order]
    )
    try:
        shapes = iter(jax.eval_shape(traced, args, kwargs, **bound_named))
    except Exception as e:
        if not isinstance(e, TypeError):  # JAX's concretization errors are TypeErrors
            raise
        n = len(bound_leaves)
        note_abstract_scalars(
            e,
            core,
            len(treedef.children()[0].children()[0].children()),
            leaves[n:],
            abstract[n:],
            treedef.children()[1],
        )
        raise
    if len(out_info) == 1:
        _raise_escapes(out_info[0])
    out_treedef, descriptions = out_info
    return Structure(out_treedef, tuple(next(shapes) if d is _TRACED else d for d in descriptions))


_TRACED = object()
_CALL_PARAMETERS: Final = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in ("args", "kwargs")]


def dynamic_arguments(
    core: Callable[..., Any], leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef
) -> tuple[Any, Any, dict[str, Any]]:
    """The abstract leaves grouped as the call was written: a tuple over the
    positional arguments and a dict over the keyword arguments (each argument's
    own tree with its static leaves as `None` where its nodes hold plain data,
    else a list of its abstract leaves), and the bound ones by the name
    of the parameter they are bound to (`n` for `partial(f, n=...)`, `f`'s
    parameter name for a positional one), so that JAX's messages name them as
    the user wrote them (`args[0]['params']['w']`). Flattened in that order
    (bound first), they give the abstract leaves in order."""
    it = iter(zip(leaves, abstract, strict=True))

    def group(td: jtu.PyTreeDef) -> Any:
        items = list(itertools.islice(it, td.num_leaves))
        part = [x for x, a in items if a]
        if jtu.treedef_is_leaf(td):
            return part[0] if part else part
        if not part or not _tree.treedef_is_plain(td):
            return part  # user objects in node data would enter JAX's caches, and stay
        try:  # `None` is a node without leaves: the abstract leaves keep their paths
            tree = jtu.tree_unflatten(td, [x if a else None for x, a in items])
            if len(jtu.tree_leaves(tree)) == len(part):
                return tree
        except Exception:  # a node type that cannot hold None
            pass
        return part

    (bound_td, bound_kw_td), (args_td, kwargs_td) = (td.children() for td in treedef.children())
    params = _parameter_names(core) if bound_td.num_leaves else []
    names = [params[i] if i < len(params) else f"bound_{i}" for i in range(len(bound_td.children()))]
    names += list(bound_kw_td.node_data()[1])
    tds = bound_td.children() + bound_kw_td.children()
    if len(set(names)) < len(names) or not all(n.isidentifier() and n not in ("args", "kwargs") for n in names):
        names = [f"bound_{i}" for i in range(len(tds))]  # only if the user's names cannot be parameters
    bound = {name: group(td) for name, td in zip(names, tds, strict=True)}
    args = tuple(group(td) for td in args_td.children())
    kwargs = {key: group(td) for key, td in zip(kwargs_td.node_data()[1], kwargs_td.children(), strict=True)}
    return args, kwargs, bound


_CONCRETIZATION_ERRORS = (
    jax.errors.ConcretizationTypeError,  # also TracerBoolConversionError
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


def _needed_concrete(error: BaseException) -> bool:
    """Whether `fn` failed because it needed a concrete value and got a tracer."""
    return isinstance(error, _CONCRETIZATION_ERRORS) or _compat.is_traced_shape_error(error)


def has_value(x: Any) -> bool:
    """An array with a value (or a tracer of an enclosing trace), as opposed to a
    `ShapeDtypeStruct` or a duck array, which only describe one."""
    kind = kind_of(type(x))
    return kind == ARRAY or (kind == NUMPY and jax_dtype(x.dtype))


def note_abstract_scalars(
    error: BaseException,
    core: Callable[..., Any],
    n_bound: int,
    leaves: list[Any],
    abstract: list[bool],
    call_treedef: jtu.PyTreeDef,
) -> None:
    """When `fn` needed a concrete value and got a tracer, name the Python
    scalars that were passed abstractly and say how to keep them concrete."""
    if not _needed_concrete(error):
        return
    scalars = [i for i, (x, a) in enumerate(zip(leaves, abstract, strict=True)) if a and kind_of(type(x)) == SCALAR]
    if not scalars:
        return
    flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(call_treedef, leaves))
    named, bind = [], []
    params = _parameter_names(core)
    for i in scalars:
        keys = flat[i][0]
        root = "args" if keys[0] == jtu.SequenceKey(0) else "kwargs"
        named.append(f"{root}{jtu.keystr(tuple(keys[1:]))} = {leaves[i]!r}")
        if len(keys) == 2 and root == "kwargs":
            bind.append(f"{keys[1].key}={leaves[i]!r}")
        elif len(keys) == 2 and n_bound + keys[1].idx < len(params):
            bind.append(f"{params[n_bound + keys[1].idx]}={leaves[i]!r}")
    name = getattr(core, "__name__", None)
    name = name if isinstance(name, str) and name.isidentifier() else "fn"
    example = ", ".join(bind) if len(bind) == len(scalars) else "name=value"
    error.add_note(
        f"treeshape: Python scalars are abstract inputs (traced, like arrays): {', '.join(named)}. If {name} "
        "needs one as a Python value (a size, a flag, a loop count), bind it so that it stays concrete: "
        f"`ts.out_structure(functools.partial({name}, {example}), ...)` without it, or pass a jitted function "
        f"that marks it static: `jax.jit({name}, static_argnames=...)`."
    )


def _parameter_names(fn: Any) -> list[str]:
    """The names of `fn`'s leading parameters that can be passed by keyword."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    for p in parameters:
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            break
        names.append(p.name)
    return names


_EMPTY_BOUND = jtu.tree_structure(((), {}))
_JITTED: type = type(jax.jit(lambda: None))


def _tracer_escapes(out: Any, treedef: jtu.PyTreeDef, descriptions: list[Any], root: str = "") -> list[str]:
    """Where a static leaf or node data of `out` holds a tracer (an attribute, a
    closure cell, a generator frame...), which would escape the trace. Paths are
    printed under `root` (`""`: the output of `fn`)."""
    suspects = [
        i
        for i, d in enumerate(descriptions)
        if d is not _TRACED and not isinstance(d, jax.ShapeDtypeStruct) and not _tree.is_plain(d)
    ]
    found = [i for i in suspects if _cache.holds_tracer(descriptions[i])]
    noun = "" if root else "output "
    where = []
    if found:
        paths = [root + jtu.keystr(path) for path, _ in jtu.tree_flatten_with_path(out)[0]]
        where += [f"the {noun}leaf {paths[i] or '(the whole output)'}" for i in found]
    if not _tree.treedef_is_plain(treedef):
        where += [f"the static data of the {noun}node {node}" for node in _nodes_holding_tracers(out, root)]
    return where


def _nodes_holding_tracers(out: Any, root: str) -> list[str]:
    """`type at path` for each node of `out` whose static data holds a tracer."""
    return [
        f"{type(node).__name__} at {path or '(the root)'}"
        for path, node, aux in _tree.nodes(out, root)
        if _cache.holds_tracer(aux)
    ]


_ESCAPE_FIXES = {
    "out_structure": "Return arrays as pytree leaves instead (register the class as a pytree node), and results "
    "rather than closures over traced values.",
    "structure_of": "Keep arrays as pytree leaves instead (register the class as a pytree node, with the arrays as "
    "its children), or pass only the array part of the tree.",
}


def _raise_escapes(where: list[str], fn_name: str = "out_structure") -> None:
    raise TypeError(
        f"treeshape.{fn_name}: {', '.join(where)} holds a JAX tracer (in an attribute, a closure cell or a "
        "generator), which would escape the trace; `jax.eval_shape` rejects it too. " + _ESCAPE_FIXES[fn_name]
    )


def check_callable(fn: Any, fn_name: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"treeshape.{fn_name}: `fn` must be callable, got {type(fn).__name__} {fn!r}. "
            f"Pass the function first and its arguments after it: `ts.{fn_name}(f, x)`."
        )


class Call(NamedTuple):
    """A call `fn(*args, **kwargs)` split as `core(*bound, *args, **{**bound_kw, **kwargs})`, flattened."""

    core: Callable[..., Any]
    bound_leaves: list[Any]
    bound_treedef: jtu.PyTreeDef
    call_leaves: list[Any]
    call_treedef: jtu.PyTreeDef

    @property
    def jitted(self) -> bool:
        """A jitted core abstracts its own non-static arguments: Python scalars are
        passed to it concrete (and keyed by value), so its static arguments work."""
        return type(self.core) is _JITTED

    @property
    def treedef(self) -> jtu.PyTreeDef:
        return jtu.treedef_tuple((self.bound_treedef, self.call_treedef))

    @property
    def n_concrete(self) -> int:
        """How many leaves, from the first, pass Python scalars concrete."""
        return len(self.bound_leaves) + (len(self.call_leaves) if self.jitted else 0)


def split_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], who: str = "out_structure"
) -> Call:
    core, bound, bound_kw = _split_callable(fn)
    if cycle_problem((args, kwargs, bound, bound_kw), "") is not None:  # one walk; then name the part
        for tree, root in (
            (args, "args"),
            (kwargs, "kwargs"),
            (bound, "the bound args"),
            (bound_kw, "the bound kwargs"),
        ):
            refuse_cycles(tree, who, root)
    if bound or bound_kw:
        bound_leaves, bound_treedef = flatten((bound, bound_kw), who, "the bound arguments", checked=True)
    else:
        bound_leaves, bound_treedef = [], _EMPTY_BOUND
    call_leaves, call_treedef = flatten((args, kwargs), who, "the arguments", checked=True)
    return Call(core, bound_leaves, bound_treedef, call_leaves, call_treedef)


def _is_structure(x: Any) -> bool:
    return isinstance(x, Structure)


def with_trees(call: Call) -> Call:
    """`call` with every `Structure` among its leaves (arguments or bound values) replaced
    by the pytree of `ShapeDtypeStruct`s it describes (`s.tree`)."""
    if Structure not in map(type, call.call_leaves) and Structure not in map(type, call.bound_leaves):
        return call  # (a C-level scan: this runs on every call, cached ones too)
    bound = jtu.tree_unflatten(call.bound_treedef, call.bound_leaves)
    args = jtu.tree_unflatten(call.call_treedef, call.call_leaves)
    bound, args = jtu.tree_map(lambda x: x.tree if _is_structure(x) else x, (bound, args), is_leaf=_is_structure)
    bound_leaves, bound_treedef = jtu.tree_flatten(bound)
    call_leaves, call_treedef = jtu.tree_flatten(args)
    return Call(call.core, bound_leaves, bound_treedef, call_leaves, call_treedef)


def call_key(call: Call, refs: list[Any]) -> tuple[Any, ...]:
    """The cache key parts of a call: the core function, the treedefs, each leaf's part
    (`_call_key`) and the tracing context. Raises what `static_key` raises."""
    return (
        static_key(call.core, refs),
        call.bound_treedef,
        call.call_treedef,
        *_call_key(call.bound_leaves, True, refs),
        *_call_key(call.call_leaves, call.jitted, refs),
        _cache.context_key(),
    )


def _out_structure(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Structure, list[Any]]:
    """The structure of `fn(*args, **kwargs)`, and the flattened `(args, kwargs)`."""
    check_callable(fn, "out_structure")
    call = split_call(fn, args, kwargs)
    types = {*map(type, call.call_leaves), *map(type, call.bound_leaves)}  # (one pass: this runs on every call)
    if Structure in types:
        call = with_trees(call)
        types = {*map(type, call.call_leaves), *map(type, call.bound_leaves)}
    core, bound_leaves, bound_treedef, call_leaves, call_treedef = call
    if jax.ShapeDtypeStruct in types:
        check_splits([*bound_leaves, *call_leaves], call.treedef, "out_structure")
    refs: list[Any] = []
    key: Key | None = None
    hit = None
    try:
        key = Key(call_key(call, refs))
        hit = CACHE.get(key)
    except Exception:  # Uncacheable, or a user object's __hash__/__eq__ (in node data) failing
        key = None
        CACHE.miss()
    if hit is not None and hit is not NEEDS_CONCRETE:
        return hit, call_leaves
    n_concrete = call.n_concrete
    treedef = call.treedef
    if hit is NEEDS_CONCRETE:
        return _with_bound_values(core, n_concrete, bound_leaves, call_leaves, treedef, key, refs, True), call_leaves
    try:
        structure = _evaluate(core, n_concrete, bound_leaves, call_leaves, treedef)
    except (TypeError, IndexError):  # what JAX raises where a value is needed (a size, an `int()`, a slice)
        if not any(has_value(x) for x in bound_leaves):
            raise
        retry = True
    else:
        retry = False
    if retry:  # outside the handler: an error now is the user's, not a consequence of the first
        structure = _with_bound_values(core, n_concrete, bound_leaves, call_leaves, treedef, key, refs, False)
        if key is not None:
            CACHE.put(key, NEEDS_CONCRETE, refs)
        return structure, call_leaves
    if key is not None and _may_hold(bound_treedef, call_treedef, structure):
        CACHE.put(key, structure, refs)
    return structure, call_leaves


_MAX_VALUE_KEY_BYTES: Final = 1 << 16


def _with_bound_values(
    core: Callable[..., Any],
    n_concrete: int,
    bound_leaves: list[Any],
    call_leaves: list[Any],
    treedef: jtu.PyTreeDef,
    key: Key | None,
    refs: list[Any],
    look_up: bool,
) -> Structure:
    """The answer when `fn` needs the arrays bound in a partial as values (a size, an
    `int()`): they are passed concrete, as `jax.eval_shape` passes them, and the
    answer is cached by those values (small arrays only) on top of the abstract key,
    looked up first with `look_up` (not on the first call, whose miss is counted)."""
    value_key = None if key is None else bound_value_key(key, bound_leaves)
    if look_up:  # else this call's miss is counted already (and the entry cannot be there yet)
        hit = CACHE.get(value_key) if value_key is not None else None
        if hit is not None:
            return hit
        if value_key is None:
            CACHE.miss()
    structure = _evaluate(core, n_concrete, bound_leaves, call_leaves, treedef, close_bound=True)
    bound_treedef, call_treedef = treedef.children()
    if value_key is not None and _may_hold(bound_treedef, call_treedef, structure):
        CACHE.put(value_key, structure, refs)
    return structure


def bound_value_key(key: Key, bound_leaves: list[Any]) -> Key | None:
    """The key of a call whose bound arrays are passed concrete: `key` with their values
    (None where one is too large or not addressable here: answered uncached)."""
    try:
        return Key((NEEDS_CONCRETE, key, *(_value_key(x) for x in bound_leaves)))
    except Exception:
        return None


def _value_key(x: Any) -> Any:
    """A bound leaf's key part when bound arrays are passed concrete: their value."""
    if not has_value(x) or isinstance(x, jax.core.Tracer):
        return None  # keyed by its abstract value in the key below
    if x.nbytes > _MAX_VALUE_KEY_BYTES:
        raise _cache.Uncacheable
    value = np.asarray(x)
    return (_compat.abstractify(x), value.tobytes())


def _may_hold(bound_treedef: jtu.PyTreeDef, call_treedef: jtu.PyTreeDef, structure: Structure) -> bool:
    """Whether an entry may keep its key's treedefs and its result alive:
    only if their node data and static leaves are plain data."""
    return (
        _tree.treedef_is_plain(bound_treedef)
        and _tree.treedef_is_plain(call_treedef)
        and _tree.treedef_is_plain(structure.treedef)
        and all(isinstance(leaf, jax.ShapeDtypeStruct) or _tree.is_plain(leaf) for leaf in structure.leaves)
    )


def out_structure(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Structure:
    """Infer the structure of `fn(*args, **kwargs)` without running it.

    Abstract evaluation with `jax.eval_shape`: no FLOPs, no device memory, no
    lowering and no compilation. Safe at top level and inside `jit`, `vmap`,
    `grad`, `jvp`/`vjp`, loop and `cond` bodies, `checkpoint`, custom
    derivative rules and `shard_map`, with closures and partials over tracers:
    no tracer escapes, and the result describes the values as seen at that
    level (under `vmap`, per-example shapes).

    Array leaves of the arguments (arrays, tracers, `jax.ShapeDtypeStruct`s,
    NumPy arrays and scalars, duck arrays) and Python scalars are abstract
    inputs, typed as JAX types them (`int`/`float`/`complex` weak, `bool`
    strong). A [treeshape.Structure][] among the arguments (or bound in a
    partial) stands for the tree it describes (`s.tree`), as in
    [treeshape.cost][], so a step can be checked on a model that was never
    allocated. Any other leaf (a string, a callable, an object) is passed to
    `fn` unchanged, as a static value. In the output, Python scalars become
    weak arrays and other non-array leaves are kept as static leaves.

    Results are cached (LRU, 4096 entries): a repeated call with the same
    callable and the same abstract inputs, in the same context, is answered
    without tracing, and the answer is exactly what `jax.eval_shape` gives
    there. The key covers the abstract inputs (an array, a NumPy array and a
    `ShapeDtypeStruct` of one type are one input), static values by type and
    value, every JAX setting that changes tracing (x64, promotion modes, PRNG
    settings, ...), the abstract mesh and the named axes in scope (`vmap`
    axis names and sizes, `shard_map` manual axes). A `functools.partial` or
    `jax.tree_util.Partial` rebuilt on every call hits the cache when its
    function, its bound Python values (passed to `fn` concrete) and the
    abstract values of its bound arrays match; where `fn` needs those arrays
    as values (a size, an `int()`), they are passed concrete, as
    `jax.eval_shape` passes them, and the answer is keyed by their values.
    A mutable static value (a dataclass that is not frozen, an object with
    attributes, a set) gives the answer for its state at the time of the
    call: it is keyed by that state where it is plain data, otherwise the
    call simply traces. The cache keeps nothing alive: functions are keyed
    by weak reference, and a call whose inputs or outputs cannot be keyed or
    held that way simply traces. Answers are cached by inputs: a function
    that reads mutable global state needs [treeshape.clear_cache][] after
    the state changes.

    A `jax.jit`-wrapped `fn` receives Python scalars concrete, so its
    `static_argnums`/`static_argnames` work; `jit` abstracts the others
    itself, exactly as `jax.eval_shape` does.

    Args:
        fn: Any callable: a function, lambda or closure, `functools.partial`,
            `jax.tree_util.Partial`, bound method, `jax.jit`-wrapped function
            or callable pytree.
        *args: Pytrees of arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy or
            Python scalars, or static values; or Structures.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Structure][]: the output treedef and one
        `jax.ShapeDtypeStruct` (or static value) per output leaf.

    Raises:
        TypeError: `fn` is not callable, or a static output leaf (an object,
            a closure, a generator) holds a tracer, which would escape.
        OverflowError: a Python int argument does not fit JAX's int type.

    Errors raised by `fn` itself propagate unchanged.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> def predict(params, x):
        ...     return params["w"] @ x + params["b"]
        >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
        >>> ts.out_structure(predict, params, jnp.zeros(3))
        Structure(f32[2], 1 leaf, 8 B)
    """
    structure, call_leaves = _out_structure(fn, args, kwargs)
    return _with_call_meshes(structure, fn, call_leaves)


def _with_call_meshes(structure: Structure, fn: Any, call_leaves: list[Any]) -> Structure:
    """At top level, a copy of `structure` that knows the concrete meshes of the call's
    arguments (and of the `jax.set_mesh` mesh), when some output sharding names an
    abstract mesh: `zeros()` places those leaves there. The cached entry is never changed:
    one entry answers calls on different concrete meshes with the same abstract mesh."""
    if not structure._sharded() or not _compat.at_top_level():
        return structure
    if not structure._memo("abstract_mesh", lambda: _sharding.has_abstract_mesh(structure)):
        return structure
    _, bound, bound_kw = _split_callable(fn)
    meshes = _sharding.concrete_meshes([call_leaves, bound, bound_kw])
    return structure._on_meshes(meshes) if meshes else structure


def structure_of(tree: PyTree) -> Structure:
    """Describe an existing pytree, reading each leaf's type without tracing.

    The result equals `out_structure(lambda t: t, tree)`, at the cost of a
    flatten (no trace, no cache: fit for trees of millions of leaves). At top
    level, a leaf that is a committed array keeps its concrete sharding, so
    `structure_of(params).zeros()` is placed where `params` lives (also across
    processes), and a `jax.ShapeDtypeStruct` keeps its sharding as given (its
    `PartitionSpec` too, over an Auto or abstract mesh). A Structure passed
    as `tree` is returned as it is.

    Args:
        tree: A pytree whose leaves are arrays, tracers,
            `jax.ShapeDtypeStruct`s, NumPy or Python scalars (typed as JAX
            types them), or static values.

    Returns:
        Its [treeshape.Structure][].

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> ts.structure_of({"step": 0, "w": jnp.zeros((2, 2), jnp.bfloat16), "act": "relu"})
        Structure({'act': 'relu', 'step': ~i32[], 'w': bf16[2,2]}, 3 leaves, 12 B)
    """
    if isinstance(tree, Structure):
        return tree
    structure = read_structure(tree, "structure_of")
    if not _compat.at_top_level():
        # A static leaf or node that holds a tracer would leave the trace inside
        # the Structure (as `out_structure` of the identity refuses it too).
        where = _tracer_escapes(tree, structure.treedef, list(structure.leaves), "tree")
        if where:
            _raise_escapes(where, "structure_of")
    return structure
