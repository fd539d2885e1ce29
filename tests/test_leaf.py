"""Facts about one leaf that treeshape keeps in one place (`_leaf`, and `_compat` for what
depends on the release), checked against the running JAX through the public API, so every
module that asks them answers alike: PRNG implementations, leaf classification and Python
scalar types, static leaves, and dtype short names."""

import enum
import json
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_one_line_error

import treeshape as ts
from treeshape import _compat
from treeshape._cli import main


BITS = 64 if jax.config.jax_enable_x64 else 32  # Python scalars take the default width


# -- PRNG implementations ------------------------------------------------------------
@pytest.mark.parametrize("impl", list(_compat.PRNG_IMPLS))
def test_every_prng_implementation_round_trips_through_json_and_the_command_line(impl, capsys):
    tag, since = _compat.PRNG_IMPLS[impl]
    fry = ts.structure_of({"k": jax.random.key(0)})
    text = fry.to_json().replace('"key<fry>"', f'"key<{tag}>"')
    if impl in _compat.key_impls():
        s = ts.structure_of({"k": jax.random.key(0, impl=impl)})
        assert json.loads(s.to_json())["leaves"][0]["dtype"] == f"key<{tag}>"
        assert ts.Structure.from_json(s.to_json()) == s == ts.Structure.from_json(text)
        assert main(["inspect", "helpers:echo", f"key<{tag}>[2]", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["dtype"] == f"key<{tag}>"
        assert main(["inspect", "helpers:echo", f"key<{impl}>[2]", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["dtype"] == f"key<{tag}>"
    else:  # a built-in implementation of a newer release: said so, by name and release
        with pytest.raises(ValueError, match=f"the PRNG implementation '{impl}' needs jax {since} or newer"):
            ts.Structure.from_json(text)
        assert main(["inspect", "helpers:echo", f"key<{tag}>[2]"]) == 2
        assert_one_line_error(capsys.readouterr().err, f"'{impl}' needs jax {since} or newer")


def test_unknown_prng_implementations_list_the_ones_this_release_has(capsys):
    assert main(["inspect", "helpers:echo", "key<bogus>[2]"]) == 2
    err = capsys.readouterr().err
    assert "unknown PRNG implementation 'bogus'" in err
    assert all(f"key<{_compat.PRNG_IMPLS[impl][0]}>" in err for impl in _compat.key_impls())


def test_carry_mismatches_between_key_implementations_name_both():
    init = {"k": jax.random.key(0)}
    body = lambda c, _: ({"k": jax.random.key(0, impl="rbg")}, None)
    with pytest.raises(ts.CarryMismatchError, match='impl="rbg"'):
        ts.scan_carry(body, init, length=2)


# -- leaf classification and Python scalar types -----------------------------------------
class Colour(enum.IntEnum):
    RED = 1


LEAVES = {
    "jax array": (jnp.ones(2, jnp.float16), "f16[2]", False),
    "numpy array": (np.ones(2, np.float16), "f16[2]", False),
    "numpy scalar": (np.float32(1), "f32[]", False),
    "ShapeDtypeStruct": (jax.ShapeDtypeStruct((2,), jnp.bfloat16, weak_type=True), "~bf16[2]", True),
    "bool": (True, "bool[]", False),
    "int": (1, f"~i{BITS}[]", True),
    "float": (1.0, f"~f{BITS}[]", True),
    "complex": (1j, f"~c{2 * BITS}[]", True),
}


@pytest.mark.parametrize("name", list(LEAVES))
def test_every_module_classifies_an_array_leaf_alike(name):
    x, written, weak = LEAVES[name]
    s = ts.structure_of({"x": x})
    assert repr(s).startswith(f"Structure({{'x': {written}}}")
    assert s == ts.out_structure(lambda t: t, {"x": x})
    assert ts.is_weak(x) is weak
    assert ts.weak_paths({"x": x}) == (["['x']"] if weak else [])
    if not isinstance(x, jax.ShapeDtypeStruct):  # a value: a jitted step's state may hold it
        state = ts.settle(lambda st: st, {"x": x})
        assert ts.structure_of(state).leaves[0].dtype == s.leaves[0].dtype


@pytest.mark.parametrize("static", ["relu", Colour.RED, np.array(["a", "b"]), None.__class__])
def test_static_leaves_are_static_everywhere(static):
    s = ts.structure_of({"x": static})
    assert s.leaves == (static,) or isinstance(static, np.ndarray)
    assert len(s.tree) == 1 and s.nbytes == 0
    assert ts.weak_paths({"x": static}) == []
    assert ts.out_structure(lambda t: t, {"x": static}) == s
    if isinstance(static, int):  # an IntEnum: static for treeshape, but jax.jit takes it as an int
        return
    with pytest.raises(TypeError, match=r"state\['x'\] is a"):
        ts.settle(lambda st: st, {"x": static})


# -- dtype short names: the table writes what the command line reads -----------------------
@pytest.mark.parametrize(
    "dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.int8, jnp.uint8, jnp.int32, jnp.complex64, jnp.bool_]
)
def test_the_short_dtype_names_printed_are_the_ones_specs_take(dtype, capsys):
    s = ts.structure_of(jax.ShapeDtypeStruct((2,), dtype))
    written = repr(s).split("(", 1)[1].split(",")[0]  # e.g. bf16[2]
    assert written.endswith("[2]") and written[0] in "bfuicb"
    assert main(["inspect", "helpers:echo", written, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["dtype"] == jnp.dtype(dtype).name


def test_static_repr_is_what_json_gives_back_for_other_static_leaves():
    s = ts.structure_of({"c": Colour.RED, "f": "relu"})
    loaded = ts.Structure.from_json(s.to_json())
    marker = loaded.leaves[0]
    assert type(marker) is ts.StaticRepr and repr(marker) == repr(Colour.RED) and marker.text == repr(Colour.RED)
    assert marker.type_name.endswith(":Colour") and loaded.leaves[1] == "relu"
    assert pickle.loads(pickle.dumps(marker)) == marker
    assert ts.cache_info() == ts.CacheInfo(hits=0, misses=0, size=0, maxsize=4096)
