"""KerasHub's LLM generation (keras_hub.models.LlamaCausalLM.generate: a jitted generate loop
with a KV cache and a greedy sampler), unchanged, on whatever JAX backend the environment
selects: a tiny random Llama made on the spot (2 layers, random weights from a fixed seed; no
hub), token ids in and out (no tokenizer: KerasHub's tokenizers need TensorFlow), on one
device or, with --data-parallel, batch-split over every device JAX offers
(keras.distribution.DataParallel). Prints one JSON line: backend, devices, start-up,
tokens/s (the fastest of --repeats calls) and the generated ids (docs/own-serving-stack.md
compares them).

Run it with keras-hub and keras installed, KERAS_BACKEND=jax:
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python examples/third_party/keras_hub_generate.py
    KERAS_BACKEND=jax FLEXNPU_PLATFORM_NAME=cpu python examples/third_party/keras_hub_generate.py
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

BATCH = 4
PROMPT_LEN = 8
VOCAB = 512


def make_model(seed: int) -> Any:
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_query_heads=4,
        hidden_dim=128,
        intermediate_dim=256,
        num_key_value_heads=2,
        dtype="float32",
    )
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="greedy")
    return model


def prompts(max_length: int) -> dict[str, np.ndarray]:
    """BATCH prompts of PROMPT_LEN ids from a fixed seed, padded to max_length."""
    rng = np.random.default_rng(1)
    token_ids = np.zeros((BATCH, max_length), np.int32)
    token_ids[:, :PROMPT_LEN] = rng.integers(3, VOCAB, size=(BATCH, PROMPT_LEN))
    padding_mask = np.zeros((BATCH, max_length), bool)
    padding_mask[:, :PROMPT_LEN] = True
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def run(max_new_tokens: int, data_parallel: bool, repeats: int) -> dict[str, Any]:
    import jax
    import keras

    started = time.perf_counter()
    devices = jax.devices()
    if data_parallel:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    model = make_model(seed=0)
    inputs = prompts(PROMPT_LEN + max_new_tokens)
    model.generate(inputs, stop_token_ids=None)  # compiles what the timed call needs
    startup_s = time.perf_counter() - started
    elapsed = float("inf")
    for _ in range(repeats):  # steady state: the fastest of a few calls
        t0 = time.perf_counter()
        out = model.generate(inputs, stop_token_ids=None)
        elapsed = min(elapsed, time.perf_counter() - t0)
    ids = np.asarray(out["token_ids"])[:, PROMPT_LEN:].tolist()
    return {
        "jax": jax.__version__,
        "keras": keras.__version__,
        "default_backend": jax.default_backend(),
        "platform_version": devices[0].client.platform_version,
        "num_devices": len(devices),
        "data_parallel": data_parallel,
        "startup_s": round(startup_s, 2),
        "tokens_per_s": round(BATCH * max_new_tokens / elapsed, 1),
        "generate_ms": round(elapsed * 1000, 1),
        "output_ids": ids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--data-parallel", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("RESULT " + json.dumps(run(args.max_new_tokens, args.data_parallel, args.repeats)))


if __name__ == "__main__":
    main()
