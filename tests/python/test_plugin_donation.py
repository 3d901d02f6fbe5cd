"""Buffer donation (what LLM KV caches rely on) and per-virtual-device memory accounting."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax


@partial(jax.jit, donate_argnums=(0,))
def _append(cache: jax.Array, row: jax.Array, pos: jax.Array) -> jax.Array:
    return lax.dynamic_update_slice(cache, row, (pos, 0))


def test_donated_input_is_consumed_not_copied(npu_devices: list) -> None:
    device = npu_devices[1]
    cache = jax.device_put(jnp.zeros((1024, 256), jnp.float32), device)
    before = cache.unsafe_buffer_pointer()
    row = jax.device_put(jnp.ones((1, 256), jnp.float32), device)
    out = _append(cache, row, jnp.int32(3))
    assert cache.is_deleted(), "the donated cache must be consumed"
    assert out.unsafe_buffer_pointer() == before, "the update must happen in place"
    host = np.asarray(out)
    assert host[3].sum() == 256 and host.sum() == 256
    with pytest.raises(RuntimeError, match="deleted|donated"):
        np.asarray(cache)


def test_donation_over_many_steps_keeps_memory_flat(npu_devices: list) -> None:
    device = npu_devices[2]
    cache = jax.device_put(jnp.zeros((512, 128), jnp.float32), device)
    row = jax.device_put(jnp.ones((1, 128), jnp.float32), device)
    out = _append(cache, row, jnp.int32(0))  # compile outside the measurement
    start = device.memory_stats()["bytes_in_use"]
    pointer = out.unsafe_buffer_pointer()
    for step in range(1, 50):
        out = _append(out, row, jnp.int32(step))
    assert out.unsafe_buffer_pointer() == pointer
    assert device.memory_stats()["bytes_in_use"] == start
    assert np.asarray(out)[:50].sum() == 50 * 128


def test_memory_stats_count_bytes_held_per_virtual_device(npu_devices: list) -> None:
    device = npu_devices[3]
    other = npu_devices[0]
    base = device.memory_stats()["bytes_in_use"]
    base_other = other.memory_stats()["bytes_in_use"]
    x = jax.device_put(np.zeros((1000,), np.float32), device)
    x.block_until_ready()
    stats = device.memory_stats()
    assert stats["bytes_in_use"] == base + 4000
    assert stats["peak_bytes_in_use"] >= base + 4000
    assert stats["largest_alloc_size"] >= 4000
    assert other.memory_stats()["bytes_in_use"] == base_other
    y = jax.device_put(x, other)
    y.block_until_ready()
    assert other.memory_stats()["bytes_in_use"] == base_other + 4000
    x.delete()
    assert device.memory_stats()["bytes_in_use"] == base
    del y
    assert other.memory_stats()["bytes_in_use"] == base_other


def test_memory_stats_agree_with_flexnpu_stats(npu_devices: list) -> None:
    import flexnpu.stats

    x = jax.device_put(np.ones((333,), np.float32), npu_devices[1])
    x.block_until_ready()
    (client,) = flexnpu.stats.clients()
    for device in npu_devices:
        assert (
            client["virtual_devices"][device.id]["bytes_in_use"]
            == (device.memory_stats()["bytes_in_use"])
        )
    del x


def test_deletion_is_reported_as_jaxlib_cpu_reports_it(npu_devices: list) -> None:
    """is_deleted after donation (an empty array too: aliased with no bytes), explicit delete,
    and for an argument that was only read, on flexnpu and on jaxlib's cpu run directly."""
    step = jax.jit(lambda e, x, y: (e + 1, x * 2, y + x), donate_argnums=(0, 1))
    # Donates only the empty array: the compiled program aliases no bytes.
    empty_step = jax.jit(lambda e, y: (e + 1, y + 1), donate_argnums=(0,))

    def deletions(device: object) -> list[bool]:
        empty = jax.device_put(jnp.zeros((0,), jnp.float32), device)
        x = jax.device_put(jnp.ones((4,), jnp.float32), device)
        y = jax.device_put(jnp.arange(4.0, dtype=jnp.float32), device)
        _, doubled, summed = step(empty, x, y)
        np.testing.assert_array_equal(np.asarray(summed), np.arange(4.0) + 1)
        states = [empty.is_deleted(), x.is_deleted(), y.is_deleted()]
        doubled.delete()
        only_empty = jax.device_put(jnp.zeros((0,), jnp.float32), device)
        empty_step(only_empty, y)
        return [*states, doubled.is_deleted(), summed.is_deleted(), only_empty.is_deleted(),
                y.is_deleted()]

    expected = deletions(jax.devices("cpu")[0])
    assert expected == [True, True, False, True, False, True, False]
    assert deletions(npu_devices[1]) == expected
