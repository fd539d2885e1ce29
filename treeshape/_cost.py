"""`cost`: what `jax.jit(fn)` needs for inputs of these abstract values, from XLA's own
analysis of the compiled program (compiled, never run, and cached like `out_structure`).

How a call flows: the inputs are split, flattened, checked and keyed by `_infer`'s own
code (`split_call`, `call_key`); one program is traced whose positional arguments are the
abstract leaves (static ones closed over, as `out_structure` passes them), lowered with
`jax.jit` (donated leaves as `donate_argnums`) and compiled; its analyses are read through
`_compat` and kept as a `Cost`: figures only, never the compiled program.

Under a transformation (`jit`, `vmap`, `grad`, a loop body), the program is first traced
alone with `jax.make_jaxpr`; every constant of that trace that is a tracer of an enclosing
transformation (a value closed over by `fn`) becomes an argument of the compiled program,
of the type it has at this level (per example under `vmap`), and the other constants
(concrete arrays a closure holds) stay constants, as `jax.jit` makes them. So no function
that closes over a tracer is ever lowered. `jax.closure_convert` is not used for this: it
hoists only the values that may carry a derivative (so not an integer tracer, nor a value
batched by `vmap` at top level), and it keeps each function it converts, with the values
it closes over, in an LRU cache of 4096 entries while tracer-leak checking is off.
"""

import dataclasses
import html
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu

from . import _cache, _compat, _simulate
from ._cache import COST_CACHE, Key
from ._infer import (
    Call,
    abstract_inputs,
    call_key,
    check_callable,
    check_inputs,
    has_value,
    input_path,
    is_abstract,
    is_output_array,
    note_abstract_scalars,
    split_call,
)
from ._leaf import ARRAY, DIM, OTHER, SDS, from_aval, human_bytes, is_duck_array, kind_of
from ._structure import Structure
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

    Examples:
        >>> import treeshape as ts
        >>> c = ts.Cost(flops=64.0, bytes_accessed=384, argument_bytes=256, output_bytes=128,
        ...             temp_bytes=0, alias_bytes=128, peak_bytes=256, device_bytes=None)
        >>> c.peak_bytes
        256
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
    backend: str | None = None

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
        notes = []
        if self.backend is not None:
            notes.append(f"compiled for: {self.backend}")
            if self.backend.endswith(_SIMULATED):
                notes.append(
                    "the figures are XLA's CPU compiler's for this partitioning: arguments and outputs as on the "
                    "target, temporaries on the target accelerator may differ"
                )
        return notes

    def __str__(self) -> str:
        return "\n".join([grid(_HEADERS, self._rows(), right=1), *self._notes()])

    def _repr_html_(self) -> str:
        table = html_grid(_HEADERS, self._rows(), right=1, css_class="treeshape-cost")
        return table + "".join(f"<p>{html.escape(note)}</p>" for note in self._notes())


_HEADERS: Final = ("per device", "value", "exact")
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
def _is_structure(x: Any) -> bool:
    return isinstance(x, Structure)


