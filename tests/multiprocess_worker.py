"""One process of `tests/test_multiprocess.py`: treeshape under `jax.distributed` on CPU.

Run as `python multiprocess_worker.py PORT NUM_PROCESSES PROCESS_ID` (the test starts
every process, with a clean environment: two CPU devices each, no XLA_FLAGS). Not a
test module itself (no `test_` prefix). Every check raises on failure, so a failing
process exits non-zero; the last line printed is `done {json}` with the training losses.
"""

import json
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from helpers import train_step
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import treeshape as ts


STEPS, BATCH, FEATURES, OUT = 10, 16, 4, 2


def training_data() -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The data-parallel example: the same in every process and in the test's reference."""
    rng = np.random.RandomState(0)
    xs = rng.normal(size=(STEPS, BATCH, FEATURES)).astype(np.float32)
    true_w = rng.normal(size=(FEATURES, OUT)).astype(np.float32)
    ys = (xs @ true_w + 0.1 * rng.normal(size=(STEPS, BATCH, OUT))).astype(np.float32)
    params = {"w": np.zeros((FEATURES, OUT), np.float32), "b": np.zeros(OUT, np.float32)}
    return xs, ys, params


def make_train(opt: optax.GradientTransformation):
    """`train(params, opt_state, xs, ys) -> losses`: `lax.scan` over the steps, carry from treeshape."""
    step = train_step(opt)

    def train(params, opt_state, xs, ys):
        carry = ts.scan_carry(step, (params, opt_state), (xs, ys))
        _, losses = lax.scan(step, carry, (xs, ys))
        return losses

    return train


def _local(x: jax.Array) -> list[np.ndarray]:
    return [np.asarray(shard.data) for shard in x.addressable_shards]


def _replicated_value(x: jax.Array) -> np.ndarray:
    assert x.is_fully_replicated, x.sharding
    return np.asarray(x.addressable_shards[0].data)


def check_structure_of(mesh, sharded) -> None:
    n_dev = mesh.size
    x = jax.make_array_from_callback((2 * n_dev, 3), sharded, lambda idx: np.ones((2 * n_dev, 3), np.float32)[idx])
    assert not x.is_fully_addressable
    s = ts.structure_of({"x": x, "n": 1})
    assert s.leaves[1] == jax.ShapeDtypeStruct((2 * n_dev, 3), jnp.float32, sharding=sharded)
    assert s.leaves[1].sharding == sharded
    n_bytes = s.leaves[0].dtype.itemsize  # the weak int: unsharded, counted whole
    assert (s.nbytes, s.nbytes_per_device) == (2 * n_dev * 3 * 4 + n_bytes, 2 * 3 * 4 + n_bytes)


def check_fills(mesh, sharded, replicated) -> None:
    n_dev = mesh.size
    key_dtype = jax.random.key(0).dtype
    kinds = {"f32": (jnp.float32, False), "bf16": (jnp.bfloat16, False), "i32": (jnp.int32, False)}
    kinds |= {"weak": (jnp.float32, True), "key": (key_dtype, False)}
    specs = {
        f"{name}_{where}": jax.ShapeDtypeStruct((2 * n_dev, 3), dtype, weak_type=weak, sharding=sharding)
        for name, (dtype, weak) in kinds.items()
        for where, sharding in (("sharded", sharded), ("replicated", replicated))
    }
    s = ts.structure_of(specs)
    for build, value in [(s.zeros, 0), (s.ones, 1), (lambda: s.full(7), 7)]:
        out = build()
        assert ts.structure_of(out) == s
        for name, x in out.items():
            spec = specs[name]
            assert x.sharding.is_equivalent_to(spec.sharding, 2), (name, x.sharding)
            t = jax.typeof(x)
            assert (t.shape, t.dtype, t.weak_type) == (spec.shape, spec.dtype, spec.weak_type), (name, t)
            assert not x.is_fully_addressable, name  # a global array: its devices span every process
            shard_shape = (2, 3) if spec.sharding is sharded else (2 * n_dev, 3)
            assert len(x.addressable_shards) == len(jax.local_devices())
            for shard in x.addressable_shards:
                assert shard.data.shape == shard_shape, (name, shard.data.shape)
                if name.startswith("key"):
                    assert not np.asarray(jax.random.key_data(shard.data)).any(), name  # zero key data
                else:
                    np.testing.assert_array_equal(np.asarray(shard.data, np.float32), np.full(shard_shape, value))


def check_with_shardings(mesh, sharded, replicated) -> None:
    n_dev = mesh.size
    plain = ts.structure_of(
        {
            "w": jax.ShapeDtypeStruct((2 * n_dev, 4), jnp.float32),
            "b": jax.ShapeDtypeStruct((3,), jnp.bfloat16),
            "keys": jax.ShapeDtypeStruct((n_dev,), jax.random.key(0).dtype),
            "act": "relu",
        }
    )
    placed = plain.with_shardings(lambda path, leaf: sharded if leaf.shape[0] % n_dev == 0 else replicated)
    assert placed == plain
    assert placed.nbytes_per_device == 2 * 4 * 4 + 3 * 2 + 8  # w: 2 rows, b: whole, 1 key
    z = placed.zeros()
    assert z["act"] == "relu"
    assert z["w"].sharding.is_equivalent_to(sharded, 2) and z["keys"].sharding.is_equivalent_to(sharded, 1)
    assert z["b"].sharding.is_equivalent_to(replicated, 1)
    assert all(not a.any() for a in _local(z["w"])) and all(not a.any() for a in _local(z["b"]))
    assert all(not np.asarray(jax.random.key_data(sh.data)).any() for sh in z["keys"].addressable_shards)


