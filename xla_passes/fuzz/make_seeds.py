"""Writes serialized optimized HLO modules produced by jax, for tests and fuzzer seeds.

Usage: python xla_passes/fuzz/make_seeds.py OUT_DIR

Each module is written as NAME.pb (an HloModuleProto) and listed in OUT_DIR/expected.txt with
XLA's own cost analysis (flops, bytes accessed), which the C++ test compares against.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def _programs() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    f32 = jnp.float32

    def sds(*shape: int, dtype: Any = f32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype)

    def softmax(x: jax.Array) -> jax.Array:
        return jax.nn.softmax(x, axis=-1)

    def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        return jax.nn.gelu(x @ w1) @ w2

    def conv(x: jax.Array, k: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(x, k, (1, 1), "SAME")

    def kv_append(cache: jax.Array, new: jax.Array, pos: jax.Array) -> jax.Array:
        return lax.dynamic_update_slice(cache, new, (0, pos, 0))

    def loop(x: jax.Array) -> jax.Array:
        return lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c) * 2.0, x)

    return {
        "matmul.pb": (lambda a, b: a @ b, (sds(64, 32), sds(32, 48))),
        "gemv.pb": (lambda a, b: a @ b, (sds(1, 256), sds(256, 128))),
        "softmax.pb": (softmax, (sds(16, 128),)),
        "mlp.pb": (mlp, (sds(8, 64), sds(64, 128), sds(128, 64))),
        "conv.pb": (conv, (sds(1, 4, 16, 16), sds(8, 4, 3, 3))),
        "kv_append.pb": (kv_append, (sds(4, 64, 32), sds(4, 1, 32), sds(dtype=jnp.int32))),
        "while.pb": (loop, (sds(128),)),
    }


def optimized_hlo(fn: Callable[..., Any], *args: Any) -> tuple[bytes, dict[str, float]]:
    compiled = jax.jit(fn).lower(*args).compile()
    module = compiled.runtime_executable().hlo_modules()[0]
    return module.as_serialized_hlo_module_proto(), compiled.cost_analysis()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, (fn, args) in _programs().items():
        data, cost = optimized_hlo(fn, *args)
        (out / name).write_bytes(data)
        lines.append(f"{name} {cost.get('flops', 0.0):.1f} {cost.get('bytes accessed', 0.0):.1f}")
    (out / "expected.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
