"""FlexNPU dynamic with an adaptive prefill:decode split (`--dynamic-layout adaptive`).

Every unit hosts a prefill and a decode instance (virtual devices v and units + v, home unit
v, as in the colocated layout); the cluster layer of flexnpu.serving (serving/cluster.py: the
same code as the engine's `--layout adaptive`) asks the split advisor how many units take new
prompts, routes arrivals to the prefill instances of units [0, n) and handoffs to the decode
instances of [n, units), and, when a unit changes side, moves its decode instance's running
sequences to the decode side with their KV (over the link, as a handoff) and its prefill
instance's queued prompts back to the router. The dynamic placer still lends units across
roles step by step. The advisor sees what the engine sees: each prompt's length at arrival,
the decode sequences its decode instances hold and the prompt tokens queued on its prefill
instances; its prefill capacity, which the engine measures at warm-up, comes from the
step-time model here.
"""

from __future__ import annotations

from typing import Any

from flexnpu.serving.cluster import (
    SPLIT_BACKLOG_DRAIN_S,
    SPLIT_HOLD_S,
    SPLIT_TARGET_UTILIZATION,
    SplitSettings,
)
from flexnpu.sim.simulation import ADVISED_CORE_POLICY, Simulation

__all__ = [
    "SPLIT_BACKLOG_DRAIN_S",
    "SPLIT_HOLD_S",
    "SPLIT_TARGET_UTILIZATION",
    "AdaptiveSimulation",
]


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
        split_colocate: bool = False,
        prefill_tokens_per_s: float = 0.0,
        **kw: Any,
    ) -> None:
        kw.pop("dynamic_layout", None)
        policy = kw.setdefault("policy", "dynamic")
        if policy != "dynamic" and policy not in ADVISED_CORE_POLICY:
            raise ValueError(
                f"the split advisor's routing serves policies dynamic, "
                f"{', '.join(ADVISED_CORE_POLICY)}; got {policy!r}"
            )
        self.initial_prefill = num_prefill
        self.split_target = split_target_utilization
        self.split_backlog_drain_s = split_backlog_drain_s
        self.split_hold_s = split_hold_s
        self.split_colocate = split_colocate
        self.prefill_tokens_per_s = prefill_tokens_per_s  # 0: from the step-time model
        super().__init__(num_prefill=num_prefill, dynamic_layout="colocated", **kw)

    def _split_settings(self) -> SplitSettings:
        # One unit's prefill capacity: tokens per second of a full prefill batch (prompts of
        # up to 1024 tokens filling max_num_batched_tokens), from the step-time model the
        # placer's roofline also uses (the engine measures the same at warm-up).
        rate = self.prefill_tokens_per_s
        t = self.timer
        if not rate and t.shapes is not None:
            # FlexNPU's engine: its warm-up times its largest prefill program.
            c = t.shapes.chunk_buckets[-1]
            rate = c / t.seconds(*t.program_cost(c, t.shapes.max_blocks))
        if not rate:
            budget = self.front[0].sched.config.max_num_batched_tokens
            prompt = min(1024, budget)
            n = max(1, budget // prompt)
            rate = n * prompt / t.seconds(*t.flops_bytes(t.features([(0, prompt, True)] * n)))
        return SplitSettings(
            prefill_tokens_per_s=rate,
            decode_batch=self.back[0].sched.config.max_num_seqs,
            initial_prefill_units=self.initial_prefill,
            target_utilization=self.split_target,
            backlog_drain_s=self.split_backlog_drain_s,
            hold_s=self.split_hold_s,
            colocate_at_capacity=self.split_colocate,
        )

    def _run(self, wl: Any) -> Any:
        result = super()._run(wl)
        result.split_timeline = self.cluster.split_timeline  # type: ignore[attr-defined]
        result.moves = self.cluster.moves  # type: ignore[attr-defined]
        return result
