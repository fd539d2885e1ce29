"""`ts.cost` costs the program the user's own jit compiles: a `jax.jit` / `eqx.filter_jit` /
`nnx.jit` wrapper with its donation, static arguments and shardings, a flax.nnx train step
that updates its modules in place, donation of keyword arguments, the per-device program
inside `shard_map`, inputs planned on an abstract mesh; its cache for calls that keep their
bound values concrete, and JAX's messages naming the user's inputs. The oracle is always
the user's own `.lower(...).compile()`."""

import functools as ft
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts


F32 = jnp.float32
FIELDS = ("flops", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes")


def own(compiled):
    """The figures of a program the user compiled (`.lower(...).compile()`)."""
    compiled = getattr(compiled, "compiled", compiled)  # equinox wraps jax's Compiled
    memory = compiled.memory_analysis()
    return {
        "flops": compiled.cost_analysis().get("flops"),
        "argument_bytes": memory.argument_size_in_bytes,
        "output_bytes": memory.output_size_in_bytes,
        "temp_bytes": memory.temp_size_in_bytes,
        "alias_bytes": memory.alias_size_in_bytes,
    }


def figures(c):
    return {k: getattr(c, k) for k in FIELDS}


STATE = {"w": jnp.zeros((256, 256), F32), "b": jnp.zeros((256,), F32)}
BATCH = jnp.zeros((32, 256), F32)


def step(state, batch):
    def loss(s):
        return jnp.mean(jnp.tanh(batch @ s["w"] + s["b"]) ** 2)

    grads = jax.grad(loss)(state)
    return jtu.tree_map(lambda p, g: p - 0.1 * g, state, grads), batch * 2.0


STATE_BYTES = (256 * 256 + 256) * 4
BATCH_BYTES = 32 * 256 * 4
PY_FLOAT_BYTES = jnp.asarray(2.0).dtype.itemsize  # a traced Python float: 8 bytes under jax_enable_x64


# -- a jitted step ---------------------------------------------------------------------
@pytest.mark.parametrize("donation", [{"donate_argnums": 0}, {"donate_argnames": "state"}])
def test_a_jitted_step_keeps_its_own_donation(donation):
    jitted = jax.jit(step, **donation)
    c = ts.cost(jitted, STATE, BATCH)
    assert figures(c) == own(jitted.lower(STATE, BATCH).compile())
    assert c.alias_bytes == STATE_BYTES
    assert ts.cost(step, STATE, BATCH).alias_bytes == 0  # the same function, not jitted by the user


def test_donation_given_to_cost_is_added_to_the_wrappers():
    c = ts.cost(jax.jit(step, donate_argnums=0), STATE, BATCH, donate_argnums=1)
    assert figures(c) == own(jax.jit(step, donate_argnums=(0, 1)).lower(STATE, BATCH).compile())
    assert c.alias_bytes == STATE_BYTES + BATCH_BYTES


def test_a_jitted_step_keeps_its_static_arguments():
    def tile(x, n, mode):
        return jnp.tile(x, n) if mode == "tile" else x * n

    jitted = jax.jit(tile, static_argnums=1, static_argnames="mode")
    c = ts.cost(jitted, BATCH, 3, mode="tile")
    assert figures(c) == own(jitted.lower(BATCH, 3, mode="tile").compile())
    assert c.output_bytes == 3 * BATCH_BYTES


@pytest.mark.parametrize("wrap", [jax.jit, nnx.jit], ids=["jax.jit", "nnx.jit"])
@pytest.mark.parametrize("static", [{"static_argnums": 1}, {"static_argnames": "n"}])
@pytest.mark.parametrize("passed", ["position", "keyword"])
def test_a_jit_wrappers_static_arguments_stay_static_passed_either_way(wrap, static, passed):
    def tile(x, n, scale):
        return jnp.tile(x, n) * scale

    args, kwargs = ((BATCH, 3), {"scale": 2.0}) if passed == "position" else ((BATCH,), {"n": 3, "scale": 2.0})
    theirs = jax.jit(tile, **static)
    assert ts.out_structure(wrap(tile, **static), *args, **kwargs).tree == jax.eval_shape(theirs, *args, **kwargs)
    c = ts.cost(wrap(tile, **static), *args, **kwargs)
    assert figures(c) == own(theirs.lower(*args, **kwargs).compile())
    assert (c.argument_bytes, c.output_bytes) == (BATCH_BYTES + PY_FLOAT_BYTES, 3 * BATCH_BYTES)  # `scale` is traced


@pytest.mark.parametrize("wrap", [jax.jit, nnx.jit], ids=["jax.jit", "nnx.jit"])
def test_a_negative_static_argnum_counts_back_from_the_last_positional_argument(wrap):
    def tile(x, n):
        return jnp.tile(x, n)

    expected = jax.eval_shape(jax.jit(tile, static_argnums=-1), BATCH, 3)
    assert ts.out_structure(wrap(tile, static_argnums=-1), BATCH, 3).tree == expected


@pytest.mark.parametrize("where", ["donated", "under jit"])
def test_a_jitted_steps_traced_python_scalar_stays_an_argument_where_cost_jits_around_it(where):
    def scaled(x, n, scale):
        return x * (scale * n)

    jitted = jax.jit(scaled, static_argnums=1)
    if where == "donated":  # donation given to `cost`: the program jits around the wrapper
        c = ts.cost(jitted, BATCH, 3, 2.0, donate_argnums=0)
        expected = own(jax.jit(scaled, static_argnums=1, donate_argnums=0).lower(BATCH, 3, 2.0).compile())
    else:  # under a transformation: the program is traced there, then compiled alone
        found = []
        jax.jit(lambda x: found.append(ts.cost(jitted, x, 3, 2.0)) or x)(BATCH)
        [c] = found
        expected = own(jitted.lower(BATCH, 3, 2.0).compile())
    assert figures(c) == expected
    assert expected["argument_bytes"] == BATCH_BYTES + PY_FLOAT_BYTES


def test_a_jitted_step_keeps_its_shardings():
    mesh = jax.make_mesh((8,), ("d",), axis_types=(AxisType.Explicit,))
    rows = NamedSharding(mesh, P("d"))
    jitted = jax.jit(step, in_shardings=({"w": rows, "b": NamedSharding(mesh, P())}, rows), out_shardings=rows)
    c = ts.cost(jitted, STATE, BATCH)  # unplaced inputs: the wrapper's shardings place them
    assert figures(c) == own(jitted.lower(STATE, BATCH).compile())
    assert c.argument_bytes == (256 * 256 // 8 + 256 + 32 * 256 // 8) * 4  # per device


def test_an_equinox_filter_jit_keeps_its_donation():
    jitted = eqx.filter_jit(step, donate="all")
    c = ts.cost(jitted, STATE, BATCH)
    assert figures(c) == own(jax.jit(step, donate_argnums=(0, 1)).lower(STATE, BATCH).compile())
    theirs = own(jitted.lower(STATE, BATCH).compile())
    # equinox's own program also returns a scalar marker (4 bytes, and its entry in the
    # output tuple), which the step's caller never sees; every other figure is the same.
    assert {k: v for k, v in figures(c).items() if k != "output_bytes"} == {
        k: v for k, v in theirs.items() if k != "output_bytes"
    }
    assert 4 <= theirs["output_bytes"] - c.output_bytes <= 16
    assert c.alias_bytes == STATE_BYTES + BATCH_BYTES


# -- a flax.nnx train step that updates in place ---------------------------------------
class MLP(nnx.Module):
    def __init__(self, d, h, rngs):
        self.l1 = nnx.Linear(d, h, rngs=rngs)
        self.l2 = nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))


