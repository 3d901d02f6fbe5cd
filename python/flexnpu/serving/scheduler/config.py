"""The settings of one instance's scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from flexnpu.serving.scheduler.sequence import Role


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences holding KV and scheduled together (the decode batch)
    max_num_batched_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    block_size: int = 16  # KV positions per block
    num_blocks: int = 1024  # blocks in this instance's KV pool
    max_model_len: int = 2048  # prompt + output positions of one sequence
    max_waiting: int = 1024  # bound of the waiting queue (QueueFullError beyond)
    chunked_prefill: bool = True  # False: a prompt is prefilled whole, in one step
    mixed_batches: bool = True  # False: a step is all prefill or all decode (prefill first)
    max_prefill_seqs: int = 0  # 0: no cap; else at most this many prompt chunks per step
    role: Role = Role.MIXED
    watermark_blocks: int = 0  # blocks kept free when admitting a new prompt

    def validate(self) -> None:
        for name in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "num_blocks",
            "max_model_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"scheduler: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0 or self.max_prefill_seqs < 0 or self.watermark_blocks < 0:
            raise ValueError(
                "scheduler: max_waiting, max_prefill_seqs and watermark_blocks must be >= 0"
            )
        if self.watermark_blocks >= self.num_blocks:
            raise ValueError(
                f"scheduler: watermark_blocks {self.watermark_blocks} must be < "
                f"num_blocks {self.num_blocks}"
            )
        self.role = Role(self.role)
