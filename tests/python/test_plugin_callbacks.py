"""Host callbacks on flexnpu over CPU plugins (flexnpu/host_callbacks.py, FlexNPU's own FFI
handler runtime/host_callback.cc) against jaxlib's cpu in the same run: debug.print output,
pure_callback values (also under vmap, for several dtypes and empty arrays), ordered
io_callback side effects across calls and inside loops, and errors raised in the callback.
Each configuration runs in a fresh interpreter under JAX_PLATFORMS=<one platform>."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _subprocess import run_python

_PROGRAM = r"""
import json, jax, jax.numpy as jnp, numpy as np, ml_dtypes
from jax.experimental import io_callback
out, seen = {}, []

@jax.jit
def printed(x):
    jax.debug.print("x={x} sum={s}", x=x, s=x.sum())
    return x + 1
@jax.jit
def printed_in_order(x):
    jax.debug.print("ordered {}", x[0], ordered=True)
    jax.debug.print("ordered {}", x[1], ordered=True)
    return x + 1
for i in range(2):
    printed(jnp.arange(3.0) + i).block_until_ready()
    printed_in_order(jnp.arange(3.0) + i).block_until_ready()
jax.effects_barrier()

sin = jax.jit(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
out["sin"] = np.asarray(sin(jnp.linspace(0, 1, 5, dtype=jnp.float32))).tolist()
for method in ("sequential", "expand_dims", "broadcast_all"):
    f = jax.vmap(lambda x: jax.pure_callback(
        lambda a: np.asarray(a) * 3 + np.asarray(a).ndim, jax.ShapeDtypeStruct((), x.dtype), x,
        vmap_method=method))
    out["vmap_" + method] = np.asarray(jax.jit(f)(jnp.arange(4.0))).tolist()
for name, shape in (("int32", (2, 3)), ("bool", (2, 3)), ("bfloat16", (2, 3)),
                    ("complex64", (2, 3)), ("uint8", (2, 3)), ("float64", (2, 3)),
                    ("int4", (1, 5)), ("uint4", (2, 3)), ("int2", (3, 3)),
                    ("float4_e2m1fn", (1, 3))):
    dtype = np.dtype(getattr(ml_dtypes, name, None) or name)
    count = int(np.prod(shape))
    unsigned = name in ("bool", "uint8", "uint4")
    values = np.arange(count) % 2 if unsigned else np.arange(count) % 3 - 1
    x = jnp.asarray(values.reshape(shape), dtype=dtype)
    f = jax.jit(lambda x: jax.pure_callback(
        lambda a: (np.asarray(a), np.asarray(a).T.copy()),
        (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[::-1], x.dtype)), x))
    a, b = f(x)
    out["dtype_" + name] = [str(a.dtype), np.asarray(a).astype(np.float64).tolist(),
                            np.asarray(b).astype(np.float64).tolist()]
empty = jax.jit(lambda x: jax.pure_callback(
    lambda a: (np.zeros((0, 2), np.float32), np.float32(a.size)),
    (jax.ShapeDtypeStruct((0, 2), jnp.float32), jax.ShapeDtypeStruct((), jnp.float32)), x))
e0, e1 = empty(jnp.zeros((0,), jnp.float32))
out["empty"] = [list(e0.shape), float(e1)]

def record(tag):
    def cb(x):
        seen.append([tag, np.asarray(x).tolist()])
        return np.asarray(x) + 1
    return cb
@jax.jit
def ordered(x):
    a = io_callback(record("a"), jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)
    b = io_callback(record("b"), jax.ShapeDtypeStruct(x.shape, x.dtype), x * 10, ordered=True)
    def body(i, c):
        return io_callback(record("loop"), jax.ShapeDtypeStruct(c.shape, c.dtype), c, ordered=True)
    return jax.lax.fori_loop(0, 3, body, a + b)
out["ordered"] = [np.asarray(ordered(jnp.float32(i))).tolist() for i in range(3)]
jax.effects_barrier()

errors = {}
def boom(x):
    raise ValueError("boom from the callback 42")
for name, f in {
    "raises": lambda x: jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
    "wrong_shape": lambda x: jax.pure_callback(
        lambda a: np.zeros(5, np.float32), jax.ShapeDtypeStruct(x.shape, x.dtype), x),
    "io_raises": lambda x: io_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                       ordered=True),
}.items():
    try:
        np.asarray(jax.jit(f)(jnp.ones(3, jnp.float32)))
        errors[name] = None
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}"
out["after_errors"] = np.asarray(jax.jit(lambda v: v * 2)(jnp.arange(3.0))).tolist()
print("RESULT " + json.dumps({"platform": jax.devices()[0].platform, "out": out,
                              "seen": seen, "errors": errors}))
