"""Runs policies x seeds, tunes the static-PD ratio, searches goodput, aggregates with CIs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from flexnpu.serving.scheduler import Scheduler
from flexnpu.serving.topology import Link as TopologyLink
from flexnpu.serving.topology import Topology, hosts_devices
from flexnpu.sim.adaptive import (
    SPLIT_BACKLOG_DRAIN_S,
    SPLIT_HOLD_S,
    SPLIT_TARGET_UTILIZATION,
    AdaptiveSimulation,
)
from flexnpu.sim.hardware import LINKS, RUNTIMES, get_preset, topology_link
from flexnpu.sim.models import get_model
from flexnpu.sim.simulation import (
    ADVISED_CORE_POLICY,
    POLICIES,
    InstanceConfig,
    RunResult,
    Simulation,
    percentiles,
)
from flexnpu.sim.workload import Workload, make_workload, workload_cycle_s

# dynamic's virtual layouts: a prefill + a decode instance per unit; static-pd's split; the
# colocated instances with the split the placement core's SplitAdvisor adapts (sim/adaptive.py).
DYNAMIC_LAYOUTS = ("colocated", "disaggregated", "adaptive")

# Student t 97.5% quantiles for n-1 degrees of freedom (95% two-sided CI).
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float

    @property
    def name(self) -> str:
        return f"ttft<={self.ttft_s:g}s,tpot<={self.tpot_s * 1e3:g}ms"


def parse_slos(text: str) -> list[Slo]:
    """'2:0.1,0.2:0.05' -> tiers (TTFT seconds : TPOT seconds); the first one is goodput's."""
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            ttft, tpot = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"--slo: {item!r} is not TTFT_S:TPOT_S (e.g. 2:0.1)") from None
        if not (ttft > 0 and tpot > 0):
            raise ValueError(f"--slo: {item!r}: both targets must be > 0")
        out.append(Slo(ttft, tpot))
    if not out:
        raise ValueError("--slo: no tiers")
    return out


