"""JAX plugin entry point (group `jax_plugins`): registers the `flexnpu` platform.

JAX imports this module during backend discovery and calls `initialize()`; user code never
imports FlexNPU for `JAX_PLATFORMS=flexnpu` to work.

Installing FlexNPU changes no JAX program's default backend: with JAX_PLATFORMS unset JAX
creates every registered backend and picks the one with the highest priority, and flexnpu's
sits below jaxlib's cpu unless FLEXNPU_DEFAULT asks for it (docs/configuration.md).

FLEXNPU_PLATFORM_NAME=<physical platform> (e.g. cpu) is for frameworks that know only
tpu/gpu/cpu: FlexNPU then serves JAX's platform of that name in place of jaxlib's own, its
virtual devices present that name and the physical device kind, and JAX lowers, donates,
caches and runs callbacks as for that platform (docs/own-serving-stack.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

PLATFORM_NAME = "flexnpu"
DEFAULT_VARIABLE = "FLEXNPU_DEFAULT"
PLATFORM_NAME_VARIABLE = "FLEXNPU_PLATFORM_NAME"
# JAX's default backend is the registered one with the highest priority: jaxlib's cpu 0, tpu 300,
# a plugin 400 unless it says otherwise, cuda and rocm 500.
DEFAULT_PRIORITY = 1000  # FLEXNPU_DEFAULT=1: above all of them, whatever the physical backend
NOT_DEFAULT_PRIORITY = -100  # below jaxlib's cpu: reachable by name, never the default
_YES = ("1", "true", "yes", "on")
_NO = ("", "0", "false", "no", "off")
# XLA's C++ logging in a PJRT plugin reads this once, when the library is loaded; `import jax`
# sets it to "1" when it is unset.
_LOG_LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
_JAX_DEFAULT_LOG_LEVEL = "1"
_FATAL_ONLY = "3"
logger = logging.getLogger(__name__)


def default_requested() -> bool:
    """FLEXNPU_DEFAULT: whether flexnpu is JAX's default backend when JAX_PLATFORMS is unset."""
    raw = os.environ.get(DEFAULT_VARIABLE, "")
    value = raw.strip().lower()
    if value in _YES:
        return True
    if value in _NO:
        return False
    raise ValueError(
        f"{DEFAULT_VARIABLE}={raw!r}: expected 1, true, yes or on (flexnpu becomes JAX's "
        "default backend) or 0, false, no, off or unset (JAX's own default stays)"
    )


def presented_platform() -> str:
    """FLEXNPU_PLATFORM_NAME: the platform name FlexNPU's devices present to JAX ("flexnpu"
    unless set; the C++ side checks that another name is the physical backend's)."""
    return os.environ.get(PLATFORM_NAME_VARIABLE, "").strip().lower() or PLATFORM_NAME


@contextlib.contextmanager
def _physical_backend_logs_fatal_only() -> Iterator[None]:
    """While FlexNPU loads its physical backend: that plugin's XLA logging takes its threshold
    from TF_CPP_MIN_LOG_LEVEL when it is loaded, and during compilation it logs lines such as
    `E0000 ... Unsupported fusion type: 5` that are not errors of the program. It shows only
    fatal ones unless the user chose a threshold (a value other than JAX's default). jaxlib
    read the variable when JAX was imported, so its own log lines keep their threshold."""
    chosen = os.environ.get(_LOG_LEVEL_VARIABLE)
    if chosen not in (None, _JAX_DEFAULT_LOG_LEVEL):
        yield
        return
    os.environ[_LOG_LEVEL_VARIABLE] = _FATAL_ONLY
    try:
        yield
    finally:
        if chosen is None:
            os.environ.pop(_LOG_LEVEL_VARIABLE, None)
        else:
            os.environ[_LOG_LEVEL_VARIABLE] = chosen


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

    with _physical_backend_logs_fatal_only():
        client = xla_bridge.make_pjrt_c_api_client(PLATFORM_NAME, options=_default_options)
    # Lower as the physical platform does (LAPACK, callbacks): flexnpu/lowering.py.
    kind = lowering.backend_kind(client.platform_version)
    try:
        lowering.install(kind, presented_as=client.platform)
    except (ValueError, RuntimeError) as error:
        # A backend JAX has no rules for still runs everything generic.
        logger.warning("flexnpu: %s; platform-specific lowering rules are not used", error)
    if client.platform == PLATFORM_NAME:
        # JAX runs host callbacks' Python with a "cpu" device (flexnpu/host_callbacks.py);
        # presenting the physical platform's name, FlexNPU's devices are that device.
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

    with _physical_backend_logs_fatal_only():
        xla_client.load_pjrt_plugin_dynamically(PLATFORM_NAME, str(plugin_library_path()))
    return _make_client()


def _refuse(error: Exception) -> Callable[[], Any]:
    """A backend factory that fails with `error` when JAX creates the backend."""

    def factory() -> Any:
        raise error

    return factory


