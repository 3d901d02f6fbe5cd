"""The JAX Llama model on real SmolLM2-135M-Instruct weights (GGUF, all 30 layers) against an
independent NumPy reference, a greedy chat smoke test, and the serving engine (paged KV, chunked
prefill, on-device sampling): a 1,500-token prompt at max_model_len 2048 against the reference,
and golden greedy token ids of a hand-checked set of chat prompts."""

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


@pytest.fixture(scope="module")
def smollm2_engine(smollm2):
    """The engine on one virtual NPU with a 2048-token context, prompts chunked by 512."""
    import jax

    from flexnpu.serving.engine import Engine, EngineConfig

    g, m = smollm2
    ec = EngineConfig(max_num_seqs=4, max_model_len=2048, max_num_batched_tokens=512,
                      chunk_buckets=[64, 512], decode_widths=[16], num_devices=1)
    eng = Engine(None, m.params, ec, devices=jax.devices("flexnpu")[:1], model_config=m.config,
                 eos_ids=m.tokenizer.eos_ids)
    eng.warmup()
    eng.start()
    yield eng
    eng.stop()


def test_served_1500_token_prompt_matches_numpy_reference(smollm2, smollm2_engine) -> None:
    from flexnpu.serving import reference
    from flexnpu.serving.output import IdsOutput
    from flexnpu.serving.sampling import SamplingParams

    g, m = smollm2
    ids = np.random.default_rng(3).integers(100, 49000, 1500).tolist()
    sp = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=5)
    out = IdsOutput(sp, ())
    smollm2_engine.submit(ids, sp, out)
    assert out.done.wait(600) and out.finish_reason == "length"
    ref = reference.forward(g.weights, m.config, ids + out.ids[:2])  # [1502, V] float64
    ref_lp = ref - ref.max(-1, keepdims=True)
    ref_lp -= np.log(np.exp(ref_lp).sum(-1, keepdims=True))
    for j, (tok, lp) in enumerate(zip(out.ids, out.logprobs, strict=True)):
        row = ref_lp[1499 + j]
        assert tok == int(np.argmax(row))
        assert lp.logprob == pytest.approx(row[tok], abs=2 * LOGIT_ATOL)
        top = np.argsort(-row)[:5]
        assert [t for t, _ in lp.top] == top.tolist()
        assert np.allclose([p for _, p in lp.top], row[top], atol=2 * LOGIT_ATOL)


# Greedy SmolLM2-135M-Instruct (Q4_1 GGUF, float32) answers, read and checked by hand: the text is
# fluent and on topic (the sum is wrong; a 135M model's answer, pinned as it is).
GOLDEN = {
    "What is the capital of France?": (
        "stop", [504, 3575, 282, 4649, 314, 7042, 30], "The capital of France is Paris."),
    "Name three primary colours.": (
        "length", [33, 30, 3950, 731, 378, 768, 1273, 3003, 7302, 28, 527, 314, 260, 8964, 282,
                   260, 1296, 3003, 14797, 42, 2382, 365, 66, 643],
        "1. Red - The most common primary colour, which is the union of the three primary "
        "colours: red (R),"),
    "Write a haiku about the sea.": (
        "stop", [504, 3426, 314, 253, 11558, 338, 9404, 260, 8664, 30],
        "The sea is a mirror that reflects the soul."),
    "What is 12 plus 7?": (
        "length", [33, 34, 1232, 216, 39, 446, 216, 40, 198, 198, 1348, 314, 253, 8170, 1183,
                   282, 253, 2232, 20270, 4953, 338, 416, 325, 4940],
        "12 + 7 = 8\n\nThis is a classic example of a simple arithmetic operation that can be "
        "performed"),
}


def test_golden_greedy_token_ids(smollm2, smollm2_engine) -> None:
    from flexnpu.serving.output import IdsOutput
    from flexnpu.serving.sampling import SamplingParams

    _, m = smollm2
    sp = SamplingParams(max_tokens=24, temperature=0)
    outs = {}
    for q in GOLDEN:  # all at once: batched together in the engine
        ids = m.tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
        outs[q] = IdsOutput(sp, smollm2_engine.eos_ids)
        smollm2_engine.submit(ids, sp, outs[q])
    for q, (reason, ids, text) in GOLDEN.items():
        assert outs[q].done.wait(300)
        assert (outs[q].finish_reason, outs[q].ids) == (reason, ids), q
        assert m.tokenizer.decode(ids) == text
