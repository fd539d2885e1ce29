"""The program `ts.cost` compiles: the one the user's own jit compiles for the call's
abstract inputs, traced, lowered and compiled in one place (`compile_program`).

A `jax.jit` wrapper is traced by itself (its donation, static arguments and shardings).
Otherwise `_program` is jitted: `fn` as a function of the abstract leaves (static ones
closed over, as `out_structure` passes them), named as the user wrote the inputs so that
JAX's messages name them, returning the state of the flax.nnx objects among its inputs
after the call (a step that updates them in place, as `nnx.jit` makes that state
outputs) and then the output's arrays; the donation of jitted wrappers it calls
(`eqx.filter_jit`, `nnx.jit`) is added to `cost`'s (`donated_leaves` reads `cost`'s own,
as `jax.jit` maps it). Shardings over an abstract mesh are placed on a concrete mesh, or,
for a mesh larger than this process, kept and compiled by `_simulate`. A value XLA's
64-bit sizes cannot hold is refused before XLA sees it (`_refuse_too_large`).

Under a transformation (`jit`, `vmap`, `grad`, a loop body), the program is first traced
alone with `jax.make_jaxpr`; every constant of that trace that is a tracer of an enclosing
transformation (a value closed over by `fn`) becomes an argument of the compiled program,
of the type it has at this level (per example under `vmap`), and the other constants
(concrete arrays a closure holds) stay constants, as `jax.jit` makes them. So no function
that closes over a tracer is ever lowered. `jax.closure_convert` is not used for this: it
hoists only the values that may carry a derivative (so not an integer tracer, nor a value
batched by `vmap` at top level), and it keeps each function it converts, with the values
it closes over, in an LRU cache of 4096 entries while tracer-leak checking is off. Inside
`shard_map`, that trace is replayed as one device's program (`_per_device`).
"""

import contextlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.tree_util as jtu

from .. import _compat, _nodes, _quiet, _sharding
from .._cache import has_value
from .._call import (
    Call,
    call_path,
    filter_jit_wrapper,
    input_path,
    is_jax_jit,
    is_jit_wrapper,
    is_output_array,
    pmap_name,
    traceable,
)
from .._leaf import ARRAY, NUMPY, SDS, kind_of, leaf_str
from .._shapes import extent_problem
from . import _compiles, _deviceless, _simulate, _target
from ._ops import AS_WRITTEN, OpNames
from ._per_device import (
    in_shard_map,
    inner_jaxprs,
    local,
    local_mesh,
    manual_axes_dropped,
    on_one_device,
    refuse_collectives,
    too_few_devices,
)


# -- donation ----------------------------------------------------------------------------
def _index_tuple(value: Any, what: str, kind: type, who: str) -> tuple[Any, ...]:
    items: tuple[Any, ...] = (value,) if isinstance(value, kind) else tuple(value)
    if not all(isinstance(item, kind) and not isinstance(item, bool) for item in items):
        raise TypeError(f"treeshape.{who}: {what} must be {kind.__name__}s, got {value!r}")
    return items


