"""What the tests share (tests import it as `helpers`; conftest.py holds the fixtures).

- JAX as the supported releases spell it (the floor, jax 0.8.0, to the newest):
  `pcast_varying`, `varying`, `listening` (JAX monitoring listeners for a block).
- `frames`, `assert_one_line_error`: what an error's traceback and the command line's stderr show.
- `CONTEXTS`: `f(x)` called inside each JAX transformation (the `in_context` fixture).
- `train_step(opt)`: a linear model's optax step, shaped as a `lax.scan` body.
- Functions the command-line tests inspect, as `helpers:NAME`.
- `diff_structures`: the 0.1 recursive diff, frozen, an oracle for `Structure.diff`.
- `Pair`, `Box`, `Node`, `ChexNode`: node types the random trees are drawn from.

Programs that a test runs as a child process by path stay files of their own, since each must
be a script that configures JAX before importing it (`buffer_programs.py`: XLA dump flags;
`far_mesh_programs.py`: a simulated device count; `multiprocess_worker.py`: one process of a
`jax.distributed` group).
"""

import collections
import contextlib
import dataclasses
import re
import sys
import traceback
from typing import Any, Final

import chex
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
from jax._src import monitoring as _monitoring
from jax.sharding import PartitionSpec as P

from treeshape import Mismatch, Structure, _compat
from treeshape._leaf import leaf_str, varying_axes


# -- node types the random trees of the property tests are drawn from -------------------------
Pair = collections.namedtuple("Pair", "left right")
Box = collections.namedtuple("Box", "item")  # only ever used to change a node's type


@jtu.register_dataclass
@dataclasses.dataclass
class Node:
    a: object
    b: object


@chex.dataclass
class ChexNode:
    x: object
    y: object


# -- what the tests need of JAX that is spelled differently across releases ---------------------
# treeshape's own differences live in `treeshape._compat`; these are the tests' few, detected
# the same way (by feature, never by version).

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


# -- errors ----------------------------------------------------------------------------------------
def frames(err):
    """The names of the functions an exception's traceback passes through, outermost first."""
    return [frame.name for frame in traceback.extract_tb(err.__traceback__)]


def assert_one_line_error(stderr, message):
    """stderr is exactly one `treeshape: error:` line that contains `message`."""
    assert re.fullmatch(r"treeshape: error: [^\n]+\n", stderr), stderr
    assert stderr[:-1].isprintable(), stderr  # no control character reaches the terminal
    assert message in stderr, stderr
    assert "Traceback" not in stderr


# -- JAX transformations -------------------------------------------------------------------------
def _shard_map(f, x):
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Explicit,))
    g = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    xs = jnp.concatenate([x] * 8)
    return g(jax.device_put(xs, jax.NamedSharding(mesh, P("i"))))


def _custom_jvp(f, x):
    @jax.custom_jvp
    def g(y):
        return y

    @g.defjvp
    def g_jvp(primals, tangents):
        (y,), (t,) = primals, tangents
        return f(y), f(t)

    return jax.jvp(g, (x,), (x,))[1]


def _custom_vjp_fwd(f, x):
    @jax.custom_vjp
    def g(y):
        return y

    def fwd(y):
        return f(y), None

    def bwd(_, ct):
        return (ct,)

    g.defvjp(fwd, bwd)
    return jax.grad(lambda y: g(y).sum())(x)


def _custom_vjp_bwd(f, x):
    @jax.custom_vjp
    def g(y):
        return y

    def fwd(y):
        return y, None

    def bwd(_, ct):
        return (f(ct),)

    g.defvjp(fwd, bwd)
    return jax.grad(lambda y: g(y).sum())(x)