"""


def _run(env: dict[str, str]) -> dict:
    proc = run_python(_PROGRAM, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    result["printed"] = [line for line in proc.stdout.splitlines()
                         if line.startswith(("x=", "ordered "))]
    return result


def _lammps_env() -> dict[str, str]:
    lammps = pytest.importorskip("lammps_jax_pjrt_cpu")
    path = Path(lammps.__file__).parent / "pjrt_c_api_cpu_plugin.so"
    return {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_BACKEND": str(path),
            "FLEXNPU_ALLOW_NEWER_BACKEND": "1", "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2"}


@pytest.fixture(scope="module")
def on_cpu() -> dict:
    result = _run({"JAX_PLATFORMS": "cpu"})
    assert result["platform"] == "cpu"
    return result


@pytest.mark.parametrize("backend", ["default", "lammps"])
def test_host_callbacks_equal_cpu(backend: str, on_cpu: dict) -> None:
    env = {"JAX_PLATFORMS": "flexnpu"} if backend == "default" else _lammps_env()
    result = _run(env)
    assert result["platform"] == "flexnpu"
    # debug.print: the same lines, once per call, in call order.
    assert result["printed"] == on_cpu["printed"]
    assert on_cpu["printed"] == ["x=[0. 1. 2.] sum=3.0", "ordered 0.0", "ordered 1.0",
                                 "x=[1. 2. 3.] sum=6.0", "ordered 1.0", "ordered 2.0"]
    # Values: exactly cpu's (the same numpy code runs in both).
    assert result["out"] == on_cpu["out"]
    np.testing.assert_allclose(on_cpu["out"]["sin"], np.sin(np.linspace(0, 1, 5)), rtol=1e-6)
    assert on_cpu["out"]["vmap_sequential"] == [0.0, 3.0, 6.0, 9.0]
    assert on_cpu["out"]["empty"] == [[0, 2], 0.0]
    # Ordered io_callbacks: a, b, then the loop's three, per call; calls in order.
    assert result["seen"] == on_cpu["seen"]
    assert [tag for tag, _ in on_cpu["seen"]] == ["a", "b", "loop", "loop", "loop"] * 3
    assert [v for _, v in on_cpu["seen"][:5]] == [0.0, 0.0, 2.0, 3.0, 4.0]
    # Errors: the callback's exception text reaches the caller; the process goes on.
    for name in ("raises", "io_raises"):
        assert "ValueError: boom from the callback 42" in on_cpu["errors"][name], name
        assert "ValueError: boom from the callback 42" in result["errors"][name], name
        assert result["errors"][name].startswith("JaxRuntimeError: "), result["errors"][name]
    shape_error = "Incorrect output shape for return value #0: Expected: (3,), Actual: (5,)"
    assert shape_error in on_cpu["errors"]["wrong_shape"]
    assert shape_error in result["errors"]["wrong_shape"]


def test_registration_lives_with_its_keepalive() -> None:
    from flexnpu import host_callbacks

    registration = host_callbacks.register(lambda: ())
    callback_id = registration.callback_id
    assert host_callbacks._callables[callback_id] is not None
    other = host_callbacks.register(lambda: ())
    assert other.callback_id == callback_id + 1
    del registration
    assert callback_id not in host_callbacks._callables
    assert other.callback_id in host_callbacks._callables


_FREED = r"""
import jax, jax.numpy as jnp, numpy as np
from flexnpu import host_callbacks
f = jax.jit(lambda x: jax.pure_callback(lambda a: a, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
compiled = f.lower(jnp.ones(2)).compile()
print("LIVE", len(host_callbacks._callables))
print("VALUE", np.asarray(compiled(jnp.ones(2))).tolist())
"""


def test_callable_is_registered_while_its_executable_lives() -> None:
    proc = run_python(_FREED, {"JAX_PLATFORMS": "flexnpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LIVE 1" in proc.stdout and "VALUE [1.0, 1.0]" in proc.stdout, proc.stdout


# An eager debug.print / debug.callback as the process's very first JAX call: JAX's impl asks
# for the "cpu" backend before any backend exists (flexnpu/host_callbacks.py,
# add_host_backend_with_flexnpu).
_EAGER_FIRST = r"""
import jax
seen = []
jax.debug.print("eager first {} {}", 1, 2.5)
jax.debug.callback(lambda a: seen.append(int(a)), 7)
print("RESULT", jax.default_backend(), jax.devices()[0].platform, seen)
"""


@pytest.mark.parametrize("backend", ["default", "lammps"])
def test_eager_callback_as_the_first_jax_call_equals_cpu(backend: str) -> None:
    env = {"JAX_PLATFORMS": "flexnpu"} if backend == "default" else _lammps_env()
    runs = {}
    for name, run_env in (("cpu", {"JAX_PLATFORMS": "cpu"}), ("flexnpu", env)):
        proc = run_python(_EAGER_FIRST, run_env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = [line for line in proc.stdout.splitlines()
                      if line.startswith(("eager first", "RESULT"))]
    assert runs["cpu"] == ["eager first 1 2.5", "RESULT cpu cpu [7]"]
    # The same output; the default backend stays flexnpu.
    assert runs["flexnpu"] == ["eager first 1 2.5", "RESULT flexnpu flexnpu [7]"]


# JAX never writes a program with host callbacks to its persistent cache (the callable lives in
# this process only); flexnpu lists FlexNPU's callbacks as JAX lists its own, so neither does it.
_CACHE_WITH_CALLBACK = r"""
import os, sys, jax, jax.numpy as jnp, numpy as np
cache = os.environ["CACHE_DIR"]
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
x = jnp.ones(3, jnp.float32)
before = len(os.listdir(cache))
f = jax.jit(lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1)
value = np.asarray(f(x)).tolist()
with_callback = len(os.listdir(cache))
jax.jit(lambda x: x * 3)(x).block_until_ready()
print("RESULT", with_callback - before, len(os.listdir(cache)) - with_callback, value)
"""


def test_program_with_a_callback_is_not_persisted_as_on_cpu(tmp_path: Path) -> None:
    outputs = {}
    for name, env in (("cpu", {"JAX_PLATFORMS": "cpu"}), ("flexnpu", {"JAX_PLATFORMS": "flexnpu"})):
        folder = tmp_path / name
        folder.mkdir()
        proc = run_python(_CACHE_WITH_CALLBACK, {**env, "CACHE_DIR": str(folder)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs[name] = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    # Nothing written for the callback program; the plain one is written (the cache works).
    assert outputs["cpu"][0].startswith("RESULT 0 1 ")
    assert outputs["flexnpu"] == outputs["cpu"]


# A partitioned debug callback in an SPMD program (jax.debug.print(partitioned=True), also what
# visualize_array_sharding in shard_map uses): the callback's custom call carries the sharding
# JAX's own lowering gives it; prints "RESULT {sharding, outcome}".
_PARTITIONED = r"""
import json, re, jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
arr = jax.device_put(np.arange(8), NamedSharding(mesh, P("x")))
f = jax.jit(lambda x: jax.debug.print("shard {}", x, partitioned=True))
with jax.set_mesh(mesh):
    lowered = f.lower(arr)
    call = [l for l in lowered.as_text().splitlines() if "partitioned_python_cpu_callback" in l]
    sharding = re.findall(r"sdy\.sharding = (#sdy\.sharding_per_value<[^>]*>\]>)", call[0])
    try:
        lowered.compile()(arr)
        jax.effects_barrier()
        outcome = "ran"
    except jax.errors.JaxRuntimeError as e:
        outcome = str(e)
print("RESULT " + json.dumps({"sharding": sharding, "outcome": outcome}))
"""


def test_partitioned_debug_callback_fails_as_on_the_cpu_plugin_directly(tmp_path: Path) -> None:
    """Limit (README): flexnpu lowers a partitioned callback with the sharding JAX gives it on
    cpu, but the XLA inside both CPU plugins predates partitioned Python callbacks (no
    `xla_ffi_partitioned_python_cpu_callback` in either .so) and refuses the program at compile,
    as the xla-cpu-pjrt plugin does under JAX directly: an error naming it, never an abort."""
    import xla_plugins.xla_cpu_pjrt as xla_cpu_pjrt

    config = tmp_path / "xla_cpu_pjrt.json"
    config.write_text(json.dumps({
        "library_path": str(Path(xla_cpu_pjrt.__file__).parent / "xla_cpu_pjrt.so"),
        "create_options": {"cpu_device_count": 2}}))
    runs = {}
    for name, env in (
        ("cpu", {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}),
        ("flexnpu", {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_BACKEND_OPTIONS": "cpu_device_count=2"}),
        ("plugin", {"JAX_PLATFORMS": "xla_cpu_pjrt",
                    "PJRT_NAMES_AND_LIBRARY_PATHS": f"xla_cpu_pjrt:{config}"}),
    ):
        proc = run_python(_PARTITIONED, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        runs[name] = json.loads(lines[0][len("RESULT "):])
        runs[name]["printed"] = sorted(
            line for line in proc.stdout.splitlines() if line.startswith("shard "))
    assert runs["cpu"]["outcome"] == "ran"
    assert runs["cpu"]["printed"] == ["shard [0 1 2 3]", "shard [4 5 6 7]"]
    assert runs["flexnpu"]["sharding"] == runs["cpu"]["sharding"] == runs["plugin"]["sharding"]
    assert len(runs["cpu"]["sharding"]) == 1
    for name in ("flexnpu", "plugin"):
        outcome = runs[name]["outcome"]
        assert outcome.startswith("INTERNAL: "), outcome
        assert "Side-effect HLO must have sharding" in outcome, outcome
        assert "xla_ffi_partitioned_python_cpu_callback" in outcome, outcome
        assert runs[name]["printed"] == []
