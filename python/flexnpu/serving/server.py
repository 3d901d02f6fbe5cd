"""OpenAI-compatible HTTP API over the engine (FastAPI): /v1/completions, /v1/chat/completions
(streaming SSE ending with `data: [DONE]`, `stream_options.include_usage`), /v1/models, /health,
/metrics (Prometheus). Bad requests get OpenAI-style 400 errors; unknown fields are ignored; a
client that disconnects has its request aborted, which frees its batch slot."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from flexnpu.serving.engine import Engine
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.tokenizer import IncrementalDetokenizer, Tokenizer, chatml_prompt


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.status}}
        return JSONResponse(body, status_code=self.status)


@dataclass
class ServerState:
    engine: Engine
    tokenizer: Tokenizer
    model_name: str
    chat_system: str | None
    metrics: Any = None


def _get(body: dict, key: str, types: tuple, default: Any = None, check=None,
         what: str = "") -> Any:
    if key not in body or body[key] is None:
        return default
    v = body[key]
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if not ok or (check is not None and not check(v)):
        raise APIError(f"'{key}' must be {what}, got {json.dumps(v)[:60]}", param=key)
    return v


def _sampling(body: dict, default_max: int) -> SamplingParams:
    max_tokens = _get(body, "max_completion_tokens", (int,), None, lambda v: v >= 1,
                      "a positive integer")
    max_tokens = _get(body, "max_tokens", (int,), max_tokens, lambda v: v >= 1,
                      "a positive integer")
    stop = _get(body, "stop", (str, list), [], None, "a string or a list of strings")
    if isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a string or a list of non-empty strings", param="stop")
    if _get(body, "n", (int,), 1, None, "1") != 1:
        raise APIError("only n=1 is supported", param="n")
    return SamplingParams(
        max_tokens=default_max if max_tokens is None else max_tokens,
        temperature=float(_get(body, "temperature", (int, float), 1.0, lambda v: 0 <= v <= 2,
                               "a number in [0, 2]")),
        top_p=float(_get(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1,
                         "a number in (0, 1]")),
        seed=_get(body, "seed", (int,), None, None, "an integer"),
        ignore_eos=_get(body, "ignore_eos", (bool,), False, None, "a boolean"),
        stop=stop,
    )


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="FlexNPU OpenAI-compatible server")
    eng = state.engine
    max_len = eng.ec.max_seq_len

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "flexnpu", "max_model_len": max_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return Response("", media_type="text/plain")
        eng._update_gauges()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    async def body_of(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != state.model_name:
            raise APIError(f"The model `{model}` does not exist.", 404, "model",
                           "NotFoundError")
        return body

    def check_lengths(prompt_ids: list[int], sp: SamplingParams, explicit: bool) -> None:
        n = len(prompt_ids)
        if n == 0:
            raise APIError("the prompt is empty", param="prompt")
        if n > eng.max_prompt_len or n >= max_len:
            raise APIError(f"This model's maximum context length is {max_len} tokens and the "
                           f"longest prompt it takes is {eng.max_prompt_len} tokens; your "
                           f"prompt has {n} tokens.", param="prompt")
        if explicit and n + sp.max_tokens > max_len:
            raise APIError(f"This model's maximum context length is {max_len} tokens. However, "
                           f"you requested {n + sp.max_tokens} tokens ({n} in the prompt, "
                           f"{sp.max_tokens} for the completion).", param="max_tokens")
        sp.max_tokens = min(sp.max_tokens, max_len - n)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await body_of(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = state.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            if any(not 0 <= t < eng.cfg.vocab_size for t in ids):
                raise APIError("token id out of the vocabulary", param="prompt")
        else:
            raise APIError("'prompt' must be a string or a list of token ids (one prompt)",
                           param="prompt")
        sp = _sampling(body, 16)
        check_lengths(ids, sp, "max_tokens" in body)
        return await _serve(request, state, body, ids, sp, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await body_of(request)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise APIError("'messages' must be a non-empty list of {role, content} objects",
                           param="messages")
        try:
            text = chatml_prompt(msgs, state.chat_system)
        except TypeError as e:
            raise APIError(str(e), param="messages") from None
        ids = state.tokenizer.encode(text)
        sp = _sampling(body, max_len)
        explicit = "max_tokens" in body or "max_completion_tokens" in body
        check_lengths(ids, sp, explicit)
        return await _serve(request, state, body, ids, sp, chat=True)

    return app


async def _events(request: Request, state: ServerState, ids: list[int],
                  sp: SamplingParams) -> AsyncIterator[tuple[str, str | None, int]]:
    """Runs one request: yields (text delta, finish_reason or None, completion tokens).
    Stop strings are applied to the text; a disconnect or early stop aborts the request."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()

    def sink(tok: int | None, reason: str | None) -> None:
        loop.call_soon_threadsafe(q.put_nowait, (tok, reason))

    eng = state.engine
    req = eng.submit(ids, sp, sink)
    det = IncrementalDetokenizer(state.tokenizer, ids)
    text, sent = "", 0
    hold = max((len(s) for s in sp.stop), default=1) - 1
    finished = False
    try:
        while True:
            try:
                item = await asyncio.wait_for(q.get(), timeout=1.0)
            except TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            items = [item]
            while not q.empty():  # merge what is already there (e.g. last token + finish)
                items.append(q.get_nowait())
            reason = None
            for tok, why in items:
                if tok is not None and reason is None:
                    text += det.add(tok)
                    cut = min((i for s in sp.stop if (i := text.find(s)) >= 0), default=-1)
                    if cut >= 0:
                        text = text[:cut]
                        reason = "stop"
                reason = reason or why
            if reason is not None:
                finished = True
                if reason.startswith("error"):
                    raise RuntimeError(reason)
                yield text[sent:], reason, len(req.output_ids)
                return
            upto = max(sent, len(text) - hold)
            if upto > sent:
                yield text[sent:upto], None, len(req.output_ids)
                sent = upto
    finally:
        if not finished or not req.done:
            eng.abort(req)


