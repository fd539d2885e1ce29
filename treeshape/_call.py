"""The model of a call `fn(*args, **kwargs)`, for every entry point that takes one
(`out_structure`, `cost`, `largest_fit`): the callable split into its core function and
bound values (a partial's arguments, a bound method's `self`, a callable pytree itself),
the inputs flattened and checked, a place in the call named as the user wrote it, the
signatures JAX's messages read, and the settings of a jit wrapper of the user's own
(`jax.jit`, `eqx.filter_jit`, `nnx.jit`)."""

import functools as ft
import inspect
import itertools
import keyword
import types
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu

from . import _compat, _nodes, _sharding, _tree
from ._dtypes import jax_dtype
from ._leaf import (
    ARRAY,
    DIM,
    NUMPY,
    OTHER,
    SCALAR,
    SDS,
    as_abstract,
    extent_message,
    flatten,
    int_too_big_message,
    is_duck_array,
    kind_of,
    refuse_cycles,
    walk_call,
    walked_leaf_types,
)
from ._shapes import BadShape, TooLarge, bad_shape_message, check_extents, checked_sds, sizes
from ._structure import Structure


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


def _call_filter_jit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """An `eqx.filter_jit` wrapper called (or a callable pytree whose `__call__` is one, an
    equinox module's): every leaf that is not an array is static to it, so Python scalars
    are passed to it concrete, as to a `jax.jit` wrapper, and come back as they are."""
    return fn(*args, **kwargs)


_PYTREE_CALLS: Final = (_call_pytree, _call_filter_jit)


def is_filter_jit(fn: Any) -> bool:
    """Whether `fn` is an `eqx.filter_jit` wrapper (equinox is never imported here)."""
    cls = type(fn)
    return cls.__name__ == "_JitWrapper" and cls.__module__.startswith("equinox.")


def _is_equinox_partial(fn: Any) -> bool:
    """Whether `fn` is an `eqx.Partial` (what equinox makes of a module's method bound to it)."""
    cls = type(fn)
    return cls.__name__ == "Partial" and cls.__module__.startswith("equinox.")


def _is_nnx_jit(core: Any) -> bool:
    cls = type(core)
    return cls.__name__ == "JitWrapped" and cls.__module__.startswith("flax.")


def is_jit_wrapper(core: Any) -> bool:
    """Whether the split call's `core` is a jit wrapper of its own (`jax.jit`,
    `eqx.filter_jit`, `nnx.jit`, `jax.pmap`): the program it compiles is named by it, and
    the program `ts.cost` jits around it adds nothing but that outer name."""
    return core is _call_filter_jit or wrapper_named(core) is not None


def wrapper_named(fn: Any) -> str | None:
    """How the user spelled the jit (or pmap) wrapper `fn` is (`"jax.jit"`, `"eqx.filter_jit"`,
    `"nnx.jit"`, `"jax.pmap"`), else None."""
    cls = type(fn)
    if cls is _JITTED:
        return "jax.jit"
    if is_filter_jit(fn):
        return "eqx.filter_jit"
    if _is_nnx_jit(fn):
        return "nnx.jit"
    return "jax.pmap" if pmap_name(fn) is not None else None


def pmap_name(core: Any) -> str | None:
    """The name of the function a `jax.pmap` wrapper maps, where the split call's `core` is
    one (JAX's own `PmapFunction`, or the function JAX 0.8+ builds over `shard_map`, told
    by its `lower`), else None."""
    if type(core).__name__ == "PmapFunction" and type(core).__module__.startswith("jaxlib"):
        return _function_name(getattr(core, "__wrapped__", core))
    lower = getattr(core, "lower", None)
    if isinstance(core, types.FunctionType) and getattr(lower, "__qualname__", None) == "pmap.<locals>.lower":
        # jax 0.8.0's wrapper wraps nothing (it is named "wrapped"): the function its settings hold
        over = _compat.pmap_over(core)
        return _function_name(over.fun if over is not None else getattr(core, "__wrapped__", core))
    return None


def _function_name(fn: Any) -> str:
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else "fn"


