"""Chat prompts from the model's own chat template (the GGUF's `tokenizer.chat_template`),
rendered like Hugging Face's `apply_chat_template`: jinja2's ImmutableSandboxedEnvironment with
trim_blocks / lstrip_blocks and loop controls, `raise_exception`, a `tojson` filter that keeps
non-ASCII text, `strftime_now`, the `{% generation %}` tag, and the variables `messages`,
`add_generation_prompt`, `tools`, `documents` plus the special tokens (`bos_token`,
`eos_token`, ...).

A model without a template (random:<preset>, a GGUF lacking the key) is served with
FALLBACK_CHATML: ChatML with no default system prompt.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

FALLBACK_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (the template raised, or it is not valid jinja)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (assistant masks in HF): renders the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_render_body")
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _render_body(self, caller) -> str:
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template is not valid jinja: {e}") from None


def message_text(content: Any) -> str:
    """OpenAI message content (a string, null, or a list of text parts) as one string."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type", "text") != "text" or not isinstance(
                    part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatTemplateError(f"content part of type {kind!r} is not supported "
                                        "(only text parts)")
            texts.append(part["text"])
        return "".join(texts)
    raise ChatTemplateError("message content must be a string or a list of text parts")


class ChatTemplate:
    def __init__(self, source: str | None, special_tokens: dict[str, str | None] | None = None
                 ) -> None:
        self.is_fallback = not source
        self.source = source or FALLBACK_CHATML
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._template = _compile(self.source)

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list[dict] | None = None, documents: list[dict] | None = None,
               **kwargs: Any) -> str:
        """The prompt text (tokenize it without adding special tokens: the template places
        bos itself when the model wants it)."""
        import jinja2

        msgs = [{**m, "content": message_text(m.get("content"))} for m in messages]
        variables = {**self.special_tokens, **kwargs}
        try:
            return self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt,
                                         tools=tools, documents=documents, **variables)
        except ChatTemplateError:
            raise
        except jinja2.exceptions.SecurityError as e:
            raise ChatTemplateError(f"the chat template did something unsafe: {e}") from None
        except (jinja2.TemplateError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"the chat template failed on these messages: {e}") from None
