"""Issue 25's ablation: goodput (DistServe: the largest rate with >= 90% of requests within the
first SLO tier, flexnpu.sim's goodput search) of each policy, searched once per seed so that the
seeds give a 95% confidence interval; then TTFT / TPOT p99 of every policy at one common rate
(a fraction of static PD's goodput), where static PD still meets its SLOs.

    python -m bench.ablation --suite --out DIR         # every workload of SUITE, resumable
    python -m bench.ablation --workloads phase-shift:5 --variants adaptive,elastic-pd \
        --json a.json                                  # a part; SUITE's settings per workload
    python -m bench.ablation --merge DIR/*.json a.json [--markdown FILE]   # the joined tables

Policies (VARIANTS): static-pd with its split tuned for goodput and for throughput (tuned again
at every rate the search tries), elastic-pd (the split advisor re-splits whole units, no
per-step lending), chunked-colocate, static-colocate, dynamic (placer over the colocated
layout), adaptive (advisor and placer), and adaptive with the advisor's plain rule (no prompt
backlog in the prefill need, no hysteresis). Workloads and their run lengths: SUITE. Prints a
markdown table per workload.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from flexnpu.sim.experiments import SimSpec, _mean_ci, run_all, search_goodput
from flexnpu.sim.workload import parse_workload

VARIANTS: dict[str, dict[str, Any]] = {
    "static-pd (goodput-best split)": {"policies": ("static-pd",)},
    "static-pd (throughput-best split)": {
        "policies": ("static-pd",),
        "split_objective": "throughput",
    },
    "elastic-pd": {"policies": ("elastic-pd",)},
    "chunked-colocate": {"policies": ("chunked-colocate",)},
    "static-colocate": {"policies": ("static-colocate",)},
    "dynamic": {"policies": ("dynamic",)},
    "adaptive": {"policies": ("adaptive",)},
    "adaptive (no backlog or hysteresis)": {
        "policies": ("adaptive",),
        "split_backlog_drain_s": 0.0,
        "split_hold_s": 0.0,
    },
    "elastic-pd (co-located at capacity)": {"policies": ("elastic-pd",), "split_colocate": True},
    "adaptive (co-located at capacity)": {"policies": ("adaptive",), "split_colocate": True},
}
# Names earlier JSON files recorded variants under (--merge reads them as the new name).
OLD_VARIANT_NAMES = {"adaptive (split.h rule)": "adaptive (no backlog or hysteresis)"}
BASELINES = (
    "static-pd (goodput-best split)",
    "static-pd (throughput-best split)",
    "elastic-pd",
    "chunked-colocate",
)

# Per workload (16 x H200, Llama-3-8B): arrival seconds per rate (a phase-shift:L run holds one
# prompt-heavy and one output-heavy phase; long-output's requests live ~40 s near saturation,
# so its runs last long enough to fill the decode batches) and the search's first rate (near
# the policies' goodput: the search brackets it by --bracket steps).
SUITE: dict[str, dict[str, Any]] = {
    "sharegpt": {"duration": 10.0, "rate": 1800.0},
    "burst:2": {"duration": 10.0, "rate": 1600.0},
    "phase-shift:5": {"duration": 10.0, "rate": 650.0},
    "phase-shift:10": {"duration": 20.0, "rate": 650.0},
    "phase-shift:30": {"duration": 60.0, "rate": 340.0},
    "phase-shift:60": {"duration": 120.0, "rate": 340.0},
    "long-output": {"duration": 90.0, "rate": 90.0, "max_output": 8192},
}


def _settings(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    """The workload's duration, first rate and max_output: the command line's, else SUITE's."""
    preset = SUITE.get(workload, {})
    return {
        "duration": args.duration or preset.get("duration", 10.0),
        "rate": args.rate or preset.get("rate", 800.0),
        "max_output": args.max_output or preset.get("max_output", 0),
    }


def _spec(args: argparse.Namespace, workload: str, variant: str, **kw: Any) -> SimSpec:
    base = dict(
        devices=args.devices,
        device=args.device,
        model=args.model,
        workload=workload,
        search_duration=args.search_duration,
        seeds=1,
    ) | _settings(args, workload)
    if not base["search_duration"]:
        base["search_duration"] = base["duration"]
    return SimSpec(**(base | VARIANTS[variant] | kw))


def _fmt(mean: float, ci: float, digits: int = 0) -> str:
    return f"{mean:.{digits}f} ± {ci:.{digits}f}"


