"""Prometheus exposition of the daemon's own state (`flexnpu_daemon_` prefix): sessions, and per
tenant bytes held, quota, executions and batch executions held back for latency work (and
those released by the gate's max wait); per
device the latency-class executions in flight. The runtime's placement (with --policy) is
flexnpu.metrics' collector, registered beside this one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class DaemonCollector(Collector):
    """Reads the daemon server's stats (its StatsJson) at scrape time."""

    def __init__(self, stats_json: Callable[[], str]) -> None:
        self._stats_json = stats_json

    def collect(self) -> Iterator[Any]:
        state = json.loads(self._stats_json())
        sessions = GaugeMetricFamily("flexnpu_daemon_sessions", "Client sessions connected")
        sessions.add_metric([], len(state["sessions"]))
        served = CounterMetricFamily("flexnpu_daemon_sessions_served",
                                     "Client sessions accepted since start")
        served.add_metric([], state["sessions_served"])
        labels = ["tenant", "priority"]
        held = GaugeMetricFamily("flexnpu_daemon_tenant_bytes_in_use",
                                 "Bytes a tenant holds on the devices", labels=labels)
        quota = GaugeMetricFamily("flexnpu_daemon_tenant_memory_quota_bytes",
                                  "A tenant's memory quota (-1: none)", labels=labels)
        executions = CounterMetricFamily("flexnpu_daemon_tenant_executions",
                                         "Executions a tenant's sessions dispatched",
                                         labels=labels)
        waited = CounterMetricFamily(
            "flexnpu_daemon_tenant_held_for_latency",
            "Batch-class executions that waited for latency-class work on their device",
            labels=labels)
        past_max_wait = CounterMetricFamily(
            "flexnpu_daemon_tenant_held_past_max_wait",
            "Batch-class executions released because they had waited the gate's max wait "
            "(latency-class work still in flight)",
            labels=labels)
        for name, tenant in state["tenants"].items():
            key = [name, tenant["priority"]]
            held.add_metric(key, tenant["bytes_in_use"])
            quota.add_metric(key, tenant["memory_quota_bytes"])
            executions.add_metric(key, tenant["executions"])
            waited.add_metric(key, tenant["held_for_latency"])
            past_max_wait.add_metric(key, tenant["held_past_max_wait"])
        in_flight = GaugeMetricFamily("flexnpu_daemon_latency_in_flight",
                                      "Latency-class executions in flight on a device",
                                      labels=["device"])
        for device, count in enumerate(state["latency_in_flight"]):
            in_flight.add_metric([str(device)], count)
        yield from (sessions, served, held, quota, executions, waited, past_max_wait, in_flight)
