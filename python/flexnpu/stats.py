"""FlexNPU's runtime state, read from the loaded plugin: per virtual device bytes held, per client
executions, migrations and compiles. The plugin answers through its exported `FlexNpu_StatsJson`."""

from __future__ import annotations

import ctypes
import json
from typing import Any

from flexnpu._paths import plugin_library_path


def _library() -> ctypes.CDLL:
    # The same path JAX loaded: dlopen returns the already-loaded instance.
    library = ctypes.CDLL(str(plugin_library_path()))
    library.FlexNpu_StatsJson.restype = ctypes.c_char_p
    return library


def clients() -> list[dict[str, Any]]:
    """State of every live FlexNPU client in this process (empty before JAX creates one)."""
    raw = _library().FlexNpu_StatsJson()
    return json.loads(raw.decode()) if raw else []


def set_policy(policy: str) -> None:
    """Switches the placement policy of every live FlexNPU client, without restart.

    `policy` uses the placement syntax, e.g. "dynamic" or "static-pd:prefill=0,1|decode=2,3".
    Raises ValueError (and changes nothing) when a client rejects it.
    """
    library = _library()
    library.FlexNpu_SetPolicy.restype = ctypes.c_char_p
    library.FlexNpu_SetPolicy.argtypes = [ctypes.c_char_p]
    error = library.FlexNpu_SetPolicy(policy.encode())
    if error:
        raise ValueError(error.decode())
