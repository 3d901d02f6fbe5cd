"""Tokenizers: the GGUF byte-level BPE rebuilt with `tokenizers` (control tokens registered as
special tokens), a byte-level fallback for random models, ChatML prompts (the fallback template)
and incremental detokenization for streaming (`decode_stream`)."""

from __future__ import annotations

import codecs
import functools
import json
import re
from typing import Protocol

CHATML_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class TextStream(Protocol):
    def step(self, token_id: int) -> str:
        """The text this token completes ('' while a character is incomplete)."""
        ...


class Tokenizer(Protocol):
    eos_id: int
    bos_id: int

    @property
    def vocab_size(self) -> int:
        """1 + the largest id it knows (ids beyond cannot be decoded)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def decode_stream(self, prompt_ids: list[int], skip_special_tokens: bool = True) -> TextStream:
        """Text as tokens arrive; special tokens are left out unless `skip_special_tokens` is
        False (vLLM's request field of that name)."""
        ...

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (logprobs)."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """One token's raw bytes (logprobs' `bytes`: part of a UTF-8 character, possibly)."""
        ...

    def to_json(self) -> str: ...


def chatml_prompt(messages: list[dict], default_system: str | None = CHATML_SYSTEM) -> str:
    """The ChatML template of SmolLM2's GGUF metadata, with the generation prompt."""
    parts = []
    if default_system and (not messages or messages[0].get("role") != "system"):
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{_content_text(m.get('content'))}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise TypeError("message content must be a string or a list of text parts")


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer`, with what serving needs of the model besides it: every
    end-of-generation id, the chat template and the special tokens' text."""

    def __init__(self, tok, bos_id: int, eos_id: int, eos_ids: tuple[int, ...] = (),
                 chat_template: str | None = None,
                 special_tokens: dict[str, str | None] | None = None) -> None:
        self._tok = tok
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = tuple(dict.fromkeys((eos_id, *eos_ids)))
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})

    @functools.cached_property
    def vocab_size(self) -> int:
        return max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_stream(self, prompt_ids: list[int], skip_special_tokens: bool = True) -> TextStream:
        try:
            return _HFStream(self._tok, prompt_ids, skip_special_tokens)
        except ImportError:  # a `tokenizers` without DecodeStream (< 0.21)
            return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if token_id in self._tok.get_added_tokens_decoder():
            return piece.encode("utf-8")
        table = _unicode_to_bytes()  # byte-level BPE pieces spell bytes with GPT-2's table
        return bytes(table[ch] for ch in piece if ch in table)

    def hf_tokenizer(self):
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tok

    def to_json(self) -> str:
        return json.dumps(
            {"kind": "hf", "bos_id": self.bos_id, "eos_id": self.eos_id,
             "eos_ids": list(self.eos_ids), "chat_template": self.chat_template,
             "special_tokens": self.special_tokens,
             "tokenizer": json.loads(self._tok.to_str())}
        )


# Control tokens that end a turn in common chat templates (llama.cpp's end-of-generation list):
# one of them that the chat template uses is a stop token besides eos / eot / eom.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                      "<|endoftext|>", "<|end_of_text|>", "<EOT>", "</s>", "<|END_OF_TURN_TOKEN|>")


def end_of_turn_ids(control_tokens: dict[int, str], chat_template: str | None) -> list[int]:
    """The ids of the control tokens (id -> text) that end a turn (END_OF_TURN_TOKENS) and that
    `chat_template` uses."""
    if not chat_template:
        return []
    return [i for i, t in sorted(control_tokens.items())
            if t in END_OF_TURN_TOKENS and t in chat_template]


def load_hf_directory(path: str) -> HFTokenizer:
    """A Hugging Face tokenizer directory, as `save_hf_directory` (and transformers) write one:
    tokenizer.json; tokenizer_config.json for the chat template (or chat_template.jinja) and
    the special tokens; generation_config.json for the eos ids, if there. Every id that ends
    generation: eos, generation_config's eos_token_id(s) and the template's end-of-turn token.
    Errors name the file and what is missing."""
    import os

    from tokenizers import Tokenizer as HFTok

    def read_json(name: str) -> dict:
        f = os.path.join(path, name)
        if not os.path.isfile(f):
            return {}
        with open(f, encoding="utf-8") as fh:
            d = json.load(fh)
        if not isinstance(d, dict):
            raise ValueError(f"{f}: expected a JSON object")
        return d

    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    tokenizer_json = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tokenizer_json):
        raise FileNotFoundError(f"{path}: no tokenizer.json (a Hugging Face tokenizer "
                                "directory holds one)")
    tok = HFTok.from_file(tokenizer_json)
    config, generation = read_json("tokenizer_config.json"), read_json("generation_config.json")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja = os.path.join(path, "chat_template.jinja")
    if template is None and os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as fh:
            template = fh.read()
    special = {k: _token_content(config.get(k))
               for k in ("bos_token", "eos_token", "unk_token", "pad_token")}

    def config_ids(key: str) -> list[int]:
        v = generation.get(key)
        return [int(i) for i in (v if isinstance(v, list) else [v]) if isinstance(i, int)]

    eos = [i for i in [_id_of(tok, special["eos_token"]), *config_ids("eos_token_id")]
           if i is not None]
    if not eos:
        raise ValueError(f"{path}: no eos token (tokenizer_config.json eos_token or "
                         "generation_config.json eos_token_id)")
    control = {i: t.content for i, t in tok.get_added_tokens_decoder().items() if t.special}
    eos_ids = (*eos, *end_of_turn_ids(control, template))
    # Some tokenizers have no bos (Qwen2's is null): then eos stands in, as those models do.
    bos = _id_of(tok, special["bos_token"])
    bos = bos if bos is not None else next(iter(config_ids("bos_token_id")), eos[0])
    return HFTokenizer(tok, bos, eos[0], eos_ids, template, special)


def _token_content(v) -> str | None:
    """A special token of tokenizer_config.json: its text, or an AddedToken object's content."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _id_of(tok, text: str | None) -> int | None:
    return None if text is None else tok.token_to_id(text)


# Pre-tokenizer regexes of llama.cpp's `tokenizer.ggml.pre` values (as in the models' own
# tokenizer.json files); the GPT-2 one is ByteLevel's built-in.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_PRE = ("default", "gpt2", "gpt-2")
_DIGITS_PRE = ("smollm", "starcoder", "refact")
_LLAMA3_PRE = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")
SUPPORTED_PRE = (*_GPT2_PRE, *_DIGITS_PRE, *_LLAMA3_PRE)


def from_gguf(tokens: list[str], token_types: list[int], merges: list[str], bos_id: int,
              eos_id: int, pre: str | None = None, eos_ids: tuple[int, ...] = (),
              chat_template: str | None = None,
              special_tokens: dict[str, str | None] | None = None) -> HFTokenizer:
    """GPT-2-style byte-level BPE from GGUF vocabulary and merges. Control tokens (type 3) are
    registered as special tokens so `<|im_start|>` stays one token."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre = pre or "default"
    if pre in _DIGITS_PRE:
        # llama.cpp's pre-tokenizer for these: every digit split off, then the GPT-2 regex.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre in _LLAMA3_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pre in _GPT2_PRE:
        tok.pre_tokenizer = byte_level
    else:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_PRE)})")
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(token_types) if t == 3]
    tok.add_special_tokens(special)
    return HFTokenizer(tok, bos_id, eos_id, eos_ids, chat_template, special_tokens)


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then bos/eos: for random-initialized models."""

    SPECIAL = ("<|im_start|>", "<|im_end|>")

    def __init__(self, bos_id: int = 256, eos_id: int = 257) -> None:
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = (eos_id,)
        self.chat_template: str | None = None  # served with the ChatML fallback
        self.special_tokens: dict[str, str | None] = {"bos_token": self.SPECIAL[0],
                                                      "eos_token": self.SPECIAL[1]}

    @property
    def vocab_size(self) -> int:
        return max(256, self.bos_id, self.eos_id) + 1

    def encode(self, text: str) -> list[int]:
        # <|im_start|> / <|im_end|> map to bos / eos so ChatML prompts work on random models.
        ids: list[int] = []
        special = {self.SPECIAL[0]: self.bos_id, self.SPECIAL[1]: self.eos_id}
        for part in re.split("(" + "|".join(map(re.escape, self.SPECIAL)) + ")", text):
            if part in special:
                ids.append(special[part])
            else:
                ids.extend(part.encode("utf-8"))
        return ids

    def hf_tokenizer(self):
        """The same tokenizer as a `tokenizers.Tokenizer` (byte-level, no merges)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        vocab.update({self.SPECIAL[0]: self.bos_id, self.SPECIAL[1]: self.eos_id})
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in self.SPECIAL])
        return tok

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        stream = _ByteStream(self if not skip_special_tokens else None)
        return "".join(stream.step(i) for i in ids) + stream.flush()

    def decode_stream(self, prompt_ids: list[int], skip_special_tokens: bool = True) -> TextStream:
        return _ByteStream(self if not skip_special_tokens else None)

    def token_text(self, token_id: int) -> str:
        """ASCII as itself, other bytes as <0xNN> (as SentencePiece byte tokens), so distinct
        tokens have distinct texts in logprobs."""
        if token_id == self.eos_id:
            return self.SPECIAL[1]
        if token_id == self.bos_id:
            return self.SPECIAL[0]
        if 0 <= token_id < 128:
            return chr(token_id)
        if 128 <= token_id < 256:
            return f"<0x{token_id:02X}>"
        return f"<|token_{token_id}|>"

    def token_bytes(self, token_id: int) -> bytes:
        if 0 <= token_id < 256:
            return bytes([token_id])
        return self.token_text(token_id).encode() if token_id in (self.bos_id, self.eos_id) \
            else b""

    def to_json(self) -> str:
        return json.dumps({"kind": "bytes", "bos_id": self.bos_id, "eos_id": self.eos_id})


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what ByteLevel pre-tokenizes bytes into)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
          *range(ord("\u00ae"), ord("\u00ff") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


@functools.cache
def _unicode_to_bytes() -> dict[str, int]:
    return {ch: b for b, ch in _bytes_to_unicode().items()}


def tokenizer_from_json(text: str) -> Tokenizer:
    d = json.loads(text)
    if d["kind"] == "bytes":
        return ByteTokenizer(d["bos_id"], d["eos_id"])
    from tokenizers import Tokenizer as HFTok

    return HFTokenizer(HFTok.from_str(json.dumps(d["tokenizer"])), d["bos_id"], d["eos_id"],
                       tuple(d.get("eos_ids", ())), d.get("chat_template"),
                       d.get("special_tokens"))


class _HFStream:
    """`tokenizers`' DecodeStream (Rust): holds back incomplete UTF-8, skips special tokens;
    primed with the prompt's last tokens so the first piece decodes in context."""

    def __init__(self, tok, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        self._tok = tok
        self._stream = DecodeStream(ids=list(prompt_ids[-4:]),
                                    skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._tok, token_id) or ""


class _ByteStream:
    """Bytes as UTF-8 text; the special ids as their names when `shown` is the tokenizer."""

    def __init__(self, shown: ByteTokenizer | None = None) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._special = {shown.bos_id: shown.SPECIAL[0], shown.eos_id: shown.SPECIAL[1]} \
            if shown is not None else {}

    def step(self, token_id: int) -> str:
        if 0 <= token_id < 256:
            return self._utf8.decode(bytes([token_id]))
        special = self._special.get(token_id)
        return self.flush() + special if special is not None else ""

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class IncrementalDetokenizer:
    """Streams text as tokens arrive; holds back bytes of an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-4:]) if prompt_ids else []
        self.prefix = len(self.ids)
        self.read = len(self.ids)

    def step(self, token_id: int) -> str:
        return self.add(token_id)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self.tok.decode(self.ids[self.prefix:self.read], self.skip_special_tokens)
        new_text = self.tok.decode(self.ids[self.prefix:], self.skip_special_tokens)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text):]
        return ""


def save_hf_directory(tokenizer: Tokenizer, out_dir: str, model_max_length: int) -> list[str]:
    """Writes `tokenizer` as a Hugging Face tokenizer directory (tokenizer.json,
    tokenizer_config.json with the chat template and special tokens, special_tokens_map.json,
    generation_config.json with every eos id) that `transformers.AutoTokenizer` loads offline,
    so third-party clients count tokens as the server does. Returns the files written."""
    import os

    from flexnpu.serving.chat_template import FALLBACK_CHATML

    hf = tokenizer.hf_tokenizer()  # type: ignore[attr-defined]
    special = {k: v for k, v in getattr(tokenizer, "special_tokens", {}).items() if v}
    added = {str(i): {
        "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
        "normalized": t.normalized, "single_word": t.single_word, "special": t.special}
        for i, t in hf.get_added_tokens_decoder().items()}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": getattr(tokenizer, "chat_template", None) or FALLBACK_CHATML,
        "added_tokens_decoder": added,
        **special,
    }
    eos_ids = list(getattr(tokenizer, "eos_ids", (tokenizer.eos_id,)))
    files = {
        "tokenizer.json": hf.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False),
        "generation_config.json": json.dumps(
            {"bos_token_id": tokenizer.bos_id,
             "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}, indent=2),
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, text in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.write(text)
    return sorted(files)
