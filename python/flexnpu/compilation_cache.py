"""JAX's persistent compilation cache for the flexnpu platform.

JAX 0.10.2 only uses its persistent cache (`jax_compilation_cache_dir`) for platforms in a list
hard-coded inside `jax._src.compilation_cache.is_cache_used` ("tpu", "gpu", "cpu", "neuron").
FlexNPU serializes its executables (PJRT_Executable_Serialize: a versioned envelope, see
pjrt_flexnpu/runtime/executable_serialization.h), so the plugin wraps that one function to
answer for flexnpu as for a listed platform. The cache key JAX computes hashes FlexNPU's
platform_version, which names the physical backend, its build and FlexNPU's executable format.
tests/python/test_plugin_serialization.py pins the hook, so a JAX upgrade that moves it fails.

`flexnpu serve` turns the cache on by default in a user cache directory (`default_directory`),
and `CacheEvents` tells its progress output whether the programs come from the cache.
"""

from __future__ import annotations

import os
from pathlib import Path
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


def default_directory() -> Path:
    """$XDG_CACHE_HOME/flexnpu/jax-cache (an absolute XDG_CACHE_HOME only, as the XDG spec
    says), else ~/.cache/flexnpu/jax-cache."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "flexnpu" / "jax-cache"


def use_directory(directory: str | os.PathLike[str]) -> None:
    """JAX's persistent compilation cache in `directory` for every program (also the quick
    ones: a serving engine's small programs add up at start-up)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


_REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"


class CacheEvents:
    """Counts, while active (a context manager), JAX's compiles that consulted the persistent
    cache and those it served."""

    def __init__(self) -> None:
        self.requests = 0
        self.hits = 0

    def _on_event(self, event: str, **_: Any) -> None:
        if event == _REQUESTS:
            self.requests += 1
        elif event == _HITS:
            self.hits += 1

    @property
    def misses(self) -> int:
        return self.requests - self.hits

    def __enter__(self) -> CacheEvents:
        import jax

        jax.monitoring.register_event_listener(self._on_event)
        return self

    def __exit__(self, *exc: object) -> None:
        import jax

        jax.monitoring.unregister_event_listener(self._on_event)
