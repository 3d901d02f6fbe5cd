"""`flexnpu stats [--policy P] [--trace OUT.json] [--prometheus] [--json] SCRIPT [ARGS...]`:
runs a JAX script on FlexNPU in this process, then prints what the placer did: per physical
device executions by phase, busy fraction, queue, migrations; per virtual device bytes held."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stats", help="run a JAX script on flexnpu and report placement and device state"
    )
    parser.add_argument("--policy", help="placement policy (FLEXNPU_POLICY syntax)")
    parser.add_argument("--trace", help="write a Chrome/Perfetto timeline to this file")
    parser.add_argument("--json", action="store_true", help="print the raw state as JSON")
    parser.add_argument("--prometheus", action="store_true", help="print the Prometheus exposition")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    parser.set_defaults(func=run)


def _table(client: dict[str, Any]) -> str:
    placement = client["placement"]
    lines = [
        f"policy {client['policy']} over {client['platform_version']}",
        f"{'physical':>8} {'prefill':>8} {'decode':>8} {'small':>8} {'busy':>6} "
        f"{'queue':>6} {'MB in':>8}",
    ]
    for d in placement["physical"]:
        e = d["executions"]
        moved_mb = d["bytes_migrated_in"] / 1e6
        lines.append(
            f"{d['device']:>8} {e['prefill']:>8} {e['decode']:>8} {e['small']:>8} "
            f"{d['busy_fraction']:>6.1%} {d['queue_length']:>6} {moved_mb:>8.2f}"
        )
    lines.append(f"{'virtual':>8} {'home':>8} {'MB held':>8}")
    for v in client["virtual_devices"]:
        lines.append(f"{v['id']:>8} {v['home_physical']:>8} {v['bytes_in_use'] / 1e6:>8.2f}")
    lines.append(
        f"executions {client['executions']}, migrations {client['migrations']} "
        f"({client['bytes_migrated'] / 1e6:.2f} MB), compiles {client['compiles']}"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    os.environ["JAX_PLATFORMS"] = "flexnpu"
    if args.policy:
        os.environ["FLEXNPU_POLICY"] = args.policy
    import jax

    from flexnpu import stats

    jax.devices()  # create the client before the script, so the trace covers all of it
    if args.trace:
        stats.start_trace()
    sys.argv = [args.script, *args.args]
    try:
        runpy.run_path(args.script, run_name="__main__")
    finally:
        clients = stats.clients()
        if args.trace:
            stats.stop_trace()
            stats.export_trace(args.trace)
            print(f"timeline written to {args.trace}", file=sys.stderr)
        if args.json:
            print(json.dumps(clients, indent=2))
        elif args.prometheus:
            from prometheus_client import CollectorRegistry, generate_latest

            from flexnpu import metrics

            registry = CollectorRegistry()
            metrics.register(registry)
            print(generate_latest(registry).decode())
        else:
            for client in clients:
                print(_table(client))
    return 0
