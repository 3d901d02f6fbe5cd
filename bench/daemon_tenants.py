"""Two `flexnpu serve` tenants sharing 4 physical devices through the daemon's one dynamic placer
(config "shared") vs the same two servers each on 2 dedicated physical devices (config
"dedicated"), under bursty load whose bursts are out of phase: tenant a bursts while b is quiet
and vice versa. Prints TTFT/TPOT p50/p90 per tenant per config and the ratios shared/dedicated.

    python -m bench.daemon_tenants --model random:tiny          # quick mode (~3-5 min)
    python -m bench.daemon_tenants [--model SmolLM2 path] [--requests 24] [--json OUT]

shared:    `python -m flexnpu daemon --policy dynamic --tenants FILE` over the CPU backend with
           4 physical devices (4 virtual ones served); tenant a's device set is virtual devices
           [0, 1], b's [2, 3]; each server runs with FLEXNPU_BACKEND=daemon:SOCK,
           FLEXNPU_TENANT=a|b and `--devices 2` (the two devices its session sees). Under the
           dynamic policy the daemon's placer may run either tenant's work on any physical device.
dedicated: each server is in-process FlexNPU (passthrough) over its own CPU client created with
           FLEXNPU_BACKEND_OPTIONS=cpu_device_count=2: 2 physical devices of its own, no daemon.

Workload: per tenant, arrivals with Gamma inter-arrival gaps (shape --burstiness < 1: bursty,
BurstGPT-style) at --burst-rate req/s of *active* time; active time is laid into alternating
half-periods of --period-s, tenant a in the first half of every period, b in the second.
Prompt/output lengths uniform in the given ranges, ignore_eos; fixed --seed. The streaming
client is bench/serving.py's (TTFT = first chunk, TPOT = (E2E - TTFT) / (tokens - 1)).
On a CPU host the "devices" share the same cores: this measures the mechanics (placement across
processes, daemon round trips), not accelerator speed-ups.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import ServeProcess
from bench.serving import Result, make_prompt, one_request

TENANTS = ("a", "b")
CONFIGS = ("shared", "dedicated")


@dataclass(frozen=True)
class Request:
    tenant: str
    arrival_s: float  # since the start of the load
    prompt: str
    output_tokens: int


def burst_arrivals(
    n: int, rate: float, burstiness: float, period_s: float, phase: int, rng: np.random.Generator
) -> list[float]:
    """n arrival times: Gamma(burstiness) gaps at `rate` over active time, with active time laid
    into half `phase` (0 or 1) of each period (the other half is quiet)."""
    if n < 0 or rate <= 0 or burstiness <= 0 or period_s <= 0 or phase not in (0, 1):
        raise ValueError(
            f"burst_arrivals: need n >= 0, rate > 0, burstiness > 0, period_s > 0 "
            f"and phase 0 or 1 (got n={n}, rate={rate}, burstiness={burstiness}, "
            f"period_s={period_s}, phase={phase})"
        )
    half = period_s / 2
    active = np.cumsum(rng.gamma(burstiness, 1.0 / (rate * burstiness), n))
    windows = np.floor(active / half)
    return (windows * period_s + phase * half + (active - windows * half)).tolist()


def workload(args: argparse.Namespace) -> list[Request]:
    """Both tenants' requests, sorted by arrival."""
    rng = np.random.default_rng(args.seed)
    requests = []
    for phase, tenant in enumerate(TENANTS):
        times = burst_arrivals(
            args.requests, args.burst_rate, args.burstiness, args.period_s, phase, rng
        )
        for t in times:
            prompt_len = int(rng.integers(args.prompt_len[0], args.prompt_len[1] + 1))
            out_len = int(rng.integers(args.output_len[0], args.output_len[1] + 1))
            requests.append(Request(tenant, t, make_prompt(prompt_len, rng), out_len))
    return sorted(requests, key=lambda r: r.arrival_s)


