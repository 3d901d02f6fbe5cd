"""The serving engine on a tiny random Llama: paged KV, chunked prefill, mixed steps, async
dispatch, preemption by recompute, split prefill/decode instances with KV handoff, backpressure,
deadlines, aborts and failure handling. Greedy results are compared with the model's plain
(contiguous-cache, batch-1) steps on the physical backend directly."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

MAX_LEN = 128


@pytest.fixture(scope="module")
def tiny():
    from flexnpu.serving.loading import load_model

    return load_model("random:tiny", seed=1, log=lambda *_: None)


def _engine(tiny, devices, start=True, split_advisor=None, **kw):
    from flexnpu.serving.engine import Engine, EngineConfig

    # A narrow decode width (4 blocks) besides the full one (16): both kinds of decode steps run.
    opts = dict(max_num_seqs=4, max_model_len=MAX_LEN, max_num_batched_tokens=32, block_size=8,
                decode_widths=[4])
    opts.update(kw)
    eng = Engine(None, tiny.params, EngineConfig(**opts), devices=devices,
                 model_config=tiny.config, split_advisor=split_advisor)
    if start:
        assert eng.warmup() == eng.num_warmup_programs()
        eng.start()
    return eng


@pytest.fixture(scope="module")
def eng1(tiny, npu_devices):
    """A co-located engine on one virtual NPU, shared by the tests of this module."""
    eng = _engine(tiny, npu_devices[:1])
    yield eng
    eng.stop()


# Prompt lengths around the chunk size (32) and block size (8); 70 takes three chunks.
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((5, 12, 70, 9, 33, 1))]
LENGTHS = [20, 6, 14, 3, 25, 9]


def _greedy(max_tokens: int):
    from flexnpu.serving.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def direct(tiny, ref_devices):
    """Greedy ids of every prompt from the plain model steps on the xla-cpu-pjrt plugin
    directly (no FlexNPU, no engine)."""
    import jax

    from flexnpu.serving.loading import greedy_generate

    with jax.default_device(ref_devices[0]):
        return [greedy_generate(tiny, p, n, bucket=128) for p, n in
                zip(PROMPTS, LENGTHS, strict=True)]


class _Collect:
    """A RequestOutput that keeps everything (ids, logprobs, finish) for assertions."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.logprobs: list = []
        self.reasons: list[str] = []
        self.done = threading.Event()

    def on_token(self, token_id, logprobs, now):
        self.ids.append(token_id)
        self.logprobs.append(logprobs)
        return None

    def on_finish(self, reason, now):
        self.reasons.append(reason)
        self.done.set()


def _run_concurrently(eng, prompts, lengths, sampling=None):
    outs = [_Collect() for _ in prompts]
    for p, n, o in zip(prompts, lengths, outs, strict=True):
        eng.submit(p, sampling(n) if sampling else _greedy(n), o)
    for o in outs:
        assert o.done.wait(60), "request did not finish"
        assert o.reasons == ["length"], o.reasons
    return [o.ids for o in outs]