def _register(requested: list[str] | None) -> None:
    """Registers flexnpu with the priority and failure mode its request gives it: named in
    jax_platforms (JAX orders by that list) or opted in with FLEXNPU_DEFAULT, it fails loudly;
    otherwise it sits below jaxlib's cpu and a failure only makes it unavailable."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    from flexnpu._paths import plugin_library_path

    factory: Callable[[], Any] = _make_client
    try:
        requested_by_user = requested is not None or default_requested()
    except ValueError as error:
        factory, requested_by_user = _refuse(error), True
    with _physical_backend_logs_fatal_only():
        c_api = xla_bridge.register_plugin(
            PLATFORM_NAME, library_path=str(plugin_library_path()), factory=factory
        )
    # register_plugin loads the library (and registers its profiler) but fixes a priority of
    # 400, a loud failure and JAX's "experimental" warning for every plugin outside JAX's own
    # list; registering the factory again states FlexNPU's own.
    xla_bridge.register_backend_factory(
        PLATFORM_NAME,
        factory,
        priority=DEFAULT_PRIORITY if requested_by_user else NOT_DEFAULT_PRIORITY,
        fail_quietly=not requested_by_user,
        experimental=False,
        make_topology=functools.partial(xla_client.make_c_api_device_topology, c_api),
        c_api=c_api,
    )


def _register_as(name: str, requested: list[str] | None) -> None:
    """FLEXNPU_PLATFORM_NAME=name: FlexNPU's client is JAX's backend `name`, in place of the one
    JAX (or its plugin) would make; `flexnpu` is then no platform of its own.

    Another plugin may register `name` too (JAX's CUDA plugin registers `cuda`), before or
    after this one: JAX initializes plugins in no fixed order, and the last registration
    would win. FlexNPU's wins either way: it replaces an earlier one here and a later one once
    every plugin has registered (a JAX plugin callback), and says so in an info log line."""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    from flexnpu._paths import plugin_library_path

    factory: Callable[[], Any] = _make_client
    if requested is not None and PLATFORM_NAME in requested:
        factory = _refuse(
            RuntimeError(
                f"{PLATFORM_NAME_VARIABLE}={name}: FlexNPU serves JAX's {name!r} platform; "
                f"set JAX_PLATFORMS={name} (or leave it unset), not {PLATFORM_NAME}"
            )
        )
        xla_bridge.register_backend_factory(
            PLATFORM_NAME, factory, priority=DEFAULT_PRIORITY, fail_quietly=False
        )
        return
    with _physical_backend_logs_fatal_only():
        c_api = xla_client.load_pjrt_plugin_dynamically(PLATFORM_NAME, str(plugin_library_path()))

    def register() -> None:
        earlier = xla_bridge._backend_factories.get(name)
        if earlier is not None and earlier.factory is not factory and earlier.c_api is not None:
            logger.info(
                "flexnpu: %s=%s: FlexNPU serves JAX's %r platform in place of the other PJRT "
                "plugin registered under that name",
                PLATFORM_NAME_VARIABLE,
                name,
                name,
            )
        xla_bridge.register_backend_factory(
            name,
            factory,
            priority=DEFAULT_PRIORITY,
            fail_quietly=False,
            experimental=False,
            make_topology=functools.partial(xla_client.make_c_api_device_topology, c_api),
            c_api=c_api,
        )

    def keep_ours(**_: Any) -> None:
        # After every plugin registered (called once per registered C API: idempotent).
        if xla_bridge._backend_factories[name].factory is not factory:
            register()

    register()
    xla_bridge.register_plugin_callbacks(keep_ours)


def initialize() -> None:
    from jax._src import xla_bridge

    from flexnpu._paths import cpu_plugin_path

    # FlexNPU's C++ side offers the PJRT extensions (FFI, ...) of the backend it will use; it
    # decides when JAX loads it, before any create option, so it reads the default from here.
    os.environ.setdefault("FLEXNPU_CPU_PLUGIN_PATH", str(cpu_plugin_path()))
    requested = _requested_platforms()
    presented = presented_platform()
    if presented != PLATFORM_NAME:
        _register_as(presented, requested)
        return
    if requested is not None and PLATFORM_NAME not in requested:
        # JAX discovers plugins when it first needs a backend, after jax_platforms is final:
        # one that leaves flexnpu out never creates it, so loading FlexNPU (and with it the
        # physical backend, ~0.1 s) waits until someone asks for it anyway.
        xla_bridge.register_backend_factory(
            PLATFORM_NAME,
            _load_and_make_client,
            priority=NOT_DEFAULT_PRIORITY,
            fail_quietly=False,
        )
    else:
        _register(requested)
    if requested is not None and PLATFORM_NAME in requested and "cpu" not in requested:
        # JAX runs host callbacks' Python with a "cpu" device, which JAX_PLATFORMS=flexnpu
        # lacks: flexnpu/host_callbacks.py adds one when a callback needs it.
        from flexnpu import host_callbacks

        host_callbacks.give_eager_callbacks_a_host_device()
    _enable_donation()
    # JAX's persistent compilation cache only serves listed platforms: flexnpu/compilation_cache.py.
    from flexnpu import compilation_cache

    compilation_cache.enable()
