"""The emulated backend (FLEXNPU_BACKEND=emulate:<preset>) driven by JAX programs as users write
them: outputs have the CPU backend's shapes and dtypes and are zeros; donation, sharding and
transfers work; host callbacks are refused by name; memory is the preset's and exhausting it is
an error the process survives; the modelled device time of a program is xla_passes' prediction.

Each configuration runs in a fresh interpreter (JAX configures its backends once per process);
the CPU plugin is registered beside flexnpu as `xlacpu`, the reference."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _subprocess import run_python

PRESET = "ascend910c"
ENV = {
    "JAX_PLATFORMS": "flexnpu,xlacpu",
    "FLEXNPU_BACKEND": "emulate:910c",
    "FLEXNPU_BACKEND_OPTIONS": "device_count=4",
}

PRELUDE = textwrap.dedent(
    """
    import json
    import jax
    from jax._src import xla_bridge
    import flexnpu

    xla_bridge.register_plugin(
        "xlacpu", library_path=str(flexnpu.cpu_plugin_path()), options={"cpu_device_count": 4}
    )
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    npu = jax.devices("flexnpu")
    ref = jax.devices("xlacpu")
    """
)

PROGRAMS = PRELUDE + textwrap.dedent(
    """
    def describe(outputs):
        leaves = jax.tree_util.tree_leaves(outputs)
        return [[list(x.shape), str(x.dtype)] for x in leaves]

    def all_zero(outputs):
        return all(not np.asarray(x).any() for x in jax.tree_util.tree_leaves(outputs))

    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    rng = np.random.default_rng(0)
    a32 = rng.standard_normal((64, 96), np.float32)
    b32 = rng.standard_normal((96, 32), np.float32)
    cases = {
        "matmul_f32": (lambda a, b: a @ b, (a32, b32)),
        "matmul_bf16": (lambda a, b: (a @ b).astype(jnp.bfloat16),
                        (a32.astype(jnp.bfloat16), b32.astype(jnp.bfloat16))),
        "elementwise_int32": (lambda x, y: (x * 3 + y) % 7,
                              (np.arange(60, dtype=np.int32).reshape(6, 10),
                               np.ones((6, 10), np.int32))),
        "reductions": (lambda x: (x.sum(axis=0), x.max(), jnp.argmax(x, axis=1), x.mean()),
                       (a32,)),
        "softmax_tuple": (lambda x: {"p": softmax(x), "n": jnp.linalg.norm(x)}, (a32,)),
    }
    result = {"cases": {}}
    for name, (fn, args) in cases.items():
        got = jax.jit(fn)(*[jax.device_put(x, npu[1]) for x in args])
        want = jax.jit(fn)(*[jax.device_put(x, ref[1]) for x in args])
        result["cases"][name] = {
            "npu": describe(got), "ref": describe(want), "zeros": all_zero(got),
            "ref_nonzero": not all_zero(want),
        }

    # Donation: the donated input is consumed, as on the CPU backend.
    step = jax.jit(lambda cache, row: cache.at[0].set(row), donate_argnums=(0,))
    cache = jax.device_put(np.ones((128, 64), np.float32), npu[2])
    out = step(cache, jax.device_put(np.ones((64,), np.float32), npu[2]))
    result["donation"] = {"deleted": cache.is_deleted(), "out": describe(out),
                          "zeros": all_zero(out)}

    # A jit sharded over the 4 devices.
    def sharded(devices):
        mesh = Mesh(np.array(devices), ("x",))
        x = jax.device_put(a32, NamedSharding(mesh, P("x", None)))
        y = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=1),
                    out_shardings=NamedSharding(mesh, P("x")))(x)
        return y, [d.id for d in sorted(y.devices(), key=lambda d: d.id)]
    got, got_devices = sharded(npu)
    want, _ = sharded(ref)
    result["sharded"] = {"npu": describe(got), "ref": describe(want), "zeros": all_zero(got),
                         "devices": got_devices, "spec": str(got.sharding.spec),
                         "ref_spec": str(want.sharding.spec)}

    # device_put / device_get round trips and copies between devices.
    x = jax.device_put(a32, npu[0])
    moved = jax.device_put(x, npu[3])
    back = jax.device_get(moved)
    result["transfer"] = {"shape": list(back.shape), "dtype": str(back.dtype),
                          "zeros": not back.any(), "device": moved.devices().pop().id}
    print("RESULT" + json.dumps(result))
    """
)


def _result(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    return _result(run_python(PROGRAMS, ENV))


@pytest.mark.parametrize(
    "case", ["matmul_f32", "matmul_bf16", "elementwise_int32", "reductions", "softmax_tuple"]
)
def test_outputs_have_the_cpu_backends_shapes_and_dtypes_and_are_zeros(
    programs: dict[str, Any], case: str
) -> None:
    c = programs["cases"][case]
    assert c["npu"] == c["ref"]
    assert c["zeros"], "nothing is computed: the host sees zeros"
    assert c["ref_nonzero"], "the reference computes (the comparison is not vacuous)"


def test_donated_input_is_consumed(programs: dict[str, Any]) -> None:
    d = programs["donation"]
    assert d["deleted"]
    assert d["out"] == [[[128, 64], "float32"]] and d["zeros"]


def test_sharded_jit_runs_over_the_emulated_devices(programs: dict[str, Any]) -> None:
    s = programs["sharded"]
    assert s["npu"] == s["ref"] == [[[64], "float32"]]
    assert s["spec"] == s["ref_spec"]
    assert s["devices"] == [0, 1, 2, 3]
    assert s["zeros"]


def test_device_put_and_get(programs: dict[str, Any]) -> None:
    t = programs["transfer"]
    assert t == {"shape": [64, 96], "dtype": "float32", "zeros": True, "device": 3}


CALLBACKS = PRELUDE + textwrap.dedent(
    """
    errors = {}
    def debug(x):
        jax.debug.callback(lambda v: None, x)
        return x + 1
    def pure(x):
        return jax.pure_callback(lambda v: v, jax.ShapeDtypeStruct((3,), jnp.float32), x)
    for name, fn in {"debug_callback": debug, "pure_callback": pure}.items():
        try:
            jax.block_until_ready(jax.jit(fn)(jax.device_put(jnp.ones(3), npu[0])))
            errors[name] = None
        except Exception as e:
            errors[name] = str(e)
    # The process goes on: a program without callbacks still runs.
    ok = jax.jit(lambda x: x * 2)(jax.device_put(jnp.ones(3), npu[0]))
    print("RESULT" + json.dumps({"errors": errors, "after": np.asarray(ok).tolist()}))
    """
)


def test_host_callbacks_are_refused_by_name() -> None:
    r = _result(run_python(CALLBACKS, ENV))
    for name, error in r["errors"].items():
        assert error is not None, f"{name} must be refused: the emulated backend runs no host code"
        assert "UNIMPLEMENTED" in error
        assert "host callback 'xla_ffi_python_cpu_callback'" in error, error
        assert "computes nothing" in error
    assert r["after"] == [0.0, 0.0, 0.0]


MEMORY = PRELUDE + textwrap.dedent(
    """
    from flexnpu import stats
    limit = npu[1].memory_stats()["bytes_limit"]
    on_1 = jax.sharding.SingleDeviceSharding(npu[1])
    big = jax.jit(lambda: jnp.zeros((40_000_000_000,), jnp.float32), out_shardings=on_1)
    try:
        big().block_until_ready()
        error = None
    except Exception as e:
        error = str(e)
    # 100 GB fit: nothing is stored on the host.
    held = jax.jit(lambda: jnp.zeros((25_000_000_000,), jnp.float32), out_shardings=on_1)()
    held.block_until_ready()
    in_use = npu[1].memory_stats()["bytes_in_use"]
    print("RESULT" + json.dumps({"limit": limit, "error": error, "in_use": in_use,
                                 "shape": list(held.shape)}))
    """
)


def test_memory_is_the_presets_and_exhausting_it_is_an_error() -> None:
    from flexnpu.analysis import preset_table

    r = _result(run_python(MEMORY, ENV))
    assert r["limit"] == int(preset_table()[PRESET]["memory_bytes"])
    error = r["error"]
    assert error is not None and "RESOURCE_EXHAUSTED" in error
    assert "device 1" in error and "160.00 GB (160000000000 bytes)" in error
    assert "are free" in error
    assert r["in_use"] == 100_000_000_000
    assert r["shape"] == [25_000_000_000]


MODELLED = PRELUDE + textwrap.dedent(
    """
    from flexnpu import analysis, stats
    def modelled(physical):
        (client,) = stats.clients()
        return client["modelled_device_time"][physical]
    n = 4096
    matmul = jax.jit(lambda a, b: a @ b)
    a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), npu[2])
    b = jax.device_put(jnp.ones((n, n), jnp.bfloat16), npu[2])
    compiled = matmul.lower(a, b).compile()
    home = stats.clients()[0]["virtual_devices"][2]["home_physical"]
    before = modelled(home)
    compiled(a, b).block_until_ready()
    after = modelled(home)
    cost = analysis.analyze_bytes(analysis.optimized_hlo(compiled), device="ascend910c")
    from prometheus_client import CollectorRegistry, generate_latest
    from flexnpu import metrics
    registry = CollectorRegistry()
    metrics.register(registry)
    exposition = generate_latest(registry).decode()
    print("RESULT" + json.dumps({
        "exposition": [line for line in exposition.splitlines()
                       if line.startswith("flexnpu_modelled_") and f'device="{home}"' in line],
        "total_busy_s": after["busy_s"],
        "busy_s": after["busy_s"] - before["busy_s"],
        "executions": after["executions"] - before["executions"],
        "flops": cost.classification.flops, "bytes": cost.classification.bytes,
        "time_scale": after["time_scale"],
    }))
    """
)


def test_modelled_time_of_a_matmul_is_the_cost_models_prediction() -> None:
    from flexnpu._native_loader import native

    modelled_seconds = native("modelled_seconds", "the cost model").modelled_seconds
    env = {**ENV, "FLEXNPU_BACKEND_OPTIONS": "device_count=4;time_scale=3"}
    r = _result(run_python(MODELLED, env))
    assert r["executions"] == 1
    assert r["time_scale"] == 3
    assert r["flops"] == 2 * 4096**3
    # Device time, not wall time: the same whatever time_scale stretches it to.
    assert r["busy_s"] == pytest.approx(modelled_seconds(PRESET, r["flops"], r["bytes"]), rel=1e-9)
    # /metrics shows the same device time and count (every execution so far on that device).
    series = dict(line.rsplit(" ", 1) for line in r["exposition"])
    (seconds,) = (v for k, v in series.items() if k.startswith("flexnpu_modelled_device_seconds"))
    (count,) = (v for k, v in series.items() if k.startswith("flexnpu_modelled_executions_total"))
    assert float(seconds) == pytest.approx(r["total_busy_s"], rel=1e-9)
    assert float(count) >= 1


@pytest.mark.parametrize(
    ("backend", "options", "message"),
    [
        ("emulate:tpu9", "", "unknown preset 'tpu9' (known: ascend910b, ascend910c, h100, h200"),
        ("emulate:910c", "device_count=zero", "option 'device_count' must be an integer"),
        ("emulate:910c", "time_scale=0", "option 'time_scale' must be a number > 0"),
        ("emulate:910c", "device_count=2;colour=blue", "unknown option(s) 'colour'"),
    ],
)
def test_bad_presets_and_options_are_named(backend: str, options: str, message: str) -> None:
    code = "import jax\njax.devices('flexnpu')"
    env = {"JAX_PLATFORMS": "flexnpu", "FLEXNPU_BACKEND": backend}
    if options:
        env["FLEXNPU_BACKEND_OPTIONS"] = options
    proc = run_python(code, env)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "INVALID_ARGUMENT" in proc.stderr


DAEMON_CLIENT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    x = jax.device_put(np.ones((256, 512), np.float32), jax.devices()[1])
    y = jax.jit(lambda x: x @ x.T)(x)
    print("RESULT" + json.dumps({"shape": list(y.shape), "zeros": not np.asarray(y).any()}))
    """
)


