"""`ts.residuals`: the values that differentiating a loss saves for its backward pass, held
against JAX's own listing (`jax.ad_checkpoint.print_saved_residuals`, whose data
`saved_residuals` returns): the same values, with names, lines, bytes and memory kinds."""

import collections
import functools
import inspect
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import textwrap

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from jax._src.ad_checkpoint import saved_residuals  # JAX's listing, as data: the oracle
from jax.ad_checkpoint import checkpoint_name

import treeshape as ts
from treeshape._cli import main


F32 = jnp.float32
HERE = os.path.basename(__file__)
POLICIES = jax.checkpoint_policies


def _line(fn, text):
    """`test_residuals.py:N` of the line of `fn`'s source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    (n,) = [first + i for i, line in enumerate(lines) if text in line and "_line(" not in line]
    return f"{HERE}:{n}"


def _jax_listing(fn, *args):
    """JAX's own listing: one (shape, dtype, bytes, memory kind, what JAX says) per value."""
    out = []
    for aval, said in saved_residuals(fn, *args):
        kind = "pinned_host" if "<host>" in aval.str_short() else "device"
        out.append(
            (tuple(aval.shape), np.dtype(aval.dtype), int(np.prod(aval.shape)) * aval.dtype.itemsize, kind, said)
        )
    return out


def _same_as_jax(found, fn, *args):
    """`found` holds the values of JAX's listing, largest first; where JAX names a value, by
    that name; an argument where JAX says so. Returns JAX's listing."""
    listing = _jax_listing(fn, *args)
    assert isinstance(found, ts.Residuals) and len(found) == len(listing)
    ours = sorted((r.shape, np.dtype(r.dtype), r.nbytes, r.memory_kind) for r in found)
    assert ours == sorted(row[:4] for row in listing)
    assert [r.nbytes for r in found] == sorted((r.nbytes for r in found), reverse=True)
    assert found.total_bytes == sum(row[2] for row in listing)
    assert sum(r.kind == "argument" for r in found) == sum(
        row[4].startswith(("from the argument", "from a constant")) for row in listing
    )
    named = collections.Counter(re.findall(r"named '(\w+)'", " ".join(row[4] for row in listing)))
    assert named <= collections.Counter(r.name for r in found if r.name is not None)
    return listing


# -- a plain loss ----------------------------------------------------------------------------
def mlp_loss(params, x):
    h = x
    for w in params:
        h = jnp.tanh(h @ w)  # the layer
    return h.sum()


PARAMS = [jnp.ones((4, 8), F32), jnp.ones((8, 3), F32)]
X = jnp.ones((2, 4), F32)


def test_a_plain_mlp_loss_saves_what_jax_lists():
    found = ts.residuals(mlp_loss, PARAMS, X)
    _same_as_jax(found, mlp_loss, PARAMS, X)
    assert [(r.kind, r.source, r.shape) for r in found if r.kind == "argument"] == [
        ("argument", "args[0][0]", (4, 8)),
        ("argument", "args[0][1]", (8, 3)),
        ("argument", "args[1]", (2, 4)),
    ]
    saved = [r for r in found if r.kind == "saved"]
    assert [r.shape for r in saved] == [(2, 8), (2, 8), (2, 3), (2, 3)]
    assert {r.source for r in saved} == {_line(mlp_loss, "# the layer")}
    assert {r.name for r in found} == {None} and {r.memory_kind for r in found} == {"device"}
    assert found.total_bytes == 128 + 96 + 32 + 2 * 64 + 2 * 24
    assert found.bytes_by_kind == {"device": found.total_bytes}
    assert found.bytes_by_name == {None: found.total_bytes}


def test_abstract_arguments_give_the_same_values_and_nothing_runs():
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (PARAMS, X))
    assert ts.residuals(mlp_loss, *abstract) == ts.residuals(mlp_loss, PARAMS, X)
    assert ts.residuals(mlp_loss, ts.structure_of(PARAMS), X) == ts.residuals(mlp_loss, PARAMS, X)  # a Structure
    big = jax.ShapeDtypeStruct((1 << 16, 1 << 16), F32)  # 16 GiB: only described
    found = ts.residuals(lambda w: jnp.sin(w).sum(), big)
    assert [(r.shape, r.nbytes, r.kind) for r in found] == [((1 << 16, 1 << 16), 1 << 34, "saved")]


