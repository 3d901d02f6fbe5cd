"""Execution time of one serving step: HLO analysis of lowered steps -> fitted cost features.

Table (regenerate: `python -m flexnpu.sim.steptime --model NAME` or `--all`; JAX_PLATFORMS=cpu):
each model's layers are lowered at prefill lengths T and decode points (batch B, context C),
analysed by flexnpu.analysis, and stored as rows of (features, FLOPs, bytes) in
data/steptime_<model>.json. At run time a step's FLOPs and bytes are a non-negative linear
model over the same features, fitted to those rows (exact for the terms a transformer step has:
a constant weight read, per-token matmuls, per-pair attention, per-position KV reads, per-sample
LM head, per-touched-expert weights), so any mixed batch the scheduler produces is interpolated.

    features = (1, N tokens, A attention pairs, K KV positions read, S sampled, X experts touched)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flexnpu.sim.models import MODELS, ModelShape, get_model

DATA_DIR = Path(__file__).parent / "data"
FEATURES = ("const", "tokens", "attn_pairs", "kv_read", "sampled", "experts")
PREFILL_T = (32, 128, 512, 2048, 8192)
DECODE_B = (1, 8, 64, 256)
DECODE_C = (256, 2048, 8192)
REGENERATE = "JAX_PLATFORMS=cpu python -m flexnpu.sim.steptime --model {model}"


def step_features(m: ModelShape, entries: list[tuple[int, int, bool]]) -> np.ndarray:
    """Features of a step; entries are (start position, new tokens, samples)."""
    n = a = k = s = 0
    for start, num, samples in entries:
        n += num
        a += num * start + num * (num + 1) // 2
        k += start + num
        s += samples
    x = m.experts_touched(n) * (m.num_layers - m.num_dense_layers)
    return np.array([1.0, n, a, k, s, x])


@dataclass(frozen=True)
class EngineShapes:
    """The fixed program shapes of FlexNPU's serving runner (flexnpu.serving.runner): every
    step has `rows` decode rows (padding included) whose attention reads a block table of
    one of `decode_widths` blocks (the narrowest that holds the longest row; the full width
    when the step has a prompt chunk), plus at most one prompt chunk padded to a chunk bucket
    that attends the full table. The device runs the padded program, whatever the real
    tokens: its FLOPs and bytes are those of (chunk bucket, width), not of the batch."""

    rows: int
    block_size: int
    max_blocks: int
    chunk_buckets: tuple[int, ...]
    decode_widths: tuple[int, ...]  # includes max_blocks

    @classmethod
    def of_engine(
        cls, max_num_seqs: int, max_num_batched_tokens: int, block_size: int, max_model_len: int
    ) -> EngineShapes:
        """The shapes the engine compiles for these settings (its own bucket rules)."""
        from flexnpu.serving.engine import EngineConfig

        ec = EngineConfig(
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
        )
        ec.validate()
        return cls(
            ec.max_num_seqs,
            ec.block_size,
            ec.max_blocks_per_seq,
            ec.resolved_chunk_buckets(),
            ec.resolved_decode_widths(),
        )

    def program(self, scheduled) -> tuple[int, int]:
        """(chunk bucket or 0, block-table width) of the program a step's entries run, picked
        as the runner picks it. A step with more than one prompt chunk (the runner takes one)
        is costed as one chunk of their total tokens, clipped to the largest bucket."""
        chunk = longest = 0
        for e in scheduled:
            if e.num_tokens > 1:
                chunk += e.num_tokens
            else:
                longest = max(longest, len(e.seq.blocks))
        if chunk:
            c = next((b for b in self.chunk_buckets if b >= chunk), self.chunk_buckets[-1])
            return c, self.max_blocks
        return 0, next((w for w in self.decode_widths if w >= longest), self.max_blocks)

    def programs(self) -> list[tuple[int, int]]:
        """Every program the engine compiles, as runner.Runner.programs lists its steps."""
        return [
            *((0, w) for w in self.decode_widths),
            *((c, self.max_blocks) for c in self.chunk_buckets),
        ]

    def features(self, chunk: int, width: int) -> np.ndarray:
        """Features of the padded program as its graph computes them (see paged_step): every
        decode row scores and reads width x block_size positions, the chunk scores every
        (query, position) pair of the full table, the LM head samples rows (+1 with a chunk)."""
        dec = self.rows * width * self.block_size
        full = self.max_blocks * self.block_size
        return np.array(
            [
                1.0,
                self.rows + chunk,
                dec + chunk * full,
                dec + (full if chunk else 0),
                self.rows + (1 if chunk else 0),
                0.0,
            ]
        )


def _row_features(m: ModelShape, row: dict) -> np.ndarray:
    """Features of a table row as its graph computes them: the reference attention scores every
    (query, key) pair of a prefill, masked or not (T*T pairs), and a decode reads C positions."""
    n, ctx = row["n"], row["ctx"]
    if row["kind"] == "prefill":
        f = step_features(m, [(0, n, True)])
        f[2] = float(n) * n
        return f
    return step_features(m, [(ctx - 1, 1, True)] * n)


def _analyze(fn, *args) -> tuple[float, float]:
    from flexnpu import analysis

    a = analysis.analyze(fn, *args, device="h200")  # a native-bf16 device: no convert overhead
    return a.classification.flops, a.classification.bytes


def _layer_cost(m: ModelShape, kind: str, n: int, ctx: int) -> tuple[float, float]:
    """FLOPs and bytes of all layers for a prefill of n tokens or a decode of n x ctx."""
    import jax
    import jax.numpy as jnp

    from flexnpu.sim.models import dense_layer_fns, mla_moe_layer_fns, sds

    def one(prefill, decode, params, cache_shapes):
        x = sds((n, m.d_model))
        if kind == "prefill":
            return _analyze(jax.jit(prefill), params, x)
        return _analyze(jax.jit(decode), params, x, *[sds(s) for s in cache_shapes])

    if not m.is_moe:
        pre, dec, params = dense_layer_fns(m)
        shp = (n, ctx, m.num_kv_heads, m.head_dim)
        f, b = one(pre, dec, params, [shp, shp])
        return f * m.num_layers, b * m.num_layers
    shp = [(n, ctx, m.kv_lora_rank + m.rope_dim)]
    pre, dec, params = mla_moe_layer_fns(m, moe=False, experts=0, tokens_per_expert=0)
    fd, bd = one(pre, dec, params, shp)
    touched = max(1, round(m.experts_touched(n)))
    per_expert = math.ceil(n * m.experts_per_token / touched)
    pre, dec, params = mla_moe_layer_fns(m, True, touched, per_expert)
    fm, bm = one(pre, dec, params, shp)
    moe_layers = m.num_layers - m.num_dense_layers
    del jnp
    return fd * m.num_dense_layers + fm * moe_layers, bd * m.num_dense_layers + bm * moe_layers


def _head_cost(m: ModelShape, n: int, sampled: int) -> tuple[float, float]:
    import jax
    import jax.numpy as jnp

    from flexnpu.sim.models import head_fn, sds

    fn, params = head_fn(m)
    return _analyze(jax.jit(fn), params, sds((n,), jnp.int32), sds((sampled,), jnp.int32))


def build_table(m: ModelShape, log=print) -> dict:
    rows = []
    points = [("prefill", t, 0) for t in PREFILL_T] + [
        ("decode", b, c) for b in DECODE_B for c in DECODE_C
    ]
    for kind, n, ctx in points:
        t0 = time.perf_counter()
        lf, lb = _layer_cost(m, kind, n, ctx)
        sampled = 1 if kind == "prefill" else n
        hf, hb = _head_cost(m, n, sampled)
        rows.append({"kind": kind, "n": n, "ctx": ctx, "flops": lf + hf, "bytes": lb + hb})
        log(
            f"{m.name} {kind} n={n} ctx={ctx}: {(lf + hf) / 1e9:.1f} GFLOP "
            f"{(lb + hb) / 1e9:.2f} GB ({time.perf_counter() - t0:.1f} s)"
        )
    return {
        "model": m.name,
        "features": list(FEATURES),
        "rows": rows,
        "regenerate": REGENERATE.format(model=m.name),
        "analysis": "flexnpu.analysis of each layer kind lowered with jax.ShapeDtypeStruct "
        "params (bf16), classified on a native-bf16 device",
    }


def table_path(model: str) -> Path:
    return DATA_DIR / f"steptime_{model}.json"


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares in relative error (rows scaled by 1/y)."""
    w = 1.0 / np.maximum(y, 1e-30)
    aw, yw = a * w[:, None], y * w
    scale = np.maximum(np.abs(aw).max(axis=0), 1e-30)
    try:
        from scipy.optimize import nnls

        c, _ = nnls(aw / scale, yw)
    except ImportError:  # active set by clipping: fine for these well-posed fits
        cols = list(range(a.shape[1]))
        c = np.zeros(a.shape[1])
        while cols:
            sol, *_ = np.linalg.lstsq(aw[:, cols] / scale[cols], yw, rcond=None)
            if (sol >= 0).all():
                c[cols] = sol
                break
            cols = [cc for cc, s in zip(cols, sol, strict=True) if s >= 0]
    return c / scale


