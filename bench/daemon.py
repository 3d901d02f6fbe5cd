"""Overhead of the per-host daemon: the same programs dispatched by in-process FlexNPU and by
FlexNPU in client mode (FLEXNPU_BACKEND=daemon:SOCK), each in its own process (JAX fixes its
backends per process), rounds alternating. Prints per-call medians and the ratio daemon/local.

    python bench/daemon.py [--tiny-calls 2000] [--decode-steps 200] [--smollm2-steps 40]
                           [--daemon-policy dynamic] [--rounds 3] [--json OUT]

Workloads: a tiny op (x + 1 on a scalar, block_until_ready each call), a decode-like step
(4 layers, hidden 512: q projection, KV-cache row update, attention over 256 cached rows, MLP,
8192-way logits; the cache is donated and carried from step to step) and the served SmolLM2
decode step: the serving engine's compiled decode program for SmolLM2-135M-Instruct (batch 8,
position 48, KV cache donated), driven as bench/engine_overhead.py's bare loop drives it (read
the sampled ids each step). `--daemon-policy P` runs the daemon over FlexNPU's runtime with
policy P (its placer decides; the client passes through), default: the daemon serves the
physical backend directly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r"""
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np

tiny_calls, decode_steps, smollm2_steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
device = jax.devices()[0]
out = {}

if smollm2_steps:
    sys.path.insert(0, sys.argv[4])
    from engine_overhead import bare_step_seconds
    from flexnpu.serving import logs
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.gguf_loader import DEFAULT_MODEL
    from flexnpu.serving.loading import load_model

    logs.set_backend_log_level("fatal")
    model = load_model(DEFAULT_MODEL, log=lambda *a: None)
    config = EngineConfig(max_num_seqs=8, max_model_len=512, max_num_batched_tokens=64,
                          chunk_buckets=[32, 64], num_devices=1)
    engine = Engine(None, model.params, config, devices=[device],
                    model_config=model.config, eos_ids=())
    bare_step_seconds(engine, 5, 8, 48)  # compiles and warms the decode program
    out["smollm2_decode_step_us"] = bare_step_seconds(engine, smollm2_steps, 8, 48) * 1e6

tiny = jax.jit(lambda x: x + 1)
x = jax.device_put(np.float32(0), device)
for _ in range(50):
    tiny(x).block_until_ready()
samples = []
for _ in range(tiny_calls):
    start = time.perf_counter()
    tiny(x).block_until_ready()
    samples.append(time.perf_counter() - start)
out["tiny_op_us"] = statistics.median(samples) * 1e6

H, F, L, T, V = 512, 1536, 4, 256, 8192
rng = np.random.default_rng(0)
def w(*shape):
    return jax.device_put((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32),
                          device)
params = {"wq": [w(H, H) for _ in range(L)], "w1": [w(H, F) for _ in range(L)],
          "w2": [w(F, H) for _ in range(L)], "out": w(H, V)}

def step(params, cache, x, pos):
    new_cache = []
    for layer in range(L):
        q = x @ params["wq"][layer]
        c = jax.lax.dynamic_update_slice(cache[layer], q, (pos, 0))
        new_cache.append(c)
        attention = jax.nn.softmax(q @ c.T / np.sqrt(H), axis=-1) @ c
        x = x + attention
        x = x + jax.nn.gelu(x @ params["w1"][layer]) @ params["w2"][layer]
    return x @ params["out"], jnp.stack(new_cache)

decode = jax.jit(step, donate_argnums=1)
cache = jax.device_put(np.zeros((L, T, H), np.float32), device)
x = jax.device_put(rng.standard_normal((1, H)).astype(np.float32), device)
for i in range(10):
    logits, cache = decode(params, cache, x, np.int32(i % T))
logits.block_until_ready()
samples = []
for i in range(decode_steps):
    start = time.perf_counter()
    logits, cache = decode(params, cache, x, np.int32(i % T))
    logits.block_until_ready()
    samples.append(time.perf_counter() - start)
out["decode_step_us"] = statistics.median(samples) * 1e6
print(json.dumps(out))
"""


def _env(mode: str, socket: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    env["JAX_PLATFORMS"] = "flexnpu"
    if mode == "daemon":
        env["FLEXNPU_BACKEND"] = f"daemon:{socket}"
    return env


def _worker(mode: str, socket: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", WORKER, str(args.tiny_calls),
                           str(args.decode_steps), str(args.smollm2_steps),
                           str(Path(__file__).parent)],
                          capture_output=True, text=True, env=_env(mode, socket), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} worker failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny-calls", type=int, default=2000)
    parser.add_argument("--decode-steps", type=int, default=200)
    parser.add_argument("--smollm2-steps", type=int, default=40,
                        help="SmolLM2 decode steps timed per round (0: skip)")
    parser.add_argument("--daemon-policy", help="run the daemon over FlexNPU's runtime with "
                                                "this policy (default: the physical backend)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="flexnpu-bench-daemon-"))
    socket = tmp / "flexnpu.sock"
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    command = [sys.executable, "-m", "flexnpu", "daemon", "--socket", str(socket)]
    if args.daemon_policy:
        command += ["--policy", args.daemon_policy]
    daemon = subprocess.Popen(command, stderr=log, stdout=log, env=env)
    try:
        deadline = time.monotonic() + 60
        while "ready on" not in (tmp / "daemon.log").read_text():
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "daemon.log").read_text())
            time.sleep(0.1)
        results: dict[str, list[dict[str, float]]] = {"local": [], "daemon": []}
        for r in range(args.rounds):
            order = ["local", "daemon"] if r % 2 == 0 else ["daemon", "local"]
            for mode in order:
                results[mode].append(_worker(mode, socket, args))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        log.close()
    summary = {}
    print(f"{'workload':>14} {'local us':>10} {'daemon us':>10} {'ratio':>7}  (median of rounds)")
    workloads = [("tiny_op_us", "tiny op"), ("decode_step_us", "decode-like")]
    if args.smollm2_steps:
        workloads.append(("smollm2_decode_step_us", "SmolLM2 decode"))
    for key, name in workloads:
        local = statistics.median(x[key] for x in results["local"])
        remote = statistics.median(x[key] for x in results["daemon"])
        ratios = [d[key] / s[key] for d, s in zip(results["daemon"], results["local"], strict=True)]
        summary[key] = {"local_us": local, "daemon_us": remote, "ratio": remote / local,
                        "ratio_per_round": ratios}
        print(f"{name:>14} {local:>10.1f} {remote:>10.1f} {remote / local:>7.3f}  "
              f"per round: {', '.join(f'{x:.3f}' for x in ratios)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
