"""The adaptive prefill:decode split: the placement core's SplitAdvisor (split.h) through its
binding, and the simulator's adaptive layout that routes by it."""

from __future__ import annotations

import json
import math

import pytest

from flexnpu import placement as fp
from flexnpu.__main__ import main as flexnpu_main
from flexnpu.sim.experiments import SimSpec, run_all, simulate_once

SEC = 1_000_000_000


def _advisor(**kw) -> fp.SplitAdvisor:
    args = dict(units=24, prefill_tokens_per_s=100_000, decode_sequences_per_unit=1000,
                target_utilization=0.8)
    return fp.SplitAdvisor(**(args | kw))


def test_advisor_follows_prompt_demand_then_decode_demand():
    a = _advisor()
    assert a.prefill_units == 12 and a.units == 24
    assert a.update(0, 0) is False  # starts the clock
    for s in range(1, 6):  # 1M prompt tokens/s: 10 units / 0.8 -> 13; decode 4 units
        a.on_prompt(1_000_000)
        a.update(s * SEC, 4000)
    assert a.prefill_units == 13
    assert a.prompt_tokens_per_s == pytest.approx(1e6)
    for s in range(6, 31):  # prompts drop tenfold, decode holds 18k sequences
        a.on_prompt(100_000)
        a.update(s * SEC, 18_000)
    assert a.prefill_units == 2
    assert a.decisions == 30 and a.changes >= 2


def test_advisor_shares_units_by_need_when_overloaded():
    a = _advisor()
    a.update(0, 0)
    a.on_prompt(1_800_000)  # 18 units of prefill, 6 of decode: 22.5 + 6 > 24
    assert a.update(SEC, 6000) is True
    assert a.prefill_units == 18


