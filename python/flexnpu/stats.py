"""FlexNPU's runtime state, read from the loaded plugin: per virtual device bytes held, per client
executions, migrations and compiles. The plugin answers through its exported `FlexNpu_StatsJson`
(reached through flexnpu._native)."""

from __future__ import annotations

import json
from typing import Any

from flexnpu._native_loader import plugin_library


def clients() -> list[dict[str, Any]]:
    """State of every live FlexNPU client in this process (empty before JAX creates one)."""
    raw = plugin_library().stats_json()
    return json.loads(raw) if raw else []


def set_policy(policy: str) -> None:
    """Switches the placement policy of every live FlexNPU client, without restart.

    `policy` uses the placement syntax, e.g. "dynamic" or "static-pd:prefill=0,1|decode=2,3".
    Raises ValueError (and changes nothing) when a client rejects it.
    """
    error = plugin_library().set_policy(policy)
    if error:
        raise ValueError(error)


def start_trace() -> None:
    """Starts recording the timeline of every live client (clearing an earlier one) and of
    clients created from now on."""
    plugin_library().set_tracing(True)


def stop_trace() -> None:
    plugin_library().set_tracing(False)


def trace(client: int = 0) -> dict[str, Any]:
    """The recorded timeline of a client as a Chrome trace-event object (Perfetto opens it):
    one track per physical device, executions colored by phase, migrations as flows."""
    raw = plugin_library().trace_json(client)
    if not raw:
        raise LookupError(f"no live FlexNPU client with index {client}")
    return json.loads(raw)


def export_trace(path: str, client: int = 0) -> None:
    """Writes the timeline to `path` (open it in ui.perfetto.dev or chrome://tracing)."""
    with open(path, "w") as f:
        json.dump(trace(client), f)