def donated_leaves(
    fn: Any, call: Call, n_args: int, donate_argnums: Any, donate_argnames: Any, who: str
) -> frozenset[int]:
    """The positions (among all the call's leaves, bound ones first) of the donated leaves.

    `donate_argnums` index the positional arguments (a negative index donates nothing, as
    `jax.jit` ignores it); `donate_argnames` name keyword arguments or, through `fn`'s
    signature, positional ones (also when both are given: `jax.jit` then applies the
    names to keyword arguments only)."""
    numbers = _index_tuple(donate_argnums, "donate_argnums", int, who)
    names = _index_tuple(donate_argnames, "donate_argnames", str, who)
    if not numbers and not names:
        return frozenset()
    args_td, kwargs_td = call.call_treedef.children()
    keywords = list(kwargs_td.node_data()[1]) if kwargs_td.node_data() else []
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    positions: set[int] = set()
    donated_keywords: set[str] = set()
    for n in numbers:
        if n < 0:  # `jax.jit` ignores a negative index (jax 0.8-0.10): nothing donated, as it compiles
            continue
        if n < n_args:
            positions.add(n)
        elif 0 <= n < len(positional) and positional[n] in keywords:  # passed by keyword, as `jax.jit` maps it
            donated_keywords.add(positional[n])
        else:
            passed = f" ({', '.join(keywords)} by keyword)" if keywords else ""
            raise ValueError(
                f"treeshape.{who}: donate_argnums has {n}, but fn is called with {n_args} positional "
                f"arguments{passed}. Give the position of an argument passed by position, or of a parameter of "
                "fn passed by keyword, or name it in donate_argnames."
            )
    if names:
        open_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters) or not parameters
        for name in names:
            if name in keywords:
                donated_keywords.add(name)
            elif name in positional and positional.index(name) < n_args:
                positions.add(positional.index(name))
            elif name not in positional and not open_keywords and all(p.name != name for p in parameters):
                raise ValueError(f"treeshape.{who}: donate_argnames has {name!r}, which is no parameter of fn")
    start = len(call.bound_leaves)
    donated: set[int] = set()
    for i, td in enumerate(args_td.children()):
        if i in positions:
            donated.update(range(start, start + td.num_leaves))
        start += td.num_leaves
    for name, td in zip(keywords, kwargs_td.children(), strict=True):
        if name in donated_keywords:
            donated.update(range(start, start + td.num_leaves))
        start += td.num_leaves
    return frozenset(donated)


# -- abstract meshes -------------------------------------------------------------------
def _on_concrete_meshes(values: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef) -> tuple[list[Any], Any]:
    """The leaves with every sharding over an abstract mesh placed on a concrete mesh of
    the same axes: the `jax.set_mesh` mesh or one of the call's own (as `zeros()` places
    them), else a mesh of this process's devices (`local_mesh`); and that last mesh, if
    one was made and the `jax.set_mesh` mesh has other axes (it is then set instead while
    the program is traced: JAX refuses values on a mesh other than the one set)."""
    meshes: tuple[Any, ...] | None = None
    out = list(values)
    local = None
    for i, (x, a) in enumerate(zip(values, abstract, strict=True)):
        if not (a and kind_of(type(x)) == SDS and _sharding.abstract_mesh_of(x.sharding) is not None):
            continue
        if meshes is None:
            meshes = _sharding.concrete_meshes([values])
        sharding = _sharding.resolved(x.sharding, meshes)
        if sharding is None:
            mesh = local_mesh(x.sharding.mesh)
            if mesh is None:  # more devices than this process has
                raise too_few_devices(x.sharding.mesh, len(jax.devices()), input_path(values, treedef, i))
            sharding = jax.sharding.NamedSharding(mesh, x.sharding.spec, memory_kind=x.sharding.memory_kind)
            local = local or mesh
        out[i] = x.update(sharding=sharding)
    current = _compat.current_mesh()
    return out, None if local is None or current.empty or _sharding.same_axes(current, local) else local


def _far_mesh(leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef) -> Any:
    """The abstract mesh the inputs are sharded over when it has more devices than this
    process (the program is then compiled for simulated devices), else None."""
    for i, (x, a) in enumerate(zip(leaves, abstract, strict=True)):
        sharding = getattr(x, "sharding", None) if a else None
        mesh = getattr(sharding, "mesh", None)
        if isinstance(mesh, jax.sharding.AbstractMesh) and mesh.size > len(jax.devices()):
            _simulate.check_devices(mesh.size, input_path(leaves, treedef, i))
            return mesh
    return None


# -- the program ---------------------------------------------------------------------
_Arg = tuple[str, Any]  # an argument of the program: ("args", position) or ("named", name)


