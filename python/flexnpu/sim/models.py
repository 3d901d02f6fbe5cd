"""Model shapes the simulator knows, and the JAX step functions whose lowered HLO is analysed.

One transformer layer of each kind is lowered (never executed: parameters are
`jax.ShapeDtypeStruct`s) for a prefill of T tokens and for a decode of B sequences with a context
of C positions; `flexnpu.analysis` counts its FLOPs and bytes, and the whole step is layers x that
plus the embedding and the LM head. Dense models are grouped-query attention + SwiGLU (the
serving model's architecture: Qwen2.5-7B, Llama-3-8B, SmolLM2-135M); DeepSeek-R1 is MLA
(naive in prefill, weight-absorbed in decode, as served in practice) + MoE (256 routed experts,
top-8, one shared expert; the first 3 layers dense).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flexnpu.serving.config import LLAMA3_8B, QWEN25_7B, SMOLLM2_135M


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    d_model: int
    vocab: int
    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 128
    ffn: int = 0  # dense FFN width
    qkv_bias: bool = False
    # MLA + MoE (DeepSeek-V3 architecture); zero for dense models.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0
    num_dense_layers: int = 0  # leading dense layers of an MoE model
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    expert_ffn: int = 0
    total_params: float = 0.0  # for weight memory
    default_parallel: int = 1  # devices per serving instance (TP x EP group)
    weight_bytes_per_param: float = 2.0  # bf16
    kv_bytes_per_elem: int = 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token over all layers."""
        if self.kv_lora_rank:
            per_layer = self.kv_lora_rank + self.rope_dim
        else:
            per_layer = 2 * self.num_kv_heads * self.head_dim
        return per_layer * self.num_layers * self.kv_bytes_per_elem

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param

    def experts_touched(self, tokens: float) -> float:
        """Expected distinct routed experts a step of `tokens` tokens reads per MoE layer
        (uniform routing: each token picks experts_per_token of num_experts)."""
        if not self.is_moe or tokens <= 0:
            return 0.0
        p_miss = (1.0 - self.experts_per_token / self.num_experts) ** tokens
        return self.num_experts * (1.0 - p_miss)


def _dense(cfg, name: str, parallel: int = 1) -> ModelShape:
    params = cfg.num_params()
    return ModelShape(
        name=name,
        num_layers=cfg.num_layers,
        d_model=cfg.hidden_size,
        vocab=cfg.vocab_size,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        ffn=cfg.intermediate_size,
        qkv_bias=cfg.attention_bias,
        total_params=float(params),
        default_parallel=parallel,
    )


DEEPSEEK_R1 = ModelShape(
    name="deepseek-r1",
    num_layers=61,
    d_model=7168,
    vocab=129280,
    num_heads=128,
    head_dim=128,
    ffn=18432,
    q_lora_rank=1536,
    kv_lora_rank=512,
    rope_dim=64,
    v_head_dim=128,
    num_dense_layers=3,
    num_experts=256,
    experts_per_token=8,
    num_shared_experts=1,
    expert_ffn=2048,
    total_params=671e9,
    default_parallel=16,
    # CloudMatrix-Infer serves DeepSeek-R1 in INT8 (W8A8); weights 1 byte per parameter.
    weight_bytes_per_param=1.0,
)

MODELS: dict[str, ModelShape] = {
    "qwen2.5-7b": _dense(QWEN25_7B, "qwen2.5-7b"),
    "deepseek-r1": DEEPSEEK_R1,
    "llama-3-8b": _dense(LLAMA3_8B, "llama-3-8b"),
    "smollm2-135m": _dense(SMOLLM2_135M, "smollm2-135m"),
}


def get_model(name: str) -> ModelShape:
    key = name.lower().replace("_", "-")
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    return MODELS[key]


# ---- the lowered step functions -------------------------------------------------------------


def sds(shape, dtype=None):
    """An abstract array (jax.ShapeDtypeStruct, bf16 unless `dtype`) to trace a layer with."""
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(tuple(int(s) for s in shape), dtype or jnp.bfloat16)


