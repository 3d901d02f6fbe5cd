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


def start_trace() -> None:
    """Starts recording the timeline of every live client (clearing an earlier one) and of
    clients created from now on."""
    library = _library()
    library.FlexNpu_SetTracing.argtypes = [ctypes.c_int]
    library.FlexNpu_SetTracing(1)


def stop_trace() -> None:
    library = _library()
    library.FlexNpu_SetTracing.argtypes = [ctypes.c_int]
    library.FlexNpu_SetTracing(0)


def trace(client: int = 0) -> dict[str, Any]:
    """The recorded timeline of a client as a Chrome trace-event object (Perfetto opens it):
    one track per physical device, executions colored by phase, migrations as flows."""
    library = _library()
    library.FlexNpu_TraceJson.restype = ctypes.c_char_p
    library.FlexNpu_TraceJson.argtypes = [ctypes.c_int]
    raw = library.FlexNpu_TraceJson(client)
    if not raw:
        raise LookupError(f"no live FlexNPU client with index {client}")
    return json.loads(raw.decode())


def export_trace(path: str, client: int = 0) -> None:
    """Writes the timeline to `path` (open it in ui.perfetto.dev or chrome://tracing)."""
    with open(path, "w") as f:
        json.dump(trace(client), f)
