"""The cluster layer: serving instances over physical units, which instance takes a new prompt
or a prefilled (or moved) sequence, and role changes by the split advisor.

One layer decides for the production engine (`serving.Engine`, from its threads under its lock)
and for the cluster simulator (`flexnpu.sim`, from its event loop): routing, handoff targets,
the adaptive split and which sequences move when a unit changes role. It is pure and
clock-injected (every call that needs time takes `now`, seconds, any epoch): no JAX, no threads.
The executors do the mechanics: run steps, copy KV, wake threads or push events.

Layouts, over `units` physical units (a unit: one device, or a tensor-parallel group):
- colocated: one MIXED instance per unit;
- split: the first `prefill` units PREFILL instances, the others DECODE instances;
- static-colocate: every unit hosts a PREFILL and a DECODE instance (instance i on unit
  i mod units), every prefill instance takes prompts and every decode instance prefilled
  sequences: the paper's static co-location (both phases share each device);
- adaptive: every unit hosts a PREFILL instance and a MIXED one (its back instance), and the
  split advisor (flexnpu.placement.SplitAdvisor, the C++ rule of placement/split.h) gives each
  unit a role: units [0, p) PREFILL (prompts go to their prefill instances), [p, p + m) MIXED
  (prompts and handoffs go to their back instances, which prefill in chunks beside their
  decodes: co-location), the rest DECODE (handoffs go to their back instances). Prefilled
  sequences go to the back instances of the MIXED and DECODE units. When a unit turns PREFILL
  its back instance's running decodes move, KV and all, to the others (`take_moves`) and its
  queued prompts go back to the router; when it stops taking prompts, the queued prompts of the
  instance that took them go back to the router; when units join the decode side, the
  handoffs queued at the others for a batch slot are routed again (their KV moves with them);
  what cannot move (a prompt half computed, a sequence mid-handoff) drains where it is.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from typing import Any

from flexnpu.serving.scheduler import Role, Scheduler, Sequence, least_loaded

LAYOUTS = ("colocated", "split", "static-colocate", "adaptive")

# The advisor's defaults (placement/split.h explains each): prefill units sized for 75% load,
# prompt rate averaged over 2 s, one decision per second, a backlog drained over 2 s, a
# reversal of the last change held for 2 s.
SPLIT_TARGET_UTILIZATION = 0.75
SPLIT_AVERAGE_S = 2.0
SPLIT_TICK_S = 1.0
SPLIT_BACKLOG_DRAIN_S = 2.0
SPLIT_HOLD_S = 2.0
# A decode unit counts as full at 3/4 of its batch cap (max_num_seqs): sized at the cap, the
# advisor leaves prompt-heavy overload with too few decode units; at 1/2 it starves prefill
# (chosen on the phase-shift workload over 384 x 910C, `python -m bench.paper`).
SPLIT_DECODE_BATCH_FRACTION = 0.75


class ClusterInstance:
    """A serving instance as the cluster layer sees it: its index, unit, role and scheduler.
    The engine's and the simulator's instances extend it with their mechanics."""

    __slots__ = ("idx", "unit", "role", "sched", "pos", "changed", "draining", "down")

    def __init__(self, idx: int, unit: int, role: Role, sched: Scheduler) -> None:
        self.idx = idx
        self.unit = unit  # its home unit
        self.role = role
        self.sched = sched
        self.pos = 0  # index in its router
        # Its router's list of instances whose scheduler changed since it last routed.
        self.changed: list[ClusterInstance] = []
        # Outside its side of the split: takes nothing new, gives up what can move.
        self.draining = False
        # Out of service (the engine's instance failed; the simulator's never do): routers pass
        # it over.
        self.down = False


class NoLiveInstanceError(RuntimeError):
    """Every instance a router could pick is out of service."""


def unit_roles(layout: str, units: int, prefill_units: int = 0) -> list[Role]:
    """The role of each instance of `layout` (instance i on unit i mod units)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if units < 1:
        raise ValueError(f"a cluster needs at least one unit, got {units}")
    if layout == "colocated":
        return [Role.MIXED] * units
    if units < 2 and layout != "static-colocate":
        raise ValueError(f"the {layout} layout needs at least 2 units, got {units}")
    if layout == "split":
        if not 1 <= prefill_units < units:
            raise ValueError(f"prefill units must be in [1, {units - 1}], got {prefill_units}")
        return [Role.PREFILL] * prefill_units + [Role.DECODE] * (units - prefill_units)
    back = Role.MIXED if layout == "adaptive" else Role.DECODE
    return [Role.PREFILL] * units + [back] * units


