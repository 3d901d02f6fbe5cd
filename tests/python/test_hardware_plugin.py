"""The plugin with telemetry from the fake AscendCL while the CPU backend executes: binding of
the physical PJRT devices, telemetry in flexnpu.stats and `flexnpu devices`, memory-aware
placement (a device reported full gets no placement under dynamic, still does under
passthrough), external load, and an explicit source that fails as a clear client error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import build_fakes

FOUR_NPUS = (
    "devices=4\nsoc=Ascend910B2\nmemory_total=68719476736\nmemory_free=60000000000\n"
    "cube=0\nvector=0\nmemutil=10\n"
)

# Runs on flexnpu, compares with NumPy, prints the client's stats as JSON (last line).
PROGRAM = r"""
import json, os, sys
import numpy as np
import jax, jax.numpy as jnp
from flexnpu import stats

script = os.environ.get("FLEXNPU_FAKE_ACL_FILE")
devices = jax.devices("flexnpu")
f = jax.jit(lambda a, b: jnp.tanh(a @ b) + 1.0)
a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
for round in range(int(sys.argv[1])):
    for d in devices:
        out = f(jax.device_put(a, d), jax.device_put(a, d))
        np.testing.assert_allclose(np.asarray(out), np.tanh(a @ a) + 1.0, rtol=1e-5)
if os.environ.get("PRINT_TRACE"):
    import time
    stats.start_trace()
    deadline = time.monotonic() + 60  # the sampler's next rounds (liveness, not speed)
    counters = []
    while not counters and time.monotonic() < deadline:
        time.sleep(0.02)
        counters = [e for e in stats.trace()["traceEvents"] if e.get("ph") == "C"]
    stats.stop_trace()
    print(json.dumps(counters))
if os.environ.get("PRINT_PROMETHEUS"):
    from prometheus_client import CollectorRegistry, generate_latest
    from flexnpu import metrics
    registry = CollectorRegistry()
    metrics.register(registry)
    print(generate_latest(registry).decode())
