"""FlexNPU serving: a Llama-architecture LLM in JAX (real SmolLM2 weights from GGUF or random
weights of any Llama config), a continuous-batching engine over `jax.devices()`, an
OpenAI-compatible HTTP server and `jax.export` artifacts. Runs on any JAX platform."""
