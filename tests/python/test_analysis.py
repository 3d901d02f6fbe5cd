"""HLO analysis vs an independent oracle: XLA's own cost analysis of the same executable.

`compiled.cost_analysis()` runs XLA's HloCostAnalysis over the optimized module; FlexNPU's
C++ analysis reads the serialized module with its own protobuf reader. With
`xla_compatible=True` both count by the same conventions, so FLOPs must agree within 1% and
bytes within 10% on every program of the corpus. The default (real-execution) counts differ by
design where a program has while loops (bodies times trip count instead of once) or fused
gathers (rows read instead of whole tables); those differences are checked explicitly.
"""

from __future__ import annotations

import os

# jaxlib's own XLA:CPU compiler (the oracle and the measured numbers below are for it), even
# when other jax plugins are installed; set before any jax backend initializes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import flexnpu
from bench import llama_corpus as lc
from flexnpu import analysis as fa

f32 = jnp.float32


def sds(*shape: int, dtype: Any = f32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def cpu_device() -> Any:
    """The XLA CPU backend, whichever name it is registered under (not the flexnpu plugin)."""
    for name in ("cpu", "xlacpu"):
        try:
            return jax.devices(name)[0]
        except RuntimeError:
            continue
    return jax.devices()[0]


@pytest.fixture(autouse=True, scope="module")
def _cpu() -> Iterator[None]:
    # Compile for the XLA CPU backend even if another jax plugin is the default.
    with jax.default_device(cpu_device()):
        yield


def _attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    s = jnp.einsum("bhsd,bhtd->bhst", q, k) / 8.0
    return jnp.einsum("bhst,bhtd->bhsd", jax.nn.softmax(s, axis=-1), v)


def _layernorm(x: jax.Array, g: jax.Array) -> jax.Array:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def _mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def _conv(x: jax.Array, k: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, k, (1, 1), "SAME")


def _strided_conv(x: jax.Array, k: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, k, (2, 2), "VALID", rhs_dilation=(2, 1))


def _corpus() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    small = lc.LlamaConfig()
    scan = replace(small, scan_layers=True)
    programs: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        f"matmul {m}x{k}x{n}": (jnp.matmul, (sds(m, k), sds(k, n)))
        for m, k, n in ((128, 256, 64), (512, 512, 512), (7, 300, 129), (1024, 64, 2048))
    }
    programs |= {
        "gemv 1x1024x1024": (jnp.matmul, (sds(1, 1024), sds(1024, 1024))),
        "gemv 4x2048x512": (jnp.matmul, (sds(4, 2048), sds(2048, 512))),
        "batched matmul": (jnp.matmul, (sds(8, 64, 128), sds(8, 128, 32))),
        "conv 3x3 same": (_conv, (sds(2, 8, 32, 32), sds(16, 8, 3, 3))),
        "conv strided dilated": (_strided_conv, (sds(1, 4, 33, 17), sds(8, 4, 3, 2))),
        "softmax": (lambda x: jax.nn.softmax(x, axis=-1), (sds(64, 1000),)),
        "layernorm": (_layernorm, (sds(32, 768), sds(768))),
        "attention": (_attention, (sds(2, 4, 64, 32), sds(2, 4, 64, 32), sds(2, 4, 64, 32))),
        "mlp": (_mlp, (sds(16, 256), sds(256, 1024), sds(1024, 256))),
    }
    for b, s in ((1, 64), (4, 32)):
        programs[f"llama prefill b{b} s{s}"] = (lc.prefill_fn(small), lc.prefill_args(small, b, s))
    for b in (1, 8):
        programs[f"llama decode b{b} t128"] = (lc.decode_fn(small), lc.decode_args(small, b, 128))
    programs["llama scan decode b2"] = (lc.decode_fn(scan), lc.decode_args(scan, 2, 64))
    return programs


CORPUS = _corpus()


