"""Simulator model shapes and the HLO-derived step cost model."""

from __future__ import annotations

import pytest

from flexnpu.sim.hardware import get_preset
from flexnpu.sim.models import get_model
from flexnpu.sim.steptime import CostModel, step_features


def test_kv_bytes_per_token_match_the_published_shapes():
    assert get_model("deepseek-r1").kv_bytes_per_token == 70_272  # MLA 512 + 64, 61 layers
    assert get_model("qwen2.5-7b").kv_bytes_per_token == 57_344
    assert get_model("llama-3-8b").kv_bytes_per_token == 131_072


@pytest.mark.parametrize("name,gflop_per_token", [("qwen2.5-7b", 14.1), ("deepseek-r1", 74.0)])
def test_decode_flops_per_token_match_the_parameter_count(name, gflop_per_token):
    cm = CostModel.load(name)
    # Short context: the matmuls (2 x active parameters) dominate; the LM head adds ~2 GFLOP.
    f, _ = cm.flops_bytes(step_features(cm.model, [(0, 1, True)] * 256), fused_attention=True)
    assert f / 256 / 1e9 == pytest.approx(gflop_per_token, rel=0.15)


@pytest.mark.parametrize("name", ["qwen2.5-7b", "llama-3-8b", "smollm2-135m", "deepseek-r1"])
def test_cost_model_fits_its_table(name):
    cm = CostModel.load(name)
    assert cm.fit_error < 0.25


def test_decode_reads_the_weights_once_per_step():
    cm = CostModel.load("qwen2.5-7b")
    _, b1 = cm.flops_bytes(step_features(cm.model, [(10, 1, True)]), fused_attention=True)
    _, b8 = cm.flops_bytes(step_features(cm.model, [(10, 1, True)] * 8), fused_attention=True)
    weights = 7.6e9 * 2
    assert b1 == pytest.approx(weights, rel=0.1)
    assert b8 - b1 < 0.02 * weights  # activations and KV only


def test_moe_touches_fewer_experts_at_small_batches():
    m = get_model("deepseek-r1")
    assert m.experts_touched(1) == pytest.approx(8)
    assert m.experts_touched(4096) == pytest.approx(256, rel=1e-6)


def test_presets_and_errors():
    p = get_preset("910c")
    assert 0 < p.eff_compute <= 1 and 0 < p.eff_memory <= 1
    assert "CloudMatrix" in p.efficiency_source
    for gpu in ("a100", "h100", "h200"):
        g = get_preset(gpu)
        assert 0.5 < g.eff_compute <= 1 and 0.5 < g.eff_memory <= 1
        assert "Vidur" in g.efficiency_source
    assert "not measured on H200" in get_preset("h200").efficiency_source
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        get_preset("tpu")
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        get_model("gpt")


@pytest.mark.parametrize("entries", [
    [(100, 1, True)] * 7,                                  # decode-only (the summed fast path)
    [(0, 512, True), (37, 1, True), (12, 300, False)],     # prompt chunks and a decode
    [(5, 1, True), (0, 0, False), (9, 2, True)],           # n == len but not all single
    [],
])
def test_step_cost_from_scheduler_entries_equals_the_feature_model(entries):
    from flexnpu.serving.scheduler import ScheduledSeq
    from flexnpu.sim.hardware import StepTimer

    timer = StepTimer.create(get_model("deepseek-r1"), get_preset("910c"), 16)
    scheduled = [ScheduledSeq(None, st, num, samples) for st, num, samples in entries]
    want = timer.flops_bytes(step_features(timer.model, entries))
    assert timer.step_cost(scheduled) == pytest.approx(want, rel=1e-12)
