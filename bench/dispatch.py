"""Dispatch overhead of FlexNPU against the physical backend directly.

The same tiny jitted op and a mid-size matmul are dispatched N times with block_until_ready on a
flexnpu device and on the physical CPU plugin directly, in one process; blocks of calls
alternate between the two so drift hits both alike. One run gives, per benchmark, the ratio
flexnpu/direct of the per-call medians and of the 10th percentiles (the fastest calls, those
other processes on a shared machine did not disturb); --runs repeats that and prints the
min/median/max of each ratio over the runs.

    python -m bench.dispatch [--tiny-calls 1000] [--matmul-calls 100] [--rounds 10] [--runs 5]
                             [--matmul-size 256] [--json OUT]

The placement policy is FlexNPU's default (passthrough) unless FLEXNPU_POLICY says otherwise,
e.g. `FLEXNPU_POLICY=dynamic FLEXNPU_NUM_VIRTUAL_DEVICES=8 python -m bench.dispatch`.
`--plugin PATH` measures another build of the plugin (e.g. build/<dir>/pjrt_flexnpu/
pjrt_plugin_flexnpu.so, or a copy of the previous commit's) instead of the installed one, with
the same policy and number of virtual devices, to compare builds under the same conditions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import DIRECT_PLATFORM, setup_side_by_side


def _time_calls(fn: Callable, args: tuple, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        samples.append(time.perf_counter() - start)
    return samples


def compare_dispatch(
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
    # Compile and warm up with one block of calls each: under a placing policy the first
    # executions also compile a variant per physical device and may move the arguments once,
    # which the measured blocks should not contain.
    for args in (args_npu, args_direct):
        for _ in range(max(20, calls)):
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
    npu_p10 = _percentile(npu_samples, 10)
    direct_p10 = _percentile(direct_samples, 10)
    return {
        "name": name,
        "calls": calls * rounds,
        "flexnpu_median_us": npu_median * 1e6,
        "direct_median_us": direct_median * 1e6,
        "ratio": npu_median / direct_median,
        "ratio_p10": npu_p10 / direct_p10,
    }


def _percentile(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1]


def _setup_plugin(plugin: Path, num_physical: int = 4) -> tuple[list, list]:
    """As setup_side_by_side, with FlexNPU loaded from `plugin` (platform flexnpubench)."""
    import os

    import jax
    from jax._src import xla_bridge

    import flexnpu

    cpu = str(flexnpu.cpu_plugin_path())
    os.environ.setdefault("FLEXNPU_CPU_PLUGIN_PATH", cpu)  # as flexnpu's jax_plugin does
    options: dict[str, str | int] = {
        "cpu_plugin_path": cpu,
        "backend_options": f"cpu_device_count={num_physical}",
        "policy": os.environ.get("FLEXNPU_POLICY", "passthrough"),
        "num_virtual_devices": int(os.environ.get("FLEXNPU_NUM_VIRTUAL_DEVICES", num_physical)),
    }
    xla_bridge.register_plugin("flexnpubench", library_path=str(plugin), options=options)
    xla_bridge.register_plugin(
        DIRECT_PLATFORM, library_path=cpu, options={"cpu_device_count": num_physical}
    )
    jax.config.update("jax_platforms", f"flexnpubench,{DIRECT_PLATFORM}")
    return jax.devices("flexnpubench"), jax.devices(DIRECT_PLATFORM)


def _spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-calls", type=int, default=1000, help="calls per block")
    parser.add_argument("--matmul-calls", type=int, default=100, help="calls per block")
    parser.add_argument("--matmul-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10, help="blocks per platform and run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plugin", type=Path, help="a FlexNPU plugin .so instead of the installed")
    args = parser.parse_args()

    if args.plugin is None:
        npu_devices, direct_devices = setup_side_by_side()
    else:
        npu_devices, direct_devices = _setup_plugin(args.plugin.resolve())
    import jax.numpy as jnp
    import numpy as np

    n = args.matmul_size
    rng = np.random.default_rng(0)
    benchmarks = [
        (
            "tiny op (x + 1, f32[8])",
            lambda x: x + 1,
            lambda: (np.ones(8, np.float32),),
            args.tiny_calls,
        ),
        (
            f"matmul f32[{n},{n}] @ f32[{n},{n}]",
            lambda a, b: jnp.dot(a, b),
            lambda: (
                rng.standard_normal((n, n), np.float32),
                rng.standard_normal((n, n), np.float32),
            ),
            args.matmul_calls,
        ),
    ]
    runs = [
        [
            compare_dispatch(
                name, fn, make_args, calls, args.rounds, npu_devices[0], direct_devices[0]
            )
            for name, fn, make_args, calls in benchmarks
        ]
        for _ in range(args.runs)
    ]
    print(
        f"{'benchmark':<36} {'run':>3} {'calls':>6} {'flexnpu µs':>11} {'direct µs':>10} "
        f"{'ratio':>6} {'p10':>6}"
    )
    for i, results in enumerate(runs):
        for r in results:
            print(
                f"{r['name']:<36} {i:>3} {r['calls']:>6} {r['flexnpu_median_us']:>11.1f} "
                f"{r['direct_median_us']:>10.1f} {r['ratio']:>6.3f} {r['ratio_p10']:>6.3f}"
            )
    print(f"\nflexnpu/direct over {args.runs} runs, min / median / max")
    for b, (name, *_rest) in enumerate(benchmarks):
        ratios = [results[b]["ratio"] for results in runs]
        p10s = [results[b]["ratio_p10"] for results in runs]
        print(f"{name:<36} median calls {_spread(ratios)}   p10 calls {_spread(p10s)}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
