"""Soak: N concurrent streaming clients for a bounded time against `flexnpu serve`, with faults on
a schedule, and invariants checked throughout and in a final report.

    python -m bench.soak --clients 16 --duration 600 --out /tmp/soak        # 8 x emulated 910C
    python -m bench.soak --backend cpu --model random:tiny --duration 20 --out /tmp/soak-cpu
    python -m bench.soak --fuzz 10000 --backend cpu --model random:tiny --out /tmp/fuzz
    python -m bench.soak --base-url http://127.0.0.1:8000 --server-pid PID ...   # a running one

The server it starts (bench.common.ServeProcess): `flexnpu serve --model random:qwen2.5-7b
--dtype bfloat16` on FLEXNPU_BACKEND=emulate:910c with device_count=8 and a time_scale at which
the 2-core host keeps up (nothing is computed on emulated devices; time comes from the cost
model), small KV pools (--num-kv-blocks) and queue (--max-waiting) so that faults reach them.

Clients: each sends one request after another until the time is up: completions or chat, text or
token-id prompts, sometimes n=2 or not streamed, always a fixed output length k (`ignore_eos`,
`max_tokens` = `min_tokens` = k) and logprobs, so every choice must carry exactly k tokens
(counted from each chunk's logprobs token list and usage.completion_tokens; text cannot count
them: a byte-level tokenizer merges bytes and special tokens have no text). A 503/429 (named
overload) makes the client back off.

Faults (--faults, one every --fault-every seconds, in turn; each counted in the report):
disconnect-storm, kv-exhaustion, bad-http (bench/soak_faults.py), and when the server has them:
instance-failure (the server's fault hook, FLEXNPU_FAULT_INJECTION=1), daemon-restart (--daemon),
ray-node-kill (--ray-node-pid). A fault that cannot run here is printed as "skipped: NAME: why".

Invariants (exit status 1 if one fails): the server up throughout (/health polled, the process
alive); every request ended exactly once with a finish reason or a named error; exactly k tokens
in every completed choice and no text_offset going back; no 5xx other than a named overload;
/metrics (flexnpu:generation_tokens_total, flexnpu:request_success_total{finished_reason=
"length"}) within what the clients saw; 0 running and 0 waiting once the clients stopped; the
server's RSS (/proc/PID/status VmRSS) after the warm-up grows by less than --max-rss-growth.
Report: DIR/soak.json and DIR/soak.md (--out), with the server log's tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ServeProcess, ServerStartError, start_server
from bench.soak_client import KEEPALIVE_S, OVERLOAD_STATUSES, Record, judge, send
from bench.soak_faults import FAULTS, Fault, FaultContext

WORDS = ("soak", "stream", "token", "virtual", "npu", "flex", "serve", "fault", "storm", "kv")
DEFAULT_FAULTS = "disconnect-storm,kv-exhaustion,bad-http,instance-failure"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
GAUGES = (
    "flexnpu:kv_cache_usage_perc",
    "flexnpu:num_requests_running",
    "flexnpu:num_requests_waiting",
)


# --- the server ---------------------------------------------------------------------------------


class DaemonProcess:
    """`flexnpu daemon` on a socket, restartable on the same socket (the daemon-restart fault)."""

    def __init__(
        self, socket_path: Path, log: Path, env: dict[str, str], backend: str, backend_options: str
    ) -> None:
        self.command = [sys.executable, "-m", "flexnpu", "daemon", "--socket", str(socket_path)]
        if backend != "cpu":
            self.command += ["--backend", backend]
        if backend_options:
            self.command += ["--backend-options", backend_options.replace(";", ",")]
        self.log, self.env = log, env
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120.0) -> float:
        t0 = time.monotonic()
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        while "ready on" not in self.log.read_bytes()[start:].decode(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"the daemon did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> float:
        t0 = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - t0


def serve_args(o: argparse.Namespace) -> list[str]:
    args = [
        "--model",
        o.model,
        "--dtype",
        o.dtype,
        "--max-model-len",
        str(o.max_model_len),
        "--max-num-seqs",
        str(o.max_num_seqs),
        "--max-waiting",
        str(o.max_waiting),
        "--shutdown-grace-s",
        "5",
    ]
    if o.num_kv_blocks:
        args += ["--num-kv-blocks", str(o.num_kv_blocks)]
    if o.daemon:  # the remote backend cannot serialize executables for the cache (daemon_tenants)
        args.append("--no-compilation-cache")
    return args + list(o.serve_arg)


def server_env(o: argparse.Namespace, faults: list[str]) -> dict[str, str]:
    """This environment without FLEXNPU_*/JAX_* settings, plus the backend's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    env["JAX_PLATFORMS"] = "flexnpu"
    if o.backend != "cpu":
        env["FLEXNPU_BACKEND"] = o.backend
    if o.backend_options:
        env["FLEXNPU_BACKEND_OPTIONS"] = o.backend_options
    if "instance-failure" in faults:
        env["FLEXNPU_FAULT_INJECTION"] = "1"
    return env


