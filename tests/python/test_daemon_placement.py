"""The daemon serving FlexNPU's own runtime (--policy): one placer for every client process;
priority classes (batch work waits for latency work on its device); /metrics and the trace;
the tenant given as a create option."""

from __future__ import annotations

import json
import pickle
import signal
import socket as socketlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_daemon import (
    CORPUS_CLIENT,
    SMALL_PROGRAM,
    TESTS,
    Daemon,
    _assert_matches_backend,
    _client_env,
    _wait_for,
)

TENANTS = """
[[tenants]]
name = "interactive"
priority = "latency"
[[tenants]]
name = "bulk"
priority = "batch"
"""


def _free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def placing_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("placing")
    tenants = tmp / "tenants.toml"
    tenants.write_text(TENANTS)
    port = _free_port()
    # A long starvation bound: the priority test's batch work waits out the latency step.
    d = Daemon(tmp / "p.sock", tmp / "p.log", tenants,
               extra=("--policy", "dynamic", "--metrics-port", str(port),
                      "--batch-max-wait-ms", "60000"))
    d.metrics_port = port  # type: ignore[attr-defined]
    yield d
    d.stop()


def _placements(runtime: dict) -> dict[str, int]:
    totals: dict[str, int] = {}
    for device in runtime["placement"]["physical"]:
        for reason, count in device["decisions"].items():
            totals[reason] = totals.get(reason, 0) + count
    return totals


