"""The waiting sequences of one instance, in the order they are admitted."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

from flexnpu.serving.scheduler.decisions import remaining_tokens
from flexnpu.serving.scheduler.sequence import Sequence


class WaitQueue:
    """Waiting sequences by (priority, arrival order); preempted ones go back in front of their
    priority class. Removal (abort) is lazy. `live` (the ids of the queued sequences) and
    `tokens` (the KV positions they have yet to compute: prompts, recomputes after preemption,
    one for a handed-off sequence) are read directly where every step reads them."""

    __slots__ = ("_heap", "_order", "_front", "live", "tokens")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Sequence]] = []
        self._order = itertools.count()
        self._front = itertools.count(-1, -1)
        self.live: set[int] = set()
        self.tokens = 0

    def __len__(self) -> int:
        return len(self.live)

    def push(self, seq: Sequence, front: bool = False) -> None:
        key = next(self._front) if front else next(self._order)
        heapq.heappush(self._heap, (seq.priority, key, seq))
        self.live.add(id(seq))
        self.tokens += remaining_tokens(seq)

    def remove(self, seq: Sequence) -> None:
        """Removes a queued sequence."""
        self.live.discard(id(seq))
        self.tokens -= remaining_tokens(seq)

    def peek(self) -> Sequence | None:
        heap, live = self._heap, self.live
        while heap and id(heap[0][2]) not in live:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Sequence:
        heap, live = self._heap, self.live
        while id(heap[0][2]) not in live:
            heapq.heappop(heap)
        seq = heapq.heappop(heap)[2]
        live.discard(id(seq))
        self.tokens -= remaining_tokens(seq)
        return seq

    def __iter__(self) -> Iterator[Sequence]:
        return (s for _, _, s in sorted(self._heap) if id(s) in self.live)
