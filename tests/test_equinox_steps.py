"""Steps jitted by `eqx.filter_jit` and `nnx.jit`, costed, inferred and fitted as those
wrappers compile them, and their buffers named as the user names them.

The oracle is the wrapper's own program: `eqx.filter_jit(step).lower(...).compile()`
(equinox's program returns one more output, an int32 marker, which `ts.cost`'s does not)
and `nnx.jit(step).lower(...).compile()`.
"""

import functools as ft
import re
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import treeshape as ts


class Net(eqx.Module):
    """In the style of equinox's examples: Python fields next to the layers."""

    linear: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    hidden_size: int
    inference: bool
    scale: float

    def __init__(self, key: jax.Array) -> None:
        self.linear = eqx.nn.Linear(16, 32, key=key)
        self.norm = eqx.nn.LayerNorm(32)
        self.hidden_size = 32
        self.inference = False
        self.scale = 0.5

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.norm(jax.nn.relu(self.linear(x))) + jnp.zeros(self.hidden_size)
        return y if self.inference else y * self.scale


def loss(model: Net, x: jax.Array) -> jax.Array:
    return jnp.mean(jax.vmap(model)(x) ** 2)


def step(model: Net, opt_state: optax.OptState, x: jax.Array) -> tuple[Net, optax.OptState, jax.Array]:
    value, grads = eqx.filter_value_and_grad(loss)(model, x)
    updates, opt_state = OPTIM.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, value


OPTIM = optax.adam(1e-3)
MODEL = Net(jax.random.key(0))
OPT_STATE = OPTIM.init(eqx.filter(MODEL, eqx.is_array))
X = jnp.zeros((64, 16))  # an array: to `eqx.filter_jit`, a ShapeDtypeStruct is a static value


def _compiled(jitted, *args):
    lowered = jitted.lower(*args)
    return getattr(lowered, "lowered", lowered).compile()  # equinox's Lowered holds JAX's


def _ops(text):
    """The operations named in a compiled program's metadata (a fusion's by its first)."""
    return {name.split(";")[0] for name in re.findall(r'op_name="([^"]+)"', text)}


def _marker_bytes(n_outputs: int) -> int:
    """What equinox's marker output adds: its bytes (an int32, an int64 with x64 on), and its
    entry (8 bytes) in XLA's table of the outputs, which a program of one output has none of."""
    return jnp.asarray(0).dtype.itemsize + 8 + (8 if n_outputs == 1 else 0)


@pytest.mark.parametrize("call", ["positional", "partial"])
def test_filter_jit_step_costs_as_equinox_compiles_it(call):
    jitted = eqx.filter_jit(step)
    compiled = _compiled(jitted, MODEL, OPT_STATE, X)
    memory = compiled.memory_analysis()
    if call == "positional":
        c = ts.cost(jitted, MODEL, OPT_STATE, X)
    else:  # the model bound in a partial: its Python fields are static all the same
        c = ts.cost(ft.partial(jitted, MODEL), OPT_STATE, X)
    assert c.argument_bytes == memory.argument_size_in_bytes
    assert c.temp_bytes == memory.temp_size_in_bytes
    assert c.flops == compiled.cost_analysis()["flops"]
    n_outputs = len(jax.tree.leaves(eqx.filter(jitted(MODEL, OPT_STATE, X), eqx.is_array)))
    assert c.output_bytes == memory.output_size_in_bytes - _marker_bytes(n_outputs)


def test_filter_jit_python_fields_are_static_in_out_structure():
    jitted = eqx.filter_jit(step)
    s = ts.out_structure(jitted, MODEL, OPT_STATE, X)
    theirs = eqx.filter_eval_shape(step, MODEL, OPT_STATE, X)  # the Python fields as values
    assert jax.tree.structure(s.tree) == jax.tree.structure(theirs)
    assert jax.tree.leaves(s.tree) == jax.tree.leaves(theirs)
    model = s.tree[0]
    assert (model.hidden_size, model.inference, model.scale) == (32, False, 0.5)


def test_filter_jit_branching_on_a_python_field():
    """`if self.inference` and `jnp.zeros(self.hidden_size)` need the fields as values."""
    model = eqx.nn.inference_mode(MODEL)
    jitted = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))
    compiled = _compiled(jitted, model, X)
    c = ts.cost(jitted, model, X)
    assert c.flops == compiled.cost_analysis()["flops"]
    assert c.argument_bytes == compiled.memory_analysis().argument_size_in_bytes
    assert ts.out_structure(jitted, model, X).tree == jax.ShapeDtypeStruct((64, 32), X.dtype)


def test_filter_jit_step_fits_as_equinox_compiles_it():
    (b,) = jax.export.symbolic_shape("b")
    jitted = eqx.filter_jit(step)
    budget = 1_000_000
    fit = ts.largest_fit(jitted, MODEL, OPT_STATE, jax.ShapeDtypeStruct((b, 16), X.dtype), dim="b", budget=budget)

    def peak(n):
        m = _compiled(jitted, MODEL, OPT_STATE, jnp.zeros((n, 16), X.dtype)).memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes

    marker = _marker_bytes(3)
    assert peak(fit.size) - marker <= budget < peak(fit.size + 1) - marker


