"""Model selection: the default SmolLM2-135M-Instruct GGUF, any llama GGUF path, or
`random:<preset>` (random weights of a published shape, made on the device); and its tokenizer:
the model's own, a Hugging Face tokenizer directory (`tokenizer=`), or for a random model the
bundled SmolLM2 one (byte-level when its vocabulary is too small for that one: random:tiny)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from flexnpu.serving import model as model_lib
from flexnpu.serving import tokenizer as tok_lib
from flexnpu.serving.chat_template import ChatTemplate
from flexnpu.serving.config import RANDOM_PRESETS, SMOLLM2_135M, LlamaConfig
from flexnpu.serving.gguf_loader import DEFAULT_MODEL, GgufModel, load_gguf

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass
class LoadedModel:
    name: str
    config: LlamaConfig
    params: dict[str, Any]
    tokenizer: tok_lib.Tokenizer  # carries eos_ids, chat_template and the special tokens
    chat_system: str | None = None  # unused: the chat template decides (kept for export.py)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: eos, eot / eom, the template's end-of-turn token."""
        return tuple(self.tokenizer.eos_ids)

    @property
    def vocab_limit(self) -> int | None:
        """Sample only ids below this: the tokenizer's vocabulary when the model's is larger (a
        random model's 152k ids against SmolLM2's 49k), so every sampled id decodes."""
        return vocab_limit(self.tokenizer, self.config)


def load_model(model: str = DEFAULT_MODEL, dtype: str = "float32", seed: int = 0,
               device=None, max_layers: int | None = None, log=print,
               tokenizer: str | None = None) -> LoadedModel:
    """`tokenizer`: a Hugging Face tokenizer directory instead of the model's own."""
    t0 = time.perf_counter()
    if model.startswith("random:"):
        cfg = _preset(model)
        tok = load_tokenizer(model, tokenizer)
        params = model_lib.random_params(cfg, seed, DTYPES[dtype], device)
        loaded = LoadedModel(model, cfg, params, tok)
    else:
        path = None if model == DEFAULT_MODEL else model
        g = load_gguf(path, max_layers=max_layers)
        tok = tok_lib.load_hf_directory(tokenizer) if tokenizer else tokenizer_from_gguf(g)
        check_tokenizer_fits(tok, g.config, model)
        params = model_lib.params_from_gguf(g.weights, g.config, DTYPES[dtype], device)
        name = DEFAULT_MODEL if path is None else g.name
        loaded = LoadedModel(name, g.config, params, tok)
    if not getattr(loaded.tokenizer, "chat_template", None):
        whose = (f"the tokenizer {tokenizer} has no chat_template" if tokenizer else
                 "the GGUF has no tokenizer.chat_template" if not model.startswith("random:")
                 else "its byte-level tokenizer has no chat template")
        log(f"{loaded.name}: {whose}; chat uses plain ChatML")
    n = loaded.config.num_params()
    log(f"loaded {loaded.name}: {n / 1e6:.1f}M params, {loaded.config.num_layers} layers, "
        f"{dtype}, {time.perf_counter() - t0:.1f}s")
    return loaded


def tokenizer_from_gguf(g: GgufModel) -> tok_lib.HFTokenizer:
    kind = g.metadata.get("tokenizer_model", "gpt2")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2', "
                         "byte-level BPE)")
    special = {k: g.metadata.get(k) for k in ("bos_token", "eos_token", "unk_token",
                                               "pad_token")}
    return tok_lib.from_gguf(g.tokens, g.token_types, g.merges, g.config.bos_id,
                             g.config.eos_id, g.metadata.get("pre"), g.eos_ids,
                             g.chat_template, special)


def load_tokenizer(model: str = DEFAULT_MODEL, tokenizer: str | None = None) -> tok_lib.Tokenizer:
    """The tokenizer a model is served with (no weights read): the Hugging Face directory
    `tokenizer` if given, else the GGUF's; a random model's is SmolLM2's, or byte-level when the
    model's vocabulary is smaller than SmolLM2's (random:tiny). ValueError when the tokenizer
    has ids the model does not."""
    g = None if model.startswith("random:") else load_gguf(
        None if model == DEFAULT_MODEL else model, weights=False)
    cfg = _preset(model) if g is None else g.config
    if tokenizer:
        tok: tok_lib.Tokenizer = tok_lib.load_hf_directory(tokenizer)
    elif g is not None:
        tok = tokenizer_from_gguf(g)
    elif cfg.vocab_size < SMOLLM2_135M.vocab_size:
        tok = tok_lib.ByteTokenizer(cfg.bos_id, cfg.eos_id)
    else:
        tok = tokenizer_from_gguf(load_gguf(None, weights=False))
    check_tokenizer_fits(tok, cfg, model)
    return tok


def check_tokenizer_fits(tok: tok_lib.Tokenizer, cfg: LlamaConfig, model: str) -> None:
    """A tokenizer whose ids the model's embedding cannot take is refused (a larger model
    vocabulary is fine: vocab_limit)."""
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} token ids, more than the "
                         f"{cfg.vocab_size} of {model}'s vocabulary")


def vocab_limit(tok: tok_lib.Tokenizer, cfg: LlamaConfig) -> int | None:
    """tok.vocab_size when it is below the model's vocabulary (sampling stops there), else
    None."""
    return tok.vocab_size if tok.vocab_size < cfg.vocab_size else None


def model_context_length(model: str = DEFAULT_MODEL) -> int:
    """The context length the model was trained for (GGUF context_length)."""
    if model.startswith("random:"):
        return _preset(model).max_position
    g = load_gguf(None if model == DEFAULT_MODEL else model, weights=False)
    return g.config.max_position


def chat_template(tokenizer: tok_lib.Tokenizer) -> ChatTemplate:
    """The model's chat template (FALLBACK_CHATML when it has none)."""
    return ChatTemplate(getattr(tokenizer, "chat_template", None),
                        getattr(tokenizer, "special_tokens", None))


def _preset(model: str) -> LlamaConfig:
    preset = model.split(":", 1)[1]
    if preset not in RANDOM_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(RANDOM_PRESETS)}")
    return RANDOM_PRESETS[preset]


def greedy_generate(m: LoadedModel, prompt_ids: list[int], max_new_tokens: int,
                    bucket: int | None = None) -> list[int]:
    """Batch-1 greedy decoding with the jitted steps (no engine): for smoke tests."""
    cfg = m.config
    prefill, decode, insert = model_lib.jitted_steps(cfg)
    n = len(prompt_ids)
    t = bucket or max(16, 1 << (n - 1).bit_length())
    toks = np.zeros(t, np.int32)
    toks[:n] = prompt_ids
    logits, k, v = prefill(m.params, toks, np.int32(n))
    dtype = m.params["layers"]["wq"].dtype
    ck, cv = model_lib.init_cache(cfg, 1, t + max_new_tokens, dtype)
    ck, cv = insert(ck, cv, k, v, np.int32(0))
    out = [int(np.argmax(np.asarray(logits)))]
    while len(out) < max_new_tokens and out[-1] not in m.eos_ids:
        tok = np.array([out[-1]], np.int32)
        pos = np.array([n + len(out) - 1], np.int32)
        logits, ck, cv = decode(m.params, ck, cv, tok, pos)
        out.append(int(np.argmax(np.asarray(logits)[0])))
    return out
