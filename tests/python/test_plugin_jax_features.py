"""JAX features that depend on lowering rules and PJRT extensions, on flexnpu vs jaxlib's cpu:
linear algebra and FFT (LAPACK / DUCC custom calls), host callbacks (debug.print, pure_callback,
io_callback) and user FFI targets. Each configuration runs in a fresh interpreter (JAX sets up
its backends once per process), the cpu reference with JAX_PLATFORMS=cpu."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _subprocess import run_python

# The ops whose cpu lowering is a jaxlib LAPACK custom call, plus FFT (an HLO op); prints one
# JSON line: each op's results, or its error.
_LINALG = r"""
import json, jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
a = rng.standard_normal((6, 6))
spd = jnp.asarray(a @ a.T + 6 * np.eye(6))
b = jnp.asarray(rng.standard_normal((6, 2)))
x = jnp.asarray(a)
out, errors = {}, {}
def op(name, fn, *args):
    try:
        value = jax.jit(fn)(*args)
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}"
        return
    out[name] = [np.asarray(v).tolist() if not np.iscomplexobj(v) else
                 [np.real(v).tolist(), np.imag(v).tolist()] for v in value]
op("fft", lambda m: [jnp.fft.fft(m)], x)
op("rfft2", lambda m: [jnp.fft.rfft2(m)], x)
op("ifft", lambda m: [jnp.fft.ifft(m)], x)
op("eigh", lambda m: (lambda w, v: [w, jnp.abs(v)])(*jnp.linalg.eigh(m)), spd)
op("svd", lambda m: [jnp.linalg.svd(m, compute_uv=False)], x)
op("qr", lambda m: [jnp.abs(t) for t in jnp.linalg.qr(m)], x)
op("cholesky", lambda m: [jnp.linalg.cholesky(m)], spd)
op("solve", lambda m, r: [jnp.linalg.solve(m, r)], x, b)
op("inv", lambda m: [jnp.linalg.inv(m)], x)
op("eig", lambda m: [jnp.sort(jnp.linalg.eigvals(m))], x)
op("eig_vectors", lambda m: list(jnp.linalg.eig(m)), x)
op("eig_f32", lambda m: list(jnp.linalg.eig(m)), x.astype(jnp.float32))
op("lu", lambda m: list(jax.lax.linalg.lu(m)), x)
op("det", lambda m: [jnp.linalg.det(m)], x)
routes = {}
if jax.devices()[0].platform == "flexnpu":
    from flexnpu import lowering
    routes = {r.target: [r.route, r.handler_version, r.backend_version]
              for r in lowering.ffi_routes() if r.target.startswith("lapack_")}
print("RESULT " + json.dumps({"platform": jax.devices()[0].platform, "out": out,
                              "errors": errors, "routes": routes}))
"""

_CALLBACKS = r"""
import json, jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback
seen = []
def record(tag):
    def cb(x):
        seen.append([tag, np.asarray(x).tolist()])
        return np.asarray(x)
    return cb
@jax.jit
def f(x):
    jax.debug.print("value {x}", x=x)
    y = jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    a = io_callback(record("first"), jax.ShapeDtypeStruct(x.shape, x.dtype), y, ordered=True)
    b = io_callback(record("second"), jax.ShapeDtypeStruct(x.shape, x.dtype), a + 1, ordered=True)
    return b * 3
results = [np.asarray(f(jnp.arange(3.0) + i)).tolist() for i in range(2)]
jax.effects_barrier()
print("RESULT " + json.dumps({"platform": jax.devices()[0].platform, "results": results,
                              "seen": seen}))
