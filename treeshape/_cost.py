"""`cost`: what the program the user's own jit compiles needs for inputs of these
abstract values, from XLA's own analysis of it (compiled, never run, and cached like
`out_structure`).

How a call flows: the inputs are split, flattened and checked by `_infer` (`split_call`)
and keyed by `_cache` (`call_key`); shardings over an abstract mesh are placed on a concrete
mesh; one program is traced in one place (`_compile`: `jax.jit(...).trace`, then
`.lower()` and `.compile()`), and its analyses are read through `_compat` (`_read`) and
kept as a `Cost`: figures only, never the compiled program.

The program is the one the user runs. A `jax.jit` wrapper is traced by itself (its
donation, static arguments and shardings). Otherwise `_program` is jitted: `fn` as a
function of the abstract leaves (static ones closed over, as `out_structure` passes
them), named as the user wrote the inputs so that JAX's messages name them, returning
the state of the flax.nnx objects among its inputs after the call (a step that updates
them in place, as `nnx.jit` makes that state outputs) and then the output's arrays; the
donation of jitted wrappers it calls (`eqx.filter_jit`, `nnx.jit`) is added to `cost`'s.

Under a transformation (`jit`, `vmap`, `grad`, a loop body), the program is first traced
alone with `jax.make_jaxpr`; every constant of that trace that is a tracer of an enclosing
transformation (a value closed over by `fn`) becomes an argument of the compiled program,
of the type it has at this level (per example under `vmap`), and the other constants
(concrete arrays a closure holds) stay constants, as `jax.jit` makes them. So no function
that closes over a tracer is ever lowered. `jax.closure_convert` is not used for this: it
hoists only the values that may carry a derivative (so not an integer tracer, nor a value
batched by `vmap` at top level), and it keeps each function it converts, with the values
it closes over, in an LRU cache of 4096 entries while tracer-leak checking is off. Inside
`shard_map`, that trace is replayed inside a `shard_map` of the same manual axes over this
process's devices, which compiles each device's program (local shapes).
"""

import contextlib
import dataclasses
import html
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import jax
import jax.tree_util as jtu
from jax.sharding import PartitionSpec as P

