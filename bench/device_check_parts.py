"""The parts of `python -m bench.device_check` that run JAX, one per worker process (the driver
starts `python -m bench.device_check --part NAME`): a crash, a hang or a CUDA error in one part
then fails that part alone, with its output in the report.

Each part returns a dict: status (passed / failed / skipped), reason, details. The backend is
"cuda" (FlexNPU over the CUDA plugin, FLEXNPU_BACKEND set by the driver, beside JAX's own cuda
backend) or "cpu" (FlexNPU over the XLA CPU plugin beside that plugin loaded directly, as the
tests and benchmarks compare them)."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO

Result = dict[str, Any]

# Programs of tests/python/test_plugin_programs.py compared on both platforms (cheap to compile).
CONFORMANCE_PROGRAMS = (
    "elementwise_f32",
    "elementwise_bf16",
    "int8_arith",
    "matmul_f32",
    "matmul_bf16",
    "batched_dot_general",
    "conv2d",
    "grad_mlp",
    "scan",
    "while_loop",
    "random",
    "sort",
    "reductions",
    "layernorm_softmax",
    "gather_scatter",
    "dynamic_update_slice",
)
QUICK_CONFORMANCE_PROGRAMS = ("elementwise_f32", "matmul_f32", "scan", "sort")


def result(status: str, reason: str = "", **details: Any) -> Result:
    return {"status": status, "reason": reason, "details": details}


# --- FlexNPU beside its physical backend


def side_by_side(backend: str) -> tuple[list[Any], list[Any]]:
    """(flexnpu devices, the physical backend's devices as JAX drives it directly)."""
    if backend == "cpu":
        from bench.common import setup_side_by_side

        return setup_side_by_side()
    import jax

    jax.config.update("jax_platforms", "flexnpu,cuda")
    return jax.devices("flexnpu"), jax.devices("cuda")


def _test_programs() -> dict[str, tuple[Callable, tuple]]:
    """PROGRAMS of the project's own parity test, loaded from its file (tests/ is no package)."""
    path = REPO / "tests" / "python" / "test_plugin_programs.py"
    spec = importlib.util.spec_from_file_location("device_check_test_programs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PROGRAMS


def _run_on(fn: Callable, args: tuple, device: Any) -> list[Any]:
    import jax
    import numpy as np

    out = jax.jit(fn)(*jax.device_put(args, device))
    return [np.asarray(leaf) for leaf in jax.tree.leaves(out)]


def _compare_leaves(got: list[Any], want: list[Any]) -> dict[str, Any]:
    """The parity test's tolerance (rtol 1e-5, atol 1e-6 for floats, exact otherwise), and
    whether the bits are identical."""
    import numpy as np

    equal = len(got) == len(want)
    identical = equal
    max_abs = 0.0
    for g, w in zip(got, want, strict=False):
        if g.dtype != w.dtype or g.shape != w.shape:
            return {
                "equal": False,
                "identical": False,
                "why": f"{g.dtype}{g.shape} vs {w.dtype}{w.shape}",
            }
        identical = identical and g.tobytes() == w.tobytes()
        if g.dtype.kind == "f" or str(g.dtype) == "bfloat16":
            g32, w32 = g.astype(np.float32), w.astype(np.float32)
            max_abs = max(max_abs, float(np.max(np.abs(g32 - w32), initial=0.0)))
            equal = equal and bool(np.allclose(g32, w32, rtol=1e-5, atol=1e-6, equal_nan=True))
        else:
            equal = equal and bool(np.array_equal(g, w))
    return {"equal": equal, "identical": identical, "max_abs_diff": max_abs}


def _virtual_devices_listing(npu: list[Any], backend: str) -> dict[str, Any]:
    physical = {str(getattr(d, "physical_platform", "?")) for d in npu}
    return {
        "flexnpu_devices": [repr(d) for d in npu],
        "physical_platforms": sorted(physical),
        "platform_version": npu[0].client.platform_version,
        "over_the_backend": physical <= ({"cuda", "gpu"} if backend == "cuda" else {"cpu"}),
    }


def part_conformance(backend: str, quick: bool) -> Result:
    npu, direct = side_by_side(backend)
    listing = _virtual_devices_listing(npu, backend)
    programs = _test_programs()
    names = QUICK_CONFORMANCE_PROGRAMS if quick else CONFORMANCE_PROGRAMS
    npu_dev, direct_dev = npu[min(2, len(npu) - 1)], direct[min(2, len(direct) - 1)]
    compared = {}
    for name in names:
        fn, args = programs[name]
        try:
            compared[name] = _compare_leaves(
                _run_on(fn, args, npu_dev), _run_on(fn, args, direct_dev)
            )
        except Exception as e:  # one program's error is that program's result
            compared[name] = {"equal": False, "identical": False, "why": f"{type(e).__name__}: {e}"}
    moved = _device_put_across(npu) if len(npu) >= 2 else None
    failed = [n for n, c in compared.items() if not c["equal"]]
    problems = failed + (
        [] if listing["over_the_backend"] else ["virtual devices not over the backend"]
    )
    problems += ["device_put across virtual devices"] if moved is False else []
    identical = sum(c["identical"] for c in compared.values())
    summary = (
        f"{len(compared) - len(failed)}/{len(compared)} programs equal, {identical} bit-identical"
    )
    return result(
        "failed" if problems else "passed",
        f"{summary}; failing: {', '.join(problems)}" if problems else summary,
        devices=listing,
        direct_device=repr(direct_dev),
        programs=compared,
        device_put_across_virtual_devices=moved,
    )


def _device_put_across(npu: list[Any]) -> bool:
    import jax
    import numpy as np

    x = jax.device_put(np.arange(12, dtype=np.float32), npu[0])
    y = jax.device_put(x, npu[1])
    z = jax.jit(lambda v: v * 2)(y)
    return z.devices() == {npu[1]} and bool(
        np.array_equal(np.asarray(z), np.arange(12, dtype=np.float32) * 2)
    )


# --- dispatch overhead


def part_dispatch(backend: str, quick: bool) -> Result:
    import numpy as np

    from bench.dispatch import compare_dispatch

    npu, direct = side_by_side(backend)
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    calls, rounds = (50, 2) if quick else (500, 6)
    mm_calls = 20 if quick else 100
    rows = [
        compare_dispatch(
            "tiny op (x + 1, f32[8])",
            lambda x: x + 1,
            lambda: (np.ones(8, np.float32),),
            calls,
            rounds,
            npu[0],
            direct[0],
        ),
        compare_dispatch(
            "matmul f32[256,256]",
            lambda a, b: jnp.dot(a, b),
            lambda: (
                rng.standard_normal((256, 256), np.float32),
                rng.standard_normal((256, 256), np.float32),
            ),
            mm_calls,
            rounds,
            npu[0],
            direct[0],
        ),
    ]
    # SmolLM2-135M shapes on the GPU; the tiny preset in the CPU dry run (the same code path).
    model = "random:tiny" if quick or backend == "cpu" else "random:smollm2-135m"
    rows.append(_decode_step_ratio(npu[0], direct[0], model, quick))
    reason = ", ".join(f"{r['name']} {r['ratio']:.3f}x" for r in rows)
    same_ids = rows[-1].get("same_ids", True)
    return result(
        "passed" if same_ids else "failed",
        f"flexnpu/direct medians: {reason}" + ("" if same_ids else "; greedy ids differ"),
        rows=rows,
    )


def _decode_step_ratio(
    npu_device: Any, direct_device: Any, model: str, quick: bool
) -> dict[str, Any]:
    """The served engine's decode step (batch 8) on each platform: bare (the step alone, ids
    read back) and served (TPOT of 8 greedy requests through the engine), rounds alternating."""
    from bench.engine_overhead import bare_step_seconds, served
    from flexnpu.serving.engine import Engine, EngineConfig
    from flexnpu.serving.loading import load_model

    m = load_model(model, log=lambda *_: None)
    ec = EngineConfig(
        max_num_seqs=8,
        max_model_len=64 if quick else 256,
        max_num_batched_tokens=32 if quick else 64,
        chunk_buckets=[32] if quick else [32, 64],
        num_devices=1,
    )
    engines = {}
    for name, dev in (("flexnpu", npu_device), ("direct", direct_device)):
        eng = Engine(None, m.params, ec, devices=[dev], model_config=m.config, eos_ids=())
        eng.warmup()
        eng.start()
        engines[name] = eng
    rounds, steps, tokens = (1, 5, 16) if quick else (3, 30, 32)
    bare: dict[str, list[float]] = {n: [] for n in engines}
    tpot: dict[str, list[float]] = {n: [] for n in engines}
    ids: dict[str, Any] = {}
    for eng in engines.values():  # first calls of the bare loop's inputs stay out of the medians
        bare_step_seconds(eng, 3, 8, 24)
    for r in range(rounds):
        for name in engines if r % 2 == 0 else reversed(list(engines)):
            bare[name].append(bare_step_seconds(engines[name], steps, 8, 24))
            s = served(engines[name], 8, tokens, 16)
            tpot[name].append(s["tpot_s"])
            ids.setdefault(name, s["ids"])
    for eng in engines.values():
        eng.stop()
    med = {n: (statistics.median(bare[n]), statistics.median(tpot[n])) for n in engines}
    return {
        "name": f"decode step {model} x8 (bare)",
        "flexnpu_median_us": med["flexnpu"][0] * 1e6,
        "direct_median_us": med["direct"][0] * 1e6,
        "ratio": med["flexnpu"][0] / med["direct"][0],
        "served_tpot_ratio": med["flexnpu"][1] / med["direct"][1],
        "served_tpot_us": {n: med[n][1] * 1e6 for n in med},
        "same_ids": ids["flexnpu"] == ids["direct"],
    }


# --- NVML telemetry


def _devices_cli() -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "flexnpu", "devices", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"flexnpu devices --json: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout)


def _nvidia_smi() -> list[str]:
    query = "name,memory.total,memory.used,utilization.gpu,clocks.sm"
    proc = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.stdout.strip().splitlines()


def part_telemetry(backend: str, quick: bool) -> Result:
    rows = _devices_cli()
    if backend != "cuda":
        return result(
            "skipped",
            f"NVML needs an NVIDIA GPU (backend {backend}); "
            f"`flexnpu devices --json` listed {len(rows)} rows",
            devices_cli=rows,
        )
    samples = _telemetry_under_load(seconds=1.0 if quick else 3.0)
    smi = _nvidia_smi()
    nvml = [r for r in rows if r["source"] == "nvml"]
    problems = _telemetry_problems(nvml, samples, smi)
    peak = max((s["compute"] or 0 for s in samples), default=0)
    summary = f"{len(nvml)} NVML device(s), peak compute utilisation {peak}% under load"
    return result(
        "failed" if problems else "passed",
        "; ".join(problems) if problems else summary,
        devices_cli=rows,
        samples=samples,
        nvidia_smi=smi,
    )


def _telemetry_problems(nvml: list[dict], samples: list[dict], smi: list[str]) -> list[str]:
    problems = []
    if not nvml:
        problems.append("`flexnpu devices` found no NVML device")
    elif nvml[0]["pjrt_device"] is None:
        problems.append("the NVML device is bound to no PJRT device")
    if not samples:
        problems.append("the client's telemetry had no device while it ran")
    elif max((s["compute"] or 0) for s in samples) <= 0:
        problems.append("compute utilisation stayed 0 while matmuls ran")
    if nvml and smi:
        smi_total = float(smi[0].split(",")[1]) * 2**20
        if abs(nvml[0]["memory_total_bytes"] - smi_total) > 0.02 * smi_total:
            problems.append(
                f"memory total {nvml[0]['memory_total_bytes']} vs nvidia-smi {smi_total:.0f}"
            )
    return problems


def _telemetry_under_load(seconds: float) -> list[dict[str, Any]]:
    """The FlexNPU client's own telemetry (NVML, sampled every 100 ms) read while bf16 matmuls
    keep the GPU busy."""
    os.environ["FLEXNPU_TELEMETRY"] = "nvml"
    os.environ["FLEXNPU_TELEMETRY_PERIOD_MS"] = "100"
    import jax
    import jax.numpy as jnp

    from flexnpu import stats

    jax.config.update("jax_platforms", "flexnpu")
    x = jax.random.normal(jax.random.key(0), (8192, 8192), jnp.bfloat16)
    mm = jax.jit(lambda a: (a @ a) * 0.01)
    samples: list[dict[str, Any]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            for d in (stats.clients()[0].get("telemetry") or {}).get("devices", []):
                u = d.get("utilization") or {}
                samples.append(
                    {
                        "t": round(time.perf_counter() - t0, 2),
                        "compute": u.get("compute"),
                        "memory": u.get("memory"),
                        "free": d.get("memory_free_bytes"),
                    }
                )

    t0 = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x = mm(x)
        x.block_until_ready()
    stop.set()
    sampler.join()
    return samples


# --- a model exported on CPU, served on the backend

EXPORT_PROMPTS = [[5, 6, 7, 8], list(range(10, 50)), [100] * 9]


def part_export_serve(backend: str, quick: bool, export_dir: str) -> Result:
    """Greedy tokens of the export in `export_dir` served by the engine on jaxlib's cpu (the
    reference) and on flexnpu (over the backend the driver's environment names)."""
    import jax

    from flexnpu.serving import export
    from flexnpu.serving.engine import Engine
    from flexnpu.serving.sampling import SamplingParams

    jax.config.update("jax_platforms", "flexnpu,cpu")
    art = export.load(export_dir)
    sp = SamplingParams(max_tokens=6 if quick else 12, temperature=0.0, ignore_eos=True)
    ec = art.engine_config(layout="colocated", num_devices=1)
    tokens, devices = {}, {}
    for platform in ("cpu", "flexnpu"):
        device = jax.devices(platform)[0]
        eng = Engine(art.steps, art.params, ec, devices=[device])
        eng.start()
        tokens[platform] = [eng.generate(p, sp)[0] for p in EXPORT_PROMPTS]
        eng.stop()
        devices[platform] = {"device": repr(device), "version": device.client.platform_version}
    same = tokens["cpu"] == tokens["flexnpu"]
    return result(
        "passed" if same else "failed",
        f"greedy tokens {'equal' if same else 'DIFFER'} on {devices['flexnpu']['device']} and "
        "jaxlib's cpu",
        tokens=tokens,
        devices=devices,
    )


# --- the emulator's calibration


def calibration_programs(quick: bool) -> dict[str, tuple[Callable, Callable]]:
    """name -> (a call that returns an array to block on, maker of its arguments on the device):
    the serving engine's decode and 2k-prefill steps of an 8B model (Llama-3-8B shapes, random
    bf16 weights), and a bf16 matmul on random data."""
    import jax
    import jax.numpy as jnp

    from bench.emulated_fidelity import engine_programs

    n = 1024 if quick else 8192
    model, rows, context, chunk = ("tiny", 2, 256, 64) if quick else ("llama-3-8b", 16, 4096, 2048)

    def random_bf16() -> tuple:
        k1, k2 = jax.random.split(jax.random.key(1))
        return (
            jax.random.normal(k1, (n, n), jnp.bfloat16),
            jax.random.normal(k2, (n, n), jnp.bfloat16),
        )

    programs = {f"matmul bf16 {n}^3": (jax.jit(lambda a, b: a @ b), random_bf16)}
    steps = engine_programs(model, rows=rows, context=context, chunk=chunk)
    programs |= {name: (step, make) for name, (step, make, *_rest) in steps.items()}
    return programs


def part_predict(backend: str, quick: bool) -> Result:
    """emulate:h200's modelled device time of one execution of each program (its stats'
    busy_s; time_scale tiny so nothing waits)."""
    import jax

    from flexnpu import stats

    jax.config.update("jax_platforms", "flexnpu")
    predicted = {}
    for name, (fn, make_args) in calibration_programs(quick).items():
        args = make_args()
        fn(*args).block_until_ready()  # compiled, inputs ready
        before = float(stats.clients()[0]["modelled_device_time"][0]["busy_s"])
        fn(*args).block_until_ready()
        predicted[name] = float(stats.clients()[0]["modelled_device_time"][0]["busy_s"]) - before
    return result(
        "passed",
        f"{len(predicted)} programs predicted",
        predicted_s=predicted,
        platform_version=jax.devices()[0].client.platform_version,
    )


def part_measure(backend: str, quick: bool) -> Result:
    """Device time per execution on JAX's own cuda backend: back-to-back calls blocked on once
    (host overhead hides behind device time), median of repeats."""
    import jax

    jax.config.update("jax_platforms", "cuda")
    calls, repeats = (5, 3) if quick else (20, 5)
    measured = {}
    for name, (fn, make_args) in calibration_programs(quick).items():
        args = make_args()
        for _ in range(3):
            fn(*args).block_until_ready()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = [fn(*args) for _ in range(calls)]
            outs[-1].block_until_ready()
            samples.append((time.perf_counter() - t0) / calls)
        measured[name] = {"median_s": statistics.median(samples), "samples_s": samples}
    return result(
        "passed",
        f"{len(measured)} programs timed on {jax.devices()[0].device_kind}",
        measured=measured,
        device_kind=jax.devices()[0].device_kind,
    )


PARTS: dict[str, Callable[..., Result]] = {
    "conformance": part_conformance,
    "dispatch": part_dispatch,
    "telemetry": part_telemetry,
    "export_serve": part_export_serve,
    "predict": part_predict,
    "measure": part_measure,
}


def run_part(name: str, backend: str, quick: bool, result_path: Path, **kwargs: Any) -> None:
    """Runs one part in this process and writes its result as JSON (an exception is a failed
    result with its traceback's end)."""
    import traceback

    t0 = time.perf_counter()
    try:
        out = PARTS[name](backend, quick, **kwargs)
    except Exception as e:
        out = result(
            "failed", f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-4000:]
        )
    out["seconds"] = round(time.perf_counter() - t0, 1)
    result_path.write_text(json.dumps(out, indent=1, default=str))
