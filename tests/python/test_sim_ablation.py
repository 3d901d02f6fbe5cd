"""Issue 25's ablation harness: its workloads (Gamma bursts by CV, phase-shift with a phase
length, long-output), every policy deterministic for a seed, the goodput search's bracketing
and bench.ablation's merge of old variant names."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from bench import ablation
from flexnpu.__main__ import main as flexnpu_main
from flexnpu.sim.experiments import SimSpec, search_goodput, simulate_once, tune_prefill_units
from flexnpu.sim.workload import make_workload, parse_workload, workload_cycle_s

LIMITS = dict(max_prompt=4096, max_output=8192)
# 4 x H100, Qwen2.5-7B: small enough for a second per run.
SMALL = dict(
    devices=4,
    device="h100",
    model="qwen2.5-7b",
    duration=2.0,
    seeds=1,
    max_prompt=1024,
    max_output=512,
)


def test_phase_shift_alternates_phases_of_the_given_length():
    wl = make_workload("phase-shift:5", 400.0, 20.0, 0, **LIMITS)
    phase = (wl.arrivals // 5).astype(int)
    for k in range(4):
        p = np.median(wl.prompt_tokens[phase == k])
        o = np.median(wl.output_tokens[phase == k])
        if k % 2 == 0:  # prompt-heavy: medians 1000 / 60
            assert 850 < p < 1150 and 50 < o < 70, (k, p, o)
        else:  # output-heavy: medians 120 / 600
            assert 100 < p < 140 and 520 < o < 680, (k, p, o)
    # Without a length: two halves, as before.
    a = make_workload("phase-shift", 400.0, 20.0, 0, **LIMITS)
    assert np.median(a.prompt_tokens[a.arrivals < 10]) > 850
    assert np.median(a.prompt_tokens[a.arrivals >= 10]) < 140
    assert workload_cycle_s("phase-shift:5", 60.0) == 10.0
    assert workload_cycle_s("phase-shift:60", 60.0) == 60.0  # never longer than the run
    assert workload_cycle_s("sharegpt", 60.0) == 0.0


@pytest.mark.parametrize("cv", [1.0, 2.0, 4.0])
def test_burst_gaps_have_the_named_coefficient_of_variation(cv):
    wl = make_workload(f"burst:{cv:g}", 2000.0, 20.0, 3, **LIMITS)
    gaps = np.diff(wl.arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert len(wl) == pytest.approx(40_000, rel=0.05)
    # burst:2 is the default burstiness (Gamma shape 0.25) under its CV's name.
    same = make_workload("burst", 2000.0, 20.0, 3, burstiness=0.25, **LIMITS)
    if cv == 2.0:
        assert np.array_equal(same.arrivals, wl.arrivals)


def test_long_output_has_short_prompts_and_long_outputs():
    wl = make_workload("long-output", 200.0, 20.0, 0, **LIMITS)
    assert np.median(wl.prompt_tokens) == pytest.approx(200, rel=0.05)
    assert np.median(wl.output_tokens) == pytest.approx(2000, rel=0.05)
    assert np.percentile(wl.output_tokens, 90) == pytest.approx(4300, rel=0.1)


@pytest.mark.parametrize(
    "name,message",
    [
        ("phase-shift:0", "the phase length in seconds must be a number > 0, got '0'"),
        ("burst:x", "the Gamma gaps' coefficient of variation must be a number > 0, got 'x'"),
        ("sharegpt:3", "workload 'sharegpt' takes no parameter"),
        ("bursty", "unknown workload 'bursty'"),
    ],
)
def test_bad_workload_names_are_named(name, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_workload(name)
    with pytest.raises(ValueError, match="workload"):
        make_workload(name, 10.0, 1.0, 0, **LIMITS)


def test_cli_takes_a_workload_with_its_parameter(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = flexnpu_main(
        [
            "simulate",
            "--devices",
            "2",
            "--device",
            "h100",
            "--model",
            "qwen2.5-7b",
            "--workload",
            "phase-shift:1",
            "--rate",
            "20",
            "--duration",
            "2",
            "--policies",
            "chunked-colocate",
            "--seeds",
            "1",
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    assert json.loads(out.read_text())["config"]["workload"] == "phase-shift:1"
    with pytest.raises(SystemExit):
        flexnpu_main(["simulate", "--workload", "phase-shift:-1"])
    assert "phase length in seconds must be a number > 0" in capsys.readouterr().err


def _digest(spec: SimSpec, policy: str, seed: int) -> tuple:
    r = simulate_once(spec, policy, seed, prefill_units=2 if policy == "static-pd" else 0)
    per_request = tuple((q.first_token, q.finish, q.n_out, q.dropped) for q in r.requests)
    split = tuple(getattr(r, "split_timeline", ()))
    return per_request, split, r.steps, r.decisions_by_reason


@pytest.mark.parametrize(
    "workload,rate", [("burst:2", 60.0), ("phase-shift:0.5", 40.0), ("long-output", 8.0)]
)
@pytest.mark.parametrize("variant", list(ablation.VARIANTS))
def test_every_variant_is_deterministic_for_a_seed(workload, rate, variant):
    kw = {k: v for k, v in ablation.VARIANTS[variant].items() if k != "split_objective"}
    spec = SimSpec(**SMALL, workload=workload, rate=rate, **kw).resolved()
    (policy,) = spec.policies
    first = _digest(spec, policy, 1)
    assert sum(f >= 0 for _, f, _, _ in first[0]) > 0.5 * len(first[0])  # it served
    assert _digest(spec, policy, 1) == first
    assert _digest(spec, policy, 2)[0] != first[0]


def test_bracketed_search_finds_the_doubling_searchs_goodput_in_fewer_runs():
    spec = SimSpec(**SMALL, workload="sharegpt", rate=100.0).resolved()
    full, full_curve = search_goodput(spec, "chunked-colocate", 0, lambda s: None)
    for start in (0.7 * full, 1.3 * full):  # from below and from above
        s = SimSpec(**SMALL, workload="sharegpt", rate=start).resolved()
        g, curve = search_goodput(
            s, "chunked-colocate", 0, lambda s: None, bracket=1.15, bisections=2
        )
        assert len(curve) < len(full_curve)
        # Within the bracket's resolution (15% / 4) of the finer search; never above a rate
        # it saw fail.
        assert g == pytest.approx(full, rel=0.08), (start, g, full)
        assert all(p["attainment"] < 0.9 for p in curve if p["rate"] > g)


def test_local_split_tuning_finds_the_grids_split():
    spec = SimSpec(
        **(SMALL | dict(devices=8)), workload="phase-shift:1", rate=150.0, search_duration=1.0
    ).resolved()
    grid, grid_curve = tune_prefill_units(spec, "static-pd", lambda s: None)
    # The tuning run holds both phases although --search-duration is shorter than a cycle.
    assert spec.search_duration < workload_cycle_s(spec.workload, spec.duration)
    for start in (1, 7):
        local, curve = tune_prefill_units(spec, "static-pd", lambda s: None, start=start)
        assert local == grid, (start, local, grid_curve)


def test_merge_reads_the_old_variant_name(tmp_path, capsys):
    row = {"goodput_rps": 5.0, "ci95": 0.0, "per_seed": [4.0, 6.0], "split": []}
    old = {
        "args": {"devices": 4, "device": "h100", "model": "m", "duration": 2.0},
        "workloads": {"sharegpt": {"adaptive (split.h rule)": row}},
    }
    new = {
        "args": old["args"],
        "workloads": {
            "sharegpt": {"adaptive (no backlog or hysteresis)": dict(row, per_seed=[5.0])}
        },
    }
    (tmp_path / "a.json").write_text(json.dumps(old))
    (tmp_path / "b.json").write_text(json.dumps(new))
    assert ablation.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "split.h" not in out
    assert "| adaptive (no backlog or hysteresis) | 5 ± 2 |" in out  # 3 seeds joined


def test_inspect_accounts_for_every_decoded_request(capsys):
    from bench import ablation_inspect

    spec = SimSpec(**SMALL, workload="phase-shift:1", rate=150.0, policies=("adaptive",))
    got = ablation_inspect.inspect(spec, 0, 150.0, sys.stdout)
    # Every request that decoded past its first token was taken by one decode instance.
    assert got["handoffs"] == got["decoded"] > 0
    assert sum(got["slow_by_instance"].values()) > 0
    assert got["split"][0][0] < 0.1  # routed by the advisor from the first arrival on
    assert "decode instance: handoffs taken" in capsys.readouterr().out