def test_checkpoint_with_dots_saveable_saves_the_products():
    loss = jax.checkpoint(mlp_loss, policy=POLICIES.dots_saveable)
    found = ts.residuals(loss, PARAMS, X)
    _same_as_jax(found, loss, PARAMS, X)
    saved = [r for r in found if r.kind == "saved"]
    assert [r.shape for r in saved] == [(2, 8), (2, 3)]
    assert {r.source for r in saved} == {_line(mlp_loss, "# the layer")}


def named_loss(params, x):
    h = x
    for i, w in enumerate(params):
        h = checkpoint_name(h @ w, f"dot{i}")  # named
        h = jnp.tanh(h)
    return h.sum()


def test_named_values_with_save_only_these_names_are_named():
    loss = jax.checkpoint(named_loss, policy=POLICIES.save_only_these_names("dot0"))
    found = ts.residuals(loss, PARAMS, X)
    _same_as_jax(found, loss, PARAMS, X)
    (saved,) = [r for r in found if r.kind == "saved"]
    assert (saved.name, saved.shape, saved.source) == ("dot0", (2, 8), _line(named_loss, "# named"))
    assert found.bytes_by_name == {None: 128 + 96 + 32, "dot0": 64}


OFFLOAD = POLICIES.save_and_offload_only_these_names(
    names_which_can_be_saved=[],
    names_which_can_be_offloaded=["dot0", "dot1"],
    offload_src="device",
    offload_dst="pinned_host",
)


def test_an_offload_policy_names_the_offloaded_values_and_their_host_memory():
    """Traced on the CPU (nothing compiles): JAX lists an offloaded value as "output of
    device_put" alone; it is named by the policy's name and lives in pinned host memory."""
    loss = jax.checkpoint(named_loss, policy=OFFLOAD)
    found = ts.residuals(loss, PARAMS, X)
    listing = _same_as_jax(found, loss, PARAMS, X)
    assert sum("<host>" in str(aval) for aval, _ in saved_residuals(loss, PARAMS, X)) == 2
    assert not any("named" in row[4] for row in listing if row[3] == "pinned_host")  # what JAX says
    host = [r for r in found if r.memory_kind == "pinned_host"]
    assert [(r.name, r.shape, r.kind, r.source) for r in host] == [
        ("dot0", (2, 8), "saved", _line(named_loss, "# named")),
        ("dot1", (2, 3), "saved", _line(named_loss, "# named")),
    ]
    assert found.bytes_by_kind == {"device": 128 + 96 + 32, "pinned_host": 64 + 24}
    assert found.bytes_by_name == {None: 256, "dot0": 64, "dot1": 24}


def test_saving_one_name_and_offloading_another():
    policy = POLICIES.save_and_offload_only_these_names(
        names_which_can_be_saved=["dot1"],
        names_which_can_be_offloaded=["dot0"],
        offload_src="device",
        offload_dst="pinned_host",
    )
    loss = jax.checkpoint(named_loss, policy=policy)
    found = ts.residuals(loss, PARAMS, X)
    _same_as_jax(found, loss, PARAMS, X)
    assert {r.name: r.memory_kind for r in found if r.name} == {"dot0": "pinned_host", "dot1": "device"}


# -- loops -----------------------------------------------------------------------------------
def layer(c, w):
    h = checkpoint_name(c @ w, "proj")  # the projection
    return jnp.tanh(h), None


def scanned_loss(ws, x):
    c, _ = jax.lax.scan(layer, x, ws)  # the scan
    return c.sum()


WS = jnp.ones((5, 3, 3), F32)
XS = jnp.ones((2, 3), F32)


def test_a_scan_body_saves_each_step_stacked():
    found = ts.residuals(scanned_loss, WS, XS)
    _same_as_jax(found, scanned_loss, WS, XS)
    saved = [r for r in found if r.kind == "saved"]
    assert saved and {r.shape for r in saved} == {(5, 2, 3)}
    # Made inside the body: the body's line, found through the scan (JAX gives the scan's);
    # the carry's inputs, stacked, are the scan's.
    tanh, scan = _line(layer, "return jnp.tanh"), _line(scanned_loss, "# the scan")
    assert sorted(r.source for r in saved) == sorted([tanh, tanh, scan])


