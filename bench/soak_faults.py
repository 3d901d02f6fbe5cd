"""The soak's faults (bench/soak.py), one class each, injected on a schedule. A fault says
whether it can run against this server (`unavailable`: None, or why not: the soak then prints
"skipped: NAME: why" and leaves it out) and injects itself (`inject`: what it did, for the
report). Add one by subclassing Fault and listing it in FAULTS."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from bench.soak_client import Record

# Values that are wrong for most OpenAI fields; the bad-HTTP fault puts them in valid bodies.
NASTY_VALUES: tuple[Any, ...] = (
    None,
    -1,
    0,
    2**64,
    1e308,
    -1e308,
    "",
    "x" * 5000,
    [],
    {},
    [None],
    {"a": {"b": []}},
    True,
    float("nan"),
    3.5,
    [1, 2, 3],
    [[1], []],
    "\udcff lone surrogate",
    "\x00",
    -0.0,
)
MUTATED_FIELDS = (
    "prompt",
    "messages",
    "max_tokens",
    "min_tokens",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "ignore_eos",
    "skip_special_tokens",
    "model",
    "logit_bias",
    "echo",
    "response_format",
    "max_completion_tokens",
    "add_generation_prompt",
    "chat_template_kwargs",
)


@dataclass
class FaultContext:
    """What faults act on: the soak's server and client, and where requests are recorded."""

    base_url: str
    client: Any  # httpx.AsyncClient on base_url
    options: Any  # the soak's argparse.Namespace
    rng: random.Random
    spawn: Any  # (Record, body) -> asyncio.Task: sends a request, recorded in the ledger
    new_record: Any  # (kind, path, stream, **fields) -> Record
    active: dict[int, tuple[Record, asyncio.Task]]  # requests in flight
    kv_tokens: int | None = None  # KV positions of all instances together (None: unknown)
    instances: int = 1
    max_model_len: int = 1024
    daemon: Any = None  # soak.DaemonProcess when the soak started the server over a daemon
    # The names of the engine instances in service (GET /health), when the server takes
    # POST /debug/fail-instance/{name} (started with FLEXNPU_FAULT_INJECTION=1); else empty.
    failable: list[str] = field(default_factory=list)
    background: set[asyncio.Task] = field(default_factory=set)  # the slow clients


class Fault:
    name = "fault"

    def unavailable(self, ctx: FaultContext) -> str | None:
        return None

    async def inject(self, ctx: FaultContext) -> dict:
        raise NotImplementedError


class DisconnectStorm(Fault):
    """A fraction of the clients streaming now hang up at once, mid-stream."""

    name = "disconnect-storm"

    async def inject(self, ctx: FaultContext) -> dict:
        streaming = [
            (r, task)
            for r, task in ctx.active.values()
            if r.kind == "client" and r.stream and r.status == 200 and not task.done()
        ]
        chosen = ctx.rng.sample(streaming, round(len(streaming) * ctx.options.storm_fraction))
        for r, task in chosen:
            r.hung_up = "storm"
            task.cancel()
        return {"streaming": len(streaming), "hung_up": len(chosen)}


def _token_prompt(rng: random.Random, length: int) -> list[int]:
    """A prompt of exactly `length` token ids, printable ASCII bytes (ids every tokenizer the
    soak meets has: the byte-level one's and SmolLM2's)."""
    return [rng.randint(33, 126) for _ in range(length)]


