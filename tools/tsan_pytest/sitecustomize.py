"""Makes every interpreter of the ThreadSanitizer pytest subset load a TSan-built FlexNPU plugin.

tools/tsan_pytest.sh puts this folder on PYTHONPATH, so Python imports it at start-up in the
pytest process and in every interpreter the tests start (they pass PYTHONPATH and LD_PRELOAD on
but drop FLEXNPU_* variables, hence the variable's name). The installed package stays untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

_PLUGIN = os.environ.get("TSAN_FLEXNPU_PLUGIN", "")

if _PLUGIN:
    import flexnpu
    import flexnpu._paths

    def _tsan_plugin_library_path() -> Path:
        path = Path(_PLUGIN)
        if not path.is_file():
            raise FileNotFoundError(f"TSAN_FLEXNPU_PLUGIN names no file: {path}")
        return path

    # Modules bind the function when they import it: flexnpu's own namespace already has.
    flexnpu._paths.plugin_library_path = _tsan_plugin_library_path
    flexnpu.plugin_library_path = _tsan_plugin_library_path
