"""`jax.export` artifacts: the prefill (one per bucket), insert (one per bucket) and decode steps
as serialized StableHLO lowered for both `cpu` and `flexnpu`, plus the weights, the tokenizer and
a manifest. `load` serves them without the model code, unchanged on either platform."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from flexnpu.serving import kvcache
from flexnpu.serving.config import LlamaConfig
from flexnpu.serving.engine import EngineConfig
from flexnpu.serving.tokenizer import Tokenizer, tokenizer_from_json

PLATFORMS = ("cpu", "flexnpu")
FORMAT = "flexnpu-serving-export/1"


def _flatten(params: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def _unflatten(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, v in flat.items():
        d = out
        *parents, leaf = key.split("/")
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = v
    return out


def export(m, out_dir: str, ec: EngineConfig, platforms=PLATFORMS) -> list[str]:
    """Writes the artifacts of model `m` (a LoadedModel) for engine shapes `ec`."""
    from flexnpu.serving import model as model_lib

    os.makedirs(out_dir, exist_ok=True)
    cfg: LlamaConfig = m.config
    buckets = ec.resolved_buckets()
    spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), m.params)
    dtype = m.params["layers"]["wq"].dtype
    i32 = jnp.int32
    cache = jax.ShapeDtypeStruct(kvcache.cache_shape(cfg, ec.max_batch, ec.max_seq_len), dtype)
    vec = jax.ShapeDtypeStruct((ec.max_batch,), i32)
    scalar = jax.ShapeDtypeStruct((), i32)

    def write(name: str, fn, *args) -> str:
        exp = jax_export.export(jax.jit(fn), platforms=platforms)(*args)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(exp.serialize())
        return name

    files = [write("decode.bin", partial(model_lib.decode, cfg=cfg), spec, cache, cache, vec, vec)]
    for b in buckets:
        kv = jax.ShapeDtypeStruct((cfg.num_layers, b, cfg.num_kv_heads, cfg.head_dim), dtype)
        files.append(write(f"prefill_{b}.bin", partial(model_lib.prefill, cfg=cfg), spec,
                           jax.ShapeDtypeStruct((b,), i32), scalar))
        files.append(write(f"insert_{b}.bin", model_lib.insert, cache, cache, kv, kv, scalar))
    flat = {k: np.asarray(v) for k, v in _flatten(m.params).items()}
    dtypes = {k: str(v.dtype) for k, v in flat.items()}
    np.savez(os.path.join(out_dir, "weights.npz"),
             **{k.replace("/", "."): (v.view(np.uint16) if v.dtype == jnp.bfloat16 else v)
                for k, v in flat.items()})
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        f.write(m.tokenizer.to_json())
    manifest = {"format": FORMAT, "name": m.name, "config": cfg.to_dict(), "buckets": buckets,
                "max_batch": ec.max_batch, "max_seq_len": ec.max_seq_len,
                "chat_system": m.chat_system, "platforms": list(platforms), "weights": dtypes,
                "programs": files}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return files


class ExportSteps:
    """The engine's Steps from deserialized artifacts (jitted `Exported.call`)."""

    def __init__(self, out_dir: str, manifest: dict) -> None:
        self.config = LlamaConfig.from_dict(manifest["config"])

        def load(name: str, **jit_kw):
            with open(os.path.join(out_dir, name), "rb") as f:
                exp = jax_export.deserialize(bytearray(f.read()))
            return jax.jit(exp.call, **jit_kw)

        self._decode = load("decode.bin", donate_argnums=(1, 2))
        self._prefill = {b: load(f"prefill_{b}.bin") for b in manifest["buckets"]}
        self._insert = {b: load(f"insert_{b}.bin", donate_argnums=(0, 1))
                        for b in manifest["buckets"]}

    def prefill(self, params, tokens, length):
        return self._prefill[tokens.shape[0]](params, tokens, length)

    def decode(self, params, ck, cv, tokens, pos):
        return self._decode(params, ck, cv, tokens, pos)

    def insert(self, ck, cv, k, v, slot):
        return self._insert[k.shape[1]](ck, cv, k, v, slot)


@dataclass
class Artifacts:
    steps: ExportSteps
    params: dict
    tokenizer: Tokenizer
    name: str
    chat_system: str | None
    max_batch: int
    max_seq_len: int
    buckets: list[int]


def load(out_dir: str) -> Artifacts:
    with open(os.path.join(out_dir, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{out_dir}: not a {FORMAT} directory")
    with np.load(os.path.join(out_dir, "weights.npz")) as z:
        flat = {}
        for key, dt in manifest["weights"].items():
            a = z[key.replace("/", ".")]
            flat[key] = jnp.asarray(a.view(jnp.bfloat16) if dt == "bfloat16" else a)
    with open(os.path.join(out_dir, "tokenizer.json")) as f:
        tok = tokenizer_from_json(f.read())
    return Artifacts(ExportSteps(out_dir, manifest), _unflatten(flat), tok, manifest["name"],
                     manifest["chat_system"], manifest["max_batch"], manifest["max_seq_len"],
                     manifest["buckets"])