def run_workload(args: argparse.Namespace, workload: str, log) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    # static-pd's split candidates by (seed, policy, rate, split), shared by both objectives.
    tune_cache: dict[int, dict[tuple, dict[str, Any]]] = {}
    for variant in args.variants:
        t0 = time.perf_counter()
        goodputs: list[float] = []
        splits: list[int] = []
        start = 0.0
        for k in range(args.first_seed, args.first_seed + args.seeds * (not args.skip_search)):
            # Each seed's search starts at the last seed's goodput (a close guess).
            kw = {"rate": start} if start else {}
            spec = _spec(args, workload, variant, seed=k, **kw).resolved()
            (policy,) = spec.policies
            pd = policy == "static-pd"
            goodput, curve = search_goodput(
                spec,
                policy,
                0,
                lambda s: None,
                tune_split=pd,
                tune_cache=tune_cache.setdefault(k, {}),
                bracket=args.bracket,
                bisections=args.bisections,
                local_split=pd,
            )
            goodputs.append(goodput)
            start = goodput or start
            # static-pd: the split the search used at its goodput rate
            at = [p for p in curve if p["rate"] == goodput]
            if at and "prefill_units" in at[0]:
                splits.append(at[0]["prefill_units"])
        mean, ci = _mean_ci(goodputs) if goodputs else (0.0, 0.0)
        rows[variant] = {"goodput_rps": mean, "ci95": ci, "per_seed": goodputs, "split": splits}
        log(
            f"{workload} {variant}: goodput {_fmt(mean, ci)} req/s {goodputs} "
            f"split {splits} ({time.perf_counter() - t0:.0f} s)"
        )
    ref = [rows[v]["goodput_rps"] for v in rows if v.startswith("static-pd")]
    rate = args.latency_rate or (args.latency_fraction * max(ref) if ref else 0.0)
    if rate > 0:
        for variant in args.variants:
            t0 = time.perf_counter()
            spec = _spec(args, workload, variant, rate=rate, seeds=args.seeds, seed=args.first_seed)
            (m,) = run_all(spec)["policies"].values()
            per_seed = m["per_seed"]
            rows[variant]["at_rate"] = {
                "rate": rate,
                "attainment": m["slo"][spec.slos[0].name]["attainment"],
                "ttft_p99": (m["ttft_s"]["p99"], m["ci95"]["ttft_s"]["p99"]),
                "tpot_p99": (m["tpot_s"]["p99"], m["ci95"]["tpot_s"]["p99"]),
                "ttft_p50": (m["ttft_s"]["p50"], m["ci95"]["ttft_s"]["p50"]),
                "tpot_p50": (m["tpot_s"]["p50"], m["ci95"]["tpot_s"]["p50"]),
                "tok_s": (m["throughput_tok_s"], m["ci95"]["throughput_tok_s"]),
                "split": m.get("prefill_units_range") or m.get("prefill_units"),
                # the advisor's split changes per seed (adaptive, elastic-pd)
                "split_changes": [
                    len(s["split_timeline"]) - 1 for s in per_seed if "split_timeline" in s
                ],
            }
            log(
                f"{workload} {variant} at {rate:.0f} req/s: {rows[variant]['at_rate']} "
                f"({time.perf_counter() - t0:.0f} s)"
            )
    return rows


def _split_cell(r: dict[str, Any]) -> str:
    """static-pd: its P units at goodput per seed; the advisor's policies: the P range at the
    latency rate (and its changes per seed)."""
    out = []
    if r["split"]:
        out.append(", ".join(f"{s}P" for s in r["split"]) + " at goodput")
    a = r.get("at_rate")
    if a and a.get("split") is not None:
        s = a["split"]
        changes = a.get("split_changes") or []
        if isinstance(s, list):
            text = f"{s[0]}..{s[1]}P"
            if changes:
                text += f" ({'/'.join(str(c) for c in changes)} changes)"
            out.append(text)
        elif not r["split"]:
            out.append(f"{s}P")
    return "; ".join(out)


def table(workload: str, rows: dict[str, Any], args: dict[str, Any]) -> str:
    rate = next((r["at_rate"]["rate"] for r in rows.values() if "at_rate" in r), None)
    at = f" at {rate:.0f} req/s" if rate else ""
    seeds = max((len(r["per_seed"]) for r in rows.values()), default=0)
    dur = args.get("durations", {}).get(workload, args.get("duration"))
    head = f"### {workload}: {args['devices']} x {args['device']}, {args['model']}, "
    head += f"{dur:g} s of arrivals per rate, " if dur else ""
    tail = ""
    if args.get("bracket", 0) > 1:  # ± 0: every seed on the same point of the search's grid
        step = (args["bracket"] - 1) / 2 ** args.get("bisections", 0)
        tail = f"; goodput searched to {step:.1%} of the rate"
    out = [
        head + f"{seeds} seeds (mean ± 95% CI{tail})",
        "",
        f"| policy | goodput req/s | TTFT p99{at} | TPOT p99{at} | P units (split) |",
        "|---|---|---|---|---|",
    ]
    for variant, r in rows.items():
        a = r.get("at_rate")
        lat = (
            [
                _fmt(*a["ttft_p99"], 3) + " s",
                _fmt(a["tpot_p99"][0] * 1e3, a["tpot_p99"][1] * 1e3, 1) + " ms",
            ]
            if a
            else ["", ""]
        )
        good = _fmt(r["goodput_rps"], r["ci95"]) if r["per_seed"] else ""
        out.append(f"| {variant} | {good} | " + " | ".join(lat) + f" | {_split_cell(r)} |")
    base = [rows[v]["goodput_rps"] for v in BASELINES if v in rows and rows[v]["per_seed"]]
    if base and "adaptive" in rows and rows["adaptive"]["per_seed"]:
        best = max(base)
        out += [
            "",
            f"adaptive / best baseline goodput: {rows['adaptive']['goodput_rps'] / best:.2f}x",
        ]
    return "\n".join(out)


