"""The role split advisor: how many units of a prefill/decode deployment take new prompts now.

Pure and deterministic, clock injected, one owner (not thread-safe). It imports nothing of the
simulator and takes only what a serving engine knows, so the engine's cluster layer can use it
as it is. Its rule is the placement core's (pjrt_flexnpu/placement/split.h) with two fixes:

- the prefill need counts the queued prompt backlog, not only the arrival rate: sized on
  arrivals alone, a backlog built at the overload edge never drains (the prefill units run at
  the arrival rate);
- hysteresis: a reversal of the last change waits until the proposals have asked for it for
  `hold_ns` (a large one only while the last change is younger than that), so a rate that
  hovers near a unit boundary does not flip the split every tick, while a trend (the EWMA
  walking to a new phase's level unit by unit) and a large shift move it at once.

With backlog_drain_ns=0 and hold_ns=0 it decides exactly as split.h.

Decision, once per tick_ns (the first update starts the clock):
    prompt rate R   = EWMA (time constant average_ns) of the prompt tokens reported per second
    prefill need    = (R + queued prompt tokens / backlog_drain_s) / prefill_tokens_per_s
    decode need     = decode sequences held / decode_sequences_per_unit
    proposal        = ceil(prefill need / target_utilization) if that plus the decode need
                      fits the units; else (overloaded) the prefill share units * prefill need /
                      (prefill need + decode need), rounded up while a backlog of more than a
                      unit's tick of prefill waits (rounded down it would sit at the arrival
                      rate again), else to nearest; clamped to [1, units - 1]
    applied         = the proposal at once if it moves the way the last change went (or is
                      the first change), or moves more than deadband_units and the last change
                      is hold_ns old; otherwise (a reversal) once every proposal for hold_ns
                      asked for a move that way, the smallest of those moves

Inputs, all of which a serving engine has:
    construction    units; one unit's prefill tokens per second at a full batch (production:
                    measured prefill step times; the simulator: its step-time model); decode
                    sequences one unit serves within the TPOT target (a fraction of the decode
                    batch cap); the knobs above
    on_prompt       the token count of each prompt as it arrives (the router sees it)
    update          the clock (ns); the sequences the decode instances hold (running + waiting);
                    the prompt tokens queued on the prefill instances and not yet computed
                    (Scheduler.waiting_tokens summed over them)
"""

from __future__ import annotations

import math


