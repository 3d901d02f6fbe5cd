"""Memory stats as a serving framework reads them to size its KV cache: each virtual device's
`bytes_limit` is its share of its physical device's memory, so N virtual devices over M physical
ones add up to what the physical devices have (for the CPU backend: the host's RAM, split among
the CPU devices), and `bytes_in_use` counts the bytes held on that virtual device.

Each configuration runs in a fresh interpreter (JAX configures its backends once per process)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from _subprocess import run_python

PROGRAM = textwrap.dedent(
    """
    import json
    import jax
    import jax.numpy as jnp
    from flexnpu import stats

    devices = jax.devices("flexnpu")
    before = [d.memory_stats() for d in devices]
    held = jax.device_put(jnp.ones((1000,), jnp.float32), devices[-1])
    held.block_until_ready()
    after = [d.memory_stats() for d in devices]
    (client,) = stats.clients()
    print("RESULT" + json.dumps({
        "before": before,
        "after": after,
        "homes": [v["home_physical"] for v in client["virtual_devices"]],
        "physical": client["physical_memory_bytes"],
    }))
    """
)


def _host_ram() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _run(num_virtual: int, num_physical: int) -> dict:
    proc = run_python(
        PROGRAM,
        {
            "JAX_PLATFORMS": "flexnpu",
            "FLEXNPU_NUM_VIRTUAL_DEVICES": str(num_virtual),
            "FLEXNPU_BACKEND_OPTIONS": f"cpu_device_count={num_physical}",
        },
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.parametrize(("num_virtual", "num_physical"), [(1, 1), (4, 1), (4, 4), (6, 4), (3, 2)])
def test_virtual_limits_add_up_to_the_physical_memory(num_virtual: int, num_physical: int) -> None:
    r = _run(num_virtual, num_physical)
    host = _host_ram()
    physical = r["physical"]
    assert len(physical) == num_physical
    # The CPU devices split the host's RAM.
    assert sum(physical) == host
    assert max(physical) - min(physical) <= 1
    limits = [s["bytes_limit"] for s in r["before"]]
    assert len(limits) == num_virtual
    for p in range(num_physical):
        homed = [limit for limit, home in zip(limits, r["homes"], strict=True) if home == p]
        if homed:
            assert sum(homed) == physical[p], (p, homed)
            assert max(homed) - min(homed) <= 1
    if num_virtual >= num_physical:
        assert sum(limits) == host
    # The limit is also what the device may reserve.
    assert all(s["bytes_reservable_limit"] == s["bytes_limit"] for s in r["before"])


def test_bytes_in_use_counts_what_each_virtual_device_holds() -> None:
    r = _run(6, 4)
    before = [s["bytes_in_use"] for s in r["before"]]
    after = [s["bytes_in_use"] for s in r["after"]]
    # 1000 float32 on the last virtual device, nothing elsewhere.
    assert after[-1] - before[-1] == 4000
    assert after[:-1] == before[:-1]
    assert all(a <= s["bytes_limit"] for a, s in zip(after, r["after"], strict=True))
