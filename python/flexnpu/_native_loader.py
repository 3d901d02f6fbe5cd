"""Imports the nanobind extension `flexnpu._native`, with an error that says what is missing."""

from __future__ import annotations

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
