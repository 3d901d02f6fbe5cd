"""The pure parts of bench/daemon_tenants.py: the out-of-phase bursty workload and the table."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench import daemon_tenants as bench
from bench.serving import Result


def _args(**kw: object) -> argparse.Namespace:
    base = dict(seed=3, requests=40, burst_rate=2.0, burstiness=0.5, period_s=8.0,
                prompt_len=(16, 48), output_len=(16, 32))
    return argparse.Namespace(**{**base, **kw})


def test_arrivals_fall_in_the_tenants_half_of_each_period() -> None:
    for phase in (0, 1):
        times = np.asarray(bench.burst_arrivals(500, 3.0, 0.5, 6.0, phase,
                                                np.random.default_rng(1)))
        assert len(times) == 500
        assert np.all(np.diff(times) >= 0)
        in_period = times % 6.0
        assert np.all((in_period >= 3.0 * phase) & (in_period < 3.0 * (phase + 1)))


def test_arrivals_keep_the_gamma_gaps_over_active_time() -> None:
    rng = np.random.default_rng(5)
    times = np.asarray(bench.burst_arrivals(20000, 4.0, 0.5, 10.0, 0, rng))
    # Removing the quiet halves gives back the active-time gaps: mean 1/rate, Gamma(0.5)'s
    # coefficient of variation 1/sqrt(0.5) ~ 1.41 (bursty; Poisson would be 1).
    windows = np.floor(times / 10.0)
    active = times - windows * 5.0
    gaps = np.diff(np.concatenate([[0.0], active]))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2 ** 0.5, rel=0.08)


def test_bad_arrival_parameters_are_named() -> None:
    with pytest.raises(ValueError, match=r"phase 0 or 1 .*phase=2"):
        bench.burst_arrivals(3, 1.0, 0.5, 4.0, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"rate > 0.*rate=0"):
        bench.burst_arrivals(3, 0, 0.5, 4.0, 0, np.random.default_rng(0))


def test_workload_is_seeded_out_of_phase_and_within_the_length_ranges() -> None:
    first, again, other = (bench.workload(_args()), bench.workload(_args()),
                           bench.workload(_args(seed=4)))
    assert first == again
    assert first != other
    assert [r.arrival_s for r in first] == sorted(r.arrival_s for r in first)
    for tenant, phase in (("a", 0), ("b", 1)):
        mine = [r for r in first if r.tenant == tenant]
        assert len(mine) == 40
        assert all(4.0 * phase <= r.arrival_s % 8.0 < 4.0 * (phase + 1) for r in mine)
        assert all(16 <= r.output_tokens <= 32 for r in mine)
        assert all(15 <= len(r.prompt.split()) <= 47 for r in mine)


def _result(ttft: float, latency: float, tokens: int, ok: bool = True) -> Result:
    return Result(ok=ok, output_tokens=tokens, ttft=ttft, latency=latency)


def test_percentiles_and_table() -> None:
    # TPOT of each: (latency - ttft) / (tokens - 1) = 10 ms, 20 ms.
    shared = [_result(0.1, 0.1 + 0.01 * 9, 10), _result(0.3, 0.3 + 0.02 * 9, 10),
              _result(0, 0, 0, ok=False)]
    dedicated = [_result(0.1, 0.1 + 0.01 * 4, 5), _result(0.1, 0.1 + 0.01 * 4, 5)]
    s, d = bench.percentiles(shared), bench.percentiles(dedicated)
    assert (s["completed"], s["failed"]) == (2, 1)
    assert s["ttft_p50_ms"] == pytest.approx(200.0)
    assert s["ttft_p90_ms"] == pytest.approx(280.0)
    assert s["tpot_p50_ms"] == pytest.approx(15.0)
    assert d["tpot_p90_ms"] == pytest.approx(10.0)
    summary = {"shared": {"a": s, "b": d}, "dedicated": {"a": d, "b": d}}
    lines = bench.table(summary).splitlines()
    assert "| a | TTFT P50 | 200.0 | 100.0 | 2.00 |" in lines
    assert "| a | TPOT P50 | 15.0 | 10.0 | 1.50 |" in lines
    assert "| b | TTFT P90 | 100.0 | 100.0 | 1.00 |" in lines
    assert "| a | completed/failed | 2/1 | 2/0 | |" in lines
    assert len(lines) == 2 + 8 + 2


def test_percentiles_of_no_successes_are_nan() -> None:
    p = bench.percentiles([_result(0, 0, 0, ok=False)])
    assert (p["completed"], p["failed"]) == (0, 1)
    assert np.isnan(p["ttft_p50_ms"]) and np.isnan(p["tpot_p90_ms"])