def test_solo_requests_match_the_plain_model_steps(eng1, direct) -> None:
    got = [eng1.generate(p, _greedy(n))[0] for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    assert got == direct


def test_continuous_batching_with_mixed_steps(eng1, direct) -> None:
    eng = eng1
    eng.step_log.clear()
    eng.keep_step_log = True
    try:
        # 6 requests > 4 sequences per step: some wait, others join as sequences finish.
        together = _run_concurrently(eng, PROMPTS, LENGTHS)
    finally:
        eng.keep_step_log = False
    assert together == direct
    log = [(set(decodes), chunk) for _, decodes, chunk in eng.step_log]
    assert max(len(d) for d, _ in log) == 4  # the batch filled up
    assert any(d and chunk for d, chunk in log)  # a prefill chunk rode along with decodes
    first = min(r for _, chunk in log if chunk for r in [chunk[0]])
    long_chunks = [chunk[1] for _, chunk in log if chunk and chunk[0] == first + 2]
    assert len(long_chunks) >= 3 and sum(long_chunks) == 70  # the 70-token prompt, chunked
    sets = [d for d, _ in log]
    assert any(b - a and a & b for a, b in zip(sets, sets[1:], strict=False))  # one joined
    assert any(a - b and a & b for a, b in zip(sets, sets[1:], strict=False))  # one left
    assert eng.num_running() == 0 and eng.kv_usage() == 0


def test_preemption_by_recompute_gives_the_same_tokens(tiny, npu_devices, direct) -> None:
    # 12 blocks of 8 positions: the 4 sequences (up to 95 positions each) cannot all fit.
    eng = _engine(tiny, npu_devices[:1], num_kv_blocks=12)
    try:
        seqs = []
        orig = eng.submit

        def submit(*a, **kw):
            req = orig(*a, **kw)
            seqs.append(req.seq)
            return req

        eng.submit = submit
        got = _run_concurrently(eng, PROMPTS, LENGTHS)
        assert got == direct
        assert sum(s.num_preemptions for s in seqs) > 0
        assert eng.kv_usage() == 0
    finally:
        eng.stop()


def test_split_prefill_and_decode_instances_hand_over_the_kv(tiny, npu_devices, direct) -> None:
    eng = _engine(tiny, npu_devices, layout="split", prefill_devices=2, decode_devices=2)
    try:
        assert [x.device for x in eng.instances] == list(npu_devices[:4])
        assert [x.role.value for x in eng.instances] == ["prefill"] * 2 + ["decode"] * 2
        eng.keep_step_log = True
        got = _run_concurrently(eng, PROMPTS, LENGTHS)
        assert got == direct
        decoded_on = {name for name, decodes, _ in eng.step_log if decodes}
        assert decoded_on <= {"decode-2", "decode-3"} and len(decoded_on) == 2
        chunks_on = {name for name, _, chunk in eng.step_log if chunk}
        assert chunks_on <= {"prefill-0", "prefill-1"}
    finally:
        eng.stop()


def test_static_colocation_hands_the_kv_over_on_each_device(tiny, npu_devices, direct) -> None:
    """The paper's static co-location: a prefill and a decode instance on each device."""
    eng = _engine(tiny, npu_devices[:2], layout="static-colocate")
    try:
        assert [(x.role.value, x.device) for x in eng.instances] == [
            ("prefill", npu_devices[0]), ("prefill", npu_devices[1]),
            ("decode", npu_devices[0]), ("decode", npu_devices[1])]
        eng.keep_step_log = True
        assert _run_concurrently(eng, PROMPTS, LENGTHS) == direct
        assert {name for name, decodes, _ in eng.step_log if decodes} == {"decode-2", "decode-3"}
        assert {name for name, _, chunk in eng.step_log if chunk} <= {"prefill-0", "prefill-1"}
        assert eng.kv_usage() == 0
    finally:
        eng.stop()


def test_all_devices_colocated_by_default(tiny, npu_devices, direct) -> None:
    eng = _engine(tiny, None)
    try:
        import jax

        assert [x.device for x in eng.instances] == jax.devices()
        assert _run_concurrently(eng, PROMPTS, LENGTHS) == direct
    finally:
        eng.stop()


def test_stops_and_lengths(tiny, eng1) -> None:
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.sampling import SamplingParams

    eng = eng1
    out, reason = eng.generate(PROMPTS[0], _greedy(5))
    assert len(out) == 5 and reason == "length"
    # The first generated token declared a stop token: the request ends there.
    out2, reason2 = eng.generate(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0,
                                                            stop_token_ids=[out[0]]))
    assert out2 == [] and reason2 == "stop"
    # Exactly max_model_len positions in all.
    out3, reason3 = eng.generate(PROMPTS[2], _greedy(MAX_LEN - len(PROMPTS[2])))
    assert reason3 == "length" and len(PROMPTS[2]) + len(out3) == MAX_LEN
    assert isinstance(eng, Engine)


def test_too_long_and_bad_requests_are_refused_with_a_reason(eng1) -> None:
    from flexnpu.serving.scheduler import RequestTooLongError

    with pytest.raises(RequestTooLongError, match=r"maximum context length is 128 tokens.*"
                       r"100 prompt tokens \+ max_tokens 29 = 129"):
        eng1.submit([3] * 100, _greedy(29), _Collect())
    with pytest.raises(ValueError, match="out of range"):
        eng1.submit([3, 99999], _greedy(1), _Collect())
    with pytest.raises(ValueError, match="top_p must be in"):
        _greedy(1).__class__(top_p=0.0)
    assert eng1.num_waiting() == 0


