"""Overhead of the per-host daemon: the same programs dispatched by in-process FlexNPU and by
FlexNPU in client mode (FLEXNPU_BACKEND=daemon:SOCK), side by side in one run. JAX fixes its
backends per process, so two worker processes (one per mode) load and warm every workload,
then run blocks of calls in lockstep (A B, B A, ...): each block pair sees nearly the same load,
and the ratio daemon/local is taken per pair. Prints per-call medians, the ratios (min, median,
max over pairs), CPU per call (the daemon's process counted with its client) and, from the
daemon's stats, the requests each call makes by op and the payload bytes moved.

    python -m bench.daemon [--tiny-calls 2000] [--decode-steps 200] [--smollm2-steps 40]
                           [--daemon-policy dynamic] [--rounds 3] [--json OUT]

Workloads: a tiny op (x + 1 on a scalar, block_until_ready each call), a decode-like step
(4 layers, hidden 512: q projection, KV-cache row update, attention over 256 cached rows, MLP,
8192-way logits; the cache is donated and carried from step to step) and the served SmolLM2
decode step: the serving engine's compiled decode program for SmolLM2-135M-Instruct (batch 8,
position 48, KV cache donated), driven as bench/engine_overhead.py's bare loop drives it (read
the sampled ids each step). `--rounds` is the number of block pairs; each block runs the given
number of calls. `--daemon-policy P` runs the daemon over FlexNPU's runtime with policy P (its
placer decides; the client passes through), default: the daemon serves the physical backend.
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
from typing import Any

from bench.common import REPO

WORKER = r"""
import json, statistics, sys, time
import jax, jax.numpy as jnp, numpy as np

smollm2 = sys.argv[1] == "1"
device = jax.devices()[0]
runs = {}

if smollm2:
    from bench.common import decode_inputs
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
    runner = engine.instances[0].runner
    smol_inputs = runner.device_inputs(decode_inputs(runner, 8, 48))

    def smollm2_step():
        # As bench/engine_overhead.py's bare loop: the step, the cache carried, ids read.
        out = runner.steps.step(runner.params, runner.ck, runner.cv, smol_inputs)
        runner.ck, runner.cv = out[4], out[5]
        np.asarray(out[0])

    runs["smollm2_decode_step_us"] = smollm2_step

tiny = jax.jit(lambda x: x + 1)
x0 = jax.device_put(np.float32(0), device)
runs["tiny_op_us"] = lambda: tiny(x0).block_until_ready()

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
state = {"cache": jax.device_put(np.zeros((L, T, H), np.float32), device), "i": 0}
xd = jax.device_put(rng.standard_normal((1, H)).astype(np.float32), device)

def decode_step():
    logits, state["cache"] = decode(params, state["cache"], xd, np.int32(state["i"] % T))
    state["i"] += 1
    logits.block_until_ready()

runs["decode_step_us"] = decode_step

for name, run in runs.items():  # compile and warm
    for _ in range(5 if name == "smollm2_decode_step_us" else 20):
        run()
print(json.dumps({"ready": sorted(runs)}), flush=True)
for line in sys.stdin:
    name, calls = line.split()
    run = runs[name]
    samples = []
    cpu = time.process_time()
    for _ in range(int(calls)):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    print(json.dumps({"samples": samples, "cpu_s": time.process_time() - cpu}), flush=True)
