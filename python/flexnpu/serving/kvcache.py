"""KV-cache layouts shared by the model code and the engine (which also serves exported
programs without the model code): contiguous [L, B, S, n_kv, D] (the plain model steps) and
paged [L, blocks * block_size, n_kv, D] (the engine), for keys and for values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flexnpu.serving.config import LlamaConfig


def cache_shape(cfg: LlamaConfig, batch: int, max_len: int) -> tuple[int, ...]:
    return (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)


def init_cache(cfg: LlamaConfig, batch: int, max_len: int, dtype=jnp.float32, device=None):
    shape = cache_shape(cfg, batch, max_len)
    return zeros_on_device(shape, dtype, device), zeros_on_device(shape, dtype, device)


def zeros_on_device(shape: tuple[int, ...], dtype, device=None) -> jax.Array:
    """Zeros made by the device (default: the first of jax.devices()), never on the host: a
    cache may be larger than host memory on an emulated backend."""
    on_device = jax.sharding.SingleDeviceSharding(device or jax.devices()[0])
    return jax.jit(_zeros, static_argnums=(0, 1), out_shardings=on_device)(shape, dtype)


def _zeros(shape: tuple[int, ...], dtype) -> jax.Array:
    return jnp.zeros(shape, dtype)


# ---- paged layout (the engine): [L, num_slots, n_kv, D], slot = block * block_size + offset ----
# One extra block past the pool is the trash block: padding rows and tokens write there.


def paged_cache_shape(cfg: LlamaConfig, num_blocks: int, block_size: int) -> tuple[int, ...]:
    return (cfg.num_layers, (num_blocks + 1) * block_size, cfg.num_kv_heads, cfg.head_dim)


def init_paged_cache(cfg: LlamaConfig, num_blocks: int, block_size: int, dtype=jnp.float32,
                     device=None):
    shape = paged_cache_shape(cfg, num_blocks, block_size)
    return zeros_on_device(shape, dtype, device), zeros_on_device(shape, dtype, device)


def bytes_per_block(cfg: LlamaConfig, block_size: int, dtype=jnp.float32) -> int:
    """Keys and values of one block over all layers."""
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * \
        np.dtype(dtype).itemsize


def slots_of(blocks: list[int], start: int, n: int, block_size: int) -> np.ndarray:
    """Slots of positions [start, start + n) of a sequence with block table `blocks`."""
    pos = np.arange(start, start + n)
    return np.asarray(blocks, np.int32)[pos // block_size] * block_size + pos % block_size