class _Program(NamedTuple):
    """`core` as the function `jax.jit` traces, with its arguments."""

    fn: Callable[..., list[Any]]
    args: tuple[Any, ...]
    named: dict[str, Any]
    owners: list[_Arg]  # the argument each of its flat inputs belongs to, in JAX's order
    paths: list[str]  # each flat input's path, as the user names it (`args[0].encoder.weight`)
    output_paths: list[str]  # each output's path (`out[1]['w']`), once traced
    output_tree: list[jtu.PyTreeDef]  # the structure `core` returns, once traced


def _program(core: Callable[..., Any], values: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef) -> _Program:
    """`core` as a function of the call's abstract leaves grouped as the call was written:
    positional arguments as `*args`, keyword arguments and bound values by name, so that
    JAX's messages name them as the user wrote them (`args[0]['w']`, `state['params']`),
    and point at `core`. It returns, as `nnx.jit` makes them outputs, the state of the
    flax.nnx objects among the inputs after the call (`core` may update them in place:
    `opt.update(model, grads)`), then the array leaves of `core`'s output. The objects
    passed in are never changed: the program updates the copies it rebuilds from the
    leaves."""
    output_paths: list[str] = []  # filled when traced
    output_tree: list[jtu.PyTreeDef] = []

    def outputs(inputs: Any, out: Any) -> list[Any]:
        state = [(keys, x) for keys, x in jtu.tree_flatten_with_path(inputs, is_leaf=_is_nnx)[0] if _is_nnx(x)]
        found, paths = _outputs(state, out, core)
        output_paths[:] = paths
        output_tree[:] = [jtu.tree_structure(out)]
        return found

    program = traceable(core, values, abstract, treedef, outputs)
    owners: list[_Arg] = [
        ("args" if _nodes.key_name(path[0]) == 0 else "named", _nodes.key_name(path[1]))
        for path, _ in jtu.tree_flatten_with_path((program.args, program.named))[0]
    ]
    paths = _input_paths(values, abstract, treedef, owners, program.bound_names)
    return _Program(program.fn, program.args, program.named, owners, paths, output_paths, output_tree)


def _input_paths(
    values: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef, owners: list[_Arg], bound: list[str]
) -> list[str]:
    """Each flat input of the program by the path of its leaf in the call, through every
    node type (an argument's tree may be passed to the program as a list of its leaves):
    `args[0].encoder.weight`, `kwargs['x']`, a bound value by its parameter name."""
    queues: dict[_Arg, list[str]] = {}
    n_bound_args = len(treedef.children()[0].children()[0].children())
    wrapped = _filter_jit_paths(values, treedef)
    for (keys, _), a in zip(jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, values))[0], abstract, strict=True):
        if not a:
            continue
        given, positional, where = _nodes.key_name(keys[0]), _nodes.key_name(keys[1]), _nodes.key_name(keys[2])
        rest = jtu.keystr(tuple(keys[3:]))
        if wrapped and (given, positional, where) == (0, 0, 0):
            rest = wrapped.pop(0)
        elif (given, positional, where) == (0, 0, 0) and keys[3:4] == (_nodes.WRAPPED_KEY,):
            rest = jtu.keystr(tuple(keys[4:]))  # a wrapper's child, the function it wraps (`ts.watch(model)`)
        if given == 1:
            owner: _Arg = ("args", where) if positional == 0 else ("named", where)
            root = f"args[{where}]" if positional == 0 else f"kwargs[{where!r}]"
        else:
            name = bound[where if positional == 0 else n_bound_args + list(_bound_keywords(treedef)).index(where)]
            owner, root = ("named", name), name
        queues.setdefault(owner, []).append(root + rest)
    return [queues[owner].pop(0) for owner in owners]


