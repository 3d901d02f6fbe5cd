"""The front of a multi-host cluster: one object with the Engine's API that the HTTP server
drives (`submit`, `abort`, `healthy`/`error`, `num_running`/`num_waiting`/`kv_usage`), over one
engine replica per host.

- Routing: the cluster layer (serving/cluster.py) decides over hosts as the engine's does over
  devices: each live replica is a unit, its load (a Scheduler's numbers, from its polls plus
  what the front sent it that it has not yet reported taking) what the layer's routers read.
  colocated (the default): a request goes to a host where it would find a free batch slot,
  if any, and among those (or among all, if none) to the one whose least loaded entry instance
  has the smallest `Scheduler.load_key()` (waiting tokens + waiting requests, then running,
  then KV usage: the in-host router's key), and runs there. split (`prefill_hosts`) and
  adaptive (the split advisor decides how many hosts take prompts): a prompt goes to a
  prefill host, stops at its first token, and its KV goes to the decode host the layer picks
  (the same order: a free slot first), replica to replica (`take_kv` on one,
  `submit_prefilled` on the other; the front passes a handle, never the bytes), or stays on
  its device when the layer picks the same host.
- Role changes (the adaptive advisor's, or the roles given again when a host joins or dies): a
  host that leaves the decode side (decode or mixed -> prefill) gives up its requests: each
  stops at its next token there and is handed off as above, its KV (every token so far) to a
  host that decodes now, its stream going on with the next token (`export_running`). Requests
  still computing their prompt there stop at their first token. With no other host decoding,
  they stay. What a host holds when it stops taking prompts (mixed -> decode) stays there.
- Streaming: one poller thread per replica asks it for every new token and finish (one call
  per replica in flight, whatever the number of requests), then runs each request's own output
  (detokenization, stop strings) here; a stop decided here aborts the request on its replica.
- Faults: a replica whose poll fails (its actor or node died, or it stopped answering) is
  dropped; its requests that have not produced a token yet are sent to the other replicas, the
  others finish "error: replica <name> on host <host> died: <why>" (or, with `recompute`, are
  sent too, their prompt followed by the tokens streamed so far: they go on where they were).
  The front is healthy while one replica lives.
- Growth: a watcher thread looks for hosts that offer devices and have no replica yet (a node
  that joins later) and starts one there.

The replicas are reached through a launcher (`ray_replicas.RayLauncher`: Ray actors; tests may
inject another), so this module does not import Ray.
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from flexnpu.serving.cluster import Cluster, ClusterInstance, SplitSettings, unit_roles
from flexnpu.serving.engine import EngineDeadError
from flexnpu.serving.engine_client import InstanceHealth, ModelLimits
from flexnpu.serving.multihost.replica import (
    Continuation,
    PrefillDone,
    ReplicaInfo,
    ReplicaStatus,
    RequestEvents,
)
from flexnpu.serving.output import RequestOutput, deliver_finish, observe_token
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.scheduler import QueueFullError, Role
from flexnpu.serving.topology import Host, Topology
from flexnpu.serving.topology import Link as TopologyLink

HOST_LAYOUTS = ("colocated", "split", "adaptive")
KV_HANDOFF_FAILED = "error: the KV handoff from replica "  # a replica's finish (replica.py)
# export_running failed (the front's call, or the replica's engine: replica.py)
DECODE_MOVE_FAILED = "error: moving the request off replica "
# A queued prompt sent to a host that joined the prompt side: its old replica's finish reason.
REBALANCED = "rebalanced"
_FULL = 1 << 62  # the load key of a host whose queue is full: never the least loaded


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
        export: bool,
    ) -> None: ...
    def submit_prefilled(self, c: Continuation) -> None: ...
    def kv_source(self, rid: int) -> Any: ...  # what another replica's submit_prefilled fetches
    def export_running(self, rids: list[int] | None) -> None: ...  # they come back prefilled
    def abort(self, rid: int, reason: str = "abort") -> None: ...
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
    stops_after_prompt: bool = False  # sent to a prefill host (a decode host continues it)
    num_tokens: int = 0  # tokens delivered to the output
    reroutes: int = 0
    handoffs: list[tuple[str, str]] = field(default_factory=list)  # (from, to) replica names
    moves: int = 0  # of those, moved while decoding (their host left the decode side)
    token_ids: list[int] = field(default_factory=list)  # delivered to the output
    recomputes: int = 0
    # What the replicas compute: the prompt and sampling, or after a recompute the prompt
    # followed by the tokens streamed before it and what is left of the sampling's budget.
    sent_prompt_ids: list[int] | None = None
    sent_sampling: SamplingParams | None = None

    def work(self) -> tuple[list[int], SamplingParams]:
        return self.sent_prompt_ids or self.prompt_ids, self.sent_sampling or self.sampling

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
    handoffs_sent: int = 0  # submit_prefilled calls sent to it
    move_out: bool = False  # left the decode side: its poller moves its requests off

    def queue_full(self) -> bool:
        waiting = self.status.num_waiting + self.sent - self.status.submitted
        return waiting >= self.info.engine_config.max_waiting

    def route_key(self, pending: int = 0) -> tuple[int, int, int, float]:
        """Its load key with the submits it has not reported taking (and `pending` other
        sequences sent to it) counted as waiting, behind whether one more would find a free
        batch slot there: 0 if so, else 1. A slot starts the sequence at once; a queue behind a
        full batch waits for a sequence to end (seconds), however short the queue. The
        submits in flight (a Ray call and a poll) would otherwise count as queued tokens and
        send the next prompt to a full host beside free slots."""
        waiting, running, kv = self.status.load_key
        unacked = self.unacked_tokens[
            max(0, len(self.unacked_tokens) - (self.sent - self.status.submitted)) :
        ]
        full = int(len(unacked) + pending >= self.status.free_slots)
        return full, waiting + sum(unacked) + len(unacked) + pending, running, kv


@dataclass
class FrontConfig:
    poll_wait_s: float = 0.05  # a poll returns after this long when nothing happened
    liveness_timeout_s: float = 60.0  # a replica that answers no poll this long is dead
    discover_interval_s: float = 2.0  # how often to look for hosts that joined
    metrics_timeout_s: float = 1.0  # a replica's /metrics part waits at most this
    # How the cluster layer uses the hosts (HOST_LAYOUTS); split: the first `prefill_hosts`
    # live hosts take prompts, the others decode (with fewer hosts than that needs: as many as
    # leave one decoding; one host: colocated).
    layout: str = "colocated"
    prefill_hosts: int = 1
    split_hold_s: float = 2.0  # adaptive: the advisor's hysteresis hold
    split_colocate: bool = False  # adaptive: every host co-located while the needs fill them
    # adaptive: hosts -> the advisor (cluster.Cluster's `split`; None: the placement core's,
    # sized by the replicas' measured prefill rates). A test's script, say.
    split_advisor: Callable[[int], Any] | None = None
    # A dead replica's running requests (and those whose KV handoff failed) are computed again
    # elsewhere, from their prompt and the tokens streamed so far, instead of failing.
    recompute: bool = False

    def validate(self) -> None:
        if self.layout not in HOST_LAYOUTS:
            raise ValueError(
                f"host layout {self.layout!r}: expected one of {', '.join(HOST_LAYOUTS)}"
            )
        if self.prefill_hosts < 1:
            raise ValueError(f"prefill hosts must be >= 1, got {self.prefill_hosts}")


class _HostLoad:
    """One side of a host as the cluster layer's routers and advisor read it (a Scheduler's
    load numbers), from the replica's last poll plus what the front sent it that it has not
    reported taking: submits, and on the decode side handoffs too. A colocated host's one
    instance reads as the prompt side."""

    def __init__(self, rep: _Replica, decode: bool) -> None:
        self.rep, self.decode = rep, decode

    def load_key(self) -> tuple[int, int, int, float]:
        rep = self.rep
        if rep.queue_full():
            return _FULL, _FULL, 0, 0.0
        # (a co-located unit's back instance takes prompts too)
        return rep.route_key(self.pending_handoffs if self.decode else 0)

    @property
    def pending_handoffs(self) -> int:
        return max(0, self.rep.handoffs_sent - self.rep.status.prefilled_taken)

    @property
    def num_running(self) -> int:
        return self.rep.status.num_running if self.decode else 0

    @property
    def num_waiting(self) -> int:
        return self.pending_handoffs if self.decode else self.rep.status.num_waiting

    @property
    def waiting_tokens(self) -> int:
        return 0 if self.decode else self.rep.status.waiting_tokens


class ClusterFront(ModelLimits):
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
        self.config.validate()
        self._cluster: Cluster | None = None  # over the live replicas, rebuilt when they change
        self._units: list[_Replica] = []  # the cluster's units: live replicas, in join order
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
        self.rebalanced = 0  # queued prompts sent to hosts that joined the prompt side
        self.replica_failures = 0
        # KV handed off between replicas: bytes, seconds x source devices, transfers.
        self._kv_between: tuple[int, float, int] = (0, 0.0, 0)
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
            self._rebuild_cluster()
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

    def health(self) -> list[InstanceHealth]:
        """Each replica the front has had: "serving", or "down" (died or unhealthy; its
        requests went on at the others)."""
        roles = {name: role for _, name, role in self.host_roles()}
        with self._lock:
            reps = list(self._replicas.values())
        return [
            InstanceHealth(r.info.name, r.info.host, roles.get(r.info.name, "none"),
                           "serving" if r.live and r.status.healthy else "down",
                           last_error=None if r.live else self._last_failure)
            for r in reps
        ]

    def inject_fault(self, instance: str) -> None:
        raise ValueError("the multi-host front takes no injected faults: kill a replica's "
                         "process or Ray node instead")

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

    def topology(self) -> Topology:
        """The cluster as flexnpu.serving.topology describes it (what `simulate --topology`
        reads): a host per live replica, in join order, with its devices; the inter-host link
        measured from the KV handoffs between replicas (their bytes over the seconds the
        destinations spent fetching them, per device of the source replica; None before the
        first), the intra-host one unknown (None: each engine's own devices)."""
        with self._lock:
            live = [r.info for r in self._units if r.live]
            nbytes, device_seconds, transfers = self._kv_between
        if not live:
            raise RuntimeError("the cluster front has no live replica")
        inter = None
        if transfers and device_seconds > 0:
            inter = TopologyLink(
                "measured",
                nbytes / device_seconds,
                0.0,
                f"{transfers} KV handoffs between replicas, {nbytes} bytes (the latency is "
                "inside the bandwidth)",
            )
        return Topology(tuple(Host(i.host, i.num_devices) for i in live), None, inter)

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
            routed = self._route(req)
            if routed is None:
                raise EngineDeadError(f"the cluster is not serving: {self.error}")
            self._requests[req.id] = req
            self._send(routed[0], req, routed[1])
        self.update_gauges()
        return req

    def abort(self, req: ClusterRequest) -> None:
        with self._lock:
            rep = self._replicas.get(req.replica or "")
        if rep is not None and rep.live and not req.done:
            rep.handle.abort(req.id)
        self._finish(req, "abort")

    def host_roles(self) -> list[tuple[str, str, str]]:
        """(host, replica, role) of each live replica in the cluster layer, role: prefill,
        decode or mixed (takes prompts and decodes them)."""
        with self._lock:
            cluster, units = self._cluster, list(self._units)
            p = cluster.prefill_units if cluster is not None else 0
            m = cluster.mixed_units if cluster is not None else len(units)
        return [
            (r.info.host, r.info.name, "prefill" if i < p else "mixed" if i < p + m else "decode")
            for i, r in enumerate(units)
        ]

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

    def _rebuild_cluster(self) -> None:
        """The cluster layer over the live replicas (lock held; a replica joined or died): a
        unit per host, in join order. The adaptive layout's advisor starts afresh."""
        decoding, prompting = self._decoding_replicas(), self._prompt_replicas()
        self._build_cluster()
        self._left_decode_side(decoding)
        self._joined_prompt_side(prompting)

    def _build_cluster(self) -> None:
        units = [r for r in self._replicas.values() if r.live]
        self._units = units
        if not units:
            self._cluster = None
            return
        cfg, n = self.config, len(units)
        layout = cfg.layout if n >= 2 else "colocated"
        split: Any = None
        if layout == "adaptive" and cfg.split_advisor is not None:
            split = cfg.split_advisor(n)
        elif layout == "adaptive":
            rate = min(r.info.prefill_tokens_per_s for r in units)
            if not rate > 0:
                raise RuntimeError("the adaptive host layout needs the replicas' prefill rates")
            split = SplitSettings(
                prefill_tokens_per_s=rate,
                decode_batch=min(r.info.decode_batch for r in units),
                hold_s=cfg.split_hold_s,
                colocate_at_capacity=cfg.split_colocate,
                time_scale=units[0].info.time_scale,
            )
        roles = unit_roles(layout, n, min(cfg.prefill_hosts, n - 1))
        # An instance that takes prefilled sequences reads as its host's decode side (the
        # adaptive layout's back instances, on units n..2n-1).
        insts = [
            ClusterInstance(i, i % n, role, _HostLoad(units[i % n], role is Role.DECODE or i >= n))
            for i, role in enumerate(roles)
        ]
        self._cluster = Cluster(insts, n, split, incremental=False)

    def _route(self, req: ClusterRequest) -> tuple[_Replica, bool] | None:
        """The replica the cluster layer gives the prompt (lock held) and whether it stops
        after the prompt (a decode host continues it); QueueFullError when every entry
        host's queue is full."""
        cluster = self._cluster
        if cluster is None or not self._routable():
            return None
        self._roles_changed_if(lambda: cluster.on_arrival(len(req.prompt_ids), time.perf_counter()))
        inst = cluster.route_arrival(req.id)
        rep = self._units[inst.unit]
        if rep.queue_full():
            entry = cluster.front_router.insts
            raise QueueFullError(
                f"every replica's queue is full ({len(entry)} replicas take prompts, "
                f"max_waiting {rep.info.engine_config.max_waiting} each)"
            )
        return rep, inst.role is Role.PREFILL  # a prefill instance hands the sequence off

    def _send(self, rep: _Replica, req: ClusterRequest, export: bool) -> None:
        """Sends the request to `rep` (lock held). A request sent again (re-routed, computed
        again) leaves its previous replica's set: that replica's death must not touch it."""
        previous = self._replicas.get(req.replica or "")
        if previous is not None and previous is not rep:
            previous.requests.discard(req.id)
        req.replica = rep.info.name
        req.stops_after_prompt = export
        rep.requests.add(req.id)
        prompt_ids, sampling = req.work()
        rep.sent += 1
        rep.unacked_tokens.append(len(prompt_ids))
        del rep.unacked_tokens[:-256]  # only the not yet taken ones are read
        rep.handle.submit(req.id, prompt_ids, sampling, self._timeout_s(req), req.priority, export)

    def _timeout_s(self, req: ClusterRequest) -> float | None:
        if req.deadline is None:
            return None
        return max(req.deadline - time.perf_counter(), 0.001)

    def _hand_off(self, src: _Replica, req: ClusterRequest, done: PrefillDone) -> None:
        """`req` was prefilled on `src`: the cluster layer picks the host that decodes it
        (with no decode host left: `src` itself), which fetches the KV from `src` (or, on
        `src`, keeps it on its device)."""
        with self._lock:
            if req.done or req.replica != src.info.name:
                return
            cluster = self._cluster
            dst = src
            if cluster is not None and cluster.back_router is not None:
                if cluster.back_router.insts:
                    dst = self._units[cluster.route_handoff(req.id).unit]
            if not dst.live:
                dst = src
            src.requests.discard(req.id)
            dst.requests.add(req.id)
            dst.handoffs_sent += 1
            req.replica = dst.info.name
            req.stops_after_prompt = False  # it decodes there
            req.handoffs.append((src.info.name, dst.info.name))
            moved = done.moved and dst is not src
            req.moves += moved
            kv = None if dst is src else src.handle.kv_source(req.id)
            prompt_ids, sampling = req.work()
            dst.handle.submit_prefilled(
                Continuation(
                    req.id,
                    prompt_ids,
                    sampling,
                    done,
                    kv,
                    src.info.name,
                    self._timeout_s(req),
                    req.priority,
                )
            )
        if moved:
            hook = getattr(self.metrics, "on_moved_decode", None)
            if hook is not None:
                hook((src.info.host, src.info.name), (dst.info.host, dst.info.name))

    # ---- role changes ----------------------------------------------------------------------

    def _decoding_replicas(self) -> set[str]:
        """The live replicas on the decode side (decode or mixed)."""
        return {name for _, name, role in self.host_roles() if role != "prefill"}

    def _roles_changed_if(self, decide: Callable[[], bool]) -> None:
        """Runs the advisor's `decide` (lock held); if it changed the split, the hosts that
        left the decode side move their decodes off and those that joined the prompt side take
        queued prompts."""
        decoding, prompting = self._decoding_replicas(), self._prompt_replicas()
        if decide():
            self._left_decode_side(decoding)
            self._joined_prompt_side(prompting)

    def _tick(self) -> None:
        """The advisor's tick between arrivals (from the pollers: it decides at most once per
        its own period; `due` is a const check, the rest runs only when it is)."""
        with self._lock:
            cluster = self._cluster
            if cluster is None or cluster.advisor is None:
                return
            now = time.perf_counter()
            if cluster.advisor.due(int(now * 1e9)):
                self._roles_changed_if(lambda: cluster.on_tick(now))

    def _prompt_replicas(self) -> set[str]:
        """The live replicas on the prompt side (prefill or mixed)."""
        return {name for _, name, role in self.host_roles() if role != "decode"}

    def _joined_prompt_side(self, prompting_before: set[str]) -> None:
        """Hosts joined the prompt side (lock held: a role change, or a host that joined): the
        prompts queued on the hosts that took prompts before, beyond an even share of all the
        queued ones, go through the router again (the newest first out: a FIFO engine computes
        them last), so a burst queued on one prefill host does not wait there while the hosts
        that joined have nothing to do. Queued: sent, no token yet (a prompt the old host has
        begun computing is computed again; its events from there are stale, as a re-route's).
        One the router gives back to its own host stays."""
        prompting = self._prompt_replicas()
        joined = prompting - prompting_before
        if not joined or self._cluster is None:
            return
        hosts = [r for r in self._units if r.info.name in prompting]
        queued = {
            r.info.name: [
                req
                for i in sorted(r.requests)
                if (req := self._requests.get(i)) is not None
                and not req.done
                and req.num_tokens == 0
                and req.replica == r.info.name
            ]
            for r in hosts
        }
        share = -(-sum(len(q) for q in queued.values()) // len(hosts))
        moved = 0
        for name in sorted(prompting & prompting_before):
            src = self._replicas[name]
            for req in reversed(queued[name][share:]):
                inst = self._cluster.route_arrival(req.id)
                dst = self._units[inst.unit]
                if dst is src or dst.queue_full():
                    continue
                src.handle.abort(req.id, REBALANCED)
                self._send(dst, req, inst.role is Role.PREFILL)
                moved += 1
        if moved:
            self.rebalanced += moved
            self.log(f"front: {moved} queued prompts sent to the hosts that joined the prompt side")
            hook = getattr(self.metrics, "on_rebalance", None)
            if hook is not None:
                hook(moved)

    def _left_decode_side(self, decoding_before: set[str]) -> None:
        """The roles changed (lock held): the replicas that decoded and no longer do move their
        requests off (on their poller threads: `_move_off`)."""
        for name in decoding_before - self._decoding_replicas():
            rep = self._replicas.get(name)
            if rep is not None and rep.live:
                rep.move_out = True

    def _move_off(self, rep: _Replica) -> None:
        """`rep` left the decode side: its requests stop at their next token there and come
        back prefilled (`_hand_off` sends each to a host that decodes now). They stay when no
        other host decodes or `rep` decodes again; a refused call ends them with an error
        naming `rep` (or, with `recompute`, computes them again elsewhere)."""
        with self._lock:
            rep.move_out = False
            decoding = self._decoding_replicas()
            if not rep.live or rep.info.name in decoding or not decoding:
                return
            reqs = [self._requests[i] for i in sorted(rep.requests) if i in self._requests]
            reqs = [r for r in reqs if not (r.stops_after_prompt and r.replica == rep.info.name)]
        if not reqs:
            return
        try:
            rep.handle.export_running([r.id for r in reqs])
            return
        except Exception as e:  # noqa: BLE001 - each request is told, none hangs
            message = f"{DECODE_MOVE_FAILED}{rep.info.name} failed: {type(e).__name__}: {e}"
        self.log(f"front: {message}")
        for req in reqs:
            if req.done or req.replica != rep.info.name:
                continue
            with self._lock:
                rep.requests.discard(req.id)
            try:
                rep.handle.abort(req.id)
            except Exception:  # noqa: BLE001 - the replica may be going; its poll will say
                pass
            if not (self.config.recompute and self._recompute(req)):
                self._finish(req, message)

    # ---- streaming -------------------------------------------------------------------------

    def _poll_loop(self, rep: _Replica) -> None:
        cfg = self.config
        try:
            while not self._stop.is_set():
                if rep.move_out:
                    self._move_off(rep)
                try:
                    events, status = rep.handle.poll(cfg.poll_wait_s, cfg.liveness_timeout_s)
                except Exception as e:  # noqa: BLE001 - ReplicaDiedError, or anything
                    if not self._stop.is_set():
                        self._replica_died(rep, str(e))
                    return
                rep.status = status
                for rid, ev in events.items():
                    self._deliver(rep, rid, ev)
                self._tick()
                if not status.healthy and rep.live:
                    self._replica_died(rep, f"its engine failed: {status.error}")
                    return
        except BaseException:  # noqa: BLE001 - never leave requests hanging
            traceback.print_exc()
            self._replica_died(rep, "the front's poller failed")

    def _deliver(self, rep: _Replica, rid: int, ev: RequestEvents) -> None:
        if ev.kv_received is not None:
            self._kv_received(rep, ev.kv_received)
        with self._lock:
            req = self._requests.get(rid)
            # Events of a replica the request left (handed off, re-routed) are stale, and so
            # are those of a replica declared dead: its requests went on elsewhere.
            if req is None or req.done or req.replica != rep.info.name or not rep.live:
                return
        for token, lp in ev.tokens:
            now = time.perf_counter()
            observe_token(self.metrics, req, now)
            req.num_tokens += 1
            req.token_ids.append(token)
            try:
                reason = req.output.on_token(token, lp, now)
            except Exception as exc:  # noqa: BLE001 - one bad output fails its request only
                reason = f"error: output processing failed: {exc}"
            if reason is not None:
                self.abort_on_replica(req)
                self._finish(req, reason)
                return
        if ev.prefilled is not None:
            self._hand_off(rep, req, ev.prefilled)
        if ev.finish is not None:
            if (
                ev.finish.startswith(KV_HANDOFF_FAILED)
                and self.config.recompute
                and self._recompute(req)
            ):
                return
            self._finish(req, ev.finish)

    def _recompute(self, req: ClusterRequest) -> bool:
        """Sends a request that streamed tokens to a live replica again: its prompt followed
        by those tokens, for what is left of its tokens (greedy, it goes on as it would have;
        seeded sampling too: a token's randomness is its position's). False if none takes it;
        True, nothing sent nor counted, if it finished meanwhile (a client's abort)."""
        with self._lock:  # the check and the send at once: a finish in between went uncounted
            if req.done:
                return True
            sp = req.sampling
            left = sp.max_tokens - len(req.token_ids)
            if left < 1:
                return False
            req.sent_prompt_ids = req.prompt_ids + req.token_ids
            req.sent_sampling = dataclasses.replace(
                sp, max_tokens=left, min_tokens=max(0, sp.min_tokens - len(req.token_ids))
            )
            if not self._reroute(req):
                return False
            req.recomputes += 1
        return True

    def _kv_received(self, dst: _Replica, received: Any) -> None:
        with self._lock:
            src = self._replicas.get(received.source)
            if src is not None and src is not dst:  # the inter-host link topology() reports
                nbytes, device_seconds, transfers = self._kv_between
                self._kv_between = (
                    nbytes + received.nbytes,
                    device_seconds + received.seconds * max(1, src.info.num_devices),
                    transfers + 1,
                )
        hook = getattr(self.metrics, "on_kv_transfer", None)
        if hook is None:
            return
        source = (src.info.host, src.info.name) if src is not None else ("?", received.source)
        hook(source, (dst.info.host, dst.info.name), received.nbytes, received.seconds)

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
            self._rebuild_cluster()
            self._last_failure = message
            self.replica_failures += 1
            orphans = [
                req
                for i in sorted(rep.requests)
                if (req := self._requests.get(i)) is not None and req.replica == info.name
            ]
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
            if req.num_tokens and self.config.recompute and self._recompute(req):
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
                routed = self._route(req)
            except QueueFullError:
                routed = None
            if routed is None:
                return False
            req.reroutes += 1
            self.reroutes += 1
            self._send(routed[0], req, routed[1])
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