def kv_capacity(log_text: str) -> tuple[int | None, int]:
    """(KV positions of all instances, instances) from the server's `engine:` start-up line."""
    line = next((x for x in log_text.splitlines() if x.startswith("engine: ")), "")
    instances = max(1, line.count(" on "))
    m = re.search(r"(\d+) KV blocks of (\d+) per device", line)
    return (int(m.group(1)) * int(m.group(2)) * instances if m else None), instances


def rss_mib(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def tracebacks(log_text: str, limit: int = 5) -> list[str]:
    """The server log's Python tracebacks (each up to its exception line), at most `limit`."""
    found, lines = [], log_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith((" ", "\t")) or not lines[j].strip()):
                j += 1
            found.append("\n".join(lines[i : j + 1]))
    return found[:limit]


# --- metrics ------------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{label="v",...}': value} and per name the sum over labels."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(
                f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name"
            )
            out[f"{s.name}{{{labels}}}" if labels else s.name] += s.value
            if labels:
                out[s.name] += s.value
    return dict(out)


def metric_delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Monitor:
    health_failures: list[tuple[float, str]] = field(default_factory=list)
    health_polls: int = 0
    rss: list[tuple[float, float]] = field(default_factory=list)  # (s, MiB)
    faults: list[dict] = field(default_factory=list)
    gauge_peaks: dict[str, float] = field(default_factory=dict)  # GAUGES' largest samples


