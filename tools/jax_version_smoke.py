"""A small JAX program on flexnpu and on jaxlib's own cpu, in one process, results compared:
what tools/check_jax_versions.sh runs under each supported jax/jaxlib. Exits non-zero, naming
the program, when a result differs or a program fails; prints one summary line."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def programs(devices: list) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 32)).astype(np.float32)
    spd = a @ a.T + 32 * np.eye(32, dtype=np.float32)
    x = np.arange(16, dtype=np.float32)
    mesh = Mesh(np.array(devices[:4]), ("d",))
    shard = NamedSharding(mesh, P("d"))

    def on(device):  # noqa: ANN001, ANN202 - helper
        return lambda v: jax.device_put(v, device)

    return {
        "matmul_softmax": lambda: jax.jit(lambda m: jax.nn.softmax(m @ m.T, axis=-1))(
            on(devices[1])(a)
        ),
        "solve": lambda: jax.jit(jnp.linalg.solve)(on(devices[2])(spd), on(devices[2])(a)),
        "pure_callback": lambda: jax.jit(
            lambda v: (
                jax.pure_callback(
                    lambda u: np.asarray(u) * 2, jax.ShapeDtypeStruct(v.shape, v.dtype), v
                )
                + 1
            )
        )(on(devices[0])(x)),
        "donation": lambda: jax.jit(lambda v: v * 3, donate_argnums=0)(on(devices[3])(x)),
        "sharded": lambda: jax.jit(
            lambda v: v * 3 + v.sum(), in_shardings=shard, out_shardings=shard
        )(jax.device_put(x, shard)),
    }


def main() -> int:
    npu = jax.devices("flexnpu")
    cpu = jax.devices("cpu")
    if len(cpu) < 4:
        print("need 4 cpu devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)")
        return 2
    got, want = programs(npu), programs(cpu)
    failures = []
    for name in got:
        try:
            np.testing.assert_allclose(
                np.asarray(got[name]()), np.asarray(want[name]()), rtol=1e-5, atol=1e-5
            )
        except Exception as error:  # noqa: BLE001 - reported by name below
            failures.append(f"{name}: {type(error).__name__}: {str(error)[:300]}")
    print(
        f"jax {jax.__version__} jaxlib {jaxlib.__version__}: "
        f"{len(got) - len(failures)}/{len(got)} programs equal on flexnpu and cpu"
    )
    for failure in failures:
        print("  FAILED " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