def static_arguments(core: Any) -> tuple[frozenset[int], frozenset[str]] | None:
    """The positions and names of the arguments that the split call's `core` makes static,
    where it is a jit wrapper that names them (`jax.jit`, `nnx.jit`: its `static_argnums`
    and `static_argnames` as JAX applies them, one given alone completed through the
    function's signature); None for any other `core`, or where its settings cannot be read."""
    if type(core) is _JITTED:
        return _compat.jit_static_arguments(core)
    if _is_nnx_jit(core):  # `nnx.jit` calls a `jax.jit` of its own with the user's static arguments
        return _compat.jit_static_arguments(getattr(core, "jitted_fn", None))
    return None


def bound_positional(core: Any, leaves: list[Any], treedef: jtu.PyTreeDef) -> tuple[Any, ...]:
    """The positional values bound in the call (rebuilt from `leaves`) where `core` calls a
    callable pytree (`()` otherwise, or where a node cannot be rebuilt from them)."""
    if core not in _PYTREE_CALLS:
        return ()
    try:
        return tuple(jtu.tree_unflatten(treedef, leaves)[0][0])
    except Exception:  # a node type that cannot be rebuilt from abstract leaves
        return ()


def user_function(core: Any, bound: Sequence[Any]) -> Any:
    """The function of the user's that `core` calls, for JAX's messages to point at: for a
    callable pytree, what it wraps (`eqx.filter_jit`) or its class's `__call__`."""
    if core not in _PYTREE_CALLS or not bound:
        return core
    fn = bound[0]
    if is_filter_jit(fn):
        fn = getattr(fn, "__wrapped__", fn)
    return fn if isinstance(fn, (types.FunctionType, types.MethodType)) else type(fn).__call__


def core_name(core: Any, bound: Sequence[Any]) -> str:
    """The name JAX shows for the program of `core`: the user's function, never one of
    treeshape's own (a callable pytree's wrapped function, or its class)."""
    if core in _PYTREE_CALLS and bound:
        fn = bound[0]
        core = getattr(fn, "__wrapped__", fn) if is_filter_jit(fn) else fn
        name = getattr(core, "__name__", None)
        if not isinstance(name, str):
            name = type(core).__name__
    else:
        name = getattr(core, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else "fn"


def split_callable(fn: Any) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """Write `fn` as `core(*bound, *args, **{**bound_kw, **kwargs})`.

    `bound`/`bound_kw` hold the callable's own state (a partial's arguments, a
    bound method's `self`, a callable pytree itself): passed to `core` as
    inputs, so a partial rebuilt on every call shares one cache entry and no
    tracer is ever closed over.
    """
    if type(fn) is types.FunctionType:
        return fn, (), {}
    if isinstance(fn, ft.partial):
        core, bound, bound_kw = split_callable(fn.func)
        return core, bound + tuple(fn.args), {**bound_kw, **fn.keywords}
    if type(fn) is types.MethodType:
        core, bound, bound_kw = split_callable(fn.__func__)
        return core, (*bound, fn.__self__), bound_kw
    if is_filter_jit(fn):
        return _call_filter_jit, (fn,), {}
    if _is_equinox_partial(fn) and is_filter_jit(fn.func):  # a method under `eqx.filter_jit`: `model.step`
        core, bound, bound_kw = split_callable(fn.func)
        return core, bound + tuple(fn.args), {**bound_kw, **fn.keywords}
    if not isinstance(fn, types.BuiltinFunctionType) and not jtu.treedef_is_leaf(jtu.tree_structure(fn)):
        # A callable pytree; one whose `__call__` is `@eqx.filter_jit` (an equinox module) is called
        # as that wrapper: its Python scalars in and out are static values.
        jitted = is_filter_jit(inspect.getattr_static(type(fn), "__call__", None))
        return (_call_filter_jit if jitted else _call_pytree), (fn,), {}
    return fn, (), {}


# -- inference -----------------------------------------------------------------
def input_path(leaves: list[Any], treedef: jtu.PyTreeDef, i: int) -> str:
    """Leaf `i` of the call as the user wrote it: `args[0]['w']`, `kwargs['n']`, or
    `the bound args[1]` for a value bound in a partial."""
    return call_path(jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, leaves))[0][i][0])


