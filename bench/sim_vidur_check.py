"""Cross-check the simulator's GPU step time against Vidur's measured operator profiles.

Vidur (microsoft/vidur; PyPI `vidur`) predicts a step from per-operator GPU profiles (the PyPI
wheel ships none). Both simulators on one trace, attention included: bench/sim_vidur_compare.py.
This script needs only Vidur's mlp.csv: it checks the non-attention part of a step (embedding,
norms, QKV and output projections, RoPE, gated MLP, residual adds: every linear layer) on the
same model and device: Vidur's measured per-operator medians summed over the layers, against
this simulator's time for a step of N tokens with the attention terms left out (roofline x the
preset's fitted efficiencies; the LM head's weight read is inside the simulator's constant term,
not in Vidur's mlp profile).

    python -m bench.sim_vidur_check --vidur-profiles DIR [--device a100] [--model llama-3-8b]

DIR is Vidur's data/profiling directory (from a clone of microsoft/vidur; it is not part of
this project): DIR/compute/<device>/<hf model>/mlp.csv is read.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from flexnpu.sim.hardware import StepTimer, get_preset
from flexnpu.sim.models import get_model

HF_NAMES = {"llama-3-8b": "meta-llama/Meta-Llama-3-8B"}
PER_LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
)
TOKENS = (1, 8, 32, 128, 512, 1024, 2048, 4096, 8192)


def vidur_linear_ms(rows: list[dict], num_tokens: int, layers: int) -> float:
    """Vidur's measured non-attention time of a step (ms), tensor parallel 1."""
    match = [
        r
        for r in rows
        if int(r["num_tokens"]) == num_tokens and int(r["num_tensor_parallel_workers"]) == 1
    ]
    if not match:
        raise ValueError(f"no profile row for num_tokens={num_tokens}, tensor parallel 1")
    r = match[0]

    def med(op: str) -> float:
        return float(r[f"time_stats.{op}.median"])

    return med("emb") + layers * (sum(med(op) for op in PER_LAYER_OPS) + 2 * med("add"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--vidur-profiles", type=Path, required=True, metavar="DIR")
    p.add_argument("--device", default="a100")
    p.add_argument("--model", default="llama-3-8b", choices=sorted(HF_NAMES))
    args = p.parse_args(argv)
    path = args.vidur_profiles / "compute" / args.device / HF_NAMES[args.model] / "mlp.csv"
    if not path.exists():
        print(
            f"error: {path} does not exist (--vidur-profiles is Vidur's data/profiling directory)",
            file=sys.stderr,
        )
        return 2
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    m = get_model(args.model)
    preset = get_preset(args.device)
    timer = StepTimer.create(m, preset, 1)
    print(
        f"{args.model} on {args.device}: Vidur profile {path}; simulator preset efficiency "
        f"{preset.eff_compute:.2f} compute / {preset.eff_memory:.2f} memory "
        f"({preset.efficiency_source})"
    )
    print("\n| tokens | Vidur measured ms | simulator ms | sim / Vidur |\n|---|---|---|---|")
    ratios = []
    for n in TOKENS:
        try:
            v = vidur_linear_ms(rows, n, m.num_layers)
        except ValueError as e:
            print(f"| {n} | {e} | | |")
            continue
        ours = timer.seconds(*timer.flops_bytes(np.array([1.0, n, 0, 0, 0, 0]))) * 1e3
        ratios.append(ours / v)
        print(f"| {n} | {v:.2f} | {ours:.2f} | {ours / v:.2f} |")
    if ratios:
        print(
            f"\nsim / Vidur: median {np.median(ratios):.2f}, range {min(ratios):.2f}-"
            f"{max(ratios):.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
