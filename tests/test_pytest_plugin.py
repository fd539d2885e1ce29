"""The pytest plugin (`treeshape.pytest_plugin`, entry point `pytest11`).

Each test runs an inner pytest in a subprocess (`pytester.runpytest_subprocess`), so
the plugin loads through its installed entry point, as in a user's project, and the
inner JAX state (devices, x64) stays separate from this process.
"""

import json
import subprocess
import sys

import jax.numpy as jnp

import treeshape as ts
from treeshape.pytest_plugin import snapshot_stem


pytest_plugins = ["pytester"]


# The inner runs leave out the test extra's plugins that they do not use (hypothesis's and
# nbmake's): loading them costs about a second of every inner pytest's start. treeshape's own
# plugin still loads through its entry point, with pytest's and any other installed ones.
_UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:nbmake")


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *_UNUSED_PLUGINS, *args)


def test_conftest_configures_jax_before_anything_imports_it(pytester):
    pytester.makeconftest(
        """
        import os
        import sys

        # pytest has loaded treeshape's plugin (and the package) by now: JAX must not be imported yet.
        assert "jax" not in sys.modules, "JAX was imported before conftest.py"
        assert "treeshape._structure" not in sys.modules
        assert "treeshape.pytest_plugin" in sys.modules
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
        """
    )
    pytester.makepyfile(
        """
        import jax
        import jax.numpy as jnp

        def test_devices_follow_the_conftest(structure_snapshot):
            assert jax.device_count() == 3
            structure_snapshot.check({"w": jnp.zeros(3)})
        """
    )
    result = _run(pytester, "--update-structures")
    result.assert_outcomes(passed=1)


def test_assert_equal_structures_shows_the_diff_by_path(pytester):
    pytester.makepyfile(
        """
        import jax.numpy as jnp
        import treeshape as ts

        def test_structures():
            expected = ts.structure_of({"b": jnp.zeros(3, "float32"), "w": jnp.zeros((2, 3), "float32")})
            actual = ts.structure_of({"b": jnp.zeros(3, "int32"), "w": jnp.zeros((3, 2), "float32"), "x": 1.0})
            assert expected == actual

        def test_other_objects_keep_pytest_s_own_report():
            assert [1, 2] == [1, 3]
        """
    )
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "E       AssertionError: assert Structure(*) == Structure(*)",
            "E         3 differences (left is expected, right is actual):",
            "E           tree['b']: expected dtype float32, got int32.",
            "E           tree['w']: expected shape (2, 3), got (3, 2).",
            "E           tree?'x'?: unexpected extra entry ~f*",  # f32, or f64 with x64 on
        ]
    )
    result.stdout.fnmatch_lines(["E         At index 1 diff: 2 != 3"])


def test_assert_equal_on_a_structure_loaded_from_json_passes_and_names_the_nodes_that_make_it_unequal(pytester):
    pytester.makepyfile(
        """
        import jax.numpy as jnp
        import optax
        import treeshape as ts
        from flax.training import train_state

        def test_loaded():
            state = train_state.TrainState.create(apply_fn=len, params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1))
            live = ts.structure_of(state)
            assert ts.Structure.from_json(live.to_json()) == live

        def test_checkpointed():
            import jax
            from flax import nnx

            state = nnx.state(nnx.eval_shape(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(0))))
            sds = jax.ShapeDtypeStruct
            saved = {"bias": {"value": sds((3,), "float32")}, "kernel": {"value": sds((2, 3), "float32")}}
            assert ts.structure_of(state).matches(saved)
            assert ts.structure_of(state) == ts.structure_of(saved)
        """
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)  # the optimizer's text stands for it: equal
    result.stdout.fnmatch_lines(
        ["E         The structures differ only where Structure.diff reads one node as another*"]
    )


