"""The per-request output processor (serving/output.py): stop tokens, stop strings with
hold-back, detokenization, logprobs, finish; on the byte tokenizer of random models and the
SmolLM2 GGUF tokenizer."""

from __future__ import annotations

import pytest
from _serving import require_smollm2

from flexnpu.serving.output import Delta, IdsOutput, StopStrings, TextOutput, TokenLogprobs
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.tokenizer import ByteTokenizer

EOS = 257


def _run_text(text_ids: list[int], sp: SamplingParams, tok=None, eos=(EOS,)):
    tok = tok or ByteTokenizer()
    deltas: list[Delta] = []
    out = TextOutput(tok, sp, eos, [1, 2, 3], deltas.append)
    stopped_at = None
    for i, t in enumerate(text_ids):
        if out.on_token(t, None, 0.0) is not None:
            stopped_at = i
            break
    out.on_finish("stop" if stopped_at is not None else "length", 0.0)
    return out, deltas, stopped_at


def _ids(s: str) -> list[int]:
    return list(s.encode())


def test_ids_output_eos_stop_ids_and_ignore_eos() -> None:
    sp = SamplingParams(max_tokens=10)
    sp.stop_token_ids = [7]
    out = IdsOutput(sp, [EOS])
    assert [out.on_token(t, None, 0.0) for t in (5, 6, 7)] == [None, None, "stop"]
    out.on_finish("stop", 0.0)
    out.on_finish("abort", 0.0)  # only the first finish counts
    assert out.ids == [5, 6] and out.num_tokens == 3 and out.finish_reason == "stop"
    assert out.done.is_set()

    eos_out = IdsOutput(SamplingParams(), [EOS, 300])
    assert eos_out.on_token(300, None, 0.0) == "stop" and eos_out.ids == []

    ignoring = IdsOutput(SamplingParams(ignore_eos=True), [EOS])
    assert ignoring.on_token(EOS, None, 0.0) is None and ignoring.ids == [EOS]


def test_ids_output_collects_logprobs_of_shown_tokens() -> None:
    out = IdsOutput(SamplingParams(), [EOS])
    out.on_token(4, TokenLogprobs(-0.5, [(4, -0.5), (9, -1.5)]), 0.0)
    out.on_token(EOS, TokenLogprobs(-0.1, [(EOS, -0.1)]), 0.0)
    assert [lp.logprob for lp in out.logprobs] == [-0.5]
    assert out.logprobs[0].top == [(4, -0.5), (9, -1.5)]


def test_text_stream_joins_to_the_full_text_and_counts_tokens() -> None:
    text = "héllo 🙂 wörld"
    out, deltas, stopped = _run_text(_ids(text), SamplingParams())
    assert stopped is None
    assert "".join(d.text for d in deltas) == text
    assert all("\ufffd" not in d.text for d in deltas)  # incomplete UTF-8 is held back
    assert deltas[-1].finish_reason == "length" and deltas[-1].num_tokens == len(_ids(text))
    assert sum(len(d.token_ids) for d in deltas) == len(_ids(text))


def test_eos_is_counted_not_shown() -> None:
    out, deltas, stopped = _run_text([*_ids("ab"), EOS, *_ids("cd")], SamplingParams())
    assert stopped == 2 and out.text == "ab"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].num_tokens == 3
    assert all(EOS not in d.token_ids for d in deltas)


def test_stop_string_cuts_text_before_it() -> None:
    sp = SamplingParams(stop=["STOP"])
    out, deltas, stopped = _run_text(_ids("abc STOP def"), sp)
    assert stopped == len("abc STOP") - 1  # the token completing the stop string
    assert "".join(d.text for d in deltas) == "abc "
    assert deltas[-1].finish_reason == "stop"


def test_possible_stop_prefix_is_held_back_then_released() -> None:
    sp = SamplingParams(stop=["</end>"])
    seen: list[str] = []
    out = TextOutput(ByteTokenizer(), sp, [EOS], [], lambda d: seen.append(d.text))
    for t in _ids("x</en"):
        assert out.on_token(t, None, 0.0) is None
    assert "".join(seen) == "x"  # "</en" may start the stop string
    for t in _ids("d!"):
        out.on_token(t, None, 0.0)
    assert "".join(seen) == "x</end!"  # "</end!" is not the stop string: released at once
    out.on_finish("length", 0.0)
    assert "".join(seen) == "x</end!"


def test_held_text_is_flushed_at_a_length_finish() -> None:
    out, deltas, stopped = _run_text(_ids("ab</e"), SamplingParams(stop=["</end>"]))
    assert stopped is None
    assert [d.text for d in deltas][-1] == "</e" and out.text == "ab</e"


