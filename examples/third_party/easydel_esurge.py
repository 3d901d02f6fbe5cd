"""EasyDeL's eSurge engine, unchanged, on whatever JAX backend the environment selects: a tiny
random LLaMA made on the spot (config, a byte-level BPE tokenizer trained in-process, random
weights from a fixed seed; no hub), greedy generation of a few prompts; prints one JSON line
with the backend, the devices' memory stats, the KV cache eSurge sized from them, start-up
time, tokens/s and the output token ids (docs/own-serving-stack.md compares them).

Run it in a venv with `easydel==0.3.0` (and flexnpu installed for the FlexNPU runs):
    python examples/third_party/easydel_esurge.py --tokenizer-dir /tmp/tiny-tok
    FLEXNPU_PLATFORM_NAME=cpu FLEXNPU_POLICY=dynamic \
        python examples/third_party/easydel_esurge.py --tokenizer-dir /tmp/tiny-tok
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "The quick brown fox",
    "Virtual devices share one accelerator",
    "Prefill is compute bound and decode",
    "Serving stacks run unchanged",
]
CORPUS = [p + " jumps over the lazy dog while the scheduler places work." for p in PROMPTS] * 8


def make_tokenizer(directory: Path) -> None:
    """A byte-level BPE tokenizer trained in-process on a few sentences (no hub)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    ).save_pretrained(directory)


def make_model(seed: int = 0) -> Any:
    """A 2-layer LLaMA (hidden 256, 4 heads of 128; EasyDeL's XLA attention needs heads of 128)
    with random float32 weights from a fixed seed, sharded over every device JAX offers.
    EasyDeL's own loader (AutoEasyDeLModelForCausalLM.from_pretrained of config + safetensors)
    imports transformers' PyTorch models, so without torch the model is built directly."""
    import easydel as ed
    import jax.numpy as jnp
    from flax import nnx

    config = ed.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,  # divisible by 4 devices' tensor-parallel axis
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        sharding_axis_dims=(1, 1, 1, -1, 1),
        attn_mechanism="ragged_page_attention_v3",  # eSurge's paged attention on cpu
    )
    return ed.LlamaForCausalLM.sequential_init(
        config=config, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(seed)
    )


def run(tokenizer_dir: Path, max_tokens: int, hbm_utilization: float) -> dict[str, Any]:
    import easydel as ed
    import jax
    import jax.numpy as jnp

    started = time.perf_counter()
    devices = jax.devices()
    stats = [d.memory_stats() or {} for d in devices]
    model = make_model()
    engine = ed.eSurge(
        model=model,
        tokenizer=str(tokenizer_dir),
        dtype=jnp.float32,
        max_model_len=256,
        max_num_seqs=4,
        hbm_utilization=hbm_utilization,
        page_size=16,
        silent_mode=True,
    )
    params = ed.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    engine.generate(PROMPTS[:1], params)  # compiles what the timed run needs
    startup_s = time.perf_counter() - started
    t0 = time.perf_counter()
    outputs = engine.generate(PROMPTS, params)
    elapsed = time.perf_counter() - t0
    ids = [list(map(int, o.outputs[0].token_ids)) for o in outputs]
    cache = getattr(getattr(engine, "runner", None), "metadata", None)
    kv = {
        name: int(getattr(cache, name))
        for name in ("num_pages", "page_size")
        if cache is not None and getattr(cache, name, None) is not None
    }
    if hasattr(engine, "terminate"):
        engine.terminate()
    return {
        "jax": jax.__version__,
        "default_backend": jax.default_backend(),
        "platform_version": devices[0].client.platform_version,
        "num_devices": len(devices),
        "device_kind": devices[0].device_kind,
        "bytes_limit_sum": sum(int(s.get("bytes_limit", 0)) for s in stats),
        "kv_cache": kv,
        "startup_s": round(startup_s, 2),
        "tokens_per_s": round(sum(len(i) for i in ids) / elapsed, 2),
        "output_ids": ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--hbm-utilization", type=float, default=0.05)
    args = parser.parse_args()
    if not (args.tokenizer_dir / "tokenizer.json").exists():
        make_tokenizer(args.tokenizer_dir)
    print("RESULT " + json.dumps(run(args.tokenizer_dir, args.max_tokens, args.hbm_utilization)))


if __name__ == "__main__":
    main()
