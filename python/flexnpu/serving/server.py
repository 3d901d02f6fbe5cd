"""OpenAI-compatible HTTP API over the engine (FastAPI): /v1/completions (a prompt, a list of
prompts, token ids), /v1/chat/completions (the model's own chat template), streaming SSE ending
with `data: [DONE]` (`stream_options.include_usage`), logprobs in OpenAI's formats, n > 1,
/v1/models, /health, /metrics (Prometheus: serving and placement in one registry).

Every error is OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`, whatever the
status: 400 bad request (including prompt + max_tokens beyond max_model_len and fields that
would change the result but are not supported), 404, 405, 422, 500, 503 (queue full, engine
failed), 504 (the per-request timeout). Unknown fields that do not change results are ignored,
like vLLM. A client that disconnects, streaming or not, has its request aborted at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from flexnpu.serving.chat_template import ChatTemplate, ChatTemplateError
from flexnpu.serving.output import Delta, TextOutput, TokenLogprobs
from flexnpu.serving.sampling import NUM_TOP_LOGPROBS, SamplingParams
from flexnpu.serving.tokenizer import Tokenizer

MAX_CHOICES = 64  # prompts x n per request
MAX_LOGPROBS = NUM_TOP_LOGPROBS  # what the device step returns
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is still there
TIMEOUT_GRACE_S = 5.0  # past its deadline, a request the engine has not finished is ended here

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error",
                405: "invalid_request_error", 408: "timeout_error",
                413: "invalid_request_error", 422: "invalid_request_error",
                500: "server_error", 503: "service_unavailable_error", 504: "timeout_error"}


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param
        self.kind = kind or _ERROR_TYPES.get(status, "server_error" if status >= 500
                                             else "invalid_request_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


@dataclass
class ServerState:
    engine: Any
    tokenizer: Tokenizer
    model_name: str
    chat_template: ChatTemplate | str | None = None  # None: the tokenizer's (GGUF) template
    metrics: Any = None
    eos_ids: tuple[int, ...] | None = None  # None: engine.eos_ids, else the tokenizer's
    request_timeout: float | None = None  # seconds per request; None: the engine's (if any)
    _template: ChatTemplate = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.chat_template, ChatTemplate):
            self._template = self.chat_template
        else:
            source = self.chat_template or getattr(self.tokenizer, "chat_template", None)
            self._template = ChatTemplate(source, getattr(self.tokenizer, "special_tokens", None))
        if self.request_timeout is None:
            self.request_timeout = getattr(getattr(self.engine, "ec", None), "request_timeout",
                                           None)
        if self.eos_ids is None:
            ids = getattr(self.engine, "eos_ids", None) or getattr(self.tokenizer, "eos_ids",
                                                                     (self.tokenizer.eos_id,))
            self.eos_ids = tuple(ids)

    @property
    def template(self) -> ChatTemplate:
        return self._template


# ---- request parsing ------------------------------------------------------------------------


def _get(body: dict, key: str, types: tuple, default: Any = None, check=None,
         what: str = "") -> Any:
    if key not in body or body[key] is None:
        return default
    v = body[key]
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if not ok or (check is not None and not check(v)):
        raise APIError(f"'{key}' must be {what}, got {json.dumps(v)[:60]}", param=key)
    return v


# Fields that change the result; accepted only at the value that changes nothing (vLLM's
# benchmark sends e.g. repetition_penalty=1.0). (field, neutral values, what to say)
_UNSUPPORTED: tuple[tuple[str, tuple, str], ...] = (
    ("presence_penalty", (0, 0.0), "presence_penalty is not supported (only 0)"),
    ("frequency_penalty", (0, 0.0), "frequency_penalty is not supported (only 0)"),
    ("repetition_penalty", (1, 1.0), "repetition_penalty is not supported (only 1)"),
    ("length_penalty", (1, 1.0), "length_penalty is not supported (only 1)"),
    ("logit_bias", ({},), "logit_bias is not supported"),
    ("bad_words", ([],), "bad_words is not supported"),
    ("allowed_token_ids", ([],), "allowed_token_ids is not supported"),
    ("min_tokens", (0,), "min_tokens is not supported (only 0)"),
    ("best_of", (1,), "best_of is not supported (only 1)"),
    ("use_beam_search", (False,), "beam search is not supported"),
    ("prompt_logprobs", (0,), "prompt_logprobs is not supported"),
    ("echo", (False,), "echo is not supported"),
    ("suffix", ("",), "suffix is not supported"),
    ("include_stop_str_in_output", (False,), "include_stop_str_in_output is not supported"),
    ("skip_special_tokens", (True,), "skip_special_tokens=false is not supported"),
    ("tools", ([],), "tools (function calling) are not supported"),
    ("functions", ([],), "functions (function calling) are not supported"),
    ("tool_choice", ("none",), "tool_choice is not supported (only 'none')"),
    ("function_call", ("none",), "function_call is not supported"),
    ("guided_json", (), "guided decoding is not supported"),
    ("guided_regex", (), "guided decoding is not supported"),
    ("guided_choice", (), "guided decoding is not supported"),
    ("guided_grammar", (), "guided decoding is not supported"),
    ("structured_outputs", (), "structured outputs are not supported"),
    ("chat_template", (), "a per-request chat_template is not supported"),
    ("audio", (), "audio output is not supported"),
    ("modalities", (["text"],), "only text modalities are supported"),
    ("prediction", (), "predicted outputs are not supported"),
)


def _reject_unsupported(body: dict) -> None:
    for key, neutral, message in _UNSUPPORTED:
        v = body.get(key)
        if v is None or any(type(v) is type(n) and v == n for n in neutral):
            continue
        if isinstance(v, int | float) and not isinstance(v, bool) and any(
                isinstance(n, int | float) and not isinstance(n, bool) and v == n
                for n in neutral):
            continue
        raise APIError(f"{message}; got {key}={json.dumps(v)[:60]}", param=key)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise APIError("response_format is not supported (only {'type': 'text'}); got "
                       f"{json.dumps(fmt)[:60]}", param="response_format")


def _sampling(body: dict, chat: bool) -> tuple[SamplingParams, int | None]:
    """SamplingParams from the body and the explicit max_tokens (None when not given)."""
    _reject_unsupported(body)
    max_tokens = _get(body, "max_completion_tokens", (int,), None, lambda v: v >= 1,
                      "a positive integer")
    max_tokens = _get(body, "max_tokens", (int,), max_tokens, lambda v: v >= 1,
                      "a positive integer")
    stop = _get(body, "stop", (str, list), [], None, "a string or a list of strings")
    if isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a string or a list of non-empty strings", param="stop")
    stop_ids = _get(body, "stop_token_ids", (list,), [], lambda v: all(
        isinstance(t, int) and not isinstance(t, bool) for t in v), "a list of token ids")
    top_k = _get(body, "top_k", (int,), 0, lambda v: v >= -1, "an integer >= -1 (-1, 0: off)")
    if chat:
        want = _get(body, "logprobs", (bool,), False, None, "a boolean")
        top = _get(body, "top_logprobs", (int,), None, lambda v: 0 <= v <= MAX_LOGPROBS,
                   f"an integer in [0, {MAX_LOGPROBS}]")
        if top is not None and not want:
            raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = _get(body, "logprobs", (int,), None, lambda v: 0 <= v <= MAX_LOGPROBS,
                        f"an integer in [0, {MAX_LOGPROBS}]")
    try:
        sp = SamplingParams(
            max_tokens=max_tokens or 16,
            temperature=float(_get(body, "temperature", (int, float), 1.0,
                                   lambda v: 0 <= v <= 2, "a number in [0, 2]")),
            top_p=float(_get(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1,
                             "a number in (0, 1]")),
            seed=_get(body, "seed", (int,), None, lambda v: 0 <= v < 2**63,
                      "an integer in [0, 2**63)"),
            ignore_eos=_get(body, "ignore_eos", (bool,), False, None, "a boolean"),
            stop=stop,
        )
        _set_if_supported(sp, "top_k", max(top_k, 0), 0)
        _set_if_supported(sp, "min_p", float(_get(body, "min_p", (int, float), 0.0,
                                                  lambda v: 0 <= v <= 1, "a number in [0, 1]")),
                          0.0)
        _set_if_supported(sp, "stop_token_ids", list(stop_ids), [])
        _set_if_supported(sp, "logprobs", logprobs, None)
    except ValueError as e:
        raise APIError(str(e)) from None
    return sp, max_tokens


def _set_if_supported(sp: SamplingParams, key: str, value: Any, neutral: Any) -> None:
    if hasattr(sp, key):
        setattr(sp, key, value)
    elif value != neutral:
        raise APIError(f"'{key}' is not supported by this engine", param=key)


# ---- engine plumbing ------------------------------------------------------------------------


def _engine_error(e: BaseException) -> APIError | None:
    name = type(e).__name__
    if name == "QueueFullError":
        return APIError(f"The server is at capacity: {e}. Retry later.", 503,
                        headers={"Retry-After": "1"})
    if name == "EngineDeadError":
        return APIError(f"The engine has failed and is not serving: {e}", 503)
    if name == "RequestTooLongError":
        return APIError(str(e), 400, "max_tokens")
    return None


def _healthy(engine: Any) -> tuple[bool, str | None]:
    return bool(getattr(engine, "healthy", True)), getattr(engine, "error", None)


def _max_model_len(engine: Any) -> int:
    n = getattr(engine, "max_model_len", None)
    return int(n if n is not None else engine.ec.max_seq_len)


@dataclass
class _Choice:
    index: int
    prompt_ids: list[int]
    sampling: SamplingParams
    output: TextOutput | None = None
    request: Any = None
    text: str = ""
    num_tokens: int = 0
    finish: str | None = None
    logprobs: list[tuple[int, TokenLogprobs]] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)
    token_chars: int = 0  # text length of the tokens so far (completions' text_offset)


class _Run:
    """The engine requests of one HTTP request (prompts x n), their deltas on one queue."""

    def __init__(self, state: ServerState, choices: list[_Choice]) -> None:
        self.state = state
        self.choices = choices
        self.queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()

    def start(self) -> None:
        eng, st = self.state.engine, self.state
        deadline = (time.perf_counter() + st.request_timeout) if st.request_timeout else None
        ok, why = _healthy(eng)
        if not ok:
            raise APIError(f"The engine has failed and is not serving: {why}", 503)
        try:
            for c in self.choices:
                c.output = TextOutput(st.tokenizer, c.sampling, st.eos_ids, c.prompt_ids,
                                      self._emitter(c.index))
                c.request = eng.submit(c.prompt_ids, c.sampling, c.output, deadline=deadline)
        except Exception as e:
            self.abort()
            err = _engine_error(e)
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

    async def deltas(self, request: Request
                     ) -> AsyncIterator[list[tuple[_Choice, Delta, int]]]:
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
                        raise APIError(f"The request did not finish within the server's "
                                       f"request timeout of {timeout:g}s", 504) from None
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

    def _record(self, c: _Choice, d: Delta) -> int:
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


def _finish_error(c: _Choice, timeout: float | None) -> APIError | None:
    if c.finish is None or c.finish in ("stop", "length", "abort"):
        return None
    if c.finish == "timeout":
        return APIError(f"The request did not finish within the server's request timeout "
                        f"of {timeout:g}s", 504)
    msg = c.finish.removeprefix("error:").strip()
    return APIError(f"Generation failed: {msg}", 500)


# ---- logprobs in OpenAI's formats -----------------------------------------------------------


def _lp(x: float) -> float:
    return max(float(x), -9999.0) if not math.isnan(x) else -9999.0  # JSON has no -inf


def _token_str(tok: Tokenizer, t: int) -> str:
    """A token's text; one holding part of a UTF-8 character as "bytes:\\xe4\\xb8" (OpenAI's
    and vLLM's spelling), so distinct tokens stay distinct."""
    text = tok.token_text(t)
    if "\ufffd" in text:
        raw = tok.token_bytes(t)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return text


