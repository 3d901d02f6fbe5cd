"""What a user sees of the placer: the trace timeline, Prometheus exposition, the stats CLI,
and correctness of concurrent dispatch under the dynamic policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _subprocess import run_python

WORKLOAD = """
import json, threading
import jax, jax.numpy as jnp, numpy as np
import flexnpu.stats
from flexnpu import metrics
from prometheus_client import CollectorRegistry, generate_latest

flexnpu.stats.start_trace()
rng = np.random.default_rng(0)
w = rng.standard_normal((512, 1024)).astype(np.float32) * 0.01
prefill = jax.jit(lambda x, w: jnp.tanh(x @ w))
gemv = jax.jit(lambda x, w: x @ w)
errors = []

def worker(i):
    try:
        dev = jax.devices()[i % 4]
        wd = jax.device_put(w, dev)
        for _ in range(5):
            x = rng.standard_normal((128, 512)).astype(np.float32)
            if not np.allclose(np.asarray(prefill(x, wd)), np.tanh(x @ w), rtol=1e-4, atol=1e-5):
                errors.append("prefill mismatch")
            v = x[:1]
            if not np.allclose(np.asarray(gemv(v, wd)), v @ w, rtol=1e-4, atol=1e-5):
                errors.append("gemv mismatch")
    except Exception as e:  # reported below
        errors.append(repr(e))

threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
for t in threads: t.start()
for t in threads: t.join()
jax.effects_barrier()
flexnpu.stats.stop_trace()
registry = CollectorRegistry()
metrics.register(registry)
print(json.dumps({
    "errors": errors,
    "trace": flexnpu.stats.trace(),
    "prometheus": generate_latest(registry).decode(),
    "stats": flexnpu.stats.clients()[0],
}))
"""


def test_dynamic_concurrent_dispatch_trace_and_metrics() -> None:
    proc = run_python(WORKLOAD, env={"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "dynamic"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == []

    events = out["trace"]["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert tracks == {f"physical device {p}" for p in range(4)}
    executions = [
        e for e in events if e["ph"] == "X" and e["cat"] in ("prefill", "decode", "small")
    ]
    assert len(executions) == out["stats"]["executions"]
    assert all(e["dur"] >= 0 and 0 <= e["pid"] < 4 for e in executions)
    assert {e["cat"] for e in executions} >= {"prefill"}
    placed = out["stats"]["placement"]["physical"]
    assert sum(sum(d["executions"].values()) for d in placed) == out["stats"]["executions"]

    text = out["prometheus"]
    for name in (
        "flexnpu_placement_info",
        "flexnpu_physical_queue_length",
        "flexnpu_physical_busy_fraction",
        "flexnpu_physical_executions_total",
        "flexnpu_placement_decisions_total",
        "flexnpu_physical_bytes_migrated_in_total",
        "flexnpu_virtual_bytes_in_use",
    ):
        assert name in text, name
    assert 'policy="dynamic"' in text


def test_stats_cli_runs_a_script_and_writes_a_trace(tmp_path: Path) -> None:
    script = tmp_path / "work.py"
    script.write_text(
        "import jax, numpy as np\n"
        "x = jax.device_put(np.ones((256, 256), np.float32), jax.devices()[2])\n"
        "print('sum', float((x @ x).sum()))\n"
    )
    trace = tmp_path / "trace.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flexnpu",
            "stats",
            "--policy",
            "static-colocate",
            "--trace",
            str(trace),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sum 16777216.0" in proc.stdout
    assert "policy static-colocate" in proc.stdout
    assert json.loads(trace.read_text())["traceEvents"]
