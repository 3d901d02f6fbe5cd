"""bench/sim_validate.py on emulated accelerators: the real server on `emulate:<preset>` devices
against `simulate --device <preset> --runtime flexnpu`, the same trace, the same engine settings.

    python -m bench.sim_validate --platform emulate:910c --model random:qwen2.5-7b \\
        --configs emu --duration 4 --time-scale 20 [--layout split] [--devices 2]
    python -m bench.sim_validate --platform emulate:910c --model random:qwen2.5-7b \
        --configs emu-phases --duration 10 --time-scale 20 --devices 8 \
        --layout adaptive          # or colocated, or split --prefill-devices 4

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
chunked-colocate on N devices, split = static-pd with --prefill-units P on P + D devices,
adaptive = elastic-pd on N devices (the same cluster layer and split advisor, every step on its
home device: the server runs the emulated devices without FlexNPU's per-step placer).

emu-phases: a prompt-heavy first half (long prompts, short outputs) then an output-heavy second
half (short prompts, long outputs): the shift a fixed split cannot follow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.sim_validate import (
    Config,
    Sent,
    _load,
    drive,
    make_trace,
    measured_requests,
    run_simulate,
    start_server,
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
# Rates in requests per second over all the devices (8 x 910C): the prompt-heavy phase needs
# ~4 devices of prefill, the output-heavy one ~7 of decode (16 sequences each).
PHASES = (
    replace(
        EMU,
        name="prompt-heavy",
        rate=40.0,
        prompt_median=1024,
        output_median=16,
        sigma=0.3,
        prompt_range=(256, 1536),
        output_range=(8, 32),
    ),
    replace(
        EMU,
        name="output-heavy",
        rate=14.0,
        prompt_median=64,
        output_median=256,
        sigma=0.3,
        prompt_range=(16, 256),
        output_range=(128, 512),
    ),
)
CONFIGS = {
    "emu": (EMU,),
    "emu-heavy": (replace(EMU, name="emu-heavy", rate=20.0),),
    "emu-phases": PHASES,
    # Twice the rates: the prompt-heavy phase needs ~6.5 of 8 devices of prefill, the
    # output-heavy one every decode slot.
    "emu-phases-heavy": tuple(replace(c, rate=2 * c.rate) for c in PHASES),
}


def make_phase_trace(phases: tuple[Config, ...], duration: float, seed: int) -> list[Sent]:
    """The phases one after the other, each duration / len(phases) long."""
    span = duration / len(phases)
    reqs: list[Sent] = []
    for i, cfg in enumerate(phases):
        for r in make_trace(cfg, span, seed + i, ENGINE["max_model_len"]):
            reqs.append(replace(r, rid=len(reqs), planned=r.planned + i * span))
    return reqs


def split_metrics(port: int) -> dict[str, float]:
    """The server's split gauges and role-change counters from /metrics."""
    import httpx

    names = (
        "prefill_units",
        "mixed_units",
        "decode_units",
        "split_changes_total",
        "moved_sequences_total",
    )
    out: dict[str, float] = {}
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError as e:  # a server gone: the requests' failures say why, not this
        print(f"split metrics: the server did not answer: {e}", flush=True)
        return out
    for line in text.splitlines():
        for n in names:
            if line.startswith(f"flexnpu:{n}{{"):
                out[n] = float(line.rsplit(" ", 1)[1])
    return out


def percentiles(xs: list[float]) -> dict[str, float]:
    p = np.percentile(np.array(xs), [50, 90, 99]) if xs else [float("nan")] * 3
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


def preset_of(platform: str) -> str:
    return platform.split(":", 1)[1]


