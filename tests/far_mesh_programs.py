"""Train steps planned for meshes this process does not have, and the reference compile.

Imported by `test_far_mesh.py` (inputs sharded over a `jax.sharding.AbstractMesh`), and run
as a script in a child process with that many simulated CPU devices, where the same step is
compiled with `jax.jit(...).lower(...).compile()` over a real mesh of the same shape:

    python far_mesh_programs.py PROGRAM '{"data": 8, "model": 8}'

prints XLA's memory figures of that compile as one JSON object.
"""

import json
import sys

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P


WIDTH = 512
_TX = optax.adamw(1e-3)


def mlp_loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(mlp_loss)(params, batch)
    updates, opt_state = _TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _sds(shape, mesh, spec, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


def inputs(program, mesh, batch=None):
    """The abstract inputs of `program` on `mesh` (abstract or real): fully sharded data
    parallel (`fsdp`: parameters split over the one axis `data`) or tensor parallel (`tp`:
    hidden units over `model`, the batch over `data`)."""
    if program == "fsdp":
        n = mesh.shape["data"]
        weight, bias, data = P("data", None), P(None), P("data", None)
    else:
        n = mesh.shape["data"]
        weight, bias, data = P(None, "model"), P("model"), P("data", None)
    batch = batch if batch is not None else 4 * n
    params = {
        "w1": _sds((WIDTH, 4 * WIDTH), mesh, weight),
        "b1": _sds((4 * WIDTH,), mesh, bias),
        "w2": _sds((4 * WIDTH, WIDTH), mesh, weight if program == "fsdp" else P("model", None)),
    }
    opt_state = jax.eval_shape(_TX.init, params)
    # eval_shape keeps no sharding for the moments: give them the parameters' (as a real
    # state has); scalars (the step count) are replicated.
    flat_params = {k: v.sharding for k, v in params.items()}

    def place(path, leaf):
        key = getattr(path[-1], "key", None)
        sharding = flat_params.get(key, NamedSharding(mesh, P()))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    opt_state = jax.tree_util.tree_map_with_path(place, opt_state)
    data = {"x": _sds((batch, WIDTH), mesh, data), "y": _sds((batch, WIDTH), mesh, data)}
    return params, opt_state, data


def _main(program, axes):
    mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
    compiled = jax.jit(train_step, donate_argnums=(0, 1)).lower(*inputs(program, mesh)).compile()
    m = compiled.memory_analysis()
    print(
        json.dumps(
            {
                "argument": m.argument_size_in_bytes,
                "output": m.output_size_in_bytes,
                "temp": m.temp_size_in_bytes,
                "alias": m.alias_size_in_bytes,
                "devices": len(jax.devices()),
            }
        )
    )


if __name__ == "__main__":
    _main(sys.argv[1], json.loads(sys.argv[2]))
