"""A Llama-architecture transformer in JAX: RMSNorm, interleaved-pair RoPE (the GGUF Q/K
layout), grouped-query attention, SwiGLU MLP, tied or untied LM head.

Layers are stacked and run with `lax.scan`, so compile time does not grow with depth. Two
steps: `prefill` (one prompt padded to a length bucket → last-token logits and its KV) and
`decode` (one token for each of B batch slots against a KV cache [L, B, S, n_kv, D] that is
donated and updated in place); `insert` copies a prefilled KV into a batch slot.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flexnpu.serving.config import LlamaConfig, rope_inv_freq
from flexnpu.serving.kvcache import cache_shape, init_cache  # noqa: F401 - re-exported

Params = dict[str, Any]

LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
BIAS_KEYS = ("bq", "bk", "bv")  # with attention_bias
_GGUF_NAMES = {
    "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight",
    "wv": "attn_v.weight", "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
    "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight", "w_down": "ffn_down.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias",
}


def layer_keys(cfg: LlamaConfig) -> tuple[str, ...]:
    return LAYER_KEYS + (BIAS_KEYS if cfg.attention_bias else ())


def params_from_gguf(weights: dict[str, np.ndarray], cfg: LlamaConfig, dtype=jnp.float32,
                     device=None) -> Params:
    """GGUF tensors (out, in) → stacked JAX params (in, out), cast to `dtype` (norms stay f32)."""

    def mat(name: str) -> np.ndarray:
        return weights[name].T

    layers = {}
    for key in layer_keys(cfg):
        stack = [weights[f"blk.{i}.{_GGUF_NAMES[key]}"] for i in range(cfg.num_layers)]
        arr = np.stack([s if s.ndim == 1 else s.T for s in stack])
        layers[key] = arr
    params: Params = {
        "embed": weights["token_embd.weight"],
        "layers": layers,
        "norm": weights["output_norm.weight"],
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = mat("output.weight")
    return cast_params(params, dtype, device)


def cast_params(params: Params, dtype, device=None) -> Params:
    def cast(path, x):
        name = jax.tree_util.keystr(path)
        dt = jnp.float32 if "norm" in name else dtype
        return jax.device_put(np.asarray(x, dtype=dt), device)

    return jax.tree_util.tree_map_with_path(cast, params)


def param_shapes(cfg: LlamaConfig, dtype=jnp.float32) -> Params:
    """The parameter tree of `cfg` as jax.ShapeDtypeStruct (norms f32, the rest `dtype`)."""
    h, f, d, n = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.num_layers
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    layer = {"attn_norm": (h,), "wq": (h, q), "wk": (h, kv), "wv": (h, kv), "wo": (q, h),
             "ffn_norm": (h,), "w_gate": (h, f), "w_up": (h, f), "w_down": (f, h),
             "bq": (q,), "bk": (kv,), "bv": (kv,)}

    def spec(name: str, *shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32 if "norm" in name else dtype)

    params: Params = {
        "embed": spec("embed", cfg.vocab_size, h),
        "layers": {k: spec(k, n, *layer[k]) for k in layer_keys(cfg)},
        "norm": spec("norm", h),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = spec("lm_head", h, cfg.vocab_size)
    return params


def random_params(cfg: LlamaConfig, seed: int = 0, dtype=jnp.float32, device=None) -> Params:
    """Random weights (normal, std 0.02; norms 1) of any Llama config, made by one jitted program
    on `device` (default: the first of jax.devices()) from the seed alone: nothing of their size
    is made on the host, so a model larger than host memory loads onto devices that hold it (an
    emulated backend's). A seed gives the same weights in every dtype (up to rounding)."""
    device = device or jax.devices()[0]
    shapes = param_shapes(cfg, dtype)
    leaves, tree = jax.tree_util.tree_flatten_with_path(shapes)

    def init(seed_words: jax.Array) -> Params:
        # "rbg": XLA's RngBitGenerator makes the bits, which compiles several times faster than
        # threefry unrolled per parameter; the weights are the same for a seed on one backend.
        key = jax.random.fold_in(jax.random.key(seed_words[0], impl="rbg"), seed_words[1])
        out = []
        for k, (path, s) in zip(jax.random.split(key, len(leaves)), leaves, strict=True):
            if "norm" in jax.tree_util.keystr(path):
                out.append(jnp.ones(s.shape, s.dtype))
            else:
                out.append((jax.random.normal(k, s.shape, jnp.float32) * 0.02).astype(s.dtype))
        return jax.tree_util.tree_unflatten(tree, out)

    words = np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], np.uint32)
    on_device = jax.sharding.SingleDeviceSharding(device)
    return jax.jit(init, out_shardings=on_device)(jax.device_put(words, device))


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * w).astype(x.dtype)


