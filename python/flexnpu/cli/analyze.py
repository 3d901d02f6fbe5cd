"""`flexnpu analyze FILE`: profile and classify a serialized HLO module."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "analyze",
        help="cost profile and phase of a serialized HLO module",
        description=(
            "Analyze an HloModuleProto or HloModuleProtoWithConfig (protobuf bytes, e.g. from "
            "PJRT_Executable_OptimizedProgram or HloModule.as_serialized_hlo_module_proto())."
        ),
    )
    p.add_argument("file", type=Path, help="serialized HLO module")
    p.add_argument(
        "--device", default="cpu", help="preset: ascend910b, ascend910c, h100, h200, cpu"
    )
    p.add_argument("--peak-flops", type=float, help="custom device: dense peak FLOP/s")
    p.add_argument("--bandwidth", type=float, help="custom device: memory bandwidth in bytes/s")
    p.add_argument(
        "--xla-compatible",
        action="store_true",
        help="count as XLA's cost analysis does (while bodies once, whole fused gather tables)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flexnpu.analysis import Device, analyze_bytes, get_device

    device: str | Device = args.device
    if args.peak_flops is not None or args.bandwidth is not None:
        if args.peak_flops is None or args.bandwidth is None:
            print("flexnpu analyze: --peak-flops and --bandwidth go together", file=sys.stderr)
            return 2
        device = Device(name="custom", peak_flops=args.peak_flops, mem_bandwidth=args.bandwidth)
    try:
        data = args.file.read_bytes()
        result = analyze_bytes(data, device=get_device(device), xla_compatible=args.xla_compatible)
    except (OSError, ValueError) as e:
        print(f"flexnpu analyze: {args.file}: {e}", file=sys.stderr)
        return 1
    print(result.to_json() if args.json else result.table())
    return 0
