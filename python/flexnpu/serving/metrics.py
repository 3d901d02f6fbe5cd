"""Prometheus metrics with vLLM's names under a `flexnpu:` prefix, in one registry per server
that also holds the placer's collector (`flexnpu_` names, python/flexnpu/metrics.py) and the
process collector (`process_resident_memory_bytes`, ...): one /metrics endpoint for all."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)


class ServingMetrics:
    def __init__(self, model_name: str, placement: bool = True, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        if placement:
            from flexnpu import metrics as placement_metrics

            placement_metrics.register(r)
        if process:
            ProcessCollector(registry=r)

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(f"flexnpu:{name}", doc, labels, registry=r,
                             buckets=_LATENCY_BUCKETS).labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"flexnpu:{name}", doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"flexnpu:{name}", doc, labels, registry=r).labels(model_name)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token (s).")
        self.itl = hist("inter_token_latency_seconds", "Time between output tokens (s).")
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency (s).")
        self.running = gauge("num_requests_running", "Requests in the decode batch.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting for prefill.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage (1 = full).")
        self.prompt_tokens = counter("prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        # The split of the adaptive layout (and of the static ones): scraped over time, the
        # split's history.
        self.prefill_units = gauge("prefill_units", "Devices taking only new prompts.")
        self.mixed_units = gauge("mixed_units",
                                 "Devices taking new prompts and prefilled sequences "
                                 "(co-located).")
        self.decode_units = gauge("decode_units", "Devices taking only prefilled sequences.")
        self.split_changes = counter("split_changes", "Changes of the prefill:decode split.")
        self.moved = counter("moved_sequences", "Sequences moved by role changes (decodes "
                             "with their KV, queued prompts).")
        self._split: tuple[int, int, int] | None = None
        self.instance_failures = Counter(
            "flexnpu:instance_failures", "Failures of an engine instance (each ends in a "
            "restart, or the instance is taken out of service).",
            ["model_name", "instance"], registry=r)
        self.requeued = counter("requeued_requests", "Requests of a failed instance that went "
                                "on at another (recomputed from their known tokens).")
        finished = Counter("flexnpu:request_success", "Finished requests by reason.",
                           ["model_name", "finished_reason"], registry=r)
        self._finished = finished
        self._model = model_name

    def on_first_token(self, req, now: float) -> None:
        self.ttft.observe(now - req.arrival)
        self.prompt_tokens.inc(len(req.prompt_ids))
        self.generation_tokens.inc()

    def on_token(self, itl: float) -> None:
        self.itl.observe(itl)
        self.generation_tokens.inc()

    def on_finish(self, req, now: float) -> None:
        self.e2e.observe(now - req.arrival)

    def on_reason(self, reason: str) -> None:
        self._finished.labels(self._model, reason).inc()

    def set_gauges(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def set_split(self, prefill_units: int, mixed_units: int, units: int) -> None:
        split = (prefill_units, mixed_units, units)
        if self._split is not None and self._split != split:
            self.split_changes.inc()
        self._split = split
        self.prefill_units.set(prefill_units)
        self.mixed_units.set(mixed_units)
        self.decode_units.set(units - prefill_units - mixed_units)

    def on_moves(self, n: int) -> None:
        self.moved.inc(n)

    def on_instance_failure(self, instance: str, requeued: int) -> None:
        self.instance_failures.labels(self._model, instance).inc()
        self.requeued.inc(requeued)

    def render(self) -> bytes:
        return generate_latest(self.registry)
