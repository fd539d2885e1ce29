"""Group K: steps of kinds the step-time table never had, held out from the time model.

Defined and committed before any of them was measured on a chip, after the per-kind
refit of the time model (API.md section 31, the issue "The time right on kernels it never
saw"), and never tuned on: the model is compared with them only once it is committed.

Twelve kinds, as users write them: mixture-of-experts routing (top-k, one-hot dispatch
and combine einsums), a diffusion UNet, long causal attention written out (sequence 4096),
a selective-scan SSM (`lax.associative_scan`), embedding bags (gathers, scatter-add
gradients), a graph network (`jax.ops.segment_sum`), gradient accumulation (`lax.scan`
over micro-batches), an LSTM with bf16 parameters and Adafactor, Pallas TPU kernels (JAX's
flash attention, a hand-written blocked matmul), a decode step with a KV cache, dilated
1-D convolutions (WaveNet) and host offload of a remat policy's dots. Same conventions as
`models.py` (a `models.Case` each: `step(state, batch) -> (state, loss)`, the state
donated); imports JAX and optax only. The Pallas rows lower for a TPU only.
"""

import functools as ft
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
from models import Case


BF16 = jnp.bfloat16
F32 = jnp.float32


def _dense(key: Any, shape: tuple[int, ...], scale: float | None = None, dtype: Any = F32) -> Any:
    fan_in = shape[-2] if len(shape) > 1 else shape[0]
    return (jax.random.normal(key, shape, F32) * (scale or fan_in**-0.5)).astype(dtype)


def _train(loss_fn: Callable[..., Any], tx: Any) -> Callable[..., Any]:
    def step(state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    return step


def _state(params: Any, tx: Any) -> dict[str, Any]:
    return {"params": params, "opt_state": tx.init(params)}


def _rms(x: Any, scale: Any) -> Any:
    x32 = x.astype(F32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def _xent(logits: Any, labels: Any) -> Any:
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(F32), labels).mean()


def _lm_batch(key: Any, size: int, seq: int, vocab: int) -> dict[str, Any]:
    tokens = jax.random.randint(key, (size, seq + 1), 0, vocab)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}


def _lm_params(key: Any, vocab: int, d: int, layers: Any) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    return {"embed": _dense(k1, (vocab, d), 0.02), "layers": layers, "norm": jnp.ones(d), "out": _dense(k2, (d, vocab))}


def _lm_head(params: Any, x: Any, batch: Any) -> Any:
    return _xent(_rms(x, params["norm"]) @ params["out"].astype(BF16), batch["targets"])


def _lm_case(name: str, kind: str, size: int, seq: int, vocab: int, init: Any, loss_fn: Any, tx: Any = None) -> Case:
    """A language model's train step over `size` sequences of `seq` tokens (AdamW unless
    `tx`)."""
    tx = tx or optax.adamw(3e-4, weight_decay=0.1)

    def make(key: Any) -> Any:
        k1, k2 = jax.random.split(key)
        return _state(init(k1), tx), _lm_batch(k2, size, seq, vocab)

    return Case(name, kind, size, _train(loss_fn, tx), make, size * seq)


# -- a transformer's pieces (shared by several kinds) -------------------------------------------
def _attention_params(key: Any, d: int) -> dict[str, Any]:
    k = jax.random.split(key, 4)
    return {n: _dense(k[i], (d, d)) for i, n in enumerate(("wq", "wk", "wv", "wo"))} | {"n1": jnp.ones(d)}


def _ffn_params(key: Any, d: int, d_ff: int) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    return {"up": _dense(k1, (d, d_ff)), "down": _dense(k2, (d_ff, d)), "n2": jnp.ones(d)}


def _attend(q: Any, k: Any, v: Any, how: str) -> Any:
    """Causal attention of `[b, t, heads, dh]` queries, keys and values."""
    scale = q.shape[-1] ** -0.5
    if how == "fused":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)
    if how == "flash":  # JAX's Pallas TPU kernel, in its [b, heads, t, dh] layout
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        return flash_attention(q, k, v, causal=True, sm_scale=scale).transpose(0, 2, 1, 3)
    t = q.shape[1]  # written out: XLA's attention, the scores in f32, masked, softmax
    s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=F32) * scale
    s = jnp.where(jnp.arange(t)[:, None] >= jnp.arange(t)[None, :], s, jnp.finfo(F32).min)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, axis=-1).astype(q.dtype), v)


