"""The steady-decode fast path: the running sequences that decode one token per step, kept in
aggregate so that a step costs O(events), not O(batch). It takes exactly the decisions the
per-sequence path takes (decisions.py), only for many members at once."""

from __future__ import annotations

import bisect
import operator

from flexnpu.serving.scheduler.decisions import output_limit
from flexnpu.serving.scheduler.kv_blocks import BlockPool
from flexnpu.serving.scheduler.sequence import Sequence
from flexnpu.serving.scheduler.step_plan import ScheduledSeq, StepPlan

_serial_of = operator.attrgetter("_serial")  # a Sequence's admission order


class DecodeCohort:
    """The running sequences in steady decode (each step: one new position, one sampled
    token), kept in aggregate: a member stores its token counts as offsets from `tick`, the
    number of steps the cohort has taken, so one step advances every member by `tick += 1`.
    A member is touched one by one only at its next event (a KV block boundary or its last
    token by length), found in `events` (tick -> members), or when it leaves (finish, stop,
    abort, preemption). Lists in running (admission) order."""

    __slots__ = (
        "tick",
        "seqs",
        "offs",
        "serials",
        "off_sum",
        "events",
        "shared",
        "_pool",
        "_block_size",
        "_max_model_len",
    )

    def __init__(self, pool: BlockPool, max_model_len: int) -> None:
        self.tick = 0
        self.seqs: list[Sequence] = []
        self.offs: list[int] = []  # num_computed_tokens - tick of each member
        self.serials: list[int] = []
        self.off_sum = 0
        self.events: dict[int, list[Sequence]] = {}
        # Plans whose bulk holds seqs / offs / serials (a plan reads only their first members,
        # so appends are safe; copy before any other change). Scheduler.release gives one back.
        self.shared = 0
        self._pool = pool
        self._block_size = pool.block_size
        self._max_model_len = max_model_len

    def unshare(self) -> None:
        if self.shared:
            self.seqs, self.offs, self.serials = (
                self.seqs.copy(),
                self.offs.copy(),
                self.serials.copy(),
            )
            self.shared = 0

    # ---- membership ------------------------------------------------------------------------

    def join(self, seq: Sequence) -> None:
        seq._computed -= self.tick
        seq._output -= self.tick
        seq._cohort = self
        serials = self.serials
        if not serials or serials[-1] < seq._serial:  # the common case: the latest admitted
            self.seqs.append(seq)  # past what a plan holding the lists reads
            self.offs.append(seq._computed)
            serials.append(seq._serial)
        else:
            self.unshare()
            serials = self.serials
            i = bisect.bisect_left(serials, seq._serial)
            self.seqs.insert(i, seq)
            self.offs.insert(i, seq._computed)
            serials.insert(i, seq._serial)
        self.off_sum += seq._computed
        self.file_event(seq, output_limit(seq, self._max_model_len))

    def leave(self, seq: Sequence) -> None:
        if self.shared:
            self.unshare()
        i = bisect.bisect_left(self.serials, seq._serial)
        del self.seqs[i], self.offs[i], self.serials[i]
        self.off_sum -= seq._computed
        seq._computed += self.tick
        seq._output += self.tick
        seq._cohort = None
        seq._event = -1

    def dissolve(self) -> None:
        """Every member leaves (the per-sequence path takes this step)."""
        for seq in self.seqs:
            seq._computed += self.tick
            seq._output += self.tick
            seq._cohort = None
            seq._event = -1
        self.seqs, self.offs, self.serials, self.off_sum, self.shared = [], [], [], 0, 0
        self.events.clear()

    # ---- steps -----------------------------------------------------------------------------

    def file_event(self, seq: Sequence, limit: int) -> None:
        """Files a member under the tick of its next event: the step whose position opens a
        new block, or the step that samples its last token by length (its output reaches
        `limit`, output_limit()). With offsets the event ticks do not depend on the tick."""
        block_tick = len(seq.blocks) * self._block_size - seq._computed
        last_tick = limit - seq._output - 1
        tick = block_tick if block_tick < last_tick else last_tick
        seq._event = tick
        events = self.events
        bucket = events.get(tick)
        if bucket is None:
            events[tick] = [seq]
        else:
            bucket.append(seq)

    def advance(self, plan: StepPlan) -> bool:
        """Every member decodes one token in `plan`, held there in aggregate. The members whose
        event is this step are handled one by one: a new KV block, or the last token by length
        (the member leaves; a PREFILL instance has no cohort, so no handoff here). False, having
        changed nothing, when they need more blocks than are free."""
        tick = self.tick
        bs, max_len, free = self._block_size, self._max_model_len, self._pool.free
        due: list[Sequence] = []
        bucket = self.events.get(tick)
        if bucket:  # (it may still list members that left or were filed again)
            due = [s for s in dict.fromkeys(bucket) if s._cohort is self and s._event == tick]
            due.sort(key=_serial_of)  # running order
            need = 0
            for s in due:
                if len(s.blocks) * bs <= s._computed + tick:  # this position opens a block
                    need += 1
            if need > len(free):
                return False
        self.events.pop(tick, None)
        last: list[ScheduledSeq] = []
        ending: list[Sequence] = []
        for seq in due:
            computed = seq._computed + tick
            blocks = seq.blocks
            if len(blocks) * bs <= computed:
                blocks.append(free.popleft())
            limit = output_limit(seq, max_len)
            if seq._output + tick + 1 >= limit:
                last.append(ScheduledSeq(seq, computed, 1, True, True))
                ending.append(seq)
            else:
                self.file_event(seq, limit)
        count = len(self.seqs)
        starts = self.off_sum + tick * count
        self.tick = tick + 1
        for seq in ending:  # they leave before the plan takes the lists: no copy for them
            self.leave(seq)
            seq.pending_finish = "length"
        plan.hold_bulk_decodes(tick, self.seqs, self.offs, self.serials, last, count, starts)
        self.shared += 1
        return True