def _rms(x, w):
    import jax
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * w).astype(x.dtype)


def _swiglu(x, wg, wu, wd):
    import jax

    return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def _attend(q, k, v, causal: bool):
    """q [T, H, D], k/v [S, H, Dk/Dv] (already expanded to H heads) -> [T, H, Dv]."""
    import jax
    import jax.numpy as jnp

    s = jnp.einsum("thd,shd->hts", q, k, preferred_element_type=jnp.float32) / math.sqrt(
        q.shape[-1]
    )
    if causal:
        t, n = q.shape[0], k.shape[0]
        mask = jnp.arange(n)[None, :] <= jnp.arange(t)[:, None] + (n - t)
        s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    return jnp.einsum("hts,shd->thd", p, v)


def dense_layer_fns(m: ModelShape):
    """(prefill(params, x[T,d]), decode(params, x[B,d], k[B,C,kv,D], v[B,C,kv,D]), params)."""
    import jax.numpy as jnp

    h, nh, nkv, d = m.d_model, m.num_heads, m.num_kv_heads, m.head_dim
    g = nh // nkv
    params = {
        "n1": sds((h,), jnp.float32),
        "n2": sds((h,), jnp.float32),
        "wq": sds((h, nh * d)),
        "wk": sds((h, nkv * d)),
        "wv": sds((h, nkv * d)),
        "wo": sds((nh * d, h)),
        "wg": sds((h, m.ffn)),
        "wu": sds((h, m.ffn)),
        "wd": sds((m.ffn, h)),
    }

    def qkv(p, x):
        y = _rms(x, p["n1"])
        return y @ p["wq"], y @ p["wk"], y @ p["wv"]

    def prefill(p, x):
        t = x.shape[0]
        q, k, v = qkv(p, x)
        q = q.reshape(t, nh, d)
        k = jnp.repeat(k.reshape(t, nkv, d), g, axis=1)
        v = jnp.repeat(v.reshape(t, nkv, d), g, axis=1)
        o = _attend(q, k, v, causal=True).reshape(t, nh * d)
        x = x + o @ p["wo"]
        return x + _swiglu(_rms(x, p["n2"]), p["wg"], p["wu"], p["wd"]), k, v

    def decode(p, x, kc, vc):
        b = x.shape[0]
        q, k, v = qkv(p, x)
        qg = q.reshape(b, nkv, g, d)
        s = jnp.einsum("bkgd,bckd->bkgc", qg, kc, preferred_element_type=jnp.float32)
        pr = (s / math.sqrt(d)).astype(kc.dtype)
        o = jnp.einsum("bkgc,bckd->bkgd", pr, vc).reshape(b, nh * d)
        x = x + o @ p["wo"]
        return x + _swiglu(_rms(x, p["n2"]), p["wg"], p["wu"], p["wd"]), k, v

    return prefill, decode, params


