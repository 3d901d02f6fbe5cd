"""JAX's persistent compilation cache for the flexnpu platform.

JAX 0.10.2 only uses its persistent cache (`jax_compilation_cache_dir`) for platforms in a list
hard-coded inside `jax._src.compilation_cache.is_cache_used` ("tpu", "gpu", "cpu", "neuron").
FlexNPU serializes its executables (PJRT_Executable_Serialize: a versioned envelope, see
pjrt_flexnpu/runtime/executable_serialization.h), so the plugin wraps that one function to
answer for flexnpu as for a listed platform. The cache key JAX computes hashes FlexNPU's
platform_version, which names the physical backend, its build and FlexNPU's executable format.
tests/python/test_plugin_serialization.py pins the hook, so a JAX upgrade that moves it fails.
"""

from __future__ import annotations

from typing import Any

PLATFORM_NAME = "flexnpu"
# Any platform JAX's list accepts: only `platform` and `supports_executable_serialization`
# of the backend are read by the check.
_ACCEPTED_PLATFORM = "cpu"


class _AsAcceptedPlatform:
    """A view of the flexnpu client that JAX's platform check accepts."""

    platform = _ACCEPTED_PLATFORM
    supports_executable_serialization = True


def enable() -> None:
    """Lets JAX's persistent compilation cache serve flexnpu (idempotent)."""
    from jax._src import compilation_cache

    original = compilation_cache.is_cache_used
    if getattr(original, "_flexnpu_wrapped", False):
        return

    def is_cache_used(backend: Any) -> bool:
        if getattr(backend, "platform", None) == PLATFORM_NAME:
            return original(_AsAcceptedPlatform())
        return original(backend)

    is_cache_used._flexnpu_wrapped = True  # type: ignore[attr-defined]
    compilation_cache.is_cache_used = is_cache_used