from . import _buffers, _compat, _nodes, _sharding, _simulate
from ._buffers import Buffer, Donation
from ._cache import COST_CACHE, NEEDS_CONCRETE, Key, call_key, has_value, value_key
from ._infer import (
    _JITTED,
    Call,
    abstract_inputs,
    check_callable,
    check_inputs,
    dynamic_arguments,
    input_path,
    is_abstract,
    is_output_array,
    note_abstract_scalars,
    split_call,
    with_trees,
)
from ._leaf import ARRAY, DIM, OTHER, SDS, extent_problem, from_aval, human_bytes, is_duck_array, kind_of, leaf_str
from ._loops import NO_LOOPS, LoopCorrection, holds_loops, loop_correction
from ._table import grid, html_grid


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one compiled program needs, per device, from XLA's own analysis.

    A figure the backend does not report (or reports as a negative sentinel) is
    `None`, never a made-up 0.

    Attributes:
        flops: Floating-point operations of one run, from XLA's cost analysis.
        bytes_accessed: Bytes read and written by one run, from the cost analysis.
        argument_bytes: Bytes of the program's inputs on one device.
        output_bytes: Bytes of its outputs on one device.
        temp_bytes: Bytes of the temporaries XLA allocates on one device.
        alias_bytes: Bytes of outputs that reuse a donated input's memory.
        peak_bytes: `argument_bytes + output_bytes + temp_bytes - alias_bytes`: the
            memory one device needs while the program runs (the same definition on
            every backend; `None` if one of the four is unknown).
        device_bytes: The device's memory limit where the backend reports one
            (GPUs, TPUs), else `None` (CPU).
        exact_flops: Whether `flops` and `bytes_accessed` count every loop body
            (`lax.scan`, `fori_loop`, `while_loop`) as often as it runs. XLA's analysis
            counts a body once; `ts.cost` multiplies it by its trip count where the
            compiled program knows it. `False` where one is not known (a `while_loop` on
            a traced condition) or a body's cost cannot be had alone: that body is then
            counted once, and the table says so.
        buffers: The [treeshape.Buffer][]s live on one device at the step of the
            program's schedule with the most distinct bytes live, largest first; `None`
            where the release or backend does not give XLA's buffer assignment.
        donation: Each donated input leaf by path: a [treeshape.Donation][] that says
            which output reuses it, or why none does (`{}` when nothing is donated;
            `None` as for `buffers`).
        live_peak_bytes: The bytes of `buffers` (at most `peak_bytes`).

    Two Costs are equal when their figures are (`buffers` and `donation` name the
    inputs as they were passed, by position or keyword).

    Examples:
        >>> import treeshape as ts
        >>> c = ts.Cost(flops=64.0, bytes_accessed=384, argument_bytes=256, output_bytes=128,
        ...             temp_bytes=0, alias_bytes=128, peak_bytes=256, device_bytes=None)
        >>> c.peak_bytes, c.exact_flops
        (256, True)
        >>> print(c)
        per device      value         exact
        --------------  ------------  -----
        flops           64                64
        bytes accessed  384 B            384
        arguments       256 B            256
        outputs         128 B            128
        temporaries     0 B                0
        aliased         128 B            128
        peak            256 B            256
        device memory   not reported
        --------------  ------------  -----

        A program with a loop whose trip count is known only when it runs:

        >>> import jax, jax.numpy as jnp
        >>> def until_small(x):
        ...     return jax.lax.while_loop(lambda x: x.sum() > 1.0, lambda x: (x @ x) / 2, x)
        >>> c = ts.cost(until_small, jnp.zeros((16, 16)))
        >>> c.exact_flops
        False
        >>> print([line for line in str(c).splitlines() if "loop body" in line][0])
        flops and bytes accessed count a loop body once: its trip count or its cost per run is unknown
    """

    __module__ = "treeshape"  # as users import it (JAX's and pytest's messages show it)

    flops: float | None
    bytes_accessed: int | None
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    peak_bytes: int | None
    device_bytes: int | None
    _: dataclasses.KW_ONLY
    # Compared as figures: the same program asked with inputs passed otherwise (by keyword)
    # has the same figures and buffers of other paths.
    buffers: tuple[Buffer, ...] | None = dataclasses.field(default=None, compare=False)
    donation: dict[str, Donation] | None = dataclasses.field(default=None, compare=False)
    live_peak_bytes: int | None = None
    exact_flops: bool = True
    backend: str | None = None

    def breakdown(self, depth: int | None = None) -> str:
        """The buffers at the peak grouped by input path, output path or module, with
        their bytes: arguments by their paths, outputs by `out` paths, temporaries by
        their `op` without its outermost `jit(...)`, each to `depth` levels (as
        [treeshape.describe][] groups a tree; `None`: a row per buffer), largest first.

        Args:
            depth: How many keys of a path (or levels of an op) make a group.

        Returns:
            The table, a `str` that a notebook shows as HTML.

        Raises:
            ValueError: `depth` is not None or an int >= 0, or the buffers are unknown.

        Examples:
            >>> import jax.numpy as jnp
            >>> import treeshape as ts
            >>> def loss(params, x):
            ...     return jnp.tanh(x @ params["w1"]) @ params["w2"]
            >>> params = {"w1": jnp.zeros((512, 1024)), "w2": jnp.zeros((1024, 8))}
            >>> c = ts.cost(loss, params, jnp.zeros((64, 512)))
            >>> print(c.breakdown(depth=1))
            group    buffers      bytes
            -------  -------  ---------
            args[0]        2    2.0 MiB
            tanh           1  256.0 KiB
            args[1]        1  128.0 KiB
            out            1    2.0 KiB
            -------  -------  ---------
            total          5    2.4 MiB
        """
        if self.buffers is None:
            raise ValueError(
                "treeshape: this Cost has no buffers: the JAX release or backend that compiled it does not "
                "give XLA's buffer assignment"
            )
        return _buffers.breakdown(self.buffers, depth)

    def _rows(self) -> list[tuple[str, str, str]]:
        rows = [("flops", _count(self.flops), exact(self.flops))]
        for label, n in (
            ("bytes accessed", self.bytes_accessed),
            ("arguments", self.argument_bytes),
            ("outputs", self.output_bytes),
            ("temporaries", self.temp_bytes),
            ("aliased", self.alias_bytes),
            ("peak", self.peak_bytes),
            ("device memory", self.device_bytes),
        ):
            rows.append((label, _UNKNOWN if n is None else human_bytes(n), exact(n)))
        return rows

    def _notes(self) -> list[str]:
        if self.backend is None or not self.backend.endswith(_SIMULATED):
            return []
        return [
            f"compiled for: {self.backend}: the figures are XLA's CPU compiler's for this partitioning, arguments "
            "and outputs as on the target; temporaries on the target accelerator may differ"
        ]

    def __str__(self) -> str:
        return self._text(5)

    def _text(self, n_buffers: int) -> str:
        """The table of figures, and under it the `n_buffers` largest buffers at the peak."""
        text = grid(_HEADERS, self._rows(), right=1)
        if not self.exact_flops:
            text += f"\n{_COUNTED_ONCE}"
        for note in self._notes():
            text += f"\n{note}"
        if self.buffers and n_buffers:
            text += "\n\n" + _buffers.largest(self.buffers, self.live_peak_bytes, n_buffers)
        return text

    def _repr_html_(self) -> str:
        page = html_grid(_HEADERS, self._rows(), right=1, css_class="treeshape-cost")
        if not self.exact_flops:
            page += f"<p>{html.escape(_COUNTED_ONCE)}</p>"
        page += "".join(f"<p>{html.escape(note)}</p>" for note in self._notes())
        if self.buffers:
            page += _buffers.largest_html(self.buffers, self.live_peak_bytes, 5)
        return page


_HEADERS: Final = ("per device", "value", "exact")
_COUNTED_ONCE: Final = "flops and bytes accessed count a loop body once: its trip count or its cost per run is unknown"
_UNKNOWN: Final = "not reported"
_SIMULATED: Final = "(simulated)"


def _count(x: float | None) -> str:
    if x is None:
        return _UNKNOWN
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:g}"


def exact(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.2f}"


# -- inputs ----------------------------------------------------------------------
def _refuse_symbolic(leaves: list[Any], treedef: jtu.PyTreeDef) -> None:
    """A leaf with symbolic dimensions cannot be compiled: name it and `Structure.bind`."""
    for i, x in enumerate(leaves):
        kind = kind_of(type(x))
        if kind == DIM:
            raise ValueError(
                f"treeshape.cost: {input_path(leaves, treedef, i)} is the symbolic dimension {x}, and a program "
                "is compiled for concrete sizes. Pass an integer instead."
            )
        if not (kind in (ARRAY, SDS) or (kind == OTHER and is_duck_array(x))):
            continue
        shape = getattr(x, "shape", ())
        if isinstance(shape, tuple) and any(jax.export.is_symbolic_dim(d) for d in shape):
            dims = ", ".join(str(d) for d in shape)
            raise ValueError(
                f"treeshape.cost: {input_path(leaves, treedef, i)} has symbolic dimensions ({dims}), and a "
                "program is compiled for concrete sizes. Bind them first: `Structure.bind` gives every "
                "dimension a size (`ts.cost(fn, s.bind(b=32))`), or pass concrete shapes."
            )


def _index_tuple(value: Any, what: str, kind: type, who: str) -> tuple[Any, ...]:
    items: tuple[Any, ...] = (value,) if isinstance(value, kind) else tuple(value)
    if not all(isinstance(item, kind) and not isinstance(item, bool) for item in items):
        raise TypeError(f"treeshape.{who}: {what} must be {kind.__name__}s, got {value!r}")
    return items


def _donated(fn: Any, call: Call, n_args: int, donate_argnums: Any, donate_argnames: Any, who: str) -> frozenset[int]:
    """The positions (among all the call's leaves, bound ones first) of the donated leaves.

    `donate_argnums` index the positional arguments; `donate_argnames` name keyword
    arguments or, through `fn`'s signature, positional ones (also when both are given:
    `jax.jit` then applies the names to keyword arguments only)."""
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
        if -n_args <= n < n_args:
            positions.add(n % n_args)
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


def _placement(x: Any) -> Any:
    """What of a leaf's placement the compiled program depends on beyond its abstract value:
    a committed array's or a `ShapeDtypeStruct`'s sharding (None for the rest)."""
    kind = kind_of(type(x))
    if kind == SDS:
        return x.sharding
    if kind == ARRAY and not isinstance(x, jax.core.Tracer) and x.committed:
        return x.sharding
    return None


def _lowering_argument(x: Any) -> Any:
    """An abstract leaf as `jax.jit(...).trace` takes it: a tracer by its type at this
    level, anything else as it is (arrays keep their placement, scalars are weak)."""
    if isinstance(x, jax.core.Tracer):
        return from_aval(jax.typeof(x))
    return x


def _local(x: Any) -> Any:
    """An argument of one device's program inside `shard_map`: its local type alone."""
    if kind_of(type(x)) in (SDS, ARRAY):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    return x


