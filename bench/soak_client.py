"""The soak's client side (bench/soak.py): one request sent and read to its end, and what it
must have looked like. Every request is a Record; `judge` names what broke an invariant.

Token counting: the text of a stream cannot count tokens (a byte-level tokenizer merges or holds
back bytes, and special tokens have no text), so every soak request asks for logprobs and each
chunk's token list is counted (completions: logprobs.tokens; chat: logprobs.content), beside
usage.completion_tokens."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Idle connections are dropped by the client before uvicorn's keep-alive timeout (5 s) closes
# them: a request sent on a connection the server is closing fails with "Server disconnected
# without sending a response" (seen once in 10 minutes of 0.5 s /health polls), not the
# server's fault.
KEEPALIVE_S = 2.0

# Statuses that are a named refusal under overload, not a failure: 429, and 503 saying the
# server is at capacity (its queue is full). A 503 for a failed engine is a server error.
OVERLOAD_STATUSES = (429, 503)


def is_overload(status: int | None, error: str | None) -> bool:
    return status == 429 or (status == 503 and "at capacity" in (error or ""))


@dataclass
class Record:
    """One HTTP request of the soak and how it ended."""

    id: int
    kind: str  # who sent it: "client", "long" (KV exhaustion), "bad-http", ...
    path: str
    stream: bool
    choices: int = 1  # prompts x n
    expected_tokens: int | None = None  # per choice, when the output length is fixed
    max_tokens: int | None = None  # per choice: the most the server may generate
    sent_s: float = 0.0
    ended_s: float | None = None
    status: int | None = None
    finishes: dict[int, list[str]] = field(default_factory=dict)  # choice -> finish reasons
    tokens: Counter = field(default_factory=Counter)  # choice -> tokens seen (logprobs)
    usage_tokens: int | None = None
    done_markers: int = 0
    events_after_done: int = 0
    error: str | None = None  # a named error from the server (status body or error event)
    client_error: str | None = None  # what the client saw go wrong (reset, timeout, ...)
    hung_up: str | None = None  # why the client hung up on purpose ("storm", ...)
    token_offsets_ok: bool = True  # completions' text_offset never went backwards
    # Whether its tokens can be counted (it asked for logprobs); not for fuzzed bodies.
    counts_tokens: bool = True
    body_excerpt: str | None = None  # what was sent, for the faults' requests

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())


def judge(r: Record) -> tuple[str, list[str]]:
    """(outcome, violations) of a finished record. Outcomes: completed, hung-up, rejected
    (503/429 with an OpenAI error), refused (4xx with one), named-error (an error event or an
    error status the server named), lost."""
    bad: list[str] = []
    if r.hung_up is not None:
        over = [i for i, n in r.tokens.items() if r.max_tokens and n > r.max_tokens]
        if over:
            bad.append(f"more tokens than max_tokens on choices {over} before hanging up")
        return "hung-up", bad
    if r.client_error is not None:
        return "lost", [f"lost: {r.client_error}"]
    if r.status is None:
        return "lost", ["lost: no status"]
    if r.status != 200:
        if r.error is None:
            bad.append(f"HTTP {r.status} without an OpenAI-shaped error body")
        if is_overload(r.status, r.error):
            return "rejected", bad
        if r.status >= 500:
            bad.append(f"server error {r.status}: {r.error}")
        return ("refused" if r.status < 500 else "named-error"), bad
    if r.stream:
        if r.done_markers != 1:
            bad.append(f"{r.done_markers} [DONE] markers")
        if r.events_after_done:
            bad.append(f"{r.events_after_done} events after [DONE]")
    if not r.token_offsets_ok:
        bad.append("text_offset went backwards (a token repeated?)")
    if r.error is not None:  # an error event in the stream: the request ended, named
        twice = [i for i, f in r.finishes.items() if f]
        if twice:
            bad.append(f"an error event after finish reasons on choices {twice}")
        return "named-error", bad
    for i in range(r.choices):
        reasons = r.finishes.get(i, [])
        if len(reasons) != 1:
            bad.append(f"choice {i} ended {len(reasons)} times ({reasons})")
    if not r.counts_tokens:
        return "completed", bad
    if r.expected_tokens is not None:
        for i in range(r.choices):
            reasons = r.finishes.get(i, [])
            if reasons == ["length"] and r.tokens[i] != r.expected_tokens:
                bad.append(f"choice {i}: {r.tokens[i]} tokens streamed, {r.expected_tokens} asked")
            if reasons and reasons != ["length"]:
                bad.append(f"choice {i} finished {reasons[0]!r}, not 'length' at a fixed length")
        want = r.expected_tokens * r.choices
        if r.usage_tokens is not None and r.usage_tokens != want:
            bad.append(f"usage.completion_tokens {r.usage_tokens}, {want} asked")
    if r.usage_tokens is not None and r.usage_tokens != r.total_tokens:
        bad.append(f"usage.completion_tokens {r.usage_tokens} != {r.total_tokens} streamed")
    return "completed", bad


def _error_message(payload: Any) -> str | None:
    """The message of an OpenAI-shaped error body, else None."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        message = payload["error"].get("message")
        if isinstance(message, str) and message:
            return message
    return None