def call_path(keys: Sequence[Any]) -> str:
    """A place in the call `((bound args, bound kwargs), (args, kwargs))`, given by its keys,
    as the user wrote it: `args[0]['w']`, `kwargs['n']`, `the bound args[1]`."""
    bound, given = map(_nodes.key_name, keys[:2])
    return ("the bound " if bound == 0 else "") + ("args" if given == 0 else "kwargs") + jtu.keystr(tuple(keys[2:]))


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


def is_output_array(x: Any, kind: int, core: Any = None) -> bool:
    """Whether an output leaf is an array for JAX (the rest are kept as static leaves).
    `eqx.filter_jit` (`core`) returns a Python scalar as it is: a static value."""
    if kind == SCALAR:
        return core is not _call_filter_jit
    if kind == ARRAY or kind == DIM:
        return True
    if kind == NUMPY:
        return jax_dtype(x.dtype)
    return kind == OTHER and is_duck_array(x)


def _signature_target(core: Any, leaves: list[Any], treedef: jtu.PyTreeDef) -> tuple[Any, int, list[str]]:
    """The callable whose parameters name the call's arguments, how many of its leading
    parameters the bound positional values fill, and the names of those bound values
    that are not its parameters (a callable pytree itself: `self`; a function's
    `eqx.filter_jit` wrapper: `fn`)."""
    n_bound = len(treedef.children()[0].children()[0].children())
    bound = bound_positional(core, leaves, treedef)
    if not bound:
        return core, n_bound, []
    fn = bound[0]
    target = getattr(fn, "__wrapped__", fn) if is_filter_jit(fn) else fn
    if isinstance(target, types.FunctionType):  # an `eqx.filter_jit` of a function, maybe a method taking `self`
        return target, n_bound - 1, [_unique("fn", set(_parameter_names(target, positional_only=True)))]
    return target, n_bound - 1, ["self"]


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    return name


def program_signature(
    core: Any, leaves: list[Any], treedef: jtu.PyTreeDef, n_args: int, named: list[str]
) -> inspect.Signature:
    """The signature of a program called `program(*args, **named)` for `core`: its positional
    arguments by `core`'s own parameter names where it has them, so that JAX's messages
    name a leaf as `jax.jit(core)` names it (`state['params']['w']`), the rest as `args`,
    and the `named` values by their names (never clashing with a parameter of `core`
    called `args` or `kwargs`)."""
    target, n_bound, _ = _signature_target(core, leaves, treedef)
    names = _parameter_names(target, positional_only=True)[n_bound : n_bound + n_args]
    keyword_only = [n for n in named if n.isidentifier() and not keyword.iskeyword(n)]
    names = [n for n in itertools.takewhile(lambda n: n not in keyword_only, names)]
    taken = {*names, *named}
    P = inspect.Parameter
    parameters = [P(n, P.POSITIONAL_ONLY) for n in names]
    parameters.append(P(_unique("args", taken), P.VAR_POSITIONAL))
    parameters += [P(n, P.KEYWORD_ONLY) for n in keyword_only]
    parameters.append(P(_unique("kwargs", taken), P.VAR_KEYWORD))
    return inspect.Signature(parameters)


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
    params: list[str] = []
    if bound_td.num_leaves:
        target, n_bound, own = _signature_target(core, leaves, treedef)
        params = own + _parameter_names(target, positional_only=True)[: max(n_bound, 0)]
    names = [params[i] if i < len(params) else f"bound_{i}" for i in range(len(bound_td.children()))]
    names += list(bound_kw_td.node_data()[1])
    tds = bound_td.children() + bound_kw_td.children()
    if len(set(names)) < len(names) or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        names = [f"bound_{i}" for i in range(len(tds))]  # only if the user's names cannot be parameters
    bound = {name: group(td) for name, td in zip(names, tds, strict=True)}
    args = tuple(group(td) for td in args_td.children())
    kwargs = {key: group(td) for key, td in zip(kwargs_td.node_data()[1], kwargs_td.children(), strict=True)}
    return args, kwargs, bound


