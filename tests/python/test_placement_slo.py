"""SLO-aware admission through the bindings (tpot_slo_ns, stall_bank_steps): a prefill starts
in front of a device's active decode stream only while the stream's stall budget covers it."""

from __future__ import annotations

import pytest

from flexnpu import placement as fp

MS = 1_000_000
# 1e12 FLOP/s, 100 GB/s, FIFO: a decode step 10 ms, a prefill 100 ms, the busy one 1 s.
MODEL = fp.DeviceModel(peak_flops=1e12, bandwidth_bytes_per_s=1e11, link_bytes_per_s=1e10)
DECODE = fp.Profile("decode", flops=1e6, bytes=1e9)
PREFILL = fp.Profile("prefill", flops=1e11, bytes=1e6)
HUGE = fp.Profile("prefill", flops=1e12, bytes=1e6)


def _prefill_devices(**tuning: float) -> list[int]:
    """v0 (prefill instance, home 0) keeps device 0 busy for 1 s; v1 decodes five 10 ms steps
    on device 1; at 50 ms three 100 ms prefills of a long prompt queue (weight 100)."""
    core = fp.Core("dynamic", [MODEL] * 2, num_virtual_devices=2, **tuning)
    assert core.place(0, HUGE, now_ns=0, executable_id=1).physical_device == 0
    for i in range(5):
        t = i * 10 * MS
        d = core.place(1, DECODE, now_ns=t, inputs=[(1, 1 << 20)], weight=1, executable_id=2)
        assert d.physical_device == 1
        core.on_start(d.ticket, t)
        core.on_finish(d.ticket, t + 10 * MS)
    return [core.place(0, PREFILL, now_ns=50 * MS, weight=100, executable_id=3).physical_device
            for _ in range(3)]


@pytest.mark.parametrize("tuning,devices", [
    ({}, [1, 1, 1]),                                           # off: the ratio penalty only
    ({"tpot_slo_ns": 50 * MS}, [1, 1, 0]),                     # 200 ms banked: two fit
    ({"tpot_slo_ns": 50 * MS, "stall_bank_steps": 2}, [1, 0, 0]),  # capped at 100 ms: one
])
def test_prefills_in_front_of_decode_stay_within_the_stall_budget(tuning, devices):
    assert _prefill_devices(**tuning) == devices


@pytest.mark.parametrize("key,value", [("tpot_slo_ns", -1), ("stall_bank_steps", -0.5)])
def test_negative_slo_settings_are_rejected_by_name(key, value):
    with pytest.raises(ValueError, match=f"{key} < 0"):
        fp.Core("dynamic", [MODEL] * 2, **{key: value})
