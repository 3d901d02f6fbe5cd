"""`flexnpu devices [--json] [--source S] [--no-client]`: the physical devices FlexNPU runs on, one
row each: index, source, name, roofline preset, memory total/free, utilisation and the PJRT
device FlexNPU bound to it; then the virtual devices over them.

By default the FlexNPU client is created (JAX_PLATFORMS=flexnpu) so that the rows are what the
placer sees: the accelerators npu-smi / nvidia-smi show (AscendCL, NVML telemetry) with their
bindings, and every physical device of the backend no telemetry row binds (the CPU plugin's
devices, for one: source "pjrt", name "cpu:N"). `--no-client` only asks AscendCL / NVML
(pjrt_device is null). JSON: a list of objects with keys index, source, name, preset,
memory_total_bytes, memory_free_bytes, utilization {compute, memory} (percent, null where
unsupported), pjrt_device.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

JSON_KEYS = (
    "index",
    "source",
    "name",
    "preset",
    "memory_total_bytes",
    "memory_free_bytes",
    "utilization",
    "pjrt_device",
)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices", help="list physical NPUs / GPUs (AscendCL, NVML) and their PJRT bindings"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.add_argument(
        "--source",
        choices=("auto", "ascendcl", "nvml", "none"),
        help="telemetry source (default FLEXNPU_TELEMETRY or auto)",
    )
    parser.add_argument(
        "--no-client",
        action="store_true",
        help="do not create the FlexNPU client: vendor libraries only, no PJRT bindings",
    )
    parser.set_defaults(func=run)


def _row(device: dict[str, Any]) -> dict[str, Any]:
    u = device.get("utilization") or {}
    return {
        "index": device["index"],
        "source": device["source"],
        "name": device["name"],
        "preset": device.get("preset"),
        "memory_total_bytes": device.get("memory_total_bytes"),
        "memory_free_bytes": device.get("memory_free_bytes"),
        "utilization": {"compute": u.get("compute"), "memory": u.get("memory")},
        "pjrt_device": device.get("pjrt_device"),
    }


@dataclass
class _Listing:
    rows: list[dict[str, Any]]
    note: str = ""  # why telemetry found no accelerator, or its error
    backend: str = ""  # the client's backend, policy and device counts (table only)
    virtual: str = ""  # the virtual devices over the physical ones (table only)


def _backend_row(index: int, platform: str, preset: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "source": "pjrt",
        "name": f"{platform}:{index}",
        "preset": preset,
        "memory_total_bytes": None,
        "memory_free_bytes": None,
        "utilization": {"compute": None, "memory": None},
        "pjrt_device": index,
    }


def _from_client(source: str | None) -> _Listing:
    """What the FlexNPU client has: telemetry's accelerators, the backend's other physical
    devices, the virtual devices over them."""
    os.environ["JAX_PLATFORMS"] = "flexnpu"
    if source:
        os.environ["FLEXNPU_TELEMETRY"] = source
    import jax

    from flexnpu import stats

    devices = jax.devices()
    client = stats.clients()[0]
    telemetry = client.get("telemetry") or {}
    rows = [_row(d) for d in telemetry.get("devices", [])]
    bound = {r["pjrt_device"] for r in rows}
    platform = str(devices[0].physical_platform)
    num_physical = client["num_physical_devices"]
    rows += [
        _backend_row(p, platform, client.get("roofline"))
        for p in range(num_physical)
        if p not in bound
    ]
    virtual = client["virtual_devices"]
    return _Listing(
        rows,
        note=telemetry.get("fallback") or telemetry.get("error") or "",
        backend=f"{client['platform_version']}: {num_physical} physical devices, "
        f"{len(virtual)} virtual, policy {client['policy']}",
        virtual="virtual devices: "
        + ", ".join(f"flexnpu:{v['id']} over {platform}:{v['home_physical']}" for v in virtual),
    )


def _from_libraries(source: str | None) -> _Listing:
    from dataclasses import asdict

    from flexnpu import hardware

    opened = hardware.open_source(source)
    if opened is None:
        return _Listing([], hardware.last_fallback)
    with opened:
        return _Listing([_row(asdict(d)) for d in opened.devices()], opened.fallback)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _percent(value: int | None) -> str:
    return "n/a" if value is None else f"{value}%"


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'index':>5} {'source':<8} {'name':<24} {'preset':<11} {'total GiB':>9} "
        f"{'free GiB':>9} {'compute':>7} {'memory':>7} {'pjrt':>5}"
    ]
    for r in rows:
        u = r["utilization"]
        pjrt = "-" if r["pjrt_device"] is None else str(r["pjrt_device"])
        lines.append(
            f"{r['index']:>5} {r['source']:<8} {r['name'][:24]:<24} {r['preset'] or '-':<11} "
            f"{_gib(r['memory_total_bytes']):>9} {_gib(r['memory_free_bytes']):>9} "
            f"{_percent(u['compute']):>7} {_percent(u['memory']):>7} {pjrt:>5}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from flexnpu.hardware import HardwareError

    try:
        found = _from_libraries(args.source) if args.no_client else _from_client(args.source)
    except (HardwareError, ValueError) as e:
        print(f"flexnpu devices: {e}", file=sys.stderr)
        return 1
    rows, note = found.rows, found.note
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        print("\n".join(x for x in (found.backend, _table(rows), found.virtual) if x))
    else:
        print("no physical devices through AscendCL or NVML" + (f" ({note})" if note else ""))
    if note and rows and not args.json:
        print(note, file=sys.stderr)
    return 0
