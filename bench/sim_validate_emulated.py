"""bench/sim_validate.py on emulated accelerators: the real server on `emulate:<preset>` devices
against `simulate --device <preset> --runtime flexnpu`, the same trace, the same engine settings.

    python -m bench.sim_validate --platform emulate:910c --model random:qwen2.5-7b \\
        --configs emu --duration 4 --time-scale 20 [--layout split] [--devices 2]

The server (`flexnpu serve --dtype bfloat16`, weights made on the devices) runs with
FLEXNPU_BACKEND=emulate:<preset> and FLEXNPU_BACKEND_OPTIONS=device_count=N;time_scale=K: every
execution lasts K x its modelled device time on the wall clock. The trace is in device seconds;
its requests are sent at K x their arrival times and every latency the clients measure is divided
by K, so the table is in device time and the host's own time (HTTP, the engine's Python, JAX
dispatch) counts 1/K of what it took: K large enough that a step's K x device time exceeds the
host's time per step makes the run what a host as fast as the devices would see. --time-scale 1
shows the host's share (this machine's 2 shared cores against a 910C's step times).

The simulator gets the trace as the requests were sent (device seconds), the server's engine
settings, --runtime flexnpu (the engine's padded programs, costed as the emulated backend costs
them; one prompt chunk per step; two steps in flight) and the layout's policy: colocated =
chunked-colocate on N devices, split = static-pd with --prefill-units P on P + D devices.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

from bench.common import free_port
from bench.sim_validate import (
    Config,
    _load,
    _pct,
    drive,
    make_trace,
    measured_requests,
    run_simulate,
    start_server,
    stop_server,
    write_measured_trace,
)

# One engine instance per device; the programs: decode widths 32 and 128 blocks, chunk buckets
# 64..512 (six programs, compiled once for all devices).
ENGINE = {
    "max_num_seqs": 16,
    "max_model_len": 2048,
    "max_num_batched_tokens": 512,
    "block_size": 16,
}

# Rates in requests per device second.
EMU = Config(
    "emu",
    rate=8.0,
    prompt_median=256,
    output_median=64,
    prompt_range=(16, 1024),
    output_range=(16, 128),
)
CONFIGS = {"emu": EMU, "emu-heavy": replace(EMU, name="emu-heavy", rate=20.0)}


def preset_of(platform: str) -> str:
    return platform.split(":", 1)[1]


def measure(cfg: Config, args: argparse.Namespace, work: Path) -> dict:
    """The server's side of one configuration, latencies in device seconds."""
    k = args.time_scale
    reqs = make_trace(cfg, args.duration, args.seed, ENGINE["max_model_len"])
    for r in reqs:
        r.planned *= k  # wall clock
    name = f"{cfg.name}_{args.layout}_x{k:g}"
    print(
        f"\n== {name}: {len(reqs)} requests over {args.duration:g} device s (rate {cfg.rate} "
        f"req/s, prompt median {cfg.prompt_median}, output median {cfg.output_median}) on "
        f"{args.devices} emulated {preset_of(args.platform)}, time_scale {k:g}; "
        f"load average {_load():.1f}",
        flush=True,
    )
    layout = ["--layout", args.layout, "--dtype", "bfloat16"]
    if args.layout == "split":
        layout += [
            "--prefill-devices",
            str(args.prefill_devices),
            "--decode-devices",
            str(args.devices - args.prefill_devices),
        ]
    env = {
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": args.platform,
        "FLEXNPU_BACKEND_OPTIONS": f"device_count={args.devices};time_scale={k:g}",
    }
    port = free_port()
    t = time.time()
    proc = start_server(args, port, work / f"server_{name}.log", ENGINE, tuple(layout), env)
    print(f"server up in {time.time() - t:.0f} s; load average {_load():.1f}", flush=True)
    loads = {"load_start": _load()}
    try:
        t = time.time()
        asyncio.run(drive(port, reqs, args.seed))
        loads["load_end"] = _load()
        print(f"load done in {time.time() - t:.0f} s; load average {_load():.1f}", flush=True)
    finally:
        stop_server(proc)
    per_request = measured_requests(reqs, k)
    doc = {
        "name": name,
        "config": cfg.__dict__,
        "engine": ENGINE,
        "platform": args.platform,
        "layout": args.layout,
        "devices": args.devices,
        "prefill_devices": args.prefill_devices if args.layout == "split" else 0,
        "time_scale": k,
        "seed": args.seed,
        "load_average": loads,
        "per_request": per_request,
    }
    (work / f"measured_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def simulate(m: dict, model: str, trace: Path, out: Path) -> dict:
    """The simulator on the measured configuration's trace (device seconds)."""
    split = m["layout"] == "split"
    policy = "static-pd" if split else "chunked-colocate"
    sent = [r["sent_s"] for r in m["per_request"]]
    extra = ("--runtime", "flexnpu")
    if split:
        extra += ("--prefill-units", str(m["prefill_devices"]))
    return run_simulate(
        trace,
        max(sent) - min(sent) + 1e-3,
        out,
        devices=m["devices"],
        device=preset_of(m["platform"]),
        model=model,
        policy=policy,
        engine=ENGINE,
        extra=extra,
    )


def analyse(m: dict, model: str, work: Path) -> dict:
    per_request = m["per_request"]
    trace = work / f"trace_{m['name']}.csv"
    write_measured_trace(per_request, trace)
    sim = simulate(m, model, trace, work / f"sim_{m['name']}.json")
    real = {
        "ttft_s": _pct([r["ttft_s"] for r in per_request]),
        "tpot_s": _pct([r["tpot_s"] for r in per_request if r["tpot_s"] >= 0]),
    }
    return m | {
        "requests": len(per_request),
        "trace": str(trace),
        "real": real,
        "sim": {"ttft_s": sim["ttft_s"], "tpot_s": sim["tpot_s"]},
        "sim_requests_finished": sim["requests_finished"],
    }


def print_table(results: list[dict]) -> None:
    print(
        "\n| run | requests | metric | emulator (device ms) | simulator (ms) | sim / emu |\n"
        "|---|---|---|---|---|---|"
    )
    for res in results:
        for metric in ("ttft_s", "tpot_s"):
            for p in ("p50", "p90"):
                real, sim = res["real"][metric][p], res["sim"][metric][p]
                ratio = sim / real if real > 0 else float("nan")
                print(
                    f"| {res['name']} | {res['requests']} | {metric[:4].upper()} {p} | "
                    f"{real * 1e3:.1f} | {sim * 1e3:.1f} | {ratio:.3f} |"
                )


def run(args: argparse.Namespace, names: list[str], work: Path) -> int:
    if not args.model or not args.model.startswith("random:"):
        raise SystemExit("--platform emulate:<preset> needs --model random:<name>")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown and not args.from_measured:
        raise SystemExit(f"--configs: unknown {unknown} (emulated: {', '.join(CONFIGS)})")
    if args.layout == "split" and not 1 <= args.prefill_devices < args.devices:
        raise SystemExit("--layout split needs 1 <= --prefill-devices < --devices")
    model = args.model.split(":", 1)[1]
    if args.from_measured:
        measured = [json.loads(f.read_text()) for f in args.from_measured]
    else:
        measured = [measure(CONFIGS[n], args, work) for n in names]
    results = [analyse(m, model, work) for m in measured]
    print_table(results)
    for res in results:
        print(
            f"{res['name']}: load average {res['load_average']}; simulated requests finished "
            f"{res['sim_requests_finished']} of {res['requests']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=1) + "\n")
        print(f"wrote {args.json}")
    print(f"work files in {work}")
    return 0
