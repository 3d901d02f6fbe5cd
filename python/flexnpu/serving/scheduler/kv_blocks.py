"""Paged-KV accounting of one instance: the pool of free blocks and how many blocks a number of
KV positions needs."""

from __future__ import annotations

from collections import deque
from itertools import repeat, starmap

from flexnpu.serving.scheduler.sequence import Sequence


class BlockPool:
    """The free KV blocks (ids) of one instance. A sequence holds its blocks in `seq.blocks`;
    `free` is read directly where a loop takes blocks one by one."""

    __slots__ = ("num_blocks", "block_size", "free")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, positions: int) -> int:
        """Blocks that hold `positions` KV positions."""
        return -(-positions // self.block_size)

    def blocks_short(self, seq: Sequence, positions: int) -> int:
        """Blocks `seq` still needs to hold `positions` positions (<= 0: none)."""
        return self.blocks_needed(positions) - len(seq.blocks)

    def take(self, n: int) -> list[int]:
        """n free blocks (n <= len(free); none for n <= 0), in pool order."""
        return list(starmap(self.free.popleft, repeat((), n)))  # n x popleft, in C

    def give_back(self, seq: Sequence) -> None:
        """Every block of `seq` back to the pool."""
        self.free.extend(seq.blocks)
        seq.blocks = []
