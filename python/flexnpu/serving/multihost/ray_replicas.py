"""Replicas as Ray actors: the hosts that offer FlexNPU devices (the custom resource
`flexnpu_devices`, set by `ray start --resources '{"flexnpu_devices": 4}'`) and one named actor
per such host (`flexnpu-replica-<node id prefix>`, pinned to its node, holding all of that
node's `flexnpu_devices`), running a ReplicaServer in its own process.

A prefilled request's KV goes from replica to replica through Ray's object store: the front
asks the prefill replica for it (`take_kv`, whose result stays in the object store of the
prefill host) and hands the decode replica that object reference, inside a list so that Ray
does not resolve it before the call; the decode replica fetches it (`ray.get`, host to host)
on a thread of its own. The front never holds the bytes (a KV under Ray's inline limit,
100 KiB, travels with the reference instead).

Ray is imported only here, and only when used: everything else works without it
(`pip install "flexnpu[ray]"` adds it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from flexnpu.serving.multihost.replica import (
    DEVICES_RESOURCE,
    Continuation,
    ReplicaInfo,
    ReplicaServer,
    ReplicaSpec,
    ReplicaStatus,
    RequestEvents,
    first_line,
)

RAY_VERSION = "2.60.0"  # pyproject's [ray] extra
ACTOR_PREFIX = "flexnpu-replica-"
# Concurrent calls a replica actor takes: a poll, a metrics scrape, start-up. Submits and
# aborts run in a group of their own, one at a time, in the order the front sent them (calls
# in the default group of a threaded actor may run out of order: a queue would not be FIFO).
ACTOR_CONCURRENCY = 4
ORDERED = "ordered"


class RayMissingError(RuntimeError):
    """`--ray` without Ray installed."""


class ReplicaDiedError(RuntimeError):
    """The replica's actor or node is gone (or stopped answering); the message says why."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayMissingError(
            f"serving on a Ray cluster needs Ray: pip install 'flexnpu[ray]' (ray=={RAY_VERSION})"
            f" ({e})"
        ) from e
    return ray


@dataclass(frozen=True)
class NodeOffer:
    """A live Ray node that offers FlexNPU devices."""

    node_id: str
    host: str
    devices: float  # its flexnpu_devices resource


def replica_name(node_id: str) -> str:
    return ACTOR_PREFIX + node_id[:8]


class RayReplicaServer(ReplicaServer):
    """The replica as a Ray actor: a handed-off KV arrives as an object reference."""

    def fetch_kv(self, source: Any) -> tuple[Any, Any]:
        import ray

        return ray.get(source[0])


class RayLauncher:
    """Finds the offering nodes of the connected Ray cluster and starts replicas on them."""

    def __init__(self, spec: ReplicaSpec, start_timeout_s: float = 1800.0) -> None:
        self.ray = import_ray()
        if not self.ray.is_initialized():
            raise RuntimeError("RayLauncher: call ray.init first")
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self._actor_class = self.ray.remote(concurrency_groups={ORDERED: 1})(RayReplicaServer)

    def offering_nodes(self) -> list[NodeOffer]:
        offers = []
        for node in self.ray.nodes():
            devices = node.get("Resources", {}).get(DEVICES_RESOURCE, 0)
            if node.get("Alive") and devices > 0:
                offers.append(
                    NodeOffer(node["NodeID"], node.get("NodeManagerHostname", "?"), devices)
                )
        return offers

    def launch(self, node: NodeOffer) -> RayReplica:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        name = replica_name(node.node_id)
        options: dict[str, Any] = dict(
            name=name,
            num_cpus=0,
            resources={DEVICES_RESOURCE: node.devices},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=ACTOR_CONCURRENCY,
            # Ray starts workers at niceness 15 (its daemons first); a replica is the host's
            # serving process and must not yield its cores to every other process there.
            runtime_env={"env_vars": {"RAY_worker_niceness": "0", **self.spec.env}},
        )
        try:
            actor = self._actor_class.options(**options).remote(
                self.spec, name, node.node_id, int(node.devices)
            )
        except ValueError as e:  # the name is taken: another front on this cluster
            raise ReplicaDiedError(f"cannot start replica {name} on host {node.host}: {e}") from e
        return RayReplica(self.ray, actor, name, node, self.start_timeout_s)


