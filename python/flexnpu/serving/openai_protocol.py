"""The OpenAI API's wire format: request bodies parsed and validated (sampling parameters,
prompts; fields that would change the result but are not supported are refused), OpenAI-shaped
errors (`{"error": {"message", "type", "param", "code"}}`), and responses (whole or as stream
chunks, logprobs in OpenAI's two formats)."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from flexnpu.serving.output import TextOutput, TokenLogprobs
from flexnpu.serving.sampling import NUM_TOP_LOGPROBS, SamplingParams
from flexnpu.serving.tokenizer import Tokenizer

MAX_CHOICES = 64  # prompts x n per request
MAX_LOGPROBS = NUM_TOP_LOGPROBS  # what the device step returns
INT32_LIMIT = 2**31  # token ids and top_k go to the device step as int32

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class APIError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.param = status, param
        self.kind = kind or _ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = headers

    def body(self) -> dict:
        return {
            "error": {
                "message": str(self),
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# ---- requests ------------------------------------------------------------------------------


def get_field(
    body: dict, key: str, types: tuple, default: Any = None, check=None, what: str = ""
) -> Any:
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
    ("best_of", (1,), "best_of is not supported (only 1)"),
    ("use_beam_search", (False,), "beam search is not supported"),
    ("prompt_logprobs", (0,), "prompt_logprobs is not supported"),
    ("echo", (False,), "echo is not supported"),
    ("suffix", ("",), "suffix is not supported"),
    ("include_stop_str_in_output", (False,), "include_stop_str_in_output is not supported"),
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
        if (
            isinstance(v, int | float)
            and not isinstance(v, bool)
            and any(
                isinstance(n, int | float) and not isinstance(n, bool) and v == n for n in neutral
            )
        ):
            continue
        raise APIError(f"{message}; got {key}={json.dumps(v)[:60]}", param=key)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise APIError(
            "response_format is not supported (only {'type': 'text'}); got "
            f"{json.dumps(fmt)[:60]}",
            param="response_format",
        )


def parse_sampling(
    body: dict, chat: bool, default_max_tokens: int = 16
) -> tuple[SamplingParams, int | None]:
    """SamplingParams from the body and the explicit max_tokens (None when not given: then
    `default_max_tokens`)."""
    _reject_unsupported(body)
    max_tokens = get_field(
        body, "max_completion_tokens", (int,), None, lambda v: v >= 1, "a positive integer"
    )
    max_tokens = get_field(
        body, "max_tokens", (int,), max_tokens, lambda v: v >= 1, "a positive integer"
    )
    min_tokens = get_field(
        body, "min_tokens", (int,), 0, lambda v: v >= 0, "an integer >= 0 (vLLM's min_tokens)"
    )
    limit = max_tokens or default_max_tokens
    if min_tokens > limit:
        what = "max_tokens" if max_tokens else "the default max_tokens"
        raise APIError(
            f"'min_tokens' ({min_tokens}) must not exceed {what} ({limit})", param="min_tokens"
        )
    stop = get_field(body, "stop", (str, list), [], None, "a string or a list of strings")
    if isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a string or a list of non-empty strings", param="stop")
    # The device step holds token ids and top_k as int32: a larger value would fail the
    # engine's step (and with it every request of its instance), not just this request.
    stop_ids = get_field(
        body,
        "stop_token_ids",
        (list,),
        [],
        lambda v: all(_is_int(t) and 0 <= t < INT32_LIMIT for t in v),
        f"a list of token ids (integers in [0, {INT32_LIMIT}))",
    )
    top_k = get_field(
        body,
        "top_k",
        (int,),
        0,
        lambda v: -1 <= v < INT32_LIMIT,
        f"an integer in [-1, {INT32_LIMIT}) (-1, 0: off)",
    )
    if chat:
        want = get_field(body, "logprobs", (bool,), False, None, "a boolean")
        top = get_field(
            body,
            "top_logprobs",
            (int,),
            None,
            lambda v: 0 <= v <= MAX_LOGPROBS,
            f"an integer in [0, {MAX_LOGPROBS}]",
        )
        if top is not None and not want:
            raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = get_field(
            body,
            "logprobs",
            (int,),
            None,
            lambda v: 0 <= v <= MAX_LOGPROBS,
            f"an integer in [0, {MAX_LOGPROBS}]",
        )
    try:
        sp = SamplingParams(
            max_tokens=max_tokens or default_max_tokens,
            min_tokens=min_tokens,
            temperature=float(
                get_field(
                    body,
                    "temperature",
                    (int, float),
                    1.0,
                    lambda v: 0 <= v <= 2,
                    "a number in [0, 2]",
                )
            ),
            top_p=float(
                get_field(
                    body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]"
                )
            ),
            seed=get_field(
                body, "seed", (int,), None, lambda v: 0 <= v < 2**63, "an integer in [0, 2**63)"
            ),
            ignore_eos=get_field(body, "ignore_eos", (bool,), False, None, "a boolean"),
            skip_special_tokens=get_field(
                body, "skip_special_tokens", (bool,), True, None, "a boolean"
            ),
            stop=stop,
        )
        _set_if_supported(sp, "top_k", max(top_k, 0), 0)
        _set_if_supported(
            sp,
            "min_p",
            float(
                get_field(
                    body, "min_p", (int, float), 0.0, lambda v: 0 <= v <= 1, "a number in [0, 1]"
                )
            ),
            0.0,
        )
        _set_if_supported(sp, "stop_token_ids", list(stop_ids), [])
        _set_if_supported(sp, "logprobs", logprobs, None)
    except ValueError as e:
        raise APIError(str(e)) from None
    return sp, max_tokens


# A JSON \u escape of a UTF-16 surrogate (only escapes can carry one: UTF-8 cannot).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _is_unicode(v: Any) -> bool:
    """Whether every string in v (keys included) is valid Unicode, without lone surrogates."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(v, dict):
        return all(_is_unicode(k) and _is_unicode(x) for k, x in v.items())
    if isinstance(v, list):
        return all(_is_unicode(x) for x in v)
    return True


