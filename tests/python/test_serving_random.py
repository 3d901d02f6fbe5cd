"""Random-weight models (`serve --model random:<preset>`): the published shapes (shared with the
simulator), Qwen2's QKV bias against the NumPy reference, weights and KV caches made by the device
(nothing of their size crosses from the host), any Hugging Face tokenizer directory, sampling kept
to the tokenizer's ids; and vLLM's `ignore_eos` / `min_tokens` over the real server: a 5-token
tokenizer makes its eos likely, so each field visibly changes how long the output is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _serving import require, require_smollm2, serve_subprocess

# ---- shapes ------------------------------------------------------------------------------------


def test_presets_have_the_published_shapes_and_the_simulator_uses_them() -> None:
    from flexnpu.serving.config import RANDOM_PRESETS
    from flexnpu.sim.models import get_model

    q, ll = RANDOM_PRESETS["qwen2.5-7b"], RANDOM_PRESETS["llama-3-8b"]
    assert (
        q.num_layers,
        q.hidden_size,
        q.num_heads,
        q.num_kv_heads,
        q.head_dim,
        q.intermediate_size,
        q.vocab_size,
        q.rope_theta,
        q.attention_bias,
        q.tie_embeddings,
    ) == (28, 3584, 28, 4, 128, 18944, 152064, 1e6, True, False)
    assert (
        ll.num_layers,
        ll.hidden_size,
        ll.num_heads,
        ll.num_kv_heads,
        ll.head_dim,
        ll.intermediate_size,
        ll.vocab_size,
        ll.rope_theta,
        ll.attention_bias,
        ll.tie_embeddings,
    ) == (32, 4096, 32, 8, 128, 14336, 128256, 5e5, False, False)
    assert q.num_params() == pytest.approx(7.616e9, rel=1e-3)  # Qwen2.5-7B: 7.61B
    assert ll.num_params() == pytest.approx(8.030e9, rel=1e-3)  # Llama-3-8B: 8.03B
    for name, cfg in (("qwen2.5-7b", q), ("llama-3-8b", ll)):
        sim = get_model(name)
        assert (
            sim.num_layers,
            sim.d_model,
            sim.ffn,
            sim.vocab,
            sim.num_kv_heads,
            sim.qkv_bias,
        ) == (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.num_kv_heads,
            cfg.attention_bias,
        )


# ---- Qwen2's QKV bias --------------------------------------------------------------------------


def _gguf_weights(cfg, rng) -> dict[str, np.ndarray]:
    """GGUF-named float32 weights (out, in) of `cfg`, biases large enough to matter."""
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d

    def normal(*shape: int, std: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {
        "token_embd.weight": normal(cfg.vocab_size, h, std=1.0),
        "output_norm.weight": 1 + normal(h),
        "output.weight": normal(cfg.vocab_size, h),
    }
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        w |= {
            p + "attn_norm.weight": 1 + normal(h),
            p + "ffn_norm.weight": 1 + normal(h),
            p + "attn_q.weight": normal(q, h),
            p + "attn_k.weight": normal(kv, h),
            p + "attn_v.weight": normal(kv, h),
            p + "attn_output.weight": normal(h, q),
            p + "ffn_gate.weight": normal(f, h),
            p + "ffn_up.weight": normal(f, h),
            p + "ffn_down.weight": normal(h, f),
            p + "attn_q.bias": normal(q, std=1.0),
            p + "attn_k.bias": normal(kv, std=1.0),
            p + "attn_v.bias": normal(kv, std=1.0),
        }
    return w


def test_qkv_bias_prefill_and_decode_match_the_numpy_reference(npu_devices) -> None:
    import dataclasses

    from flexnpu.serving import model as model_lib
    from flexnpu.serving import reference
    from flexnpu.serving.config import RANDOM_PRESETS

    cfg = dataclasses.replace(RANDOM_PRESETS["tiny-qwen2.5"], vocab_size=300)
    assert cfg.attention_bias
    weights = _gguf_weights(cfg, np.random.default_rng(0))
    params = model_lib.params_from_gguf(weights, cfg, device=npu_devices[0])
    assert params["layers"]["bq"].shape == (cfg.num_layers, cfg.num_heads * cfg.head_dim)
    ids = [5, 17, 200, 3, 99, 42, 7]
    n = len(ids)
    prefill, decode, insert = model_lib.jitted_steps(cfg)
    toks = np.zeros(16, np.int32)
    toks[: n - 2] = ids[: n - 2]
    logits, k, v = prefill(params, toks, np.int32(n - 2))
    got = [np.asarray(logits)]
    ck, cv = model_lib.init_cache(cfg, 1, 32, device=npu_devices[0])
    ck, cv = insert(ck, cv, k, v, np.int32(0))
    for pos in (n - 2, n - 1):  # two decode steps on the known ids
        logits, ck, cv = decode(
            params, ck, cv, np.array([ids[pos]], np.int32), np.array([pos], np.int32)
        )
        got.append(np.asarray(logits)[0])
    ref = reference.forward(weights, cfg, ids)
    for j, g in enumerate(got):
        assert np.abs(ref[n - 3 + j] - g).max() < 1e-3, j
    # The biases matter here: the reference without them is far from the model.
    unbiased = {k: (np.zeros_like(a) if k.endswith(".bias") else a) for k, a in weights.items()}
    assert np.abs(reference.forward(unbiased, cfg, ids)[n - 3] - got[0]).max() > 0.1


# ---- weights and caches made by the device -----------------------------------------------------


def test_random_weights_and_caches_are_made_on_the_device(npu_devices, monkeypatch) -> None:
    import jax
    import jax.numpy as jnp

    from flexnpu.serving import kvcache
    from flexnpu.serving import model as model_lib
    from flexnpu.serving.config import RANDOM_PRESETS

    cfg = RANDOM_PRESETS["tiny-qwen2.5"]
    dev = npu_devices[1]
    sent: list[int] = []
    real_put = jax.device_put

    def counting_put(x, *args, **kwargs):
        sent.extend(
            int(a.nbytes)
            for a in jax.tree_util.tree_leaves(x)
            if isinstance(a, np.ndarray | np.generic)
        )
        return real_put(x, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counting_put)
    with jax.transfer_guard("disallow"):  # no implicit host -> device copy either
        params = model_lib.random_params(cfg, 7, jnp.bfloat16, device=dev)
        ck, cv = kvcache.init_paged_cache(cfg, 8, 16, jnp.bfloat16, dev)
    assert sum(sent) <= 8, sent  # the seed's two words, nothing else
    leaves = jax.tree_util.tree_leaves_with_path(params)
    assert {k for k, _ in jax.tree_util.tree_leaves_with_path(model_lib.param_shapes(cfg))} == {
        k for k, _ in leaves
    }
    for path, x in [*leaves, ("ck", ck), ("cv", cv)]:
        assert isinstance(x, jax.Array) and x.devices() == {dev}, path
    monkeypatch.undo()
    assert params["embed"].dtype == jnp.bfloat16 and params["norm"].dtype == jnp.float32
    assert params["embed"].shape == (152064, 32) and params["lm_head"].shape == (32, 152064)
    embed = np.asarray(params["embed"], np.float32)
    assert embed.std() == pytest.approx(0.02, rel=0.02) and abs(embed.mean()) < 1e-3
    assert np.all(np.asarray(params["layers"]["attn_norm"]) == 1)
    assert not np.asarray(ck).any()
    again = model_lib.random_params(cfg, 7, jnp.float32, device=dev)
    # a seed's weights in every dtype, up to bfloat16's rounding
    assert np.allclose(np.asarray(again["embed"]), embed, rtol=2**-8, atol=1e-7)
    other = model_lib.random_params(cfg, 8, jnp.bfloat16, device=dev)
    assert not np.array_equal(np.asarray(other["lm_head"]), np.asarray(params["lm_head"]))


# ---- tokenizers ---------------------------------------------------------------------------------

SMALL_VOCAB = {"a": 0, "b": 1, "c": 2, "</s>": 3, "<unk>": 4}
SMALL_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def small_tokenizer_dir(tmp_path_factory) -> str:
    """A 5-token word-level Hugging Face tokenizer directory with eos `</s>` (id 3)."""
    require("tokenizers")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(SMALL_VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken("</s>", special=True, normalized=False)])
    d = tmp_path_factory.mktemp("small_tokenizer")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": {"content": "</s>", "special": True},
                "unk_token": "<unk>",
                "chat_template": SMALL_TEMPLATE,
            }
        )
    )
    return str(d)


def test_hugging_face_tokenizer_directory(small_tokenizer_dir, tmp_path) -> None:
    from flexnpu.serving.tokenizer import load_hf_directory

    tok = load_hf_directory(small_tokenizer_dir)
    assert tok.encode("a c zz") == [0, 2, 4] and tok.vocab_size == 5
    assert tok.eos_id == 3 and tok.eos_ids == (3,) and tok.chat_template == SMALL_TEMPLATE
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hf_directory(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_hf_directory(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text(
        (Path(small_tokenizer_dir) / "tokenizer.json").read_text()
    )
    with pytest.raises(ValueError, match="no eos token"):
        load_hf_directory(str(tmp_path))


def test_exported_smollm2_tokenizer_loads_back_the_same(tmp_path) -> None:
    require_smollm2()
    from flexnpu.serving.loading import load_tokenizer
    from flexnpu.serving.tokenizer import load_hf_directory, save_hf_directory

    ours = load_tokenizer("random:qwen2.5-7b")  # a random model's default: SmolLM2's
    assert ours.vocab_size == 49152
    save_hf_directory(ours, str(tmp_path), 8192)
    back = load_hf_directory(str(tmp_path))
    text = "<|im_start|>user\nHello, wörld 12345!<|im_end|>\n"
    assert back.encode(text) == ours.encode(text)
    assert (back.vocab_size, back.eos_ids, back.bos_id, back.chat_template) == (
        ours.vocab_size,
        ours.eos_ids,
        ours.bos_id,
        ours.chat_template,
    )


def test_tokenizer_must_fit_the_model_vocabulary(small_tokenizer_dir, tmp_path) -> None:
    require_smollm2()
    from flexnpu.serving.loading import load_tokenizer
    from flexnpu.serving.tokenizer import ByteTokenizer, save_hf_directory

    assert isinstance(load_tokenizer("random:tiny"), ByteTokenizer)  # 512 ids: bytes
    smollm2 = load_tokenizer("random:tiny-qwen2.5")
    save_hf_directory(smollm2, str(tmp_path), 2048)
    with pytest.raises(ValueError, match="49152 token ids, more than the 512 of random:tiny"):
        load_tokenizer("random:tiny", str(tmp_path))
    assert load_tokenizer("random:tiny", small_tokenizer_dir).vocab_size == 5


def test_mask_logits_drops_ids_beyond_the_vocabulary_and_suppressed_ones() -> None:
    import jax
    import jax.numpy as jnp

    from flexnpu.serving.sampling import mask_logits

    logits = jnp.zeros((2, 8))
    suppress = jnp.array([[1, 6, 8, 8], [8, 8, 8, 8]], jnp.int32)  # 8: padding
    out = np.asarray(jax.jit(mask_logits, static_argnums=2)(logits, suppress, 5))
    assert np.isneginf(out).tolist() == [
        [False, True, False, False, False, True, True, True],
        [False, False, False, False, False, True, True, True],
    ]


def test_random_model_samples_only_ids_its_tokenizer_has(npu_devices) -> None:
    require_smollm2()
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model
    from flexnpu.serving.runner import ModelSteps
    from flexnpu.serving.sampling import SamplingParams

    m = load_model("random:tiny-qwen2.5", "bfloat16", seed=2, log=lambda *_: None)
    assert m.config.vocab_size == 152064 and m.vocab_limit == 49152
    ec = EngineConfig(
        max_num_seqs=2,
        max_model_len=128,
        max_num_batched_tokens=32,
        chunk_buckets=[32],
        num_devices=1,
    )
    eng = Engine(
        ModelSteps(m.config, ec.block_size, m.vocab_limit),
        m.params,
        ec,
        devices=npu_devices[:1],
        eos_ids=m.eos_ids,
    )
    eng.start()
    try:
        prompt = m.tokenizer.encode("Hello there")
        ids, reason = eng.generate(
            prompt, SamplingParams(max_tokens=64, temperature=1.0, seed=1, ignore_eos=True)
        )
        # Unrestricted, 64 draws would land beyond 49152 (two thirds of the ids) many times.
        assert reason == "length" and len(ids) == 64 and max(ids) < 49152
        assert isinstance(m.tokenizer.decode(ids), str)
        # min_tokens: a stop id is not even sampled before that many tokens.
        greedy = SamplingParams(max_tokens=6, temperature=0.0)
        first = eng.generate(prompt, greedy)[0][0]
        kept = SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=[first], min_tokens=4)
        ids, _ = eng.generate(prompt, kept)
        assert len(ids) >= 4 and first not in ids[:4]
    finally:
        eng.stop()


# ---- ignore_eos and min_tokens over the real server ---------------------------------------------


@pytest.fixture(scope="module")
def server(small_tokenizer_dir, tmp_path_factory):
    """`python -m flexnpu serve --model random:tiny-qwen2.5 --tokenizer <5 tokens>`: sampling
    keeps to the 5 ids, so eos comes about every fifth token at temperature 1."""
    require("fastapi", "uvicorn", "openai", "httpx")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    args = [
        "--model",
        "random:tiny-qwen2.5",
        "--tokenizer",
        small_tokenizer_dir,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "128",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "32",
        "--chunk-buckets",
        "32",
        "--devices",
        "1",
    ]
    with serve_subprocess(args, log) as base:
        yield base


def _post(base: str, path: str, body: dict):
    import httpx

    return httpx.post(base + path, json={"model": "random:tiny-qwen2.5", **body}, timeout=120)


SAMPLED = {"prompt": "a b c", "max_tokens": 64, "temperature": 1.0, "seed": 0, "logprobs": 0}


def test_eos_ends_requests_early_without_the_fields(server) -> None:
    r = _post(server, "/v1/completions", SAMPLED).json()
    assert r["choices"][0]["finish_reason"] == "stop"  # the precondition of the tests below
    assert r["usage"]["completion_tokens"] < 20
    assert set(r["choices"][0]["logprobs"]["tokens"]) <= {"a", "b", "c", "<unk>"}


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_ignore_eos_generates_max_tokens(server, path) -> None:
    body = dict(SAMPLED, ignore_eos=True)
    if path.endswith("chat/completions"):
        body = {k: v for k, v in body.items() if k not in ("prompt", "logprobs")}
        body["messages"] = [{"role": "user", "content": "a b"}]
    r = _post(server, path, body).json()
    assert r["usage"]["completion_tokens"] == 64 and r["choices"][0]["finish_reason"] == "length"
    stream = _post(server, path, dict(body, stream=True, stream_options={"include_usage": True}))
    events = [json.loads(e[6:]) for e in stream.text.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["usage"]["completion_tokens"] == 64
    assert [c["finish_reason"] for e in events for c in e["choices"]][-1] == "length"


def test_skip_special_tokens_false_puts_special_tokens_in_the_text(server) -> None:
    body = dict(SAMPLED, ignore_eos=True)
    shown = _post(server, "/v1/completions", dict(body, skip_special_tokens=False)).json()
    hidden = _post(server, "/v1/completions", body).json()
    tokens = shown["choices"][0]["logprobs"]["tokens"]
    assert tokens == hidden["choices"][0]["logprobs"]["tokens"]  # the same seed, the same draws
    assert "</s>" in tokens  # eos comes about every fifth token
    assert shown["choices"][0]["text"].count("</s>") == tokens.count("</s>")
    assert "</s>" not in hidden["choices"][0]["text"]
    bad = _post(server, "/v1/completions", dict(body, skip_special_tokens="no"))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "skip_special_tokens"


def test_min_tokens_keeps_eos_and_stops_away_until_then(server) -> None:
    r = _post(server, "/v1/completions", dict(SAMPLED, min_tokens=40, stop=["b"])).json()
    tokens = r["choices"][0]["logprobs"]["tokens"]
    assert r["usage"]["completion_tokens"] >= 40 and len(tokens) >= 40
    assert "</s>" not in tokens  # never sampled: the step suppressed it
    assert "b" in tokens[:39]  # the stop string did not apply before min_tokens
    # min_tokens = max_tokens: a fixed output length, eos kept (as benchmark clients ask)
    for path, extra in (
        ("/v1/completions", {"prompt": "a"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "c"}]}),
    ):
        r = _post(
            server, path, dict(extra, max_tokens=48, min_tokens=48, temperature=1.0, seed=3)
        ).json()
        assert r["usage"]["completion_tokens"] == 48, r
        assert r["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"min_tokens": -1}, "min_tokens", "'min_tokens' must be an integer >= 0"),
        ({"min_tokens": "4"}, "min_tokens", "'min_tokens' must be an integer >= 0"),
        ({"min_tokens": 2.5}, "min_tokens", "'min_tokens' must be an integer >= 0"),
        ({"min_tokens": True}, "min_tokens", "'min_tokens' must be an integer >= 0"),
        (
            {"min_tokens": 9, "max_tokens": 8},
            "min_tokens",
            r"'min_tokens' \(9\) must not exceed max_tokens \(8\)",
        ),
        (
            {"min_tokens": 17},
            "min_tokens",
            r"'min_tokens' \(17\) must not exceed the default max_tokens \(16\)",
        ),
        (
            {"min_tokens": 1, "stop_token_ids": list(range(20))},
            "min_tokens",
            "min_tokens with 20 stop token ids .* at most 16",
        ),
        ({"ignore_eos": "yes"}, "ignore_eos", "'ignore_eos' must be a boolean"),
        ({"ignore_eos": 1}, "ignore_eos", "'ignore_eos' must be a boolean"),
    ],
)
def test_bad_fields_get_an_openai_400_naming_them(server, body, param, message) -> None:
    import re

    r = _post(server, "/v1/completions", {"prompt": "a", **body})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and err["code"] == 400, err
    assert err["type"] == "invalid_request_error" and re.search(message, err["message"]), err


def test_min_tokens_beyond_the_context_left_is_refused(server) -> None:
    r = _post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}], "min_tokens": 128},
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "min_tokens"
    assert (
        "the 127 tokens left for the completion (128 of context, 1 in the prompt)" in err["message"]
    ), err
