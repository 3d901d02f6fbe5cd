"""Benchmark: time to analyze the optimized HLO of a full transformer step vs compile time.

    JAX_PLATFORMS=cpu python -m bench.analysis [--layers N] [--repeat R]

Compiles Qwen2.5-7B-shaped prefill and decode steps from ShapeDtypeStructs (layers unrolled,
so the optimized module holds every layer) and reports lower+compile time, the size of the
serialized module, the analysis time (parse + analyze + classify, best of R) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from bench import llama_corpus as lc  # noqa: E402
from flexnpu import analysis as fa  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=lc.QWEN25_7B.layers)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cfg = replace(lc.QWEN25_7B, layers=args.layers, scan_layers=False)
    steps = {
        "prefill b4 s512": (lc.prefill_fn(cfg), lc.prefill_args(cfg, 4, 512)),
        "decode b8 t1024": (lc.decode_fn(cfg), lc.decode_args(cfg, 8, 1024)),
    }
    print(f"Qwen2.5-7B shapes, {cfg.layers} layers unrolled, XLA:CPU")
    print(
        f"{'step':18} {'compile s':>10} {'HLO bytes':>10} {'instrs':>7} {'analyze ms':>11} "
        f"{'ratio':>8}  phase on h200"
    )
    for name, (fn, fn_args) in steps.items():
        t0 = time.perf_counter()
        compiled = fn.lower(*fn_args).compile()
        compile_s = time.perf_counter() - t0
        data = fa.optimized_hlo(compiled)
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = fa.analyze_bytes(data, device="h200")
            best = min(best, time.perf_counter() - t0)
        print(
            f"{name:18} {compile_s:10.2f} {len(data):10d} "
            f"{result.profile['instruction_count']:7d} {best * 1e3:11.2f} "
            f"{best / compile_s:8.2e}  {result.phase}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