def test_buffers_are_named_by_path_and_ops_as_equinox_names_them():
    jitted = eqx.filter_jit(step)
    c = ts.cost(jitted, MODEL, OPT_STATE, X)
    paths = {b.path for b in c.buffers if b.kind == "argument"}
    assert "args[0].linear.weight" in paths
    assert "args[2]" in paths
    bound = ts.cost(ft.partial(jitted, MODEL), OPT_STATE, X)
    assert "model.linear.weight" in {b.path for b in bound.buffers}
    for b in c.buffers + bound.buffers:
        assert not re.search(r"bound_|_call|dynamic\[|\]\[\d+\]$", f"{b.path} {b.op}"), b
    # each temporary's op as equinox's own program's metadata gives it
    theirs = _ops(_compiled(jitted, MODEL, OPT_STATE, X).as_text())
    ours = {b.op.split(";")[0] for b in c.buffers if b.op is not None}
    assert ours and ours <= theirs
    assert all(op.startswith("jit(step)/") or op == "jit(step)" for op in ours)


def test_donation_is_keyed_by_path():
    jitted = eqx.filter_jit(step, donate="all")
    with warnings.catch_warnings():  # equinox's own call hides it too: the batch is donated, and no output reuses it
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        c = ts.cost(jitted, MODEL, OPT_STATE, X)
        alias = _compiled(jitted, MODEL, OPT_STATE, X).memory_analysis().alias_size_in_bytes
    assert "args[0].linear.weight" in c.donation
    assert c.donation["args[0].linear.weight"].reused
    arrays = jax.tree_util.tree_flatten_with_path(eqx.filter((MODEL, OPT_STATE, X), eqx.is_array))[0]
    assert set(c.donation) == {"args" + jax.tree_util.keystr(keys) for keys, _ in arrays}
    assert c.alias_bytes == alias


class Scaler(eqx.Module):
    """A method under `eqx.filter_jit`, called bound (`model.update(x)`): equinox binds
    `self` to the wrapper in an `eqx.Partial`."""

    weight: jax.Array
    size: int
    frozen: bool

    @eqx.filter_jit
    def update(self, x: jax.Array) -> tuple["Scaler", jax.Array]:
        new = self if self.frozen else eqx.tree_at(lambda m: m.weight, self, self.weight + x.sum())
        return new, jnp.tile(x, self.size)


def test_a_bound_method_under_filter_jit_keeps_the_modules_python_fields_static():
    model, x = Scaler(jnp.ones((4, 4)), 3, False), jnp.ones(8)
    s, theirs = ts.out_structure(model.update, x), eqx.filter_eval_shape(model.update, x)
    assert jax.tree.structure(s.tree) == jax.tree.structure(theirs)
    assert jax.tree.leaves(s.tree) == jax.tree.leaves(theirs)
    assert (s.tree[0].size, s.tree[0].frozen) == (3, False)
    c = ts.cost(model.update, x)
    compiled = _compiled(Scaler.update, model, x)
    memory = compiled.memory_analysis()
    assert (c.flops, c.argument_bytes) == (compiled.cost_analysis()["flops"], memory.argument_size_in_bytes)
    assert c.output_bytes == memory.output_size_in_bytes - _marker_bytes(2)  # the fields are no outputs
    assert {b.path for b in c.buffers if b.kind == "argument"} == {"self.weight", "args[0]"}


class Counter(eqx.Module):
    """A module whose `__call__` is `@eqx.filter_jit`, called as `model(x)`: it returns itself
    and Python numbers, which equinox keeps static."""

    weight: jax.Array
    calls: int
    frozen: bool

    @eqx.filter_jit
    def __call__(self, x: jax.Array) -> tuple["Counter", int, bool, jax.Array]:
        new = eqx.tree_at(lambda m: m.calls, self, self.calls + 1)
        return new, self.calls * 2, not self.frozen, jnp.tile(x, self.calls)


def test_a_module_whose_call_is_filter_jit_keeps_its_python_fields_static_in_out_structure():
    model, x = Counter(jnp.ones((4, 4), jnp.float32), 3, False), jnp.ones(8, jnp.float32)
    s = ts.out_structure(model, x)
    new, doubled, thawed, _ = model(x)
    assert (s.tree[0].calls, s.tree[0].frozen, s.tree[1], s.tree[2]) == (new.calls, new.frozen, doubled, thawed)
    assert (type(s.tree[0].calls), type(s.tree[2])) == (int, bool)
    assert s.tree[3] == jax.ShapeDtypeStruct((24,), jnp.float32)
    theirs = eqx.filter_eval_shape(model, x)
    assert jax.tree.structure(s.tree) == jax.tree.structure(theirs)
    assert jax.tree.leaves(s.tree) == jax.tree.leaves(theirs)
    c = ts.cost(model, x)  # the Python numbers are no outputs of equinox's program
    compiled = _compiled(Counter.__call__, model, x)
    assert c.output_bytes == compiled.memory_analysis().output_size_in_bytes - _marker_bytes(2)


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(16, 32, rngs=rngs)
        self.linear2 = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear2(nnx.relu(self.linear1(x)))


