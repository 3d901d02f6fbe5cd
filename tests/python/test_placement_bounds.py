"""Placement core bounds through the bindings: the executable corrections are an LRU, and a
decode stream does not move onto another active stream's device (move_weight) nor onto an active
prefill instance's home (prefill_role_ns)."""

from __future__ import annotations

import pytest

from flexnpu import placement as fp

DECODE = fp.Profile("decode", flops=1e9, bytes=2e9)  # 2 ms on the model below
MODEL = fp.DeviceModel(peak_flops=1e14, bandwidth_bytes_per_s=1e12, link_bytes_per_s=1e10)
MS = 1_000_000


def _predicted(core: fp.Core, exe: int, now: int) -> int:
    d = core.place(0, DECODE, now_ns=now, executable_id=exe)
    core.cancel(d.ticket)
    return d.predicted_finish_ns - d.predicted_start_ns


def test_executable_corrections_are_bounded():
    core = fp.Core("dynamic", [MODEL] * 2, max_executables=8)
    now = 0
    for _ in range(40):  # executable 1 really takes 3x the roofline
        d = core.place(0, DECODE, now_ns=now, executable_id=1)
        core.on_start(d.ticket, now)
        now += 6 * MS
        core.on_finish(d.ticket, now)
    assert _predicted(core, 1, now) == pytest.approx(6 * MS, rel=0.05)
    for exe in range(100, 1100):  # a thousand compiles later
        d = core.place(0, DECODE, now_ns=now, executable_id=exe)
        now += 2 * MS
        core.on_finish(d.ticket, now)
    assert core.stats(now)["executables"] == 8
    assert _predicted(core, 1, now) < 4 * MS  # forgotten: back to the (device-corrected) model
    core.forget_executable(1)
    assert core.stats(now)["executables"] == 7
    with pytest.raises(KeyError, match="executable 1 has no correction to forget"):
        core.forget_executable(1)
    with pytest.raises(ValueError, match="max_executables"):
        fp.Core("dynamic", [MODEL], max_executables=0)
    with pytest.raises(ValueError, match="unknown placement tuning option 'max_execs'"):
        fp.Core("dynamic", [MODEL], max_execs=3)


@pytest.mark.parametrize("weight,moves", [(1.0, False), (0.0, True)])
def test_decode_does_not_move_onto_another_active_stream(weight, moves):
    core = fp.Core("dynamic", [MODEL] * 2, move_weight=weight)
    kv = 20_000_000
    now = 0
    # Two streams at home on 0 and 1, one step each every 2 ms.
    for _ in range(5):
        for v in (0, 1):
            d = core.place(v, DECODE, now_ns=now, inputs=[(v, kv)], executable_id=10 + v)
            core.on_finish(d.ticket, now + 2 * MS)
        now += 2 * MS
    # A prefill whose 4 GB input lives on 0 takes device 0 for 50 ms.
    p = core.place(0, fp.Profile("prefill", flops=5e12, bytes=2e9), now_ns=now,
                   inputs=[(0, 4 << 30)], executable_id=20)
    assert p.physical_device == 0
    d = core.place(0, DECODE, now_ns=now, inputs=[(0, kv)], executable_id=10)
    assert (d.physical_device == 1) is moves
    # Device 1 is momentarily empty between stream 1's steps: the old policy calls it a steal.
    assert d.reason == ("idle_steal" if moves else "affinity")


@pytest.mark.parametrize("role_ns,device,reason", [(100 * MS, 1, "affinity"),
                                                   (0, 0, "idle_steal")])
def test_decode_does_not_escape_onto_an_active_prefill_home(role_ns, device, reason):
    # 1e12 FLOP/s, 100 GB/s: v1 decodes (1 ms) on its home, device 1. At 1 ms v0 (a prefill
    # instance, home 0) runs 5 ms there, v2 300 ms on device 2, and v5 (home 2) a 300 ms
    # prefill of 100 prompts on device 1. At 10 ms device 0 is idle but v0 prefilled 9 ms ago.
    model = fp.DeviceModel(peak_flops=1e12, bandwidth_bytes_per_s=1e11, link_bytes_per_s=1e10)
    core = fp.Core("dynamic", [model] * 3, num_virtual_devices=6, prefill_role_ns=role_ns)
    decode = fp.Profile("decode", flops=1e6, bytes=1e8)
    short, long = fp.Profile("prefill", 5e9, 1e6), fp.Profile("prefill", 3e11, 1e6)
    kv = [(1, 1_000_000)]
    d = core.place(1, decode, now_ns=0, inputs=kv, weight=1, executable_id=1)
    core.on_start(d.ticket, 0)
    core.on_finish(d.ticket, MS)
    a = core.place(0, short, now_ns=MS, weight=1, executable_id=2)
    b = core.place(2, long, now_ns=MS, weight=1, executable_id=3)
    c = core.place(5, long, now_ns=MS, weight=100, executable_id=3)
    assert (a.physical_device, b.physical_device, c.physical_device) == (0, 2, 1)
    core.on_start(a.ticket, MS)
    core.on_finish(a.ticket, 6 * MS)
    d = core.place(1, decode, now_ns=10 * MS, inputs=kv, weight=1, executable_id=1)
    assert (d.physical_device, d.reason) == (device, reason)


def test_negative_prefill_role_window_is_rejected():
    with pytest.raises(ValueError, match="durations must be >= 0"):
        fp.Core("dynamic", [MODEL] * 2, prefill_role_ns=-1)