def train(model, opt, x):
    def loss_fn(m):
        return jnp.mean((m(x) - x) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss


def _model():
    return MLP(64, 256, nnx.Rngs(0))


def _optimizer(model):
    return nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)


X = jnp.ones((16, 64), F32)
STATE_NNX = (64 * 256 + 256 + 256 * 64 + 64) * 4  # the parameters


def test_an_nnx_step_that_updates_in_place_costs_as_nnx_jit_compiles_it():
    model = _model()
    opt = _optimizer(model)
    kernel, before = model.l1.kernel, np.asarray(model.l1.kernel[...])
    c = ts.cost(train, model, opt, X)
    assert figures(c) == own(nnx.jit(train).lower(model, opt, X).compile())
    # the updated parameters and optimizer state are outputs: twice the parameters (adam's
    # mu and nu) plus the parameters, the step count and the loss
    assert c.output_bytes >= 3 * STATE_NNX
    assert model.l1.kernel is kernel and np.array_equal(np.asarray(model.l1.kernel[...]), before)
    assert int(opt.step[...]) == 0  # the modules passed in are left unchanged


class Noisy(nnx.Module):
    """Dropout draws from its own `Rngs` (a counter updated in place) and batch norm
    updates its running statistics: both are state the step updates."""

    def __init__(self):
        self.linear = nnx.Linear(64, 64, rngs=nnx.Rngs(0))
        self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(1))
        self.norm = nnx.BatchNorm(64, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.norm(self.drop(self.linear(x)))


def test_rng_counters_and_batch_statistics_are_outputs_too():
    def forward(model, x):
        return model(x)

    model = Noisy()
    c = ts.cost(forward, model, X)
    assert figures(c) == own(nnx.jit(forward).lower(model, X).compile())
    assert c.output_bytes > 16 * 64 * 4 + 2 * 64 * 4  # the output and the new statistics, at least


def test_a_module_both_updated_and_returned_is_one_output():
    def shift(model, x):
        model.l1.bias[...] = model.l1.bias[...] + 1.0
        return model, model(x)

    model = _model()
    c = ts.cost(shift, model, X)
    assert figures(c) == own(nnx.jit(shift).lower(model, X).compile())
    assert c.output_bytes < 2 * STATE_NNX


def test_an_abstract_nnx_model_costs_the_same():
    model = _model()
    opt = _optimizer(model)
    expected = own(nnx.jit(train).lower(model, opt, X).compile())
    abstract_model = nnx.eval_shape(_model)
    abstract_opt = nnx.eval_shape(lambda: _optimizer(_model()))
    c = ts.cost(train, abstract_model, abstract_opt, jax.ShapeDtypeStruct(X.shape, F32))
    assert figures(c) == expected


def test_an_nnx_jit_wrapper_keeps_its_donation():
    model = _model()
    opt = _optimizer(model)
    jitted = nnx.jit(train, donate_argnums=(0, 1))
    c = ts.cost(jitted, model, opt, X)
    assert figures(c) == own(jitted.lower(model, opt, X).compile())
    assert c.alias_bytes >= 3 * STATE_NNX
    assert int(opt.step[...]) == 0


def test_an_nnx_step_finds_the_batch_that_fits():
    model = nnx.eval_shape(_model)
    opt = nnx.eval_shape(lambda: _optimizer(_model()))
    (b,) = jax.export.symbolic_shape("b")
    budget = 3_000_000
    fit = ts.largest_fit(train, model, opt, jax.ShapeDtypeStruct((b, 64), F32), dim="b", budget=budget)
    at = lambda n: own(nnx.jit(train).lower(model, opt, jax.ShapeDtypeStruct((n, 64), F32)).compile())  # noqa: E731
    peak = lambda f: f["argument_bytes"] + f["output_bytes"] + f["temp_bytes"] - f["alias_bytes"]  # noqa: E731
    assert peak(at(fit.size)) <= budget < peak(at(fit.size + 1))


# -- donation by keyword -----------------------------------------------------------------
def test_donate_argnums_reaches_arguments_passed_by_keyword():
    c = ts.cost(step, state=STATE, batch=BATCH, donate_argnums=0)
    assert figures(c) == own(jax.jit(step, donate_argnums=0).lower(state=STATE, batch=BATCH).compile())
    assert c.alias_bytes == STATE_BYTES
    assert ts.cost(step, STATE, batch=BATCH, donate_argnums=(0, 1)).alias_bytes == STATE_BYTES + BATCH_BYTES
    with pytest.raises(ValueError, match=r"donate_argnums has 2.*1 positional arguments \(batch by keyword\)"):
        ts.cost(step, STATE, batch=BATCH, donate_argnums=2)


# -- inside shard_map ------------------------------------------------------------------
def _in_shard_map(body, *xs):
    mesh = jax.make_mesh((8,), ("i",), axis_types=(AxisType.Explicit,))
    spread = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return spread(*(jax.device_put(x, NamedSharding(mesh, P("i"))) for x in xs))


def _local_oracle(f, *shapes):
    return own(jax.jit(f).lower(*(jax.ShapeDtypeStruct(s, F32) for s in shapes)).compile())


def test_inside_shard_map_the_figures_are_one_devices_program():
    found = []

    def layer(a, w):
        return jnp.tanh(a @ w)

    def body(x, w):
        found.append(ts.cost(layer, x, w[0]))  # x: (4, 16) on each device, w: (16, 16)
        found.append(ts.cost(lambda a: jax.lax.scan(lambda c, _: (jnp.sin(c) + x, None), a, length=3)[0], x))
        found.append(ts.cost(lambda a: a * x.sum(), jax.ShapeDtypeStruct((7,), F32)))
        found.append(ts.cost(lambda a: (a * x).sum(), x))
        return x

    _in_shard_map(body, jnp.ones((32, 16), F32), jnp.ones((8, 16, 16), F32))
    assert figures(found[0]) == _local_oracle(layer, (4, 16), (16, 16))
    scan = lambda a, x: jax.lax.scan(lambda c, _: (jnp.sin(c) + x, None), a, length=3)[0]  # noqa: E731
    assert figures(found[1]) == _local_oracle(scan, (4, 16), (4, 16))
    assert figures(found[2]) == _local_oracle(lambda a, x: a * x.sum(), (7,), (4, 16))
    assert figures(found[3]) == _local_oracle(lambda a, x: (a * x).sum(), (4, 16), (4, 16))
    assert found[0].argument_bytes == (4 * 16 + 16 * 16) * 4


def test_inside_a_shard_map_over_some_axes_the_figures_are_one_devices_program():
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
    found = []

    def body(x):
        found.append(ts.cost(lambda a: jnp.tanh(a @ a.T) + x.sum(), x))  # x: (8, 64) on each device
        return x

    spread = jax.shard_map(body, mesh=mesh, in_specs=P("a"), out_specs=P("a"), axis_names={"a"})
    jax.jit(spread)(jax.device_put(jnp.ones((16, 64), F32), NamedSharding(mesh, P("a"))))
    assert figures(found[0]) == _local_oracle(lambda a, x: jnp.tanh(a @ a.T) + x.sum(), (8, 64), (8, 64))


@pytest.mark.parametrize(
    ("f", "name"),
    [
        (lambda a: jax.lax.psum(a, "i"), "psum"),
        (lambda a: a + jax.lax.axis_index("i"), "axis_index"),
        (lambda a: jax.lax.scan(lambda c, _: (c + jax.lax.pmax(c, "i"), None), a, length=2)[0], "pmax"),
    ],
)
def test_inside_shard_map_a_collective_is_named(f, name):
    errors = []

    def body(x):
        try:
            ts.cost(f, x)
        except ValueError as e:
            errors.append(str(e))
        return x

    _in_shard_map(body, jnp.ones((32,), F32))
    assert len(errors) == 1
    assert f"`{name}`" in errors[0] and "'i'" in errors[0] and "shard_map" in errors[0]


# -- abstract meshes -----------------------------------------------------------------------
def _planned(mesh):
    w = jax.ShapeDtypeStruct((512, 128), F32)
    x = jax.ShapeDtypeStruct((64, 512), F32)
    return ts.structure_of({"w": w, "x": x}).with_shardings(
        {"w": NamedSharding(mesh, P("d")), "x": NamedSharding(mesh, P())}
    )


def _matmul(t):
    return t["x"] @ t["w"]


@pytest.mark.parametrize("kind", [AxisType.Explicit, AxisType.Auto])
def test_an_abstract_mesh_is_costed_on_a_concrete_one(kind):
    concrete = jax.make_mesh((8,), ("d",), axis_types=(kind,))
    expected = own(jax.jit(_matmul).lower(_planned(concrete).tree).compile())
    planned = _planned(AbstractMesh((8,), ("d",), axis_types=(kind,)))
    loaded = ts.Structure.from_json(_planned(concrete).to_json())
    assert isinstance(loaded.leaves[0].sharding.mesh, AbstractMesh)
    for s in (planned, loaded):
        assert figures(ts.cost(_matmul, s)) == expected  # on this process's devices
        with jax.set_mesh(concrete):
            assert figures(ts.cost(_matmul, s)) == expected  # on the mesh set
    assert ts.cost(_matmul, planned).argument_bytes == (512 * 128 // 8 + 64 * 512) * 4
    other = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
    with jax.set_mesh(other):  # a mesh with other axes: costed on this process's devices all the same
        assert figures(ts.cost(_matmul, planned)) == expected


def test_an_abstract_mesh_larger_than_this_process_is_compiled_for_simulated_devices():
    # tests/test_far_mesh.py checks these figures against a real mesh of the same shape
    planned = _planned(AbstractMesh((16,), ("d",), axis_types=(AxisType.Explicit,)))
    c = ts.cost(_matmul, planned)
    assert c.backend == "cpu x16 (simulated)"
    assert c.argument_bytes == (512 * 128 // 16 + 64 * 512) * 4


# -- the cache -----------------------------------------------------------------------------
def test_a_call_whose_bound_values_stay_concrete_is_cached(compiles):
    def zeros_like_n(n, x):
        return jnp.zeros(int(n), F32) + x.sum()

    x = jax.ShapeDtypeStruct((32, 64), F32)
    five = np.int32(5)
    compiles.clear()
    first = ts.cost(ft.partial(zeros_like_n, five), x)
    assert first.output_bytes == 5 * 4
    n = len(compiles)
    assert n >= 1
    assert ts.cost(ft.partial(zeros_like_n, np.int32(5)), x) == first
    assert len(compiles) == n  # asked again: nothing compiled
    assert ts.cost(ft.partial(zeros_like_n, np.int32(7)), x).output_bytes == 7 * 4  # another value, another answer
    assert len(compiles) > n


# -- messages name the user's inputs ---------------------------------------------------------
def needs_value(state, n):
    return jnp.zeros(int(state["params"]["w"].sum()))


STATE_TREE = {"params": {"w": jax.ShapeDtypeStruct((3,), F32), "b": jax.ShapeDtypeStruct((2,), F32)}}


def _jax_name(fn, *args, **kwargs):
    """The name JAX's own `jax.jit(fn)` gives the leaf its concretization error is about."""
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        jax.jit(fn).trace(*args, **kwargs)
    return re.search(r"the argument (\S+)\.\n", str(info.value)).group(1)


def _needs_n(x, n):
    return jnp.zeros(int(n))


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: ts.cost(needs_value, STATE_TREE, 3), _jax_name(needs_value, STATE_TREE, 3)),
        (lambda: ts.cost(ft.partial(needs_value, STATE_TREE), 3), "state['params']['w']"),
        (lambda: ts.cost(_needs_n, X, n=jnp.ones(())), _jax_name(_needs_n, X, n=jnp.ones(()))),
        (lambda: ts.out_structure(needs_value, STATE_TREE, 3), _jax_name(needs_value, STATE_TREE, 3)),
    ],
)
def test_messages_name_the_users_inputs_and_frame(call, named):
    """A leaf is named as JAX names it for `jax.jit(fn)` (by fn's parameter names), and a
    bound one by the parameter it is bound to."""
    assert named in ("state['params']['w']", "n")
    with pytest.raises(jax.errors.ConcretizationTypeError) as info:
        call()
    message = str(info.value)
    assert f"the argument {named}." in message
    assert "dynamic[" not in message
    assert re.search(rf"tracing the function \S+ at {re.escape(__file__)}:\d+", message)