class Traceable(NamedTuple):
    """A call as one function that JAX traces, and the arguments to trace it with."""

    fn: Callable[..., Any]  # `fn(*args, **named)`
    args: tuple[Any, ...]
    named: dict[str, Any]  # the keyword arguments, then the bound values by name
    bound_names: list[str]  # the names the bound values are passed by, in their order


def traceable(
    core: Callable[..., Any],
    leaves: list[Any],
    abstract: list[bool],
    treedef: jtu.PyTreeDef,
    finish: Callable[[Any, Any], Any],
) -> Traceable:
    """The call `core(*bound, *args, **{**bound_kw, **kwargs})` (its leaves flattened by
    `treedef`) as a function of its abstract leaves (`abstract[i]`; the others are passed
    as they are), grouped as `dynamic_arguments` groups them: positional arguments as
    `*args`, keyword arguments and bound values by name. JAX's messages then name them as
    the user wrote them and point at the user's function (`__wrapped__`, `__signature__`).
    The function returns `finish(inputs, out)`: the call's inputs rebuilt from its
    arguments, `((bound, bound_kw), (args, kwargs))`, and `core`'s output."""
    args, kwargs, bound = dynamic_arguments(core, leaves, abstract, treedef)
    if set(bound) & set(kwargs):  # a keyword argument overriding a bound one: both are inputs
        bound = {f"bound_{i}": v for i, v in enumerate(bound.values())}
    order, keywords = list(bound), list(kwargs)

    def call(*args: Any, **named: Any) -> Any:
        it = iter(jtu.tree_leaves(([named[n] for n in order], args, {k: named[k] for k in keywords})))
        inputs = jtu.tree_unflatten(treedef, [next(it) if a else x for x, a in zip(leaves, abstract, strict=True)])
        (bound_args, bound_kw), (call_args, call_kw) = inputs
        return finish(inputs, core(*bound_args, *call_args, **{**bound_kw, **call_kw}))

    bound_args = bound_positional(core, leaves, treedef)
    call.__name__ = call.__qualname__ = core_name(core, bound_args)
    call.__wrapped__ = user_function(core, bound_args)  # type: ignore[attr-defined]
    call.__signature__ = program_signature(core, leaves, treedef, len(args), [*keywords, *order])  # type: ignore[attr-defined]
    return Traceable(call, args, {**kwargs, **bound}, order)


_CONCRETIZATION_ERRORS = (
    jax.errors.ConcretizationTypeError,  # also TracerBoolConversionError
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerArrayConversionError,
)


def _needed_concrete(error: BaseException) -> bool:
    """Whether `fn` failed because it needed a concrete value and got a tracer."""
    return isinstance(error, _CONCRETIZATION_ERRORS) or _compat.is_traced_shape_error(error)


def note_abstract_scalars(
    error: BaseException,
    core: Callable[..., Any],
    leaves: list[Any],
    abstract: list[bool],
    treedef: jtu.PyTreeDef,
    who: str = "out_structure",
) -> None:
    """When `fn` needed a concrete value and got a tracer, name the Python scalars of the
    call (`leaves`, bound first, flattened by `treedef`) that were passed abstractly, and
    say how to keep them concrete, as a call of `ts.{who}`. A jit wrapper's own arguments
    are left to JAX's message, which names its `static_argnums`."""
    if not _needed_concrete(error) or is_jit_wrapper(core):
        return
    n_leaves = treedef.children()[0].num_leaves
    target, n_bound, _ = _signature_target(core, leaves, treedef)
    call_treedef, leaves, abstract = treedef.children()[1], leaves[n_leaves:], abstract[n_leaves:]
    scalars = [i for i, (x, a) in enumerate(zip(leaves, abstract, strict=True)) if a and kind_of(type(x)) == SCALAR]
    if not scalars:
        return
    flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(call_treedef, leaves))
    named, bind = [], []
    params = _parameter_names(target)
    for i in scalars:
        keys = flat[i][0]
        root = "args" if _nodes.key_name(keys[0]) == 0 else "kwargs"
        named.append(f"{root}{jtu.keystr(tuple(keys[1:]))} = {leaves[i]!r}")
        where = _nodes.key_name(keys[1]) if len(keys) == 2 else None  # a keyword's name, or a position
        if where is not None and root == "kwargs":
            bind.append(f"{where}={leaves[i]!r}")
        elif where is not None and n_bound + where < len(params):
            bind.append(f"{params[n_bound + where]}={leaves[i]!r}")
    name = "fn" if core in _PYTREE_CALLS else core_name(core, ())
    example = ", ".join(bind) if len(bind) == len(scalars) else "name=value"
    error.add_note(
        f"treeshape: Python scalars are abstract inputs (traced, like arrays): {', '.join(named)}. If {name} "
        "needs one as a Python value (a size, a flag, a loop count), bind it so that it stays concrete: "
        f"`ts.{who}(functools.partial({name}, {example}), ...)` without it, or pass a jitted function "
        f"that marks it static: `jax.jit({name}, static_argnames=...)`."
    )