@dataclass
class SimSpec:
    """Everything one `simulate` invocation needs (the JSON's config)."""

    devices: int = 8
    device: str = "h100"
    model: str = "qwen2.5-7b"
    parallel: int = 0  # 0: the model's default
    link: str = ""  # "": the preset's
    co_run: bool = False
    workload: str = "sharegpt"
    rate: float = 10.0
    duration: float = 60.0
    trace: str | None = None
    burstiness: float = 0.25
    length_scale: float = 1.0
    max_prompt: int = 0  # 0: model default
    max_output: int = 0
    policies: tuple[str, ...] = POLICIES
    seeds: int = 3
    seed: int = 0
    slos: tuple[Slo, ...] = (Slo(2.0, 0.1), Slo(0.2, 0.05))
    prefill_units: int = 0  # 0: tuned by search
    dynamic_prefill_units: int = 0  # dynamic's disaggregated layout; 0: static-pd's split
    search_duration: float = 60.0
    dynamic_layout: str = "colocated"
    split_target_utilization: float = SPLIT_TARGET_UTILIZATION  # adaptive layout's advisor
    split_backlog_drain_s: float = SPLIT_BACKLOG_DRAIN_S  # 0: prompt backlog not counted
    split_hold_s: float = SPLIT_HOLD_S  # 0: no hysteresis
    split_colocate: bool = False  # every unit co-located while the needs fill the cluster
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    block_size: int = 0
    max_model_len: int = 0
    prefill_inflight: int = 2
    request_weights: bool = True  # steps tell the placer the sequences they serve
    drain_s: float = 600.0
    goodput_search: bool = False
    split_objective: str = "goodput"  # the static-PD split tuner's: goodput or throughput
    timeline_window: tuple[float, float] | None = None
    core_tuning: dict[str, float] = field(default_factory=dict)
    # "preset": the preset's serving runtime; "flexnpu": FlexNPU's own engine on it (padded
    # programs, one prompt chunk per step, two steps in flight), as on emulated devices.
    runtime: str = "preset"
    # The hosts and links (flexnpu.serving.topology's JSON); None: one host of every device.
    # Its intra-host link, when it gives none, is `link`.
    topology: dict[str, Any] | None = None

    def resolved(self) -> SimSpec:
        """Fills model-dependent defaults (0 / "" fields)."""
        m = get_model(self.model)
        big = m.is_moe
        d = {
            "parallel": self.parallel or m.default_parallel,
            "link": self.link or get_preset(self.device).link,
            "max_num_seqs": self.max_num_seqs
            or (1536 if big else (8 if m.d_model < 1024 else 256)),
            "max_num_batched_tokens": self.max_num_batched_tokens
            or (16384 if big else (512 if m.d_model < 1024 else 8192)),
            "block_size": self.block_size or (128 if big else 16),
            "max_prompt": self.max_prompt
            or (8192 if big else (1024 if m.d_model < 1024 else 4096)),
            "max_output": self.max_output
            or (8192 if big else (1024 if m.d_model < 1024 else 2048)),
        }
        d["max_model_len"] = self.max_model_len or d["max_prompt"] + d["max_output"]
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"unknown policy {p!r} (known: {', '.join(POLICIES)})")
        if self.split_objective not in SPLIT_OBJECTIVES:
            raise ValueError("--split-objective must be one of " + ", ".join(SPLIT_OBJECTIVES))
        for name, value in (
            ("--split-backlog-drain", self.split_backlog_drain_s),
            ("--split-hold", self.split_hold_s),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be >= 0 seconds (0: off), got {value}")
        if self.dynamic_layout not in DYNAMIC_LAYOUTS:
            raise ValueError("--dynamic-layout must be one of " + ", ".join(DYNAMIC_LAYOUTS))
        if not 0 < self.split_target_utilization <= 1:
            raise ValueError(
                f"--split-target must be in (0, 1], got {self.split_target_utilization}"
            )
        if self.devices < 1 or d["parallel"] < 1 or self.devices % d["parallel"]:
            raise ValueError(
                f"--devices {self.devices} must be a positive multiple of "
                f"--parallel {d['parallel']}"
            )
        units = self.devices // d["parallel"]
        pd = [
            p
            for p in self.policies
            if p == "static-pd" or (p == "dynamic" and self.dynamic_layout == "disaggregated")
        ]
        pd += [p for p in self.policies if p in ADVISED_CORE_POLICY]
        if pd and units < 2:
            raise ValueError(
                f"{pd[0]} needs at least 2 units; {self.devices} devices / "
                f"--parallel {d['parallel']} = {units}"
            )
        if self.prefill_units and pd and not 1 <= self.prefill_units < units:
            raise ValueError(f"--prefill-units must be in [1, {units - 1}]")
        if self.dynamic_prefill_units and not 1 <= self.dynamic_prefill_units < units:
            raise ValueError(f"dynamic_prefill_units must be in [1, {units - 1}]")
        if self.runtime not in RUNTIMES:
            raise ValueError(
                f"--runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}"
            )
        if self.prefill_inflight < 1:
            raise ValueError(f"--prefill-inflight must be >= 1, got {self.prefill_inflight}")
        if self.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {self.seeds}")
        if d["link"] not in LINKS:
            raise ValueError(f"unknown link {d['link']!r} (known: {', '.join(LINKS)})")
        if self.topology is not None:
            topo = Topology.from_json(self.topology)
            if topo.intra_host_link is None:
                topo = replace(topo, intra_host_link=TopologyLink(d["link"]))
            if topo.devices != self.devices:
                raise ValueError(
                    f"the topology has {topo.devices} devices ({hosts_devices(topo.hosts)}), "
                    f"--devices says {self.devices}"
                )
            topo.unit_hosts(d["parallel"])  # no unit straddles hosts
            topology_link(topo.intra_host_link, "intra_host_link")
            if len(topo.placement_domains(d["parallel"])) > 1:
                topology_link(topo.inter_host_link, "inter_host_link")
            d["topology"] = topo.to_json()
        return replace(self, **d)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["policies"] = list(self.policies)
        out["slos"] = [{"ttft_s": s.ttft_s, "tpot_s": s.tpot_s} for s in self.slos]
        return out


def simulate_once(
    spec: SimSpec,
    policy: str,
    seed: int,
    *,
    rate: float | None = None,
    duration: float | None = None,
    prefill_units: int = 0,
    window: tuple[float, float] | None = None,
) -> RunResult:
    sim, wl = build_simulation(
        spec, policy, seed, rate=rate, duration=duration, prefill_units=prefill_units, window=window
    )
    return sim.run(wl)


def build_simulation(
    spec: SimSpec,
    policy: str,
    seed: int,
    *,
    rate: float | None = None,
    duration: float | None = None,
    prefill_units: int = 0,
    window: tuple[float, float] | None = None,
    scheduler_class: type[Scheduler] | None = None,
    adaptive_class: type[AdaptiveSimulation] = AdaptiveSimulation,
) -> tuple[Simulation, Workload]:
    """simulate_once's simulation and workload, not run yet (a bench times the run apart;
    adaptive_class: the split advisor's policies run as this subclass, a bench's recorder)."""
    s = spec
    model, preset = get_model(s.model), get_preset(s.device, s.runtime)
    wl = make_workload(
        s.workload,
        rate if rate is not None else s.rate,
        duration if duration is not None else s.duration,
        seed,
        max_prompt=s.max_prompt,
        max_output=s.max_output,
        burstiness=s.burstiness,
        length_scale=s.length_scale,
        trace=s.trace,
    )
    ic = InstanceConfig(
        s.max_num_seqs,
        s.max_num_batched_tokens,
        s.block_size,
        s.max_model_len,
        prefill_inflight=s.prefill_inflight,
    )
    kw: dict[str, Any] = dict(
        model=model,
        preset=preset,
        devices=s.devices,
        parallel=s.parallel,
        policy=policy,
        instance=ic,
        num_prefill=prefill_units,
        link=LINKS[s.link],
        co_run=s.co_run,
        drain_s=s.drain_s,
        timeline_window=window,
        core_tuning=s.core_tuning,
        request_weights=s.request_weights,
        scheduler_class=scheduler_class,
        topology=Topology.from_json(s.topology) if s.topology is not None else None,
    )
    if policy in ADVISED_CORE_POLICY or (policy == "dynamic" and s.dynamic_layout == "adaptive"):
        sim: Simulation = adaptive_class(
            split_target_utilization=s.split_target_utilization,
            split_backlog_drain_s=s.split_backlog_drain_s,
            split_hold_s=s.split_hold_s,
            split_colocate=s.split_colocate,
            split_tpot_target_s=s.slos[0].tpot_s,  # what co-located steps must keep
            **kw,
        )
    else:
        sim = Simulation(dynamic_layout=s.dynamic_layout, **kw)
    return sim, wl


def run_metrics(r: RunResult, spec: SimSpec, duration: float) -> dict[str, Any]:
    """One run's metrics (requests dropped or unfinished count as SLO misses)."""
    fin = [q for q in r.requests if q.finish >= 0]
    ttft = np.array([q.first_token - q.arrival for q in fin])
    tpot = np.array([(q.finish - q.first_token) / (q.n_out - 1) for q in fin if q.n_out > 1])
    e2e = np.array([q.finish - q.arrival for q in fin])
    out_tokens = sum(q.n_out for q in fin)
    in_tokens = sum(q.prompt for q in fin)
    span = max(r.makespan_s, 1e-9)
    total = len(r.requests)
    slo = {}
    for tier in spec.slos:
        ok = sum(
            1
            for q in fin
            if q.first_token - q.arrival <= tier.ttft_s
            and (q.n_out <= 1 or (q.finish - q.first_token) / (q.n_out - 1) <= tier.tpot_s)
        )
        slo[tier.name] = {"attainment": ok / total if total else 1.0, "goodput_rps": ok / duration}
    dropped: dict[str, int] = {}
    for q in r.requests:
        if q.dropped:
            dropped[q.dropped] = dropped.get(q.dropped, 0) + 1
    units = len(r.busy_s)
    # The adaptive layout's [(time_s, prefill units, mixed units)].
    split = getattr(r, "split_timeline", None)
    extra = (
        {}
        if split is None
        else {
            "split_timeline": [[round(t, 3), n, m] for t, n, m in split],
            "prefill_units_range": [min(n for _, n, _ in split), max(n for _, n, _ in split)]
            if split
            else None,
        }
    )
    return extra | {
        "requests_total": total,
        "requests_finished": len(fin),
        "requests_dropped": total - len(fin),
        "dropped_by_reason": dropped,
        "throughput_tok_s": r.tokens_in_window / r.window_s,
        "throughput_tok_s_per_device": r.tokens_in_window / r.window_s / spec.devices,
        "output_tok_s_to_drain": out_tokens / span,
        "input_tok_s": in_tokens / span,
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
        "slo": slo,
        "goodput_rps": slo[spec.slos[0].name]["goodput_rps"],
        "kv_bytes_moved": r.kv_bytes_moved,
        "kv_bytes_handoff": r.kv_bytes_handoff,
        "kv_bytes_migrated": r.kv_bytes_migrated,
        "kv_bytes_between_hosts": r.kv_bytes_inter_host,
        "kv_bytes_within_hosts": r.kv_bytes_moved - r.kv_bytes_inter_host,
        "utilisation": float(sum(r.busy_s) / (units * span)) if units else 0.0,
        "decisions_by_reason": r.decisions_by_reason,
        "decisions_total": r.core_decisions,
        "steps": r.steps,
        "events": r.events,
        "preemptions": r.preemptions,
        "makespan_s": r.makespan_s,
        "core_policy": r.layout,
    }


def _mean_ci(xs: list[float]) -> tuple[float, float]:
    a = np.array(xs, dtype=float)
    if len(a) < 2 or not np.all(np.isfinite(a)):
        return float(np.mean(a)), 0.0
    t = _T975.get(len(a) - 1, 1.96)
    return float(a.mean()), float(t * a.std(ddof=1) / math.sqrt(len(a)))


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds (CI95 half-widths in "ci95"); counts are summed over seeds."""
    out: dict[str, Any] = {}
    ci: dict[str, Any] = {}
    for key in (
        "throughput_tok_s",
        "throughput_tok_s_per_device",
        "input_tok_s",
        "goodput_rps",
        "utilisation",
    ):
        out[key], ci[key] = _mean_ci([r[key] for r in per_seed])
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        out[key], ci[key] = {}, {}
        for p in ("p50", "p90", "p99"):
            out[key][p], ci[key][p] = _mean_ci([r[key][p] for r in per_seed])
    for key in (
        "requests_total",
        "requests_finished",
        "requests_dropped",
        "kv_bytes_moved",
        "kv_bytes_handoff",
        "kv_bytes_migrated",
        "kv_bytes_between_hosts",
        "kv_bytes_within_hosts",
        "decisions_total",
        "steps",
        "events",
        "preemptions",
    ):
        out[key] = int(sum(r[key] for r in per_seed))
    reasons: dict[str, int] = {}
    for r in per_seed:
        for k, v in r["decisions_by_reason"].items():
            reasons[k] = reasons.get(k, 0) + v
    out["decisions_by_reason"] = reasons
    out["slo"] = {
        name: {
            "attainment": _mean_ci([r["slo"][name]["attainment"] for r in per_seed])[0],
            "goodput_rps": _mean_ci([r["slo"][name]["goodput_rps"] for r in per_seed])[0],
        }
        for name in per_seed[0]["slo"]
    }
    out["core_policy"] = per_seed[0]["core_policy"]
    out["ci95"] = ci
    out["per_seed"] = per_seed
    return out


SPLIT_OBJECTIVES = ("goodput", "throughput")


def _objective(m: dict[str, Any], objective: str = "goodput") -> tuple[float, float]:
    if objective == "throughput":
        return (m["throughput_tok_s"], m["goodput_rps"])
    return (m["goodput_rps"], m["throughput_tok_s"])


def tune_prefill_units(
    spec: SimSpec,
    policy: str,
    log: Callable[[str], None],
    *,
    rate: float | None = None,
    objective: str | None = None,
    cache: dict[tuple, dict[str, Any]] | None = None,
    start: int = 0,
) -> tuple[int, list]:
    """The P:D split with the best goodput (then throughput; objective "throughput": the other
    way round) at `rate` (None: the spec's), the spec's seed, over a shorter run (but one that
    holds every phase of a phase-shift:L workload): all splits for <= 12 units, else a coarse
    grid refined around its best; start > 0: a local search from that split instead (one unit
    at a time while the objective improves; the search passes the split of the rate it tried
    last). cache: the candidates' metrics by (policy, rate, split), for calls whose specs
    differ at most in split_objective."""
    units = spec.devices // spec.parallel
    dur = min(
        spec.duration, max(spec.search_duration, workload_cycle_s(spec.workload, spec.duration))
    )
    objective = objective or spec.split_objective
    tried: dict[int, dict[str, Any]] = {}
    cache = {} if cache is None else cache

    def evaluate(n: int) -> tuple[float, float]:
        if n not in tried and (policy, rate, n) in cache:
            tried[n] = cache[policy, rate, n]
        if n not in tried:
            r = simulate_once(spec, policy, spec.seed, rate=rate, duration=dur, prefill_units=n)
            tried[n] = cache[policy, rate, n] = run_metrics(r, spec, dur)
            log(
                f"  {policy} P:D {n}:{units - n}: goodput {tried[n]['goodput_rps']:.2f} req/s, "
                f"{tried[n]['throughput_tok_s']:.0f} tok/s"
            )
        return _objective(tried[n], objective)

    if 1 <= start < units:
        best = start
        for direction in (-1, 1):
            while 1 <= best + direction < units and evaluate(best + direction) > evaluate(best):
                best += direction
        cands = []
    elif units <= 12:
        cands = list(range(1, units))
    else:
        cands = sorted(
            {
                max(1, min(units - 1, round(units * f)))
                for f in (0.125, 0.25, 0.375, 0.5, 0.625, 0.75)
            }
        )
    if cands:
        best = max(cands, key=evaluate)
    step = max(1, units // 16)
    while cands and step >= 1 and units > 12:
        for n in (best - step, best + step):
            if 1 <= n < units:
                evaluate(n)
        new = max(tried, key=lambda k: _objective(tried[k], objective))
        if new == best:
            step //= 2
        best = new
    curve = [
        {
            "prefill_units": k,
            "decode_units": units - k,
            "goodput_rps": v["goodput_rps"],
            "throughput_tok_s": v["throughput_tok_s"],
        }
        for k, v in sorted(tried.items())
    ]
    return best, curve


def search_goodput(
    spec: SimSpec,
    policy: str,
    prefill_units: int,
    log: Callable[[str], None],
    *,
    tune_split: bool = False,
    tune_cache: dict[tuple, dict[str, Any]] | None = None,
    bracket: float = 0.0,
    bisections: int = 6,
    local_split: bool = False,
) -> tuple[float, list]:
    """DistServe goodput: the largest rate with >= 90% of requests meeting the first SLO tier
    (mean attainment over the seeds); bisection (`bisections` times) between 0 and the first
    failing doubling. bracket > 1: from the spec's rate up or down by that factor until the
    attainment changes, then bisection between the last two rates (fewer runs when the rate is
    a good guess). tune_split: static-PD's P:D split is tuned again at every rate tried
    (tune_prefill_units), as an operator would size a static deployment for its load;
    prefill_units is then ignored (tune_cache: tune_prefill_units' cache; local_split: every
    tuning after the first searches locally from the split of the rate tried last)."""
    tier = spec.slos[0].name
    curve: list[dict[str, Any]] = []
    last_split = [0]

    def attained(rate: float) -> bool:
        split = prefill_units
        if tune_split:
            split, _ = tune_prefill_units(
                spec,
                "static-pd",
                lambda s: None,
                rate=rate,
                cache=tune_cache,
                start=last_split[0] if local_split else 0,
            )
            last_split[0] = split
        vals = []
        for k in range(spec.seeds):
            r = simulate_once(spec, policy, spec.seed + k, rate=rate, prefill_units=split)
            vals.append(run_metrics(r, spec, spec.duration)["slo"][tier]["attainment"])
        a = float(np.mean(vals))
        point: dict[str, Any] = {"rate": rate, "attainment": a}
        if tune_split:
            point["prefill_units"] = split
        curve.append(point)
        where = f" at P:D {split}:{spec.devices // spec.parallel - split}" if tune_split else ""
        log(f"  {policy} rate {rate:.3g}{where}: SLO attainment {a:.3f}")
        return a >= 0.9

    lo, hi = 0.0, spec.rate
    if bracket > 1:
        if attained(spec.rate):
            lo, hi = spec.rate, spec.rate * bracket
            while attained(hi) and hi < spec.rate * 64:
                lo, hi = hi, hi * bracket
        else:
            lo = spec.rate / bracket
            while not attained(lo):
                lo, hi = lo / bracket, lo
                if lo < spec.rate / 64:
                    lo = 0.0
                    break
    else:
        while attained(hi):
            lo, hi = hi, hi * 2
            if hi > spec.rate * 64:
                break
    for _ in range(bisections):
        mid = (lo + hi) / 2
        if attained(mid):
            lo = mid
        else:
            hi = mid
    curve.sort(key=lambda c: c["rate"])
    return lo, curve


def _has_split(spec: SimSpec, policy: str) -> bool:
    """Whether `policy` runs on a fixed P:D split of units (static-pd's)."""
    return policy == "static-pd" or (policy == "dynamic" and spec.dynamic_layout == "disaggregated")


def request_samples(r: RunResult) -> dict[str, list[float]]:
    fin = [q for q in r.requests if q.finish >= 0]
    return {
        "ttft": [q.first_token - q.arrival for q in fin],
        "tpot": [(q.finish - q.first_token) / (q.n_out - 1) for q in fin if q.n_out > 1],
    }


def run_all(
    spec: SimSpec,
    log: Callable[[str], None] = lambda s: None,
    progress: Callable[[int], None] | None = None,
    keep_samples: bool = False,
) -> dict[str, Any]:
    """The JSON document: {"config": ..., "policies": {name: metrics}}. keep_samples adds
    "_samples" (seed 0's per-request TTFT / TPOT, for the CDF plots; not part of the JSON)."""
    spec = spec.resolved()
    units = spec.devices // spec.parallel
    result: dict[str, Any] = {"config": spec.to_json() | {"units": units}, "policies": {}}
    tuned: dict[str, Any] = {}
    needs_split = any(
        _has_split(spec, p) and not (p == "dynamic" and spec.dynamic_prefill_units)
        for p in spec.policies
    )
    split = spec.prefill_units
    if needs_split and not split:
        log(f"tuning the static-PD prefill:decode split over {units} units")
        split, curve = tune_prefill_units(spec, "static-pd", log)
        tuned = {"prefill_units": split, "decode_units": units - split, "search": curve}
    result["config"]["static_pd_split"] = tuned or (
        {"prefill_units": split, "decode_units": units - split} if split else None
    )
    for policy in spec.policies:
        per_seed = []
        units_p = (
            spec.dynamic_prefill_units
            if policy == "dynamic" and spec.dynamic_prefill_units
            else split
        )
        for k in range(spec.seeds):
            window = spec.timeline_window if k == 0 else None
            r = simulate_once(spec, policy, spec.seed + k, prefill_units=units_p, window=window)
            m = run_metrics(r, spec, spec.duration)
            if keep_samples and k == 0:
                result.setdefault("_samples", {})[policy] = request_samples(r)
            if window is not None:
                m["timeline"] = [list(t) for t in r.timeline]
            per_seed.append(m)
            if progress:
                progress(1)
        agg = aggregate(per_seed)
        if "timeline" in per_seed[0]:
            agg["timeline"] = per_seed[0].pop("timeline")
        if _has_split(spec, policy):
            agg["prefill_units"], agg["decode_units"] = units_p, units - units_p
        if "prefill_units_range" in per_seed[0]:
            ranges = [m["prefill_units_range"] for m in per_seed if m["prefill_units_range"]]
            agg["prefill_units_range"] = (
                [min(a for a, _ in ranges), max(b for _, b in ranges)] if ranges else None
            )
        if spec.goodput_search:
            log(f"goodput search for {policy}")
            # A split the user fixed stays; a tuned one is tuned again at every rate tried.
            retune = _has_split(spec, policy) and not (
                spec.prefill_units or (policy == "dynamic" and spec.dynamic_prefill_units)
            )
            agg["goodput_rps"], agg["goodput_curve"] = search_goodput(
                spec, policy, units_p, log, tune_split=retune
            )
            agg["goodput_definition"] = "largest rate with >= 90% meeting " + spec.slos[0].name
        else:
            agg["goodput_definition"] = (
                "requests meeting " + spec.slos[0].name + " per second at --rate "
                "(run with --goodput-search for the largest rate with >= 90% attainment)"
            )
        result["policies"][policy] = agg
    return result