def merge(paths: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The rows of --json files joined per workload and variant (seeds of one variant run
    apart are joined; old variant names read as their new ones)."""
    merged: dict[str, dict[str, Any]] = {}
    head: dict[str, Any] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        head = head or dict(doc["args"])
        head.setdefault("durations", {}).update(doc["args"].get("durations", {}))
        for workload, rows in doc["workloads"].items():
            into = merged.setdefault(workload, {})
            for variant, row in rows.items():
                variant = OLD_VARIANT_NAMES.get(variant, variant)
                have = into.setdefault(variant, {"per_seed": [], "split": []})
                have["per_seed"] += row["per_seed"]
                have["split"] += row["split"]
                if "at_rate" in row:
                    have["at_rate"] = row["at_rate"]
    order = {v: i for i, v in enumerate(VARIANTS)}
    for workload, rows in merged.items():
        for row in rows.values():
            row["goodput_rps"], row["ci95"] = (
                _mean_ci(row["per_seed"]) if row["per_seed"] else (0.0, 0.0)
            )
        merged[workload] = dict(sorted(rows.items(), key=lambda kv: order.get(kv[0], 99)))
    suite = {w: i for i, w in enumerate(SUITE)}
    merged = dict(sorted(merged.items(), key=lambda kv: suite.get(kv[0], len(suite))))
    return merged, head


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=16)
    p.add_argument("--device", default="h200")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--workloads", default="sharegpt,phase-shift:5", help="of SUITE or any")
    p.add_argument("--suite", action="store_true", help="every workload of SUITE (needs --out)")
    p.add_argument(
        "--out", help="one JSON per workload here; a workload whose JSON exists is skipped"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--duration", type=float, default=0.0, help="arrival seconds per rate")
    p.add_argument(
        "--search-duration",
        type=float,
        default=5.0,
        help="seconds per static-pd split candidate (0: --duration; at least one phase-shift "
        "cycle)",
    )
    p.add_argument("--rate", type=float, default=0.0, help="the search's first rate")
    p.add_argument("--max-output", type=int, default=0, help="clip outputs (0: SUITE's/model's)")
    p.add_argument(
        "--bracket",
        type=float,
        default=1.15,
        help="the search steps its rate by this factor until attainment changes (0: doubling "
        "from 0, the simulator's --goodput-search)",
    )
    p.add_argument("--bisections", type=int, default=2, help="then bisects this many times")
    p.add_argument(
        "--latency-fraction",
        type=float,
        default=0.8,
        help="latencies at this fraction of static PD's best goodput (0: skip)",
    )
    p.add_argument("--latency-rate", type=float, default=0.0, help="or at this rate")
    p.add_argument("--skip-search", action="store_true", help="latencies only (--latency-rate)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--merge", nargs="+", help="print the tables of these --json files")
    p.add_argument("--markdown", help="also write the tables to this file")
    args = p.parse_args(argv)

    def emit(text: str) -> None:
        print(text, flush=True)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write(text + "\n")

    if args.markdown:
        Path(args.markdown).write_text("")
    if args.merge:
        merged, head = merge(args.merge)
        for workload, rows in merged.items():
            emit(table(workload, rows, head) + "\n")
        return 0
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
    workloads = list(SUITE) if args.suite else [w.strip() for w in args.workloads.split(",")]
    for w in workloads:
        try:
            parse_workload(w)
        except ValueError as e:
            p.error(str(e))
    if args.suite and not args.out:
        p.error("--suite writes one JSON per workload: give --out DIR")
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    doc: dict[str, Any] = {"args": vars(args) | {"durations": {}}, "workloads": {}}
    for workload in [w for w in workloads if w]:
        path = out / f"{workload.replace(':', '_')}.json" if out else None
        if path and path.exists():
            log(f"{workload}: {path} exists, skipped")
            continue
        rows = run_workload(args, workload, log)
        one = {
            "args": vars(args) | {"durations": {workload: _settings(args, workload)["duration"]}}
        }
        one["workloads"] = {workload: rows}
        doc["workloads"][workload] = rows
        doc["args"]["durations"][workload] = _settings(args, workload)["duration"]
        emit(table(workload, rows, one["args"]) + "\n")
        if path:
            path.write_text(json.dumps(one, indent=1) + "\n")
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    if out:
        merged, head = merge(sorted(str(x) for x in out.glob("*.json")))
        log(f"all of {out}:")
        for workload, rows in merged.items():
            log(table(workload, rows, head) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
