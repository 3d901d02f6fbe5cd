"""`python -m flexnpu serve` end to end in a subprocess (the random tiny model on one virtual
device, to compile little): it answers the openai client, /health is ok, and its first screen
carries no backend `E0000 ... Unsupported fusion type` lines; and `python -m flexnpu
export-tokenizer` for the same model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from _serving import require


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_subcommand_answers_and_is_quiet(tmp_path) -> None:
    require("fastapi", "uvicorn", "openai", "httpx")
    import httpx
    import openai

    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FLEXNPU_") and k != "TF_CPP_MIN_LOG_LEVEL"}
    env["JAX_PLATFORMS"] = "flexnpu"
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexnpu", "serve", "--model", "random:tiny", "--port",
             str(port), "--max-model-len", "128", "--max-num-seqs", "2",
             "--max-num-batched-tokens", "32", "--chunk-buckets", "32", "--devices", "1"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 500  # compiling on a loaded 2-core machine
        while time.time() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("server did not come up:\n" + log.read_text())
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        r = client.completions.create(model="random:tiny", prompt="hi", max_tokens=4,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 4
        chat = client.chat.completions.create(model="random:tiny", max_tokens=3,
                                              messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.role == "assistant"
    finally:
        proc.terminate()
        proc.wait(30)
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