def test_nnx_jit_ops_are_nnx_jit_s_own():
    model = MLP(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, opt, x, y):
        def loss_fn(model):
            return ((model(x) - y) ** 2).mean()

        value, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return value

    x, y = jnp.zeros((64, 16)), jnp.zeros((64, 4))
    c = ts.cost(train_step, model, opt, x, y)
    ours = {b.op.split(";")[0] for b in c.buffers if b.op is not None}
    theirs = _ops(train_step.lower(model, opt, x, y).compile().as_text())
    assert ours and ours <= theirs
    assert not any(op.startswith("jit(train_step)/jit(train_step)") for op in ours)
    assert "args[0].linear1.kernel.value" in {b.path for b in c.buffers}
    groups = c.breakdown(depth=1)
    assert "jit(train_step)" not in groups and "transpose(jvp())" in groups


def test_a_jitted_module_s_arrays_are_named_by_their_paths_in_it():
    model = eqx.nn.MLP(16, 4, 32, 1, key=jax.random.key(1))
    x = jnp.zeros(16)
    jitted = ts.cost(eqx.filter_jit(model), x)
    plain = ts.cost(model, x)
    arguments = sorted(b.path for b in jitted.buffers if b.kind == "argument")
    assert arguments == sorted(b.path for b in plain.buffers if b.kind == "argument")
    assert "self.layers[0].weight" in arguments
    assert jitted.argument_bytes == _compiled(eqx.filter_jit(model), x).memory_analysis().argument_size_in_bytes


class RNN(eqx.Module):
    """equinox's train_rnn example's model: a `hidden_size: int` read inside the step."""

    hidden_size: int
    cell: eqx.nn.GRUCell
    linear: eqx.nn.Linear
    unroll: int

    def __init__(self, key: jax.Array, hidden_size: int = 16, unroll: int = 1) -> None:
        ckey, lkey = jax.random.split(key)
        self.hidden_size = hidden_size
        self.cell = eqx.nn.GRUCell(2, hidden_size, key=ckey)
        self.linear = eqx.nn.Linear(hidden_size, 1, key=lkey)
        self.unroll = unroll

    def __call__(self, xs: jax.Array) -> jax.Array:
        h = jnp.zeros((self.hidden_size,))
        out, _ = jax.lax.scan(lambda h, x: (self.cell(x, h), None), h, xs, unroll=self.unroll)
        return self.linear(out)


@eqx.filter_jit
def rnn_grads(model: RNN, xs: jax.Array) -> RNN:
    return eqx.filter_grad(lambda m: jnp.mean(jax.vmap(m)(xs)))(model)


def test_a_recurrent_step_with_a_python_size_costs_as_equinox_compiles_it():
    model, xs = RNN(jax.random.key(2)), jnp.zeros((32, 16, 2))
    compiled = _compiled(rnn_grads, model, xs)
    c = ts.cost(rnn_grads, model, xs)
    memory = compiled.memory_analysis()
    assert (c.argument_bytes, c.temp_bytes) == (memory.argument_size_in_bytes, memory.temp_size_in_bytes)
    ours = {b.op.split(";")[0] for b in c.buffers if b.op is not None}
    assert ours and ours <= _ops(compiled.as_text())  # never the wrapper's call alone (`jit(rnn_grads)`)
    s, theirs = ts.out_structure(rnn_grads, model, xs), eqx.filter_eval_shape(rnn_grads.__wrapped__, model, xs)
    assert jax.tree.structure(s.tree) == jax.tree.structure(theirs)
    assert jax.tree.leaves(s.tree) == jax.tree.leaves(theirs)


@pytest.mark.parametrize(("hidden", "length", "within"), [(64, 16, 0.02), (64, 64, 0.02), (16, 16, 0.035)])
def test_a_gru_under_vmap_and_grad_costs_as_its_unrolled_twin(hidden, length, within):
    # The oracle is the same step with the scan unrolled (`unroll=length`: `True` would hash as
    # the `1` of the step itself, and equinox would hand back that program). Both run the same dots and
    # transcendentals per step; a small cell is mostly elementwise work, which XLA's unrolled
    # program recomputes in more of its fusions (at hidden size 16: 48% more multiplies and
    # twice the subtractions per step), so the twin reports 2-3% more than the loop runs.
    xs = jnp.zeros((32, length, 2))
    c = ts.cost(rnn_grads, RNN(jax.random.key(2), hidden), xs)
    analysis = _compiled(rnn_grads, RNN(jax.random.key(2), hidden, unroll=length), xs).cost_analysis()
    if isinstance(analysis, list):  # older releases: one dict per program
        analysis = analysis[0]
    assert c.exact_flops
    assert c.flops == pytest.approx(analysis["flops"], rel=within)
