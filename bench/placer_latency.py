"""Placement decision latency at 4, 64 and 384 physical devices (target: median <= 2 us at 384).

Timed in C++ (`flexnpu._native.PlacementCore.bench`): a loop of `Core::Place` calls on a steady
mixed workload (one decode stream per virtual device whose KV cache follows it, a prefill every
16th request, executions finished in order), each call timed with steady_clock; Python call
overhead is not in the numbers. Per-call samples include one clock read (its cost is printed).
`batch mean` times the same loop without per-call clock reads and includes the OnFinish calls.
Policies: dynamic (the O(P) cost-model scan) vs passthrough (v mod P: the bookkeeping alone).

    python -m bench.placer_latency [--calls 200000] [--devices 4 64 384] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _percentile(sorted_samples: list[int], q: float) -> float:
    return float(sorted_samples[min(len(sorted_samples) - 1, int(q * len(sorted_samples)))])


def measure(policy: str, devices: int, calls: int, preset: str) -> dict:
    from flexnpu import placement as fp

    core = fp.Core(policy, [fp.DeviceModel.from_preset(preset)] * devices)
    r = core.bench(calls, warmup=min(calls, 10_000), max_outstanding=2 * devices)
    samples = sorted(r["samples_ns"])
    return {
        "policy": policy,
        "physical_devices": devices,
        "calls": calls,
        "median_ns": statistics.median(samples),
        "p90_ns": _percentile(samples, 0.90),
        "p99_ns": _percentile(samples, 0.99),
        "clock_overhead_ns": r["clock_overhead_ns"],
        "batch_mean_ns": r["batch_mean_ns"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--devices", type=int, nargs="+", default=[4, 64, 384])
    parser.add_argument("--policies", nargs="+", default=["passthrough", "dynamic"])
    parser.add_argument("--preset", default="h200", help="device preset of the cost model")
    parser.add_argument("--target-ns", type=float, default=2000.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    results = [
        measure(policy, devices, args.calls, args.preset)
        for devices in args.devices
        for policy in args.policies
    ]
    print(f"{'policy':<12} {'P':>4} {'median':>9} {'p90':>9} {'p99':>9} {'batch mean':>11}  (ns)")
    for r in results:
        print(
            f"{r['policy']:<12} {r['physical_devices']:>4} {r['median_ns']:>9.0f} "
            f"{r['p90_ns']:>9.0f} {r['p99_ns']:>9.0f} {r['batch_mean_ns']:>11.0f}"
        )
    print(f"steady_clock read: ~{results[0]['clock_overhead_ns']:.0f} ns (included per call)")
    largest = max(args.devices)
    worst = [r for r in results if r["physical_devices"] == largest and r["policy"] == "dynamic"]
    ok = all(r["median_ns"] <= args.target_ns for r in worst)
    if worst:
        verdict = "meets" if ok else "MISSES"
        print(
            f"dynamic at P={largest}: median {worst[0]['median_ns']:.0f} ns {verdict} "
            f"the {args.target_ns:.0f} ns target"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
