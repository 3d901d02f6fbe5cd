"""A request's generation as it happens: its engine requests' deltas brought onto the event
loop (Run: the client's disconnect or the request timeout aborts them), and, for stream=true,
the SSE events built from them, ending with `data: [DONE]` (a choice aborted while its client
is still there, by the server's shutdown, ends with finish_reason "abort")."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from fastapi import Request

from flexnpu.serving.engine_client import EngineClient
from flexnpu.serving.openai_protocol import (
    APIError,
    Choice,
    ResponseFormat,
    engine_error,
    finish_error,
)
from flexnpu.serving.output import Delta, TextOutput
from flexnpu.serving.tokenizer import Tokenizer

DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there
TIMEOUT_GRACE_S = 5.0  # past its deadline, a request the engine has not finished is ended here


class RunContext(Protocol):
    """What a Run needs of the server (serving.server.ServerState has it)."""

    engine: EngineClient
    tokenizer: Tokenizer
    eos_ids: tuple[int, ...] | None
    request_timeout: float | None


class Run:
    """The engine requests of one HTTP request (prompts x n), their deltas on one queue."""

    def __init__(self, state: RunContext, choices: list[Choice]) -> None:
        self.state = state
        self.choices = choices
        self.queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        eng, st = self.state.engine, self.state
        deadline = (time.perf_counter() + st.request_timeout) if st.request_timeout else None
        if not eng.healthy:
            raise APIError(f"The engine has failed and is not serving: {eng.error}", 503)
        try:
            for c in self.choices:
                c.output = TextOutput(
                    st.tokenizer, c.sampling, st.eos_ids, c.prompt_ids, self._emitter(c.index)
                )
                c.request = eng.submit(c.prompt_ids, c.sampling, c.output, deadline=deadline)
        except Exception as e:
            self.abort()
            err = engine_error(e)
            if err is None:
                raise
            raise err from None

    def _emitter(self, index: int) -> Callable[[Delta], None]:
        def emit(d: Delta) -> None:  # engine thread
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, d))

        return emit

    def abort(self) -> None:
        for c in self.choices:
            if c.request is not None and c.finish is None:
                self.state.engine.abort(c.request)

    def pending(self) -> int:
        return sum(1 for c in self.choices if c.finish is None)

    async def deltas(self, request: Request) -> AsyncIterator[list[tuple[Choice, Delta, int]]]:
        """Batches of deltas as they arrive, until every choice finished; aborts everything
        when the client goes away, the generator is closed early, or the server-side guard
        (request_timeout plus a grace period) passes."""
        timeout = self.state.request_timeout
        guard = time.perf_counter() + timeout + TIMEOUT_GRACE_S if timeout else None
        checked = time.perf_counter()
        try:
            while self.pending():
                try:
                    first = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    first = None
                now = time.perf_counter()
                if first is None or now - checked >= DISCONNECT_POLL_S:
                    checked = now  # also while tokens flow: a plain request's client may go
                    if await request.is_disconnected():
                        return
                    if guard is not None and now > guard:
                        raise APIError(
                            f"The request did not finish within the server's "
                            f"request timeout of {timeout:g}s",
                            504,
                        ) from None
                if first is None:
                    continue
                items = [first]
                while not self.queue.empty():  # merge what is there (e.g. last token + finish)
                    items.append(self.queue.get_nowait())
                batch = []
                for index, d in items:
                    c = self.choices[index]
                    batch.append((c, d, self._record(c, d)))
                yield batch
        finally:
            self.abort()
            # Left early (the client went, the guard passed): nobody reads on, so the choices
            # end here, and the Run leaves InFlight's count now, not when it is collected.
            for c in self.choices:
                if c.finish is None:
                    c.finish = "abort"

    def _record(self, c: Choice, d: Delta) -> int:
        """Adds the delta to its choice; returns where its logprobs start in c.logprobs."""
        start = len(c.logprobs)
        for t, lp in zip(d.token_ids, d.logprobs, strict=False):  # logprobs only when asked
            c.text_offsets.append(c.token_chars)
            c.token_chars += len(self.state.tokenizer.token_text(t))
            c.logprobs.append((t, lp))
        c.text += d.text
        c.num_tokens = d.num_tokens
        if d.finish_reason is not None:
            c.finish = d.finish_reason
        return start


# Line breaks to str.splitlines (and so to httpx's aiter_lines and other SSE readers) that JSON
# leaves unescaped: escaped, so that one event stays one line.
_SPLITLINES_SAFE = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(d: dict) -> str:
    """One SSE event carrying `d` as JSON, on one line."""
    return f"data: {json.dumps(d, ensure_ascii=False).translate(_SPLITLINES_SAFE)}\n\n"


async def sse_events(
    run: Run, request: Request, fmt: ResponseFormat, include_usage: bool
) -> AsyncIterator[str]:
    """The stream of a started run: one chunk per batch of deltas (a choice's deltas merged),
    an error event for a choice that failed, the usage if asked for, then [DONE]."""
    timeout = run.state.request_timeout
    started: set[int] = set()
    try:
        async for batch in run.deltas(request):
            merged: dict[int, tuple[Choice, str, int, int, str | None]] = {}
            for c, d, start in batch:  # one chunk per choice per batch
                _, text, first, end, fin = merged.get(c.index, (c, "", start, start, None))
                end = start + len(d.logprobs)
                merged[c.index] = (c, text + d.text, first, end, d.finish_reason or fin)
            parts = []
            for c, text, first, end, fin in merged.values():
                lps = c.logprobs[first:end]
                err = finish_error(c, timeout) if fin else None
                if err is not None:
                    yield sse(err.body())
                    continue
                if not text and fin is None and not lps:
                    continue
                lp = fmt.logprobs(lps, c.text_offsets[first:end])
                parts.append(fmt.chunk_choice(c.index, text, lp, fin, c.index not in started))
                started.add(c.index)
            if parts:
                yield sse(fmt.chunk(parts, {"usage": None} if include_usage else None))
    except APIError as e:
        yield sse(e.body())
    if include_usage:
        yield sse(fmt.chunk([], {"usage": fmt.usage(run.choices)}))
    yield "data: [DONE]\n\n"
