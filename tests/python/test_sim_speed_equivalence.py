"""The scheduler's steady-decode fast path (aggregate bookkeeping for a decoding cohort) and the
simulator's use of plan aggregates decide exactly as the per-sequence code did.

Goldens: the digests below were recorded with the scheduler as it was before the fast path
(commit 12ff696) by `python tests/python/test_sim_speed_equivalence.py --record`; a trace
records every plan entry, preemption, kv insert, finish and, after every call, each running
sequence's token counts and KV block ids, so any change in what the scheduler decides changes
the digest. The simulator check runs the same scenario with the fast path on and off in one
process (its output also depends on the cost model and the placer, which other work changes).
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from typing import Any

import pytest

from flexnpu.serving.cluster import Router
from flexnpu.serving.scheduler import (
    QueueFullError,
    RequestTooLongError,
    Role,
    ScheduledSeq,
    Scheduler,
    SchedulerConfig,
    Sequence,
    least_loaded,
)
from flexnpu.sim import simulation as sim_simulation
from flexnpu.sim.experiments import SimSpec, run_metrics, simulate_once
from flexnpu.sim.hardware import StepTimer, get_preset
from flexnpu.sim.models import get_model
from flexnpu.sim.simulation import POLICIES

# name -> (SchedulerConfig kwargs, async depth (plans in flight), steps)
SCENARIOS: dict[str, tuple[dict[str, Any], int, int]] = {
    "mixed_chunked": (dict(max_num_seqs=12, max_num_batched_tokens=48, block_size=4,
                           num_blocks=90, max_model_len=120), 1, 900),
    "mixed_chunked_async": (dict(max_num_seqs=12, max_num_batched_tokens=48, block_size=4,
                                 num_blocks=90, max_model_len=120), 2, 900),
    "tight_budget": (dict(max_num_seqs=16, max_num_batched_tokens=6, block_size=4,
                          num_blocks=200, max_model_len=100), 1, 700),
    "not_mixed": (dict(max_num_seqs=10, max_num_batched_tokens=64, block_size=8,
                       num_blocks=60, max_model_len=200, chunked_prefill=False,
                       mixed_batches=False), 1, 700),
    "prefill_cap_watermark": (dict(max_num_seqs=10, max_num_batched_tokens=40, block_size=4,
                                   num_blocks=80, max_model_len=120, max_prefill_seqs=2,
                                   watermark_blocks=6), 2, 700),
    "prefill_role": (dict(max_num_seqs=6, max_num_batched_tokens=32, block_size=4,
                          num_blocks=60, max_model_len=120, role=Role.PREFILL), 2, 500),
    "decode_role": (dict(max_num_seqs=24, max_num_batched_tokens=64, block_size=4,
                         num_blocks=120, max_model_len=160, role=Role.DECODE), 1, 900),
    "decode_roomy": (dict(max_num_seqs=64, max_num_batched_tokens=256, block_size=4,
                          num_blocks=2000, max_model_len=160, role=Role.DECODE), 1, 900),
    "mixed_roomy_async": (dict(max_num_seqs=64, max_num_batched_tokens=128, block_size=8,
                               num_blocks=1000, max_model_len=160), 2, 900),
    "decode_role_async": (dict(max_num_seqs=24, max_num_batched_tokens=16, block_size=8,
                               num_blocks=70, max_model_len=160, role=Role.DECODE), 2, 900),
}
GOLDEN = {
    'decode_role': '44988f05d90dabed50ce492eaf2a8cefb397e53e8c4a1d35ed88d29a5471ac7e',
    'decode_role_async': '66c21d5dae0f6d41017a3652120a6ecdf0647d51431754e2be6ce25e54614836',
    'decode_roomy': '2a7c25ed2b9ed589009b304c327c3d37a5e47818ebbbe0475f4591404486db34',
    'mixed_chunked': 'c6cf98a4f9ab01403a446043d718a79ff58b3244c7c2ed597ba46567ee6fcb6c',
    'mixed_chunked_async': '9b6f0f443618bda93923758ecf8d0e347fd80f5a4082009d16f9988d2c7b0eea',
    'mixed_roomy_async': '2fa932d36fde959a9a449ae50bf895ab82ffd9651cff63b40830e81c9504bc44',
    'not_mixed': 'd6038ca6ec28d5394ab934b55e33daefe0f23a101550823d3ca4fd0ea58b0112',
    'prefill_cap_watermark': '71f6f66526addb9ba5465b316587feaa5f35d8deb28b6f518089c99c26a07303',
    'prefill_role': '4b202057db5154e93a47a01df8ddb14f9051eecfddb3439034e757f8ee473ed8',
    'tight_budget': '9440c63cb7b6b5b064074ef21f684ee217ec3ae6f9cd0be77787e9b7252cf0a7',
}


def _seq_state(s: Scheduler) -> list:
    return [(q.request_id, q.num_computed_tokens, q.num_output_tokens, list(q.blocks),
             q.pending_finish) for q in s.running()]


def _entries(plan) -> list:
    return [(e.seq.request_id, e.start, e.num_tokens, e.samples, e.finishes)
            for e in plan.scheduled]


def scheduler_trace(cfg: dict[str, Any], depth: int, steps: int, seed: int,
                    late: bool = False) -> list:
    """Drives one scheduler through a seeded random workload with only its public API: adds
    (priorities, deadlines), prefilled handoffs, stops, aborts, up to `depth` plans in flight;
    returns everything the scheduler decided and its state after every call. late: a plan's
    entries are read only after its step is done (and later plans were made), not at once."""
    rng = random.Random(seed)
    s = Scheduler(SchedulerConfig(**cfg))
    decode = s.config.role is Role.DECODE
    out: list = []
    inflight: list = []
    now, rid = 0.0, 0
    for _ in range(steps):
        now += rng.choice((0.01, 0.05, 0.2))
        for _ in range(rng.choice((0, 0, 0, 1, 1, 2))):
            rid += 1
            q = Sequence(rid, rng.randint(1, 60), rng.randint(1, 50), now,
                         deadline=now + rng.uniform(1, 8) if rng.random() < 0.1 else None,
                         priority=rng.choice((0, 0, 0, 1)))
            try:
                if decode:
                    q.num_output_tokens = rng.randint(1, 3)
                    q.max_tokens += q.num_output_tokens
                    s.add_prefilled(q)
                else:
                    s.add(q)
                out.append(("add", rid))
            except (QueueFullError, RequestTooLongError) as e:
                out.append(("reject", rid, type(e).__name__))
        if rng.random() < 0.02 and s.running():
            victim = rng.choice(s.running()).request_id
            gone = s.abort(victim)
            out.append(("abort", victim, gone is not None))
        plan = s.schedule(now)
        out.append(["plan", plan.step_id, None if late else _entries(plan),
                    [q.request_id for q in plan.kv_inserts],
                    [q.request_id for q in plan.preempted],
                    [(q.request_id, q.finish_reason) for q in plan.finished],
                    plan.num_tokens, plan.num_prefill_tokens, plan.is_empty])
        record = out[-1]
        out.append(("state", _seq_state(s), s.num_free_blocks, s.num_waiting,
                    s.waiting_tokens))
        inflight.append((plan, record))
        while len(inflight) >= depth or (inflight and rng.random() < 0.3):
            done_plan, done_record = inflight.pop(0)
            stops = {q.request_id: "stop" for q in s.running() if rng.random() < 0.02}
            done = s.on_step_done(done_plan, now, stops)
            if late:
                done_record[2] = _entries(done_plan)
            out.append(("done", done_plan.step_id,
                        [(q.request_id, q.finish_reason, q.num_output_tokens) for q in done]))
            out.append(("state", _seq_state(s), s.num_free_blocks))
    for plan, record in inflight:
        record[2] = _entries(plan)
    return out


def digest(trace: list) -> str:
    return hashlib.sha256(json.dumps(trace).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scheduler_decides_as_before_the_fast_path(name):
    cfg, depth, steps = SCENARIOS[name]
    trace = scheduler_trace(cfg, depth, steps, seed=11)
    assert sum(1 for t in trace if t[0] == "done" and t[2]) > 20  # the scenario finishes work
    assert digest(trace) == GOLDEN[name]
    assert digest(scheduler_trace(cfg, depth, steps, seed=11, late=True)) == GOLDEN[name]


class _PerSequenceScheduler(Scheduler):
    """The scheduler with its aggregate decode path off: every step one sequence at a time."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._bulk_ok = False


