"""The checkpoint workflow with orbax: read a checkpoint's structure from its
metadata (no array is loaded), check it against the model's, and restore into
a target built by treeshape, with or without shardings."""

import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


OPT = optax.adam(1e-3)


def _init(key):
    params = {"w": jax.random.normal(key, (4, 8)).astype(jnp.bfloat16), "b": jnp.zeros(8, jnp.bfloat16)}
    return {"params": params, "opt": OPT.init(params), "step": 0}


@pytest.fixture
def checkpoint(tmp_path):
    state = _init(jax.random.key(0))
    state = {**state, "params": jax.tree.map(lambda p: p + 1, state["params"])}
    checkpointer = ocp.StandardCheckpointer()
    path = tmp_path / "ckpt" / "1"
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()
    return checkpointer, path, state


def test_structure_of_checkpoint_metadata(checkpoint):
    checkpointer, path, state = checkpoint
    metadata = checkpointer.metadata(path).item_metadata.tree  # orbax ArrayMetadata leaves
    s = ts.structure_of(metadata)
    assert "['opt'][0]['mu']['w']" in s.paths  # orbax keeps optax's state as plain containers
    assert s.tree["params"]["w"] == jax.ShapeDtypeStruct((4, 8), jnp.bfloat16)
    assert s.tree["step"].dtype == jnp.result_type(int) and not s.tree["step"].weak_type
    expected = ts.out_structure(_init, jax.random.key(0))
    # The Python-int step is weak in the model and strong in the checkpoint, and orbax
    # stores optax's tuple of states as a list of dicts and None: the metadata is read as
    # the tree it was written from, so nothing differs (orbax restores it into `expected`).
    assert expected.diff(s) == [] and s.diff(expected) == [] and expected.diff(metadata) == []
    ts.structure_of(expected.tree["params"]).check(s.tree["params"])


def test_restore_into_a_treeshape_target(checkpoint):
    checkpointer, path, state = checkpoint
    expected = ts.out_structure(_init, jax.random.key(0))
    restored = checkpointer.restore(path, target=expected.tree)
    expected.check(restored, ignore={"weak_type"})
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), np.asarray(state["params"]["w"]))
    assert type(restored["opt"][0]) is type(state["opt"][0])  # the namedtuples come back from the target


def test_restore_with_shardings(checkpoint):
    checkpointer, path, state = checkpoint
    mesh = jax.make_mesh((8,), ("d",))
    expected = ts.out_structure(_init, jax.random.key(0))

    def fsdp(path, leaf):
        return NamedSharding(mesh, P(None, "d") if len(leaf.shape) == 2 else P())

    target = expected.with_shardings(fsdp)
    assert target.nbytes_per_device < target.nbytes
    restored = checkpointer.restore(path, target=target.tree)
    assert restored["params"]["w"].sharding.spec == P(None, "d")
    assert restored["opt"][0].mu["w"].sharding.spec == P(None, "d")
    assert restored["params"]["b"].sharding.is_fully_replicated
    expected.check(restored, ignore={"weak_type"})
    np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), np.asarray(state["params"]["w"]))


def test_checkpoint_metadata_itself_points_to_its_tree(checkpoint):
    checkpointer, path, state = checkpoint
    metadata = checkpointer.metadata(path).item_metadata  # a TreeMetadata around the tree
    fix = "pass its `.tree` instead, e.g. `ts.structure_of(checkpointer.metadata(path).item_metadata.tree)`."
    with pytest.raises(TypeError) as info:
        ts.structure_of(metadata)
    assert str(info.value) == (
        "treeshape.structure_of: tree is an orbax checkpoint's metadata (a TreeMetadata), which wraps the tree "
        "it describes: " + fix
    )
    expected = ts.out_structure(_init, jax.random.key(0))
    with pytest.raises(TypeError, match=r"tree is an orbax checkpoint's metadata.*`\.tree`"):
        expected.diff(metadata)
    # the fix: the tree it wraps, which zeros() can rebuild
    s = ts.structure_of(metadata.tree)
    zeros = s.zeros()
    assert s.matches(zeros) and zeros["params"]["w"].dtype == jnp.bfloat16
    assert "_TreeMetadataImpl" not in str(info.value)


