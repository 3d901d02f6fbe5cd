"""Load test: N concurrent streaming clients against the OpenAI server on loopback for a bounded
time (and at most --max-requests), then it stops by itself and checks:

- nothing dropped: every request either finished (a finish_reason, usage with the asked token
  count, then `data: [DONE]`) or was rejected with an OpenAI-shaped 503 (queue full); a client
  that hangs up on purpose (--disconnect-fraction) is counted apart;
- nothing leaked: once the clients stop, the server reports 0 running and 0 waiting requests;
- memory flat: the server's RSS (process_resident_memory_bytes on /metrics), sampled every
  --sample-s seconds, grows by less than --max-rss-growth over the run after the warm-up.

    python -m bench.load_test --clients 200 --duration 300            # starts its own server
    python -m bench.load_test --base-url http://127.0.0.1:8000 ...     # or tests a running one

The server it starts is `python -m flexnpu serve --model random:tiny` with a small
--max-waiting, so that 200 clients overflow the queue and the 503 path is exercised too.
Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import ServeProcess, ServerStartError
from bench.common import start_server as start_server_process


@dataclass
class Tally:
    finished: int = 0
    rejected_503: int = 0
    disconnected: int = 0  # hung up on purpose
    dropped: int = 0  # anything else: a bug
    tokens: int = 0
    drops: Counter = field(default_factory=Counter)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (seconds, MiB)


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[-1])
    return None


async def one(client, rng: random.Random, args, t: Tally) -> None:
    out_len = rng.randint(args.min_tokens, args.max_tokens)
    chat = rng.random() < args.chat_fraction
    body: dict = {
        "max_tokens": out_len,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "temperature": rng.choice([0.0, 0.8]),
    }
    prompt = " ".join(
        rng.choice(("load", "test", "tokens", "stream", "flex", "npu"))
        for _ in range(rng.randint(1, args.max_prompt_words))
    )
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    hang_up_after = rng.randint(1, 4) if rng.random() < args.disconnect_fraction else None
    path = "/v1/chat/completions" if chat else "/v1/completions"
    finish, done, usage, chunks = None, False, None, 0
    try:
        async with client.stream("POST", path, json=body) as r:
            if r.status_code == 503:
                err = json.loads(await r.aread()).get("error", {})
                if err.get("code") == 503 and err.get("message"):
                    t.rejected_503 += 1
                else:
                    t.dropped += 1
                    t.drops["503 without an OpenAI error body"] += 1
                await asyncio.sleep(args.backoff_s)
                return
            if r.status_code != 200:
                t.dropped += 1
                text = (await r.aread()).decode(errors="replace")
                t.drops[f"HTTP {r.status_code}: {text[:80]}"] += 1
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                try:
                    d = json.loads(data)
                except json.JSONDecodeError:
                    t.dropped += 1
                    t.drops[f"an event that is not JSON: {data[:60]!r}"] += 1
                    return
                if "error" in d:
                    t.dropped += 1
                    t.drops[f"error event: {d['error'].get('message', '')[:60]}"] += 1
                    return
                for c in d.get("choices") or ():
                    chunks += 1
                    finish = c.get("finish_reason") or finish
                if d.get("usage"):
                    usage = d["usage"]
                if hang_up_after is not None and chunks >= hang_up_after:
                    t.disconnected += 1
                    return  # leaving the block closes the connection
    except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
        t.dropped += 1
        t.drops[type(e).__name__] += 1
        return
    if done and finish == "length" and usage and usage["completion_tokens"] == out_len:
        t.finished += 1
        t.tokens += out_len
    else:
        t.dropped += 1
        t.drops[f"incomplete stream (finish={finish}, done={done}, usage={usage})"] += 1


async def run_clients(args, base: str, t: Tally) -> float:
    import httpx

    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=0)
    stop_at = time.perf_counter() + args.duration
    issued = 0

    async def client_loop(i: int, client) -> None:
        nonlocal issued
        rng = random.Random(args.seed * 100003 + i)
        while time.perf_counter() < stop_at and issued < args.max_requests:
            issued += 1
            await one(client, rng, args, t)

    async def sample_rss(client) -> None:
        t0 = time.perf_counter()
        while time.perf_counter() < stop_at:
            try:
                text = (await client.get("/metrics", timeout=10)).text
                rss = _metric(text, "process_resident_memory_bytes")
                if rss is not None:
                    t.rss.append((time.perf_counter() - t0, rss / 2**20))
            except Exception:  # noqa: BLE001 - a missed sample is not a failure
                pass
            await asyncio.sleep(args.sample_s)

    async with httpx.AsyncClient(
        base_url=base, timeout=httpx.Timeout(args.timeout), limits=limits
    ) as client:
        t0 = time.perf_counter()
        sampler = asyncio.create_task(sample_rss(client))
        await asyncio.gather(*(client_loop(i, client) for i in range(args.clients)))
        elapsed = time.perf_counter() - t0
        sampler.cancel()
    return elapsed


def start_server(args) -> ServeProcess:
    serve_args = [
        "--model",
        args.model,
        "--max-model-len",
        "512",
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        "64",
        "--max-waiting",
        str(args.max_waiting),
    ]
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "flexnpu")}
    try:
        return start_server_process(serve_args, env=env, timeout_s=600)
    except ServerStartError as e:
        raise SystemExit(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", default=None, help="a running server (default: start one)")
    p.add_argument("--model", default="random:tiny", help="model of the server it starts")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-waiting", type=int, default=16)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    p.add_argument("--max-requests", type=int, default=1_000_000)
    p.add_argument("--min-tokens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument(
        "--max-prompt-words",
        type=int,
        default=40,
        help="prompt words (the tiny model's byte tokenizer: ~7 tokens a word)",
    )
    p.add_argument("--chat-fraction", type=float, default=0.5)
    p.add_argument("--disconnect-fraction", type=float, default=0.05)
    p.add_argument("--backoff-s", type=float, default=0.2, help="wait after a 503")
    p.add_argument("--timeout", type=float, default=120.0, help="per request (client side)")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.2,
        help="RSS samples in this first part of the run are the warm-up",
    )
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", default=None)
    args = p.parse_args(argv)

    import httpx

    server = None
    base = args.base_url
    if base is None:
        print(f"starting python -m flexnpu serve --model {args.model} ...", flush=True)
        server = start_server(args)
        base = server.base_url
    t = Tally()
    try:
        elapsed = asyncio.run(run_clients(args, base, t))
        deadline = time.time() + 30  # what the server still holds must drain
        running = waiting = None
        while time.time() < deadline:
            text = httpx.get(base + "/metrics", timeout=10).text
            running = _metric(text, "flexnpu:num_requests_running")
            waiting = _metric(text, "flexnpu:num_requests_waiting")
            if running == 0 and waiting == 0:
                break
            time.sleep(0.5)
        healthy = httpx.get(base + "/health", timeout=10).status_code == 200
    finally:
        if server is not None:
            server.stop()

    after = [m for s, m in t.rss if s >= args.warmup_fraction * args.duration]
    base_rss, last_rss = (after[0], after[-1]) if after else (0.0, 0.0)
    growth = (last_rss - base_rss) / base_rss if base_rss else float("nan")
    total = t.finished + t.rejected_503 + t.disconnected + t.dropped
    checks = {
        "0 dropped": t.dropped == 0,
        "0 running and 0 waiting after the load": running == 0 and waiting == 0,
        "healthy after the load": healthy,
        f"RSS growth after warm-up < {args.max_rss_growth:.0%}": bool(after)
        and growth < args.max_rss_growth,
    }
    print("=" * 60)
    print(f"{args.clients} concurrent streaming clients for {elapsed:.0f} s on {base}")
    print(
        f"requests {total}: finished {t.finished}, rejected 503 {t.rejected_503}, "
        f"hung up on purpose {t.disconnected}, dropped {t.dropped}"
    )
    print(f"throughput {t.finished / elapsed:.1f} req/s, {t.tokens / elapsed:.0f} tok/s")
    if t.drops:
        print("drops:", dict(t.drops.most_common(5)))
    if t.rss:
        print(
            f"server RSS MiB: first {t.rss[0][1]:.0f}, after warm-up {base_rss:.0f}, "
            f"max {max(m for _, m in t.rss):.0f}, last {last_rss:.0f} "
            f"(growth {growth:+.1%}, {len(t.rss)} samples)"
        )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(
                {
                    "clients": args.clients,
                    "duration_s": elapsed,
                    "finished": t.finished,
                    "rejected_503": t.rejected_503,
                    "disconnected": t.disconnected,
                    "dropped": t.dropped,
                    "drops": dict(t.drops),
                    "tokens": t.tokens,
                    "rss_mib": t.rss,
                    "rss_growth": growth,
                    "checks": checks,
                },
                f,
                indent=1,
            )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