def test_largest_fit_messages_name_the_users_inputs():
    (b,) = jax.export.symbolic_shape("b")
    with pytest.raises(jax.errors.ConcretizationTypeError, match=r"the argument n\."):
        ts.largest_fit(
            lambda x, n: jnp.zeros(int(n)) + x.sum(), jax.ShapeDtypeStruct((b,), F32), 3.0, dim="b", budget=1e6
        )


# -- every context ------------------------------------------------------------------------
def test_in_every_context_the_figures_are_those_of_the_program_at_that_level(in_context):
    found = []

    def f(x):
        c = ts.cost(lambda a: jnp.sin(a) * x, x)  # x as an argument and closed over
        found.append((isinstance(x, jax.core.Tracer), figures(c)))
        return x

    in_context(f, jnp.ones(8, F32))
    traced = _local_oracle(lambda a, x: jnp.sin(a) * x, (8,), (8,))  # a tracer closed over: an argument
    constant = own(jax.jit(lambda a: jnp.sin(a) * jnp.ones(8, F32)).lower(jnp.ones(8, F32)).compile())
    assert found
    assert all(c == (traced if is_tracer else constant) for is_tracer, c in found)


# -- parameters of any name, donation as jax.jit takes it ---------------------------------
def diffrax_step(state, args):  # diffrax's and many equinox codebases' signature
    return state * args["scale"] + 1


