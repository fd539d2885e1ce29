"""One-shot check of `ts.cost(..., target="h200")` against a real H200.

Three fixed steps on ONE device (unsharded): a 4-layer scanned bf16 MLP train step with
its state donated, an unrolled f32 MLP train step with its parameters donated, and a
bf16 matmul.

    # here (no GPU; jax 0.10.2 with jax-cuda12-plugin 0.10.2 importable):
    JAX_PLATFORMS=cpu PYTHONPATH=$PWD python benchmarks/target_check.py --plan /tmp/plan.json
    # on the machine with the H200 (its own JAX and CUDA plugin; no treeshape needed):
    python benchmarks/target_check.py --device /tmp/device.json
    # anywhere:
    python benchmarks/target_check.py --compare /tmp/plan.json /tmp/device.json

`--plan` writes treeshape's figures: `ts.cost(..., target="h200")` (XLA:GPU deviceless,
this machine's jaxlib) and, for reference, the CPU stand-in (`ts.cost` without target).
`--device` compiles the same steps with `jax.jit(step, donate_argnums=...).lower(...)
.compile()` on the real GPU and writes `memory_analysis()` and `cost_analysis()`'s
figures, the device kind and the JAX version; and, where `jax.experimental.topologies`
works there, the same steps compiled deviceless for an H200 by that machine's own plugin
(from treeshape/_cost/specs/h200.txtpb), which separates the XLA-version difference from the
deviceless-vs-real one. It imports only JAX and NumPy, and runs in well under a minute.
"""

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp


FIELDS = ("argument_bytes", "output_bytes", "temp_bytes", "alias_bytes", "peak_bytes", "flops")
SPEC = Path(__file__).resolve().parent.parent / "treeshape" / "_cost" / "specs" / "h200.txtpb"


# -- the steps (pure JAX: the device machine needs nothing else) -----------------------
def _scanned_mlp_step(state: Any, x: Any) -> Any:
    """4 layers under `lax.scan`, bf16, SGD with momentum; state = (params, momentum)."""
    params, momentum = state

    def loss(params: Any) -> Any:
        def layer(h: Any, w: Any) -> Any:
            return jax.nn.gelu(h @ w), None

        h, _ = jax.lax.scan(layer, x, params)
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    grads = jax.grad(loss)(params)
    momentum = jax.tree.map(lambda m, g: (0.9 * m + g).astype(m.dtype), momentum, grads)
    params = jax.tree.map(lambda p, m: (p - 0.01 * m).astype(p.dtype), params, momentum)
    return params, momentum


def _unrolled_mlp_step(params: Any, x: Any) -> Any:
    """4 f32 layers in a Python loop, plain SGD; params = a list of (w, b)."""

    def loss(params: Any) -> Any:
        h = x
        for w, b in params:
            h = jnp.tanh(h @ w + b)
        return jnp.mean(h**2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)


def _matmul(a: Any, b: Any) -> Any:
    return a @ b


def steps() -> dict[str, tuple[Any, tuple[Any, ...], tuple[int, ...]]]:
    """name -> (function, abstract arguments, donate_argnums)."""
    sds = jax.ShapeDtypeStruct
    width, batch, layers = 2048, 1024, 4
    w = sds((layers, width, width), jnp.bfloat16)
    scanned = ((w, w), sds((batch, width), jnp.bfloat16))
    unrolled = ([(sds((width, width), jnp.float32), sds((width,), jnp.float32)) for _ in range(layers)],)
    unrolled += (sds((batch, width), jnp.float32),)
    square = sds((4096, 4096), jnp.bfloat16)
    return {
        "scanned_mlp_bf16_donated": (_scanned_mlp_step, scanned, (0,)),
        "unrolled_mlp_f32_donated": (_unrolled_mlp_step, unrolled, (0,)),
        "matmul_bf16_4096": (_matmul, (square, square), ()),
    }


def _memory(compiled: Any) -> dict[str, Any]:
    m = compiled.memory_analysis()
    out: dict[str, Any] = {
        "argument_bytes": m.argument_size_in_bytes,
        "output_bytes": m.output_size_in_bytes,
        "temp_bytes": m.temp_size_in_bytes,
        "alias_bytes": m.alias_size_in_bytes,
    }
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    out["backend_peak_memory_in_bytes"] = getattr(m, "peak_memory_in_bytes", None)
    return out


def _flops(compiled: Any) -> Any:
    try:
        analysis = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    flops = None if not analysis else analysis.get("flops")
    return None if flops is None or flops < 0 else flops  # -1: XLA's "not reported" (cuBLAS calls)


# -- --plan: treeshape here ----------------------------------------------------------------
def plan(out: str) -> None:
    import treeshape as ts

    result: dict[str, Any] = {
        "jax": jax.__version__,
        "python": platform.python_version(),
        "target": "h200",
        "h200": {},
        "cpu_stand_in": {},
    }
    for name, (fn, args, donate) in steps().items():
        for key, target in (("h200", "h200"), ("cpu_stand_in", None)):
            start = time.perf_counter()
            c = ts.cost(fn, *args, donate_argnums=donate, target=target)
            row = {f: getattr(c, f) for f in FIELDS}
            row["backend"] = c.backend
            row["seconds"] = round(time.perf_counter() - start, 3)
            result[key][name] = row
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


