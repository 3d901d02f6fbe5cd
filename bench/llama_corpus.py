"""A small Llama-architecture transformer (prefill and decode steps) for the analysis corpus.

Llama / Qwen2 block: RMSNorm -> GQA attention with RoPE (optional q/k/v bias, as in Qwen2)
-> residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm and an untied LM head.
The KV cache (per K and V) is updated in place with dynamic_update_slice (the append of a
decode step). Layers are either unrolled (a Python loop; the cache is a tuple of per-layer
[batch, max_seq, kv_heads, head_dim] arrays, each donated and updated in place) or scanned
(`lax.scan`: one while loop whose body the analysis multiplies by the trip count; the cache is
stacked [layers, ...] and threaded through the scan as xs/ys, which copies it every step).

Everything works on `jax.ShapeDtypeStruct`s, so models of any size can be compiled (never run)
for analysis. Written for analysis tests and benchmarks, not for serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Params = dict[str, Any]


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 512
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    ffn: int = 256
    dtype: Any = jnp.float32
    qkv_bias: bool = False
    scan_layers: bool = False
    rope_theta: float = 10000.0

    def param_count(self) -> int:
        d, h, kv, hd, f = self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn
        per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f + 2 * d
        if self.qkv_bias:
            per_layer += h * hd + 2 * kv * hd
        return self.layers * per_layer + 2 * self.vocab * d + d

    def kv_bytes_per_token(self) -> int:
        itemsize = jnp.dtype(self.dtype).itemsize
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


# Qwen2.5-7B: 28 layers, hidden 3584, 28 heads, 4 KV heads, head dim 128, FFN 18944,
# vocab 152064, q/k/v bias, untied embeddings (config.json of Qwen/Qwen2.5-7B).
QWEN25_7B = LlamaConfig(
    vocab=152064,
    hidden=3584,
    layers=28,
    heads=28,
    kv_heads=4,
    head_dim=128,
    ffn=18944,
    dtype=jnp.bfloat16,
    qkv_bias=True,
    scan_layers=True,
    rope_theta=1e6,
)


def _layer_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    d, h, kv, hd, f = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn
    shapes = {
        "attn_norm": (d,),
        "wq": (d, h * hd),
        "wk": (d, kv * hd),
        "wv": (d, kv * hd),
        "wo": (h * hd, d),
        "mlp_norm": (d,),
        "w_gate": (d, f),
        "w_up": (d, f),
        "w_down": (f, d),
    }
    if cfg.qkv_bias:
        shapes |= {"bq": (h * hd,), "bk": (kv * hd,), "bv": (kv * hd,)}
    return shapes


def param_specs(cfg: LlamaConfig) -> Params:
    """Parameter pytree as ShapeDtypeStructs (layers stacked when scanning)."""

    def sds(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, cfg.dtype)

    layer = _layer_shapes(cfg)
    if cfg.scan_layers:
        layers: Any = {k: sds((cfg.layers, *s)) for k, s in layer.items()}
    else:
        layers = [{k: sds(s) for k, s in layer.items()} for _ in range(cfg.layers)]
    return {
        "embed": sds((cfg.vocab, cfg.hidden)),
        "layers": layers,
        "final_norm": sds((cfg.hidden,)),
        "lm_head": sds((cfg.hidden, cfg.vocab)),
    }


def init_params(cfg: LlamaConfig, key: jax.Array) -> Params:
    """Random weights with the structure of param_specs (for small models that really run)."""
    specs = param_specs(cfg)
    leaves, tree = jax.tree.flatten(specs)
    keys = jax.random.split(key, len(leaves))
    values = [
        (0.02 * jax.random.normal(k, s.shape, jnp.float32)).astype(s.dtype)
        if len(s.shape) >= 2 and s.shape[-1] > 1
        else jnp.ones(s.shape, s.dtype)
        for k, s in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(tree, values)


def cache_specs(cfg: LlamaConfig, batch: int, max_seq: int) -> tuple[Any, Any]:
    shape = (batch, max_seq, cfg.kv_heads, cfg.head_dim)
    if cfg.scan_layers:
        spec: Any = jax.ShapeDtypeStruct((cfg.layers, *shape), cfg.dtype)
    else:
        spec = tuple(jax.ShapeDtypeStruct(shape, cfg.dtype) for _ in range(cfg.layers))
    return spec, spec


def _rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def _rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    # x: [B, S, heads, hd]; positions: [S] (or broadcastable).
    hd = x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]  # [S, hd/2]
    cos = jnp.cos(angles)[None, :, None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.astype(x.dtype)


def _block(
    cfg: LlamaConfig,
    lp: Params,
    x: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    pos: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer on x [B, S, D] writing S new keys/values at `pos` of the [B, T, KV, hd] cache."""
    b, s, _ = x.shape
    h, kv, hd = cfg.heads, cfg.kv_heads, cfg.head_dim
    group = h // kv
    y = _rms_norm(x, lp["attn_norm"])
    q, k, v = y @ lp["wq"], y @ lp["wk"], y @ lp["wv"]
    if cfg.qkv_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    positions = pos + jnp.arange(s)
    q = _rope(q.reshape(b, s, h, hd), positions, cfg.rope_theta)
    k = _rope(k.reshape(b, s, kv, hd), positions, cfg.rope_theta)
    v = v.reshape(b, s, kv, hd)
    zero = jnp.zeros((), jnp.int32)
    k_cache = lax.dynamic_update_slice(k_cache, k, (zero, pos, zero, zero))
    v_cache = lax.dynamic_update_slice(v_cache, v, (zero, pos, zero, zero))
    t = k_cache.shape[1]
    qg = q.reshape(b, s, kv, group, hd)
    scores = jnp.einsum("bskgd,btkd->bkgst", qg, k_cache).astype(jnp.float32) / jnp.sqrt(
        jnp.float32(hd)
    )
    mask = jnp.arange(t)[None, :] <= positions[:, None]  # [S, T] causal over the cache
    scores = jnp.where(mask[None, None, None], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
    attn = jnp.einsum("bkgst,btkd->bskgd", probs, v_cache).reshape(b, s, h * hd)
    x = x + attn @ lp["wo"]
    y = _rms_norm(x, lp["mlp_norm"])
    x = x + (jax.nn.silu(y @ lp["w_gate"]) * (y @ lp["w_up"])) @ lp["w_down"]
    return x, k_cache, v_cache


def forward(
    cfg: LlamaConfig,
    params: Params,
    tokens: jax.Array,
    k_cache: Any,
    v_cache: Any,
    pos: jax.Array,
) -> tuple[jax.Array, Any, Any]:
    """Runs tokens [B, S] starting at position `pos`; returns last-position logits and caches."""
    x = params["embed"][tokens]
    if cfg.scan_layers:

        def body(x: jax.Array, layer: tuple[Params, jax.Array, jax.Array]) -> Any:
            lp, kc, vc = layer
            x, kc, vc = _block(cfg, lp, x, kc, vc, pos)
            return x, (kc, vc)

        x, (k_cache, v_cache) = lax.scan(body, x, (params["layers"], k_cache, v_cache))
    else:
        ks, vs = [], []
        for i, lp in enumerate(params["layers"]):
            x, kc, vc = _block(cfg, lp, x, k_cache[i], v_cache[i], pos)
            ks.append(kc)
            vs.append(vc)
        k_cache, v_cache = tuple(ks), tuple(vs)
    x = _rms_norm(x[:, -1:, :], params["final_norm"])
    logits = (x @ params["lm_head"])[:, 0, :]
    return logits, k_cache, v_cache


def prefill_fn(cfg: LlamaConfig) -> Any:
    """jit(params, tokens [B, S], k_cache, v_cache) -> (logits, k_cache, v_cache).

    The caches are donated (updated in place)."""

    def prefill(params: Params, tokens: jax.Array, k_cache: Any, v_cache: Any) -> Any:
        return forward(cfg, params, tokens, k_cache, v_cache, jnp.zeros((), jnp.int32))

    return jax.jit(prefill, donate_argnums=(2, 3))


def decode_fn(cfg: LlamaConfig) -> Any:
    """jit(params, token [B, 1], k_cache, v_cache, pos) -> (logits, k_cache, v_cache)."""
    return jax.jit(partial(forward, cfg), donate_argnums=(2, 3))


def prefill_args(cfg: LlamaConfig, batch: int, seq: int, max_seq: int | None = None) -> tuple:
    kc, vc = cache_specs(cfg, batch, max_seq or seq)
    return (param_specs(cfg), jax.ShapeDtypeStruct((batch, seq), jnp.int32), kc, vc)


def decode_args(cfg: LlamaConfig, batch: int, max_seq: int) -> tuple:
    kc, vc = cache_specs(cfg, batch, max_seq)
    return (
        param_specs(cfg),
        jax.ShapeDtypeStruct((batch, 1), jnp.int32),
        kc,
        vc,
        jax.ShapeDtypeStruct((), jnp.int32),
    )