def _parameter_names(fn: Any, positional_only: bool = False) -> list[str]:
    """The names of `fn`'s leading parameters that can be passed by keyword (and, with
    `positional_only`, those that cannot)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    names = []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, *([inspect.Parameter.POSITIONAL_ONLY] if positional_only else []))
    for p in parameters:
        if p.kind not in kinds:
            break
        names.append(p.name)
    return names


# The bound part of a call that binds nothing.
EMPTY_BOUND: Final = jtu.tree_structure(((), {}))
_JITTED: type = type(jax.jit(lambda: None))


def is_jax_jit(core: Any) -> bool:
    """Whether the split call's `core` is a `jax.jit` wrapper (its options are its own)."""
    return type(core) is _JITTED


def filter_jit_wrapper(leaves: list[Any], treedef: jtu.PyTreeDef) -> Any:
    """The `eqx.filter_jit` wrapper a call calls (`ts.cost(eqx.filter_jit(model), x)`), its
    first bound value rebuilt from `leaves`; None for any other call."""
    bound = bound_positional(_call_filter_jit, leaves, treedef)
    return bound[0] if bound and is_filter_jit(bound[0]) else None


def check_callable(fn: Any, fn_name: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"treeshape.{fn_name}: `fn` must be callable, got {type(fn).__name__} {fn!r}. "
            f"Pass the function first and its arguments after it: `ts.{fn_name}(f, x)`."
        )


