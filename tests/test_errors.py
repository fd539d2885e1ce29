"""What a user's mistake gets: a catalogue of bad inputs, each named with what is wrong and
where, leaving the library (and its cache) working for the next good call; shapes JAX cannot
take, leaked tracers and trees that contain themselves; long lists cut after the first three;
errors from the user's own code keep their type and frame, and treeshape's are raised from
treeshape, not from JAX's internals."""

import dataclasses
import functools as ft
import json
import os
import re
import subprocess
import sys
import traceback
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import frames
from jax import lax

import treeshape as ts
from treeshape._cli import main


F32 = jnp.float32


class DuckWithBadDtype:
    shape = (2,)
    dtype = "not-a-dtype"


class Boom(Exception):
    pass


def _explode(x):
    raise Boom("raised inside fn")


def _cli(argv):
    def run():
        status = main(argv)
        if status:
            raise SystemExit(status)

    return run


def _assign(obj, name, value):
    setattr(obj, name, value)


def _assign_item(seq, i, value):
    seq[i] = value


def _nested(w_shape=(2, 3), w_dtype=F32, extra=False, as_list=False):
    layer = {"w": jnp.zeros(w_shape, w_dtype), "b": jnp.zeros(3, F32)}
    tree = {"params": [layer, layer], "step": jnp.zeros((), jnp.int32)}
    if extra:
        tree["ema"] = jnp.zeros(3, F32)
    if as_list:
        tree["params"] = tuple(tree["params"])
    return tree


_S = ts.structure_of(_nested())

