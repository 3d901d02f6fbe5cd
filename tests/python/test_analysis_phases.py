"""Phase classification of prefill and decode steps, and the decode -> compute-bound boundary.

(a) A small Llama-architecture model that really fits this machine, on the CPU preset.
(b) A model with Qwen2.5-7B's shapes (28 layers, hidden 3584, 28 heads, 4 KV heads, head dim
    128, FFN 18944, vocab 152064, bf16), lowered and compiled from ShapeDtypeStructs (no
    weights) with its layers unrolled, classified on the H200 and Ascend 910C presets.

XLA:CPU emulates bf16 with converts; both presets compute bf16 natively, so the classification
drops those convert kernels (profile["convert_overhead_*"], see xla_passes/analysis.h).

Boundary. Every decode-step quantity is linear in the batch size B: FLOPs F(B) = f0 + f1 B
and bytes M(B) = m0 + m1 B (weights once, KV cache and activations per sequence). The step is
compute-bound when F/M >= ridge, i.e. from B* = (ridge m0 - f0) / (f1 - ridge m1). The test
fits the line from the analysis at two batch sizes, checks that the classifier switches phase
exactly around B*, and compares the coefficients with first principles: f1 = 2 (P - P_embed)
+ 4 T H hd L (dots + attention), m0 = 2 (P - P_embed) bytes of bf16 weights (the embedding is
gathered, not read), m1 >= T x KV bytes per token. The analysed m1 is larger than the KV cache
alone (the CPU executable also streams f32 activations and unfused attention scores per
sequence), so the analysed B* is larger than the KV-only roofline B*; both are printed.
"""

from __future__ import annotations

import os

# jaxlib's own XLA:CPU compiler (the oracle and the measured numbers below are for it), even
# when other jax plugins are installed; set before any jax backend initializes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import pytest

from flexnpu import analysis as fa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_analysis import cpu_device  # noqa: E402

from bench import llama_corpus as lc  # noqa: E402

QWEN = replace(lc.QWEN25_7B, scan_layers=False)
CONTEXT = 256  # decode attends over a 256-token KV cache


@pytest.fixture(autouse=True, scope="module")
def _cpu() -> Iterator[None]:
    with jax.default_device(cpu_device()):
        yield


# (a) ------------------------------------------------------------------------------------------
SMALL = lc.LlamaConfig(vocab=1024, hidden=512, layers=2, heads=8, kv_heads=4, head_dim=64, ffn=1408)


def test_small_llama_phases_on_cpu() -> None:
    prefill = fa.analyze(lc.prefill_fn(SMALL), *lc.prefill_args(SMALL, 4, 128), device="cpu")
    decode = fa.analyze(lc.decode_fn(SMALL), *lc.decode_args(SMALL, 1, 128), device="cpu")
    assert prefill.phase == "prefill", prefill.classification
    assert decode.phase == "decode", decode.classification
    # On an H200 the same tiny decode step is latency-bound; without the latency floor its
    # intensity still says bandwidth-bound.
    assert decode.classify("h200").phase == "small"
    no_floor = replace(fa.get_device("h200"), small_work_s=0.0)
    assert decode.classify(no_floor).phase == "decode"
    assert prefill.classify(no_floor).arithmetic_intensity > 10 * (
        decode.classify(no_floor).arithmetic_intensity
    )


# (b) ------------------------------------------------------------------------------------------
# The Qwen-shaped steps are compiled in a child process with JAX_PLATFORMS=cpu: jaxlib's own
# XLA:CPU, the compiler the numbers in this file's docstring are about, whatever platforms
# the pytest session configured (conftest.py runs the session on flexnpu + xla-cpu-pjrt).
_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from dataclasses import replace
from bench import llama_corpus as lc
from flexnpu import analysis as fa
q = replace(lc.QWEN25_7B, scan_layers=False)
out = []
for kind, batch, seq in {requests!r}:
    if kind == "prefill":
        fn, args = lc.prefill_fn(q), lc.prefill_args(q, batch, seq)
    else:
        fn, args = lc.decode_fn(q), lc.decode_args(q, batch, seq)
    out.append(fa.analyze(fn, *args).profile)
