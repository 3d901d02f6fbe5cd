"""Where an adaptive run's TPOT goes: one run of a bench.ablation variant (one workload, rate and
seed) with the split advisor's timeline, each decode instance's batch over time, and the slow
requests (TPOT above the run's p90) by the decode instance that took them and when.

    python -m bench.ablation_inspect --workload phase-shift:5 --rate 517 \
        --variants "adaptive,adaptive (no backlog or hysteresis)"

A decode instance takes handoffs only while its unit is on the decode side of the split; a
role change moves a unit's decode sequences with their KV to the decode side (serving/cluster.py),
which counts here as the new instance taking them (the last one that took a request is shown).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

import numpy as np

from bench.ablation import SUITE, VARIANTS
from flexnpu.sim import experiments
from flexnpu.sim.adaptive import AdaptiveSimulation


class _Recording(AdaptiveSimulation):
    """AdaptiveSimulation that records which decode instance took each sequence, each decode
    instance's running batch every `sample_s`, and where each decode step ran."""

    sample_s = 0.25

    def _run(self, wl: Any) -> Any:
        self.took: dict[int, tuple[int, float]] = {}  # rid -> (decode instance, time)
        self.batches: list[tuple[float, list[tuple[int, int]]]] = []  # running, waiting
        # decode steps per instance: on its home unit, lent, while its unit takes prompts
        self.decode_steps: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
        self._next_sample = 0.0
        return super()._run(wl)

    def _on_arrival(self, req: Any, now: float) -> None:
        if now >= self._next_sample:
            self._next_sample = now + self.sample_s
            self.batches.append(
                (now, [(x.sched.num_running, x.sched.num_waiting) for x in self.back])
            )
        super()._on_arrival(req, now)

    def _on_kv(self, inst: Any, seq: Any, now: float) -> None:
        self.took[seq.payload.rid] = (inst.idx - self.units, now)
        super()._on_kv(inst, seq, now)

    def _on_done(self, inst: Any, plan: Any, ticket: int, unit: int, now: float) -> None:
        if inst.idx >= self.units:
            home = inst.idx - self.units
            self.decode_steps[home][unit != home] += 1
            if home < self.cluster.prefill_units:  # its unit now takes prompts
                self.decode_steps[home][2] += 1
        super()._on_done(inst, plan, ticket, unit, now)


def inspect(spec: experiments.SimSpec, seed: int, rate: float, out: Any) -> dict[str, Any]:
    spec = spec.resolved()
    (policy,) = spec.policies
    rec, wl = experiments.build_simulation(spec, policy, seed, rate=rate, adaptive_class=_Recording)
    if not isinstance(rec, _Recording):
        raise SystemExit(f"{policy}: not a policy of the split advisor")
    r = rec.run(wl)
    m = experiments.run_metrics(r, spec, spec.duration)
    fin = [q for q in r.requests if q.finish >= 0 and q.n_out > 1]
    tpot = {q.rid: (q.finish - q.first_token) / (q.n_out - 1) for q in fin}
    vals = np.array(list(tpot.values()))
    p90, p99 = np.percentile(vals, [90, 99])
    print(
        f"  {len(r.requests)} requests, attainment "
        f"{m['slo'][spec.slos[0].name]['attainment']:.3f}, TTFT p99 "
        f"{m['ttft_s']['p99']:.3f} s, TPOT p50/p90/p99 {np.percentile(vals, 50) * 1e3:.1f}/"
        f"{p90 * 1e3:.1f}/{p99 * 1e3:.1f} ms, preemptions {r.preemptions}",
        file=out,
    )
    timeline = r.split_timeline
    print(
        "  split (time s: prefill units, or M: all co-located): "
        + ", ".join(f"{t:.0f}:{'M' if m else n}" for t, n, m in timeline),
        file=out,
    )
    # The slow requests: which decode instance took them, and when.
    slow = [rid for rid, v in tpot.items() if v > p99]
    by_inst: dict[int, int] = defaultdict(int)
    for rid in slow:
        by_inst[rec.took[rid][0]] += 1
    took_at = sorted(rec.took[rid][1] for rid in slow)
    print(
        f"  {len(slow)} requests above TPOT p99: taken by decode instances "
        + ", ".join(f"{k}: {v}" for k, v in sorted(by_inst.items(), key=lambda kv: -kv[1]))
        + f"; taken at {np.percentile(took_at, 10):.1f}..{np.percentile(took_at, 90):.1f} s",
        file=out,
    )
    # Each decode instance: handoffs taken and its peak batch, with the time of the peak.
    taken: dict[int, int] = defaultdict(int)
    for inst, _ in rec.took.values():
        taken[inst] += 1
    peaks = []
    for i in range(rec.units):
        series = [(b[i][0], t) for t, b in rec.batches]
        peak, when = max(series) if series else (0, 0.0)
        waiting = max((b[i][1] for _, b in rec.batches), default=0)
        home, lent, draining = rec.decode_steps[i]
        tp = [tpot[rid] for rid, (k, _) in rec.took.items() if k == i and rid in tpot]
        tp99 = np.percentile(tp, 99) if tp else 0.0
        peaks.append((i, taken[i], peak, when, waiting, home, lent, draining, tp99))
    print(
        "  decode instance: handoffs taken, peak batch (at s), peak waiting, decode steps "
        "home/lent (of which while its unit took prompts), its requests' TPOT p99",
        file=out,
    )
    for i, n, peak, when, waiting, home, lent, draining, tp in peaks:
        print(
            f"    {i:2d}: {n:5d}, {peak:4d} (at {when:5.1f}), {waiting:4d}, "
            f"{home}/{lent} ({draining}), "
            f"{tp * 1e3:.0f} ms",
            file=out,
        )
    return {
        "tpot_p99": p99,
        "split": timeline,
        "handoffs": sum(taken.values()),
        "decoded": len(fin),
        "slow_by_instance": dict(by_inst),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=16)
    p.add_argument("--device", default="h200")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--workload", default="phase-shift:5")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--duration", type=float, default=0.0, help="0: SUITE's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default="adaptive,adaptive (no backlog or hysteresis)")
    args = p.parse_args(argv)
    duration = args.duration or SUITE.get(args.workload, {}).get("duration", 10.0)
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        if variant not in VARIANTS:
            p.error(f"unknown variant {variant!r}")
        spec = experiments.SimSpec(
            devices=args.devices,
            device=args.device,
            model=args.model,
            workload=args.workload,
            rate=args.rate,
            duration=duration,
            seeds=1,
            **{k: v for k, v in VARIANTS[variant].items() if k != "split_objective"},
        )
        print(f"{variant}, {args.workload} at {args.rate:g} req/s, seed {args.seed}:")
        inspect(spec, args.seed, args.rate, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
