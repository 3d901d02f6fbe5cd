"""Dispatch cost in instructions: bench/dispatch_capi.cc under callgrind, load-independent.

The C-level loop (one tiny jitted call as jaxlib makes it, see the .cc) runs over the physical
CPU plugin directly and over FlexNPU (passthrough, and dynamic with 8 virtual over 4 physical
devices); callgrind counts the instructions of the loop alone, in all threads. Printed: per
configuration the instructions per call, FlexNPU's extra instructions per call over the direct
plugin, and that extra as a ratio of the direct call's instructions. Wall-clock figures of the
same binary outside valgrind are printed too (secondary: they depend on the machine's load).

    python -m bench.dispatch_capi --build-dir build/ctest_dispatch [--calls 2000] [--json OUT]
        [--baseline-build-dir DIR]

glibc's fastbin consolidation (malloc_consolidate) runs or not per call depending on the heap's
layout, which moves the physical plugin's own cost by up to ~1,000 instructions per call
between otherwise equal runs; the counts are taken with fastbins off (GLIBC_TUNABLES
glibc.malloc.mxfast=0) in every configuration unless --glibc-fastbins is given.
`--baseline-build-dir` adds the FlexNPU configurations of another build (e.g. of the previous
commit) to the table, measured in the same run.

Needs valgrind and a build with -DFLEXNPU_BUILD_TESTS=ON (target dispatch_capi).

`--jax` measures a real JAX loop instead of the C-level model: one CPython process with both
platforms (FlexNPU from --build-dir's plugin, or the installed one without --build-dir, and the
physical CPU plugin registered directly), a jitted tiny op (x + 1, f32[8]) with
block_until_ready, blocks of --calls calls alternating flexnpu / direct twice; callgrind counts
each block alone (all threads, toggled from outside at marks the child sets), with its cache
and branch simulation, so besides instructions per call it prints simulated L1 instruction
misses, L1 data misses and mispredicted branches per call: the load-independent view of what
the wall-clock ratio of bench/dispatch.py also pays for (code footprint, not just instructions).

    python -m bench.dispatch_capi --jax [--build-dir DIR] [--policy dynamic] [--calls 1000]
        [--keep-dumps DIR]   # per-block dumps, e.g. callgrind_annotate DIR/block1.flexnpu.callgrind
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

from bench.common import REPO

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


# Simulated events per call that --jax prints (callgrind --cache-sim=yes --branch-sim=yes).
_JAX_EVENTS = {
    "Ir": "instr",
    "I1mr": "L1i miss",
    "D1mr": "L1d rd miss",
    "D1mw": "L1d wr miss",
    "Bcm": "br mispred",
    "Bim": "ind mispred",
}


def _jax_child(args: argparse.Namespace) -> int:
    """The measured process of --jax: marks phases in args.sync, waits for the parent's ack."""
    import time

    import jax
    import numpy as np
    from jax._src import xla_bridge

    import flexnpu
    from bench.common import DIRECT_PLATFORM, setup_side_by_side

    if args.plugin:
        cpu = str(flexnpu.cpu_plugin_path())
        # As flexnpu's jax_plugin does: the plugin offers the backend's PJRT extensions (FFI:
        # JAX then makes an execute context per call) only when it knows the backend at load.
        os.environ.setdefault("FLEXNPU_CPU_PLUGIN_PATH", cpu)
        options = {
            "cpu_plugin_path": cpu,
            "backend_options": "cpu_device_count=4",
            "policy": args.policy,
            "num_virtual_devices": 8 if args.policy == "dynamic" else 4,
        }
        xla_bridge.register_plugin("flexnpubench", library_path=args.plugin, options=options)
        xla_bridge.register_plugin(
            DIRECT_PLATFORM, library_path=cpu, options={"cpu_device_count": 4}
        )
        jax.config.update("jax_platforms", f"flexnpubench,{DIRECT_PLATFORM}")
        npu, direct = jax.devices("flexnpubench")[0], jax.devices(DIRECT_PLATFORM)[0]
    else:
        os.environ["FLEXNPU_POLICY"] = args.policy
        if args.policy == "dynamic":
            os.environ["FLEXNPU_NUM_VIRTUAL_DEVICES"] = "8"
        npu_devices, direct_devices = setup_side_by_side()
        npu, direct = npu_devices[0], direct_devices[0]
    jitted = jax.jit(lambda x: x + 1)
    x_npu = jax.device_put(np.ones(8, np.float32), npu)
    x_direct = jax.device_put(np.ones(8, np.float32), direct)
    for _ in range(args.warmup):
        jitted(x_npu).block_until_ready()
        jitted(x_direct).block_until_ready()
    mark = 0

    def phase() -> None:
        nonlocal mark
        (args.sync / f"phase.{mark}").write_text("")
        while not (args.sync / f"ack.{mark}").exists():
            time.sleep(0.05)
        mark += 1

    phase()  # instrumentation on
    for _ in range(2):
        for x in (x_npu, x_direct):
            for _ in range(args.calls):
                jitted(x).block_until_ready()
            phase()  # dump this block
    return 0


