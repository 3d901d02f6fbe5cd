"""Fidelity of the emulated backend: the device time a JAX program takes on emulated devices,
measured on the wall clock and divided by time_scale, against the cost model's prediction
(xla_passes::ModelledSeconds, read back from the runtime's stats), and the host overhead.

For each program: `--calls` calls one at a time (launch, block_until_ready: device time plus
host overhead), then `--calls` calls launched back to back and blocked on once (the device
stays busy; host overhead hides behind device time when it is smaller). Error = measured device
time / predicted - 1. Host overhead = wall time of a blocking call - time_scale x predicted.

    python -m bench.emulated_fidelity [--preset 910c] [--time-scale 20] [--calls 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def _programs() -> dict[str, tuple[Callable, Callable]]:
    """name -> (jitted program, maker of its arguments on the device: nothing on the host)."""
    import jax
    import jax.numpy as jnp

    def zeros(*shape: int, dtype: Any = jnp.bfloat16) -> Callable:
        return lambda: jax.jit(lambda: jnp.zeros(shape, dtype))()

    n = 8192
    return {
        "matmul bf16 8192^3": (jax.jit(lambda a, b: a @ b), lambda: (zeros(n, n)(), zeros(n, n)())),
        "elementwise bf16 512M (bandwidth)": (
            jax.jit(lambda x: x * 2 + 1),
            lambda: (zeros(512 * 1024 * 1024)(),),
        ),
        "gemv bf16 1x8192x28672 (decode-like)": (
            jax.jit(lambda x, w: x @ w),
            lambda: (zeros(1, n)(), zeros(n, 28672)()),
        ),
        "softmax f32 4096x32768": (
            jax.jit(lambda x: jax.nn.softmax(x, axis=-1)),
            lambda: (zeros(4096, 32768, dtype=jnp.float32)(),),
        ),
        "add f32 1024 (launch-bound)": (
            jax.jit(lambda x: x + 1),
            lambda: (zeros(1024, dtype=jnp.float32)(),),
        ),
    }


def _busy_s() -> float:
    from flexnpu import stats

    (client,) = stats.clients()
    return float(client["modelled_device_time"][0]["busy_s"])


def _measure(fn: Callable, args: tuple, calls: int, time_scale: float) -> dict[str, float]:
    fn(*args).block_until_ready()  # compiled, inputs ready
    before = _busy_s()
    fn(*args).block_until_ready()
    predicted = _busy_s() - before  # the modelled duration of one execution (device time)
    blocking = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        blocking.append(time.perf_counter() - start)
    start = time.perf_counter()
    outs = [fn(*args) for _ in range(calls)]
    outs[-1].block_until_ready()
    pipelined = (time.perf_counter() - start) / calls
    single = statistics.median(blocking)
    return {
        "predicted_s": predicted,
        "measured_single_s": single / time_scale,
        "error_single": single / time_scale / predicted - 1,
        "measured_pipelined_s": pipelined / time_scale,
        "error_pipelined": pipelined / time_scale / predicted - 1,
        "host_overhead_s": single - time_scale * predicted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="910c")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "flexnpu"
    os.environ["FLEXNPU_BACKEND"] = f"emulate:{args.preset}"
    os.environ["FLEXNPU_BACKEND_OPTIONS"] = f"device_count=1;time_scale={args.time_scale:g}"

    import jax

    results: dict[str, Any] = {
        "preset": args.preset,
        "time_scale": args.time_scale,
        "platform_version": jax.devices()[0].client.platform_version,
        "programs": {},
    }
    print(f"{results['platform_version']}\n")
    print(
        f"{'program':<38} {'model ms':>9} {'1-by-1 ms':>9} {'err':>7} "
        f"{'piped ms':>9} {'err':>7} {'host ms':>8}"
    )
    for name, (fn, make_args) in _programs().items():
        r = _measure(fn, make_args(), args.calls, args.time_scale)
        results["programs"][name] = r
        print(
            f"{name:<38} {r['predicted_s'] * 1e3:>9.4f} {r['measured_single_s'] * 1e3:>9.4f} "
            f"{r['error_single']:>+7.2%} {r['measured_pipelined_s'] * 1e3:>9.4f} "
            f"{r['error_pipelined']:>+7.2%} {r['host_overhead_s'] * 1e3:>8.3f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
