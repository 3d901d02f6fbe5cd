"""FLOPs and bytes of FlexNPU's own step programs, analysed as the emulated backend costs them.

With the `flexnpu` runtime on an accelerator preset (`simulate --runtime flexnpu`), a step costs
what the engine's padded program for (chunk bucket, block-table width) costs on emulated devices
of that preset: the serving runner's step (flexnpu.serving.model.packed_paged_step, bf16 weights
and KV cache, the runner's shapes), compiled for its shapes by the XLA CPU compiler and analysed
by xla_passes on the preset (converts of bf16 emulation removed) -- the emulated backend's own
numbers, one implementation for both. The steptime.CostModel's reference layers differ from that
program (it gathers every row's block table, materialises the attention scores, samples on the
device), so its per-feature fit would not be the program the engine runs.

Compiling a 7B-shaped step takes tens of seconds on a small machine: the optimized HLO of each
program is kept in a cache directory keyed by its lowered StableHLO, the jax version and the CPU
plugin file (the analysis itself runs on every load, so a changed analysis takes effect at once).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from flexnpu.sim.steptime import EngineShapes

CACHE_ENV = "FLEXNPU_SIM_PROGRAM_CACHE"


def cache_directory() -> Path:
    """$FLEXNPU_SIM_PROGRAM_CACHE, else $XDG_CACHE_HOME/flexnpu/sim-programs (an absolute
    XDG_CACHE_HOME only), else ~/.cache/flexnpu/sim-programs."""
    explicit = os.environ.get(CACHE_ENV, "")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "flexnpu" / "sim-programs"


def serving_config(model: str) -> Any:
    """The serving engine's LlamaConfig of a simulator model (its random:<name> preset)."""
    from flexnpu.serving.config import RANDOM_PRESETS

    if model not in RANDOM_PRESETS:
        known = ", ".join(sorted(RANDOM_PRESETS))
        raise ValueError(
            f"runtime flexnpu: the serving engine has no model {model!r} (its models: {known})"
        )
    return RANDOM_PRESETS[model]


def compiler_device() -> Any:
    """A device of the flexnpu platform: its programs are compiled by the emulated backend's
    compiler (the XLA CPU plugin FlexNPU loads), whatever backend the platform runs over."""
    import jax

    try:
        return jax.devices("flexnpu")[0]
    except RuntimeError as e:
        raise ValueError(
            "runtime flexnpu costs the engine's programs as the emulated backend compiles them, "
            f"on the flexnpu platform, which JAX did not initialise ({e}); leave JAX_PLATFORMS "
            "unset or include flexnpu"
        ) from None


def _step_arguments(
    cfg: Any, shapes: EngineShapes, chunk: int, width: int, device: Any = None
) -> tuple:
    """The step's arguments as jax.ShapeDtypeStruct on `device`, as the runner passes them."""
    import jax
    import jax.numpy as jnp

    from flexnpu.serving import kvcache
    from flexnpu.serving.model import param_shapes
    from flexnpu.serving.step_io import packed_int_length

    b, r = shapes.rows, shapes.rows + 1
    cache = jax.ShapeDtypeStruct(
        kvcache.paged_cache_shape(cfg, shapes.rows * shapes.max_blocks, shapes.block_size),
        jnp.bfloat16,
    )
    packed = {
        "ints": jax.ShapeDtypeStruct((packed_int_length(b, chunk, width),), jnp.int32),
        "floats": jax.ShapeDtypeStruct((3 * r,), jnp.float32),
        "chunk_table": jax.ShapeDtypeStruct((width,), jnp.int32),
        "prev_ids": jax.ShapeDtypeStruct((r,), jnp.int32),
    }
    args = (param_shapes(cfg, jnp.bfloat16), cache, cache, packed)
    if device is None:
        return args
    on = jax.sharding.SingleDeviceSharding(device)
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on), args
    )


def optimized_step_hlo(
    cfg: Any, shapes: EngineShapes, chunk: int, width: int, cache: Path | None = None
) -> bytes:
    """The optimized HLO of the engine's step program (from the cache when it has it)."""
    import jax

    import flexnpu
    from flexnpu.analysis import optimized_hlo
    from flexnpu.serving.model import jitted_paged_steps

    step = jitted_paged_steps(cfg, shapes.block_size)[0]
    lowered = step.lower(*_step_arguments(cfg, shapes, chunk, width, compiler_device()))
    plugin = Path(flexnpu.cpu_plugin_path())
    stat = plugin.stat()
    compiler = f"{jax.__version__} {plugin} {stat.st_size} {stat.st_mtime_ns}"
    key = hashlib.sha256(f"{compiler}\n{lowered.as_text()}".encode()).hexdigest()
    path = (cache or cache_directory()) / f"{key}.hlo.pb"
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = optimized_hlo(lowered.compile())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError:
        pass  # no cache: compiled again next time
    return data


def program_costs(
    model: str, shapes: EngineShapes, device: str, log=None
) -> dict[tuple[int, int], tuple[float, float]]:
    """(chunk bucket, width) -> (FLOPs, bytes) of every program the engine compiles, as the
    emulated backend counts them on `device` (flexnpu.analysis preset name)."""
    from flexnpu import analysis

    cfg = serving_config(model)
    out = {}
    for chunk, width in shapes.programs():
        c = analysis.analyze_bytes(
            optimized_step_hlo(cfg, shapes, chunk, width), device=device
        ).classification
        out[(chunk, width)] = (float(c.flops), float(c.bytes))
        if log:
            log(
                f"{model} step chunk={chunk} width={width}: {c.flops / 1e12:.3f} TFLOP, "
                f"{c.bytes / 1e9:.2f} GB on {device}"
            )
    return out
