"""The cluster layer (serving/cluster.py): one code for the engine's and the simulator's routing,
handoffs and role changes. A role change moves decodes with their KV blocks and queued prompts
without losing or duplicating a request or a block; the engine and the simulator, driven with
one trace, make the same decisions."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from _serving import ScriptedSplit

from flexnpu.serving.cluster import Cluster, ClusterInstance, SplitSettings, unit_roles
from flexnpu.serving.scheduler import Role, Scheduler, SchedulerConfig, Sequence


def _cluster(units: int, advisor) -> Cluster:
    insts = []
    for i, role in enumerate(unit_roles("adaptive", units)):
        cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, block_size=4,
                              num_blocks=200, max_model_len=160, role=role)
        insts.append(ClusterInstance(i, i % units, role, Scheduler(cfg)))
    return Cluster(insts, units, advisor, keep_log=True)


def _check_conservation(cluster: Cluster, live: set[int]) -> None:
    """Every live request is held by exactly one instance; no KV block is in two sequences or
    both held and free."""
    held: list[int] = []
    for x in cluster.instances:
        seqs = x.sched.running() + x.sched.waiting()
        held += [s.request_id for s in seqs]
        blocks = [b for s in seqs for b in s.blocks]
        assert len(blocks) == len(set(blocks)), f"instance {x.idx}: a block in two sequences"
        assert len(blocks) + x.sched.num_free_blocks == x.sched.config.num_blocks
    assert sorted(held) == sorted(live)


# Splits the random role changes pick from: prefill units, or (prefill, mixed): every unit
# co-located, and co-located units beside prefill and decode ones.
SPLITS = [1, 2, 3, (0, 4), (1, 2), (0, 2)]


def _unit_role(advisor: ScriptedSplit, unit: int) -> Role:
    p, m = advisor.prefill_units, advisor.mixed_units
    return Role.PREFILL if unit < p else Role.MIXED if unit < p + m else Role.DECODE


@pytest.mark.parametrize("seed", [3, 4])
def test_role_changes_move_every_sequence_once_with_its_blocks(seed: int) -> None:
    rng = random.Random(seed)
    advisor = ScriptedSplit(2)
    cluster = _cluster(4, advisor)
    live: set[int] = set()
    now = 0.0
    rid = 0
    kv_of: dict[int, list[int]] = {}  # request -> the positions its KV holds (as block count)
    seen: set = set()
    rebalanced = 0
    order = rng.sample(SPLITS, len(SPLITS))  # every split, in a random order, twice over
    for round_ in range(90):
        now += 0.1
        if round_ % 7 == 3:
            advisor.ask = order[(round_ // 7) % len(order)]
        changed = cluster.on_arrival(10, now)
        x = cluster.route_arrival(rid)
        # A prefill unit's prefill instance, or a co-located unit's back instance.
        unit_role = _unit_role(advisor, x.unit)
        assert x.role is (Role.PREFILL if unit_role is Role.PREFILL else Role.MIXED)
        assert unit_role is not Role.DECODE
        x.sched.add(Sequence(rid, rng.randint(4, 40), rng.randint(20, 60), now))
        live.add(rid)
        rid += 1
        if changed:
            split = (advisor.prefill_units, advisor.mixed_units)
            assert cluster.split_timeline[-1] == (now, *split)
            seen.add(split)
        # Every instance runs a step; prefilled sequences go to the back instances; instances
        # outside their old roles give up what can move.
        for inst in cluster.instances:
            for seq, blocks in cluster.take_moves(inst):
                if seq.needs_kv_insert:  # queued for a slot: units joined the decode side
                    assert not blocks and inst.role is Role.MIXED
                    dst = cluster.route_handoff(seq.request_id)
                    dst.sched.add_prefilled(seq)
                    rebalanced += 1
                elif blocks:  # a decode: its unit takes prefilled ones no more
                    assert inst.role is Role.MIXED
                    assert _unit_role(advisor, inst.unit) is Role.PREFILL
                    assert seq.num_computed_tokens == seq.num_tokens - 1
                    assert len(blocks) * 4 >= seq.num_computed_tokens  # its KV came along
                    dst = cluster.route_handoff(seq.request_id)
                    assert dst.role is Role.MIXED
                    assert _unit_role(advisor, dst.unit) is not Role.PREFILL
                    dst.sched.add_prefilled(seq)
                    kv_of[seq.request_id] = blocks
                else:  # a queued (or preempted) prompt: its instance takes prompts no more
                    assert seq.num_computed_tokens == 0
                    cluster.route_arrival(seq.request_id).sched.add(seq)
            plan = inst.sched.schedule(now)
            for seq in inst.sched.on_step_done(plan, now):
                if seq.finish_reason == "prefilled":
                    cluster.route_handoff(seq.request_id).sched.add_prefilled(seq)
                else:
                    live.discard(seq.request_id)
            inst.changed.append(inst)
        _check_conservation(cluster, live)
    assert cluster.moves > 0 and kv_of
    assert (0, 4) in seen and any(p and m for p, m in seen)
    assert rebalanced > 0
    log = cluster.decisions.log
    assert [k for k, *_ in log].count("split") == len(cluster.split_timeline) - 1


def test_layout_errors_are_named() -> None:
    with pytest.raises(ValueError, match="layout 'ring': expected one of colocated, split"):
        unit_roles("ring", 4)
    with pytest.raises(ValueError, match=r"prefill units must be in \[1, 3\], got 4"):
        unit_roles("split", 4, 4)
    with pytest.raises(ValueError, match="the split advisor needs the adaptive layout"):
        insts = [ClusterInstance(i, i, Role.MIXED, Scheduler(SchedulerConfig(
            max_num_seqs=2, max_num_batched_tokens=8, block_size=4, num_blocks=8,
            max_model_len=16))) for i in range(2)]
        Cluster(insts, 2, ScriptedSplit(1))
    with pytest.raises(ValueError, match="prefill_tokens_per_s must be > 0"):
        _cluster(4, SplitSettings(prefill_tokens_per_s=0.0, decode_batch=4))


# One trace for the engine and the simulator: prompt-heavy, then short prompts, arrivals 4 s
# apart (each request is done before the next arrives, so no decision depends on how fast
# either side runs), and a split advisor that sizes a unit at 20 prompt tokens/s: the split
# goes up in the first phase and down in the second.
TRACE = [(4.0 * i, 90 if i < 7 else 4, 3) for i in range(14)]
SETTINGS = SplitSettings(prefill_tokens_per_s=20.0, decode_batch=4, hold_s=0.0)
# A unit sized at 8 tokens/s: the first phase fills the cluster, which co-locates every unit.
COLOCATING = SplitSettings(prefill_tokens_per_s=8.0, decode_batch=4, hold_s=0.0,
                           colocate_at_capacity=True)


def _simulated_decisions(settings: SplitSettings) -> list:
    from flexnpu.sim.adaptive import AdaptiveSimulation
    from flexnpu.sim.hardware import get_preset
    from flexnpu.sim.models import get_model
    from flexnpu.sim.simulation import InstanceConfig
    from flexnpu.sim.workload import Workload

    sim = AdaptiveSimulation(
        model=get_model("qwen2.5-7b"), preset=get_preset("h100"), devices=4, parallel=1,
        policy="elastic-pd", instance=InstanceConfig(max_num_seqs=4, max_num_batched_tokens=32,
                                                     block_size=8, max_model_len=128),
        prefill_tokens_per_s=settings.prefill_tokens_per_s, split_hold_s=settings.hold_s,
        split_colocate=settings.colocate_at_capacity, keep_cluster_log=True)
    wl = Workload(np.array([t for t, _, _ in TRACE]), np.array([p for _, p, _ in TRACE]),
                  np.array([o for _, _, o in TRACE]), duration=TRACE[-1][0] + 1)
    result = sim.run(wl)
    assert all(q.finish >= 0 for q in result.requests)
    return sim.cluster.decisions.log


@pytest.mark.parametrize("settings", [SETTINGS, COLOCATING], ids=["split", "colocating"])
def test_engine_and_simulator_make_the_same_decisions_on_one_trace(
    npu_devices, settings: SplitSettings
) -> None:
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.sampling import SamplingParams

    tiny = load_model("random:tiny", seed=1, log=lambda *_: None)
    clock = [0.0]
    eng = Engine(None, tiny.params,
                 EngineConfig(max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32,
                              block_size=8, layout="adaptive", keep_cluster_log=True),
                 devices=npu_devices[:4], model_config=tiny.config, split_advisor=settings,
                 cluster_clock=lambda: clock[0])
    eng.start()
    try:
        for t, prompt, output in TRACE:
            clock[0] = t
            ids, reason = eng.generate([3 + j % 200 for j in range(prompt)],
                                       SamplingParams(max_tokens=output, temperature=0.0,
                                                      ignore_eos=True), timeout=120)
            assert reason == "length" and len(ids) == output
        served = list(eng.cluster.decisions.log)
    finally:
        eng.stop()
    simulated = _simulated_decisions(settings)
    splits = [split for kind, split, _ in simulated if kind == "split"]
    if settings.colocate_at_capacity:  # co-located, then split again
        assert (0, 4) in splits and splits[-1][1] == 0, simulated
    else:  # the split moved both ways
        assert max(p for p, _ in splits) > 2 and splits[-1] == (1, 0), simulated
    assert served == simulated


def test_engine_routes_concurrent_arrivals_through_the_cluster_lock(npu_devices) -> None:
    """Arrivals from many threads while the split changes: each request is routed once and
    finishes once."""
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.sampling import SamplingParams

    tiny = load_model("random:tiny", seed=1, log=lambda *_: None)
    advisor = ScriptedSplit(1)
    eng = Engine(None, tiny.params,
                 EngineConfig(max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32,
                              block_size=8, layout="adaptive", keep_cluster_log=True),
                 devices=npu_devices[:3], model_config=tiny.config, split_advisor=advisor)
    eng.start()
    results: list[tuple[list[int], str]] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for j in range(3):
            advisor.ask = (1, 2, (0, 3))[(k + j) % 3]  # split, and every unit co-located
            out = eng.generate([5 + k, 6 + j, 7], SamplingParams(max_tokens=12, temperature=0.0,
                                                                  ignore_eos=True), timeout=120)
            with lock:
                results.append(out)

    try:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
        assert len(results) == 18 and all(r == "length" and len(ids) == 12
                                          for ids, r in results)
        arrivals = [rid for kind, rid, _ in eng.cluster.decisions.log if kind == "arrival"]
        assert sorted(set(arrivals)) == list(range(18))
        assert eng.num_running() == 0 and eng.num_waiting() == 0 and eng.kv_usage() == 0
    finally:
        eng.stop()
