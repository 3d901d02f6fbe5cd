"""Ordinary JAX programs on FlexNPU give the same results as on the physical backend directly."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _mlp_loss(params: dict, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"]) ** 2)


def _scan_cumprod(x: jax.Array) -> jax.Array:
    def step(carry: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        carry = carry * v
        return carry, carry

    return lax.scan(step, jnp.float32(1.0), x)[1]


def _while_collatz(n: jax.Array) -> jax.Array:
    def cond(state: tuple) -> jax.Array:
        return state[0] != 1

    def body(state: tuple) -> tuple:
        v, steps = state
        return jnp.where(v % 2 == 0, v // 2, 3 * v + 1), steps + 1

    return lax.while_loop(cond, body, (n, jnp.int32(0)))[1]


def _conv(x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _layernorm_softmax(x: jax.Array) -> jax.Array:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return jax.nn.softmax((x - mu) * lax.rsqrt(var + 1e-5), axis=-1)


def _random(key: jax.Array) -> tuple:
    k1, k2, k3 = jax.random.split(key, 3)
    return (
        jax.random.normal(k1, (16, 8)),
        jax.random.uniform(k2, (32,)),
        jax.random.randint(k3, (10,), 0, 100),
    )


PARAMS = {
    "w1": _f32(16, 32),
    "b1": _f32(32),
    "w2": _f32(32, 4),
}

# name -> (function, arguments)
PROGRAMS: dict[str, tuple[Callable, tuple]] = {
    "elementwise_f32": (
        lambda x, y: jnp.exp(x) * jnp.sin(y) + x / (1 + y**2),
        (_f32(64), _f32(64)),
    ),
    "elementwise_bf16": (lambda x: jnp.tanh(x) * 3 + x, (_f32(128).astype(jnp.bfloat16),)),
    "elementwise_f16": (lambda x: jnp.sqrt(jnp.abs(x)) - x, (_f32(128).astype(np.float16),)),
    "int8_arith": (
        lambda a, b: (a * b + a // 3, jnp.maximum(a, b)),
        (RNG.integers(-10, 10, 50).astype(np.int8), RNG.integers(1, 10, 50).astype(np.int8)),
    ),
    "bool_logic": (
        lambda a, b: (a & ~b, jnp.any(a), jnp.sum(a ^ b)),
        (RNG.random(40) > 0.5, RNG.random(40) > 0.3),
    ),
    "matmul_f32": (lambda a, b: a @ b, (_f32(96, 64), _f32(64, 48))),
    "matmul_bf16": (
        lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32),
        (_f32(32, 64).astype(jnp.bfloat16), _f32(64, 16).astype(jnp.bfloat16)),
    ),
    "batched_dot_general": (
        lambda a, b: jnp.einsum("bij,bjk->bik", a, b),
        (_f32(4, 8, 16), _f32(4, 16, 8)),
    ),
    "conv2d": (_conv, (_f32(2, 8, 8, 3), _f32(3, 3, 3, 4))),
    "grad_mlp": (jax.grad(_mlp_loss), (PARAMS, _f32(8, 16))),
    "value_and_grad": (jax.value_and_grad(lambda x: jnp.sum(jnp.sin(x) ** 2)), (_f32(20),)),
    "vmap": (jax.vmap(lambda m, v: m @ v), (_f32(5, 4, 3), _f32(5, 3))),
    "cond": (lambda p, x: lax.cond(p > 0, jnp.sin, jnp.cos, x), (np.float32(1.0), _f32(10))),
    "scan": (_scan_cumprod, (RNG.uniform(0.5, 1.5, 12).astype(np.float32),)),
    "while_loop": (_while_collatz, (np.int32(27),)),
    "fori_loop": (lambda x: lax.fori_loop(0, 5, lambda i, v: v * 2 + i, x), (_f32(6),)),
    "random": (_random, (jax.random.key_data(jax.random.PRNGKey(42)),)),
    "sort": (lambda x: (jnp.sort(x), jnp.argsort(x), lax.top_k(x, 5)), (_f32(50),)),
    "reductions": (
        lambda x: (x.sum(0), x.max(1), jnp.argmax(x, 1), jnp.cumsum(x, 1), jax.nn.logsumexp(x)),
        (_f32(7, 9),),
    ),
    "layernorm_softmax": (_layernorm_softmax, (_f32(4, 32),)),
    "gather_scatter": (
        lambda x, i: (x[i], x.at[i].add(1.0)),
        (_f32(20), RNG.integers(0, 20, 6).astype(np.int32)),
    ),
    "dynamic_update_slice": (
        lambda cache, row, pos: lax.dynamic_update_slice(cache, row, (pos, 0)),
        (_f32(16, 8), _f32(1, 8), np.int32(5)),
    ),
}


def _run(fn: Callable, args: tuple, device: jax.Device) -> list[np.ndarray]:
    placed = jax.device_put(args, device)
    out = jax.jit(fn)(*placed)
    leaves = jax.tree.leaves(out)
    for leaf in leaves:
        assert leaf.devices() == {device}
    return [np.asarray(leaf) for leaf in leaves]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_physical_backend(name: str, npu_devices: list, ref_devices: list) -> None:
    fn, args = PROGRAMS[name]
    # Use a device other than 0 so placement is exercised.
    got = _run(fn, args, npu_devices[2])
    want = _run(fn, args, ref_devices[2])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if np.issubdtype(g.dtype, np.floating) or g.dtype == jnp.bfloat16:
            np.testing.assert_allclose(
                g.astype(np.float32), w.astype(np.float32), rtol=1e-5, atol=1e-6
            )
        else:
            np.testing.assert_array_equal(g, w)


def test_device_put_across_virtual_devices(npu_devices: list) -> None:
    x = jax.device_put(np.arange(12, dtype=np.float32), npu_devices[0])
    y = jax.device_put(x, npu_devices[3])
    assert y.devices() == {npu_devices[3]}
    z = jax.jit(lambda v: v * 2)(y)
    assert z.devices() == {npu_devices[3]}
    np.testing.assert_array_equal(np.asarray(z), np.arange(12, dtype=np.float32) * 2)
    # The source is untouched and independent.
    y.delete()
    np.testing.assert_array_equal(np.asarray(x), np.arange(12, dtype=np.float32))


def test_sharded_jit_is_one_spmd_execution(npu_devices: list, ref_devices: list) -> None:
    from jax.sharding import NamedSharding, PartitionSpec

    x = _f32(8, 16)
    w = _f32(16, 4)

    def step(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w).sum(0)

    results = []
    for devices in (npu_devices, ref_devices):
        mesh = jax.sharding.Mesh(np.array(devices), ("d",))
        xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("d")))
        ws = jax.device_put(w, NamedSharding(mesh, PartitionSpec()))
        out = jax.jit(step)(xs, ws)
        assert {s.device for s in out.addressable_shards} <= set(devices)
        results.append(np.asarray(out))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


def test_shard_map_collectives(npu_devices: list) -> None:
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.Mesh(np.array(npu_devices), ("d",))

    @jax.jit
    def total(x: jax.Array) -> jax.Array:
        return jax.shard_map(
            lambda b: lax.psum(b.sum(), "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
        )(x)

    x = np.arange(16, dtype=np.float32)
    assert float(total(x)) == float(x.sum())


def test_deleted_buffer_reports_deletion(npu_devices: list) -> None:
    x = jax.device_put(np.ones(4, np.float32), npu_devices[1])
    x.delete()
    assert x.is_deleted()
    with pytest.raises(RuntimeError, match="deleted"):
        np.asarray(x)
    with pytest.raises(RuntimeError, match="deleted"):
        jax.jit(lambda v: v + 1)(x)


def test_export_round_trip(npu_devices: list, ref_devices: list) -> None:
    from jax import export

    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.nn.relu(x @ w)

    x, w = _f32(4, 8), _f32(8, 3)
    exported = export.export(jax.jit(f), platforms=["cpu", "flexnpu"])(x, w)
    restored = export.deserialize(exported.serialize())
    got = restored.call(jax.device_put(x, npu_devices[1]), jax.device_put(w, npu_devices[1]))
    want = restored.call(jax.device_put(x, ref_devices[1]), jax.device_put(w, ref_devices[1]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, w)), rtol=1e-5, atol=1e-6)
