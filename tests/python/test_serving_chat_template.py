"""Chat prompts from the GGUF's own template: SmolLM2's renders to the expected ChatML text, the
rendering matches Hugging Face's apply_chat_template (transformers, loading the directory that
`export-tokenizer` writes) on several templates, the sandbox refuses unsafe templates and
raise_exception reaches the client as a 400; the export round trip keeps tokens, template and
special tokens."""

from __future__ import annotations

import json
import os

import pytest
from _serving import require, require_smollm2

from flexnpu.serving.chat_template import ChatTemplate, ChatTemplateError

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye 🙂 ü"}],
    [{"role": "user", "content": [{"type": "text", "text": "two "},
                                  {"type": "text", "text": "parts"}]}],
]
# Templates exercising what HF's environment provides: trim/lstrip blocks, loop controls,
# tojson (non-ASCII kept), bos/eos variables, raise_exception, {% generation %}, namespace.
TEMPLATES = {
    "llama3": (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
        "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"),
    "blocks": (
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "    {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "    {% set ns.n = ns.n + 1 %}\n"
        "    [{{ ns.n }}] {{ m.role }}: {{ m.content | tojson }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}{% generation %}assistant:{% endgeneration %}{% endif %}"
        "{{ eos_token }}"),
}


@pytest.fixture(scope="module")
def smol():
    require_smollm2()
    from flexnpu.serving.loading import chat_template, load_tokenizer

    tok = load_tokenizer()
    return tok, chat_template(tok)


def test_smollm2_template_from_the_gguf(smol) -> None:
    tok, t = smol
    assert not t.is_fallback and t.source == tok.chat_template
    assert t.render(CONVERSATIONS[0]) == (
        f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    own = t.render(CONVERSATIONS[1], add_generation_prompt=False)
    assert own == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n"
                   "<|im_start|>user\nBye 🙂 ü<|im_end|>\n")
    ids = tok.encode(t.render(CONVERSATIONS[0]))
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert tok.eos_ids == (2,)


def test_unsafe_templates_and_raise_exception() -> None:
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{% for m in messages %}{{ messages.append(m) }}{% endfor %}").render(
            [{"role": "user", "content": "x"}])
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations "
                     "must start with the user') }}{% endif %}ok")
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="must start with the user"):
        t.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="not valid jinja"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="'image_url' is not supported"):
        t.render([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])


def test_template_error_is_a_400_naming_it() -> None:
    require("fastapi", "httpx")
    from _serving import FakeEngine  # the request fails before it reaches an engine
    from fastapi.testclient import TestClient

    from flexnpu.serving.server import ServerState, create_app
    from flexnpu.serving.tokenizer import ByteTokenizer

    t = ChatTemplate("{{ raise_exception('only one message, please') if messages | length > 1 }}")
    app = create_app(ServerState(FakeEngine(), ByteTokenizer(), "m", chat_template=t))
    r = TestClient(app).post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["message"] == "only one message, please" and err["param"] == "messages"


@pytest.fixture(scope="module")
def exported(smol, tmp_path_factory):
    from flexnpu.__main__ import main

    out = tmp_path_factory.mktemp("smol_tokenizer")
    assert main(["export-tokenizer", str(out)]) == 0
    return out


def test_export_tokenizer_files(smol, exported) -> None:
    require("tokenizers")
    from tokenizers import Tokenizer

    tok, t = smol
    assert sorted(os.listdir(exported)) == ["generation_config.json", "special_tokens_map.json",
                                            "tokenizer.json", "tokenizer_config.json"]
    again = Tokenizer.from_file(str(exported / "tokenizer.json"))
    for conv in CONVERSATIONS:
        text = t.render(conv)
        assert again.encode(text, add_special_tokens=False).ids == tok.encode(text)
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tok.chat_template
    assert config["eos_token"] == "<|im_end|>" and config["bos_token"] == "<|im_start|>"
    assert config["model_max_length"] == 8192
    assert config["added_tokens_decoder"]["2"]["content"] == "<|im_end|>"
    special = json.loads((exported / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>"
    assert json.loads((exported / "generation_config.json").read_text())["eos_token_id"] == 2


@pytest.fixture(scope="module")
def hf(exported):
    require("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(exported))


def test_transformers_loads_the_export_and_counts_the_same(smol, hf) -> None:
    tok, t = smol
    assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == 2
    for text in ("The capital of France is Paris.", "Unicode: héllo wörld, 日本語, 🙂!",
                 "code: def f(x):\n    return x ** 2  # 12345"):
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
        assert hf.decode(tok.encode(text)) == text


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("name", ["gguf", *TEMPLATES])
def test_rendering_matches_hugging_face(smol, hf, name, conv) -> None:
    tok, gguf_template = smol
    ours = gguf_template if name == "gguf" else ChatTemplate(TEMPLATES[name],
                                                             tok.special_tokens)
    messages = CONVERSATIONS[conv]
    hf_messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                    "".join(p["text"] for p in m["content"])} for m in messages]
    for add in (True, False):
        want = hf.apply_chat_template(hf_messages, chat_template=ours.source, tokenize=False,
                                      add_generation_prompt=add)
        assert ours.render(messages, add_generation_prompt=add) == want
