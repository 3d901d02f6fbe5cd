"""One host's engine replica, run in that host's own process (a Ray actor, or in-process for
tests): it builds an Engine over the host's devices and serves it to a front through a few
plain calls whose arguments and results pickle (`submit`, `abort`, `poll`, `metrics_text`).

Tokens go back by polling: `poll` blocks until some request has new tokens or a finish (or
`wait_s` passes) and returns them all, with the replica's load, so a front needs one call per
replica in flight, not one per request or token. Stop tokens are decided here (the engine must
stop generating); stop strings and detokenization stay with the front, which aborts a request
its own output stopped.

Later steps (KV handoff across hosts) add calls to this interface, e.g. extracting a prefilled
sequence's KV and inserting it into another replica's engine; nothing here assumes they do not
exist (requests are keyed by the front's ids, not the engine's)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flexnpu.serving.output import IdsOutput, TokenLogprobs
from flexnpu.serving.sampling import SamplingParams

DEVICES_RESOURCE = "flexnpu_devices"  # the Ray custom resource a host offers its devices as


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica builds (the `serve` options), in a form that pickles to other hosts."""

    model: str
    engine_config: Any  # an EngineConfig, or a callable devices -> EngineConfig (the CLI's)
    dtype: str = "float32"
    seed: int = 0
    tokenizer: str | None = None  # a tokenizer directory on every host
    policy: str | None = None  # the placer's policy (FLEXNPU_POLICY syntax)
    served_model_name: str | None = None
    warmup: bool = True
    compilation_cache: str | None = "default"  # "default": the host's user cache; None: off
    backend_log_level: str = "fatal"
    env: dict[str, str] = field(default_factory=dict)  # set before JAX starts, over the host's


@dataclass(frozen=True)
class ReplicaInfo:
    """What a started replica reports once (the front checks that replicas agree)."""

    name: str
    host: str
    node_id: str
    pid: int
    devices: str  # e.g. "4 flexnpu devices (cpu)"
    layout: str  # the engine's, as `serve` prints it
    model_name: str
    model_config: Any  # LlamaConfig
    eos_ids: tuple[int, ...]
    max_model_len: int
    engine_config: Any  # EngineConfig
    start_seconds: float


@dataclass(frozen=True)
class ReplicaStatus:
    """The replica's load, sent with every poll: the router's key (the least loaded entry
    instance's `Scheduler.load_key()`), the engine's totals and health, and how many submits it
    has taken (the front counts those it sent but not yet seen taken as load too)."""

    load_key: tuple[int, int, float]
    num_running: int
    num_waiting: int
    kv_usage: float
    submitted: int
    healthy: bool
    error: str | None


@dataclass
class RequestEvents:
    """What one request produced since the last poll."""

    tokens: list[tuple[int, TokenLogprobs | None]] = field(default_factory=list)
    finish: str | None = None


class _ForwardingOutput(IdsOutput):
    """Stops on stop tokens (as IdsOutput: the engine stops the request) and hands every sampled
    token, the stop token too, to the replica's event buffer for the front's own output."""

    def __init__(
        self, rid: int, sampling: SamplingParams, eos_ids: Any, events: _EventBuffer
    ) -> None:
        super().__init__(sampling, eos_ids)
        self._rid, self._events = rid, events

    def on_token(self, token_id: int, logprobs: TokenLogprobs | None, now: float) -> str | None:
        reason = super().on_token(token_id, logprobs, now)
        self._events.token(self._rid, token_id, logprobs)
        return reason

    def on_finish(self, reason: str, now: float) -> None:
        super().on_finish(reason, now)
        self._events.finish(self._rid, reason)


class _EventBuffer:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[int, RequestEvents] = {}

    def token(self, rid: int, token_id: int, logprobs: TokenLogprobs | None) -> None:
        with self._cond:
            self._pending.setdefault(rid, RequestEvents()).tokens.append((token_id, logprobs))
            self._cond.notify_all()

    def finish(self, rid: int, reason: str) -> None:
        with self._cond:
            self._pending.setdefault(rid, RequestEvents()).finish = reason
            self._cond.notify_all()

    def take(self, wait_s: float) -> dict[int, RequestEvents]:
        with self._cond:
            if not self._pending:
                self._cond.wait(wait_s)
            taken, self._pending = self._pending, {}
        return taken


