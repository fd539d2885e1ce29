"""`out_structure` (one abstract evaluation, cached) and `structure_of` (read without tracing)."""

import builtins
import functools as ft
import gc
import types
from collections.abc import Callable
from typing import Any, Final

import jax
import jax.tree_util as jtu
import numpy as np

from . import _cache, _compat, _sharding, _tree
from ._cache import CACHE, has_value
from ._call import (
    EMPTY_BOUND,
    Call,
    abstract_inputs,
    check_callable,
    check_inputs,
    check_splits,
    is_abstract,
    is_jax_jit,
    is_output_array,
    note_abstract_scalars,
    split_call,
    split_callable,
    traceable,
    with_trees,
)
from ._leaf import ARRAY_TYPES, kind_of
from ._structure import PyTree, Structure, read_structure


def _evaluate(call: Call, close_bound: bool = False) -> Structure:
    """Abstractly evaluate the call (one `jax.eval_shape` trace).

    Python scalars are passed concrete where `Call.concrete` says, and with
    `close_bound` so are the bound arrays and tracers (closed over, as
    `jax.eval_shape` of the partial itself passes them).
    """
    core, treedef, n_bound = call.core, call.treedef, len(call.bound_leaves)
    leaves = abstract_inputs(call.bound_leaves + call.call_leaves, treedef)
    abstract = [
        is_abstract(x, concrete) and not (close_bound and i < n_bound and has_value(x))
        for i, (x, concrete) in enumerate(zip(leaves, call.concrete(), strict=True))
    ]
    check_inputs(leaves, abstract, treedef)
    if is_jax_jit(core) and not n_bound and call.bound_treedef == EMPTY_BOUND:
        # A jitted function on its own: exactly `jax.eval_shape`, which asks the
        # jitted function for its output info (so its `out_shardings` show).
        (args, kwargs) = jtu.tree_unflatten(treedef, leaves)[1]
        out = jax.eval_shape(core, *args, **kwargs)
        out_leaves, out_treedef = jtu.tree_flatten(out)
        return Structure(out_treedef, tuple(out_leaves))
    out_info: list[Any] = []

    def described(inputs: Any, out: Any) -> list[Any]:
        out_leaves, out_treedef = jtu.tree_flatten(out)
        traced_out = []
        descriptions: list[Any] = []
        for x in out_leaves:
            if is_output_array(x, kind_of(type(x)), core):
                descriptions.append(_TRACED)
                traced_out.append(x)
            else:  # a ShapeDtypeStruct describes itself; other leaves are static
                descriptions.append(x)
        # Checked while the trace is alive, and nothing that holds a tracer is
        # kept: it must not outlive the trace (the leak checker would see it).
        escapes = _tracer_escapes(out, out_treedef, descriptions)
        out_info[:] = [escapes] if escapes else [out_treedef, descriptions]
        return [] if escapes else traced_out

    traced = traceable(core, leaves, abstract, treedef, described)
    try:
        shapes = iter(jax.eval_shape(traced.fn, *traced.args, **traced.named))
    except Exception as e:
        if isinstance(e, TypeError):  # JAX's concretization errors are TypeErrors
            note_abstract_scalars(e, core, leaves, abstract, treedef)
        raise
    if len(out_info) == 1:
        _raise_escapes(out_info[0])
    out_treedef, descriptions = out_info
    return Structure(out_treedef, tuple(next(shapes) if d is _TRACED else d for d in descriptions))


_TRACED = object()


# -- tracers hidden in outputs ---------------------------------------------------
_LIMIT: Final = 10_000
_BUILTINS: Final = vars(builtins)
_OPAQUE: Final = (str, bytes, int, float, complex, type, types.ModuleType, types.CodeType, np.ndarray, jax.Array)


def _holds_tracer(x: Any) -> bool | None:
    """Whether a tracer is reachable from `x` (an attribute, a closure cell, a
    generator frame, a container...): True, False, or None when `x` reaches
    more objects than can be searched."""
    seen: set[int] = set()
    stack = [x]
    while stack:
        obj = stack.pop()
        if isinstance(obj, jax.core.Tracer):
            return True
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        if type(obj) is dict and ("__builtins__" in obj or obj is _BUILTINS):  # a module's globals
            continue
        seen.add(id(obj))
        if len(seen) > _LIMIT:
            return None
        stack.extend(gc.get_referents(obj))
    return False