def _filter_jit_paths(values: list[Any], treedef: jtu.PyTreeDef) -> list[str]:
    """Where an `eqx.filter_jit` wrapper is called (`ts.cost(eqx.filter_jit(model), x)`),
    the paths in the function it wraps of its arrays, which the wrapper holds as a flat
    list (in that order); else `[]`."""
    wrapper = filter_jit_wrapper(values, treedef)
    if wrapper is None:
        return []
    try:
        flat = jtu.tree_flatten_with_path(wrapper.__wrapped__)[0]
    except Exception:  # the wrapped function cannot be rebuilt from abstract leaves
        return []
    paths = [jtu.keystr(tuple(keys)) for keys, x in flat if kind_of(type(x)) in (ARRAY, SDS, NUMPY)]
    n = sum(kind_of(type(x)) in (ARRAY, SDS, NUMPY) for x in jtu.tree_leaves(wrapper))
    return paths if len(paths) == n else []


def _bound_keywords(treedef: jtu.PyTreeDef) -> tuple[str, ...]:
    data = treedef.children()[0].children()[1].node_data()
    return tuple(data[1]) if data else ()


def _lowering_argument(x: Any) -> Any:
    """An abstract leaf as `jax.jit(...).trace` takes it: a tracer by its type at this
    level, anything else as it is (arrays keep their placement, scalars are weak)."""
    if isinstance(x, jax.core.Tracer):
        return _compat.from_aval(jax.typeof(x))
    return x


def _outputs(state: list[tuple[Any, Any]], out: Any, core: Any) -> tuple[list[Any], list[str]]:
    """The program's outputs as `nnx.jit` orders them (the inputs' flax.nnx objects, then
    the output; XLA's buffer plan follows the order), each nnx `Variable` once (an object
    both updated and returned is one output, as `nnx.jit` shares it), and their paths: an
    input's state by the input's path (`args[0].kernel`), the output by `out` and its path."""
    roots = [call_path(keys) for keys, _ in state]
    seen: set[int] = set()
    found: list[Any] = []
    paths: list[str] = []
    flat = jtu.tree_flatten_with_path(([x for _, x in state], out), is_leaf=_is_variable)[0]
    for keys, x in flat:
        where = (
            roots[_nodes.key_name(keys[1])] + jtu.keystr(keys[2:])
            if _nodes.key_name(keys[0]) == 0
            else "out" + jtu.keystr(keys[1:])
        )
        if _is_variable(x):
            if id(x) not in seen:
                seen.add(id(x))
                for sub, y in jtu.tree_flatten_with_path(x)[0]:
                    if is_output_array(y, kind_of(type(y)), core):
                        found.append(y)
                        paths.append(where + jtu.keystr(sub))
        elif is_output_array(x, kind_of(type(x)), core):
            found.append(x)
            paths.append(where)
    return found, paths


def _is_nnx(x: Any) -> bool:
    return _nodes.kind(type(x)) in (_nodes.NNX, _nodes.NNX_VARIABLE)


def _is_variable(x: Any) -> bool:
    return _nodes.kind(type(x)) == _nodes.NNX_VARIABLE


def _donated_arguments(donated: frozenset[int], treedef: jtu.PyTreeDef, kwarg_names: list[str]) -> set[_Arg]:
    """The program's arguments holding the donated leaves (`cost` donates whole arguments)."""
    (bound_td, bound_kw_td), (args_td, kwargs_td) = (td.children() for td in treedef.children())
    start = bound_td.num_leaves + bound_kw_td.num_leaves
    found: set[_Arg] = set()
    for owner, td in [(("args", i), td) for i, td in enumerate(args_td.children())] + [
        (("named", k), td) for k, td in zip(kwarg_names, kwargs_td.children(), strict=True)
    ]:
        if donated & set(range(start, start + td.num_leaves)):
            found.add(owner)
        start += td.num_leaves
    return found


def _jit(program: _Program, donated: set[_Arg]) -> Any:
    return jax.jit(
        program.fn,
        donate_argnums=sorted(i for kind, i in donated if kind == "args"),
        donate_argnames=sorted(n for kind, n in donated if kind == "named"),
    )


