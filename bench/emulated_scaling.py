"""Independence of emulated devices: N emulated accelerators, each driven by its own thread,
should give N times one device's throughput however few host cores there are.

    python -m bench.emulated_scaling                       # 1, 2, 4, 8, 16 x emulated 910C
    python -m bench.emulated_scaling --devices 1 4 --steps 20 --preset h100

Each N runs in a fresh process with JAX_PLATFORMS=flexnpu, FLEXNPU_BACKEND=emulate:PRESET and
FLEXNPU_BACKEND_OPTIONS=device_count=N (passthrough: virtual device i on emulated device i).
Every thread jits one bf16 matmul on its device and runs it `--steps` times, waiting for each
result as a serving loop waits for its tokens. Prints per N the aggregate executions/s, its
ratio to N x the one-device figure (the issue's bar: >= 0.9), the modelled device time of one
execution (xla_passes::ModelledSeconds on the preset), the wall time of a step and the host
overhead per step: the wall time of a step not spent in (time_scale x) modelled device time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
import jax, jax.numpy as jnp
from flexnpu._native_loader import native
from flexnpu.analysis import analyze

n, steps, size, preset = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
devices = jax.devices()
assert len(devices) == n, devices

def matmul(a, b):
    return a @ b

shape = jax.ShapeDtypeStruct((size, size), jnp.bfloat16)
a = analyze(matmul, shape, shape, device=preset).classification
modelled = native("modelled_seconds", "the step-time model").modelled_seconds(
    preset, a.flops, a.bytes
)
step = jax.jit(matmul)
inputs = [
    jax.jit(lambda: jnp.zeros((size, size), jnp.bfloat16), device=d)() for d in devices
]
for x in inputs:  # compile (once per device variant) and warm up
    step(x, x).block_until_ready()

def drive(x, out, i):
    t = time.perf_counter()
    for _ in range(steps):
        step(x, x).block_until_ready()
    out[i] = time.perf_counter() - t

walls = [0.0] * n
threads = [threading.Thread(target=drive, args=(x, walls, i)) for i, x in enumerate(inputs)]
start = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
total = time.perf_counter() - start
print(json.dumps({"n": n, "wall": total, "per_thread": walls, "modelled": modelled}))
"""


def run(n: int, steps: int, size: int, preset: str, time_scale: float) -> dict:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": f"emulate:{preset}",
        "FLEXNPU_BACKEND_OPTIONS": f"device_count={n},time_scale={time_scale:g}",
        "FLEXNPU_POLICY": "passthrough",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(steps), str(size), preset],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"N={n} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--size", type=int, default=16384, help="square bf16 matmul side")
    p.add_argument("--preset", default="910c")
    p.add_argument("--time-scale", type=float, default=1.0)
    args = p.parse_args(argv)

    base = None
    print(f"emulated {args.preset}, [{args.size}]^2 bf16 matmul, {args.steps} steps per device")
    header = ("N", "exec/s", "vs N x 1", "modelled", "step wall", "host/step")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (3, 9, 9, 10, 10, 10), strict=True)))
    for n in args.devices:
        r = run(n, args.steps, args.size, args.preset, args.time_scale)
        rate = n * args.steps / r["wall"]
        if base is None:
            base = rate / n
        step_wall = sum(r["per_thread"]) / n / args.steps
        device = args.time_scale * r["modelled"]  # wall seconds the device is busy per step
        print(
            f"{n:>3} {rate:>9.1f} {rate / (n * base):>9.3f} {r['modelled'] * 1e3:>8.3f}ms "
            f"{step_wall * 1e3:>8.3f}ms {(step_wall - device) * 1e6:>8.0f}us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
