"""`python -m flexnpu serve` end to end in a subprocess (the random tiny model on one virtual
device, to compile little): it answers the openai client, /health is ok, and its first screen
carries no backend `E0000 ... Unsupported fusion type` lines; and `python -m flexnpu
export-tokenizer` for the same model."""

from __future__ import annotations

import pytest
from _serving import require, serve_subprocess


def test_serve_subcommand_answers_and_is_quiet(tmp_path) -> None:
    require("fastapi", "uvicorn", "openai", "httpx")
    import openai

    log = tmp_path / "serve.log"
    args = ["--model", "random:tiny", "--max-model-len", "128", "--max-num-seqs", "2",
            "--max-num-batched-tokens", "32", "--chunk-buckets", "32", "--devices", "1"]
    with serve_subprocess(args, log) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="random:tiny", prompt="hi", max_tokens=4,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 4
        chat = client.chat.completions.create(model="random:tiny", max_tokens=3,
                                              messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.role == "assistant"
    text = log.read_text()
    assert "serving random:tiny on" in text
    assert "E0000" not in text and "Unsupported fusion" not in text, text


def test_export_tokenizer_of_a_random_model(tmp_path) -> None:
    require("tokenizers")
    from tokenizers import Tokenizer

    from flexnpu.__main__ import main
    from flexnpu.serving.tokenizer import ByteTokenizer

    assert main(["export-tokenizer", str(tmp_path), "--model", "random:tiny"]) == 0
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = ByteTokenizer()
    for text in ("héllo 🙂", "<|im_start|>user\nhi<|im_end|>\n"):
        assert tok.encode(text, add_special_tokens=False).ids == ours.encode(text)
    import json

    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["model_max_length"] == 2048
    assert "<|im_start|>" in config["chat_template"]
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        main(["export-tokenizer", str(tmp_path), "--model", "random:nope"])