"""


def _result(code: str, env: dict[str, str]) -> dict:
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    result = json.loads(lines[0][len("RESULT ") :])
    result["stdout"] = proc.stdout
    return result


_ON_FLEXNPU = {"JAX_PLATFORMS": "flexnpu"}
_ON_CPU = {"JAX_PLATFORMS": "cpu"}


def _lammps_env() -> dict[str, str]:
    lammps = pytest.importorskip("lammps_jax_pjrt_cpu")
    path = Path(lammps.__file__).parent / "pjrt_c_api_cpu_plugin.so"
    return {
        "JAX_PLATFORMS": "flexnpu",
        "FLEXNPU_BACKEND": str(path),
        "FLEXNPU_ALLOW_NEWER_BACKEND": "1",
        "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2",
    }


@pytest.fixture(scope="module")
def cpu_linalg() -> dict:
    result = _result(_LINALG, _ON_CPU)
    assert result["platform"] == "cpu" and result["errors"] == {}, result["errors"]
    return result["out"]


def _assert_same_linalg(out: dict, reference: dict) -> None:
    assert sorted(out) == sorted(reference)
    for name, values in reference.items():
        for got, want in zip(out[name], values, strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9,
                                       err_msg=name)


def test_linalg_over_default_backend_equal_cpu(cpu_linalg: dict) -> None:
    # xla-cpu-pjrt 0.0.1 implements XLA FFI 0.2; jaxlib 0.10.2's LAPACK kernels are FFI 0.3,
    # which the plugin refuses at registration. FlexNPU's FFI version adapter (runtime/ffi.h)
    # registers each through a trampoline declaring 0.2, so the same LAPACK kernels run: eig
    # included, equal to cpu's.
    result = _result(_LINALG, _ON_FLEXNPU)
    assert result["platform"] == "flexnpu"
    assert result["errors"] == {}, result["errors"]
    _assert_same_linalg(result["out"], cpu_linalg)
    lapack = result["routes"]
    assert len(lapack) == 60, sorted(lapack)  # jaxlib 0.10.2's LAPACK targets, all adapted
    assert set(map(tuple, lapack.values())) == {("adapted", "0.3", "0.2")}, lapack


def test_linalg_generic_rules_equal_cpu(cpu_linalg: dict) -> None:
    # The fallback for a backend that cannot run jaxlib's LAPACK kernels (one without the FFI
    # extension, e.g. through the daemon): JAX's platform-generic rules, QDWH for eigh/svd
    # (eigenvectors to ~1e-7). Forced here by installing them before JAX creates flexnpu.
    forced = "from flexnpu import lowering\nlowering.install('cpu', jaxlib_kernels=False)\n"
    result = _result(forced + _LINALG, _ON_FLEXNPU)
    assert result["platform"] == "flexnpu"
    assert result["errors"] == {}, result["errors"]
    out = result["out"]
    assert sorted(out) == sorted(cpu_linalg)
    for name, values in out.items():
        for got, want in zip(values, cpu_linalg[name], strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7,
                                       err_msg=name)


def test_linalg_over_lammps_backend_equal_cpu(cpu_linalg: dict) -> None:
    result = _result(_LINALG, _lammps_env())
    assert result["platform"] == "flexnpu"
    assert result["errors"] == {}, result["errors"]
    _assert_same_linalg(result["out"], cpu_linalg)
    # lammps implements FFI 0.4: jaxlib's 0.3 kernels go in as they are.
    assert set(map(tuple, result["routes"].values())) == {("direct", "0.3", "0.4")}


def _check_callbacks(result: dict) -> None:
    # f(x) = (2x + 1) * 3; the io_callbacks see 2x, then 2x + 1, once per call, in order.
    for i, got in enumerate(result["results"]):
        np.testing.assert_array_equal(got, ((np.arange(3.0) + i) * 2 + 1) * 3)
    expected_seen = []
    for i in range(2):
        x = np.arange(3.0) + i
        expected_seen += [["first", (2 * x).tolist()], ["second", (2 * x + 1).tolist()]]
    assert result["seen"] == expected_seen
    printed = [line for line in result["stdout"].splitlines() if line.startswith("value ")]
    assert printed == ["value [0. 1. 2.]", "value [1. 2. 3.]"]


def test_host_callbacks_on_cpu_reference() -> None:
    result = _result(_CALLBACKS, _ON_CPU)
    assert result["platform"] == "cpu"
    _check_callbacks(result)


@pytest.mark.parametrize("backend", ["default", "lammps"])
def test_host_callbacks_over_cpu_plugins_equal_cpu(backend: str) -> None:
    # FlexNPU's own FFI handler (flexnpu/host_callbacks.py); more in test_plugin_callbacks.py.
    result = _result(_CALLBACKS, _ON_FLEXNPU if backend == "default" else _lammps_env())
    assert result["platform"] == "flexnpu"
    _check_callbacks(result)


# A user FFI target: y = 2x + 1 over f32, in C against jaxlib's FFI C header. It declares FFI
# API 0.1 in its metadata (it uses nothing newer), so XLA builds from 0.1 up accept it.
_FFI_SOURCE = r"""
#include "xla/ffi/api/c_api.h"
XLA_FFI_Error* flexnpu_test_affine(XLA_FFI_CallFrame* frame) {
  for (XLA_FFI_Extension_Base* e = frame->extension_start; e != 0; e = e->next) {
    if (e->type == XLA_FFI_Extension_Metadata) {
      XLA_FFI_Metadata* m = ((XLA_FFI_Metadata_Extension*)e)->metadata;
      m->api_version.major_version = 0;
      m->api_version.minor_version = 1;
      m->traits = 0;
      return 0;
    }
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return 0;
  XLA_FFI_Buffer* in = (XLA_FFI_Buffer*)frame->args.args[0];
  XLA_FFI_Buffer* out = (XLA_FFI_Buffer*)frame->rets.rets[0];
  int64_t n = 1;
  for (int64_t i = 0; i < in->rank; ++i) n *= in->dims[i];
  const float* x = (const float*)in->data;
  float* y = (float*)out->data;
  for (int64_t i = 0; i < n; ++i) y[i] = 2.0f * x[i] + 1.0f;
  return 0;
}
"""

_FFI_USER = r"""
import ctypes, json, os, jax, jax.numpy as jnp, numpy as np
lib = ctypes.CDLL(os.environ["FFI_LIB"])
platform = jax.devices()[0].platform
jax.ffi.register_ffi_target("flexnpu_test_affine", jax.ffi.pycapsule(lib.flexnpu_test_affine),
                            platform=platform)
x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
f = jax.jit(lambda v: jax.ffi.ffi_call(
    "flexnpu_test_affine", jax.ShapeDtypeStruct(v.shape, v.dtype))(v) + 1)
print("RESULT " + json.dumps({"platform": platform, "y": np.asarray(f(x)).tolist()}))
"""


@pytest.fixture(scope="module")
def ffi_library(tmp_path_factory: pytest.TempPathFactory) -> str:
    import shutil
    import subprocess

    import jaxlib

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("ffi")
    (folder / "affine.c").write_text(_FFI_SOURCE)
    include = Path(jaxlib.__file__).parent / "include"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", f"-I{include}", "-o",
                    str(folder / "affine.so"), str(folder / "affine.c")], check=True)
    return str(folder / "affine.so")


@pytest.mark.parametrize("backend", ["default", "lammps"])
def test_user_ffi_target_equal_cpu(ffi_library: str, backend: str) -> None:
    env = _ON_FLEXNPU if backend == "default" else _lammps_env()
    npu = _result(_FFI_USER, {**env, "FFI_LIB": ffi_library})
    cpu = _result(_FFI_USER, {**_ON_CPU, "FFI_LIB": ffi_library})
    assert (npu["platform"], cpu["platform"]) == ("flexnpu", "cpu")
    expected = (2 * np.arange(6.0).reshape(2, 3) + 2).tolist()
    assert cpu["y"] == expected
    assert npu["y"] == expected


_LAYOUTS = r"""
import json, jax, jax.numpy as jnp
x = jnp.ones((3, 4), jnp.float32)
compiled = jax.jit(lambda v: (v.T @ v, v[0], v.astype(jnp.int8))).lower(x).compile()
y = compiled(x)
print("RESULT " + json.dumps({
    "platform": jax.devices()[0].platform,
    "outputs": [str(f.layout) for f in compiled.output_formats],
    "inputs": [str(f.layout) for f in jax.tree.leaves(compiled.input_formats)],
    "array": str(x.format.layout),
    "results": [str(a.format.layout) for a in y],
}))
"""


@pytest.mark.parametrize("backend", ["default", "lammps"])
def test_layouts_equal_cpu(backend: str) -> None:
    # FlexNPU forwards the backend's PJRT Layouts extension: JAX reads the same layouts.
    npu = _result(_LAYOUTS, _ON_FLEXNPU if backend == "default" else _lammps_env())
    cpu = _result(_LAYOUTS, _ON_CPU)
    assert (npu["platform"], cpu["platform"]) == ("flexnpu", "cpu")
    for key in ("outputs", "inputs", "array", "results"):
        assert npu[key] == cpu[key], key