def _sim_json(spec: SimSpec, policy: str) -> str:
    r = simulate_once(spec, policy, 3, prefill_units=1)
    m = run_metrics(r, spec, spec.duration)
    m["requests"] = [(q.rid, q.first_token, q.finish, q.n_out, q.dropped) for q in r.requests]
    m["busy_s"] = r.busy_s
    m["placements"] = r.placements
    return json.dumps(m, sort_keys=True)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", [
    dict(devices=4, device="h100", model="qwen2.5-7b", rate=30.0, duration=4.0,
         max_num_seqs=24, max_num_batched_tokens=1024),
    dict(devices=32, device="910c", model="deepseek-r1", workload="reasoning", rate=40.0,
         duration=2.0, co_run=True),
], ids=["qwen-h100", "deepseek-910c-corun"])
def test_simulation_is_identical_with_and_without_aggregate_decodes(monkeypatch, case,
                                                                     policy):
    spec = SimSpec(**case).resolved()
    fast = _sim_json(spec, policy)
    monkeypatch.setattr(sim_simulation, "Scheduler", _PerSequenceScheduler)
    slow = _sim_json(spec, policy)
    assert json.loads(fast)["steps"] > 100
    assert fast == slow


def test_plan_totals_match_its_entries():
    """What the simulator reads instead of the entries (bulk_decodes, entries_after_bulk,
    num_scheduled, num_tokens) agrees with the entries themselves."""
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, block_size=4,
                                  num_blocks=200, max_model_len=200))
    for i in range(6):
        s.add(Sequence(i, 10 + 7 * i, 30, 0.0))
    bulk_seen = 0
    for _ in range(40):
        plan = s.schedule(0.0)
        count, starts = plan.bulk_decodes
        rest = list(plan.entries_after_bulk)
        n = plan.num_scheduled
        tokens = plan.num_tokens
        bulk_seen += count
        entries = plan.scheduled  # builds the bulk entries
        assert n == len(entries) and tokens == sum(e.num_tokens for e in entries)
        assert entries[count:] == rest
        assert all(e.is_decode and e.samples for e in entries[:count])
        assert sum(e.start for e in entries[:count]) == starts
        assert plan.bulk_decodes == (0, 0) and plan.entries_after_bulk is entries
        s.on_step_done(plan, 0.0)
    assert bulk_seen > 100


