"""How noisy is one program's time on this shared machine, and does priority help?

Builds the serving engine as bench/sim_calibrate.py does (SmolLM2-135M shapes, random f32
weights, the validation's engine settings) and times two of its programs (a decode-only step
and a mixed step with a prompt chunk) in alternating phases. Each phase runs the process at a
scheduling priority: the process's `nice` and its *autogroup* nice (/proc/self/autogroup).
With sched_autogroup_enabled=1 (this machine's kernel) a process's nice only orders it against
processes of its own autogroup (its session); against other sessions' work the autogroup's nice
decides, so `nice -n -15` alone does nothing against other users' `nice -n 10` jobs.

    nice -n -15 python -m bench.sim_noise --phases 3 --seconds 20   # root, for negative nice

Prints per phase and program: median, p10, p90, max and the (p90-p10)/median spread.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

from bench.common import smollm2_engine, time_program  # noqa: E402

AUTOGROUP = Path("/proc/self/autogroup")


def autogroup_nice() -> int | None:
    """The autogroup nice of this process (None where the kernel has no autogroups)."""
    try:
        return int(AUTOGROUP.read_text().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def set_fifo(on: bool) -> str:
    """SCHED_FIFO (priority 1) or back to SCHED_OTHER for every thread of this process (XLA's
    thread pool included: sched_setscheduler sets one thread)."""
    policy, prio = (os.SCHED_FIFO, 1) if on else (os.SCHED_OTHER, 0)
    failed = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(prio))
        except OSError:
            failed += 1
    return ("SCHED_FIFO 1" if on else "SCHED_OTHER") + (
        f" ({failed} threads not set)" if failed else ""
    )


def set_priority(prio: str) -> str:
    """'N': the process nice and its autogroup's nice N; 'fifo': SCHED_FIFO at nice -15."""
    done = [set_fifo(prio == "fifo")]
    nice = -15 if prio == "fifo" else int(prio)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        done.append(f"nice {nice}")
    except OSError as e:
        done.append(f"nice not set ({e.strerror})")
    try:
        AUTOGROUP.write_text(str(nice))
        done.append(f"autogroup nice {autogroup_nice()}")
    except OSError as e:
        done.append(f"autogroup not set ({e.strerror})")
    return ", ".join(done)


def build(engine: dict):
    eng = smollm2_engine(**engine)
    eng.warmup()
    return eng.instances[0].runner


def stats(xs: list[float]) -> dict:
    a = np.array(xs)
    p10, p50, p90 = np.percentile(a, [10, 50, 90])
    return {
        "n": len(xs),
        "median_s": float(p50),
        "p10_s": float(p10),
        "p90_s": float(p90),
        "max_s": float(a.max()),
        "spread": float((p90 - p10) / p50),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--priorities", default="0,-15", help="nice values or 'fifo' (SCHED_FIFO), alternated"
    )
    p.add_argument("--phases", type=int, default=3, help="rounds over --priorities")
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    prios = [x.strip() for x in args.priorities.split(",")]
    engine = {
        "max_num_seqs": 8,
        "max_model_len": 256,
        "max_num_batched_tokens": 128,
        "block_size": 16,
    }
    runner = build(engine)
    programs = [(0, 4), (64, 16)]
    samples: dict[str, dict[tuple[int, int], list[float]]] = {
        n: {pr: [] for pr in programs} for n in prios
    }
    loads: dict[str, list[float]] = {n: [] for n in prios}
    for _ in range(args.phases):
        for n in prios:
            print(f"phase: {set_priority(n)}; load average {os.getloadavg()[0]:.1f}", flush=True)
            end = time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                for pr in programs:
                    samples[n][pr].append(time_program(runner, *pr))
            loads[n].append(os.getloadavg()[0])
    set_priority("0")
    doc = {
        "programs": {},
        "load_average": loads,
        "autogroups": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip(),
    }
    for pr in programs:
        for n in prios:
            s = stats(samples[n][pr])
            doc["programs"].setdefault(f"chunk={pr[0]} width={pr[1]}", {})[n] = s
            print(
                f"chunk={pr[0]:3d} width={pr[1]:2d} {n:>4}: median "
                f"{s['median_s'] * 1e3:7.1f} ms  p10 {s['p10_s'] * 1e3:7.1f}  p90 "
                f"{s['p90_s'] * 1e3:7.1f}  max {s['max_s'] * 1e3:7.1f}  spread "
                f"{s['spread'] * 100:5.1f}%  (n={s['n']})"
            )
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
