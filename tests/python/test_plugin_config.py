"""Discovery, configuration and bad-configuration errors; each case in a fresh interpreter."""

from __future__ import annotations

import json

import pytest
from _subprocess import run_python

DESCRIBE = """
import json, jax, numpy as np
d = jax.devices()
x = jax.device_put(np.arange(6.0, dtype=np.float32), d[-1])
y = jax.jit(lambda v: v * 3)(x)
print(json.dumps({
    "platform": d[0].platform,
    "n": len(d),
    "reprs": [repr(v) for v in d],
    "kinds": [v.device_kind for v in d],
    "result": np.asarray(y).tolist(),
    "result_device": list(y.devices())[0].id,
}))
"""


def _describe(env: dict[str, str], prelude: str = "") -> dict:
    proc = run_python(prelude + DESCRIBE, env={"JAX_PLATFORMS": "flexnpu", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _error(env: dict[str, str], prelude: str = "") -> str:
    proc = run_python(
        prelude + "import jax; jax.devices()", env={"JAX_PLATFORMS": "flexnpu", **env}
    )
    assert proc.returncode != 0, "expected the backend to fail"
    assert "Traceback" in proc.stderr  # a Python exception, not an abort
    return proc.stderr


def test_discovered_without_import_and_four_devices_by_default() -> None:
    info = _describe({})
    assert info["platform"] == "flexnpu"
    assert info["n"] == 4
    assert all("virtual NPU" in r for r in info["reprs"])
    assert set(info["kinds"]) == {"virtual NPU"}
    assert info["result"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert info["result_device"] == 3


@pytest.mark.parametrize("virtual", [8, 2])
def test_virtual_count_independent_of_physical(virtual: int) -> None:
    info = _describe({"FLEXNPU_NUM_VIRTUAL_DEVICES": str(virtual)})
    assert info["n"] == virtual
    assert info["result_device"] == virtual - 1
    # Virtual i lives on physical i mod 4.
    assert f"cpu:{(virtual - 1) % 4}" in info["reprs"][-1]


def test_backend_options_reach_the_physical_backend() -> None:
    info = _describe({"FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2"})
    assert info["n"] == 2


def test_create_options_win_over_environment() -> None:
    prelude = (
        "import jax\n"
        "jax.config.update('jax_pjrt_client_create_options', "
        "'num_virtual_devices:3;backend_options:cpu_device_count=3')\n"
    )
    info = _describe({"FLEXNPU_NUM_VIRTUAL_DEVICES": "7"}, prelude)
    assert info["n"] == 3
    assert "cpu:2" in info["reprs"][2]


def test_sharded_program_over_more_virtual_than_physical_devices() -> None:
    code = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
d = jax.devices()
# Virtual 0 and 4 both live on physical 0: the SPMD mapping must pick distinct physical devices.
mesh = jax.sharding.Mesh(np.array([d[0], d[4]]), ("x",))
x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(mesh, P("x")))
y = jax.jit(lambda v: (v * 2).sum())(x)
print(float(y))
"""
    proc = run_python(code, env={"JAX_PLATFORMS": "flexnpu", "FLEXNPU_NUM_VIRTUAL_DEVICES": "8"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "56.0"


def test_portable_single_device_compile() -> None:
    info = _describe(
        {"FLEXNPU_SINGLE_DEVICE_COMPILE": "portable", "FLEXNPU_NUM_VIRTUAL_DEVICES": "6"}
    )
    assert info["n"] == 6
    assert info["result"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert info["result_device"] == 5


def test_lammps_plugin_with_newer_c_api_needs_an_opt_in() -> None:
    # PJRT C API 0.115 against FlexNPU's 0.81 header: FlexNPU passes its own struct sizes, so a
    # newer plugin is refused unless the user accepts that (issue 13, item 14).
    lammps = pytest.importorskip("lammps_jax_pjrt_cpu")
    from pathlib import Path

    path = Path(lammps.__file__).parent / "pjrt_c_api_cpu_plugin.so"
    env = {"FLEXNPU_BACKEND": str(path), "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2"}
    stderr = _error(env)
    assert "has PJRT C API 0.115, newer than FlexNPU's 0." in stderr
    assert "allow_newer_backend=true (FLEXNPU_ALLOW_NEWER_BACKEND=1)" in stderr
    info = _describe({**env, "FLEXNPU_ALLOW_NEWER_BACKEND": "1"})
    assert info["n"] == 2
    assert info["result"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"FLEXNPU_POLICY": "roundrobin"},
            "FlexNPU placement policy: unknown placement policy 'roundrobin'",
        ),
        (
            {"FLEXNPU_POLICY": "static-pd", "FLEXNPU_PREFILL_DEVICES": "0,9"},
            "FlexNPU placement policy: static-pd prefill pool",
        ),
        (
            {"FLEXNPU_NUM_VIRTUAL_DEVICES": "many"},
            "'num_virtual_devices' must be an integer, got 'many'",
        ),
        (
            {"FLEXNPU_NUM_VIRTUAL_DEVICES": "0"},
            "'num_virtual_devices' must be in [1, 65536], got 0",
        ),
        (
            {"FLEXNPU_BACKEND": "/nonexistent/plugin.so"},
            "cannot load physical backend '/nonexistent/plugin.so'",
        ),
        ({"FLEXNPU_BACKEND": "libm.so.6"}, "is not a PJRT plugin: it does not export GetPjrtApi"),
        (
            {"FLEXNPU_BACKEND_OPTIONS": "cpu_device_count"},
            "malformed backend option 'cpu_device_count'",
        ),
        (
            {"FLEXNPU_SINGLE_DEVICE_COMPILE": "eager"},
            "must be 'auto', 'pinned' or 'portable', got 'eager'",
        ),
    ],
)
def test_bad_configuration_is_a_clear_error(env: dict[str, str], message: str) -> None:
    stderr = _error(env)
    assert "INVALID_ARGUMENT" in stderr
    assert message in stderr


def test_unknown_create_option_is_rejected() -> None:
    prelude = (
        "import jax\njax.config.update('jax_pjrt_client_create_options', 'num_virtual_device:3')\n"
    )
    stderr = _error({}, prelude)
    assert "INVALID_ARGUMENT" in stderr
    assert "unknown FlexNPU create option 'num_virtual_device'" in stderr


def test_backend_failing_on_its_options_is_contained() -> None:
    # The CPU plugin wants an int64 cpu_device_count and throws a C++ exception on a string:
    # FlexNPU contains it as an INTERNAL error of PJRT_Client_Create instead of aborting.
    stderr = _error({"FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=four"})
    assert "INTERNAL: PJRT_Client_Create" in stderr