def measure(config: str, args: argparse.Namespace, work: Path) -> dict:
    """The server's side of one configuration, latencies in device seconds."""
    k = args.time_scale
    phases = CONFIGS[config]
    reqs = make_phase_trace(phases, args.duration, args.seed)
    for r in reqs:
        r.planned *= k  # wall clock
    split = f"{args.prefill_devices}p" if args.layout == "split" else ""
    colocate = args.layout == "adaptive" and args.split_colocate
    name = f"{config}_{args.layout}{split}{'-colocating' if colocate else ''}_x{k:g}"
    shape = "; then ".join(
        f"rate {c.rate} req/s, prompt median {c.prompt_median}, output median {c.output_median}"
        for c in phases
    )
    print(
        f"\n== {name}: {len(reqs)} requests over {args.duration:g} device s ({shape}) on "
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
    if args.layout == "adaptive":
        layout.append("--split-colocate" if colocate else "--no-split-colocate")
    env = {
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": args.platform,
        "FLEXNPU_BACKEND_OPTIONS": f"device_count={args.devices};time_scale={k:g}",
    }
    t = time.time()
    server = start_server(args, work / f"server_{name}.log", ENGINE, tuple(layout), env)
    port = server.port
    print(f"server up in {time.time() - t:.0f} s; load average {_load():.1f}", flush=True)
    loads = {"load_start": _load()}
    try:
        t = time.time()
        asyncio.run(drive(port, reqs, args.seed))
        loads["load_end"] = _load()
        print(f"load done in {time.time() - t:.0f} s; load average {_load():.1f}", flush=True)
        split = split_metrics(port)
        print(f"split: {split}", flush=True)
    finally:
        server.stop()
    per_request = measured_requests(reqs, k)
    doc = {
        "name": name,
        "config": [c.__dict__ for c in phases],
        "engine": ENGINE,
        "platform": args.platform,
        "layout": args.layout,
        "devices": args.devices,
        "prefill_devices": args.prefill_devices if args.layout == "split" else 0,
        "split_colocate": colocate,
        "time_scale": k,
        "seed": args.seed,
        "load_average": loads,
        "split": split,
        "per_request": per_request,
    }
    (work / f"measured_{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def simulate(m: dict, model: str, trace: Path, out: Path) -> dict:
    """The simulator on the measured configuration's trace (device seconds)."""
    split = m["layout"] == "split"
    policy = {
        "split": "static-pd",
        "static-colocate": "static-colocate",
        "adaptive": "elastic-pd",
    }.get(m["layout"], "chunked-colocate")
    sent = [r["sent_s"] for r in m["per_request"]]
    extra = ("--runtime", "flexnpu")
    if split:
        extra += ("--prefill-units", str(m["prefill_devices"]))
    if m.get("split_colocate"):
        extra += ("--split-colocate",)
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
        "ttft_s": percentiles([r["ttft_s"] for r in per_request]),
        "tpot_s": percentiles([r["tpot_s"] for r in per_request if r["tpot_s"] >= 0]),
    }
    # As the simulator counts it: tokens sampled within the arrivals' window, per second.
    sent = [r["sent_s"] for r in per_request]
    window = max(sent) - min(sent) + 1e-3
    end = min(sent) + window
    real["throughput_tok_s"] = (
        sum(1 for r in per_request for t in r["token_times_s"] if t <= end) / window
    )
    return m | {
        "requests": len(per_request),
        "trace": str(trace),
        "real": real,
        "sim": {
            "ttft_s": sim["ttft_s"],
            "tpot_s": sim["tpot_s"],
            "throughput_tok_s": sim.get("throughput_tok_s", float("nan")),
        },
        "sim_requests_finished": sim["requests_finished"],
    }


def print_table(results: list[dict]) -> None:
    print(
        "\n| run | requests | metric | emulator (device ms) | simulator (ms) | sim / emu |\n"
        "|---|---|---|---|---|---|"
    )
    for res in results:
        for metric in ("ttft_s", "tpot_s"):
            for p in ("p50", "p90", "p99"):
                real, sim = res["real"][metric][p], res["sim"][metric][p]
                ratio = sim / real if real > 0 else float("nan")
                print(
                    f"| {res['name']} | {res['requests']} | {metric[:4].upper()} {p} | "
                    f"{real * 1e3:.1f} | {sim * 1e3:.1f} | {ratio:.3f} |"
                )
        real, sim = res["real"]["throughput_tok_s"], res["sim"]["throughput_tok_s"]
        print(
            f"| {res['name']} | {res['requests']} | output tok/s | {real:,.0f} | {sim:,.0f} | "
            f"{sim / real:.3f} |"
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
        measured = [measure(n, args, work) for n in names]
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