class RayReplica:
    """The front's handle on one replica actor: calls that cannot hang the front (submits and
    aborts are sent without waiting; polls wait at most `timeout_s`) and death reported as
    ReplicaDiedError."""

    def __init__(
        self, ray: Any, actor: Any, name: str, node: NodeOffer, start_timeout_s: float
    ) -> None:
        self.ray, self.actor, self.name, self.node = ray, actor, name, node
        self.host = node.host
        self.start_timeout_s = start_timeout_s

    def start(self) -> ReplicaInfo:
        try:
            return self.ray.get(self.actor.start.remote(), timeout=self.start_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            self.kill()
            raise ReplicaDiedError(
                f"replica {self.name} on host {self.host} did not start within "
                f"{self.start_timeout_s:g}s (is its node's {DEVICES_RESOURCE} resource taken "
                "by another server?)"
            ) from None
        except self.ray.exceptions.RayTaskError as e:
            self.kill()
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise ReplicaDiedError(
                f"replica {self.name} on host {self.host} failed to start: "
                f"{type(cause).__name__}: {cause}"
            ) from None
        except self.ray.exceptions.RayError as e:
            self.kill()
            raise ReplicaDiedError(
                f"replica {self.name} on host {self.host} failed to start: {first_line(e)}"
            ) from None

    def submit(
        self,
        rid: int,
        prompt_ids: list[int],
        sampling: Any,
        timeout_s: float | None,
        priority: int,
        export: bool = False,
    ) -> None:
        self.actor.submit.options(concurrency_group=ORDERED).remote(
            rid, prompt_ids, sampling, timeout_s, priority, export
        )

    def submit_prefilled(self, c: Continuation) -> None:
        """(The KV reference inside `c` reaches the actor unresolved: Ray resolves only
        references passed as arguments themselves.)"""
        self.actor.submit_prefilled.options(concurrency_group=ORDERED).remote(c)

    def export_running(self, rids: list[int] | None) -> None:
        """In the order of the submits and handoffs sent before it (the ordered group)."""
        self.actor.export_running.options(concurrency_group=ORDERED).remote(rids)

    def kv_source(self, rid: int) -> list[Any]:
        """The object reference of this replica's prefilled KV of `rid`, in a list (a
        reference inside an argument reaches the callee as a reference, unresolved)."""
        return [self.actor.take_kv.remote(rid)]

    def abort(self, rid: int, reason: str = "abort") -> None:
        self.actor.abort.options(concurrency_group=ORDERED).remote(rid, reason)

    def poll(
        self, wait_s: float, timeout_s: float
    ) -> tuple[dict[int, RequestEvents], ReplicaStatus]:
        """Raises ReplicaDiedError when the actor died or did not answer within `timeout_s`
        (an unreachable actor is asked again until then)."""
        errors = self.ray.exceptions
        give_up = time.monotonic() + timeout_s
        while True:
            left = give_up - time.monotonic()
            try:
                return self.ray.get(self.actor.poll.remote(wait_s), timeout=max(left, 0.01))
            except errors.GetTimeoutError:
                raise ReplicaDiedError(f"it did not answer for {timeout_s:g}s") from None
            except errors.ActorUnavailableError as e:
                if time.monotonic() >= give_up:
                    raise ReplicaDiedError(
                        f"unreachable for {timeout_s:g}s: {first_line(e)}"
                    ) from None
                time.sleep(min(0.5, max(left, 0.0)))
            except errors.RayError as e:
                raise ReplicaDiedError(first_line(e)) from None

    def metrics_text(self, timeout_s: float) -> bytes | None:
        try:
            return self.ray.get(self.actor.metrics_text.remote(), timeout=timeout_s)
        except self.ray.exceptions.RayError:
            return None

    def kill(self) -> None:
        try:
            self.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
