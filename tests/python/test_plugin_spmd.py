"""SPMD programs over virtual devices whose order differs from the physical devices' order.

FlexNPU compiles an SPMD program for distinct physical devices and hands the inner executable
its arguments in the inner device order (inner_position). With the virtual devices listed out
of physical order, or colliding on one physical device (8 virtual over 4 physical, where the
dynamic policy's group mapping moves buffers every step), each shard must still get its own
data and come back on its own virtual device.
"""

from __future__ import annotations

import json

from _subprocess import run_python

SHARD_ORDER = """
import json
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

devices = jax.devices()
picked = [devices[i] for i in %s]
mesh = Mesh(np.array(picked), ("x",))
# Each shard is scaled by its own position along the mesh axis: a shard handed to the wrong
# inner position comes back scaled wrongly.
scale = jax.jit(jax.shard_map(lambda x: x * (jax.lax.axis_index("x") + 1).astype(x.dtype),
                              mesh=mesh, in_specs=P("x"), out_specs=P("x")))
x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("x")))
results = []
for _ in range(4):  # repeated: under dynamic, inputs ping-pong between physical devices
    x = scale(x)
    results.append(np.asarray(x).tolist())
shard_devices = [s.device.id for s in x.addressable_shards]
print(json.dumps({"results": results, "shard_devices": shard_devices,
                  "picked": [d.id for d in picked]}))
"""


def _expected(rounds: int, n: int) -> list[list[float]]:
    x = list(range(8))
    per = 8 // n
    out = []
    for _ in range(rounds):
        x = [v * (i // per + 1) for i, v in enumerate(x)]
        out.append([float(v) for v in x])
    return out


def _run(picked: list[int], env: dict[str, str]) -> dict:
    proc = run_python(SHARD_ORDER % picked, env={"JAX_PLATFORMS": "flexnpu", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_devices_out_of_physical_order() -> None:
    info = _run([3, 0], {})
    assert info["results"] == _expected(4, 2)
    assert info["shard_devices"] == [3, 0]


def test_colliding_virtual_devices_under_dynamic() -> None:
    # Virtual 5 and 1 both live on physical 1: the group takes physical 1 and 0, in the
    # opposite order of the inner executable's device list for one of the two.
    info = _run([5, 1], {"FLEXNPU_NUM_VIRTUAL_DEVICES": "8", "FLEXNPU_POLICY": "dynamic"})
    assert info["results"] == _expected(4, 2)
    assert info["shard_devices"] == [5, 1]


def test_four_shards_reversed_over_eight_virtual() -> None:
    info = _run([7, 2, 5, 0], {"FLEXNPU_NUM_VIRTUAL_DEVICES": "8"})
    assert info["results"] == _expected(4, 4)
    assert info["shard_devices"] == [7, 2, 5, 0]


SPMD_LOAD = """
import json
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import flexnpu.stats

devices = jax.devices()
mesh = Mesh(np.array([devices[5], devices[1]]), ("x",))
double = jax.jit(jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("x")))
before = flexnpu.stats.clients()[0]["placement"]["decisions_total"]
for _ in range(3):
    x = double(x)
x.block_until_ready()
after = flexnpu.stats.clients()[0]["placement"]
print(json.dumps({"result": np.asarray(x).tolist(), "before": before, "after": after}))
"""


def test_spmd_shards_are_load_the_dynamic_policy_sees() -> None:
    # Virtual 5 and 1 both live on physical 1 (8 over 4): the group runs on physical 1 and 0.
    # Every shard of every call is one placement there, as single-device executions are.
    proc = run_python(
        SPMD_LOAD,
        env={"JAX_PLATFORMS": "flexnpu", "FLEXNPU_NUM_VIRTUAL_DEVICES": "8",
             "FLEXNPU_POLICY": "dynamic"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == [float(v * 8) for v in range(8)]
    placement = out["after"]
    assert placement["decisions_total"] - out["before"] == 6
    virtual = {v["device"]: v for v in placement["virtual"]}
    physical = {d["device"]: d for d in placement["physical"]}
    for v in (5, 1):
        assert sum(virtual[v]["executions"].values()) == 3
    for d in (1, 0):
        assert sum(physical[d]["executions"].values()) == 3
