"""The per-host daemon's configuration: its tenants and the backend it serves
(`python -m flexnpu daemon` runs it: flexnpu/cli/daemon.py).

The tenants file (TOML or JSON) lists who may connect (`FLEXNPU_TENANT`)::

    allow_unknown = false
    [[tenants]]
    name = "prefill"
    memory_quota_bytes = 8_000_000_000
    devices = [0, 1]          # physical device ids; absent: all
    priority = "latency"      # or "batch"
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRIORITIES = ("latency", "batch")


@dataclass(frozen=True)
class Tenant:
    name: str
    memory_quota_bytes: int = -1
    devices: tuple[int, ...] = ()
    priority: str = "batch"


@dataclass(frozen=True)
class Tenants:
    tenants: tuple[Tenant, ...] = ()
    allow_unknown: bool = True
    names: frozenset[str] = field(default_factory=frozenset)


def _tenant(entry: Any, where: str) -> Tenant:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise ValueError(f"{where}: each tenant needs a non-empty string 'name'")
    known = {"name", "memory_quota_bytes", "devices", "priority"}
    unknown = set(entry) - known
    if unknown:
        raise ValueError(
            f"{where}: tenant '{entry['name']}' has unknown keys {sorted(unknown)} "
            f"(known: {sorted(known)})"
        )
    quota = entry.get("memory_quota_bytes", -1)
    if not isinstance(quota, int) or isinstance(quota, bool) or quota < -1:
        raise ValueError(
            f"{where}: tenant '{entry['name']}': memory_quota_bytes must be an "
            f"integer >= 0 (or -1 for none), not {quota!r}"
        )
    devices = entry.get("devices", [])
    if not isinstance(devices, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
    ):
        raise ValueError(
            f"{where}: tenant '{entry['name']}': devices must be a list of "
            f"physical device ids, not {devices!r}"
        )
    priority = entry.get("priority", "batch")
    if priority not in PRIORITIES:
        raise ValueError(
            f"{where}: tenant '{entry['name']}': priority must be one of "
            f"{PRIORITIES}, not {priority!r}"
        )
    return Tenant(entry["name"], quota, tuple(devices), priority)


def load_tenants(path: str | Path) -> Tenants:
    """Parses a tenants file (.toml, else JSON) with errors naming the file and the field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read tenants file {path}: {e}") from e
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"tenants file {path} is not valid {path.suffix or 'JSON'}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"tenants file {path}: the top level must be a table/object")
    unknown = set(data) - {"tenants", "allow_unknown"}
    if unknown:
        raise ValueError(f"tenants file {path}: unknown keys {sorted(unknown)}")
    allow_unknown = data.get("allow_unknown", True)
    if not isinstance(allow_unknown, bool):
        raise ValueError(f"tenants file {path}: allow_unknown must be true or false")
    entries = data.get("tenants", [])
    if not isinstance(entries, list):
        raise ValueError(f"tenants file {path}: 'tenants' must be a list")
    tenants = tuple(_tenant(e, f"tenants file {path}") for e in entries)
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenants file {path}: a tenant is listed twice: {names}")
    return Tenants(tenants, allow_unknown, frozenset(names))


def _backend_options(text: str) -> list[tuple[str, int]]:
    options: list[tuple[str, int]] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            options.append((key.strip(), int(value)))
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise ValueError(f"--backend-options: '{item}' is not KEY=INTEGER")
    return options


def _backend_path(backend: str) -> str:
    if backend == "cpu":
        from flexnpu._paths import cpu_plugin_path

        return str(cpu_plugin_path())
    return backend


@dataclass(frozen=True)
class ServedBackend:
    """The plugin the daemon serves and its create options."""

    path: str
    int_options: list[tuple[str, int]]
    string_options: list[tuple[str, str]]


def served_backend(
    backend: str, backend_options: str, policy: str | None, num_virtual_devices: int = 0
) -> ServedBackend:
    """The physical plugin itself, or (with `policy`) FlexNPU's plugin over it: the same library
    flexnpu.stats reads in this process, so the runtime's state is this daemon's."""
    options = _backend_options(backend_options)
    if policy is None:
        if backend == "cpu" and not any(k == "cpu_device_count" for k, _ in options):
            options.append(("cpu_device_count", 4))
        # The emulated backend (emulate:PRESET) compiles with the CPU plugin.
        strings = (
            [("cpu_plugin_path", _backend_path("cpu"))] if backend.startswith("emulate:") else []
        )
        return ServedBackend(_backend_path(backend), options, strings)
    from flexnpu._paths import cpu_plugin_path, plugin_library_path

    if num_virtual_devices < 0:
        raise ValueError(
            f"--num-virtual-devices must be >= 1 (0: one per physical "
            f"device), not {num_virtual_devices}"
        )
    # FlexNPU's runtime defaults to 4 CPU devices itself; its backend options are one string.
    strings = [
        ("policy", policy),
        ("backend", backend),
        ("cpu_plugin_path", str(cpu_plugin_path())),
        ("backend_options", ",".join(f"{k}={v}" for k, v in options)),
    ]
    ints = [("num_virtual_devices", num_virtual_devices)] if num_virtual_devices else []
    return ServedBackend(str(plugin_library_path()), ints, strings)