def _count_choice(r: Record, chat: bool, c: dict) -> None:
    index = c.get("index", 0)
    lp = c.get("logprobs") or {}
    if chat:
        r.tokens[index] += len(lp.get("content") or ())
    else:
        r.tokens[index] += len(lp.get("tokens") or ())
        offsets = lp.get("text_offset") or []
        if any(b < a for a, b in zip(offsets, offsets[1:], strict=False)):
            r.token_offsets_ok = False
    if c.get("finish_reason"):
        r.finishes.setdefault(index, []).append(c["finish_reason"])


def _read_event(r: Record, chat: bool, data: str) -> None:
    if r.done_markers:
        r.events_after_done += 1
        return
    if data == "[DONE]":
        r.done_markers += 1
        return
    event = json.loads(data)
    if (message := _error_message(event)) is not None:
        r.error = message
        return
    for c in event.get("choices") or ():
        _count_choice(r, chat, c)
    if event.get("usage"):
        r.usage_tokens = event["usage"].get("completion_tokens")


def encode_body(body: dict | bytes) -> bytes:
    """The request's bytes: JSON as Python writes it (NaN and lone surrogates escaped, which
    httpx's own encoder refuses), or raw bytes as given."""
    return body if isinstance(body, bytes) else json.dumps(body).encode()


async def send(client: Any, r: Record, body: dict | bytes, started: float) -> Record:
    """Sends `body` to r.path with an httpx.AsyncClient and fills `r` in until the response
    ends. A CancelledError with r.hung_up set is the client hanging up on purpose (the
    connection is closed as the stream's context exits); it ends the record, not the caller."""
    import httpx

    chat = r.path.endswith("/chat/completions")
    r.sent_s = time.perf_counter() - started
    try:
        headers = {"content-type": "application/json"}
        async with client.stream(
            "POST", r.path, content=encode_body(body), headers=headers
        ) as resp:
            r.status = resp.status_code
            if resp.status_code == 200:  # a fuzzed body may have asked for a stream or not
                r.stream = resp.headers.get("content-type", "").startswith("text/event-stream")
            if resp.status_code != 200 or not r.stream:
                raw = await resp.aread()
                try:
                    payload = json.loads(raw)
                except ValueError:
                    payload = None
                r.error = _error_message(payload)
                if resp.status_code == 200 and isinstance(payload, dict):
                    for c in payload.get("choices") or ():
                        _count_choice(r, chat, c)
                    r.usage_tokens = (payload.get("usage") or {}).get("completion_tokens")
            else:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        _read_event(r, chat, line[6:])
    except asyncio.CancelledError:
        if r.hung_up is None:
            raise
    except (httpx.HTTPError, ValueError, OSError) as e:  # ValueError: an event not JSON
        if r.hung_up is None:
            r.client_error = f"{type(e).__name__}: {e}"[:300]
    r.ended_s = time.perf_counter() - started
    return r
