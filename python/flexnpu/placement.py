"""Placement decision core: which physical device runs each execution.

The decisions are made by the C++ core in `pjrt_flexnpu/placement/` (exposed as
`flexnpu._native`); see `pjrt_flexnpu/placement/placement.h` for the policies and the cost
model. This module wraps it in typed objects for tests, tools and simulators. The clock is
injected: every call takes `now_ns` (any epoch), so the same calls give the same decisions.

    >>> from flexnpu import placement as fp
    >>> core = fp.Core("dynamic", [fp.DeviceModel.from_preset("h200")] * 4)
    >>> d = core.place(0, fp.Profile("decode", flops=2e9, bytes=2e9), now_ns=0)
    >>> d.physical_device, d.reason
    (0, 'affinity')
    >>> core.on_finish(d.ticket, now_ns=500_000)

Policies: `passthrough`, `static-pd:prefill=0,1;decode=2,3` (also `|` between pools),
`static-colocate`, `dynamic`; switch at run time with `Core.set_policy`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flexnpu._native_loader import native

# The phases of the one C++ enum (pjrt_flexnpu/base/phase.h), in code order, and their codes.
PHASES: tuple[str, ...] = native("PHASE_NAMES", "the base layer").PHASE_NAMES
PHASE_CODE: dict[str, int] = {name: code for code, name in enumerate(PHASES)}
REASONS = (
    "passthrough",
    "affinity",
    "least_loaded",
    "pool",
    "idle_steal",
    "return_home",
    "avoid_failed",
    "fallback",
)
ANYWHERE = -1  # an input present on every device (replicated, host): no migration cost

# Link bandwidth (bytes/s, one direction) of the presets, for input migration. cpu: a copy in
# the same memory (its measured copy bandwidth). Others: PCIe-class unless known.
_PRESET_LINK = {
    "h100": 450e9,  # NVLink 4: 900 GB/s bidirectional
    "h200": 450e9,  # NVLink 4: 900 GB/s bidirectional
    "ascend910c": 392e9,  # CloudMatrix384 UB: 392 GB/s unidirectional per NPU
}
_DEFAULT_LINK = 32e9  # PCIe 4.0 x16


def _native() -> Any:
    return native("PlacementCore", "the placement core")


@dataclass(frozen=True)
class DeviceModel:
    """One physical device's roofline and link, as the placement cost model sees it."""

    peak_flops: float
    bandwidth_bytes_per_s: float
    link_bytes_per_s: float = _DEFAULT_LINK
    can_overlap: bool = False  # the backend co-runs executions on the device
    launch_s: float = 0.0  # fixed cost per execution

    @classmethod
    def from_preset(
        cls,
        name: str,
        *,
        link_bytes_per_s: float | None = None,
        can_overlap: bool = False,
        launch_s: float | None = None,
    ) -> DeviceModel:
        """A model from an analysis preset (ascend910b, ascend910c, h100, h200, cpu)."""
        from flexnpu.analysis import get_device

        spec = get_device(name)
        if link_bytes_per_s is None and spec.name == "cpu":
            link_bytes_per_s = spec.mem_bandwidth
        if link_bytes_per_s is None:
            link_bytes_per_s = _PRESET_LINK.get(spec.name, _DEFAULT_LINK)
        return cls(
            peak_flops=spec.peak_flops,
            bandwidth_bytes_per_s=spec.mem_bandwidth,
            link_bytes_per_s=link_bytes_per_s,
            can_overlap=can_overlap,
            launch_s=spec.small_work_s if launch_s is None else launch_s,
        )


@dataclass(frozen=True)
class Profile:
    """What the core needs of an executable: its phase, FLOPs and bytes moved."""

    phase: str
    flops: float = 0.0
    bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r} (one of {', '.join(PHASES)})")

    @classmethod
    def from_analysis(cls, analysis: Any) -> Profile:
        """From `flexnpu.analyze(...)`: its phase, FLOPs and bytes on its device."""
        c = analysis.classification
        return cls(phase=c.phase, flops=c.flops, bytes=c.bytes)


@dataclass(frozen=True)
class Decision:
    physical_device: int
    reason: str
    predicted_start_ns: int
    predicted_finish_ns: int
    migrate_bytes: int
    ticket: int


@dataclass(frozen=True)
class PolicySpec:
    kind: str
    prefill_pool: tuple[int, ...] = ()
    decode_pool: tuple[int, ...] = ()
    text: str = field(default="", compare=False)


def parse_policy(spec: str, num_physical: int) -> PolicySpec:
    """Parse and validate a policy string; ValueError names what is wrong."""
    p = _native().parse_policy(spec, num_physical)
    return PolicySpec(p["kind"], tuple(p["prefill_pool"]), tuple(p["decode_pool"]), p["text"])


