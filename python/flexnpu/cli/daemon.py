"""`python -m flexnpu daemon --socket PATH [--backend cpu|LIB] [--backend-options K=V,...]
[--policy P] [--tenants FILE] [--metrics-port N] [--trace FILE]`: the per-host FlexNPU
daemon. It owns the physical PJRT client; processes run with `FLEXNPU_BACKEND=daemon:PATH`
reach it through their virtual devices. Foreground, logs on stderr; SIGTERM (or Ctrl-C) ends
every session and stops.

With `--policy` the daemon serves FlexNPU's own runtime (pjrt_plugin_flexnpu.so, loaded in
this process) over the physical backend: every session's executions go through that one
runtime, so its placer decides across processes (its placements are in `stats --daemon`,
/metrics and the trace). Without it the daemon serves the physical backend directly.

The tenants file's format: flexnpu/daemon.py.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from flexnpu.daemon import Tenants, load_tenants, served_backend
from flexnpu.serving import logs


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "daemon", help="run the per-host daemon that shares physical devices between processes"
    )
    parser.add_argument("--socket", required=True, help="Unix-domain socket path to serve")
    parser.add_argument(
        "--backend",
        default="cpu",
        help="physical PJRT plugin: 'cpu' (xla-cpu-pjrt), a library path, or "
        "'emulate:PRESET' (emulated accelerators, docs/emulation.md)",
    )
    parser.add_argument(
        "--backend-options",
        default="",
        help="integer create options of the physical client, K=V,... "
        "(default for cpu: cpu_device_count=4)",
    )
    parser.add_argument(
        "--policy",
        help="serve FlexNPU's runtime with this placement policy (e.g. dynamic) "
        "over the backend: one placer for every session",
    )
    parser.add_argument(
        "--num-virtual-devices",
        type=int,
        default=0,
        help="with --policy: the virtual devices served (default: one per physical device)",
    )
    parser.add_argument("--tenants", help="tenants file (TOML or JSON)")
    parser.add_argument(
        "--batch-max-wait-ms",
        type=int,
        default=50,
        help="how long a batch-class execution waits at most for latency-class "
        "ones on its device (default 50)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on this port (sessions, tenants, and "
        "with --policy the runtime's placement)",
    )
    parser.add_argument(
        "--trace",
        help="with --policy: write the runtime's Chrome/Perfetto "
        "timeline to this file when the daemon stops",
    )
    logs.add_argument(parser)
    parser.set_defaults(func=run)


def _start_metrics(port: int, server: Any, with_runtime: bool) -> Callable[[], None]:
    """Serves /metrics; returns what stops it. The HTTP thread holds the registry and the
    registry the server's stats: stopping it lets the server go when the daemon stops (else
    nanobind reports the server as leaked at exit)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as e:
        raise RuntimeError(
            "--metrics-port needs prometheus-client (pip install 'flexnpu[serve]')"
        ) from e
    from flexnpu import _daemon_metrics

    registry = CollectorRegistry()
    collector = _daemon_metrics.DaemonCollector(server.stats_json)
    registry.register(collector)
    if with_runtime:
        from flexnpu import metrics

        metrics.register(registry)
    try:
        http, thread = start_http_server(port, registry=registry)
    except OSError as e:
        registry.unregister(collector)
        raise RuntimeError(f"--metrics-port {port}: cannot listen: {e}") from e

    def stop() -> None:
        http.shutdown()
        http.server_close()
        thread.join()
        registry.unregister(collector)

    return stop


def _no_metrics() -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from flexnpu._native_loader import native

    logs.set_backend_log_level(args.backend_log_level)  # before the backend is loaded
    if args.trace and not args.policy:
        print(
            "flexnpu daemon: --trace needs --policy (the trace is the timeline of the "
            "daemon's FlexNPU runtime)",
            file=sys.stderr,
        )
        return 2
    try:
        tenants = load_tenants(args.tenants) if args.tenants else Tenants()
        backend = served_backend(
            args.backend, args.backend_options, args.policy, args.num_virtual_devices
        )
        if args.batch_max_wait_ms < 0:
            raise ValueError(f"--batch-max-wait-ms must be >= 0, not {args.batch_max_wait_ms}")
        server_class = native("DaemonServer", "the daemon").DaemonServer
        server = server_class.start(
            args.socket,
            backend.path,
            backend.int_options,
            [(t.name, t.memory_quota_bytes, list(t.devices), t.priority) for t in tenants.tenants],
            tenants.allow_unknown,
            backend_string_options=backend.string_options,
            batch_max_wait_ms=args.batch_max_wait_ms,
        )
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"flexnpu daemon: {e}", file=sys.stderr)
        return 2
    stop_metrics: Callable[[], None] = _no_metrics
    try:
        if args.metrics_port is not None:
            stop_metrics = _start_metrics(args.metrics_port, server, args.policy is not None)
            print(f"flexnpu daemon: /metrics on port {args.metrics_port}", file=sys.stderr)
        if args.trace:
            from flexnpu import stats

            stats.start_trace()
    except RuntimeError as e:
        stop_metrics()
        server.stop()
        print(f"flexnpu daemon: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        print(
            f"flexnpu daemon: {signal.Signals(signum).name}: stopping", file=sys.stderr, flush=True
        )
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    print(f"flexnpu daemon: ready on {args.socket}", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    if args.trace:
        from flexnpu import stats

        # Before stop: the runtime's client (and its timeline) lives as long as the server.
        stats.stop_trace()
        stats.export_trace(args.trace)
        print(f"flexnpu daemon: timeline written to {args.trace}", file=sys.stderr, flush=True)
    stop_metrics()
    server.stop()
    return 0