def _chat_logprobs(tok: Tokenizer, entries: list[tuple[int, TokenLogprobs]], k: int) -> dict:
    def item(t: int, lp: float) -> dict:
        return {"token": _token_str(tok, t), "logprob": _lp(lp),
                "bytes": list(tok.token_bytes(t))}

    return {"content": [{**item(t, lp.logprob),
                         "top_logprobs": [item(i, v) for i, v in lp.top[:k]]}
                        for t, lp in entries]}


def _completion_logprobs(tok: Tokenizer, entries: list[tuple[int, TokenLogprobs]], k: int,
                         offsets: list[int]) -> dict:
    return {
        "tokens": [_token_str(tok, t) for t, _ in entries],
        "token_logprobs": [_lp(lp.logprob) for _, lp in entries],
        "top_logprobs": [{_token_str(tok, i): _lp(v) for i, v in lp.top[:k]}
                         for _, lp in entries],
        "text_offset": offsets,
    }


# ---- the app --------------------------------------------------------------------------------


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
        ok, why = _healthy(eng)
        if not ok:
            return APIError(f"The engine has failed: {why}", 503).response()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "flexnpu", "max_model_len": _max_model_len(eng)}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            return Response("", media_type="text/plain")
        update = getattr(eng, "update_gauges", None) or getattr(eng, "_update_gauges", None)
        if update is not None:
            update()
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
            raise APIError(f"The model `{model}` does not exist.", 404, "model")
        return body

    def choices_for(prompts: list[list[int]], sp: SamplingParams, explicit: int | None,
                    body: dict) -> list[_Choice]:
        n = _get(body, "n", (int,), 1, lambda v: v >= 1, "a positive integer")
        if len(prompts) * n > MAX_CHOICES:
            raise APIError(f"{len(prompts)} prompts x n={n} is more than {MAX_CHOICES} "
                           "choices per request", param="n")
        max_len = _max_model_len(eng)
        out = []
        for p, ids in enumerate(prompts):
            k = len(ids)
            if k == 0:
                raise APIError("the prompt is empty", param="prompt")
            if any(not 0 <= t < eng.cfg.vocab_size for t in ids):
                raise APIError(f"token ids must be in [0, {eng.cfg.vocab_size})", param="prompt")
            longest = getattr(eng, "max_prompt_len", max_len - 1)
            if k >= max_len or k > longest:
                raise APIError(f"This model's maximum context length is {max_len} tokens and "
                               f"the longest prompt it takes is {min(longest, max_len - 1)} "
                               f"tokens; your prompt has {k} tokens.", param="prompt")
            if explicit is not None and k + explicit > max_len:
                raise APIError(f"This model's maximum context length is {max_len} tokens. "
                               f"However, you requested {k + explicit} tokens ({k} in the "
                               f"prompt, {explicit} for the completion). Reduce the prompt or "
                               "max_tokens.", param="max_tokens")
            for i in range(n):
                spi = _copy_sampling(sp)
                spi.max_tokens = explicit if explicit is not None else min(sp.max_tokens,
                                                                            max_len - k)
                if sp.seed is not None and n > 1:
                    spi.seed = (sp.seed + i) % 2**63
                out.append(_Choice(p * n + i, list(ids), spi))
        return out

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await body_of(request)
        prompts = _prompts(body.get("prompt"), state.tokenizer)
        sp, explicit = _sampling(body, chat=False)
        return await _serve(request, state, body, choices_for(prompts, sp, explicit, body),
                            chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await body_of(request)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise APIError("'messages' must be a non-empty list of {role, content} objects",
                           param="messages")
        kwargs = _get(body, "chat_template_kwargs", (dict,), {}, None, "an object")
        add_gen = _get(body, "add_generation_prompt", (bool,), True, None, "a boolean")
        try:
            text = state.template.render(msgs, add_generation_prompt=add_gen, **kwargs)
        except ChatTemplateError as e:
            raise APIError(str(e), param="messages") from None
        sp, explicit = _sampling(body, chat=True)
        sp.max_tokens = _max_model_len(eng) if explicit is None else explicit
        ids = state.tokenizer.encode(text)
        return await _serve(request, state, body, choices_for([ids], sp, explicit, body),
                            chat=True)

    return app


def _copy_sampling(sp: SamplingParams) -> SamplingParams:
    import copy

    return copy.copy(sp)


def _prompts(prompt: Any, tok: Tokenizer) -> list[list[int]]:
    """A string, a list of strings, a list of token ids or a list of such lists."""

    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if is_ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p)
                                                   for p in prompt):
        return [tok.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    raise APIError("'prompt' must be a string, a list of strings, a list of token ids or a "
                   "list of token-id lists", param="prompt")


# Line breaks to str.splitlines (and so to httpx's aiter_lines and other SSE readers) that JSON
# leaves unescaped: escaped, so that one event stays one line.
_SPLITLINES_SAFE = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _sse(d: dict) -> str:
    return f"data: {json.dumps(d, ensure_ascii=False).translate(_SPLITLINES_SAFE)}\n\n"


async def _serve(request: Request, state: ServerState, body: dict, choices: list[_Choice],
                 chat: bool) -> Response:
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    model = state.model_name
    tok = state.tokenizer
    stream = _get(body, "stream", (bool,), False, None, "a boolean")
    opts = _get(body, "stream_options", (dict,), {}, None, "an object")
    include_usage = bool(opts.get("include_usage", False))
    k = choices[0].sampling.logprobs if hasattr(choices[0].sampling, "logprobs") else None
    run = _Run(state, choices)
    run.start()

    def usage() -> dict:
        n_in = sum(len(c.prompt_ids) for c in choices)
        n_out = sum(c.num_tokens for c in choices)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def logprobs_of(c: _Choice, entries, offsets) -> dict | None:
        if k is None:
            return None
        if chat:
            return _chat_logprobs(tok, entries, k)
        return _completion_logprobs(tok, entries, k, offsets)

    if not stream:
        async for _ in run.deltas(request):
            pass
        for c in choices:
            if (err := _finish_error(c, state.request_timeout)) is not None:
                raise err
        if any(c.finish is None for c in choices):  # client gone
            return Response(status_code=499)
        out = []
        for c in choices:
            choice: dict[str, Any] = {"index": c.index, "finish_reason": c.finish,
                                      "logprobs": logprobs_of(c, c.logprobs, c.text_offsets)}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            out.append(choice)
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else
                             "text_completion", "created": created, "model": model,
                             "choices": out, "usage": usage()})

    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(cs: list, extra: dict | None = None) -> str:
        d = {"id": rid, "object": chunk_obj, "created": created, "model": model,
             "choices": cs, **(extra or {})}
        return _sse(d)

    async def events() -> AsyncIterator[str]:
        started: set[int] = set()
        try:
            async for batch in run.deltas(request):
                merged: dict[int, tuple[_Choice, str, int, int, str | None]] = {}
                for c, d, start in batch:  # one chunk per choice per batch
                    _, text, first, end, fin = merged.get(c.index, (c, "", start, start, None))
                    end = start + len(d.logprobs)
                    merged[c.index] = (c, text + d.text, first, end, d.finish_reason or fin)
                parts = []
                for c, text, first, end, fin in merged.values():
                    lps = c.logprobs[first:end]
                    err = _finish_error(c, state.request_timeout) if fin else None
                    if err is not None:
                        yield _sse(err.body())
                        continue
                    if fin == "abort":
                        continue
                    if not text and fin is None and not lps:
                        continue
                    lp = logprobs_of(c, lps, c.text_offsets[first:end])
                    if chat:
                        delta: dict[str, Any] = {"content": text} if text else {}
                        if c.index not in started:
                            delta = {"role": "assistant", **delta}
                        parts.append({"index": c.index, "delta": delta, "logprobs": lp,
                                      "finish_reason": fin})
                    else:
                        parts.append({"index": c.index, "text": text, "logprobs": lp,
                                      "finish_reason": fin})
                    started.add(c.index)
                if parts:
                    yield chunk(parts, {"usage": None} if include_usage else None)
        except APIError as e:
            yield _sse(e.body())
        if include_usage:
            yield chunk([], {"usage": usage()})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