def test_queue_limit_raises_queue_full(tiny, npu_devices) -> None:
    from flexnpu.serving.scheduler import QueueFullError

    eng = _engine(tiny, npu_devices[:1], start=False, max_waiting=2)
    outs = [_Collect() for _ in range(2)]
    for o in outs:
        eng.submit(PROMPTS[0], _greedy(3), o)
    with pytest.raises(QueueFullError, match=r"waiting queue is full \(2 requests\)"):
        eng.submit(PROMPTS[0], _greedy(3), _Collect())
    eng.start()  # nothing accepted is lost
    try:
        for o in outs:
            assert o.done.wait(60) and o.reasons == ["length"] and len(o.ids) == 3
    finally:
        eng.stop()


def _wait_for(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_abort_ends_the_request_at_once_and_frees_its_kv_at_the_next_step(eng1) -> None:
    eng = eng1
    o = _Collect()
    req = eng.submit(PROMPTS[1], _greedy(MAX_LEN - 20), o)
    _wait_for(lambda: o.ids, "the first token")
    assert eng.kv_usage() > 0
    eng.abort(req)
    assert o.done.is_set() and o.reasons == ["abort"]  # the client hears it at once
    _wait_for(lambda: eng.kv_usage() == 0 and eng.num_running() == 0, "the blocks back")
    n = len(o.ids)
    time.sleep(0.1)
    assert len(o.ids) == n  # nothing after the finish


def _aborting_prepare(eng, pick):
    """Wraps instance 0's runner.prepare: before it reads a plan, pick(plan) names requests
    that are aborted right there, as a client's disconnect on another thread would land
    between the plan and its preparation."""
    runner = eng.instances[0].runner
    real = runner.prepare

    def prepare(plan, prev):
        for req in pick(plan):
            eng.abort(req)
        return real(plan, prev)

    runner.prepare = prepare


def test_an_abort_between_planning_and_preparing_a_step_is_safe(tiny, npu_devices,
                                                               direct) -> None:
    """The crash of issue 42: a decode row whose sequence was aborted after the plan was made
    (its blocks freed under it) failed the step (IndexError in slots_of) and the engine."""
    eng = _engine(tiny, npu_devices[:1])
    try:
        victim_out = _Collect()
        victim = eng.submit(PROMPTS[2], _greedy(40), victim_out)
        aborted: list = []

        def pick(plan):
            decoding = any(e.seq.payload is victim and e.is_decode for e in plan.scheduled)
            if decoding and not aborted:
                aborted.append(victim)
                return [victim]
            return []

        _aborting_prepare(eng, pick)
        together = _run_concurrently(eng, PROMPTS[:2], LENGTHS[:2])
        assert victim_out.done.wait(30) and victim_out.reasons == ["abort"] and aborted
        assert eng.healthy, eng.error
        assert together == direct[:2]
        _wait_for(lambda: eng.kv_usage() == 0, "every block back")
    finally:
        eng.stop()


def test_aborts_driven_into_in_flight_steps(tiny, npu_devices, direct) -> None:
    """Seeded storm: every few steps a decoding request is aborted between its plan and its
    preparation, others from a client thread at random moments; the rest finish with the
    plain model's tokens, every request ends once, the KV pool drains."""
    import random

    eng = _engine(tiny, npu_devices[:1], max_num_seqs=4)
    rng = random.Random(5)
    try:
        def pick(plan):
            rows = [e.seq.payload for e in plan.scheduled if e.is_decode]
            return [rng.choice(rows)] if rows and rng.random() < 0.3 else []

        _aborting_prepare(eng, pick)
        work = [(i % 4, _Collect()) for i in range(24)]
        reqs = [eng.submit(PROMPTS[k], _greedy(LENGTHS[k]), o) for k, o in work]

        def client() -> None:
            for r in rng.sample(reqs, 6):
                time.sleep(rng.uniform(0, 0.05))
                eng.abort(r)

        t = threading.Thread(target=client)
        t.start()
        t.join()
        for k, o in work:
            assert o.done.wait(60), "a request did not end"
            assert len(o.reasons) == 1, o.reasons
            if o.reasons == ["length"]:
                assert o.ids == direct[k]
            else:
                assert o.reasons == ["abort"] and o.ids == direct[k][:len(o.ids)]
        assert eng.healthy, eng.error
        assert sum(o.reasons == ["abort"] for _, o in work) >= 6
        _wait_for(lambda: eng.kv_usage() == 0, "every block back")
    finally:
        eng.stop()


def test_deadline_finishes_with_timeout(eng1) -> None:
    o = _Collect()
    eng1.submit(PROMPTS[1], _greedy(MAX_LEN - 20), o, deadline=time.perf_counter() + 0.05)
    assert o.done.wait(30) and o.reasons == ["timeout"]
    assert len(o.ids) < MAX_LEN - 20


def _failing_dispatch(runner, fail):
    """runner.dispatch raising "injected device failure" on the calls fail(n) picks."""
    real = runner.dispatch
    calls = {"n": 0}

    def dispatch(*a, **kw):
        calls["n"] += 1
        if fail(calls["n"]):
            raise RuntimeError("injected device failure")
        return real(*a, **kw)

    runner.dispatch = dispatch


def test_a_failing_instance_is_restarted_and_its_requests_go_on_elsewhere(
        tiny, npu_devices, direct) -> None:
    """Instance isolation: a step of instance 0 fails mid-stream; its requests go on at the
    other instance with exactly their tokens (none lost or repeated: the same greedy ids), the
    engine stays healthy, instance 0 restarts and serves again."""
    from flexnpu.serving.metrics import ServingMetrics

    metrics = ServingMetrics("tiny", placement=False, process=False)
    eng = _engine(tiny, npu_devices[:2], max_num_seqs=2)
    eng.metrics = metrics
    try:
        _failing_dispatch(eng.instances[0].runner, lambda n: n == 6)
        prompts = [PROMPTS[k % 4] for k in range(8)]  # more than the slots: some queue
        lengths = [LENGTHS[k % 4] for k in range(8)]
        got = _run_concurrently(eng, prompts, lengths)
        assert got == [direct[k % 4] for k in range(8)]
        assert eng.healthy, eng.error
        h = {x.name: x for x in eng.health()}
        assert h["mixed-0"].state == "serving" and h["mixed-0"].restarts == 1
        assert "injected device failure" in h["mixed-0"].last_error
        assert h["mixed-1"].state == "serving" and h["mixed-1"].restarts == 0
        text = metrics.render().decode()
        assert 'flexnpu:instance_failures_total{instance="mixed-0",model_name="tiny"} 1.0' \
            in text
        # It serves again: a request routed there finishes with the plain model's tokens.
        assert _run_concurrently(eng, PROMPTS[:4], LENGTHS[:4]) == direct[:4]
    finally:
        eng.stop()


def test_a_failing_decode_instance_of_the_split_layout(tiny, npu_devices, direct) -> None:
    """Split layout: a decode instance fails with handed-off sequences on it; they are
    recomputed through the prefill side and finish with the plain model's tokens."""
    eng = _engine(tiny, npu_devices[:3], max_num_seqs=2, layout="split", prefill_devices=1,
                  decode_devices=2)
    try:
        decode = [x for x in eng.instances if x.role.value == "decode"][0]
        _failing_dispatch(decode.runner, lambda n: n == 4)
        got = _run_concurrently(eng, PROMPTS[:4] * 2, LENGTHS[:4] * 2)
        assert got == direct[:4] * 2
        assert eng.healthy and {x.name: x.restarts for x in eng.health()}[decode.name] == 1
    finally:
        eng.stop()


def test_an_instance_that_keeps_failing_is_taken_out_of_service(tiny, npu_devices,
                                                                direct) -> None:
    from flexnpu.serving.engine import MAX_INSTANCE_FAILURES

    eng = _engine(tiny, npu_devices[:2], max_num_seqs=2)
    try:
        _failing_dispatch(eng.instances[0].runner, lambda n: True)
        for _ in range(MAX_INSTANCE_FAILURES + 1):  # each round reaches instance 0 again
            assert _run_concurrently(eng, PROMPTS[:4], LENGTHS[:4]) == direct[:4]
        h = {x.name: x for x in eng.health()}
        assert h["mixed-0"].state == "down" and h["mixed-1"].state == "serving"
        assert eng.healthy
        eng.inject_fault("mixed-1")  # the last one fails once: restarted, still serving
        assert _run_concurrently(eng, PROMPTS[:2], LENGTHS[:2]) == direct[:2]
        assert {x.name: x.restarts for x in eng.health()}["mixed-1"] == 1
        with pytest.raises(ValueError, match="no instance 'mixed-7'"):
            eng.inject_fault("mixed-7")
    finally:
        eng.stop()


def test_the_engine_fails_when_no_instance_is_left(tiny, npu_devices) -> None:
    """One instance whose steps always fail: its requests go on at it once restarted (no other
    takes them), end with the error at its next failure (they may be what fails it), and its
    third failure takes it, and so the engine, out of service."""
    from flexnpu.serving.engine import MAX_INSTANCE_FAILURES, EngineDeadError

    eng = _engine(tiny, npu_devices[:1], max_num_seqs=2)
    failed = "error: instance mixed-0 failed (RuntimeError: injected device failure)"
    try:
        _failing_dispatch(eng.instances[0].runner, lambda n: True)
        outs = [_Collect() for _ in range(4)]
        for o in outs:
            eng.submit(PROMPTS[1], _greedy(50), o)
        for o in outs:
            assert o.done.wait(60), "a request hangs after the failure"
            assert len(o.reasons) == 1 and o.reasons[0].startswith(failed), o.reasons
        assert "on a failing instance 2 times" in outs[0].reasons[0]
        for _ in range(MAX_INSTANCE_FAILURES):  # until the engine refuses
            o = _Collect()
            try:
                eng.submit(PROMPTS[1], _greedy(50), o)
            except EngineDeadError:
                break
            assert o.done.wait(60) and o.reasons[0].startswith(failed), o.reasons
        assert not eng.healthy and "no instance left to serve" in eng.error
        assert "injected device failure" in eng.error
        assert eng.health()[0].state == "down"
        assert len(eng.instances[0].failures) == MAX_INSTANCE_FAILURES
        with pytest.raises(EngineDeadError, match="injected device failure"):
            eng.submit(PROMPTS[0], _greedy(1), _Collect())
    finally:
        eng.stop()


# ---- sampling on the device ------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_batch_independent(eng1) -> None:
    from flexnpu.serving.sampling import SamplingParams

    def sp(seed, n=12):
        return SamplingParams(max_tokens=n, temperature=1.0, top_p=0.9, seed=seed,
                              ignore_eos=True)

    a = eng1.generate(PROMPTS[1], sp(7))[0]
    b = eng1.generate(PROMPTS[1], sp(7))[0]
    c = eng1.generate(PROMPTS[1], sp(8))[0]
    assert a == b and a != c
    # The same seeded request among others (different rows, mixed steps) gives the same ids.
    together = _run_concurrently(eng1, [PROMPTS[1], PROMPTS[2], PROMPTS[1]], [12, 12, 12],
                                 lambda n: sp(7, n))
    assert together[0] == a and together[2] == a


def test_logprobs_of_served_tokens(eng1, direct) -> None:
    from flexnpu.serving.sampling import SamplingParams

    o = _Collect()
    eng1.submit(PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                           logprobs=3), o)
    assert o.done.wait(30)
    assert o.ids == direct[0][:6]
    for tok, lp in zip(o.ids, o.logprobs, strict=True):
        assert len(lp.top) == 3 and lp.top[0][0] == tok  # greedy: the best one
        assert lp.logprob == pytest.approx(lp.top[0][1]) and lp.logprob <= 0
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
    o2 = _Collect()
    eng1.submit(PROMPTS[0], _greedy(2), o2)
    assert o2.done.wait(30) and o2.logprobs == [None, None]


