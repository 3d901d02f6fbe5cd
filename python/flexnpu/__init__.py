"""FlexNPU: virtual NPUs over any PJRT backend, with phase-aware placement for LLM serving."""

from flexnpu._paths import cpu_plugin_path, plugin_library_path

__all__ = ["cpu_plugin_path", "plugin_library_path"]
__version__ = "0.1.0"
