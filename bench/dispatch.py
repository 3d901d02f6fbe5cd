"""Dispatch overhead of FlexNPU against the physical backend directly.

The same tiny jitted op and a mid-size matmul are dispatched N times with block_until_ready on a
flexnpu device and on the physical CPU plugin directly, in one process; rounds alternate between
the two so drift hits both alike. Prints per-call medians and the ratio flexnpu/direct.

    python bench/dispatch.py [--tiny-calls 3000] [--matmul-calls 300] [--rounds 5] [--json OUT]

The placement policy is FlexNPU's default (passthrough) unless FLEXNPU_POLICY says otherwise,
e.g. `FLEXNPU_POLICY=dynamic python bench/dispatch.py --matmul-size 256`. The machine is shared:
repeat a run at least three times and report min/median/max of the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import _side_by_side  # noqa: E402


def _time_calls(fn: Callable, args: tuple, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        samples.append(time.perf_counter() - start)
    return samples


def _compare(
    name: str,
    fn: Callable,
    make_args: Callable,
    calls: int,
    rounds: int,
    npu: object,
    direct: object,
) -> dict:
    import jax

    jitted = jax.jit(fn)
    args_npu = jax.device_put(make_args(), npu)
    args_direct = jax.device_put(make_args(), direct)
    for args in (args_npu, args_direct):  # compile and warm up
        for _ in range(20):
            jitted(*args).block_until_ready()
    npu_samples: list[float] = []
    direct_samples: list[float] = []
    for r in range(rounds):
        order = [(args_npu, npu_samples), (args_direct, direct_samples)]
        if r % 2:
            order.reverse()
        for args, sink in order:
            sink.extend(_time_calls(jitted, args, calls))
    npu_median = statistics.median(npu_samples)
    direct_median = statistics.median(direct_samples)
    return {
        "name": name,
        "calls": calls * rounds,
        "flexnpu_median_us": npu_median * 1e6,
        "direct_median_us": direct_median * 1e6,
        "ratio": npu_median / direct_median,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-calls", type=int, default=3000)
    parser.add_argument("--matmul-calls", type=int, default=300)
    parser.add_argument("--matmul-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    npu_devices, direct_devices = _side_by_side.setup()
    import jax.numpy as jnp
    import numpy as np

    n = args.matmul_size
    rng = np.random.default_rng(0)
    results = [
        _compare(
            "tiny op (x + 1, f32[8])",
            lambda x: x + 1,
            lambda: (np.ones(8, np.float32),),
            args.tiny_calls,
            args.rounds,
            npu_devices[0],
            direct_devices[0],
        ),
        _compare(
            f"matmul f32[{n},{n}] @ f32[{n},{n}]",
            lambda a, b: jnp.dot(a, b),
            lambda: (
                rng.standard_normal((n, n), np.float32),
                rng.standard_normal((n, n), np.float32),
            ),
            args.matmul_calls,
            args.rounds,
            npu_devices[0],
            direct_devices[0],
        ),
    ]
    print(f"{'benchmark':<36} {'calls':>7} {'flexnpu µs':>11} {'direct µs':>11} {'ratio':>7}")
    for r in results:
        print(
            f"{r['name']:<36} {r['calls']:>7} {r['flexnpu_median_us']:>11.1f} "
            f"{r['direct_median_us']:>11.1f} {r['ratio']:>7.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