def _sample(logits, n, **kw):
    import jax
    import jax.numpy as jnp

    from flexnpu.serving.sampling import sample_rows

    r = n
    row = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    row.update(kw)
    f = jax.jit(sample_rows)
    return f(jnp.tile(jnp.asarray(logits, jnp.float32), (r, 1)),
             jnp.full(r, row["temperature"], jnp.float32), jnp.full(r, row["top_k"], jnp.int32),
             jnp.full(r, row["top_p"], jnp.float32), jnp.full(r, row["min_p"], jnp.float32),
             jnp.zeros((r, 2), jnp.uint32), jnp.arange(r, dtype=jnp.int32), jnp.bool_(True))


def test_device_sampler_filters() -> None:
    # 4 real tokens, then 28 with ~no mass (top logprobs need >= 20 entries)
    logits = np.concatenate([np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32)),
                             np.full(28, -1e4, np.float32)])
    n = 400

    def drawn(**kw):
        return np.asarray(_sample(logits, n, **kw)[0])

    free = np.bincount(drawn(), minlength=32)[:4] / n
    assert np.allclose(free, [0.5, 0.3, 0.15, 0.05], atol=0.07)  # 400 draws: ~3 sigma
    assert set(drawn(top_p=0.7)) == {0, 1}  # 0.5 + 0.3 covers 0.7
    assert set(drawn(top_k=3)) == {0, 1, 2}
    assert set(drawn(min_p=0.5)) == {0, 1}  # p >= 0.25
    assert set(drawn(top_k=1)) == {0}
    assert set(drawn(temperature=0.0)) == {0}
    ids, chosen, top_ids, top_lp = _sample(logits, 2, temperature=0.0)
    assert np.allclose(np.asarray(chosen), np.log(0.5), atol=1e-5)
    assert np.asarray(top_ids)[0, :4].tolist() == [0, 1, 2, 3]
    assert np.allclose(np.asarray(top_lp)[0, :4], np.log([0.5, 0.3, 0.15, 0.05]), atol=1e-5)


