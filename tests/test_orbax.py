"""The checkpoint workflow with orbax: read a checkpoint's structure from its
metadata (no array is loaded), check it against the model's, and restore into
a target built by treeshape, with or without shardings."""

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
    # The Python-int step is weak in the model and strong in the checkpoint, and
    # orbax stores optax's namedtuple state as a list: diff names exactly that.
    assert [str(m) for m in expected.diff(s, ignore={"weak_type"})] == [
        "tree['opt']: expected a tuple with 2 children, got a list with 2 children."
    ]
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
