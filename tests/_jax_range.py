"""What the tests need of JAX that is spelled differently across the supported releases
(the floor, jax 0.8.0, to the newest). treeshape's own differences live in `treeshape._compat`;
these are the tests' few, detected the same way (by feature, never by version)."""

import contextlib

import jax
from jax._src import monitoring as _monitoring

from treeshape import _compat


# `lax.pcast(x, axes, to="varying")` from jax 0.8.2, `lax.pvary(x, axes)` before.
pcast_varying = _compat.pcast_varying


def varying(x):
    """The manual axes an array, tracer or ShapeDtypeStruct varies over (`manual_axis_type.varying`
    from jax 0.10.0, `vma` before)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return _compat.varying_axes(x)
    return _compat.varying_axes(jax.typeof(x))


def _unregister(name, callback):
    public = getattr(jax.monitoring, name, None)  # public from jax 0.8.1
    if public is not None:
        public(callback)
    else:
        getattr(_monitoring, f"_{name}_by_callback")(callback)


@contextlib.contextmanager
def listening(on_event=None, on_duration=None):
    """JAX monitoring listeners registered for the block (events, and durations in seconds)."""
    if on_event is not None:
        jax.monitoring.register_event_listener(on_event)
    if on_duration is not None:
        jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        yield
    finally:
        if on_event is not None:
            _unregister("unregister_event_listener", on_event)
        if on_duration is not None:
            _unregister("unregister_event_duration_listener", on_duration)
