"""Dispatch cost in instructions: bench/dispatch_capi.cc under callgrind, load-independent.

The C-level loop (one tiny jitted call as jaxlib makes it, see the .cc) runs over the physical
CPU plugin directly and over FlexNPU (passthrough, and dynamic with 8 virtual over 4 physical
devices); callgrind counts the instructions of the loop alone, in all threads. Printed: per
configuration the instructions per call, FlexNPU's extra instructions per call over the direct
plugin, and that extra as a ratio of the direct call's instructions. Wall-clock figures of the
same binary outside valgrind are printed too (secondary: they depend on the machine's load).

    python bench/dispatch_capi.py --build-dir build/ctest_dispatch [--calls 2000] [--json OUT]
        [--baseline-build-dir DIR]

glibc's fastbin consolidation (malloc_consolidate) runs or not per call depending on the heap's
layout, which moves the physical plugin's own cost by up to ~1,000 instructions per call
between otherwise equal runs; the counts are taken with fastbins off (GLIBC_TUNABLES
glibc.malloc.mxfast=0) in every configuration unless --glibc-fastbins is given.
`--baseline-build-dir` adds the FlexNPU configurations of another build (e.g. of the previous
commit) to the table, measured in the same run.

Needs valgrind and a build with -DFLEXNPU_BUILD_TESTS=ON (target dispatch_capi).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS: dict[str, list[str]] = {
    "direct": [],
    "passthrough": ["policy=passthrough", "num_virtual_devices=4"],
    "dynamic": ["policy=dynamic", "num_virtual_devices=8"],
}


def _cpu_plugin() -> str:
    import flexnpu

    return str(flexnpu.cpu_plugin_path())


def _command(build_dir: Path, config: str, calls: int, warmup: int) -> list[str]:
    cpu = _cpu_plugin()
    if config == "direct":
        plugin, options = cpu, ["cpu_device_count=4"]
    else:
        plugin = str(build_dir / "pjrt_flexnpu" / "pjrt_plugin_flexnpu.so")
        options = [f"cpu_plugin_path={cpu}", "backend_options=cpu_device_count=4", *CONFIGS[config]]
    command = [str(build_dir / "dispatch_capi"), "--plugin", plugin]
    for option in options:
        command += ["--option", option]
    return command + ["--calls", str(calls), "--warmup", str(warmup)]


def _instructions(command: list[str], out_dir: Path, config: str, env: dict[str, str]) -> int:
    out_file = out_dir / f"callgrind.{config}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out_file}",
            *command,
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    for dump in sorted(out_dir.glob(f"callgrind.{config}*")):
        text = dump.read_text(errors="replace")
        if "dispatch loop" in text:
            match = re.search(r"^(?:totals|summary):\s+(\d+)", text, re.M)
            if match:
                return int(match.group(1))
    raise RuntimeError(f"no callgrind dump of the dispatch loop for {config} in {out_dir}")


def _wall(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    result = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    match = re.search(r"min (\d+)\s+median (\d+)", result.stdout)
    if not match:
        raise RuntimeError(f"unexpected output of {command[0]}: {result.stdout!r}")
    return float(match.group(1)), float(match.group(2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=2000)
    # Long enough that dynamic placement has compiled its pinned variant on every device.
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--wall-calls", type=int, default=20000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline-build-dir", type=Path)
    parser.add_argument(
        "--glibc-fastbins",
        action="store_true",
        help="leave glibc's fastbins on (counts then vary by heap layout)",
    )
    args = parser.parse_args()
    env = dict(os.environ)
    if not args.glibc_fastbins:
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
        env["GLIBC_TUNABLES"] = ":".join([*tunables, "glibc.malloc.mxfast=0"])
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    if not (args.build_dir / "dispatch_capi").exists():
        print(
            f"{args.build_dir}/dispatch_capi is missing: build target dispatch_capi "
            "(-DFLEXNPU_BUILD_TESTS=ON)",
            file=sys.stderr,
        )
        return 1
    runs = [(config, args.build_dir, config) for config in CONFIGS]
    if args.baseline_build_dir is not None:
        runs += [
            (f"{config} (baseline)", args.baseline_build_dir, config)
            for config in CONFIGS
            if config != "direct"
        ]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, build_dir, config in runs:
            command = _command(build_dir, config, args.calls, args.warmup)
            total = _instructions(command, Path(tmp), name.replace(" ", "_"), env)
            wall_min, wall_median = _wall(
                _command(build_dir, config, args.wall_calls, args.warmup), env
            )
            rows[name] = {
                "instructions_per_call": total / args.calls,
                "wall_min_ns": wall_min,
                "wall_median_ns": wall_median,
            }
    direct = rows["direct"]["instructions_per_call"]
    print(
        f"{'config':<22} {'instr/call':>11} {'extra':>8} {'ratio':>7} "
        f"{'wall min ns':>12} {'wall median ns':>15}"
    )
    for config, row in rows.items():
        extra = row["instructions_per_call"] - direct
        row["extra_instructions_per_call"] = extra
        row["instruction_ratio"] = row["instructions_per_call"] / direct
        print(
            f"{config:<22} {row['instructions_per_call']:>11.0f} {extra:>8.0f} "
            f"{row['instruction_ratio']:>7.3f} {row['wall_min_ns']:>12.0f} "
            f"{row['wall_median_ns']:>15.0f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
