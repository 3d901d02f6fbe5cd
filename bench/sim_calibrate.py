"""Fit the simulator's `cpu` preset to the serving engine's own programs, timed on this machine.

Builds FlexNPU's engine for the given settings (SmolLM2-135M shapes, random float32 weights:
the times do not depend on the values) on one device of the current JAX platform, runs every
program it compiles (the decode-only step at each block-table width, the mixed step at each
prompt-chunk bucket; padded inputs, as the engine's warm-up runs them), and times each (median
of --repeats after a warm-up, the inputs put on the device and the sampled ids read back every
call, as the engine's loop does). Then it fits the preset's compute and memory efficiency and
its fixed per-step time so that

    max(FLOPs / (peak * eff_compute), bytes / (bandwidth * eff_memory)) + launch_s

with FLOPs and bytes of each padded program from the simulator's HLO-derived cost model
(steptime.EngineShapes) matches (least squares in log time). Writes the calibration JSON
(default python/flexnpu/sim/data/cpu_calibration.json, read by flexnpu.sim.hardware) and prints
the per-program error.

    JAX_PLATFORMS=cpu python -m bench.sim_calibrate            # ~1-2 min on 2 shared cores
    JAX_PLATFORMS=flexnpu python -m bench.sim_calibrate --max-model-len 256 \\
        --max-num-batched-tokens 128 --out /tmp/cal.json

The 2 vCPUs are shared by every device of the machine: the fit describes one device that has
the whole machine (XLA uses both cores), as a one-device serve run uses it, under whatever
load the machine has while it runs (the load average is printed and stored).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from bench.common import smollm2_engine, time_program  # noqa: E402
from flexnpu.sim.hardware import CPU_CALIBRATION, get_preset  # noqa: E402
from flexnpu.sim.models import get_model  # noqa: E402
from flexnpu.sim.steptime import CostModel, EngineShapes  # noqa: E402


def measure(args: argparse.Namespace) -> tuple[EngineShapes, list[dict]]:
    """Median seconds of every program of the engine built with these settings."""
    eng = smollm2_engine(
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
    )
    ec = eng.ec
    shapes = EngineShapes.of_engine(
        ec.max_num_seqs, ec.max_num_batched_tokens, ec.block_size, ec.max_model_len
    )
    runner = eng.instances[0].runner
    t0 = time.perf_counter()
    eng.warmup()
    print(
        f"{eng.instances[0].device.platform}: compiled {eng.num_warmup_programs()} programs "
        f"in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    rows = []
    for chunk, width in shapes.programs():
        ts = [time_program(runner, chunk, width) for _ in range(args.repeats + 1)]
        s = statistics.median(ts[1:])
        rows.append({"chunk": chunk, "width": width, "seconds": s, "min_seconds": min(ts[1:])})
        print(
            f"program chunk={chunk:4d} width={width:3d}: {s * 1e3:8.1f} ms "
            f"(min {min(ts[1:]) * 1e3:.1f})",
            flush=True,
        )
    return shapes, rows


def fit(shapes: EngineShapes, rows: list[dict]) -> tuple[float, float, float, list[float]]:
    """(eff_compute, eff_memory, launch_s, relative error per program)."""
    m = get_model("smollm2-135m")
    cm = CostModel.load(m)
    dev = get_preset("cpu").device
    fb = np.array(
        [
            cm.flops_bytes(shapes.features(r["chunk"], r["width"]), fused_attention=False)
            for r in rows
        ]
    )
    meas = np.array([r["seconds"] for r in rows])
    ecs = np.geomspace(0.005, 1.0, 80)
    ems = np.geomspace(0.005, 2.0, 80)
    launches = np.concatenate([[0.0], np.geomspace(1e-4, meas.min() * 0.9, 40)])
    tc = fb[:, 0][None, :] / (dev.peak_flops * ecs[:, None])  # [ec, program]
    tm = fb[:, 1][None, :] / (dev.mem_bandwidth * ems[:, None])  # [em, program]
    roof = np.maximum(tc[:, None, :], tm[None, :, :])  # [ec, em, program]
    best = (np.inf, 0.0, 0.0, 0.0)
    for launch in launches:
        err = np.sum(np.log((roof + launch) / meas) ** 2, axis=-1)
        i, j = np.unravel_index(np.argmin(err), err.shape)
        if err[i, j] < best[0]:
            best = (float(err[i, j]), float(ecs[i]), float(ems[j]), float(launch))
    _, ec, em, launch = best
    pred = np.maximum(fb[:, 0] / (dev.peak_flops * ec), fb[:, 1] / (dev.mem_bandwidth * em))
    return ec, em, launch, (pred + launch) / meas - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=256)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=CPU_CALIBRATION, help="calibration JSON")
    p.add_argument("--dry-run", action="store_true", help="measure and fit, write nothing")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    t0 = time.time()
    shapes, rows = measure(args)
    load_after = os.getloadavg()
    ec, em, launch, rel = fit(shapes, rows)
    for r, e in zip(rows, rel, strict=True):
        r["model_error"] = float(e)
        print(
            f"chunk={r['chunk']:4d} width={r['width']:3d} measured {r['seconds'] * 1e3:8.1f} ms"
            f"  model error {e * 100:+6.1f}%"
        )
    print(
        f"eff_compute {ec:.4f}  eff_memory {em:.4f}  launch_s {launch * 1e3:.1f} ms  "
        f"(load average {load_before[0]:.1f} -> {load_after[0]:.1f})"
    )
    import jax

    doc = {
        "eff_compute": ec,
        "eff_memory": em,
        "launch_s": launch,
        "engine": {
            "max_num_seqs": args.max_num_seqs,
            "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens,
            "block_size": args.block_size,
        },
        "platform": jax.devices()[0].platform,
        "measured_at_unix": t0,
        "load_average_1m": [load_before[0], load_after[0]],
        "programs": rows,
        "source": "fitted to the serving engine's padded SmolLM2-135M programs (f32) timed "
        "on this machine by bench/sim_calibrate.py",
        "regenerate": "JAX_PLATFORMS=cpu python -m bench.sim_calibrate",
    }
    if not args.dry_run:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