print(json.dumps(stats.clients()[0]))
"""


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_fakes(tmp_path_factory.mktemp("fakes"))


def _run(
    fakes: dict[str, Path], script: Path, extra: dict[str, str], rounds: int = 3
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_TELEMETRY": "ascendcl",
        "FLEXNPU_ASCENDCL_LIBRARY": str(fakes["ascendcl"]),
        "FLEXNPU_FAKE_ACL_FILE": str(script),
        "FLEXNPU_TELEMETRY_PERIOD_MS": "20",
        **extra,
    }
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(rounds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _stats(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_devices_are_bound_and_reported(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.3=1234\n")
    client = _stats(_run(fakes, script, {}))
    telemetry = client["telemetry"]
    assert telemetry["source"] == "ascendcl"
    assert str(fakes["ascendcl"]) in telemetry["library"]
    assert [d["pjrt_device"] for d in telemetry["devices"]] == [0, 1, 2, 3]
    assert all(d["bound"] for d in telemetry["devices"])
    assert telemetry["devices"][0]["name"] == "Ascend910B2"
    assert telemetry["devices"][0]["preset"] == "ascend910b"
    assert telemetry["devices"][3]["memory_free_bytes"] == 1234
    assert telemetry["rounds"] >= 1 and telemetry["errors"] == 0
    placement = client["placement"]["physical"]
    assert placement[0]["memory_free_bytes"] == 60000000000
    assert placement[3]["memory_free_bytes"] == 1234


def test_full_device_gets_no_placement_except_under_passthrough(
    fakes: dict[str, Path], tmp_path: Path
) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.1=0\n")
    dynamic = _stats(_run(fakes, script, {"FLEXNPU_POLICY": "dynamic"}))["placement"]["physical"]
    assert sum(dynamic[1]["executions"].values()) == 0, dynamic[1]
    assert dynamic[1]["memory_skips"] > 0
    assert sum(sum(d["executions"].values()) for d in dynamic) > 0
    passthrough = _stats(_run(fakes, script, {"FLEXNPU_POLICY": "passthrough"}))
    assert passthrough["executions"] > 0
    # Passthrough never consults the core: nothing was skipped for memory.
    assert passthrough["placement"]["physical"][1]["memory_skips"] == 0


def test_external_load_is_reported(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "cube.2=85\n")
    client = _stats(_run(fakes, script, {"FLEXNPU_POLICY": "dynamic"}, rounds=1))
    device = client["placement"]["physical"][2]
    assert device["utilization"] == pytest.approx(0.85)
    assert 0.5 < device["external_utilization"] <= 0.85
    assert client["telemetry"]["devices"][2]["utilization"] == {"compute": 85, "memory": 10}


def test_explicit_source_failure_is_a_client_error(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "error.aclInit=500002\nmessage.aclInit=EH9999 not ready\n")
    proc = _run(fakes, script, {})
    assert proc.returncode != 0
    assert "FlexNPU telemetry 'ascendcl'" in proc.stderr
    assert "aclInit failed with ACL error 500002: EH9999 not ready" in proc.stderr
    assert "Traceback" in proc.stderr  # a Python exception, not an abort
    # auto: the client starts without telemetry and says why in one line.
    auto = _run(fakes, script, {"FLEXNPU_TELEMETRY": "auto"}, rounds=1)
    client = _stats(auto)
    assert client["telemetry"]["source"] == "none"
    assert "aclInit failed with ACL error 500002" in client["telemetry"]["fallback"]
    assert auto.stderr.count("flexnpu: telemetry auto: none") == 1


def test_bad_telemetry_option_names_it(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS)
    proc = _run(fakes, script, {"FLEXNPU_TELEMETRY": "npu-smi"})
    assert proc.returncode != 0
    assert "FlexNPU option 'telemetry'" in proc.stderr
    assert "auto, ascendcl, nvml or none, got 'npu-smi'" in proc.stderr
    proc = _run(fakes, script, {"FLEXNPU_TELEMETRY_PERIOD_MS": "0"})
    assert "'telemetry_period_ms' must be in [1, 3600000], got 0" in proc.stderr


def test_cli_devices_through_the_client(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.3=1234\ncube.3=-1\nvector.3=-1\nmemutil.3=-1\n")
    env = {
        **os.environ,
        "FLEXNPU_ASCENDCL_LIBRARY": str(fakes["ascendcl"]),
        "FLEXNPU_FAKE_ACL_FILE": str(script),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "flexnpu", "devices", "--json", "--source", "ascendcl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert [r["pjrt_device"] for r in rows] == [0, 1, 2, 3]
    assert rows[3] == {
        "index": 3,
        "source": "ascendcl",
        "name": "Ascend910B2",
        "preset": "ascend910b",
        "memory_total_bytes": 68719476736,
        "memory_free_bytes": 1234,
        "utilization": {"compute": None, "memory": None},
        "pjrt_device": 3,
    }


def test_prometheus_exposes_telemetry(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.3=1234\ncube.2=85\n")
    proc = _run(fakes, script, {"PRINT_PROMETHEUS": "1"}, rounds=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert (
        'flexnpu_physical_memory_free_bytes{client="0",device="3",source="ascendcl"} 1234.0'
        in lines
    )
    assert 'flexnpu_physical_utilization_ratio{client="0",device="2",kind="compute"} 0.85' in lines
    assert 'flexnpu_physical_utilization_ratio{client="0",device="2",kind="memory"} 0.1' in lines
    external = [x for x in lines if x.startswith('flexnpu_physical_utilization_ratio{client="0",'
                                                 'device="2",kind="external"}')]  # fmt: skip
    assert len(external) == 1 and 0.5 < float(external[0].split()[-1]) <= 0.85


def test_trace_has_telemetry_counters(fakes: dict[str, Path], tmp_path: Path) -> None:
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.1=2000000000\ncube.1=25\n")
    proc = _run(fakes, script, {"PRINT_TRACE": "1"}, rounds=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counters = json.loads(proc.stdout.strip().splitlines()[-2])
    by_device = {e["pid"]: e["args"] for e in counters if e["name"] == "telemetry"}
    assert set(by_device) == {0, 1, 2, 3}
    assert by_device[1] == {"memory_free_GB": 2.0, "utilization": 0.25}


def test_backend_ascend_executes_through_an_installed_ascend_plugin(tmp_path: Path) -> None:
    """FLEXNPU_BACKEND=ascend finds the PJRT library of a `jax_plugins` package named *ascend*
    (here the CPU plugin under that name: no Ascend plugin exists on this machine)."""
    import flexnpu

    package = tmp_path / "site" / "jax_plugins" / "ascend_npu"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pjrt_plugin_ascend.so").symlink_to(flexnpu.cpu_plugin_path())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": "ascend",
        "FLEXNPU_TELEMETRY": "none",
    }
    code = (
        "from flexnpu import hardware; print(hardware.ascend_pjrt_plugin()); "
        "import jax, jax.numpy as jnp; print(float(jnp.arange(5.0).sum()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == str(package / "pjrt_plugin_ascend.so")
    assert lines[1] == "10.0"
    (package / "pjrt_plugin_ascend.so").unlink()
    missing = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert missing.returncode != 0
    assert "FLEXNPU_BACKEND=ascend: no Ascend PJRT plugin is installed" in missing.stderr


def test_auto_reports_but_does_not_bind_cpu_devices(fakes: dict[str, Path], tmp_path: Path) -> None:
    """A CPU backend's devices are not the NPUs: `auto` reports them, binds nothing, and the
    placer is unaffected (device 1 "full" still gets its work)."""
    script = tmp_path / "acl.txt"
    script.write_text(FOUR_NPUS + "memory_free.1=0\n")
    client = _stats(_run(fakes, script, {"FLEXNPU_TELEMETRY": "auto", "FLEXNPU_POLICY": "dynamic"}))
    telemetry = client["telemetry"]
    assert telemetry["source"] == "ascendcl"
    assert [d["pjrt_device"] for d in telemetry["devices"]] == [None] * 4
    assert not any(d["bound"] for d in telemetry["devices"])
    physical = client["placement"]["physical"]
    assert physical[1]["memory_free_bytes"] == -1  # the placer got no telemetry
    assert sum(physical[1]["executions"].values()) > 0