class Soak:
    def __init__(self, o: argparse.Namespace, base_url: str, pid: int | None) -> None:
        self.o, self.base_url, self.pid = o, base_url, pid
        self.rng = random.Random(o.seed)
        self.records: list[Record] = []
        self.active: dict[int, tuple[Record, asyncio.Task]] = {}
        self.tasks: set[asyncio.Task] = set()
        self.monitor = Monitor()
        self.printed = 0  # violations printed as they happened
        self.started = time.perf_counter()
        self.stop_at = self.started + o.duration
        # The server was started with FLEXNPU_FAULT_INJECTION=1 (server_env), or is asked to
        # have been (--base-url): POST /debug/fail-instance then answers.
        self.fault_injection = "instance-failure" in o.faults.split(",")

    def now(self) -> float:
        return time.perf_counter() - self.started

    def new_record(self, kind: str, path: str, stream: bool, **fields: Any) -> Record:
        r = Record(len(self.records), kind, path, stream, **fields)
        self.records.append(r)
        return r

    def spawn(self, r: Record, body: dict | bytes) -> asyncio.Task:
        if r.kind != "client":  # the clients' bodies are regular; the faults' are worth seeing
            r.body_excerpt = repr(body)[:400] if isinstance(body, bytes) else json.dumps(body)[:400]
        task = asyncio.get_running_loop().create_task(self._send(r, body))
        self.active[r.id] = (r, task)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _send(self, r: Record, body: dict | bytes) -> Record:
        try:
            return await send(self.client, r, body, self.started)
        finally:
            self.active.pop(r.id, None)
            if r.kind != "client":  # the clients' own are judged by their loops
                self.report_violations(r)

    async def run_one(self, r: Record, body: dict) -> Record:
        """Sends and awaits one request; a hang-up on purpose (the task cancelled by a storm)
        ends it quietly, a cancellation of the caller propagates."""
        task = self.spawn(r, body)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if r.hung_up is None or (current is not None and current.cancelling()):
                raise
            r.ended_s = r.ended_s or self.now()
            return r

    def client_request(self, rng: random.Random) -> tuple[Record, dict]:
        o = self.o
        k = rng.randint(o.min_tokens, o.max_tokens)
        chat = rng.random() < o.chat_fraction
        stream = rng.random() >= o.plain_fraction
        n = 2 if not chat and rng.random() < o.n2_fraction else 1
        body: dict[str, Any] = {
            "max_tokens": k,
            "min_tokens": k,
            "ignore_eos": True,
            "n": n,
            "temperature": rng.choice([0.0, 0.7]),
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.3:
            body["seed"] = rng.randrange(2**31)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, o.prompt_words)))
        if chat:
            body["messages"] = [{"role": "user", "content": words}]
            body["logprobs"] = True
        else:
            body["logprobs"] = 0
            ids = [rng.randint(33, 126) for _ in range(rng.randint(1, 4 * o.prompt_words))]
            body["prompt"] = ids if rng.random() < 0.3 else words
        path = "/v1/chat/completions" if chat else "/v1/completions"
        r = self.new_record("client", path, stream, choices=n, expected_tokens=k, max_tokens=k)
        return r, body

    def report_violations(self, r: Record) -> None:
        """Prints a request's violations as they happen (the first --print-violations)."""
        outcome, bad = judge(r)
        if bad and self.printed < self.o.print_violations:
            self.printed += 1
            print(f"[{self.now():6.1f}s] violation: request {r.id} ({r.kind} {r.path}, "
                  f"{outcome}): {bad}", flush=True)  # fmt: skip

    async def client_loop(self, i: int) -> None:
        rng = random.Random(self.o.seed * 100_003 + i)
        while time.perf_counter() < self.stop_at:
            r, body = self.client_request(rng)
            await self.run_one(r, body)
            self.report_violations(r)
            if r.status in OVERLOAD_STATUSES:  # overload or a failed engine: back off
                await asyncio.sleep(self.o.backoff_s)

    async def poll_health(self) -> None:
        import httpx

        # A new connection per poll: a failure is the server's, never a reused connection
        # the server had just closed.
        fresh = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.base_url, limits=fresh) as client:
            while time.perf_counter() < self.stop_at:
                self.monitor.health_polls += 1
                try:
                    r = await client.get("/health", timeout=self.o.health_timeout_s)
                    if r.status_code != 200:
                        failure = f"{r.status_code} {r.text}"
                        self.monitor.health_failures.append((self.now(), failure))
                except httpx.HTTPError as e:
                    failure = f"{type(e).__name__}: {e}"
                    self.monitor.health_failures.append((self.now(), failure))
                await asyncio.sleep(self.o.health_every)

    async def sample(self) -> None:
        """The server's RSS (from /proc, when its pid is known) and its load gauges (/metrics:
        how full the KV pools and queues got, to see that the faults reached them)."""
        import httpx

        while time.perf_counter() < self.stop_at + 1:
            mib = rss_mib(self.pid) if self.pid is not None else None
            if mib is not None:
                self.monitor.rss.append((self.now(), mib))
            try:
                m = await self.metrics()
            except httpx.HTTPError:
                m = {}
            for gauge in GAUGES:
                if gauge in m:
                    peaks = self.monitor.gauge_peaks
                    peaks[gauge] = max(peaks.get(gauge, 0.0), m[gauge])
            await asyncio.sleep(self.o.rss_every)

    async def run_faults(self, faults: list[Fault], ctx: FaultContext) -> None:
        if not faults:
            return
        await asyncio.sleep(min(self.o.fault_every, self.o.warmup_fraction * self.o.duration))
        turn = 0
        while time.perf_counter() < self.stop_at - self.o.fault_quiet_s:
            fault = faults[turn % len(faults)]
            at = self.now()
            try:
                details = await fault.inject(ctx)
                self.monitor.faults.append({"fault": fault.name, "at_s": round(at, 1), **details})
            except Exception as e:  # noqa: BLE001 - a fault that fails to inject is reported
                self.monitor.faults.append(
                    {
                        "fault": fault.name,
                        "at_s": round(at, 1),
                        "failed": f"{type(e).__name__}: {e}",
                    }
                )
            print(f"[{at:6.1f}s] fault {self.monitor.faults[-1]}", flush=True)
            turn += 1
            await asyncio.sleep(self.o.fault_every)

    async def probe_fault_route(self, ctx: FaultContext) -> None:
        """The instances an instance-failure fault may pick: those /health lists in service,
        if the soak started the server with fault injection on."""
        if not self.fault_injection:
            return
        r = await self.client.get("/health")
        if r.status_code == 200:
            ctx.failable = [x["name"] for x in r.json().get("instances", [])
                            if x.get("state") == "serving"]

    async def metrics(self) -> dict[str, float]:
        return parse_metrics((await self.client.get("/metrics", timeout=30)).text)

    async def drain(self) -> dict[str, float | None]:
        """Waits (at most --drain-s) for 0 running and 0 waiting requests on the server."""
        deadline = time.perf_counter() + self.o.drain_s
        m: dict[str, float] = {}
        while time.perf_counter() < deadline:
            m = await self.metrics()
            if not m.get("flexnpu:num_requests_running") and not m.get(
                "flexnpu:num_requests_waiting"
            ):
                break
            await asyncio.sleep(0.5)
        return {
            "running": m.get("flexnpu:num_requests_running"),
            "waiting": m.get("flexnpu:num_requests_waiting"),
        }

    async def warm_up(self) -> None:
        rng = random.Random(-1)
        for _ in range(self.o.warmup_requests):
            r, body = self.client_request(rng)
            await send(self.client, r, body, self.started)
        self.records.clear()  # not the soak's: before the baseline

    async def run(
        self, fault_names: list[str], daemon: DaemonProcess | None, log_text: str
    ) -> dict:
        import httpx

        o = self.o
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S
        )
        timeout = httpx.Timeout(o.request_timeout, connect=30)
        async with httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, limits=limits
        ) as client:
            self.client = client
            kv_tokens, instances = kv_capacity(log_text)
            ctx = FaultContext(
                self.base_url,
                client,
                o,
                random.Random(o.seed + 1),
                self.spawn,
                self.new_record,
                self.active,
                kv_tokens,
                instances,
                o.max_model_len,
                daemon,
            )
            await self.probe_fault_route(ctx)
            faults, skipped = [], {}
            for name in fault_names:
                fault = FAULTS[name]()
                why = fault.unavailable(ctx)
                if why is None:
                    faults.append(fault)
                else:
                    skipped[name] = why
                    print(f"skipped: {name}: {why}", flush=True)
            await self.warm_up()
            before = await self.metrics()
            self.started = time.perf_counter()
            self.stop_at = self.started + o.duration
            workers = [asyncio.create_task(self.client_loop(i)) for i in range(o.clients)]
            side = [
                asyncio.create_task(c)
                for c in (self.poll_health(), self.sample(), self.run_faults(faults, ctx))
            ]
            await asyncio.gather(*workers)
            ran_s = self.now()
            if self.tasks:  # fault requests still in flight
                await asyncio.wait(set(self.tasks), timeout=o.request_timeout)
            for t in side:
                t.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            drained = await self.drain()
            after = await self.metrics()
            healthy_after = (await client.get("/health")).status_code == 200
        return {
            "ran_s": ran_s,
            "faults_skipped": skipped,
            "faults_active": [f.name for f in faults],
            "kv_tokens": kv_tokens,
            "instances": instances,
            "metrics_before": before,
            "metrics_after": after,
            "drained": drained,
            "healthy_after": healthy_after,
        }


