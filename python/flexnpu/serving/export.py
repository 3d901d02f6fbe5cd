"""`jax.export` artifacts: the engine's paged step (one per prefill chunk bucket, plus the
decode-only step) and the KV handoff programs (extract/insert per bucket) as serialized StableHLO
lowered for both `cpu` and `flexnpu`, plus the weights, the tokenizer and a manifest with the
engine shapes they were exported for. `load` serves them without the model code, unchanged on
either platform."""

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
from flexnpu.serving.runner import powers_of_two
from flexnpu.serving.step_io import packed_int_length
from flexnpu.serving.tokenizer import Tokenizer, tokenizer_from_json

PLATFORMS = ("cpu", "flexnpu")
FORMAT = "flexnpu-serving-export/3"


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


def _step_inputs_spec(ec: EngineConfig, c: int, w: int) -> dict:
    """Shapes of the engine step's packed inputs (step_io) with a chunk of c tokens and block
    tables w blocks wide."""
    b, r = ec.max_num_seqs, ec.max_num_seqs + 1

    def s(n, dt=jnp.int32):
        return jax.ShapeDtypeStruct((n,), dt)

    return {"ints": s(packed_int_length(b, c, w)), "floats": s(3 * r, jnp.float32),
            "chunk_table": s(w), "prev_ids": s(r)}


def export(m, out_dir: str, ec: EngineConfig, platforms=PLATFORMS) -> list[str]:
    """Writes the artifacts of model `m` (a LoadedModel) for the engine shapes of `ec`: the
    paged step per chunk bucket (and decode-only), the KV extract/insert per handoff bucket."""
    from flexnpu.serving import model as model_lib

    ec.validate()
    os.makedirs(out_dir, exist_ok=True)
    cfg: LlamaConfig = m.config
    bs = ec.block_size
    num_blocks = ec.blocks_per_instance()
    chunks = list(ec.resolved_chunk_buckets())
    handoffs = list(powers_of_two(1, ec.max_blocks_per_seq))
    spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), m.params)
    dtype = m.params["layers"]["wq"].dtype
    cache = jax.ShapeDtypeStruct(kvcache.paged_cache_shape(cfg, num_blocks, bs), dtype)

    def write(name: str, fn, *args) -> str:
        exp = jax_export.export(jax.jit(fn), platforms=platforms)(*args)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(exp.serialize())
        return name

    step = partial(model_lib.packed_paged_step, cfg=cfg, block_size=bs,
                   vocab_limit=m.vocab_limit)
    mb = ec.max_blocks_per_seq
    widths = list(ec.resolved_decode_widths())
    shapes = [(0, w) for w in widths] + [(c, mb) for c in chunks]
    files = [write(f"step_{c}_{w}.bin", step, spec, cache, cache, _step_inputs_spec(ec, c, w))
             for c, w in shapes]
    for n in handoffs:
        slots = jax.ShapeDtypeStruct((n * bs,), jnp.int32)
        kv = jax.ShapeDtypeStruct((cfg.num_layers, n * bs, cfg.num_kv_heads, cfg.head_dim),
                                  dtype)
        files.append(write(f"extract_{n}.bin", model_lib.extract_kv, cache, cache, slots))
        files.append(write(f"insert_{n}.bin", model_lib.insert_kv, cache, cache, kv, kv, slots))
    flat = {k: np.asarray(v) for k, v in _flatten(m.params).items()}
    dtypes = {k: str(v.dtype) for k, v in flat.items()}
    np.savez(os.path.join(out_dir, "weights.npz"),
             **{k.replace("/", "."): (v.view(np.uint16) if v.dtype == jnp.bfloat16 else v)
                for k, v in flat.items()})
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        f.write(m.tokenizer.to_json())
    engine = {"max_num_seqs": ec.max_num_seqs, "max_model_len": ec.max_model_len,
              "max_num_batched_tokens": ec.max_num_batched_tokens, "block_size": bs,
              "num_kv_blocks": num_blocks, "chunk_buckets": chunks, "decode_widths": widths}
    manifest = {"format": FORMAT, "name": m.name, "config": cfg.to_dict(), "engine": engine,
                "handoff_buckets": handoffs, "chat_system": m.chat_system,
                "platforms": list(platforms), "weights": dtypes, "programs": files}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return files


class ExportSteps:
    """The runner's Steps from deserialized artifacts (jitted `Exported.call`)."""

    def __init__(self, out_dir: str, manifest: dict) -> None:
        self.config = LlamaConfig.from_dict(manifest["config"])
        eng = manifest["engine"]
        self.block_size = eng["block_size"]
        self._num_seqs = eng["max_num_seqs"]

        def load(name: str, **jit_kw):
            with open(os.path.join(out_dir, name), "rb") as f:
                exp = jax_export.deserialize(bytearray(f.read()))
            return jax.jit(exp.call, **jit_kw)

        mb = -(-eng["max_model_len"] // self.block_size)
        shapes = [(0, w) for w in eng["decode_widths"]] + [(c, mb) for c in eng["chunk_buckets"]]
        self._step = {(c, w): load(f"step_{c}_{w}.bin", donate_argnums=(1, 2))
                      for c, w in shapes}
        self._extract = {n: load(f"extract_{n}.bin") for n in manifest["handoff_buckets"]}
        self._insert = {n: load(f"insert_{n}.bin", donate_argnums=(0, 1))
                        for n in manifest["handoff_buckets"]}

    def _bucket(self, table: dict, key, what: str):
        if key not in table:
            raise ValueError(f"no exported {what} program for size {key}; exported: "
                             f"{sorted(table)}")
        return table[key]

    def step(self, params, ck, cv, inp):
        w = inp["chunk_table"].shape[0]
        c = (inp["ints"].shape[0] - packed_int_length(self._num_seqs, 0, w)) // 3
        return self._bucket(self._step, (c, w), "step (chunk tokens, table width)")(
            params, ck, cv, inp)

    def extract_kv(self, ck, cv, slots):
        return self._bucket(self._extract, slots.shape[0] // self.block_size, "extract")(
            ck, cv, slots)

    def insert_kv(self, ck, cv, k, v, slots):
        return self._bucket(self._insert, slots.shape[0] // self.block_size, "insert")(
            ck, cv, k, v, slots)


@dataclass
class Artifacts:
    steps: ExportSteps
    params: dict
    tokenizer: Tokenizer
    name: str
    chat_system: str | None
    engine: dict  # the EngineConfig fields the programs were exported for

    def engine_config(self, **overrides) -> EngineConfig:
        """An EngineConfig with the exported shapes (layout and the like from `overrides`)."""
        fixed = set(self.engine) & set(overrides)
        if fixed:
            raise ValueError(f"{sorted(fixed)} are fixed by the export: "
                             f"{ {k: self.engine[k] for k in sorted(fixed)} }")
        return EngineConfig(**self.engine, **overrides)


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
                     manifest["chat_system"], manifest["engine"])
