"""Fit the simulator's `cpu` preset to real SmolLM2-135M steps measured on this machine.

Runs the serving model's own prefill and decode (flexnpu.serving.model, SmolLM2-135M shapes,
random weights, float32 as served on this CPU, JAX_PLATFORMS=cpu), times each point (median of
--repeats after a warm-up), and fits the preset's compute / memory efficiency so that
max(FLOPs / (peak * eff_c), bytes / (bw * eff_m)) + launch matches (least squares in log time)
with FLOPs and bytes from the simulator's HLO-derived cost model. Writes
python/flexnpu/sim/data/cpu_calibration.json (read by flexnpu.sim.hardware) and prints the
per-point error.

    JAX_PLATFORMS=cpu python bench/sim_calibrate.py            # ~1 min on 2 shared cores

The 2 vCPUs are shared: the fit describes one device that has the whole machine (jax uses both
cores), which is how a single-instance serve.py run uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from flexnpu.serving import model  # noqa: E402
from flexnpu.serving.config import SMOLLM2_135M  # noqa: E402
from flexnpu.sim.hardware import CPU_CALIBRATION, get_preset  # noqa: E402
from flexnpu.sim.models import get_model  # noqa: E402
from flexnpu.sim.steptime import CostModel, step_features  # noqa: E402


def _time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(repeats: int) -> list[dict]:
    cfg = SMOLLM2_135M
    params = model.random_params(cfg, dtype=jnp.float32)
    prefill, decode, _ = model.jitted_steps(cfg)  # as the engine runs them (cache donated)
    rows = []
    for t in (32, 128, 256, 512):
        tokens = jnp.zeros((t,), jnp.int32)
        s = _time(prefill, params, tokens, jnp.int32(t), repeats=repeats)
        rows.append({"kind": "prefill", "n": t, "ctx": 0, "seconds": s})
        print(f"prefill T={t}: {s * 1e3:.2f} ms", flush=True)
    for b, ctx in ((1, 256), (4, 256), (8, 256), (8, 1024)):
        ck, cv = model.init_cache(cfg, b, ctx, dtype=jnp.float32)
        toks = jnp.zeros((b,), jnp.int32)
        pos = jnp.full((b,), ctx - 1, jnp.int32)
        ts = []
        for i in range(repeats + 1):  # the cache is donated: thread it through the calls
            t0 = time.perf_counter()
            logits, ck, cv = decode(params, ck, cv, toks, pos)
            jax.block_until_ready(logits)
            if i:
                ts.append(time.perf_counter() - t0)
        s = statistics.median(ts)
        rows.append({"kind": "decode", "n": b, "ctx": ctx, "seconds": s})
        print(f"decode B={b} C={ctx}: {s * 1e3:.2f} ms", flush=True)
    return rows


def fit(rows: list[dict]) -> tuple[float, float, list[float]]:
    m = get_model("smollm2-135m")
    cm = CostModel.load(m)
    dev = get_preset("cpu").device
    fb = []
    for r in rows:
        if r["kind"] == "prefill":
            f = step_features(m, [(0, r["n"], True)])
            f[2] = float(r["n"]) ** 2  # the served graph scores every pair, as the table's
        else:
            f = step_features(m, [(r["ctx"] - 1, 1, True)] * r["n"])
        fb.append(cm.flops_bytes(f, fused_attention=False))
    meas = np.array([r["seconds"] for r in rows])

    def predict(ec: float, em: float) -> np.ndarray:
        return np.array([max(f / (dev.peak_flops * ec), b / (dev.mem_bandwidth * em))
                         + dev.small_work_s for f, b in fb])

    best = (1e30, 1.0, 1.0)
    for ec in np.geomspace(0.01, 1.0, 60):
        for em in np.geomspace(0.01, 2.0, 60):
            err = float(np.sum(np.log(predict(ec, em) / meas) ** 2))
            if err < best[0]:
                best = (err, float(ec), float(em))
    _, ec, em = best
    rel = (predict(ec, em) / meas - 1).tolist()
    return ec, em, rel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dry-run", action="store_true", help="measure and fit, write nothing")
    args = p.parse_args(argv)
    rows = measure(args.repeats)
    ec, em, rel = fit(rows)
    for r, e in zip(rows, rel, strict=True):
        print(f"{r['kind']:8s} n={r['n']:4d} ctx={r['ctx']:5d} measured "
              f"{r['seconds'] * 1e3:7.2f} ms  model error {e * 100:+6.1f}%")
    print(f"eff_compute {ec:.3f}  eff_memory {em:.3f}")
    doc = {"eff_compute": ec, "eff_memory": em, "points": rows, "relative_error": rel,
           "source": "fitted to SmolLM2-135M steps (serving model, f32) measured on this "
                     "machine by bench/sim_calibrate.py",
           "regenerate": "JAX_PLATFORMS=cpu python bench/sim_calibrate.py"}
    if not args.dry_run:
        CPU_CALIBRATION.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {CPU_CALIBRATION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