# id: (call, exception type, fragments the message must contain)
CATALOGUE = {
    "non_callable_fn": (lambda: ts.out_structure(3, 1.0), TypeError, ["`fn` must be callable", "got int 3"]),
    "wrong_arity": (
        lambda: ts.out_structure(lambda x, y: x + y, jnp.ones(2)),
        TypeError,
        ["missing 1 required positional argument: 'y'"],
    ),
    "python_int_too_large": (
        lambda: ts.out_structure(lambda n: n, {"n": 2**70}),
        OverflowError,
        ["args[0]['n']", "Python int 1180591620717411303424", "does not fit"],
    ),
    "python_int_too_large_in_structure_of": (
        lambda: ts.structure_of({"n": [0, 2**70]}),
        OverflowError,
        ["treeshape.structure_of: tree['n'][1]", "Python int 1180591620717411303424", "keep it out of the tree"],
    ),
    "python_int_too_large_in_diff": (
        lambda: ts.structure_of({"n": 0}).diff({"n": -(2**70)}),
        OverflowError,
        ["treeshape.Structure.diff: tree['n']", "does not fit"],
    ),
    "fn_raises": (lambda: ts.out_structure(_explode, jnp.ones(2)), Boom, ["raised inside fn"]),
    "fn_raises_under_jit": (
        lambda: jax.jit(lambda x: ts.out_structure(_explode, x).leaves)(jnp.ones(2)),
        Boom,
        ["raised inside fn"],
    ),
    "different_node_types": (
        lambda: _S.check(_nested(as_list=True)),
        ts.StructureMismatchError,
        ["tree['params']: expected a list with 2 children, got a tuple with 2 children"],
    ),
    "extra_key": (
        lambda: _S.check(_nested(extra=True)),
        ts.StructureMismatchError,
        ["tree['ema']: unexpected extra entry f32[3]", "Remove this entry"],
    ),
    "missing_key": (
        lambda: ts.structure_of(_nested(extra=True)).check(_nested()),
        ts.StructureMismatchError,
        ["tree['ema']: missing; expected f32[3]", "Add this entry"],
    ),
    "shape_at_depth": (
        lambda: _S.check(_nested(w_shape=(3, 2))),
        ts.StructureMismatchError,
        ["tree['params'][0]['w']: expected shape (2, 3), got (3, 2)", "tree['params'][1]['w']", "2 differences"],
    ),
    "dtype_at_depth": (
        lambda: _S.check(_nested(w_dtype=jnp.bfloat16)),
        ts.StructureMismatchError,
        ["tree['params'][0]['w']: expected dtype float32, got bfloat16", "`.astype(float32)`"],
    ),
    "weak_type": (
        lambda: ts.structure_of({"lr": jnp.float32(0.1)}).check({"lr": 0.1}),
        ts.StructureMismatchError,
        ["tree['lr']: expected a strongly typed leaf, got a weakly typed one", "ts.strip_weak_type"],
    ),
    "list_length": (
        lambda: ts.structure_of([jnp.zeros(2, F32)] * 3).check([jnp.zeros(2, F32)] * 2),
        ts.StructureMismatchError,
        ["tree[2]: missing; expected f32[2]"],
    ),
    "scan_body_returns_three_values": (
        lambda: ts.scan_carry(lambda c, x: (c, x, x), jnp.zeros(2), jnp.ones((3, 2))),
        TypeError,
        ["treeshape.scan_carry: a scan body must return a pair `(carry, y)`"],
    ),
    "scan_body_returns_a_bare_carry": (
        lambda: ts.carry_structure(lambda c, x: c + x, jnp.zeros(2, F32), jnp.ones((3, 2), F32)),
        TypeError,
        ["must return a pair", "returned Structure(f32[2]"],
    ),
    "carry_structure_changes": (
        lambda: ts.while_carry(lambda c: {**c, "extra": c["x"]}, {"x": jnp.zeros(2, F32)}),
        ts.CarryMismatchError,
        [
            "treeshape.while_carry",
            "carry['extra']: unexpected extra entry f32[2]",
            "No policy changes the tree structure",
        ],
    ),
    "carry_shape_changes": (
        lambda: ts.fori_carry(lambda i, c: (c[0], c[1][None]), (0, jnp.zeros(4, F32))),
        ts.CarryMismatchError,
        ["carry[1]: input f32[4], output f32[1,4]", "make `body` return shape (4,) here"],
    ),
    "carry_dtype_forbidden_by_policy": (
        lambda: ts.scan_carry(lambda c, x: (c + x, None), jnp.zeros(2, jnp.bfloat16), jnp.ones((3, 2), F32)),
        ts.CarryMismatchError,
        ["carry: input bf16[2], output f32[2]", 'policy="weak" may not change it; policy="promote" would'],
    ),
    "scan_body_raises": (
        lambda: ts.scan_carry(lambda c, x: _explode(c), 0.0, length=2),
        Boom,
        ["raised inside fn"],
    ),
    "static_leaf_in_carry": (
        lambda: ts.scan_carry(lambda c, x: (c, None), {"act": "relu", "h": 0.0}, length=2),
        TypeError,
        ["carry['act'] is a str", "Keep static values out of the carry"],
    ),
    "xs_without_length": (
        lambda: ts.scan_carry(lambda c, x: (c, None), 0.0),
        ValueError,
        ["`xs` has no arrays to scan over, so `length` must be given"],
    ),
    "length_disagrees_with_xs": (
        lambda: ts.scan_carry(lambda c, x: (c, None), 0.0, {"a": jnp.ones((5, 2))}, length=3),
        ValueError,
        ["`length=3` disagrees with the leading axis of `xs` (5", "xs['a']"],
    ),
    "unknown_policy": (
        lambda: ts.carry_structure(lambda c, x: (c, None), 0.0, length=2, policy="safe"),
        ValueError,
        ["unknown policy 'safe'", "'weak', 'promote', 'cast'"],
    ),
    "upcast_forbidden_by_policy": (
        lambda: ts.upcast({"w": jnp.ones(2, F32)}, {"w": jax.ShapeDtypeStruct((2,), jnp.bfloat16)}, policy="promote"),
        ts.StructureMismatchError,
        ["tree['w']: expected dtype bfloat16, got float32", 'policy="cast" would'],
    ),
    "upcast_structure_differs": (
        lambda: ts.upcast({"w": jnp.ones(2)}, {"v": jnp.ones(2)}),
        ts.StructureMismatchError,
        ["tree['v']: missing", "tree['w']: unexpected extra entry"],
    ),
    "is_weak_of_a_non_array": (
        lambda: ts.is_weak("0.5"),
        TypeError,
        ["treeshape.is_weak: expected an array, tracer, jax.ShapeDtypeStruct or Python scalar, got str"],
    ),
    "full_with_a_non_number": (
        lambda: _S.full("zero"),
        TypeError,
        ["treeshape.Structure.full: `value` must be a number or bool scalar", "got str 'zero'"],
    ),
    "structure_attribute_assignment": (
        lambda: _assign(_S, "leaves", ()),
        dataclasses.FrozenInstanceError,
        ["treeshape.Structure is immutable; cannot assign 'leaves'"],
    ),
    "structure_private_state_assignment": (
        lambda: _assign(_S, "_leaves", ()),
        dataclasses.FrozenInstanceError,
        ["cannot assign '_leaves'"],
    ),
    "structure_leaves_item_assignment": (
        lambda: _assign_item(_S.leaves, 0, None),
        TypeError,
        ["'tuple' object does not support item assignment"],
    ),
    "mismatch_is_frozen": (
        lambda: _assign(ts.Mismatch("tree", "shape", (1,), (2,)), "kind", "dtype"),
        dataclasses.FrozenInstanceError,
        ["cannot assign to field 'kind'"],
    ),
    "cli_malformed_spec": (_cli(["inspect", "jax.numpy:add", "f32[8,"]), SystemExit, ["2"]),
    "cli_unknown_dtype": (_cli(["inspect", "jax.numpy:add", "f33[8]", "f32[8]"]), SystemExit, ["2"]),
}