# --- the report ---------------------------------------------------------------------------------


def rss_growth(rss: list[tuple[float, float]], warmup_s: float) -> dict[str, float | None]:
    """RSS after the warm-up: the means of the first and last quarter of the samples, their
    growth, and the least-squares slope in MiB per minute."""
    after = [(s, m) for s, m in rss if s >= warmup_s]
    if len(after) < 4:
        return {"samples": len(after), "first_mib": None, "last_mib": None, "growth": None}
    q = max(1, len(after) // 4)
    first = sum(m for _, m in after[:q]) / q
    last = sum(m for _, m in after[-q:]) / q
    mean_s = sum(s for s, _ in after) / len(after)
    mean_m = sum(m for _, m in after) / len(after)
    spread = sum((s - mean_s) ** 2 for s, _ in after) or 1.0
    slope = sum((s - mean_s) * (m - mean_m) for s, m in after) / spread
    return {
        "samples": len(after),
        "first_mib": round(first, 1),
        "last_mib": round(last, 1),
        "max_mib": round(max(m for _, m in after), 1),
        "growth": (last - first) / first,
        "slope_mib_per_min": round(slope * 60, 2),
    }


def token_bounds(records: list[Record]) -> tuple[int, int | None]:
    """(fewest, most) tokens the server can have generated for these requests: exactly what
    completed ones carried (their usage when their tokens were not counted); for the others
    between what the client saw and their max_tokens (a 4xx or an overload generated none).
    None: no upper bound known."""
    low, high = 0, 0
    for r in records:
        outcome, _ = judge(r)
        if outcome in ("rejected", "refused"):
            continue
        if outcome == "completed" and (r.counts_tokens or r.usage_tokens is not None):
            exact = r.total_tokens if r.counts_tokens else r.usage_tokens or 0
            low, high = low + exact, high + exact
            continue
        low += r.total_tokens
        if r.max_tokens is None:
            return low, None
        high += r.max_tokens * r.choices
    return low, high


def invariants(
    o: argparse.Namespace, records: list[Record], mon: Monitor, run: dict, server_alive: bool
) -> tuple[dict[str, dict], dict]:
    checks: dict[str, dict] = {}
    outcomes: Counter = Counter()
    violations: list[dict] = []
    statuses: Counter = Counter()
    for r in records:
        outcome, bad = judge(r)
        outcomes[f"{r.kind}:{outcome}"] += 1
        statuses[str(r.status)] += 1
        if bad:
            violations.append(
                {
                    "body": r.body_excerpt,
                    "id": r.id,
                    "kind": r.kind,
                    "path": r.path,
                    "status": r.status,
                    "error": r.error,
                    "client_error": r.client_error,
                    "violations": bad,
                }
            )
    checks["server up throughout"] = {
        "ok": not mon.health_failures and server_alive and run["healthy_after"],
        "detail": f"{mon.health_polls} /health polls, {len(mon.health_failures)} failed "
        f"(first: {mon.health_failures[:3]}); process alive at the end: {server_alive}",
    }
    five = [v for v in violations if any("server error" in b for b in v["violations"])]
    checks["no 5xx other than a named overload"] = {"ok": not five, "detail": f"{len(five)}"}
    ended = [v for v in violations if v not in five]
    checks["every request ended once (finish reason or named error), exact k tokens"] = {
        "ok": not ended,
        "detail": f"{len(records)} requests, {len(ended)} with violations",
    }
    before, after = run["metrics_before"], run["metrics_after"]
    gen = metric_delta(before, after, "flexnpu:generation_tokens_total")
    low, high = token_bounds(records)
    checks["/metrics generation tokens within the clients' counts"] = {
        "ok": gen >= low and (high is None or gen <= high),
        "detail": f"flexnpu:generation_tokens_total +{gen:.0f}; clients: at least {low}, "
        f"at most {high}",
    }
    length_key = 'flexnpu:request_success_total{finished_reason="length"}'
    served_length = metric_delta(before, after, length_key)
    seen_length = sum(
        f == ["length"] for r in records if r.hung_up is None for f in r.finishes.values()
    )
    unsure = sum(r.choices for r in records if judge(r)[0] in ("hung-up", "lost", "named-error"))
    checks["/metrics finished 'length' within the clients' counts"] = {
        "ok": seen_length <= served_length <= seen_length + unsure,
        "detail": f"server +{served_length:.0f}; clients saw {seen_length} (+ up to {unsure} "
        "hung up, lost or failed)",
    }
    drained = run["drained"]
    checks["0 running and 0 waiting after the load"] = {
        "ok": drained["running"] == 0 and drained["waiting"] == 0,
        "detail": f"{drained}",
    }
    rss = rss_growth(mon.rss, o.warmup_fraction * o.duration)
    checks[f"RSS growth after warm-up < {o.max_rss_growth:.0%}"] = {
        "ok": rss["growth"] is None or rss["growth"] < o.max_rss_growth,
        "detail": f"{rss}" + (" (too few samples: not checked)" if rss["growth"] is None else ""),
    }
    facts = {
        "outcomes": dict(sorted(outcomes.items())),
        "statuses": dict(sorted(statuses.items())),
        "violations": violations[:50],
        "violations_total": len(violations),
        "rss": rss,
        "gauge_peaks": mon.gauge_peaks,
        "rss_samples": [(round(t, 1), round(m, 1)) for t, m in mon.rss],
        "client_tokens": sum(r.total_tokens for r in records),
        "generation_tokens_delta": gen,
    }
    return checks, facts


def record_json(r: Record) -> dict:
    doc = asdict(r)
    doc["tokens"] = dict(r.tokens)  # asdict rebuilds a Counter from its (key, value) pairs
    doc["outcome"], doc["violations"] = judge(r)
    return doc


def write_report(out: Path, doc: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    lines = [
        f"# Soak {doc['when']}",
        "",
        f"`{doc['command']}`",
        "",
        f"{doc['config']}",
        "",
        "| invariant | ok | detail |",
        "|---|---|---|",
    ]
    for name, c in doc["invariants"].items():
        lines.append(f"| {name} | {'PASS' if c['ok'] else 'FAIL'} | {c['detail']} |")
    facts = doc["facts"]
    lines += [
        "",
        f"Outcomes: {facts['outcomes']}",
        "",
        f"HTTP statuses: {facts['statuses']}",
        "",
        f"Peaks of the server's gauges: {facts['gauge_peaks']}",
        "",
        "Faults injected:",
        "",
    ]
    lines += [f"- {f}" for f in doc["faults"]] or ["- none"]
    lines += [f"- skipped: {k}: {v}" for k, v in doc["faults_skipped"].items()]
    if facts["violations"]:
        lines += ["", f"Violations ({facts['violations_total']}, first 50):", ""]
        lines += [f"- {v}" for v in facts["violations"]]
    if doc["server_tracebacks"]:
        lines += ["", "Server tracebacks:", ""]
        lines += [f"```\n{t}\n```" for t in doc["server_tracebacks"]]
    (out / "soak.md").write_text("\n".join(lines) + "\n")


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=None, help="report directory (soak.json, soak.md)")
    p.add_argument(
        "--fuzz",
        type=int,
        default=0,
        metavar="N",
        help="instead of the soak: N generated requests (bench/fuzz_api.py)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fuzz-concurrency", type=int, default=8, help="fuzzed requests in flight at once"
    )
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default=None, help="a running server (default: start one)")
    s.add_argument("--server-pid", type=int, default=None, help="its pid, for RSS")
    s.add_argument(
        "--backend",
        default="emulate:910c",
        help="FLEXNPU_BACKEND of the server it starts; cpu: the XLA CPU plugin",
    )
    s.add_argument(
        "--backend-options",
        default="device_count=8;time_scale=4",
        help="FLEXNPU_BACKEND_OPTIONS (';'-separated)",
    )
    s.add_argument("--model", default="random:qwen2.5-7b")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--max-model-len", type=int, default=1024)
    s.add_argument("--max-num-seqs", type=int, default=8)
    s.add_argument("--num-kv-blocks", type=int, default=64, help="per device (0: serve's default)")
    s.add_argument("--max-waiting", type=int, default=32)
    s.add_argument("--serve-arg", action="append", default=[], help="one more serve argument")
    s.add_argument(
        "--daemon",
        action="store_true",
        help="serve over a `flexnpu daemon` the soak starts (for daemon-restart)",
    )
    s.add_argument(
        "--ray-node-pid",
        type=int,
        action="append",
        default=[],
        help="pids the ray-node-kill fault may SIGKILL, in turn",
    )
    s.add_argument("--startup-timeout", type=float, default=900.0)
    c = p.add_argument_group("clients")
    c.add_argument("--clients", type=int, default=16)
    c.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    c.add_argument("--min-tokens", type=int, default=8, help="fewest output tokens k")
    c.add_argument("--max-tokens", type=int, default=48, help="most output tokens k")
    c.add_argument("--prompt-words", type=int, default=24)
    c.add_argument("--chat-fraction", type=float, default=0.4)
    c.add_argument("--plain-fraction", type=float, default=0.1, help="stream=false requests")
    c.add_argument("--n2-fraction", type=float, default=0.1, help="completions with n=2")
    c.add_argument("--backoff-s", type=float, default=0.5, help="wait after a 503/429")
    c.add_argument("--request-timeout", type=float, default=600.0, help="client side, seconds")
    c.add_argument("--warmup-requests", type=int, default=4)
    f = p.add_argument_group("faults")
    f.add_argument(
        "--faults",
        default=DEFAULT_FAULTS,
        help=f"comma-separated, from {', '.join(FAULTS)} ('' for none)",
    )
    f.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults")
    f.add_argument(
        "--fault-quiet-s", type=float, default=10.0, help="no fault in the last seconds of the load"
    )
    f.add_argument("--storm-fraction", type=float, default=0.5)
    f.add_argument("--long-requests", type=int, default=0, help="kv-exhaustion (0: 1.5x KV)")
    f.add_argument("--long-output-tokens", type=int, default=64)
    f.add_argument("--huge-body-mb", type=float, default=2.0)
    f.add_argument("--fuzz-bodies", type=int, default=16, help="mutated bodies per bad-http")
    f.add_argument("--slow-client-s", type=float, default=8.0)
    m = p.add_argument_group("checks")
    m.add_argument("--health-every", type=float, default=0.5)
    m.add_argument("--health-timeout-s", type=float, default=10.0)
    m.add_argument("--rss-every", type=float, default=2.0)
    m.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.4,
        help="RSS samples in this first part of the load are the warm-up (the allocator's "
        "high-water mark comes after a few rounds of every fault: 10 minutes of faults every "
        "10 s swung between 584 and 773 MiB for 250 s, then held at 710 +- 3)",
    )
    m.add_argument("--max-rss-growth", type=float, default=0.10)
    m.add_argument("--drain-s", type=float, default=60.0)
    m.add_argument("--print-violations", type=int, default=20, help="print the first N at once")
    o = p.parse_args(argv)
    unknown = [x for x in o.faults.split(",") if x and x not in FAULTS]
    if unknown:
        p.error(f"--faults: unknown {unknown}; known: {', '.join(FAULTS)}")
    if o.base_url is not None and urllib.parse.urlsplit(o.base_url).hostname not in LOOPBACK:
        p.error(f"--base-url {o.base_url}: the soak only talks to loopback ({', '.join(LOOPBACK)})")
    if not 1 <= o.min_tokens <= o.max_tokens:
        p.error("--min-tokens must be in [1, --max-tokens]")
    return o


