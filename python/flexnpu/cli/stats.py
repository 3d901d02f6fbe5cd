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
    parser.add_argument(
        "--daemon",
        metavar="SOCKET",
        help="report a flexnpu daemon's sessions and tenants instead of a script",
    )
    parser.add_argument("script", nargs="?", help="the Python script to run")
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
    modelled = client.get("modelled_device_time")
    if modelled:  # an emulated backend: device time it modelled (wall time / time_scale)
        lines.append(
            "modelled device time: "
            + ", ".join(f"{m['physical']}: {m['busy_s']:.6g} s" for m in modelled)
            + f" (time_scale {modelled[0]['time_scale']:g})"
        )
    for d in placement["physical"]:
        moved = {r: b for r, b in d.get("bytes_migrated_in_by_reason", {}).items() if b}
        if moved:
            why = ", ".join(f"{r} {b / 1e6:.2f}" for r, b in moved.items())
            lines.append(f"  MB moved onto physical {d['device']} by reason: {why}")
    lines.append(f"{'virtual':>8} {'home':>8} {'MB held':>8}")
    for v in client["virtual_devices"]:
        lines.append(f"{v['id']:>8} {v['home_physical']:>8} {v['bytes_in_use'] / 1e6:>8.2f}")
    lines.append(
        f"executions {client['executions']}, migrations {client['migrations']} "
        f"({client['bytes_migrated'] / 1e6:.2f} MB), compiles {client['compiles']}"
    )
    return "\n".join(lines)


def _daemon_table(state: dict[str, Any]) -> str:
    lines = [
        f"daemon {state['socket']} over {state['platform']} ({state['devices']} devices), "
        f"sessions served {state['sessions_served']}, reclaimed {state['sessions_reclaimed']}",
        f"{'session':>8} {'tenant':>12} {'buffers':>8} {'executables':>11}",
    ]
    for s in state["sessions"]:
        lines.append(f"{s['id']:>8} {s['tenant']:>12} {s['buffers']:>8} {s['executables']:>11}")
    lines.append(
        f"{'tenant':>12} {'sessions':>8} {'MB held':>8} {'quota MB':>8} {'priority':>8} "
        f"{'executions':>10} {'held':>6}"
    )
    for name, t in state["tenants"].items():
        quota = "-" if t["memory_quota_bytes"] < 0 else f"{t['memory_quota_bytes'] / 1e6:.2f}"
        lines.append(
            f"{name:>12} {t['sessions']:>8} {t['bytes_in_use'] / 1e6:>8.2f} "
            f"{quota:>8} {t['priority']:>8} {t.get('executions', 0):>10} "
            f"{t.get('held_for_latency', 0):>6}"
        )
    # Served over FlexNPU's runtime (daemon --policy): its one placer's decisions.
    for client in state.get("runtime", []):
        lines.append("placements by reason (the daemon's placer, all sessions):")
        lines.append(_table(client))
        for d in client["placement"]["physical"]:
            reasons = ", ".join(f"{k} {v}" for k, v in d["decisions"].items() if v)
            lines.append(f"  physical {d['device']}: {reasons or 'none'}")
    return "\n".join(lines)


def _run_daemon(args: argparse.Namespace) -> int:
    from flexnpu._daemon_wire import daemon_stats

    try:
        state = json.loads(daemon_stats(args.daemon))
    except (ConnectionError, RuntimeError, OSError) as e:
        print(f"flexnpu stats: {e}", file=sys.stderr)
        return 1
    print(json.dumps(state, indent=2) if args.json else _daemon_table(state))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.daemon:
        return _run_daemon(args)
    if not args.script:
        print("flexnpu stats: give a SCRIPT to run or --daemon SOCKET", file=sys.stderr)
        return 2
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
