"""Dispatch cost with and without telemetry, side by side in one run.

Telemetry is read on a background thread (pjrt_flexnpu/hardware TelemetrySampler) and handed
to the placer with one short lock per device and round; the dispatch path only reads what is
there. This runs the same small jitted program on flexnpu (CPU backend, policy dynamic) with
telemetry none and with the fake AscendCL (tests/fakes, built here) sampled every 1 ms and every
500 ms, and prints the median per-call time and its ratio to `none`.

    python -m bench.telemetry_overhead [--calls 3000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import build_fakes

PROGRAM = r"""
import json, sys, time
import numpy as np
import jax, jax.numpy as jnp
calls = int(sys.argv[1])
f = jax.jit(lambda a: a * 2.0 + 1.0)
devices = jax.devices("flexnpu")
xs = [jax.device_put(np.ones((8,), np.float32), d) for d in devices]
for x in xs:
    f(x).block_until_ready()
times = []
for i in range(calls):
    x = xs[i % len(xs)]
    t0 = time.perf_counter_ns()
    f(x).block_until_ready()
    times.append(time.perf_counter_ns() - t0)
from flexnpu import stats
t = stats.clients()[0]["telemetry"]
print(json.dumps({"median_us": float(np.median(times)) / 1e3, "rounds": t.get("rounds", 0),
                  "source": t["source"]}))
"""

SCRIPT = "devices=4\nsoc=Ascend910B2\nmemory_total=68719476736\nmemory_free=60000000000\ncube=5\n"


def run(calls: int, env: dict[str, str]) -> dict:
    full = {**os.environ, "JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "dynamic", **env}
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(calls)],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fakes = build_fakes(Path(tmp))
        script = Path(tmp) / "acl.txt"
        script.write_text(SCRIPT)
        acl = {
            "FLEXNPU_TELEMETRY": "ascendcl",
            "FLEXNPU_ASCENDCL_LIBRARY": str(fakes["ascendcl"]),
            "FLEXNPU_FAKE_ACL_FILE": str(script),
        }
        configs = {
            "none": {"FLEXNPU_TELEMETRY": "none"},
            "ascendcl fake, 1 ms": {**acl, "FLEXNPU_TELEMETRY_PERIOD_MS": "1"},
            "ascendcl fake, 500 ms": {**acl, "FLEXNPU_TELEMETRY_PERIOD_MS": "500"},
        }
        results: dict[str, list[dict]] = {name: [] for name in configs}
        for _ in range(args.repeats):  # interleaved, so machine load hits every config alike
            for name, env in configs.items():
                results[name].append(run(args.calls, env))
    base = sorted(r["median_us"] for r in results["none"])[args.repeats // 2]
    print(f"{'telemetry':<24} {'median us/call':>15} {'ratio':>7} {'rounds':>8}")
    for name, runs in results.items():
        median = sorted(r["median_us"] for r in runs)[args.repeats // 2]
        rounds = max(r["rounds"] for r in runs)
        print(f"{name:<24} {median:>15.1f} {median / base:>7.3f} {rounds:>8}")


if __name__ == "__main__":
    main()
