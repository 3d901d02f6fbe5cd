"""`python -m flexnpu daemon --socket PATH [--backend cpu|LIB] [--backend-options K=V,...]
[--policy P] [--tenants FILE] [--metrics-port N] [--trace FILE]`: the per-host FlexNPU
daemon. It owns the physical PJRT client; processes run with `FLEXNPU_BACKEND=daemon:PATH`
reach it through their virtual devices. Foreground, logs on stderr; SIGTERM (or Ctrl-C) ends
every session and stops.

With `--policy` the daemon serves FlexNPU's own runtime (pjrt_plugin_flexnpu.so, loaded in
this process) over the physical backend: every session's executions go through that one
runtime, so its placer decides across processes (its placements are in `stats --daemon`,
/metrics and the trace). Without it the daemon serves the physical backend directly.

The tenants file (TOML or JSON) lists who may connect (`FLEXNPU_TENANT`)::

    allow_unknown = false
    [[tenants]]
    name = "prefill"
    memory_quota_bytes = 8_000_000_000
    devices = [0, 1]          # physical device ids; absent: all
    priority = "latency"      # or "batch"
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRIORITIES = ("latency", "batch")


@dataclass(frozen=True)
class Tenant:
    name: str
    memory_quota_bytes: int = -1
    devices: tuple[int, ...] = ()
    priority: str = "batch"


@dataclass(frozen=True)
class Tenants:
    tenants: tuple[Tenant, ...] = ()
    allow_unknown: bool = True
    names: frozenset[str] = field(default_factory=frozenset)


def _tenant(entry: Any, where: str) -> Tenant:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ValueError(f"{where}: each tenant needs a non-empty string 'name'")
    known = {"name", "memory_quota_bytes", "devices", "priority"}
    unknown = set(entry) - known
    if unknown:
        raise ValueError(f"{where}: tenant '{entry['name']}' has unknown keys {sorted(unknown)} "
                         f"(known: {sorted(known)})")
    quota = entry.get("memory_quota_bytes", -1)
    if not isinstance(quota, int) or isinstance(quota, bool) or quota < -1:
        raise ValueError(f"{where}: tenant '{entry['name']}': memory_quota_bytes must be an "
                         f"integer >= 0 (or -1 for none), not {quota!r}")
    devices = entry.get("devices", [])
    if not isinstance(devices, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
        raise ValueError(f"{where}: tenant '{entry['name']}': devices must be a list of "
                         f"physical device ids, not {devices!r}")
    priority = entry.get("priority", "batch")
    if priority not in PRIORITIES:
        raise ValueError(f"{where}: tenant '{entry['name']}': priority must be one of "
                         f"{PRIORITIES}, not {priority!r}")
    return Tenant(entry["name"], quota, tuple(devices), priority)


def load_tenants(path: str | Path) -> Tenants:
    """Parses a tenants file (.toml, else JSON) with errors naming the file and the field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read tenants file {path}: {e}") from e
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"tenants file {path} is not valid {path.suffix or 'JSON'}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"tenants file {path}: the top level must be a table/object")
    unknown = set(data) - {"tenants", "allow_unknown"}
    if unknown:
        raise ValueError(f"tenants file {path}: unknown keys {sorted(unknown)}")
    allow_unknown = data.get("allow_unknown", True)
    if not isinstance(allow_unknown, bool):
        raise ValueError(f"tenants file {path}: allow_unknown must be true or false")
    entries = data.get("tenants", [])
    if not isinstance(entries, list):
        raise ValueError(f"tenants file {path}: 'tenants' must be a list")
    tenants = tuple(_tenant(e, f"tenants file {path}") for e in entries)
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenants file {path}: a tenant is listed twice: {names}")
    return Tenants(tenants, allow_unknown, frozenset(names))