# -- a flax.nnx State: orbax writes each Variable as a dict {'value': ...} -----------------------
class Classifier(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs, norm: bool = True):
        self.hidden = nnx.Linear(4, width, rngs=rngs)
        self.norm = nnx.BatchNorm(width, rngs=rngs) if norm else None
        self.out = nnx.Linear(width, 2, rngs=rngs)


@pytest.fixture
def nnx_checkpoint(tmp_path):
    model = Classifier(8, nnx.Rngs(0))
    checkpointer = ocp.StandardCheckpointer()
    path = tmp_path / "nnx" / "1"
    checkpointer.save(path, nnx.state(model))
    checkpointer.wait_until_finished()
    return checkpointer, path, model


def test_nnx_state_metadata_diffs_leaf_by_leaf_against_the_models_state(nnx_checkpoint):
    checkpointer, path, model = nnx_checkpoint
    metadata = checkpointer.metadata(path).item_metadata.tree
    assert type(metadata["hidden"]["kernel"]) is dict and set(metadata["hidden"]["kernel"]) == {"value"}
    state = ts.structure_of(nnx.state(nnx.eval_shape(lambda: Classifier(8, nnx.Rngs(0)))))
    saved = ts.structure_of(metadata)
    assert state.diff(metadata) == [] and saved.diff(nnx.state(model)) == [] and state.matches(saved)
    assert len(state) == len(saved) == 8
    # A model of another width: the leaves that differ, by path, from either side.
    wider = ts.structure_of(nnx.state(nnx.eval_shape(lambda: Classifier(16, nnx.Rngs(0)))))
    found = [(m.path, m.kind, m.expected, m.actual) for m in wider.diff(metadata)]
    assert found == [
        ("['hidden']['bias'].value", "shape", (16,), (8,)),
        ("['hidden']['kernel'].value", "shape", (4, 16), (4, 8)),
        *[(f"['norm'][{name!r}].value", "shape", (16,), (8,)) for name in ("bias", "mean", "scale", "var")],
        ("['out']['kernel'].value", "shape", (16, 2), (8, 2)),
    ]
    assert [m.path for m in saved.diff(wider)] == [p.replace(".value", "['value']") for p, *_ in found]
    # A missing layer is named by its key, as for any dict.
    [missing] = saved.diff(nnx.state(nnx.eval_shape(lambda: Classifier(8, nnx.Rngs(0), norm=False))))
    assert (missing.path, missing.actual) == ("['norm']", None)


def test_nnx_state_round_trip_through_a_checkpoint(nnx_checkpoint):
    checkpointer, path, model = nnx_checkpoint
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Classifier(8, nnx.Rngs(1))))
    ts.structure_of(abstract).check(checkpointer.metadata(path).item_metadata.tree)  # before loading anything
    restored = nnx.merge(graphdef, checkpointer.restore(path, target=abstract))
    ts.structure_of(nnx.state(model)).check(nnx.state(restored))
    np.testing.assert_array_equal(np.asarray(restored.hidden.kernel[...]), np.asarray(model.hidden.kernel[...]))


# -- orbax's layouts read as the trees they were written from --------------------------------
class Stack(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(4, width, rngs=rngs), nnx.Linear(width, 4, rngs=rngs)])


