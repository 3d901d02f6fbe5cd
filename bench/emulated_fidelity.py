"""Fidelity of the emulated backend: the device time a JAX program takes on emulated devices,
measured on the wall clock and divided by time_scale, against the cost model's prediction, and
the host overhead.

Programs: single ops (a large bf16 matmul, a bandwidth-bound elementwise op, ...) and the
serving engine's own step programs for Qwen2.5-7B (random bf16 weights made on the device, the
paged KV cache of the runner): a decode step (--engine-rows rows over a 4k-token block table)
and a 2k-token prefill chunk step (the rows padded, as the runner runs it). The prediction is
the cost model's, computed apart from the backend: flexnpu.analysis of the program's optimized
HLO classified on the preset (converts removed), then xla_passes::ModelledSeconds; the
backend's own modelled time (its stats' busy_s) must equal it.

For each program: `--calls` calls one at a time (launch, block_until_ready: device time plus
host overhead), then `--calls` calls launched back to back and blocked on once (the device
stays busy; host overhead hides behind device time when it is smaller). Error = measured device
time / predicted - 1. Host overhead = wall time of a blocking call - time_scale x predicted.

    python -m bench.emulated_fidelity [--preset 910c] [--time-scale 20] [--calls 10] [--json OUT]
    python -m bench.emulated_fidelity --only engine      # the Qwen2.5-7B steps only
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


def engine_programs(
    model: str = "qwen2.5-7b", rows: int = 16, context: int = 4096, chunk: int = 2048
) -> dict[str, tuple[Callable, ...]]:
    """The serving engine's step programs for a random-weight preset (bf16): name -> (a call of
    the step that threads the donated KV cache through, maker of its arguments, the step's
    arguments as the analysis lowers them, the jitted step)."""
    import jax
    import jax.numpy as jnp

    from flexnpu.serving.config import RANDOM_PRESETS
    from flexnpu.serving.model import random_params
    from flexnpu.serving.runner import ModelSteps, Runner, RunnerShapes

    cfg = RANDOM_PRESETS[model]
    block = 16
    blocks = context // block
    shapes = RunnerShapes(
        num_seqs=rows,
        block_size=block,
        num_blocks=rows * blocks,
        max_blocks_per_seq=blocks,
        chunk_buckets=(chunk,),
    )
    steps = ModelSteps(cfg, block)
    runner = Runner(
        steps, random_params(cfg, 0, jnp.bfloat16), jax.devices()[0], shapes, jnp.bfloat16
    )

    def step(inputs: dict) -> Any:
        ids, _, _, _, runner.ck, runner.cv = steps.step(runner.params, runner.ck, runner.cv, inputs)
        return ids

    def inputs(c: int) -> Callable:
        return lambda: (runner.device_inputs(runner._padding_inputs(c, blocks)),)

    def analysed(inp: dict) -> tuple:  # the step's arguments as the analysis lowers them
        return runner.params, runner.ck, runner.cv, inp

    return {
        f"{model} decode step {rows} rows x {context} ctx": (step, inputs(0), analysed, steps.step),
        f"{model} prefill step {chunk} chunk (+{rows} rows)": (
            step,
            inputs(chunk),
            analysed,
            steps.step,
        ),
    }


def _predicted_s(preset: str, fn: Callable, args: tuple) -> float:
    """The cost model's prediction, apart from the backend: the analysis of the program's
    optimized HLO on the preset (convert overhead removed for a native-bf16 device), then
    xla_passes::ModelledSeconds."""
    from flexnpu import analysis

    c = analysis.analyze(fn, *args, device=preset).classification
    return float(analysis._native().modelled_seconds(preset, c.flops, c.bytes))


def _busy_s() -> float:
    from flexnpu import stats

    (client,) = stats.clients()
    return float(client["modelled_device_time"][0]["busy_s"])


def _measure(
    fn: Callable, args: tuple, calls: int, time_scale: float, predicted: float
) -> dict[str, float]:
    fn(*args).block_until_ready()  # compiled, inputs ready
    before = _busy_s()
    fn(*args).block_until_ready()
    backend = _busy_s() - before  # the backend's modelled duration of one execution
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
        "backend_modelled_s": backend,
        "backend_vs_predicted": backend / predicted - 1,
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
    parser.add_argument(
        "--only",
        choices=("all", "ops", "engine"),
        default="all",
        help="single ops, the engine's Qwen2.5-7B steps, or both (default)",
    )
    parser.add_argument(
        "--engine-rows", type=int, default=16, help="decode rows of the engine's steps"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "flexnpu"
    os.environ["FLEXNPU_BACKEND"] = f"emulate:{args.preset}"
    os.environ["FLEXNPU_BACKEND_OPTIONS"] = f"device_count=1;time_scale={args.time_scale:g}"

    import jax

    from flexnpu.analysis import get_device

    preset = get_device(args.preset).name
    results: dict[str, Any] = {
        "preset": args.preset,
        "time_scale": args.time_scale,
        "platform_version": jax.devices()[0].client.platform_version,
        "load_average": os.getloadavg()[0],
        "programs": {},
    }
    print(f"{results['platform_version']}; load average {results['load_average']:.1f}\n")
    print(
        f"{'program':<44} {'model ms':>9} {'backend':>8} {'1-by-1 ms':>9} {'err':>7} "
        f"{'piped ms':>9} {'err':>7} {'host ms':>8}"
    )
    programs: dict[str, tuple] = {}
    if args.only in ("all", "ops"):
        programs |= {name: (fn, make, lambda *a: a, fn) for name, (fn, make) in _programs().items()}
    if args.only in ("all", "engine"):
        programs |= engine_programs(rows=args.engine_rows)
    for name, (fn, make_args, analysed, jitted) in programs.items():
        fn_args = make_args()
        predicted = _predicted_s(preset, jitted, analysed(*fn_args))
        r = _measure(fn, fn_args, args.calls, args.time_scale, predicted)
        results["programs"][name] = r
        print(
            f"{name:<44} {r['predicted_s'] * 1e3:>9.4f} {r['backend_vs_predicted']:>+8.2%} "
            f"{r['measured_single_s'] * 1e3:>9.4f} {r['error_single']:>+7.2%} "
            f"{r['measured_pipelined_s'] * 1e3:>9.4f} {r['error_pipelined']:>+7.2%} "
            f"{r['host_overhead_s'] * 1e3:>8.3f}",
            flush=True,
        )
    print(f"\nload average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
