"""The multi-host front without Ray: routing by load key, a dead replica's requests (re-routed
before their first token, failed with its name after), nodes that join, KV handoff between
hosts (the split host layout: which replica prefills, which decodes, what a death at each
point does), and `serve --ray`'s errors when Ray is missing or the options are wrong. Replicas
here are scripted fakes, and real replicas (ReplicaServer over an engine) in this process; the
Ray actors are tests/python/test_ray_cluster.py's."""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _serving import greedy
from _subprocess import run_python

TIMEOUT_S = 30


@dataclass(frozen=True)
class _Node:
    node_id: str
    host: str
    devices: int = 1


class _FakeReplica:
    """A replica the test drives: it records submits and aborts, reports the load it is told,
    emits what the test says and dies on `die`."""

    def __init__(self, node: _Node) -> None:
        self.name, self.host, self.node = f"flexnpu-replica-{node.node_id}", node.host, node
        self.submitted: list[int] = []
        self.exports: list[int] = []  # submitted to stop after the prompt
        self.continued: list[tuple[int, object, str]] = []  # submit_prefilled: (id, kv, source)
        self.continuations: list = []  # what submit_prefilled got
        self.moves: list[list[int] | None] = []  # export_running calls
        self.move_error: Exception | None = None  # export_running raises it
        self.aborted: list[int] = []
        self.abort_reasons: list[str] = []
        self.load = (0, 0, 0.0)
        self.free_slots = 0  # a full batch: the load key alone routes
        self._events: queue.Queue = queue.Queue()
        self._dead: str | None = None

    def start(self):
        from flexnpu.serving.config import RANDOM_PRESETS
        from flexnpu.serving.engine import EngineConfig
        from flexnpu.serving.multihost.replica import ReplicaInfo

        return ReplicaInfo(
            self.name,
            self.host,
            self.node.node_id,
            1,
            "1 fake device",
            "colocated",
            "tiny",
            RANDOM_PRESETS["tiny"],
            (2,),
            128,
            EngineConfig(max_model_len=128, max_waiting=4),
            0.0,
            num_devices=self.node.devices,
        )

    def submit(self, rid, prompt_ids, sampling, timeout_s, priority, export=False) -> None:
        self.submitted.append(rid)
        self.work = (list(prompt_ids), sampling.max_tokens)  # the last submit's
        if export:
            self.exports.append(rid)

    def submit_prefilled(self, c) -> None:
        self.continuations.append(c)
        self.continued.append((c.rid, c.kv, c.source))

    def export_running(self, rids) -> None:
        if self.move_error is not None:
            raise self.move_error
        self.moves.append(rids)

    def kv_source(self, rid):
        return ("kv of", self.name, rid)

    def prefilled(self, rid: int, first: int) -> None:
        """The request stopped after its prompt here (its first token, then the export)."""
        from flexnpu.serving.multihost.replica import PrefillDone, RequestEvents

        ev = RequestEvents([(first, None)], None, PrefillDone((first,), (1, 0), 1, 4096))
        self._events.put({rid: ev})

    def moved(self, rid: int, before: list[int], last: int) -> None:
        """The request stopped at its next token here (`last`, after `before`), moved off."""
        from flexnpu.serving.multihost.replica import PrefillDone, RequestEvents

        done = PrefillDone((*before, last), (1, 0), 1, 4096, moved=True)
        self._events.put({rid: RequestEvents([(last, None)], None, done)})

    def abort(self, rid, reason="abort") -> None:
        self.aborted.append(rid)
        self.abort_reasons.append(reason)

    def emit(self, rid: int, tokens: list[int], finish: str | None = None) -> None:
        from flexnpu.serving.multihost.replica import RequestEvents

        self._events.put({rid: RequestEvents([(t, None) for t in tokens], finish)})

    def die(self, why: str) -> None:
        self._dead = why

    def poll(self, wait_s, timeout_s):
        from flexnpu.serving.multihost.ray_replicas import ReplicaDiedError
        from flexnpu.serving.multihost.replica import ReplicaStatus

        if self._dead:
            raise ReplicaDiedError(self._dead)
        try:
            events = self._events.get(timeout=wait_s)
        except queue.Empty:
            events = {}
        # Reports no submit taken: what the front sent counts as waiting on it (deterministic).
        return events, ReplicaStatus(
            self.load, 0, 0, 0.0, 0, True, None, free_slots=self.free_slots
        )

    def metrics_text(self, timeout_s):
        return b""

    def kill(self) -> None:
        self._dead = self._dead or "killed"


class _FakeLauncher:
    def __init__(self, nodes: list[_Node]) -> None:
        self.nodes = list(nodes)
        self.replicas: dict[str, _FakeReplica] = {}

    def offering_nodes(self):
        return list(self.nodes)

    def launch(self, node):
        rep = self.replicas[node.node_id] = _FakeReplica(node)
        return rep


class _Out:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.done = threading.Event()

    def on_token(self, token_id, logprobs, now):
        self.tokens.append(token_id)
        return "stop" if token_id == 99 else None  # a stop string, as the server's output

    def on_finish(self, reason, now):
        self.finish = reason
        self.done.set()


@pytest.fixture
def front():
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig

    launcher = _FakeLauncher([_Node("aaaa", "host-a"), _Node("bbbb", "host-b")])
    f = ClusterFront(
        launcher, None, FrontConfig(poll_wait_s=0.01, discover_interval_s=0.05), log=lambda *_: None
    )
    f.start()
    yield f, launcher.replicas["aaaa"], launcher.replicas["bbbb"], launcher
    f.stop()


