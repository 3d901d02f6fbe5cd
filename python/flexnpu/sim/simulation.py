"""The discrete-event cluster simulation: serving instances (flexnpu.serving.scheduler), physical
device units, the placement core (flexnpu.placement.Core) and KV transfers over links.

Events are batch steps, arrivals and KV handoffs (a heap of (time, order, kind, ...)); tokens are
never events. Each instance has at most one step in flight: schedule() -> the step's FLOPs and
bytes from the HLO-derived cost model -> Core.place() on the simulated clock -> the unit runs it
(FIFO: after what is queued there; co-run: the roofline share of the placer's own co-run model)
-> on_finish / on_step_done at its end. The placer learns from the simulated durations exactly as
it learns from PJRT events in production.

Hosts (flexnpu.serving.topology): the units lie on hosts; KV between units of one host takes the
intra-host link, KV between hosts the inter-host one (each unit has a port of each, with its own
busy-until clock; one port when the two are the same link). A placer places over its own host's
devices, as the plugin does in production: one placement core per host (a unit spanning whole
hosts is a core of its own), each step of an instance placed by its host's core onto that host's
units. Routing and the split advisor (the cluster layer) stay cluster-wide. Without a topology:
one host holding every device.

Layouts (what each policy name means here):
    passthrough       one MIXED instance per unit, whole-prompt prefill, a step is all prefill
                      or all decode (vLLM v0-style monolithic continuous batching); core
                      passthrough
    chunked-colocate  one MIXED instance per unit, chunked prefill in mixed batches
                      (Sarathi-Serve); core passthrough
    static-pd         n_p PREFILL + (P - n_p) DECODE instances, one per unit, KV handed over the
                      link; core static-pd with those pools; n_p tuned by search
    static-colocate   the engine's PD layout on 2P virtual devices: every unit hosts one PREFILL
                      and one DECODE instance, both phases share it FIFO; core static-colocate
    dynamic           FlexNPU: the same virtual PD layout (or the static-pd one, see
                      --dynamic-layout), every step placed onto any unit by the core's dynamic
                      policy; a decode step that moves takes its instance's KV with it
    elastic-pd        static-colocate's virtual layout with the split advisor's routing
                      (sim/adaptive.py): whole units change role, an instance leaving its role
                      drains; every step on its home unit (core passthrough). NVIDIA Dynamo's
                      planner, which scales prefill and decode workers, without per-step lending
    adaptive          elastic-pd's routing with dynamic's placer (= dynamic with
                      --dynamic-layout adaptive)
"""

from __future__ import annotations

import gc
import heapq
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexnpu import placement as fp
from flexnpu.serving.cluster import Cluster, ClusterInstance, SplitSettings, unit_roles
from flexnpu.serving.scheduler import (
    QueueFullError,
    RequestTooLongError,
    Role,
    Scheduler,
    SchedulerConfig,
    Sequence,
)
from flexnpu.serving.topology import Topology
from flexnpu.sim.hardware import LINKS, Link, Preset, StepTimer, topology_link
from flexnpu.sim.models import ModelShape
from flexnpu.sim.workload import Workload

POLICIES = (
    "passthrough",
    "static-pd",
    "static-colocate",
    "chunked-colocate",
    "dynamic",
    "elastic-pd",
    "adaptive",
)
# Policies whose routers follow the split advisor (sim/adaptive.py's AdaptiveSimulation), over
# the colocated virtual layout, with this core policy: elastic-pd re-splits whole units and
# runs every step on its home unit (passthrough); adaptive lets the dynamic placer lend units.
ADVISED_CORE_POLICY = {"elastic-pd": "passthrough", "adaptive": "dynamic"}
# The core's Tuning when the engine passes request weights (sequences per step, prompts queued
# behind a prefill): tpot_weight converts a decode sequence's delay into TTFT-equivalent time.
# A decode delay of t spreads over the sequence's hundreds of output tokens (its TPOT grows by
# t / output length) while a prefill delay lands whole on TTFT, so it is well below 1. 0.25 is
# from a sweep (1, 0.5, 0.25, 0.1) on DeepSeek-R1 / 96 x 910C ShareGPT and phase-shift: it
# ties static-pd on ShareGPT and keeps most of the phase-shift gain.
WEIGHTED_CORE_TUNING = {"tpot_weight": 0.25}
_ARRIVAL, _START, _DONE, _KV = 0, 1, 2, 3
_PREFILL_ROLE = Role.PREFILL  # a global: an Enum member read via its class is slow on 3.11
# The phase's bits of a step's executable id (see _dispatch)
_PREFILL_EXE, _DECODE_EXE = fp.PHASE_CODE["prefill"] << 32, fp.PHASE_CODE["decode"] << 32