class KvExhaustion(Fault):
    """Long fixed-length requests whose prompts and outputs together need 1.5x the KV pool of
    every instance: admission by KV usage, preemption by recompute, and (with a small
    --max-waiting) 503s. Each is checked like the clients' (exactly k tokens)."""

    name = "kv-exhaustion"

    def unavailable(self, ctx: FaultContext) -> str | None:
        if not ctx.kv_tokens and not ctx.options.long_requests:
            return "the KV pool size is unknown (not the soak's own server): pass --long-requests"
        return None

    async def inject(self, ctx: FaultContext) -> dict:
        per_request = ctx.max_model_len - 1
        output = max(1, min(per_request // 2, ctx.options.long_output_tokens))
        prompt = per_request - output
        count = ctx.options.long_requests or -(-int(1.5 * (ctx.kv_tokens or 0)) // per_request)
        for _ in range(count):
            body = {
                "prompt": _token_prompt(ctx.rng, prompt),
                "max_tokens": output,
                "min_tokens": output,
                "ignore_eos": True,
                "logprobs": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            r = ctx.new_record(
                "long", "/v1/completions", True, expected_tokens=output, max_tokens=output
            )
            ctx.spawn(r, body)
        return {"requests": count, "prompt_tokens": prompt, "output_tokens": output}


def mutated_body(rng: random.Random, chat: bool) -> dict:
    """A valid small request with 1-3 fields set to something wrong (or odd but valid)."""
    body: dict[str, Any] = {"max_tokens": 4, "min_tokens": 4, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    for key in rng.sample(MUTATED_FIELDS, rng.randint(1, 3)):
        body[key] = rng.choice(NASTY_VALUES)
    return body


async def _raw_exchange(ctx: FaultContext, payload: bytes, hold_s: float, dribble: bool) -> str:
    """Opens a TCP connection to the server, sends `payload` (a byte every 0.25 s when
    `dribble`), holds the connection for `hold_s` without reading, closes it; returns the
    first line of what the server had answered by then."""
    host, port = ctx.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        deadline = time.monotonic() + hold_s
        if dribble:
            for b in payload:
                if time.monotonic() > deadline:
                    break
                writer.write(bytes([b]))
                await writer.drain()
                await asyncio.sleep(0.25)
        else:
            writer.write(payload)
            await writer.drain()
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        try:
            first = await asyncio.wait_for(reader.readline(), 0.5)
        except (TimeoutError, ConnectionError):
            first = b""
        return first.decode(errors="replace").strip()
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


def _http_request(path: str, body: bytes, content_length: int | None = None) -> bytes:
    length = len(body) if content_length is None else content_length
    head = (
        f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    return head.encode() + body


class BadHttp(Fault):
    """Bad HTTP at once: broken and wrongly typed JSON, OpenAI fields set to wrong values, a huge
    body, a huge token-id prompt, and slow clients that hold connections (a body dribbled a byte
    at a time, a connection that says nothing, a stream never read). None may get a 5xx other
    than a named overload; the server must stay healthy."""

    name = "bad-http"

    async def inject(self, ctx: FaultContext) -> dict:
        o, rng = ctx.options, ctx.rng
        bodies: list[tuple[str, Any]] = [
            ("/v1/completions", b"{not json"),
            ("/v1/completions", b'{"prompt": "truncated'),
            ("/v1/chat/completions", b"[1, 2, 3]"),
            ("/v1/completions", b"\xff\xfe\x00garbage"),
            ("/v1/completions", b""),
            ("/v1/completions", {"prompt": "x" * int(o.huge_body_mb * 2**20), "max_tokens": 1}),
            ("/v1/completions", {"prompt": [65] * 200_000, "max_tokens": 1}),
        ]
        bodies += [
            (path, mutated_body(rng, path.endswith("chat/completions")))
            for path in rng.choices(["/v1/completions", "/v1/chat/completions"], k=o.fuzz_bodies)
        ]
        for path, body in bodies:
            r = ctx.new_record(
                "bad-http", path, False, max_tokens=ctx.max_model_len, counts_tokens=False
            )
            ctx.spawn(r, body)
        # (body, max tokens it may generate, dribbled): the server may generate for those it
        # reads whole, unseen by the client, so each is a record whose tokens bound /metrics.
        stream = {"prompt": "slow reader", "max_tokens": 64, "ignore_eos": True, "stream": True}
        slow: list[tuple[bytes, int, bool]] = [
            (_http_request("/v1/completions", b'{"prompt": "dribbled"}'), 16, True),
            (b"", 0, False),  # a connection that says nothing
            (_http_request("/v1/completions", json.dumps(stream).encode()), 64, False),
            (_http_request("/v1/completions", b"{}", content_length=10**6), 16, False),
        ]
        for payload, max_tokens, dribble in slow:
            ctx.new_record(
                "slow-client", "/v1/completions", False, max_tokens=max_tokens,
                counts_tokens=False, hung_up="slow client",
            )  # fmt: skip
            task = asyncio.get_running_loop().create_task(  # holds its connection a while
                _raw_exchange(ctx, payload, o.slow_client_s, dribble)
            )
            ctx.background.add(task)  # a reference, or the loop may drop the task
            task.add_done_callback(ctx.background.discard)
        return {"bad_bodies": len(bodies), "slow_clients": len(slow)}


class InstanceFailure(Fault):
    """An engine instance fails (through the server's fault hook, FLEXNPU_FAULT_INJECTION=1):
    the engine's isolation must restart it while the others serve."""

    name = "instance-failure"

    def unavailable(self, ctx: FaultContext) -> str | None:
        if not ctx.failable:
            return (
                "the server takes no POST /debug/fail-instance (start it with "
                "FLEXNPU_FAULT_INJECTION=1), or /health lists no instance in service"
            )
        return None

    async def inject(self, ctx: FaultContext) -> dict:
        instance = ctx.rng.choice(ctx.failable)
        r = await ctx.client.post(f"/debug/fail-instance/{instance}")
        return {"instance": instance, "status": r.status_code, "answer": r.text[:300]}


class DaemonRestart(Fault):
    """The daemon under the server is stopped and started again on the same socket."""

    name = "daemon-restart"

    def unavailable(self, ctx: FaultContext) -> str | None:
        if ctx.daemon is None:
            return "the server does not run over a daemon the soak started (--daemon)"
        return None

    async def inject(self, ctx: FaultContext) -> dict:
        seconds = await asyncio.to_thread(ctx.daemon.restart)
        return {"restarted_in_s": round(seconds, 2)}


class RayNodeKill(Fault):
    """A Ray node dies: SIGKILL to the next of the --ray-node-pid processes (e.g. a worker node's
    raylet of the cluster the server runs on with --ray)."""

    name = "ray-node-kill"

    def unavailable(self, ctx: FaultContext) -> str | None:
        if not ctx.options.ray_node_pid:
            return (
                "no --ray-node-pid given (serve with --ray over a cluster and pass the pids "
                "of worker nodes' raylets)"
            )
        return None

    async def inject(self, ctx: FaultContext) -> dict:
        if not ctx.options.ray_node_pid:
            return {"killed": False, "why": "every --ray-node-pid was killed already"}
        pid = ctx.options.ray_node_pid.pop(0)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return {"pid": pid, "killed": False}
        return {"pid": pid, "killed": True}


FAULTS: dict[str, type[Fault]] = {
    f.name: f
    for f in (DisconnectStorm, KvExhaustion, BadHttp, InstanceFailure, DaemonRestart, RayNodeKill)
}