def _submit(f, n=3):
    from flexnpu.serving.sampling import SamplingParams

    out = _Out()
    return f.submit([5] * n, SamplingParams(max_tokens=8), out), out


def _wait(cond) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_routes_by_load_key_counting_what_was_sent(front) -> None:
    f, a, b, _ = front
    a.load = (10, 0, 0.0)  # a has 10 waiting tokens: b takes the next ones until it has more
    _wait(lambda: f._replicas[a.name].status.load_key == (10, 0, 0.0))
    sent = [_submit(f, n=3)[0] for _ in range(4)]
    # b: 0 -> 4 -> 8 -> 12 (3 tokens + 1 request each, not yet taken), so the 4th goes to a.
    assert [r.replica for r in sent] == [b.name, b.name, b.name, a.name]
    assert f.healthy and f.num_running() == 0


def test_a_free_batch_slot_comes_before_a_shorter_queue(front) -> None:
    """At capacity (every batch full but a's two slots), the prompts in flight to a count as
    its waiting tokens, yet the next goes to a while a slot is left for it: on b it would wait
    for a whole sequence to end. Then the load key alone decides."""
    f, a, b, _ = front
    a.free_slots = 2
    _wait(lambda: f._replicas[a.name].status.free_slots == 2)
    sent = [_submit(f, n=3)[0] for _ in range(4)]
    # a: two slots; then a (4 + 4 waiting, full) against b (0, full): b, then b (4) again.
    assert [r.replica for r in sent] == [a.name, a.name, b.name, b.name]
    b.free_slots = 4  # b reports its slots (nothing it was sent is taken yet): 2 left for it
    _wait(lambda: f._replicas[b.name].status.free_slots == 4)
    sent = [_submit(f, n=3)[0] for _ in range(2)]
    # b, though its 8 then 12 queued tokens are not fewer than a's 8.
    assert [r.replica for r in sent] == [b.name, b.name]


def test_dead_replica_reroutes_unstarted_and_fails_started(front) -> None:
    f, a, b, _ = front
    b.load = (100, 0, 0.0)  # everything to a
    _wait(lambda: f._replicas[b.name].status.load_key[0] == 100)
    (r1, o1), (r2, o2) = _submit(f), _submit(f)
    assert r1.replica == r2.replica == a.name
    a.emit(r1.id, [7, 8])
    _wait(lambda: r1.num_tokens == 2)
    a.die("ActorDiedError: The actor is dead because its node has died.")
    assert o1.done.wait(TIMEOUT_S)
    assert o1.finish == (
        f"error: replica {a.name} on host host-a died: ActorDiedError: The "
        "actor is dead because its node has died."
    )
    _wait(lambda: r2.replica == b.name)
    assert r2.reroutes == 1 and b.submitted == [r2.id] and f.reroutes == 1
    b.emit(r2.id, [1, 2, 3], "length")
    assert o2.done.wait(TIMEOUT_S) and (o2.tokens, o2.finish) == ([1, 2, 3], "length")
    assert f.healthy and [i.name for i in f.replicas()] == [b.name]
    # The last replica dies: the endpoint says why, and new requests are refused.
    b.die("gone")
    _wait(lambda: not f.healthy)
    assert f.error == f"no live replica (last failure: replica {b.name} on host host-b died: gone)"
    from flexnpu.serving.engine import EngineDeadError

    with pytest.raises(EngineDeadError, match="no live replica"):
        _submit(f)


def test_stop_decided_by_the_front_aborts_on_the_replica(front) -> None:
    f, a, b, _ = front
    r, out = _submit(f)
    rep = a if r.replica == a.name else b
    rep.emit(r.id, [4, 99, 5])  # 99: the output's stop; 5 must not reach it
    assert out.done.wait(TIMEOUT_S)
    assert (out.tokens, out.finish) == ([4, 99], "stop") and rep.aborted == [r.id]


def test_full_queues_and_joining_nodes(front) -> None:
    from flexnpu.serving.scheduler import QueueFullError

    f, a, b, launcher = front
    for _ in range(8):  # max_waiting 4 per replica, nothing taken yet: both full
        _submit(f)
    with pytest.raises(QueueFullError, match="every replica's queue is full"):
        _submit(f)
    launcher.nodes.append(_Node("cccc", "host-c"))
    _wait(lambda: len(f.replicas()) == 3)
    r, _ = _submit(f)
    assert r.replica == "flexnpu-replica-cccc"


def _serve_without_ray(args: str) -> tuple[int, str]:
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
        "from flexnpu.__main__ import main\n"
        f"sys.exit(main(['serve', '--port', '0', {args}]))"
    )
    r = run_python(code, timeout=120)
    return r.returncode, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def test_serve_ray_without_ray_names_the_extra() -> None:
    code, line = _serve_without_ray("'--ray', '--model', 'random:tiny'")
    assert code == 2 and line.startswith(
        "flexnpu serve: serving on a Ray cluster needs Ray: pip install 'flexnpu[ray]' "
        "(ray==2.60.0)"
    ), line


def test_serve_ray_refuses_export_and_bad_env() -> None:
    code, line = _serve_without_ray("'--ray', '--export', '/tmp/x'")
    assert code == 2 and "--export and --from-export are single-host only" in line, line
    code, line = _serve_without_ray("'--ray', 'auto', '--ray-env', 'NOEQUALS'")
    assert code == 2 and line == "flexnpu serve: --ray-env 'NOEQUALS': expected KEY=VALUE", line


