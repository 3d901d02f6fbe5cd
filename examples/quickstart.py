"""FlexNPU quickstart: run with `JAX_PLATFORMS=flexnpu python examples/quickstart.py`.

An ordinary JAX program (no FlexNPU import): a jitted MLP step on one virtual NPU, a batch sharded
over all of them, and the memory each virtual device holds.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def mlp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"])
    return h @ params["w2"]


def main() -> None:
    devices = jax.devices()
    print(f"platform: {devices[0].platform}, {len(devices)} devices")
    for d in devices:
        print(f"  {d}")

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w1": jax.random.normal(k1, (256, 1024)) * 0.02,
        "w2": jax.random.normal(k2, (1024, 256)) * 0.02,
    }
    x = jax.random.normal(k3, (64, 256))

    loss = jax.jit(lambda p, x: jnp.mean(mlp(p, x) ** 2))
    grads = jax.jit(jax.grad(lambda p, x: jnp.mean(mlp(p, x) ** 2)))(params, x)
    print(f"loss on {devices[0]}: {float(loss(params, x)):.6f}")
    print(f"grad norm: {float(jnp.linalg.norm(grads['w1'])):.6f}")

    mesh = jax.make_mesh((len(devices),), ("batch",))
    sharded_x = jax.device_put(x, NamedSharding(mesh, PartitionSpec("batch")))
    out = jax.jit(mlp)(params, sharded_x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(mlp(params, x)), rtol=2e-5, atol=1e-6)
    print(f"sharded over {len(devices)} devices: {out.sharding}")

    for d in devices:
        stats = d.memory_stats() or {}
        print(f"  {d.id}: {stats.get('bytes_in_use', 0)} bytes in use")


if __name__ == "__main__":
    main()