@pytest.mark.parametrize("role", [Role.MIXED, Role.DECODE])
def test_router_picks_as_least_loaded(role):
    """The cluster layer's incremental router (keys recomputed only for instances whose scheduler
    changed) picks the instance least_loaded picks over all of them, ties included."""
    rng = random.Random(5)
    cfg = dict(max_num_seqs=6, max_num_batched_tokens=40, block_size=4, num_blocks=60,
               max_model_len=120, role=role)
    insts = [sim_simulation.Instance(i, Scheduler(SchedulerConfig(**cfg)), role, 0, 1)
             for i in range(5)]
    router = Router(insts)
    scheds = [x.sched for x in insts]
    assert router.pick() is insts[0]  # all equal: the lowest index
    plans: list = []
    picked = set()
    for rid in range(400):
        x = router.pick()
        assert x is insts[least_loaded(scheds)]
        picked.add(x.idx)
        q = Sequence(rid, rng.randint(1, 30), rng.randint(1, 20), 0.0)
        if role is Role.DECODE:
            q.num_output_tokens = 1
            x.sched.add_prefilled(q)
        else:
            x.sched.add(q)
        x.changed.append(x)
        for _ in range(2):  # some instances step, some finish a step
            if rng.random() < 0.5 or not plans:
                y = rng.choice(insts)
                plans.append((y, y.sched.schedule(0.0)))
            else:
                y, plan = plans.pop(0)
                y.sched.on_step_done(plan, 0.0)
            y.changed.append(y)
    assert picked == set(range(5))


