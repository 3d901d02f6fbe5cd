"""The simulator over a multi-host topology (serving/topology.py): KV between the units of a
host takes the intra-host link, between hosts the inter-host one; each host's placer places
its instances' steps onto its own units; one host (the default) is the simulator as before."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flexnpu.__main__ import main as flexnpu_main
from flexnpu.analysis import link_table
from flexnpu.serving.topology import Link, Topology
from flexnpu.sim.adaptive import AdaptiveSimulation
from flexnpu.sim.hardware import LINKS, get_preset
from flexnpu.sim.models import get_model
from flexnpu.sim.simulation import InstanceConfig, Simulation
from flexnpu.sim.workload import Workload, make_workload

IC = InstanceConfig(max_num_seqs=64, max_num_batched_tokens=2048, block_size=16, max_model_len=4096)


def _sim(policy: str, cls: type[Simulation] = Simulation, **kw) -> Simulation:
    args = dict(
        model=get_model("qwen2.5-7b"),
        preset=get_preset("h100"),
        devices=4,
        parallel=1,
        policy=policy,
        instance=IC,
        num_prefill=1,
    )
    args.update(kw)
    return cls(**args)


def _expected(link: str, nbytes: int, parallel: int) -> float:
    row = link_table()[link]
    return nbytes / (row["bytes_per_s"] * parallel) + row["latency_s"]


def _one_handoff(**kw) -> tuple[Simulation, object, int, int, float]:
    """One request through static-pd: (sim, result, decode unit, KV bytes, seconds from the
    prefill's end to the KV's arrival)."""
    sim = _sim("static-pd", **kw)
    seen = []
    on_kv = sim._on_kv

    def record(inst, seq, now):
        seen.append((inst.kv_unit, seq.num_tokens * sim.kv_per_token, now))
        on_kv(inst, seq, now)

    sim._on_kv = record
    r = sim.run(Workload(np.array([0.5]), np.array([700]), np.array([5]), 1.0))
    (req,) = r.requests
    ((unit, nbytes, at),) = seen
    assert req.n_out == 5
    return sim, r, unit, nbytes, at - req.first_token


def test_handoff_within_a_host_takes_the_intra_host_link() -> None:
    topo = Topology.from_spec("2x2", Link("nvlink"), Link("roce"))
    _, r, unit, nbytes, seconds = _one_handoff(num_prefill=1, topology=topo)
    assert unit == 1  # prefill unit 0 hands off to decode unit 1, both on host0
    assert seconds == pytest.approx(_expected("nvlink", nbytes, 1), rel=1e-12)
    assert r.kv_bytes_handoff == nbytes and r.kv_bytes_inter_host == 0


def test_handoff_between_hosts_takes_the_inter_host_link() -> None:
    topo = Topology.from_spec("2x2", Link("nvlink"), Link("roce"))
    _, r, unit, nbytes, seconds = _one_handoff(num_prefill=2, topology=topo)
    assert unit in (2, 3)  # prefill units 0, 1 on host0, decode units on host1
    assert seconds == pytest.approx(_expected("roce", nbytes, 1), rel=1e-12)
    assert r.kv_bytes_handoff == r.kv_bytes_inter_host == nbytes


@pytest.mark.parametrize("hosts", ["2x2", "4x1"])
def test_units_of_whole_hosts_hand_off_over_the_inter_host_link(hosts: str) -> None:
    # parallel 2: a unit is a host (2x2) or spans two whole hosts (4x1); each unit moves KV at
    # parallel x the per-device bandwidth.
    topo = Topology.from_spec(hosts, Link("hccs"), Link("roce"))
    sim, r, unit, nbytes, seconds = _one_handoff(num_prefill=1, parallel=2, topology=topo)
    assert unit == 1 and sim.multi_host
    assert seconds == pytest.approx(_expected("roce", nbytes, 2), rel=1e-12)
    assert r.kv_bytes_inter_host == nbytes


def test_default_is_one_host_on_the_presets_link() -> None:
    sim, r, unit, nbytes, seconds = _one_handoff(num_prefill=1)
    assert not sim.multi_host and sim.topology == Topology.single_host(4)
    assert seconds == pytest.approx(_expected(get_preset("h100").link, nbytes, 1), rel=1e-12)
    assert r.kv_bytes_inter_host == 0


def test_a_unit_may_not_straddle_hosts() -> None:
    with pytest.raises(ValueError, match=r"unit 0 \(devices 0-2\) would straddle hosts host0, "):
        _sim("passthrough", devices=6, parallel=3, topology=Topology.from_spec("3x2"))
    with pytest.raises(ValueError, match="the topology has 8 devices, the simulation 4"):
        _sim("passthrough", topology=Topology.from_spec("2x4"))
    with pytest.raises(ValueError, match="the topology's inter_host_link is unknown"):
        _sim("passthrough", topology=Topology.from_spec("2x2", Link("hccs")))
    with pytest.raises(ValueError, match="inter_host_link: unknown link 'fast'"):
        _sim("passthrough", topology=Topology.from_spec("2x2", None, Link("fast")))


def _fingerprint(r) -> list:
    return [(q.first_token, q.finish, q.n_out, q.dropped) for q in r.requests] + [
        r.kv_bytes_moved,
        r.steps,
        r.decisions_by_reason,
        r.makespan_s,
    ]


WL = make_workload("burst", rate=40.0, duration=4.0, seed=3, max_prompt=1024, max_output=128)


@pytest.mark.parametrize(
    "policy", ["passthrough", "static-pd", "static-colocate", "dynamic", "adaptive"]
)
def test_a_supernode_as_one_host_on_hccs_is_the_default(policy: str) -> None:
    cls = AdaptiveSimulation if policy == "adaptive" else Simulation
    hccs = LINKS["hccs"]
    base = _sim(policy, cls, link=hccs).run(WL)
    topo = Topology.from_spec("1x4", Link("hccs"), Link("roce"))
    assert _fingerprint(_sim(policy, cls, topology=topo).run(WL)) == _fingerprint(base)


@pytest.mark.parametrize("policy", ["passthrough", "chunked-colocate", "elastic-pd"])
def test_hosts_on_hccs_everywhere_are_the_default_where_steps_stay_home(policy: str) -> None:
    # 2 hosts, hccs within and between (one port per unit): the KV of every handoff and move
    # takes the time it takes on one host; these policies place every step on its home unit,
    # so the per-host placers decide as the one.
    cls = AdaptiveSimulation if policy == "elastic-pd" else Simulation
    base = _sim(policy, cls, link=LINKS["hccs"]).run(WL)
    topo = Topology.from_spec("2x2", Link("hccs"), Link("hccs"))
    r = _sim(policy, cls, topology=topo).run(WL)
    assert _fingerprint(r) == _fingerprint(base)
    if policy == "elastic-pd":
        assert r.kv_bytes_inter_host > 0  # KV did cross hosts, as fast as within


def test_each_hosts_placer_places_onto_its_own_units() -> None:
    topo = Topology.from_spec("2x2", Link("nvlink"), Link("roce"))
    sim = _sim("dynamic", topology=topo)
    home_host = [sim.unit_host[x.unit] for x in sim.instances]
    placed: list[tuple[int, int]] = []
    calls = sim.core.native_calls

    def recording_calls():
        place, on_start, on_finish = calls()

        def rec(v, *args):
            d = place(v, *args)
            placed.append((v, d[0]))
            return d

        return rec, on_start, on_finish

    sim.core.native_calls = recording_calls
    wl = make_workload("burst", rate=60.0, duration=4.0, seed=1, max_prompt=1024, max_output=128)
    r = sim.run(wl)
    assert len(placed) == r.steps > 0
    assert all(sim.unit_host[u] == home_host[v] for v, u in placed)
    # The placers still lend units within their host, and both decided.
    assert any(u != sim.instances[v].unit for v, u in placed)
    hosts = sim.core.stats(int(r.makespan_s * 1e9))["hosts"]
    assert [h["decisions_total"] > 0 for h in hosts] == [True, True]
    assert sum(h["decisions_total"] for h in hosts) == r.core_decisions == r.steps


def test_cli_hosts_and_topology_file(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    args = [
        "simulate",
        "--device",
        "h100",
        "--model",
        "qwen2.5-7b",
        "--rate",
        "20",
        "--duration",
        "3",
        "--seeds",
        "1",
        "--policies",
        "static-pd",
        "--prefill-units",
        "2",
        "--no-progress",
        "--max-prompt",
        "1024",
        "--max-output",
        "64",
    ]
    assert (
        flexnpu_main([*args, "--hosts", "2x2", "--inter-host-link", "roce", "--json", str(out)])
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["config"]["devices"] == 4
    assert doc["config"]["topology"] == {
        "hosts": [{"name": "host0", "devices": 2}, {"name": "host1", "devices": 2}],
        "intra_host_link": "nvlink",  # the preset's
        "inter_host_link": "roce",
    }
    m = doc["policies"]["static-pd"]
    # 2 prefill units on host0, 2 decode units on host1: every handoff crosses hosts
    assert m["kv_bytes_between_hosts"] == m["kv_bytes_moved"] > 0
    assert m["kv_bytes_within_hosts"] == 0
    text = capsys.readouterr().out
    assert "Hosts: 2x2 (hosts x devices), nvlink within a host, roce between hosts" in text
    # The same cluster from a file (a front's GET /cluster/topology), its measured link.
    topo = tmp_path / "t.json"
    topo.write_text(
        json.dumps(
            {
                "hosts": [{"name": "a", "devices": 2}, {"name": "b", "devices": 2}],
                "intra_host_link": None,
                "inter_host_link": {"bytes_per_s": 5e10, "latency_s": 1e-5},
            }
        )
    )
    assert flexnpu_main([*args, "--topology", str(topo), "--json", str(out)]) == 0
    m2 = json.loads(out.read_text())["policies"]["static-pd"]
    # roce's figures measured: the same run
    assert (m2["kv_bytes_between_hosts"], m2["throughput_tok_s"], m2["ttft_s"]) == (
        m["kv_bytes_between_hosts"],
        m["throughput_tok_s"],
        m["ttft_s"],
    )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--hosts", "2x3"], "the topology has 6 devices (2x3), --devices says 4"),
        (["--hosts", "2x2"], "the topology's inter_host_link is unknown"),
        (["--hosts", "2x2", "--inter-host-link", "fast"], "inter_host_link: unknown link 'fast'"),
        (["--inter-host-link", "roce"], "--inter-host-link needs --hosts or --topology"),
        (["--hosts", "4"], "hosts '4': '4' is not HOSTSxDEVICES"),
        (["--topology", "/nonexistent.json"], "--topology /nonexistent.json: No such file"),
        (["--hosts", "1x4", "--topology", "x.json"], "give --hosts or --topology, not both"),
        (
            [
                "--hosts",
                "1x2,1x6",
                "--devices",
                "8",
                "--parallel",
                "4",
                "--inter-host-link",
                "roce",
            ],
            "unit 0 (devices 0-3) would straddle hosts host0, host1",
        ),
    ],
)
def test_cli_refuses_bad_topologies_by_message(extra, message, capsys) -> None:
    assert (
        flexnpu_main(["simulate", "--devices", "4", "--seeds", "1", "--no-progress", *extra]) == 2
    )
    assert message in capsys.readouterr().err