def _with_trees(call: Call) -> Call:
    """`call` with every `Structure` among its leaves (arguments or bound values) replaced
    by the pytree of `ShapeDtypeStruct`s it describes (`s.tree`)."""
    if not any(isinstance(x, Structure) for x in (*call.bound_leaves, *call.call_leaves)):
        return call
    bound = jtu.tree_unflatten(call.bound_treedef, call.bound_leaves)
    args = jtu.tree_unflatten(call.call_treedef, call.call_leaves)
    bound, args = jtu.tree_map(lambda x: x.tree if _is_structure(x) else x, (bound, args), is_leaf=_is_structure)
    bound_leaves, bound_treedef = jtu.tree_flatten(bound)
    call_leaves, call_treedef = jtu.tree_flatten(args)
    return Call(call.core, bound_leaves, bound_treedef, call_leaves, call_treedef)


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
    positions: set[int] = set()
    for n in numbers:
        if not -n_args <= n < n_args:
            raise ValueError(
                f"treeshape.{who}: donate_argnums has {n}, but fn is called with {n_args} positional arguments"
            )
        positions.add(n % n_args)
    args_td, kwargs_td = call.call_treedef.children()
    keywords = list(kwargs_td.node_data()[1]) if kwargs_td.node_data() else []
    donated_keywords: set[str] = set()
    if names:
        try:
            parameters = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        positional = [
            p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
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
    """An abstract leaf as `jax.jit(...).lower` takes it: a tracer by its type at this
    level, anything else as it is (arrays keep their placement, scalars are weak)."""
    if isinstance(x, jax.core.Tracer):
        return from_aval(jax.typeof(x))
    return x


# -- the program ---------------------------------------------------------------------
def _program(
    core: Callable[..., Any], leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef
) -> Callable[..., list[Any]]:
    """`core` as a function of the abstract leaves alone, returning its array outputs."""

    def program(*dynamic: Any) -> list[Any]:
        it = iter(dynamic)
        full = [next(it) if a else x for x, a in zip(leaves, abstract, strict=True)]
        (bound, bound_kw), (args, kwargs) = jtu.tree_unflatten(treedef, full)
        out = core(*bound, *args, **{**bound_kw, **kwargs})
        return [x for x in jtu.tree_leaves(out) if is_output_array(x, kind_of(type(x)))]

    name = getattr(core, "__name__", None)
    program.__name__ = program.__qualname__ = name if isinstance(name, str) else "fn"
    return program


def _hoist_tracers(program: Callable[..., Any], arguments: list[Any]) -> tuple[Callable[..., Any], list[Any]]:
    """`program` with the tracers it closes over as extra trailing arguments, and their types.

    One trace of `program` (`jax.make_jaxpr`); the returned function replays it, so no
    tracer of an enclosing transformation reaches the lowering. Concrete constants stay
    constants of the program."""
    closed = jax.make_jaxpr(program)(*arguments)
    hoist = [isinstance(c, jax.core.Tracer) for c in closed.consts]
    kept = [c for c, h in zip(closed.consts, hoist, strict=True) if not h]
    types = [from_aval(jax.typeof(c)) for c, h in zip(closed.consts, hoist, strict=True) if h]
    jaxpr = closed.jaxpr
    n_args = len(arguments)
    del closed  # it holds the tracers

    def converted(*flat: Any) -> list[Any]:
        extra, constants = iter(flat[n_args:]), iter(kept)
        values = [next(extra) if h else next(constants) for h in hoist]
        return jax.core.eval_jaxpr(jaxpr, values, *flat[:n_args])

    converted.__name__ = converted.__qualname__ = program.__name__
    return converted, types


def _compile(
    core: Callable[..., Any], leaves: list[Any], abstract: list[bool], treedef: jtu.PyTreeDef, donated: frozenset[int]
) -> Cost:
    program = _program(core, leaves, abstract, treedef)
    arguments = [_lowering_argument(x) for x, a in zip(leaves, abstract, strict=True) if a]
    dynamic = [i for i, a in enumerate(abstract) if a]
    donate = tuple(j for j, i in enumerate(dynamic) if i in donated)
    far = _far_mesh(leaves, abstract, treedef)
    if far is not None:
        traced = jax.jit(program, donate_argnums=donate).trace(*arguments)
        module = _compat.lowered_module(traced.lower(lowering_platforms=("cpu",)))
        simulated = _simulate.compile_for(module, far.size)
        return _read(simulated, backend=f"cpu x{far.size} {_SIMULATED}")
    if _compat.at_top_level():
        lowered = jax.jit(program, donate_argnums=donate).lower(*arguments)
    else:
        converted, hoisted = _hoist_tracers(program, arguments)
        lowered = jax.jit(converted, donate_argnums=donate).lower(*arguments, *hoisted)
    return _read(lowered.compile())


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


def _read(compiled: Any, backend: str | None = None) -> Cost:
    analysis = _compat.cost_analysis(compiled)
    memory = _compat.memory_analysis(compiled)
    argument, output, temp, alias = (_bytes(memory[k]) for k in ("argument", "output", "temp", "alias"))
    peak = None
    if argument is not None and output is not None and temp is not None and alias is not None:
        peak = argument + output + temp - alias
    return Cost(
        flops=_figure(analysis.get("flops")),
        bytes_accessed=_bytes(analysis.get("bytes accessed")),
        argument_bytes=argument,
        output_bytes=output,
        temp_bytes=temp,
        alias_bytes=alias,
        peak_bytes=peak,
        device_bytes=None if isinstance(compiled, _simulate.Simulated) else _device_limit(compiled),
        backend=backend if backend is not None else _backend(compiled),
    )


def _backend(compiled: Any) -> str:
    devices = _devices(compiled)
    return f"{devices[0].platform} x{len(devices)}"


def _devices(compiled: Any) -> list[Any]:
    shardings: list[Any] = []
    for part in ("input_shardings", "output_shardings"):
        try:
            shardings += jtu.tree_leaves(getattr(compiled, part))
        except Exception:
            continue
    devices = {d for s in shardings if isinstance(s, jax.sharding.Sharding) for d in s.device_set}
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
    donated (aliased) buffers, and their sum, the peak.

    Inputs are taken as [treeshape.out_structure][] takes them: arrays, tracers,
    `jax.ShapeDtypeStruct`s, NumPy arrays and Python scalars are abstract (typed as JAX
    types them), any other leaf (a string, an object) is passed to `fn` unchanged, and a
    [treeshape.Structure][] stands for the tree it describes (`s.tree`), so a model that
    was never allocated can be costed. Sharded leaves (committed arrays,
    `ShapeDtypeStruct`s with a sharding) are compiled with their shardings, and the
    figures are those of one device. Arrays bound in a `functools.partial` /
    `jax.tree_util.Partial` and tracers that `fn` closes over are arguments of the
    program; concrete arrays a closure holds are its constants, as `jax.jit` makes them.

    Safe at top level and inside `jit`, `vmap` (the figures of the per-example program),
    `grad` and loop bodies: a tracer of an enclosing transformation is never lowered,
    and none escapes. Answers are cached as `out_structure`'s are (by the callable, the
    abstract inputs, the static values, the tracing context; here also the input
    shardings and the donation): a `functools.partial` built afresh on each call
    compiles nothing the second time. The cache holds figures only, never a compiled
    program; [treeshape.clear_cache][] empties it too.

    Args:
        fn: Any callable `out_structure` takes.
        *args: Pytrees of abstract inputs, static values or Structures.
        donate_argnums: Positional arguments whose buffers the program may reuse for its
            outputs, as `jax.jit` takes them.
        donate_argnames: The same by parameter name (a keyword argument, or a positional
            one through `fn`'s signature); may be given with `donate_argnums`.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Cost][].

    Raises:
        TypeError: `fn` is not callable, or a donation is not ints / strings.
        ValueError: a leaf has symbolic dimensions (bind them with `Structure.bind`),
            or a donation names no argument.

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
    call = _with_trees(split_call(fn, args, kwargs))
    n_args = len(call.call_treedef.children()[0].children())
    return call, _donated(fn, call, n_args, donate_argnums, donate_argnames, who)


def cost_of(call: Call, donated: frozenset[int]) -> tuple[Cost, int]:
    """The `Cost` of a prepared call (from the cache, or compiled and cached), and how many
    programs were compiled for it: 0 for a cache hit, else 1 (a first attempt that fails
    while tracing, to be retried with bound arrays as constants, compiles nothing)."""
    leaves = call.bound_leaves + call.call_leaves
    treedef = call.treedef
    _refuse_symbolic(leaves, treedef)
    refs: list[Any] = []
    key: Key | None = None
    try:
        key = Key((*call_key(call, refs), tuple(sorted(donated)), tuple(_placement(x) for x in leaves)))
        hit = COST_CACHE.get(key)
    except Exception:  # uncacheable (see out_structure), answered all the same
        key, hit = None, None
        COST_CACHE.miss()
    if hit is not None:
        return hit, 0
    leaves = abstract_inputs(leaves, treedef, "cost")
    abstract = [is_abstract(x, i < call.n_concrete) for i, x in enumerate(leaves)]
    check_inputs(leaves, abstract, treedef, "cost")
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
        closed = [
            a and not (i < n_bound and has_value(x)) for i, (x, a) in enumerate(zip(leaves, abstract, strict=True))
        ]
        return _compile(call.core, leaves, closed, treedef, donated), 1
    if key is not None and _cache.treedef_is_plain(call.bound_treedef) and _cache.treedef_is_plain(call.call_treedef):
        COST_CACHE.put(key, result, refs)
    return result, 1


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Cost": Cost}