PROJ_OFFLOAD = POLICIES.save_and_offload_only_these_names(
    names_which_can_be_saved=[],
    names_which_can_be_offloaded=["proj"],
    offload_src="device",
    offload_dst="pinned_host",
)


@pytest.mark.parametrize(
    ("policy", "memory_kind"),
    [(PROJ_OFFLOAD, "pinned_host"), (POLICIES.save_only_these_names("proj"), "device")],
    ids=["offload", "save"],
)
def test_a_checkpointed_scan_body_names_its_stacked_values(policy, memory_kind):
    def loss(ws, x):
        c, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, ws)
        return c.sum()

    found = ts.residuals(loss, WS, XS)
    _same_as_jax(found, loss, WS, XS)
    (proj,) = [r for r in found if r.name == "proj"]
    assert (proj.shape, proj.source, proj.memory_kind) == ((5, 2, 3), _line(layer, "# the projection"), memory_kind)


def test_a_jitted_loss_that_offloads_is_followed_into_for_names_and_lines():
    """JAX lists each value as an "output of jitted function 'named_loss'", with no line."""
    loss = jax.jit(jax.checkpoint(named_loss, policy=OFFLOAD))
    found = ts.residuals(loss, PARAMS, X)
    listing = _same_as_jax(found, loss, PARAMS, X)
    assert all("jitted function 'named_loss'" in row[4] for row in listing if "argument" not in row[4])
    assert [(r.name, r.source, r.memory_kind) for r in found if r.kind == "saved"] == [
        ("dot0", _line(named_loss, "# named"), "pinned_host"),
        ("dot1", _line(named_loss, "# named"), "pinned_host"),
    ]


def test_a_named_value_inside_a_jitted_function_is_named_through_it():
    @jax.jit
    def inner(x):
        return checkpoint_name(jnp.sin(x), "s")  # inside

    loss = jax.checkpoint(lambda x: jnp.sin(inner(x)).sum(), policy=POLICIES.save_only_these_names("s"))
    x = jnp.ones(3, F32)
    found = ts.residuals(loss, x)
    _same_as_jax(found, loss, x)
    assert [(r.name, r.source) for r in found if r.kind == "saved"] == [("s", _line(inner, "# inside"))]


# -- calls -----------------------------------------------------------------------------------
def test_integer_inputs_are_kept_and_a_partial_or_closure_is_a_constant():
    def loss(w, x, labels):
        return (jnp.take(x @ w, labels, axis=1)).sum()

    w, x, labels = jnp.ones((4, 3), F32), jnp.ones((2, 4), F32), jnp.array([0, 2])
    _same_as_jax(ts.residuals(loss, w, x, labels), loss, w, x, labels)

    bound = ts.residuals(functools.partial(loss, w), x, labels)
    closed = ts.residuals(lambda x, labels: loss(w, x, labels), x, labels)
    _same_as_jax(bound, lambda x, labels: loss(w, x, labels), x, labels)
    assert bound == closed
    assert [r.source for r in closed if r.kind == "argument"] == ["closed over"]


def test_keyword_arguments_are_named_by_their_path():
    found = ts.residuals(lambda w, *, x: jnp.sin(x @ w).sum(), jnp.ones((4, 3), F32), x=jnp.ones((2, 4), F32))
    assert sorted(r.source for r in found if r.kind == "argument") == ["args[0]", "kwargs['x']"]


def test_called_inside_jit_and_vmap_with_tracers_nothing_leaks():
    seen = []

    @jax.jit
    def step(params, x):
        seen.append(ts.residuals(mlp_loss, params, x))
        return mlp_loss(params, x)

    with jax.checking_leaks():
        step(PARAMS, X)
        jax.vmap(lambda x: seen.append(ts.residuals(mlp_loss, PARAMS, x)) or x.sum())(jnp.ones((3, 2, 4), F32))
    assert seen[0] == ts.residuals(mlp_loss, PARAMS, X)
    assert seen[1] == ts.residuals(mlp_loss, PARAMS, X)  # one example's values