class Core:
    """The placement core over `devices` (DeviceModels, or a count of `preset` devices).

    Tuning keywords (see placement.h `Tuning`): hysteresis_frac, hysteresis_ns, min_dwell_ns,
    quiet_ns, return_max_steps, tpot_weight, decode_active_ns, move_weight, move_gain,
    prefill_role_ns,
    tpot_slo_ns, stall_bank_steps, max_executables, ewma_alpha, device_alpha,
    error_quarantine_ns.
    """

    def __init__(
        self,
        policy: str = "passthrough",
        devices: Sequence[DeviceModel] | int = 4,
        *,
        preset: str = "cpu",
        num_virtual_devices: int = 0,
        **tuning: float,
    ) -> None:
        if isinstance(devices, int):
            devices = [DeviceModel.from_preset(preset)] * devices
        self._core = _native().PlacementCore(
            policy, [asdict(d) for d in devices], num_virtual_devices, dict(tuning)
        )

    @property
    def policy(self) -> str:
        return self._core.policy

    @property
    def num_physical(self) -> int:
        return self._core.num_physical

    @property
    def num_virtual(self) -> int:
        return self._core.num_virtual

    def set_policy(self, spec: str) -> None:
        """Switch policy at run time; outstanding tickets stay valid. ValueError if bad."""
        self._core.set_policy(spec)

    def place(
        self,
        virtual_device: int,
        profile: Profile,
        *,
        now_ns: int,
        inputs: Iterable[tuple[int, int]] = (),
        executable_id: int = 0,
        weight: float = 0.0,
    ) -> Decision:
        """Choose the physical device; `inputs` are (physical_device or ANYWHERE, bytes);
        `weight`: sequences the execution serves (0: 1, see placement.h Request::weight)."""
        r = self._core.place(
            virtual_device,
            executable_id,
            profile.phase,
            float(profile.flops),
            float(profile.bytes),
            [(int(d), int(b)) for d, b in inputs],
            int(now_ns),
            float(weight),
        )
        return Decision(*r)

    def on_start(self, ticket: int, now_ns: int) -> None:
        self._core.on_start(ticket, now_ns)

    def on_finish(self, ticket: int, now_ns: int, ok: bool = True) -> None:
        """Completion (ok=False: an error, counted against the device). KeyError if unknown."""
        self._core.on_finish(ticket, now_ns, ok)

    def cancel(self, ticket: int) -> None:
        self._core.cancel(ticket)

    def forget_executable(self, executable_id: int) -> None:
        """Drop an unloaded executable's learnt correction. KeyError if it has none."""
        self._core.forget_executable(executable_id)

    def stats(self, now_ns: int) -> dict[str, Any]:
        """Observability counters per physical and virtual device (see Stats in placement.h)."""
        return json.loads(self._core.snapshot_json(now_ns))

    def bench(self, calls: int, **kwargs: int) -> dict[str, Any]:
        """Decision latency measured in C++ (see bench/placer_latency.py)."""
        return self._core.bench(calls, **kwargs)


class SplitAdvisor:
    """Which units of a prefill/decode deployment take new prompts now, which decode and which
    do both (the C++ advisor in pjrt_flexnpu/placement/split.h; see there for the rule). The
    serving layer reports each prompt (`on_prompt`) and, when `due`, the decode sequences it
    holds and the prompt tokens queued on its prefill instances (`update`); units
    [0, prefill_units) take prompts, the next `mixed_units` both prompts and handoffs
    (co-located), the rest handoffs. `backlog_drain_ns`: the queued prompt tokens count in the
    prefill need, drained over this; `hold_ns`: hysteresis, a reversal of the last change
    waits this long (both 0: neither fix); `colocate_at_capacity`: every unit co-located while
    the two needs fill the cluster. ValueError names a bad value; a rejected call keeps the
    state."""

    def __init__(
        self,
        units: int,
        prefill_tokens_per_s: float,
        decode_sequences_per_unit: float,
        *,
        target_utilization: float = 0.75,
        average_ns: int = 2_000_000_000,
        tick_ns: int = 1_000_000_000,
        initial_prefill_units: int = 0,
        backlog_drain_ns: int = 2_000_000_000,
        hold_ns: int = 2_000_000_000,
        deadband_units: int = 1,
        colocate_at_capacity: bool = False,
    ) -> None:
        self._advisor = native("SplitAdvisor", "the placement core").SplitAdvisor(
            int(units),
            float(prefill_tokens_per_s),
            float(decode_sequences_per_unit),
            float(target_utilization),
            int(average_ns),
            int(tick_ns),
            int(initial_prefill_units),
            int(backlog_drain_ns),
            int(hold_ns),
            int(deadband_units),
            bool(colocate_at_capacity),
        )
        # The bound methods: the simulator calls them per arrival.
        self.on_prompt: Callable[[int], None] = self._advisor.on_prompt  # (tokens)
        self.due: Callable[[int], bool] = self._advisor.due  # (now_ns)
        # (now_ns, decode_sequences, queued_prompt_tokens=0) -> whether prefill_units changed
        self.update: Callable[..., bool] = self._advisor.update

    @property
    def prefill_units(self) -> int:
        return self._advisor.prefill_units

    @property
    def mixed_units(self) -> int:
        """0, or every unit while co-located."""
        return self._advisor.mixed_units

    @property
    def proposal(self) -> int:
        """The last decision's rule output (prefill units; 0: co-locate), before the hysteresis
        held it back or not."""
        return self._advisor.proposal

    @property
    def units(self) -> int:
        return self._advisor.units

    @property
    def prompt_tokens_per_s(self) -> float:
        return self._advisor.prompt_tokens_per_s

    @property
    def decisions(self) -> int:
        return self._advisor.decisions

    @property
    def changes(self) -> int:
        return self._advisor.changes
