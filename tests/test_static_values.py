"""Static values (functions, partials, builtins, closures, any object) as tables, messages and JSON
tell them, with the real JAX, optax, equinox and flax; `ignore={"static"}`; and `==` agreeing with
`diff` for Structures loaded from JSON.

- A function, class, `custom_jvp`/`custom_vjp` function or builtin prints by its public import path
  (`jax.nn.gelu`), checked against Python's own import of that path; never a memory address.
- A value whose `repr` raises prints as `<TypeName object (its repr raised)>`, and printing never raises.
- `ignore={"static"}` leaves out static leaves and static fields, never keys, node types or shapes.
"""

import dataclasses
import functools
import html
import importlib
import json
import math
import pickle
import re
import typing
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx, struct
from flax.core import FrozenDict
from flax.training import train_state

import treeshape as ts


SDS = jax.ShapeDtypeStruct
F32 = jnp.float32


@jax.custom_vjp
def clip_gradient(x):
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))


class Scaler:
    def apply(self, x):
        return x

    def __repr__(self) -> str:
        return "Scaler()"


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _row(table: str, path: str) -> str:
    [row] = [line for line in table.splitlines() if line.startswith(path + " ")]
    return row.rstrip()


def _resolve(path: str) -> Any:
    """The object an import path names, as Python imports it (the oracle)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return functools.reduce(getattr, parts[i:], obj)
    return importlib.import_module("builtins").__dict__[path]


NAMED = [
    (jax.nn.relu, "jax.nn.relu", "custom_jvp"),
    (jax.nn.gelu, "jax.nn.gelu", "function"),
    (jax.nn.logsumexp, "jax.nn.logsumexp", "function"),  # defined in jax._src.ops.special
    (clip_gradient, "test_static_values.clip_gradient", "custom_vjp"),
    (jnp.sin, "jax.numpy.sin", "PjitFunction"),
    (jnp.add, "jax.numpy.add", "ufunc"),
    (jnp.float32, "jax.numpy.float32", "_ScalarMeta"),
    (optax.adam, "optax.adam", "function"),
    (eqx.nn.Linear, "equinox.nn.Linear", "_ModuleMeta"),
    (len, "len", "builtin_function_or_method"),
    (math.sqrt, "math.sqrt", "builtin_function_or_method"),
]
OTHERS = [
    (functools.partial(jax.nn.gelu, approximate=False), "functools.partial(jax.nn.gelu, approximate=False)"),
    (optax.adam(1e-3).init, "optax.chain.<locals>.init_fn"),  # a closure: its maker's path, then its qualname
    (jax.nn.initializers.lecun_normal(), "jax.nn.initializers.variance_scaling.<locals>.init"),
    (Scaler().apply, "<bound method test_static_values.Scaler.apply of Scaler()>"),
    (BadRepr(), "<BadRepr object (its repr raised)>"),
]


@pytest.mark.parametrize(("value", "text", "kind"), NAMED, ids=[text for _, text, _ in NAMED])
def test_a_function_prints_by_its_public_import_path_in_tables_json_and_diffs(value, text, kind):
    assert _resolve(text) is value  # the path finds the very object
    s = ts.structure_of({"f": value, "w": jnp.zeros(2)})
    assert _row(str(s), "['f']").endswith(f"static {kind} {text}")
    assert text in s._repr_html_() and text in ts.describe(s)
    [record, _] = json.loads(s.to_json())["leaves"]
    assert record["static"] == text
    assert record["name"] == (":".join(text.rsplit(".", 1)) if "." in text else f"builtins:{text}")
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s and loaded.leaves[0] is value and loaded.diff({"f": value, "w": jnp.zeros(2)}) == []
    [m] = s.diff({"f": jax.nn.sigmoid, "w": jnp.zeros(2)})
    assert str(m) == f"tree['f']: expected the static value {text}, got the static value jax.nn.sigmoid."


@pytest.mark.parametrize(("value", "text"), OTHERS, ids=[text[:40] for _, text in OTHERS])
def test_partials_closures_methods_and_objects_print_by_what_they_hold(value, text):
    s = ts.structure_of({"f": value})
    table = str(s)
    assert table.splitlines()[2].endswith(f"static {type(value).__name__} {text}")
    assert " at 0x" not in table + s.to_json() and "jax._src" not in table + s.to_json()
    assert json.loads(s.to_json())["leaves"][0]["static"] == text
    [m] = s.diff({"f": "other"})
    assert str(m) == f"tree['f']: expected the static value {text}, got the static value 'other'."


@pytest.mark.parametrize("module", [jax.nn, jax.numpy, optax, eqx.nn, jax.random, jax.lax])
def test_every_public_function_of_a_library_prints_as_a_path_that_imports_it(module):
    checked = 0
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or not callable(value) or isinstance(value, functools.partial):
            continue
        if typing.get_origin(value) is not None or type(value).__module__ == "typing":
            continue  # type aliases (`optax.Params`, `jax.lax.DotDimensionNumbers`): not values a tree holds
        text = ts.describe({"f": value}).splitlines()[2].split(" static ", 1)[1].split(" ", 1)[1]
        if "<locals>" in text:  # a closure made by a library function (`jax.lax.random_gamma_grad`)
            continue
        assert _resolve(text) is value, (name, text)
        checked += 1
    assert checked >= 20


def test_equinox_activations_print_by_their_public_path():
    mlp = eqx.filter_eval_shape(eqx.nn.MLP, 2, 3, 4, 1, key=jax.random.key(0))
    table = str(ts.structure_of(mlp))
    assert ".activation                      static custom_jvp jax.nn.relu" in table
    assert "equinox.nn._mlp._identity" in table  # a lambda bound to a module global: by that name
    gelu = eqx.filter_eval_shape(eqx.nn.MLP, 2, 3, 4, 1, activation=jax.nn.gelu, key=jax.random.key(0))
    [m] = ts.structure_of(mlp).diff(gelu)
    assert str(m) == "tree.activation: expected the static value jax.nn.relu, got the static value jax.nn.gelu."
    assert " object" not in ts.structure_of(mlp).to_json()


# -- a repr that raises ----------------------------------------------------------------------------
def test_printing_never_raises_for_a_static_value_whose_repr_raises():
    s = ts.structure_of({"bad": BadRepr(), "w": jnp.zeros(2)})
    shown = "<BadRepr object (its repr raised)>"
    assert f"static BadRepr {shown}" in str(s)
    assert repr(s).startswith("Structure(") and html.escape(shown) in s._repr_html_() and shown in ts.describe(s)
    assert json.loads(s.to_json())["leaves"][0]["static"] == shown
    nested = ts.structure_of({"bad": (BadRepr(), functools.partial(jnp.sum, BadRepr()))})
    assert shown in str(nested) and "functools.partial(jax.numpy.sum, <BadRepr object" in str(nested)
    [m] = s.diff({"bad": BadRepr(), "w": jnp.zeros(2)})  # another object, printed alike
    alike = "got another value that prints the same (the two are not equal)."
    assert str(m) == f"tree['bad']: expected the static value {shown}, {alike}"
    with pytest.raises(ts.StructureMismatchError, match=re.escape("compare with `ignore={'static'}`")):
        s.check({"bad": BadRepr(), "w": jnp.zeros(2)})


# -- ignore={"static"} --------------------------------------------------------------------------------
def _train_state(width: int = 3, tx: Any = None) -> Any:
    params = {"w": jnp.zeros(width)}
    return train_state.TrainState.create(apply_fn=lambda p, x: x, params=params, tx=tx or optax.adam(1e-3))


def test_two_train_states_built_alike_differ_only_on_static_fields_that_ignore_static_leaves_out():
    a, b = ts.structure_of(_train_state()), ts.structure_of(_train_state())
    assert [(m.path, m.kind) for m in a.diff(b)] == [(".apply_fn", "structure"), (".tx", "structure")]
    [_, tx] = a.diff(b)
    assert str(tx) == (
        "tree.tx: expected GradientTransformationExtraArgs(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, "
        "eps_root=0.0, mu_dtype=None, nesterov=False), optax.scale(step_size=-0.001)), got another value that prints "
        "the same (the two are not equal)."
    )
    assert a.diff(b, ignore={"static"}) == [] and a.matches(b, ignore={"static"})
    assert a.check(b, ignore={"static"}) is None
    # Shapes and the optimizer state's containers are still compared.
    wider = _train_state(width=4, tx=optax.sgd(1e-3))
    found = {(m.path, m.kind) for m in a.diff(wider, ignore={"static"})}
    assert (".params['w']", "shape") in found and (".opt_state[0]", "structure") in found
    assert not any(m.path in (".tx", ".apply_fn") for m in a.diff(wider, ignore={"static"}))


def test_two_adamw_train_states_show_their_optimizers_whole_never_cut_inside_a_call():
    adamw = (
        "GradientTransformationExtraArgs(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0, "
        "mu_dtype=None, nesterov=False), optax.add_decayed_weights(weight_decay=0.0001), optax.scale(step_size={}))"
    )
    a = ts.structure_of(_train_state(tx=optax.adamw(1e-3)))
    # two optimizers built alike print alike: shown whole, by the transformations they chain
    [m] = a.diff(_train_state(tx=optax.adamw(1e-3)))[1:]
    assert str(m) == (
        f"tree.tx: expected {adamw.format(-0.001)}, got another value that prints the same (the two are not equal)."
    )
    # two learning rates: the transformation that differs, whole, the others as `...`
    [m] = a.diff(_train_state(tx=optax.adamw(3e-4)))[1:]
    assert str(m) == (
        "tree.tx: expected GradientTransformationExtraArgs(..., optax.scale(step_size=-0.001)), "
        "got GradientTransformationExtraArgs(..., optax.scale(step_size=-0.0003))."
    )
    # a schedule held inside: the call that differs, each cut only between the items of a call
    warmup = [optax.warmup_cosine_decay_schedule(0.0, peak, 100, 1000) for peak in (1e-3, 3e-4)]
    s = ts.structure_of(_train_state(tx=optax.adamw(warmup[0])))
    [m] = s.diff(_train_state(tx=optax.adamw(warmup[1])))[1:]
    assert "schedules=[optax.polynomial_schedule(end_value=0.001, ...), ...]" in m.expected
    assert "schedules=[optax.polynomial_schedule(end_value=0.0003, ...), ...]" in m.actual
    for text in (m.expected, m.actual):
        assert text.count("(") == text.count(")") and text.count("[") == text.count("]") and "#" not in text


def test_ignore_static_leaves_out_nnx_and_equinox_static_attributes_not_the_leaves_under_them():
    small = nnx.eval_shape(lambda: nnx.Linear(3, 8, rngs=nnx.Rngs(0)))
    big = nnx.eval_shape(lambda: nnx.Linear(3, 16, rngs=nnx.Rngs(0)))
    assert [m.path for m in ts.structure_of(small).diff(big, ignore={"static"})] == [".bias.value", ".kernel.value"]
    eqx8 = eqx.filter_eval_shape(eqx.nn.Linear, 3, 8, key=jax.random.key(0))
    eqx16 = eqx.filter_eval_shape(eqx.nn.Linear, 3, 16, key=jax.random.key(0))
    found = ts.structure_of(eqx8).diff(eqx16, ignore={"static", "shape"})
    assert found == []
    assert [m.kind for m in ts.structure_of(eqx8).diff(eqx16, ignore={"static"})] == ["shape", "shape"]


def test_ignore_static_leaves_out_static_leaves_but_not_keys_types_or_arrays():
    s = ts.structure_of({"act": "relu", "f": jax.nn.relu, "w": jnp.zeros(2, jnp.float32)})
    assert s.diff({"act": "gelu", "f": jax.nn.gelu, "w": jnp.zeros(2, jnp.float32)}, ignore={"static"}) == []
    kept = s.diff({"act": jnp.zeros(1, jnp.float32), "g": jax.nn.relu, "w": [jnp.zeros(2)]}, ignore={"static"})
    assert [(m.path, m.expected, m.actual) for m in kept] == [
        ("['act']", "the static value 'relu'", "f32[1]"),  # a static value against an array
        ("['f']", "the static value jax.nn.relu", None),
        ("['g']", None, "the static value jax.nn.relu"),
        ("['w']", "f32[2]", "a list with 1 child"),
    ]
    with pytest.raises(ValueError, match=re.escape("'shape', 'static'; got 'statics'")):
        s.diff(s, ignore={"statics"})


# -- == agrees with diff for Structures loaded from JSON -------------------------------------------
@struct.dataclass
class Configured:
    w: Any
    config: Any = struct.field(pytree_node=False)


def test_plain_node_data_is_written_as_data_so_a_loaded_structure_equals_its_source():
    tree = Configured(SDS((2,), F32), FrozenDict({"layers": 2, "act": "gelu", "drop": float("inf")}))
    s = ts.structure_of(tree)
    [entry] = [e for e in json.loads(s.to_json())["treedef"] if type(e) is dict]
    assert entry["fields"]["config"] == {"frozendict": [["layers", 2], ["act", "gelu"], ["drop", {"float": "inf"}]]}
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s and hash(loaded) == hash(s) and loaded.diff(tree) == [] and s.diff(loaded) == []
    assert type(jax.tree_util.tree_structure(loaded.tree).node_data()[1][0]) is FrozenDict
    other = Configured(SDS((2,), F32), FrozenDict({"layers": 3, "act": "gelu", "drop": float("inf")}))
    [m] = loaded.diff(other)
    assert loaded != ts.structure_of(other) and m.path == ".config" and "layers: 2" in m.expected


class _Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x)


def _linen_train_state(tx: Any = None) -> Any:
    model = _Dense()
    params = model.init(jax.random.key(0), jnp.ones((1, 2)))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx or optax.adam(1e-3))


class _CNN(nnx.Module):
    """flax's examples/mnist CNN, small: its pooling is a `functools.partial` attribute."""

    def __init__(self, *, rngs: nnx.Rngs, strides: tuple[int, int] = (2, 2)) -> None:
        self.conv1 = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=strides)
        self.linear = nnx.Linear(4, 2, rngs=rngs)


