"""The waiting sequences of one instance, in the order they are admitted."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from flexnpu.serving.scheduler.decisions import remaining_tokens
from flexnpu.serving.scheduler.sequence import Sequence


class WaitQueue:
    """Waiting sequences by (priority, arrival order); preempted ones go back in front of their
    priority class. Removal (abort) is lazy: `live` maps the id of each queued sequence to the
    key of its current heap entry (a sequence removed and queued again, e.g. a prompt moved
    away by a role change and handed back after its prefill, leaves a stale entry that must
    stay dead). `live` and `tokens` (the KV positions they have yet to compute: prompts,
    recomputes after preemption, one for a handed-off sequence) are read directly where every
    step reads them."""

    __slots__ = ("_heap", "_order", "_front", "live", "tokens")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Sequence]] = []
        self._order = itertools.count()
        self._front = itertools.count(-1, -1)
        self.live: dict[int, int] = {}
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.live)

    def push(self, seq: Sequence, front: bool = False) -> None:
        key = next(self._front) if front else next(self._order)
        heapq.heappush(self._heap, (seq.priority, key, seq))
        self.live[id(seq)] = key
        self.tokens += remaining_tokens(seq)

    def remove(self, seq: Sequence) -> None:
        """Removes a queued sequence."""
        del self.live[id(seq)]
        self.tokens -= remaining_tokens(seq)

    def peek(self) -> Sequence | None:
        heap, live = self._heap, self.live
        while heap and live.get(id(heap[0][2])) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Sequence:
        heap, live = self._heap, self.live
        while live.get(id(heap[0][2])) != heap[0][1]:
            heapq.heappop(heap)
        seq = heapq.heappop(heap)[2]
        del live[id(seq)]
        self.tokens -= remaining_tokens(seq)
        return seq

    def __iter__(self) -> Iterator[Sequence]:
        live = self.live
        return (s for _, k, s in sorted(self._heap) if live.get(id(s)) == k)
