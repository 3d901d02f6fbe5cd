"""The front of a multi-host cluster: one object with the Engine's API that the HTTP server
drives (`submit`, `abort`, `healthy`/`error`, `num_running`/`num_waiting`/`kv_usage`), over one
engine replica per host.

- Routing: a request goes to the live replica whose least loaded entry instance has the
  smallest `Scheduler.load_key()` (waiting tokens + waiting requests, then running, then KV
  usage: the in-host router's key), plus what the front sent it that the replica has not yet
  reported taking.
- Streaming: one poller thread per replica asks it for every new token and finish (one call
  per replica in flight, whatever the number of requests), then runs each request's own output
  (detokenization, stop strings) here; a stop decided here aborts the request on its replica.
- Faults: a replica whose poll fails (its actor or node died, or it stopped answering) is
  dropped; its requests that have not produced a token yet are sent to the other replicas, the
  others finish "error: replica <name> on host <host> died: <why>". The front is healthy while
  one replica lives.
- Growth: a watcher thread looks for hosts that offer devices and have no replica yet (a node
  that joins later) and starts one there.

The replicas are reached through a launcher (`ray_replicas.RayLauncher`: Ray actors; tests may
inject another), so this module does not import Ray.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flexnpu.serving.engine import EngineDeadError
from flexnpu.serving.multihost.replica import ReplicaInfo, ReplicaStatus, RequestEvents
from flexnpu.serving.output import RequestOutput, deliver_finish, observe_token
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.scheduler import QueueFullError


class RemoteReplica(Protocol):
    name: str
    host: str

    def start(self) -> ReplicaInfo: ...
    def submit(
        self,
        rid: int,
        prompt_ids: list[int],
        sampling: SamplingParams,
        timeout_s: float | None,
        priority: int,
    ) -> None: ...
    def abort(self, rid: int) -> None: ...
    def poll(
        self, wait_s: float, timeout_s: float
    ) -> tuple[dict[int, RequestEvents], ReplicaStatus]: ...
    def metrics_text(self, timeout_s: float) -> bytes | None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    def offering_nodes(self) -> list[Any]: ...  # each with .node_id and .host
    def launch(self, node: Any) -> RemoteReplica: ...


@dataclass(eq=False)
class ClusterRequest:
    """A request as the front knows it (what `submit` returns, for `abort`)."""

    id: int
    prompt_ids: list[int]
    sampling: SamplingParams
    output: RequestOutput
    deadline: float | None  # the front's perf_counter
    priority: int
    arrival: float = field(default_factory=time.perf_counter)
    replica: str | None = None
    num_tokens: int = 0  # tokens delivered to the output
    reroutes: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class _Replica:
    handle: RemoteReplica
    info: ReplicaInfo
    status: ReplicaStatus
    sent: int = 0  # submits sent to it
    unacked_tokens: list[int] = field(default_factory=list)  # prompt lengths, oldest first
    live: bool = True
    requests: set[int] = field(default_factory=set)
    thread: threading.Thread | None = None

    def route_key(self) -> tuple[int, int, float]:
        """Its load key with the submits it has not reported taking counted as waiting."""
        waiting, running, kv = self.status.load_key
        unacked = self.unacked_tokens[
            max(0, len(self.unacked_tokens) - (self.sent - self.status.submitted)) :
        ]
        return waiting + sum(unacked) + len(unacked), running, kv


@dataclass
class FrontConfig:
    poll_wait_s: float = 0.05  # a poll returns after this long when nothing happened
    liveness_timeout_s: float = 60.0  # a replica that answers no poll this long is dead
    discover_interval_s: float = 2.0  # how often to look for hosts that joined
    metrics_timeout_s: float = 1.0  # a replica's /metrics part waits at most this


class ClusterFront:
    def __init__(
        self,
        launcher: Launcher,
        metrics: Any = None,
        config: FrontConfig | None = None,
        log: Callable[[str], Any] = print,
    ) -> None:
        self.launcher = launcher
        self.metrics = metrics  # ServingMetrics of the front (its own latencies, as clients see)
        self.config = config or FrontConfig()
        self.log = log
        self.host = socket.gethostname()
        self._lock = threading.RLock()
        self._replicas: dict[str, _Replica] = {}
        self._nodes_seen: set[str] = set()  # nodes given a replica (started, starting or dead)
        self._requests: dict[int, ClusterRequest] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._first: ReplicaInfo | None = None
        self.reroutes = 0
        self.replica_failures = 0
        self.start_failures: list[str] = []

    # ---- start-up and shutdown ------------------------------------------------------------

    def start(self) -> list[ReplicaInfo]:
        """Starts a replica on every offering node and waits for them; then keeps looking for
        new nodes. Raises RuntimeError when no node offers devices or no replica started."""
        nodes = self.launcher.offering_nodes()
        if not nodes:
            raise RuntimeError(
                "no node of the Ray cluster offers the custom resource flexnpu_devices (start "
                "nodes with: ray start ... --resources '{\"flexnpu_devices\": 4}')"
            )
        started = self._start_replicas(nodes)
        if not started:
            raise RuntimeError("no replica started: " + "; ".join(self.start_failures))
        self._watcher = threading.Thread(
            target=self._watch, name="flexnpu-front-watch", daemon=True
        )
        self._watcher.start()
        return started

    def _start_replicas(self, nodes: list[Any]) -> list[ReplicaInfo]:
        """Starts replicas on `nodes` in parallel (each loads and compiles in its own process)
        and adds those that start; returns their infos."""
        handles = []
        for node in nodes:
            with self._lock:
                self._nodes_seen.add(node.node_id)
            try:
                handles.append(self.launcher.launch(node))
            except Exception as e:  # noqa: BLE001 - one host's failure is reported, not fatal
                self._start_failed(str(e))
        results: list[ReplicaInfo | None] = [None] * len(handles)

        def start(i: int) -> None:
            try:
                results[i] = handles[i].start()
            except Exception as e:  # noqa: BLE001
                self._start_failed(str(e))

        threads = [
            threading.Thread(target=start, args=(i,), daemon=True) for i in range(len(handles))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        started = []
        for handle, info in zip(handles, results, strict=True):
            if info is not None and self._add(handle, info):
                started.append(info)
        return started

    def _start_failed(self, message: str) -> None:
        self.start_failures.append(message)
        self.log(f"front: {message}")

    def _add(self, handle: RemoteReplica, info: ReplicaInfo) -> bool:
        with self._lock:
            if self._stop.is_set():
                handle.kill()
                return False
            first = self._first
            if first is not None and (
                info.model_config != first.model_config
                or info.max_model_len != first.max_model_len
                or info.eos_ids != first.eos_ids
            ):
                handle.kill()
                self._start_failed(
                    f"replica {info.name} on host {info.host} serves another "
                    f"model or context than {first.name}; not used"
                )
                return False
            if first is None:
                self._first = info
            status = ReplicaStatus((0, 0, 0.0), 0, 0, 0.0, 0, True, None)
            rep = _Replica(handle, info, status)
            self._replicas[info.name] = rep
            rep.thread = threading.Thread(
                target=self._poll_loop, args=(rep,), name=f"flexnpu-front-{info.name}", daemon=True
            )
            rep.thread.start()
        self.log(
            f"replica {info.name} on host {info.host} (pid {info.pid}): {info.devices}, "
            f"{info.layout}; ready in {info.start_seconds:.1f}s"
        )
        return True

    def stop(self) -> None:
        """Aborts what is in flight, stops the threads and kills the replicas."""
        self._stop.set()
        with self._lock:
            live = [r for r in self._requests.values() if not r.done]
            replicas = list(self._replicas.values())
        for req in live:
            self.abort(req)
        for rep in replicas:
            if rep.thread is not None:
                rep.thread.join(timeout=5)
            rep.handle.kill()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    # ---- the Engine API the server uses -----------------------------------------------------

    @property
    def cfg(self) -> Any:
        return self._info().model_config

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._info().eos_ids

    @property
    def max_model_len(self) -> int:
        return self._info().max_model_len

    @property
    def ec(self) -> Any:
        return self._info().engine_config

    def _info(self) -> ReplicaInfo:
        if self._first is None:
            raise RuntimeError("the cluster front has no replica yet (call start())")
        return self._first

    @property
    def healthy(self) -> bool:
        return not self._stop.is_set() and bool(self._routable())

    @property
    def error(self) -> str | None:
        if self._stop.is_set():
            return "the server was stopped"
        if self._routable():
            return None
        return "no live replica" + (
            f" (last failure: {self._last_failure})" if self._last_failure else ""
        )

    _last_failure: str | None = None

    def replicas(self) -> list[ReplicaInfo]:
        """The live replicas."""
        with self._lock:
            return [r.info for r in self._replicas.values() if r.live]

    def submit(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        output: RequestOutput,
        *,
        deadline: float | None = None,
        priority: int = 0,
    ) -> ClusterRequest:
        """Routes the request to the least loaded live replica; its tokens go to `output` on a
        front thread. Raises EngineDeadError (no live replica), QueueFullError (every replica's
        queue is full), ValueError."""
        if self._stop.is_set():
            raise EngineDeadError("the server was stopped")
        vocab = self.cfg.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        req = ClusterRequest(
            next(self._ids), list(prompt_ids), sampling, output, deadline, priority
        )
        with self._lock:
            rep = self._route(req)
            if rep is None:
                raise EngineDeadError(f"the cluster is not serving: {self.error}")
            self._requests[req.id] = req
            self._send(rep, req)
        self.update_gauges()
        return req

    def abort(self, req: ClusterRequest) -> None:
        with self._lock:
            rep = self._replicas.get(req.replica or "")
        if rep is not None and rep.live and not req.done:
            rep.handle.abort(req.id)
        self._finish(req, "abort")

    def num_running(self) -> int:
        return sum(r.status.num_running for r in self._routable())

    def num_waiting(self) -> int:
        return sum(r.status.num_waiting for r in self._routable())

    def kv_usage(self) -> float:
        live = self._routable()
        return sum(r.status.kv_usage for r in live) / len(live) if live else 0.0

    def update_gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.set_gauges(self.num_running(), self.num_waiting(), self.kv_usage())

    def replica_metrics(self) -> list[tuple[ReplicaInfo, bytes]]:
        """Each live replica's own /metrics text (those that answer in time)."""
        with self._lock:
            live = [r for r in self._replicas.values() if r.live]
        out = []
        for rep in live:
            text = rep.handle.metrics_text(self.config.metrics_timeout_s)
            if text is not None:
                out.append((rep.info, text))
        return out

    # ---- routing -------------------------------------------------------------------------

    def _routable(self) -> list[_Replica]:
        with self._lock:
            return [r for r in self._replicas.values() if r.live and r.status.healthy]

    def _route(self, req: ClusterRequest) -> _Replica | None:
        """The least loaded routable replica (lock held); QueueFullError when every one's
        queue is full."""
        live = self._routable()
        if not live:
            return None
        open_ = [
            r
            for r in live
            if r.status.num_waiting + r.sent - r.status.submitted < r.info.engine_config.max_waiting
        ]
        if not open_:
            raise QueueFullError(
                f"every replica's queue is full ({len(live)} replicas, "
                f"max_waiting {live[0].info.engine_config.max_waiting} each)"
            )
        return min(open_, key=_Replica.route_key)

    def _send(self, rep: _Replica, req: ClusterRequest) -> None:
        """Sends the request to `rep` (lock held)."""
        req.replica = rep.info.name
        rep.requests.add(req.id)
        rep.sent += 1
        rep.unacked_tokens.append(len(req.prompt_ids))
        del rep.unacked_tokens[:-256]  # only the not yet taken ones are read
        timeout_s = None
        if req.deadline is not None:
            timeout_s = max(req.deadline - time.perf_counter(), 0.001)
        rep.handle.submit(req.id, req.prompt_ids, req.sampling, timeout_s, req.priority)

    # ---- streaming -------------------------------------------------------------------------

    def _poll_loop(self, rep: _Replica) -> None:
        cfg = self.config
        try:
            while not self._stop.is_set():
                try:
                    events, status = rep.handle.poll(cfg.poll_wait_s, cfg.liveness_timeout_s)
                except Exception as e:  # noqa: BLE001 - ReplicaDiedError, or anything
                    if not self._stop.is_set():
                        self._replica_died(rep, str(e))
                    return
                rep.status = status
                for rid, ev in events.items():
                    self._deliver(rid, ev)
                if not status.healthy and rep.live:
                    self._replica_died(rep, f"its engine failed: {status.error}")
                    return
        except BaseException:  # noqa: BLE001 - never leave requests hanging
            traceback.print_exc()
            self._replica_died(rep, "the front's poller failed")

    def _deliver(self, rid: int, ev: RequestEvents) -> None:
        with self._lock:
            req = self._requests.get(rid)
        if req is None or req.done:
            return
        for token, lp in ev.tokens:
            now = time.perf_counter()
            observe_token(self.metrics, req, now)
            req.num_tokens += 1
            try:
                reason = req.output.on_token(token, lp, now)
            except Exception as exc:  # noqa: BLE001 - one bad output fails its request only
                reason = f"error: output processing failed: {exc}"
            if reason is not None:
                self.abort_on_replica(req)
                self._finish(req, reason)
                return
        if ev.finish is not None:
            self._finish(req, ev.finish)

    def abort_on_replica(self, req: ClusterRequest) -> None:
        with self._lock:
            rep = self._replicas.get(req.replica or "")
        if rep is not None and rep.live:
            rep.handle.abort(req.id)

    # ---- faults and growth -------------------------------------------------------------------

    def _replica_died(self, rep: _Replica, why: str) -> None:
        """Drops the replica: its requests without a token yet go to other replicas, the
        others finish with an error naming it."""
        info = rep.info
        message = f"replica {info.name} on host {info.host} died: {why}"
        with self._lock:
            if not rep.live:
                return
            rep.live = False
            self._last_failure = message
            self.replica_failures += 1
            orphans = [self._requests[i] for i in sorted(rep.requests) if i in self._requests]
            rep.requests.clear()
        self.log(f"front: {message}")
        self._count("on_replica_failure")
        rep.handle.kill()
        failed = rerouted = 0
        for req in orphans:
            if req.done:
                continue
            if req.num_tokens == 0 and self._reroute(req):
                rerouted += 1
                continue
            failed += 1
            self._finish(req, f"error: {message}")
        if orphans:
            self.log(f"front: {rerouted} of {info.name}'s requests re-routed, {failed} failed")
        self.update_gauges()

    def _reroute(self, req: ClusterRequest) -> bool:
        with self._lock:
            if req.done:
                return True
            try:
                rep = self._route(req)
            except QueueFullError:
                rep = None
            if rep is None:
                return False
            req.reroutes += 1
            self.reroutes += 1
            self._send(rep, req)
        self._count("on_reroute")
        return True

    def _watch(self) -> None:
        """Starts a replica on every node that joins with devices."""
        while not self._stop.wait(self.config.discover_interval_s):
            try:
                nodes = self.launcher.offering_nodes()
            except Exception as e:  # noqa: BLE001 - the cluster may be briefly unreachable
                self.log(f"front: cannot list the cluster's nodes: {e}")
                continue
            with self._lock:
                new = [n for n in nodes if n.node_id not in self._nodes_seen]
            if new:
                self.log(
                    f"front: {len(new)} new node(s) offer devices: "
                    + ", ".join(f"{n.host} ({n.node_id[:8]})" for n in new)
                )
                self._start_replicas(new)

    # ---- finishing and metrics ---------------------------------------------------------------

    def _finish(self, req: ClusterRequest, reason: str) -> None:
        """Exactly once per request."""
        with self._lock:
            if req.done:
                return
            req.finish_reason = reason
            self._requests.pop(req.id, None)
            rep = self._replicas.get(req.replica or "")
            if rep is not None:
                rep.requests.discard(req.id)
        deliver_finish(self.metrics, req, reason, time.perf_counter())

    def _count(self, event: str) -> None:
        """A cluster event for ClusterMetrics (a plain ServingMetrics has no such series)."""
        hook = getattr(self.metrics, event, None)
        if hook is not None:
            hook()

