"""`python -m flexnpu simulate`: the cluster simulator (flexnpu.sim)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from flexnpu.serving.topology import Link as TopologyLink
from flexnpu.serving.topology import Topology
from flexnpu.sim.hardware import LINKS, PRESETS, RUNTIMES
from flexnpu.sim.models import MODELS
from flexnpu.sim.simulation import POLICIES
from flexnpu.sim.workload import WORKLOADS, parse_workload

_EPILOG = """\
Policies: passthrough (monolithic continuous batching per unit), static-pd (prefill and decode
instances on fixed units, P:D split tuned by search unless --prefill-units), static-colocate
(a prefill and a decode instance on every unit, FIFO), chunked-colocate (Sarathi-style chunked
prefill in mixed batches), dynamic (FlexNPU: the PD layout on virtual devices, every step placed
by the C++ placement core), elastic-pd (the split advisor moves whole units between prefill and
decode, every step on its home unit: Dynamo's planner), adaptive (elastic-pd's routing with
dynamic's placer; = dynamic --dynamic-layout adaptive). A unit is --parallel devices serving one
instance.

Output: a markdown table on stdout, --json with {"config", "policies": {NAME: {throughput_tok_s,
goodput_rps, ttft_s, tpot_s, requests_finished, requests_dropped, decisions_by_reason,
kv_bytes_moved, ...}}}; counts are summed over seeds, the rest are means (ci95: half-widths).
Step times: flexnpu/sim/data/steptime_MODEL.json (regenerate with
`JAX_PLATFORMS=cpu python -m flexnpu.sim.steptime --model MODEL`).
"""


def _tuning(items: list[str]) -> dict[str, float | int]:
    """KEY=VALUE pairs for placement.Core; the core's integer fields (nanoseconds,
    max_executables) go as int: its bindings reject a float there (std::bad_cast)."""
    out: dict[str, float | int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--core-tuning {item!r} is not KEY=VALUE")
        key = key.strip()
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--core-tuning {item!r}: {value!r} is not a number") from None
        if key.endswith("_ns") or key == "max_executables":
            if not number.is_integer():
                raise ValueError(f"--core-tuning {item!r}: {key} takes an integer")
            out[key] = int(number)
        else:
            out[key] = number
    return out


def _workload_name(text: str) -> str:
    try:
        parse_workload(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _window(text: str | None) -> tuple[float, float] | None:
    if not text:
        return None
    a, sep, b = text.partition(":")
    if not sep:
        raise ValueError(f"--timeline-window {text!r} is not START:END (seconds)")
    lo, hi = float(a), float(b)
    if not hi > lo >= 0:
        raise ValueError(f"--timeline-window {text!r}: need 0 <= START < END")
    return lo, hi


def _topology(args: argparse.Namespace) -> Topology | None:
    """--topology FILE or --hosts SPEC, with --link / --inter-host-link over its links."""
    if args.topology and args.hosts:
        raise ValueError("give --hosts or --topology, not both")
    if args.topology:
        try:
            text = Path(args.topology).read_text()
        except OSError as e:
            raise ValueError(f"--topology {args.topology}: {e.strerror or e}") from None
        try:
            topo = Topology.loads(text)
        except ValueError as e:
            raise ValueError(f"--topology {args.topology}: {e}") from None
    elif args.hosts:
        topo = Topology.from_spec(args.hosts)
    else:
        if args.inter_host_link:
            raise ValueError("--inter-host-link needs --hosts or --topology")
        return None
    if args.link:
        topo = replace(topo, intra_host_link=TopologyLink(args.link))
    if args.inter_host_link:
        topo = replace(topo, inter_host_link=TopologyLink(args.inter_host_link))
    return topo


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="cluster simulation of serving policies with FlexNPU's own scheduler and placer",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    h = p.add_argument_group("cluster")
    h.add_argument(
        "--devices",
        type=int,
        default=None,
        help="physical devices (default 8, or the --hosts / --topology total)",
    )
    h.add_argument("--device", default="h100", help=f"preset: {', '.join(PRESETS)}")
    h.add_argument("--model", default="qwen2.5-7b", help=f"model: {', '.join(MODELS)}")
    h.add_argument(
        "--parallel",
        type=int,
        default=0,
        help="devices per serving instance (TP x EP degree); 0: the model's default "
        "(deepseek-r1 16, others 1)",
    )
    h.add_argument(
        "--link",
        default="",
        help=f"KV link: {', '.join(LINKS)} (default: the "
        "preset's: hccs for Ascend, nvlink for GPUs, memcpy for cpu)",
    )
    h.add_argument(
        "--hosts",
        default="",
        help="the devices' hosts, HOSTSxDEVICES (48x8: 48 hosts of 8 devices; 2x8,1x4): KV "
        "within a host takes --link, between hosts --inter-host-link, and each host's steps "
        "are placed by its own placer over its own units (default: one host of every device)",
    )
    h.add_argument(
        "--inter-host-link",
        default="",
        help=f"the network between hosts: {', '.join(LINKS)} (roce: a conventional cluster; "
        "hccs: a CloudMatrix384-like supernode, its UB plane between hosts)",
    )
    h.add_argument(
        "--topology",
        help="hosts and links from this JSON file (flexnpu.serving.topology's format, as "
        "a multi-host front's GET /cluster/topology returns it); --link and "
        "--inter-host-link fill or override its links",
    )
    h.add_argument(
        "--runtime",
        default="preset",
        choices=RUNTIMES,
        help="serving runtime on the devices: the preset's (continuous batching with kernels "
        "sized to the batch) or flexnpu (FlexNPU's engine: its padded step programs, one "
        "prompt chunk per step, two steps in flight; as `serve` runs on emulated devices)",
    )
    h.add_argument(
        "--co-run",
        action="store_true",
        help="devices co-run executions (the placer's can_overlap model) instead of FIFO",
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload",
        default="sharegpt",
        type=_workload_name,
        help=f"one of {', '.join(WORKLOADS)}; phase-shift:L (phases of L seconds), burst:CV "
        "(Gamma gaps with that coefficient of variation)",
    )
    w.add_argument(
        "--rate",
        type=float,
        default=10.0,
        help="mean arrival rate, requests/s (with --trace: rescale to it and repeat "
        "the trace to fill --duration; 0 keeps the trace's times)",
    )
    w.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="arrivals for this many simulated seconds (default 60)",
    )
    w.add_argument(
        "--trace",
        help="CSV trace (timestamp,input_tokens,output_tokens or the "
        "Azure TIMESTAMP,ContextTokens,GeneratedTokens); implies --workload trace",
    )
    w.add_argument(
        "--burstiness",
        type=float,
        default=0.25,
        help="Gamma shape of the burst workload's gaps (1 = Poisson)",
    )
    w.add_argument("--length-scale", type=float, default=1.0, help="scales the length medians")
    w.add_argument("--max-prompt", type=int, default=0, help="clip prompts (0: model default)")
    w.add_argument("--max-output", type=int, default=0, help="clip outputs (0: model default)")
    r = p.add_argument_group("runs")
    r.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    r.add_argument("--seeds", type=int, default=3, help="seeds per policy (default 3)")
    r.add_argument("--seed", type=int, default=0, help="first seed")
    r.add_argument(
        "--slo",
        default="2:0.1,0.2:0.05",
        help="SLO tiers TTFT_S:TPOT_S,...; the first defines goodput "
        "(default 2 s / 100 ms and strict 200 ms / 50 ms)",
    )
    r.add_argument(
        "--goodput-search",
        action="store_true",
        help="search the largest rate with >= 90%% of requests within the first SLO",
    )
    r.add_argument(
        "--prefill-units",
        type=int,
        default=0,
        help="static-pd prefill units (0: tuned by search at --rate, and again at "
        "every rate --goodput-search tries)",
    )
    r.add_argument(
        "--split-objective",
        default="goodput",
        choices=("goodput", "throughput"),
        help="what the static-pd split search maximises first (default goodput; "
        "throughput: the split with the most tok/s)",
    )
    r.add_argument(
        "--search-duration",
        type=float,
        default=60.0,
        help="simulated seconds per P:D ratio candidate (default 60)",
    )
    r.add_argument(
        "--dynamic-layout",
        default="colocated",
        choices=("colocated", "disaggregated", "adaptive"),
        help="dynamic's virtual layout: a prefill + a decode instance per unit "
        "(colocated), static-pd's split (disaggregated), or the colocated instances "
        "with the prefill:decode split the placement core's SplitAdvisor adapts to "
        "the prompt demand and the decode sequences held (adaptive)",
    )
    r.add_argument(
        "--split-target",
        type=float,
        default=0.75,
        help="adaptive layout: the load the advisor sizes the prefill units for, in "
        "(0, 1] (default 0.75)",
    )
    r.add_argument(
        "--split-backlog-drain",
        type=float,
        default=2.0,
        help="adaptive / elastic-pd advisor: seconds its prefill units are sized to drain "
        "the queued prompt backlog in (0: backlog not counted; default 2)",
    )
    r.add_argument(
        "--split-hold",
        type=float,
        default=2.0,
        help="adaptive / elastic-pd advisor: a reversal of the split's last change "
        "waits until asked for this many seconds (0: no hysteresis; default 2)",
    )
    r.add_argument(
        "--split-colocate",
        action="store_true",
        help="adaptive / elastic-pd advisor: every unit co-located (prefill chunks beside "
        "decodes) while the prefill and decode needs fill the cluster",
    )
    r.add_argument(
        "--drain",
        type=float,
        default=600.0,
        help="simulated seconds after the last arrival before unfinished requests "
        "are reported dropped",
    )
    r.add_argument(
        "--no-request-weights",
        action="store_true",
        help="steps do not tell the placer the sequences they serve (batch, and "
        "prompts queued behind a prefill); the core then counts one per "
        "decode stream and keeps its default tpot_weight 1 (the behaviour "
        "before request weights)",
    )
    r.add_argument(
        "--core-tuning",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="placement core Tuning field (see placement.h), repeatable",
    )
    i = p.add_argument_group("instances (0: model defaults)")
    i.add_argument("--max-num-seqs", type=int, default=0, help="decode batch per instance")
    i.add_argument("--max-num-batched-tokens", type=int, default=0, help="token budget per step")
    i.add_argument("--block-size", type=int, default=0, help="KV block size")
    i.add_argument("--max-model-len", type=int, default=0, help="prompt + output limit")
    i.add_argument(
        "--prefill-inflight",
        type=int,
        default=2,
        help="steps a prefill instance keeps in flight (async dispatch; the placer "
        "may run them on different units; default 2)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", help="write the results here")
    o.add_argument("--plot", help="write PNG plots into this directory")
    o.add_argument(
        "--timeline-window",
        help="START:END simulated seconds recorded for the "
        "timeline plot (default with --plot: the middle 2 s)",
    )
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flexnpu.sim import report
    from flexnpu.sim.experiments import SimSpec, parse_slos, run_all

    try:
        policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
        window = _window(args.timeline_window)
        if args.plot and window is None:
            mid = args.duration / 2
            window = (max(0.0, mid - 1.0), mid + 1.0)
        topology = _topology(args)
        devices = args.devices
        if devices is None:
            devices = topology.devices if topology is not None else 8
        spec = SimSpec(
            devices=devices,
            device=args.device,
            model=args.model,
            parallel=args.parallel,
            link=args.link,
            co_run=args.co_run,
            runtime=args.runtime,
            workload="trace" if args.trace else args.workload,
            rate=args.rate,
            duration=args.duration,
            trace=args.trace,
            burstiness=args.burstiness,
            length_scale=args.length_scale,
            max_prompt=args.max_prompt,
            max_output=args.max_output,
            policies=policies,
            seeds=args.seeds,
            seed=args.seed,
            slos=tuple(parse_slos(args.slo)),
            prefill_units=args.prefill_units,
            split_objective=args.split_objective,
            search_duration=args.search_duration,
            dynamic_layout=args.dynamic_layout,
            split_target_utilization=args.split_target,
            split_backlog_drain_s=args.split_backlog_drain,
            split_hold_s=args.split_hold,
            split_colocate=args.split_colocate,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            prefill_inflight=args.prefill_inflight,
            drain_s=args.drain,
            goodput_search=args.goodput_search,
            timeline_window=window,
            core_tuning=_tuning(args.core_tuning),
            request_weights=not args.no_request_weights,
            topology=topology.to_json() if topology is not None else None,
        ).resolved()
    except (ValueError, FileNotFoundError) as e:
        print(f"flexnpu simulate: error: {e}", file=sys.stderr)
        return 2

    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(spec.policies) * spec.seeds, desc="simulating", unit="run", file=sys.stderr
        )
    t0 = time.perf_counter()
    try:
        doc = run_all(
            spec,
            log=lambda s: print(s, file=sys.stderr),
            progress=bar.update if bar else None,
            keep_samples=bool(args.plot),
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"flexnpu simulate: error: {e}", file=sys.stderr)
        return 2
    finally:
        if bar:
            bar.close()
    wall = time.perf_counter() - t0
    samples = doc.pop("_samples", None)
    print(report.markdown_table(doc))
    events = sum(m["events"] for m in doc["policies"].values())
    print(f"\nwall {wall:.1f} s, {events / wall:.0f} events/s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    if args.plot:
        for path in report.plots(doc | {"_samples": samples or {}}, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0
