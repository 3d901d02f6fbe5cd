"""The pure serving scheduler: chunked prefill, paged-KV accounting, preemption by recompute,
async (optimistic) output counting, roles, backpressure, deadlines. No JAX."""

from __future__ import annotations

import random

import pytest

from flexnpu.serving.scheduler import (
    QueueFullError,
    RequestTooLongError,
    Role,
    Scheduler,
    SchedulerConfig,
    SeqStatus,
    Sequence,
    least_loaded,
)


def seq(rid, prompt, max_tokens, arrival=0.0, **kw) -> Sequence:
    return Sequence(rid, prompt, max_tokens, arrival, **kw)


def run_to_end(s: Scheduler, now: float = 0.0, limit: int = 10_000, stopped=None):
    """Steps until idle; returns (plans, finished sequences in finish order)."""
    plans, done = [], []
    for _ in range(limit):
        plan = s.schedule(now)
        if plan.is_empty and not s.has_work:
            return plans, done
        plans.append(plan)
        done += s.on_step_done(plan, now, (stopped or (lambda p: None))(plan))
        now += 1.0
    raise AssertionError("scheduler did not drain")


def test_chunked_prefill_then_decode_to_length():
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, block_size=16, num_blocks=64))
    r = seq("a", 150, 3)
    s.add(r)
    plans, done = run_to_end(s)
    chunks = [(e.start, e.num_tokens, e.samples) for p in plans for e in p.scheduled]
    assert chunks == [(0, 64, False), (64, 64, False), (128, 22, True),
                      (150, 1, True), (151, 1, True)]
    assert done == [r] and r.finish_reason == "length" and r.num_output_tokens == 3
    assert s.num_free_blocks == 64 and r.blocks == []