def _dense_state(features):
    import flax.linen as nn
    from flax.training import train_state

    dense = nn.Dense(features)
    params = dense.init(jax.random.key(0), jnp.ones((1, 2)))
    return train_state.TrainState.create(apply_fn=dense.apply, params=params, tx=optax.adamw(1e-3))


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Metadata trees of what users save, each with the tree it was written from."""
    import equinox as eqx

    model = Stack(8, nnx.Rngs(0))
    mesh = jax.make_mesh((8,), ("d",))
    fsdp = {
        "w": jax.device_put(jnp.ones((64, 24), jnp.float32), NamedSharding(mesh, P("d"))),
        "v": jax.device_put(jnp.ones((16, 8), jnp.bfloat16), NamedSharding(mesh, P(None, "d"))),
        "b": jnp.ones(24, jnp.float32),
    }
    trees = {
        "stack": nnx.state(model),
        "optimizer": nnx.state(nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)),
        "equinox": eqx.filter(eqx.nn.MLP(2, 3, 8, 1, key=jax.random.key(0)), eqx.is_array),
        "linen": _dense_state(3),
        "fsdp": fsdp,
    }
    root = tmp_path_factory.mktemp("layouts")
    with ocp.PyTreeCheckpointer() as checkpointer:
        for name, tree in trees.items():
            checkpointer.save(root / name, tree)
        return {name: (checkpointer.metadata(root / name).item_metadata.tree, tree) for name, tree in trees.items()}


@pytest.mark.parametrize("name", ["stack", "optimizer"])
def test_string_index_keys_are_the_indices_they_were_written_from(layouts, name):
    metadata, tree = layouts[name]
    assert "0" in (metadata["layers"] if name == "stack" else metadata["opt_state"])  # as orbax writes them
    assert ts.structure_of(tree).diff(metadata) == [] and ts.structure_of(metadata).diff(tree) == []
    # a layer of another width is named by its own path, the index as the model writes it
    wider = nnx.state(nnx.eval_shape(lambda: Stack(16, nnx.Rngs(0))))
    if name == "optimizer":
        wider = nnx.state(
            nnx.eval_shape(lambda: nnx.Optimizer(Stack(16, nnx.Rngs(0)), optax.adam(1e-3), wrt=nnx.Param))
        )
    found = [(m.path, m.expected, m.actual) for m in ts.structure_of(wider).diff(metadata)]
    prefix = "" if name == "stack" else "['opt_state'][0]['mu']"
    assert (f"{prefix}['layers'][0]['bias'].value", (16,), (8,)) in found
    assert not any(m[0].endswith("]") and m[2] is None for m in found)  # no layer missing or extra


def test_modules_and_train_states_compare_leaf_by_leaf(layouts):
    import equinox as eqx

    metadata, tree = layouts["equinox"]
    # orbax writes the MLP as a dict of its fields, and its tuple of layers as a list: the same MLP
    assert ts.structure_of(tree).diff(metadata) == [] and ts.structure_of(metadata).diff(tree) == []
    abstract = eqx.filter_eval_shape(eqx.nn.MLP, 2, 3, 16, 1, key=jax.random.key(0))
    wider = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    assert [(m.path, m.expected, m.actual) for m in ts.structure_of(wider).diff(metadata)] == [
        (".layers[0].bias", (16,), (8,)),
        (".layers[0].weight", (16, 2), (8, 2)),
        (".layers[1].weight", (3, 16), (3, 8)),
    ]
    metadata, tree = layouts["linen"]
    found = ts.structure_of(_dense_state(5)).diff(metadata)
    assert [(m.path, m.kind) for m in found] == [
        *[(f".opt_state[0].{m}['params'][{p!r}]", "shape") for m in ("mu", "nu") for p in ("bias", "kernel")],
        (".params['params']['bias']", "shape"),
        (".params['params']['kernel']", "shape"),
    ]


def test_a_train_states_metadata_equals_the_live_state(tmp_path):
    """orbax writes a TrainState as a dict of its fields, optax's tuples as lists, its namedtuple
    states as dicts of their fields and its empty states as None, and keeps no weak type (the
    step, a Python int, comes back a strong int): none of that is a difference there."""
    import flax.linen as nn
    from flax.training import train_state

    dense = nn.Dense(3)
    params = dense.init(jax.random.key(0), jnp.ones((1, 2)))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = train_state.TrainState.create(apply_fn=dense.apply, params=params, tx=tx)
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        metadata = checkpointer.metadata(tmp_path / "state").item_metadata.tree
    assert type(metadata["opt_state"]) is list and metadata["opt_state"][0] is None
    live, saved = ts.structure_of(state), ts.structure_of(metadata)
    assert live.tree.step.weak_type and not saved.tree["step"].weak_type
    assert live.diff(metadata) == [] and saved.diff(state) == [] and live.matches(saved) and saved.matches(live)
    # an optimizer of another kind still differs, where its state does
    sgd = state.replace(tx=optax.sgd(1e-3), opt_state=optax.sgd(1e-3).init(params))
    assert [str(m) for m in ts.structure_of(sgd).diff(metadata)] == [
        "tree.opt_state[1]: expected an empty EmptyState, got a list with 3 children."
    ]
    # outside a node orbax wrote, a list is no tuple and a weak leaf no strong one
    assert [m.kind for m in ts.structure_of({"s": (state.step,)}).diff({"s": [metadata["step"]]})] == ["structure"]
    assert [m.kind for m in ts.structure_of({"s": state.step}).diff({"s": metadata["step"]})] == ["weak_type"]


class _Train(typing.NamedTuple):
    params: Any
    opt_state: Any
    step: Any


@pytest.mark.parametrize("step", [0, jnp.int32(0), jnp.asarray(0)], ids=["int", "int32", "weak"])
@pytest.mark.parametrize("kind", ["dict", "namedtuple"])
def test_a_train_states_metadata_diffs_empty_where_orbax_restores_it(tmp_path, kind, step):
    """A train state as a dict (or NamedTuple) of params, `optax.adamw`'s state and a step: orbax
    writes the tuple of optax states as a list (each NamedTuple a dict, `EmptyState` None), the
    NamedTuple root as a dict and a Python-int or weak step as a strong int. Where orbax's own
    restore into the live state succeeds, diff finds nothing, both ways."""
    params = {"w": jnp.ones((4, 8), jnp.float32), "b": jnp.zeros(8, jnp.float32)}
    tx = optax.adamw(1e-3)
    parts = {"params": params, "opt_state": tx.init(params), "step": step}
    state = parts if kind == "dict" else _Train(**parts)
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
        metadata = manager.item_metadata(1).tree
        restored = manager.restore(1, args=ocp.args.StandardRestore(jax.eval_shape(lambda: state)))
    assert type(metadata) is dict and type(metadata["opt_state"]) is list and metadata["opt_state"][1] is None
    ts.structure_of(state).check(restored, ignore={"weak_type"})  # orbax's restore succeeds
    live, saved = ts.structure_of(state), ts.structure_of(metadata)
    assert live.diff(metadata) == [] and saved.diff(state) == [] and live.matches(saved) and saved.matches(live)
    # what orbax's restore would refuse still differs: another shape, another optimizer's state
    wider = {**parts, "params": {**params, "w": jnp.ones((4, 16), jnp.float32)}}
    wider["opt_state"] = tx.init(wider["params"])
    found = [(m.path, m.kind) for m in ts.structure_of(wider).diff(metadata)]
    assert found == [(f"['opt_state'][0].{m}['w']", "shape") for m in ("mu", "nu")] + [("['params']['w']", "shape")]
    sgd = {**parts, "opt_state": optax.sgd(1e-3).init(params)}
    assert [m.path for m in ts.structure_of(sgd).diff(metadata)] == ["['opt_state']"]


def test_a_sharded_checkpoint_counts_bytes_per_device_as_the_state(layouts):
    metadata, tree = layouts["fsdp"]
    saved, state = ts.structure_of(metadata), ts.structure_of(tree)
    assert saved.nbytes_per_device == state.nbytes_per_device == (64 * 24 * 4 + 16 * 8 * 2) // 8 + 24 * 4
    assert saved.nbytes == state.nbytes and saved == state and saved.diff(tree) == []
    assert saved.tree["w"].sharding.spec == P("d") and saved.tree["v"].sharding.spec == P(None, "d")
    assert saved.tree["b"].sharding is None
