"""The JAX Llama model on real SmolLM2-135M-Instruct weights (GGUF, all 30 layers) against an
independent NumPy reference, and a greedy chat smoke test."""

from __future__ import annotations

import numpy as np
import pytest
from _serving import require_smollm2

# Stated tolerance: max |logit difference| (float32 JAX vs float64 NumPy); logits are ~±30.
LOGIT_ATOL = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    require_smollm2()
    from flexnpu.serving.gguf_loader import load_gguf
    from flexnpu.serving.loading import LoadedModel
    from flexnpu.serving.model import params_from_gguf
    from flexnpu.serving.tokenizer import CHATML_SYSTEM, from_gguf

    g = load_gguf()
    tok = from_gguf(g.tokens, g.token_types, g.merges, g.config.bos_id, g.config.eos_id,
                    g.metadata["pre"])
    m = LoadedModel("smollm2", g.config, params_from_gguf(g.weights, g.config), tok,
                    CHATML_SYSTEM)
    return g, m


def _chat_ids(m, question: str) -> list[int]:
    from flexnpu.serving.tokenizer import chatml_prompt

    return m.tokenizer.encode(chatml_prompt([{"role": "user", "content": question}]))


def test_config_from_gguf(smollm2) -> None:
    g, _ = smollm2
    c = g.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (
        30, 576, 9, 3, 64)
    assert c.tie_embeddings and c.eos_id == 2 and c.rope_theta == 1e5
    assert c.num_params() == pytest.approx(134.5e6, rel=0.01)


def test_prefill_and_decode_match_numpy_reference(smollm2) -> None:
    import jax

    from flexnpu.serving import model as model_lib
    from flexnpu.serving import reference

    g, m = smollm2
    cfg = m.config
    ids = _chat_ids(m, "Name three colours.")
    n, steps, slot = len(ids), 4, 1
    prefill, decode, insert = model_lib.jitted_steps(cfg)
    toks = np.zeros(64, np.int32)
    toks[:n] = ids
    logits, k, v = prefill(m.params, toks, np.int32(n))
    ck, cv = model_lib.init_cache(cfg, 2, 96)
    ck, cv = insert(ck, cv, k, v, np.int32(slot))
    got = [np.asarray(logits)]
    out = [int(np.argmax(got[0]))]
    for i in range(steps):
        tok = np.array([0, out[-1]], np.int32)
        pos = np.array([0, n + i], np.int32)
        logits, ck, cv = decode(m.params, ck, cv, tok, pos)
        got.append(np.asarray(logits)[slot])
        out.append(int(np.argmax(got[-1])))
    assert jax.devices()[0].platform == "flexnpu"
    ref = reference.forward(g.weights, cfg, ids + out[:steps])
    diffs = [float(np.abs(ref[n - 1 + j] - got[j]).max()) for j in range(steps + 1)]
    print("max |logit diff| prefill, decode steps:", diffs)
    assert max(diffs) < LOGIT_ATOL
    assert [int(np.argmax(ref[n - 1 + j])) for j in range(steps + 1)] == out


def test_greedy_chat_knows_the_capital_of_france(smollm2) -> None:
    from flexnpu.serving.loading import greedy_generate

    _, m = smollm2
    out = greedy_generate(m, _chat_ids(m, "What is the capital of France?"), 24)
    text = m.tokenizer.decode(out)
    print(repr(text))
    assert "Paris" in text
    assert out[-1] == m.config.eos_id