SCALE = {"scale": jnp.full((256, 256), 2.0, F32)}


@pytest.mark.parametrize("donate", [{}, {"donate_argnames": "args"}, {"donate_argnums": 1}, {"donate_argnums": 0}])
def test_a_parameter_named_args_is_taken_as_jax_jit_takes_it(donate):
    c = ts.cost(diffrax_step, STATE["w"], args=SCALE, **donate)
    assert figures(c) == own(jax.jit(diffrax_step, **donate).lower(STATE["w"], args=SCALE).compile())
    assert figures(ts.cost(jax.jit(diffrax_step, **donate), STATE["w"], args=SCALE)) == figures(c)
    assert ts.out_structure(diffrax_step, STATE["w"], args=SCALE).tree == jax.ShapeDtypeStruct((256, 256), F32)


@pytest.mark.parametrize("names", [("fn", "self"), ("args", "kwargs"), ("kwargs", "args")])
def test_parameters_of_any_name_by_keyword(names):
    first, second = names
    fn = eval(f"lambda {first}, {second}: {first} @ {second}")  # noqa: S307 (the names are the test's)
    call = {first: STATE["w"], second: BATCH.T}
    c = ts.cost(fn, **call, donate_argnames=second)
    assert figures(c) == own(jax.jit(fn, donate_argnames=second).lower(**call).compile())
    assert set(c.donation) == {f"kwargs['{second}']"}


