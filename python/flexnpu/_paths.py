"""Where FlexNPU's own plugin library and the default physical backend live."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PLUGIN_LIBRARY_NAME = "pjrt_plugin_flexnpu.so"


def plugin_library_path() -> Path:
    """Path of the FlexNPU PJRT plugin shipped inside this package."""
    path = Path(__file__).resolve().parent / PLUGIN_LIBRARY_NAME
    if not path.is_file():
        raise FileNotFoundError(f"FlexNPU plugin library missing: {path} (reinstall flexnpu)")
    return path


def cpu_plugin_path() -> Path:
    """Path of the embedded default physical backend: the `xla-cpu-pjrt` plugin."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the default backend needs the `xla-cpu-pjrt` package")
    return Path(spec.origin).resolve().parent / "xla_cpu_pjrt.so"