async def _serve(request: Request, state: ServerState, body: dict, ids: list[int],
                 sp: SamplingParams, chat: bool) -> Response:
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    model = state.model_name
    obj = "chat.completion" if chat else "text_completion"

    def usage(n_out: int) -> dict:
        return {"prompt_tokens": len(ids), "completion_tokens": n_out,
                "total_tokens": len(ids) + n_out}

    if not _get(body, "stream", (bool,), False, None, "a boolean"):
        parts, reason, n_out = [], "stop", 0
        try:
            async for delta, fin, count in _events(request, state, ids, sp):
                n_out = count
                parts.append(delta)
                reason = fin or reason
        except RuntimeError as e:
            raise APIError(f"generation failed: {e}", 500, kind="InternalServerError") from e
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse({"id": rid, "object": obj, "created": created, "model": model,
                             "choices": [choice], "usage": usage(n_out)})

    opts = _get(body, "stream_options", (dict,), {}, None, "an object")
    include_usage = bool(opts.get("include_usage", False))
    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list, extra: dict | None = None) -> str:
        d = {"id": rid, "object": chunk_obj, "created": created, "model": model,
             "choices": choices, **(extra or {})}
        return f"data: {json.dumps(d, ensure_ascii=False)}\n\n"

    async def stream() -> AsyncIterator[str]:
        first, n_out = True, 0
        try:
            async for delta, fin, count in _events(request, state, ids, sp):
                n_out = count
                if not delta and fin is None:
                    continue
                if chat:
                    d: dict[str, Any] = {"content": delta} if delta else {}
                    if first:
                        d = {"role": "assistant", **d}
                    c = {"index": 0, "delta": d, "logprobs": None, "finish_reason": fin}
                else:
                    c = {"index": 0, "text": delta, "logprobs": None, "finish_reason": fin}
                first = False
                yield chunk([c], {"usage": None} if include_usage else None)
        except RuntimeError as e:
            err = {"error": {"message": f"generation failed: {e}", "type": "InternalServerError",
                             "code": 500}}
            yield f"data: {json.dumps(err)}\n\n"
        if include_usage:
            yield chunk([], {"usage": usage(n_out)})
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")
