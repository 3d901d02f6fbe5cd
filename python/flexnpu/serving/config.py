"""Llama-architecture model configurations (real and random-initialized)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_position: int = 4096
    tie_embeddings: bool = True
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE pairs)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        return cls(**d)

    def num_params(self) -> int:
        h, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * h * f + 2 * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * layer + h + head


SMOLLM2_135M = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_eps=1e-5, max_position=8192,
    tie_embeddings=True, bos_id=1, eos_id=2,
)

# Qwen2.5-7B shapes (Llama architecture without the QKV bias) and scaled-down variants for
# load tests of random-initialized models: same GQA ratio (7:1), untied head, RoPE base 1e6.
QWEN25_7B = LlamaConfig(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
    num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_eps=1e-6, max_position=32768,
    tie_embeddings=False, bos_id=1, eos_id=2,
)

RANDOM_PRESETS: dict[str, LlamaConfig] = {
    # A few-MB model for tests: byte-level vocabulary (see tokenizer.ByteTokenizer).
    "tiny": LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position=2048,
        tie_embeddings=False, bos_id=256, eos_id=257,
    ),
    # Qwen2.5-7B scaled down 8x in width, 7x in depth, 4x in heads (~ 90M params with its
    # 152k vocabulary): same kind of shapes, fits a CPU.
    "qwen2.5-7b-mini": dataclasses.replace(
        QWEN25_7B, hidden_size=448, intermediate_size=2368, num_layers=4, num_heads=7,
        num_kv_heads=1, head_dim=64, bos_id=256, eos_id=257,
    ),
    "qwen2.5-7b": dataclasses.replace(QWEN25_7B, bos_id=256, eos_id=257),
}
