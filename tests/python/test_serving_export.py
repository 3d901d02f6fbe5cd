"""`--export` / `--from-export`: the prefill, insert and decode steps as jax.export artifacts with
the weights, served without the model code; the same artifacts give the same tokens on
`JAX_PLATFORMS=cpu` and on `JAX_PLATFORMS=flexnpu` (fresh interpreters) as the model code."""

from __future__ import annotations

import json

import pytest
from _subprocess import run_python

PROMPTS = [[5, 6, 7, 8], list(range(10, 30)), [100] * 9]
SERVE = """
import json, sys, jax
from flexnpu.serving import export
from flexnpu.serving.engine import Engine, EngineConfig
from flexnpu.serving.sampling import SamplingParams
art = export.load({dir!r})
assert "flexnpu.serving.model" not in sys.modules, "served with the model code"
ec = EngineConfig(art.max_batch, art.max_seq_len, art.buckets)
eng = Engine(art.steps, art.params, ec, devices=jax.devices()[:1])
eng.warmup(); eng.start()
sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
outs = [eng.generate(p, sp)[0] for p in {prompts!r}]
eng.stop()
print("RESULT", json.dumps({{"platform": jax.devices()[0].platform, "outs": outs}}))
"""


def test_export_served_unchanged_on_cpu_and_flexnpu(tmp_path, npu_devices) -> None:
    from flexnpu.serving import export
    from flexnpu.serving.engine import Engine, EngineConfig, ModelSteps
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.sampling import SamplingParams

    m = load_model("random:tiny", seed=5, log=lambda *_: None)
    ec = EngineConfig(max_batch=2, max_seq_len=64, buckets=[16, 32])
    files = export.export(m, str(tmp_path), ec)
    assert sorted(files) == ["decode.bin", "insert_16.bin", "insert_32.bin", "prefill_16.bin",
                             "prefill_32.bin"]
    eng = Engine(ModelSteps(m.config), m.params, ec, devices=npu_devices[:1])
    eng.start()
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    want = [eng.generate(p, sp)[0] for p in PROMPTS]
    eng.stop()
    code = SERVE.format(dir=str(tmp_path), prompts=PROMPTS)
    for platform in ("cpu", "flexnpu"):
        proc = run_python(code, env={"JAX_PLATFORMS": platform}, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        got = json.loads(line[7:])
        assert got["platform"] == platform
        assert got["outs"] == want, platform


def test_from_export_rejects_other_directories(tmp_path) -> None:
    from flexnpu.serving import export

    (tmp_path / "manifest.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a flexnpu-serving-export"):
        export.load(str(tmp_path))