# Each context calls `f(x)` with `x` a float32 vector seen through one JAX
# transformation; `f` must return an array shaped like its input.
CONTEXTS = {
    "top": lambda f, x: f(x),
    "jit": lambda f, x: jax.jit(f)(x),
    "vmap": lambda f, x: jax.vmap(f)(jnp.stack([x, x]))[0],
    "grad": lambda f, x: jax.grad(lambda y: f(y).sum())(x),
    "jvp": lambda f, x: jax.jvp(f, (x,), (x,))[1],
    "vjp": lambda f, x: jax.vjp(f, x)[1](x)[0],
    "scan": lambda f, x: jax.lax.scan(lambda c, _: (f(c), None), x, length=2)[0],
    "while": lambda f, x: jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, f(c[1])), (0, x))[1],
    "fori": lambda f, x: jax.lax.fori_loop(0, 2, lambda i, c: f(c), x),
    "cond": lambda f, x: jax.lax.cond(x.sum() > 0, f, lambda y: y, x),
    "checkpoint": lambda f, x: jax.checkpoint(f)(x),
    "custom_jvp": _custom_jvp,
    "custom_vjp_fwd": _custom_vjp_fwd,
    "custom_vjp_bwd": _custom_vjp_bwd,
    "shard_map": _shard_map,
    "jit_vmap_grad": lambda f, x: jax.jit(jax.vmap(jax.grad(lambda y: f(y).sum())))(jnp.stack([x, x]))[0],
}


