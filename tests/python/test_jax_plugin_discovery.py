"""flexnpu/jax_plugin.py: a JAX process whose jax_platforms leaves flexnpu out does not load
FlexNPU (nor, through it, the physical backend); flexnpu stays a known platform, and one that
asks for it loads it as before. Installing FlexNPU leaves JAX's default backend alone: flexnpu is
the default only when JAX_PLATFORMS names it or FLEXNPU_DEFAULT=1."""

from __future__ import annotations

import json

import pytest
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
    assert _probe({}, 'jax.config.update("jax_platforms", "cpu")') == "RESULT False False True cpu"


def test_platforms_with_flexnpu_load_it() -> None:
    assert _probe({"JAX_PLATFORMS": "flexnpu"}) == "RESULT True True True flexnpu"
    assert _probe({"JAX_PLATFORMS": "cpu,flexnpu"}) == "RESULT True True True cpu"


# JAX's default backend, and flexnpu reached by name: a computation on its first device compared
# with numpy; an error creating it is reported, not raised.
_DEFAULT_PROBE = r"""
import json
import jax, jax.numpy as jnp, numpy as np
from jax._src import xla_bridge
out = {"default": jax.default_backend(), "backends": sorted(xla_bridge.backends())}
try:
    npu = jax.devices("flexnpu")
    x = jax.device_put(np.arange(6, dtype=np.float32), npu[0])
    y = jax.jit(lambda v: jnp.cumsum(v * 3.0))(x)
    out["flexnpu"] = {"n": len(npu), "platform": y.devices().pop().platform,
                      "right": np.allclose(np.asarray(y), np.cumsum(np.arange(6) * 3.0))}
except RuntimeError as e:
    out["flexnpu_error"] = str(e)
print("RESULT " + json.dumps(out))
"""


def _default_probe(env: dict[str, str]) -> tuple[dict, str]:
    proc = run_python(_DEFAULT_PROBE, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0][len("RESULT ") :]), proc.stderr


_REACHED = {"n": 4, "platform": "flexnpu", "right": True}


def test_installed_flexnpu_is_not_the_default_but_reachable_by_name() -> None:
    out, stderr = _default_probe({})
    assert out == {"default": "cpu", "backends": ["cpu", "flexnpu"], "flexnpu": _REACHED}
    assert "experimental" not in stderr, stderr


@pytest.mark.parametrize(
    "env", [{"JAX_PLATFORMS": "flexnpu"}, {"FLEXNPU_DEFAULT": "1"}, {"FLEXNPU_DEFAULT": " Yes "}]
)
def test_flexnpu_is_the_default_when_asked_for(env: dict[str, str]) -> None:
    out, stderr = _default_probe(env)
    # With JAX_PLATFORMS=flexnpu, FlexNPU adds jaxlib's cpu for host callbacks.
    assert out == {"default": "flexnpu", "backends": ["cpu", "flexnpu"], "flexnpu": _REACHED}
    # FlexNPU registers as a non-experimental platform: no warning when it is asked for.
    assert "experimental" not in stderr, stderr


def test_flexnpu_default_off_values_keep_cpu() -> None:
    out, _ = _default_probe({"FLEXNPU_DEFAULT": "off"})
    assert out["default"] == "cpu" and out["flexnpu"] == _REACHED


def test_bad_flexnpu_default_is_an_error_naming_it() -> None:
    proc = run_python("import jax; jax.devices()", {"FLEXNPU_DEFAULT": "maybe"})
    assert proc.returncode != 0
    assert (
        "Unable to initialize backend 'flexnpu': FLEXNPU_DEFAULT='maybe': expected 1, true, yes "
        "or on (flexnpu becomes JAX's default backend) or 0, false, no, off or unset"
    ) in proc.stderr, proc.stderr[-3000:]


def test_bad_configuration_of_an_unrequested_flexnpu_leaves_jax_working() -> None:
    out, _ = _default_probe({"FLEXNPU_POLICY": "bogus"})
    assert out["default"] == "cpu" and out["backends"] == ["cpu"]
    assert out["flexnpu_error"].startswith("Backend 'flexnpu' failed to initialize: ")
    assert "unknown placement policy 'bogus'" in out["flexnpu_error"]