def _round_trips(tree: Any) -> ts.Structure:
    """The Structure of `tree`, checked equal to its JSON and pickled copies by `==`, `hash` and `diff`."""
    live = ts.structure_of(tree)
    for copy in (ts.Structure.from_json(live.to_json()), pickle.loads(pickle.dumps(live))):
        assert copy == live and live == copy and hash(copy) == hash(live)
        assert copy.diff(live) == [] and live.diff(copy) == [] and copy.diff(tree) == []
        copy.check(tree)
    return live


def test_a_train_state_loaded_from_json_or_pickled_equals_the_live_one_its_functions_by_their_text():
    state = _linen_train_state()
    live = _round_trips(state)
    loaded = ts.Structure.from_json(live.to_json())
    node_data = jax.tree_util.tree_structure(loaded.tree).node_data()[1]
    assert type(node_data[0]) is ts.StaticRepr
    assert repr(node_data[0]) == "<bound method flax.linen.Module.apply of _Dense()>"
    # Another function, or an optimizer that prints otherwise, still differs, by the field.
    other = state.replace(apply_fn=_Dense().__call__)
    [m] = loaded.diff(other)
    assert loaded != ts.structure_of(other) and m.path == ".apply_fn"
    assert str(m).startswith(
        "tree.apply_fn: expected <bound method flax.linen.Module.apply of _Dense()>, got <bound method "
        "test_static_values._Dense.__call__ of _Dense()"
    )
    # Two live values still compare by their own `==`: two optimizers built alike differ.
    assert live != ts.structure_of(_linen_train_state()) and loaded == ts.structure_of(_linen_train_state())


