"""`cost`: what the program the user's own jit compiles needs for inputs of these
abstract values, from XLA's own analysis of it (compiled, never run, and cached like
`out_structure`).

How a call flows: the inputs are split, flattened and checked by `_call` (`split_call`)
and keyed by `_cache` (`call_key`), with each leaf's placement and the donation
(`prepare`, `cost_of`); at a miss, `_program` traces, lowers and compiles the program
the user runs (`compile_program`) and asks XLA's analyses of it once (`Analyses`); from
that record the figures are read (`_read`, each loop body counted as often as it runs by
`_loops.count`, what is at the peak by `_buffers`, each op named by the program's own
rule, `Compiled.names`) and kept in `_cache.COST_CACHE` as a `Cost`: figures only, never
the compiled program.
"""

import dataclasses
import html
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import jax
import jax.tree_util as jtu

from .. import _quiet
from .._cache import COST_CACHE, answer, call_key, has_value
from .._call import (
    Call,
    abstract_inputs,
    check_callable,
    check_donation,
    check_inputs,
    input_path,
    is_abstract,
    note_abstract_scalars,
    split_call,
    with_trees,
)
from .._leaf import ARRAY, DIM, OTHER, SDS, is_duck_array, kind_of
from .._shapes import human_bytes
from .._table import grid, html_grid
from . import _buffers, _host, _kernels, _pallas, _simulate, _target, _time
from ._buffers import Buffer, Donation
from ._hlo import F, Frames, Module, str_field
from ._loops import NO_LOOPS, LoopCorrection, count, scan_lengths
from ._program import Compiled, compile_program, donated_leaves
from ._time import StepTime
from ._timeline import Timeline


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one compiled program needs, per device, from XLA's own analysis.

    A figure the backend does not report is `None`, never a made-up 0.

    Attributes:
        flops: Floating-point operations of one run, from XLA's cost analysis.
        bytes_accessed: Bytes read and written by one run, from the cost analysis.
        argument_bytes: Bytes of the program's inputs on one device.
        output_bytes: Bytes of its outputs on one device.
        temp_bytes: Bytes of the temporaries XLA allocates on one device.
        alias_bytes: Bytes of outputs that reuse a donated input's memory.
        peak_bytes: `argument_bytes + output_bytes + temp_bytes - alias_bytes`, what one device needs while the
            program runs (the same definition on every backend; `None` if one of the four is unknown).
        device_bytes: The device's memory limit where the backend reports one (GPUs, TPUs), else `None` (CPU).
        exact_flops: Whether `flops` and `bytes_accessed` count every loop body as often as it runs
            ([Loops](../guide/fit.md#loops)); `False` where a trip count is unknown: that body is counted once.
        buffers: The [treeshape.Buffer][]s live on one device at the peak step of the schedule, largest first, then
            the host's ([What is at the peak](../guide/fit.md#what-is-at-the-peak)); `None` without XLA's assignment.
        donation: Each donated input leaf by path: a [treeshape.Donation][] that says which output reuses it,
            or why none does (`{}` when nothing is donated; `None` as for `buffers`).
        live_peak_bytes: The bytes of the device's `buffers`: at most `peak_bytes`, but on a TPU target
            by the constants and scalars libtpu keeps in HBM and leaves out of its figures.
        timeline: The bytes live at each step of the schedule, a [treeshape.Timeline][]
            (`None` exactly where `buffers` is).
        compiler_peak_bytes: On a TPU target, libtpu's own peak (what the chip holds:
            `largest_fit` judges a TPU by it), else `None`.
        time: On a target, the time of one run, a [treeshape.StepTime][]; else `None`.
        host_argument_bytes: Bytes of inputs in the host's memory kinds (`pinned_host`, `unpinned_host`), the
            target compiler's own figure (a step that offloads); 0 without a target (the CPU).
        host_output_bytes: Bytes of outputs in the host's memory kinds, as `host_argument_bytes`.
        host_temp_bytes: Bytes of temporaries in the host's memory kinds (offloaded residuals), as those.
        host_alias_bytes: Bytes of host outputs that reuse a donated host input (`largest_fit`'s `host_budget`).

    Examples:
        >>> import treeshape as ts
        >>> c = ts.Cost(flops=64.0, bytes_accessed=384, argument_bytes=256, output_bytes=128,
        ...             temp_bytes=0, alias_bytes=128, peak_bytes=256, device_bytes=None)
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
    # Compared as figures: the same program asked with inputs passed otherwise (by keyword)
    # has the same figures and buffers of other paths.
    buffers: tuple[Buffer, ...] | None = dataclasses.field(default=None, compare=False)
    donation: dict[str, Donation] | None = dataclasses.field(default=None, compare=False)
    live_peak_bytes: int | None = None
    # Compared as `buffers` is: read from the same buffer assignment.
    timeline: Timeline | None = dataclasses.field(default=None, compare=False, repr=False)
    exact_flops: bool = True
    backend: str | None = None
    compiler_peak_bytes: int | None = None
    # Read from the same compile as `buffers`: compared as they are.
    time: StepTime | None = dataclasses.field(default=None, compare=False, repr=False, metadata={"json": True})
    host_argument_bytes: int | None = 0
    host_output_bytes: int | None = 0
    host_temp_bytes: int | None = 0
    host_alias_bytes: int | None = 0

    def breakdown(self, depth: int | None = None) -> str:
        """The device's buffers at the peak (those `live_peak_bytes` counts) grouped by input
        path, output path or module, with their bytes: arguments by their paths, outputs by `out` paths, temporaries by
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
        return _buffers.breakdown(_buffers.on_device(self.buffers), depth)

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
        return self._host() + self._compiled_for()

    def _host(self) -> list[str]:
        """The line of the host's memory kinds, where any of its figures is not 0."""
        host = (self.host_argument_bytes, self.host_output_bytes, self.host_temp_bytes, self.host_alias_bytes)
        if not any(host):
            return []
        said = ", ".join(
            f"{label} {_UNKNOWN if n is None else human_bytes(n)}"
            for label, n in zip(("arguments", "outputs", "temporaries", "aliased"), host, strict=True)
        )
        return [f"host memory (pinned_host, unpinned_host): {said}"]

    def _compiled_for(self) -> list[str]:
        if self.backend is not None and self.backend.endswith(_DEVICELESS):
            notes = [f"compiled for: {self.backend}: the figures are that accelerator's own compiler's"]
            return notes + ([self.time.line()] if self.time is not None else [])
        if self.backend is None or not self.backend.endswith(_SIMULATED):
            return []
        return [
            f"compiled for: {self.backend}: the figures are XLA's CPU compiler's for this partitioning, arguments "
            "and outputs as on the target; temporaries on the target accelerator may differ (target= gives "
            'the accelerator\'s own figures, e.g. target="h100"; see ts.targets())'
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
_DEVICELESS: Final = "(deviceless)"


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


def _placement(x: Any) -> Any:
    """What of a leaf's placement the compiled program depends on beyond its abstract value:
    a committed array's or a `ShapeDtypeStruct`'s sharding (None for the rest)."""
    kind = kind_of(type(x))
    if kind == SDS:
        return x.sharding
    if kind == ARRAY and not isinstance(x, jax.core.Tracer) and x.committed:
        return x.sharding
    return None


# -- reading a compiled program -------------------------------------------------------
def _figure(x: Any) -> float | None:
    """A reported figure, or None where it is missing or a negative sentinel."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x < 0:
        return None
    return float(x)


def _bytes(x: Any) -> int | None:
    value = _figure(x)
    return None if value is None else int(value)


def _figures(program: Compiled) -> Cost:
    """The `Cost` of a compiled program from XLA's analyses of it (read once, where it
    compiled), each loop body counted as often as it runs (`_loops.count`), its ops named as
    the user's program names them (`program.names`)."""
    if program.target is not None:  # compiled by a named accelerator's compiler (`target=`)
        with _quiet.quiet():  # (its loop bodies compiled alone: the compilers' log lines)
            return _targeted(program)
    backend = None if program.far is None else f"cpu x{program.far.size} {_SIMULATED}"  # (a far mesh's)
    return _read(program, _loops_of(program), backend)


def _reported(program: Compiled) -> tuple[float | None, float | None]:
    """XLA's (flops, bytes accessed) of the program, each body counted once."""
    analysis = program.analyses.cost
    return _figure(analysis.get("flops")), _figure(analysis.get("bytes accessed"))


def _loops_of(program: Compiled) -> LoopCorrection:
    """What XLA's figures miss of the program's loops, counted by `_loops.count`."""
    return count(
        program.jaxpr,
        program.compiled,
        shardings=_shardings(program.compiled),
        arguments=program.arguments,
        reported=_reported(program),
        far=program.far is not None,
        loop_counts=None if program.target is None else program.target.target.chip.compiler.loop_counts,
    )


def _targeted(program: Compiled) -> Cost:
    """The `Cost` of a program compiled for a named accelerator: its own memory figures and
    buffers, its device memory, its time, each loop body counted as often as it runs (on a
    TPU read from libtpu's optimized module; else, or where that cannot be read, each body
    compiled alone by the target's compiler for the target's devices, as `_loops` does for
    this process's)."""
    placed = program.target
    cost = _read(program, _loops_of(program), placed.backend)
    time = _step_time(program, cost.flops)
    own = placed.target.chip.compiler.own_peak
    peak = _bytes(program.analyses.memory["peak"]) if own else None
    return dataclasses.replace(cost, device_bytes=placed.target.device_bytes, time=time, compiler_peak_bytes=peak)


def _step_time(program: Compiled, flops: float | None) -> StepTime | None:
    """The time of one run on the target, from the kernels of the module its compiler
    dumped (`None` where it dumped none that can be read)."""
    placed, dumped = program.target, getattr(program.compiled, "kernels", None)
    if dumped is None:
        return None
    text, proto = dumped
    pallas = _pallas.kernels(program.jaxpr.jaxpr) if _pallas.CUSTOM_CALL in text else None  # (Mosaic's)
    chip = placed.target.chip
    read = _kernels.read(text, scan_lengths(program.jaxpr.jaxpr), pallas, tile=chip.matrix_tile, lanes=chip.lanes)
    if read is None:
        return None
    kernels, exact = read
    module = Module.read(proto)
    frames = Frames(module)
    names = {
        i.name: (program.names.op(str_field(i.metadata, F.METADATA_OP_NAME)), frames.source(i.metadata))
        for i in module.instructions.values()
    }
    # (a call from Python: the arrays and pytree nodes its host flattens and unflattens)
    from_python = program.call and chip.estimated
    call = _host.tree_counts(program.call[0], program.call[1:]) if from_python else None
    return _time.estimate(kernels, names, chip, placed.target.label, flops, exact, call)


def _read(program: Compiled, loops: LoopCorrection = NO_LOOPS, backend: str | None = None) -> Cost:
    """The figures of a compiled program, each loop body's FLOPs and bytes counted as often
    as it runs (`loops`), and what is at its peak (`_buffers.read`: its arguments named by
    their input paths, its outputs by their `out` paths, its ops by `program.names`)."""
    compiled, memory = program.compiled, program.analyses.memory
    argument, output, temp, alias = (_bytes(memory[k]) for k in ("argument", "output", "temp", "alias"))
    host = [_bytes(memory[k]) for k in ("host_argument", "host_output", "host_temp", "host_alias")]
    peak = None
    if argument is not None and output is not None and temp is not None and alias is not None:
        peak = argument + output + temp - alias
    reading = _buffers.read(
        compiled,
        memory["buffer_assignment"],
        program.argument_paths,
        program.output_paths,
        program.donated,
        memory["live_ranges"],
        program.names,
    )
    flops, accessed = _reported(program)
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
        timeline=None if reading is None else reading.timeline,
        exact_flops=loops.exact,
        backend=backend if backend is not None else _backend(compiled),
        host_argument_bytes=host[0],
        host_output_bytes=host[1],
        host_temp_bytes=host[2],
        host_alias_bytes=host[3],
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
    target: str | None = None,
    **kwargs: Any,
) -> Cost:
    """What `jax.jit(fn)(*args, **kwargs)` needs, from XLA's analysis of the compiled program.

    The program is compiled for the abstract values of the inputs (nothing runs and no
    input memory is allocated), and XLA's cost and memory analyses and its buffer
    assignment are read into a [treeshape.Cost][]: FLOPs, bytes and the peak per device,
    the buffers live at the peak and what became of each donated input, each loop body
    counted as often as it runs. Inputs are taken as [treeshape.out_structure][] takes
    them (a Structure stands for its tree, so a model never allocated can be costed); a
    jitted `fn` is costed as its wrapper compiles it. Safe under transformations, and
    cached. What is compiled, and how: [What ts.cost
    compiles](../guide/fit.md#what-tscost-compiles).

    Args:
        fn: Any callable `out_structure` takes.
        *args: Pytrees of abstract inputs, static values or Structures.
        donate_argnums: Positional arguments whose buffers the program may reuse for its
            outputs, as `jax.jit` takes them (a negative index donates nothing, as there).
        donate_argnames: The same by parameter name; may be given with `donate_argnums`.
        target: An accelerator from [treeshape.targets][] (`"h100"`, `"v5e:16x16"`): the
            program is compiled by that accelerator's own XLA compiler, without one.
        **kwargs: As `args`.

    Returns:
        A [treeshape.Cost][].

    Raises:
        TypeError: `fn` is not callable, or a donation is not ints / strings.
        ValueError: a leaf has symbolic dimensions (bind them with `Structure.bind`), a
            donation names no argument, `target` is unknown or cannot form the mesh, or
            the mesh is too large ([the cases](../guide/fit.md#what-tscost-compiles)).
        RuntimeError: compiling for simulated devices, or a `target`'s plugin, failed.
        ImportError: the `target`'s compiler is not installed (`treeshape[cuda]`, `[tpu]`).

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
    donate_argnums, donate_argnames = check_donation(donate_argnums, donate_argnames, "cost")
    target = check_target(target, "cost")
    call, donated = prepare(fn, args, kwargs, donate_argnums, donate_argnames, "cost")
    return cost_of(call, donated, target)[0]


def check_target(target: Any, who: str) -> str | None:
    """A `target=` as `cost_of` takes it (lower case), after the errors that come before
    anything is traced: an unknown name, a compiler not installed, a JAX release without it."""
    if target is None:
        return None
    found, _ = _target.resolve(target, who)
    _target.check_installed(found, who)
    return str(target).strip().lower()


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
    return call, donated_leaves(fn, call, n_args, donate_argnums, donate_argnames, who)


def cost_of(
    call: Call,
    donated: frozenset[int],
    target: str | None = None,
    who: str = "cost",
    on_compile: Callable[[], None] | None = None,
) -> tuple[Cost, int]:
    """The `Cost` of a prepared call (from the cache, or compiled and cached), and how many
    programs were compiled for it: 0 for a cache hit, else 1 (a first attempt that fails
    while tracing, to be retried with bound arrays as constants, compiles nothing). A
    note added to an error of `fn` is told in terms of `ts.{who}`."""
    leaves = call.bound_leaves + call.call_leaves
    treedef = call.treedef
    _refuse_symbolic(leaves, treedef)
    key = call_key(
        call,
        tuple(sorted(donated)),
        tuple(_placement(x) for x in leaves),
        target,
        concrete_scalars=call.concrete_scalars(),
    )

    n_bound = len(call.bound_leaves)
    checked: list[tuple[list[Any], list[bool]]] = []  # at the first evaluation: a hit checks nothing

    def evaluate(close_bound: bool) -> Cost:
        if on_compile is not None:  # a miss: the program is about to be traced and compiled
            on_compile()
        if not checked:
            flat = abstract_inputs(leaves, treedef, who)
            abstract = [is_abstract(x, concrete) for x, concrete in zip(flat, call.concrete(), strict=True)]
            check_inputs(flat, abstract, treedef, who)
            checked.append((flat, abstract))
        flat, abstract = checked[0]
        closed = abstract
        if close_bound:  # bound arrays are constants of the program, as `jax.jit` of the partial makes them
            closed = [
                a and not (i < n_bound and has_value(x)) for i, (x, a) in enumerate(zip(flat, abstract, strict=True))
            ]
        try:
            return _figures(compile_program(call.core, flat, closed, treedef, donated, target))
        except Exception as e:  # a concretization error: name the Python scalars passed abstractly
            note_abstract_scalars(e, call.core, flat, abstract, treedef, who)
            raise

    result, compiled = answer(COST_CACHE, key, call.bound_leaves, evaluate)
    return result, int(compiled)


# The public classes report module `treeshape`, so doctest would not look for their examples here.
__test__ = {"Cost": Cost}
