"""Per-request output processing, called by the engine on its thread for every sampled token:
stop decisions (the model's eos ids unless `ignore_eos`, `stop_token_ids`, stop strings),
detokenization (tokenizers' DecodeStream), logprobs collection and the finish.

One stop semantics for `engine.generate()` (IdsOutput) and HTTP (TextOutput):
- before `min_tokens` tokens nothing stops a request (its stop ids are not even sampled: the
  step suppresses them, `suppressed_ids`);
- a stop *token* (eos or stop_token_ids) ends the request; it is counted in `num_tokens`
  (usage.completion_tokens, as vLLM does) but neither its id (IdsOutput.ids) nor its text is
  shown, nor its logprobs;
- a stop *string* ends the request at the token whose text completes it; the text is cut just
  before the stop string (OpenAI semantics); the token itself is in `ids`;
- while a stop string could still be forming, the text that might be its start is held back and
  sent only once it is known not to be one (or at the finish).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flexnpu.serving.sampling import SamplingParams
    from flexnpu.serving.tokenizer import Tokenizer

FINISH_REASONS = ("stop", "length", "abort", "timeout")  # or "error: <message>"


@dataclass
class TokenLogprobs:
    logprob: float  # of the sampled token
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


class RequestOutput(Protocol):
    def on_token(self, token_id: int, logprobs: TokenLogprobs | None, now: float) -> str | None:
        """Each sampled token, in order. Returns "stop" when the request must stop here, else
        None. Must not block."""
        ...

    def on_finish(self, reason: str, now: float) -> None:
        """Exactly once: "stop", "length", "abort", "timeout" or "error: <message>"."""
        ...


def stop_token_ids(sampling: SamplingParams, eos_ids: Collection[int]) -> frozenset[int]:
    """The ids that end a request: its stop_token_ids, plus the model's eos ids unless
    ignore_eos."""
    ids = set(getattr(sampling, "stop_token_ids", None) or ())
    if not sampling.ignore_eos:
        ids.update(eos_ids)
    return frozenset(ids)


def suppressed_ids(sampling: SamplingParams, eos_ids: Collection[int]) -> tuple[int, ...]:
    """What min_tokens keeps from being sampled until that many tokens (as vLLM): the request's
    stop token ids (above); none without min_tokens. ValueError naming the fields when they are
    more than a step row takes."""
    from flexnpu.serving.step_io import MAX_SUPPRESSED_IDS

    if not sampling.min_tokens:
        return ()
    ids = tuple(sorted(stop_token_ids(sampling, eos_ids)))
    if len(ids) > MAX_SUPPRESSED_IDS:
        raise ValueError(f"min_tokens with {len(ids)} stop token ids (stop_token_ids and the "
                         f"model's eos ids) is not supported; at most {MAX_SUPPRESSED_IDS}")
    return ids


class IdsOutput:
    """Token ids only (no tokenizer): eos / stop_token_ids; for engine.generate() and tests."""

    def __init__(self, sampling: SamplingParams, eos_ids: Collection[int]) -> None:
        self._stop_ids = stop_token_ids(sampling, eos_ids)
        self._min_tokens = sampling.min_tokens
        self.ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []
        self.num_tokens = 0  # tokens received, the stop token included
        self.finish_reason: str | None = None
        self.done = threading.Event()
        self._stopped = False

    def on_token(self, token_id: int, logprobs: TokenLogprobs | None, now: float) -> str | None:
        if self._stopped:  # the engine sends nothing past a stop; be safe if it does
            return "stop"
        self.num_tokens += 1
        if token_id in self._stop_ids and self.num_tokens >= self._min_tokens:
            self._stopped = True
            return "stop"
        self.ids.append(token_id)
        if logprobs is not None:
            self.logprobs.append(logprobs)
        return None

    def on_finish(self, reason: str, now: float) -> None:
        if self.finish_reason is None:
            self.finish_reason = _after_stop(reason, self._stopped)
            self.done.set()


def _after_stop(reason: str, stopped: bool) -> str:
    """A request that stopped finishes "stop", even if the engine's own finish (its length
    limit in the same step, an abort) reaches it first; errors stay errors."""
    return "stop" if stopped and not reason.startswith("error") else reason


@dataclass
class Delta:
    """What a request produced since the last Delta (the server turns it into a chunk)."""

    text: str
    token_ids: list[int]  # shown tokens since the last delta (stop tokens excluded)
    logprobs: list[TokenLogprobs]  # one per token_ids entry when logprobs were asked
    num_tokens: int  # completion tokens so far (usage), the stop token included
    finish_reason: str | None = None


class StopStrings:
    """Finds stop strings in growing text; says how much of the text is safe to show."""

    def __init__(self, stops: Collection[str]) -> None:
        self.stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, new_from: int) -> int:
        """Index of the earliest stop string that ends in text[new_from:], or -1."""
        start = max(0, new_from - self._longest + 1)
        hits = [i for s in self.stops if (i := text.find(s, start)) >= 0]
        return min(hits, default=-1)

    def safe_end(self, text: str) -> int:
        """len(text) minus its longest suffix that is a prefix of a stop string."""
        for k in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)


class TextOutput:
    """Detokenizes and applies stops for the HTTP server; every change goes to `emit` (called
    on the engine thread: it must not block, e.g. loop.call_soon_threadsafe)."""

    def __init__(self, tokenizer: Tokenizer, sampling: SamplingParams, eos_ids: Collection[int],
                 prompt_ids: list[int], emit: Callable[[Delta], None]) -> None:
        self._stop_ids = stop_token_ids(sampling, eos_ids)
        self._min_tokens = sampling.min_tokens
        self._stops = StopStrings(sampling.stop or ())
        self._stream = tokenizer.decode_stream(prompt_ids, sampling.skip_special_tokens)
        self._emit = emit
        self.text = ""
        self._sent = 0
        self.num_tokens = 0
        self._ids: list[int] = []
        self._lps: list[TokenLogprobs] = []
        self.stopped = False
        self.finish_reason: str | None = None

    def on_token(self, token_id: int, logprobs: TokenLogprobs | None, now: float) -> str | None:
        if self.stopped:
            return "stop"
        self.num_tokens += 1
        may_stop = self.num_tokens >= self._min_tokens  # vLLM: no stop before min_tokens
        if token_id in self._stop_ids and may_stop:
            self.stopped = True
            return "stop"
        self._ids.append(token_id)
        if logprobs is not None:
            self._lps.append(logprobs)
        piece = self._stream.step(token_id)
        if piece:
            before = len(self.text)
            self.text += piece
            if self._stops.stops and may_stop:
                cut = self._stops.find(self.text, before)
                if cut >= 0:
                    self.text = self.text[:cut]
                    self.stopped = True
                    return "stop"
        end = self._stops.safe_end(self.text) if self._stops.stops else len(self.text)
        if end > self._sent or self._lps:
            self._send(end, None)
        return None

    def on_finish(self, reason: str, now: float) -> None:
        if self.finish_reason is not None:
            return
        self.finish_reason = reason = _after_stop(reason, self.stopped)
        self._send(len(self.text), reason)  # what was held back is not a stop string

    def _send(self, end: int, reason: str | None) -> None:
        text, self._sent = self.text[self._sent:end], max(self._sent, end)
        ids, self._ids = self._ids, []
        lps, self._lps = self._lps, []
        self._emit(Delta(text, ids, lps, self.num_tokens, reason))


def observe_token(metrics: Any, req: Any, now: float) -> None:
    """A token of `req` arrived at `now`: its first / last token times and, with `metrics`
    (ServingMetrics or None), TTFT or the inter-token latency. The engine and the multi-host
    front keep their requests' token timing this one way."""
    if req.first_token_time is None:
        req.first_token_time = now
        if metrics:
            metrics.on_first_token(req, now)
    elif metrics and req.last_token_time is not None:
        metrics.on_token(now - req.last_token_time)
    req.last_token_time = now


def deliver_finish(metrics: Any, req: Any, reason: str, now: float) -> None:
    """`req` finished with `reason`: its metrics, then its output told; a broken output prints
    its traceback and takes nothing else down."""
    if metrics:
        metrics.on_finish(req, now)
        metrics.on_reason(reason.split(":")[0])
    try:
        req.output.on_finish(reason, now)
    except Exception:  # noqa: BLE001 - a broken output must not take the server down
        traceback.print_exc()
