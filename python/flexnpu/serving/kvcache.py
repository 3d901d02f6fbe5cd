"""KV-cache layout shared by the model code and the engine (which also serves exported
programs without the model code): [L, B, S, n_kv, D] for keys and for values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flexnpu.serving.config import LlamaConfig


def cache_shape(cfg: LlamaConfig, batch: int, max_len: int) -> tuple[int, ...]:
    return (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)


def init_cache(cfg: LlamaConfig, batch: int, max_len: int, dtype=jnp.float32, device=None):
    shape = cache_shape(cfg, batch, max_len)
    return (jax.device_put(np.zeros(shape, dtype=dtype), device),
            jax.device_put(np.zeros(shape, dtype=dtype), device))