def _inner_donations(jaxpr: Any, owners: list[_Arg]) -> set[_Arg]:
    """The arguments that a jitted function called by the program donates (a `jax.jit`,
    `eqx.filter_jit` or `nnx.jit` wrapper): as the program that wrapper compiles."""
    position = {id(v): i for i, v in enumerate(jaxpr.jaxpr.invars)}
    found: set[_Arg] = set()
    for eqn in jaxpr.jaxpr.eqns:
        for v, donated in zip(eqn.invars, eqn.params.get("donated_invars", ()), strict=False):
            if donated and id(v) in position:
                found.add(owners[position[id(v)]])
    return found


def _hoist_tracers(program: _Program, donated: set[_Arg]) -> tuple[Any, list[Any]]:
    """The jitted program with the tracers it closes over as extra trailing arguments, and
    its flat arguments.

    One trace of `program` (`jax.make_jaxpr`); the returned function replays it, so no
    tracer of an enclosing transformation reaches the lowering. Concrete constants stay
    constants of the program."""
    closed = jax.make_jaxpr(program.fn)(*program.args, **program.named)
    donated = donated | _inner_donations(closed, program.owners)
    per_device = in_shard_map()
    if per_device:
        refuse_collectives(closed.jaxpr, set(jax.sharding.get_abstract_mesh().manual_axes))
    hoist = [isinstance(c, jax.core.Tracer) for c in closed.consts]
    kept = [c for c, h in zip(closed.consts, hoist, strict=True) if not h]
    types = [_compat.from_aval(jax.typeof(c)) for c, h in zip(closed.consts, hoist, strict=True) if h]
    jaxpr, out_types = closed.jaxpr, closed.out_avals
    n_args = len(program.owners)
    del closed  # it holds the tracers

    def converted(*flat: Any) -> list[Any]:
        extra, constants = iter(flat[n_args:]), iter(kept)
        values = [next(extra) if h else next(constants) for h in hoist]
        return jax.core.eval_jaxpr(jaxpr, values, *flat[:n_args])

    converted.__name__ = converted.__qualname__ = program.fn.__name__
    donate = [i for i, owner in enumerate(program.owners) if owner in donated]
    flat = [*(_lowering_argument(x) for x in jtu.tree_leaves((program.args, program.named))), *types]
    if per_device:
        return jax.jit(on_one_device(converted, flat, out_types), donate_argnums=donate), [local(x) for x in flat]
    return jax.jit(converted, donate_argnums=donate), flat


# -- trace, lower, compile ------------------------------------------------------------
class Analyses(NamedTuple):
    """What XLA says of a compiled program, each analysis asked once, where it compiled."""

    cost: dict[str, Any]  # `_compat.cost_analysis`: `flops`, `bytes accessed`, ...
    memory: dict[str, Any]  # `_compat.memory_analysis`: the bytes, the buffer assignment, the live ranges

    @classmethod
    def of(cls, compiled: Any, quiet: bool) -> "Analyses":
        """`compiled`'s analyses; `quiet`: a target's compiler's, its log lines kept quiet."""
        with _quiet.quiet() if quiet else contextlib.nullcontext():
            return cls(_compat.cost_analysis(compiled), _compat.memory_analysis(compiled))


class Compiled(NamedTuple):
    """A compiled program, and what `_cost` needs to read its figures."""

    compiled: Any  # a `jax.stages.Compiled`, or `_simulate.Simulated` for a far mesh
    analyses: Analyses  # XLA's analyses of `compiled`, read once
    argument_paths: list[str | None]  # each argument's input path (None: a value closed over)
    output_paths: list[str]  # each output's `out` path
    donated: frozenset[int]  # the positions of the donated arguments
    jaxpr: Any  # the traced program (`jax.jit(...).trace(...).jaxpr`), for its loops
    arguments: list[Any]  # its flat arguments, as lowered
    far: Any  # the abstract mesh it was compiled for in a child process, else None
    target: Any = None  # the `_deviceless.Placed` it was compiled for with `target=`, else None
    names: OpNames = AS_WRITTEN  # how its ops are named as the user's program names them
    call: tuple[jtu.PyTreeDef, ...] = ()  # the structures a call passes in and gets back


