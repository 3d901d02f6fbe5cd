"""One planned step: its entries (which sequence computes which KV positions, and whether it
samples), the handed-off KV to write first, and what the planning preempted or finished."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from flexnpu.serving.scheduler.sequence import Sequence


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # first KV position computed in this step
    num_tokens: int  # positions computed in this step
    samples: bool  # the step yields a new token for `seq`
    finishes: bool = False  # that token is its last (length, or the handoff of a prefill)

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.start >= self.seq.num_prompt_tokens


class StepPlan:
    """One step. `scheduled` lists its entries: decodes in running order, then prompt chunks,
    then newly admitted sequences. The scheduler may hold the leading decodes in aggregate
    (`bulk_decodes`) and build their entries only when `scheduled` is first read; callers
    that need only totals (the cluster simulator) read `bulk_decodes`, `entries_after_bulk`
    and `num_scheduled` instead and never pay for the entries."""

    __slots__ = (
        "step_id",
        "kv_inserts",
        "preempted",
        "finished",
        "_bulk",
        "_entries",
        "_finishing",
    )

    def __init__(
        self,
        step_id: int,
        scheduled: list[ScheduledSeq] | None = None,
        kv_inserts: list[Sequence] | None = None,
        preempted: list[Sequence] | None = None,
        finished: list[Sequence] | None = None,
    ) -> None:
        self.step_id = step_id
        self.kv_inserts: list[Sequence] = [] if kv_inserts is None else kv_inserts
        self.preempted: list[Sequence] = [] if preempted is None else preempted
        self.finished: list[Sequence] = [] if finished is None else finished
        # Bulk decodes: (tick, members, their offsets, their serials, the number of members
        # this plan reads from those lists, the entries of the members that finish (they left
        # the lists; placed by serial), count, sum of starts); start of an entry = offset + tick.
        self._bulk: (
            tuple[int, list[Sequence], list[int], list[int], int, list[ScheduledSeq], int, int]
            | None
        ) = None
        self._entries: list[ScheduledSeq] = [] if scheduled is None else scheduled
        # Entries that finish, in plan order (None: not tracked, scan `scheduled`).
        self._finishing: list[ScheduledSeq] | None = None if scheduled else []

    # ---- building (the scheduler) ----------------------------------------------------------

    def add(self, entry: ScheduledSeq) -> None:
        """Appends an entry after those already planned."""
        self._entries.append(entry)
        if entry.finishes and self._finishing is not None:
            self._finishing.append(entry)

    def hold_bulk_decodes(
        self,
        tick: int,
        seqs: list[Sequence],
        offs: list[int],
        serials: list[int],
        last: list[ScheduledSeq],
        count: int,
        starts: int,
    ) -> None:
        """The leading decodes, held in aggregate: one entry (start = offset + tick) for each
        of the first len(seqs) members of the lists (which the plan shares, not copies), plus
        `last`, the entries of members that finish (no longer in the lists), by serial. Called
        before any other entry is added."""
        self._bulk = (tick, seqs, offs, serials, len(seqs), last, count, starts)
        self._finishing.extend(last)  # type: ignore[union-attr]

    def release_bulk(self) -> list[Sequence] | None:
        """Drops the aggregate decodes and every entry (the caller reads none of them again);
        returns the member list the plan held, if any."""
        b = self._bulk
        if b is None:
            return None
        self._bulk = None
        self._entries = []
        return b[1]

    def drop_entries_of(self, seq: Sequence) -> list[ScheduledSeq]:
        """Removes the entries of `seq` (preempted while this plan is built); returns them."""
        dropped = [e for e in self.scheduled if e.seq is seq]
        for e in dropped:
            self.scheduled.remove(e)
            if self._finishing is not None and e in self._finishing:
                self._finishing.remove(e)
        return dropped

    # ---- reading ---------------------------------------------------------------------------

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        if self._bulk is not None:
            tick, seqs, offs, serials, n, last, _, _ = self._bulk
            self._bulk = None
            bulk = [
                ScheduledSeq(s, off + tick, 1, True)
                for s, off in zip(seqs[:n], offs[:n], strict=True)
            ]
            for k, e in enumerate(last):  # in serial order: k of them are before e
                bulk.insert(bisect.bisect_left(serials, e.seq._serial, 0, n) + k, e)
            self._entries[:0] = bulk
        return self._entries

    @scheduled.setter
    def scheduled(self, entries: list[ScheduledSeq]) -> None:
        self._bulk, self._entries, self._finishing = None, entries, None

    @property
    def num_scheduled(self) -> int:
        b = self._bulk
        return len(self._entries) + (b[6] if b is not None else 0)

    @property
    def bulk_decodes(self) -> tuple[int, int]:
        """(count, sum of start positions) of the leading decode entries held in aggregate,
        not in `entries_after_bulk`. Each is a single-token entry that samples."""
        b = self._bulk
        if b is None:
            return 0, 0
        return b[6], b[7]

    @property
    def entries_after_bulk(self) -> list[ScheduledSeq]:
        """The entries not counted by `bulk_decodes` (all of them once `scheduled` is read)."""
        return self._entries

    @property
    def finishing(self) -> list[ScheduledSeq]:
        """Entries whose token is their sequence's last (`finishes`), in plan order."""
        if self._finishing is None:
            return [e for e in self.scheduled if e.finishes]
        return self._finishing

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled and not self.kv_inserts

    @property
    def num_tokens(self) -> int:
        return self.bulk_decodes[0] + sum(e.num_tokens for e in self._entries)

    @property
    def decodes(self) -> list[ScheduledSeq]:
        return [e for e in self.scheduled if e.is_decode]

    @property
    def prefills(self) -> list[ScheduledSeq]:
        return [e for e in self.scheduled if not e.is_decode]

    @property
    def num_prefill_tokens(self) -> int:  # bulk entries are decodes
        return sum(e.num_tokens for e in self._entries if not e.is_decode)

    def __repr__(self) -> str:
        return (
            f"StepPlan(step_id={self.step_id}, scheduled={self.scheduled}, kv_inserts="
            f"{self.kv_inserts}, preempted={self.preempted}, finished={self.finished})"
        )
