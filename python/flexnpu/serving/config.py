"""Llama-architecture model configurations (real and random-initialized)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

# RoPE scalings applied by rope_inv_freq; GGUF's "yarn" and "longrope" also change the attention
# scale and are refused by the loader rather than served wrong.
ROPE_SCALINGS = ("none", "linear", "llama3")


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
    # RoPE scaling: "linear" divides every frequency by rope_scaling_factor; "llama3" divides
    # frequency i by rope_freq_factors[i] (GGUF's rope_freqs tensor, Llama-3.1 style).
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_freq_factors: tuple[float, ...] | None = None
    # A bias on the Q, K and V projections (Qwen2); Llama has none.
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE pairs)")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"RoPE scaling {self.rope_scaling!r} is not supported "
                             f"(supported: {', '.join(ROPE_SCALINGS)})")
        if self.rope_scaling == "linear" and not self.rope_scaling_factor > 0:
            raise ValueError(f"linear RoPE scaling factor {self.rope_scaling_factor} must be > 0")
        factors = self.rope_freq_factors
        if (self.rope_scaling == "llama3") != (factors is not None):
            raise ValueError("llama3 RoPE scaling needs rope_freq_factors, and only it uses them")
        if factors is not None:
            if len(factors) != self.head_dim // 2:
                raise ValueError(f"{len(factors)} RoPE frequency factors, expected head_dim/2 "
                                 f"= {self.head_dim // 2}")
            if not all(f > 0 for f in factors):
                raise ValueError("RoPE frequency factors must be > 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        d = dict(d)
        if d.get("rope_freq_factors") is not None:
            d["rope_freq_factors"] = tuple(float(f) for f in d["rope_freq_factors"])
        return cls(**d)

    def num_params(self) -> int:
        h, f, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.attention_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        layer = attn + 3 * h * f + 2 * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * layer + h + head


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2] (float32) with the model's scaling applied."""
    d = cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if cfg.rope_scaling == "linear":
        inv = inv / cfg.rope_scaling_factor
    if cfg.rope_freq_factors is not None:
        inv = inv / np.asarray(cfg.rope_freq_factors, np.float64)
    return inv.astype(np.float32)


SMOLLM2_135M = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_eps=1e-5, max_position=8192,
    tie_embeddings=True, bos_id=1, eos_id=2,
)

# The published shapes (Hugging Face config.json) of the models served with random weights and
# modelled by the simulator. bos/eos are the models' own ids; a random model is served with the
# tokenizer named at start-up (loading.py), whose ids are the ones used.
QWEN25_7B = LlamaConfig(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
    num_kv_heads=4, head_dim=128, rope_theta=1e6, rms_eps=1e-6, max_position=32768,
    tie_embeddings=False, bos_id=151643, eos_id=151645, attention_bias=True,
)
LLAMA3_8B = LlamaConfig(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
    num_kv_heads=8, head_dim=128, rope_theta=5e5, rms_eps=1e-5, max_position=8192,
    tie_embeddings=False, bos_id=128000, eos_id=128001,
)

# `--model random:<name>`: these shapes with random weights.
RANDOM_PRESETS: dict[str, LlamaConfig] = {
    # A few-MB model for tests: byte-level vocabulary (see tokenizer.ByteTokenizer).
    "tiny": LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_position=2048,
        tie_embeddings=False, bos_id=256, eos_id=257,
    ),
    # Qwen2.5-7B's architecture (QKV bias, untied head, RoPE base 1e6) and vocabulary at a width
    # of 32 and 2 layers (~10M parameters, nearly all embedding and head): tests of the
    # vocabulary a real tokenizer brings.
    "tiny-qwen2.5": dataclasses.replace(
        QWEN25_7B, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=8, max_position=4096,
    ),
    "smollm2-135m": SMOLLM2_135M,
    # Qwen2.5-7B scaled down 8x in width, 7x in depth, 4x in heads (~ 150M params with its
    # 152k vocabulary): same kind of shapes, fits a CPU.
    "qwen2.5-7b-mini": dataclasses.replace(
        QWEN25_7B, hidden_size=448, intermediate_size=2368, num_layers=4, num_heads=7,
        num_kv_heads=1, head_dim=64,
    ),
    "qwen2.5-7b": QWEN25_7B,
    "llama-3-8b": LLAMA3_8B,
}
