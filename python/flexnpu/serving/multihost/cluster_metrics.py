"""One /metrics for a multi-host cluster: the front's own series (the latencies clients see,
re-routes, replica failures, live replicas) and every live replica's whole registry (its
engine's vLLM-named series, its placer's, its process'), each series labelled with the `host`
it comes from and the `replica` (the front's: replica="front")."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from flexnpu.serving.metrics import ServingMetrics

FRONT = "front"


class ClusterMetrics(ServingMetrics):
    """The front's metrics; `render()` adds the replicas' (`attach` the front first)."""

    def __init__(self, model_name: str) -> None:
        super().__init__(model_name, placement=False, process=True)
        r = self.registry
        self.rerouted = Counter(
            "flexnpu:cluster_rerouted_requests",
            "Requests sent to another replica because theirs died before their first token.",
            registry=r,
        )
        self.rebalanced = Counter(
            "flexnpu:cluster_rebalanced_requests",
            "Queued prompts (no token yet) sent to a host that joined the prompt side.",
            registry=r,
        )
        self.replica_failures = Counter(
            "flexnpu:cluster_replica_failures", "Replicas found dead (actor or node).", registry=r
        )
        self.replicas = Gauge("flexnpu:cluster_replicas", "Live replicas.", registry=r)
        pair = ["source_host", "source_replica", "destination_host", "destination_replica"]
        self.kv_bytes = Counter(
            "flexnpu:kv_transfer_bytes",
            "KV bytes handed off between hosts (prefilled on the source, or moved off it while "
            "decoding; decoded on the destination).",
            pair,
            registry=r,
        )
        self.kv_seconds = Counter(
            "flexnpu:kv_transfer_seconds",
            "Seconds the destination spent fetching handed-off KV (call to arrays on its host).",
            pair,
            registry=r,
        )
        self.kv_transfers = Counter(
            "flexnpu:kv_transfers", "KV handoffs between hosts.", pair, registry=r
        )
        self.moved_decodes = Counter(
            "flexnpu:cluster_moved_decodes",
            "Running requests moved, KV and all, off a host that left the decode side (their KV "
            "bytes are in flexnpu:kv_transfer_bytes).",
            pair,
            registry=r,
        )
        self.host_role = Gauge(
            "flexnpu:cluster_host_role",
            "1 for each live host's role in the cluster layer (prefill, decode, or mixed: "
            "takes prompts and decodes them).",
            ["role_host", "role_replica", "role"],
            registry=r,
        )
        self.host = socket.gethostname()
        self._front: Any = None

    def attach(self, front: Any) -> None:
        self._front = front

    def on_reroute(self) -> None:
        self.rerouted.inc()

    def on_rebalance(self, n: int) -> None:
        self.rebalanced.inc(n)

    def on_replica_failure(self) -> None:
        self.replica_failures.inc()

    def on_kv_transfer(
        self, source: tuple[str, str], destination: tuple[str, str], nbytes: int, seconds: float
    ) -> None:
        """A handed-off KV fetched by `destination` from `source` ((host, replica) each)."""
        labels = (*source, *destination)
        self.kv_bytes.labels(*labels).inc(nbytes)
        self.kv_seconds.labels(*labels).inc(seconds)
        self.kv_transfers.labels(*labels).inc()

    def on_moved_decode(self, source: tuple[str, str], destination: tuple[str, str]) -> None:
        """A running request handed from `source` to `destination` ((host, replica) each)."""
        self.moved_decodes.labels(*source, *destination).inc()

    def set_host_roles(self, roles: list[tuple[str, str, str]]) -> None:
        """(host, replica, role) of every live host; also the prefill/mixed/decode unit
        gauges, counted in hosts."""
        self.host_role.clear()
        for host, replica, role in roles:
            self.host_role.labels(host, replica, role).set(1)
        self.prefill_units.set(sum(role == "prefill" for _, _, role in roles))
        self.mixed_units.set(sum(role == "mixed" for _, _, role in roles))
        self.decode_units.set(sum(role == "decode" for _, _, role in roles))

    def render(self) -> bytes:
        parts: list[tuple[dict[str, str], bytes]] = []
        if self._front is not None:
            self.replicas.set(len(self._front.replicas()))
            self.set_host_roles(self._front.host_roles())
            parts = [
                ({"host": info.host, "replica": info.name}, text)
                for info, text in self._front.replica_metrics()
            ]
        own = super().render()
        return merge_labelled([({"host": self.host, "replica": FRONT}, own), *parts])


def merge_labelled(parts: Iterable[tuple[dict[str, str], bytes]]) -> bytes:
    """Prometheus texts merged into one, every sample of each text with that text's labels
    added (one HELP/TYPE per family, as the format requires)."""
    families: dict[str, Metric] = {}
    for labels, text in parts:
        for fam in text_string_to_metric_families(text.decode()):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(
                    fam.name, fam.documentation, fam.type, fam.unit
                )
            for s in fam.samples:
                merged.add_sample(s.name, {**s.labels, **labels}, s.value, s.timestamp, s.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families
