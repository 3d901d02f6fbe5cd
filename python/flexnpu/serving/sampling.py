"""Host-side token sampling: greedy, temperature, nucleus (top-p), per-request seeds."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 → greedy
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token id from logits [V] (float32)."""
    if params.temperature <= 0.0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / params.temperature
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, params.top_p) + 1)]
        q = p[keep] / p[keep].sum()
        return int(keep[rng.choice(len(keep), p=q)])
    return int(rng.choice(len(p), p=p))
