"""The model runner of one engine instance: its device, its paged KV cache and the compiled steps.

It turns a scheduler `StepPlan` into the fixed-shape inputs of one step (B decode rows and at most
one prefill chunk padded to a token-count bucket), dispatches it without waiting, and reads the
sampled ids back later, so the engine can dispatch step k+1 before it does the host work of step
k: a decode row whose input token is step k's output takes it from step k's ids on the device
(`prev_row`). Shapes are bounded (one program per chunk bucket, plus the decode-only step, plus a
KV extract/insert per handoff bucket, and the decode-only step per block-table width, so its
attention reads only the blocks in use) and compiled by `warmup`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import numpy as np

from flexnpu.serving import kvcache
from flexnpu.serving.config import LlamaConfig
from flexnpu.serving.sampling import NUM_TOP_LOGPROBS, SamplingParams
from flexnpu.serving.scheduler import ScheduledSeq, StepPlan
from flexnpu.serving.step_io import MAX_SUPPRESSED_IDS, pack_step_inputs


class Steps(Protocol):
    """The compiled programs a runner runs (from the model code or from jax.export artifacts)."""

    config: LlamaConfig
    block_size: int

    def step(self, params: Any, ck: Any, cv: Any, packed: dict) -> tuple: ...  # see model.py

    def extract_kv(self, ck: Any, cv: Any, slots: Any) -> tuple: ...

    def insert_kv(self, ck: Any, cv: Any, k: Any, v: Any, slots: Any) -> tuple: ...


class ModelSteps:
    def __init__(self, config: LlamaConfig, block_size: int,
                 vocab_limit: int | None = None) -> None:
        """`vocab_limit`: sample only ids below it (a tokenizer smaller than the model's
        vocabulary)."""
        from flexnpu.serving import model as model_lib

        self.config = config
        self.block_size = block_size
        self.step, self.extract_kv, self.insert_kv = model_lib.jitted_paged_steps(
            config, block_size, vocab_limit)


class RowSource(Protocol):
    """What the runner needs of a scheduled sequence's payload (the engine's Request)."""

    sampling: SamplingParams
    seed_words: tuple[int, int]
    prompt_ids: list[int]
    suppressed_ids: tuple[int, ...]  # not sampled before sampling.min_tokens output tokens

    def known_tokens(self) -> list[int]: ...  # prompt + the output tokens known on the host


def powers_of_two(smallest: int, largest: int) -> tuple[int, ...]:
    out, b = [], smallest
    while b < largest:
        out.append(b)
        b *= 2
    return (*out, largest)


@dataclass(frozen=True)
class RunnerShapes:
    num_seqs: int  # B: decode rows of every step (the scheduler's max_num_seqs)
    block_size: int
    num_blocks: int  # the instance's KV pool (the scheduler's num_blocks)
    max_blocks_per_seq: int  # MB: block-table width (ceil(max_model_len / block_size))
    chunk_buckets: tuple[int, ...]  # prefill chunk sizes compiled
    handoff_buckets: tuple[int, ...] = ()  # KV handoff sizes in blocks (split layout)
    # Block-table widths of the decode-only step (its attention reads only that many blocks per
    # row, so short contexts decode fast at a long max_model_len); () = max_blocks_per_seq only.
    # Steps with a prefill chunk always use the full width.
    decode_widths: tuple[int, ...] = ()

    @property
    def trash_block(self) -> int:
        return self.num_blocks

    def chunk_bucket(self, n: int) -> int:
        return _bucket(self.chunk_buckets, n, f"a prefill chunk of {n} tokens", "chunk bucket")

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(sorted({*self.decode_widths, self.max_blocks_per_seq}))

    def decode_width(self, num_blocks: int) -> int:
        return next(w for w in self.widths if w >= num_blocks)

    def handoff_bucket(self, num_blocks: int) -> int:
        return _bucket(self.handoff_buckets, num_blocks, f"a KV handoff of {num_blocks} blocks",
                       "bucket")


def _bucket(buckets: tuple[int, ...], n: int, what: str, kind: str) -> int:
    """The smallest of the ascending `buckets` that holds `n`."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{what} exceeds the largest {kind} {buckets[-1] if buckets else 0}")