def _entry_view(entries: list) -> list[tuple]:
    return [(e.seq.request_id, e.start, e.num_tokens, e.samples, e.finishes) for e in entries]


def test_plans_held_read_late_or_released_keep_their_entries():
    """A plan holds the cohort's lists (no copy) while members join and, after release,
    leave in place: a plan read only after later steps ran still lists what it scheduled,
    and releasing plans changes no decision (against the per-sequence scheduler, two plans
    in flight)."""
    rng = random.Random(3)
    cfg = SchedulerConfig(max_num_seqs=10, max_num_batched_tokens=64, block_size=4,
                          num_blocks=160, max_model_len=160)
    fast, ref = Scheduler(cfg), Scheduler(cfg)
    ref._bulk_ok = False
    inflight: list[tuple] = []
    late: list[tuple] = []
    bulk_entries = enders_in_bulk = released = 0
    for step in range(500):
        if step < 300 and rng.random() < 0.6:
            p, o = rng.randint(1, 40), rng.randint(1, 30)
            fast.add(Sequence(step, p, o, 0.0))
            ref.add(Sequence(step, p, o, 0.0))
        pf, pr = fast.schedule(0.0), ref.schedule(0.0)
        inflight.append((step, pf, pr, pf.bulk_decodes, pf.num_scheduled,
                         _entry_view(pr.scheduled)))
        if len(inflight) < 2:
            continue
        k, pf, pr, (count, starts), n, want = inflight.pop(0)
        bulk_entries += count
        assert n == len(want)
        fast.on_step_done(pf, 0.0)
        ref.on_step_done(pr, 0.0)
        if k % 3 == 0:  # read after later steps ran (held: the scheduler copies for it)
            late.append((pf, count, want))
        else:  # the simulator's way: totals only, then released
            assert starts == sum(w[1] for w in want[:count])
            fast.release(pf)
            released += 1
    for pf, count, want in late:
        assert _entry_view(pf.scheduled) == want
        enders_in_bulk += sum(1 for w in want[:count] if w[4])
    assert bulk_entries > 500 and enders_in_bulk > 5 and released > 200


def test_step_cost_memo_gives_the_unmemoised_cost():
    """StepTimer.step_cost memoises the experts a step touches per token count: a timer that
    saw many steps (memo hits, in any order) costs each step exactly as a fresh timer does
    (memo miss), and that is the documented formula with ModelShape.experts_touched."""
    model, preset = get_model("deepseek-r1"), get_preset("910c")
    parallel = model.default_parallel
    warm = StepTimer.create(model, preset, parallel)
    rng = random.Random(2)
    cases = [(rng.randint(0, 2000), rng.randint(0, 400)) for _ in range(60)]
    cases += cases[::-1]  # the second half hits the memo
    for decodes, prompt in cases:
        rest = [ScheduledSeq(Sequence(0, prompt, 4, 0.0), 0, prompt, True)] if prompt else []
        starts = 100 * decodes
        got = warm.step_cost(rest, decodes, starts)
        fresh = StepTimer.create(model, preset, parallel)
        assert got == fresh.step_cost(rest, decodes, starts)
        n = decodes + prompt
        moe = model.num_layers - model.num_dense_layers
        x = model.experts_touched(n) * moe
        assert got[0] == pytest.approx(sum(
            c * v for c, v in zip(warm._fcl, _step_features(decodes, starts, prompt, x),
                                  strict=True)), rel=1e-12)


def _step_features(decodes: int, starts: int, prompt: int, experts: float) -> list[float]:
    """step_cost's features (tokens, attention area, KV read, samples, experts) by hand."""
    n, a, k, s = decodes, starts + decodes, starts + decodes, decodes
    if prompt:
        n += prompt
        a += prompt * (prompt + 1) // 2
        k += prompt
        s += 1
    return [1.0, n, a, k, s, experts]


if __name__ == "__main__" and "--record" in sys.argv:
    for n in sorted(SCENARIOS):
        c, d, k = SCENARIOS[n]
        print(f"    {n!r}: {digest(scheduler_trace(c, d, k, seed=11))!r},")