def test_a_closure_over_a_tracer_inside_jit_does_not_leak():
    found = []

    @jax.jit
    def step(w, x):
        found.append(ts.residuals(lambda x: jnp.sin(x @ w).sum(), x))
        return w

    with jax.checking_leaks():
        step(jnp.ones((4, 3), F32), X)
    assert sorted((r.kind, r.source, r.shape) for r in found[0]) == [
        ("argument", "closed over", (4, 3)),
        ("saved", _line(test_a_closure_over_a_tracer_inside_jit_does_not_leak, "jnp.sin(x @ w)"), (2, 3)),
    ]


# -- errors a user can cause -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fn", "got", "fix"),
    [
        (lambda x: jnp.sin(x), "f32[3]", "`fn(...).mean()` or `.sum()`"),
        (lambda x: (jnp.sin(x).sum(), {"acc": x.mean()}), "a pytree of f32[], f32[]", "lambda *args: fn(*args)[0]"),
        (lambda x: jnp.sin(x).sum().astype(jnp.int32), "i32[]", ".astype(jnp.float32)"),
        (lambda x: (x * 1j).sum(), "c64[]", "`jnp.abs(...)` or `.real`"),
    ],
    ids=["vector", "pair", "integer", "complex"],
)
def test_a_function_that_does_not_return_a_scalar_loss_is_refused(fn, got, fix):
    with pytest.raises(TypeError) as info:
        ts.residuals(fn, jnp.ones(3, F32))
    message = str(info.value)
    assert message.startswith("treeshape.residuals: `fn` must return a scalar loss")
    assert f"but it returned {got}" in message and fix in message


def test_a_call_without_a_floating_point_input_is_refused():
    w = jnp.ones((4, 3), F32)
    with pytest.raises(TypeError, match=re.escape("no argument of `fn` can be differentiated")) as info:
        ts.residuals(lambda tokens: w[tokens].sum(), jnp.array([0, 1], jnp.int32))
    assert "args[0]: i32[2]" in str(info.value) and "ts.residuals(fn, params, batch)" in str(info.value)


def test_an_error_of_the_users_function_keeps_its_type_with_a_note():
    def loss(x):
        raise KeyError("missing")

    with pytest.raises(KeyError) as info:
        ts.residuals(loss, jnp.ones(3, F32))
    assert info.value.args == ("missing",)
    assert any("treeshape.residuals: raised while tracing `jax.vjp` of `loss`" in n for n in info.value.__notes__)


def test_a_python_scalar_that_must_be_concrete_says_how_to_bind_it():
    def loss(x, n):
        return jnp.tile(x, n).sum()

    with pytest.raises(TypeError) as info:
        ts.residuals(loss, jnp.ones(3, F32), 2)
    assert any("functools.partial(loss, n=2)" in n for n in info.value.__notes__)


def test_not_a_callable_is_refused():
    with pytest.raises(TypeError, match=re.escape("treeshape.residuals: `fn` must be callable")):
        ts.residuals(jnp.ones(3), jnp.ones(3))


# -- the result ------------------------------------------------------------------------------
def test_residuals_are_frozen_picklable_and_print_a_table():
    found = ts.residuals(jax.checkpoint(named_loss, policy=OFFLOAD), PARAMS, X)
    with pytest.raises(AttributeError):
        found[0].nbytes = 1
    assert pickle.loads(pickle.dumps(found)) == found and type(pickle.loads(pickle.dumps(found))) is ts.Residuals
    assert repr(found) == "Residuals(5 values, 344 B)"
    lines = str(found).splitlines()
    assert lines[0].split() == ["name", "source", "shape", "dtype", "kind", "memory", "bytes"]
    assert lines[2].split() == ["-", "args[0][0]", "[4,8]", "f32", "argument", "device", "128", "B"]
    assert lines[4].split() == ["dot0", _line(named_loss, "# named"), "[2,8]", "f32", "saved", "pinned_host", "64", "B"]
    assert lines[-1] == "total: 5 values, 344 B (device 256 B, pinned_host 88 B)"
    page = found._repr_html_()
    assert page.startswith("<table") and "pinned_host" in page and "total: 5 values" in page