def test_an_nnx_cnn_with_a_partial_and_its_optimizer_equal_their_json_and_pickled_copies():
    model = _CNN(rngs=nnx.Rngs(0))
    _round_trips(model)
    _round_trips(nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param))
    loaded = ts.Structure.from_json(ts.structure_of(model).to_json())
    other = _CNN(rngs=nnx.Rngs(0), strides=(1, 1))  # another partial: other arguments
    [m] = loaded.diff(other)
    assert loaded != ts.structure_of(other) and m.path == ".avg_pool"
    assert str(m) == (
        "tree.avg_pool: expected functools.partial(..., strides=(2, 2)), got functools.partial(..., strides=(1, 1))."
    )


def test_a_static_leaf_that_is_a_closure_stands_for_what_prints_as_it_and_hashes_by_its_text():
    tree = {"act": lambda x: x, "init": jax.nn.initializers.normal(0.1), "w": jnp.zeros(2)}
    live = _round_trips(tree)
    loaded = ts.Structure.from_json(live.to_json())
    assert loaded.leaves[0] == tree["act"] and loaded.leaves[0] != _Dense.__call__  # another function
    again = {**tree, "init": jax.nn.initializers.normal(0.1)}  # made anew, prints alike
    assert loaded == ts.structure_of(again) and hash(loaded) == hash(ts.structure_of(again))
    assert live != ts.structure_of(again)  # two live closures: by their own `==`
    [m] = loaded.diff({**tree, "init": jax.nn.initializers.lecun_normal()})
    assert m.path == "['init']" and m.actual == "the static value jax.nn.initializers.variance_scaling.<locals>.init"