def _good_call_still_works():
    traces = 0

    def f(x):
        nonlocal traces
        traces += 1
        return {"y": x * 2}

    for _ in range(2):
        assert ts.out_structure(f, jnp.ones(3, F32)).tree == {"y": jax.ShapeDtypeStruct((3,), F32)}
    assert traces == 1  # the second call was a cache hit


def test_catalogue_has_at_least_25_cases():
    assert len(CATALOGUE) >= 25


@pytest.mark.parametrize("case", list(CATALOGUE))
def test_bad_input_is_named_and_leaves_treeshape_working(case, capsys):
    call, error, fragments = CATALOGUE[case]
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    if error is SystemExit:  # the command line: one line on stderr, no traceback
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("treeshape: error: ") and "Traceback" not in err
    elif message.startswith("treeshape."):  # treeshape's own errors come from treeshape's frames
        last = traceback.extract_tb(info.value.__traceback__)[-1]
        assert "/treeshape/" in last.filename
    _good_call_still_works()


def test_catalogue_under_jit_leaks_no_tracer():
    # The same mistakes inside a jitted function (the leak checker is on).
    @jax.jit
    def f(x):
        with pytest.raises(ts.CarryMismatchError, match=re.escape("carry: input bf16[2], output f32[2]")):
            ts.scan_carry(lambda c, xi: (c + xi, None), x.astype(jnp.bfloat16), jnp.ones((3, 2), F32))
        with pytest.raises(OverflowError, match=re.escape("args[0]['n']")):
            ts.out_structure(lambda t: t, {"n": 2**70, "x": x})
        with pytest.raises(ts.StructureMismatchError, match=re.escape("tree['w']: expected shape (2,), got (3,)")):
            ts.structure_of({"w": x}).check({"w": jnp.zeros(3)})
        return lax.scan(lambda c, xi: (c + xi, None), x, jnp.ones((3, 2), F32))[0]

    assert (f(jnp.zeros(2, F32)) == 3).all()
    _good_call_still_works()


def test_unhashable_static_value_still_works_uncached():
    before = ts.cache_info()
    s = ts.out_structure(lambda x, options: x * len(options), jnp.ones(2, F32), {"a", "b"})
    assert s.leaves[0].shape == (2,)
    after = ts.cache_info()
    assert after.size == before.size and after.misses == before.misses + 1


def test_arrays_jax_cannot_hold_are_static_values():
    # NumPy arrays of strings or objects, and duck arrays with a dtype JAX does not
    # know, are passed to `fn` unchanged (like any other object), and kept in outputs.
    names = np.array(["a", "b"])
    objects = np.array([object()])
    duck = DuckWithBadDtype()
    seen = []

    def f(x, names, objects=None, duck=None):
        seen.append((names, objects, duck))
        return {"y": x[: len(names)], "names": names}

    s = ts.out_structure(f, jnp.ones(3, F32), names, objects=objects, duck=duck)
    assert seen == [(names, objects, duck)]
    assert s.tree["y"] == jax.ShapeDtypeStruct((2,), F32) and s.tree["names"] is names
    assert ts.out_structure(ft.partial(f, names=names), jnp.ones(3, F32)).tree["names"] is names


def test_static_output_leaves_are_kept():
    s = ts.out_structure(lambda x: {"y": x, "names": np.array(["a"]), "act": jax.nn.relu}, jnp.ones(2, F32))
    assert s.tree["act"] is jax.nn.relu and s.tree["names"][0] == "a"
    assert isinstance(s.tree["y"], jax.ShapeDtypeStruct)


