"""FlexNPU dynamic with an adaptive prefill:decode split (`--dynamic-layout adaptive`).

Every unit hosts a prefill and a decode instance (virtual devices v and units + v, home unit
v, as in the colocated layout); the placement core's role split advisor (split.h through
flexnpu.placement.SplitAdvisor: the same code as in production, prompt backlog and hysteresis
included) decides how many units take new prompts: arrivals are routed to the prefill
instances of units [0, n), handoffs to the decode instances of units [n, units). An instance
outside its side's range only drains what it holds; its unit is then free for the other role,
and the dynamic placer still lends units across roles step by step. The advisor sees what a
serving engine sees: each prompt's length at arrival, the decode sequences its decode
instances hold and the prompt tokens queued on its prefill instances.
"""

from __future__ import annotations

from typing import Any

from flexnpu import placement as fp
from flexnpu.sim.simulation import ADVISED_CORE_POLICY, Instance, Request, Router, Simulation

# Defaults of the advisor here (split.h explains them): prefill units sized for 75% load,
# prompt rate averaged over 2 s, one decision per simulated second.
SPLIT_TARGET_UTILIZATION = 0.75
SPLIT_AVERAGE_NS = 2_000_000_000
SPLIT_TICK_NS = 1_000_000_000
# A decode unit counts as full at 3/4 of its batch cap (max_num_seqs): sized at the cap, the
# advisor leaves prompt-heavy overload with too few decode units; at 1/2 it starves prefill
# (chosen on the phase-shift workload over 384 x 910C, `python -m bench.paper`).
SPLIT_DECODE_BATCH_FRACTION = 0.75
# The backlog's drain time and the hysteresis hold (split.h; 0 turns either off).
SPLIT_BACKLOG_DRAIN_S = 2.0
SPLIT_HOLD_S = 2.0


class AdaptiveSimulation(Simulation):
    """Simulation over the colocated virtual layout, its routers limited to the advisor's split:
    policy "adaptive" (or "dynamic", the adaptive layout) with the dynamic placer, "elastic-pd"
    with every step on its home unit. `num_prefill`: the split before the first decision (0:
    half)."""

    advised = True

    def __init__(
        self,
        *,
        num_prefill: int = 0,
        split_target_utilization: float = SPLIT_TARGET_UTILIZATION,
        split_backlog_drain_s: float = SPLIT_BACKLOG_DRAIN_S,
        split_hold_s: float = SPLIT_HOLD_S,
        **kw: Any,
    ) -> None:
        kw.pop("dynamic_layout", None)
        policy = kw.setdefault("policy", "dynamic")
        if policy != "dynamic" and policy not in ADVISED_CORE_POLICY:
            raise ValueError(
                f"the split advisor's routing serves policies dynamic, "
                f"{', '.join(ADVISED_CORE_POLICY)}; got {policy!r}"
            )
        super().__init__(num_prefill=num_prefill, dynamic_layout="colocated", **kw)
        self.initial_prefill = num_prefill
        self.split_target = split_target_utilization
        self.split_backlog_drain_ns = round(split_backlog_drain_s * 1e9)
        self.split_hold_ns = round(split_hold_s * 1e9)

    def _make_advisor(self) -> fp.SplitAdvisor:
        # One unit's prefill capacity: tokens per second of a full prefill batch (prompts of
        # up to 1024 tokens filling max_num_batched_tokens), from the step-time model the
        # placer's roofline also uses; decode: a fraction of the sequences a decode instance
        # batches at most.
        t = self.timer
        budget = self.front[0].sched.config.max_num_batched_tokens
        prompt = min(1024, budget)
        n = max(1, budget // prompt)
        seconds = t.seconds(*t.flops_bytes(t.features([(0, prompt, True)] * n)))
        return fp.SplitAdvisor(
            self.units,
            n * prompt / seconds,
            self.back[0].sched.config.max_num_seqs * SPLIT_DECODE_BATCH_FRACTION,
            target_utilization=self.split_target,
            average_ns=SPLIT_AVERAGE_NS,
            tick_ns=SPLIT_TICK_NS,
            initial_prefill_units=self.initial_prefill,
            backlog_drain_ns=self.split_backlog_drain_ns,
            hold_ns=self.split_hold_ns,
        )

    def _run(self, wl: Any) -> Any:
        self.advisor = self._make_advisor()
        self.split_timeline: list[tuple[float, int]] = []
        self._outside: list[Instance] = []  # the `changed` list of instances no router takes
        self._routed = False
        result = super()._run(wl)
        result.split_timeline = self.split_timeline  # type: ignore[attr-defined]
        return result

    def _reroute(self, now: float) -> None:
        n, units = self.advisor.prefill_units, self.units
        for x in self.instances:
            x.changed = self._outside
        self._front = Router([x for x in self.front if x.idx % units < n])
        self._back = Router([x for x in self.back if x.idx % units >= n])
        self.split_timeline.append((now, n))

    def _on_arrival(self, req: Request, now: float) -> None:
        adv = self.advisor
        adv.on_prompt(req.prompt)
        now_ns = int(now * 1e9)
        if adv.due(now_ns):
            held = sum(x.sched.num_running + x.sched.num_waiting for x in self.back)
            queued = sum(x.sched.waiting_tokens for x in self.front)
            if adv.update(now_ns, held, queued) or not self._routed:
                self._routed = True
                self._reroute(now)
        self._outside.clear()
        super()._on_arrival(req, now)