def test_serve_ray_unreachable_address_fails_at_once() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys, types; sys.modules['ray'] = types.ModuleType('ray')\n"  # never reached
        "from flexnpu.__main__ import main\n"
        f"sys.exit(main(['serve', '--port', '0', '--model', 'random:tiny', '--ray', "
        f"'127.0.0.1:{port}']))"
    )
    r = run_python(code, timeout=120)
    line = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and line.startswith(
        f"flexnpu serve: --ray 127.0.0.1:{port}: cannot reach the Ray cluster's head there"
    ), r.stderr


@pytest.fixture
def split_front():
    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig

    launcher = _FakeLauncher([_Node("aaaa", "host-a"), _Node("bbbb", "host-b")])
    metrics = ClusterMetrics("tiny")
    f = ClusterFront(
        launcher,
        metrics,
        FrontConfig(poll_wait_s=0.01, discover_interval_s=0.05, layout="split", prefill_hosts=1),
        log=lambda *_: None,
    )
    metrics.attach(f)
    f.start()
    yield f, launcher.replicas["aaaa"], launcher.replicas["bbbb"], metrics
    f.stop()


def test_split_prefills_on_one_host_and_decodes_on_the_other(split_front) -> None:
    f, a, b, metrics = split_front
    assert f.host_roles() == [
        ("host-a", a.name, "prefill"),
        ("host-b", b.name, "decode"),
    ]
    (r1, o1), (r2, o2) = _submit(f), _submit(f)
    # Prompts go to the prefill host only (both, though it is the busier one), to stop there.
    assert a.submitted == a.exports == [r1.id, r2.id] and b.submitted == []
    a.prefilled(r1.id, 7)
    _wait(lambda: len(b.continued) == 1)
    # The decode host fetches the KV from the prefill host: the front passes a handle.
    assert b.continued == [(r1.id, ("kv of", a.name, r1.id), a.name)]
    assert r1.replica == b.name and r1.handoffs == [(a.name, b.name)] and o1.tokens == [7]
    # The prefill host's later events of r1 are stale; the decode host's count.
    a.emit(r1.id, [1], "abort")
    b.emit(r1.id, [8, 9], "length")
    assert o1.done.wait(TIMEOUT_S) and (o1.tokens, o1.finish) == ([7, 8, 9], "length")
    # The decode host dies holding r2 (handed off): it fails naming that host; a request
    # submitted then runs colocated on the prefill host (one host left).
    a.prefilled(r2.id, 5)
    _wait(lambda: len(b.continued) == 2)
    b.die("ActorDiedError: gone")
    assert o2.done.wait(TIMEOUT_S)
    assert o2.finish == f"error: replica {b.name} on host host-b died: ActorDiedError: gone"
    r3, _ = _submit(f)
    assert r3.replica == a.name and a.exports == [r1.id, r2.id]
    assert f.host_roles() == [("host-a", a.name, "mixed")]


def test_prefill_host_dying_before_the_handoff_reroutes(split_front) -> None:
    f, a, b, _ = split_front
    r1, o1 = _submit(f)
    a.die("ActorDiedError: gone")
    # No token yet: re-routed to the one host left, which now prefills and decodes it.
    _wait(lambda: r1.replica == b.name)
    assert r1.reroutes == 1 and b.submitted == [r1.id] and b.exports == []
    b.emit(r1.id, [1, 2], "length")
    assert o1.done.wait(TIMEOUT_S) and o1.finish == "length"


def test_recompute_continues_running_requests_elsewhere(split_front) -> None:
    f, a, b, _ = split_front
    f.config.recompute = True
    (r1, o1), (r2, _) = _submit(f), _submit(f)
    a.prefilled(r1.id, 7)
    _wait(lambda: len(b.continued) == 1)
    b.emit(r1.id, [8])
    _wait(lambda: r1.num_tokens == 2)
    # The decode host dies: r1 goes on at the host left, its prompt followed by the tokens it
    # streamed, for the tokens it has left (8 in all).
    b.die("ActorDiedError: gone")
    _wait(lambda: r1.recomputes == 1)
    assert r1.replica == a.name and a.work == ([5, 5, 5, 7, 8], 6) and not o1.done.is_set()
    a.emit(r1.id, [9, 10], "length")
    assert o1.done.wait(TIMEOUT_S) and (o1.tokens, o1.finish) == ([7, 8, 9, 10], "length")
    # r2, prefilled after that with no decode host left, goes on where its KV is.
    a.prefilled(r2.id, 6)
    _wait(lambda: len(a.continued) == 1)
    assert a.continued == [(r2.id, None, a.name)] and r2.handoffs == [(a.name, a.name)]


def test_failed_kv_handoff_is_computed_again(split_front) -> None:
    f, a, b, _ = split_front
    f.config.recompute = True
    r, out = _submit(f)
    a.prefilled(r.id, 7)
    _wait(lambda: len(b.continued) == 1)
    b.emit(r.id, [], f"error: the KV handoff from replica {a.name} failed: KeyError: gone")
    _wait(lambda: r.recomputes == 1)
    # Sent to the prefill host again (its prompt and first token), to stop after it again.
    assert r.replica == a.name and a.exports == [r.id, r.id] and a.work == ([5, 5, 5, 7], 7)
    assert not out.done.is_set()
    # The decode host dying later does not touch r: it runs on the prefill host now.
    b.die("ActorDiedError: gone")
    _wait(lambda: len(f.replicas()) == 1)
    assert r.recomputes == 1 and r.replica == a.name and not out.done.is_set()
    a.prefilled(r.id, 8)  # no decode host left: it goes on where its KV is
    _wait(lambda: len(a.continued) == 1)
    a.emit(r.id, [9], "length")
    assert out.done.wait(TIMEOUT_S) and (out.tokens, out.finish) == ([7, 8, 9], "length")