class RoleSplitAdvisor:
    """See the module doc. ValueError names a bad value; state is kept on a rejected call."""

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
    ) -> None:
        where = "split advisor: "
        if units < 2:
            raise ValueError(f"{where}units must be >= 2, got {units}")
        for name, value in (
            ("prefill_tokens_per_s", prefill_tokens_per_s),
            ("decode_sequences_per_unit", decode_sequences_per_unit),
        ):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{where}{name} must be a finite number > 0, got {value}")
        if not 0 < target_utilization <= 1:
            raise ValueError(f"{where}target_utilization must be in (0, 1]")
        for name, value in (("average_ns", average_ns), ("tick_ns", tick_ns)):
            if value <= 0:
                raise ValueError(f"{where}{name} must be > 0, got {value}")
        for name, value in (
            ("backlog_drain_ns", backlog_drain_ns),
            ("hold_ns", hold_ns),
            ("deadband_units", deadband_units),
        ):
            if value < 0:
                raise ValueError(f"{where}{name} must be >= 0 (0: off), got {value}")
        if not 0 <= initial_prefill_units < units:
            raise ValueError(
                f"{where}initial_prefill_units must be in [0, units - 1] (0: units / 2), "
                f"got {initial_prefill_units}"
            )
        self.units = units
        self.prefill_tokens_per_s = float(prefill_tokens_per_s)
        self.decode_sequences_per_unit = float(decode_sequences_per_unit)
        self.target_utilization = float(target_utilization)
        self.average_ns = average_ns
        self.tick_ns = tick_ns
        self.backlog_drain_ns = backlog_drain_ns
        self.hold_ns = hold_ns
        self.deadband_units = deadband_units
        self.prefill_units = initial_prefill_units or max(1, units // 2)
        self.proposal = self.prefill_units  # the last decision's rule output
        self.prompt_tokens_per_s = 0.0  # EWMA of arrivals
        self.decisions = 0  # ticks that decided
        self.changes = 0  # decisions that moved the split
        self._pending = 0.0  # prompt tokens reported since the last decision
        self._last_ns = 0
        self._started = False
        self._averaged = False
        self._last_direction = 0  # of the last change: +1 more prefill, -1 fewer
        self._last_change_ns = 0
        self._ask_direction = 0  # of the proposals held back since _ask_since_ns
        self._ask_since_ns = 0
        self._ask_least = 0  # the smallest move they asked for

    def on_prompt(self, tokens: int) -> None:
        """A prompt of `tokens` arrived."""
        if tokens < 0:
            raise ValueError(f"split advisor: on_prompt tokens must be >= 0, got {tokens}")
        self._pending += tokens

    def due(self, now_ns: int) -> bool:
        """Whether update(now_ns, ...) would decide (lets the caller skip counting in between)."""
        return not self._started or now_ns - self._last_ns >= self.tick_ns

    def update(self, now_ns: int, decode_sequences: int, queued_prompt_tokens: int = 0) -> bool:
        """Decides if a tick has passed since the last decision; whether prefill_units changed."""
        if decode_sequences < 0:
            raise ValueError(
                f"split advisor: update decode_sequences must be >= 0, got {decode_sequences}"
            )
        if queued_prompt_tokens < 0:
            raise ValueError(
                "split advisor: update queued_prompt_tokens must be >= 0, got "
                f"{queued_prompt_tokens}"
            )
        if self._started and now_ns < self._last_ns:
            raise ValueError(
                f"split advisor: update clock went back ({now_ns} < {self._last_ns} ns)"
            )
        if not self._started:  # prompts reported before the clock started count from here
            self._started = True
            self._last_ns = now_ns
            return False
        dt_ns = now_ns - self._last_ns
        if dt_ns < self.tick_ns:
            return False
        measured = self._pending / (dt_ns * 1e-9)
        # The first measurement starts the average (from 0 it would lag one time constant).
        a = 1.0 - math.exp(-dt_ns / self.average_ns) if self._averaged else 1.0
        self.prompt_tokens_per_s += a * (measured - self.prompt_tokens_per_s)
        self._averaged = True
        self._pending = 0.0
        self._last_ns = now_ns
        self.decisions += 1
        self.proposal = self._propose(decode_sequences, queued_prompt_tokens)
        return self._apply(now_ns, self.proposal)

    def _propose(self, decode_sequences: int, queued: int) -> int:
        units = self.units
        demand = self.prompt_tokens_per_s
        if self.backlog_drain_ns:
            demand += queued / (self.backlog_drain_ns * 1e-9)
        prefill_need = demand / self.prefill_tokens_per_s
        decode_need = decode_sequences / self.decode_sequences_per_unit
        prefill_want = prefill_need / self.target_utilization
        if prefill_want + decode_need <= units:
            want = math.ceil(prefill_want)
        else:  # overloaded: share the units in proportion to the needs
            share = units * prefill_need / (prefill_need + decode_need)
            backlog = self.backlog_drain_ns and (
                queued > self.prefill_tokens_per_s * self.tick_ns * 1e-9
            )
            want = math.ceil(share) if backlog else math.floor(share + 0.5)  # as lround
        return min(max(want, 1), units - 1)

    def _apply(self, now_ns: int, proposal: int) -> bool:
        move = proposal - self.prefill_units
        if move == 0:
            self._ask_direction = 0
            return False
        direction = 1 if move > 0 else -1
        at_once = direction != -self._last_direction or (
            abs(move) > self.deadband_units and now_ns - self._last_change_ns >= self.hold_ns
        )
        if not self.hold_ns or at_once:
            return self._change(now_ns, proposal, direction)
        if direction != self._ask_direction:  # a new ask: hold it from now
            self._ask_direction, self._ask_since_ns = direction, now_ns
            self._ask_least = abs(move)
        else:
            self._ask_least = min(self._ask_least, abs(move))
        if now_ns - self._ask_since_ns >= self.hold_ns:
            return self._change(now_ns, self.prefill_units + direction * self._ask_least, direction)
        return False

    def _change(self, now_ns: int, prefill_units: int, direction: int) -> bool:
        self.prefill_units = prefill_units
        self._last_direction = direction
        self._last_change_ns = now_ns
        self._ask_direction = 0
        self.changes += 1
        return True
