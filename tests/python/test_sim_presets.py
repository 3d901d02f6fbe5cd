"""The simulator and the emulated backend read one preset table (xla_passes/roofline.cc) and
one step-time model (xla_passes::ModelledSeconds)."""

from __future__ import annotations

import pytest

from flexnpu._native_loader import native
from flexnpu.analysis import get_device, preset_table
from flexnpu.sim.hardware import (
    LINKS,
    PRESETS,
    StepTimer,
    fit_cloudmatrix,
    fit_vidur,
    get_preset,
)
from flexnpu.sim.models import get_model

EMULATED = ("910b", "910c", "h100", "h200", "a100")


def test_table_efficiencies_are_the_published_fits() -> None:
    table = preset_table()
    ec, em = fit_cloudmatrix(get_device("ascend910c"))
    for name in ("ascend910b", "ascend910c"):
        assert table[name]["eff_compute"] == pytest.approx(ec, rel=1e-12)
        assert table[name]["eff_memory"] == pytest.approx(em, rel=1e-12)
    for name, gpu in (("h100", "h100"), ("h200", "h100"), ("a100", "a100")):
        ec, em = fit_vidur(get_device(gpu), gpu)
        assert table[name]["eff_compute"] == pytest.approx(ec, rel=1e-12), name
        assert table[name]["eff_memory"] == pytest.approx(em, rel=1e-12), name


@pytest.mark.parametrize("name", EMULATED)
def test_presets_come_from_the_table(name: str) -> None:
    p = get_preset(name)
    row = preset_table()[p.device.name]
    assert p.memory_bytes == row["memory_bytes"] > 0
    assert p.link == row["link"] and p.link in LINKS
    assert (p.eff_compute, p.eff_memory) == (row["eff_compute"], row["eff_memory"])
    assert p.efficiency_source == row["efficiency_source"]


@pytest.mark.parametrize("name", EMULATED)
@pytest.mark.parametrize("flops,nbytes", [(0.0, 0.0), (3.5e13, 1.5e10), (2e9, 1.6e10), (1e15, 1e9)])
def test_step_time_is_the_modelled_seconds(name: str, flops: float, nbytes: float) -> None:
    timer = StepTimer.create(get_model("qwen2.5-7b"), get_preset(name), 1)
    expected = native("modelled_seconds", "the step-time model").modelled_seconds(
        get_preset(name).device.name, flops, nbytes
    )
    assert timer.seconds(flops, nbytes) == pytest.approx(expected, rel=1e-12)


def test_unknown_preset_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown device 'tpu'.*910c"):
        get_preset("tpu")
    assert set(EMULATED) < set(PRESETS)
