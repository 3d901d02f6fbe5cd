"""Physical accelerators as their vendor libraries see them: Ascend NPUs through AscendCL,
NVIDIA GPUs through NVML; and where an Ascend PJRT plugin is installed (`ascend_pjrt_plugin`).

The C++ hardware layer (`pjrt_flexnpu/hardware/`, exposed as `flexnpu._native`) loads
libascendcl.so / libnvidia-ml.so.1 with dlopen, so nothing here needs the vendor SDKs installed:
without them `discover()` returns no devices (source `auto`) or raises `HardwareError` naming
the library and the call that failed (an explicit source).

    >>> from flexnpu import hardware
    >>> for d in hardware.discover():          # doctest: +SKIP
    ...     print(d.index, d.name, d.preset, d.memory_free_bytes)
    0 Ascend910B2 ascend910b 60129542144

Sources: `auto` (AscendCL when it loads and sees devices; NVML when `backend_is_cuda`; else
none), `ascendcl`, `nvml`, `none`. Libraries: option or `FLEXNPU_ASCENDCL_LIBRARY` /
`FLEXNPU_NVML_LIBRARY`, else `$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64` and the
loader path. `ASCEND_RT_VISIBLE_DEVICES` is honoured (index = logical id, physical_index = the
NPU id npu-smi shows). GPUs are numbered by CUDA ordinal, matched to NVML by PCI bus id.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flexnpu._native_loader import native

SOURCES = ("auto", "ascendcl", "nvml", "none")


class HardwareError(RuntimeError):
    """A vendor library could not be loaded or one of its calls failed (the message names the
    library, the call, the library's error code and its text)."""


def _native() -> Any:
    return native("hardware_open", "the hardware layer")


@dataclass(frozen=True)
class Utilization:
    """Percentages; None where the library cannot say (ACL's -1, NVML NOT_SUPPORTED)."""

    compute: int | None
    memory: int | None
    cube: int | None = None
    vector: int | None = None


@dataclass(frozen=True)
class PhysicalDevice:
    """One accelerator: ids, name, roofline preset and a reading of memory and utilisation."""

    index: int  # ACL logical id / CUDA ordinal: the PJRT device's local hardware id
    physical_index: int | None  # npu-smi / nvidia-smi numbering
    source: str  # "ascendcl" or "nvml"
    name: str
    preset: str | None
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    utilization: Utilization
    pci_bus_id: str | None = None
    ai_cores: int | None = None

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PhysicalDevice:
        u = d["utilization"]
        return PhysicalDevice(
            index=d["index"],
            physical_index=d["physical_index"],
            source=d["source"],
            name=d["name"],
            preset=d["preset"],
            memory_total_bytes=d["memory_total_bytes"],
            memory_free_bytes=d["memory_free_bytes"],
            utilization=Utilization(u["compute"], u["memory"], u["cube"], u["vector"]),
            pci_bus_id=d["pci_bus_id"],
            ai_cores=d["ai_cores"],
        )


def preset_for_name(name: str) -> str | None:
    """Roofline preset of a SoC or GPU name (`Ascend910B2` -> `ascend910b`), None if unknown."""
    return _native().hardware_preset_for_name(name) or None


class Source:
    """An opened vendor library (aclInit / nvmlInit_v2 done); `close()` finalises it."""

    def __init__(self, handle: Any, fallback: str) -> None:
        self._handle = handle
        self.fallback = fallback  # auto: why no (or which) source, one line; else ""

    @property
    def kind(self) -> str:
        return str(self._handle.kind)

    @property
    def library(self) -> str:
        return str(self._handle.library)

    @property
    def notes(self) -> list[str]:
        return list(self._handle.notes)

    def __len__(self) -> int:
        return int(self._handle.device_count)

    def devices(self) -> list[PhysicalDevice]:
        try:
            return [PhysicalDevice.from_dict(self._handle.describe(i)) for i in range(len(self))]
        except RuntimeError as e:
            raise HardwareError(str(e)) from e

    def bind(self, index: int) -> None:
        """AscendCL: aclrtSetDevice(index), held until unbind/close. NVML: nothing to do."""
        try:
            self._handle.bind(index)
        except RuntimeError as e:
            raise HardwareError(str(e)) from e

    def unbind(self, index: int) -> None:
        try:
            self._handle.unbind(index)
        except RuntimeError as e:
            raise HardwareError(str(e)) from e

    def bound(self, index: int) -> bool:
        return bool(self._handle.bound(index))

    def sampler(self, period_s: float) -> Any:
        """A background sampler (`latest()`, `refresh()`, `rounds`, `errors`, `close()`)."""
        return _native().HardwareSampler(self._handle, period_s)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_source(
    source: str | None = None,
    *,
    ascendcl_library: str | None = None,
    nvml_library: str | None = None,
    dcmi_library: str | None = None,
    cuda_library: str | None = None,
    backend_is_cuda: bool = False,
) -> Source | None:
    """The telemetry source (None for `none`, or `auto` finding nothing: see `last_fallback`).
    Unset arguments come from FLEXNPU_TELEMETRY, FLEXNPU_ASCENDCL_LIBRARY, FLEXNPU_NVML_LIBRARY.
    Raises HardwareError when an explicit source fails, ValueError for an unknown source."""
    global last_fallback
    mode = source or os.environ.get("FLEXNPU_TELEMETRY", "auto")
    try:
        handle, fallback = _native().hardware_open(
            mode,
            ascendcl_library or os.environ.get("FLEXNPU_ASCENDCL_LIBRARY", ""),
            nvml_library or os.environ.get("FLEXNPU_NVML_LIBRARY", ""),
            dcmi_library or "",
            cuda_library or "",
            backend_is_cuda,
        )
    except RuntimeError as e:
        raise HardwareError(str(e)) from e
    last_fallback = fallback
    return None if handle is None else Source(handle, fallback)


last_fallback = ""  # the auto fallback line of the last open_source call


def ascend_pjrt_plugin() -> Path | None:
    """The PJRT plugin library of an installed Ascend JAX plugin: a `jax_plugins` package (or
    `jax_plugins` entry point) whose name contains "ascend", and the shared library in it (one
    named *pjrt* or *plugin* first). None when there is none. No official Ascend plugin exists;
    community builds package themselves this way, like the CUDA and TPU plugins."""
    candidates: list[Path] = []
    try:
        import jax_plugins  # namespace package of JAX plugins

        for module in pkgutil.iter_modules(jax_plugins.__path__):
            if "ascend" in module.name.lower():
                for folder in jax_plugins.__path__:
                    candidates.append(Path(folder) / module.name)
    except ImportError:
        pass
    for entry in importlib.metadata.entry_points(group="jax_plugins"):
        if "ascend" in entry.name.lower() or "ascend" in entry.value.lower():
            spec = importlib.util.find_spec(entry.value.split(":")[0])
            if spec is not None and spec.origin is not None:
                candidates.append(Path(spec.origin).parent)
    for folder in candidates:
        libraries = sorted(p for p in folder.glob("*.so") if p.is_file())
        libraries.sort(key=lambda p: not ("pjrt" in p.name or "plugin" in p.name))
        if libraries:
            return libraries[0]
    return None


def discover(source: str | None = None, **libraries: Any) -> list[PhysicalDevice]:
    """Every physical device of the source (see open_source), with a fresh reading."""
    opened = open_source(source, **libraries)
    if opened is None:
        return []
    with opened:
        return opened.devices()
