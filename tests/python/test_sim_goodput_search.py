"""The goodput search (--goodput-search): static-PD's split is tuned at every rate it tries, and
a trace fills the search's duration at every rate instead of shrinking into a burst."""

from __future__ import annotations

import numpy as np
import pytest

from flexnpu.sim.experiments import SimSpec, search_goodput, tune_prefill_units
from flexnpu.sim.workload import load_trace, make_workload

# 4 x H100, Qwen2.5-7B, ShareGPT: at 8 req/s the tuner picks 1P:3D (every split meets the
# SLOs; 1P:3D has the most tok/s), at 400 req/s 1P:3D misses them and 2P:2D meets them.
SMALL = dict(
    devices=4,
    device="h100",
    model="qwen2.5-7b",
    workload="sharegpt",
    rate=8.0,
    duration=4.0,
    search_duration=4.0,
    seeds=1,
    max_prompt=1024,
    max_output=256,
)


def _trace(tmp_path, n: int = 10):
    path = tmp_path / "t.csv"
    rows = [f"{i * 0.9:.1f},{100 + i},{10 + i}" for i in range(n)]  # 10 requests over 8.1 s
    path.write_text("timestamp,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def test_trace_is_repeated_to_fill_the_duration_at_the_rate(tmp_path):
    path = _trace(tmp_path)
    for rate in (10.0, 20.0, 40.0):
        wl = load_trace(path, rate=rate, duration=5.0, max_prompt=10_000, max_output=10_000)
        # rate x duration requests, spread over the whole window (not a 10-request burst).
        assert len(wl) == int(rate * 5.0)
        assert wl.duration == 5.0
        assert wl.arrivals[-1] == pytest.approx(5.0 - 1.0 / rate)
        assert np.all(np.diff(wl.arrivals) == pytest.approx(1.0 / rate))
        # Every pass replays the trace's requests in order.
        assert wl.prompt_tokens.tolist() == [100 + i % 10 for i in range(len(wl))]
        assert wl.output_tokens.tolist() == [10 + i % 10 for i in range(len(wl))]
    # Through make_workload, as the search calls it.
    wl = make_workload("trace", 40.0, 5.0, 0, max_prompt=10_000, max_output=10_000, trace=str(path))
    assert len(wl) == 200


def test_trace_keeps_its_own_times_without_a_rate(tmp_path):
    path = _trace(tmp_path)
    wl = load_trace(path, duration=4.0, max_prompt=10_000, max_output=10_000)
    assert wl.arrivals.tolist() == pytest.approx([0.0, 0.9, 1.8, 2.7, 3.6])  # cut
    wl = load_trace(path, duration=12.0, max_prompt=10_000, max_output=10_000)
    assert len(wl) == 10 and wl.duration == 12.0  # replayed once, as recorded


def test_search_tunes_the_static_pd_split_at_every_rate_it_tries():
    spec = SimSpec(**SMALL).resolved()
    split_at_rate, _ = tune_prefill_units(spec, "static-pd", lambda s: None)
    assert split_at_rate == 1
    fixed, fixed_curve = search_goodput(spec, "static-pd", split_at_rate, lambda s: None)
    tuned, curve = search_goodput(spec, "static-pd", split_at_rate, lambda s: None, tune_split=True)
    # Each rate ran with the split the tuner picks at that rate ...
    for point in curve:
        best, _ = tune_prefill_units(spec, "static-pd", lambda s: None, rate=point["rate"])
        assert point["prefill_units"] == best, point
    # ... which is not the one tuned at --rate near saturation, and scores higher there.
    assert {p["prefill_units"] for p in curve} > {1}
    assert all("prefill_units" not in p for p in fixed_curve)
    assert tuned > 1.2 * fixed, (tuned, fixed)


def test_split_objective_is_checked_and_throughput_picks_by_tokens():
    with pytest.raises(ValueError, match="--split-objective must be one of goodput, throughput"):
        SimSpec(**SMALL, split_objective="latency").resolved()
    spec = SimSpec(**SMALL, split_objective="throughput").resolved()
    best, curve = tune_prefill_units(spec, "static-pd", lambda s: None, rate=200.0)
    assert best == max(curve, key=lambda c: c["throughput_tok_s"])["prefill_units"]
