"""Serving across a Ray cluster (`serve --ray`): a local cluster of two nodes started by
ray.cluster_utils.Cluster, each offering one FlexNPU device (the custom resource
flexnpu_devices), one replica actor per node serving a tiny random Llama, and the front in this
process routing to them. Greedy answers through the cluster are compared with a single-host
engine's; a replica killed mid-run, or its node, leaves no request unaccounted for (and no
client hanging); a node that joins later gets a replica.

Needs the [ray] extra (pip install ".[ray]"); skipped without it."""

from __future__ import annotations

import time

import pytest
from _serving import (
    greedy,
    require,
    serve_app_in_thread,
    submit_greedy,
    tiny_ray_front,
    wait_all,
)

ray = pytest.importorskip(
    "ray", reason="the Ray cluster tests need the [ray] extra: pip install '.[ray]'"
)

# Adding a node starts its processes with subprocess (fork + exec), which JAX warns about.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

MAX_LEN = 1024  # a long request takes seconds: time to kill its replica while it runs
DONE_TIMEOUT_S = 180  # a client never waits longer than this (a 2-core machine under load)
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((5, 12, 40, 9, 33, 1))]
LENGTHS = [20, 6, 14, 3, 25, 9]


def _engine_config():
    from flexnpu.serving.engine import EngineConfig

    # One sequence per step and replica: the others wait, so a killed replica has both.
    return EngineConfig(
        max_num_seqs=1,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=32,
        block_size=8,
        decode_widths=[4],
        num_devices=1,
    )