class _EntryOrderEngine:
    """What a replica asks of its engine when a handoff continues: records which request
    enters first (it never decodes)."""

    eos_ids = frozenset({2})

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.ec = SimpleNamespace(block_size=8)
        self.entered: list[int] = []
        self.first_entry = threading.Event()

    def submit_prefilled(self, prefilled, sampling, out, *, deadline, priority):
        from types import SimpleNamespace

        self.entered.append(prefilled.prompt_ids[0])
        self.first_entry.set()
        return SimpleNamespace(done=False)

    def stop(self) -> None:
        pass


def test_handoffs_enter_the_decode_engine_in_the_order_they_were_sent() -> None:
    """A decode replica fetches handed-off KVs in parallel, but they take its engine's
    first-come batch slots in the order the front sent them: the first one's fetch is slow
    (it returns once something entered the engine, or after 1 s), the second's is at once;
    the first still enters first. (Entering as fetched, the second took the one decode slot
    of test_ray_handoff's decode host, ran to its end there before the host was killed, and
    the first waited: the request that ended on the killed host.)"""
    import numpy as np

    from flexnpu.serving.multihost.replica import Continuation, PrefillDone, ReplicaServer
    from flexnpu.serving.sampling import SamplingParams

    engine = _EntryOrderEngine()

    class SlowFirstFetch(ReplicaServer):
        def fetch_kv(self, source):
            if source == "slow":
                engine.first_entry.wait(1.0)
            kv = np.zeros((1, 8, 1, 4), np.float32)
            return kv, kv

    server = SlowFirstFetch(None, "flexnpu-replica-dddd", log=lambda *_: None)
    server.engine = engine
    done = PrefillDone((7,), (1, 0), 1, 256)
    for rid, kv in ((1, "slow"), (2, "fast")):
        server.submit_prefilled(
            Continuation(rid, [rid, 5, 5], SamplingParams(max_tokens=8), done, kv, "a")
        )
    _wait(lambda: len(engine.entered) == 2)
    server.stop()
    assert engine.entered == [1, 2]


def test_kv_transfers_and_host_roles_in_the_metrics(split_front) -> None:
    f, a, b, metrics = split_front
    from flexnpu.serving.multihost.replica import KvReceived, RequestEvents

    r, _ = _submit(f)
    a.prefilled(r.id, 3)
    _wait(lambda: len(b.continued) == 1)
    b._events.put({r.id: RequestEvents([(4, None)], None, None, KvReceived(a.name, 4096, 0.25))})
    _wait(lambda: r.num_tokens == 2)
    text = metrics.render().decode()
    pair = (
        f'destination_host="host-b",destination_replica="{b.name}",host="{metrics.host}",'
        f'replica="front",source_host="host-a",source_replica="{a.name}"'
    )
    assert f"flexnpu:kv_transfer_bytes_total{{{pair}}} 4096.0" in text
    assert f"flexnpu:kv_transfer_seconds_total{{{pair}}} 0.25" in text
    assert f"flexnpu:kv_transfers_total{{{pair}}} 1.0" in text
    assert (
        f'flexnpu:cluster_host_role{{host="{metrics.host}",replica="front",role="prefill",' in text
    )
    assert "flexnpu:prefill_units" in text


def test_bad_host_layouts_are_refused() -> None:
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig

    for cfg, msg in (
        (FrontConfig(layout="static-colocate"), "host layout 'static-colocate': expected one of"),
        (FrontConfig(layout="split", prefill_hosts=0), "prefill hosts must be >= 1, got 0"),
    ):
        with pytest.raises(ValueError, match=msg):
            ClusterFront(_FakeLauncher([]), None, cfg)


class _InProcessReplica:
    """A real replica (ReplicaServer over an engine) in this process, behind the front's
    replica interface: the KV handle it gives is a call of its take_kv."""

    def __init__(self, server, node: _Node) -> None:
        self.server, self.name, self.host = server, server.name, node.host

    def start(self):
        return self.server.start()

    def submit(self, *args) -> None:
        self.server.submit(*args)

    def submit_prefilled(self, c) -> None:
        self.server.submit_prefilled(c)

    def export_running(self, rids) -> None:
        self.server.export_running(rids)

    def kv_source(self, rid):
        return functools.partial(self.server.take_kv, rid)

    def abort(self, rid, reason="abort") -> None:
        self.server.abort(rid, reason)

    def poll(self, wait_s, timeout_s):
        return self.server.poll(wait_s)

    def metrics_text(self, timeout_s):
        return self.server.metrics_text()

    def kill(self) -> None:
        self.server.stop()


class _InProcessLauncher(_FakeLauncher):
    def __init__(self, nodes, spec) -> None:
        super().__init__(nodes)
        self.spec = spec

    def launch(self, node):
        from flexnpu.serving.multihost.replica import ReplicaServer

        server = ReplicaServer(self.spec, f"flexnpu-replica-{node.node_id}", node.node_id, 1)
        rep = self.replicas[node.node_id] = _InProcessReplica(server, node)
        return rep