class ReplicaServer:
    """The replica: `start()` builds and starts the engine (minutes: loading, compiling), then
    the front submits, aborts and polls. Thread-safe (a Ray actor runs calls on several
    threads)."""

    def __init__(
        self,
        spec: ReplicaSpec,
        name: str,
        node_id: str = "",
        num_devices: int = 0,
        log: Callable[[str], Any] | None = None,
    ) -> None:
        self.spec, self.name, self.node_id = spec, name, node_id
        self.num_devices = num_devices  # the host's offered devices; 0: all of jax.devices()
        self._log = log  # None: print (not a default argument: the class travels by pickle)
        self.engine: Any = None
        self._events = _EventBuffer()
        self._lock = threading.Lock()
        self._requests: dict[int, Any] = {}  # front id -> engine Request
        self._submitted = 0

    def log(self, line: str) -> None:
        if self._log is None:
            print(line, flush=True)
        else:
            self._log(line)

    # ---- start-up -----------------------------------------------------------------------

    def start(self) -> ReplicaInfo:
        t0 = time.perf_counter()
        spec = self.spec
        os.environ.update(spec.env)
        if spec.policy is not None:
            os.environ["FLEXNPU_POLICY"] = spec.policy
        from flexnpu.serving import logs

        logs.set_backend_log_level(spec.backend_log_level)
        import jax

        if not jax.config.jax_platforms and not os.environ.get("JAX_PLATFORMS"):
            jax.config.update("jax_platforms", "flexnpu")  # as `serve`: flexnpu unless told
        cache = self._cache_directory()
        if cache is not None:
            from flexnpu import compilation_cache

            compilation_cache.use_directory(cache)
        devices = self._devices(jax.devices())
        from flexnpu.serving.engine import Engine
        from flexnpu.serving.loading import load_model
        from flexnpu.serving.metrics import ServingMetrics
        from flexnpu.serving.runner import ModelSteps

        ec = spec.engine_config
        if callable(ec):
            ec = ec(devices)
        m = load_model(
            spec.model,
            spec.dtype,
            spec.seed,
            tokenizer=spec.tokenizer,
            log=lambda line: self.log(f"{self.name}: {line}"),
        )
        name = spec.served_model_name or m.name
        self.metrics = ServingMetrics(name)
        steps = ModelSteps(m.config, ec.block_size, m.vocab_limit)
        engine = Engine(
            steps, m.params, ec, devices=devices, metrics=self.metrics, eos_ids=m.eos_ids
        )
        if spec.warmup:
            engine.warmup()
        engine.start()
        self.engine = engine
        where = ", ".join(f"{x.role.value} on {x.device}" for x in engine.instances)
        return ReplicaInfo(
            name=self.name,
            host=socket.gethostname(),
            node_id=self.node_id,
            pid=os.getpid(),
            devices=describe_devices(devices),
            layout=f"{ec.layout}: {where}",
            model_name=name,
            model_config=m.config,
            eos_ids=tuple(sorted(engine.eos_ids)),
            max_model_len=engine.max_model_len,
            engine_config=ec,
            start_seconds=time.perf_counter() - t0,
        )

    def _cache_directory(self) -> str | None:
        cache = self.spec.compilation_cache
        if cache != "default":
            return cache
        from flexnpu import compilation_cache

        directory = compilation_cache.default_directory()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.log(
                f"{self.name}: compilation cache {directory}: {e.strerror or e}; "
                "going on without it"
            )
            return None
        return str(directory)

    def _devices(self, devices: Sequence[Any]) -> list[Any]:
        """The first `num_devices` of the host's devices (what it offers to serving)."""
        if not devices:
            raise RuntimeError(f"{self.name}: JAX has no devices on this host")
        n = self.num_devices or len(devices)
        if n > len(devices):
            self.log(
                f"{self.name}: the host offers {n} {DEVICES_RESOURCE} but JAX sees "
                f"{len(devices)} devices; serving on those"
            )
            n = len(devices)
        return list(devices[:n])

    # ---- serving --------------------------------------------------------------------------

    def submit(
        self,
        rid: int,
        prompt_ids: list[int],
        sampling: SamplingParams,
        timeout_s: float | None = None,
        priority: int = 0,
    ) -> None:
        """Queues the front's request `rid`; its tokens and finish come back through `poll`
        (a refusal, e.g. a full queue, as an "error: ..." finish). `timeout_s`: what is left of
        its deadline (clocks differ between hosts)."""
        deadline = time.perf_counter() + timeout_s if timeout_s is not None else None
        out = _ForwardingOutput(rid, sampling, self.engine.eos_ids, self._events)
        try:
            req = self.engine.submit(
                prompt_ids, sampling, out, deadline=deadline, priority=priority
            )
        except Exception as e:  # noqa: BLE001 - told to the front as the request's finish
            out.on_finish(
                f"error: replica {self.name} refused the request: {type(e).__name__}: {e}",
                time.perf_counter(),
            )
            return
        finally:
            with self._lock:
                self._submitted += 1
        with self._lock:
            if not req.done:
                self._requests[rid] = req

    def abort(self, rid: int) -> None:
        with self._lock:
            req = self._requests.pop(rid, None)
        if req is not None:
            self.engine.abort(req)

    def poll(self, wait_s: float = 0.05) -> tuple[dict[int, RequestEvents], ReplicaStatus]:
        """New tokens and finishes per request (blocks up to `wait_s` while there are none) and
        the replica's status."""
        events = self._events.take(wait_s)
        finished = [rid for rid, ev in events.items() if ev.finish is not None]
        with self._lock:
            for rid in finished:
                self._requests.pop(rid, None)
        return events, self.status()

    def status(self) -> ReplicaStatus:
        eng = self.engine
        with self._lock:
            submitted = self._submitted
        return ReplicaStatus(
            load_key=eng.entry_load_key(),
            num_running=eng.num_running(),
            num_waiting=eng.num_waiting(),
            kv_usage=eng.kv_usage(),
            submitted=submitted,
            healthy=bool(eng.healthy),
            error=eng.error,
        )

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def describe_devices(devices: Sequence[Any]) -> str:
    """E.g. "4 flexnpu devices over emulated ascend910c" or "4 flexnpu devices over cpu"."""
    from flexnpu.serving.layout import emulated_device_kind, physical_platform

    first = devices[0]
    emulated = emulated_device_kind(first)
    under = f"emulated {emulated}" if emulated else physical_platform(first)
    return f"{len(devices)} {first.platform} devices over {under}"