# ---- under the placement policies (fresh interpreters) -----------------------------------------

POLICY_RUN = """
import json
import jax
import flexnpu.stats
from flexnpu.serving.engine import Engine, EngineConfig
from flexnpu.serving.loading import load_model
from flexnpu.serving.sampling import SamplingParams
m = load_model("random:tiny", seed=1, log=lambda *_: None)
out = {{}}
for layout in ({layout!r},):
    ec = EngineConfig(max_num_seqs=4, max_model_len={max_len}, max_num_batched_tokens=32,
                      block_size=8, decode_widths=[4], layout=layout, prefill_devices=2,
                      decode_devices=2)
    eng = Engine(None, m.params, ec, model_config=m.config)
    eng.start()
    outs = [[] for _ in {prompts!r}]
    reqs = []
    from flexnpu.serving.output import IdsOutput
    for p, n in zip({prompts!r}, {lengths!r}):
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        o = IdsOutput(sp, ())
        eng.submit(p, sp, o)
        reqs.append(o)
    for o in reqs:
        assert o.done.wait(120), "request hangs"
    out[layout] = [o.ids for o in reqs]
    eng.stop()
phys = flexnpu.stats.clients()[0]["placement"]["physical"]
out["executions"] = [sum(d["executions"].values()) for d in phys]
print("RESULT", json.dumps(out))
"""