def rope(x: jax.Array, pos: jax.Array, cfg: LlamaConfig) -> jax.Array:
    """Rotates interleaved pairs (2i, 2i+1) of the last axis; x [..., n, D], pos [...]."""
    d = x.shape[-1]
    inv = jnp.asarray(rope_inv_freq(cfg))  # [D/2], RoPE scaling applied
    ang = pos.astype(jnp.float32)[..., None, None] * inv  # [..., 1, D/2]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    xf = x.astype(jnp.float32).reshape(*x.shape[:-1], d // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def _qkv(h: jax.Array, lp: Params, pos: jax.Array, cfg: LlamaConfig):
    """h [N, hidden] -> q [N, n_heads, D], k, v [N, n_kv, D]; RoPE on q and k (after the bias,
    as Qwen2 does)."""
    n, d = h.shape[0], cfg.head_dim
    q, k, v = h @ lp["wq"], h @ lp["wk"], h @ lp["wv"]
    if cfg.attention_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    return (rope(q.reshape(n, cfg.num_heads, d), pos, cfg),
            rope(k.reshape(n, cfg.num_kv_heads, d), pos, cfg),
            v.reshape(n, cfg.num_kv_heads, d))


def _mlp(h: jax.Array, lp: Params) -> jax.Array:
    return (jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"]


def _logits(params: Params, x: jax.Array, cfg: LlamaConfig) -> jax.Array:
    x = rms_norm(x, params["norm"], cfg.rms_eps)
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.dot(x, head, preferred_element_type=jnp.float32)


def prefill(params: Params, tokens: jax.Array, length: jax.Array, *, cfg: LlamaConfig):
    """tokens [T] int32 (padded), length: real prompt length (≥ 1).
    Returns (logits [V] f32 of token length-1, k [L, T, n_kv, D], v [L, T, n_kv, D])."""
    t = tokens.shape[0]
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = nh // nkv
    pos = jnp.arange(t, dtype=jnp.int32)
    x = params["embed"][tokens]
    causal = pos[None, :] <= pos[:, None]  # [t, s]

    def layer(x, lp):
        h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
        q, k, v = _qkv(h, lp, pos, cfg)
        qg = q.reshape(t, nkv, g, d)
        s = jnp.einsum("tkgd,skd->kgts", qg, k, preferred_element_type=jnp.float32)
        s = jnp.where(causal, s / np.sqrt(d), -jnp.inf)
        p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
        o = jnp.einsum("kgts,skd->tkgd", p, v).reshape(t, nh * d)
        x = x + o @ lp["wo"]
        x = x + _mlp(rms_norm(x, lp["ffn_norm"], cfg.rms_eps), lp)
        return x, (k, v)

    x, (ks, vs) = jax.lax.scan(layer, x, params["layers"])
    last = jax.lax.dynamic_index_in_dim(x, length - 1, axis=0, keepdims=False)
    return _logits(params, last, cfg), ks, vs


def decode(params: Params, cache_k: jax.Array, cache_v: jax.Array, tokens: jax.Array,
           pos: jax.Array, *, cfg: LlamaConfig):
    """One token per batch slot. cache_* [L, B, S, n_kv, D]; tokens, pos [B] int32 (pos = index
    the token is written at). Returns (logits [B, V] f32, cache_k, cache_v)."""
    b = tokens.shape[0]
    s_max = cache_k.shape[2]
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = nh // nkv
    x = params["embed"][tokens]
    rows = jnp.arange(b)
    mask = jnp.arange(s_max)[None, :] <= pos[:, None]  # [B, S]

    def layer(carry, lp):
        x, ck, cv, i = carry
        h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
        q, k, v = _qkv(h, lp, pos, cfg)
        ck = ck.at[i, rows, pos].set(k.astype(ck.dtype))
        cv = cv.at[i, rows, pos].set(v.astype(cv.dtype))
        kl, vl = ck[i], cv[i]  # [B, S, n_kv, D]
        qg = q.reshape(b, nkv, g, d)
        s = jnp.einsum("bkgd,bskd->bkgs", qg, kl, preferred_element_type=jnp.float32)
        s = jnp.where(mask[:, None, None, :], s / np.sqrt(d), -jnp.inf)
        p = jax.nn.softmax(s, axis=-1).astype(vl.dtype)
        o = jnp.einsum("bkgs,bskd->bkgd", p, vl).reshape(b, nh * d)
        x = x + o @ lp["wo"]
        x = x + _mlp(rms_norm(x, lp["ffn_norm"], cfg.rms_eps), lp)
        return (x, ck, cv, i + 1), None

    (x, cache_k, cache_v, _), _ = jax.lax.scan(
        layer, (x, cache_k, cache_v, jnp.int32(0)), params["layers"]
    )
    return _logits(params, x, cfg), cache_k, cache_v


def insert(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
           slot: jax.Array):
    """Copies a prefilled KV (k, v [L, T, n_kv, D]) into batch slot `slot` at positions [0, T)."""
    start = (0, slot, 0, 0, 0)
    cache_k = jax.lax.dynamic_update_slice(cache_k, k[:, None].astype(cache_k.dtype), start)
    cache_v = jax.lax.dynamic_update_slice(cache_v, v[:, None].astype(cache_v.dtype), start)
    return cache_k, cache_v


def jitted_steps(cfg: LlamaConfig):
    """(prefill, decode, insert) jitted; decode and insert donate the cache."""
    return (
        jax.jit(partial(prefill, cfg=cfg)),
        jax.jit(partial(decode, cfg=cfg), donate_argnums=(1, 2)),
        jax.jit(insert, donate_argnums=(0, 1)),
    )


# ---- paged KV: the serving engine's steps ---------------------------------------------------
# The cache is [L, num_slots, n_kv, D] (kvcache.paged_cache_shape): slot = block * block_size +
# offset, blocks given per sequence by a block table. One step computes B decode rows (one token
# each, any sequence) and, when C > 0, one prefill chunk of C tokens of one sequence, writes their
# KV into the slots given, attends each row to its sequence's blocks and samples on the device.


def _gather_index(tables: jax.Array, block_size: int) -> jax.Array:
    """Block tables [..., MB] -> slot index of every position [..., MB * block_size]."""
    idx = tables[..., None] * block_size + jnp.arange(block_size, dtype=tables.dtype)
    return idx.reshape(*tables.shape[:-1], tables.shape[-1] * block_size)


def paged_step(params: Params, cache_k: jax.Array, cache_v: jax.Array, inp: dict[str, jax.Array],
               *, cfg: LlamaConfig, block_size: int, vocab_limit: int | None = None):
    """One engine step over the paged cache (donated). `inp` (B decode rows, C chunk tokens,
    MB blocks per table, R = B + 1 sampling rows, the last one the chunk's):
      tokens [B + C] i32      host-known input tokens (decode rows first, then the chunk)
      prev_row [B] i32        >= 0: take decode row b's token from prev_ids[prev_row[b]] (the
                              previous step's output, still on the device); -1: from tokens
      prev_ids [R] i32        the previous step's sampled ids
      positions [B + C] i32   position of every token; slots [B + C] i32 where its KV goes
      dec_tables [B, MB] i32  block table of every decode row; chunk_table [MB] i32
      chunk_last () i32       index in the chunk of its last real token (its logits are sampled)
      temperature, top_p, min_p [R] f32; top_k [R] i32; seeds [R, 2] u32; sample_pos [R] i32
      suppress_ids [R, K] i32 ids row r may not sample (padding: >= vocab_size)
      want_logprobs () bool
    `vocab_limit`: only ids below it are sampled (the tokenizer's vocabulary, when smaller).
    Returns (ids [R], logprob [R], top_ids [R, 20], top_logprobs [R, 20], cache_k, cache_v)."""
    from flexnpu.serving.sampling import mask_logits, sample_rows

    b = inp["prev_row"].shape[0]
    c = inp["tokens"].shape[0] - b
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = nh // nkv
    prev = inp["prev_ids"][jnp.clip(inp["prev_row"], 0, inp["prev_ids"].shape[0] - 1)]
    dec_tokens = jnp.where(inp["prev_row"] >= 0, prev, inp["tokens"][:b])
    tokens = jnp.concatenate([dec_tokens, inp["tokens"][b:]])
    pos, slots = inp["positions"], inp["slots"]
    x = params["embed"][tokens]
    dec_idx = _gather_index(inp["dec_tables"], block_size)  # [B, S]
    s_max = dec_idx.shape[-1]
    dec_mask = jnp.arange(s_max)[None, :] <= pos[:b, None]  # [B, S]
    if c:
        chunk_idx = _gather_index(inp["chunk_table"], block_size)  # [S]
        chunk_mask = jnp.arange(s_max)[None, :] <= pos[b:, None]  # [C, S]

    def layer(carry, lp):
        x, ck, cv, i = carry
        h = rms_norm(x, lp["attn_norm"], cfg.rms_eps)
        q, k, v = _qkv(h, lp, pos, cfg)
        ck = ck.at[i, slots].set(k.astype(ck.dtype))
        cv = cv.at[i, slots].set(v.astype(cv.dtype))
        kd, vd = ck[i, dec_idx], cv[i, dec_idx]  # [B, S, n_kv, D]
        qd = q[:b].reshape(b, nkv, g, d)
        s = jnp.einsum("bkgd,bskd->bkgs", qd, kd, preferred_element_type=jnp.float32)
        s = jnp.where(dec_mask[:, None, None, :], s / np.sqrt(d), -jnp.inf)
        p = jax.nn.softmax(s, axis=-1).astype(vd.dtype)
        o = jnp.einsum("bkgs,bskd->bkgd", p, vd).reshape(b, nh * d)
        if c:
            kc, vc = ck[i, chunk_idx], cv[i, chunk_idx]  # [S, n_kv, D]
            qc = q[b:].reshape(c, nkv, g, d)
            s = jnp.einsum("tkgd,skd->kgts", qc, kc, preferred_element_type=jnp.float32)
            s = jnp.where(chunk_mask, s / np.sqrt(d), -jnp.inf)
            p = jax.nn.softmax(s, axis=-1).astype(vc.dtype)
            oc = jnp.einsum("kgts,skd->tkgd", p, vc).reshape(c, nh * d)
            o = jnp.concatenate([o, oc])
        x = x + o @ lp["wo"]
        x = x + _mlp(rms_norm(x, lp["ffn_norm"], cfg.rms_eps), lp)
        return (x, ck, cv, i + 1), None

    (x, cache_k, cache_v, _), _ = jax.lax.scan(
        layer, (x, cache_k, cache_v, jnp.int32(0)), params["layers"])
    if c:
        rows = jnp.concatenate([x[:b], jax.lax.dynamic_index_in_dim(x, b + inp["chunk_last"], 0)])
        sel = slice(None)
    else:  # no chunk row: sample the B decode rows, pad the outputs
        rows, sel = x[:b], slice(0, b)
    logits = mask_logits(_logits(params, rows, cfg), inp["suppress_ids"][sel], vocab_limit)
    out = sample_rows(logits, inp["temperature"][sel], inp["top_k"][sel], inp["top_p"][sel],
                      inp["min_p"][sel], inp["seeds"][sel], inp["sample_pos"][sel],
                      inp["want_logprobs"])
    if not c:
        out = tuple(jnp.concatenate([o, jnp.zeros_like(o[:1])]) for o in out)
    return (*out, cache_k, cache_v)


def packed_paged_step(params: Params, cache_k: jax.Array, cache_v: jax.Array,
                      packed: dict[str, jax.Array], *, cfg: LlamaConfig, block_size: int,
                      vocab_limit: int | None = None):
    """paged_step on packed inputs ({"ints", "floats", "chunk_table", "prev_ids"})."""
    from flexnpu.serving.step_io import unpack_step_inputs

    return paged_step(params, cache_k, cache_v, unpack_step_inputs(packed), cfg=cfg,
                      block_size=block_size, vocab_limit=vocab_limit)


def extract_kv(cache_k: jax.Array, cache_v: jax.Array, slots: jax.Array):
    """The KV at `slots` [S'] -> (k, v [L, S', n_kv, D]): a sequence's blocks for a handoff."""
    return cache_k[:, slots], cache_v[:, slots]


def insert_kv(cache_k: jax.Array, cache_v: jax.Array, k: jax.Array, v: jax.Array,
              slots: jax.Array):
    """Writes handed-off KV (k, v [L, S', n_kv, D]) at `slots` [S'] (the cache is donated)."""
    return (cache_k.at[:, slots].set(k.astype(cache_k.dtype)),
            cache_v.at[:, slots].set(v.astype(cache_v.dtype)))


def jitted_paged_steps(cfg: LlamaConfig, block_size: int, vocab_limit: int | None = None):
    """(step on packed inputs, extract_kv, insert_kv) jitted; step and insert_kv donate the
    cache."""
    return (
        jax.jit(partial(packed_paged_step, cfg=cfg, block_size=block_size,
                        vocab_limit=vocab_limit), donate_argnums=(1, 2)),
        jax.jit(extract_kv),
        jax.jit(insert_kv, donate_argnums=(0, 1)),
    )