def test_snapshots_of_training_code_with_functions_in_static_fields_match(pytester):
    pytester.makepyfile(
        test_training="""
        import functools

        import jax
        import jax.numpy as jnp
        import optax
        import flax.linen as nn
        from flax import nnx
        from flax.training import train_state

        STRIDES = (2, 2)

        class CNN(nnx.Module):
            def __init__(self, *, rngs):
                self.conv1 = nnx.Conv(1, 4, kernel_size=(3, 3), rngs=rngs)
                self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=STRIDES)

        class Dense(nn.Module):
            @nn.compact
            def __call__(self, x):
                return nn.Dense(3)(x)

        def test_nnx(structure_snapshot):
            model = CNN(rngs=nnx.Rngs(0))
            structure_snapshot.check({"model": model, "opt": nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)})

        def test_linen(structure_snapshot):
            params = Dense().init(jax.random.key(0), jnp.ones((1, 2)))["params"]
            structure_snapshot.check(
                train_state.TrainState.create(apply_fn=Dense().apply, params=params, tx=optax.adam(1e-3))
            )
        """
    )
    _run(pytester, "--update-structures").assert_outcomes(passed=2)
    _run(pytester).assert_outcomes(passed=2)
    test_file = pytester.path / "test_training.py"
    test_file.write_text(test_file.read_text().replace("STRIDES = (2, 2)", "STRIDES = (1, 1)"))
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["  * tree?'model'?.avg_pool: expected *strides=(2, 2)), got *strides=(1, 1))."])


def test_snapshots_missing_written_matching_and_changed(pytester):
    test_file = pytester.makepyfile(
        test_model="""
        import jax.numpy as jnp

        SHAPE = (2, 3)

        def test_params(structure_snapshot):
            structure_snapshot.check({"w": jnp.zeros(SHAPE), "b": jnp.zeros(SHAPE[-1])})
        """
    )
    snapshot = pytester.path / "__structures__" / "test_params.json"

    # Missing: fails and names the flag.
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*structure_snapshot: no snapshot __structures__/test_params.json yet; run pytest with --update-structures*"]
    )
    assert not snapshot.exists()

    # --update-structures writes it, and says so.
    result = _run(pytester, "--update-structures")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*treeshape: wrote 1 structure snapshot(s)*", "__structures__/test_params.json"])
    expected = ts.structure_of({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
    assert snapshot.read_text() == expected.to_json()
    assert ts.Structure.from_json(snapshot.read_text()) == expected

    # Matching: passes, writes nothing.
    _run(pytester).assert_outcomes(passed=1)

    # Changed: fails with every difference by path, and names the flag.
    test_file.write_text(test_file.read_text().replace("SHAPE = (2, 3)", "SHAPE = (2, 4)"))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*structure_snapshot: the structure differs from __structures__/test_params.json; 2 differences*",
            "  * tree['b']: expected shape (3,), got (4,).",
            "  * tree['w']: expected shape (2, 3), got (2, 4).",
            "If the change is intended, rerun with --update-structures to rewrite the snapshot.",
        ]
    )

    # Rewritten with the flag, then passing again.
    _run(pytester, "--update-structures").assert_outcomes(passed=1)
    assert json.loads(snapshot.read_text())["leaves"][0]["shape"] == [4]
    _run(pytester).assert_outcomes(passed=1)


_BATCH_TEST = """
import jax
import jax.numpy as jnp
import treeshape as ts

def model(x):
    return {{"h": x @ jnp.ones((3, {out}), jnp.float32), "n": x.sum(0)}}

def test_model(structure_snapshot):
    if {batch} is None:  # the family: any batch size
        (b,) = jax.export.symbolic_shape("b", constraints=["b >= 2"])
        structure_snapshot.check(ts.out_structure(model, jax.ShapeDtypeStruct((b, 3), jnp.float32)))
    else:
        structure_snapshot.check(model(jnp.ones(({batch}, 3), jnp.float32)))
"""


def test_a_symbolic_snapshot_checks_trees_of_every_batch_size(pytester):
    snapshot = pytester.path / "__structures__" / "test_model.json"
    pytester.makepyfile(test_batch=_BATCH_TEST.format(batch=None, out=4))
    _run(pytester, "--update-structures").assert_outcomes(passed=1)
    written = snapshot.read_text()
    assert json.loads(written)["constraints"] == ["b >= 2"]
    assert json.loads(written)["leaves"][0]["shape"] == ["b", 4]

    pytester.makepyfile(test_batch=_BATCH_TEST.format(batch=5, out=4))
    _run(pytester).assert_outcomes(passed=1)
    # The family is kept by --update-structures when the tree fits it.
    _run(pytester, "--update-structures").assert_outcomes(passed=1)
    assert snapshot.read_text() == written

    # Its constraint still holds, and a changed model is told by its dimensions.
    pytester.makepyfile(test_batch=_BATCH_TEST.format(batch=1, out=5))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "  * tree['h']: expected shape (b, 4) with b >= 2, got (1, 5) (b = 1).",
            "  * tree['h']: expected shape (b, 4), got (1, 5).",
        ]
    )