@dataclass
class Dispatched:
    """A step in flight: the plan, which row each sampling entry reads, the device outputs."""

    plan: StepPlan
    rows: list[tuple[ScheduledSeq, int]]  # sampling entries and their output row
    row_of: dict[Any, int]  # request id -> output row (for the next step's prev_row)
    ids: Any
    logprob: Any
    top_ids: Any
    top_logprobs: Any
    want_logprobs: bool


@dataclass
class StepOutput:
    ids: np.ndarray
    logprob: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None
    rows: list[tuple[ScheduledSeq, int]] = field(default_factory=list)


class NeedsPreviousStep(Exception):
    """The plan needs token values of the step in flight: fetch it first."""


class Runner:
    def __init__(self, steps: Steps, params: Any, device: Any, shapes: RunnerShapes,
                 dtype: Any) -> None:
        if steps.block_size != shapes.block_size:
            raise ValueError(f"steps compiled for block size {steps.block_size}, runner uses "
                             f"{shapes.block_size}")
        self.steps = steps
        self.device = device
        self.shapes = shapes
        self.params = params
        self.cfg = steps.config
        self._dtype = dtype
        self.reset_cache()
        self._zero_ids = jax.device_put(np.zeros(shapes.num_seqs + 1, np.int32), device)
        self.num_steps = 0

    def reset_cache(self) -> None:
        """A KV cache of its own, new (at start, and after a failed step, whose inputs may have
        been donated)."""
        sh = self.shapes
        self.ck, self.cv = kvcache.init_paged_cache(self.cfg, sh.num_blocks, sh.block_size,
                                                    self._dtype, self.device)

    # ---- one step ------------------------------------------------------------------------

    def prepare(self, plan: StepPlan, prev: Dispatched | None) -> tuple[dict, Dispatched]:
        """Host inputs of `plan`; raises NeedsPreviousStep when a token it needs is only in
        `prev`'s outputs in a way a decode row cannot read (a chunk)."""
        sh = self.shapes
        b, bs, mb, trash = sh.num_seqs, sh.block_size, sh.max_blocks_per_seq, sh.trash_block
        singles = [e for e in plan.scheduled if e.num_tokens == 1]
        chunks = [e for e in plan.scheduled if e.num_tokens > 1]
        if len(singles) > b or len(chunks) > 1:
            raise RuntimeError(f"plan {plan.step_id}: {len(singles)} single-token entries and "
                               f"{len(chunks)} chunks; the runner takes {b} and 1")
        c = sh.chunk_bucket(chunks[0].num_tokens) if chunks else 0
        r = b + 1
        tokens = np.zeros(b + c, np.int32)
        prev_row = np.full(b, -1, np.int32)
        positions = np.zeros(b + c, np.int32)
        slots = np.full(b + c, trash * bs, np.int32)
        dec_tables = np.full((b, mb), trash, np.int32)
        chunk_table = np.full(mb, trash, np.int32)
        temperature = np.zeros(r, np.float32)
        top_k = np.zeros(r, np.int32)
        top_p = np.ones(r, np.float32)
        min_p = np.zeros(r, np.float32)
        seeds = np.zeros((r, 2), np.uint32)
        sample_pos = np.zeros(r, np.int32)
        suppress_ids = np.full((r, MAX_SUPPRESSED_IDS), self.cfg.vocab_size, np.int32)
        rows: list[tuple[ScheduledSeq, int]] = []
        want_logprobs = False

        def sampling_row(row: int, e: ScheduledSeq, src: RowSource) -> None:
            nonlocal want_logprobs
            sp = src.sampling
            temperature[row], top_k[row], top_p[row], min_p[row] = (
                sp.temperature, sp.top_k, sp.top_p, sp.min_p)
            seeds[row] = src.seed_words
            sample_pos[row] = e.start + e.num_tokens
            if sample_pos[row] - len(src.prompt_ids) < sp.min_tokens:  # outputs before this one
                ids = src.suppressed_ids
                suppress_ids[row, :len(ids)] = ids
            want_logprobs |= sp.logprobs is not None
            rows.append((e, row))

        for row, e in enumerate(singles):
            src: RowSource = e.seq.payload
            known = src.known_tokens()
            if e.start < len(known):
                tokens[row] = known[e.start]
            elif prev is not None and e.seq.request_id in prev.row_of:
                prev_row[row] = prev.row_of[e.seq.request_id]
            else:
                raise NeedsPreviousStep
            positions[row] = e.start
            slots[row] = kvcache.slots_of(e.seq.blocks, e.start, 1, bs)[0]
            dec_tables[row, :len(e.seq.blocks)] = e.seq.blocks
            if e.samples:
                sampling_row(row, e, src)
        chunk_last = 0
        if chunks:
            e = chunks[0]
            src = e.seq.payload
            known = src.known_tokens()
            n = e.num_tokens
            if e.start + n > len(known):
                raise NeedsPreviousStep
            tokens[b:b + n] = known[e.start:e.start + n]
            positions[b:b + n] = np.arange(e.start, e.start + n)
            slots[b:b + n] = kvcache.slots_of(e.seq.blocks, e.start, n, bs)
            chunk_table[:len(e.seq.blocks)] = e.seq.blocks
            chunk_last = n - 1
            if e.samples:
                sampling_row(b, e, src)
        if not c:  # decode-only: read no more blocks than the longest row has
            w = sh.decode_width(max((len(e.seq.blocks) for e in singles), default=1))
            dec_tables, chunk_table = dec_tables[:, :w], chunk_table[:w]
        inp = {
            "tokens": tokens, "prev_row": prev_row, "positions": positions, "slots": slots,
            "dec_tables": dec_tables, "chunk_table": chunk_table,
            "chunk_last": np.int32(chunk_last), "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "min_p": min_p, "seeds": seeds, "sample_pos": sample_pos,
            "suppress_ids": suppress_ids, "want_logprobs": np.bool_(want_logprobs),
        }
        d = Dispatched(plan, rows, {e.seq.request_id: row for e, row in rows}, None, None, None,
                       None, want_logprobs)
        return inp, d

    def dispatch(self, inp: dict, d: Dispatched, prev: Dispatched | None) -> Dispatched:
        """Runs the step asynchronously (nothing here waits for the device)."""
        dev_inp = self.device_inputs(inp, prev.ids if prev is not None else None)
        d.ids, d.logprob, d.top_ids, d.top_logprobs, self.ck, self.cv = self.steps.step(
            self.params, self.ck, self.cv, dev_inp)
        self.num_steps += 1
        return d

    def device_inputs(self, inp: dict, prev_ids: Any = None) -> dict:
        """The step's host inputs packed and put on this device (three transfers)."""
        dev = jax.device_put(pack_step_inputs(inp), self.device)
        dev["prev_ids"] = self._zero_ids if prev_ids is None else prev_ids
        return dev

    def fetch(self, d: Dispatched) -> StepOutput:
        """Waits for the step and reads its sampled ids (and logprobs when asked) to the host."""
        out = StepOutput(np.asarray(d.ids), rows=d.rows)
        if d.want_logprobs:
            out.logprob = np.asarray(d.logprob)
            out.top_ids = np.asarray(d.top_ids)
            out.top_logprobs = np.asarray(d.top_logprobs)
        return out

    # ---- KV handoff (split layout) -----------------------------------------------------------

    def _handoff_slots(self, blocks: Sequence[int], num_blocks: int) -> np.ndarray:
        padded = np.full(num_blocks, self.shapes.trash_block, np.int32)
        padded[:len(blocks)] = blocks
        bs = self.shapes.block_size
        return (padded[:, None] * bs + np.arange(bs, dtype=np.int32)).reshape(-1)

    def extract_kv(self, blocks: Sequence[int]) -> tuple[Any, Any]:
        """The KV of a sequence's blocks (padded to a handoff bucket), still on this device."""
        n = self.shapes.handoff_bucket(len(blocks))
        slots = jax.device_put(self._handoff_slots(blocks, n), self.device)
        return self.steps.extract_kv(self.ck, self.cv, slots)

    def insert_kv(self, k: Any, v: Any, blocks: Sequence[int]) -> None:
        """Writes handed-off KV (from extract_kv, already on this device) into `blocks`."""
        n = k.shape[1] // self.shapes.block_size
        if len(blocks) > n:
            blocks = blocks[:n]  # the blocks past the handed-off positions are filled by decode
        slots = jax.device_put(self._handoff_slots(blocks, n), self.device)
        self.ck, self.cv = self.steps.insert_kv(self.ck, self.cv, k, v, slots)

    # ---- start-up ----------------------------------------------------------------------------

    def programs(self) -> list[tuple[str, int, int]]:
        """Every program shape this runner runs: ("step", chunk tokens, block-table width) and
        ("handoff", blocks, 0)."""
        sh = self.shapes
        return [*(("step", 0, w) for w in sh.widths),
                *(("step", c, sh.max_blocks_per_seq) for c in sh.chunk_buckets),
                *(("handoff", n, 0) for n in sh.handoff_buckets)]

    def warmup(self, progress: Callable[[int], Any] | None = None) -> int:
        """Compiles every program. A jitted step is lowered and compiled without running (a
        program the persistent compilation cache has is only loaded, and the step's later calls
        find the executable); other programs run once on padding that writes only the trash
        block."""
        sh = self.shapes
        done = 0
        for kind, n, width in self.programs():
            if kind == "step":
                inputs = self.device_inputs(self._padding_inputs(n, width))
                lower = getattr(self.steps.step, "lower", None)
                if lower is not None:
                    lower(self.params, self.ck, self.cv, inputs).compile()
                else:  # e.g. jax.export artifacts, a step per shape behind one method
                    out = self.steps.step(self.params, self.ck, self.cv, inputs)
                    self.ck, self.cv = out[4], out[5]
                    jax.block_until_ready(out[0])
            else:
                k, v = self.extract_kv([sh.trash_block] * n)
                self.insert_kv(k, v, [sh.trash_block] * n)
                jax.block_until_ready(self.ck)
            done += 1
            if progress:
                progress(1)
        return done

    def time_prefill_step(self, repeats: int = 3) -> tuple[int, float]:
        """(tokens, seconds) of a full-budget prefill step (the largest chunk bucket, on
        padding that writes only the trash block): the fastest of `repeats` runs after one
        that compiles. The adaptive layout's advisor sizes a unit's prefill capacity by it."""
        c = self.shapes.chunk_buckets[-1]
        inputs = self.device_inputs(self._padding_inputs(c))
        best = float("inf")
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            out = self.steps.step(self.params, self.ck, self.cv, inputs)
            self.ck, self.cv = out[4], out[5]
            jax.block_until_ready(out[0])
            if i:
                best = min(best, time.perf_counter() - t0)
        return c, best

    def _padding_inputs(self, c: int, width: int | None = None) -> dict:
        sh = self.shapes
        b, r = sh.num_seqs, sh.num_seqs + 1
        width = width or sh.max_blocks_per_seq
        return {
            "tokens": np.zeros(b + c, np.int32), "prev_row": np.full(b, -1, np.int32),
            "positions": np.zeros(b + c, np.int32),
            "slots": np.full(b + c, sh.trash_block * sh.block_size, np.int32),
            "dec_tables": np.full((b, width), sh.trash_block, np.int32),
            "chunk_table": np.full(width, sh.trash_block, np.int32),
            "chunk_last": np.int32(0), "temperature": np.zeros(r, np.float32),
            "top_k": np.zeros(r, np.int32), "top_p": np.ones(r, np.float32),
            "min_p": np.zeros(r, np.float32), "seeds": np.zeros((r, 2), np.uint32),
            "sample_pos": np.zeros(r, np.int32),
            "suppress_ids": np.full((r, MAX_SUPPRESSED_IDS), self.cfg.vocab_size, np.int32),
            "want_logprobs": np.bool_(False),
        }


def top_logprobs(out: StepOutput, row: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The sampled token's logprob and the top k (id, logprob) of one output row."""
    assert out.logprob is not None and out.top_ids is not None and out.top_logprobs is not None
    k = min(k, NUM_TOP_LOGPROBS)
    return float(out.logprob[row]), [(int(i), float(p)) for i, p in
                                     zip(out.top_ids[row, :k], out.top_logprobs[row, :k],
                                         strict=True)]
