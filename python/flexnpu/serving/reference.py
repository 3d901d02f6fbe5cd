"""An independent NumPy forward pass of a llama GGUF model, written from the Hugging Face
formulation: Q/K rows are first restored to the HF layout (`unpermute_qk`) and RoPE rotates
halves (`rotate_half`), so agreement with the JAX model (interleaved pairs on GGUF rows) checks
the layout handling too. No KV cache: every call recomputes the whole sequence."""

from __future__ import annotations

import numpy as np

from flexnpu.serving.config import LlamaConfig
from flexnpu.serving.gguf_loader import unpermute_qk


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def forward(weights: dict[str, np.ndarray], cfg: LlamaConfig, tokens: list[int]) -> np.ndarray:
    """Logits [T, V] (float64 math) for every position of `tokens`."""
    t = len(tokens)
    d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads

    def w(name: str) -> np.ndarray:
        return weights[name].astype(np.float64)

    x = weights["token_embd.weight"][np.asarray(tokens)].astype(np.float64)
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        h = _rms(x, w(p + "attn_norm.weight"), cfg.rms_eps)
        q = h @ unpermute_qk(w(p + "attn_q.weight"), nh).T
        k = h @ unpermute_qk(w(p + "attn_k.weight"), nkv).T
        v = h @ w(p + "attn_v.weight").T
        if cfg.attention_bias:  # Qwen2: biases in the GGUF row order too
            q = q + unpermute_qk(w(p + "attn_q.bias"), nh)
            k = k + unpermute_qk(w(p + "attn_k.bias"), nkv)
            v = v + w(p + "attn_v.bias")
        q, k, v = q.reshape(t, nh, d), k.reshape(t, nkv, d), v.reshape(t, nkv, d)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = nh // nkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        # Batched matmuls (BLAS) rather than einsum: einsum without a contraction plan loops.
        s = (q.transpose(1, 0, 2) @ k.transpose(1, 2, 0)) / np.sqrt(d)  # [h, t, s]
        s = np.where(causal[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(t, nh * d)
        x = x + o @ w(p + "attn_output.weight").T
        h = _rms(x, w(p + "ffn_norm.weight"), cfg.rms_eps)
        gate = h @ w(p + "ffn_gate.weight").T
        up = h @ w(p + "ffn_up.weight").T
        x = x + ((gate / (1 + np.exp(-gate))) * up) @ w(p + "ffn_down.weight").T
    x = _rms(x, w("output_norm.weight"), cfg.rms_eps)
    head = w("output.weight" if "output.weight" in weights else "token_embd.weight")
    return x @ head.T
