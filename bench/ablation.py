"""Issue 25's ablation, small: goodput (DistServe: the largest rate with >= 90% of requests
within the first SLO tier, flexnpu.sim's --goodput-search) of each policy, searched once per
seed so that the seeds give a 95% confidence interval; then TTFT / TPOT p99 of every policy at
one common rate (a fraction of static PD's goodput), where static PD still meets its SLOs.

    python -m bench.ablation --devices 16 --device h200 --model llama-3-8b \
        --workloads sharegpt,phase-shift --seeds 3 --duration 10 --search-duration 5 \
        --rate 800 --json out.json
    python -m bench.ablation --merge a.json b.json   # the tables of runs split by --variants

Policies: static-pd with its split tuned for goodput and for throughput (tuned again at every
rate the search tries), elastic-pd (the split advisor re-splits whole units, no per-step
lending), chunked-colocate, dynamic (placer over the colocated layout), adaptive (advisor and
placer), and adaptive with split.h's plain rule (the advisor with its backlog and hysteresis
off).
Prints a markdown table per workload.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from flexnpu.sim.experiments import SimSpec, _mean_ci, run_all, search_goodput

VARIANTS: dict[str, dict[str, Any]] = {
    "static-pd (goodput-best split)": {"policies": ("static-pd",)},
    "static-pd (throughput-best split)": {
        "policies": ("static-pd",),
        "split_objective": "throughput",
    },
    "elastic-pd": {"policies": ("elastic-pd",)},
    "chunked-colocate": {"policies": ("chunked-colocate",)},
    "dynamic": {"policies": ("dynamic",)},
    "adaptive": {"policies": ("adaptive",)},
    # The advisor's plain rule: its fixes off (no backlog in the prefill need, no hysteresis).
    # The name is kept so that --merge joins runs recorded under it.
    "adaptive (split.h rule)": {
        "policies": ("adaptive",),
        "split_backlog_drain_s": 0.0,
        "split_hold_s": 0.0,
    },
}


def _spec(args: argparse.Namespace, workload: str, variant: str, **kw: Any) -> SimSpec:
    base = dict(
        devices=args.devices,
        device=args.device,
        model=args.model,
        workload=workload,
        rate=args.rate,
        duration=args.duration,
        search_duration=args.search_duration or args.duration,
        seeds=1,
    )
    return SimSpec(**(base | VARIANTS[variant] | kw))


def _fmt(mean: float, ci: float, digits: int = 0) -> str:
    return f"{mean:.{digits}f} ± {ci:.{digits}f}"


def run_workload(args: argparse.Namespace, workload: str, log) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    # static-pd's split candidates by (seed, policy, rate, split), shared by both objectives.
    tune_cache: dict[int, dict[tuple, dict[str, Any]]] = {}
    for variant in args.variants:
        t0 = time.perf_counter()
        goodputs, splits = [], []
        if args.skip_search:
            rows[variant] = {"goodput_rps": 0.0, "ci95": 0.0, "per_seed": [], "split": []}
            continue
        for k in range(args.first_seed, args.first_seed + args.seeds):
            spec = _spec(args, workload, variant, seed=k).resolved()
            (policy,) = spec.policies
            pd = policy == "static-pd"
            goodput, curve = search_goodput(
                spec,
                policy,
                0,
                lambda s: None,
                tune_split=pd,
                tune_cache=tune_cache.setdefault(k, {}),
            )
            goodputs.append(goodput)
            # static-pd: the split the search used at its goodput rate
            at = [p for p in curve if p["rate"] == goodput]
            if at and "prefill_units" in at[0]:
                splits.append(at[0]["prefill_units"])
        mean, ci = _mean_ci(goodputs)
        rows[variant] = {"goodput_rps": mean, "ci95": ci, "per_seed": goodputs, "split": splits}
        log(
            f"{workload} {variant}: goodput {_fmt(mean, ci)} req/s {goodputs} "
            f"split {splits} ({time.perf_counter() - t0:.0f} s)"
        )
    ref = [rows[v]["goodput_rps"] for v in rows if v.startswith("static-pd")]
    rate = args.latency_rate or (args.latency_fraction * max(ref) if ref else 0.0)
    if rate > 0:
        for variant in args.variants:
            spec = _spec(args, workload, variant, rate=rate, seeds=args.seeds, seed=args.first_seed)
            (m,) = run_all(spec)["policies"].values()
            rows[variant]["at_rate"] = {
                "rate": rate,
                "attainment": m["slo"][spec.slos[0].name]["attainment"],
                "ttft_p99": (m["ttft_s"]["p99"], m["ci95"]["ttft_s"]["p99"]),
                "tpot_p99": (m["tpot_s"]["p99"], m["ci95"]["tpot_s"]["p99"]),
                "tok_s": (m["throughput_tok_s"], m["ci95"]["throughput_tok_s"]),
                "split": m.get("prefill_units_range") or m.get("prefill_units"),
            }
            log(f"{workload} {variant} at {rate:.0f} req/s: {rows[variant]['at_rate']}")
    return rows


def table(workload: str, rows: dict[str, Any], args: dict[str, Any]) -> str:
    rate = next((r["at_rate"]["rate"] for r in rows.values() if "at_rate" in r), None)
    at = f" at {rate:.0f} req/s" if rate else ""
    out = [
        f"### {workload}: {args['devices']} x {args['device']}, {args['model']}, "
        f"{args['duration']:g} s of arrivals per rate, {args['seeds']} seeds (mean ± 95% CI)",
        "",
        f"| policy | goodput req/s | per seed | P units at goodput | TTFT p99{at} "
        f"| TPOT p99{at} | SLO attainment{at} | P units{at} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, r in rows.items():
        a = r.get("at_rate")
        lat = (
            [
                _fmt(*a["ttft_p99"], 3) + " s",
                _fmt(a["tpot_p99"][0] * 1e3, a["tpot_p99"][1] * 1e3, 1) + " ms",
                f"{a['attainment']:.3f}",
                str(a["split"] or ""),
            ]
            if a
            else ["", "", "", ""]
        )
        per_seed = ", ".join(f"{g:.0f}" for g in r["per_seed"])
        split = ", ".join(str(s) for s in r["split"])
        out.append(
            f"| {variant} | {_fmt(r['goodput_rps'], r['ci95'])} | {per_seed} | {split} | "
            + " | ".join(lat)
            + " |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=16)
    p.add_argument("--device", default="h200")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--workloads", default="sharegpt,phase-shift")
    p.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--skip-search", action="store_true", help="latencies only")
    p.add_argument("--duration", type=float, default=10.0, help="arrival seconds per rate")
    p.add_argument(
        "--search-duration",
        type=float,
        default=5.0,
        help="seconds per static-pd split candidate (0: --duration)",
    )
    p.add_argument("--rate", type=float, default=800.0, help="the search's first rate")
    p.add_argument(
        "--latency-fraction",
        type=float,
        default=0.8,
        help="latencies at this fraction of static PD's best goodput (0: skip)",
    )
    p.add_argument("--latency-rate", type=float, default=0.0, help="or at this rate")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--merge", nargs="+", help="print the tables of these --json files")
    args = p.parse_args(argv)
    if args.merge:
        merged: dict[str, dict[str, Any]] = {}
        head: dict[str, Any] = {}
        for path in args.merge:
            doc = json.loads(Path(path).read_text())
            head = head or doc["args"]
            for workload, rows in doc["workloads"].items():
                into = merged.setdefault(workload, {})
                for variant, row in rows.items():  # seeds of one variant run apart: joined
                    have = into.setdefault(variant, {"per_seed": [], "split": []})
                    have["per_seed"] += row["per_seed"]
                    have["split"] += row["split"]
                    if "at_rate" in row:
                        have["at_rate"] = row["at_rate"]
        for workload, rows in merged.items():
            head = head | {"seeds": max(len(r["per_seed"]) for r in rows.values())}
            for row in rows.values():
                row["goodput_rps"], row["ci95"] = (
                    _mean_ci(row["per_seed"]) if row["per_seed"] else (0.0, 0.0)
                )
            order = {v: i for i, v in enumerate(VARIANTS)}
            rows = dict(sorted(rows.items(), key=lambda kv: order.get(kv[0], 99)))
            print(table(workload, rows, head) + "\n")
        return 0
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    doc: dict[str, Any] = {"args": vars(args), "workloads": {}}
    for workload in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        rows = run_workload(args, workload, lambda s: print(s, file=sys.stderr, flush=True))
        doc["workloads"][workload] = rows
        print(table(workload, rows, vars(args)) + "\n", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
