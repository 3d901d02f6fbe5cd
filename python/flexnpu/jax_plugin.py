"""JAX plugin entry point (group `jax_plugins`): registers the `flexnpu` platform.

JAX imports this module during backend discovery and calls `initialize()`; user code never
imports FlexNPU for `JAX_PLATFORMS=flexnpu` to work.
"""

from __future__ import annotations

import logging
import os
from typing import Any

PLATFORM_NAME = "flexnpu"
logger = logging.getLogger(__name__)


def _default_options() -> dict[str, str]:
    from flexnpu._paths import cpu_plugin_path

    # The C++ side cannot find a Python package; hand it the default backend's path.
    options = {"cpu_plugin_path": str(cpu_plugin_path())}
    if os.environ.get("FLEXNPU_BACKEND", "").strip().lower() == "ascend":
        # Execute through an installed Ascend PJRT plugin (a create option wins over the env).
        from flexnpu.hardware import ascend_pjrt_plugin

        plugin = ascend_pjrt_plugin()
        if plugin is None:
            raise RuntimeError(
                "FLEXNPU_BACKEND=ascend: no Ascend PJRT plugin is installed (a jax_plugins "
                "package whose name contains 'ascend'); set FLEXNPU_BACKEND to its library path"
            )
        options["backend"] = str(plugin)
    return options


def _enable_donation() -> None:
    # JAX only honours donate_argnums on platforms in a hard-coded list; FlexNPU forwards
    # donation to the physical backend, which implements it.
    from jax._src.interpreters import mlir

    if PLATFORM_NAME not in mlir._platforms_with_donation:
        mlir._platforms_with_donation.append(PLATFORM_NAME)


def _make_client() -> Any:
    from jax._src import xla_bridge

    from flexnpu import lowering

    client = xla_bridge.make_pjrt_c_api_client(PLATFORM_NAME, options=_default_options)
    # Lower as the physical platform does (LAPACK, callbacks): flexnpu/lowering.py.
    kind = lowering.backend_kind(client.platform_version)
    try:
        lowering.install(kind)
    except (ValueError, RuntimeError) as error:
        # A backend JAX has no rules for still runs everything generic.
        logger.warning("flexnpu: %s; platform-specific lowering rules are not used", error)
    # JAX runs host callbacks' Python with a "cpu" device (flexnpu/host_callbacks.py).
    from flexnpu import host_callbacks

    host_callbacks.add_host_backend_with_flexnpu(_requested_platforms())
    return client


def _requested_platforms() -> list[str] | None:
    """The platforms JAX will create backends for (jax_platforms), or None: all it knows."""
    from jax._src import config, xla_bridge

    value = config.jax_platforms.value
    if not value:
        return None
    return [p for name in value.split(",") for p in xla_bridge.expand_platform_alias(name)]


def _load_and_make_client() -> Any:
    from jaxlib import xla_client

    from flexnpu._paths import plugin_library_path

    xla_client.load_pjrt_plugin_dynamically(PLATFORM_NAME, str(plugin_library_path()))
    return _make_client()


def initialize() -> None:
    from jax._src import xla_bridge

    from flexnpu._paths import cpu_plugin_path, plugin_library_path

    # FlexNPU's C++ side offers the PJRT extensions (FFI, ...) of the backend it will use; it
    # decides when JAX loads it, before any create option, so it reads the default from here.
    os.environ.setdefault("FLEXNPU_CPU_PLUGIN_PATH", str(cpu_plugin_path()))
    requested = _requested_platforms()
    if requested is not None and PLATFORM_NAME not in requested:
        # JAX discovers plugins when it first needs a backend, after jax_platforms is final:
        # one that leaves flexnpu out never creates it, so loading FlexNPU (and with it the
        # physical backend, ~0.1 s) waits until someone asks for it anyway.
        xla_bridge.register_backend_factory(
            PLATFORM_NAME, _load_and_make_client, priority=400, fail_quietly=False,
            experimental=True,
        )
    else:
        xla_bridge.register_plugin(
            PLATFORM_NAME, library_path=str(plugin_library_path()), factory=_make_client
        )
        # JAX runs host callbacks' Python with a "cpu" device, which JAX_PLATFORMS=flexnpu
        # lacks: flexnpu/host_callbacks.py adds one when a callback needs it.
        from flexnpu import host_callbacks

        host_callbacks.give_eager_callbacks_a_host_device()
    _enable_donation()
    # JAX's persistent compilation cache only serves listed platforms: flexnpu/compilation_cache.py.
    from flexnpu import compilation_cache

    compilation_cache.enable()
