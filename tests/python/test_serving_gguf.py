"""GGUF loading beyond SmolLM2, on small synthetic files written with gguf's GGUFWriter (read
back through the same loader): RoPE scaling (llama3 rope_freqs, linear) applied by the model's
rope(), unsupported scalings / tokenizers / architectures refused by name, end-of-generation ids
(eos, eot, the template's end-of-turn token), the chat template or its fallback."""

from __future__ import annotations

import numpy as np
import pytest
from _serving import require

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 32, 4, 2, 8, 64
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)


def _vocab() -> tuple[list[str], list[int], list[str]]:
    from flexnpu.serving.tokenizer import _bytes_to_unicode

    byte_chars = list(_bytes_to_unicode().values())
    tokens = [*byte_chars, "he", "ll", *SPECIALS]
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    return tokens, types, ["h e", "l l"]


def write_gguf(path, *, arch: str = "llama", rope_freqs=None, scaling: str | None = None,
               factor: float = 1.0, template: str | None = LLAMA3_TEMPLATE,
               tokenizer_model: str = "gpt2", pre: str = "llama-bpe", eot: bool = True) -> str:
    require("gguf", "tokenizers")
    import gguf

    tokens, types, merges = _vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    if scaling is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling))
        w.add_rope_scaling_factor(factor)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    w.add_eos_token_id(tokens.index("<|end_of_text|>"))
    if eot:
        w.add_eot_token_id(tokens.index("<|eot_id|>"))
    if template is not None:
        w.add_chat_template(template)
    rng = np.random.default_rng(0)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    t("token_embd.weight", len(tokens), HIDDEN)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(HIDDEN, np.float32))
    t("blk.0.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
    t("blk.0.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
    t("blk.0.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
    t("blk.0.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
    t("blk.0.ffn_gate.weight", FFN, HIDDEN)
    t("blk.0.ffn_up.weight", FFN, HIDDEN)
    t("blk.0.ffn_down.weight", HIDDEN, FFN)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _base_inv(d: int = HEAD_DIM, theta: float = 500000.0) -> np.ndarray:
    return theta ** (-np.arange(0, d, 2) / d)


def test_llama3_rope_freqs_divide_the_frequencies(tmp_path) -> None:
    from flexnpu.serving.config import rope_inv_freq
    from flexnpu.serving.gguf_loader import load_gguf

    factors = [1.0, 1.0, 4.0, 8.0]
    g = load_gguf(write_gguf(tmp_path / "m.gguf", rope_freqs=factors))
    assert g.config.rope_scaling == "llama3" and g.config.rope_freq_factors == tuple(factors)
    assert "rope_freqs.weight" not in g.weights and "blk.0.attn_q.weight" in g.weights
    np.testing.assert_allclose(rope_inv_freq(g.config), _base_inv() / np.array(factors),
                               rtol=1e-6)


def test_linear_rope_scaling(tmp_path) -> None:
    from flexnpu.serving.config import rope_inv_freq
    from flexnpu.serving.gguf_loader import load_gguf

    g = load_gguf(write_gguf(tmp_path / "m.gguf", scaling="linear", factor=4.0), weights=False)
    assert g.config.rope_scaling == "linear" and g.config.rope_scaling_factor == 4.0
    np.testing.assert_allclose(rope_inv_freq(g.config), _base_inv() / 4.0, rtol=1e-6)
    plain = load_gguf(write_gguf(tmp_path / "p.gguf", scaling="linear", factor=1.0),
                      weights=False)
    assert plain.config.rope_scaling == "none"


@pytest.mark.parametrize("scaling", ["yarn", "longrope"])
def test_unsupported_rope_scaling_is_refused_by_name(tmp_path, scaling) -> None:
    from flexnpu.serving.gguf_loader import load_gguf

    path = write_gguf(tmp_path / "m.gguf", scaling=scaling, factor=4.0)
    with pytest.raises(ValueError, match=f"RoPE scaling '{scaling}'.*not supported"):
        load_gguf(path)


def test_model_rope_uses_the_scaled_frequencies(tmp_path) -> None:
    import jax.numpy as jnp

    from flexnpu.serving import model
    from flexnpu.serving.gguf_loader import load_gguf

    factors = [1.0, 2.0, 4.0, 8.0]
    cfg = load_gguf(write_gguf(tmp_path / "m.gguf", rope_freqs=factors), weights=False).config
    x = np.random.default_rng(1).standard_normal((3, HEADS, HEAD_DIM)).astype(np.float32)
    pos = np.array([0, 7, 3000], np.int32)
    got = np.asarray(model.rope(jnp.asarray(x), jnp.asarray(pos), cfg))
    ang = pos[:, None, None] * (_base_inv() / np.array(factors))[None, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    want = np.stack([x0 * np.cos(ang) - x1 * np.sin(ang), x0 * np.sin(ang) + x1 * np.cos(ang)],
                    axis=-1).reshape(x.shape)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_end_of_generation_ids_and_chat_template(tmp_path) -> None:
    from flexnpu.serving.loading import chat_template, load_model

    tokens, _, _ = _vocab()
    m = load_model(write_gguf(tmp_path / "m.gguf"), log=lambda *_: None)
    eos, eot = tokens.index("<|end_of_text|>"), tokens.index("<|eot_id|>")
    assert m.eos_ids == (eos, eot) and m.config.eos_id == eos
    tok = m.tokenizer
    assert tok.encode("<|eot_id|>") == [eot]
    assert tok.encode("hello") == [tokens.index("he"), tokens.index("ll"), ord("o") - 33]
    text = chat_template(tok).render([{"role": "user", "content": " Hi \n"}])
    assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # Without eot_token_id in the metadata, the template's end-of-turn token is still a stop.
    m2 = load_model(write_gguf(tmp_path / "n.gguf", eot=False), log=lambda *_: None)
    assert m2.eos_ids == (eos, eot)


def test_no_chat_template_falls_back_to_plain_chatml(tmp_path) -> None:
    from flexnpu.serving.loading import chat_template, load_model

    logged: list[str] = []
    m = load_model(write_gguf(tmp_path / "m.gguf", template=None), log=logged.append)
    assert any("no tokenizer.chat_template" in line for line in logged)
    t = chat_template(m.tokenizer)
    assert t.is_fallback
    assert t.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("kwargs,match", [
    ({"tokenizer_model": "llama"}, "tokenizer model 'llama' is not supported"),
    ({"pre": "qwen2"}, "pre-tokenizer 'qwen2' is not supported"),
    ({"arch": "qwen2"}, "architecture 'qwen2', only 'llama'"),
])
def test_unsupported_models_are_refused_by_name(tmp_path, kwargs, match) -> None:
    from flexnpu.serving.loading import load_model, load_tokenizer

    path = write_gguf(tmp_path / "m.gguf", **kwargs)
    with pytest.raises(ValueError, match=match):
        load_model(path, log=lambda *_: None)
    with pytest.raises(ValueError, match=match):
        load_tokenizer(path)


def test_llama3_pre_tokenizer_splits_like_the_llama3_regex() -> None:
    require("tokenizers")
    from flexnpu.serving.tokenizer import _bytes_to_unicode, from_gguf

    tok = from_gguf(list(_bytes_to_unicode().values()), [1] * 256, [], 0, 1, "llama-bpe")
    pieces = tok.hf_tokenizer().pre_tokenizer.pre_tokenize_str("1234567 don't  Hello\n\nworld!!")
    # Digits in groups of three, contractions apart, "\n\n" one piece (GPT-2's regex differs
    # on the first and the last).
    assert [p for p, _ in pieces] == ["123", "456", "7", "Ġdon", "'t", "Ġ", "ĠHello", "ĊĊ",
                                      "world", "!!"]


def test_smollm2_gguf_metadata() -> None:
    from _serving import require_smollm2

    require_smollm2()
    from flexnpu.serving.gguf_loader import load_gguf

    g = load_gguf(weights=False)
    assert g.weights == {} and g.config.num_layers == 30
    assert g.config.rope_scaling == "none" and g.config.rope_freq_factors is None
    assert g.eos_ids == (2,) and g.tokens[2] == "<|im_end|>"
    assert g.chat_template.startswith("{% for message in messages %}")
    assert g.metadata["bos_token"] == "<|im_start|>" and g.metadata["tokenizer_model"] == "gpt2"
