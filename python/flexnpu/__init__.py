"""FlexNPU: virtual NPUs over any PJRT backend, with phase-aware placement for LLM serving."""

from typing import Any

from flexnpu._paths import cpu_plugin_path, plugin_library_path

__all__ = ["analyze", "analyze_bytes", "cpu_plugin_path", "plugin_library_path"]
__version__ = "0.1.0"

_LAZY = {"analyze", "analyze_bytes", "device_presets", "Device"}


def __getattr__(name: str) -> Any:
    # The analysis imports jax lazily; keep `import flexnpu` (run by the jax plugin) light.
    if name in _LAZY:
        from flexnpu import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module 'flexnpu' has no attribute {name!r}")
