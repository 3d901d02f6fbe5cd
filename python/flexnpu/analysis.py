"""HLO analysis: how much an executable computes and moves, and which phase it is on a device.

The work is done by the C++ analysis in `xla_passes/` (exposed as `flexnpu._native`); this
module gets optimized HLO out of jax and wraps the results in typed objects.

    >>> import jax.numpy as jnp, flexnpu
    >>> a = flexnpu.analyze(lambda x, w: x @ w, jnp.ones((1, 8192)), jnp.ones((8192, 8192)),
    ...                     device="h200")
    >>> a.phase, round(a.arithmetic_intensity, 2)   # doctest: +SKIP
    ('decode', 0.5)

Phases (see xla_passes/roofline.h): `prefill` = compute-bound (arithmetic intensity at or
above the device ridge point), `decode` = bandwidth-bound, `small` = roofline time below the
device's latency floor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from flexnpu._native_loader import native


def _native() -> Any:
    return native("analyze_hlo", "the xla_passes analysis")


@dataclass(frozen=True)
class Device:
    """A roofline: dense peak FLOP/s, memory bandwidth (bytes/s) and a latency floor."""

    name: str
    peak_flops: float
    mem_bandwidth: float
    small_work_s: float = 20e-6
    native_low_precision: bool = True
    source: str = "custom"

    @property
    def ridge(self) -> float:
        """FLOPs per byte at which the device turns from bandwidth- to compute-bound."""
        return self.peak_flops / self.mem_bandwidth if self.mem_bandwidth > 0 else 0.0

    def _as_native(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_flops": float(self.peak_flops),
            "mem_bandwidth": float(self.mem_bandwidth),
            "small_work_s": float(self.small_work_s),
            "native_low_precision": bool(self.native_low_precision),
        }


def device_presets() -> dict[str, Device]:
    """Built-in devices: ascend910b, ascend910c, h100, h200, a100 and cpu (this machine)."""
    presets = _native().device_presets()
    return {
        name: Device(
            name=d["name"],
            peak_flops=d["peak_flops"],
            mem_bandwidth=d["mem_bandwidth"],
            small_work_s=d["small_work_s"],
            native_low_precision=d["native_low_precision"],
            source=d["source"],
        )
        for name, d in presets.items()
    }


def preset_table() -> dict[str, dict[str, Any]]:
    """The one device preset table (xla_passes/roofline.cc) as C++ holds it: roofline, memory,
    link and the fitted efficiencies the simulator and the emulated backend both use."""
    return dict(_native().device_presets())


def link_table() -> dict[str, dict[str, Any]]:
    """The device-to-device links of the preset table (name, bytes_per_s, latency_s, source)."""
    return dict(_native().links())


def get_device(device: str | Device) -> Device:
    """A preset by name (case, '-' and '_' ignored) or a custom `Device` as given."""
    if isinstance(device, Device):
        return device
    key = device.lower().replace("-", "").replace("_", "").replace(" ", "")
    presets = device_presets()
    if key not in presets and f"ascend{key}" in presets:  # "910c", as FindDevice takes it
        key = f"ascend{key}"
    if key not in presets:
        raise ValueError(f"unknown device {device!r} (known: {', '.join(sorted(presets))})")
    return presets[key]


@dataclass(frozen=True)
class Classification:
    phase: str
    device: str
    ridge: float
    arithmetic_intensity: float
    flops: float
    bytes: float
    compute_time_s: float
    memory_time_s: float
    roofline_time_s: float
    ridge_ratio: float


@dataclass(frozen=True)
class Analysis:
    """An executable profile (plain dict, keys as in xla_passes/analysis.h) + classification."""

    profile: dict[str, Any]
    classification: Classification
    device: Device = field(repr=False)

    @property
    def phase(self) -> str:
        return self.classification.phase

    @property
    def flops(self) -> float:
        return float(self.profile["flops"])

    @property
    def bytes_accessed(self) -> float:
        return float(self.profile["bytes_accessed"])

    @property
    def arithmetic_intensity(self) -> float:
        return float(self.profile["arithmetic_intensity"])

    def classify(self, device: str | Device) -> Classification:
        """The same profile classified on another device (no re-analysis)."""
        return classify_profile(self.profile, device)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "classification": asdict(self.classification),
            "device": asdict(self.device) | {"ridge": self.device.ridge},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        return format_table(self)


def classify_profile(profile: Mapping[str, Any], device: str | Device) -> Classification:
    dev = get_device(device)
    c = _native().classify_profile(
        float(profile["flops"]),
        float(profile["bytes_accessed"]),
        float(profile.get("convert_overhead_flops", 0.0)),
        float(profile.get("convert_overhead_bytes", 0.0)),
        dev._as_native(),
    )
    return Classification(**c)


def analyze_bytes(
    data: bytes, device: str | Device = "cpu", xla_compatible: bool = False
) -> Analysis:
    """Analyzes a serialized HloModuleProto or HloModuleProtoWithConfig.

    `xla_compatible=True` counts exactly as XLA's cost analysis (one iteration per while loop,
    whole tables for fused gathers); the default counts one real execution (see
    xla_passes/analysis.h). Raises ValueError (with the reason) on malformed input.
    """
    dev = get_device(device)
    out = _native().classify(bytes(data), dev._as_native(), xla_compatible)
    return Analysis(
        profile=out["profile"], classification=Classification(**out["classification"]), device=dev
    )


def optimized_hlo(fn: Callable[..., Any] | Any, *args: Any, **kwargs: Any) -> bytes:
    """Serialized optimized HloModuleProto of `fn` compiled for `args`.

    `fn` may be a plain function, a `jax.jit` function, or an already compiled
    `jax.stages.Compiled` (then `args` must be empty). Arguments may be arrays or
    `jax.ShapeDtypeStruct`s (nothing is executed).
    """
    compiled = fn if hasattr(fn, "runtime_executable") else None
    if compiled is None:
        import jax

        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        compiled = jitted.lower(*args, **kwargs).compile()
    elif args or kwargs:
        raise TypeError("a compiled executable takes no example arguments")
    modules = compiled.runtime_executable().hlo_modules()
    if len(modules) != 1:
        raise ValueError(f"expected one HLO module, got {len(modules)}")
    return bytes(modules[0].as_serialized_hlo_module_proto())


def analyze(
    fn: Callable[..., Any] | Any,
    *args: Any,
    device: str | Device = "cpu",
    xla_compatible: bool = False,
    **kwargs: Any,
) -> Analysis:
    """Compiles `fn` for the example arguments and analyzes its optimized HLO."""
    data = optimized_hlo(fn, *args, **kwargs)
    return analyze_bytes(data, device=device, xla_compatible=xla_compatible)


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _seconds(value: float) -> str:
    for scale, suffix in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if value >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value / 1e-9:.3g} ns"


def format_table(a: Analysis) -> str:
    p, c, d = a.profile, a.classification, a.device
    rows: list[tuple[str, str]] = [
        ("module", str(p["module_name"])),
        ("phase", f"{c.phase} on {d.name} (ridge {c.ridge:.1f} FLOP/B)"),
        ("FLOPs", _si(p["flops"], "FLOP")),
        ("  dot / conv", f"{_si(p['dot_flops'], 'FLOP')} / {_si(p['conv_flops'], 'FLOP')}"),
        (
            "  elementwise / reduce",
            f"{_si(p['elementwise_flops'], 'FLOP')} / {_si(p['reduce_flops'], 'FLOP')}",
        ),
        ("transcendentals", _si(p["transcendentals"], "op")),
        ("bytes accessed", _si(p["bytes_accessed"], "B")),
        ("  read / written", f"{_si(p['bytes_read'], 'B')} / {_si(p['bytes_written'], 'B')}"),
        (
            "  convert overhead",
            f"{_si(p['convert_overhead_bytes'], 'B')}, {_si(p['convert_overhead_flops'], 'FLOP')}",
        ),
        ("arithmetic intensity", f"{p['arithmetic_intensity']:.3g} FLOP/B"),
        (f"intensity on {d.name}", f"{c.arithmetic_intensity:.3g} FLOP/B ({c.ridge_ratio:.3g}x)"),
        (
            "roofline time",
            f"{_seconds(c.roofline_time_s)} (compute {_seconds(c.compute_time_s)}, "
            f"memory {_seconds(c.memory_time_s)})",
        ),
        ("dots (GEMV-shaped)", f"{p['dot_count']} ({p['gemv_dot_count']})"),
        (
            "state appends",
            f"{p['state_append_count']} into {_si(p['state_append_buffer_bytes'], 'B')}",
        ),
        (
            "while loops",
            f"{p['while_loops']} (unknown trip count: {p['while_loops_unknown_trip_count']})",
        ),
        ("kernels / fusions", f"{p['top_level_kernels']} / {p['fusion_count']}"),
        (
            "parameters / outputs",
            f"{_si(p['parameter_bytes'], 'B')} / {_si(p['output_bytes'], 'B')}",
        ),
        ("aliased in place", f"{len(p['aliased'])} buffers, {_si(p['aliased_bytes'], 'B')}"),
    ]
    for b in p["largest_parameters"]:
        rows.append((f"  param {b['index']}", f"{b['shape']} {_si(b['bytes'], 'B')} {b['name']}"))
    for b in p["largest_outputs"]:
        rows.append((f"  output {b['name']}", f"{b['shape']} {_si(b['bytes'], 'B')}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
