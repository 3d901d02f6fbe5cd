"""Engine overhead and FlexNPU overhead of the served decode step, side by side in one process.

For each platform (a flexnpu virtual NPU under the default policy, and the xla-cpu-pjrt plugin
loaded directly by JAX) one co-located engine on one device is built and compiled; then rounds
alternate between the platforms (so drift hits both alike) and measure, each:
- bare: the engine's own compiled decode step (B rows, no prefill chunk) called back to back by a
  minimal loop that reads the sampled ids every step (what any decode loop must do);
- served: B concurrent greedy requests through the engine (scheduler, async dispatch, output
  callbacks); TPOT per request = (last token - first token) / (tokens - 1), and the steady
  inter-token latency (median gap while all B requests decode).
Prints medians over rounds and the ratios served/bare (target <= 1.10) and flexnpu/direct
(target <= 1.01).

    python -m bench.engine_overhead [--model random:tiny] [--rounds 3] [--tokens 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from bench.common import decode_inputs, setup_side_by_side, steady_gaps


class _Timed:
    """A RequestOutput that records when each token arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.ids: list[int] = []
        self.done = threading.Event()

    def on_token(self, token_id, logprobs, now):
        self.times.append(now)
        self.ids.append(token_id)
        return None

    def on_finish(self, reason, now):
        self.done.set()


def bare_step_seconds(engine, steps: int, rows: int, position: int) -> float:
    """Median seconds of the engine's decode step in a minimal loop."""
    import numpy as np

    runner = engine.instances[0].runner
    inp = runner.device_inputs(decode_inputs(runner, rows, position))
    samples = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = runner.steps.step(runner.params, runner.ck, runner.cv, inp)
        runner.ck, runner.cv = out[4], out[5]
        np.asarray(out[0])
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def served(engine, rows: int, tokens: int, prompt_len: int) -> dict:
    from flexnpu.serving.sampling import SamplingParams

    sp = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    outs = [_Timed() for _ in range(rows)]
    for i, o in enumerate(outs):
        engine.submit([(7 * i + j) % 1000 + 3 for j in range(prompt_len)], sp, o)
    for o in outs:
        if not o.done.wait(600):
            raise TimeoutError("a benchmark request did not finish")
    tpot = [(o.times[-1] - o.times[0]) / (len(o.times) - 1) for o in outs]
    gaps = steady_gaps([o.times for o in outs])
    return {
        "tpot_s": statistics.mean(tpot),
        "steady_itl_s": statistics.median(gaps),
        "ids": [o.ids for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=None,
        help="the SmolLM2-135M-Instruct GGUF (default), a .gguf path or random:<preset>",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--bare-steps", type=int, default=40)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from flexnpu.serving import logs

    logs.set_backend_log_level("fatal")
    npu, direct = setup_side_by_side()
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.gguf_loader import DEFAULT_MODEL
    from flexnpu.serving.loading import load_model

    m = load_model(args.model or DEFAULT_MODEL, log=lambda *a: print(*a, flush=True))
    ec = EngineConfig(
        max_num_seqs=args.batch,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=64,
        chunk_buckets=[32, 64],
        num_devices=1,
    )
    engines = {}
    for name, dev in (("flexnpu", npu[0]), ("direct", direct[0])):
        t0 = time.perf_counter()
        eng = Engine(None, m.params, ec, devices=[dev], model_config=m.config, eos_ids=())
        eng.warmup()
        eng.start()
        engines[name] = eng
        print(f"{name}: {dev} compiled in {time.perf_counter() - t0:.1f}s", flush=True)
    res: dict[str, dict[str, list[float]]] = {
        n: {"bare_s": [], "tpot_s": [], "steady_itl_s": []} for n in engines
    }
    ids: dict[str, list] = {}
    position = args.prompt_len + args.tokens // 2
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            eng = engines[name]
            res[name]["bare_s"].append(
                bare_step_seconds(eng, args.bare_steps, args.batch, position)
            )
            s = served(eng, args.batch, args.tokens, args.prompt_len)
            res[name]["tpot_s"].append(s["tpot_s"])
            res[name]["steady_itl_s"].append(s["steady_itl_s"])
            ids.setdefault(name, s["ids"])
            print(
                f"round {r} {name}: bare {res[name]['bare_s'][-1] * 1e3:.2f} ms, TPOT "
                f"{s['tpot_s'] * 1e3:.2f} ms, steady ITL {s['steady_itl_s'] * 1e3:.2f} ms",
                flush=True,
            )
    for eng in engines.values():
        eng.stop()
    med = {n: {k: statistics.median(v) for k, v in d.items()} for n, d in res.items()}
    print(f"\n{m.name}, batch {args.batch}, {args.tokens} tokens, {args.rounds} rounds (medians)")
    print(
        f"{'platform':10} {'bare step ms':>13} {'TPOT ms':>9} {'steady ITL ms':>14} "
        f"{'TPOT/bare':>10} {'ITL/bare':>9}"
    )
    for n, d in med.items():
        print(
            f"{n:10} {d['bare_s'] * 1e3:13.2f} {d['tpot_s'] * 1e3:9.2f} "
            f"{d['steady_itl_s'] * 1e3:14.2f} {d['tpot_s'] / d['bare_s']:10.3f} "
            f"{d['steady_itl_s'] / d['bare_s']:9.3f}"
        )
    ratios = {k: med["flexnpu"][k] / med["direct"][k] for k in ("bare_s", "tpot_s", "steady_itl_s")}
    print("flexnpu/direct: " + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in ratios.items()))
    same = ids["flexnpu"] == ids["direct"]
    print(f"greedy ids identical on both platforms: {same}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"medians": med, "raw": res, "flexnpu_over_direct": ratios, "same_ids": same},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