class Router:
    """least_loaded (flexnpu.serving.scheduler) over a list of instances. Incremental (the
    simulator, single-threaded): each instance's (key, index) is recomputed only after its
    scheduler changed, which its owner records by appending it to `changed`; the least (key,
    index) comes from a heap with lazy deletion (every current key is in it; an entry that is
    no longer its instance's key is dropped when it reaches the top), so the pick is
    least_loaded's, ties included. Not incremental (the engine, whose schedulers change on
    other threads): every pick reads every key."""

    __slots__ = ("insts", "keys", "changed", "heap", "limit", "incremental")

    def __init__(self, insts: list[ClusterInstance], incremental: bool = True) -> None:
        self.insts = insts
        self.incremental = incremental
        self.changed: list[ClusterInstance] = []
        if incremental:
            for i, x in enumerate(insts):
                x.pos, x.changed = i, self.changed
        self.keys = [(x.sched.load_key(), i) for i, x in enumerate(insts)]
        self.heap = sorted(self.keys)
        # Stale entries above the top are dropped only by a rebuild, past this size.
        self.limit = 4 * len(insts) + 16

    def pick(self) -> ClusterInstance:
        insts = self.insts
        if not self.incremental:  # (the engine's: its instances may be out of service)
            live = [x for x in insts if not x.down]
            if not live:
                raise NoLiveInstanceError(
                    f"all {len(insts)} instances that could take this are out of service")
            return live[0] if len(live) == 1 else live[least_loaded([x.sched for x in live])]
        if len(insts) == 1:
            return insts[0]
        keys, changed, heap = self.keys, self.changed, self.heap
        if changed:
            push = heapq.heappush
            for x in changed:
                pos = x.pos
                k = (x.sched.load_key(), pos)
                if k != keys[pos]:
                    keys[pos] = k
                    push(heap, k)
            changed.clear()
            if len(heap) > self.limit:
                heap[:] = keys
                heapq.heapify(heap)
        # Current entries are the very tuples in `keys` (a stale one equal in value to its
        # current key is dropped as well: the same instance is found either way).
        top = heap[0]
        while top is not keys[top[1]]:
            heapq.heappop(heap)
            top = heap[0]
        return insts[top[1]]


@dataclass(frozen=True)
class SplitSettings:
    """The advisor of the adaptive layout. `prefill_tokens_per_s`: one unit's prefill
    throughput at a full batch (the engine measures it at warm-up; the simulator has it from
    its step-time model, which stands for the same measurement)."""

    prefill_tokens_per_s: float
    decode_batch: int  # max_num_seqs of a decode instance
    initial_prefill_units: int = 0  # 0: half
    target_utilization: float = SPLIT_TARGET_UTILIZATION
    average_s: float = SPLIT_AVERAGE_S
    tick_s: float = SPLIT_TICK_S
    backlog_drain_s: float = SPLIT_BACKLOG_DRAIN_S
    hold_s: float = SPLIT_HOLD_S
    # Every unit co-located (MIXED) while the prefill and decode needs fill the cluster,
    # unless a prompt chunk of chunk_tokens alone takes longer than tpot_target_s (device
    # seconds; either 0: not checked).
    colocate_at_capacity: bool = False
    chunk_tokens: int = 0
    tpot_target_s: float = 0.0
    # Wall seconds per device second: emulated devices run time_scale x slower than the
    # accelerator they model, and the advisor's periods (above, in device seconds) stretch
    # with them, so that it decides as it would on that accelerator.
    time_scale: float = 1.0


@dataclass
class ClusterDecisions:
    """What the layer decided, in order (the engine keeps it on request; the simulator's and
    the engine's logs are compared by the tests): ("arrival", request id, instance),
    ("handoff", request id, instance), ("split", (prefill units, mixed units), time)."""

    log: list[tuple[str, Any, int | float]] = field(default_factory=list)