@pytest.mark.parametrize(("policy", "layout"), [("static-pd:prefill=0,1;decode=2,3", "split"),
                                                ("dynamic", "colocated")])
def test_serving_under_placement_policies_matches_the_backend(policy, layout, direct) -> None:
    import json

    from _subprocess import run_python

    code = POLICY_RUN.format(max_len=MAX_LEN, prompts=PROMPTS, lengths=LENGTHS, layout=layout)
    proc = run_python(code, env={"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": policy},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert got[layout] == direct
    assert sum(e > 0 for e in got["executions"]) >= 2, got["executions"]  # the placer spread it


def test_stop_aborts_what_is_queued_and_refuses_new_requests(tiny, npu_devices) -> None:
    from flexnpu.serving.engine import EngineDeadError

    eng = _engine(tiny, npu_devices[:1], start=False)
    o = _Collect()
    eng.submit(PROMPTS[0], _greedy(3), o)
    eng.stop()
    assert o.done.is_set() and o.reasons == ["abort"]
    assert not eng.healthy
    with pytest.raises(EngineDeadError, match="the engine is not serving: the engine was stopped"):
        eng.submit(PROMPTS[0], _greedy(3), _Collect())


def test_adaptive_layout_moves_decodes_with_their_kv_when_the_split_changes(
        tiny, npu_devices, ref_devices) -> None:
    """4 devices, each with a prefill and a back (mixed) instance. Sequences decode on units
    1-3 while unit 0 prefills; then units 0-2 take prompts: the decodes of units 1 and 2 move
    to unit 3 with their KV mid-stream, and back out when the split returns; then every unit
    is co-located (prompts go to the back instances, which prefill beside their decodes), and
    the split returns. Every token equals the plain model's, no request is lost or finishes
    twice, and the KV pools end empty."""
    import jax

    from flexnpu.serving.loading import greedy_generate

    lengths = [40, 36, 44, 30, 38, 42]
    with jax.default_device(ref_devices[0]):
        want = [greedy_generate(tiny, p, n, bucket=128) for p, n in
                zip(PROMPTS, lengths, strict=True)]
    from _serving import ScriptedSplit

    script = ScriptedSplit(1)
    eng = _engine(tiny, npu_devices[:4], layout="adaptive", split_advisor=script,
                  keep_cluster_log=True)
    try:
        assert [x.role.value for x in eng.instances] == ["prefill"] * 4 + ["mixed"] * 4
        assert [x.device for x in eng.instances] == list(npu_devices[:4]) * 2
        outs = [_Collect() for _ in PROMPTS]
        for p, n, o in zip(PROMPTS, lengths, outs, strict=True):
            eng.submit(p, _greedy(n), o)

        def wait_tokens(k: int) -> None:
            deadline = time.monotonic() + 60
            while min(len(o.ids) for o in outs) < k and time.monotonic() < deadline:
                time.sleep(0.01)

        def arrival() -> Any:  # one more request: the advisor decides at arrivals
            extra = _Collect()
            req = eng.submit([5, 6, 7], _greedy(2), extra)
            assert extra.done.wait(60) and extra.reasons == ["length"]
            return req

        wait_tokens(4)
        script.ask = 3  # units 0-2 take prompts; unit 3 decodes
        arrival()
        wait_tokens(16)
        script.ask = 1
        arrival()
        wait_tokens(20)
        script.ask = (0, 4)  # every unit co-located
        assert arrival().instance.role.value == "mixed"
        wait_tokens(24)
        script.ask = 2
        arrival()
        for o in outs:
            assert o.done.wait(120), "request did not finish"
            assert o.reasons == ["length"], o.reasons
        assert [o.ids for o in outs] == want
        log = eng.cluster.decisions.log
        assert [n for kind, n, _ in log if kind == "split"] == [(3, 0), (1, 0), (0, 4), (2, 0)]
        handoffs = [rid for kind, rid, _ in log if kind == "handoff"]
        moved = {rid for rid in handoffs if handoffs.count(rid) > 1}
        assert moved and eng.cluster.moves >= len(moved)
        assert eng.num_running() == 0 and eng.kv_usage() == 0
    finally:
        eng.stop()


@pytest.fixture(scope="module")
def handoff_engines(tiny, npu_devices):
    """Two engines with the KV handoff programs, on two devices (as on two hosts)."""
    a = _engine(tiny, npu_devices[:1], kv_handoff=True)
    b = _engine(tiny, npu_devices[1:2], kv_handoff=True)
    yield a, b
    a.stop()
    b.stop()


def test_a_prefilled_sequence_continues_in_another_engine(tiny, handoff_engines, direct) -> None:
    """Engine A stops every request at its first token and exports its KV; engine B (another
    device, another KV pool) continues them from host arrays (as from another host), and A
    itself from its device arrays: the greedy ids equal the plain model's."""
    from flexnpu.serving.engine import PrefilledSequence

    a, b = handoff_engines
    exported: dict[int, PrefilledSequence] = {}
    outs = [_Collect() for _ in PROMPTS]
    for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True)):
        a.submit(p, _greedy(n), outs[i], export=lambda x, i=i: exported.__setitem__(i, x))
    for o in outs:
        assert o.done.wait(60), "the prefill did not finish"
    # Every request stopped after its first token, its KV exported.
    assert [o.reasons for o in outs] == [["prefilled"]] * len(PROMPTS)
    assert sorted(exported) == list(range(len(PROMPTS)))
    conts = [_Collect() for _ in PROMPTS]
    for i, p in exported.items():
        assert p.output_ids == outs[i].ids == direct[i][:1]
        blocks = -(-len(PROMPTS[i]) // 8)
        k, v = p.host_kv()
        assert p.num_blocks == blocks and k.shape == (
            tiny.config.num_layers, blocks * 8, tiny.config.num_kv_heads, tiny.config.head_dim)
        assert p.nbytes == k.nbytes + v.nbytes
        target = b if i % 2 == 0 else a
        if target is b:
            p = PrefilledSequence(p.prompt_ids, p.output_ids, p.seed_words, p.num_blocks,
                                  p.block_size, k, v)
        target.submit_prefilled(p, _greedy(LENGTHS[i]), conts[i])
    for o in conts:
        assert o.done.wait(60) and o.reasons == ["length"], o.reasons
    assert [outs[i].ids + conts[i].ids for i in range(len(PROMPTS))] == direct
    # Wrong KV shapes are refused with the reason.
    bad = exported[0]
    k, v = bad.host_kv()
    with pytest.raises(ValueError, match="does not fit"):
        b.submit_prefilled(PrefilledSequence(bad.prompt_ids, bad.output_ids, bad.seed_words,
                                             1, 8, k[:1], v[:1]), _greedy(3), _Collect())


def test_exports_need_the_handoff_programs(tiny, npu_devices) -> None:
    eng = _engine(tiny, npu_devices[:1], start=False)
    with pytest.raises(ValueError, match="kv_handoff"):
        eng.submit([1, 2], _greedy(2), _Collect(), export=lambda _: None)
    with pytest.raises(ValueError, match="exporting a running sequence needs .*kv_handoff"):
        eng.export_running(None, lambda *_: None)


class _MoveAt(_Collect):
    """Collects, and at its `at`-th token asks its engine to move its request out
    (export_running; the request is `req`, set after submit)."""

    def __init__(self, engine, at: int, export) -> None:
        super().__init__()
        self.engine, self.at, self.export, self.req = engine, at, export, None
        self.marked: list = []

    def on_token(self, token_id, logprobs, now):
        super().on_token(token_id, logprobs, now)
        if len(self.ids) == self.at:
            assert self.req is not None
            self.marked = self.engine.export_running([self.req], self.export)
        return None


def test_a_running_request_moves_to_another_engine_mid_decode(handoff_engines) -> None:
    """Engine A moves a request out at its 3rd token (greedy) or 5th (seeded sampling): its
    PrefilledSequence holds the prompt, every token so far and their KV; engine B continues it
    from host arrays, and the ids equal an unmoved run's, each token once."""
    from flexnpu.serving.engine import PrefilledSequence
    from flexnpu.serving.sampling import SamplingParams

    a, b = handoff_engines
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=11, ignore_eos=True)
    for prompt, sp, at in ((PROMPTS[2], _greedy(20), 3), (PROMPTS[1], seeded, 5)):
        want = a.generate(prompt, sp)[0]
        moved: list[PrefilledSequence] = []
        out = _MoveAt(a, at, lambda req, p, moved=moved: moved.append(p))
        out.req = a.submit(prompt, sp, out)
        assert out.done.wait(60) and out.reasons == ["moved"], out.reasons
        assert out.marked == [out.req] and len(moved) == 1
        p = moved[0]
        assert p.prompt_ids == prompt and p.output_ids == out.ids == want[:at]
        assert p.num_positions == len(prompt) + at - 1
        assert p.num_blocks == -(-p.num_positions // 8)
        k, v = p.host_kv()
        rest = _Collect()
        b.submit_prefilled(PrefilledSequence(p.prompt_ids, p.output_ids, p.seed_words,
                                             p.num_blocks, 8, k, v), sp, rest)
        assert rest.done.wait(60) and rest.reasons == ["length"], rest.reasons
        assert out.ids + rest.ids == want
    # A finished request is skipped; a failing export ends its request with the reason.
    assert a.export_running([out.req], lambda *_: None) == []
    def refuse(req, p):
        raise RuntimeError("no room")

    failing = _MoveAt(a, 2, refuse)
    failing.req = a.submit(PROMPTS[0], _greedy(10), failing)
    assert failing.done.wait(60)
    assert failing.reasons == ["error: exporting the running sequence failed: no room"]
    assert len(failing.ids) == 2