def _compile(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    return jitted.lower(*args).compile()


@pytest.mark.parametrize("name", list(CORPUS))
def test_agrees_with_xla_cost_analysis(name: str) -> None:
    compiled = _compile(*CORPUS[name])
    xla = compiled.cost_analysis()
    ours = fa.analyze(compiled, xla_compatible=True).profile
    assert ours["flops"] == pytest.approx(xla.get("flops", 0.0), rel=0.01, abs=1)
    assert ours["transcendentals"] == pytest.approx(xla.get("transcendentals", 0.0), rel=0.01)
    assert ours["bytes_accessed"] == pytest.approx(xla["bytes accessed"], rel=0.10)
    assert ours["bytes_written"] == pytest.approx(xla["bytes accessedout{}"], rel=0.10)


def test_matmul_flops_are_exact() -> None:
    p = fa.analyze(jnp.matmul, sds(512, 256), sds(256, 128)).profile
    assert p["dot_flops"] == 2 * 512 * 256 * 128
    assert p["dot_count"] == 1 and p["gemv_dot_count"] == 0
    b = fa.analyze(jnp.matmul, sds(8, 64, 128), sds(8, 128, 32)).profile
    assert b["dot_flops"] == 2 * 8 * 64 * 128 * 32  # batch dims are in the output


def test_while_loops_count_trip_count_times_by_default() -> None:
    def loop(x: jax.Array) -> jax.Array:
        return lax.fori_loop(0, 6, lambda i, c: jnp.tanh(c @ c), x)

    compiled = _compile(loop, (sds(64, 64),))
    once = fa.analyze(compiled, xla_compatible=True).profile
    real = fa.analyze(compiled).profile
    assert once["flops"] == pytest.approx(compiled.cost_analysis()["flops"], rel=0.01)
    # XLA counts one iteration; the real executable runs the body 6 times.
    assert real["max_trip_count"] == 6 and real["while_loops_unknown_trip_count"] == 0
    assert real["dot_flops"] == 6 * 2 * 64**3
    assert real["transcendentals"] == 6 * 64 * 64


def test_scan_and_unrolled_llama_agree_by_default() -> None:
    # Same model, layers unrolled vs scanned: XLA's convention counts one scanned layer, the
    # default convention counts all of them, like the unrolled executable.
    cfg = lc.LlamaConfig(layers=3)
    unrolled = fa.analyze(lc.decode_fn(cfg), *lc.decode_args(cfg, 2, 64)).profile
    scan_cfg = replace(cfg, scan_layers=True)
    scanned = fa.analyze(lc.decode_fn(scan_cfg), *lc.decode_args(scan_cfg, 2, 64)).profile
    assert scanned["dot_flops"] == pytest.approx(unrolled["dot_flops"], rel=0.01)
    assert scanned["max_trip_count"] == 3


def test_fused_gather_reads_rows_not_the_table() -> None:
    # An embedding lookup fused with its consumer: XLA charges the whole table.
    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        return jnp.tanh(table[ids]) * 2

    compiled = _compile(embed, (sds(50000, 256), sds(8, dtype=jnp.int32)))
    xla = fa.analyze(compiled, xla_compatible=True).profile["bytes_accessed"]
    real = fa.analyze(compiled).profile["bytes_accessed"]
    table = 50000 * 256 * 4
    assert real < 0.01 * table <= xla


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("scanned", [False, True])
def test_kv_cache_scatter_is_an_in_place_update(dtype: Any, scanned: bool) -> None:
    # A decode step's KV write: 8 tokens scattered into each layer of a 28-layer cache. The
    # CPU compiler wraps a bf16 scatter in converts of the whole cache (it has no bf16
    # scatter); a device with native bf16 updates the rows in place.
    layers, rows, tokens = 28, 4096, 8
    cache = jax.ShapeDtypeStruct((layers, rows, 4, 128), dtype)
    new = jax.ShapeDtypeStruct((tokens, 4, 128), dtype)
    positions = jax.ShapeDtypeStruct((tokens,), jnp.int32)

    def write(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
        if scanned:
            body = lambda c, layer: (c.at[layer, positions].set(new), None)  # noqa: E731
            return lax.scan(body, cache, jnp.arange(layers))[0]
        for layer in range(layers):
            cache = cache.at[layer, positions].set(new)
        return cache

    compiled = jax.jit(write, donate_argnums=0).lower(cache, new, positions).compile()
    native = fa.analyze(compiled).classify("ascend910c").bytes
    update = tokens * 4 * 128 * jnp.dtype(dtype).itemsize
    # Each layer reads and writes its rows (~3x the update with the update's own read), plus
    # the indices; nothing near the cache's size (28 x 4096 rows: 1024x the updates).
    assert layers * update <= native <= layers * (4 * update + 4096)
    whole = fa.analyze(compiled, xla_compatible=True).profile["bytes_accessed"]
    assert whole >= layers * rows * 4 * 128 * jnp.dtype(dtype).itemsize / (layers if scanned else 1)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, f32])