"""

WORKLOADS = [
    ("tiny_op_us", "tiny op", "tiny_calls"),
    ("decode_step_us", "decode-like", "decode_steps"),
    ("smollm2_decode_step_us", "SmolLM2 decode", "smollm2_steps"),
]


def _env(mode: str, socket: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    env["JAX_PLATFORMS"] = "flexnpu"
    if mode == "daemon":
        env["FLEXNPU_BACKEND"] = f"daemon:{socket}"
    return env


class Worker:
    """One worker process (one mode) answering 'WORKLOAD CALLS' with its samples."""

    def __init__(self, mode: str, socket: Path, smollm2: bool, log: Path) -> None:
        self.mode = mode
        self._stderr = open(log, "w")  # noqa: SIM115 - lives as long as the worker
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, "1" if smollm2 else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=_env(mode, socket),
            cwd=REPO,
        )  # `-c` imports from its cwd: the bench package
        self._log = log

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            raise RuntimeError(f"{self.mode} worker failed: {self._log.read_text()[-3000:]}")
        return json.loads(line)

    def run(self, workload: str, calls: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{workload} {calls}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _daemon_counters(socket: Path) -> dict[str, Any]:
    from flexnpu._daemon_wire import daemon_stats

    tenant = json.loads(daemon_stats(str(socket)))["tenants"].get("default", {})
    counters = {f"requests.{op}": v["count"] for op, v in tenant.get("requests", {}).items()}
    for key in ("pushes", "bytes_to_device", "bytes_to_host"):
        counters[key] = tenant.get(key, 0)
    return counters


def _per_call(before: dict[str, Any], after: dict[str, Any], calls: int) -> dict[str, float]:
    return {k: (v - before.get(k, 0)) / calls for k, v in after.items() if v != before.get(k, 0)}


def _start_daemon(tmp: Path, socket: Path, policy: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    command = [sys.executable, "-m", "flexnpu", "daemon", "--socket", str(socket)]
    if policy:
        command += ["--policy", policy]
    log = tmp / "daemon.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(command, stderr=out, stdout=out, env=env)
    deadline = time.monotonic() + 60
    while "ready on" not in log.read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(log.read_text())
        time.sleep(0.1)
    return daemon


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny-calls", type=int, default=2000)
    parser.add_argument("--decode-steps", type=int, default=200)
    parser.add_argument(
        "--smollm2-steps", type=int, default=40, help="SmolLM2 decode steps per block (0: skip)"
    )
    parser.add_argument(
        "--daemon-policy",
        help="run the daemon over FlexNPU's runtime with "
        "this policy (default: the physical backend)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="block pairs per workload")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="flexnpu-bench-daemon-"))
    socket = tmp / "flexnpu.sock"
    daemon = _start_daemon(tmp, socket, args.daemon_policy)
    workers: dict[str, Worker] = {}
    results: dict[str, Any] = {}
    try:
        for mode in ("local", "daemon"):
            workers[mode] = Worker(mode, socket, args.smollm2_steps > 0, tmp / f"{mode}.log")
        for worker in workers.values():
            worker.read()  # ready: loaded, compiled, warm
        for key, _, count in WORKLOADS:
            calls = getattr(args, count)
            if calls <= 0:
                continue
            rounds: list[dict[str, Any]] = []
            for r in range(args.rounds):
                pair: dict[str, Any] = {}
                for mode in ("local", "daemon") if r % 2 == 0 else ("daemon", "local"):
                    daemon_cpu = _cpu_seconds(daemon.pid)
                    counters = _daemon_counters(socket) if mode == "daemon" else {}
                    got = workers[mode].run(key, calls)
                    cpu = got["cpu_s"]
                    if mode == "daemon":
                        cpu += _cpu_seconds(daemon.pid) - daemon_cpu
                        pair["requests_per_call"] = _per_call(
                            counters, _daemon_counters(socket), calls
                        )
                    pair[mode] = {
                        "median_us": statistics.median(got["samples"]) * 1e6,
                        "cpu_us_per_call": cpu / calls * 1e6,
                    }
                pair["ratio"] = pair["daemon"]["median_us"] / pair["local"]["median_us"]
                rounds.append(pair)
            results[key] = rounds
    finally:
        for worker in workers.values():
            worker.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)

    summary: dict[str, Any] = {}
    print(
        f"{'workload':>14} {'local us':>10} {'daemon us':>10} {'ratio':>7} "
        f"{'min':>6} {'max':>6}  {'cpu local':>9} {'cpu daemon':>10}  (per call; ratio: median"
        f" of {args.rounds} lockstep pairs)"
    )
    for key, name, _ in WORKLOADS:
        if key not in results:
            continue
        rounds = results[key]
        ratios = [p["ratio"] for p in rounds]

        def med(mode: str, field: str, rounds: list[dict[str, Any]] = rounds) -> float:
            return statistics.median(p[mode][field] for p in rounds)

        summary[key] = {
            "local_us": med("local", "median_us"),
            "daemon_us": med("daemon", "median_us"),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_per_round": ratios,
            "cpu_local_us": med("local", "cpu_us_per_call"),
            "cpu_daemon_us": med("daemon", "cpu_us_per_call"),
            "requests_per_call": rounds[-1]["requests_per_call"],
        }
        s = summary[key]
        print(
            f"{name:>14} {s['local_us']:>10.1f} {s['daemon_us']:>10.1f} {s['ratio']:>7.3f} "
            f"{s['ratio_min']:>6.3f} {s['ratio_max']:>6.3f}  {s['cpu_local_us']:>9.1f} "
            f"{s['cpu_daemon_us']:>10.1f}"
        )
    print("daemon requests and bytes per call (last pair):")
    for key, name, _ in WORKLOADS:
        if key in summary:
            per = ", ".join(
                f"{k.removeprefix('requests.')} {v:g}"
                for k, v in sorted(summary[key]["requests_per_call"].items())
            )
            print(f"  {name}: {per}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