@dataclass
class InstanceConfig:
    """Scheduler knobs of the simulated instances (SchedulerConfig of flexnpu.serving)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    max_model_len: int
    max_waiting: int = 100_000
    prefill_max_num_seqs: int = 64
    # Steps a PREFILL instance keeps in flight (JAX dispatches asynchronously: the engine's
    # prefill loop issues the next prompts before the last ones finished; the placer may run
    # them on different units). Decode and mixed instances run one step at a time.
    prefill_inflight: int = 1


@dataclass
class Layout:
    """Virtual instances and the core's view of the physical units."""

    roles: list[Role]  # per instance (= per virtual device)
    core_policy: str
    chunked: bool
    mixed: bool
    num_prefill: int = 0  # static-pd / dynamic-disaggregated


def make_layout(policy: str, units: int, num_prefill: int, dynamic_layout: str) -> Layout:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    if policy == "passthrough":
        return Layout(unit_roles("colocated", units), "passthrough", chunked=False, mixed=False)
    if policy == "chunked-colocate":
        return Layout(unit_roles("colocated", units), "passthrough", chunked=True, mixed=True)
    pd_split = policy == "static-pd" or (policy == "dynamic" and dynamic_layout == "disaggregated")
    if pd_split:
        if units < 2:
            raise ValueError(f"{policy} needs at least 2 units (devices / parallel), got {units}")
        if not 1 <= num_prefill < units:
            raise ValueError(f"prefill units must be in [1, {units - 1}], got {num_prefill}")
        roles = unit_roles("split", units, num_prefill)
        core = (
            f"static-pd:prefill=0-{num_prefill - 1};decode={num_prefill}-{units - 1}"
            if policy == "static-pd"
            else "dynamic"
        )
        return Layout(roles, core, chunked=False, mixed=False, num_prefill=num_prefill)
    # Home of virtual v: v mod units.
    advised = policy in ADVISED_CORE_POLICY or dynamic_layout == "adaptive"
    roles = unit_roles("adaptive" if advised else "static-colocate", units)
    core = ADVISED_CORE_POLICY.get(policy, policy)
    return Layout(roles, core, chunked=False, mixed=False, num_prefill=units)


class Request:
    """One request of the workload and what happened to it (times in simulated seconds)."""

    __slots__ = ("rid", "arrival", "prompt", "output", "first_token", "finish", "n_out", "dropped")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.first_token = -1.0
        self.finish = -1.0
        self.n_out = 0
        self.dropped = ""


class Instance(ClusterInstance):
    """A serving instance on a virtual device (the cluster layer's view plus where its KV is
    and its steps in flight)."""

    __slots__ = ("kv_unit", "inflight", "max_inflight", "steps")

    def __init__(
        self, idx: int, sched: Scheduler, role: Role, kv_unit: int, max_inflight: int
    ) -> None:
        super().__init__(idx, kv_unit, role, sched)
        self.kv_unit = kv_unit  # where its KV pool lives now (home at first)
        self.inflight = 0  # steps dispatched, not finished
        self.max_inflight = max_inflight
        self.steps = 0


def _core_calls(
    core: Any,
) -> tuple[Callable[..., tuple], Callable[[int, int], None], Callable[[int, int], None]]:
    """place(virtual, executable_id, phase, flops, bytes, inputs, now_ns, weight) -> the
    decision's fields, on_start and on_finish of `core`. For a flexnpu.placement.Core these
    are the bindings its methods call (same call, same decision) without the Profile and
    Decision objects of every call (the simulator places every step), for HostCores its
    cores' bindings; any other core (a test's wrapper) is called through its Python
    methods."""
    if type(core) is fp.Core:
        native = core._core
        return native.place, native.on_start, native.on_finish  # on_finish's ok: True
    if type(core) is HostCores:
        return core.native_calls()

    def place(
        v: int,
        exe: int,
        phase: str,
        flops: float,
        nbytes: float,
        inputs: list[tuple[int, int]],
        now_ns: int,
        weight: float,
    ) -> tuple:
        d = core.place(
            v,
            fp.Profile(phase, flops, nbytes),
            now_ns=now_ns,
            inputs=inputs,
            executable_id=exe,
            weight=weight,
        )
        return (
            d.physical_device,
            d.reason,
            d.predicted_start_ns,
            d.predicted_finish_ns,
            d.migrate_bytes,
            d.ticket,
        )

    return place, core.on_start, core.on_finish