def _jax_main(args: argparse.Namespace, env: dict[str, str]) -> int:
    import time

    plugin = ""
    if args.build_dir is not None:
        plugin = str((args.build_dir / "pjrt_flexnpu" / "pjrt_plugin_flexnpu.so").resolve())
    with tempfile.TemporaryDirectory() as tmp:
        sync = Path(tmp)
        child = [
            sys.executable,
            "-m",
            "bench.dispatch_capi",
            "--jax-child",
            "--sync",
            tmp,
            "--policy",
            args.policy,
            "--calls",
            str(args.calls),
            "--warmup",
            str(min(args.warmup, 500)),
            "--plugin",
            plugin,
        ]
        process = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--cache-sim=yes",
                "--branch-sim=yes",
                f"--callgrind-out-file={tmp}/cg.%p",
                *child,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for mark in range(5):
            while not (sync / f"phase.{mark}").exists():
                if process.poll() is not None:
                    print(process.stderr.read() if process.stderr else "", file=sys.stderr)
                    raise RuntimeError("the measured JAX process ended early")
                time.sleep(0.1)
            control = ["-i", "on"] if mark == 0 else ["-d", f"block{mark}"]
            subprocess.run(
                ["callgrind_control", *control, str(process.pid)], check=True, capture_output=True
            )
            (sync / f"ack.{mark}").write_text("")
        subprocess.run(["callgrind_control", "-i", "off", str(process.pid)], capture_output=True)
        process.wait()
        blocks: list[dict[str, float]] = []
        for mark in range(1, 5):
            dump = next(sync.glob(f"cg.{process.pid}.{mark}"))
            text = dump.read_text(errors="replace")
            names = re.search(r"^events:\s+(.+)$", text, re.M).group(1).split()
            values = re.search(r"^summary:\s+(.+)$", text, re.M).group(1).split()
            counts = dict(zip(names, (int(v) for v in values), strict=False))
            blocks.append({k: counts.get(k, 0) / args.calls for k in _JAX_EVENTS})
        if args.keep_dumps is not None:
            args.keep_dumps.mkdir(parents=True, exist_ok=True)
            for mark, label in enumerate(("flexnpu", "direct", "flexnpu", "direct"), start=1):
                dump = next(sync.glob(f"cg.{process.pid}.{mark}"))
                shutil.copy(dump, args.keep_dumps / f"block{mark}.{label}.callgrind")
    rows = {
        "flexnpu": {k: (blocks[0][k] + blocks[2][k]) / 2 for k in _JAX_EVENTS},
        "direct": {k: (blocks[1][k] + blocks[3][k]) / 2 for k in _JAX_EVENTS},
    }
    print(
        f"real JAX loop, jitted x + 1 on f32[8], policy {args.policy}, per call "
        f"(mean of 2 blocks of {args.calls}):"
    )
    print(f"{'':<9}" + "".join(f"{label:>13}" for label in _JAX_EVENTS.values()))
    for name, row in rows.items():
        print(f"{name:<9}" + "".join(f"{row[k]:>13.0f}" for k in _JAX_EVENTS))
    print(
        f"{'extra':<9}"
        + "".join(f"{rows['flexnpu'][k] - rows['direct'][k]:>13.0f}" for k in _JAX_EVENTS)
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", type=Path)
    parser.add_argument("--jax", action="store_true", help="measure a real JAX loop (see above)")
    parser.add_argument("--policy", default="passthrough", help="--jax: FlexNPU's policy")
    parser.add_argument("--jax-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sync", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plugin", default="", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=2000)
    # Long enough that dynamic placement has compiled its pinned variant on every device.
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--wall-calls", type=int, default=20000)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        help="--jax: copy each block's callgrind dump here (for callgrind_annotate)",
    )
    parser.add_argument("--baseline-build-dir", type=Path)
    parser.add_argument(
        "--glibc-fastbins",
        action="store_true",
        help="leave glibc's fastbins on (counts then vary by heap layout)",
    )
    args = parser.parse_args()
    if args.jax_child:
        return _jax_child(args)
    env = dict(os.environ)
    if not args.glibc_fastbins:
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
        env["GLIBC_TUNABLES"] = ":".join([*tunables, "glibc.malloc.mxfast=0"])
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 1
    if args.jax:
        return _jax_main(args, env)
    if args.build_dir is None:
        parser.error("--build-dir is required (except with --jax)")
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
