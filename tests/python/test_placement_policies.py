"""Real JAX programs under every placement policy: results identical to NumPy/the physical
backend, executions land where the policy says, migrations are counted."""

from __future__ import annotations

import json

import pytest
from _subprocess import run_python

# A prefill-like step (compute-bound matmul) and a decode-like step (GEMV over a large weight
# plus an in-place KV-cache append with the cache donated), all on virtual device 0.
WORKLOAD = """
import json
from functools import partial
import jax, jax.numpy as jnp, numpy as np
import flexnpu.stats

rng = np.random.default_rng(0)
w = (rng.standard_normal((512, 2048)) * 0.01).astype(np.float32)
x_prompt = rng.standard_normal((256, 512)).astype(np.float32)
x_token = rng.standard_normal((1, 512)).astype(np.float32)
dev = jax.devices()[0]

prefill = jax.jit(lambda x, w: jnp.tanh(x @ w[:, :512]))

@partial(jax.jit, donate_argnums=(0,))
def decode(cache, x, w, pos):
    y = x @ w
    return jax.lax.dynamic_update_slice(cache, y[:, :512], (pos, 0)), y.sum()

wd = jax.device_put(w, dev)
cache = jax.device_put(np.zeros((1024, 512), np.float32), dev)
want_cache = np.zeros((1024, 512), np.float32)
ok = True
for step in range(6):
    h = prefill(jax.device_put(x_prompt, dev), wd)
    ok &= bool(np.allclose(np.asarray(h), np.tanh(x_prompt @ w[:, :512]), rtol=1e-4, atol=1e-5))
    cache, s = decode(cache, jax.device_put(x_token, dev), wd, jnp.int32(step))
    want = x_token @ w
    want_cache[step] = want[0, :512]
    ok &= bool(np.isclose(float(s), float(want.sum()), rtol=1e-4, atol=1e-4))
    ok &= list(cache.devices())[0] == dev
ok &= bool(np.allclose(np.asarray(cache), want_cache, rtol=1e-4, atol=1e-5))
print(json.dumps({"ok": ok, "stats": flexnpu.stats.clients()[0]}))
"""

PREFILL, DECODE = "prefill", "decode"


def _run(env: dict[str, str]) -> dict:
    proc = run_python(WORKLOAD, env={"JAX_PLATFORMS": "flexnpu", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], "results differ from NumPy"
    return out["stats"]


def _executions(stats: dict, phase: str) -> list[int]:
    return [d["executions"][phase] for d in stats["placement"]["physical"]]


def test_passthrough_keeps_everything_on_the_home_device() -> None:
    stats = _run({"FLEXNPU_POLICY": "passthrough"})
    assert stats["policy"] == "passthrough"
    assert stats["migrations"] == 0


def test_static_pd_never_crosses_pools() -> None:
    stats = _run({"FLEXNPU_POLICY": "static-pd:prefill=0,1|decode=2,3"})
    prefill = _executions(stats, PREFILL)
    decode = _executions(stats, DECODE)
    assert sum(prefill) == 6 and sum(decode) == 6
    assert prefill[2] == prefill[3] == 0
    assert decode[0] == decode[1] == 0
    # Decode runs in the decode pool: its inputs (weights, cache) were moved there.
    assert stats["migrations"] > 0 and stats["bytes_migrated"] > 0


def test_static_pd_pools_as_separate_options() -> None:
    stats = _run(
        {
            "FLEXNPU_POLICY": "static-pd",
            "FLEXNPU_PREFILL_DEVICES": "3",
            "FLEXNPU_DECODE_DEVICES": "0,1,2",
        }
    )
    assert _executions(stats, PREFILL) == [0, 0, 0, 6]
    assert _executions(stats, DECODE)[3] == 0


@pytest.mark.parametrize("policy", ["static-colocate", "dynamic"])
def test_co_locating_policies_give_identical_results(policy: str) -> None:
    stats = _run({"FLEXNPU_POLICY": policy})
    assert stats["policy"] == policy
    assert sum(_executions(stats, PREFILL)) == 6
    assert sum(_executions(stats, DECODE)) == 6


def test_policy_switch_at_run_time() -> None:
    code = (
        "import jax, numpy as np, flexnpu.stats\n"
        "x = jax.device_put(np.ones((4,), np.float32), jax.devices()[1])\n"
        "print(float((x * 2).sum()))\n"
        "flexnpu.stats.set_policy('dynamic')\n"
        "print(flexnpu.stats.clients()[0]['policy'])\n"
        "print(float((x * 3).sum()))\n"
        "try:\n"
        "    flexnpu.stats.set_policy('static-pd:prefill=0')\n"
        "except ValueError as e:\n"
        "    print('rejected:', e)\n"
        "print(flexnpu.stats.clients()[0]['policy'])\n"
    )
    proc = run_python(code, env={"JAX_PLATFORMS": "flexnpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-5:]
    assert lines[0] == "8.0"
    assert lines[1] == "dynamic"
    assert lines[2] == "12.0"
    assert lines[3].startswith("rejected:") and "decode pool is missing" in lines[3]
    assert lines[4] == "dynamic"
