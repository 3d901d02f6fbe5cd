"""The per-host daemon end to end: JAX processes with FLEXNPU_BACKEND=daemon:SOCK get the
physical backend's results, two at once; a killed client is reclaimed; a dead daemon fails
calls fast; the handshake, isolation, tenants and quotas hold at the protocol level."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flexnpu._daemon_wire import (
    OP_BUFFER_DESTROY,
    OP_BUFFER_FROM_HOST,
    OP_BUFFER_TO_HOST,
    OP_BUFFER_TO_HOST_SIZE,
    OP_COMPILE,
    OP_EVENT_READY,
    OP_EXECUTE,
    PROTOCOL_VERSION,
    Connection,
    Frame,
    daemon_stats,
)

TESTS = Path(__file__).parent
F32 = 11  # PJRT_Buffer_Type_F32
NO_LAYOUT = [-1, 0, 0, 0]  # a host layout field saying "none"
OK, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED = 0, 3, 5, 7
RESOURCE_EXHAUSTED, FAILED_PRECONDITION = 8, 9


class Daemon:
    def __init__(self, socket: Path, log: Path, tenants: Path | None = None,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.socket = socket
        self.log = log
        cmd = [sys.executable, "-m", "flexnpu", "daemon", "--socket", str(socket), *extra]
        if tenants is not None:
            cmd += ["--tenants", str(tenants)]
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
        clean.update(env or {})
        with open(log, "w") as out:
            self.process = subprocess.Popen(cmd, stderr=out, stdout=out, env=clean)
        deadline = time.monotonic() + 60
        while "ready on" not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start: {log.read_text()}")
            time.sleep(0.1)

    def stats(self) -> dict:
        return json.loads(daemon_stats(str(self.socket)))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("daemon")
    d = Daemon(tmp / "flexnpu.sock", tmp / "daemon.log")
    yield d
    d.stop()


def _client_env(socket: Path, tenant: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    env.update(JAX_PLATFORMS="flexnpu", FLEXNPU_BACKEND=f"daemon:{socket}")
    if tenant:
        env["FLEXNPU_TENANT"] = tenant
    return env


# Runs corpus programs (test_plugin_programs.PROGRAMS) on virtual device 2 and pickles the
# results: argv = [output path, names...].
CORPUS_CLIENT = """
import pickle, sys
import jax, numpy as np
sys.path.insert(0, {tests!r})
from test_plugin_programs import PROGRAMS
device = jax.devices()[2]
results = {{}}
for name in sys.argv[2:]:
    fn, args = PROGRAMS[name]
    out = jax.jit(fn)(*jax.device_put(args, device))
    results[name] = [np.asarray(leaf) for leaf in jax.tree.leaves(out)]
with open(sys.argv[1], "wb") as f:
    pickle.dump((jax.devices()[0].client.platform_version, results), f)
