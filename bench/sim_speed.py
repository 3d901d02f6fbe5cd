"""Simulator speed: 384 x 910C, DeepSeek-R1-shaped, near saturation (the issue's goal: 10
simulated minutes in <= 60 s wall). Reports wall and CPU seconds, events/s, steps/s, placer
calls/s, token-steps/s, simulated seconds per wall second and the projected wall and CPU time
of --target simulated seconds: the set-up (workload, cost model, KV pools) once plus the event
loop scaled by target / simulated seconds (min / median over --repeat runs: the machine is
shared). The cost per simulated second grows while the cluster fills (larger decode batches):
project from a window long enough to be near its steady state (--duration 60 or more).

    python bench/sim_speed.py                       # 20 simulated s of the dynamic policy
    python bench/sim_speed.py --drain 0             # only the loaded window (no final drain)
    python bench/sim_speed.py --compare --repeat 3  # also the per-sequence scheduler path,
                                                    # interleaved, with the ratio
    python bench/sim_speed.py --duration 600        # the full goal (long: see the projection)
    python bench/sim_speed.py --baseline REV --repeat 3  # this tree against itself with the
                                                    # simulator engine and scheduler of git
                                                    # revision REV, runs alternated, ratios;
                                                    # fails if the results differ

--compare runs the scheduler with its aggregate decode path off (every sequence one by one,
the code the aggregate path replaced and must decide exactly like): both runs must give the
same steps, events and makespan, or the bench fails.

--baseline REV runs each measurement in a fresh interpreter, alternating between this tree's
python/flexnpu and a copy of it in which the modules of _BASELINE_MODULES (the event loop and
the scheduler whose speed this is about; each a file or a package, as REV has it) are REV's:
before / after on the same loaded machine, with everything else (cost model, placer, compiled
modules) the same on both sides.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flexnpu.serving.scheduler import Scheduler, SchedulerConfig
from flexnpu.sim import engine
from flexnpu.sim.runner import SimSpec, run_metrics, simulate_once


class PerSequenceScheduler(Scheduler):
    """The scheduler with the aggregate decode path off."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._bulk_ok = False