print(json.dumps(out))
"""


def _profiles(requests: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    code = _CHILD.format(root=str(Path(__file__).resolve().parents[2]), requests=requests)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_cache: dict[tuple[str, int, int], dict[str, Any]] = {}


def _profile(kind: str, batch: int, seq: int = CONTEXT) -> dict[str, Any]:
    return _many([(kind, batch, seq)])[0]


def _many(requests: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
    missing = [r for r in requests if r not in _cache]
    if missing:
        _cache.update(zip(missing, _profiles(missing), strict=True))
    return [_cache[r] for r in requests]


def _phase(profile: dict[str, Any], device: str) -> str:
    return fa.classify_profile(profile, device).phase


def _line(device: str) -> tuple[float, float, float, float]:
    """(f0, f1, m0, m1) of the decode step on `device`, from batch sizes 1 and 64."""
    p1, p64 = _many([("decode", 1, CONTEXT), ("decode", 64, CONTEXT), ("prefill", 4, 512)])[:2]
    a1, a64 = fa.classify_profile(p1, device), fa.classify_profile(p64, device)
    f1 = (a64.flops - a1.flops) / 63
    m1 = (a64.bytes - a1.bytes) / 63
    return a1.flops - f1, f1, a1.bytes - m1, m1


def _boundary(device: str) -> float:
    f0, f1, m0, m1 = _line(device)
    ridge = fa.get_device(device).ridge
    assert f1 > ridge * m1, "decode never turns compute-bound at this context length"
    return (ridge * m0 - f0) / (f1 - ridge * m1)


def _first_principles() -> dict[str, float]:
    cfg = QWEN
    embed = cfg.vocab * cfg.hidden
    return {
        "f1": 2 * (cfg.param_count() - embed) + 4 * CONTEXT * cfg.heads * cfg.head_dim * cfg.layers,
        "m0": 2 * (cfg.param_count() - embed),
        "kv_per_seq": CONTEXT * cfg.kv_bytes_per_token(),
    }


def test_qwen_shapes_prefill_is_compute_bound() -> None:
    p = _profile("prefill", 4, 512)
    assert _phase(p, "h200") == "prefill", fa.classify_profile(p, "h200")
    assert _phase(p, "ascend910c") == "prefill"
    assert p["gemv_dot_count"] <= 1  # only the last-token LM head


def test_qwen_shapes_decode_coefficients_match_first_principles() -> None:
    theory = _first_principles()
    f0, f1, m0, m1 = _line("h200")
    assert f1 == pytest.approx(theory["f1"], rel=0.02)
    assert m0 == pytest.approx(theory["m0"], rel=0.02)
    assert abs(f0) < 0.01 * f1
    assert theory["kv_per_seq"] <= m1 <= 5 * theory["kv_per_seq"]
    small = _profile("decode", 1)
    assert _phase(small, "h200") == "decode" and _phase(small, "ascend910c") == "decode"
    assert small["state_append_count"] == 2 * QWEN.layers
    assert small["gemv_dot_count"] == small["dot_count"]


def _report(device: str, boundary: float) -> str:
    theory = _first_principles()
    ridge = fa.get_device(device).ridge
    kv_only = ridge * theory["m0"] / (theory["f1"] - ridge * theory["kv_per_seq"])
    return (
        f"{device}: ridge {ridge:.1f} FLOP/B, decode turns compute-bound at batch "
        f"{boundary:.0f} (analysis), {kv_only:.0f} (KV-only roofline)"
    )


def test_qwen_shapes_decode_boundary_h200_and_910c(capsys: Any) -> None:
    b_h200, b_910c = _boundary("h200"), _boundary("ascend910c")
    with capsys.disabled():
        print("\n" + _report("h200", b_h200) + "\n" + _report("ascend910c", b_910c))
    assert 64 < b_h200 < b_910c  # 910C's ridge (235) is above H200's (206)
    assert 1.2 * b_h200 < b_910c
    below, between, above = _many(
        [
            ("decode", int(0.8 * b_h200), CONTEXT),
            ("decode", math.ceil(1.2 * b_h200), CONTEXT),
            ("decode", math.ceil(1.2 * b_910c), CONTEXT),
        ]
    )
    assert _phase(below, "h200") == "decode" and _phase(below, "ascend910c") == "decode"
    # Between the two boundaries the devices disagree: compute-bound on H200 only.
    assert _phase(between, "h200") == "prefill" and _phase(between, "ascend910c") == "decode"
    assert _phase(above, "h200") == "prefill" and _phase(above, "ascend910c") == "prefill"