def check_unicode(raw: bytes, body: dict) -> None:
    """APIError naming the field whose string holds a lone surrogate escape (`"\ud800"`): JSON
    parses it, the tokenizer cannot take it (a TypeError, answered 500)."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    for key, value in body.items():
        if not (_is_unicode(key) and _is_unicode(value)):
            raise APIError(
                f"'{key.encode('utf-8', 'backslashreplace').decode()}' holds a string with a lone "
                "UTF-16 surrogate (an unpaired \\ud800-\\udfff escape): not valid Unicode",
                param=key.encode("utf-8", "backslashreplace").decode(),
            )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _set_if_supported(sp: SamplingParams, key: str, value: Any, neutral: Any) -> None:
    if hasattr(sp, key):
        setattr(sp, key, value)
    elif value != neutral:
        raise APIError(f"'{key}' is not supported by this engine", param=key)


def parse_prompts(prompt: Any, tok: Tokenizer) -> list[list[int]]:
    """A string, a list of strings, a list of token ids or a list of such lists."""

    def is_ids(x: Any) -> bool:
        return (
            isinstance(x, list)
            and bool(x)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
        )

    if isinstance(prompt, str):
        return [tok.encode(prompt)]
    if is_ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return [tok.encode(p) if isinstance(p, str) else list(p) for p in prompt]
    raise APIError(
        "'prompt' must be a string, a list of strings, a list of token ids or a "
        "list of token-id lists",
        param="prompt",
    )


def engine_error(e: BaseException) -> APIError | None:
    """The API error an engine exception means (told by class name); None: not one of them."""
    name = type(e).__name__
    if name == "QueueFullError":
        return APIError(
            f"The server is at capacity: {e}. Retry later.", 503, headers={"Retry-After": "1"}
        )
    if name == "EngineDeadError":
        return APIError(f"The engine has failed and is not serving: {e}", 503)
    if name == "RequestTooLongError":
        return APIError(str(e), 400, "max_tokens")
    return None


# ---- responses -----------------------------------------------------------------------------


@dataclass
class Choice:
    """One choice of a request (a prompt, or one of its n samples) and what it produced."""

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


def finish_error(c: Choice, timeout: float | None) -> APIError | None:
    """The API error of a choice that ended by timeout or failure; None otherwise."""
    if c.finish is None or c.finish in ("stop", "length", "abort"):
        return None
    if c.finish == "timeout":
        return APIError(
            f"The request did not finish within the server's request timeout of {timeout:g}s", 504
        )
    msg = c.finish.removeprefix("error:").strip()
    return APIError(f"Generation failed: {msg}", 500)


def _lp(x: float) -> float:
    return max(float(x), -9999.0) if not math.isnan(x) else -9999.0  # JSON has no -inf


def token_str(tok: Tokenizer, t: int) -> str:
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
        return {"token": token_str(tok, t), "logprob": _lp(lp), "bytes": list(tok.token_bytes(t))}

    return {
        "content": [
            {**item(t, lp.logprob), "top_logprobs": [item(i, v) for i, v in lp.top[:k]]}
            for t, lp in entries
        ]
    }


def _completion_logprobs(
    tok: Tokenizer, entries: list[tuple[int, TokenLogprobs]], k: int, offsets: list[int]
) -> dict:
    return {
        "tokens": [token_str(tok, t) for t, _ in entries],
        "token_logprobs": [_lp(lp.logprob) for _, lp in entries],
        "top_logprobs": [{token_str(tok, i): _lp(v) for i, v in lp.top[:k]} for _, lp in entries],
        "text_offset": offsets,
    }


@dataclass
class ResponseFormat:
    """The responses to one request in OpenAI's format: a (chat) completion, whole or as stream
    chunks. `top_logprobs`: the alternatives per token asked for (None: no logprobs)."""

    tokenizer: Tokenizer
    model: str
    chat: bool
    top_logprobs: int | None
    id: str = field(init=False)
    created: int = field(init=False)

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def usage(self, choices: list[Choice]) -> dict:
        n_in = sum(len(c.prompt_ids) for c in choices)
        n_out = sum(c.num_tokens for c in choices)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def logprobs(self, entries: list[tuple[int, TokenLogprobs]], offsets: list[int]) -> dict | None:
        k = self.top_logprobs
        if k is None:
            return None
        if self.chat:
            return _chat_logprobs(self.tokenizer, entries, k)
        return _completion_logprobs(self.tokenizer, entries, k, offsets)

    def response(self, choices: list[Choice]) -> dict:
        """The whole response (stream=false) once every choice finished."""
        out = []
        for c in choices:
            choice: dict[str, Any] = {
                "index": c.index,
                "finish_reason": c.finish,
                "logprobs": self.logprobs(c.logprobs, c.text_offsets),
            }
            if self.chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            out.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": self.usage(choices),
        }

    def chunk_choice(
        self, index: int, text: str, logprobs: dict | None, finish: str | None, first: bool
    ) -> dict:
        """One choice's part of a stream chunk; `first`: its first part (chat: the role)."""
        if self.chat:
            delta: dict[str, Any] = {"content": text} if text else {}
            if first:
                delta = {"role": "assistant", **delta}
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def chunk(self, parts: list[dict], extra: dict | None = None) -> dict:
        """A stream chunk of choice parts (extra: e.g. the usage)."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": parts,
            **(extra or {}),
        }
