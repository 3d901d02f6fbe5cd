"""Continuous batching on a tiny random Llama: requests join and leave the running batch, the
result of each request does not depend on its neighbours, split prefill/decode devices (KV handed
over with jax.device_put) give the same tokens as interleaved mode."""

from __future__ import annotations

import threading

import numpy as np
import pytest


@pytest.fixture(scope="module")
def tiny():
    from flexnpu.serving.loading import load_model

    return load_model("random:tiny", seed=1, log=lambda *_: None)


@pytest.fixture(scope="module")
def eng1(tiny, npu_devices):
    """An interleaved engine on one virtual NPU, shared by the tests of this module."""
    eng = _engine(tiny, npu_devices[:1])
    yield eng
    eng.stop()


def _engine(tiny, devices, **kw):
    from flexnpu.serving.engine import Engine, EngineConfig, ModelSteps

    ec = EngineConfig(max_batch=4, max_seq_len=96, buckets=[8, 16, 32], **kw)
    eng = Engine(ModelSteps(tiny.config), tiny.params, ec, devices=devices)
    assert eng.warmup() == eng.num_warmup_programs()
    eng.start()
    return eng


PROMPTS = [list(range(3, 3 + n)) for n in (5, 12, 30, 9, 17, 2)]


def _greedy(max_tokens: int):
    from flexnpu.serving.sampling import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _run_concurrently(eng, prompts, lengths):
    """Submits all requests at once (more than the slots: some wait) and collects the tokens."""
    results: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    done = threading.Semaphore(0)

    def sink_for(i):
        def sink(tok, reason):
            if tok is not None:
                results[i].append(tok)
            if reason is not None:
                done.release()
        return sink

    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        eng.submit(p, _greedy(n), sink_for(i))
    for _ in prompts:
        assert done.acquire(timeout=60)
    return [results[i] for i in range(len(prompts))]


def test_continuous_batching_joins_and_leaves(eng1) -> None:
    eng = eng1
    try:
        eng.keep_step_log = True
        solo = [eng.generate(p, _greedy(n))[0] for p, n in zip(PROMPTS, [20, 6, 14, 3, 25, 9],
                                                                 strict=True)]
        assert [len(s) for s in solo] == [20, 6, 14, 3, 25, 9]
        eng.step_log.clear()
        # 6 requests > 4 slots: some wait, others join as slots free up.
        together = _run_concurrently(eng, PROMPTS, [20, 6, 14, 3, 25, 9])
        assert together == solo
        log = eng.step_log
        assert max(len(s) for s in log) == 4  # the batch filled up
        sets = [set(s) for s in log]
        joined = any(b - a and a & b for a, b in zip(sets, sets[1:], strict=False))
        left = any(a - b and a & b for a, b in zip(sets, sets[1:], strict=False))
        assert joined and left, log
        assert eng.num_running() == 0 and eng.kv_usage() == 0
    finally:
        eng.keep_step_log = False


def test_split_prefill_decode_devices_match_interleaved(tiny, eng1, npu_devices) -> None:
    lengths = [8, 5, 11, 7, 4, 9]
    want = _run_concurrently(eng1, PROMPTS, lengths)
    split = _engine(tiny, npu_devices, prefill_devices=2, decode_devices=2)
    try:
        assert [str(d) for d in split.prefill_devs] == [str(d) for d in npu_devices[:2]]
        assert [g.device for g in split.groups] == list(npu_devices[2:4])
        got = _run_concurrently(split, PROMPTS, lengths)
        assert got == want
        assert {g.ck.devices().pop() for g in split.groups} == set(npu_devices[2:4])
    finally:
        split.stop()


def test_stops_at_eos_max_tokens_and_context(tiny, eng1) -> None:
    from flexnpu.serving.sampling import SamplingParams

    eng = eng1
    try:
        out, reason = eng.generate(PROMPTS[0], _greedy(5))
        assert len(out) == 5 and reason == "length"
        # Stop at the first generated token by declaring it eos.
        eng.eos_id = out[0]
        out2, reason2 = eng.generate(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0))
        assert out2 == [] and reason2 == "stop"  # eos ends the request, is not streamed
        eng.eos_id = -1
        out3, reason3 = eng.generate(PROMPTS[2], _greedy(1000))
        assert reason3 == "length" and len(PROMPTS[2]) + len(out3) == 96
        with pytest.raises(ValueError):
            eng.submit(list(range(33)), _greedy(1), lambda *a: None)
    finally:
        eng.eos_id = tiny.config.eos_id


def test_seeded_sampling_is_reproducible(eng1) -> None:
    from flexnpu.serving.sampling import SamplingParams

    eng = eng1
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    a = eng.generate(PROMPTS[1], sp)[0]
    b = eng.generate(PROMPTS[1], sp)[0]
    c = eng.generate(PROMPTS[1], SamplingParams(max_tokens=12, temperature=1.0, seed=8,
                                                ignore_eos=True))[0]
    assert a == b and a != c


def test_abort_frees_the_slot(eng1) -> None:
    eng = eng1
    got = []
    done = threading.Event()

    def sink(tok, reason):
        if reason is not None:
            got.append(reason)
            done.set()

    req = eng.submit(PROMPTS[0], _greedy(10_000), sink)
    while eng.num_running() == 0:
        threading.Event().wait(0.01)
    eng.abort(req)
    assert done.wait(10) and got == ["abort"]
    for _ in range(100):
        if eng.num_running() == 0:
            break
        threading.Event().wait(0.01)
    assert eng.num_running() == 0


def test_sampling_top_p_keeps_the_nucleus() -> None:
    from flexnpu.serving.sampling import SamplingParams, sample

    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    rng = np.random.default_rng(0)
    sp = SamplingParams(temperature=1.0, top_p=0.7)
    assert {sample(logits, sp, rng) for _ in range(200)} == {0, 1}
    assert sample(logits, SamplingParams(temperature=0.0), rng) == 0
