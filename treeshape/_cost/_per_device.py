"""Inside `shard_map`: the program of one device.

`ts.cost` called while a `shard_map` body is traced (the mesh in context has manual axes)
costs the program each device runs. The body is traced alone (by `_program`), and its
jaxpr is replayed inside a `shard_map` of the same manual axes over this process's
devices (`on_one_device`), its inputs replicated and made varying as they were traced:
compiled, its figures per device are those of one device's program (local shapes). An
operation that names a manual axis (a collective, `axis_index`) needs the other devices,
so it is refused first, by name (`refuse_collectives`).

Also the mesh of this process's devices with an abstract mesh's axes (`local_mesh`), on
which both one device's program and `cost`'s top-level placement are compiled, and the
error when this process has too few devices for it.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Final

import jax
from jax.sharding import PartitionSpec as P

from .. import _compat
from .._leaf import ARRAY, SDS, kind_of


def in_shard_map() -> bool:
    """Whether a `shard_map` body is being traced (the mesh in context has manual axes)."""
    return not _compat.at_top_level() and bool(jax.sharding.get_abstract_mesh().manual_axes)


@contextlib.contextmanager
def manual_axes_dropped(per_device: bool) -> Iterator[None]:
    """Outside `shard_map`'s manual mesh while one device's program is traced and lowered."""
    if not per_device:
        yield
        return
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
        yield


def on_one_device(converted: Callable[..., list[Any]], inputs: list[Any], out_types: list[Any]) -> Any:
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
    mesh = local_mesh(abstract)
    if mesh is None:
        raise too_few_devices(abstract, len(jax.devices()), "a value of the enclosing `shard_map`")
    in_axes = [tuple(sorted(_compat.varying_axes(x))) if kind_of(type(x)) == SDS else () for x in inputs]
    out_axes = [tuple(sorted(_compat.varying_axes(t))) for t in out_types]

    def each_device(*flat: Any) -> list[Any]:
        flat = tuple(_compat.pcast_varying(x, a) if a else x for x, a in zip(flat, in_axes, strict=True))
        out = converted(*flat)
        # a varying output is each device's block of a global array, along its first dimension
        return [y[None] if a and not y.ndim else y for y, a in zip(out, out_axes, strict=True)]

    each_device.__name__ = each_device.__qualname__ = converted.__name__
    out_specs = [P(a) if a else P() for a in out_axes]
    with manual_axes_dropped(True):
        return jax.shard_map(each_device, mesh=mesh, in_specs=P(), out_specs=out_specs, axis_names=manual)


# Primitives that only change a value's type inside `shard_map` (varying over manual axes),
# not its value on one device.
_TYPE_ONLY: Final = frozenset({"pvary", "pcast"})


def refuse_collectives(jaxpr: Any, manual: set[str]) -> None:
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
        for inner in inner_jaxprs(eqn):
            refuse_collectives(inner, manual)


def inner_jaxprs(eqn: Any) -> Iterator[Any]:
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


def local(x: Any) -> Any:
    """An argument of one device's program inside `shard_map`: its local type alone."""
    if kind_of(type(x)) in (SDS, ARRAY):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    return x


# -- a mesh of this process's devices ----------------------------------------------------
def local_mesh(abstract: Any) -> Any:
    """A mesh of this process's first devices with `abstract`'s axes (names, sizes, types),
    or None when it has fewer devices than `abstract`."""
    available = jax.devices()
    if abstract.size > len(available):
        return None
    types = tuple(abstract.axis_types)
    return jax.make_mesh(abstract.axis_sizes, abstract.axis_names, axis_types=types, devices=available[: abstract.size])


def too_few_devices(abstract: Any, count: int, where: str) -> ValueError:
    axes = ", ".join(f"{n!r}: {s}" for n, s in zip(abstract.axis_names, abstract.axis_sizes, strict=True))
    return ValueError(
        f"treeshape.cost: {where} is sharded over an abstract mesh of {abstract.size} devices ({axes}), and this "
        f"process has {count} {jax.default_backend()} device{'s' if count != 1 else ''}, so the program cannot be "
        "compiled for it here. Cost it on a machine with that many devices, plan it on a mesh of at most "
        f"{count} devices, or set `jax.set_mesh` to a concrete mesh with those axes."
    )