@dataclasses.dataclass(frozen=True)
class _Unlike:
    """A static value that equals nothing, itself included."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


def test_eq_and_diff_agree_on_live_structures_too():
    value = _Unlike()
    a = ts.structure_of({"v": value, "w": jnp.zeros(2)})
    assert a == a and a.diff(a) == []  # the same object: equal without asking it
    b = ts.structure_of({"v": _Unlike(), "w": jnp.zeros(2)})
    assert a != b and [m.path for m in a.diff(b)] == ["['v']"]


DEFAULT_INIT = jax.nn.initializers.lecun_normal()  # a closure, known by this global (as flax.nnx's defaults are)


@struct.dataclass
class Initialized:
    w: Any
    init: Any = struct.field(pytree_node=False)


def test_a_closure_held_as_a_global_of_the_nodes_module_round_trips_and_another_is_named():
    tree = Initialized(SDS((2,), F32), DEFAULT_INIT)
    s = ts.structure_of(tree)
    [entry] = [e for e in json.loads(s.to_json())["treedef"] if type(e) is dict]
    assert entry["fields"]["init"] == {"name": "test_static_values:DEFAULT_INIT"}
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s and loaded.diff(tree) == []
    again = Initialized(SDS((2,), F32), jax.nn.initializers.lecun_normal())  # made anew: known by its text
    loaded = ts.Structure.from_json(ts.structure_of(again).to_json())
    assert loaded == ts.structure_of(again) and loaded.diff(again) == []
    other = Initialized(SDS((2,), F32), jax.nn.initializers.normal(0.1))
    assert loaded != ts.structure_of(other) and [m.path for m in loaded.diff(other)] == [".init"]
    assert loaded.diff(other)[0].expected == "jax.nn.initializers.variance_scaling.<locals>.init"


@struct.dataclass
class Precise:
    w: Any
    precision: Any = struct.field(pytree_node=False)


def test_an_enum_in_node_data_is_written_by_name_and_comes_back_as_itself():
    tree = Precise(SDS((2,), F32), (jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT))
    s = ts.structure_of(tree)
    [entry] = [e for e in json.loads(s.to_json())["treedef"] if type(e) is dict]
    member = {"enum": "jax.lax:Precision", "member": "HIGHEST"}
    assert entry["fields"]["precision"] == {"tuple": [member, {**member, "member": "DEFAULT"}]}
    loaded = ts.Structure.from_json(s.to_json())
    assert loaded == s and loaded.diff(tree) == []
    [m] = loaded.diff(Precise(SDS((2,), F32), (jax.lax.Precision.HIGH, jax.lax.Precision.DEFAULT)))
    assert m.path == ".precision" and loaded != ts.structure_of(Precise(SDS((2,), F32), (None, None)))
    bad = s.to_json().replace('"member": "HIGHEST"', '"member": "__class__"')
    with pytest.raises(ValueError, match=re.escape("jax.lax:Precision has no member '__class__'")):
        ts.Structure.from_json(bad)
