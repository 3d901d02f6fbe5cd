"""The GGUF tokenizer rebuilt with `tokenizers`: special tokens, round trips, ChatML, streaming
detokenization; and the byte-level tokenizer of random models."""

from __future__ import annotations

import pytest
from _serving import require_smollm2


@pytest.fixture(scope="module")
def tok():
    require_smollm2()
    import gguf

    from flexnpu.serving.gguf_loader import default_gguf_path
    from flexnpu.serving.tokenizer import from_gguf

    r = gguf.GGUFReader(default_gguf_path())

    def f(k):
        return r.fields[k].contents()

    return from_gguf(f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type"),
                     f("tokenizer.ggml.merges"), 1, 2, f("tokenizer.ggml.pre"))


TEXTS = [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Unicode: héllo wörld, 日本語, emoji 🙂!",
    "code: def f(x):\n    return x ** 2  # 12345",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_control_tokens_are_single_tokens(tok) -> None:
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[-1] == 2
    assert tok.decode([1, *tok.encode("hi"), 2]) == "hi"  # specials skipped on output


def test_digits_split_individually(tok) -> None:
    assert len(tok.encode("12345")) == 5


def test_chatml_prompt(tok) -> None:
    from flexnpu.serving.tokenizer import chatml_prompt

    p = chatml_prompt([{"role": "user", "content": "Hi"}])
    assert p.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert p.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(p)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    own = chatml_prompt([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    assert own.count("<|im_start|>system") == 1 and "SmolLM" not in own


def test_incremental_detokenizer_streams_the_same_text(tok) -> None:
    from flexnpu.serving.tokenizer import IncrementalDetokenizer

    text = "Streaming: 日本語 and 🙂 emoji, then ASCII."
    ids = tok.encode(text)
    det = IncrementalDetokenizer(tok, tok.encode("prompt"))
    pieces = [det.add(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_tokenizer_json_round_trip(tok) -> None:
    from flexnpu.serving.tokenizer import tokenizer_from_json

    again = tokenizer_from_json(tok.to_json())
    assert again.encode(TEXTS[2]) == tok.encode(TEXTS[2]) and again.eos_id == 2


def test_byte_tokenizer() -> None:
    from flexnpu.serving.tokenizer import ByteTokenizer, tokenizer_from_json

    b = ByteTokenizer(256, 257)
    assert b.decode(b.encode("héllo")) == "héllo"
    assert b.encode("a<|im_end|>b") == [97, 257, 98]
    assert tokenizer_from_json(b.to_json()).encode("x") == [120]


def test_token_text_and_bytes_for_logprobs(tok) -> None:
    text = "世界 🙂<|im_end|> hi"
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()  # partial UTF-8 kept
    assert tok.token_text(2) == "<|im_end|>" and tok.token_bytes(2) == b"<|im_end|>"
    assert tok.token_text(tok.encode(" hi")[0]) == " hi"


def test_decode_stream_skips_special_tokens(tok) -> None:
    ids = tok.encode("<|im_start|>assistant\nHello 🙂<|im_end|>")
    stream = tok.decode_stream(tok.encode("prompt"))
    assert "".join(stream.step(i) for i in ids) == "assistant\nHello 🙂"


def test_logprob_token_strings_spell_partial_characters_as_bytes(tok) -> None:
    from _serving import require

    require("fastapi")
    from flexnpu.serving.openai_protocol import token_str as _token_str

    assert [_token_str(tok, i) for i in tok.encode("世 hi")] == [
        "bytes:\\xe4\\xb8", "bytes:\\x96", " hi"]