def test_snapshot_names_parametrised_classes_and_several_checks(pytester):
    pytester.makepyfile(
        test_names="""
        import jax.numpy as jnp
        import pytest

        @pytest.mark.parametrize("name", ["a/b", "a_b", "x y", "bf16-8"])
        def test_param(structure_snapshot, name):
            structure_snapshot.check({"n": jnp.zeros(len(name))})

        class TestModel:
            def test_init(self, structure_snapshot):
                structure_snapshot.check([jnp.zeros(1)])

        def test_several(structure_snapshot):
            structure_snapshot.check(jnp.zeros(1))
            structure_snapshot.check(jnp.zeros(2))
            structure_snapshot.check(jnp.zeros(3), name="opt state")

        def test_same_name_twice(structure_snapshot):
            structure_snapshot.check(jnp.zeros(1), name="a")
            structure_snapshot.check(jnp.zeros(1), name="a")
        """
    )
    result = _run(pytester, "--update-structures")
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*ValueError: structure_snapshot: test_same_name_twice-a.json is already checked*"])
    names = sorted(path.name for path in (pytester.path / "__structures__").iterdir())
    assert names == sorted(
        [
            f"{snapshot_stem('test_param[a/b]')}.json",
            "test_param[a_b].json",
            f"{snapshot_stem('test_param[x y]')}.json",
            "test_param[bf16-8].json",
            "TestModel.test_init.json",
            "test_several.json",
            "test_several-2.json",
            f"test_several-{snapshot_stem('opt state')}.json",
            "test_same_name_twice-a.json",
        ]
    )
    assert all("/" not in name and " " not in name for name in names)
    assert len(set(names)) == len(names)  # "a/b" and "a_b" do not collide
    several = pytester.path / "__structures__" / "test_several-2.json"
    assert json.loads(several.read_text())["leaves"][0]["shape"] == [2]
    _run(pytester, "-k", "not same_name").assert_outcomes(passed=6)


def test_unreadable_snapshot_fails_and_names_the_flag(pytester):
    pytester.makepyfile(
        """
        import jax.numpy as jnp

        def test_it(structure_snapshot):
            structure_snapshot.check(jnp.zeros(1))
        """
    )
    (pytester.path / "__structures__").mkdir()
    (pytester.path / "__structures__" / "test_it.json").write_text('{"version": 99}')
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*structure_snapshot: cannot read __structures__/test_it.json: treeshape.Structure.from_json: version*",
            "Rerun with --update-structures to rewrite it.",
        ]
    )


def test_snapshot_stem():
    assert snapshot_stem("test_x[1-2]") == "test_x[1-2]"
    assert snapshot_stem("C::test_x") == "C.test_x"
    assert snapshot_stem("test_x[a/b]") != snapshot_stem("test_x[a_b]")
    long = snapshot_stem("test_" + "x" * 500)
    assert len(long) < 140
    assert snapshot_stem("..") and not snapshot_stem("..").startswith(".")
    assert snapshot_stem("test[\u00e9\n:*?<>|]").isascii()


def test_import_treeshape_is_lazy_and_every_public_name_resolves():
    code = (
        "import sys, treeshape, treeshape.pytest_plugin\n"
        "assert 'jax' not in sys.modules, 'import treeshape imported JAX'\n"
        "names = {name: getattr(treeshape, name) for name in treeshape.__all__}\n"
        "assert 'jax' in sys.modules and set(dir(treeshape)) >= set(names)\n"
        "from treeshape import settle, Structure\n"
        "assert settle is names['settle'] and Structure.__module__ == 'treeshape'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
