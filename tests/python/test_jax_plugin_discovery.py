"""flexnpu/jax_plugin.py: a JAX process whose jax_platforms leaves flexnpu out does not load
FlexNPU (nor, through it, the physical backend); flexnpu stays a known platform, and one that
asks for it loads it as before."""

from __future__ import annotations

from _subprocess import run_python

_PROBE = r"""
import jax
{configure}
jax.devices()
from jax._src import xla_bridge
maps = open("/proc/self/maps").read()
print("RESULT", "pjrt_plugin_flexnpu" in maps, "xla_cpu_pjrt.so" in maps,
      "flexnpu" in xla_bridge._backend_factories, jax.default_backend())
"""


def _probe(env: dict[str, str], configure: str = "") -> str:
    proc = run_python(_PROBE.replace("{configure}", configure), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    return lines[0]


def test_platforms_without_flexnpu_do_not_load_it() -> None:
    assert _probe({"JAX_PLATFORMS": "cpu"}) == "RESULT False False True cpu"
    # Set in code before the first backend is made: the same.
    assert _probe({}, 'jax.config.update("jax_platforms", "cpu")') == \
        "RESULT False False True cpu"


def test_platforms_with_flexnpu_load_it() -> None:
    assert _probe({"JAX_PLATFORMS": "flexnpu"}) == "RESULT True True True flexnpu"
    assert _probe({"JAX_PLATFORMS": "cpu,flexnpu"}) == "RESULT True True True cpu"
