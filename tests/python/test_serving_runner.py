"""The runner's pieces without a model: packed step inputs survive the trip to the device, shape
buckets are chosen (or refused with a reason), engine configurations are validated."""

from __future__ import annotations

import numpy as np
import pytest

from flexnpu.serving.step_io import MAX_SUPPRESSED_IDS


def _inputs(b: int, c: int, w: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    r = b + 1

    def ints(*shape):
        return rng.integers(-5, 1000, shape).astype(np.int32)

    return {"tokens": ints(b + c), "prev_row": ints(b), "positions": ints(b + c),
            "slots": ints(b + c), "dec_tables": ints(b, w), "chunk_table": ints(w),
            "chunk_last": np.int32(c - 1), "temperature": rng.random(r).astype(np.float32),
            "top_k": ints(r), "top_p": rng.random(r).astype(np.float32),
            "min_p": rng.random(r).astype(np.float32),
            "seeds": rng.integers(0, 2**32, (r, 2), dtype=np.uint64).astype(np.uint32),
            "sample_pos": ints(r), "suppress_ids": ints(r, MAX_SUPPRESSED_IDS),
            "want_logprobs": np.bool_(True)}


@pytest.mark.parametrize(("b", "c", "w"), [(4, 0, 3), (2, 16, 8), (1, 5, 1)])
def test_packed_step_inputs_round_trip(b, c, w, npu_devices) -> None:
    import jax

    from flexnpu.serving.step_io import pack_step_inputs, unpack_step_inputs

    inp = _inputs(b, c, w)
    packed = jax.device_put(pack_step_inputs(inp), npu_devices[0])
    assert sorted(packed) == ["chunk_table", "floats", "ints"]
    packed["prev_ids"] = jax.device_put(np.arange(b + 1, dtype=np.int32), npu_devices[0])
    got = jax.jit(unpack_step_inputs)(packed)
    for k, v in inp.items():
        g = np.asarray(got[k])
        assert g.dtype == np.asarray(v).dtype and np.array_equal(g, v), k
    assert np.asarray(got["prev_ids"]).tolist() == list(range(b + 1))


def test_shape_buckets() -> None:
    from flexnpu.serving.runner import RunnerShapes, powers_of_two

    assert powers_of_two(16, 100) == (16, 32, 64, 100)
    sh = RunnerShapes(num_seqs=4, block_size=16, num_blocks=64, max_blocks_per_seq=32,
                      chunk_buckets=(16, 64), handoff_buckets=(1, 2, 4), decode_widths=(4, 8))
    assert sh.widths == (4, 8, 32)
    assert [sh.decode_width(n) for n in (1, 4, 5, 9, 32)] == [4, 4, 8, 32, 32]
    assert [sh.chunk_bucket(n) for n in (1, 16, 17, 64)] == [16, 16, 64, 64]
    with pytest.raises(ValueError, match="chunk of 65 tokens exceeds the largest chunk bucket 64"):
        sh.chunk_bucket(65)
    with pytest.raises(ValueError, match="handoff of 5 blocks exceeds the largest bucket 4"):
        sh.handoff_bucket(5)


def test_engine_config_is_validated() -> None:
    from flexnpu.serving.engine import EngineConfig

    with pytest.raises(ValueError, match="layout 'mixed': expected one of colocated, split"):
        EngineConfig(layout="mixed").validate()
    with pytest.raises(ValueError, match="split layout needs >= 1 prefill and >= 1 decode"):
        EngineConfig(layout="split", decode_devices=0).validate()
    with pytest.raises(ValueError, match="largest chunk bucket 64 < max_num_batched_tokens 128"):
        EngineConfig(max_num_batched_tokens=128, chunk_buckets=[64]).resolved_chunk_buckets()
    with pytest.raises(ValueError, match=r"decode widths \[0\] outside \[1, 64\] blocks"):
        EngineConfig(decode_widths=[0]).resolved_decode_widths()
    ec = EngineConfig(max_num_seqs=4, max_model_len=1000, block_size=16)
    assert ec.max_blocks_per_seq == 63 and ec.blocks_per_instance() == 4 * 63
    assert ec.resolved_decode_widths() == (15, 63)
    assert ec.resolved_chunk_buckets() == (64, 128, 256)