def _backend_options(text: str) -> list[tuple[str, int]]:
    options: list[tuple[str, int]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            options.append((key.strip(), int(value)))
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ValueError(f"--backend-options: '{item}' is not KEY=INTEGER")
    return options


def _backend_path(backend: str) -> str:
    if backend == "cpu":
        from flexnpu._paths import cpu_plugin_path

        return str(cpu_plugin_path())
    return backend


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "daemon", help="run the per-host daemon that shares physical devices between processes"
    )
    parser.add_argument("--socket", required=True, help="Unix-domain socket path to serve")
    parser.add_argument("--backend", default="cpu",
                        help="physical PJRT plugin: 'cpu' (xla-cpu-pjrt) or a library path")
    parser.add_argument("--backend-options", default="",
                        help="integer create options of the physical client, K=V,... "
                             "(default for cpu: cpu_device_count=4)")
    parser.add_argument("--policy",
                        help="serve FlexNPU's runtime with this placement policy (e.g. dynamic) "
                             "over the backend: one placer for every session")
    parser.add_argument("--num-virtual-devices", type=int, default=0,
                        help="with --policy: the virtual devices served (default: one per "
                             "physical device)")
    parser.add_argument("--tenants", help="tenants file (TOML or JSON)")
    parser.add_argument("--batch-max-wait-ms", type=int, default=50,
                        help="how long a batch-class execution waits at most for latency-class "
                             "ones on its device (default 50)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus /metrics on this port (sessions, tenants, and "
                             "with --policy the runtime's placement)")
    parser.add_argument("--trace", help="with --policy: write the runtime's Chrome/Perfetto "
                                        "timeline to this file when the daemon stops")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class ServedBackend:
    """The plugin the daemon serves and its create options."""

    path: str
    int_options: list[tuple[str, int]]
    string_options: list[tuple[str, str]]


def served_backend(backend: str, backend_options: str, policy: str | None,
                   num_virtual_devices: int = 0) -> ServedBackend:
    """The physical plugin itself, or (with `policy`) FlexNPU's plugin over it: the same library
    flexnpu.stats reads in this process, so the runtime's state is this daemon's."""
    options = _backend_options(backend_options)
    if policy is None:
        if backend == "cpu" and not any(k == "cpu_device_count" for k, _ in options):
            options.append(("cpu_device_count", 4))
        return ServedBackend(_backend_path(backend), options, [])
    from flexnpu._paths import cpu_plugin_path, plugin_library_path

    if num_virtual_devices < 0:
        raise ValueError(f"--num-virtual-devices must be >= 1 (0: one per physical "
                         f"device), not {num_virtual_devices}")
    # FlexNPU's runtime defaults to 4 CPU devices itself; its backend options are one string.
    strings = [("policy", policy), ("backend", backend),
               ("cpu_plugin_path", str(cpu_plugin_path())),
               ("backend_options", ",".join(f"{k}={v}" for k, v in options))]
    ints = [("num_virtual_devices", num_virtual_devices)] if num_virtual_devices else []
    return ServedBackend(str(plugin_library_path()), ints, strings)


def _start_metrics(port: int, server: Any, with_runtime: bool) -> None:
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as e:
        raise RuntimeError("--metrics-port needs prometheus-client (pip install "
                           "'flexnpu[serve]')") from e
    from flexnpu import _daemon_metrics

    registry = CollectorRegistry()
    registry.register(_daemon_metrics.DaemonCollector(server.stats_json))
    if with_runtime:
        from flexnpu import metrics

        metrics.register(registry)
    try:
        start_http_server(port, registry=registry)
    except OSError as e:
        raise RuntimeError(f"--metrics-port {port}: cannot listen: {e}") from e


def run(args: argparse.Namespace) -> int:
    from flexnpu._native_loader import native

    if args.trace and not args.policy:
        print("flexnpu daemon: --trace needs --policy (the trace is the timeline of the "
              "daemon's FlexNPU runtime)", file=sys.stderr)
        return 2
    try:
        tenants = load_tenants(args.tenants) if args.tenants else Tenants()
        backend = served_backend(args.backend, args.backend_options, args.policy,
                                 args.num_virtual_devices)
        if args.batch_max_wait_ms < 0:
            raise ValueError(f"--batch-max-wait-ms must be >= 0, not {args.batch_max_wait_ms}")
        server_class = native("DaemonServer", "the daemon").DaemonServer
        server = server_class.start(
            args.socket, backend.path, backend.int_options,
            [(t.name, t.memory_quota_bytes, list(t.devices), t.priority) for t in tenants.tenants],
            tenants.allow_unknown, backend_string_options=backend.string_options,
            batch_max_wait_ms=args.batch_max_wait_ms)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"flexnpu daemon: {e}", file=sys.stderr)
        return 2
    try:
        if args.metrics_port is not None:
            _start_metrics(args.metrics_port, server, args.policy is not None)
            print(f"flexnpu daemon: /metrics on port {args.metrics_port}", file=sys.stderr)
        if args.trace:
            from flexnpu import stats

            stats.start_trace()
    except RuntimeError as e:
        server.stop()
        print(f"flexnpu daemon: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        print(f"flexnpu daemon: {signal.Signals(signum).name}: stopping", file=sys.stderr,
              flush=True)
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
    server.stop()
    return 0
