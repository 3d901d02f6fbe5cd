"""The multi-host front without Ray: routing by load key, a dead replica's requests (re-routed
before their first token, failed with its name after), nodes that join, and `serve --ray`'s
errors when Ray is missing or the options are wrong. Replicas here are scripted fakes; the
real ones (Ray actors over engines) are tests/python/test_ray_cluster.py's."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import pytest
from _subprocess import run_python

TIMEOUT_S = 30


@dataclass(frozen=True)
class _Node:
    node_id: str
    host: str


class _FakeReplica:
    """A replica the test drives: it records submits and aborts, reports the load it is told,
    emits what the test says and dies on `die`."""

    def __init__(self, node: _Node) -> None:
        self.name, self.host, self.node = f"flexnpu-replica-{node.node_id}", node.host, node
        self.submitted: list[int] = []
        self.aborted: list[int] = []
        self.load = (0, 0, 0.0)
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
        )

    def submit(self, rid, prompt_ids, sampling, timeout_s, priority) -> None:
        self.submitted.append(rid)

    def abort(self, rid) -> None:
        self.aborted.append(rid)

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
        return events, ReplicaStatus(self.load, 0, 0, 0.0, 0, True, None)

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