def check_donation(donate_argnums: Any, donate_argnames: Any, fn_name: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """`donate_argnums` and `donate_argnames` as `jax.jit` takes them (an int or ints, a str
    or strs; `None` for none), as tuples; a `TypeError` naming the parameter for anything
    else (a float, a bool, a str among the positions), before anything is traced."""
    return (
        _donated(donate_argnums, "donate_argnums", "int", fn_name, "positions of the arguments to donate, e.g. 0"),
        _donated(donate_argnames, "donate_argnames", "str", fn_name, "names of the arguments to donate, e.g. 'state'"),
    )


def _donated(value: Any, what: str, kind: str, fn_name: str, example: str) -> tuple[Any, ...]:
    def fits(x: Any) -> bool:
        if kind == "str":
            return isinstance(x, str)
        return not isinstance(x, bool) and hasattr(type(x), "__index__")  # ints, NumPy's too

    if value is None:
        return ()
    if fits(value):
        return (value.__index__(),) if kind == "int" else (value,)
    items = None
    if not isinstance(value, (str, bytes)):
        try:
            items = tuple(value)
        except TypeError:
            items = None
    bad = [x for x in items if not fits(x)] if items is not None else [value]
    if items is None or bad:
        inner = "" if items is None else f" ({bad[0]!r} is a {type(bad[0]).__name__})"
        raise TypeError(
            f"treeshape.{fn_name}: {what} must be {'an' if kind == 'int' else 'a'} {kind} or a sequence of {kind}s "
            f"({example}), as for jax.jit; got "
            f"{type(value).__name__} {value!r}{inner}."
        )
    return tuple(x.__index__() for x in items) if kind == "int" else items


class Call(NamedTuple):
    """A call `fn(*args, **kwargs)` split as `core(*bound, *args, **{**bound_kw, **kwargs})`, flattened."""

    core: Callable[..., Any]
    bound_leaves: list[Any]
    bound_treedef: jtu.PyTreeDef
    call_leaves: list[Any]
    call_treedef: jtu.PyTreeDef
    types: frozenset[type] | None = None  # its leaves' types, found once (`leaf_types`)

    def leaf_types(self) -> frozenset[type]:
        """The types of its leaves, bound and given: one C-level pass per call, which every
        check that depends on them asks (a `Structure` among them, a `ShapeDtypeStruct`,
        only arrays) instead of a walk of its own."""
        if self.types is not None:
            return self.types
        return frozenset(map(type, self.call_leaves)).union(map(type, self.bound_leaves))

    def concrete_scalars(self) -> bool | tuple[bool, ...]:
        """Whether the Python scalars among the call's leaves (not the bound ones, which
        always are) are passed to `core` concrete, and so keyed by value: none for a plain
        function (JAX traces them); every one for an `eqx.filter_jit` wrapper, which makes
        every leaf that is not an array static; for a `jax.jit` or `nnx.jit` wrapper, those
        of the arguments it makes static (per leaf), the rest abstract as that jit makes
        them (every one where its settings cannot be read: it abstracts the others itself)."""
        core = self.core
        if core is _call_filter_jit:
            return True
        if type(core) is types.FunctionType or (type(core) is not _JITTED and not _is_nnx_jit(core)):
            return False
        static = static_arguments(core)
        if static is None:
            return True
        numbers, names = static
        args_td, kwargs_td = self.call_treedef.children()
        first = len(self.bound_treedef.children()[0].children())  # the bound positional values come first
        n_positional = first + len(args_td.children())
        numbers = frozenset(i % n_positional if i < 0 else i for i in numbers) if n_positional else numbers
        mask: list[bool] = []
        for i, td in enumerate(args_td.children()):
            mask += [first + i in numbers] * td.num_leaves
        for name, td in zip(kwargs_td.node_data()[1], kwargs_td.children(), strict=True):
            mask += [name in names] * td.num_leaves
        return tuple(mask)

    def concrete(self) -> list[bool]:
        """Per leaf, bound first, whether a Python scalar there is passed concrete."""
        given = self.concrete_scalars()
        return [True] * len(self.bound_leaves) + (
            [given] * len(self.call_leaves) if isinstance(given, bool) else list(given)
        )

    @property
    def treedef(self) -> jtu.PyTreeDef:
        return jtu.treedef_tuple((self.bound_treedef, self.call_treedef))


def split_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], who: str = "out_structure"
) -> Call:
    core, bound, bound_kw = (fn, (), {}) if type(fn) is types.FunctionType else split_callable(fn)
    reached: set[type] = set()
    if not walk_call([args, kwargs, bound, bound_kw], reached):  # one walk; then name the part
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
        bound_leaves, bound_treedef = [], EMPTY_BOUND
    call_leaves, call_treedef = flatten((args, kwargs), who, "the arguments", checked=True)
    found = walked_leaf_types(reached)  # (a model's parameters and batch: no pass over the leaves)
    if found is None:
        found = frozenset(map(type, call_leaves)).union(map(type, bound_leaves))
    # (`Call(...)` without its Python-level `__new__`: built on every call, hits included)
    return _new_call(Call, (core, bound_leaves, bound_treedef, call_leaves, call_treedef, found))


_new_call: Final = tuple.__new__


def _is_structure(x: Any) -> bool:
    return isinstance(x, Structure)


def with_trees(call: Call) -> Call:
    """`call` with every `Structure` among its leaves (arguments or bound values) replaced
    by the pytree of `ShapeDtypeStruct`s it describes (`s.tree`)."""
    if Structure not in call.leaf_types():
        return call
    bound = jtu.tree_unflatten(call.bound_treedef, call.bound_leaves)
    args = jtu.tree_unflatten(call.call_treedef, call.call_leaves)
    bound, args = jtu.tree_map(lambda x: x.tree if _is_structure(x) else x, (bound, args), is_leaf=_is_structure)
    bound_leaves, bound_treedef = jtu.tree_flatten(bound)
    call_leaves, call_treedef = jtu.tree_flatten(args)
    found = Call(call.core, bound_leaves, bound_treedef, call_leaves, call_treedef)
    return found._replace(types=found.leaf_types())