# -- a training step -----------------------------------------------------------------------------
def linear_loss(params, x, y):
    """A linear model's mean squared error."""
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def train_step(opt: optax.GradientTransformation):
    """One training step, `step((params, opt_state), (x, y)) -> ((params, opt_state), loss)`."""

    def step(carry, batch):
        params, opt_state = carry
        value, grads = jax.value_and_grad(linear_loss)(params, *batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return step


# -- functions the command-line tests inspect: `treeshape inspect helpers:NAME` --------------------
NOT_CALLABLE = 3


def echo(*args, **kwargs):
    """Return the arguments as they arrive: their structure is the input's."""
    return {"args": args, "kwargs": kwargs}


def mlp(x, scale=1.0):
    return {"logits": (x @ jnp.ones((x.shape[-1], 10), x.dtype)) * scale}


def fails(x):
    raise ValueError("fixture failure\nsecond line of the message")


class Model:
    @staticmethod
    def apply(x):
        return {"y": x * 2, "n": x.size}


def repeat(x, n, *, axis=0):
    """Needs `n` and `axis` as Python ints: a literal is passed concrete."""
    return jnp.concatenate([x] * n, axis=axis)


def quits(x):
    sys.exit(3)


def quits_quietly(x):
    sys.exit()


class BadRepr:
    """A static output leaf whose repr raises."""

    def __repr__(self):
        raise RuntimeError("repr is broken")


class TerminalRepr:
    """A static output leaf whose repr writes a newline and a terminal colour code."""

    def __repr__(self):
        return "line one\nline two \x1b[31mred\x1b[0m"


class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("str is broken")


def bad_repr(x):
    return {"x": x, "obj": BadRepr()}


def terminal_repr(x):
    return {"x": x, "obj": TerminalRepr()}


def bad_str_error(x):
    raise BadStr()


def terminal_error(x):
    raise ValueError("\x1b[31mred\x1b[0m alert\rover\nsecond line")


def tile(pair):
    """A pair (array, count): the count, a literal inside a tuple spec, must stay concrete."""
    x, n = pair
    return jnp.tile(x, n)


# -- the 0.1 recursive diff, frozen ----------------------------------------------------------------
# A test oracle for `Structure.diff`/`check`/`matches`.
#
# This is treeshape 0.1's own algorithm (`treeshape/_structure.py` as of commit
# 2c50710, from `diff_structures` to the end of that file, with the helpers
# `_leaf_key` and `_static_value` it needs), kept verbatim as the reference that
# the iterative rewrite must agree with exactly: same mismatches, in the same
# order, with the same paths, kinds, expected and actual values and root. It
# recurses once per tree level and rebuilds sub-structures per node, so it is
# only for the small trees of the property tests, never for deep or large ones.
#
# Two calls into the production `Structure` are inlined so that the oracle does
# not move with the code under test: `_equal` compares the value keys that
# `Structure.__eq__` compared in 0.1 (treedef, then per leaf shape, dtype, weak
# flag and manual axes, or a static leaf by type and value), and `_diff_nodes`
# computes a sub-tree's `keystr` paths itself instead of through
# `Structure(...).paths`.
#
# It uses only the public `treeshape.Mismatch` and `treeshape.Structure` and the
# stable bottom module `treeshape._leaf` (`leaf_str`, `varying_axes`).
# Do not "fix" it: if the expected behaviour changes on purpose, change the
# tests that use it.
def _leaf_key(leaf: Any) -> tuple[Any, ...]:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        axes = _compat.axis_sets(leaf)  # `manual_axis_type` from jax 0.10.0, `vma` before
        return (True, leaf.shape, leaf.dtype, leaf.weak_type, axes)
    return (False, type(leaf), _static_value(leaf))


def _static_value(leaf: Any) -> Any:
    """What a static leaf is compared by: a NumPy array (of strings, objects) by
    its dtype, shape and contents, anything else by itself."""
    if isinstance(leaf, np.ndarray):
        contents = tuple(leaf.ravel().tolist()) if leaf.dtype.hasobject else leaf.tobytes()
        return (leaf.dtype.str, leaf.shape, contents)
    return leaf


def _paths(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> list[str]:
    """The `keystr` path of each leaf (0.1: `Structure(treedef, leaves).paths`)."""
    flat, _ = jtu.tree_flatten_with_path(jtu.tree_unflatten(treedef, leaves))
    return [jtu.keystr(path) for path, _ in flat]


# -- diff (0.1) ------------------------------------------------------------------
def diff_structures(expected: Structure, actual: Structure, root: str) -> list[Mismatch]:
    """Every difference between two structures: `keystr` paths, printed under `root`."""
    if _equal(expected, actual):  # the common case, and cheap: keys are memoised per Structure
        return []
    out = _Found(root)
    if expected.treedef == actual.treedef:
        for path, e, a in zip(expected.paths, expected.leaves, actual.leaves, strict=True):
            _diff_leaf(path, e, a, out)
    else:
        _diff_nodes(expected.treedef, expected.leaves, actual.treedef, actual.leaves, "", out)
    return list(out)


class _Found(list[Mismatch]):
    """The mismatches found so far, all under one root name."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def add(self, path: str, kind: str, expected: Any, actual: Any) -> None:
        self.append(Mismatch(path, kind, expected, actual, root=self.root))


def _equal(a: Structure, b: Structure) -> bool:
    # 0.1 called `a == b` (Structure.__eq__) here; that comparison is inlined
    # (`_structure_eq`), so that the oracle does not move with the production equality.
    try:
        return _structure_eq(a, b)
    except Exception:  # static leaves (e.g. NumPy arrays) whose `==` is not a bool
        return False


def _structure_eq(a: Structure, b: Structure) -> bool:
    """0.1's `Structure.__eq__`."""
    if a is b:
        return True
    try:
        return bool(_structure_key(a) == _structure_key(b))
    except Exception:  # a static leaf whose `==` raises or is not a bool: compare leaf by leaf
        return a.treedef == b.treedef and all(
            _leaf_key(e) == _leaf_key(x) if isinstance(e, jax.ShapeDtypeStruct) else _static_equal(e, x)
            for e, x in zip(a.leaves, b.leaves, strict=True)
        )


def _structure_key(s: Structure) -> tuple[Any, ...]:
    return (s.treedef, tuple(_leaf_key(leaf) for leaf in s.leaves))


def _diff_leaf(path: str, e: Any, a: Any, out: _Found) -> None:
    e_array = isinstance(e, jax.ShapeDtypeStruct)
    a_array = isinstance(a, jax.ShapeDtypeStruct)
    if not (e_array and a_array):
        if e_array != a_array or not _static_equal(e, a):
            out.add(path, "structure", _describe_leaf(e), _describe_leaf(a))
        return
    if e.shape != a.shape:
        out.add(path, "shape", e.shape, a.shape)
    if e.dtype != a.dtype:
        out.add(path, "dtype", e.dtype, a.dtype)
    if e.weak_type != a.weak_type:
        out.add(path, "weak_type", e.weak_type, a.weak_type)
    if varying_axes(e) != varying_axes(a):
        out.add(path, "vma", varying_axes(e), varying_axes(a))


def _static_equal(e: Any, a: Any) -> bool:
    try:
        return type(e) is type(a) and bool(_static_value(e) == _static_value(a))
    except Exception:  # an `==` that raises or does not give a bool
        return e is a


def _describe_leaf(leaf: Any) -> str:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf_str(leaf)
    return f"the static value {leaf_str(leaf)}"


def _describe_node(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> str:
    data = treedef.node_data()
    if data is None:  # a leaf
        return _describe_leaf(leaves[0])
    node_type, aux = data
    if node_type is type(None):
        return "None"
    n = len(treedef.children())
    if n == 0:  # told apart from None
        return f"an empty {node_type.__name__}"
    keys = _mapping_keys(node_type, aux)
    if keys is not None:
        return f"{_type_name(node_type)} with keys {_short(list(keys), 120)}"
    return f"{_type_name(node_type)} with {n} {'child' if n == 1 else 'children'}"


_MAX_FIELDS: Final = 3
_SHORT: Final = 60


def _data_difference(expected: Any, actual: Any) -> tuple[str, str]:
    """Two nodes' static data, told by the fields that differ (node data such as
    flax.nnx's holds a whole graph description: its repr is no message)."""
    e_text, a_text = _short(expected, 1000), _short(actual, 1000)
    if len(e_text) <= _SHORT and len(a_text) <= _SHORT:
        return f"static data {e_text}", f"static data {a_text}"
    e_fields, a_fields = _fields(expected), _fields(actual)
    if e_fields is not None and a_fields is not None and e_fields.keys() == a_fields.keys():
        differ = [k for k in e_fields if not _static_equal(e_fields[k], a_fields[k])]
        if differ:
            shown = differ[:_MAX_FIELDS]
            more = f" and {len(differ) - _MAX_FIELDS} more fields" if len(differ) > _MAX_FIELDS else ""

            def side(fields: dict[str, Any]) -> str:
                return ", ".join(f"{k}={_short(fields[k])}" for k in shown) + more

            return f"static data {side(e_fields)}", f"static data {side(a_fields)}"
    return f"static data {_short(expected)}", f"static data {_short(actual)}"


def _fields(data: Any) -> dict[str, Any] | None:
    """A node's static data as named fields, where it has them."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return {f.name: getattr(data, f.name, None) for f in dataclasses.fields(data)}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return dict(zip(data._fields, data, strict=True))
    if isinstance(data, (tuple, list)):
        return {f"[{i}]": item for i, item in enumerate(data)}
    if isinstance(data, dict):
        return {repr(k): v for k, v in data.items()}
    attributes = getattr(data, "__dict__", None)
    return dict(attributes) if isinstance(attributes, dict) else None


def _short(value: Any, limit: int = _SHORT) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _mapping_keys(node_type: type, aux: Any) -> Any:
    """The keys of a dict-like node (dict, OrderedDict, defaultdict), else None."""
    if node_type is dict or node_type is collections.OrderedDict:
        return aux
    if node_type is collections.defaultdict:
        return aux[1]
    return None


def _type_name(node_type: type) -> str:
    name = node_type.__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _child_keys(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> list[Any]:
    node_type, _ = treedef.node_data()
    if issubclass(node_type, tuple) and hasattr(node_type, "_fields"):
        # flatten_one_level_with_keys names every namedtuple child after the
        # first field in JAX 0.10.2; the fields are the keys.
        return [jtu.GetAttrKey(name) for name in node_type._fields]
    keyed, _ = _compat.flatten_one_level_with_keys(jtu.tree_unflatten(treedef, leaves))
    return [key for key, _ in keyed]


def _split(treedef: jtu.PyTreeDef, leaves: tuple[Any, ...]) -> list[tuple[jtu.PyTreeDef, tuple[Any, ...]]]:
    parts = []
    start = 0
    for child in treedef.children():
        parts.append((child, leaves[start : start + child.num_leaves]))
        start += child.num_leaves
    return parts


def _diff_nodes(
    e_td: jtu.PyTreeDef,
    e_leaves: tuple[Any, ...],
    a_td: jtu.PyTreeDef,
    a_leaves: tuple[Any, ...],
    path: str,
    out: _Found,
) -> None:
    if e_td == a_td:
        for p, e, a in zip(_paths(e_td, e_leaves), e_leaves, a_leaves, strict=True):
            _diff_leaf(path + p, e, a, out)
        return
    e_leaf, a_leaf = jtu.treedef_is_leaf(e_td), jtu.treedef_is_leaf(a_td)
    if e_leaf and a_leaf and e_leaves and a_leaves:
        _diff_leaf(path, e_leaves[0], a_leaves[0], out)
        return
    e_node = None if e_leaf else e_td.node_data()
    a_node = None if a_leaf else a_td.node_data()
    if e_node is None or a_node is None or e_node[0] is not a_node[0]:
        out.add(path, "structure", _describe_node(e_td, e_leaves), _describe_node(a_td, a_leaves))
        return
    node_type = e_node[0]
    e_keys, a_keys = _mapping_keys(node_type, e_node[1]), _mapping_keys(node_type, a_node[1])
    if e_keys is not None and a_keys is not None:
        # Same kind of mapping: match children by key, report missing and extra keys.
        e_children = dict(zip(e_keys, _split(e_td, e_leaves), strict=True))
        a_children = dict(zip(a_keys, _split(a_td, a_leaves), strict=True))
        ordered = node_type is collections.OrderedDict  # JAX keeps its insertion order
        _diff_children(e_children, a_children, jtu.DictKey, path, out, ordered)
        return
    if node_type is list or node_type is tuple:
        # Same sequence type, different lengths: match children by index.
        e_items = dict(enumerate(_split(e_td, e_leaves)))
        a_items = dict(enumerate(_split(a_td, a_leaves)))
        _diff_children(e_items, a_items, jtu.SequenceKey, path, out)
        return
    if e_node != a_node or len(e_td.children()) != len(a_td.children()):
        # The same custom node type with other static data (or arity).
        if len(e_td.children()) == len(a_td.children()):
            expected, actual = _data_difference(e_node[1], a_node[1])
            name = _type_name(e_node[0])
            out.add(path, "structure", f"{name} with {expected}", f"{name} with {actual}")
        else:
            out.add(path, "structure", _describe_node(e_td, e_leaves), _describe_node(a_td, a_leaves))
        return
    keys = _child_keys(e_td, e_leaves)
    for key, (e_sub, e_sub_leaves), (a_sub, a_sub_leaves) in zip(
        keys, _split(e_td, e_leaves), _split(a_td, a_leaves), strict=True
    ):
        _diff_nodes(e_sub, e_sub_leaves, a_sub, a_sub_leaves, path + jtu.keystr((key,)), out)


_Children = dict[Any, tuple[jtu.PyTreeDef, tuple[Any, ...]]]


def _diff_children(
    expected: _Children, actual: _Children, make_key: Any, path: str, out: _Found, ordered: bool = False
) -> None:
    """Diff children matched by key, in leaf order: shared ones recursively,
    missing and extra ones as one structure mismatch each."""
    keys = list(expected) + [k for k in actual if k not in expected]
    if not ordered:
        try:
            keys = sorted(keys)
        except TypeError:  # keys of mixed types: keep the expected order, then the extra ones
            pass
    for key in keys:
        sub_path = path + jtu.keystr((make_key(key),))
        if key not in actual:
            out.add(sub_path, "structure", _describe_node(*expected[key]), None)
        elif key not in expected:
            out.add(sub_path, "structure", None, _describe_node(*actual[key]))
        else:
            _diff_nodes(*expected[key], *actual[key], sub_path, out)


def memory_figures(memory):
    """A compiled program's own memory figures (`memory_analysis()`), in `cost_figures`' order."""
    return (
        memory.argument_size_in_bytes,
        memory.output_size_in_bytes,
        memory.temp_size_in_bytes,
        memory.alias_size_in_bytes,
    )


def cost_figures(c):
    """A `ts.Cost`'s argument, output, temporary and alias bytes."""
    return (c.argument_bytes, c.output_bytes, c.temp_bytes, c.alias_bytes)