def _tracer_escapes(out: Any, treedef: jtu.PyTreeDef, descriptions: list[Any], root: str = "") -> list[str]:
    """Where a static leaf or node data of `out` holds a tracer (an attribute, a
    closure cell, a generator frame...), which would escape the trace. Paths are
    printed under `root` (`""`: the output of `fn`)."""
    suspects = [
        i
        for i, d in enumerate(descriptions)
        if d is not _TRACED and not isinstance(d, jax.ShapeDtypeStruct) and not _tree.is_plain(d)
    ]
    found = [i for i in suspects if _holds_tracer(descriptions[i])]
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
        if _holds_tracer(aux)
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


def out_structure(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Structure:
    """Infer the structure of `fn(*args, **kwargs)` without running it.

    One `jax.eval_shape` (no FLOPs, no device memory, no compilation), safe at
    top level and under every JAX transformation, also with closures and
    partials over tracers: no tracer escapes, and the result describes the
    values as seen at that level (under `vmap`, per-example shapes).

    Arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy arrays, duck arrays and
    Python scalars are abstract inputs, typed as JAX types them; a
    [treeshape.Structure][] stands for its tree; other leaves are passed to
    `fn` unchanged (static). A jit wrapper (`jax.jit`, `nnx.jit`,
    `eqx.filter_jit`) gets its static arguments as values, so they work.

    Answers are cached ([the cache](../guide/caching.md#the-cache): what the key holds,
    what is never held); a function that reads mutable global state needs
    [treeshape.clear_cache][] after that state changes.

    Args:
        fn: Any callable: a function, lambda or closure, `functools.partial`,
            `jax.tree_util.Partial`, bound method, `jax.jit`-wrapped function
            or callable pytree.
        *args: Pytrees of arrays, tracers, `jax.ShapeDtypeStruct`s, NumPy or
            Python scalars, or static values; or Structures.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Structure][]: the output treedef and, per output leaf,
        a `jax.ShapeDtypeStruct` (Python scalars become weak arrays) or the
        static value itself.

    Raises:
        TypeError: `fn` is not callable, or a static output leaf (an object,
            a closure, a generator) holds a tracer, which would escape.
        OverflowError: a Python int argument does not fit JAX's int type.

    Errors raised by `fn` itself propagate unchanged.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> import treeshape as ts
        >>> def predict(params, x):
        ...     return params["w"] @ x + params["b"]
        >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
        >>> ts.clear_cache()
        >>> ts.out_structure(predict, params, jnp.zeros(3))
        Structure(f32[2], 1 leaf, 8 B)
        >>> _ = ts.out_structure(predict, params, jax.ShapeDtypeStruct((3,), jnp.float32))
        >>> ts.cache_info().hits  # the same abstract input: answered from the cache
        1
    """
    if not callable(fn):
        check_callable(fn, "out_structure")
    call = split_call(fn, args, kwargs)
    concrete: bool | tuple[bool, ...] = False
    types = call.types or call.leaf_types()  # (found once by `split_call`)
    if not types <= ARRAY_TYPES:  # (else a model's parameters and batch: no Structure, no scalar)
        if Structure in types:
            call = with_trees(call)
            types = call.leaf_types()
        if jax.ShapeDtypeStruct in types:
            check_splits([*call.bound_leaves, *call.call_leaves], call.treedef, "out_structure")
        concrete = call.concrete_scalars()
    key = _cache.call_key(call, concrete_scalars=concrete)
    # (the call's treedef is built only on a miss, by `_evaluate`: a hit needs none)
    found = CACHE.get(key)
    if type(found) is Structure:  # a hit: no evaluation to prepare
        structure = found
    else:
        structure, _ = _cache.answer(CACHE, key, call.bound_leaves, ft.partial(_evaluate, call), found)
    if not structure._sharded():  # (most answers: nothing to place)
        return structure
    return _with_call_meshes(structure, fn, call.call_leaves)


def _with_call_meshes(structure: Structure, fn: Any, call_leaves: list[Any]) -> Structure:
    """At top level, a copy of `structure` that knows the concrete meshes of the call's
    arguments (and of the `jax.set_mesh` mesh), when some output sharding names an
    abstract mesh: `zeros()` places those leaves there. The cached entry is never changed:
    one entry answers calls on different concrete meshes with the same abstract mesh."""
    if not _compat.at_top_level():
        return structure
    if not structure._memo("abstract_mesh", lambda: _sharding.has_abstract_mesh(structure)):
        return structure
    _, bound, bound_kw = split_callable(fn)
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

    Raises:
        TypeError: under a transformation, a static leaf or node data holds a
            tracer, which would escape.

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