# -- abstract meshes -------------------------------------------------------------------
def _on_concrete_meshes(values: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef) -> tuple[list[Any], Any]:
    """The leaves with every sharding over an abstract mesh placed on a concrete mesh of
    the same axes: the `jax.set_mesh` mesh or one of the call's own (as `zeros()` places
    them), else a mesh of this process's devices (`_local_mesh`); and that last mesh, if
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
            mesh = _local_mesh(x.sharding.mesh)
            if mesh is None:  # more devices than this process has
                raise _too_few_devices(x.sharding.mesh, len(jax.devices()), input_path(values, treedef, i))
            sharding = jax.sharding.NamedSharding(mesh, x.sharding.spec, memory_kind=x.sharding.memory_kind)
            local = local or mesh
        out[i] = x.update(sharding=sharding)
    current = _compat.current_mesh()
    return out, None if local is None or current.empty or _sharding.same_axes(current, local) else local


def _local_mesh(abstract: Any) -> Any:
    """A mesh of this process's first devices with `abstract`'s axes (names, sizes, types),
    or None when it has fewer devices than `abstract`."""
    available = jax.devices()
    if abstract.size > len(available):
        return None
    types = tuple(abstract.axis_types)
    return jax.make_mesh(abstract.axis_sizes, abstract.axis_names, axis_types=types, devices=available[: abstract.size])


def _too_few_devices(abstract: Any, count: int, where: str) -> ValueError:
    axes = ", ".join(f"{n!r}: {s}" for n, s in zip(abstract.axis_names, abstract.axis_sizes, strict=True))
    return ValueError(
        f"treeshape.cost: {where} is sharded over an abstract mesh of {abstract.size} devices ({axes}), and this "
        f"process has {count} {jax.default_backend()} device{'s' if count != 1 else ''}, so the program cannot be "
        "compiled for it here. Cost it on a machine with that many devices, plan it on a mesh of at most "
        f"{count} devices, or set `jax.set_mesh` to a concrete mesh with those axes."
    )


# -- the program ---------------------------------------------------------------------
_Arg = tuple[str, Any]  # an argument of the program: ("args", position) or ("named", name)


class _Program(NamedTuple):
    """`core` as the function `jax.jit` traces, with its arguments."""

    fn: Callable[..., list[Any]]
    args: tuple[Any, ...]
    named: dict[str, Any]
    owners: list[_Arg]  # the argument each of its flat inputs belongs to, in JAX's order
    output_paths: list[str]  # each output's path (`out[1]['w']`), once traced


def _program(core: Callable[..., Any], values: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef) -> _Program:
    """`core` as a function of the call's abstract leaves grouped as the call was written:
    positional arguments as `*args`, keyword arguments and bound values by name, so that
    JAX's messages name them as the user wrote them (`args[0]['w']`, `state['params']`),
    and point at `core`. It returns, as `nnx.jit` makes them outputs, the state of the
    flax.nnx objects among the inputs after the call (`core` may update them in place:
    `opt.update(model, grads)`), then the array leaves of `core`'s output. The objects
    passed in are never changed: the program updates the copies it rebuilds from the
    leaves."""
    args, kwargs, bound = dynamic_arguments(core, values, abstract, treedef)
    if set(bound) & set(kwargs):  # a keyword argument overriding a bound one: both are inputs
        bound = {f"_bound{i}": v for i, v in enumerate(bound.values())}
    order, keywords = list(bound), list(kwargs)

    def program(*args: Any, **named: Any) -> list[Any]:
        it = iter(jtu.tree_leaves(([named[n] for n in order], args, {k: named[k] for k in keywords})))
        inputs = jtu.tree_unflatten(treedef, [next(it) if a else x for x, a in zip(values, abstract, strict=True)])
        (bound_args, bound_kw), (call_args, call_kw) = inputs
        out = core(*bound_args, *call_args, **{**bound_kw, **call_kw})
        state = [(keys, x) for keys, x in jtu.tree_flatten_with_path(inputs, is_leaf=_is_nnx)[0] if _is_nnx(x)]
        found, paths = _outputs(state, out)
        output_paths[:] = paths
        return found

    output_paths: list[str] = []  # filled when traced

    name = getattr(core, "__name__", None)
    program.__name__ = program.__qualname__ = name if isinstance(name, str) else "fn"
    program.__wrapped__ = core  # type: ignore[attr-defined]
    program.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]
        + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in order]
        + [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    )
    named = {**kwargs, **bound}
    owners: list[_Arg] = [
        ("args", path[1].idx) if path[0] == jtu.SequenceKey(0) else ("named", path[1].key)
        for path, _ in jtu.tree_flatten_with_path((args, named))[0]
    ]
    return _Program(program, args, named, owners, output_paths)


def _outputs(state: list[tuple[Any, Any]], out: Any) -> tuple[list[Any], list[str]]:
    """The program's outputs as `nnx.jit` orders them (the inputs' flax.nnx objects, then
    the output; XLA's buffer plan follows the order), each nnx `Variable` once (an object
    both updated and returned is one output, as `nnx.jit` shares it), and their paths: an
    input's state by the input's path (`args[0].kernel`), the output by `out` and its path."""
    roots = [_call_path(keys) for keys, _ in state]
    seen: set[int] = set()
    found: list[Any] = []
    paths: list[str] = []
    flat = jtu.tree_flatten_with_path(([x for _, x in state], out), is_leaf=_is_variable)[0]
    for keys, x in flat:
        where = (
            roots[keys[1].idx] + jtu.keystr(keys[2:]) if keys[0] == jtu.SequenceKey(0) else "out" + jtu.keystr(keys[1:])
        )
        if _is_variable(x):
            if id(x) not in seen:
                seen.add(id(x))
                for sub, y in jtu.tree_flatten_with_path(x)[0]:
                    if is_output_array(y, kind_of(type(y))):
                        found.append(y)
                        paths.append(where + jtu.keystr(sub))
        elif is_output_array(x, kind_of(type(x))):
            found.append(x)
            paths.append(where)
    return found, paths


def _call_path(keys: Any) -> str:
    """A place in the call `((bound, bound_kw), (args, kwargs))` as `out_structure` names it."""
    root = ("the bound " if keys[0] == jtu.SequenceKey(0) else "") + (
        "args" if keys[1] == jtu.SequenceKey(0) else "kwargs"
    )
    return root + jtu.keystr(tuple(keys[2:]))


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
    per_device = _in_shard_map()
    if per_device:
        _refuse_collectives(closed.jaxpr, set(jax.sharding.get_abstract_mesh().manual_axes))
    hoist = [isinstance(c, jax.core.Tracer) for c in closed.consts]
    kept = [c for c, h in zip(closed.consts, hoist, strict=True) if not h]
    types = [from_aval(jax.typeof(c)) for c, h in zip(closed.consts, hoist, strict=True) if h]
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
        return jax.jit(_on_one_device(converted, flat, out_types), donate_argnums=donate), [_local(x) for x in flat]
    return jax.jit(converted, donate_argnums=donate), flat


# -- inside shard_map: the program of one device ----------------------------------------
def _in_shard_map() -> bool:
    """Whether a `shard_map` body is being traced (the mesh in context has manual axes)."""
    return not _compat.at_top_level() and bool(jax.sharding.get_abstract_mesh().manual_axes)


@contextlib.contextmanager
def _manual_axes_dropped(per_device: bool) -> Iterator[None]:
    """Outside `shard_map`'s manual mesh while one device's program is traced and lowered."""
    if not per_device:
        yield
        return
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        yield


def _on_one_device(converted: Callable[..., list[Any]], inputs: list[Any], out_types: list[Any]) -> Any:
    """`converted` (replaying a jaxpr traced inside `shard_map`) as the program each device
    runs: inside a `shard_map` over this process's devices with the same manual axes, its
    inputs replicated and made varying as they were traced, its outputs per device. Its
    figures per device are those of one device's program (local shapes)."""
    context = jax.sharding.get_abstract_mesh()  # the enclosing mesh, its manual axes marked so
    manual = set(context.manual_axes)
    types = tuple(
        jax.sharding.AxisType.Explicit if n in manual else t
        for n, t in zip(context.axis_names, context.axis_types, strict=True)
    )
    abstract = jax.sharding.AbstractMesh(context.axis_sizes, context.axis_names, axis_types=types)
    mesh = _local_mesh(abstract)
    if mesh is None:
        raise _too_few_devices(abstract, len(jax.devices()), "a value of the enclosing `shard_map`")
    in_axes = [tuple(sorted(_compat.varying_axes(x))) if kind_of(type(x)) == SDS else () for x in inputs]
    out_axes = [tuple(sorted(_compat.varying_axes(t))) for t in out_types]

    def each_device(*flat: Any) -> list[Any]:
        flat = tuple(_compat.pcast_varying(x, a) if a else x for x, a in zip(flat, in_axes, strict=True))
        out = converted(*flat)
        # a varying output is each device's block of a global array, along its first dimension
        return [y[None] if a and not y.ndim else y for y, a in zip(out, out_axes, strict=True)]

    each_device.__name__ = each_device.__qualname__ = converted.__name__
    out_specs = [P(a) if a else P() for a in out_axes]
    with _manual_axes_dropped(True):
        return jax.shard_map(each_device, mesh=mesh, in_specs=P(), out_specs=out_specs, axis_names=manual)