# -- shapes JAX cannot take ---------------------------------------------------------
class _DuckArray:
    def __init__(self, shape, dtype=np.float32):
        self.shape, self.dtype = shape, np.dtype(dtype)


_BAD_SHAPES = {
    "nan": ((float("nan"),), TypeError, "dimension 0 is nan, a float"),
    "negative": ((2, -3), ValueError, "dimension 1 is -3, and sizes must be >= 0"),
    "fractional": ((2.5,), TypeError, "dimension 0 is 2.5, a float"),
    "string": ("ab", TypeError, "it is the string 'ab', not a sequence of sizes"),
    "None": (None, TypeError, "it is None, not a sequence of sizes"),
    "None inside": ((None, 3), TypeError, "dimension 0 is None, a NoneType"),
}


@pytest.mark.parametrize("case", list(_BAD_SHAPES))
@pytest.mark.parametrize("leaf", ["duck", "ShapeDtypeStruct"])
@pytest.mark.parametrize("where", ["top", "jit"])
def test_a_shape_jax_cannot_take_is_named_by_path(case, leaf, where):
    shape, error, problem = _BAD_SHAPES[case]
    if leaf == "duck":
        bad = _DuckArray(shape)
    elif shape is None:  # JAX itself refuses to build this one
        with pytest.raises(TypeError):
            jax.ShapeDtypeStruct(shape, jnp.float32)
        return
    else:
        bad = jax.ShapeDtypeStruct(shape, jnp.float32)
        if isinstance(shape, str):  # the ShapeDtypeStruct made it a tuple of characters
            problem = "dimension 0 is 'a', a str"
    shape = bad.shape
    tree = {"params": [jnp.ones(2), bad]}

    def run():
        with pytest.raises(error) as info:
            ts.structure_of(tree)
        assert str(info.value).startswith(f"treeshape.structure_of: tree['params'][1] has shape {shape!r}")
        assert problem in str(info.value)
        with pytest.raises(error) as info:
            ts.out_structure(lambda x, t: t, 1.0, tree)
        assert str(info.value).startswith(f"treeshape.out_structure: args[1]['params'][1] has shape {shape!r}")
        assert problem in str(info.value) and "traced" not in str(info.value)
        with pytest.raises(error, match=r"kwargs\['t'\]\['params'\]\[1\]"):
            ts.out_structure(lambda t: t, t=tree)
        with pytest.raises(error, match=r"the bound args\[0\]\['params'\]\[1\]"):
            ts.out_structure(ft.partial(lambda t, x: t, tree), 1.0)
        return jnp.zeros(())

    run() if where == "top" else jax.jit(run)()


def test_bool_and_integer_like_dimensions_read_as_jax_reads_them():
    for shape, want in [((True, 2), (1, 2)), ((False,), (0,)), ((np.int64(3), jnp.int32(2)), (3, 2))]:
        tree = {"x": _DuckArray(shape)}
        assert ts.structure_of(tree).tree["x"].shape == want
        assert ts.out_structure(lambda t: t, tree).tree["x"].shape == want
        assert ts.out_structure(lambda t: t, tree).tree["x"] == jax.eval_shape(lambda t: t, tree)["x"]
        assert ts.structure_of(tree).matches({"x": jnp.zeros(want, jnp.float32)})  # the duck is f32


# -- tracers leaked from an earlier trace ---------------------------------------------
def _leaked_tracers():
    """One tracer leaked from each kind of trace (a side effect keeping an intermediate)."""
    kept = []

    def keep(x):
        kept.append(x)
        return x

    jax.jit(keep)(jnp.ones(3))
    jax.vmap(keep)(jnp.ones((2, 3)))
    jax.grad(lambda x: keep(x).sum())(jnp.ones(3))
    jax.jvp(keep, (jnp.ones(3),), (jnp.ones(3),))
    return kept