def check_abstract_meshes(mesh, params) -> None:
    opt = optax.adam(1e-3)
    s = ts.out_structure(opt.init, params)
    opt_state = s.zeros()  # placed on the arguments' mesh: never silently on one device
    mu = opt_state[0].mu
    assert mu["w"].sharding.is_equivalent_to(params["w"].sharding, 2), mu["w"].sharding
    copy = pickle.loads(pickle.dumps(s))
    try:
        copy.zeros()
    except ValueError as err:
        assert "jax.set_mesh" in str(err) and "with_shardings" in str(err) and "tree[0].mu['w']" in str(err)
    else:
        raise AssertionError("an unresolvable abstract mesh must raise")
    with jax.set_mesh(mesh):
        assert copy.zeros()[0].mu["w"].sharding.is_equivalent_to(params["w"].sharding, 2)


def check_scan_carry_in_jit(mesh, sharded, replicated) -> None:
    n_dev = mesh.size
    xs = jax.make_array_from_callback(
        (3, 2 * n_dev, 3), NamedSharding(mesh, P(None, "d")), lambda idx: np.ones((3, 2 * n_dev, 3), np.float32)[idx]
    )

    def body(carry, x):  # the carry comes back sharded over 'd': its type changes
        acc, n = carry
        return (jax.sharding.reshard(acc + x, sharded), n + 1), None

    @jax.jit
    def run(xs):
        init = (jax.sharding.reshard(jnp.zeros((2 * n_dev, 3), jnp.float32), replicated), 0)
        carry = ts.scan_carry(body, init, xs)
        assert jax.typeof(carry[0]).sharding.spec == P("d", None)
        return lax.scan(body, carry, xs)[0]

    acc, n = run(xs)
    assert acc.sharding.spec == P("d", None)
    assert all((a == 3).all() for a in _local(acc)) and int(_replicated_value(n)) == 3


def check_scan_carry_in_shard_map(mesh, sharded) -> None:
    n_dev = mesh.size
    data = np.arange(2 * n_dev * 3, dtype=np.float32).reshape(2 * n_dev, 3)
    x = jax.make_array_from_callback(data.shape, sharded, lambda idx: data[idx])

    def local(block):  # this device's (2, 3) rows, varying over 'd'
        def body(acc, row):
            return acc + row, None

        init = ts.scan_carry(body, jnp.zeros(3, jnp.float32), block)  # made varying over 'd'
        acc, _ = lax.scan(body, init, block)
        return lax.psum(acc, "d")

    total = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("d"), out_specs=P()))(x)
    np.testing.assert_allclose(_replicated_value(total), data.sum(0))


def train_data_parallel(mesh, params_host) -> list[float]:
    xs_host, ys_host, _ = training_data()
    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P(None, "d"))
    params = {
        k: jax.make_array_from_callback(v.shape, replicated, lambda idx, v=v: v[idx]) for k, v in params_host.items()
    }
    xs = jax.make_array_from_callback(xs_host.shape, batch, lambda idx: xs_host[idx])
    ys = jax.make_array_from_callback(ys_host.shape, batch, lambda idx: ys_host[idx])
    opt = optax.adam(1e-2)
    opt_state = ts.out_structure(opt.init, params).zeros()
    assert opt_state[0].mu["w"].sharding.is_equivalent_to(replicated, 2)
    losses = jax.jit(make_train(opt))(params, opt_state, xs, ys)
    return [float(v) for v in _replicated_value(losses)]


def main() -> None:
    port, num_processes, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 2)
    jax.distributed.initialize(
        f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        coordinator_bind_address=f"127.0.0.1:{port}",
        initialization_timeout=60,
    )
    assert jax.process_count() == num_processes and len(jax.local_devices()) == 2
    mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(AxisType.Explicit,))
    sharded, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
    _, _, params_host = training_data()
    params = {
        "w": jax.make_array_from_callback((2 * mesh.size, 3), sharded, lambda idx: np.ones((2 * mesh.size, 3))[idx]),
        "b": jax.make_array_from_callback((3,), replicated, lambda idx: np.ones(3, np.float32)[idx]),
    }
    checks = [
        ("structure_of", lambda: check_structure_of(mesh, sharded)),
        ("fills", lambda: check_fills(mesh, sharded, replicated)),
        ("with_shardings", lambda: check_with_shardings(mesh, sharded, replicated)),
        ("abstract_meshes", lambda: check_abstract_meshes(mesh, params)),
        ("scan_carry_in_jit", lambda: check_scan_carry_in_jit(mesh, sharded, replicated)),
        ("scan_carry_in_shard_map", lambda: check_scan_carry_in_shard_map(mesh, sharded)),
    ]
    for name, check in checks:
        check()
        print(f"ok {name}", flush=True)
    losses = train_data_parallel(mesh, params_host)
    print("done " + json.dumps({"process": process_id, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