def test_scatter_into_a_loop_carried_state_is_in_place(dtype: Any) -> None:
    # The serving engine's KV write: every layer scatters a few rows into its slice of the
    # whole [L, S, D] cache. XLA:CPU emulates a bf16 scatter in f32 (convert the whole state,
    # scatter, convert back); a device with native bf16 updates the rows in place, so the
    # state's size must not count once per layer.
    layers, slots, width, rows = 4, 16384, 256, 8

    def step(state: jax.Array, update: jax.Array, where: jax.Array) -> jax.Array:
        def layer(carry: tuple, _: None) -> tuple:
            st, i = carry
            return (st.at[i, where].set(update.astype(st.dtype)), i + 1), None

        (state, _), _ = lax.scan(layer, (state, 0), None, length=layers)
        return state

    compiled = _compile(
        jax.jit(step, donate_argnums=0),
        (sds(layers, slots, width, dtype=dtype), sds(rows, width), sds(rows, dtype=jnp.int32)),
    )
    state_bytes = layers * slots * width * jnp.dtype(dtype).itemsize
    moved = fa.analyze(compiled, device="h200").classification.bytes
    assert moved < 0.05 * state_bytes
    # XLA's convention charges the scatter's whole state.
    assert fa.analyze(compiled, xla_compatible=True).profile["bytes_accessed"] > state_bytes


def test_structural_hints_of_decode_step() -> None:
    cfg = lc.LlamaConfig()
    a = fa.analyze(lc.decode_fn(cfg), *lc.decode_args(cfg, 1, 128))
    p = a.profile
    assert p["state_append_count"] == 2 * cfg.layers  # K and V per layer
    assert p["gemv_dot_count"] == p["dot_count"] > 0
    assert len(p["aliased"]) == 2 * cfg.layers  # donated caches updated in place
    assert p["aliased_bytes"] == 2 * cfg.layers * 128 * cfg.kv_heads * cfg.head_dim * 4
    assert p["largest_parameters"][0]["bytes"] == cfg.vocab * cfg.hidden * 4
    assert "KV" not in a.table() and "state appends" in a.table()


def _wrap_with_config(module: bytes) -> bytes:
    """An HloModuleProtoWithConfig: field 1 = module, field 2 = (some) config."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while n >= 0x80:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    config = b"\x08\x01"
    return b"\x0a" + varint(len(module)) + module + b"\x12" + varint(len(config)) + config


def test_accepts_module_with_config() -> None:
    data = fa.optimized_hlo(jnp.matmul, sds(64, 32), sds(32, 16))
    plain = fa.analyze_bytes(data).profile
    wrapped = fa.analyze_bytes(_wrap_with_config(data)).profile
    assert wrapped["from_config_wrapper"] and not plain["from_config_wrapper"]
    assert wrapped["flops"] == plain["flops"] == 2 * 64 * 32 * 16


@pytest.mark.parametrize("cut", [0, 1, 7, 100, -1])
def test_malformed_input_raises_value_error(cut: int) -> None:
    data = fa.optimized_hlo(jnp.matmul, sds(8, 8), sds(8, 8))
    with pytest.raises(ValueError):
        fa.analyze_bytes(data[:cut] if cut >= 0 else b"\xff" * 64)


def test_devices() -> None:
    presets = fa.device_presets()
    assert {"ascend910b", "ascend910c", "h100", "h200", "cpu"} <= set(presets)
    h200 = fa.get_device("H200")
    assert h200.ridge == pytest.approx(989.4e12 / 4.8e12)
    custom = fa.Device("mine", peak_flops=1e12, mem_bandwidth=1e11, small_work_s=0)
    a = flexnpu.analyze(jnp.matmul, sds(256, 256), sds(256, 256), device=custom)
    assert a.classification.ridge == pytest.approx(10.0)
    assert a.phase == "prefill"  # 2*256^3 / (3*256^2*4) = 42.7 FLOP/B > 10
    assert a.classify("h200").phase == "small"
    with pytest.raises(ValueError, match="unknown device"):
        fa.get_device("tpu9")


def test_cli_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "module.pb"
    path.write_bytes(fa.optimized_hlo(jnp.matmul, sds(1, 4096), sds(4096, 4096)))
    cmd = [sys.executable, "-m", "flexnpu", "analyze", str(path)]
    table = subprocess.run([*cmd, "--device", "h200"], capture_output=True, text=True, check=True)
    assert "arithmetic intensity" in table.stdout and "h200" in table.stdout
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["profile"]["flops"] == 2 * 4096 * 4096
    assert result["classification"]["phase"] == "decode"  # GEMV on this CPU: 0.5 FLOP/B
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\x0a\xff\xff\xff")
    err = subprocess.run([*cmd[:-1], str(bad)], capture_output=True, text=True)
    assert err.returncode == 1 and "invalid HLO module" in err.stderr
