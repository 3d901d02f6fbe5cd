"""How many co-located engine instances to run when the user does not say (`serve` without
`--devices`): what the backend really has decides.

- CPU devices (JAX's `cpu`, or FlexNPU's virtual NPUs over the XLA CPU plugin) are slices of the
  same cores: every instance's step runs on all of them, so instances beyond what the cores hold
  only make each step wait for the others' (4 instances on 2 cores: a stream's inter-token
  latency 4x that of a lone stream). One instance per `CORES_PER_CPU_INSTANCE` cores, at least
  one, at most one per device.
- Accelerators (GPU, NPU, or virtual NPUs over them): one instance per device. So are emulated
  accelerators (`FLEXNPU_BACKEND=emulate:<preset>`): their programs compile for the CPU but never
  run, and each device keeps its own time, whatever the cores.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Cores one CPU instance's steps keep busy: measured with SmolLM2-135M on a 2-core machine
# (docs/serving.md, "Default layout").
CORES_PER_CPU_INSTANCE = 2


@dataclass(frozen=True)
class InstanceChoice:
    instances: int
    reason: str  # for the start-up line, e.g. "4 CPU devices share 2 cores: 1 instance"


def physical_platform(device: Any) -> str:
    """The platform that runs `device`'s programs: FlexNPU's physical backend for its virtual
    NPUs, else the JAX platform."""
    if device.platform == "flexnpu":
        from flexnpu.lowering import backend_kind

        return backend_kind(device.client.platform_version)
    return str(device.platform)


def emulated_device_kind(device: Any) -> str | None:
    """The emulated accelerator (e.g. 'ascend910c') under FlexNPU's virtual NPU `device`, or None
    when its physical backend is not the emulated one."""
    if device.platform != "flexnpu":
        return None
    version = str(device.client.platform_version)
    marker = "(emulated "
    at = version.find(marker)
    return version[at + len(marker):].split(" ", 1)[0] if at >= 0 else None


def emulated_time_scale(device: Any) -> float:
    """Wall seconds per modelled device second of FlexNPU's emulated `device` (its backend's
    time_scale option); 1.0 for any other device."""
    if emulated_device_kind(device) is None:
        return 1.0
    version = str(device.client.platform_version)
    marker = "time_scale "
    at = version.find(marker)
    if at < 0:
        return 1.0
    try:
        return float(version[at + len(marker):].split()[0].rstrip(",;)"))
    except (ValueError, IndexError):
        return 1.0


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_instances(
    devices: Sequence[Any], cores: int | None = None, platform: str | None = None
) -> InstanceChoice:
    """The co-located instances for `devices` (`platform`: their physical platform, read from
    the first device when None; `cores`: available_cores() when None)."""
    if not devices:
        raise ValueError("no devices to serve on")
    n = len(devices)
    if platform is None and (emulated := emulated_device_kind(devices[0])) is not None:
        devices_named = _count(n, f"emulated {emulated} device")
        return InstanceChoice(n, f"{devices_named}: one instance each")
    platform = platform or physical_platform(devices[0])
    if platform != "cpu":
        return InstanceChoice(n, f"{_count(n, platform + ' device')}: one instance each")
    cores = available_cores() if cores is None else cores
    instances = min(n, max(1, cores // CORES_PER_CPU_INSTANCE))
    verb = "share" if instances < n else "over"
    return InstanceChoice(
        instances,
        f"{_count(n, 'CPU device')} {verb} {_count(cores, 'core')}: "
        f"{_count(instances, 'instance')}",
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