def _op_names(core: Any, jitted_around: bool) -> OpNames:
    """How the ops of the program compiled for `core` are named: where it was jitted
    around the user's own jit wrapper, the outermost `jit(...)` is ours (`jit(step)/...`,
    not `jit(step)/jit(step)/...`; `pmap(step)/...` for a `jax.pmap` wrapper)."""
    if not (jitted_around and is_jit_wrapper(core)):
        return AS_WRITTEN
    return OpNames(around=True, pmap=pmap_name(core))


def compile_program(
    core: Callable[..., Any],
    leaves: list[Any],
    abstract: list[bool],
    treedef: jtu.PyTreeDef,
    donated: frozenset[int],
    target: str | None = None,
) -> Compiled:
    """`core` compiled as the user's jit compiles it for the call's leaves (`abstract[i]`:
    leaf `i` is an argument of the program, else a constant), `donated` holding the
    positions of the donated leaves; with `target`, by that accelerator's compiler, without it."""
    per_device = in_shard_map()
    values, mesh = leaves, None  # tracers stay as they are: `_hoist_tracers` types them
    # A named accelerator: the leaves on its topology's devices, compiled by its compiler.
    placed = None
    if target is not None and _compat.at_top_level() and _compat.pmap_over(core) is not None:
        return _retargeted(core, leaves, abstract, treedef, donated, target, None)  # over the target's devices
    if target is not None:
        try:
            placed = _deviceless.place(leaves, abstract, lambda i: input_path(leaves, treedef, i), target, "cost")
        except _target.CountError as e:  # the inputs' count; the step may name devices of its own
            return _retargeted(core, leaves, abstract, treedef, donated, target, e)
    if placed is not None:
        values, mesh = placed.values, placed.mesh
    # A mesh larger than this process: compiled for simulated devices, its shardings kept.
    far = _far_mesh(values, abstract, treedef) if _compat.at_top_level() and placed is None else None
    if _compat.at_top_level() and far is None and placed is None:  # a tracer's sharding is on the mesh of its trace
        values, mesh = _on_concrete_meshes(values, abstract, treedef)
    kwarg_names = list(treedef.children()[1].children()[1].node_data()[1] or ())
    wanted = _donated_arguments(donated, treedef, kwarg_names)
    jitted: Any
    args: tuple[Any, ...]
    named: dict[str, Any]
    output_paths: list[str] | None = None
    output_tree: list[jtu.PyTreeDef] = []
    closed = any(has_value(x) and not a for x, a in zip(leaves, abstract, strict=True))
    if is_jax_jit(core) and not wanted and not closed and _compat.at_top_level():
        # The user's own `jax.jit` wrapper: its donation, static arguments and shardings.
        (bound_args, bound_kw), (call_args, call_kw) = jtu.tree_unflatten(treedef, values)
        jitted, args, named = core, (*bound_args, *call_args), {**bound_kw, **call_kw}
    elif _compat.at_top_level():
        program = _program(core, values, abstract, treedef)
        jitted, args, named = _jit(program, wanted), program.args, program.named
        output_paths, output_tree = program.output_paths, program.output_tree
    else:
        program = _program(core, values, abstract, treedef)
        jitted, flat = _hoist_tracers(program, wanted)
        args, named = tuple(flat), {}
        output_paths, output_tree = program.output_paths, program.output_tree
    try:
        with manual_axes_dropped(per_device), contextlib.ExitStack() as context:
            if mesh is not None:
                context.enter_context(jax.set_mesh(mesh))
            traced = jitted.trace(*args, **named)
            if jitted is not core and _compat.at_top_level():
                inner = _inner_donations(traced.jaxpr, program.owners)
                if not inner <= wanted:
                    traced = _jit(program, wanted | inner).trace(*args, **named)
            _refuse_too_large(traced.jaxpr.jaxpr)  # before XLA, which aborts the process on it
            if placed is not None:  # where no input, output or mesh places it (an init): JAX's default
                context.enter_context(jax.default_device(placed.device))
                context.enter_context(_quiet.quiet())  # (the compilers' log lines; no code of the user's runs)
            # A mesh larger than this process: lowered here for the CPU, compiled in a child.
            lowered = traced.lower() if far is None else traced.lower(lowering_platforms=("cpu",))
    except Exception as e:
        if target is None:
            raise
        # The step may name this process's devices itself (a mesh of its own, a pmap).
        return _retargeted(core, leaves, abstract, treedef, donated, target, e)
    compiled: Any
    if placed is not None:
        compiled = _deviceless.compile_for(lowered, placed)
    else:
        compiled = lowered.compile() if far is None else _simulate.compile_for(lowered, far.size)
    _compiles.compiled()
    infos = jtu.tree_flatten_with_path(lowered.args_info)[0]
    donate = frozenset(i for i, (_, info) in enumerate(infos) if getattr(info, "donated", False))
    paths: list[str | None]
    if jitted is core:  # the user's `jax.jit` wrapper, given the call's own trees
        paths = [_argument_path(keys, kwarg_names) for keys, _ in infos]
    else:  # the program's flat arguments: its own, then (under a transformation) the tracers it closes over
        paths = [*program.paths, *[None] * (len(infos) - len(program.paths))]
    if output_paths is None:  # the user's jitted function: its outputs as it returns them
        output_paths = ["out" + jtu.keystr(tuple(keys)) for keys, _ in jtu.tree_flatten_with_path(lowered.out_info)[0]]
        output_tree = [jtu.tree_structure(lowered.out_info)]
    arguments = [_lowering_argument(x) for x in jtu.tree_leaves((args, named))]
    names, call = _op_names(core, jitted is not core), (treedef, *output_tree)
    analyses = Analyses.of(compiled, quiet=placed is not None)
    return Compiled(compiled, analyses, paths, output_paths, donate, traced.jaxpr, arguments, far, placed, names, call)