class Cluster:
    """Routing and role changes over `instances` (ClusterInstance, in layout order). The
    caller serialises calls. `split`: the adaptive layout's advisor, as SplitSettings (the
    placement core's SplitAdvisor) or any object with its calls (on_prompt, due, update,
    prefill_units, and mixed_units if it co-locates: e.g. a test's script); its instances
    must be unit_roles("adaptive", units). None: the split is the layout's."""

    def __init__(
        self,
        instances: SequenceOf[ClusterInstance],
        units: int,
        split: SplitSettings | Any = None,
        *,
        incremental: bool = True,
        keep_log: bool = False,
    ) -> None:
        self.instances = list(instances)
        self.units = units
        self.incremental = incremental
        adaptive = split is not None
        # Instances that may take prompts, and that may take prefilled sequences (the
        # adaptive layout's MIXED back instances do both, as their unit's role says).
        self.front = [x for x in self.instances if x.role is not Role.DECODE]
        self.back = [
            x
            for x in self.instances
            if x.role is Role.DECODE or (adaptive and x.role is Role.MIXED)
        ]
        if not self.front:
            raise ValueError("a cluster needs an instance that takes prompts")
        self.decisions = ClusterDecisions() if keep_log else None
        # (time, prefill units, mixed units)
        self.split_timeline: list[tuple[float, int, int]] = []
        self.moves = 0  # sequences moved by role changes
        self.advisor: Any = None
        self._outside: list[ClusterInstance] = []  # `changed` of instances no router takes
        # Instances whose queued handoffs go out once (units joined the decode side).
        self._rebalance: set[int] = set()
        if split is not None:
            roles = [x.role for x in self.instances]
            if units < 2 or roles != unit_roles("adaptive", units):
                raise ValueError("the split advisor needs the adaptive layout's instances")
            self.advisor = (
                _make_advisor(units, split) if isinstance(split, SplitSettings) else split
            )
            self._apply_split(None)
        else:
            self.front_router = Router(self.front, incremental)
            self.back_router = Router(self.back, incremental) if self.back else None

    # ---- routing -----------------------------------------------------------------------------

    def on_arrival(self, prompt_tokens: int, now: float) -> bool:
        """A prompt arrived: the advisor hears of it and, once a tick, decides; True if the
        split changed (the executor then gives `take_moves` a chance on every instance)."""
        adv = self.advisor
        if adv is None:
            return False
        adv.on_prompt(prompt_tokens)
        return self.on_tick(now)

    def on_tick(self, now: float) -> bool:
        """No arrival: the advisor decides if its tick is due (an executor whose arrivals may
        stop for seconds, e.g. a closed loop's burst queued at once, calls it between them);
        True if the split changed, as on_arrival."""
        adv = self.advisor
        if adv is None:
            return False
        self._outside.clear()  # no router reads it
        now_ns = int(now * 1e9)
        if not adv.due(now_ns):
            return False
        # Decode need: the sequences the back instances hold and the prompts being computed
        # (they decode next); the prompts still queued count as prefill backlog.
        held = queued = 0
        for x in self.instances:
            sched = x.sched
            queued += sched.waiting_tokens
            held += sched.num_running
            if x.role is not Role.PREFILL:
                held += sched.num_waiting
        if adv.update(now_ns, held, queued):
            self._apply_split(now)
            return True
        return False

    def route_arrival(self, request_id: Any = None) -> ClusterInstance:
        """The instance that takes a new prompt."""
        x = self.front_router.pick()
        if self.decisions is not None:
            self.decisions.log.append(("arrival", request_id, x.idx))
        return x

    def route_handoff(self, request_id: Any = None) -> ClusterInstance:
        """The decode instance that takes a prefilled (or moved) sequence."""
        if self.back_router is None:
            raise ValueError("this layout has no decode instances")
        x = self.back_router.pick()
        if self.decisions is not None:
            self.decisions.log.append(("handoff", request_id, x.idx))
        return x

    def can_serve(self) -> bool:
        """Whether a new prompt finds an instance in service, and so does its handoff (if
        this layout hands off)."""
        routers = (self.front_router, self.back_router)
        return all(r is None or any(not x.down for x in r.insts) for r in routers)

    @property
    def prefill_units(self) -> int:
        """Units taking only new prompts (the advisor's split; the layout's without one)."""
        if self.advisor is not None:
            return int(self.advisor.prefill_units)
        return len(self.front) if self.back else 0

    @property
    def mixed_units(self) -> int:
        """Units taking prompts and prefilled sequences (co-located)."""
        if self.advisor is not None:
            return int(getattr(self.advisor, "mixed_units", 0))
        return 0 if self.back else len(self.front)

    # ---- role changes ---------------------------------------------------------------------------

    def take_moves(self, inst: ClusterInstance) -> list[tuple[Sequence, list[int]]]:
        """What `inst` gives up after a role change, with the KV blocks each held: running
        sequences in steady decode, when it no longer takes prefilled sequences (each goes on
        at `route_handoff()`'s instance, KV copied); queued prompts nothing was computed for,
        when it no longer takes prompts (each goes to `route_arrival()`'s, no KV; a preempted
        one is computed again there); handoffs queued for a batch slot, when units joined the
        decode side (each goes to `route_handoff()`'s instance; its KV is the executor's, not
        in blocks yet). See `is_handoff`. Call it only between the instance's steps (none in
        flight); empty when it gives up nothing."""
        if not inst.draining:
            return []
        sched = inst.sched
        if inst.role is Role.PREFILL:
            taken = sched.take_out(decoding=False)
        elif inst.role is Role.DECODE or inst.unit < self.prefill_units:
            taken = sched.take_out(decoding=True)
            if inst.role is Role.MIXED:
                taken += sched.take_out(decoding=False)
        else:  # a back instance taking handoffs: once, its queued prompts if its unit
            # decodes only, and its queued handoffs if units joined the decode side
            p = self.prefill_units
            taken = [] if p <= inst.unit < p + self.mixed_units else sched.take_out(decoding=False)
            if inst.idx in self._rebalance:
                self._rebalance.discard(inst.idx)
                taken += sched.take_out(decoding=False, handoffs=True)
            inst.draining = False
        inst.changed.append(inst)
        self.moves += len(taken)
        return taken

    @staticmethod
    def is_handoff(seq: Sequence, blocks: list[int]) -> bool:
        """Whether a sequence `take_moves` gave up goes on at `route_handoff()`'s instance
        (a decode with its KV blocks, or a handoff still queued), else at
        `route_arrival()`'s (a queued prompt)."""
        return bool(blocks) or seq.needs_kv_insert

    def _apply_split(self, now: float | None) -> None:
        p, m, units = self.prefill_units, self.mixed_units, self.units
        if not (p >= 0 and m >= 0 and p + m <= units and p + m > 0 and p < units):
            raise ValueError(f"split advisor: {p} prefill and {m} mixed units of {units}")
        before = set() if now is None else {id(x) for x in self.back_router.insts}
        takes_prompts, takes_handoffs = [], []
        for x in self.instances:
            x.changed = self._outside
            if x.role is Role.PREFILL:
                prompts, handoffs = x.unit < p, False
            else:
                prompts, handoffs = p <= x.unit < p + m, x.unit >= p
            # Outside its old roles: gives up what it took that it takes no more.
            x.draining = (not prompts and x.role is not Role.DECODE) or not (
                handoffs or x.role is Role.PREFILL
            )
            if prompts:
                takes_prompts.append(x)
            if handoffs:
                takes_handoffs.append(x)
        # Units joined the decode side: the handoffs queued elsewhere for a batch slot go
        # through the router again (the least loaded of all: the new units first).
        if any(id(x) not in before for x in takes_handoffs):
            for x in takes_handoffs:
                if id(x) in before and x.sched.num_waiting:
                    x.draining = True
                    self._rebalance.add(x.idx)
        if takes_prompts == takes_handoffs:  # every unit co-located: one router
            self.front_router = self.back_router = Router(takes_prompts, self.incremental)
        else:
            # An instance in both routers could not tell both of its changes: neither is then
            # incremental (only a scripted advisor mixes co-located units with a split).
            both = {id(x) for x in takes_prompts} & {id(x) for x in takes_handoffs}
            incremental = self.incremental and not both
            self.front_router = Router(takes_prompts, incremental)
            self.back_router = Router(takes_handoffs, incremental)
        self._outside.clear()
        at = 0.0 if now is None else now
        self.split_timeline.append((at, p, m))
        if self.decisions is not None and now is not None:
            self.decisions.log.append(("split", (p, m), now))


def _make_advisor(units: int, s: SplitSettings) -> Any:
    from flexnpu import placement as fp

    if not s.prefill_tokens_per_s > 0 or not math.isfinite(s.prefill_tokens_per_s):
        raise ValueError(f"prefill_tokens_per_s must be > 0, got {s.prefill_tokens_per_s}")
    if not s.time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {s.time_scale}")
    ns = s.time_scale * 1e9
    return fp.SplitAdvisor(
        units,
        s.prefill_tokens_per_s,
        s.decode_batch * SPLIT_DECODE_BATCH_FRACTION,
        target_utilization=s.target_utilization,
        average_ns=round(s.average_s * ns),
        tick_ns=round(s.tick_s * ns),
        initial_prefill_units=s.initial_prefill_units,
        backlog_drain_ns=round(s.backlog_drain_s * ns),
        hold_ns=round(s.hold_s * ns),
        colocate_at_capacity=s.colocate_at_capacity,
        chunk_tokens=s.chunk_tokens,
        tpot_target_ns=round(s.tpot_target_s * ns),
    )
