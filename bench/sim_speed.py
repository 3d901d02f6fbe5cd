"""Simulator speed: 384 x 910C, DeepSeek-R1-shaped, near saturation (the issue's goal: 10
simulated minutes in <= 60 s wall). Reports events/s, steps/s, placer calls/s, token-steps/s,
simulated seconds per wall second and the projected wall time of --target simulated seconds.

    python bench/sim_speed.py                       # 20 simulated s of the dynamic policy
    python bench/sim_speed.py --duration 600        # the full goal (long: see the projection)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

from flexnpu.sim.runner import SimSpec, run_metrics, simulate_once


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=384)
    p.add_argument("--device", default="910c")
    p.add_argument("--model", default="deepseek-r1")
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--rate", type=float, default=1200.0,
                   help="req/s (default: near the static-pd saturation of 384 x 910C, sharegpt)")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--policy", default="dynamic")
    p.add_argument("--prefill-units", type=int, default=6)
    p.add_argument("--target", type=float, default=600.0, help="simulated seconds to project")
    p.add_argument("--profile", action="store_true", help="print the top functions (cProfile)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    spec = SimSpec(devices=args.devices, device=args.device, model=args.model,
                   workload=args.workload, rate=args.rate, duration=args.duration).resolved()
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    r = simulate_once(spec, args.policy, 0, prefill_units=args.prefill_units)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    m = run_metrics(r, spec, spec.duration)
    token_steps = sum(q.n_out for q in r.requests) + sum(q.prompt for q in r.requests)
    sim_s = r.makespan_s
    out = {
        "devices": args.devices, "units": len(r.busy_s), "model": args.model,
        "workload": args.workload, "rate": args.rate, "duration_s": args.duration,
        "policy": args.policy, "wall_s": wall, "simulated_s": sim_s,
        "requests": len(r.requests), "events": r.events, "steps": r.steps,
        "placer_calls": r.placements, "events_per_s": r.events / wall,
        "steps_per_s": r.steps / wall, "placer_calls_per_s": r.placements / wall,
        "token_positions_per_s": token_steps / wall,
        "simulated_s_per_wall_s": sim_s / wall,
        "projected_wall_s_for_target": wall * args.target / sim_s,
        "utilisation": m["utilisation"], "throughput_tok_s": m["throughput_tok_s"],
        "tpot_p50_ms": m["tpot_s"]["p50"] * 1e3, "ttft_p50_s": m["ttft_s"]["p50"],
    }
    for k, v in out.items():
        print(f"{k:30s} {v:.4g}" if isinstance(v, float) else f"{k:30s} {v}")
    proj = out["projected_wall_s_for_target"]
    print(f"\n{args.target:g} simulated s of this load: ~{proj:.0f} s wall (goal 60 s): "
          f"{'met' if proj <= 60 else 'NOT met'}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