"""


def _assert_matches_backend(results: dict, ref_devices: list) -> None:
    from test_plugin_programs import PROGRAMS

    for name, got in results.items():
        fn, args = PROGRAMS[name]
        want = jax.tree.leaves(jax.jit(fn)(*jax.device_put(args, ref_devices[2])))
        assert len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            w = np.asarray(w)
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_two_clients_run_the_corpus_concurrently(daemon: Daemon, ref_devices: list,
                                                 tmp_path: Path) -> None:
    from test_plugin_programs import PROGRAMS

    names = sorted(PROGRAMS)
    code = CORPUS_CLIENT.format(tests=str(TESTS))
    outputs = [tmp_path / "a.pkl", tmp_path / "b.pkl"]
    # Different orders, so the two sessions compile and run different programs at once.
    orders = [names, names[::-1]]
    clients = [
        subprocess.Popen([sys.executable, "-c", code, str(out), *order],
                         env=_client_env(daemon.socket, tenant), stderr=subprocess.PIPE,
                         text=True)
        for out, order, tenant in zip(outputs, orders, ["alpha", "beta"], strict=True)
    ]
    for client in clients:
        _, err = client.communicate(timeout=600)
        assert client.returncode == 0, err[-3000:]
    for out in outputs:
        version, results = pickle.loads(out.read_bytes())
        assert "over cpu" in version
        assert sorted(results) == names
        _assert_matches_backend(results, ref_devices)
    assert daemon.stats()["sessions_served"] >= 2


# Holds a 4 MB buffer (shared-memory path) and a compiled executable, then waits.
HOLDER = """
import sys
import jax, jax.numpy as jnp, numpy as np
x = jax.device_put(np.ones((1024, 1024), np.float32))
y = jax.jit(lambda v: v * 2)(x)
assert float(y[0, 0]) == 2.0
print("holding", flush=True)
sys.stdin.readline()
"""

SMALL_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np
x = np.arange(100000, dtype=np.float32)
print(float(jax.jit(lambda v: (v * 3).sum())(x)))
"""


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_killed_client_is_reclaimed_while_others_run(daemon: Daemon) -> None:
    victim = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_client_env(daemon.socket, "victim"))
    survivor = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_client_env(daemon.socket, "survivor"))
    try:
        for p in (victim, survivor):
            assert p.stdout.readline().strip() == "holding", p.stderr.read()[-3000:]
        before = daemon.stats()
        assert before["tenants"]["victim"]["bytes_in_use"] >= 4 * 1024 * 1024
        victim_sessions = [s for s in before["sessions"] if s["tenant"] == "victim"]
        assert len(victim_sessions) == 1 and victim_sessions[0]["buffers"] >= 2
        assert victim_sessions[0]["executables"] >= 1

        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)

        def reclaimed() -> bool:
            s = daemon.stats()
            return (not any(x["tenant"] == "victim" for x in s["sessions"])
                    and s["tenants"]["victim"]["bytes_in_use"] == 0)

        assert _wait_for(reclaimed), daemon.stats()
        after = daemon.stats()
        assert after["tenants"]["victim"]["sessions"] == 0
        assert after["tenants"]["survivor"]["bytes_in_use"] >= 4 * 1024 * 1024
        # Others keep running: a new client computes while the survivor still holds its data.
        done = subprocess.run([sys.executable, "-c", SMALL_PROGRAM], capture_output=True,
                              text=True, timeout=300, env=_client_env(daemon.socket, "third"))
        assert done.returncode == 0, done.stderr[-3000:]
        assert float(done.stdout.strip()) == float((np.arange(100000, dtype=np.float32) * 3).sum())
    finally:
        for p in (victim, survivor):
            if p.poll() is None:
                p.communicate("\n", timeout=60)


# Computes once, waits for the test to kill the daemon, then computes again.
AFTER_DAEMON_DIES = """
import sys, time
import jax, numpy as np
f = jax.jit(lambda v: v + 1)
print(float(f(np.float32(1))), flush=True)
sys.stdin.readline()
start = time.monotonic()
try:
    print(float(f(np.float32(2))))
except Exception as e:
    print("ERROR", type(e).__name__, str(e).replace(chr(10), " "))
print("seconds", time.monotonic() - start)
"""


def test_daemon_death_fails_calls_fast_and_restart_serves_new_clients(tmp_path: Path) -> None:
    socket = tmp_path / "d.sock"
    d = Daemon(socket, tmp_path / "d1.log")
    client = subprocess.Popen([sys.executable, "-c", AFTER_DAEMON_DIES], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_client_env(socket))
    try:
        assert client.stdout.readline().strip() == "2.0", client.stderr.read()[-3000:]
        d.process.send_signal(signal.SIGKILL)
        d.process.wait(timeout=10)
        out, err = client.communicate("\n", timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
    lines = out.strip().splitlines()
    assert lines[0].startswith("ERROR"), out + err[-3000:]
    assert str(socket) in lines[0] and "connection lost" in lines[0], lines[0]

    # A new daemon takes over the stale socket file; new clients work.
    d2 = Daemon(socket, tmp_path / "d2.log")
    try:
        done = subprocess.run([sys.executable, "-c", SMALL_PROGRAM], capture_output=True,
                              text=True, timeout=300, env=_client_env(socket))
        assert done.returncode == 0, done.stderr[-3000:]
        assert float(done.stdout.strip()) == float((np.arange(100000, dtype=np.float32) * 3).sum())
    finally:
        d2.stop()
    assert not socket.exists()  # SIGTERM removes the socket


CACHE_CLIENT = """
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", {cache!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
exe = jax.jit(lambda x: x * 2 + 1).lower(jnp.arange(4.0)).compile()
print(list(map(float, exe(jnp.arange(4.0)))))
"""


def test_compilation_cache_through_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    # jaxlib asks the executable's name when it writes a cache entry and aborts the process if
    # that fails: the daemon's executables carry the backend's name.
    code = CACHE_CLIENT.format(cache=str(tmp_path / "cache"))
    for _ in range(2):  # a cold and a warm process
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env=_client_env(daemon.socket))
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "[1.0, 3.0, 5.0, 7.0]"
        assert any((tmp_path / "cache").glob("jit__lambda-*")), "no cache entry written"


