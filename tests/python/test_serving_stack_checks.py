"""What third-party JAX serving stacks check before they run, on FlexNPU (EasyDeL and others
pick kernels and memory plans from these; docs/own-serving-stack.md):

* the platform name: with FLEXNPU_PLATFORM_NAME=cpu FlexNPU serves JAX's `cpu` platform, its
  virtual devices say `cpu` (platform and device kind), and FlexNPU still places every
  execution; JAX's lowering (LAPACK, platform_dependent), host callbacks, donation and the
  persistent compilation cache behave as on cpu, with results equal to the reference;
* memory stats: bytes_limit is each virtual device's share (tests/python/test_plugin_memory_stats.py
  checks the sums; here: present, and within the host's RAM in both modes);
* the persistent-cache key: JAX hashes the serialized topology, with no fallback logged.

Each configuration runs in a fresh interpreter (JAX configures its backends once per process)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _subprocess import run_python

# Runs the framework-style checks and a few programs whose lowering depends on the platform;
# prints them as JSON. argv-free: the cache directory comes from the environment.
CHECKS = textwrap.dedent(
    """
    import json, logging, os, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.experimental import io_callback
    from flexnpu import stats

    key_log = []
    class Keep(logging.Handler):
        def emit(self, record):
            key_log.append(record.getMessage())
    logging.getLogger("jax._src.cache_key").addHandler(Keep())
    logging.getLogger("jax._src.cache_key").setLevel(logging.INFO)
    hits = []
    jax.monitoring.register_event_listener(
        lambda e, **kw: hits.append(e) if e == "/jax/compilation_cache/cache_hits" else None)
    jax.config.update("jax_compilation_cache_dir", os.environ["CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    devices = jax.devices()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 8)).astype(np.float32)
    spd = a @ a.T + 8 * np.eye(8, dtype=np.float32)
    b = rng.standard_normal((8, 3)).astype(np.float32)

    def model(x, y):
        h = jax.nn.softmax(x @ x.T, axis=-1)
        return h @ y, jnp.linalg.solve(x, y), jnp.linalg.cholesky(x)

    model_out = jax.jit(model)(spd, b)
    eigvals = jax.jit(lambda m: jnp.linalg.eigh(m)[0])(spd)
    branch = jax.jit(lambda x: lax.platform_dependent(x, cpu=lambda v: v + 1.0,
                                                      default=lambda v: v - 1.0))(jnp.zeros(2))
    seen = []
    def record(v):
        seen.append(np.asarray(v).tolist())
        return np.asarray(v) * 2
    pure = jax.jit(lambda x: jax.pure_callback(
        record, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1)(jnp.arange(3.0))
    io = jax.jit(lambda x: io_callback(record, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                       ordered=True))(jnp.arange(2.0))
    jax.jit(lambda x: jax.debug.print("debug-print {}", x))(jnp.float32(7))
    donor = jax.device_put(jnp.ones(1024), devices[1])
    donated = jax.jit(lambda x: x * 3, donate_argnums=0)(donor)
    clients = stats.clients()  # none on jaxlib's own cpu
    sys.stdout.flush()
    print("RESULT" + json.dumps({
        "default_backend": jax.default_backend(),
        "platforms": sorted({d.platform for d in devices}),
        "kinds": sorted({d.device_kind for d in devices}),
        "num_devices": len(devices),
        "platform_version": devices[0].client.platform_version,
        "limits": [(d.memory_stats() or {}).get("bytes_limit") for d in devices],
        "model": [np.asarray(o).tolist() for o in model_out],
        "eigvals": np.asarray(eigvals).tolist(),
        "branch": np.asarray(branch).tolist(),
        "pure": np.asarray(pure).tolist(),
        "io": np.asarray(io).tolist(),
        "seen": seen,
        "donor_deleted": donor.is_deleted(),
        "donated": float(np.asarray(donated).sum()),
        "executions": clients[0]["executions"] if clients else None,
        "key_fallbacks": [m for m in key_log if "unable to hash" in m],
        "cache_hits": len(hits),
    }))
    """
)


def _run(env: dict[str, str], cache: Path) -> tuple[dict, str]:
    proc = run_python(CHECKS, {**env, "CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :]), proc.stdout + proc.stderr


PRESENTING_CPU = {"FLEXNPU_PLATFORM_NAME": "cpu", "FLEXNPU_POLICY": "dynamic"}
NAMED_FLEXNPU = {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_POLICY": "dynamic"}
JAXLIB_CPU = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """jaxlib's own cpu backend, FlexNPU not used (the package is installed but not asked)."""
    result, _ = _run(JAXLIB_CPU, tmp_path_factory.mktemp("cache-ref"))
    assert "flexnpu" not in result["platform_version"] and result["executions"] is None
    return result


def _assert_same_results(got: dict, want: dict) -> None:
    for g, w in zip(got["model"], want["model"], strict=True):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got["eigvals"], want["eigvals"], rtol=2e-5, atol=2e-5)
    for key in ("branch", "pure", "io", "seen", "donor_deleted", "donated"):
        assert got[key] == want[key], key


def test_presenting_cpu_looks_like_cpu_and_flexnpu_places_every_execution(
    tmp_path: Path, reference: dict
) -> None:
    cache = tmp_path / "cache"
    first, output = _run(PRESENTING_CPU, cache)
    # What a framework that knows only tpu/gpu/cpu checks.
    assert first["default_backend"] == "cpu"
    assert first["platforms"] == ["cpu"]
    assert first["kinds"] == ["cpu"]
    assert first["num_devices"] == 4
    # ... while FlexNPU runs everything.
    assert "flexnpu 0.1.0 over cpu" in first["platform_version"]
    assert first["executions"] > 0
    # Lowering (LAPACK, platform_dependent's cpu branch), callbacks and donation as on cpu.
    _assert_same_results(first, reference)
    assert first["branch"] == [1.0, 1.0]
    assert "debug-print 7" in output
    # Memory: each device's share, all of them within the host's RAM.
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert sum(first["limits"]) == host
    # The persistent cache: a key without fallback, and a second process served from it.
    assert first["key_fallbacks"] == []
    assert first["cache_hits"] == 0
    second, _ = _run(PRESENTING_CPU, cache)
    assert second["cache_hits"] > 0
    _assert_same_results(second, reference)


def test_named_flexnpu_gives_the_same_results_and_a_quiet_cache_key(
    tmp_path: Path, reference: dict
) -> None:
    result, output = _run(NAMED_FLEXNPU, tmp_path / "cache")
    assert result["platforms"] == ["flexnpu"]
    assert result["kinds"] == ["virtual NPU"]
    assert result["key_fallbacks"] == []
    _assert_same_results(result, reference)
    assert "debug-print 7" in output


def test_a_name_other_than_the_physical_platforms_is_refused(tmp_path: Path) -> None:
    proc = run_python(
        "import jax; jax.devices()",
        {"FLEXNPU_PLATFORM_NAME": "tpu", "JAX_PLATFORMS": "tpu"},
    )
    assert proc.returncode != 0
    assert "platform_name" in proc.stderr and "'tpu'" in proc.stderr, proc.stderr[-3000:]
    assert "'cpu'" in proc.stderr, proc.stderr[-3000:]


def test_presenting_cpu_refuses_jax_platforms_flexnpu() -> None:
    proc = run_python(
        "import jax; jax.devices()",
        {"FLEXNPU_PLATFORM_NAME": "cpu", "JAX_PLATFORMS": "flexnpu"},
    )
    assert proc.returncode != 0
    assert "set JAX_PLATFORMS=cpu" in proc.stderr, proc.stderr[-3000:]


# Another PJRT plugin registers the name FlexNPU presents (over CUDA: JAX's CUDA plugin
# registers `cuda`), here the XLA CPU plugin as `cpu`: before FlexNPU's registration (the
# program registers it before JAX discovers plugins) or after it (PJRT_NAMES_AND_LIBRARY_PATHS,
# which JAX reads once every plugin module has registered).
OTHER_PLUGIN_FIRST = """
from jax._src import xla_bridge
from flexnpu._paths import cpu_plugin_path
xla_bridge.register_plugin("cpu", library_path=str(cpu_plugin_path()))
"""
PRESENTED_CLIENT = """
import json, logging, jax, jax.numpy as jnp
logging.basicConfig(level=logging.INFO)
from flexnpu import stats
x = jax.jit(lambda v: v * 2)(jnp.arange(4.0))
print("RESULT" + json.dumps({
    "platform": jax.devices()[0].platform,
    "platform_version": jax.devices()[0].client.platform_version,
    "executions": stats.clients()[0]["executions"] if stats.clients() else None,
    "x": x.tolist(),
}))
"""


@pytest.mark.parametrize("other_plugin", ["registered first", "registered last"])
def test_flexnpu_serves_the_presented_name_another_plugin_also_registers(
    other_plugin: str,
) -> None:
    from flexnpu._paths import cpu_plugin_path

    env = {"FLEXNPU_PLATFORM_NAME": "cpu", "JAX_PLATFORMS": "cpu"}
    code = PRESENTED_CLIENT
    if other_plugin == "registered first":
        code = OTHER_PLUGIN_FIRST + code
    else:
        env["PJRT_NAMES_AND_LIBRARY_PATHS"] = f"cpu:{cpu_plugin_path()}"
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    result = json.loads(line[len("RESULT") :])
    assert result["platform"] == "cpu"
    assert "flexnpu 0.1.0 over cpu" in result["platform_version"], result  # FlexNPU serves
    assert result["executions"] > 0
    assert result["x"] == [0.0, 2.0, 4.0, 6.0]
    assert "FlexNPU serves JAX's 'cpu' platform in place of the other PJRT plugin" in proc.stderr