# -- --device: the real GPU -----------------------------------------------------------------
def _spec_for_plugin(text: str, make: Any) -> Any:
    """The topology from the spec, less each field this plugin says it does not know."""
    for _ in range(16):
        try:
            return make(text)
        except Exception as e:
            unknown = re.search(r'has no field named "(\w+)"', str(e))
            if unknown is None:
                raise
            field = unknown.group(1)
            text = "".join(line for line in text.splitlines(True) if not re.match(rf"\s*{field}\s*:", line))
    raise RuntimeError("the plugin rejects the spec")


def device(out: str) -> None:
    start = time.perf_counter()
    gpu = jax.devices()[0]
    result: dict[str, Any] = {
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _version("jaxlib"),
        "python": platform.python_version(),
        "device_kind": gpu.device_kind,
        "platform": gpu.platform,
        "real": {},
        "deviceless": {},
        "deviceless_error": None,
    }
    try:
        stats = gpu.memory_stats() or {}
        result["bytes_limit"] = stats.get("bytes_limit")
    except Exception:
        result["bytes_limit"] = None
    for name, (fn, args, donate) in steps().items():
        began = time.perf_counter()
        compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
        row = _memory(compiled)
        row["flops"] = _flops(compiled)
        row["seconds"] = round(time.perf_counter() - began, 3)
        result["real"][name] = row
    try:
        from jax.experimental import topologies
        from jax.sharding import SingleDeviceSharding

        topology = _spec_for_plugin(
            SPEC.read_text(),
            lambda text: topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1"),
        )
        target = topology.devices[0]
        result["deviceless_device_kind"] = target.device_kind
        for name, (fn, args, donate) in steps().items():
            placed = jax.tree.map(
                lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=SingleDeviceSharding(target)), args
            )
            began = time.perf_counter()
            lowered = jax.jit(fn, donate_argnums=donate).lower(*placed)
            try:
                compiled = lowered.compile()
                note = None
            except Exception as e:  # e.g. an older plugin wanting autotuning results
                note = f"{type(e).__name__}: {str(e)[:300]}; retried with xla_gpu_autotune_level=0"
                compiled = lowered.compile(compiler_options={"xla_gpu_autotune_level": 0})
            row = _memory(compiled)
            row["flops"] = _flops(compiled)
            row["note"] = note
            row["seconds"] = round(time.perf_counter() - began, 3)
            result["deviceless"][name] = row
    except Exception as e:
        result["deviceless_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    result["total_seconds"] = round(time.perf_counter() - start, 3)
    Path(out).write_text(json.dumps(result, indent=1))
    print(f"wrote {out} in {result['total_seconds']} s ({result['device_kind']}, jax {result['jax']})")


def _version(package: str) -> Any:
    try:
        import importlib.metadata

        return importlib.metadata.version(package)
    except Exception:
        return None


# -- --compare --------------------------------------------------------------------------------
def compare(plan_path: str, device_path: str) -> None:
    p = json.loads(Path(plan_path).read_text())
    d = json.loads(Path(device_path).read_text())
    print(f"plan: jax {p['jax']} (treeshape target=h200, deviceless); device: {d['device_kind']}, jax {d['jax']}")
    if d.get("deviceless_error"):
        print(f"device-side deviceless compile failed: {d['deviceless_error']}")
    columns = ("treeshape h200", "real GPU", "ratio", "dev. deviceless", "CPU stand-in")
    print("flops: treeshape counts a scan body as often as it runs; XLA's own cost_analysis counts it once")
    print(f"{'step':<26} {'figure':<15} " + " ".join(f"{c:>16}" for c in columns))
    for name in p["h200"]:
        for field in FIELDS:
            ours = p["h200"][name].get(field)
            real = d["real"].get(name, {}).get(field)
            real = None if isinstance(real, (int, float)) and real < 0 else real
            other = d["deviceless"].get(name, {}).get(field)
            cpu = p["cpu_stand_in"].get(name, {}).get(field)
            ratio = f"{ours / real:.3f}" if isinstance(ours, (int, float)) and real else "-"
            cells = [_fmt(ours), _fmt(real), ratio, _fmt(other), _fmt(cpu)]
            print(f"{name:<26} {field:<15} " + " ".join(f"{c:>16}" for c in cells))
        print()


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--plan", metavar="OUT.json")
    group.add_argument("--device", metavar="OUT.json")
    group.add_argument("--compare", nargs=2, metavar=("PLAN.json", "DEVICE.json"))
    args = parser.parse_args(argv)
    if args.plan:
        plan(args.plan)
    elif args.device:
        device(args.device)
    else:
        compare(*args.compare)


if __name__ == "__main__":
    sys.exit(main())
