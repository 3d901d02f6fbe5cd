"""How the engine step's inputs travel to the device: packed in three arrays, one transfer each
instead of one per field (a transfer costs about as much as a small step on a CPU backend).
Every int32 field is flattened into "ints" (the seeds bit-cast, the flag as 0/1), the float32
ones into "floats", and "chunk_table" goes on its own (its length gives the table width); the
previous step's ids ("prev_ids", already on the device) give the row count. The fields are those
of model.paged_step. No model code here: exported programs are served with this module alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Ids a sampling row can suppress (min_tokens: a request's eos and stop token ids).
MAX_SUPPRESSED_IDS = 16

_INT_FIELDS = ("tokens", "prev_row", "positions", "slots", "dec_tables", "chunk_last", "top_k",
               "seeds", "sample_pos", "suppress_ids", "want_logprobs")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p")


def pack_step_inputs(inp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Host-side packing of paged_step's inputs (all but prev_ids)."""
    ints = []
    for k in _INT_FIELDS:
        a = np.asarray(inp[k])
        ints.append((a.view(np.int32) if a.dtype == np.uint32 else a.astype(np.int32)).ravel())
    return {"ints": np.concatenate(ints),
            "floats": np.concatenate([np.asarray(inp[k], np.float32).ravel()
                                      for k in _FLOAT_FIELDS]),
            "chunk_table": np.asarray(inp["chunk_table"], np.int32)}


def packed_int_length(b: int, c: int, w: int) -> int:
    r = b + 1
    return 3 * (b + c) + b + b * w + 1 + r + 2 * r + r + r * MAX_SUPPRESSED_IDS + 1


def unpack_step_inputs(packed: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Inverse of pack_step_inputs, inside the jitted step (shapes are static)."""
    r = packed["prev_ids"].shape[0]
    b, w = r - 1, packed["chunk_table"].shape[0]
    c = (packed["ints"].shape[0] - packed_int_length(b, 0, w)) // 3
    sizes = {"tokens": (b + c,), "prev_row": (b,), "positions": (b + c,), "slots": (b + c,),
             "dec_tables": (b, w), "chunk_last": (), "top_k": (r,), "seeds": (r, 2),
             "sample_pos": (r,), "suppress_ids": (r, MAX_SUPPRESSED_IDS), "want_logprobs": ()}
    out: dict[str, jax.Array] = {"prev_ids": packed["prev_ids"],
                                 "chunk_table": packed["chunk_table"]}
    at = 0
    for k in _INT_FIELDS:
        n = int(np.prod(sizes[k], dtype=np.int64))
        out[k] = packed["ints"][at:at + n].reshape(sizes[k])
        at += n
    out["seeds"] = jax.lax.bitcast_convert_type(out["seeds"], jnp.uint32)
    out["want_logprobs"] = out["want_logprobs"] != 0
    for i, k in enumerate(_FLOAT_FIELDS):
        out[k] = packed["floats"][i * r:(i + 1) * r]
    return out