def test_advisor_decides_once_per_tick():
    a = _advisor()
    a.update(0, 0)
    a.on_prompt(420_000)
    assert not a.due(SEC // 2)
    assert a.update(SEC // 2, 0) is False and a.decisions == 0
    a.on_prompt(420_000)
    assert a.due(2 * SEC)
    a.update(2 * SEC, 0)
    assert a.prompt_tokens_per_s == pytest.approx(420_000)
    assert a.prefill_units == 6  # 4.2 / 0.8 = 5.25
    a.update(3 * SEC, 0)
    assert a.prompt_tokens_per_s == pytest.approx(420_000 * math.exp(-0.5))


@pytest.mark.parametrize("kw,message", [
    ({"units": 1}, "units must be >= 2"),
    ({"prefill_tokens_per_s": 0}, "prefill_tokens_per_s must be a finite number > 0"),
    ({"decode_sequences_per_unit": float("nan")}, "decode_sequences_per_unit"),
    ({"target_utilization": 0}, "target_utilization must be in (0, 1]"),
    ({"tick_ns": 0}, "tick_ns must be > 0"),
    ({"initial_prefill_units": 30}, "initial_prefill_units must be in [0, units - 1]"),
])
def test_advisor_rejects_bad_config_by_name(kw, message):
    with pytest.raises(ValueError, match="split advisor: " + message.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        _advisor(**kw)


def test_advisor_rejects_bad_calls_and_keeps_its_state():
    a = _advisor()
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        a.on_prompt(-5)
    a.update(5 * SEC, 0)
    with pytest.raises(ValueError, match="clock went back"):
        a.update(4 * SEC, 0)
    with pytest.raises(ValueError, match="decode_sequences must be >= 0"):
        a.update(6 * SEC, -1)
    assert a.prefill_units == 12 and a.decisions == 0


# Qwen2.5-7B on 8 x H100, phase-shift: 1000-token prompts for 10 s, then 120-token prompts
# with 600-token outputs.
PHASES = dict(devices=8, device="h100", model="qwen2.5-7b", workload="phase-shift",
              rate=150.0, duration=20.0, seeds=1, max_prompt=4096, max_output=2048,
              policies=("dynamic",), dynamic_layout="adaptive")


def test_adaptive_split_moves_units_to_decode_in_the_output_heavy_phase():
    spec = SimSpec(**PHASES).resolved()
    r = simulate_once(spec, "dynamic", 0)
    timeline = r.split_timeline
    assert timeline[0] == (0.0, 4, 0)  # units / 2 before the first decision

    def late_split(t0: float, t1: float) -> list[int]:
        return [n for t, n, _ in timeline if t0 <= t < t1]

    # Set after the last change before t (the split in force at t).
    def split_at(t: float) -> int:
        return [n for s, n, _ in timeline if s <= t][-1]

    assert split_at(9.5) > split_at(19.5) >= 1, timeline
    assert late_split(12.0, 20.0), "the advisor kept deciding in phase 2"
    # Nothing lost: every request finishes or is reported dropped.
    assert all(q.finish >= 0 or q.dropped for q in r.requests)
    assert sum(1 for q in r.requests if q.finish >= 0) > 0.9 * len(r.requests)
    # The split went up at first (units 0-5 take prompts): the decodes of units 4 and 5 moved
    # with their KV, and none lost or gained a token on the way.
    assert r.moves > 0
    assert all(q.n_out == q.output for q in r.requests if q.finish >= 0)


def test_adaptive_same_seed_gives_identical_json_with_the_split():
    a = run_all(SimSpec(**PHASES))
    b = run_all(SimSpec(**PHASES))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    d = a["policies"]["dynamic"]
    lo, hi = d["prefill_units_range"]
    assert 1 <= lo < hi <= 7
    assert d["per_seed"][0]["split_timeline"][0][1] == 4


def test_cli_adaptive_layout_and_bad_split_target(tmp_path, capsys):
    assert flexnpu_main(["simulate", "--split-target", "1.5", "--dynamic-layout",
                         "adaptive"]) == 2
    assert "--split-target must be in (0, 1]" in capsys.readouterr().err
    out = tmp_path / "a.json"
    rc = flexnpu_main(["simulate", "--devices", "4", "--device", "h100", "--model",
                       "qwen2.5-7b", "--rate", "20", "--duration", "3", "--seeds", "1",
                       "--policies", "dynamic", "--dynamic-layout", "adaptive", "--json",
                       str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["dynamic_layout"] == "adaptive"
    assert doc["policies"]["dynamic"]["prefill_units_range"][0] >= 1


def test_elastic_pd_resplits_whole_units_without_lending_and_is_deterministic():
    spec = dict(PHASES, policies=("elastic-pd", "adaptive"), dynamic_layout="colocated")
    a = run_all(SimSpec(**spec))
    b = run_all(SimSpec(**spec))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    elastic, adaptive = a["policies"]["elastic-pd"], a["policies"]["adaptive"]
    # The advisor moves whole units between the roles (4 at first, fewer in phase 2) ...
    lo, hi = elastic["prefill_units_range"]
    assert 1 <= lo < hi <= 7
    assert elastic["per_seed"][0]["split_timeline"][0][1] == 4
    # ... and every step runs on its home unit: no lending, no KV migrated with a step.
    assert elastic["core_policy"] == "passthrough"
    assert elastic["decisions_total"] == elastic["decisions_by_reason"]["passthrough"] > 0
    assert elastic["kv_bytes_migrated"] == 0
    # adaptive is the same routing with the dynamic placer, which does lend.
    assert adaptive["core_policy"] == "dynamic"
    assert adaptive["decisions_by_reason"]["passthrough"] == 0
    assert elastic["requests_finished"] > 0.9 * elastic["requests_total"]


def test_adaptive_policy_is_dynamic_with_the_adaptive_layout():
    a = run_all(SimSpec(**dict(PHASES, policies=("adaptive",), dynamic_layout="colocated")))
    d = run_all(SimSpec(**PHASES))
    assert json.dumps(a["policies"]["adaptive"], sort_keys=True) == json.dumps(
        d["policies"]["dynamic"], sort_keys=True)


def test_advised_policies_need_the_advisors_simulation():
    with pytest.raises(ValueError, match="routes by the split advisor"):
        _plain_simulation("elastic-pd")
    with pytest.raises(ValueError, match="elastic-pd needs at least 2 units"):
        SimSpec(devices=1, device="h100", model="qwen2.5-7b", policies=("elastic-pd",)).resolved()


def _plain_simulation(policy: str):
    from flexnpu.sim.hardware import get_preset
    from flexnpu.sim.models import get_model
    from flexnpu.sim.simulation import InstanceConfig, Simulation

    ic = InstanceConfig(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16,
                        max_model_len=4096)
    return Simulation(model=get_model("qwen2.5-7b"), preset=get_preset("h100"), devices=4,
                      parallel=1, policy=policy, instance=ic)


def test_co_located_at_capacity_the_split_returns_and_no_token_is_lost():
    """phase-shift at 4/3 the rate: the prompt-heavy phase fills the cluster, which the
    advisor co-locates (every unit's back instance prefills in chunks beside its decodes);
    the output-heavy phase splits it again. Every finished request has all its tokens, and a
    seed gives the same run."""
    spec = SimSpec(**dict(PHASES, rate=200.0, split_colocate=True)).resolved()
    r = simulate_once(spec, "dynamic", 0)
    timeline = r.split_timeline
    assert any(m == 8 and p == 0 for _, p, m in timeline), timeline
    assert timeline[-1][2] == 0 and timeline[-1][0] > 10, timeline  # split in phase 2
    assert all(q.finish >= 0 or q.dropped for q in r.requests)
    assert all(q.n_out == q.output for q in r.requests if q.finish >= 0)
    again = simulate_once(spec, "dynamic", 0)
    assert again.split_timeline == timeline
    assert [q.finish for q in again.requests] == [q.finish for q in r.requests]
