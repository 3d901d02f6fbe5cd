"""Buffers that move between physical devices while the host reads them zero-copy.

Under the dynamic policy with 8 virtual over 4 physical devices, executions move their
arguments; np.asarray of a CPU buffer aliases the physical buffer's memory. Readers must see
the stored values however often the buffers move (a use-after-free once returned freed or
not-yet-copied memory). Each case runs in a fresh interpreter with its own configuration.
"""

from __future__ import annotations

import json

from _subprocess import run_python

CONCURRENT_READS = """
import json, threading
import jax, jax.numpy as jnp, numpy as np
import flexnpu.stats

devices = jax.devices()
assert len(devices) == 8, devices
step = jax.jit(lambda a, b: a + b)
buffers = [jax.device_put(np.full((128, 128), float(i + 1), np.float32), devices[i])
           for i in range(8)]
runners_left = [3]
lock = threading.Lock()
wrong = []
reads = [0]
errors = []

def runner(k):
    try:
        for i in range(300):
            a = buffers[(k + i) % 8]
            out = step(a, a)
            expected = 2.0 * ((k + i) % 8 + 1)
            if i % 50 == 0 and not (np.asarray(out) == expected).all():
                wrong.append(("output", (k + i) % 8))
    except BaseException as e:
        errors.append(repr(e))
    finally:
        with lock:
            runners_left[0] -= 1

def reader(k):
    try:
        while True:
            with lock:
                if runners_left[0] == 0:
                    break
            for i, b in enumerate(buffers):
                v = np.asarray(b)
                reads[0] += 1
                if not (v == i + 1).all():
                    wrong.append((i, float(v.min()), float(v.max())))
    except BaseException as e:
        errors.append(repr(e))

threads = [threading.Thread(target=runner, args=(k,)) for k in range(4)]
threads += [threading.Thread(target=reader, args=(k,)) for k in range(4)]
runners_left[0] = 4
for t in threads:
    t.start()
for t in threads:
    t.join()
stats = flexnpu.stats.clients()[0]
print(json.dumps({"wrong": wrong[:10], "num_wrong": len(wrong), "reads": reads[0],
                  "errors": errors[:3], "migrations": stats["migrations"]}))
"""

ENV = {
    "JAX_PLATFORMS": "flexnpu",
    "FLEXNPU_POLICY": "dynamic",
    "FLEXNPU_NUM_VIRTUAL_DEVICES": "8",
}


def _run(code: str, env: dict[str, str], attempts: int = 5) -> dict:
    """Runs the scenario until buffers really moved while being read (whether the placer moves
    any depends on timing: on a quiet machine a run may keep everything home); every run must
    be free of errors and wrong reads. Returns the first run with migrations, else the last."""
    for _ in range(attempts):
        proc = run_python(code, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["errors"] == []
        assert result["num_wrong"] == 0, result["wrong"]
        if result["migrations"] > 0:
            break
    return result


def test_zero_copy_reads_while_the_dynamic_policy_moves_buffers() -> None:
    result = _run(CONCURRENT_READS, ENV)
    assert result["errors"] == []
    # The scenario is only meaningful if buffers really moved while being read.
    assert result["migrations"] > 0
    assert result["reads"] > 0
    assert result["num_wrong"] == 0, result["wrong"]


def test_zero_copy_reads_with_portable_execute_device() -> None:
    env = {**ENV, "FLEXNPU_SINGLE_DEVICE_COMPILE": "portable"}
    result = _run(CONCURRENT_READS, env)
    assert result["errors"] == []
    assert result["migrations"] > 0
    assert result["num_wrong"] == 0, result["wrong"]


def test_pinned_compiles_per_mapping_while_moving() -> None:
    env = {**ENV, "FLEXNPU_SINGLE_DEVICE_COMPILE": "pinned"}
    result = _run(CONCURRENT_READS, env)
    assert result["errors"] == []
    assert result["migrations"] > 0
    assert result["num_wrong"] == 0, result["wrong"]