_TAKES_A_TREE = {
    "scan_carry": lambda t: ts.scan_carry(lambda c, x: (c, None), {"a": t}, length=2),
    "scan_carry xs": lambda t: ts.scan_carry(lambda c, x: (c, None), 0.0, {"x": jnp.stack([t, t])}),
    "carry_structure": lambda t: ts.carry_structure(lambda c, x: (c, None), {"a": t}, length=2),
    "while_carry": lambda t: ts.while_carry(lambda c: c, {"a": t}),
    "fori_carry": lambda t: ts.fori_carry(lambda i, c: c, {"a": t}),
    "settle": lambda t: ts.settle(lambda s: s, {"a": t}),
    "upcast": lambda t: ts.upcast({"a": t}, {"a": jnp.zeros(3)}),
    "upcast like": lambda t: ts.upcast({"a": jnp.zeros(3)}, {"a": t}),
    "strip_weak_type": lambda t: ts.strip_weak_type({"a": t}),
    "weak_paths": lambda t: ts.weak_paths({"a": t}),
    "is_weak": lambda t: ts.is_weak(t),
}


@pytest.mark.parametrize("call", list(_TAKES_A_TREE))
def test_a_leaked_tracer_passed_at_top_level_raises_jaxs_error(call):
    with jax.check_tracer_leaks(False):  # the leaks are made on purpose here
        tracers = _leaked_tracers()
    assert len(tracers) == 4
    for t in tracers:
        with pytest.raises(jax.errors.UnexpectedTracerError):
            _TAKES_A_TREE[call](t)
    with pytest.raises(jax.errors.UnexpectedTracerError):  # as lax.scan itself does
        lax.scan(lambda c, x: (c, None), {"a": tracers[0]}, length=2)


# -- a pytree that contains itself ------------------------------------------------------------
# JAX's flatten of a dict that contains itself leaves the interpreter broken (every later call
# fails), so these run in a subprocess: a regression fails the test, not the test run.
_CYCLES = r"""
import collections, json, sys
import jax, jax.numpy as jnp
import treeshape as ts

P = collections.namedtuple("P", "a b")


def cyclic(kind):
    if kind == "dict":
        t = {"a": jnp.zeros(2), "b": 1.0}
        t["self"] = t
    elif kind == "list":
        t = [jnp.zeros(2)]
        t.append(t)
    elif kind == "nested":
        t = {"p": {"q": [1.0], "r": 2.0}, "s": 3.0}
        t["p"]["q"].append(t["p"])
    elif kind == "wide":  # more containers side by side than the walk takes at once
        t = [{"w": 1.0} for _ in range(5000)]
        t[4321]["up"] = t
    else:  # through a namedtuple, a node JAX flattens itself
        inner = []
        inner.append(P(inner, 1.0))
        t = {"x": inner, "y": 1.0}
    return t


def under_jit(call):
    return jax.jit(lambda x: (call(), x)[1])(1.0)


calls = {
    "structure_of": lambda t: ts.structure_of(t),
    "out_structure": lambda t: ts.out_structure(lambda *a: 1, 0.0, t),
    "diff": lambda t: ts.structure_of({"a": 1.0}).diff(t),
    "cost": lambda t: ts.cost(lambda *a: 1.0, 0.0, t),
    "weak_paths": lambda t: ts.weak_paths(t),
    "strip_weak_type": lambda t: ts.strip_weak_type(t),
    "describe": lambda t: ts.describe(t),
    "check_prefix": lambda t: ts.check_prefix(None, t),
    "carry_structure": lambda t: ts.carry_structure(lambda c, x: (c, x), t, None, length=2),
}
out = {}
for kind in ("dict", "list", "nested", "node"):
    for name, call in calls.items():
        for jit in (False, True):
            t = cyclic(kind)
            try:
                under_jit(lambda: call(t)) if jit else call(t)
                result = "no error"
            except Exception as e:
                result = f"{type(e).__name__}: {e}"
            out[f"{kind} {name}{' jit' if jit else ''}"] = result
for name in ("structure_of", "out_structure"):
    try:
        calls[name](cyclic("wide"))
        out[f"wide {name}"] = "no error"
    except Exception as e:
        out[f"wide {name}"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
print(float(jnp.ones(3).sum()))  # the interpreter still works
"""