# Primitives that only change a value's type inside `shard_map` (varying over manual axes),
# not its value on one device.
_TYPE_ONLY: Final = frozenset({"pvary", "pcast"})


def _refuse_collectives(jaxpr: Any, manual: set[str]) -> None:
    """A `ValueError` naming the first operation (nested ones too) that names a manual axis
    of the enclosing `shard_map`: a collective needs the other devices, so one device's
    program cannot be compiled alone."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name not in _TYPE_ONLY:
            axes = _axis_names(eqn.params) & manual
            if axes:
                names = ", ".join(repr(a) for a in sorted(axes))
                raise ValueError(
                    f"treeshape.cost: the costed function uses `{eqn.primitive.name.removesuffix('_invariant')}` "
                    f"over the manual mesh axis {names} of the enclosing `shard_map`, which needs the other devices "
                    "(a collective) or this device's place among them, so its program cannot be compiled for one "
                    "device alone. Cost the whole `shard_map` from outside it "
                    "(`ts.cost(jax.shard_map(f, ...), x)`), or cost the part of the body before the collective."
                )
        for inner in _inner_jaxprs(eqn):
            _refuse_collectives(inner, manual)


def _inner_jaxprs(eqn: Any) -> Iterator[Any]:
    """The jaxprs an equation holds in its parameters (a `jit`'s, `cond`'s branches, a loop's
    body, `shard_map`'s, ...), open."""
    for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                yield inner


def _axis_names(params: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for field in ("axes", "axis_name"):
        value = params.get(field, ())
        for name in value if isinstance(value, (tuple, list, frozenset, set)) else (value,):
            if isinstance(name, str):
                names.add(name)
    return names


def _compile(
    core: Callable[..., Any], leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef, donated: frozenset[int]
) -> Cost:
    per_device = _in_shard_map()
    values, mesh = leaves, None  # tracers stay as they are: `_hoist_tracers` types them
    # A mesh larger than this process: compiled for simulated devices, its shardings kept.
    far = _far_mesh(values, abstract, treedef) if _compat.at_top_level() else None
    if _compat.at_top_level() and far is None:  # a tracer's sharding is on the mesh of its trace
        values, mesh = _on_concrete_meshes(values, abstract, treedef)
    kwarg_names = list(treedef.children()[1].children()[1].node_data()[1] or ())
    wanted = _donated_arguments(donated, treedef, kwarg_names)
    jitted: Any
    args: tuple[Any, ...]
    named: dict[str, Any]
    output_paths: list[str] | None = None
    closed = any(has_value(x) and not a for x, a in zip(leaves, abstract, strict=True))
    if type(core) is _JITTED and not wanted and not closed and _compat.at_top_level():
        # The user's own `jax.jit` wrapper: its donation, static arguments and shardings.
        (bound_args, bound_kw), (call_args, call_kw) = jtu.tree_unflatten(treedef, values)
        jitted, args, named = core, (*bound_args, *call_args), {**bound_kw, **call_kw}
    elif _compat.at_top_level():
        program = _program(core, values, abstract, treedef)
        jitted, args, named = _jit(program, wanted), program.args, program.named
        output_paths = program.output_paths
    else:
        program = _program(core, values, abstract, treedef)
        jitted, flat = _hoist_tracers(program, wanted)
        args, named = tuple(flat), {}
        output_paths = program.output_paths
    with _manual_axes_dropped(per_device), contextlib.ExitStack() as context:
        if mesh is not None:
            context.enter_context(jax.set_mesh(mesh))
        traced = jitted.trace(*args, **named)
        if jitted is not core and _compat.at_top_level():
            inner = _inner_donations(traced.jaxpr, program.owners)
            if not inner <= wanted:
                traced = _jit(program, wanted | inner).trace(*args, **named)
        _refuse_too_large(traced.jaxpr.jaxpr)  # before XLA, which aborts the process on it
        # A mesh larger than this process: lowered here for the CPU, compiled in a child.
        lowered = traced.lower() if far is None else traced.lower(lowering_platforms=("cpu",))
    compiled: Any = lowered.compile() if far is None else _simulate.compile_for(lowered, far.size)
    infos = jtu.tree_flatten_with_path(lowered.args_info)[0]
    donate = frozenset(i for i, (_, info) in enumerate(infos) if getattr(info, "donated", False))
    if _compat.at_top_level():
        paths: list[str | None] = [_argument_path(keys, kwarg_names) for keys, _ in infos]
    else:  # the program's flat arguments: its own, then the tracers it closes over
        own = [_argument_path(k, kwarg_names) for k, _ in jtu.tree_flatten_with_path((program.args, program.named))[0]]
        paths = [*own, *[None] * (len(infos) - len(own))]
    if output_paths is None:  # the user's jitted function: its outputs as it returns them
        output_paths = ["out" + jtu.keystr(tuple(keys)) for keys, _ in jtu.tree_flatten_with_path(lowered.out_info)[0]]
    analysis = _compat.cost_analysis(compiled)
    reported = (_figure(analysis.get("flops")), _figure(analysis.get("bytes accessed")))
    flat_arguments = [_lowering_argument(x) for x in jtu.tree_leaves((args, named))]
    if far is None:
        loops = loop_correction(traced.jaxpr, _shardings(compiled), arguments=flat_arguments, reported=reported)
        return _read(compiled, paths, output_paths, donate, loops)
    # Loop bodies are compiled here, and cannot be for the far mesh: counted once, and said so.
    loops = LoopCorrection(exact=not holds_loops(traced.jaxpr.jaxpr))
    return _read(compiled, paths, output_paths, donate, loops, backend=f"cpu x{far.size} {_SIMULATED}")


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
                    f"({leaf_str(from_aval(aval))}) that {problem}: "
                    "XLA would abort the process on it. Compute it in smaller pieces (a `lax.map` or `lax.scan` "
                    "over chunks), or use smaller inputs."
                )
        for inner in _inner_jaxprs(eqn):
            _refuse_too_large(inner)


def _argument_path(keys: Any, kwarg_names: list[str]) -> str:
    """An argument of the jitted program named as `out_structure` names inputs: `args[0]['w']`,
    `kwargs['x']`, a bound value by its parameter name."""
    keys = tuple(keys)
    if keys and keys[0] == jtu.SequenceKey(0):
        return "args" + jtu.keystr(keys[1:])
    name = getattr(keys[1], "key", "") if len(keys) > 1 else ""
    root = f"kwargs[{name!r}]" if name in kwarg_names else str(name)
    return root + jtu.keystr(keys[2:])


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


def _figure(x: Any) -> float | None:
    """A reported figure, or None where it is missing or a negative sentinel."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x < 0:
        return None
    return float(x)


def _bytes(x: Any) -> int | None:
    value = _figure(x)
    return None if value is None else int(value)


def _read(
    compiled: Any,
    argument_paths: Sequence[str | None] = (),
    output_paths: Sequence[str] = (),
    donated: frozenset[int] = frozenset(),
    loops: LoopCorrection = NO_LOOPS,
    backend: str | None = None,
) -> Cost:
    """The figures of a compiled program, each loop body's FLOPs and bytes counted as often
    as it runs (`loops`), and what is at its peak (`_buffers.read`): `argument_paths` name
    its arguments, `output_paths` its outputs, `donated` holds the positions of the donated
    arguments."""
    analysis = _compat.cost_analysis(compiled)
    memory = _compat.memory_analysis(compiled)
    argument, output, temp, alias = (_bytes(memory[k]) for k in ("argument", "output", "temp", "alias"))
    peak = None
    if argument is not None and output is not None and temp is not None and alias is not None:
        peak = argument + output + temp - alias
    reading = _buffers.read(compiled, memory["buffer_assignment"], argument_paths, output_paths, donated)
    flops, accessed = _figure(analysis.get("flops")), _figure(analysis.get("bytes accessed"))
    return Cost(
        flops=None if flops is None else flops + loops.flops,
        bytes_accessed=None if accessed is None else int(accessed + loops.bytes_accessed),
        argument_bytes=argument,
        output_bytes=output,
        temp_bytes=temp,
        alias_bytes=alias,
        peak_bytes=peak,
        device_bytes=None if isinstance(compiled, _simulate.Simulated) else _device_limit(compiled),
        buffers=None if reading is None else reading.buffers,
        donation=None if reading is None else reading.donation,
        live_peak_bytes=None if reading is None else reading.live_peak_bytes,
        exact_flops=loops.exact,
        backend=backend if backend is not None else _backend(compiled),
    )


def _backend(compiled: Any) -> str | None:
    """`platform xN`: where the program was compiled for, from its shardings (None without)."""
    devices: set[Any] = {d for s in _shardings(compiled) if isinstance(s, jax.sharding.Sharding) for d in s.device_set}
    if not devices:
        return None
    return f"{next(iter(devices)).platform} x{len(devices)}"


def _shardings(compiled: Any) -> list[Any]:
    shardings: list[Any] = []
    for part in ("input_shardings", "output_shardings"):
        try:
            shardings += jtu.tree_leaves(getattr(compiled, part))
        except Exception:
            continue
    return shardings


def _devices(compiled: Any) -> list[Any]:
    devices = {d for s in _shardings(compiled) if isinstance(s, jax.sharding.Sharding) for d in s.device_set}
    return sorted(devices, key=lambda d: d.id) if devices else [jax.devices()[0]]


def _device_limit(compiled: Any) -> int | None:
    """The smallest memory limit among the program's devices, if every one reports one."""
    limits = []
    for device in _devices(compiled):
        try:
            stats = device.memory_stats()
        except Exception:
            return None
        limit = _bytes(stats.get("bytes_limit")) if isinstance(stats, dict) else None
        if limit is None:
            return None
        limits.append(limit)
    return min(limits) if limits else None


# -- the public function -------------------------------------------------------
def cost(
    fn: Callable[..., Any],
    /,
    *args: Any,
    donate_argnums: int | Sequence[int] = (),
    donate_argnames: str | Iterable[str] = (),
    **kwargs: Any,
) -> Cost:
    """What `jax.jit(fn)(*args, **kwargs)` needs, from XLA's analysis of the compiled program.

    The program is compiled for the abstract values of the inputs (nothing runs and no
    input memory is allocated) and XLA's cost and memory analyses are read: FLOPs,
    bytes accessed, and per device the bytes of the arguments, outputs, temporaries and
    donated (aliased) buffers, and their sum, the peak; and XLA's buffer assignment, for
    the buffers live at the peak step of the program's schedule (`Cost.buffers`,
    `Cost.breakdown`) and what became of each donated input (`Cost.donation`). XLA counts a loop body once;
    here each body of a `lax.scan`, `fori_loop` or `while_loop` whose trip count the
    program knows counts as often as it runs (each body is compiled once more, alone,
    for its figures), and `Cost.exact_flops` says whether every one did.

    Inputs are taken as [treeshape.out_structure][] takes them: arrays, tracers,
    `jax.ShapeDtypeStruct`s, NumPy arrays and Python scalars are abstract (typed as JAX
    types them), any other leaf (a string, an object) is passed to `fn` unchanged, and a
    [treeshape.Structure][] stands for the tree it describes (`s.tree`), so a model that
    was never allocated can be costed. Sharded leaves (committed arrays,
    `ShapeDtypeStruct`s with a sharding) are compiled with their shardings, and the
    figures are those of one device. Arrays bound in a `functools.partial` /
    `jax.tree_util.Partial` and tracers that `fn` closes over are arguments of the
    program; concrete arrays a closure holds are its constants, as `jax.jit` makes them.

    The program is the one the user's own jit compiles: a `jax.jit`-wrapped `fn` is
    costed as that wrapper compiles it (its own `donate_argnums` / `donate_argnames`,
    static arguments and in/out shardings; donation given here is added to it), and so
    are `eqx.filter_jit` and `nnx.jit` wrappers' donations. A function that updates
    flax.nnx modules or optimizers in place (`opt.update(model, grads)`, returning only
    the loss) is costed as `nnx.jit` compiles it: the state of the nnx objects among the
    inputs is an output of the program. The objects passed in are left unchanged.
    Shardings over a `jax.sharding.AbstractMesh` (a Structure from JSON, or planned on
    one) are placed on the `jax.set_mesh` mesh with the same axes, else on a mesh of
    this process's devices of that shape.

    Safe at top level and inside `jit`, `vmap` (the figures of the per-example program),
    `grad`, loop bodies and `shard_map` (the figures of one device's program, local
    shapes): a tracer of an enclosing transformation is never lowered, and none escapes.
    Answers are cached as `out_structure`'s are (by the callable, the abstract inputs,
    the static values, the tracing context; here also the input shardings and the
    donation): a `functools.partial` built afresh on each call compiles nothing the
    second time, also where `fn` needs its bound arrays as values. The cache holds figures only, never a compiled
    program; [treeshape.clear_cache][] empties it too.

    Args:
        fn: Any callable `out_structure` takes.
        *args: Pytrees of abstract inputs, static values or Structures.
        donate_argnums: Positional arguments whose buffers the program may reuse for its
            outputs, as `jax.jit` takes them (also parameters of `fn` passed by keyword).
        donate_argnames: The same by parameter name (a keyword argument, or a positional
            one through `fn`'s signature); may be given with `donate_argnums`.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Cost][].

    Raises:
        TypeError: `fn` is not callable, or a donation is not ints / strings.
        ValueError: a leaf has symbolic dimensions (bind them with `Structure.bind`),
            a donation names no argument, an abstract mesh has more devices than this
            process, or inside `shard_map`, `fn` uses a collective over the manual axes.

    Errors raised by `fn` itself propagate unchanged.

    Examples:
        >>> import jax.numpy as jnp
        >>> import treeshape as ts
        >>> def layer(w, x):
        ...     return jnp.tanh(x @ w)
        >>> c = ts.cost(layer, jnp.zeros((256, 512)), jnp.zeros((32, 256)))
        >>> c.argument_bytes, c.output_bytes, c.peak_bytes
        (557056, 65536, 622592)
        >>> c.flops  # 2 * 32 * 256 * 512 multiply-adds
        8388608.0
        >>> c.device_bytes is None  # the CPU reports no memory limit
        True

        A jitted step is costed as its wrapper compiles it, donation included:

        >>> import jax
        >>> sgd = jax.jit(lambda w, g: w - 0.1 * g, donate_argnums=0)
        >>> ts.cost(sgd, jnp.zeros((256, 512)), jnp.zeros((256, 512))).alias_bytes
        524288
    """
    check_callable(fn, "cost")
    call, donated = prepare(fn, args, kwargs, donate_argnums, donate_argnames, "cost")
    return cost_of(call, donated)[0]


def prepare(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    donate_argnums: Any,
    donate_argnames: Any,
    who: str,
) -> tuple[Call, frozenset[int]]:
    """The call split and flattened as `cost` compiles it (each `Structure` replaced by its
    tree), and the positions of its donated leaves."""
    call = with_trees(split_call(fn, args, kwargs, who))
    n_args = len(call.call_treedef.children()[0].children())
    return call, _donated(fn, call, n_args, donate_argnums, donate_argnames, who)


def cost_of(call: Call, donated: frozenset[int]) -> tuple[Cost, int]:
    """The `Cost` of a prepared call (from the cache, or compiled and cached), and how many
    programs were compiled for it: 0 for a cache hit, else 1 (a first attempt that fails
    while tracing, to be retried with bound arrays as constants, compiles nothing)."""
    leaves = call.bound_leaves + call.call_leaves
    treedef = call.treedef
    _refuse_symbolic(leaves, treedef)
    key = call_key(call, tuple(sorted(donated)), tuple(_placement(x) for x in leaves), concrete_scalars=call.jitted)
    hit = COST_CACHE.get(key)
    if hit is not None and hit is not NEEDS_CONCRETE:
        return hit, 0
    leaves = abstract_inputs(leaves, treedef, "cost")
    abstract = [is_abstract(x, i < call.n_concrete) for i, x in enumerate(leaves)]
    check_inputs(leaves, abstract, treedef, "cost")
    if hit is NEEDS_CONCRETE:
        return _with_bound_values(call, leaves, abstract, donated, key, look_up=True)
    n_bound = len(call.bound_leaves)
    try:
        result = _compile(call.core, leaves, abstract, treedef, donated)
    except (TypeError, IndexError) as e:
        # What JAX raises where a value is needed (a size, an `int()`): bound arrays are then
        # constants of the program, as `jax.jit` of the partial itself makes them.
        if not any(has_value(x) for x in leaves[:n_bound]):
            note_abstract_scalars(e, call.core, n_bound, leaves[n_bound:], abstract[n_bound:], call.call_treedef)
            raise
        retry = True
    else:
        retry = False
    if retry:  # outside the handler: an error now is the user's, not a consequence of the first
        COST_CACHE.put(key, NEEDS_CONCRETE)
        return _with_bound_values(call, leaves, abstract, donated, key, look_up=False)
    COST_CACHE.put(key, result)
    return result, 1


def _with_bound_values(
    call: Call,
    leaves: list[Any],
    abstract: list[bool],
    donated: frozenset[int],
    key: Key,
    look_up: bool,
) -> tuple[Cost, int]:
    """The cost when `fn` needs the arrays bound in a partial as values: they are constants
    of the program, and the answer is cached by their values on top of the abstract key
    (as `out_structure` caches it), looked up first with `look_up`."""
    values = value_key(key, call.bound_leaves)
    if look_up:  # else this call's miss is counted already
        hit = COST_CACHE.get(values)
        if hit is not None:
            return hit, 0
    n_bound = len(call.bound_leaves)
    closed = [a and not (i < n_bound and has_value(x)) for i, (x, a) in enumerate(zip(leaves, abstract, strict=True))]
    result = _compile(call.core, leaves, closed, call.treedef, donated)
    COST_CACHE.put(values, result)
    return result, 1


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Cost": Cost}