def _attention(p: Any, x: Any, heads: int, how: str, name: Callable[[Any, str], Any] = lambda a, _: a) -> Any:
    b, t, d = x.shape
    h = _rms(x, p["n1"])
    q, k, v = (name(h @ p[n].astype(x.dtype), n).reshape(b, t, heads, d // heads) for n in ("wq", "wk", "wv"))
    return x + name(_attend(q, k, v, how).reshape(b, t, d) @ p["wo"].astype(x.dtype), "wo")


def _ffn(p: Any, x: Any, name: Callable[[Any, str], Any] = lambda a, _: a) -> Any:
    h = name(_rms(x, p["n2"]) @ p["up"].astype(x.dtype), "up")
    return x + name(jax.nn.gelu(h) @ p["down"].astype(x.dtype), "down")


def _lm(
    layers: int, d: int, heads: int, vocab: int, how: str
) -> tuple[Callable[[Any], Any], Callable[[Any, Any], Any]]:
    """A plain transformer language model (`init(key)`, `loss_fn(params, batch)`), its layers
    unrolled."""

    def init(key: Any) -> Any:
        k = jax.random.split(key, 2 * layers + 1)
        blocks = [_attention_params(k[2 * i], d) | _ffn_params(k[2 * i + 1], d, 4 * d) for i in range(layers)]
        return _lm_params(k[-1], vocab, d, blocks)

    def loss_fn(params: Any, batch: Any) -> Any:
        x = params["embed"].astype(BF16)[batch["inputs"]]
        for p in params["layers"]:
            x = _ffn(p, _attention(p, x, heads, how))
        return _lm_head(params, x, batch)

    return init, loss_fn


# -- 1. mixture of experts: router, top-k, one-hot dispatch and combine einsums ------------------
def _moe(p: Any, x: Any, top_k: int, capacity_factor: float) -> tuple[Any, Any]:
    """GShard's layer, each sequence a group: every token to its `top_k` experts, at most
    `capacity` tokens an expert (the rest dropped), and the load-balancing loss."""
    b, s, d = x.shape
    experts = p["router"].shape[-1]
    capacity = int(capacity_factor * s * top_k / experts)
    h = _rms(x, p["n2"])
    probs = jax.nn.softmax((h @ p["router"].astype(BF16)).astype(F32), axis=-1)  # [b, s, e]
    gates, chosen = jax.lax.top_k(probs, top_k)  # [b, s, k]
    gates = gates / jnp.sum(gates, -1, keepdims=True)
    choice = jax.nn.one_hot(chosen, experts, dtype=jnp.int32)  # [b, s, k, e]
    # each choice's place in its expert's buffer: first choices first, then by token
    order = choice.transpose(0, 2, 1, 3).reshape(b, top_k * s, experts)
    place = ((jnp.cumsum(order, axis=1) - 1) * order).reshape(b, top_k, s, experts).transpose(0, 2, 1, 3)
    place = jnp.sum(place, -1)  # [b, s, k]
    kept = (place < capacity).astype(BF16)
    slot = jax.nn.one_hot(place, capacity, dtype=BF16) * kept[..., None]  # [b, s, k, c]
    dispatch = jnp.einsum("bske,bskc->bsec", choice.astype(BF16), slot)
    combine = jnp.einsum("bske,bskc,bsk->bsec", choice.astype(BF16), slot, gates.astype(BF16))
    xe = jnp.einsum("bsec,bsd->becd", dispatch, h)
    ye = jax.nn.gelu(jnp.einsum("becd,edf->becf", xe, p["up"].astype(BF16)))
    ye = jnp.einsum("becf,efd->becd", ye, p["down"].astype(BF16))
    y = jnp.einsum("bsec,becd->bsd", combine, ye)
    load = jnp.mean(choice[:, :, 0].astype(F32), axis=(0, 1))  # share of first choices per expert
    aux = experts * jnp.sum(load * jnp.mean(probs, axis=(0, 1)))
    return x + y, aux


def moe(size: int, *, layers: int = 4, d: int = 512, experts: int = 8, top_k: int = 2, seq: int = 512) -> Case:
    heads, d_ff, vocab = 8, 2 * d, 8_000

    def init(key: Any) -> Any:
        k = jax.random.split(key, 4 * layers + 1)
        blocks = [
            _attention_params(k[4 * i], d)
            | {
                "router": _dense(k[4 * i + 1], (d, experts), 0.02),
                "up": _dense(k[4 * i + 2], (experts, d, d_ff)),
                "down": _dense(k[4 * i + 3], (experts, d_ff, d)),
                "n2": jnp.ones(d),
            }
            for i in range(layers)
        ]
        return _lm_params(k[-1], vocab, d, blocks)

    def loss_fn(params: Any, batch: Any) -> Any:
        x, aux = params["embed"].astype(BF16)[batch["inputs"]], 0.0
        for p in params["layers"]:
            x, a = _moe(p, _attention(p, x, heads, "fused"), top_k, 1.25)
            aux = aux + a
        return _lm_head(params, x, batch) + 0.01 * aux

    return _lm_case(f"moe-{layers}x{experts}e-top{top_k}", "mixture of experts", size, seq, vocab, init, loss_fn)


# -- 2. a diffusion UNet: convolutions, group norm, down- and up-sampling, skips, attention -----
def _conv(x: Any, w: Any, stride: int = 1) -> Any:
    return jax.lax.conv_general_dilated(
        x, w.astype(x.dtype), (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _group_norm(x: Any, scale: Any, groups: int = 32) -> Any:
    b, hh, ww, c = x.shape
    g = x.reshape(b, hh, ww, groups, c // groups).astype(F32)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.var(g, axis=(1, 2, 4), keepdims=True)
    return ((g - mean) * jax.lax.rsqrt(var + 1e-5)).reshape(x.shape).astype(x.dtype) * scale.astype(x.dtype)


def _res_params(key: Any, c_in: int, c_out: int, t_dim: int) -> dict[str, Any]:
    k = jax.random.split(key, 4)
    p = {
        "g1": jnp.ones(c_in),
        "c1": _dense(k[0], (3, 3, c_in, c_out), (9 * c_in) ** -0.5),
        "t": _dense(k[1], (t_dim, c_out)),
        "g2": jnp.ones(c_out),
        "c2": _dense(k[2], (3, 3, c_out, c_out), (9 * c_out) ** -0.5),
    }
    if c_in != c_out:
        p["skip"] = _dense(k[3], (1, 1, c_in, c_out), c_in**-0.5)
    return p


def _res(p: Any, x: Any, temb: Any) -> Any:
    h = _conv(jax.nn.silu(_group_norm(x, p["g1"])), p["c1"])
    h = h + (jax.nn.silu(temb) @ p["t"].astype(BF16))[:, None, None, :]
    h = _conv(jax.nn.silu(_group_norm(h, p["g2"])), p["c2"])
    return h + (_conv(x, p["skip"]) if "skip" in p else x)


def _image_attention(p: Any, x: Any, heads: int = 4) -> Any:
    b, hh, ww, c = x.shape
    h = _group_norm(x, p["g"]).reshape(b, hh * ww, c)
    q, k, v = (h @ p[n].astype(BF16) for n in ("wq", "wk", "wv"))
    a = jax.nn.dot_product_attention(*(z.reshape(b, hh * ww, heads, c // heads) for z in (q, k, v)))
    return x + (a.reshape(b, hh * ww, c) @ p["wo"].astype(BF16)).reshape(x.shape)


def unet(size: int, *, channels: tuple[int, ...] = (64, 128, 256), image: int = 32) -> Case:
    """A DDPM-style noise predictor: one residual block a level down and one up (its input
    the skip concatenated), strided convolutions down, nearest-neighbour up, attention at
    the lowest resolution and in the middle."""
    t_dim = 4 * channels[0]
    levels = len(channels)
    down = list(zip((channels[0], *channels[:-1]), channels, strict=True))
    up = [(channels[min(i + 1, levels - 1)] + channels[i], channels[i]) for i in reversed(range(levels))]

    def init(key: Any) -> Any:
        keys = iter(jax.random.split(key, 64))
        c_low = channels[-1]
        attn = lambda: (
            {n: _dense(next(keys), (c_low, c_low)) for n in ("wq", "wk", "wv", "wo")} | {"g": jnp.ones(c_low)}
        )  # noqa: E731
        return {
            "t1": _dense(next(keys), (channels[0], t_dim)),
            "t2": _dense(next(keys), (t_dim, t_dim)),
            "in": _dense(next(keys), (3, 3, 3, channels[0]), 0.2),
            "down": [_res_params(next(keys), a, b, t_dim) for a, b in down],
            "downsample": [_dense(next(keys), (3, 3, c, c), (9 * c) ** -0.5) for c in channels[:-1]],
            "mid": [_res_params(next(keys), c_low, c_low, t_dim) for _ in range(2)],
            "attn": [attn() for _ in range(3)],  # down, middle, up at the lowest resolution
            "up": [_res_params(next(keys), a, b, t_dim) for a, b in up],
            "upsample": [_dense(next(keys), (3, 3, c, c), (9 * c) ** -0.5) for c in channels[1:]],
            "g_out": jnp.ones(channels[0]),
            "out": _dense(next(keys), (3, 3, channels[0], 3), 0.01),
        }

    def net(params: Any, x: Any, t: Any) -> Any:
        half = channels[0] // 2
        freqs = jnp.exp(-math.log(10_000.0) * jnp.arange(half) / half)
        temb = jnp.concatenate([jnp.sin(t[:, None] * 1000 * freqs), jnp.cos(t[:, None] * 1000 * freqs)], -1)
        temb = (jax.nn.silu(temb @ params["t1"]) @ params["t2"]).astype(BF16)
        h, skips = _conv(x.astype(BF16), params["in"]), []
        for i in range(levels):
            h = _res(params["down"][i], h, temb)
            if i == levels - 1:
                h = _image_attention(params["attn"][0], h)
            skips.append(h)
            if i < levels - 1:
                h = _conv(h, params["downsample"][i], stride=2)
        h = _res(params["mid"][1], _image_attention(params["attn"][1], _res(params["mid"][0], h, temb)), temb)
        for j, i in enumerate(reversed(range(levels))):
            h = _res(params["up"][j], jnp.concatenate([h, skips.pop()], axis=-1), temb)
            if i == levels - 1:
                h = _image_attention(params["attn"][2], h)
            if i > 0:
                h = _conv(jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2), params["upsample"][i - 1])
        return _conv(jax.nn.silu(_group_norm(h, params["g_out"])), params["out"])

    def loss_fn(params: Any, batch: Any) -> Any:
        t = batch["t"]
        alpha = jnp.cos(t * jnp.pi / 2)[:, None, None, None]
        noisy = alpha * batch["images"] + jnp.sqrt(1 - alpha**2) * batch["noise"]
        return jnp.mean(jnp.square(net(params, noisy, t).astype(F32) - batch["noise"]))

    tx = optax.adamw(2e-4, weight_decay=0.0)

    def make(key: Any) -> Any:
        k = jax.random.split(key, 4)
        batch = {
            "images": jax.random.normal(k[1], (size, image, image, 3)),
            "noise": jax.random.normal(k[2], (size, image, image, 3)),
            "t": jax.random.uniform(k[3], (size,)),
        }
        return _state(init(k[0]), tx), batch

    name = f"unet-{'-'.join(map(str, channels))}-{image}px"
    return Case(name, "diffusion UNet", size, _train(loss_fn, tx), make, size)


# -- 3. long causal attention, written out (XLA's attention), sequence 4096 ----------------------
def long_attention(
    size: int, *, layers: int = 2, d: int = 1024, heads: int = 8, seq: int = 4096, vocab: int = 16_000
) -> Case:
    init, loss_fn = _lm(layers, d, heads, vocab, "xla")
    return _lm_case(f"long-attention-{layers}x{d}-{seq}", "long causal attention", size, seq, vocab, init, loss_fn)


# -- 4. a selective-scan SSM (Mamba's layer): `lax.associative_scan` over the sequence ----------
def _ssm_params(key: Any, d: int, inner: int, state: int) -> dict[str, Any]:
    k = jax.random.split(key, 6)
    rank = max(d // 16, 1)
    return {
        "norm": jnp.ones(d),
        "in": _dense(k[0], (d, 2 * inner)),
        "conv": _dense(k[1], (4, 1, inner), 0.5),
        "dt_down": _dense(k[2], (inner, rank)),
        "dt_up": _dense(k[3], (rank, inner)),
        "dt_bias": jnp.full(inner, -4.0),
        "bc": _dense(k[4], (inner, 2 * state)),
        "a_log": jnp.log(jnp.broadcast_to(jnp.arange(1, state + 1, dtype=F32), (inner, state))),
        "skip": jnp.ones(inner),
        "out": _dense(k[5], (inner, d)),
    }


def _ssm_layer(p: Any, x: Any) -> Any:
    inner, state = p["a_log"].shape
    xz = _rms(x, p["norm"]) @ p["in"].astype(BF16)
    xs, z = xz[..., :inner], xz[..., inner:]
    xs = jax.lax.conv_general_dilated(  # causal depthwise convolution over time
        xs, p["conv"].astype(BF16), (1,), [(3, 0)], dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=inner
    )
    xs = jax.nn.silu(xs)
    dt = jax.nn.softplus((xs @ p["dt_down"].astype(BF16) @ p["dt_up"].astype(BF16)).astype(F32) + p["dt_bias"])
    bc = (xs @ p["bc"].astype(BF16)).astype(F32)
    b_in, c_out = bc[..., :state], bc[..., state:]
    decay = jnp.exp(dt[..., None] * -jnp.exp(p["a_log"]))  # [b, t, inner, state]
    drive = (dt * xs.astype(F32))[..., None] * b_in[:, :, None, :]

    def combine(left: Any, right: Any) -> Any:
        return left[0] * right[0], right[0] * left[1] + right[1]

    _, h = jax.lax.associative_scan(combine, (decay, drive), axis=1)
    y = jnp.einsum("bten,btn->bte", h, c_out) + p["skip"] * xs.astype(F32)
    y = (y * jax.nn.silu(z.astype(F32))).astype(BF16)
    return x + y @ p["out"].astype(BF16)


def ssm(size: int, *, layers: int = 4, d: int = 384, state: int = 16, seq: int = 512, vocab: int = 8_000) -> Case:
    inner = 2 * d

    def init(key: Any) -> Any:
        k = jax.random.split(key, layers + 1)
        return _lm_params(k[-1], vocab, d, [_ssm_params(k[i], d, inner, state) for i in range(layers)])

    def loss_fn(params: Any, batch: Any) -> Any:
        x = params["embed"].astype(BF16)[batch["inputs"]]
        for p in params["layers"]:
            x = _ssm_layer(p, x)
        return _lm_head(params, x, batch)

    return _lm_case(f"ssm-{layers}x{d}-{seq}", "selective-scan SSM", size, seq, vocab, init, loss_fn)


# -- 5. embedding bags (a recommendation model): gathers, scatter-add gradients -------------------
_TABLES = (400_000, 200_000, 100_000, 100_000, 50_000, 20_000, 10_000, 1_000)


def recsys(size: int, *, tables: tuple[int, ...] = _TABLES, dim: int = 64, bag: int = 24, dense: int = 13) -> Case:
    """DLRM's shape: a bag of ids a table (up to `bag`, padded, masked), each bag's rows
    summed, a bottom MLP on the dense features, a top MLP on them all; Adagrad. The first
    table's ids are skewed (a few hot rows), the rest uniform."""

    def init(key: Any) -> Any:
        k = jax.random.split(key, len(tables) + 5)
        return {
            "tables": [_dense(k[i], (rows, dim), 0.01) for i, rows in enumerate(tables)],
            "bottom": [_dense(k[-5], (dense, 256)), _dense(k[-4], (256, dim))],
            "top": [_dense(k[-3], ((len(tables) + 1) * dim, 512)), _dense(k[-2], (512, 256)), _dense(k[-1], (256, 1))],
        }

    def loss_fn(params: Any, batch: Any) -> Any:
        x = jax.nn.relu(batch["dense"].astype(BF16) @ params["bottom"][0].astype(BF16))
        features = [jax.nn.relu(x @ params["bottom"][1].astype(BF16))]
        for table, ids, mask in zip(params["tables"], batch["ids"], batch["mask"], strict=True):
            features.append(jnp.sum(table[ids] * mask[..., None], axis=1).astype(BF16))
        h = jnp.concatenate(features, axis=-1)
        for w in params["top"][:-1]:
            h = jax.nn.relu(h @ w.astype(BF16))
        logits = (h @ params["top"][-1].astype(BF16)).astype(F32)[:, 0]
        return optax.sigmoid_binary_cross_entropy(logits, batch["clicks"]).mean()

    tx = optax.adagrad(0.01)

    def make(key: Any) -> Any:
        k = jax.random.split(key, 2 * len(tables) + 3)
        skewed = (tables[0] * jax.random.uniform(k[0], (size, bag)) ** 4).astype(jnp.int32)
        ids = [skewed] + [jax.random.randint(k[i + 1], (size, bag), 0, n) for i, n in enumerate(tables[1:])]
        lengths = [jax.random.randint(k[len(tables) + i], (size, 1), 1, bag + 1) for i in range(len(tables))]
        batch = {
            "ids": ids,
            "mask": [(jnp.arange(bag)[None, :] < n).astype(F32) for n in lengths],
            "dense": jax.random.normal(k[-3], (size, dense)),
            "clicks": jax.random.bernoulli(k[-2], 0.3, (size,)).astype(F32),
        }
        return _state(init(k[-1]), tx), batch

    return Case(f"recsys-{len(tables)}x{dim}-bag{bag}", "embedding bags", size, _train(loss_fn, tx), make, size)


# -- 6. a graph network: gathers over edges, `jax.ops.segment_sum` to nodes ----------------------
def _mlp2(ws: Any, x: Any) -> Any:
    return jax.nn.relu(x.astype(BF16) @ ws[0].astype(BF16)) @ ws[1].astype(BF16)


def graph(
    size: int, *, layers: int = 4, latent: int = 128, degree: int = 8, features: int = 64, classes: int = 16
) -> Case:
    """An encode-process-decode graph network over `size` nodes and `degree * size` random
    edges: each layer updates the edges from their ends, sums them into their receivers and
    updates the nodes; node classification."""
    edges = degree * size

    def init(key: Any) -> Any:
        k = iter(jax.random.split(key, 4 * layers + 6))
        mlp = lambda a, b: [_dense(next(k), (a, latent)), _dense(next(k), (latent, b))]  # noqa: E731
        return {
            "node_in": mlp(features, latent),
            "edge_in": mlp(16, latent),
            "edge": [mlp(3 * latent, latent) for _ in range(layers)],
            "node": [mlp(2 * latent, latent) for _ in range(layers)],
            "out": _dense(next(k), (latent, classes)),
        }

    def loss_fn(params: Any, batch: Any) -> Any:
        senders, receivers = batch["senders"], batch["receivers"]
        x = _mlp2(params["node_in"], batch["nodes"]).astype(F32)
        e = _mlp2(params["edge_in"], batch["edges"]).astype(F32)
        for pe, pn in zip(params["edge"], params["node"], strict=True):
            e = e + _mlp2(pe, jnp.concatenate([e, x[senders], x[receivers]], axis=-1)).astype(F32)
            incoming = jax.ops.segment_sum(e, receivers, num_segments=size)
            x = x + _mlp2(pn, jnp.concatenate([x, incoming], axis=-1)).astype(F32)
        return _xent(x.astype(BF16) @ params["out"].astype(BF16), batch["labels"])

    tx = optax.adam(1e-3)

    def make(key: Any) -> Any:
        k = jax.random.split(key, 6)
        batch = {
            "nodes": jax.random.normal(k[0], (size, features)),
            "edges": jax.random.normal(k[1], (edges, 16)),
            "senders": jax.random.randint(k[2], (edges,), 0, size),
            "receivers": jax.random.randint(k[3], (edges,), 0, size),
            "labels": jax.random.randint(k[4], (size,), 0, classes),
        }
        return _state(init(k[5]), tx), batch

    return Case(f"graph-net-{layers}x{latent}-degree{degree}", "graph network", size, _train(loss_fn, tx), make, size)


# -- 7. gradient accumulation: `lax.scan` over micro-batches, then one update ---------------------
def accumulate(
    size: int, *, micro: int = 8, layers: int = 4, d: int = 512, heads: int = 8, seq: int = 512, vocab: int = 16_000
) -> Case:
    """A small transformer's gradients summed over `size // micro` micro-batches of `micro`
    sequences by `lax.scan`, then one AdamW update."""
    init, loss_fn = _lm(layers, d, heads, vocab, "fused")
    tx = optax.adamw(3e-4, weight_decay=0.1)

    def step(state: Any, batch: Any) -> Any:
        params = state["params"]

        def body(carry: Any, mb: Any) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, mb)
            return (carry[0] + loss, jax.tree.map(jnp.add, carry[1], grads)), None

        zero = (jnp.zeros((), F32), jax.tree.map(jnp.zeros_like, params))
        (loss, grads), _ = jax.lax.scan(body, zero, batch)
        steps = size // micro
        grads = jax.tree.map(lambda g: g / steps, grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        return {"params": optax.apply_updates(params, updates), "opt_state": opt_state}, loss / steps

    def make(key: Any) -> Any:
        k1, k2 = jax.random.split(key)
        batch = jax.tree.map(lambda a: a.reshape(size // micro, micro, seq), _lm_batch(k2, size, seq, vocab))
        return _state(init(k1), tx), batch

    name = f"accumulate-{layers}x{d}-micro{micro}"
    return Case(name, "gradient accumulation", size, step, make, size * seq)


# -- 8. an LSTM with bf16 parameters, Adafactor's factored second moment -------------------------
def lstm(
    size: int, *, layers: int = 2, hidden: int = 1024, embed: int = 512, seq: int = 128, vocab: int = 8_000
) -> Case:
    """A word-level LSTM language model whose parameters are held in bf16 (no f32 master
    copy), the input's gates computed for the whole sequence at once, the recurrence under
    `lax.scan`; Adafactor."""

    def init(key: Any) -> Any:
        k = jax.random.split(key, 2 * layers + 2)
        sizes = [embed] + [hidden] * layers
        cells = [
            {
                "wx": _dense(k[2 * i], (sizes[i], 4 * hidden), dtype=BF16),
                "wh": _dense(k[2 * i + 1], (hidden, 4 * hidden), dtype=BF16),
                "b": jnp.zeros(4 * hidden, BF16),
            }
            for i in range(layers)
        ]
        return {
            "embed": _dense(k[-2], (vocab, embed), 0.02, BF16),
            "cells": cells,
            "out": _dense(k[-1], (hidden, vocab), dtype=BF16),
        }

    def layer(p: Any, xs: Any) -> Any:
        gx = jnp.einsum("tbd,dg->tbg", xs, p["wx"]) + p["b"]

        def cell(carry: Any, g: Any) -> Any:
            h, c = carry
            g = (g + h @ p["wh"]).astype(F32)
            i, f, o, u = jnp.split(g, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
            h = (jax.nn.sigmoid(o) * jnp.tanh(c)).astype(BF16)
            return (h, c), h

        b = xs.shape[1]
        _, hs = jax.lax.scan(cell, (jnp.zeros((b, hidden), BF16), jnp.zeros((b, hidden), F32)), gx)
        return hs

    def loss_fn(params: Any, batch: Any) -> Any:
        xs = params["embed"][batch["inputs"].T]  # [t, b, embed]
        for p in params["cells"]:
            xs = layer(p, xs)
        return _xent(xs @ params["out"], batch["targets"].T)

    name, kind = f"lstm-{layers}x{hidden}-bf16-adafactor", "LSTM, bf16 parameters, Adafactor"
    return _lm_case(name, kind, size, seq, vocab, init, loss_fn, optax.adafactor(1e-3))


# -- 9a. JAX's Pallas flash attention in a transformer's train step ------------------------------
def flash(size: int, *, layers: int = 4, d: int = 1024, heads: int = 8, seq: int = 2048, vocab: int = 16_000) -> Case:
    init, loss_fn = _lm(layers, d, heads, vocab, "flash")
    return _lm_case(f"flash-attention-{layers}x{d}-{seq}", "Pallas flash attention", size, seq, vocab, init, loss_fn)


# -- 9b. a hand-written blocked Pallas matmul (no cost estimate), its gradient by the same kernel -
def _matmul_kernel(x_ref: Any, w_ref: Any, o_ref: Any, acc_ref: Any) -> None:
    @pl.when(pl.program_id(2) == 0)
    def _() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=F32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _() -> None:
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _pallas_matmul(x: Any, w: Any, block: tuple[int, int, int] = (512, 512, 512)) -> Any:
    (m, k), (_, n) = x.shape, w.shape
    bm, bk, bn = block
    return pl.pallas_call(
        _matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), F32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, w)


@jax.custom_vjp
def _matmul(x: Any, w: Any) -> Any:
    return _pallas_matmul(x, w)


def _matmul_fwd(x: Any, w: Any) -> Any:
    return _pallas_matmul(x, w), (x, w)


def _matmul_bwd(res: Any, g: Any) -> Any:
    x, w = res
    return _pallas_matmul(g, w.T), _pallas_matmul(x.T, g)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def pallas_mlp(size: int, *, width: int = 4096, layers: int = 4, features: int = 1024) -> Case:
    """An MLP whose layers are a hand-written Pallas matmul (bf16 operands, f32 accumulator
    in VMEM), forward and backward; the head and the loss are XLA's."""

    def init(key: Any) -> Any:
        keys = jax.random.split(key, layers + 1)
        dims = [features] + [width] * layers
        return {
            "hidden": [_dense(k, (a, b)) for k, a, b in zip(keys, dims, dims[1:], strict=False)],
            "out": _dense(keys[-1], (width, 10)),
        }

    def loss_fn(params: Any, batch: Any) -> Any:
        x = batch["x"].astype(BF16)
        for w in params["hidden"]:
            x = jax.nn.gelu(_matmul(x, w.astype(BF16)))
        return _xent(x @ params["out"].astype(BF16), batch["y"])

    tx = optax.adamw(3e-4, weight_decay=0.1)

    def make(key: Any) -> Any:
        k1, k2, k3 = jax.random.split(key, 3)
        batch = {"x": jax.random.normal(k2, (size, features)), "y": jax.random.randint(k3, (size,), 0, 10)}
        return _state(init(k1), tx), batch

    return Case(f"pallas-matmul-mlp-{layers}x{width}", "Pallas blocked matmul", size, _train(loss_fn, tx), make, size)


# -- 10. a decode step with a KV cache: one token a sequence, the cache updated in place ----------
def decode(
    size: int, *, layers: int = 8, d: int = 1024, heads: int = 8, cache: int = 2048, vocab: int = 32_000
) -> Case:
    """One greedy token for each of `size` sequences: bf16 parameters, a `[size, cache,
    heads, dh]` key and value cache a layer written at the position by
    `lax.dynamic_update_slice` and attended up to it; the state (parameters, cache, position
    and last tokens) donated. The loss slot holds the chosen tokens' mean log-probability."""
    dh = d // heads

    def init(key: Any) -> Any:
        params = _lm(layers, d, heads, vocab, "fused")[0](key)
        return jax.tree.map(lambda a: a.astype(BF16), params)

    def step(state: Any, batch: Any) -> Any:
        params, pos = state["params"], state["pos"]
        x = params["embed"][state["tokens"]][:, None, :]  # [b, 1, d]
        caches = []
        for p, kv in zip(params["layers"], state["cache"], strict=True):
            h = _rms(x, p["n1"])
            q, k, v = ((h @ p[n]).reshape(size, heads, dh) for n in ("wq", "wk", "wv"))
            kc = jax.lax.dynamic_update_slice(kv["k"], k[:, None], (0, pos, 0, 0))
            vc = jax.lax.dynamic_update_slice(kv["v"], v[:, None], (0, pos, 0, 0))
            s = jnp.einsum("bhd,bthd->bht", q, kc, preferred_element_type=F32) * dh**-0.5
            s = jnp.where(jnp.arange(cache) <= pos, s, jnp.finfo(F32).min)
            a = jnp.einsum("bht,bthd->bhd", jax.nn.softmax(s, axis=-1).astype(BF16), vc)
            x = _ffn(p, x + (a.reshape(size, 1, d) @ p["wo"]))
            caches.append({"k": kc, "v": vc})
        logits = (_rms(x[:, 0], params["norm"]) @ params["out"]).astype(F32) / batch["temperature"]
        logp = jax.nn.log_softmax(logits, axis=-1)
        tokens = jnp.argmax(logp, axis=-1).astype(jnp.int32)
        chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)
        new = {"params": params, "cache": caches, "pos": (pos + 1) % cache, "tokens": tokens}
        return new, jnp.mean(chosen)

    def make(key: Any) -> Any:
        k1, k2, k3 = jax.random.split(key, 3)
        kv = lambda k: _dense(k, (size, cache, heads, dh), 1.0, BF16)  # noqa: E731
        caches = [{"k": kv(a), "v": kv(b)} for a, b in jax.random.split(k2, (layers, 2))]
        state = {
            "params": init(k1),
            "cache": caches,
            "pos": jnp.asarray(cache // 2, jnp.int32),
            "tokens": jax.random.randint(k3, (size,), 0, vocab),
        }
        return state, {"temperature": jnp.ones((), F32)}

    return Case(f"decode-{layers}x{d}-cache{cache}", "decode with a KV cache", size, step, make, size)


# -- 11. dilated 1-D convolutions (WaveNet) -----------------------------------------------------
def wavenet(
    size: int,
    *,
    stacks: int = 2,
    channels: int = 128,
    length: int = 8192,
) -> Case:
    """Causal convolutions of width 2 dilated 1, 2, ..., 512, `stacks` times, gated (tanh
    times sigmoid), residual and skip 1x1 convolutions; 8-bit mu-law samples predicted."""
    depth, skip, classes = 10, 2 * channels, 256
    dilations = [2**i for _ in range(stacks) for i in range(depth)]

    def init(key: Any) -> Any:
        k = jax.random.split(key, 3 * len(dilations) + 3)
        layers = [
            {
                "dil": _dense(k[3 * i], (2, channels, 2 * channels), (2 * channels) ** -0.5),
                "res": _dense(k[3 * i + 1], (channels, channels)),
                "skip": _dense(k[3 * i + 2], (channels, skip)),
            }
            for i in range(len(dilations))
        ]
        return {
            "embed": _dense(k[-3], (classes, channels), 1.0),
            "layers": layers,
            "out1": _dense(k[-2], (skip, skip)),
            "out2": _dense(k[-1], (skip, classes)),
        }

    def loss_fn(params: Any, batch: Any) -> Any:
        x = params["embed"].astype(BF16)[batch["inputs"]]  # [b, t, channels]
        skips = jnp.zeros((*x.shape[:2], skip), F32)
        for p, dilation in zip(params["layers"], dilations, strict=True):
            h = jax.lax.conv_general_dilated(
                x,
                p["dil"].astype(BF16),
                (1,),
                [(dilation, 0)],
                rhs_dilation=(dilation,),
                dimension_numbers=("NWC", "WIO", "NWC"),
            )
            gate = jnp.tanh(h[..., :channels]) * jax.nn.sigmoid(h[..., channels:])
            x = x + gate @ p["res"].astype(BF16)
            skips = skips + (gate @ p["skip"].astype(BF16)).astype(F32)
        h = jax.nn.relu(jax.nn.relu(skips).astype(BF16) @ params["out1"].astype(BF16))
        return _xent(h @ params["out2"].astype(BF16), batch["targets"])

    name = f"wavenet-{stacks}x{depth}x{channels}-{length}"
    return _lm_case(name, "dilated 1-D convolutions", size, length, classes, init, loss_fn, optax.adam(1e-3))


# -- 12. host offload: a scanned transformer whose remat policy offloads its dots ----------------
_DOTS = ("wq", "wk", "wv", "wo", "up", "down")


def offload(size: int, *, layers: int = 4, d: int = 1024, heads: int = 8, seq: int = 1024, vocab: int = 32_000) -> Case:
    """The layers under `lax.scan` and `jax.checkpoint`, the policy offloading every named
    dot to pinned host memory for the backward pass (recomputing the rest)."""
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=list(_DOTS),
        offload_src="device",
        offload_dst="pinned_host",
    )

    @ft.partial(jax.checkpoint, policy=policy)
    def block(p: Any, x: Any) -> Any:
        return _ffn(p, _attention(p, x, heads, "fused", checkpoint_name), checkpoint_name)

    def init(key: Any) -> Any:
        k1, k2 = jax.random.split(key)
        one = lambda k: _attention_params(k, d) | _ffn_params(jax.random.fold_in(k, 1), d, 4 * d)  # noqa: E731
        return _lm_params(k1, vocab, d, jax.vmap(one)(jax.random.split(k2, layers)))

    def loss_fn(params: Any, batch: Any) -> Any:
        x = params["embed"].astype(BF16)[batch["inputs"]]
        x, _ = jax.lax.scan(lambda x, p: (block(p, x), None), x, params["layers"])
        return _lm_head(params, x, batch)

    return _lm_case(f"offload-dots-{layers}x{d}", "host offload", size, seq, vocab, init, loss_fn)


# name -> (builder, sizes): group K.
AFTER_J: dict[str, tuple[Callable[[int], Case], tuple[int, ...]]] = {
    "moe": (moe, (8, 32)),
    "unet": (unet, (64, 256)),
    "long-attention": (long_attention, (1, 4)),
    "ssm": (ssm, (4, 16)),
    "recsys": (recsys, (2048, 8192)),
    "graph-net": (graph, (8192, 32768)),
    "accumulate": (accumulate, (32, 64)),
    "lstm-bf16": (lstm, (32, 128)),
    "flash-attention": (flash, (2, 6)),
    "pallas-matmul": (pallas_mlp, (2048, 8192)),
    "decode": (decode, (8, 32)),
    "wavenet": (wavenet, (4, 16)),
    "offload-dots": (offload, (4,)),
}