def test_largest_fit_of_a_step_with_a_parameter_named_args():
    (b,) = jax.export.symbolic_shape("b")
    row = {"scale": jnp.full((256,), 2.0, F32)}
    fit = ts.largest_fit(diffrax_step, jax.ShapeDtypeStruct((b, 256), F32), dim="b", budget=2**20, args=row)

    def peak(n):
        f = own(jax.jit(diffrax_step).lower(jax.ShapeDtypeStruct((n, 256), F32), args=row).compile())
        return f["argument_bytes"] + f["output_bytes"] + f["temp_bytes"] - f["alias_bytes"]

    assert peak(fit.size) <= 2**20 < peak(fit.size + 1)


@pytest.mark.parametrize("numbers", [-1, (-2,), (0, -1), (-1, 1)])
def test_a_negative_donate_argnums_is_costed_as_jax_jit_compiles_it(numbers):
    # jax.jit (0.8 to 0.10) ignores a negative index: only the others are donated
    compiled = jax.jit(step, donate_argnums=numbers).lower(STATE, BATCH).compile()
    expected = {0: {"args[0]['b']", "args[0]['w']"}, 1: {"args[1]"}}
    kept = [n for n in np.atleast_1d(numbers) if n >= 0]
    c = ts.cost(step, STATE, BATCH, donate_argnums=numbers)
    assert figures(c) == own(compiled)
    assert set(c.donation) == set().union(*(expected[n] for n in kept))
    wrapped = ts.cost(jax.jit(step, donate_argnums=numbers), STATE, BATCH)  # the wrapper's own donation
    assert figures(wrapped) == figures(c)
    assert set(wrapped.donation) == set(c.donation)
    b = jax.export.symbolic_shape("b")[0]
    batch = jax.ShapeDtypeStruct((b, 256), F32)
    fit = ts.largest_fit(step, STATE, batch, dim="b", budget=2**21, donate_argnums=numbers)
    assert fit.size == ts.largest_fit(jax.jit(step, donate_argnums=numbers), STATE, batch, dim="b", budget=2**21).size


def _zeros_of(x, n):
    return x.sum() + jnp.zeros(n)


@pytest.mark.parametrize("who", ["cost", "largest_fit"])
def test_a_note_on_a_needed_python_scalar_suggests_the_fix_in_its_functions_terms(who):
    (b,) = jax.export.symbolic_shape("b")
    with pytest.raises(TypeError) as info:
        if who == "cost":
            ts.cost(_zeros_of, X, 3)
        else:
            ts.largest_fit(_zeros_of, jax.ShapeDtypeStruct((b, 8), F32), 3, dim="b", budget=1e6)
    [note] = [n for n in info.value.__notes__ if n.startswith("treeshape:")]
    assert f"`ts.{who}(functools.partial(_zeros_of, n=3), ...)`" in note
    assert "out_structure" not in note and "_call_pytree" not in note
