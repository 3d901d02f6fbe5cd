"""Pytest set-up: FlexNPU and its physical backend (the same xla-cpu-pjrt plugin, loaded directly
by JAX as platform `xlacpu`) side by side in one process, so every test can compare the two."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

REFERENCE_PLATFORM = "xlacpu"
NUM_PHYSICAL = 4


def pytest_configure(config: pytest.Config) -> None:
    # `flexnpu serve` caches compiled programs in the user cache directory by default: the
    # servers the tests start (they inherit the environment) use a temporary one instead.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="flexnpu-tests-cache-")
    config.add_cleanup(lambda: shutil.rmtree(os.environ["XDG_CACHE_HOME"], ignore_errors=True))
    import jax
    from jax._src import xla_bridge

    import flexnpu

    xla_bridge.register_plugin(
        REFERENCE_PLATFORM,
        library_path=str(flexnpu.cpu_plugin_path()),
        options={"cpu_device_count": NUM_PHYSICAL},
    )
    jax.config.update("jax_platforms", f"flexnpu,{REFERENCE_PLATFORM}")


@pytest.fixture(scope="session")
def npu_devices() -> list:
    import jax

    return jax.devices("flexnpu")


@pytest.fixture(scope="session")
def ref_devices() -> list:
    import jax

    return jax.devices(REFERENCE_PLATFORM)