def test_a_pytree_that_contains_itself_is_named_where_it_cycles():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _CYCLES], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "3.0"
    results = json.loads(lines[-2])
    where = {"dict": ("['self']", ""), "list": ("[1]", ""), "nested": ("['p']['q'][1]", "['p']")}
    roots = {"out_structure": "args[1]", "cost": "args[1]", "carry_structure": "carry"}
    for name in ("structure_of", "out_structure", "diff", "cost", "weak_paths", "strip_weak_type", "describe"):
        for jit in ("", " jit"):
            for kind, (path, ancestor) in where.items():
                root = roots.get(name, "tree")
                who = {"diff": "Structure.diff"}.get(name, name)
                assert results[f"{kind} {name}{jit}"] == (
                    f"ValueError: treeshape.{who}: {root}{path} is {root}{ancestor} itself: the pytree contains "
                    "itself, and JAX cannot flatten it. Keep that reference out of the tree (it cycles back to one "
                    "of its own parents)."
                ), (kind, name, jit)
            node = results[f"node {name}{jit}"]
            assert (
                node.startswith(f"ValueError: treeshape.{who}: ")
                and "one of its custom pytree nodes contains itself" in node
            ), node
    for name, root in (("structure_of", "tree"), ("out_structure", "args[1]")):
        assert results[f"wide {name}"].startswith(
            f"ValueError: treeshape.{name}: {root}[4321]['up'] is {root} itself: the pytree contains itself"
        ), results[f"wide {name}"]
    assert results["nested check_prefix"].startswith("ValueError: treeshape.check_prefix: tree['p']['q'][1] is")
    assert results["dict carry_structure jit"].startswith(
        "ValueError: treeshape.carry_structure: carry['self'] is carry itself"
    )


def test_a_shared_subtree_is_no_cycle():
    shared = {"w": jnp.zeros(2)}
    tree = {"a": shared, "b": [shared, (shared, shared)]}
    assert ts.structure_of(tree).paths == ("['a']['w']", "['b'][0]['w']", "['b'][1][0]['w']", "['b'][1][1]['w']")
    assert ts.out_structure(lambda t: t, tree) == ts.structure_of(tree)


# -- errors keep the user's frame and are raised from treeshape ------------------------------------
def test_errors_from_fn_keep_their_type_and_the_users_frame():
    class ModelError(Exception):
        pass

    def my_model(x):
        raise ModelError("bad config")

    with pytest.raises(ModelError) as info:
        ts.out_structure(my_model, jnp.ones(2))
    assert frames(info.value)[-1] == "my_model"

    with pytest.raises(ModelError) as info:
        jax.jit(lambda x: ts.scan_carry(lambda c, xi: my_model(c), x, length=2))(jnp.ones(2))
    assert frames(info.value)[-1] == "my_model"
    # the cache holds nothing broken: the next good call works
    assert ts.out_structure(lambda x: x * 2, jnp.ones(2)).leaves[0].shape == (2,)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: ts.structure_of(jnp.zeros(2)).check(jnp.zeros(3)),
        lambda: ts.scan_carry(lambda c, x: (c.astype(jnp.float16), None), jnp.zeros(2), length=2),
        lambda: ts.upcast(jnp.zeros(2), jnp.zeros(2, jnp.bfloat16)),
        lambda: ts.out_structure(3),
        lambda: ts.scan_carry(lambda c, x: (c, None), 0.0),
    ],
    ids=["check", "scan_carry", "upcast", "out_structure", "length"],
)
def test_treeshape_errors_are_raised_from_treeshape_not_jax_internals(bad):
    with pytest.raises((TypeError, ValueError)) as info:
        bad()
    last = traceback.extract_tb(info.value.__traceback__)[-1]
    assert "/treeshape/" in last.filename, last.filename
    assert str(info.value).startswith("treeshape.")


# -- "first three, then N more" ------------------------------------------------------------
def test_long_lists_name_the_first_three_then_the_count():
    tree = {f"k{i}": jnp.zeros(2) for i in range(5)}
    with pytest.raises(ts.StructureMismatchError) as info:
        ts.structure_of(tree).check({k: jnp.zeros(3) for k in tree})
    assert "5 leaves fail alike (tree['k0'], tree['k1'], tree['k2'] and 2 more)" in str(info.value)
    keys = {f"k{i}": jax.random.key(i) for i in range(4)}
    with pytest.raises(TypeError, match=r"tree\['k2'\] \(key<fry>\[\]\) and 1 more\. Leave key leaves out"):
        ts.structure_of(keys).astype(jnp.float32, where=lambda path, leaf: True)


def test_the_mismatch_kinds_are_the_ones_its_docs_name():
    kinds = typing.get_args(typing.get_type_hints(ts.Mismatch)["kind"])
    documented = ts.Mismatch.__doc__.split("kind:")[1].split("expected:")[0]
    assert re.findall(r'`"(\w+)"`', documented) == list(kinds)
    assert "weak_type" in kinds and "cache" in kinds