def start_soak_server(
    o: argparse.Namespace, fault_names: list[str]
) -> tuple[ServeProcess | None, DaemonProcess | None]:
    """The server (and with --daemon the daemon under it) the options describe, up; (None, None)
    with --base-url. SystemExit(2) if it does not start."""
    if o.base_url is not None:
        return None, None
    workdir = Path(tempfile.mkdtemp(prefix="flexnpu-soak-"))
    env = server_env(o, fault_names)
    daemon = None
    if o.daemon:
        sock = workdir / "daemon.sock"
        daemon = DaemonProcess(sock, workdir / "daemon.log", env, o.backend, o.backend_options)
        daemon.start()
        env = {**env, "FLEXNPU_BACKEND": f"daemon:{sock}"}
        env.pop("FLEXNPU_BACKEND_OPTIONS", None)
    args = serve_args(o)
    print(f"starting flexnpu serve {' '.join(args)} (log {workdir}/serve.log)", flush=True)
    try:
        server = start_server(args, env=env, log=workdir / "serve.log", timeout_s=o.startup_timeout)
    except ServerStartError as e:
        if daemon is not None:
            daemon.stop()
        print(e, file=sys.stderr)
        raise SystemExit(2) from None
    return server, daemon


def soak(o: argparse.Namespace, argv: list[str]) -> int:
    fault_names = [x for x in o.faults.split(",") if x]
    server, daemon = start_soak_server(o, fault_names)
    base_url = server.base_url if server else o.base_url
    pid = server.pid if server else o.server_pid
    log_text = server.output_tail(10**6) if server else ""
    runner = Soak(o, base_url, pid)
    try:
        run = asyncio.run(runner.run(fault_names, daemon, log_text))
        alive = server.alive() if server else True
    finally:
        if server is not None:
            server.stop()
        if daemon is not None:
            daemon.stop()
    log_text = server.output_tail(10**7) if server else ""
    checks, facts = invariants(o, runner.records, runner.monitor, run, alive)
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python -m bench.soak " + " ".join(argv),
        "config": {k: v for k, v in vars(o).items() if k != "out"}
        | {
            "ran_s": round(run["ran_s"], 1),
            "kv_tokens": run["kv_tokens"],
            "instances": run["instances"],
            "load_average": os.getloadavg()[0],
        },
        "invariants": checks,
        "ok": all(c["ok"] for c in checks.values()),
        "facts": facts,
        "faults": runner.monitor.faults,
        "faults_skipped": run["faults_skipped"],
        "server_exit": server.proc.returncode if server else None,
        "server_log": str(server.log) if server else None,
        "server_tracebacks": tracebacks(log_text),
        "records": [record_json(r) for r in runner.records] if o.out else [],
    }
    if o.out:
        write_report(o.out, doc)
    print_summary(doc)
    return 0 if doc["ok"] else 1


def print_summary(doc: dict) -> None:
    f = doc["facts"]
    print("=" * 72)
    print(
        f"{len(doc['records']) or sum(f['outcomes'].values())} requests in "
        f"{doc['config']['ran_s']} s; outcomes {f['outcomes']}"
    )
    print(f"statuses {f['statuses']}; faults injected {Counter(x['fault'] for x in doc['faults'])}")
    print(f"peaks of the server's gauges: {f['gauge_peaks']}")
    for name, why in doc["faults_skipped"].items():
        print(f"skipped: {name}: {why}")
    for v in f["violations"][:10]:
        print(f"violation: {v}")
    for t in doc["server_tracebacks"][:3]:
        print(f"server traceback:\n{t}")
    for name, c in doc["invariants"].items():
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {name}: {c['detail']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    o = parse_args(argv)
    if o.fuzz:
        from bench import fuzz_api

        return fuzz_api.campaign(o, argv)
    return soak(o, argv)


if __name__ == "__main__":
    sys.exit(main())
