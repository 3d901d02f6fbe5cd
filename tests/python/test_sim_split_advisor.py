"""The placement core's role split advisor (split.h, flexnpu.placement.SplitAdvisor) as the
simulator uses it, on an injected clock: the plain rule when its fixes are off, the prompt
backlog in the prefill need, and hysteresis."""

from __future__ import annotations

import math
import random

import pytest

from flexnpu.placement import SplitAdvisor

SEC = 1_000_000_000
# 10 units; a unit prefills 100k tokens/s and decodes 1000 sequences.
TEN = dict(units=10, prefill_tokens_per_s=100_000, decode_sequences_per_unit=1000)


class PlainRule:
    """The rule without backlog and hysteresis, as split.h states it (EWMA of the prompt
    rate, the first measurement starting it; ceil of the prefill need over the target, or
    the units shared by need when overloaded, rounded to nearest): the reference the advisor
    with both fixes off must match decision for decision."""

    def __init__(
        self,
        units,
        prefill_tokens_per_s,
        decode_sequences_per_unit,
        target_utilization,
        initial_prefill_units,
    ):
        self.units, self.target = units, target_utilization
        self.prefill, self.decode = prefill_tokens_per_s, decode_sequences_per_unit
        self.prefill_units = initial_prefill_units
        self.rate = self.pending = 0.0
        self.last_ns: int | None = None  # the clock starts at the first update
        self.averaged = False

    def update(self, now_ns: int, decode_sequences: int) -> bool:
        if self.last_ns is None:
            self.last_ns = now_ns
        if now_ns - self.last_ns < SEC:  # one decision per tick (1 s)
            return False
        dt_ns, self.last_ns = now_ns - self.last_ns, now_ns
        a = 1.0 - math.exp(-dt_ns / (2 * SEC)) if self.averaged else 1.0  # average over 2 s
        self.rate += a * (self.pending / (dt_ns * 1e-9) - self.rate)
        self.averaged, self.pending = True, 0.0
        prefill_need = self.rate / self.prefill
        decode_need = decode_sequences / self.decode
        if prefill_need / self.target + decode_need <= self.units:
            want = math.ceil(prefill_need / self.target)
        else:
            want = math.floor(self.units * prefill_need / (prefill_need + decode_need) + 0.5)
        want = min(max(want, 1), self.units - 1)
        changed, self.prefill_units = want != self.prefill_units, want
        return changed