def _retargeted(
    core: Callable[..., Any],
    leaves: list[Any],
    abstract: list[bool],
    treedef: jtu.PyTreeDef,
    donated: frozenset[int],
    target: str,
    error: Exception | None,
) -> Compiled:
    """`core` compiled for `target` where its own code names this process's devices (a
    `shard_map` or sharding over a mesh of its own, a `jax.pmap`): traced here as `cost`
    without a target traces it, moved onto the target's devices (`_deviceless.moved`) and
    replayed there; a `jax.pmap` wrapper is traced over the target's devices themselves
    (`_pmap_on_target`), however many this process has. `error`, the compile over the
    target's devices as the inputs name them, is raised where the step names no devices of
    its own (None: the step is a `jax.pmap`, and the trace's own error is raised)."""
    own = core
    try:  # (inputs over more devices than this process has: traced over their abstract mesh)
        far = _far_mesh(leaves, abstract, treedef) is not None
        values, local = (leaves, None) if far else _on_concrete_meshes(leaves, abstract, treedef)
        pmap = _compat.pmap_over(core)
        if pmap is not None:
            core = _pmap_on_target(pmap, values, treedef, target)
        program = _program(core, values, abstract, treedef)
        with contextlib.ExitStack() as context:
            if local is not None:
                context.enter_context(jax.set_mesh(local))
            closed = jax.make_jaxpr(program.fn)(*program.args, **program.named)
    except Exception:
        if error is None:
            raise
        raise error from None
    inputs = jtu.tree_leaves((program.args, program.named))
    found = _deviceless.moved(closed, inputs, local or _compat.current_mesh(), target, "cost")
    if found is None:
        raise error or ValueError(f"treeshape.cost: target {target!r}: the step names no devices to move")
    moved, placed = found
    _refuse_too_large(moved.jaxpr)  # before XLA, which aborts the process on it
    kwarg_names = list(treedef.children()[1].children()[1].node_data()[1] or ())
    wanted = _donated_arguments(donated, treedef, kwarg_names) | _inner_donations(closed, program.owners)

    def replay(*flat: Any) -> list[Any]:
        return jax.core.eval_jaxpr(moved.jaxpr, moved.consts, *flat)

    replay.__name__ = replay.__qualname__ = program.fn.__name__
    jitted = jax.jit(replay, donate_argnums=[i for i, owner in enumerate(program.owners) if owner in wanted])
    try:
        with contextlib.ExitStack() as context:
            if placed.mesh is not None:
                context.enter_context(jax.set_mesh(placed.mesh))
            traced = jitted.trace(*placed.values)
            with jax.default_device(placed.device), _quiet.quiet():
                lowered = traced.lower()
    except Exception as e:
        raise ValueError(
            f"treeshape.cost: target {target!r}: the step names this process's devices (a mesh of its own, a "
            f"jax.pmap), and moved onto the target's it does not compile: {_first_line(e)}. " + _deviceless.OVER_INPUTS
        ) from e
    infos = jtu.tree_flatten_with_path(lowered.args_info)[0]
    donate = frozenset(i for i, (_, info) in enumerate(infos) if getattr(info, "donated", False))
    compiled = _deviceless.compile_for(lowered, placed)
    _compiles.compiled()
    paths = [*program.paths, *[None] * (len(infos) - len(program.paths))]
    arguments = [_lowering_argument(x) for x in placed.values]
    names, call = _op_names(own, True), (treedef, *program.output_tree)
    analyses = Analyses.of(compiled, quiet=True)
    return Compiled(
        compiled, analyses, paths, program.output_paths, donate, traced.jaxpr, arguments, None, placed, names, call
    )


