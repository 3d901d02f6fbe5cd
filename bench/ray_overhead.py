"""What serving through a Ray replica costs (`serve --ray`'s path) against the same engine in
the process: the same model and engine options, B concurrent greedy requests of T tokens,
first directly (Engine in this process), then through the multi-host front to one replica
actor on a one-node local Ray cluster (submit by actor call, tokens back by polls). Both on
the same devices kind; run one after the other, so they do not share the cores.

Reports, per side, the median over rounds of: TTFT (submit to first token at the caller),
the steady inter-token latency (median gap while all B requests decode) and the wall time of
the round; and the differences (what the Ray hop adds).

    python -m bench.ray_overhead [--model random:tiny] [--streams 1,8] [--tokens 128]
        [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import steady_gaps


class _Timed:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.done = threading.Event()

    def on_token(self, token_id: int, logprobs: Any, now: float) -> None:
        self.times.append(time.perf_counter())  # when the caller has it

    def on_finish(self, reason: str, now: float) -> None:
        self.done.set()


def _round(submit: Any, prompts: list[list[int]], tokens: int) -> dict[str, float]:
    from flexnpu.serving.sampling import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = []
    for p in prompts:
        out = _Timed()
        submit(p, sp, out)
        outs.append(out)
    for out in outs:
        if not out.done.wait(600):
            raise TimeoutError("a request did not finish in 600 s")
    wall = time.perf_counter() - t0
    gaps = steady_gaps([o.times for o in outs])
    return {
        "ttft_ms": 1e3 * statistics.median(o.times[0] - t0 for o in outs),
        "itl_ms": 1e3 * statistics.median(gaps) if gaps else float("nan"),
        "wall_s": wall,
    }


def _measure(submit: Any, streams: list[int], tokens: int, rounds: int) -> dict[int, dict]:
    prompts = [[(7 * i + j) % 200 + 3 for j in range(16)] for i in range(max(streams))]
    _round(submit, prompts[:1], 4)  # warm
    out = {}
    for b in streams:
        runs = [_round(submit, prompts[:b], tokens) for _ in range(rounds)]
        out[b] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]

    import jax

    jax.config.update("jax_platforms", "flexnpu")
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps

    ec = EngineConfig(max_num_seqs=max(streams), max_model_len=512, num_devices=1)
    m = load_model(args.model, log=lambda *_: None)
    eng = Engine(
        ModelSteps(m.config, ec.block_size, m.vocab_limit),
        m.params,
        ec,
        devices=jax.devices()[:1],
        eos_ids=m.eos_ids,
    )
    eng.warmup()
    eng.start()
    direct = _measure(lambda p, sp, out: eng.submit(p, sp, out), streams, args.tokens, args.rounds)
    eng.stop()

    import ray
    from ray.cluster_utils import Cluster

    from flexnpu.serving.multihost.front import ClusterFront
    from flexnpu.serving.multihost.ray_replicas import RayLauncher
    from flexnpu.serving.multihost.replica import ReplicaSpec

    cluster = Cluster(
        initialize_head=True, head_node_args=dict(num_cpus=1, resources={"flexnpu_devices": 1})
    )
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        front = ClusterFront(RayLauncher(ReplicaSpec(args.model, ec)), log=lambda *_: None)
        front.start()
        via_ray = _measure(
            lambda p, sp, out: front.submit(p, sp, out), streams, args.tokens, args.rounds
        )
        front.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()

    result = {"model": args.model, "tokens": args.tokens, "direct": direct, "ray": via_ray}
    print(f"{args.model}, {args.tokens} tokens, median of {args.rounds} rounds")
    print("streams | TTFT direct / ray (ms) | ITL direct / ray (ms) | wall direct / ray (s)")
    for b in streams:
        d, r = direct[b], via_ray[b]
        print(
            f"{b:7d} | {d['ttft_ms']:7.1f} / {r['ttft_ms']:7.1f} | {d['itl_ms']:6.2f} / "
            f"{r['itl_ms']:6.2f} | {d['wall_s']:6.2f} / {r['wall_s']:6.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