def test_without_backlog_and_hold_it_decides_as_the_plain_rule():
    rng = random.Random(3)
    args = dict(
        units=24,
        prefill_tokens_per_s=100_000,
        decode_sequences_per_unit=1000,
        target_utilization=0.8,
        initial_prefill_units=5,
    )
    advisor = SplitAdvisor(**args, backlog_drain_ns=0, hold_ns=0)
    plain = PlainRule(**args)
    now = changes = 0
    for _ in range(400):
        for _ in range(rng.randrange(4)):
            tokens = rng.randrange(600_000)
            advisor.on_prompt(tokens)
            plain.pending += tokens
        now += rng.randrange(SEC // 3, 2 * SEC)
        held = rng.randrange(30_000)
        changed = plain.update(now, held)
        changes += changed
        # The queue is not counted with backlog_drain_ns 0.
        assert advisor.update(now, held, rng.randrange(10**6)) == changed
        assert advisor.prefill_units == plain.prefill_units
        assert advisor.prompt_tokens_per_s == pytest.approx(plain.rate, rel=1e-12)
    assert advisor.changes == changes > 20
    assert advisor.decisions > 100


def _overload_edge(**kw) -> tuple[list[int], list[float]]:
    """A toy cluster on the advisor's clock: 600k prompt tokens/s arrive (6 units of prefill),
    4000 sequences decode (4 units): 6 / 0.75 + 4 > 10, so the advisor shares the units by
    need, 6 prefill -- exactly the arrival rate. A 1.2M-token backlog waits at the start.
    Each tick the advisor sees what the last tick left queued, then the prefill units compute
    what they can of it and of the tick's arrivals."""
    a = SplitAdvisor(**TEN, initial_prefill_units=6, **kw)
    backlog = 1_200_000.0
    splits, backlogs = [], []
    a.update(0, 4000, int(backlog))
    for t in range(1, 31):
        a.on_prompt(600_000)
        a.update(t * SEC, 4000, int(backlog))
        backlog = max(0.0, backlog + 600_000 - a.prefill_units * 100_000)
        splits.append(a.prefill_units)
        backlogs.append(backlog)
    return splits, backlogs


def test_backlog_at_the_overload_edge_never_drains_when_the_need_ignores_it():
    splits, backlogs = _overload_edge(backlog_drain_ns=0)
    assert set(splits) == {6}
    assert backlogs[-1] == 1_200_000  # every tick adds what it computes


def test_backlog_counted_in_the_prefill_need_drains_and_the_split_returns():
    splits, backlogs = _overload_edge()  # backlog drained over 2 s
    assert max(splits[:3]) >= 8  # the backlog takes units from decode at once
    # Drained down to what one unit prefills in a tick (the share is rounded up above that;
    # 1/6 s of the 6 prefill units' work here), then back to the arrivals' share.
    drained = next(t for t, b in enumerate(backlogs) if b <= 100_000)
    assert drained < 10, backlogs
    assert backlogs[-1] <= 100_000 and splits[-1] == 6


def test_backlog_below_the_edge_adds_its_drain_rate_to_the_need():
    a = SplitAdvisor(**TEN, hold_ns=0)
    a.update(0, 0)
    a.on_prompt(300_000)  # 3 units / 0.75 -> 4
    a.update(SEC, 0, 0)
    assert a.prefill_units == 4
    a.on_prompt(300_000)
    a.update(2 * SEC, 0, 600_000)  # + 600k over 2 s = 300k/s more: 6 / 0.75 -> 8
    assert a.prefill_units == 8


def _alternating(hold_ns: int) -> SplitAdvisor:
    """A prompt rate that hovers across a unit boundary: 440k/s (6 units at 0.75) and 520k/s
    (7 units) on alternate ticks; the average follows each tick (average_ns 1)."""
    a = SplitAdvisor(**TEN, initial_prefill_units=6, average_ns=1, hold_ns=hold_ns)
    a.update(0, 0)
    for t in range(1, 21):
        a.on_prompt(520_000 if t % 2 else 440_000)
        a.update(t * SEC, 0)
    return a


def test_hysteresis_keeps_a_hovering_rate_from_flipping_the_split_every_tick():
    flipping = _alternating(hold_ns=0)
    assert flipping.changes == 20  # 7, 6, 7, 6, ...
    steady = _alternating(hold_ns=2 * SEC)  # up to 7 once, never back: each ask lasts 1 s
    assert steady.decisions == 20 and steady.changes == 1
    assert steady.prefill_units == 7


def test_hysteresis_lets_trends_through_and_holds_reversals():
    a = SplitAdvisor(**TEN, initial_prefill_units=3, average_ns=1)  # hold 2 s
    a.update(0, 0)
    a.on_prompt(600_000)  # 8 units: the first change goes at once
    assert a.update(SEC, 0) is True and a.prefill_units == 8
    a.on_prompt(750_000)  # 10 -> 9 (clamped): +1 the same way, at once
    assert a.update(2 * SEC, 0) is True and a.prefill_units == 9
    a.on_prompt(200_000)  # 3 units: a large reversal of the change of 1 s ago: held
    assert a.update(3 * SEC, 0) is False and a.prefill_units == 9
    a.on_prompt(200_000)  # the last change is 2 s old: a large reversal goes at once
    assert a.update(4 * SEC, 0) is True and a.prefill_units == 3
    a.on_prompt(280_000)  # a one-unit reversal up (4) within 1 s, prefill within capacity: held
    assert a.update(5 * SEC, 0) is False and a.proposal == 4
    a.on_prompt(600_000)  # ... but one that feeds a side over its capacity (6 on 3) goes at once
    assert a.update(6 * SEC, 0) is True and a.prefill_units == 8
    for t in (7, 8):  # a one-unit reversal (7) waits until asked for 2 s
        a.on_prompt(520_000)
        assert a.update(t * SEC, 0) is False and a.proposal == 7
    a.on_prompt(520_000)
    assert a.update(9 * SEC, 0) is True and a.prefill_units == 7
    assert a.changes == 5


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"units": 1}, "units must be >= 2"),
        ({"prefill_tokens_per_s": 0}, "prefill_tokens_per_s must be a finite number > 0"),
        ({"decode_sequences_per_unit": float("inf")}, "decode_sequences_per_unit"),
        ({"target_utilization": 1.5}, r"target_utilization must be in \(0, 1\]"),
        ({"tick_ns": 0}, "tick_ns must be > 0"),
        ({"hold_ns": -1}, r"hold_ns must be >= 0 \(0: off\)"),
        ({"backlog_drain_ns": -1}, "backlog_drain_ns must be >= 0"),
        ({"initial_prefill_units": 10}, r"initial_prefill_units must be in \[0, units - 1\]"),
    ],
)
def test_bad_config_is_named(kw, message):
    with pytest.raises(ValueError, match="split advisor: " + message):
        SplitAdvisor(**(TEN | kw))


def test_bad_calls_are_named_and_keep_the_state():
    a = SplitAdvisor(**TEN)
    with pytest.raises(ValueError, match="OnPrompt tokens must be >= 0"):
        a.on_prompt(-1)
    a.update(5 * SEC, 0)
    with pytest.raises(ValueError, match="clock went back"):
        a.update(4 * SEC, 0)
    with pytest.raises(ValueError, match="queued_prompt_tokens must be >= 0"):
        a.update(6 * SEC, 0, -3)
    with pytest.raises(ValueError, match="decode_sequences must be >= 0"):
        a.update(6 * SEC, -1)
    assert a.prefill_units == 5 and a.decisions == 0


def test_simulate_rejects_a_negative_hold_or_drain_by_flag():
    from flexnpu.sim.experiments import SimSpec

    with pytest.raises(ValueError, match="--split-hold must be >= 0 seconds"):
        SimSpec(split_hold_s=-1.0).resolved()
    with pytest.raises(ValueError, match="--split-backlog-drain must be >= 0 seconds"):
        SimSpec(split_backlog_drain_s=float("nan")).resolved()


def test_co_locates_every_unit_while_the_needs_fill_the_cluster():
    a = SplitAdvisor(**TEN, average_ns=1, colocate_at_capacity=True)
    b = SplitAdvisor(**TEN, average_ns=1)  # the same without co-location
    for adv in (a, b):
        adv.update(0, 0)
        adv.on_prompt(300_000)
        adv.update(SEC, 2000)  # 3 / 0.75 + 2 = 6 of 10 units: a split
    assert (a.prefill_units, a.mixed_units) == (4, 0)
    for adv in (a, b):
        adv.on_prompt(600_000)
        adv.update(2 * SEC, 3000)  # 6 / 0.75 + 3 = 11: less than a unit to spare
    assert (a.prefill_units, a.mixed_units, a.proposal) == (0, 10, 0)
    assert b.mixed_units == 0 and b.prefill_units == 7  # shared by need, 6 / 9 of 10 units