def _pmap_on_target(pmap: _compat.PmapOver, values: list[Any], treedef: jtu.PyTreeDef, target: str) -> Any:
    """The user's `jax.pmap` wrapper over the target's devices, as `jax.pmap(f, devices=...)`
    maps over them: the topology of as many devices as the call's mapped axis (a `ValueError`
    naming the topologies of that count where the target cannot form it)."""
    (bound_args, bound_kwargs), (args, kwargs) = jtu.tree_unflatten(treedef, values)
    count = pmap.size((*bound_args, *args), {**bound_kwargs, **kwargs})
    found, shape = _target.resolve(target, "cost")
    topology = _target.topology(found, shape, count, "the jax.pmap's mapped axis", "cost")
    return pmap.over(_target.devices(found.name, topology))


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _refuse_too_large(jaxpr: Any) -> None:
    """A `ValueError` for the first value the program makes (nested jaxprs too) that XLA's
    64-bit sizes cannot hold: compiling it would abort the process."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            aval = getattr(var, "aval", None)
            shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
            if type(shape) is not tuple or dtype is None:
                continue
            problem = extent_problem(shape, dtype)
            if problem is not None:
                raise ValueError(
                    f"treeshape.cost: the program makes a value of {eqn.primitive.name} "
                    f"({leaf_str(_compat.from_aval(aval))}) that {problem}: "
                    "XLA would abort the process on it. Compute it in smaller pieces (a `lax.map` or `lax.scan` "
                    "over chunks), or use smaller inputs."
                )
        for inner in inner_jaxprs(eqn):
            _refuse_too_large(inner)


def _argument_path(keys: Any, kwarg_names: list[str]) -> str:
    """An argument of the jitted program named as `out_structure` names inputs: `args[0]['w']`,
    `kwargs['x']`, a bound value by its parameter name."""
    keys = tuple(keys)
    if keys and _nodes.key_name(keys[0]) == 0:
        return "args" + jtu.keystr(keys[1:])
    name = _nodes.key_name(keys[1]) if len(keys) > 1 else ""
    root = f"kwargs[{name!r}]" if name in kwarg_names else str(name)
    return root + jtu.keystr(keys[2:])
