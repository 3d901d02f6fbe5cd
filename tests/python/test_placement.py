"""The placement core through its Python API (flexnpu.placement): policies, a prefill burst
under `dynamic`, run-time switching, observability counters and errors. Fake clock throughout;
the scripted-workload tests of the C++ core are in tests/cpp/placement_core_test.cc."""

from __future__ import annotations

import pytest

from flexnpu import placement as fp

MS = 1_000_000
# 1e14 FLOP/s, 1 TB/s, 10 GB/s link: 20 MB of KV cache moves in 2 ms.
MODEL = fp.DeviceModel(peak_flops=1e14, bandwidth_bytes_per_s=1e12, link_bytes_per_s=1e10)
DECODE = fp.Profile("decode", flops=1e9, bytes=2e9)  # 2 ms
PREFILL = fp.Profile("prefill", flops=5e12, bytes=2e9)  # 50 ms
KV = 20_000_000


def make(policy: str, devices: int = 4, **kw) -> fp.Core:
    return fp.Core(policy, [MODEL] * devices, **kw)


def test_parse_policy_and_errors() -> None:
    spec = fp.parse_policy("static-pd:prefill=0-1|decode=2,3", 4)
    assert spec.kind == "static-pd"
    assert spec.prefill_pool == (0, 1) and spec.decode_pool == (2, 3)
    assert spec.text == "static-pd:prefill=0,1;decode=2,3"
    for bad, message in [
        ("dynamo", "unknown placement policy 'dynamo'"),
        ("static-pd:prefill=0,1;decode=1,2", "device 1 is in both"),
        ("static-pd:prefill=0;decode=7", "device 7 does not exist"),
        ("static-pd:prefill=0", "decode pool is missing"),
        ("dynamic:x=1", "takes no parameters"),
    ]:
        with pytest.raises(ValueError, match=message):
            fp.parse_policy(bad, 4)


def test_passthrough_is_identity_modulo_p() -> None:
    core = make("passthrough", 4, num_virtual_devices=9)
    for v in range(9):
        for profile in (PREFILL, DECODE):
            d = core.place(v, profile, now_ns=v, inputs=[((v + 1) % 4, KV)])
            assert (d.physical_device, d.reason) == (v % 4, "passthrough")


def test_static_pd_keeps_phases_in_their_pools() -> None:
    core = make("static-pd:prefill=0,1;decode=2,3", num_virtual_devices=8)
    now = 0
    for i in range(64):
        v = i % 8
        profile = PREFILL if i % 3 == 0 else DECODE
        d = core.place(v, profile, now_ns=now, inputs=[(i % 4, KV)])
        assert d.physical_device in ((0, 1) if profile is PREFILL else (2, 3))
        now += MS
        core.on_finish(d.ticket, now)


def test_dynamic_prefill_burst_moves_decode_and_returns_it() -> None:
    core = make("dynamic")
    now, kv_at = 0, 0
    # Steady decode at home.
    for _ in range(5):
        d = core.place(0, DECODE, now_ns=now, inputs=[(kv_at, KV)], executable_id=1)
        assert (d.physical_device, d.reason) == (0, "affinity")
        now = d.predicted_finish_ns
        core.on_finish(d.ticket, now)
    # A burst pinned to device 0 by 4 GB of inputs there (400 ms to move elsewhere).
    burst = [
        core.place(0, PREFILL, now_ns=now, inputs=[(0, 4 << 30)], executable_id=2)
        for _ in range(4)
    ]
    assert {b.physical_device for b in burst} == {0}
    d = core.place(0, DECODE, now_ns=now, inputs=[(kv_at, KV)], executable_id=1)
    assert d.physical_device != 0 and d.reason == "idle_steal"
    assert d.predicted_finish_ns - now <= 5 * MS  # not 200 ms behind the burst
    kv_at = d.physical_device
    core.on_finish(d.ticket, d.predicted_finish_ns)
    stats = core.stats(now)
    assert stats["physical"][0]["prefill_outstanding"] == 4
    assert stats["virtual"][0]["decisions"]["idle_steal"] == 1
    # The burst passes; after the dwell time the decode goes home.
    end = max(b.predicted_finish_ns for b in burst)
    for b in burst:
        core.on_finish(b.ticket, end)
    now = end + 30 * MS
    d = core.place(0, DECODE, now_ns=now, inputs=[(kv_at, KV)], executable_id=1)
    assert (d.physical_device, d.reason) == (0, "return_home")
    assert d.migrate_bytes == KV


def test_errors_are_avoided_and_counted() -> None:
    core = make("dynamic", error_quarantine_ns=100 * MS)
    d = core.place(1, DECODE, now_ns=0, inputs=[(1, KV)])
    assert d.physical_device == 1
    core.on_finish(d.ticket, 2 * MS, ok=False)
    d = core.place(1, DECODE, now_ns=3 * MS, inputs=[(1, KV)])
    assert d.physical_device != 1 and d.reason == "avoid_failed"
    stats = core.stats(3 * MS)
    assert stats["physical"][1]["errors"] == 1 and stats["physical"][1]["quarantined"]


def test_policy_switch_at_run_time_and_stats() -> None:
    core = make("passthrough")
    a = core.place(1, PREFILL, now_ns=0)
    core.set_policy("static-pd:prefill=2,3|decode=0,1")
    assert core.policy == "static-pd:prefill=2,3;decode=0,1"
    b = core.place(1, PREFILL, now_ns=1)
    assert b.physical_device in (2, 3) and b.reason == "pool"
    with pytest.raises(ValueError, match="unknown placement policy"):
        core.set_policy("fastest")
    assert core.policy.startswith("static-pd")
    core.on_finish(a.ticket, 10 * MS)
    with pytest.raises(KeyError):
        core.on_finish(a.ticket, 10 * MS)
    stats = core.stats(20 * MS)
    assert stats["policy"] == core.policy and stats["policy_switches"] == 1
    assert stats["decode_pool"] == [0, 1]
    p1 = stats["physical"][1]
    assert p1["executions"]["prefill"] == 1 and p1["decisions"]["passthrough"] == 1
    assert p1["busy_ns"] > 0 and 0 < p1["busy_fraction"] <= 1
    assert set(stats["physical"][0]["decisions"]) == set(fp.REASONS)
    assert stats["virtual"][1]["queue_length"] == 1  # b is still outstanding


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown placement tuning option 'hysteresis'"):
        make("dynamic", hysteresis=1)
    with pytest.raises(ValueError, match="virtual device 4 does not exist"):
        make("dynamic").place(4, DECODE, now_ns=0)
    with pytest.raises(ValueError, match="unknown phase"):
        fp.Profile("train")
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        fp.Core("dynamic", [fp.DeviceModel(peak_flops=1e12, bandwidth_bytes_per_s=0)])


def test_bench_loop_runs() -> None:
    r = make("dynamic", 8).bench(500, warmup=100)
    assert len(r["samples_ns"]) == 500 and min(r["samples_ns"]) > 0