def test_client_without_daemon_names_the_socket(tmp_path: Path) -> None:
    socket = tmp_path / "nobody.sock"
    done = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"],
                          capture_output=True, text=True, timeout=300,
                          env=_client_env(socket))
    assert done.returncode != 0
    assert f"cannot connect to the flexnpu daemon at {socket}" in done.stderr


def test_protocol_version_mismatch_is_refused(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as c:
        reply = c.hello(version=99)
    assert reply.code == FAILED_PRECONDITION
    assert "protocol version mismatch" in reply.text
    assert f"speaks version {PROTOCOL_VERSION}" in reply.text
    assert "client 99" in reply.text


def _device_indices(reply) -> list[tuple[int, int]]:
    ints = reply.ints
    pos = 2 + 3 * ints[1]
    count = ints[pos]
    pos += 1
    out = []
    for _ in range(count):
        index, device_id = ints[pos], ints[pos + 1]
        num_memories = ints[pos + 4]
        pos += 5 + num_memories
        out.append((index, device_id))
    return out


def _put(c: Connection, device_index: int, values: np.ndarray):
    data = values.astype(np.float32).tobytes()
    return c.call(OP_BUFFER_FROM_HOST,
                  [F32, 1, values.size, 0, device_index, -1, 1, len(data), 0], blobs=[data])


def test_a_session_cannot_name_another_sessions_buffer(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as a, Connection(str(daemon.socket)) as b:
        hello_a = a.hello("alpha")
        assert hello_a.code == OK
        assert b.hello("beta").code == OK
        device = _device_indices(hello_a)[0][0]
        put = _put(a, device, np.arange(4))
        assert put.code == OK, put.text
        buffer_id = put.ints[0]
        own = a.call(OP_BUFFER_TO_HOST_SIZE, [buffer_id, *NO_LAYOUT])
        assert own.code == OK and own.ints == [16]
        other = b.call(OP_BUFFER_TO_HOST_SIZE, [buffer_id, *NO_LAYOUT])
        assert other.code == NOT_FOUND
        assert f"buffer {buffer_id} is not one of session" in other.text


def test_one_way_transfer_failure_fails_its_event(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as c:
        assert c.hello("oneway").code == OK
        # BufferToHost has no reply (protocol 3): a refused one answers through its event.
        c.send(Frame(op=OP_BUFFER_TO_HOST, ints=[987654, 41, 16, 1, *NO_LAYOUT]))
        push = c.receive()
    assert push.op == OP_EVENT_READY and push.call_id == 0
    assert push.ints == [41, NOT_FOUND]
    assert "buffer 987654 is not one of session" in push.text


# A donating step through the daemon: results, deletion as JAX sees it, and the requests the
# daemon counted (by op) for the tenant.
DONATING_CLIENT = """
import json, jax, jax.numpy as jnp, numpy as np
step = jax.jit(lambda cache, x: (cache + x, jnp.sum(cache * x)), donate_argnums=0)
cache = jax.device_put(np.arange(8, dtype=np.float32))
x = jax.device_put(np.full(8, 2, np.float32))
for _ in range(3):
    old = cache
    cache, total = step(cache, x)
print(json.dumps({"cache": np.asarray(cache).tolist(), "total": float(total),
                  "old_deleted": old.is_deleted(), "x_deleted": x.is_deleted()}))
"""


def test_donation_is_seen_without_asking_and_requests_are_counted(daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, "-c", DONATING_CLIENT], capture_output=True,
                          text=True, timeout=300, env=_client_env(daemon.socket, "donor"))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cache"] == [float(v + 6) for v in range(8)]
    assert got["total"] == float(sum((v + 4) * 2 for v in range(8)))
    assert got["old_deleted"] is True and got["x_deleted"] is False
    donor = daemon.stats()["tenants"]["donor"]
    requests = donor["requests"]
    assert requests["Execute"]["count"] == 3
    assert requests["BufferToHost"]["count"] >= 2  # cache and total read back
    # Deletion by donation comes with the Execute reply: never asked per buffer.
    assert "BufferIsDeleted" not in requests
    assert donor["pushes"] >= 3 + 2 and donor["bytes_to_host"] >= 8 * 4 + 4


@pytest.fixture(scope="module")
def tenant_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("tenants")
    tenants = tmp / "tenants.toml"
    tenants.write_text(
        'allow_unknown = false\n'
        '[[tenants]]\nname = "small"\nmemory_quota_bytes = 1000\npriority = "batch"\n'
        '[[tenants]]\nname = "pinned"\ndevices = [1, 3]\npriority = "latency"\n'
    )
    d = Daemon(tmp / "t.sock", tmp / "t.log", tenants)
    yield d
    d.stop()


def test_unknown_tenant_is_refused(tenant_daemon: Daemon) -> None:
    with Connection(str(tenant_daemon.socket)) as c:
        reply = c.hello("stranger")
    assert reply.code == PERMISSION_DENIED
    assert "unknown tenant 'stranger'" in reply.text and "refuses unknown tenants" in reply.text


def test_quota_is_enforced_with_tenant_quota_and_request(tenant_daemon: Daemon) -> None:
    with Connection(str(tenant_daemon.socket)) as c:
        hello = c.hello("small")
        assert hello.code == OK
        device = _device_indices(hello)[0][0]
        fits = _put(c, device, np.arange(100))  # 400 bytes
        assert fits.code == OK, fits.text
        over = _put(c, device, np.arange(200))  # 800 more: over 1000
        assert over.code == RESOURCE_EXHAUSTED
        assert "tenant 'small' is over its memory quota" in over.text
        assert "needs 800 bytes" in over.text and "quota of 1000 bytes" in over.text
        assert "400 of its quota" in over.text
    # Through JAX the same error reaches the program.
    done = subprocess.run(
        [sys.executable, "-c",
         "import jax, numpy as np; jax.device_put(np.ones(1000, np.float32)).block_until_ready()"],
        capture_output=True, text=True, timeout=300,
        env=_client_env(tenant_daemon.socket, "small"))
    assert done.returncode != 0
    assert "RESOURCE_EXHAUSTED" in done.stderr
    assert "tenant 'small' is over its memory quota" in done.stderr


def test_device_set_filters_the_devices_a_session_sees(tenant_daemon: Daemon) -> None:
    with Connection(str(tenant_daemon.socket)) as c:
        hello = c.hello("pinned")
        assert hello.code == OK
        assert [device_id for _, device_id in _device_indices(hello)] == [1, 3]
        refused = _put(c, 0, np.arange(4))  # device index 0 is outside the set
    assert refused.code == PERMISSION_DENIED
    assert "outside the device set of tenant 'pinned'" in refused.text


def _execute(c: Connection, exe: int, arguments: list[int], execute_device: int = -1,
             num_devices: int = 1):
    # ints: exe, num_devices, num_args, launch_id, execute_device, non-donatable list,
    # arguments (device-major), event list, output ids list (empty: a reply names them).
    return c.call(OP_EXECUTE, [exe, num_devices, len(arguments) // num_devices, 0,
                               execute_device, 0, *arguments, 0, 0])


def _compile_doubling(c: Connection) -> int:
    code = jax.jit(lambda v: v * 2).lower(np.zeros(4, np.float32)).as_text().encode()
    from jax._src.lib import xla_client

    compiled = c.call(OP_COMPILE, blobs=[b"mlir", code,
                                         xla_client.CompileOptions().SerializeAsString()])
    assert compiled.code == OK, compiled.text
    return compiled.ints[0]


def test_a_failed_one_way_execution_fails_its_event_and_outputs(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as c:
        hello = c.hello("oneway")
        assert hello.code == OK
        assert hello.ints[-1] == 1  # one-way executions offered: the tenant has no quota
        exe = _compile_doubling(c)
        # One-way (no call id, the client names output -5): argument 4242 does not exist.
        c.send(Frame(op=OP_EXECUTE, ints=[exe, 1, 1, 0, -1, 0, 4242, 1, 77, 1, -5]))
        push = c.receive()
        # ints [event, code, donated list]: it consumed nothing.
        assert push.op == OP_EVENT_READY and push.ints == [77, NOT_FOUND, 0]
        assert "buffer 4242 is not one of session" in push.text
        # The output names the failure; reading it fails its own event with that error.
        c.send(Frame(op=OP_BUFFER_TO_HOST, ints=[-5, 78, 16, 1, *NO_LAYOUT]))
        read = c.receive()
        assert read.op == OP_EVENT_READY and read.ints == [78, NOT_FOUND]
        assert "the execution that made this buffer failed" in read.text
        assert "buffer 4242 is not one of session" in read.text
        # Destroyed like any buffer; then it is gone.
        c.send(Frame(op=OP_BUFFER_DESTROY, ints=[-5]))
        gone = c.call(OP_BUFFER_TO_HOST_SIZE, [-5, *NO_LAYOUT])
        assert gone.code == NOT_FOUND and "buffer -5 is not one of session" in gone.text
        # A daemon-side id as an output name is refused.
        put = _put(c, _device_indices(hello)[0][0], np.arange(4))
        c.send(Frame(op=OP_EXECUTE, ints=[exe, 1, 1, 0, -1, 0, put.ints[0], 1, 79, 1, 3]))
        bad = c.receive()
        assert bad.ints == [79, INVALID_ARGUMENT, 0]
        assert "output id 3 is not a new client id" in bad.text


def test_a_failed_one_way_transfer_names_its_error(daemon: Daemon) -> None:
    data = np.arange(4, dtype=np.float32).tobytes()
    with Connection(str(daemon.socket)) as c:
        hello = c.hello("oneway")
        assert hello.code == OK
        device = _device_indices(hello)[0][0]
        # One-way (no call id, the client names buffer -9): memory index 999 does not exist.
        c.send(Frame(op=OP_BUFFER_FROM_HOST,
                     ints=[F32, 1, 4, 0, device, 999, 1, len(data), -9], blobs=[data]))
        failed = c.call(OP_BUFFER_TO_HOST_SIZE, [-9, *NO_LAYOUT])
        assert failed.code == PERMISSION_DENIED
        assert "the transfer that made this buffer failed" in failed.text
        assert "memory index 999 is outside the device set" in failed.text
        # A request with a reply names no id of its own.
        named = c.call(OP_BUFFER_FROM_HOST, [F32, 1, 4, 0, device, -1, 1, len(data), -10],
                       blobs=[data])
        assert named.code == INVALID_ARGUMENT
        assert "buffer id -10 is not a new client id" in named.text


def test_an_execution_outside_the_device_set_is_refused(tenant_daemon: Daemon) -> None:
    from jax._src.lib import xla_client

    code = jax.jit(lambda v: v * 2).lower(np.zeros(4, np.float32)).as_text()
    portable = xla_client.CompileOptions()
    portable.compile_portable_executable = True
    # Two replicas on devices 0 and 1: compiling it is allowed (it lists device 1 of the set),
    # but run without an execute device it would occupy device 0 too.
    replicated = xla_client.CompileOptions()
    replicated.num_replicas = 2
    replicated.device_assignment = xla_client.DeviceAssignment.create(np.array([[0], [1]]))
    with Connection(str(tenant_daemon.socket)) as c:
        assert c.hello("pinned").code == OK
        put = _put(c, 1, np.arange(4))
        assert put.code == OK, put.text
        arg = put.ints[0]
        two = c.call(OP_COMPILE, blobs=[
            b"mlir", code.replace("mhlo.num_replicas = 1", "mhlo.num_replicas = 2").encode(),
            replicated.SerializeAsString()])
        assert two.code == OK, two.text
        refused = _execute(c, two.ints[0], [arg, arg], num_devices=2)
        assert refused.code == PERMISSION_DENIED
        assert "would run on device 0" in refused.text
        assert "outside the device set of tenant 'pinned'" in refused.text
        one = c.call(OP_COMPILE, blobs=[b"mlir", code.encode(), portable.SerializeAsString()])
        assert one.code == OK, one.text
        unplaced = _execute(c, one.ints[0], [arg])
        assert unplaced.code == INVALID_ARGUMENT
        assert "a portable executable needs an execute device" in unplaced.text
        ran = _execute(c, one.ints[0], [arg], execute_device=1)
        assert ran.code == OK, ran.text


def test_one_way_executions_are_not_offered_to_a_tenant_with_a_quota(
        tenant_daemon: Daemon) -> None:
    with Connection(str(tenant_daemon.socket)) as c:
        hello = c.hello("small")
    assert hello.code == OK and hello.ints[-1] == 0


def _session_limits(reply) -> list[int]:
    """Hello's per-device memory limits (after the devices, before the one-way flag)."""
    ints = reply.ints
    pos = 2 + 3 * ints[1]
    count = ints[pos]
    pos += 1
    for _ in range(count):
        pos += 5 + ints[pos + 4]
    return list(ints[pos + 1 : pos + 1 + ints[pos]])


HOST_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
LIMITS_CLIENT = (
    "import jax, json; "
    "print('LIMITS' + json.dumps([d.memory_stats()['bytes_limit'] for d in jax.devices()]))"
)


def _client_limits(socket: Path, tenant: str) -> list[int]:
    done = subprocess.run([sys.executable, "-c", LIMITS_CLIENT], capture_output=True, text=True,
                          timeout=300, env=_client_env(socket, tenant))
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("LIMITS"))
    return json.loads(line[len("LIMITS"):])


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def test_a_sessions_devices_report_its_tenants_quota_as_their_limit(
        tenant_daemon: Daemon) -> None:
    num_devices = tenant_daemon.stats()["devices"]
    with Connection(str(tenant_daemon.socket)) as c:
        small = c.hello("small")  # quota 1000 bytes, every device
    with Connection(str(tenant_daemon.socket)) as c:
        pinned = c.hello("pinned")  # no quota, devices 1 and 3
    assert small.code == OK and pinned.code == OK
    assert _session_limits(small) == [_share(1000, num_devices, i) for i in range(num_devices)]
    # Without a quota: what the (CPU) devices have, their shares of the host's RAM.
    assert _session_limits(pinned) == [_share(HOST_MEMORY, num_devices, i) for i in (1, 3)]
    # Through JAX: the virtual devices split the session's limits, so they add up to
    # min(quota, physical memory).
    assert sum(_client_limits(tenant_daemon.socket, "small")) == 1000
    assert sum(_client_limits(tenant_daemon.socket, "pinned")) == sum(_session_limits(pinned))


def test_without_a_quota_the_virtual_devices_share_the_physical_memory(daemon: Daemon) -> None:
    assert sum(_client_limits(daemon.socket, "alpha")) == HOST_MEMORY


def test_stats_cli_lists_sessions_and_tenants(tenant_daemon: Daemon) -> None:
    with Connection(str(tenant_daemon.socket)) as c:
        assert c.hello("pinned").code == OK
        done = subprocess.run([sys.executable, "-m", "flexnpu", "stats", "--daemon",
                               str(tenant_daemon.socket), "--json"],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert [s["tenant"] for s in state["sessions"]] == ["pinned"]
    assert state["tenants"]["small"]["memory_quota_bytes"] == 1000
    assert state["tenants"]["pinned"]["priority"] == "latency"
    assert state["tenants"]["pinned"]["devices"] == [1, 3]


def _compile(c: Connection, fn, *args) -> int:
    from jax._src.lib import xla_client

    code = jax.jit(fn).lower(*args).as_text().encode()
    compiled = c.call(OP_COMPILE, blobs=[b"mlir", code,
                                         xla_client.CompileOptions().SerializeAsString()])
    assert compiled.code == OK, compiled.text
    return compiled.ints[0]


def test_a_client_that_stops_reading_stalls_no_other_tenant(tmp_path: Path) -> None:
    # The daemon's pushes never block on a client's socket: what it does not read waits in
    # that session's queue, and a session that takes nothing for the send timeout is ended.
    d = Daemon(tmp_path / "bp.sock", tmp_path / "bp.log",
               env={"FLEXNPU_DAEMON_SEND_TIMEOUT_S": "3"})
    try:
        x = np.ones((128, 128), np.float32)  # 64 KiB: read back inline, in the push
        stalled = Connection(str(d.socket), timeout_s=2.0)
        hello = stalled.hello("stalled")
        assert hello.code == OK and hello.ints[-1] == 1
        device = _device_indices(hello)[0][0]
        data = x.tobytes()
        put = stalled.call(OP_BUFFER_FROM_HOST,
                           [F32, 2, 128, 128, 0, device, -1, 1, len(data), 0], blobs=[data])
        assert put.code == OK, put.text
        exe = _compile(stalled, lambda v: jnp.tanh(v @ v) @ v, x)
        # A burst of one-way steps, each read back (64 KiB pushed from the backend's threads
        # when the step completes), and never a read: megabytes the socket cannot hold.
        sent = 0
        try:
            for i in range(1, 400):
                stalled.send(Frame(op=OP_EXECUTE,
                                   ints=[exe, 1, 1, 0, -1, 0, put.ints[0], 1, 2 * i, 1, -i]))
                stalled.send(Frame(op=OP_BUFFER_TO_HOST,
                                   ints=[-i, 2 * i + 1, len(data), 1, *NO_LAYOUT]))
                sent = i
        except OSError:
            pass  # the daemon stopped taking this client's requests: fine either way
        assert sent >= 40, sent  # > 2.5 MB of pushes asked for
        # Another tenant computes and reads back meanwhile.
        with Connection(str(d.socket), timeout_s=60.0) as other:
            hello = other.hello("bystander")
            assert hello.code == OK
            small = _put(other, _device_indices(hello)[0][0], np.arange(4))
            assert small.code == OK, small.text
            doubling = _compile_doubling(other)
            for step in range(5):
                ran = other.call(OP_EXECUTE, [doubling, 1, 1, 0, -1, 0, small.ints[0],
                                              1, 1000 + step, 0])
                assert ran.code == OK, ran.text
                out = ran.ints[0]
                other.send(Frame(op=OP_BUFFER_TO_HOST, ints=[out, 2000 + step, 16, 1,
                                                             *NO_LAYOUT]))
                pushes = {}
                while 2000 + step not in pushes:
                    push = other.receive()  # the socket timeout bounds a stall
                    assert push.op == OP_EVENT_READY
                    pushes[push.ints[0]] = push
                read = pushes[2000 + step]
                assert read.ints[:2] == [2000 + step, OK], read.text
                assert np.frombuffer(read.blobs[0], np.float32).tolist() == [0, 2, 4, 6]
        # The stalled session is ended (it took nothing for 3 s), with the reason in the log.
        assert _wait_for(lambda: "stalled" not in [s["tenant"] for s in d.stats()["sessions"]],
                         60), d.stats()["sessions"]
        stalled.close()
        log = d.log.read_text()
        assert "tenant 'stalled'" in log and "did not read" in log, log[-3000:]
    finally:
        d.stop()
    assert d.process.returncode == 0


def test_the_protocol_version_has_one_source() -> None:
    # Python's copy is checked against protocol.h (the C++ side's, which the daemon speaks).
    import re

    header = (
        TESTS.parent.parent / "pjrt_flexnpu" / "backend" / "remote" / "protocol.h"
    ).read_text()
    found = re.findall(r"inline constexpr int64_t kProtocolVersion = (\d+);", header)
    assert found == [str(PROTOCOL_VERSION)], found


def _one_way(c: Connection, exe: int, argument: int, event: int, output: int) -> None:
    c.send(Frame(op=OP_EXECUTE, ints=[exe, 1, 1, 0, -1, 0, argument, 1, event, 1, output]))


def test_a_malformed_one_way_execution_still_fails_its_events(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as c:
        hello = c.hello("oneway")
        assert hello.code == OK
        exe = _compile_doubling(c)
        put = _put(c, _device_indices(hello)[0][0], np.arange(4))
        # The output id list claims 5 ids and holds none: the event id before it is failed.
        c.send(Frame(op=OP_EXECUTE, ints=[exe, 1, 1, 0, -1, 0, put.ints[0], 1, 81, 5]))
        push = c.receive()
    assert push.op == OP_EVENT_READY and push.ints == [81, INVALID_ARGUMENT, 0]
    assert "malformed Execute request (output ids)" in push.text


def test_a_failed_buffer_fed_through_steps_keeps_its_root_cause_once(daemon: Daemon) -> None:
    with Connection(str(daemon.socket)) as c:
        assert c.hello("oneway").code == OK
        exe = _compile_doubling(c)
        # A decode loop fed a failed buffer: each step's output names the first failure.
        _one_way(c, exe, 4242, 90, -20)
        for step in range(1, 4):
            _one_way(c, exe, -20 - step + 1, 90 + step, -20 - step)
        for step in range(4):
            assert c.receive().ints[:2] == [90 + step, NOT_FOUND]
        c.send(Frame(op=OP_BUFFER_TO_HOST, ints=[-23, 99, 16, 1, *NO_LAYOUT]))
        read = c.receive()
    assert read.ints == [99, NOT_FOUND]
    assert read.text.count("the execution that made this buffer failed") == 1, read.text
    assert "(propagated through 4 executions)" in read.text, read.text
    assert read.text.endswith("): buffer 4242 is not one of session " +
                              read.text.split()[-2] + " buffers"), read.text


def _compile_donating(c: Connection, fn, *args) -> int:
    from jax._src.lib import xla_client

    code = jax.jit(fn, donate_argnums=0).lower(*args).as_text().encode()
    compiled = c.call(OP_COMPILE, blobs=[b"mlir", code,
                                         xla_client.CompileOptions().SerializeAsString()])
    assert compiled.code == OK, compiled.text
    return compiled.ints[0]


def test_one_way_donation_is_reported_by_the_completion_push(daemon: Daemon) -> None:
    x = np.arange(4, dtype=np.float32)
    with Connection(str(daemon.socket)) as c:
        hello = c.hello("oneway")
        assert hello.code == OK
        device = _device_indices(hello)[0][0]
        exe = _compile_donating(c, lambda v: v + 1, x)
        put = _put(c, device, x)
        # Synchronous: the reply lists the consumed argument (position 0) after the output.
        first = _execute(c, exe, [put.ints[0]])
        assert first.code == OK, first.text
        assert first.ints[-2:] == [1, 0]
        output = first.ints[0]
        # One-way with the output as argument: the completion push lists it.
        _one_way(c, exe, output, 301, -31)
        done = c.receive()
        assert done.ints == [301, OK, 1, 0], done
        # One-way refused (the argument was consumed by the step before): nothing consumed.
        _one_way(c, exe, output, 302, -32)
        refused = c.receive()
        # The backend's own refusal, by code and message, and nothing reported consumed.
        assert refused.ints == [302, INVALID_ARGUMENT, 0], refused
        assert "buffer has been deleted or donated" in refused.text, refused.text


def test_an_execution_refused_after_it_ran_lists_what_it_consumed(
        tenant_daemon: Daemon) -> None:
    x = np.arange(100, dtype=np.float32)  # 400 bytes of the tenant's 1000
    with Connection(str(tenant_daemon.socket)) as c:
        hello = c.hello("small")
        assert hello.code == OK
        exe = _compile_donating(c, lambda v: (v + 1, v * 2), x)
        put = _put(c, _device_indices(hello)[0][0], x)
        assert put.code == OK, put.text
        # Its outputs (800 bytes) would exceed the quota: refused once the backend has run it,
        # and it consumed its donated argument all the same.
        ran = _execute(c, exe, [put.ints[0]])
        assert ran.code == RESOURCE_EXHAUSTED, ran.text
        assert "the outputs of an execution" in ran.text
        assert ran.ints == [1, 0]


# Donation as JAX sees it, per step, for arguments of either provenance (a zero-copy upload
# over 64 KiB, an execution's output), on the daemon and in-process alike.
DONATION_PROVENANCE = """
import json, jax, numpy as np
step = jax.jit(lambda c: c + 1, donate_argnums=0)
seen = []
for size in (16, 1 << 15):
    for source in ("upload", "output", "output", "upload", "output"):
        arg = jax.device_put(np.zeros(size, np.float32))
        if source == "output":
            arg = step(arg)
        out = step(arg)
        seen.append([source, size, arg.is_deleted(), float(np.asarray(out)[0])])
print(json.dumps(seen))
"""


def test_donation_follows_the_arguments_provenance(daemon: Daemon) -> None:
    def run(env: dict[str, str]) -> list:
        done = subprocess.run([sys.executable, "-c", DONATION_PROVENANCE], capture_output=True,
                              text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    local = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "JAX_"))}
    local.update(JAX_PLATFORMS="flexnpu")
    assert run(_client_env(daemon.socket, "provenance")) == run(local)


# Threads uploading (inline and shared-segment sizes) and reading back at once, each read
# completed on the client's reader thread while the others send.
BURST = """
import threading, jax, numpy as np
f = jax.jit(lambda v: v * 2 + 1)
errors = []
def work(seed):
    try:
        for i in range(25):
            for n in (16 * 1024, 300 * 1024):
                x = np.full(n // 4, seed + i, np.float32)
                y = np.asarray(f(jax.device_put(x)))
                assert y[0] == 2 * (seed + i) + 1 and y.shape == x.shape
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=work, args=(k * 100,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print("errors", errors)
"""


def test_a_burst_of_transfers_from_several_threads_completes(daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, "-c", BURST], capture_output=True, text=True,
                          timeout=300, env=_client_env(daemon.socket, "burst"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "errors []"
