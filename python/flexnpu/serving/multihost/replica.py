"""One host's engine replica, run in that host's own process (a Ray actor, or in-process for
tests): it builds an Engine over the host's devices and serves it to a front through a few
plain calls whose arguments and results pickle (`submit`, `abort`, `poll`, `metrics_text`).

Tokens go back by polling: `poll` blocks until some request has new tokens or a finish (or
`wait_s` passes) and returns them all, with the replica's load, so a front needs one call per
replica in flight, not one per request or token. Stop tokens are decided here (the engine must
stop generating); stop strings and detokenization stay with the front, which aborts a request
its own output stopped.

KV handoff across hosts: `submit(..., export=True)` stops a request at its first token and keeps
its KV here (the poll says `prefilled`); `take_kv` gives that KV as host arrays (the replica
that continues the request asks for it: through Ray, the bytes go from this host to that one,
not through the front); `submit_prefilled` continues a request prefilled elsewhere (its KV
fetched by `fetch_kv`, or this replica's own export left on its device: the same-host path).
`export_running` does to running requests what `export=True` does at the first token (the host
stops decoding: they go on elsewhere, their KV through `take_kv` as above). Requests are keyed
by the front's ids, not the engine's."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flexnpu.serving.output import IdsOutput, TokenLogprobs
from flexnpu.serving.sampling import SamplingParams

DEVICES_RESOURCE = "flexnpu_devices"  # the Ray custom resource a host offers its devices as
# A prefilled KV nobody fetched this long is dropped (the replica meant to fetch it died).
EXPORT_TTL_S = 300.0


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
    measure_prefill: bool = False  # time a full prefill step at start (ReplicaInfo)


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
    # Measured when the spec asks (the front's adaptive layout sizes hosts by it): the host's
    # prefill throughput at full batches (tokens/s, all its entry instances), its decode batch
    # (sequences) and wall seconds per device second (emulated devices).
    prefill_tokens_per_s: float = 0.0
    decode_batch: int = 0
    time_scale: float = 1.0
    num_devices: int = 0  # the devices its engine serves on


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
    waiting_tokens: int = 0  # prompt tokens queued, not yet computed
    prefilled_taken: int = 0  # submit_prefilled calls taken (the front counts the rest as load)
    free_slots: int = 0  # sequences it would start at once (Engine.entry_free_slots)


@dataclass(frozen=True)
class PrefillDone:
    """A request stopped after its prompt here (or later: moved by `export_running`), its KV
    kept for `take_kv`: what the replica that continues it needs besides the KV."""

    output_ids: tuple[int, ...]  # sampled here (all of them for a moved request)
    seed_words: tuple[int, int]
    num_blocks: int
    nbytes: int  # what take_kv's arrays weigh
    moved: bool = False  # by export_running


@dataclass(frozen=True)
class Continuation:
    """What `submit_prefilled` continues: request `rid`, prefilled (or moved) on replica
    `source` (`done`), its KV behind `kv` (`fetch_kv`'s handle; None: this replica's own
    export, still on its device); `timeout_s`: what is left of its deadline."""

    rid: int
    prompt_ids: list[int]
    sampling: SamplingParams
    done: PrefillDone
    kv: Any
    source: str
    timeout_s: float | None = None
    priority: int = 0


@dataclass(frozen=True)
class KvReceived:
    """A handed-off KV this replica fetched from another: from which, how much, how long the
    fetch took (from the call to the arrays on this host)."""

    source: str  # the replica it came from
    nbytes: int
    seconds: float


@dataclass
class RequestEvents:
    """What one request produced since the last poll."""

    tokens: list[tuple[int, TokenLogprobs | None]] = field(default_factory=list)
    finish: str | None = None
    prefilled: PrefillDone | None = None  # stopped after its prompt (submit(export=True))
    kv_received: KvReceived | None = None  # its KV came from another replica


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
        if reason not in ("prefilled", "moved"):  # the export's event says it (it goes on)
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

    def prefilled(self, rid: int, done: PrefillDone) -> None:
        with self._cond:
            self._pending.setdefault(rid, RequestEvents()).prefilled = done
            self._cond.notify_all()

    def kv_received(self, rid: int, received: KvReceived) -> None:
        with self._cond:
            self._pending.setdefault(rid, RequestEvents()).kv_received = received
            self._cond.notify_all()

    def take(self, wait_s: float) -> dict[int, RequestEvents]:
        with self._cond:
            if not self._pending:
                self._cond.wait(wait_s)
            taken, self._pending = self._pending, {}
        return taken


class _Turns:
    """Tickets taken in one order let their holders through one at a time in that order,
    whatever order they come in (KV fetches that end in any order enter the engine in the
    order their handoffs were sent)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._taken = 0  # tickets given out
        self._next = 0  # the ticket whose turn it is
        self._closed = False  # the replica stops: nobody waits

    def take(self) -> int:
        with self._cond:
            self._taken += 1
            return self._taken - 1

    @contextlib.contextmanager
    def turn(self, ticket: int) -> Iterator[None]:
        """Waits for `ticket`'s turn; the next ticket's comes when the block ends."""
        with self._cond:
            self._cond.wait_for(lambda: self._next == ticket or self._closed)
        try:
            yield
        finally:
            with self._cond:
                self._next = max(self._next, ticket + 1)
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


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
        # front id -> (when, PrefilledSequence) kept for take_kv, oldest first
        self._exports: dict[int, tuple[float, Any]] = {}
        self._continuing: set[int] = set()  # submit_prefilled taken, its KV being fetched
        self._move_pending: set[int] = set()  # of those, to move on once in the engine
        self._handoff_order = _Turns()  # continuations enter the engine in arrival order
        self._prefilled_taken = 0
        self._fetcher: ThreadPoolExecutor | None = None

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
        from flexnpu.serving.layout import emulated_time_scale
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
        rate = 0.0
        if spec.measure_prefill:
            entry = [x for x in engine.instances if x.role.value != "decode"]
            tokens, seconds = entry[0].runner.time_prefill_step()
            rate = len({x.device for x in entry}) * tokens / seconds
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
            prefill_tokens_per_s=rate,
            decode_batch=ec.max_num_seqs * len(engine.instances),
            time_scale=emulated_time_scale(devices[0]),
            num_devices=len(devices),
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
        export: bool = False,
    ) -> None:
        """Queues the front's request `rid`; its tokens and finish come back through `poll`
        (a refusal, e.g. a full queue, as an "error: ..." finish). `timeout_s`: what is left of
        its deadline (clocks differ between hosts). `export`: it stops at its first token and
        its KV stays here for `take_kv` or `submit_prefilled` (the poll says `prefilled`)."""
        deadline = time.perf_counter() + timeout_s if timeout_s is not None else None
        out = _ForwardingOutput(rid, sampling, self.engine.eos_ids, self._events)
        try:
            req = self.engine.submit(
                prompt_ids,
                sampling,
                out,
                deadline=deadline,
                priority=priority,
                export=(lambda p: self._exported(rid, p)) if export else None,
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

    def export_running(self, rids: list[int] | None = None) -> None:
        """Moves requests `rids` (None: all) off this replica (its host stops decoding): each
        stops at its next token (Engine.export_running) and its KV stays here for `take_kv`
        (the poll says `prefilled`, with `moved`); one whose KV is still being fetched, once
        it is in the engine. Requests not here (finished, aborted, exported) are skipped."""
        with self._lock:
            wanted = set(self._requests) | self._continuing if rids is None else set(rids)
            picked = {r: self._requests[r] for r in wanted if r in self._requests}
            self._move_pending |= wanted & self._continuing
        for rid, req in picked.items():
            self._export_running(rid, req)

    def _export_running(self, rid: int, req: Any) -> None:
        """(A refusal, e.g. an engine without the handoff programs, ends the request: the
        front does not hear of an exception in a call it did not wait for.)"""
        try:
            self.engine.export_running([req], lambda _, p: self._exported(rid, p, moved=True))
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._requests.pop(rid, None)
            why = f"error: moving the request off replica {self.name} failed: {first_line(e)}"
            self.engine.abort(req, why)

    def _exported(self, rid: int, prefilled: Any, moved: bool = False) -> None:
        with self._lock:
            self._requests.pop(rid, None)
            now = time.monotonic()
            for old, (when, _) in list(self._exports.items()):
                if now - when < EXPORT_TTL_S:
                    break
                del self._exports[old]
            self._exports[rid] = (now, prefilled)
        done = PrefillDone(
            tuple(prefilled.output_ids),
            prefilled.seed_words,
            prefilled.num_blocks,
            prefilled.nbytes,
            moved,
        )
        self._events.prefilled(rid, done)

    def take_kv(self, rid: int) -> tuple[Any, Any]:
        """The KV request `rid` was prefilled with here, as host arrays (given once)."""
        with self._lock:
            kept = self._exports.pop(rid, None)
        if kept is None:
            raise KeyError(
                f"replica {self.name} holds no prefilled KV of request {rid} (aborted, "
                "or already taken)"
            )
        return kept[1].host_kv()

    def fetch_kv(self, source: Any) -> tuple[Any, Any]:
        """The KV `submit_prefilled` was given a handle of: here the arrays themselves, or a
        call that returns them (the Ray replica fetches an object reference)."""
        return source() if callable(source) else source

    def submit_prefilled(self, c: Continuation) -> None:
        """Continues request `c.rid`, prefilled (or moved) by replica `c.source`: its KV is
        fetched (`fetch_kv(c.kv)`) on a thread of this replica, then the engine decodes it;
        kv None: this replica's own export, left on its device (no copy through the host). A KV
        that cannot be fetched finishes the request with an error naming `c.source`."""
        deadline = time.perf_counter() + c.timeout_s if c.timeout_s is not None else None
        with self._lock:
            self._continuing.add(c.rid)
            if self._fetcher is None:
                self._fetcher = ThreadPoolExecutor(2, thread_name_prefix="flexnpu-kv-fetch")
            fetcher = self._fetcher
            ticket = self._handoff_order.take()  # calls come in the front's order
        fetcher.submit(self._continue, c, deadline, ticket)

    def _continue(self, c: Continuation, deadline: float | None, ticket: int) -> None:
        """Fetches the KV (in parallel with other handoffs), then enters the engine in the
        order the handoffs were sent: the engine queues them first come, first served, and a
        fetch that ends sooner must not give a later handoff an earlier one's batch slot."""
        rid = c.rid
        out = _ForwardingOutput(rid, c.sampling, self.engine.eos_ids, self._events)
        out.num_tokens = len(c.done.output_ids)  # for min_tokens: those came from `source`
        try:
            prefilled = self._fetch(c)
        except Exception as e:  # noqa: BLE001 - told to the front as the request's finish
            with self._handoff_order.turn(ticket), self._lock:
                self._continuing.discard(rid)
                self._move_pending.discard(rid)
                self._prefilled_taken += 1
            out.on_finish(
                f"error: the KV handoff from replica {c.source} failed: {first_line(e)}",
                time.perf_counter(),
            )
            return
        req = refused = None
        with self._handoff_order.turn(ticket), self._lock:
            self._prefilled_taken += 1
            if rid not in self._continuing:  # aborted meanwhile
                return
            self._continuing.discard(rid)
            move = rid in self._move_pending
            self._move_pending.discard(rid)
            try:
                req = self.engine.submit_prefilled(
                    prefilled, c.sampling, out, deadline=deadline, priority=c.priority
                )
            except Exception as e:  # noqa: BLE001
                refused = f"error: replica {self.name} refused the request: {first_line(e)}"
            else:
                if not req.done:
                    self._requests[rid] = req
        if refused is not None:
            out.on_finish(refused, time.perf_counter())
        elif move and req is not None:  # its host stopped decoding while the KV came
            self._export_running(rid, req)

    def _fetch(self, c: Continuation) -> Any:
        """The PrefilledSequence `c` continues: this replica's own export, or one built from
        the KV fetched from `c.source` (its arrival reported in the next poll)."""
        from flexnpu.serving.engine import PrefilledSequence

        if c.kv is None:
            with self._lock:
                return self._exports.pop(c.rid)[1]
        t0 = time.perf_counter()
        k, v = self.fetch_kv(c.kv)
        received = KvReceived(c.source, k.nbytes + v.nbytes, time.perf_counter() - t0)
        self._events.kv_received(c.rid, received)
        done = c.done
        return PrefilledSequence(
            list(c.prompt_ids),
            list(done.output_ids),
            tuple(done.seed_words),
            done.num_blocks,
            self.engine.ec.block_size,
            k,
            v,
        )

    def abort(self, rid: int, reason: str = "abort") -> None:
        """Ends `rid` here, counted as `reason` in this replica's series ("rebalanced": the
        front sent it to another host)."""
        with self._lock:
            req = self._requests.pop(rid, None)
            self._exports.pop(rid, None)
            self._continuing.discard(rid)
            self._move_pending.discard(rid)
        if req is not None:
            self.engine.abort(req, reason)

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
            submitted, prefilled_taken = self._submitted, self._prefilled_taken
        return ReplicaStatus(
            load_key=eng.entry_load_key(),
            num_running=eng.num_running(),
            num_waiting=eng.num_waiting(),
            kv_usage=eng.kv_usage(),
            submitted=submitted,
            healthy=bool(eng.healthy),
            error=eng.error,
            waiting_tokens=sum(x.sched.waiting_tokens for x in eng.instances),
            prefilled_taken=prefilled_taken,
            free_slots=eng.entry_free_slots(),
        )

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self._handoff_order.close()  # no fetch waits for a turn that never comes
        if self._fetcher is not None:
            self._fetcher.shutdown(wait=False, cancel_futures=True)


def first_line(e: BaseException) -> str:
    """An error in one line, named by its type: Ray's errors run to many lines (tracebacks, the
    actor's fields), so the line that says why (an actor's death: "The actor is dead because
    ..."), else the first."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    why = next((x for x in lines if "because" in x), lines[0] if lines else "")
    return f"{type(e).__name__}: {why}"


def describe_devices(devices: Sequence[Any]) -> str:
    """E.g. "4 flexnpu devices over emulated ascend910c" or "4 flexnpu devices over cpu"."""
    from flexnpu.serving.layout import emulated_device_kind, physical_platform

    first = devices[0]
    emulated = emulated_device_kind(first)
    under = f"emulated {emulated}" if emulated else physical_platform(first)
    return f"{len(devices)} {first.platform} devices over {under}"