# -- properties ------------------------------------------------------------------------------
@given(
    widths=st.lists(st.integers(1, 6), min_size=2, max_size=4),
    batch=st.integers(1, 4),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]),
    policy=st.sampled_from([None, "dots", "nothing"]),
)
def test_random_mlps_save_what_jax_lists(widths, batch, dtype, policy):
    params = [jax.ShapeDtypeStruct((a, b), dtype) for a, b in zip(widths, widths[1:], strict=False)]
    x = jax.ShapeDtypeStruct((batch, widths[0]), dtype)
    loss = mlp_loss
    if policy is not None:
        chosen = POLICIES.dots_saveable if policy == "dots" else POLICIES.nothing_saveable
        loss = jax.checkpoint(mlp_loss, policy=chosen)
    found = ts.residuals(loss, params, x)
    _same_as_jax(found, loss, params, x)  # (JAX's listing traces the same abstract values)
    assert all(r.dtype == dtype for r in found)


# -- the command line ------------------------------------------------------------------------
_MODULE = """
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


def loss(w, x):
    h = checkpoint_name(x @ w, "proj")
    return jnp.tanh(h).sum()


policy = jax.checkpoint_policies.save_only_these_names("proj")
checkpointed = jax.checkpoint(loss, policy=policy)
"""


def test_the_command_prints_the_table_and_json(tmp_path):
    (tmp_path / "model_residuals.py").write_text(textwrap.dedent(_MODULE))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "treeshape", "residuals", "model_residuals:checkpointed", "f32[16,8]", "f32[4,16]"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["name", "source", "shape", "dtype", "kind", "memory", "bytes"]
    assert lines[2].split() == ["-", "args[0]", "[16,8]", "f32", "argument", "device", "512", "B"]
    assert lines[-1] == "total: 3 values, 896 B"
    done = subprocess.run([*argv, "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"name": None, "source": "args[0]", "shape": [16, 8], "dtype": "float32", "nbytes": 512,
         "memory_kind": "device", "kind": "argument"},
        {"name": None, "source": "args[1]", "shape": [4, 16], "dtype": "float32", "nbytes": 256,
         "memory_kind": "device", "kind": "argument"},
        {"name": "proj", "source": "model_residuals.py:8", "shape": [4, 8], "dtype": "float32", "nbytes": 128,
         "memory_kind": "device", "kind": "saved"},
    ]  # fmt: skip


def test_the_command_reports_a_loss_that_is_not_a_scalar_in_one_line(capsys):
    assert main(["residuals", "jax.numpy:sin", "f32[3]"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("treeshape: error: calling jax.numpy:sin failed: TypeError: treeshape.residuals: `sin`")
    assert len(err.splitlines()) == 1
    assert main(["residuals", "jax.nn:logsumexp", "f32[8]", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    listing = _jax_listing(jax.nn.logsumexp, jnp.zeros(8, F32))
    assert sorted(r["nbytes"] for r in records) == sorted(row[2] for row in listing) and records


# -- the guide -------------------------------------------------------------------------------
_FENCED = re.compile(r"^```(\w+)\n(.*?)^```\n", flags=re.DOTALL | re.MULTILINE)


def test_the_guide_prints_what_it_shows(capsys):
    """docs/guide/residuals.md's python blocks in order, its first as the `model.py` it says
    it is, each followed by the text block it prints."""
    page = (pathlib.Path(__file__).parents[1] / "docs" / "guide" / "residuals.md").read_text()
    blocks = [(m[1], m[2]) for m in _FENCED.finditer(page)]
    pairs = [
        (code, out if lang == "text" else None)
        for (k, code), (lang, out) in zip(blocks, blocks[1:] + [("", "")], strict=True)
        if k == "python"
    ]
    assert len(pairs) == 4 and sum(shown is not None for _, shown in pairs) == 3
    namespace: dict = {}
    with jax.enable_x64(False):
        for i, (code, shown) in enumerate(pairs):
            exec(compile(code, "model.py" if i == 0 else f"<guide block {i}>", "exec"), namespace)
            printed = capsys.readouterr().out
            if shown is not None:
                assert printed == shown, code