@dataclass(frozen=True)
class CostModel:
    """FLOPs and bytes of a step as coefficient . features."""

    model: ModelShape
    flop_coef: np.ndarray
    byte_coef: np.ndarray
    fit_error: float  # max relative error of the fit over the table rows

    @classmethod
    def load(cls, model: str | ModelShape) -> CostModel:
        m = get_model(model) if isinstance(model, str) else model
        path = table_path(m.name)
        if not path.exists():
            raise FileNotFoundError(
                f"no step-time table for {m.name} at {path}; generate it: "
                + REGENERATE.format(model=m.name)
            )
        table = json.loads(path.read_text())
        feats = np.array([_row_features(m, r) for r in table["rows"]])
        flops = np.array([r["flops"] for r in table["rows"]])
        byts = np.array([r["bytes"] for r in table["rows"]])
        fc, bc = _nnls(feats, flops), _nnls(feats, byts)
        err = max(
            float(np.max(np.abs(feats @ fc - flops) / flops)),
            float(np.max(np.abs(feats @ bc - byts) / byts)),
        )
        # The analysed graphs read bf16 weights; scale the weight terms to the served format.
        wscale = m.weight_bytes_per_param / 2.0
        bc = bc.copy()
        bc[0] *= wscale
        bc[5] *= wscale
        return cls(m, fc, bc, err)

    def byte_coefs(self, fused_attention: bool) -> np.ndarray:
        """Byte coefficients on a device with or without fused attention (a copy).

        Unfused (the cpu preset): the reference graph's bytes as XLA's CPU compiler lays them
        out, which is what runs there. Its decode attention does not read the cache once: the
        batched dots want the batch dims leading, so layout assignment inserts a
        transpose_copy_fusion of the K cache ([B,C,kv,D] -> [B,kv,D,C]) and of the V cache
        (-> [B,kv,C,D], converted to f32) before them; each position's K and V are read, copied
        and read again (Llama-3-8B: 8,704 B per position per layer analysed, scores included;
        4,096 real; the fitted kv_read term is 1.99x kv_bytes_per_token for every dense
        model). For MLA the fit puts the decode reads into the per-pair term instead (decode
        rows have pairs = positions; the naive-MLA prefill's f32 scores make that term large)
        and kv_read fits to 0, so dropping the per-pair bytes dropped MLA's KV reads too.

        Fused (accelerators: paged FlashAttention/MLA kernels): the scores stay on chip, so
        the per-pair bytes are dropped, and each context position's KV is read once: the
        model's true kv_bytes_per_token (DeepSeek-R1 MLA 70,272 B, Llama-3-8B 131,072 B)."""
        bc = self.byte_coef.copy()
        if fused_attention:
            bc[2] = 0.0
            bc[3] = float(self.model.kv_bytes_per_token)
        return bc

    def flops_bytes(self, feats: np.ndarray, fused_attention: bool) -> tuple[float, float]:
        """FLOPs and bytes of a step's features (bytes as byte_coefs says)."""
        return float(self.flop_coef @ feats), float(self.byte_coefs(fused_attention) @ feats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Regenerate the simulator's step-time tables")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", choices=sorted(MODELS))
    g.add_argument("--all", action="store_true")
    args = p.parse_args(argv)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    for name in sorted(MODELS) if args.all else [args.model]:
        table = build_table(get_model(name))
        table_path(name).write_text(json.dumps(table, indent=1) + "\n")
        cm = CostModel.load(name)
        print(f"{name}: wrote {table_path(name)}; fit max relative error {cm.fit_error:.3%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