# Prompt lengths around the block size (8) and the chunk (32); 70 takes three chunks.
PROMPTS = [[(7 * i + j) % 250 + 3 for j in range(n)] for i, n in enumerate((5, 12, 70, 9, 33))]
LENGTHS = [20, 6, 14, 3, 25]


def _tiny_engine_config():
    from flexnpu.serving.engine import EngineConfig

    return EngineConfig(
        max_num_seqs=4,
        max_model_len=128,
        max_num_batched_tokens=32,
        block_size=8,
        decode_widths=[4],
        num_devices=1,
        kv_handoff=True,
    )


@pytest.fixture(scope="module")
def one_engine(npu_devices):
    """The tiny model's greedy answers from one engine with the replicas' options."""
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps

    m = load_model("random:tiny", seed=1, log=lambda *_: None)
    ec = _tiny_engine_config()
    one = Engine(
        ModelSteps(m.config, 8, m.vocab_limit),
        m.params,
        ec,
        devices=npu_devices[:1],
        eos_ids=m.eos_ids,
    )
    one.warmup()
    one.start()
    yield m, [one.generate(p, greedy(n))[0] for p, n in zip(PROMPTS, LENGTHS, strict=True)], one
    one.stop()


def test_an_engines_free_slots_are_its_batch_less_what_runs_and_waits(
    one_engine, npu_devices
) -> None:
    """What a replica reports as free slots (ReplicaStatus.free_slots): an engine not started
    queues what it is sent, and each request takes a slot until none is left."""
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.output import IdsOutput
    from flexnpu.serving.runner import ModelSteps

    m, _, one = one_engine
    ec = _tiny_engine_config()
    steps = ModelSteps(m.config, 8, m.vocab_limit)
    eng = Engine(steps, m.params, ec, devices=npu_devices[:1], eos_ids=m.eos_ids)
    assert eng.entry_free_slots() == ec.max_num_seqs == 4
    for i, p in enumerate(PROMPTS):
        eng.submit(p, greedy(3), IdsOutput(greedy(3), eng.eos_ids))
        assert eng.entry_free_slots() == max(0, 3 - i)
    assert one.entry_free_slots() == 4  # the started engine, idle