def test_async_schedule_before_results():
    """Step k+1 is planned before step k is done; the length finish is known in advance."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=32))
    r = seq(1, 8, 3)
    s.add(r)
    p0 = s.schedule(0)
    p1 = s.schedule(0)  # before p0 is done
    p2 = s.schedule(0)
    assert [e.num_tokens for e in p0.scheduled] == [8]
    assert [e.start for e in p1.scheduled] == [8] and [e.start for e in p2.scheduled] == [9]
    assert p2.scheduled[0].finishes and s.schedule(0).is_empty  # nothing more to schedule
    assert s.on_step_done(p0, 0) == [] and s.on_step_done(p1, 0) == []
    assert s.on_step_done(p2, 0) == [r] and r.finish_reason == "length"


def test_stop_reported_ignores_in_flight_work():
    s = Scheduler(SchedulerConfig())
    r = seq("x", 4, 100)
    s.add(r)
    p0, p1 = s.schedule(0), s.schedule(0)
    assert s.on_step_done(p0, 0, {"x": "stop"}) == [r]
    assert r.finish_reason == "stop" and r.status is SeqStatus.FINISHED
    assert s.on_step_done(p1, 0) == []  # the in-flight step's token is ignored
    assert s.num_free_blocks == s.config.num_blocks and not s.has_work


def test_budget_and_batch_limits():
    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=40))
    for i in range(5):
        s.add(seq(i, 30, 4, arrival=i))
    plans, done = run_to_end(s)
    for p in plans:
        assert p.num_tokens <= 40
        assert len({e.seq.request_id for e in p.scheduled}) <= 3
    assert sorted(r.request_id for r in done) == [0, 1, 2, 3, 4]
    assert all(r.num_output_tokens == 4 for r in done)
    # Decodes of running sequences go before new prompt chunks.
    mixed = [p for p in plans if p.decodes and p.prefills]
    assert mixed and all(p.scheduled.index(p.decodes[-1]) < p.scheduled.index(p.prefills[0])
                         for p in mixed)


def test_preemption_by_recompute_when_blocks_run_out():
    # 6 blocks of 4 = 24 positions; two sequences of 8 + 8 outputs need 16 each.
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=6, max_num_batched_tokens=64))
    a, b = seq("a", 8, 8, arrival=0), seq("b", 8, 8, arrival=1)
    s.add(a)
    s.add(b)
    plans, done = run_to_end(s)
    assert b.num_preemptions >= 1 and a.num_preemptions == 0  # the later one is the victim
    assert {r.request_id for r in done} == {"a", "b"}
    assert a.num_output_tokens == 8 and b.num_output_tokens == 8
    recompute = [e for p in plans for e in p.scheduled if e.seq is b and e.start == 0]
    assert len(recompute) == 2 and recompute[1].num_tokens > 8  # prompt + outputs so far
    assert s.num_free_blocks == 6
    for p in plans:  # never more blocks handed out than exist
        assert sum(len(e.seq.blocks) for e in p.scheduled if not e.seq.finished) <= 6


def test_preempting_a_sequence_scheduled_earlier_in_the_same_step():
    s = Scheduler(SchedulerConfig(block_size=4, num_blocks=4, max_num_batched_tokens=64))
    a, b = seq("a", 3, 6, arrival=0), seq("b", 3, 6, arrival=1)
    s.add(a)
    s.add(b)
    plans, done = run_to_end(s)
    assert len(done) == 2 and all(r.num_output_tokens == 6 for r in done)
    assert all(r.finish_reason == "length" for r in done)


def test_no_mixed_batches_prefill_first():
    s = Scheduler(SchedulerConfig(mixed_batches=False, chunked_prefill=False,
                                  max_num_batched_tokens=2048))
    s.add(seq(0, 100, 3))
    p = s.schedule(0)
    s.on_step_done(p, 0)
    s.add(seq(1, 50, 3))
    p = s.schedule(1)
    assert [e.num_tokens for e in p.scheduled] == [50]  # prefill-only step; decode waits
    s.on_step_done(p, 1)
    p = s.schedule(2)
    assert [e.num_tokens for e in p.scheduled] == [1, 1]


def test_whole_prompt_longer_than_budget_runs_alone_without_chunking():
    s = Scheduler(SchedulerConfig(chunked_prefill=False, max_num_batched_tokens=64))
    s.add(seq(0, 100, 2))
    s.add(seq(1, 10, 2))
    p = s.schedule(0)
    assert [e.num_tokens for e in p.scheduled] == [100]


def test_prefill_and_decode_roles_hand_off():
    pre = Scheduler(SchedulerConfig(role=Role.PREFILL, max_num_batched_tokens=16))
    dec = Scheduler(SchedulerConfig(role=Role.DECODE))
    r = seq("r", 20, 4)
    pre.add(r)
    p0 = pre.schedule(0)
    assert pre.on_step_done(p0, 0) == []
    p1 = pre.schedule(1)
    assert pre.schedule(1).is_empty  # not decoded in the prefill instance
    assert pre.on_step_done(p1, 1) == [r] and r.finish_reason == "prefilled"
    assert pre.num_free_blocks == pre.config.num_blocks
    dec.add_prefilled(r)
    p2 = dec.schedule(2)
    assert p2.kv_inserts == [r] and [(e.start, e.num_tokens) for e in p2.scheduled] == [(20, 1)]
    _, done = run_to_end(dec, now=2)
    assert done == [r] and r.finish_reason == "length" and r.num_output_tokens == 4
    with pytest.raises(ValueError, match="add_prefilled"):
        dec.add(seq("z", 3, 3))
    with pytest.raises(ValueError, match="for decode and mixed instances"):
        pre.add_prefilled(seq("y", 3, 3))


def test_prefill_role_with_one_token_finishes_by_length():
    pre = Scheduler(SchedulerConfig(role=Role.PREFILL))
    r = seq(0, 5, 1)
    pre.add(r)
    assert pre.on_step_done(pre.schedule(0), 0) == [r] and r.finish_reason == "length"


def test_queue_bound_and_lengths_are_errors_with_reasons():
    s = Scheduler(SchedulerConfig(max_waiting=2, max_model_len=100, block_size=16,
                                  num_blocks=4))
    with pytest.raises(RequestTooLongError, match=r"maximum context length is 100.*90.*\+ "
                                                  r"max_tokens 20 = 110"):
        s.add(seq(0, 90, 20))
    with pytest.raises(RequestTooLongError, match="needs 5 KV blocks of 16; the KV pool has 4"):
        s.add(seq(0, 70, 10))
    with pytest.raises(RequestTooLongError, match="at least one token"):
        s.add(seq(0, 0, 10))
    s.add(seq(1, 10, 10))
    s.add(seq(2, 10, 10))
    with pytest.raises(QueueFullError, match=r"waiting queue is full \(2 requests\)"):
        s.add(seq(3, 10, 10))
    with pytest.raises(ValueError, match="already scheduled"):
        s.add(seq(1, 10, 10))
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        Scheduler(SchedulerConfig(max_num_seqs=0))


def test_deadline_and_abort():
    s = Scheduler(SchedulerConfig(max_num_seqs=1))
    a = seq("a", 10, 50, deadline=5.0)
    b = seq("b", 10, 50, deadline=3.0)
    s.add(a)
    s.add(b)
    s.on_step_done(s.schedule(0), 0)
    plan = s.schedule(4.0)  # b expired while waiting
    assert plan.finished == [b] and b.finish_reason == "timeout"
    s.on_step_done(plan, 4.0)
    assert s.abort("a") is a and s.abort("a") is None  # once
    # Running: its blocks stay until the next plan (one being prepared may hold them) ...
    assert a.blocks and s.num_free_blocks < s.config.num_blocks
    assert s.schedule(5.0).is_empty  # ... which leaves it out and frees them
    assert a.finish_reason == "abort" and not a.blocks
    assert s.num_free_blocks == s.config.num_blocks and not s.has_work


def test_abort_leaves_the_plans_it_is_in_intact():
    """A client's abort lands (another thread) between a plan's schedule() and the runner's
    reading of its entries, with an earlier plan still in flight: the entries keep their
    blocks, and the sequence is in no later plan."""
    s = Scheduler(SchedulerConfig(max_num_seqs=4, block_size=4, num_blocks=32))
    for rid in ("a", "b"):
        s.add(seq(rid, 6, 20))
    in_flight = s.schedule(0)  # prefills a and b
    planned = s.schedule(0)  # their first decodes, planned before in_flight is done
    s.abort("a")
    entries = {e.seq.request_id: e for e in planned.scheduled}
    a = entries["a"].seq
    assert entries["a"].start == 6 and len(a.blocks) == 2  # positions 0..6 in blocks of 4
    s.on_step_done(in_flight, 0)
    s.on_step_done(planned, 0)
    after = s.schedule(0)
    assert [e.seq.request_id for e in after.scheduled] == ["b"]
    assert a.finish_reason == "abort" and not a.blocks
    assert s.num_free_blocks == 32 - len(entries["b"].seq.blocks)


def test_priority_classes_are_served_first():
    s = Scheduler(SchedulerConfig(max_num_seqs=1))
    s.add(seq("batch", 5, 1, arrival=0, priority=1))
    s.add(seq("latency", 5, 1, arrival=1, priority=0))
    assert [e.seq.request_id for e in s.schedule(0).scheduled] == ["latency"]


def test_kv_usage_and_router():
    cfg = SchedulerConfig(block_size=10, num_blocks=10)
    a, b = Scheduler(cfg), Scheduler(SchedulerConfig(block_size=10, num_blocks=10))
    a.add(seq(0, 35, 2))
    a.schedule(0)
    assert a.kv_usage == pytest.approx(0.4)  # 36 positions -> 4 blocks
    assert least_loaded([a, b]) == 1
    b.add(seq(1, 50, 2))
    assert b.waiting_tokens == 50 and least_loaded([a, b]) == 0



def test_router_follows_every_state_change():
    """least_loaded keeps a key per instance between calls: each call that changes an
    instance (add, schedule, on_step_done, abort, finish_all) must change its answer."""
    a, b = (Scheduler(SchedulerConfig(block_size=4, num_blocks=40)) for _ in range(2))
    assert least_loaded([a, b]) == 0  # a tie goes to the lowest index
    a.add(seq("a1", 8, 3))
    assert least_loaded([a, b]) == 1  # a has 8 waiting tokens
    plan = a.schedule(0)  # a1 runs: no waiting, one running
    assert least_loaded([a, b]) == 1 and least_loaded([b, a]) == 0
    b.add(seq("b1", 6, 1))
    assert least_loaded([a, b]) == 0  # b waits with 6 tokens
    a.on_step_done(plan, 0)
    b.abort("b1")
    assert least_loaded([a, b]) == 1  # b is empty again; a still runs a1
    a.finish_all("abort")
    assert least_loaded([a, b]) == 0 and a.num_running == 0

@pytest.mark.parametrize("mixed,chunked", [(True, True), (False, False), (False, True)])
def test_random_workload_invariants(mixed, chunked):
    rng = random.Random(7)
    cfg = SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=96, block_size=8,
                          num_blocks=40, max_model_len=300, mixed_batches=mixed,
                          chunked_prefill=chunked)
    s = Scheduler(cfg)
    want = {}
    now, pending, inflight, done = 0.0, 60, [], []
    while pending or s.has_work or inflight:
        if pending and rng.random() < 0.4:
            p, m = rng.randint(1, 200), rng.randint(1, 60)
            if p + m <= cfg.max_model_len:
                r = seq(pending, p, m, arrival=now)
                s.add(r)
                want[pending] = m
            pending -= 1
        plan = s.schedule(now)
        budget_ok = plan.num_tokens <= cfg.max_num_batched_tokens or len(plan.scheduled) == 1
        assert budget_ok
        assert s.num_running <= cfg.max_num_seqs
        for e in plan.scheduled:  # every computed position has a block
            assert len(e.seq.blocks) * cfg.block_size >= e.start + e.num_tokens
        if not mixed:
            assert not (plan.decodes and plan.prefills)
        if not plan.is_empty:
            inflight.append(plan)
        if len(inflight) == 2 or (inflight and plan.is_empty):  # one step ahead, as the engine
            done += s.on_step_done(inflight.pop(0), now)
        now += 1
        assert now < 100_000
    assert sorted(r.request_id for r in done) == sorted(want)
    assert all(r.num_output_tokens == want[r.request_id] for r in done)
    assert all(r.finish_reason == "length" for r in done)
    assert s.num_free_blocks == cfg.num_blocks


def test_decode_instance_batches_handed_off_sequences_with_running_ones():
    """Even configured without mixed batches, a decode instance never stalls its running
    decodes to give a newly handed-off sequence a step of its own."""
    dec = Scheduler(SchedulerConfig(role=Role.DECODE, mixed_batches=False,
                                    chunked_prefill=False))
    first = seq("a", 10, 50)
    first.num_output_tokens = 1
    dec.add_prefilled(first)
    dec.on_step_done(dec.schedule(0), 0)
    second = seq("b", 10, 50)
    second.num_output_tokens = 1
    dec.add_prefilled(second)
    plan = dec.schedule(1)
    assert plan.kv_inserts == [second]
    assert sorted(e.seq.request_id for e in plan.scheduled) == ["a", "b"]
    assert all(e.is_decode for e in plan.scheduled)


@pytest.mark.parametrize("seed", range(8))
def test_handed_off_sequences_preempted_on_the_decode_side_deliver_every_token(seed):
    """The split layout's two schedulers, steps one ahead as the engine runs them, a decode
    pool small enough to preempt: a handed-off sequence (its prompt KV inserted) that is
    preempted recomputes its prompt and tokens from scratch, and finishes "length" having
    delivered exactly max_tokens tokens (a token is delivered for each sampling entry of a
    step whose sequence is not finished when the step completes, as Engine._complete does):
    no early "length" from a count run ahead of the tokens."""
    rng = random.Random(seed)
    common = dict(max_num_batched_tokens=32, block_size=4, max_model_len=120,
                  max_prefill_seqs=1)
    pre = Scheduler(SchedulerConfig(role=Role.PREFILL, num_blocks=200, **common))
    dec = Scheduler(SchedulerConfig(role=Role.DECODE, max_num_seqs=6, num_blocks=40,
                                    **common))
    want, delivered, preempted = {}, {}, 0
    in_flight: dict[Role, list] = {Role.PREFILL: [], Role.DECODE: []}
    now = 0.0
    while len(want) < 40 or pre.has_work or dec.has_work or any(in_flight.values()):
        if len(want) < 40 and rng.random() < 0.5:
            r = seq(len(want), rng.randint(1, 60), rng.randint(1, 55), arrival=now)
            pre.add(r)
            want[r.request_id], delivered[r.request_id] = r.max_tokens, 0
        for s in (pre, dec):
            plan, steps = s.schedule(now), in_flight[s.config.role]
            if not plan.is_empty:
                steps.append(plan)
            if len(steps) == 2 or (steps and plan.is_empty):
                done = steps.pop(0)
                for e in done.scheduled:
                    delivered[e.seq.request_id] += e.samples and not e.seq.finished
                for r in s.on_step_done(done, now):
                    if r.finish_reason == "prefilled":
                        dec.add_prefilled(r)
                        continue
                    assert r.finish_reason == "length"
                    assert delivered[r.request_id] == want[r.request_id], r
                    preempted += r.num_preemptions
        now += 1
        assert now < 100_000
    assert all(delivered[i] == n for i, n in want.items()) and preempted > 0

