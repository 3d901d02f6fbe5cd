"""KV handoff across hosts on a local Ray cluster (ray.cluster_utils.Cluster): two nodes with
one FlexNPU device each, the front's split host layout (the first host prefills, the second
decodes). Greedy answers equal a single-host engine's, the KV bytes counted between the hosts
are what the prompts' KV blocks weigh, and a decode replica killed while it holds handed-off
requests: with recompute, each goes on at the host left with the greedy ids of an uninterrupted
run (none hangs), and the endpoint goes on serving there. (A death failing the running
requests with the replica's name: test_ray_cluster.py, and test_multihost_front.py around a
handoff.)

Needs the [ray] extra (pip install ".[ray]"); skipped without it."""

from __future__ import annotations

import time

import pytest
from _serving import greedy, submit_greedy, tiny_ray_front, wait_all

ray = pytest.importorskip(
    "ray", reason="the Ray cluster tests need the [ray] extra: pip install '.[ray]'"
)

pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

MAX_LEN = 256
LONG = MAX_LEN - 40 - 1  # tokens of a request that decodes for a while
BLOCK = 16
DONE_TIMEOUT_S = 180
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((5, 17, 40, 33))]
LENGTHS = [20, 6, 14, 25]


def _engine_config():
    from flexnpu.serving.engine import EngineConfig

    # One sequence per step: handed-off requests wait on the decode host behind the one
    # that runs, so a killed decode replica holds both kinds.
    return EngineConfig(
        max_num_seqs=1,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=64,
        block_size=BLOCK,
        decode_widths=[4],
        num_devices=1,
        kv_handoff=True,
    )


@pytest.fixture(scope="module")
def front():
    from ray.cluster_utils import Cluster

    from flexnpu.serving.multihost.front import FrontConfig

    c = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=1, resources={"flexnpu_devices": 1}, include_dashboard=False),
    )
    c.add_node(num_cpus=1, resources={"flexnpu_devices": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="flexnpu-handoff-tests", log_to_driver=False)
    config = FrontConfig(liveness_timeout_s=60, layout="split", prefill_hosts=1)
    try:
        with tiny_ray_front(_engine_config(), config) as f:
            yield f
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def single_host(npu_devices):
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps

    m = load_model("random:tiny", seed=1, log=lambda *_: None)
    ec = _engine_config()
    eng = Engine(
        ModelSteps(m.config, BLOCK, m.vocab_limit),
        m.params,
        ec,
        devices=npu_devices[:1],
        eos_ids=m.eos_ids,
    )
    eng.warmup()
    eng.start()
    answers = [
        eng.generate(p, greedy(n), timeout=DONE_TIMEOUT_S)[0]
        for p, n in zip(PROMPTS, LENGTHS, strict=True)
    ]
    long = eng.generate(PROMPTS[2], greedy(LONG), timeout=DONE_TIMEOUT_S)[0]
    yield m, answers, long
    eng.stop()


def _submit(front, prompt, max_tokens):
    return submit_greedy(front, prompt, max_tokens)


def _wait_all(outs) -> None:
    wait_all(outs, DONE_TIMEOUT_S)


def _counter(text: str, name: str) -> float:
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + "{"))


def test_split_across_hosts_answers_as_one_host_and_counts_the_kv(front, single_host) -> None:
    from flexnpu.serving import kvcache

    m, want, _ = single_host
    (_, pre, prefill), (_, dec, decode) = front.host_roles()
    assert (prefill, decode) == ("prefill", "decode")
    sent = [_submit(front, p, n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    _wait_all([out for _, out in sent])
    assert [out.ids for _, out in sent] == want
    assert [out.finish_reason for _, out in sent] == ["length"] * len(PROMPTS)
    assert [req.handoffs for req, _ in sent] == [[(pre, dec)]] * len(PROMPTS)
    # The bytes moved are the prompts' KV blocks (the KV of each prompt's positions), counted
    # once the decode host fetched them through the object store.
    weight = sum(-(-len(p) // BLOCK) for p in PROMPTS) * kvcache.bytes_per_block(m.config, BLOCK)
    text = front.metrics.render().decode()
    assert _counter(text, "flexnpu:kv_transfer_bytes_total") == weight
    assert _counter(text, "flexnpu:kv_transfers_total") == len(PROMPTS)
    assert _counter(text, "flexnpu:kv_transfer_seconds_total") > 0
    assert f'source_replica="{pre}"' in text and f'destination_replica="{dec}"' in text


def test_decode_replica_killed_with_handed_off_requests_recomputed(front, single_host) -> None:
    _, want, long = single_host
    (host, pre, _), (_, dec, _) = front.host_roles()
    front.config.recompute = True
    sent = [_submit(front, PROMPTS[2], LONG) for _ in range(3)]
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not sent[0][0].num_tokens >= 2:  # the first decodes on the decode host
        assert time.monotonic() < deadline, "no token from the decode host"
        time.sleep(0.01)
    ray.kill(ray.get_actor(dec), no_restart=True)
    _wait_all([out for _, out in sent])
    # Those handed off are computed again on the host left from where they were (one at
    # least: the first was decoding); one prefilled after the death goes on where its KV is.
    # None ends on `dec`: the handoffs enter its engine in the order they were sent, so the
    # others wait behind the first for its one batch slot (entering as their KV came, one
    # once took the slot, ran to its end on `dec` before the kill and the first waited).
    assert sent[0][0].handoffs == [(pre, dec)] and sent[0][0].recomputes == 1
    ends = [(req.replica, req.handoffs, req.recomputes) for req, _ in sent]
    assert [(out.ids, out.finish_reason) for _, out in sent] == [(long, "length")] * 3, ends
    assert all(end in ((pre, [(pre, dec)], 1), (pre, [(pre, pre)], 0)) for end in ends), ends
    # One host left: it prefills and decodes (no handoff), with the same greedy answer.
    assert front.healthy and front.host_roles() == [(host, pre, "mixed")]
    req, out = _submit(front, PROMPTS[1], LENGTHS[1])
    _wait_all([out])
    assert out.ids == want[1] and req.replica == pre and req.handoffs == []
