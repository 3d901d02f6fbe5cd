"""Runs Python code in a fresh interpreter: JAX configures its backends once per process, so
each FlexNPU configuration (device counts, backends, bad options) gets its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (JAX backends are configured once per process)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    full_env.pop("JAX_PLATFORMS", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parent,
    )