def run_once(spec: SimSpec, args: argparse.Namespace, per_sequence: bool,
             prof: cProfile.Profile | None = None) -> dict[str, Any]:
    engine.Scheduler = PerSequenceScheduler if per_sequence else Scheduler  # type: ignore
    # The event loop (Simulation.run) timed apart from the set-up (workload, cost model,
    # instances' KV pools): only the loop grows with simulated time.
    loop: list[float] = []
    sim_run = engine.Simulation.run

    def timed_run(sim: engine.Simulation, wl: Any) -> engine.RunResult:
        lc, lt = time.process_time(), time.perf_counter()
        try:
            return sim_run(sim, wl)
        finally:
            loop[:] = [time.perf_counter() - lt, time.process_time() - lc]

    engine.Simulation.run = timed_run  # type: ignore[method-assign]
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        if prof:
            prof.enable()
        r = simulate_once(spec, args.policy, 0, prefill_units=args.prefill_units)
        if prof:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        engine.Scheduler = Scheduler  # type: ignore
        engine.Simulation.run = sim_run  # type: ignore[method-assign]
    loop_wall, loop_cpu = loop
    m = run_metrics(r, spec, spec.duration)
    token_steps = sum(q.n_out for q in r.requests) + sum(q.prompt for q in r.requests)
    # Without a drain the run ends at the last arrival: simulated time = the loaded window.
    sim_s = r.makespan_s if args.drain > 0 else min(r.makespan_s, spec.duration)
    return {
        "wall_s": wall, "cpu_s": cpu, "simulated_s": sim_s, "requests": len(r.requests),
        "events": r.events, "steps": r.steps, "placer_calls": r.placements,
        "units": len(r.busy_s), "events_per_s": r.events / wall, "steps_per_s": r.steps / wall,
        "placer_calls_per_s": r.placements / wall, "token_positions_per_s": token_steps / wall,
        "simulated_s_per_wall_s": sim_s / wall,
        "setup_wall_s": wall - loop_wall, "setup_cpu_s": cpu - loop_cpu,
        # set-up once + the event loop scaled to the target
        "projected_wall_s_for_target": wall - loop_wall + loop_wall * args.target / sim_s,
        "projected_cpu_s_for_target": cpu - loop_cpu + loop_cpu * args.target / sim_s,
        "utilisation": m["utilisation"], "throughput_tok_s": m["throughput_tok_s"],
        "tpot_p50_ms": m["tpot_s"]["p50"] * 1e3, "ttft_p50_s": m["ttft_s"]["p50"],
        "makespan_s": r.makespan_s,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """min / median of the timing-dependent figures, the rest from the first run."""
    out = dict(runs[0])
    for k in ("wall_s", "cpu_s", "setup_wall_s", "setup_cpu_s", "projected_wall_s_for_target",
              "projected_cpu_s_for_target"):
        xs = [r[k] for r in runs]
        out[k] = min(xs)
        out[k + "_median"] = statistics.median(xs)
    for k in ("events_per_s", "steps_per_s", "placer_calls_per_s", "token_positions_per_s",
              "simulated_s_per_wall_s"):
        xs = [r[k] for r in runs]
        out[k] = max(xs)
        out[k + "_median"] = statistics.median(xs)
    out["runs"] = len(runs)
    return out


_ROOT = Path(__file__).resolve().parents[1]
# Runs this script with the flexnpu package found first in the directory given first (the editable
# install's finder would otherwise win over sys.path).
_CHILD = """import importlib.machinery, runpy, sys
sys.path.insert(0, sys.argv.pop(1))
sys.meta_path.sort(key=lambda f: f is not importlib.machinery.PathFinder)
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""
_SAME = ("requests", "events", "steps", "placer_calls", "makespan_s", "throughput_tok_s",
         "tpot_p50_ms", "ttft_p50_s")


# Module paths without ".py": REV's `X.py` or package `X/` replaces this tree's.
_BASELINE_MODULES = ("python/flexnpu/sim/engine", "python/flexnpu/serving/scheduler")


def _git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(_ROOT), *args], check=True,
                              capture_output=True).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"--baseline: git {' '.join(args)} failed: "
                         f"{e.stderr.decode().strip()}") from None


def baseline_package(rev: str, into: Path) -> Path:
    """A copy of this tree's python/flexnpu under `into` with REV's _BASELINE_MODULES."""
    pkg = into / "python"
    shutil.copytree(_ROOT / "python" / "flexnpu", pkg / "flexnpu", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for module in _BASELINE_MODULES:
        paths = (module + ".py", module)
        files = _git("ls-tree", "-r", "--name-only", rev, "--", *paths).decode().split()
        if not files:
            raise SystemExit(f"--baseline {rev}: {rev} has neither {paths[0]} nor {module}/")
        for path in paths:
            target = into / path
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        for path in files:
            (into / path).parent.mkdir(parents=True, exist_ok=True)
            (into / path).write_bytes(_git("show", f"{rev}:{path}"))
    return pkg


def run_child(pkg: Path, argv: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _CHILD, str(pkg), str(Path(__file__).resolve()), *argv,
           "--repeat", "1", "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"run with {pkg} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads(out.read_text())["aggregate"]


def baseline_main(args: argparse.Namespace, argv: list[str]) -> int:
    """Before / after: REV's Python code against this tree's, alternated, --repeat each."""
    child_argv = [a for a in argv if a not in ("--compare", "--profile")]
    for opt in ("--baseline", "--repeat", "--json"):
        while opt in child_argv:
            i = child_argv.index(opt)
            del child_argv[i:i + 2]
    tmp = Path(tempfile.mkdtemp(prefix="sim_speed_"))
    try:
        pkgs = {"baseline": baseline_package(args.baseline, tmp),
                "current": _ROOT / "python"}
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in pkgs}
        for k in range(args.repeat):
            for mode, pkg in pkgs.items():
                runs[mode].append(run_child(pkg, child_argv, tmp / f"{mode}{k}.json"))
                r = runs[mode][-1]
                print(f"{mode:9s} run {k + 1}: wall {r['wall_s']:.2f} s, cpu {r['cpu_s']:.2f} s",
                      flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {"baseline_rev": args.baseline, "argv": child_argv}
    for mode in pkgs:
        out[mode] = summary(runs[mode])
    b, c = out["baseline"], out["current"]
    print(f"\n{'':38s} {'baseline':>12s} {'current':>12s} {'ratio':>7s}")
    for k in ("wall_s", "wall_s_median", "cpu_s", "cpu_s_median", "events_per_s",
              "placer_calls_per_s", "projected_wall_s_for_target", "projected_cpu_s_for_target"):
        ratio = b[k] / c[k] if k.startswith(("wall", "cpu", "proj")) else c[k] / b[k]
        print(f"{k:38s} {b[k]:12.4g} {c[k]:12.4g} {ratio:6.2f}x")
    # Every run of both sides, not only the first: a tree edited while the bench runs (others'
    # work in a shared tree) changes the current side's later runs and must not pass.
    first = runs["baseline"][0]
    same = all(r[k] == first[k] for mode in pkgs for r in runs[mode] for k in _SAME)
    out["same_results"] = same
    print(f"\nsame results ({', '.join(_SAME)}; all {2 * args.repeat} runs): {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if not same:
        print("ERROR: the baseline and the current code gave different results")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=384)
    p.add_argument("--device", default="910c")
    p.add_argument("--model", default="deepseek-r1")
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--rate", type=float, default=1200.0,
                   help="req/s (default: near the static-pd saturation of 384 x 910C, sharegpt)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    p.add_argument("--drain", type=float, default=600.0,
                   help="simulated seconds after the last arrival (0: stop there, so the "
                        "projection covers the loaded window only)")
    p.add_argument("--policy", default="dynamic")
    p.add_argument("--prefill-units", type=int, default=6)
    p.add_argument("--target", type=float, default=600.0, help="simulated seconds to project")
    p.add_argument("--repeat", type=int, default=1, help="runs per mode (min / median)")
    p.add_argument("--compare", action="store_true",
                   help="also run the per-sequence scheduler path, interleaved; print ratios")
    p.add_argument("--profile", action="store_true", help="print the top functions (cProfile)")
    p.add_argument("--baseline", metavar="REV",
                   help="compare with the Python code of git revision REV (see above)")
    p.add_argument("--json")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.repeat < 1 or args.duration <= 0 or args.drain < 0:
        p.error("--repeat must be >= 1, --duration > 0, --drain >= 0")
    if args.baseline:
        return baseline_main(args, argv)
    spec = SimSpec(devices=args.devices, device=args.device, model=args.model,
                   workload=args.workload, rate=args.rate, duration=args.duration,
                   drain_s=args.drain).resolved()
    prof = cProfile.Profile() if args.profile else None
    modes = ["aggregate"] + (["per_sequence"] if args.compare else [])
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:
            runs[mode].append(run_once(spec, args, mode == "per_sequence",
                                       prof if mode == "aggregate" else None))
    out: dict[str, Any] = {
        "devices": args.devices, "model": args.model, "workload": args.workload,
        "rate": args.rate, "duration_s": args.duration, "drain_s": args.drain,
        "policy": args.policy, "target_s": args.target,
    }
    for mode in modes:
        out[mode] = summary(runs[mode])
    agg = out["aggregate"]
    for k in ("devices", "units", "requests", "events", "steps", "placer_calls", "simulated_s",
              "wall_s", "wall_s_median", "cpu_s", "cpu_s_median", "setup_wall_s",
              "setup_cpu_s", "events_per_s",
              "placer_calls_per_s", "steps_per_s", "token_positions_per_s",
              "simulated_s_per_wall_s", "projected_wall_s_for_target",
              "projected_wall_s_for_target_median", "projected_cpu_s_for_target",
              "projected_cpu_s_for_target_median",
              "utilisation", "throughput_tok_s", "tpot_p50_ms", "ttft_p50_s"):
        v = agg.get(k, out.get(k))
        print(f"{k:36s} {v:.4g}" if isinstance(v, float) else f"{k:36s} {v}")
    if args.compare:
        ref = out["per_sequence"]
        same = all(ref[k] == agg[k] for k in ("steps", "events", "placer_calls", "makespan_s"))
        out["same_decisions"] = same
        ratio = {k: ref[k] / agg[k] for k in ("wall_s", "wall_s_median", "cpu_s",
                                              "cpu_s_median")}
        out["speedup_vs_per_sequence"] = ratio
        print(f"\nper-sequence path: wall {ref['wall_s']:.2f} s (median "
              f"{ref['wall_s_median']:.2f}), cpu {ref['cpu_s']:.2f} s, "
              f"{ref['events_per_s']:.0f} events/s, {ref['placer_calls_per_s']:.0f} placer "
              f"calls/s")
        print(f"aggregate speed-up: wall x{ratio['wall_s']:.2f} (median "
              f"x{ratio['wall_s_median']:.2f}), cpu x{ratio['cpu_s']:.2f} (median "
              f"x{ratio['cpu_s_median']:.2f}); same decisions: {same}")
    proj = agg["projected_wall_s_for_target"]
    window = "loaded window only" if args.drain == 0 else "incl. the drain after the arrivals"
    proj_cpu = agg["projected_cpu_s_for_target"]
    print(f"\n{args.target:g} simulated s of this load ({window}; set-up once + the event "
          f"loop scaled): ~{proj:.0f} s wall, ~{proj_cpu:.0f} s CPU (min of {args.repeat}; "
          f"goal 60 s wall): {'met' if proj <= 60 else 'NOT met'}"
          f"{' (met on CPU time)' if proj > 60 >= proj_cpu else ''}")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.compare and not out["same_decisions"]:
        print("ERROR: the per-sequence and aggregate paths decided differently")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
