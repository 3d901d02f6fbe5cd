"""Imports the nanobind extension `flexnpu._native`, with an error that says what is missing."""

from __future__ import annotations

import functools
from typing import Any


def native(attribute: str, component: str) -> Any:
    """The extension module, checked to provide `attribute` (built with `component`)."""
    try:
        from flexnpu import _native
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "flexnpu._native is missing: build/install flexnpu (pip install .) first"
        ) from e
    if not hasattr(_native, attribute):  # pragma: no cover
        raise ImportError(f"flexnpu._native was built without {component}")
    return _native


@functools.cache
def plugin_library() -> Any:
    """The FlexNPU plugin's FlexNpu_* entry points, in the instance JAX loaded: the plugin is
    opened by the path JAX loads it from, which returns the loaded instance (or loads the one
    JAX will get). Opened once: it stays loaded for the process."""
    from flexnpu._paths import plugin_library_path

    library = native("PluginLibrary", "the plugin entry points").PluginLibrary
    return library(str(plugin_library_path()))