class HostCores:
    """One placement core per host (`domains`: each host's units, in unit order), with a
    core's calls over all of them: instance `v`'s steps go to the core of its home unit's host
    as that core's virtual device `local[v]`, and the unit it picks comes back as the global
    one. A ticket carries its core: local ticket * number of cores + core."""

    def __init__(
        self,
        policies: list[str],
        unit_model: fp.DeviceModel,
        domains: list[list[int]],
        virtual_per_unit: int,
        home: list[int],
        **tuning: float,
    ) -> None:
        units = sum(len(d) for d in domains)
        self.bases = [d[0] for d in domains]
        domain_of = [0] * units
        for k, d in enumerate(domains):
            for u in d:
                domain_of[u] = k
        self.domain_of = domain_of
        self.cores = [
            fp.Core(
                policy,
                [unit_model] * len(d),
                num_virtual_devices=virtual_per_unit * len(d),
                **tuning,
            )
            for policy, d in zip(policies, domains, strict=True)
        ]
        # Instance v (virtual device v of the cluster, home unit home[v] = v mod units, layer
        # v // units): virtual layer * n + (home - base) of its host's core of n units, whose
        # home there (that mod n) is the same unit.
        self.inst_domain = [domain_of[h] for h in home]
        self.inst_local = [
            (v // units) * len(domains[domain_of[h]]) + h - self.bases[domain_of[h]]
            for v, h in enumerate(home)
        ]

    def native_calls(
        self,
    ) -> tuple[Callable[..., tuple], Callable[[int, int], None], Callable[[int, int], None]]:
        """_core_calls' (place, on_start, on_finish) over the hosts' cores."""
        places = [c._core.place for c in self.cores]
        starts = [c._core.on_start for c in self.cores]
        finishes = [c._core.on_finish for c in self.cores]
        n = len(self.cores)
        inst_domain, inst_local, bases = self.inst_domain, self.inst_local, self.bases

        def place(
            v: int,
            exe: int,
            phase: str,
            flops: float,
            nbytes: float,
            inputs: list[tuple[int, int]],
            now_ns: int,
            weight: float,
        ) -> tuple:
            k = inst_domain[v]
            base = bases[k]
            if inputs:
                inputs = [(u - base, b) for u, b in inputs]
            u, reason, start, finish, migrate, ticket = places[k](
                inst_local[v], exe, phase, flops, nbytes, inputs, now_ns, weight
            )
            return u + base, reason, start, finish, migrate, ticket * n + k

        def on_start(ticket: int, now_ns: int) -> None:
            starts[ticket % n](ticket // n, now_ns)

        def on_finish(ticket: int, now_ns: int) -> None:
            finishes[ticket % n](ticket // n, now_ns)

        return place, on_start, on_finish

    def stats(self, now_ns: int) -> dict[str, Any]:
        """The cores' counters: decisions summed, physical devices in unit order, and each
        host's own (`hosts`)."""
        each = [c.stats(now_ns) for c in self.cores]
        return {
            "decisions_total": sum(int(s["decisions_total"]) for s in each),
            "physical": [d for s in each for d in s["physical"]],
            "hosts": each,
        }


def host_policies(core_policy: str, domains: list[list[int]], num_prefill: int) -> list[str]:
    """Each host's core policy: the layout's, with static-pd's pools cut to the host's units
    (global units below num_prefill prefill). A host with units of one role only runs
    static-colocate: prefills to the earliest finish over its units, decodes stay with their
    KV (static-pd's placements within a pool; its decisions then read least_loaded and
    affinity instead of pool)."""
    if not core_policy.startswith("static-pd"):
        return [core_policy] * len(domains)
    out = []
    for d in domains:
        pre = [u - d[0] for u in d if u < num_prefill]
        dec = [u - d[0] for u in d if u >= num_prefill]
        if pre and dec:
            out.append(
                "static-pd:prefill="
                + ",".join(map(str, pre))
                + ";decode="
                + ",".join(map(str, dec))
            )
        else:
            out.append("static-colocate")
    return out


@dataclass
class RunResult:
    policy: str
    layout: str
    requests: list[Request]
    decisions_by_reason: dict[str, int]
    core_decisions: int
    kv_bytes_moved: int
    kv_bytes_handoff: int
    kv_bytes_migrated: int
    busy_s: list[float]
    makespan_s: float
    events: int
    steps: int
    placements: int
    timeline: list[tuple[int, float, float, str]] = field(default_factory=list)
    preemptions: int = 0
    tokens_in_window: int = 0  # tokens sampled by steps that ended within [0, window_s]
    window_s: float = 0.0
    kv_bytes_inter_host: int = 0  # of kv_bytes_moved, what crossed hosts


class Simulation:
    """One policy, one workload, one seed. `scheduler_class`: the instances' scheduler (None:
    flexnpu.serving's Scheduler; a bench passes a variant of it to compare code paths)."""

    advised = False  # routes by the split advisor (AdaptiveSimulation)

    def __init__(
        self,
        *,
        model: ModelShape,
        preset: Preset,
        devices: int,
        parallel: int,
        policy: str,
        instance: InstanceConfig,
        num_prefill: int = 0,
        dynamic_layout: str = "colocated",
        link: Link | None = None,
        co_run: bool = False,
        drain_s: float = 600.0,
        timeline_window: tuple[float, float] | None = None,
        core_tuning: dict[str, float] | None = None,
        request_weights: bool = True,
        scheduler_class: type[Scheduler] | None = None,
        keep_cluster_log: bool = False,
        topology: Topology | None = None,
    ) -> None:
        if devices < 1 or parallel < 1 or devices % parallel:
            raise ValueError(
                f"--devices {devices} must be a positive multiple of --parallel {parallel}"
            )
        if policy in ADVISED_CORE_POLICY and not self.advised:
            raise ValueError(
                f"policy {policy!r} routes by the split advisor: run it with "
                "flexnpu.sim.adaptive.AdaptiveSimulation"
            )
        self.model, self.preset, self.policy = model, preset, policy
        self.keep_cluster_log = keep_cluster_log
        self.units = devices // parallel
        self.timer = StepTimer.create(model, preset, parallel, instance)
        # The intra-host link: the topology's, else `link`, else the preset's.
        self.link = link or LINKS[preset.link]
        topo = topology or Topology.single_host(devices)
        if topo.devices != devices:
            raise ValueError(
                f"the topology has {topo.devices} devices, the simulation {devices} (--devices)"
            )
        if topo.intra_host_link is not None:
            self.link = topology_link(topo.intra_host_link, "intra_host_link")
        self.topology = topo
        self.domains = topo.placement_domains(parallel)
        # Each unit's host (its placement domain: a host, or the hosts a unit spans).
        self.unit_host = [0] * self.units
        for k, d in enumerate(self.domains):
            for u in d:
                self.unit_host[u] = k
        self.multi_host = len(self.domains) > 1
        self.inter_link = (
            topology_link(topo.inter_host_link, "inter_host_link") if self.multi_host else None
        )
        self.co_run = co_run
        self.drain_s = drain_s
        self.window = timeline_window
        self.layout = make_layout(
            policy, self.units, num_prefill, "adaptive" if self.advised else dynamic_layout
        )
        self.kv_per_token = model.kv_bytes_per_token
        roles = self.layout.roles
        v = len(roles)
        unit_model = fp.DeviceModel(
            peak_flops=self.timer.peak,
            bandwidth_bytes_per_s=self.timer.bandwidth,
            link_bytes_per_s=self.link.bytes_per_s * parallel,
            can_overlap=co_run,
            launch_s=self.timer.launch_s,
        )
        self.request_weights = request_weights
        tuning = {**(WEIGHTED_CORE_TUNING if request_weights else {}), **(core_tuning or {})}
        if self.multi_host:
            self.core: Any = HostCores(
                host_policies(self.layout.core_policy, self.domains, self.layout.num_prefill),
                unit_model,
                self.domains,
                v // self.units,
                [i % self.units for i in range(v)],
                **tuning,
            )
        else:
            self.core = fp.Core(
                self.layout.core_policy, [unit_model] * self.units, num_virtual_devices=v, **tuning
            )
        self.link_bw = self.link.bytes_per_s * parallel
        self.inter_bw = self.inter_link.bytes_per_s * parallel if self.inter_link else 0.0
        depth = preset.runtime.inflight  # the preset's serving runtime (0: as below)
        make_scheduler = scheduler_class or Scheduler
        self.instances = [
            Instance(
                i,
                make_scheduler(self._sched_config(r, instance, roles)),
                r,
                i % self.units,
                depth or (instance.prefill_inflight if r is Role.PREFILL else 1),
            )
            for i, r in enumerate(roles)
        ]
        # The instances that take prompts, and those that take prefilled sequences (a layout
        # with prefill instances: the others).
        self.front = [x for x in self.instances if x.role is not Role.DECODE]
        has_prefill = any(r is Role.PREFILL for r in roles)
        self.back = [x for x in self.instances if has_prefill and x.role is not Role.PREFILL]

    # ---- configuration ---------------------------------------------------------------------

    def _sched_config(self, role: Role, ic: InstanceConfig, roles: list[Role]) -> SchedulerConfig:
        """KV pool from the unit's memory: weights replicated per unit; a unit that hosts a
        prefill and a decode instance gives the prefill one a pool for its batch only."""
        mem = self.preset.memory_bytes * self.timer.parallel
        free = mem * 0.9 - self.model.weight_bytes
        if free <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB of weights) does not "
                f"fit {self.timer.parallel} x {self.preset.name} "
                f"({mem / 1e9:.0f} GB); raise --parallel"
            )
        block_bytes = ic.block_size * self.kv_per_token
        max_useful = math.ceil(ic.max_num_seqs * ic.max_model_len / ic.block_size)
        shares_unit = len(roles) > self.units
        prefill_pool = math.ceil(
            2 * max(ic.max_model_len, ic.max_num_batched_tokens) / ic.block_size
        )
        if role is Role.PREFILL:
            blocks = prefill_pool
        else:
            avail = free - (prefill_pool * block_bytes if shares_unit else 0)
            blocks = min(max_useful, int(avail // block_bytes))
        if blocks < 1:
            raise ValueError(f"no memory left for the KV cache on a {self.preset.name} unit")
        prefill = role is Role.PREFILL
        if self.preset.runtime.padded_programs:
            # FlexNPU's engine: every instance, whatever its role, has the same scheduler
            # (serving.engine: chunked prefill at the token budget, mixed batches, the
            # max_num_seqs batch, a pool of max_num_seqs full-length sequences), so a prefill
            # instance of the split layout prefills long prompts in chunks, one per step.
            return SchedulerConfig(
                max_num_seqs=ic.max_num_seqs,
                max_num_batched_tokens=ic.max_num_batched_tokens,
                block_size=ic.block_size,
                num_blocks=ic.max_num_seqs * math.ceil(ic.max_model_len / ic.block_size),
                max_model_len=ic.max_model_len,
                max_waiting=ic.max_waiting,
                max_prefill_seqs=self.preset.runtime.max_prefill_seqs,
                role=role,
            )
        # A decode instance, or the adaptive layout's back instance.
        back = role is Role.DECODE or (shares_unit and role is Role.MIXED)
        return SchedulerConfig(
            max_num_seqs=ic.prefill_max_num_seqs if prefill else ic.max_num_seqs,
            max_num_batched_tokens=ic.max_num_batched_tokens,
            block_size=ic.block_size,
            num_blocks=blocks,
            max_model_len=ic.max_model_len,
            max_waiting=ic.max_waiting,
            # The adaptive layout's back instance (MIXED beside a prefill instance) prefills in
            # chunks beside its decodes while its unit is co-located.
            chunked_prefill=self.layout.chunked or (shares_unit and role is Role.MIXED),
            # A decode instance joins handed-off sequences to the running batch (continuous
            # batching); with mixed_batches=False the scheduler would give them steps of
            # their own and stall the running decodes.
            mixed_batches=self.layout.mixed or back,
            max_prefill_seqs=self.preset.runtime.max_prefill_seqs,
            role=role,
        )

    # ---- the event loop --------------------------------------------------------------------

    def run(self, wl: Workload) -> RunResult:
        # A run allocates millions of objects that live to its end (requests, sequences, KV
        # block lists) and builds no reference cycles: the cyclic collector would only rescan
        # them. Off for the run, as it was after.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run(wl)
        finally:
            if collecting:
                gc.enable()

    def _run(self, wl: Workload) -> RunResult:
        self._heap: list[tuple] = []
        self._order = 0
        units = self.units
        self._free_at = [0.0] * units  # FIFO: when the unit's queue drains
        self._hc = [0.0] * units  # co-run horizons (compute, memory)
        self._hm = [0.0] * units
        self._inflight = [0] * units
        self._busy = [0.0] * units
        self._busy_until = [0.0] * units
        self._link_free = [0.0] * units  # each unit's intra-host port
        # and its inter-host NIC; one port when both are the same network (a supernode's
        # hosts on the fabric within them)
        self._nic_free = self._link_free if self.inter_link == self.link else [0.0] * units
        self._reasons: Counter[str] = Counter()
        self._kv_handoff = self._kv_migrated = self._kv_inter_host = 0
        self._steps = self._placements = self._preempted = 0
        self._timeline: list[tuple[int, float, float, str]] = []
        self._window_end = wl.duration
        self._tokens_in_window = 0
        self.cluster = Cluster(
            self.instances, self.units, self._split_settings(), keep_log=self.keep_cluster_log
        )
        self._place, self._on_start, self._on_finish = _core_calls(self.core)
        reqs = [
            Request(i, t, p, o)
            for i, (t, p, o) in enumerate(
                zip(
                    np.asarray(wl.arrivals, dtype=float).tolist(),
                    np.asarray(wl.prompt_tokens, dtype=np.int64).tolist(),
                    np.asarray(wl.output_tokens, dtype=np.int64).tolist(),
                    strict=True,
                )
            )
        ]
        self._requests = reqs
        horizon = (reqs[-1].arrival if reqs else 0.0) + self.drain_s
        heap = self._heap
        n, i = len(reqs), 0
        now = 0.0
        events = 0
        pop = heapq.heappop
        on_done, on_kv, on_arrival = self._on_done, self._on_kv, self._on_arrival
        on_start = self._on_start
        next_arrival = reqs[0].arrival if n else math.inf
        while True:
            if heap and heap[0][0] <= next_arrival:
                ev = pop(heap)
                now = ev[0]
                if now > horizon:
                    break
                kind = ev[2]
                if kind == _DONE:
                    on_done(ev[3], ev[4], ev[5], ev[6], now)
                elif kind == _KV:
                    on_kv(ev[3], ev[4], now)
                else:
                    on_start(ev[3], int(now * 1e9))
            elif i < n:
                now = next_arrival
                on_arrival(reqs[i], now)
                i += 1
                next_arrival = reqs[i].arrival if i < n else math.inf
            else:
                break
            events += 1
        self._events = events
        end = max(now, max((r.finish for r in reqs), default=0.0))
        for r in reqs:
            if r.finish < 0 and not r.dropped:
                r.dropped = "unfinished"
        stats = self.core.stats(int(end * 1e9))
        core_reasons: Counter[str] = Counter()
        for d in stats["physical"]:
            core_reasons.update(d["decisions"])
        return RunResult(
            policy=self.policy,
            layout=self.layout.core_policy,
            requests=reqs,
            decisions_by_reason={k: int(core_reasons[k]) for k in fp.REASONS},
            core_decisions=int(stats["decisions_total"]),
            kv_bytes_moved=self._kv_handoff + self._kv_migrated,
            kv_bytes_handoff=self._kv_handoff,
            kv_bytes_migrated=self._kv_migrated,
            busy_s=list(self._busy),
            makespan_s=end,
            events=self._events,
            steps=self._steps,
            placements=self._placements,
            timeline=self._timeline,
            preemptions=self._preempted,
            tokens_in_window=self._tokens_in_window,
            window_s=wl.duration,
            kv_bytes_inter_host=self._kv_inter_host,
        )

    def _push(self, t: float, kind: int, *payload: Any) -> None:
        self._order += 1
        heapq.heappush(self._heap, (t, self._order, kind, *payload))

    def _split_settings(self) -> SplitSettings | None:
        """The split advisor of the cluster layer (AdaptiveSimulation's), or None."""
        return None

    def _on_arrival(self, req: Request, now: float) -> None:
        cluster = self.cluster
        if cluster.on_arrival(req.prompt, now):
            for x in self.instances:
                if x.draining and not x.inflight:
                    self._move_out(x, now)
        inst = cluster.route_arrival(req.rid)
        seq = Sequence(req.rid, req.prompt, req.output, now, payload=req)
        sched = inst.sched
        try:
            sched.add(seq)
        except QueueFullError:
            req.dropped = "queue_full"
            return
        except RequestTooLongError:
            req.dropped = "too_long"
            return
        if inst.inflight < inst.max_inflight:
            self._start_step(inst, now)  # has work: dispatches, which marks `inst` changed
        else:
            inst.changed.append(inst)

    def _on_kv(self, inst: Instance, seq: Sequence, now: float) -> None:
        try:
            inst.sched.add_prefilled(seq)
        except RequestTooLongError:
            seq.payload.dropped = "too_long"
            return
        if inst.inflight < inst.max_inflight:
            self._start_step(inst, now)  # has work: dispatches, which marks `inst` changed
        else:
            inst.changed.append(inst)

    def _start_step(self, inst: Instance, now: float) -> None:
        while inst.inflight < inst.max_inflight and inst.sched.has_work:
            if not self._dispatch(inst, now):
                return

    def _dispatch(self, inst: Instance, now: float) -> bool:
        """Schedules and places one step of `inst`; False if there was nothing to run."""
        sched = inst.sched
        plan = sched.schedule(now)
        inst.changed.append(inst)
        if plan.preempted:
            self._preempted += len(plan.preempted)
        if plan.is_empty:
            return False  # woken by the next add / handoff / finished step
        timer = self.timer
        # The plan's steady decodes come in aggregate (count, sum of starts): the step's cost
        # and everything below need no per-sequence work for them.
        if timer.shapes is not None:
            plan.scheduled  # noqa: B018 -- padded programs look at every entry
        bulk, bulk_starts = plan.bulk_decodes
        rest = plan.entries_after_bulk
        flops, nbytes = timer.step_cost(rest, bulk, bulk_starts)
        num_scheduled = bulk + len(rest)
        # The engine's program decides the phase (a step with prompt tokens is its prefill
        # program), not the roofline: on a 910C group a short DeepSeek prefill is bandwidth-
        # bound (it reads every touched expert) and would be classed "decode".
        if rest:
            last = rest[-1]
            is_decode = last.num_tokens == 1 and last.start >= last.seq.num_prompt_tokens
            num_tokens = bulk
            for e in rest:
                num_tokens += e.num_tokens
        else:
            is_decode = bulk > 0
            num_tokens = bulk
        kv_unit = inst.kv_unit
        if inst.role is not _PREFILL_ROLE:
            used = sched.config.num_blocks - sched.num_free_blocks
            kv_bytes = used * sched.config.block_size * self.kv_per_token
            inputs = [(kv_unit, int(kv_bytes))] if kv_bytes else []
        else:
            inputs = []
        now_ns = int(now * 1e9)
        phase = "decode" if is_decode else "prefill"
        exe = (
            (_DECODE_EXE if is_decode else _PREFILL_EXE)
            | max(1, num_scheduled).bit_length() << 8
            | min(255, num_tokens.bit_length())
        )
        # weight: the sequences whose latency this step's placement decides (the engine knows
        # them): its batch, and for a prefill also the prompts queued behind it, which wait as
        # long as it does. The core weighs them against the decode sequences it would delay.
        weight = (
            num_scheduled + (0 if is_decode else sched.num_waiting) if self.request_weights else 0
        )
        u, reason, _, _, migrate_bytes, ticket = self._place(
            inst.idx, exe, phase, float(flops), float(nbytes), inputs, now_ns, float(weight)
        )
        self._placements += 1
        self._reasons[reason] += 1
        ready = now
        if migrate_bytes:
            if self.multi_host and self.unit_host[kv_unit] != self.unit_host[u]:
                # (a host's core places on its own units: only a test's core gets here)
                ready += migrate_bytes / self.inter_bw + self.inter_link.latency_s
                self._kv_inter_host += migrate_bytes
            else:
                ready += migrate_bytes / self.link_bw + self.link.latency_s
            self._kv_migrated += migrate_bytes
        if self.co_run:
            start = ready
            k1 = self._inflight[u] + 1
            c = flops * timer.seconds_per_flop
            m = nbytes * timer.seconds_per_byte
            hc = max(0.0, self._hc[u] - start)
            hm = max(0.0, self._hm[u] - start)
            end = start + max(min(c * k1, hc + c), min(m * k1, hm + m)) + timer.launch_s
            self._hc[u] = max(self._hc[u], start) + c
            self._hm[u] = max(self._hm[u], start) + m
        else:
            free_at = self._free_at
            start = ready if ready > free_at[u] else free_at[u]
            end = start + timer.seconds(flops, nbytes)
            free_at[u] = end
        self._inflight[u] += 1
        busy_until = self._busy_until
        until = busy_until[u]
        # the busy time this step adds: max(0, end - max(start, until))
        added = end - (start if start > until else until)
        if added > 0.0:
            self._busy[u] += added
        if end > until:
            busy_until[u] = end
        inst.kv_unit = u
        inst.inflight += 1
        inst.steps += 1
        self._steps += 1
        order = self._order + 1
        heap = self._heap
        if start > now:
            heapq.heappush(heap, (start, order, _START, ticket))
            order += 1
        else:
            self._on_start(ticket, now_ns)
        self._order = order
        w = self.window
        if w is not None and start < w[1] and end > w[0]:
            self._timeline.append((u, start, end, phase))
        heapq.heappush(heap, (end, order, _DONE, inst, plan, ticket, u))
        return True

    def _on_done(self, inst: Instance, plan, ticket: int, unit: int, now: float) -> None:
        self._on_finish(ticket, int(now * 1e9))
        self._inflight[unit] -= 1
        inst.inflight -= 1
        sampled = plan.num_scheduled
        for e in reversed(plan.entries_after_bulk):  # decodes first, then prompt chunks
            if e.num_tokens == 1 and e.start >= e.seq.num_prompt_tokens:  # e.is_decode
                break
            if e.samples:
                req = e.seq.payload
                if req.first_token < 0:
                    req.first_token = now
            else:
                sampled -= 1
        if now <= self._window_end:
            self._tokens_in_window += sampled
        sched = inst.sched
        done = sched.on_step_done(plan, now)
        sched.release(plan)  # read no more: its decode lists go back uncopied
        for seq in done:
            if seq.finish_reason == "prefilled":
                self._handoff(inst, seq, now)
            else:
                req = seq.payload
                req.finish = now
                req.n_out = seq.num_output_tokens
        # _start_step(inst, now), inline; a dispatch marks `inst` changed (its router recomputes
        # its load key), so only a done step that dispatches nothing marks it here.
        if inst.draining and not inst.inflight:
            self._move_out(inst, now)
        if inst.inflight < inst.max_inflight and sched.has_work:
            while (
                self._dispatch(inst, now) and inst.inflight < inst.max_inflight and sched.has_work
            ):
                pass
        else:
            inst.changed.append(inst)

    def _move_out(self, inst: Instance, now: float) -> None:
        """A role change: `inst`'s decodes go to the decode side with their KV, its queued
        prompts back to the router (the cluster layer decides which and where)."""
        cluster = self.cluster
        for seq, blocks in cluster.take_moves(inst):
            if not cluster.is_handoff(seq, blocks):  # a queued prompt (or a preempted one)
                dst = cluster.route_arrival(seq.request_id)
                dst.sched.add(seq)
                if dst.inflight < dst.max_inflight:
                    self._start_step(dst, now)
                else:
                    dst.changed.append(dst)
            else:
                self._handoff(inst, seq, now)

    def _handoff(self, src: Instance, seq: Sequence, now: float) -> None:
        dst = self.cluster.route_handoff(seq.request_id)
        self._order += 1
        if src.kv_unit == dst.kv_unit:  # same unit (co-located): the KV stays in place
            heapq.heappush(self._heap, (now, self._order, _KV, dst, seq))
            return
        nbytes = seq.num_tokens * self.kv_per_token
        u = src.kv_unit
        if self.multi_host and self.unit_host[u] != self.unit_host[dst.kv_unit]:
            port, link, bw = self._nic_free, self.inter_link, self.inter_bw
            self._kv_inter_host += nbytes
        else:
            port, link, bw = self._link_free, self.link, self.link_bw
        link_free = port[u]
        start = now if now > link_free else link_free
        if self.preset.runtime.padded_programs and not self.co_run:
            # FlexNPU's engine extracts the KV with a program on the source device, queued
            # behind the step it already dispatched there (two in flight).
            start = max(start, self._free_at[u])
        link_free = port[u] = start + nbytes / bw
        self._kv_handoff += nbytes
        heapq.heappush(self._heap, (link_free + link.latency_s, self._order, _KV, dst, seq))


def percentiles(xs: np.ndarray) -> dict[str, float]:
    if len(xs) == 0:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    p = np.percentile(xs, [50, 90, 99])
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}