@pytest.fixture(scope="module")
def cluster():
    require("prometheus_client")
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=1, resources={"flexnpu_devices": 1}, include_dashboard=False),
    )
    c.add_node(num_cpus=1, resources={"flexnpu_devices": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="flexnpu-tests", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def front(cluster):
    from flexnpu.serving.multihost.front import FrontConfig

    config = FrontConfig(discover_interval_s=0.5, liveness_timeout_s=60)
    with tiny_ray_front(_engine_config(), config) as f:
        yield f


@pytest.fixture(scope="module")
def single_host(npu_devices):
    """The same model and engine options on one host (this process), for the greedy ids."""
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps

    m = load_model("random:tiny", seed=1, log=lambda *_: None)
    ec = _engine_config()
    steps = ModelSteps(m.config, ec.block_size, m.vocab_limit)  # as `serve` builds it
    eng = Engine(steps, m.params, ec, devices=npu_devices[:1], eos_ids=m.eos_ids)
    eng.warmup()
    eng.start()
    yield [
        eng.generate(p, greedy(n), timeout=DONE_TIMEOUT_S)[0]
        for p, n in zip(PROMPTS, LENGTHS, strict=True)
    ]
    eng.stop()


def _submit(front, prompt, max_tokens):
    return submit_greedy(front, prompt, max_tokens)


def _wait_all(outs) -> None:
    wait_all(outs, DONE_TIMEOUT_S)


def test_one_named_replica_per_offering_node(cluster, front) -> None:
    from flexnpu.serving.multihost.ray_replicas import replica_name

    infos = front.replicas()
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(infos) == 2 and {i.node_id for i in infos} == nodes
    for info in infos:
        assert info.name == replica_name(info.node_id) == f"flexnpu-replica-{info.node_id[:8]}"
        assert ray.get_actor(info.name) is not None  # what the dashboard lists
        assert info.devices == "1 flexnpu devices over cpu"
    assert front.healthy and front.error is None


def test_greedy_through_the_cluster_equals_one_host_and_spreads(front, single_host) -> None:
    sent = [_submit(front, p, n) for p, n in zip(PROMPTS, LENGTHS, strict=True)]
    _wait_all([out for _, out in sent])
    assert [out.ids for _, out in sent] == single_host
    assert [out.finish_reason for _, out in sent] == ["length"] * len(PROMPTS)
    # A burst is spread: each replica takes half (least loaded, counting what it was sent).
    by_replica = [req.replica for req, _ in sent]
    assert sorted(by_replica.count(r) for r in set(by_replica)) == [3, 3]


def test_openai_endpoint_streams_and_metrics_name_hosts(front, single_host) -> None:
    require("fastapi", "uvicorn", "httpx")
    import httpx

    from flexnpu.serving.loading import load_tokenizer
    from flexnpu.serving.server import ServerState, create_app

    state = ServerState(front, load_tokenizer("random:tiny"), "tiny", metrics=front.metrics)
    url, srv, th = serve_app_in_thread(create_app(state))
    try:
        with httpx.Client(base_url=url, timeout=DONE_TIMEOUT_S) as h:
            assert h.get("/health").status_code == 200
            body = {
                "model": "tiny",
                "prompt": PROMPTS[0],
                "max_tokens": LENGTHS[0],
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 1,
            }
            plain = h.post("/v1/completions", json=body).json()
            assert (
                plain["choices"][0]["logprobs"]["tokens"]
                and plain["usage"]["completion_tokens"] == LENGTHS[0]
            )
            with h.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                lines = [x for x in r.iter_lines() if x.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            import json

            text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines[:-1])
            assert text == plain["choices"][0]["text"]
            metrics = h.get("/metrics").text
    finally:
        srv.should_exit = True
        th.join(10)
    for info in front.replicas():
        assert f'host="{info.host}"' in metrics
        assert (
            f'flexnpu:num_requests_running{{host="{info.host}",model_name="tiny",'
            f'replica="{info.name}"}}' in metrics
        )
    assert 'replica="front"' in metrics
    assert "flexnpu:cluster_replicas" in metrics and metrics.count("# TYPE flexnpu:") == len(
        {x.split()[2] for x in metrics.splitlines() if x.startswith("# TYPE flexnpu:")}
    )


def test_killed_replica_reroutes_queued_fails_running_then_a_new_node_serves(
    cluster, front, single_host
) -> None:
    # Long requests (seconds each): one runs on each replica, two wait behind it.
    n = MAX_LEN - 40 - 1
    sent = [_submit(front, PROMPTS[0], n) for i in range(6)]
    victim = sent[0][0].replica
    on_victim = [(req, out) for req, out in sent if req.replica == victim]
    assert len(on_victim) == 3  # equal prompts: the burst alternates between the replicas
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not sent[0][0].num_tokens:  # the victim's first request runs (FIFO), two wait
        assert time.monotonic() < deadline, "no token from the victim"
        time.sleep(0.01)
    host = next(i.host for i in front.replicas() if i.name == victim)
    ray.kill(ray.get_actor(victim), no_restart=True)
    _wait_all([out for _, out in sent])

    running, queued = on_victim[0], on_victim[1:]
    assert running[1].finish_reason.startswith(f"error: replica {victim} on host {host} died: "), (
        running[1].finish_reason
    )
    # Ray's own words vary with timing: the kill's cause ("killed by `ray.kill`"), or the worker
    # process' death when the poll's task saw the process go first.
    assert "ActorDiedError: " in running[1].finish_reason, running[1].finish_reason
    assert running[0].reroutes == 0 and 0 < len(running[1].ids) < n
    for req, out in sent:
        if req is not running[0]:
            assert (out.finish_reason, len(out.ids)) == ("length", n)
            assert req.replica != victim and out.ids[: LENGTHS[0]] == single_host[0]
    assert [req.reroutes for req, _ in queued] == [1, 1] and front.reroutes == 2
    assert front.healthy and [i.name for i in front.replicas()] == [sent[1][0].replica]

    # The endpoint serves afterwards, with the same greedy answer.
    req, out = _submit(front, PROMPTS[1], LENGTHS[1])
    _wait_all([out])
    assert out.ids == single_host[1] and req.replica != victim

    # A node that joins with devices gets a replica.
    node = cluster.add_node(num_cpus=1, resources={"flexnpu_devices": 1})
    deadline = time.monotonic() + DONE_TIMEOUT_S * 2
    while len(front.replicas()) < 2:
        assert time.monotonic() < deadline, "the new node got no replica"
        time.sleep(0.5)
    joined = next(i for i in front.replicas() if i.name != req.replica)
    assert joined.name != victim
    outs = [_submit(front, PROMPTS[i], LENGTHS[i]) for i in range(4)]
    _wait_all([o for _, o in outs])
    assert [o.ids for _, o in outs] == single_host[:4]
    assert joined.name in {r.replica for r, _ in outs}

    # That node dies (its raylet and workers killed) while a long request runs there and one
    # waits: the running one fails naming the replica, the waiting one finishes elsewhere.
    last = [_submit(front, PROMPTS[0], n) for _ in range(4)]
    on_joined = [x for x in last if x[0].replica == joined.name]
    survivor = next(req.replica for req, _ in last if req.replica != joined.name)
    assert len(on_joined) == 2  # the burst alternates
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not on_joined[0][0].num_tokens:
        assert time.monotonic() < deadline, "no token from the joined replica"
        time.sleep(0.01)
    cluster.remove_node(node, allow_graceful=False)
    _wait_all([out for _, out in last])
    assert on_joined[0][1].finish_reason.startswith(
        f"error: replica {joined.name} on host {joined.host} died: "
    ), on_joined[0][1].finish_reason
    assert on_joined[1][1].finish_reason == "length" and on_joined[1][0].replica == survivor
    assert [i.name for i in front.replicas()] == [survivor] and front.healthy
