"""`ts.restore_plan` and `RestorePlan.restore` on real orbax checkpoints (written here, in
tmp_path): what users save (nnx states and optimizers, equinox modules and states, linen
TrainStates, optax states, sharded states), restored into the same model, a changed
model, and another topology; the plan read from the metadata alone; the command line."""

import json
import pathlib
import re
import shutil
import subprocess
import sys

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx, serialization
from flax.training import train_state
from hypothesis import given, strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import treeshape as ts


def _save(path, tree, ocdbt=True):
    with ocp.PyTreeCheckpointer() if ocdbt else _plain() as checkpointer:
        checkpointer.save(path, tree)
    return path


def _plain():
    return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False))


def _same_values(restored, saved):
    """Every leaf of `restored` equals the saved array, leaf by leaf."""
    r_leaves, r_def = jax.tree.flatten(restored)
    s_leaves, s_def = jax.tree.flatten(saved)
    assert r_def == s_def
    for r, s in zip(r_leaves, s_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(r), np.asarray(s))


class Block(nnx.Module):
    def __init__(self, width, rngs):
        self.linear = nnx.Linear(width, width, rngs=rngs)
        self.norm = nnx.LayerNorm(width, rngs=rngs)


class Net(nnx.Module):
    def __init__(self, rngs, depth=2, block="Block_0"):
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(depth)])
        setattr(self, block, Block(4, rngs))
        self.head = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        for layer in self.layers:
            x = nnx.relu(layer(x))
        block = next(v for k, v in vars(self).items() if isinstance(v, Block))
        return self.head(block.norm(block.linear(x)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One directory of checkpoints shared by the tests: each name, its saved tree."""
    root = tmp_path_factory.mktemp("restore")
    model = Net(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    mlp = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(1))
    _, eqx_state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(5, "batch", mode="batch")
    dense = nn.Dense(3)
    params = dense.init(jax.random.key(2), jnp.ones((1, 2)))
    linen_state = train_state.TrainState.create(apply_fn=dense.apply, params=params, tx=optax.adamw(1e-3))
    linen_state = linen_state.replace(step=7)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    w = {"w": jnp.arange(6.0).reshape(2, 3)}
    mesh = jax.make_mesh((8,), ("d",))
    fsdp = jax.device_put(jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16), NamedSharding(mesh, P("d")))
    trees = {
        "nnx": nnx.state(model),
        "optimizer": nnx.state(optimizer),
        "equinox": eqx.filter(mlp, eqx.is_array),
        "eqx_state": eqx_state,
        "linen": linen_state,
        "linen_dict": serialization.to_state_dict(linen_state),
        "optax": {"params": w, "opt": tx.init(w), "step": 3, "nothing": None},
        "fsdp": {"w": fsdp, "b": jnp.ones(16, jnp.float32)},
    }
    paths = {name: _save(root / name, tree) for name, tree in trees.items()}
    objects = {"model": model, "optimizer": optimizer, "mlp": mlp, "linen_state": linen_state, "tx": tx, "mesh": mesh}
    return paths, trees, objects


# -- what users save, restored into the same model: all "same" -------------------------------
def _all_same(plan, n):
    assert plan.ok and [e.fate for e in plan.entries] == ["same"] * n, str(plan)


def test_nnx_state_and_module(saved):
    paths, trees, objects = saved
    abstract = nnx.eval_shape(lambda: Net(nnx.Rngs(5)))
    plan = ts.restore_plan(paths["nnx"], nnx.state(abstract))
    _all_same(plan, 10)
    assert plan.entries[0].source == "['Block_0']['linear']['bias']['value']"
    assert plan.entries[0].path == "['Block_0']['linear']['bias'].value"
    assert plan.nbytes == ts.structure_of(trees["nnx"]).nbytes
    restored = plan.restore()
    assert isinstance(restored, nnx.State)
    _same_values(restored, trees["nnx"])
    # an abstract module restores to a module, which runs
    module = ts.restore_plan(paths["nnx"], abstract).restore()
    assert isinstance(module, Net)
    np.testing.assert_allclose(module(jnp.ones((1, 4))), objects["model"](jnp.ones((1, 4))))


def test_nnx_optimizer_state(saved):
    paths, trees, _ = saved
    abstract = nnx.eval_shape(lambda: nnx.Optimizer(Net(nnx.Rngs(0)), optax.adam(1e-3), wrt=nnx.Param))
    plan = ts.restore_plan(paths["optimizer"], nnx.state(abstract))
    _all_same(plan, len(jax.tree.leaves(trees["optimizer"])))
    assert "['opt_state']['0']['count']['value']" in [e.source for e in plan.entries]  # orbax's '0' for index 0
    _same_values(plan.restore(), trees["optimizer"])


def test_equinox_module_and_state(saved):
    paths, trees, objects = saved
    abstract = eqx.filter_eval_shape(eqx.nn.MLP, 3, 2, 8, 2, key=jax.random.key(9))
    plan = ts.restore_plan(paths["equinox"], abstract)
    _all_same(plan, 6)  # the activation functions and sizes are static: no entries
    restored = plan.restore()
    assert isinstance(restored, eqx.nn.MLP) and restored.activation is abstract.activation
    _same_values(eqx.filter(restored, eqx.is_array), trees["equinox"])
    np.testing.assert_allclose(restored(jnp.ones(3)), objects["mlp"](jnp.ones(3)))
    _, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(5, "batch", mode="batch")
    plan = ts.restore_plan(paths["eqx_state"], state)
    _all_same(plan, len(jax.tree.leaves(trees["eqx_state"])))
    _same_values(plan.restore(), trees["eqx_state"])


def test_linen_train_state_and_its_state_dict(saved):
    paths, trees, objects = saved
    dense = nn.Dense(3)
    fresh = train_state.TrainState.create(
        apply_fn=dense.apply, params=dense.init(jax.random.key(0), jnp.ones((1, 2))), tx=optax.adamw(1e-3)
    )
    plan = ts.restore_plan(paths["linen"], fresh)
    _all_same(plan, 8)
    assert plan.entries[0].path == ".step" and plan.entries[0].source == "['step']"
    restored = plan.restore()
    assert isinstance(restored, train_state.TrainState) and int(restored.step) == 7
    _same_values(restored.params, trees["linen"].params)
    _same_values(restored.opt_state, trees["linen"].opt_state)
    # to_state_dict writes the optimizer's tuple as a dict {'0': ...}: read as the tuple's index 0
    plan = ts.restore_plan(paths["linen_dict"], fresh)
    _all_same(plan, 8)
    assert plan.entries[3].source == "['opt_state']['0']['count']"
    restored = plan.restore()
    assert int(restored.step) == 7
    _same_values(restored.opt_state, trees["linen"].opt_state)


def test_optax_states_in_the_containers_orbax_writes(saved):
    paths, trees, objects = saved
    w = {"w": jnp.zeros((2, 3))}
    target = {"params": w, "opt": objects["tx"].init(w), "step": 0, "nothing": None}
    plan = ts.restore_plan(paths["optax"], target)
    _all_same(plan, 5)
    assert [e.path for e in plan.entries][1:3] == ["['opt'][1][0].mu['w']", "['opt'][1][0].nu['w']"]
    restored = plan.restore()
    assert type(restored["opt"][1][0]) is type(target["opt"][1][0]) and int(restored["step"]) == 3
    _same_values(restored, trees["optax"])


# -- another topology: the target's shardings decide -----------------------------------------
def test_sharded_state_onto_another_mesh_and_unsharded(saved):
    paths, trees, _ = saved
    two = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    target = {
        "w": jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(two, P(None, "x"))),
        "b": jax.ShapeDtypeStruct((16,), jnp.float32, sharding=NamedSharding(two, P())),
    }
    plan = ts.restore_plan(paths["fsdp"], target)
    _all_same(plan, 2)
    assert plan.nbytes == 64 * 16 * 4 + 64 and plan.nbytes_per_device == 64 * 8 * 4 + 64
    restored = plan.restore()
    assert restored["w"].sharding == target["w"].sharding and restored["b"].sharding.is_fully_replicated
    _same_values(restored, trees["fsdp"])
    # no sharding: where JAX puts a new array, whatever the checkpoint's sharding says
    unsharded = ts.restore_plan(paths["fsdp"], jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), target))
    assert unsharded.nbytes_per_device == unsharded.nbytes
    restored = unsharded.restore()
    assert restored["w"].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
    _same_values(restored, trees["fsdp"])


def test_a_sharding_that_does_not_divide_is_refused_before_anything_is_read(saved):
    paths, _, _ = saved
    three = jax.make_mesh((3,), ("x",), devices=jax.devices()[:3])
    target = {
        "w": jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=NamedSharding(three, P("x"))),
        "b": jax.ShapeDtypeStruct((16,), jnp.float32),
    }
    plan = ts.restore_plan(paths["fsdp"], target)
    [problem] = plan.problems
    assert (problem.path, problem.fate) == ("['w']", "indivisible")
    assert "dimension 0 (size 64) would be split 3 ways over mesh axes ('x',)" in problem.reason
    with pytest.raises(ts.RestoreError, match=r"\['w'\]: indivisible") as info:
        plan.restore()
    assert isinstance(info.value, ValueError) and info.value.entries == plan.problems


# -- a changed model ---------------------------------------------------------------------
def test_changed_model_suggests_renames_and_keeps_new_layers(saved):
    paths, trees, objects = saved
    grown = Net(nnx.Rngs(3), depth=4, block="block_0")  # two more layers, the block renamed
    plan = ts.restore_plan(paths["nnx"], nnx.state(grown))
    assert not plan.ok
    fates = {e.path: e.fate for e in plan.entries}
    assert fates["['layers'][3]['kernel'].value"] == "missing"
    assert fates["['block_0']['linear']['kernel'].value"] == "missing"
    assert [e.path for e in plan.entries if e.fate == "extra"] == [
        "['Block_0']['linear']['bias']['value']",
        "['Block_0']['linear']['kernel']['value']",
        "['Block_0']['norm']['bias']['value']",
        "['Block_0']['norm']['scale']['value']",
    ]
    [kernel] = [e for e in plan.entries if e.path == "['block_0']['linear']['kernel'].value"]
    assert kernel.reason == (
        "the checkpoint has no leaf here; rename={\"['Block_0']\": \"['block_0']\"} would take the checkpoint's "
        "['Block_0']['linear']['kernel']['value']"
    )
    [new] = [e for e in plan.entries if e.path == "['layers'][2]['bias'].value"]
    assert new.reason == "the checkpoint has no leaf here; rename a checkpoint leaf onto it, or missing='keep'"
    plan = ts.restore_plan(paths["nnx"], nnx.state(grown), rename={"['Block_0']": "['block_0']"}, missing="keep")
    assert plan.ok, str(plan)
    counts = {f: sum(e.fate == f for e in plan.entries) for f in ("same", "renamed", "kept")}
    assert counts == {"same": 6, "renamed": 4, "kept": 4}
    restored = plan.restore()
    _same_values(restored["block_0"], trees["nnx"]["Block_0"])
    _same_values(restored["layers"][1], trees["nnx"]["layers"][1])
    _same_values(restored["layers"][3], nnx.state(grown)["layers"][3])  # kept: the model's own values
    # the same rename as a callable and as regex pairs
    for rename in (lambda p: p.replace("['Block_0']", "['block_0']"), [(r"^\['Block_0'\]", "['block_0']")]):
        again = ts.restore_plan(paths["nnx"], nnx.state(grown), rename=rename, missing="keep")
        assert again.entries == plan.entries


def test_linen_names_against_nnx_names_and_layer_numbering(tmp_path):
    path = _save(tmp_path / "c", {"Dense_0": {"kernel": jnp.ones((2, 3))}, "layers_3": {"bias": jnp.ones(3)}})
    target = {"dense_0": {"kernel": jnp.zeros((2, 3))}, "layers": {3: {"bias": jnp.zeros(3)}}}
    plan = ts.restore_plan(path, target)
    reasons = [e.reason for e in plan.problems if e.fate == "missing"]
    assert reasons == [
        "the checkpoint has no leaf here; rename={\"['Dense_0']\": \"['dense_0']\"} would take the checkpoint's "
        "['Dense_0']['kernel']",
        "the checkpoint has no leaf here; rename={\"['layers_3']\": \"['layers'][3]\"} would take the "
        "checkpoint's ['layers_3']['bias']",
    ]
    plan = ts.restore_plan(path, target, rename={"['Dense_0']": "['dense_0']", "['layers_3']": "['layers'][3]"})
    assert [e.fate for e in plan.entries] == ["renamed", "renamed"]
    restored = plan.restore()
    assert restored["layers"][3]["bias"].tolist() == [1.0, 1.0, 1.0]


def test_refusals_casts_and_extras(tmp_path):
    f32 = jnp.float32
    path = _save(
        tmp_path / "c", {"w": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.ones(3, f32), "n": jnp.ones(2, jnp.int32)}
    )
    target = {"w": jnp.zeros((2, 3), f32), "b": jnp.zeros(4, f32), "n": jnp.zeros(2, f32)}
    plan = ts.restore_plan(path, target)
    assert [(e.path, e.fate) for e in plan.entries] == [("['b']", "reshaped"), ("['n']", "uncast"), ("['w']", "uncast")]
    assert plan.entries[0].reason == (
        "the checkpoint holds f32[3] at ['b'], the target wants f32[4]: a restore never reshapes; give the model "
        "shape (3,) here, or leave this leaf out of the target"
    )
    assert plan.entries[1].reason.endswith("""; cast={("int32", "float32")} would cast it""")
    assert plan.entries[2].reason.endswith("""; cast='allow' or cast={("bfloat16", "float32")} would cast it""")
    plan = ts.restore_plan(path, {"w": target["w"]}, cast="allow", extra="error")
    assert [(e.path, e.fate) for e in plan.entries] == [("['w']", "cast"), ("['b']", "extra"), ("['n']", "extra")]
    assert not plan.ok and len(plan.problems) == 2
    plan = ts.restore_plan(path, {"w": target["w"]}, cast={("bfloat16", jnp.float32)})
    assert plan.ok and "2 extra" in str(plan) and plan.entries[0].reason == "cast from bfloat16 to float32"
    restored = plan.restore()
    assert restored["w"].dtype == jnp.float32 and restored["w"].tolist() == [[1.0] * 3] * 2
    abstract = {"w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16), "new": jax.ShapeDtypeStruct((2,), jnp.float32)}
    [problem] = ts.restore_plan(path, abstract, missing="keep").problems
    assert (problem.path, problem.fate) == ("['new']", "missing")
    assert problem.reason == (
        "the checkpoint has no leaf here, and missing='keep' keeps only arrays, not an abstract leaf: pass a target "
        "with an array here (the model itself, not an abstract one), or rename a checkpoint leaf onto it"
    )


def test_the_plan_reads_only_metadata(tmp_path):
    """A copy of a checkpoint whose array chunks are removed (each array's header, `.zarray`,
    kept) gives the same plan."""
    w = {"w": jnp.arange(12.0).reshape(3, 4), "layers": [{"b": jnp.ones(4)}, {"b": jnp.zeros(4)}]}
    path = _save(tmp_path / "full", w, ocdbt=False)
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    arrays = [d for d in bare.iterdir() if (d / ".zarray").is_file()]  # each array's header: .zarray
    removed = [f for d in arrays for f in d.iterdir() if not f.name.startswith(".")]
    assert len(arrays) == 3 and sorted({f.name for f in removed}) == ["0", "0.0"]  # the chunks
    for f in removed:
        f.unlink()
    target = {"w": jnp.zeros((3, 4), jnp.bfloat16), "layers": [{"b": jnp.zeros(4)}, {"b": jnp.zeros(4)}]}
    full, metadata_only = (ts.restore_plan(p, target, cast="allow") for p in (path, bare))
    assert metadata_only.entries == full.entries and str(metadata_only) == str(full)
    _same_values(full.restore()["layers"], w["layers"])
    assert not any(f.exists() for f in removed)


def test_a_refused_plan_reads_nothing_and_unused_leaves_are_not_read(tmp_path):
    path = _save(tmp_path / "full", {"w": jnp.ones(3), "old": jnp.ones(5)}, ocdbt=False)
    (path / "old" / "0").unlink()  # the unused leaf's data
    restored = ts.restore_plan(path, {"w": jnp.zeros(3)}).restore()
    assert restored["w"].tolist() == [1.0, 1.0, 1.0]
    (path / "w" / "0").unlink()
    with pytest.raises(ts.RestoreError, match=r"the plan refuses 1 leaf; nothing was read:\n  \* \['v'\]: missing"):
        ts.restore_plan(path, {"w": jnp.ones(3), "v": jnp.ones(2)}).restore()


# -- what a checkpoint is, and bad input --------------------------------------------------
def test_manager_directories(tmp_path):
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave({"w": jnp.full(3, float(step))}))
    target = {"w": jnp.zeros(3)}
    for where in (tmp_path / "run" / "2", tmp_path / "run" / "2" / "default"):
        assert ts.restore_plan(where, target).restore()["w"].tolist() == [2.0] * 3
    with pytest.raises(ValueError) as info:
        ts.restore_plan(tmp_path / "run", target)
    assert str(info.value) == (
        f"treeshape.restore_plan: {str(tmp_path / 'run')!r} is a CheckpointManager's directory of steps (1, 2), "
        f"not one checkpoint: pass a step's item directory, e.g. {str(tmp_path / 'run' / '2' / 'default')!r}"
    )
    with pytest.raises(ValueError, match=r"'.*nowhere' does not exist: pass the directory of an orbax checkpoint"):
        ts.restore_plan(tmp_path / "nowhere", target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"is not an orbax checkpoint: it has no _METADATA file"):
        ts.restore_plan(tmp_path / "empty", target)
    damaged = tmp_path / "run" / "1" / "default"
    (damaged / "_METADATA").write_text("{")
    with pytest.raises(ValueError, match=r"the metadata of the checkpoint '.*default' cannot be read: "):
        ts.restore_plan(damaged, target)


def test_the_metadata_tree_itself(saved):
    paths, trees, _ = saved
    with ocp.PyTreeCheckpointer() as checkpointer:
        metadata = checkpointer.metadata(paths["optax"]).item_metadata
    target = jax.tree.map(jnp.zeros_like, trees["optax"])
    for tree in (metadata, metadata.tree):
        _same_values(ts.restore_plan(tree, target).restore(), trees["optax"])


def test_bad_renames(tmp_path):
    path = _save(tmp_path / "c", {"a": jnp.ones(2), "b": jnp.ones(2)})
    with pytest.raises(ValueError) as info:
        ts.restore_plan(path, {"a": jnp.ones(2), "c": jnp.ones(2)}, rename={"['b']": "['a']"})
    assert str(info.value) == (
        "treeshape.restore_plan: rename maps two checkpoint leaves to the target's ['a']: ['a'] and ['b']"
    )
    with pytest.raises(ValueError, match=r"maps the checkpoint's \['b'\] to \['z'\], which the target lacks"):
        ts.restore_plan(path, {"a": jnp.ones(2)}, rename={"['b']": "['z']"})
    with pytest.raises(ValueError, match=r"rename value 'z' is not a keystr path"):
        ts.restore_plan(path, {"a": jnp.ones(2)}, rename={"['b']": "z"})
    with pytest.raises(ValueError, match=r"cast='yes' is not one of 'error', 'allow'"):
        ts.restore_plan(path, {"a": jnp.ones(2)}, cast="yes")


# -- the command line ----------------------------------------------------------------------
_TARGETS = """
import jax.numpy as jnp

def same():
    return {"w": jnp.zeros((64, 16), jnp.float32), "b": jnp.zeros(16, jnp.float32)}

def wider():
    return {"w": jnp.zeros((64, 32), jnp.float32), "b": jnp.zeros(16, jnp.float32)}

def broken():
    raise RuntimeError("no model today")
"""


def _cli(*args, cwd):
    run = subprocess.run(
        [sys.executable, "-m", "treeshape", "restore-plan", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )
    return run.returncode, run.stdout, run.stderr


def test_command_line(saved, tmp_path):
    paths, _, _ = saved
    (tmp_path / "targets.py").write_text(_TARGETS)
    status, out, err = _cli(paths["fsdp"], "targets:same", cwd=tmp_path)
    assert (status, err) == (0, "") and out.startswith("restore plan: 2 same; ok; ")
    status, out, _ = _cli(paths["fsdp"], "targets:wider", "--json", cwd=tmp_path)
    data = json.loads(out)
    assert status == 1 and data["ok"] is False
    assert data["entries"][1] == {
        "path": "['w']",
        "fate": "reshaped",
        "source": "['w']",
        "saved": {"shape": [64, 16], "dtype": "float32"},
        "wanted": {"shape": [64, 32], "dtype": "float32"},
        "reason": data["entries"][1]["reason"],
    }
    status, out, err = _cli(pathlib.Path(paths["fsdp"]).parent / "nowhere", "targets:same", cwd=tmp_path)
    assert status == 2 and out == "" and err.count("\n") == 1 and "does not exist" in err
    status, out, err = _cli(paths["fsdp"], "targets:broken", cwd=tmp_path)
    assert status == 2 and err.count("\n") == 1 and "RuntimeError: no model today" in err


# -- the guide -------------------------------------------------------------------------------
_FENCED = re.compile(r"^```(\w+)\n(.*?)^```\n", flags=re.DOTALL | re.MULTILINE)


def test_the_restore_guide_runs_and_prints_what_it_shows(capsys):
    text = (pathlib.Path(__file__).parents[1] / "docs" / "guide" / "restore.md").read_text()
    blocks = [(m.group(1), m.group(2)) for m in _FENCED.finditer(text)]
    pairs = [(code, blocks[k + 1][1]) for k, (lang, code) in enumerate(blocks) if lang == "python"]
    assert len(pairs) == 4 and all(blocks[k + 1][0] == "text" for k, (lang, _) in enumerate(blocks) if lang == "python")
    namespace: dict = {}
    with jax.enable_x64(False):  # the guide's outputs are those of JAX's default
        for code, shown in pairs:
            exec(compile(code, "<docs/guide/restore.md>", "exec"), namespace)
            assert capsys.readouterr().out == shown, code


def test_a_structure_target_and_an_abstract_mesh(saved):
    paths, trees, _ = saved
    mesh = jax.sharding.AbstractMesh((4,), ("x",))
    target = ts.structure_of(trees["fsdp"]).with_shardings(lambda path, leaf: NamedSharding(mesh, P("x")))
    plan = ts.restore_plan(paths["fsdp"], target)
    _all_same(plan, 2)
    assert plan.nbytes_per_device == (64 * 16 * 4 + 16 * 4) // 4  # the plan's figures on the abstract mesh
    with pytest.raises(ValueError, match=r"\['b'\] is sharded over an abstract mesh, which holds no array"):
        plan.restore()
    _same_values(ts.restore_plan(paths["fsdp"], ts.structure_of(trees["fsdp"])).restore(), trees["fsdp"])


def test_the_plans_table(tmp_path):
    f32 = jnp.float32
    path = _save(tmp_path / "c", {"w": jnp.ones(3, f32), "<b>": jnp.ones(2, f32)})
    plan = ts.restore_plan(path, {"w": jnp.zeros(3, f32), "n": jnp.zeros(2, f32)}, missing="keep")
    assert repr(plan) == "RestorePlan(1 same, 1 kept, 1 extra, ok)"
    assert str(plan).splitlines()[:4] == [
        "restore plan: 1 same, 1 kept, 1 extra; ok; 20 B (20 B per device)",
        "path     fate   saved   wanted  reason",
        "-------  -----  ------  ------  -----------------------------------------------------",
        "['n']    kept   -       f32[2]  not in the checkpoint: the target's own value is kept",
    ]
    page = plan._repr_html_()
    assert "<td" in page and "&lt;b&gt;" in page and "<b>" not in page and "kept" in page


# -- an invariant: the suggested renames, applied, take every leaf they were suggested for ------
_NAME = st.from_regex(r"[a-z]{1,6}(_[0-9])?", fullmatch=True)


def _respelled(name, how):
    """`name` as another framework spells it: capitalised, or without its separator."""
    return name.capitalize() if how == 0 else name.replace("_", "")


@given(
    st.dictionaries(
        _NAME,
        st.dictionaries(_NAME, st.sampled_from([(2,), (3, 2), ()]), min_size=1, max_size=3),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.integers(0, 1), min_size=4, max_size=4),
)
def test_suggested_renames_take_the_leaves_they_name(layout, hows):
    # a checkpoint's metadata tree (ShapeDtypeStructs stand for orbax's ArrayMetadata), and a
    # target whose top-level names are spelled another way
    saved = {k: {n: jax.ShapeDtypeStruct(s, jnp.float32) for n, s in v.items()} for k, v in layout.items()}
    names = {k: _respelled(k, hows[i % 4]) for i, k in enumerate(saved)}
    target = {names[k]: {n: np.zeros(s.shape, s.dtype) for n, s in v.items()} for k, v in saved.items()}
    plan = ts.restore_plan(saved, target)
    suggested = {}
    for e in plan.entries:
        if e.fate == "missing":
            m = re.search(r'rename=\{"(.*?)": "(.*?)"\}', e.reason)
            assert m, e.reason
            suggested[m.group(1)] = m.group(2)
    assert plan.ok == (not suggested)
    fixed = ts.restore_plan(saved, target, rename=suggested)
    assert fixed.ok and {e.fate for e in fixed.entries} <= {"same", "renamed"}
    assert len(fixed.entries) == sum(len(v) for v in saved.values())