def percentiles(results: list[Result]) -> dict[str, float]:
    """TTFT and TPOT p50/p90 in ms of the successful results, and the count of failed ones."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft * 1e3 for r in ok]
    tpot = [(r.latency - r.ttft) * 1e3 / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out: dict[str, float] = {"completed": len(ok), "failed": len(results) - len(ok)}
    for name, xs in (("ttft", ttft), ("tpot", tpot)):
        for p in (50, 90):
            out[f"{name}_p{p}_ms"] = float(np.percentile(xs, p)) if xs else float("nan")
    return out


def table(summary: dict[str, dict[str, dict[str, float]]]) -> str:
    """Markdown: one row per tenant and metric, shared vs dedicated and the ratio."""
    lines = [
        "| tenant | metric | shared (daemon, dynamic) ms | dedicated (2 devices) ms "
        "| shared/dedicated |",
        "|---|---|---:|---:|---:|",
    ]
    for tenant in TENANTS:
        for metric in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"):
            s, d = summary["shared"][tenant][metric], summary["dedicated"][tenant][metric]
            ratio = s / d if d else float("nan")
            name = metric.removesuffix("_ms").replace("_", " ").upper()
            lines.append(f"| {tenant} | {name} | {s:.1f} | {d:.1f} | {ratio:.2f} |")
    for tenant in TENANTS:
        s, d = summary["shared"][tenant], summary["dedicated"][tenant]
        lines.append(
            f"| {tenant} | completed/failed | {s['completed']:.0f}/{s['failed']:.0f} "
            f"| {d['completed']:.0f}/{d['failed']:.0f} | |"
        )
    return "\n".join(lines)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    env["JAX_PLATFORMS"] = "flexnpu"
    return env


def _wait_for_log(path: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"waiting for {text!r} in {path}:\n{path.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.2)


class Processes:
    """The daemon and servers of one config; stop() ends them (SIGTERM, then SIGKILL), the
    servers before the daemon."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.servers: list[ServeProcess] = []

    def start(self, command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def start_server(self, serve_args: list[str], env: dict[str, str], log: Path) -> ServeProcess:
        """Launches one server (ServeProcess.wait_ready waits for it)."""
        server = ServeProcess(serve_args, env=env, log=log)
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def start_config(
    config: str, args: argparse.Namespace, tmp: Path, procs: Processes
) -> dict[str, str]:
    """Starts the config's daemon (shared) and both servers; returns tenant -> base URL."""
    env = _clean_env()
    server_env: dict[str, dict[str, str]] = {}
    if config == "shared":
        socket, tenants_file = tmp / "daemon.sock", tmp / "tenants.json"
        tenants_file.write_text(
            json.dumps(
                {
                    "allow_unknown": False,
                    "tenants": [
                        {"name": "a", "devices": [0, 1], "priority": args.priority[0]},
                        {"name": "b", "devices": [2, 3], "priority": args.priority[1]},
                    ],
                }
            )
        )
        daemon = procs.start(
            [
                sys.executable,
                "-m",
                "flexnpu",
                "daemon",
                "--socket",
                str(socket),
                "--policy",
                "dynamic",
                "--tenants",
                str(tenants_file),
                "--backend-options",
                "cpu_device_count=4",
            ],
            env,
            tmp / "daemon.log",
        )
        _wait_for_log(tmp / "daemon.log", "ready on", daemon, 120)
        for tenant in TENANTS:
            server_env[tenant] = {
                **env,
                "FLEXNPU_BACKEND": f"daemon:{socket}",
                "FLEXNPU_TENANT": tenant,
            }
    else:
        for tenant in TENANTS:
            server_env[tenant] = {**env, "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2"}
    servers = {}
    for tenant in TENANTS:
        serve_args = [
            "--model",
            args.model,
            "--devices",
            "2",
            "--max-model-len",
            str(args.max_model_len),
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--max-num-batched-tokens",
            "64",
        ]
        if config == "dedicated":
            # Not through the daemon: serializing an executable there aborts the server
            # (PJRT_Executable_Name is not provided by the remote backend; reported).
            serve_args += ["--compilation-cache", str(args.compilation_cache / config)]
        servers[tenant] = procs.start_server(
            serve_args, server_env[tenant], tmp / f"serve_{tenant}.log"
        )
    for server in servers.values():
        server.wait_ready(args.startup_timeout, poll_s=0.2)
    return {tenant: server.base_url for tenant, server in servers.items()}


async def drive(
    requests: list[Request], urls: dict[str, str], args: argparse.Namespace
) -> dict[str, list[Result]]:
    """Open loop: each request is sent at its arrival time to its tenant's server."""
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    client_args = argparse.Namespace(endpoint="/v1/completions")
    clients = {
        t: httpx.AsyncClient(base_url=u, timeout=httpx.Timeout(args.timeout), limits=limits)
        for t, u in urls.items()
    }
    try:
        models = {
            t: (await c.get("/v1/models")).json()["data"][0]["id"] for t, c in clients.items()
        }
        t0 = time.perf_counter()
        tasks: list[tuple[str, asyncio.Task[Result]]] = []
        for r in requests:
            await asyncio.sleep(max(0.0, t0 + r.arrival_s - time.perf_counter()))
            tasks.append(
                (
                    r.tenant,
                    asyncio.create_task(
                        one_request(
                            clients[r.tenant],
                            client_args,
                            models[r.tenant],
                            r.prompt,
                            r.output_tokens,
                        )
                    ),
                )
            )
        results: dict[str, list[Result]] = {t: [] for t in TENANTS}
        for tenant, task in tasks:
            results[tenant].append(await task)
        return results
    finally:
        for client in clients.values():
            await client.aclose()


def daemon_placements(socket: Path) -> dict[str, object]:
    """The daemon runtime's decisions per physical device and each tenant's executions."""
    done = subprocess.run(
        [sys.executable, "-m", "flexnpu", "stats", "--daemon", str(socket), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(),
    )
    if done.returncode != 0:
        return {"error": done.stderr[-500:]}
    try:
        state = json.loads(done.stdout)
        [runtime] = state["runtime"]
        return {
            "decisions_per_physical_device": [
                d["decisions"] for d in runtime["placement"]["physical"]
            ],
            "executions_per_tenant": {t: v["executions"] for t, v in state["tenants"].items()},
        }
    except (ValueError, KeyError, TypeError) as e:  # a report, not a reason to lose the run
        return {"error": f"unexpected stats --json shape: {e!r}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default=None,
        help="serve's --model (default: SmolLM2); random:tiny for a quick run",
    )
    p.add_argument("--requests", type=int, default=16, help="per tenant")
    p.add_argument("--burst-rate", type=float, default=2.0, help="req/s of active time")
    p.add_argument("--burstiness", type=float, default=0.5, help="Gamma shape (< 1: bursty)")
    p.add_argument(
        "--period-s", type=float, default=8.0, help="a tenant is active in its half of every period"
    )
    p.add_argument(
        "--prompt-len",
        type=int,
        nargs=2,
        default=(16, 48),
        metavar=("MIN", "MAX"),
        help="prompt words (about a token each on SmolLM2; random:tiny's byte "
        "tokenizer makes ~5 tokens of a word)",
    )
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    p.add_argument(
        "--priority",
        nargs=2,
        default=("latency", "latency"),
        choices=("latency", "batch"),
        metavar=("A", "B"),
        help="priority classes of tenants a and b in the tenants file",
    )
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument(
        "--compilation-cache",
        type=Path,
        default=None,
        help="JAX cache dir of the dedicated servers (the shared ones compile cold, "
        "see start_config; default: a temp dir)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--timeout", type=float, default=300.0, help="per request (client side)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if args.model is None:
        from flexnpu.serving.gguf_loader import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    tmp = Path(tempfile.mkdtemp(prefix="flexnpu-bench-tenants-"))
    args.compilation_cache = args.compilation_cache or tmp / "jax-cache"

    requests = workload(args)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    raw: dict[str, dict[str, list[dict]]] = {}
    placements: dict[str, object] = {}
    for config in CONFIGS:
        (tmp / config).mkdir()
        procs = Processes()
        try:
            t0 = time.perf_counter()
            urls = start_config(config, args, tmp / config, procs)
            print(f"{config}: servers up in {time.perf_counter() - t0:.0f} s", flush=True)
            results = asyncio.run(drive(requests, urls, args))
            if config == "shared":
                placements = daemon_placements(tmp / config / "daemon.sock")
                print(f"daemon placer: {placements}", flush=True)
        finally:
            procs.stop()
        summary[config] = {t: percentiles(rs) for t, rs in results.items()}
        raw[config] = {t: [vars(r) for r in rs] for t, rs in results.items()}
        errors = sorted({r.error for rs in results.values() for r in rs if not r.ok})
        if errors:
            print(f"{config} errors: {errors[:3]}", flush=True)
    print(
        f"\nmodel {args.model}; {args.requests} requests per tenant, bursts out of phase "
        f"(period {args.period_s} s, {args.burst_rate} req/s in a burst, Gamma shape "
        f"{args.burstiness}); priorities a={args.priority[0]} b={args.priority[1]}; "
        f"logs in {tmp}\n"
    )
    print(table(summary))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "summary": summary,
                    "daemon": placements,
                    "requests": raw,
                },
                indent=1,
            )
        )
    failed = sum(s[t]["failed"] for s in summary.values() for t in TENANTS)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
