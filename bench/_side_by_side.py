"""FlexNPU and its physical backend in one process: the `xla-cpu-pjrt` plugin loaded a second time
by JAX directly, as platform `xlacpu`, so benchmarks compare the two under identical conditions."""

from __future__ import annotations

import jax
from jax._src import xla_bridge

import flexnpu

DIRECT_PLATFORM = "xlacpu"


def setup(num_physical: int = 4) -> tuple[list[jax.Device], list[jax.Device]]:
    """Returns (flexnpu devices, direct physical devices)."""
    xla_bridge.register_plugin(
        DIRECT_PLATFORM,
        library_path=str(flexnpu.cpu_plugin_path()),
        options={"cpu_device_count": num_physical},
    )
    jax.config.update("jax_platforms", f"flexnpu,{DIRECT_PLATFORM}")
    return jax.devices("flexnpu"), jax.devices(DIRECT_PLATFORM)