def test_two_clients_are_placed_by_the_daemons_one_placer(placing_daemon: Daemon,
                                                          ref_devices: list,
                                                          tmp_path: Path) -> None:
    from test_plugin_programs import PROGRAMS

    # Every third program of the corpus (test_daemon runs all of them through a daemon over the
    # physical backend; here each compile also goes through the daemon's runtime).
    names = sorted(PROGRAMS)[::3]
    code = CORPUS_CLIENT.format(tests=str(TESTS))
    outputs = [tmp_path / "a.pkl", tmp_path / "b.pkl"]
    clients = [
        subprocess.Popen([sys.executable, "-c", code, str(out), *order],
                         env=_client_env(placing_daemon.socket, tenant),
                         stderr=subprocess.PIPE, text=True)
        for out, order, tenant in zip(outputs, [names, names[::-1]], ["alpha", "beta"],
                                      strict=True)
    ]
    for client in clients:
        _, err = client.communicate(timeout=600)
        assert client.returncode == 0, err[-3000:]
    for out in outputs:
        version, results = pickle.loads(out.read_bytes())
        # The client's runtime over the daemon's, which runs over the CPU plugin.
        assert "flexnpu 0.1.0 over cpu (flexnpu 0.1.0 over cpu (" in version, version
        assert sorted(results) == names
        _assert_matches_backend(results, ref_devices)

    state = placing_daemon.stats()
    assert state["tenants"]["alpha"]["executions"] >= len(names)
    assert state["tenants"]["beta"]["executions"] >= len(names)
    [runtime] = state["runtime"]  # the daemon's FlexNPU runtime: one client, one placer
    assert runtime["policy"].startswith("dynamic"), runtime["policy"]
    placed = _placements(runtime)
    # Every execution of both processes went through that placer.
    assert sum(placed.values()) >= 2 * len(names), placed
    assert placed["passthrough"] == 0, placed
    assert runtime["executions"] >= 2 * len(names)

    table = subprocess.run([sys.executable, "-m", "flexnpu", "stats", "--daemon",
                            str(placing_daemon.socket)], capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0, table.stderr
    assert "placements by reason" in table.stdout and "affinity" in table.stdout, table.stdout


# argv: tenant role. Compiles, says "ready", waits for "go", then dispatches its work and
# says "done" once its results are checked.
PRIORITY_CLIENT = """
import sys
import jax, jax.numpy as jnp, numpy as np
from jax import lax
device = jax.devices()[0]
role = sys.argv[1]
if role == "latency":
    step = jax.jit(lambda x, n: lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ y), x))
    x = jax.device_put(np.full((384, 384), 0.01, np.float32), device)
    step(x, 1).block_until_ready()
    print("ready", flush=True)
    sys.stdin.readline()
    out = step(x, 150)
    print("dispatched", flush=True)
    out.block_until_ready()
    print("done", flush=True)
else:
    burst = jax.jit(lambda x: jnp.sin(x) * 2)
    base = np.linspace(-3.0, 3.0, 1 << 22, dtype=np.float32)
    x = jax.device_put(base, device)
    want = np.sin(base) * 2
    np.testing.assert_allclose(np.asarray(burst(x)), want, rtol=1e-6, atol=1e-6)
    print("ready", flush=True)
    sys.stdin.readline()
    outs = [burst(x) for _ in range(5)]
    for o in outs:
        np.testing.assert_allclose(np.asarray(o), want, rtol=1e-6, atol=1e-6)
    print("done", flush=True)
"""


def test_batch_burst_waits_for_the_latency_tenants_step(placing_daemon: Daemon) -> None:
    def start(role: str, tenant: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", PRIORITY_CLIENT, role],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env=_client_env(placing_daemon.socket, tenant))
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-3000:]
        return p

    latency = start("latency", "interactive")
    batch = start("batch", "bulk")
    try:
        before = placing_daemon.stats()["tenants"]
        latency.stdin.write("go\n")
        latency.stdin.flush()
        assert latency.stdout.readline().strip() == "dispatched"
        # The latency step is in the daemon (enqueued, not complete) before the burst comes.
        assert _wait_for(lambda: placing_daemon.stats()["latency_in_flight"][0] >= 1, 60)
        batch.stdin.write("go\n")
        batch.stdin.flush()
        latency_out, latency_err = latency.communicate(timeout=300)
        batch_out, batch_err = batch.communicate(timeout=300)
    finally:
        for p in (latency, batch):
            if p.poll() is None:
                p.kill()
    assert latency.returncode == 0, latency_err[-3000:]
    assert batch.returncode == 0, batch_err[-3000:]
    assert latency_out.split()[-1] == "done" and batch_out.split()[-1] == "done"
    # Ordering from the daemon's own sequence (not clocks of two processes): the burst's first
    # execution was held while the latency step was in flight, and went only once that
    # step's completion events had fired (not at the starvation bound).
    after = placing_daemon.stats()["tenants"]
    assert after["bulk"]["held_for_latency"] - before["bulk"]["held_for_latency"] >= 1
    assert after["bulk"]["held_past_max_wait"] == before["bulk"]["held_past_max_wait"]
    assert after["interactive"]["held_for_latency"] == 0
    assert after["bulk"]["executions"] - before["bulk"]["executions"] >= 5
    assert placing_daemon.stats()["latency_in_flight"] == [0] * placing_daemon.stats()["devices"]


TENANT_OPTION = """
import jax, numpy as np
jax.config.update("jax_pjrt_client_create_options", "tenant:{tenant}")
x = jax.device_put(np.ones(1000, np.float32))
print(float(x.sum()), flush=True)
input()
"""


def test_tenant_create_option_names_the_session(placing_daemon: Daemon) -> None:
    env = _client_env(placing_daemon.socket)
    env["FLEXNPU_TENANT"] = "from-env"  # the create option wins over the environment
    p = subprocess.Popen([sys.executable, "-c", TENANT_OPTION.format(tenant="from-option")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "1000.0", p.stderr.read()[-3000:]
        tenants = [s["tenant"] for s in placing_daemon.stats()["sessions"]]
        assert "from-option" in tenants and "from-env" not in tenants, tenants
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0


def test_metrics_endpoint_serves_tenants_and_placements(placing_daemon: Daemon) -> None:
    done = subprocess.run([sys.executable, "-c", SMALL_PROGRAM], capture_output=True, text=True,
                          timeout=300, env=_client_env(placing_daemon.socket, "bulk"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip()) == float((np.arange(100000, dtype=np.float32) * 3).sum())
    port = placing_daemon.metrics_port  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    executions = [line for line in text.splitlines()
                  if line.startswith('flexnpu_daemon_tenant_executions_total{priority="batch",'
                                     'tenant="bulk"}')]
    assert len(executions) == 1 and float(executions[0].split()[-1]) >= 1, text[-3000:]
    assert "flexnpu_daemon_sessions " in text
    assert "flexnpu_daemon_latency_in_flight{" in text
    # Nothing of this batch tenant's waited past the gate's max wait (no latency work ran).
    past = [line for line in text.splitlines()
            if line.startswith('flexnpu_daemon_tenant_held_past_max_wait_total{priority="batch",'
                               'tenant="bulk"}')]
    assert len(past) == 1 and float(past[0].split()[-1]) == 0, text[-3000:]
    # The runtime's placements (flexnpu.metrics) come from the daemon's own runtime.
    affinity = [line for line in text.splitlines()
                if line.startswith("flexnpu_placement_decisions_total{")]
    assert affinity and sum(float(line.split()[-1]) for line in affinity) >= 1, text[-3000:]


def test_trace_is_written_at_sigterm(tmp_path: Path) -> None:
    trace = tmp_path / "daemon_trace.json"
    d = Daemon(tmp_path / "t.sock", tmp_path / "t.log",
               extra=("--policy", "dynamic", "--trace", str(trace)))
    try:
        done = subprocess.run([sys.executable, "-c", SMALL_PROGRAM], capture_output=True,
                              text=True, timeout=300, env=_client_env(d.socket))
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        d.process.send_signal(signal.SIGTERM)
        d.process.wait(timeout=60)
    assert d.process.returncode == 0, d.log.read_text()[-3000:]
    events = json.loads(trace.read_text())["traceEvents"]
    executions = [e for e in events if e.get("ph") == "X" and e.get("cat") != "migration"]
    assert executions, events
    assert f"timeline written to {trace}" in d.log.read_text()


def test_trace_without_policy_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "flexnpu", "daemon", "--socket",
                           str(tmp_path / "x.sock"), "--trace", str(tmp_path / "t.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--trace needs --policy" in done.stderr


def test_sigterm_stops_the_daemon_cleanly_with_metrics_served(tmp_path: Path) -> None:
    # The /metrics thread refers to the server's stats: stopping it first lets the server go, so
    # nanobind reports no leaked DaemonServer at exit.
    d = Daemon(tmp_path / "m.sock", tmp_path / "m.log",
               extra=("--policy", "dynamic", "--metrics-port", str(_free_port())))
    try:
        done = subprocess.run([sys.executable, "-c", SMALL_PROGRAM], capture_output=True,
                              text=True, timeout=300, env=_client_env(d.socket))
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        d.stop()
    log = d.log.read_text()
    assert d.process.returncode == 0, log
    assert "SIGTERM: stopping" in log and "stopped" in log, log
    assert "leaked" not in log, log
