"""OpenAI-compatible HTTP API over the engine (FastAPI): /v1/completions (a prompt, a list of
prompts, token ids), /v1/chat/completions (the model's own chat template), streaming SSE ending
with `data: [DONE]` (`stream_options.include_usage`), logprobs in OpenAI's formats, n > 1,
/v1/models, /health, /metrics (Prometheus: serving and placement in one registry).

Every error is OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, whatever the
status: 400 bad request (including prompt + max_tokens beyond max_model_len and fields that
would change the result but are not supported), 404, 405, 422, 500, 503 (queue full, engine
failed, server shutting down), 504 (the per-request timeout). Unknown fields that do not change
results are ignored, like vLLM. A client that disconnects, streaming or not, has its request
aborted at once.

Shutting down (serving.shutdown closes the InFlight): /health and new requests get a 503; the
requests in flight run on until the grace period ends and are then aborted: a stream ends with
a chunk whose finish_reason is "abort" (vLLM's spelling) and `data: [DONE]`, a plain request
gets a 503 saying the server shut down before it finished (not a partial result: a client that
does not read finish_reason would take a 200 for the whole answer).

This module is the app (routes, error handlers, the life of a request); the wire format is in
openai_protocol, the engine side and SSE in streaming.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from flexnpu.serving.chat_template import ChatTemplate, ChatTemplateError
from flexnpu.serving.engine_client import EngineClient
from flexnpu.serving.openai_protocol import (
    MAX_CHOICES,
    APIError,
    Choice,
    ResponseFormat,
    check_unicode,
    finish_error,
    get_field,
    parse_prompts,
    parse_sampling,
)
from flexnpu.serving.output import suppressed_ids
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.streaming import Run, sse_events
from flexnpu.serving.tokenizer import Tokenizer


class InFlight:
    """The requests in flight (their Runs) and whether new ones are still admitted: the
    shutdown closes it, then aborts what is still running when its grace period ends."""

    def __init__(self) -> None:
        self.closed = False
        self.grace_s = 0.0
        self._runs: weakref.WeakSet[Run] = weakref.WeakSet()  # a finished Run drops out

    def start(self, run: Run) -> None:
        """Starts the run, or refuses it (503) once the server is shutting down."""
        if self.closed:
            raise APIError("The server is shutting down and takes no new requests", 503)
        run.start()
        self._runs.add(run)

    def close(self, grace_s: float) -> int:
        """Admits no more requests; returns how many are still running."""
        self.closed, self.grace_s = True, grace_s
        return self.count()

    def count(self) -> int:
        return sum(1 for run in list(self._runs) if run.pending())

    def abort_all(self) -> int:
        """Aborts every request still running (through the engine: its KV blocks are
        freed); returns how many there were."""
        running = [run for run in list(self._runs) if run.pending()]
        for run in running:
            run.abort()
        return len(running)

    def cut_short(self) -> APIError:
        """The error of a plain request the shutdown aborted."""
        return APIError(
            "The server shut down before the request finished (its shutdown grace period "
            f"of {self.grace_s:g}s ended)",
            503,
        )


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: Tokenizer
    model_name: str
    chat_template: ChatTemplate | str | None = None  # None: the tokenizer's (GGUF) template
    metrics: Any = None
    eos_ids: tuple[int, ...] | None = None  # None: engine.eos_ids, else the tokenizer's
    request_timeout: float | None = None  # seconds per request; None: the engine's (if any)
    in_flight: InFlight = field(default_factory=InFlight)
    # POST /debug/fail-instance/{name} makes an engine instance fail (the soak, fault tests);
    # `serve` turns it on with FLEXNPU_FAULT_INJECTION=1 only.
    fault_injection: bool = False
    _template: ChatTemplate = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.chat_template, ChatTemplate):
            self._template = self.chat_template
        else:
            source = self.chat_template or getattr(self.tokenizer, "chat_template", None)
            self._template = ChatTemplate(source, getattr(self.tokenizer, "special_tokens", None))
        if self.request_timeout is None:
            self.request_timeout = self.engine.request_timeout
        if self.eos_ids is None:
            ids = self.engine.eos_ids or getattr(
                self.tokenizer, "eos_ids", (self.tokenizer.eos_id,)
            )
            self.eos_ids = tuple(ids)

    @property
    def template(self) -> ChatTemplate:
        return self._template


class _InternalErrors:
    """Any other exception: an OpenAI-shaped 500, logged, the connection kept (Starlette's
    own handler re-raises, and uvicorn then resets the keep-alive connection)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # the client left while sending its body: nobody to answer, nothing failed
        except Exception as e:
            if started:
                raise
            logging.getLogger("flexnpu.serving").exception("request failed")
            err = APIError(f"Internal server error: {type(e).__name__}: {e}", 500)
            await err.response()(scope, receive, send)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="FlexNPU OpenAI-compatible server")
    eng = state.engine

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 404:
            msg = f"Not found: {request.method} {request.url.path}"
        elif e.status_code == 405:
            msg = f"Method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(e.detail)
        return APIError(msg, e.status_code, headers=getattr(e, "headers", None)).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        errs = e.errors()
        loc = ".".join(str(x) for x in errs[0].get("loc", ())) if errs else None
        msg = "; ".join(str(x.get("msg")) for x in errs) or "invalid request"
        return APIError(msg, 422, loc).response()

    app.add_middleware(_InternalErrors)

    @app.get("/health")
    async def health() -> Response:
        """200 while the server takes requests: status "ok", or "degraded" when an instance
        is restarting or out of service (the others serve); 503 otherwise. Both list the
        instances and their states."""
        instances = [x.to_json() for x in eng.health()]
        if state.in_flight.closed:
            return APIError("The server is shutting down", 503).response()
        if not eng.healthy:
            err = APIError(f"The engine has failed: {eng.error}", 503)
            return JSONResponse({**err.body(), "instances": instances}, 503)
        degraded = any(x["state"] != "serving" for x in instances)
        return JSONResponse({"status": "degraded" if degraded else "ok",
                             "instances": instances})

    if state.fault_injection:

        @app.post("/debug/fail-instance/{name}")
        async def fail_instance(name: str) -> dict:
            try:
                eng.inject_fault(name)
            except ValueError as e:
                raise APIError(str(e), 404, "name") from None
            return {"injected": name}

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "flexnpu",
                    "max_model_len": eng.max_model_len,
                }
            ],
        }

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return Response("", media_type="text/plain")
        eng.update_gauges()
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/cluster/topology")
    async def cluster_topology() -> JSONResponse:
        """A multi-host front's hosts and links (serving/topology.py)."""
        topology = eng.topology()
        if topology is None:
            raise APIError("Not found: this server is one engine, not a multi-host front "
                           "(GET /cluster/topology)", 404)
        return JSONResponse(topology.to_json())

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError("request body must be a JSON object")
        check_unicode(raw, body)
        model = body.get("model")
        if model is not None and model != state.model_name:
            raise APIError(f"The model `{model}` does not exist.", 404, "model")
        return body

    def choices_for(
        prompts: list[list[int]], sp: SamplingParams, explicit: int | None, body: dict
    ) -> list[Choice]:
        n = get_field(body, "n", (int,), 1, lambda v: v >= 1, "a positive integer")
        if len(prompts) * n > MAX_CHOICES:
            raise APIError(
                f"{len(prompts)} prompts x n={n} is more than {MAX_CHOICES} choices per request",
                param="n",
            )
        try:
            suppressed_ids(sp, state.eos_ids or ())
        except ValueError as e:
            raise APIError(str(e), param="min_tokens") from None
        max_len = eng.max_model_len
        out = []
        for p, ids in enumerate(prompts):
            k = len(ids)
            if k == 0:
                raise APIError("the prompt is empty", param="prompt")
            if any(not 0 <= t < eng.vocab_size for t in ids):
                raise APIError(f"token ids must be in [0, {eng.vocab_size})", param="prompt")
            longest = eng.max_prompt_len
            if k >= max_len or k > longest:
                raise APIError(
                    f"This model's maximum context length is {max_len} tokens and "
                    f"the longest prompt it takes is {min(longest, max_len - 1)} "
                    f"tokens; your prompt has {k} tokens.",
                    param="prompt",
                )
            if explicit is not None and k + explicit > max_len:
                raise APIError(
                    f"This model's maximum context length is {max_len} tokens. "
                    f"However, you requested {k + explicit} tokens ({k} in the "
                    f"prompt, {explicit} for the completion). Reduce the prompt or "
                    "max_tokens.",
                    param="max_tokens",
                )
            for i in range(n):
                spi = _copy_sampling(sp)
                spi.max_tokens = (
                    explicit if explicit is not None else min(sp.max_tokens, max_len - k)
                )
                if spi.min_tokens > spi.max_tokens:
                    raise APIError(
                        f"'min_tokens' ({spi.min_tokens}) is more than the {spi.max_tokens} "
                        f"tokens left for the completion ({max_len} of context, {k} in the "
                        "prompt)",
                        param="min_tokens",
                    )
                if sp.seed is not None and n > 1:
                    spi.seed = (sp.seed + i) % 2**63
                out.append(Choice(p * n + i, list(ids), spi))
        return out

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await body_of(request)
        prompts = parse_prompts(body.get("prompt"), state.tokenizer)
        sp, explicit = parse_sampling(body, chat=False)
        return await _serve(
            request, state, body, choices_for(prompts, sp, explicit, body), chat=False
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await body_of(request)
        msgs = body.get("messages")
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs)
        ):
            raise APIError(
                "'messages' must be a non-empty list of {role, content} objects", param="messages"
            )
        kwargs = get_field(body, "chat_template_kwargs", (dict,), {}, None, "an object")
        add_gen = get_field(body, "add_generation_prompt", (bool,), True, None, "a boolean")
        try:
            text = state.template.render(msgs, add_generation_prompt=add_gen, **kwargs)
        except ChatTemplateError as e:
            raise APIError(str(e), param="messages") from None
        sp, explicit = parse_sampling(body, chat=True, default_max_tokens=eng.max_model_len)
        ids = state.tokenizer.encode(text)
        return await _serve(request, state, body, choices_for([ids], sp, explicit, body), chat=True)

    return app


def _copy_sampling(sp: SamplingParams) -> SamplingParams:
    import copy

    return copy.copy(sp)


async def _serve(
    request: Request, state: ServerState, body: dict, choices: list[Choice], chat: bool
) -> Response:
    stream = get_field(body, "stream", (bool,), False, None, "a boolean")
    opts = get_field(body, "stream_options", (dict,), {}, None, "an object")
    include_usage = bool(opts.get("include_usage", False))
    k = choices[0].sampling.logprobs if hasattr(choices[0].sampling, "logprobs") else None
    fmt = ResponseFormat(state.tokenizer, state.model_name, chat, k)
    run = Run(state, choices)
    state.in_flight.start(run)
    if stream:
        return StreamingResponse(
            sse_events(run, request, fmt, include_usage), media_type="text/event-stream"
        )
    async for _ in run.deltas(request):
        pass
    if state.in_flight.closed and any(c.finish == "abort" for c in choices):
        raise state.in_flight.cut_short()
    for c in choices:
        if (err := finish_error(c, state.request_timeout)) is not None:
            raise err
    if any(c.finish is None for c in choices):  # client gone
        return Response(status_code=499)
    return JSONResponse(fmt.response(choices))