@pytest.mark.parametrize("layout", ["split", "adaptive"])
def test_real_replicas_hand_the_kv_over_and_answer_as_one_engine(layout, one_engine) -> None:
    """Two replicas over engines in this process (the tiny model): in the split layout every
    prompt is prefilled on the first and decoded on the second, its KV fetched from host arrays;
    in the adaptive one (a scripted advisor: one host takes prompts) the same. Greedy ids equal
    one engine's, and the KV bytes counted are what the prompts' KV blocks weigh. Adaptive, the
    same front then moves running decodes (`_move_running_decodes`)."""
    from _serving import ScriptedSplit

    from flexnpu.serving import kvcache
    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig
    from flexnpu.serving.multihost.replica import ReplicaSpec
    from flexnpu.serving.output import IdsOutput

    m, want, one = one_engine
    ec = _tiny_engine_config()
    spec = ReplicaSpec(model="random:tiny", seed=1, engine_config=ec, compilation_cache=None)
    launcher = _InProcessLauncher([_Node("aaaa", "host-a"), _Node("bbbb", "host-b")], spec)
    metrics = ClusterMetrics("tiny")
    script = ScriptedSplit(1)
    cfg = FrontConfig(poll_wait_s=0.01, layout=layout, split_advisor=lambda n: script)
    f = ClusterFront(launcher, metrics, cfg, log=lambda *_: None)
    metrics.attach(f)
    f.start()
    try:
        sent = []
        for p, n in zip(PROMPTS, LENGTHS, strict=True):
            out = IdsOutput(greedy(n), f.eos_ids)
            sent.append((f.submit(p, greedy(n), out), out))
        for _, out in sent:
            assert out.done.wait(TIMEOUT_S * 4), "a request hung"
        assert [out.ids for _, out in sent] == want
        assert [out.finish_reason for _, out in sent] == ["length"] * len(PROMPTS)
        a, b = (f"flexnpu-replica-{x}" for x in ("aaaa", "bbbb"))
        assert [req.handoffs for req, _ in sent] == [[(a, b)]] * len(PROMPTS)
        per_block = kvcache.bytes_per_block(m.config, 8)
        weight = sum(-(-len(p) // 8) * per_block for p in PROMPTS)
        text = metrics.render().decode()
        line = next(x for x in text.splitlines() if x.startswith("flexnpu:kv_transfer_bytes_total"))
        assert f'source_replica="{a}"' in line and f'destination_replica="{b}"' in line
        assert float(line.split()[-1]) == weight
        if layout == "adaptive":
            _move_running_decodes(f, script, one, metrics)
    finally:
        f.stop()


def _move_running_decodes(f, script, one, metrics) -> None:
    """Host a turns mixed and runs requests; once each has streamed a token, a turns prefill and
    its running decodes move to b with their KV (from host arrays) mid-stream. Every answer
    (greedy, and seeded sampling) equals one engine's, every token once; the moves are
    counted, their KV with the handoffs'."""
    from flexnpu.serving.output import IdsOutput
    from flexnpu.serving.sampling import SamplingParams

    a, b = (f"flexnpu-replica-{x}" for x in ("aaaa", "bbbb"))
    # Short prompts, long answers (prompt + answer within max_model_len 128): still decoding
    # when the role changes.
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[3], PROMPTS[1]]
    samplings = [greedy(100), greedy(90), greedy(95)]
    samplings.append(SamplingParams(max_tokens=90, temperature=1.0, seed=5, ignore_eos=True))
    want = [one.generate(p, sp)[0] for p, sp in zip(prompts, samplings, strict=True)]
    script.ask = (0, 1)  # a mixed (takes prompts and decodes them), b decodes
    sent = []
    for p, sp in zip(prompts, samplings, strict=True):
        out = IdsOutput(sp, f.eos_ids)
        sent.append((f.submit(p, sp, out), out))
    assert [role for _, _, role in f.host_roles()] == ["mixed", "decode"]
    assert {req.replica for req, _ in sent} == {a}
    _wait(lambda: all(req.num_tokens for req, _ in sent))
    script.ask = 1  # at this arrival: a prefills, b decodes
    last = IdsOutput(greedy(6), f.eos_ids)
    sent.append((f.submit(PROMPTS[2], greedy(6), last), last))
    want.append(one.generate(PROMPTS[2], greedy(6))[0])
    for _, out in sent:
        assert out.done.wait(TIMEOUT_S * 4), "a request hung"
    assert [out.finish_reason for _, out in sent] == ["length"] * len(sent)
    assert [out.ids for _, out in sent] == want
    assert [req.num_tokens for req, _ in sent] == [len(w) for w in want]
    assert [req.handoffs for req, _ in sent] == [[(a, b)]] * len(sent)
    assert [req.moves for req, _ in sent] == [1, 1, 1, 1, 0]  # the last: a plain handoff
    text = metrics.render().decode()
    lines = [x for x in text.splitlines() if x.startswith("flexnpu:cluster_moved_decodes_total")]
    assert len(lines) == 1 and f'source_replica="{a}"' in lines[0]
    assert f'destination_replica="{b}"' in lines[0] and lines[0].endswith(" 4.0")
    line = next(x for x in text.splitlines() if x.startswith("flexnpu:kv_transfers_total"))
    assert line.endswith(f" {len(PROMPTS) + len(sent)}.0")  # the first handoffs, these


def test_serve_ray_host_layout_errors() -> None:
    code, line = _serve_without_ray("'--ray', '--layout', 'static-colocate'")
    assert code == 2 and line == (
        "flexnpu serve: --ray --layout static-colocate: across hosts the layouts are "
        "colocated, split, adaptive (each host's engine is colocated over its devices)"
    ), line
    code, line = _serve_without_ray("'--ray', '--layout', 'adaptive', '--prefill-hosts', '2'")
    assert code == 2 and line == (
        "flexnpu serve: --prefill-hosts 2: expected N >= 1 with --layout split"
    ), line
    code, line = _serve_without_ray("'--ray', '--prefill-devices', '1'")
    assert code == 2 and "--prefill-devices/--decode-devices split one host's devices" in line
    code, line = _serve_without_ray("'--prefill-hosts', '1', '--model', 'random:tiny'")
    assert code == 2 and line == (
        "flexnpu serve: --prefill-hosts splits the hosts of a Ray cluster: it needs --ray"
    ), line


def test_host_counts_against_the_layout() -> None:
    from flexnpu.cli.errors import CliError
    from flexnpu.cli.serve_ray import check_hosts

    check_hosts("colocated", 1, 1)
    check_hosts("split", 2, 3)
    with pytest.raises(
        CliError,
        match=r"--prefill-hosts 3: the cluster has 3 hosts offering "
        r"flexnpu_devices; expected 1 to 2 \(the others decode\)",
    ):
        check_hosts("split", 3, 3)
    with pytest.raises(CliError, match="--layout adaptive across hosts needs at least 2 hosts"):
        check_hosts("adaptive", 1, 1)


@contextlib.contextmanager
def _three_adaptive_hosts() -> Iterator:
    """A front over three fake hosts (a, b, c) in the adaptive host layout, the advisor
    scripted (one prefill host first): (front, script, a, b, c)."""
    from _serving import ScriptedSplit

    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig

    script = ScriptedSplit(1)
    launcher = _FakeLauncher([_Node(x * 4, f"host-{x}") for x in "abc"])
    f = ClusterFront(
        launcher,
        None,
        FrontConfig(poll_wait_s=0.01, layout="adaptive", split_advisor=lambda n: script),
        log=lambda *_: None,
    )
    f.start()
    try:
        yield f, script, *(launcher.replicas[x * 4] for x in "abc")
    finally:
        f.stop()


def test_adaptive_hosts_change_sides_and_drain() -> None:
    """Three hosts, the advisor scripted: 1 prefill host, then 2. A host that joins the prefill
    side takes prompts from the next arrival on and no more handoffs; it is asked to move what
    it decodes (a fake replica keeps it: test_a_host_leaving_the_decode_side_moves_...)."""
    with _three_adaptive_hosts() as (f, script, a, b, c):
        assert [role for _, _, role in f.host_roles()] == ["prefill", "decode", "decode"]
        r1, _ = _submit(f)
        a.prefilled(r1.id, 7)
        _wait(lambda: len(b.continued) + len(c.continued) == 1)
        first_decoder = b if b.continued else c
        script.ask = 2  # b joins the prefill side at the next arrival
        r2, _ = _submit(f)
        r3, _ = _submit(f)
        assert [role for _, _, role in f.host_roles()] == ["prefill", "prefill", "decode"]
        assert {r2.replica, r3.replica} == {a.name, b.name} and b.exports
        # Handoffs go to the decode side only (c), whatever b holds.
        for r in (r2, r3):
            (a if r.replica == a.name else b).prefilled(r.id, 5)
        _wait(lambda: len(c.continued) == 2 + (first_decoder is c))
        assert all(rid != r2.id and rid != r3.id for rid, _, _ in b.continued)
        assert r1.replica == first_decoder.name  # (the fake did not move it)
        if first_decoder is b:
            _wait(lambda: b.moves == [[r1.id]])
        assert c.moves == [] and b.moves == ([[r1.id]] if first_decoder is b else [])
        # b co-located (mixed): prompts that go there run there, not handed off.
        script.ask = (1, 1)
        sent = [_submit(f)[0] for _ in range(2)]
        assert [role for _, _, role in f.host_roles()] == ["prefill", "mixed", "decode"]
        on_b = [r for r in sent if r.replica == b.name]
        assert on_b and not set(b.exports) & {r.id for r in on_b}
        assert {r.replica for r in sent} == {a.name, b.name}


def test_prompts_queued_on_the_prefill_host_go_to_the_hosts_that_join_the_prompt_side() -> None:
    """A burst queued on the one prefill host, then the advisor co-locates all three at its
    next tick, no arrival needed (the front ticks it between arrivals): the newest queued
    prompts beyond an even share go to the hosts that joined (aborted where they were), the
    oldest stay; the old host's late events for a moved prompt are stale."""
    with _three_adaptive_hosts() as (f, script, a, b, c):
        burst = [_submit(f) for _ in range(4)]  # max_waiting 4: a's queue holds them
        assert {r.replica for r, _ in burst} == {a.name} and f.rebalanced == 0
        script.ask = (0, 3)  # every host mixed, at the advisor's next tick
        _wait(lambda: f.rebalanced == 2)
        assert [role for _, _, role in f.host_roles()] == ["mixed"] * 3
        # 4 queued over 3 hosts: a keeps 2 (the oldest), the 2 newest go to b and c.
        ids = [r.id for r, _ in burst]
        assert a.aborted == [ids[3], ids[2]] and f.rebalanced == 2
        assert a.abort_reasons == ["rebalanced"] * 2  # a's own series count them so
        assert [r.replica for r, _ in burst] == [a.name, a.name, c.name, b.name]
        assert b.submitted[:1] == [ids[3]] and c.submitted[:1] == [ids[2]]
        assert not (set(b.exports) | set(c.exports)) & set(ids)  # mixed: no handoff
        assert _submit(f)[0].replica in {b.name, c.name}
        moved, out = burst[3]
        a.emit(moved.id, [11])  # stale: the prompt left a
        b.emit(moved.id, [12], "length")
        _wait(lambda: out.done.is_set())
        assert out.tokens == [12] and out.finish == "length"


def test_topology_of_the_live_replicas_on_its_route(tmp_path) -> None:
    """The front reports its hosts (each replica's devices) and the inter-host link measured
    from its KV handoffs on GET /cluster/topology, in serving/topology.py's format, which
    `simulate --topology` reads; a single-host server has no such route."""

    from fastapi.testclient import TestClient

    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig
    from flexnpu.serving.multihost.replica import KvReceived, RequestEvents
    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.tokenizer import ByteTokenizer
    from flexnpu.serving.topology import Topology

    launcher = _FakeLauncher([_Node("aaaa", "host-a", 4), _Node("bbbb", "host-b", 8)])
    f = ClusterFront(
        launcher,
        None,
        FrontConfig(poll_wait_s=0.01, discover_interval_s=0.05, layout="split", prefill_hosts=1),
        log=lambda *_: None,
    )
    f.start()
    try:
        a, b = launcher.replicas["aaaa"], launcher.replicas["bbbb"]
        client = TestClient(create_app(ServerState(f, ByteTokenizer(), "tiny")))
        doc = client.get("/cluster/topology").json()
        assert doc == {
            "hosts": [{"name": "host-a", "devices": 4}, {"name": "host-b", "devices": 8}],
            "intra_host_link": None,
            "inter_host_link": None,  # no KV crossed hosts yet
        }
        # Two handoffs a -> b: 4096 + 12288 bytes fetched in 0.25 + 0.75 s, a has 4 devices.
        for nbytes, seconds in ((4096, 0.25), (12288, 0.75)):
            r, _ = _submit(f)
            a.prefilled(r.id, 3)
            _wait(lambda r=r: r.replica == b.name)
            b._events.put(
                {r.id: RequestEvents([(4, None)], None, None, KvReceived(a.name, nbytes, seconds))}
            )
            _wait(lambda r=r: r.num_tokens == 2)
        link = client.get("/cluster/topology").json()["inter_host_link"]
        assert link["bytes_per_s"] == pytest.approx(16384 / (1.0 * 4))  # per device of a
        assert link["latency_s"] == 0.0 and link["source"].startswith("2 KV handoffs")
        topo = Topology.from_json(client.get("/cluster/topology").json())
        assert topo == f.topology() and topo.devices == 12
        path = tmp_path / "topology.json"
        path.write_text(topo.dumps())
        assert Topology.loads(path.read_text()) == topo
        # b dies: the topology is the live replicas'.
        b.die("gone")
        _wait(lambda: len(f.replicas()) == 1)
        assert [h.name for h in f.topology().hosts] == ["host-a"]
    finally:
        f.stop()
    from _serving import FakeEngine

    single = TestClient(create_app(ServerState(FakeEngine(), ByteTokenizer(), "x")))
    assert single.get("/cluster/topology").status_code == 404


@pytest.fixture
def mixed_front():
    """Two fake hosts, the advisor scripted: host a mixed (takes prompts and decodes them), b
    decodes; a test then turns a to the prefill side (`script.ask = 1`)."""
    from _serving import ScriptedSplit

    from flexnpu.serving.multihost.cluster_metrics import ClusterMetrics
    from flexnpu.serving.multihost.front import ClusterFront, FrontConfig

    script = ScriptedSplit(0)
    script.mixed_units, script.ask = 1, (0, 1)
    launcher = _FakeLauncher([_Node("aaaa", "host-a"), _Node("bbbb", "host-b")])
    metrics = ClusterMetrics("tiny")
    cfg = FrontConfig(poll_wait_s=0.01, layout="adaptive", split_advisor=lambda n: script)
    f = ClusterFront(launcher, metrics, cfg, log=lambda *_: None)
    metrics.attach(f)
    f.start()
    yield f, launcher.replicas["aaaa"], launcher.replicas["bbbb"], script, metrics
    f.stop()


def test_a_host_leaving_the_decode_side_moves_its_running_requests(mixed_front) -> None:
    f, a, b, script, metrics = mixed_front
    assert [role for _, _, role in f.host_roles()] == ["mixed", "decode"]
    r1, o1 = _submit(f)
    assert r1.replica == a.name and a.exports == []  # runs where it was prefilled
    a.emit(r1.id, [1, 2])
    _wait(lambda: r1.num_tokens == 2)
    assert a.moves == []
    script.ask = 1  # a turns prefill at the next arrival: what it runs moves to b
    r2, _ = _submit(f)
    assert [role for _, _, role in f.host_roles()] == ["prefill", "decode"]
    assert r2.replica == a.name and a.exports == [r2.id]
    _wait(lambda: len(a.moves) == 1)
    assert a.moves == [[r1.id]]  # (r2 stops after its prompt anyway)
    # a stops r1 at its next token and keeps its KV; b continues it from there.
    a.moved(r1.id, [1, 2], 3)
    _wait(lambda: len(b.continued) == 1)
    assert b.continued == [(r1.id, ("kv of", a.name, r1.id), a.name)]
    assert b.continuations[0].done.output_ids == (1, 2, 3)
    assert r1.replica == b.name and r1.handoffs == [(a.name, b.name)] and r1.moves == 1
    a.emit(r1.id, [9], "abort")  # stale: r1 left a
    b.emit(r1.id, [4, 5], "length")
    assert o1.done.wait(TIMEOUT_S) and (o1.tokens, o1.finish) == ([1, 2, 3, 4, 5], "length")
    text = metrics.render().decode()
    pair = (
        f'destination_host="host-b",destination_replica="{b.name}",host="{metrics.host}",'
        f'replica="front",source_host="host-a",source_replica="{a.name}"'
    )
    assert f"flexnpu:cluster_moved_decodes_total{{{pair}}} 1.0" in text
    # A prompt prefilled on a (now a prefill host) is a handoff, not a move.
    a.prefilled(r2.id, 6)
    _wait(lambda: len(b.continued) == 2)
    assert r2.moves == 0 and f"flexnpu:cluster_moved_decodes_total{{{pair}}} 1.0" in (
        metrics.render().decode()
    )


def test_a_failed_move_ends_the_request_with_the_replica_named(mixed_front) -> None:
    f, a, b, script, _ = mixed_front
    r1, o1 = _submit(f)
    a.emit(r1.id, [1])
    _wait(lambda: r1.num_tokens == 1)
    a.move_error = RuntimeError("the actor is gone")
    script.ask = 1
    r2, o2 = _submit(f)
    assert o1.done.wait(TIMEOUT_S)
    assert o1.finish == (
        f"error: moving the request off replica {a.name} failed: RuntimeError: the actor is gone"
    )
    assert o1.tokens == [1] and a.aborted == [r1.id] and b.continued == []
    assert not o2.done.is_set() and r2.replica == a.name  # prefilled there, not moved


def test_a_replica_that_cannot_move_a_request_ends_it_naming_itself() -> None:
    """The front does not wait for `export_running` (a Ray call): a replica whose engine
    refuses the move ends the request itself, with an error naming the replica."""
    from types import SimpleNamespace

    from flexnpu.serving.multihost.replica import ReplicaServer, ReplicaSpec
    from flexnpu.serving.sampling import SamplingParams

    class _RefusingEngine:
        eos_ids = frozenset([2])

        def __init__(self) -> None:
            self.aborted: list[tuple[object, str]] = []

        def submit(self, prompt_ids, sampling, output, **kw):
            return SimpleNamespace(done=False)

        def export_running(self, requests, export):
            raise ValueError("exporting a running sequence needs an engine built with kv_handoff")

        def abort(self, req, reason="abort") -> None:
            self.aborted.append((req, reason))

    server = ReplicaServer(ReplicaSpec(model="random:tiny", engine_config=None), "replica-x")
    server.engine = engine = _RefusingEngine()
    server.submit(7, [5, 5], SamplingParams(max_tokens=4))
    server.export_running([7, 8])  # 8 is not there: skipped
    assert [reason for _, reason in engine.aborted] == [
        "error: moving the request off replica replica-x failed: ValueError: exporting a "
        "running sequence needs an engine built with kv_handoff"
    ]
    server.export_running(None)  # 7 left the replica's requests: nothing more
    assert len(engine.aborted) == 1
