"""The placer's counters read true under every policy (passthrough runs without asking the
placement core, yet its executions and busy time are counted), and what the dynamic policy
moved, by reason: a chain of dependent steps that carries its weights is not moved."""

from __future__ import annotations

import json
import re

from _subprocess import run_python

# Runs n1 executions on virtual device 1 and n3 on 3 (physical 1 and 3 under passthrough),
# then prints the stats and the Prometheus exposition.
PASSTHROUGH = """
import json
import jax, jax.numpy as jnp, numpy as np
import flexnpu.stats
from flexnpu import metrics
from prometheus_client import CollectorRegistry, generate_latest

f = jax.jit(lambda x: jnp.tanh(x @ x))
d = jax.devices()
x1 = jax.device_put(np.ones((64, 64), np.float32) / 64, d[1])
x3 = jax.device_put(np.ones((64, 64), np.float32) / 64, d[3])
for _ in range(7):
    x1 = f(x1)
for _ in range(4):
    x3 = f(x3)
def reference(n):
    x = np.ones((64, 64), np.float32) / 64
    for _ in range(n):
        x = np.tanh(x @ x)
    return x
ok = bool(np.allclose(np.asarray(x1), reference(7), atol=1e-5)
          and np.allclose(np.asarray(x3), reference(4), atol=1e-5))
registry = CollectorRegistry()
metrics.register(registry)
print(json.dumps({"ok": ok, "stats": flexnpu.stats.clients()[0],
                  "prometheus": generate_latest(registry).decode()}))
"""


def _sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_passthrough_executions_and_busy_time_are_counted() -> None:
    proc = run_python(PASSTHROUGH, env={"JAX_PLATFORMS": "flexnpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"]
    stats = out["stats"]
    assert stats["policy"] == "passthrough"
    physical = stats["placement"]["physical"]
    ran = {d["device"]: sum(d["executions"].values()) for d in physical}
    assert ran == {0: 0, 1: 7, 2: 0, 3: 4}
    assert stats["executions"] == 11
    assert stats["placement"]["decisions_total"] == 11
    assert physical[1]["decisions"]["passthrough"] == 7
    # JAX awaits each execution's completion event: that gives the busy time.
    assert physical[1]["busy_ns"] > 0 and 0 < physical[1]["busy_fraction"] <= 1
    assert physical[3]["busy_ns"] > 0
    assert physical[0]["busy_ns"] == 0 and physical[2]["busy_fraction"] == 0
    virtual = {v["device"]: sum(v["executions"].values()) for v in stats["placement"]["virtual"]}
    assert virtual == {0: 0, 1: 7, 2: 0, 3: 4}

    text = out["prometheus"]
    assert _sample(text, "flexnpu_physical_executions_total", device="1") == 7
    assert _sample(text, "flexnpu_physical_executions_total", device="3") == 4
    assert _sample(text, "flexnpu_physical_executions_total", device="0") == 0
    assert _sample(text, "flexnpu_placement_decisions_total", device="3", reason="passthrough") == 4
    assert _sample(text, "flexnpu_physical_busy_fraction", device="1") > 0
    assert _sample(text, "flexnpu_migrated_bytes_total") == 0


# A serving engine's pattern: each step reads the previous one's output and a 50 MB weight on
# device 0, and is dispatched before the previous one finished. The queue on device 0 is that
# previous step, so moving the weight to an idle device gains nothing.
CHAIN = """
import json
import jax, jax.numpy as jnp, numpy as np
import flexnpu.stats
from flexnpu import metrics
from prometheus_client import CollectorRegistry, generate_latest

dev = jax.devices()[0]
w = jax.device_put(np.full((3200, 4096), 1e-3, np.float32), dev)
x0 = np.eye(1024, dtype=np.float32)

@jax.jit
def step(w, x):
    for _ in range(2):
        x = jnp.tanh(x @ x)
    return x + w[:1024, :1024]

x = jax.device_put(x0, dev)
step(w, x).block_until_ready()
for _ in range(6):
    x = step(w, x)
expected = x0
for _ in range(6):
    for _ in range(2):
        expected = np.tanh(expected @ expected)
    expected = expected + 1e-3
registry = CollectorRegistry()
metrics.register(registry)
print(json.dumps({"ok": bool(np.allclose(np.asarray(x), expected, atol=1e-4)),
                  "stats": flexnpu.stats.clients()[0],
                  "prometheus": generate_latest(registry).decode()}))
"""


def test_dynamic_does_not_move_weights_away_from_a_dependent_chain() -> None:
    proc = run_python(CHAIN, env={"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "dynamic"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"]
    stats = out["stats"]
    physical = stats["placement"]["physical"]
    assert stats["migrations"] == 0, physical
    assert [sum(d["executions"].values()) for d in physical] == [7, 0, 0, 0]
    assert all(d["bytes_migrated_in"] == 0 for d in physical)
    assert all(not any(d["bytes_migrated_in_by_reason"].values()) for d in physical)
    text = out["prometheus"]
    assert 'flexnpu_migrated_bytes_total{client="0",device="1",reason="least_loaded"} 0.0' in text