def test_daemon_serves_the_emulated_backend(tmp_path: Path) -> None:
    from test_daemon import Daemon, _client_env

    daemon = Daemon(
        tmp_path / "flexnpu.sock",
        tmp_path / "daemon.log",
        extra=(
            "--backend",
            "emulate:910c",
            "--backend-options",
            "device_count=4",
            "--policy",
            "dynamic",
        ),
    )
    try:
        env = _client_env(daemon.socket)
        proc = subprocess.run(
            [sys.executable, "-c", DAEMON_CLIENT],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert _result(proc) == {"shape": [256, 256], "zeros": True}
        (runtime,) = daemon.stats()["runtime"]
        assert "emulated ascend910c x4" in runtime["platform_version"]
        assert sum(m["executions"] for m in runtime["modelled_device_time"]) >= 1
    finally:
        daemon.stop()


def test_the_server_on_emulated_devices_completes_every_request(tmp_path: Path) -> None:
    # The real server over 2 emulated 910C (one instance each): concurrent streams with fixed
    # output lengths, as benchmark clients send them. Every sampled id is 0 (outputs are
    # zeros): SmolLM2's <|endoftext|>, shown because the requests ask for special tokens.
    from concurrent.futures import ThreadPoolExecutor

    from _serving import require, require_smollm2, serve_subprocess

    require("httpx")
    require_smollm2()
    import httpx

    args = ["--model", "random:tiny-qwen2.5", "--dtype", "bfloat16", "--max-model-len", "128",
            "--max-num-seqs", "2", "--max-num-batched-tokens", "32", "--chunk-buckets", "32",
            "--no-compilation-cache"]
    env = {"FLEXNPU_BACKEND": "emulate:910c", "FLEXNPU_BACKEND_OPTIONS": "device_count=2"}
    tokens = 12

    def stream(i: int) -> tuple[str, int, str | None]:
        body = {"model": "random:tiny-qwen2.5", "stream": True, "max_tokens": tokens,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "ignore_eos": True, "min_tokens": tokens, "skip_special_tokens": False,
                "stream_options": {"include_usage": True}}
        text, usage, reason = "", 0, None
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                for choice in event["choices"]:
                    text += choice["delta"].get("content") or ""
                    reason = choice.get("finish_reason") or reason
                if event.get("usage"):
                    usage = event["usage"]["completion_tokens"]
        return text, usage, reason

    with serve_subprocess(args, tmp_path / "serve.log", env=env) as base:
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(stream, range(6)))
        metrics = httpx.get(base + "/metrics", timeout=30).text
    assert results == [("<|endoftext|>" * tokens, tokens, "length")] * 6
    executions = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("flexnpu_modelled_executions_total")]
    assert len(executions) == 2 and min(executions) > 0  # both emulated devices served
