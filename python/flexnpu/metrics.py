"""Prometheus exposition of FlexNPU's runtime state (prometheus-client conventions, `flexnpu_`
prefix): per physical device queue length, busy fraction, executions by phase, placement
decisions by reason, bytes migrated in (in all and by the placement's reason); per virtual
device bytes held; the policy and pools; telemetry of the physical devices (AscendCL / NVML):
free memory and utilisation by kind; on emulated devices (`emulate:<preset>`) the device time they
modelled and their executions. Under every policy, passthrough included, the counts are
those of every execution.

    from prometheus_client import REGISTRY, start_http_server
    flexnpu.metrics.register(REGISTRY); start_http_server(9400)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from flexnpu import stats


class FlexNpuCollector(Collector):
    """Reads every live FlexNPU client of this process at scrape time."""

    def collect(self) -> Iterator[Any]:
        try:
            clients = stats.clients()
        except OSError:  # the plugin library is not there (e.g. serving on plain cpu)
            clients = []
        info = InfoMetricFamily(
            "flexnpu_placement", "Placement policy and pools", labels=["client"]
        )
        queue = GaugeMetricFamily(
            "flexnpu_physical_queue_length",
            "Executions placed on a physical device and not finished",
            labels=["client", "device"],
        )
        busy = GaugeMetricFamily(
            "flexnpu_physical_busy_fraction",
            "Fraction of time a physical device was executing",
            labels=["client", "device"],
        )
        executions = CounterMetricFamily(
            "flexnpu_physical_executions",
            "Executions placed on a physical device, by phase",
            labels=["client", "device", "phase"],
        )
        decisions = CounterMetricFamily(
            "flexnpu_placement_decisions",
            "Placement decisions, by physical device and reason",
            labels=["client", "device", "reason"],
        )
        migrated = CounterMetricFamily(
            "flexnpu_physical_bytes_migrated_in",
            "Input bytes moved onto a physical device by placements",
            labels=["client", "device"],
        )
        migrated_by_reason = CounterMetricFamily(
            "flexnpu_migrated_bytes",
            "Input bytes moved onto a physical device by placements, by the placement's reason",
            labels=["client", "device", "reason"],
        )
        in_use = GaugeMetricFamily(
            "flexnpu_virtual_bytes_in_use",
            "Bytes of the buffers alive on a virtual device",
            labels=["client", "device"],
        )
        total_executions = CounterMetricFamily(
            "flexnpu_executions", "Executions dispatched by FlexNPU", labels=["client"]
        )
        memory_free = GaugeMetricFamily(
            "flexnpu_physical_memory_free_bytes",
            "Free device memory as AscendCL / NVML last reported it",
            labels=["client", "device", "source"],
        )
        utilization = GaugeMetricFamily(
            "flexnpu_physical_utilization_ratio",
            "Device utilisation as AscendCL / NVML last reported it (compute, memory), and the "
            "part of compute not caused by FlexNPU's executions (external)",
            labels=["client", "device", "kind"],
        )
        modelled = CounterMetricFamily(
            "flexnpu_modelled_device_seconds",
            "Device time an emulated device modelled for its executions (wall-clock time / "
            "time_scale); absent on real devices",
            labels=["client", "device"],
        )
        modelled_executions = CounterMetricFamily(
            "flexnpu_modelled_executions",
            "Executions an emulated device ran or queued",
            labels=["client", "device"],
        )
        for index, client in enumerate(clients):
            c = str(index)
            placement = client["placement"]
            info.add_metric(
                [c],
                {
                    "policy": client["policy"],
                    "prefill_pool": ",".join(map(str, placement.get("prefill_pool", []))),
                    "decode_pool": ",".join(map(str, placement.get("decode_pool", []))),
                    "roofline": client.get("roofline", ""),
                },
            )
            total_executions.add_metric([c], client["executions"])
            for device in placement["physical"]:
                d = str(device["device"])
                queue.add_metric([c, d], device["queue_length"])
                busy.add_metric([c, d], device["busy_fraction"])
                migrated.add_metric([c, d], device["bytes_migrated_in"])
                for phase, count in device["executions"].items():
                    executions.add_metric([c, d, phase], count)
                for reason, count in device["decisions"].items():
                    decisions.add_metric([c, d, reason], count)
                for reason, moved in device.get("bytes_migrated_in_by_reason", {}).items():
                    migrated_by_reason.add_metric([c, d, reason], moved)
            for device in client["virtual_devices"]:
                in_use.add_metric([c, str(device["id"])], device["bytes_in_use"])
            _telemetry(c, client, memory_free, utilization)
            for device in client.get("modelled_device_time") or ():
                d = str(device["physical"])
                modelled.add_metric([c, d], device["busy_s"])
                modelled_executions.add_metric([c, d], device["executions"])
        yield from (info, queue, busy, executions, decisions, migrated, migrated_by_reason)
        yield from (in_use, total_executions)
        yield from (memory_free, utilization, modelled, modelled_executions)


def _telemetry(
    c: str, client: dict[str, Any], memory_free: GaugeMetricFamily, utilization: GaugeMetricFamily
) -> None:
    """Bound telemetry devices, labelled by the FlexNPU physical device they are bound to."""
    physical = client["placement"]["physical"]
    for device in client.get("telemetry", {}).get("devices", []):
        p = device.get("physical_device")
        if p is None:
            continue
        d = str(p)
        if device["memory_free_bytes"] is not None:
            memory_free.add_metric([c, d, device["source"]], device["memory_free_bytes"])
        for kind, percent in device["utilization"].items():
            if percent is not None:
                utilization.add_metric([c, d, kind], percent / 100)
        if physical[p].get("utilization", -1) >= 0:
            utilization.add_metric([c, d, "external"], physical[p]["external_utilization"])


def register(registry: CollectorRegistry) -> FlexNpuCollector:
    collector = FlexNpuCollector()
    registry.register(collector)
    return collector
