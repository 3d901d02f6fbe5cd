"""`--export` / `--from-export`: the engine's paged steps (per chunk bucket) and KV handoff
programs as jax.export artifacts with the weights, served without the model code; the same
artifacts give the same tokens on `JAX_PLATFORMS=cpu` and on `JAX_PLATFORMS=flexnpu` (fresh
interpreters, co-located and split layouts) as the model code."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from _subprocess import run_python

PROMPTS = [[5, 6, 7, 8], list(range(10, 50)), [100] * 9]
SERVE = """
import json, sys, jax
from flexnpu.serving import export
from flexnpu.serving.engine import Engine
from flexnpu.serving.sampling import SamplingParams
art = export.load({dir!r})
assert "flexnpu.serving.model" not in sys.modules, "served with the model code"
sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
outs = {{}}
for layout in ("colocated", "split"):
    ec = art.engine_config(layout=layout, num_devices=1)
    eng = Engine(art.steps, art.params, ec, devices=jax.devices()[:2])
    eng.start()
    outs[layout] = [eng.generate(p, sp)[0] for p in {prompts!r}]
    eng.stop()
print("RESULT", json.dumps({{"platform": jax.devices()[0].platform, "outs": outs}}))
"""


def test_export_served_unchanged_on_cpu_and_flexnpu(tmp_path, npu_devices) -> None:
    from flexnpu.serving import export
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps
    from flexnpu.serving.sampling import SamplingParams

    m = load_model("random:tiny", seed=5, log=lambda *_: None)
    ec = EngineConfig(max_num_seqs=2, max_model_len=64, max_num_batched_tokens=32,
                      block_size=16, chunk_buckets=[16, 32], num_devices=1)
    files = export.export(m, str(tmp_path), ec)
    assert sorted(files) == ["extract_1.bin", "extract_2.bin", "extract_4.bin", "insert_1.bin",
                             "insert_2.bin", "insert_4.bin", "step_0_1.bin", "step_0_4.bin",
                             "step_16_4.bin", "step_32_4.bin"]
    # as `serve` runs it: sampling kept to the byte tokenizer's ids (the export carries that)
    eng = Engine(ModelSteps(m.config, ec.block_size, m.vocab_limit), m.params, ec,
                 devices=npu_devices[:1])
    eng.start()
    sp = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    want = [eng.generate(p, sp)[0] for p in PROMPTS]
    eng.stop()
    code = SERVE.format(dir=str(tmp_path), prompts=PROMPTS)

    platforms = ("cpu", "flexnpu")

    def serve_on(platform: str):
        env = {"JAX_PLATFORMS": platform, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
        return run_python(code, env=env, timeout=240)

    # Two independent interpreters, each compiling and serving on mostly one core: side by side.
    with ThreadPoolExecutor(len(platforms)) as pool:
        runs = list(pool.map(serve_on, platforms))
    for platform, proc in zip(platforms, runs, strict=True):
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        got = json.loads(line[7:])
        assert got["platform"] == platform
        assert got["outs"] == {"colocated": want, "split": want}, platform


def test_from_export_rejects_other_directories(tmp_path) -> None:
    from flexnpu.serving import export

    # /2: written before the step took suppressed ids (min_tokens)
    (tmp_path / "manifest.json").write_text('{"format": "flexnpu-serving-export/2"}')
    with pytest.raises(ValueError, match="not a flexnpu-serving-export/3 directory"):
        export.load(str(tmp_path))


def test_exported_shapes_cannot_be_overridden() -> None:
    from flexnpu.serving.export import Artifacts

    art = Artifacts(None, {}, None, "m", None, {"max_num_seqs": 2, "block_size": 16})
    assert art.engine_config(layout="split").max_num_seqs == 2
    with pytest.raises(ValueError, match=r"\['block_size'\] are fixed by the export"):
        art.engine_config(block_size=8)