def mla_moe_layer_fns(m: ModelShape, moe: bool, experts: int, tokens_per_expert: int):
    """DeepSeek-V3 layer: MLA attention + (MoE with `experts` touched experts holding
    `tokens_per_expert` dispatched tokens each | dense FFN)."""
    import jax
    import jax.numpy as jnp

    h, nh, dn, dr, dv = m.d_model, m.num_heads, m.head_dim, m.rope_dim, m.v_head_dim
    r = m.kv_lora_rank
    params = {
        "n1": sds((h,), jnp.float32),
        "n2": sds((h,), jnp.float32),
        "wq_a": sds((h, m.q_lora_rank)),
        "wq_b": sds((m.q_lora_rank, nh * (dn + dr))),
        "wkv_a": sds((h, r + dr)),
        "w_uk": sds((nh, r, dn)),
        "w_uv": sds((nh, r, dv)),
        "wo": sds((nh * dv, h)),
    }
    if moe:
        f = m.expert_ffn
        params |= {
            "router": sds((h, m.num_experts)),
            "e_g": sds((experts, h, f)),
            "e_u": sds((experts, h, f)),
            "e_d": sds((experts, f, h)),
            "s_g": sds((h, f * m.num_shared_experts)),
            "s_u": sds((h, f * m.num_shared_experts)),
            "s_d": sds((f * m.num_shared_experts, h)),
        }
    else:
        params |= {"wg": sds((h, m.ffn)), "wu": sds((h, m.ffn)), "wd": sds((m.ffn, h))}

    def ffn(p, x):
        y = _rms(x, p["n2"])
        if not moe:
            return x + _swiglu(y, p["wg"], p["wu"], p["wd"])
        n = y.shape[0]
        logits = y @ p["router"]
        _, idx = jax.lax.top_k(logits.astype(jnp.float32), m.experts_per_token)
        # Dispatch: a fixed slot per (expert, position); the gather stands for the all-to-all.
        slots = (jnp.arange(experts * tokens_per_expert) % n).reshape(experts, tokens_per_expert)
        xe = y[slots + 0 * idx[0, 0]]
        he = jnp.einsum(
            "ecf,efh->ech",
            jax.nn.silu(jnp.einsum("ech,ehf->ecf", xe, p["e_g"]))
            * jnp.einsum("ech,ehf->ecf", xe, p["e_u"]),
            p["e_d"],
        )
        routed = jnp.zeros_like(y).at[slots.reshape(-1)].add(he.reshape(-1, h))
        return x + routed + _swiglu(y, p["s_g"], p["s_u"], p["s_d"])

    def q_proj(p, y, n):
        q = (_rms(y @ p["wq_a"], 1.0) @ p["wq_b"]).reshape(n, nh, dn + dr)
        return q[..., :dn], q[..., dn:]

    def prefill(p, x):
        t = x.shape[0]
        y = _rms(x, p["n1"])
        qn, qr = q_proj(p, y, t)
        kv = y @ p["wkv_a"]
        c, kr = kv[:, :r], kv[:, r:]
        kn = jnp.einsum("tr,hrd->thd", c, p["w_uk"])
        v = jnp.einsum("tr,hrd->thd", c, p["w_uv"])
        k = jnp.concatenate([kn, jnp.broadcast_to(kr[:, None], (t, nh, dr))], -1)
        q = jnp.concatenate([qn, qr], -1)
        o = _attend(q, k, v, causal=True).reshape(t, nh * dv)
        return ffn(p, x + o @ p["wo"]), kv

    def decode(p, x, cache):
        """cache [B, C, r + dr]: the compressed latent + rope key (weight absorption)."""
        b = x.shape[0]
        y = _rms(x, p["n1"])
        qn, qr = q_proj(p, y, b)
        ql = jnp.einsum("bhd,hrd->bhr", qn, p["w_uk"])
        s = jnp.einsum("bhr,bcr->bhc", ql, cache[..., :r], preferred_element_type=jnp.float32)
        s = s + jnp.einsum("bhd,bcd->bhc", qr, cache[..., r:], preferred_element_type=jnp.float32)
        pr = jax.nn.softmax(s / math.sqrt(dn + dr), -1).astype(cache.dtype)
        ol = jnp.einsum("bhc,bcr->bhr", pr, cache[..., :r])
        o = jnp.einsum("bhr,hrd->bhd", ol, p["w_uv"]).reshape(b, nh * dv)
        return ffn(p, x + o @ p["wo"]), y @ p["wkv_a"]

    return prefill, decode, params


def head_fn(m: ModelShape):
    """Embedding gather for N tokens + final norm + LM head for S sampled positions."""
    import jax.numpy as jnp

    params = {
        "embed": sds((m.vocab, m.d_model)),
        "norm": sds((m.d_model,), jnp.float32),
        "head": sds((m.d_model, m.vocab)),
    }

    def fn(p, tokens, last):
        x = p["embed"][tokens]
        return jnp.dot(_rms(x[last], p["norm"]), p["head"], preferred_element_type=jnp.float32)

    return fn, params