def test_earliest_of_several_stop_strings_wins() -> None:
    stops = StopStrings(["world", "lo w", "zzz"])
    assert stops.find("hello world", 0) == 3
    assert stops.find("abc", 0) == -1
    assert stops.safe_end("hello wor") == len("hello ")  # "wor" starts "world"
    assert stops.safe_end("hello") == len("hel")  # "lo" starts "lo w"
    out, deltas, _ = _run_text(_ids("hello world"), SamplingParams(stop=["world", "lo w"]))
    assert out.text == "hel" and "".join(d.text for d in deltas) == "hel"


def test_stop_string_spanning_tokens_with_multibyte_text() -> None:
    out, deltas, stopped = _run_text(_ids("日本語です"), SamplingParams(stop=["語で"]))
    assert stopped is not None and out.text == "日本"
    assert "".join(d.text for d in deltas) == "日本"


def test_logprobs_travel_with_their_tokens() -> None:
    deltas: list[Delta] = []
    out = TextOutput(ByteTokenizer(), SamplingParams(stop=["zz"]), [EOS], [], deltas.append)
    for i, t in enumerate(_ids("az")):
        out.on_token(t, TokenLogprobs(-float(i), [(t, -float(i))]), 0.0)
    out.on_finish("length", 0.0)
    ids = [t for d in deltas for t in d.token_ids]
    lps = [lp.logprob for d in deltas for lp in d.logprobs]
    assert ids == _ids("az") and lps == [0.0, -1.0]
    assert "".join(d.text for d in deltas) == "az"


def test_error_finish_is_delivered_once() -> None:
    deltas: list[Delta] = []
    out = TextOutput(ByteTokenizer(), SamplingParams(), [EOS], [], deltas.append)
    out.on_token(ord("a"), None, 0.0)
    out.on_finish("error: device lost", 0.0)
    out.on_finish("abort", 0.0)
    assert [d.finish_reason for d in deltas] == [None, "error: device lost"]


@pytest.fixture(scope="module")
def smol_tok():
    require_smollm2()
    from flexnpu.serving.loading import load_tokenizer

    return load_tokenizer()


def test_decode_stream_on_the_gguf_tokenizer(smol_tok) -> None:
    text = "Streaming: 日本語 and 🙂 emoji, then ASCII."
    ids = smol_tok.encode(text)
    out, deltas, stopped = _run_text(ids, SamplingParams(), smol_tok, eos=(2,))
    assert stopped is None and "".join(d.text for d in deltas) == text
    assert all("\ufffd" not in d.text for d in deltas)
    eos_out, _, at = _run_text([*ids[:3], 2, *ids[3:]], SamplingParams(), smol_tok, eos=(2,))
    assert at == 3 and eos_out.text == smol_tok.decode(ids[:3])


def test_a_stopped_request_finishes_stop_whatever_the_engine_says() -> None:
    ids_out = IdsOutput(SamplingParams(), [EOS])
    ids_out.on_token(EOS, None, 0.0)
    ids_out.on_finish("length", 0.0)  # e.g. max_tokens reached in the same step
    assert ids_out.finish_reason == "stop"
    deltas: list[Delta] = []
    out = TextOutput(ByteTokenizer(), SamplingParams(stop=["b"]), [EOS], [], deltas.append)
    out.on_token(ord("a"), None, 0.0)
    assert out.on_token(ord("b"), None, 0.0) == "stop"
    out.on_finish("length", 0.0)
    assert deltas[-1].finish_reason == "stop" and out.text == "a"
    failed = IdsOutput(SamplingParams(), [EOS])
    failed.on_token(EOS, None, 0.0)
    failed.on_finish("error: device lost", 0.0)
    assert failed.finish_reason == "error: device lost"


def test_skip_special_tokens_false_shows_the_byte_tokenizers_special_tokens() -> None:
    tok = ByteTokenizer()
    ids = [*_ids("hi"), tok.eos_id, *_ids("é"), tok.bos_id]
    sp = SamplingParams(ignore_eos=True)
    assert _run_text(ids, sp)[0].text == "hié"
    sp.skip_special_tokens = False
    assert _run_text(ids, sp)[0].text == "hi<|im_end|>é<|im_start|>"
    assert tok.decode(ids, skip_special_tokens=False) == "hi<|im_end|>é<|im_start|>"
    assert tok.decode(ids) == "hié"


def test_skip_special_tokens_false_shows_smollm2s_special_tokens(smol_tok) -> None:
    tok = smol_tok
    ids = [*tok.encode("Hello"), 0, *tok.encode(" world")]
    sp = SamplingParams(ignore_eos=True)
    assert _run_text(ids, sp, tok, eos=())[0].text == "Hello world"
    sp.skip_special_tokens = False
    assert _run_text(ids, sp, tok, eos=())[0].text == "Hello<|endoftext|> world"
