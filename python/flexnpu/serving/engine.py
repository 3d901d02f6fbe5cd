"""Continuous-batching engine over `jax.devices()` of any platform.

Decode runs in *groups*, one per decode device: a KV cache [L, B, S, n_kv, D] (donated across
steps) and B batch slots that requests join and leave at every step. Prompts are padded to
length buckets, so the programs are bounded and compiled at start-up.

Two device layouts (JetStream-style slices taken from `jax.devices()` in order):
- interleaved: every device runs both phases; the generate loop prefills waiting requests into
  free slots between decode steps (prefill first, like vLLM without chunking);
- split (`prefill_devices`, `decode_devices`): one prefill thread per prefill device; the KV of a
  prefilled prompt is handed to its decode device with `jax.device_put` and inserted into a
  free slot by the generate loop, so prefill overlaps decode.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import numpy as np

from flexnpu.serving import kvcache
from flexnpu.serving.config import LlamaConfig
from flexnpu.serving.sampling import SamplingParams, sample

# A sink receives (token_id, None) for each token, then (None, finish_reason) exactly once;
# it is called on an engine thread and must not block.
Sink = Callable[[int | None, str | None], None]


class Steps(Protocol):
    """The compiled programs the engine runs (from model code or from `jax.export` artifacts)."""

    config: LlamaConfig

    def prefill(self, params: Any, tokens: np.ndarray, length: np.ndarray) -> tuple: ...

    def decode(self, params: Any, ck: Any, cv: Any, tokens: Any, pos: Any) -> tuple: ...

    def insert(self, ck: Any, cv: Any, k: Any, v: Any, slot: Any) -> tuple: ...


class ModelSteps:
    def __init__(self, config: LlamaConfig) -> None:
        from flexnpu.serving import model as model_lib

        self.config = config
        self.prefill, self.decode, self.insert = model_lib.jitted_steps(config)


def default_buckets(max_prompt: int, smallest: int = 32) -> list[int]:
    out, b = [], smallest
    while b < max_prompt:
        out.append(b)
        b *= 2
    return [*out, max_prompt]


@dataclass
class EngineConfig:
    max_batch: int = 8  # slots per decode device
    max_seq_len: int = 1024  # KV positions per slot (the served context length)
    buckets: list[int] | None = None  # prompt length buckets; default powers of two
    prefill_devices: int = 0  # 0: interleaved mode
    decode_devices: int = 1  # split: decode devices; interleaved: devices doing both
    max_prefills_per_step: int = 4  # interleaved mode: admissions between two decode steps

    def resolved_buckets(self) -> list[int]:
        b = sorted(self.buckets or default_buckets(min(512, self.max_seq_len - 1)))
        if b[-1] >= self.max_seq_len:
            raise ValueError(f"bucket {b[-1]} must be < max_seq_len {self.max_seq_len}")
        return b


@dataclass
class Request:
    id: int
    prompt_ids: list[int]
    sampling: SamplingParams
    sink: Sink
    arrival: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    first_token_time: float | None = None
    last_token_time: float | None = None
    aborted: bool = False
    done: bool = False
    rng: np.random.Generator | None = None


@dataclass
class _Ready:  # a prefilled request whose KV is on its decode group's device
    req: Request
    group: _Group
    slot: int
    k: Any
    v: Any


class _Group:
    def __init__(self, index: int, device, cache: tuple, batch: int) -> None:
        self.index = index
        self.device = device
        self.ck, self.cv = cache
        self.slots: list[Request | None] = [None] * batch
        self.reserved = [False] * batch
        self.pos = np.zeros(batch, np.int32)
        self.tokens = np.zeros(batch, np.int32)
        self.params: Any = None

    def free_slots(self) -> int:
        return sum(1 for s, r in zip(self.slots, self.reserved, strict=True) if s is None and not r)


class Engine:
    def __init__(self, steps: Steps, params: Any, config: EngineConfig, devices=None,
                 metrics=None, eos_id: int | None = None) -> None:
        self.steps = steps
        self.cfg = steps.config
        self.ec = config
        self.buckets = config.resolved_buckets()
        self.eos_id = self.cfg.eos_id if eos_id is None else eos_id
        self.metrics = metrics
        devices = list(devices if devices is not None else jax.devices())
        n_pre, n_dec = config.prefill_devices, config.decode_devices
        if n_pre + n_dec > len(devices):
            raise ValueError(f"{n_pre} prefill + {n_dec} decode devices requested, "
                             f"only {len(devices)} available: {devices}")
        self.split = n_pre > 0
        self.prefill_devs = devices[:n_pre] if self.split else devices[:n_dec]
        decode_devs = devices[n_pre:n_pre + n_dec]
        dtype = jax.tree_util.tree_leaves(params)[0].dtype
        self._params = {d: jax.device_put(params, d) for d in {*self.prefill_devs, *decode_devs}}
        self.groups = [
            _Group(i, d, kvcache.init_cache(self.cfg, config.max_batch, config.max_seq_len,
                                              dtype, d), config.max_batch)
            for i, d in enumerate(decode_devs)
        ]
        for g in self.groups:
            g.params = self._params[g.device]
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._waiting: queue.Queue[Request] = queue.Queue()
        self._ready: queue.Queue[_Ready] = queue.Queue()
        self._slots_free = threading.Semaphore(config.max_batch * len(self.groups))
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.num_waiting = 0
        self.step_log: list[tuple[int, ...]] = []  # active request ids per decode step (tests)
        self.keep_step_log = False
        self.decode_steps = 0

    # ---- public API -------------------------------------------------------------------------

    @property
    def max_prompt_len(self) -> int:
        return self.buckets[-1]

    def warmup(self, progress: Callable[[int], Any] | None = None) -> int:
        """Compiles (by running) every program on every device it will run on: prefill per
        bucket per prefill device, insert per bucket and decode per decode group."""
        done = 0
        for d in self.prefill_devs:
            for b in self.buckets:
                out = self.steps.prefill(self._params[d], np.zeros(b, np.int32), np.int32(1))
                jax.block_until_ready(out)
                done += 1
                if progress:
                    progress(1)
        for g in self.groups:
            for b in self.buckets:
                k, v = _dummy_kv(self.cfg, b, g.ck.dtype, g.device)
                g.ck, g.cv = self.steps.insert(g.ck, g.cv, k, v, np.int32(0))
                done += 1
                if progress:
                    progress(1)
            logits, g.ck, g.cv = self.steps.decode(g.params, g.ck, g.cv, g.tokens, g.pos)
            jax.block_until_ready(logits)
            done += 1
            if progress:
                progress(1)
        return done

    def num_warmup_programs(self) -> int:
        return len(self.buckets) * (len(self.prefill_devs) + len(self.groups)) + len(self.groups)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._generate_loop, name="generate",
                                          daemon=True)]
        if self.split:
            for i, d in enumerate(self.prefill_devs):
                self._threads.append(threading.Thread(
                    target=self._prefill_loop, args=(d,), name=f"prefill-{i}", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=30)

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, sink: Sink) -> Request:
        if not 1 <= len(prompt_ids) <= self.max_prompt_len:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens; this server takes 1 to "
                             f"{self.max_prompt_len}")
        req = Request(next(self._ids), list(prompt_ids), sampling, sink)
        req.rng = sampling.rng()
        with self._lock:
            self.num_waiting += 1
        self._waiting.put(req)
        self._wake.set()
        self._update_gauges()
        return req

    def abort(self, req: Request) -> None:
        """Frees the request's slot at the next step (e.g. its client disconnected)."""
        req.aborted = True
        self._wake.set()

    def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                 timeout: float = 120) -> tuple[list[int], str]:
        """Blocking helper: the generated ids and the finish reason."""
        out: list[int] = []
        fin: list[str] = []
        done = threading.Event()

        def sink(tok: int | None, reason: str | None) -> None:
            if tok is not None:
                out.append(tok)
            if reason is not None:
                fin.append(reason)
                done.set()

        self.submit(prompt_ids, sampling, sink)
        if not done.wait(timeout):
            raise TimeoutError("generation did not finish")
        return out, fin[0]

    def num_running(self) -> int:
        return sum(1 for g in self.groups for s in g.slots if s is not None)

    def kv_usage(self) -> float:
        used = sum(int(g.pos[i]) + 1 for g in self.groups for i, s in enumerate(g.slots)
                   if s is not None)
        return used / (len(self.groups) * self.ec.max_batch * self.ec.max_seq_len)

    # ---- internals ----------------------------------------------------------------------------

    def _bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _prefill(self, req: Request, device) -> tuple[int, Any, Any]:
        n = len(req.prompt_ids)
        toks = np.zeros(self._bucket(n), np.int32)
        toks[:n] = req.prompt_ids
        logits, k, v = self.steps.prefill(self._params[device], toks, np.int32(n))
        return self._sample(req, np.asarray(logits)), k, v

    def _sample(self, req: Request, logits: np.ndarray) -> int:
        assert req.rng is not None
        return sample(logits, req.sampling, req.rng)

    def _reserve_slot(self) -> tuple[_Group, int] | None:
        with self._lock:
            g = max(self.groups, key=lambda g: g.free_slots())
            for i in range(len(g.slots)):
                if g.slots[i] is None and not g.reserved[i]:
                    g.reserved[i] = True
                    return g, i
        return None

    def _take_waiting(self) -> Request | None:
        try:
            req = self._waiting.get_nowait()
        except queue.Empty:
            return None
        with self._lock:
            self.num_waiting -= 1
        return req

    def _prefill_loop(self, device) -> None:
        while not self._stop.is_set():
            if not self._slots_free.acquire(timeout=0.1):
                continue
            req = None
            while req is None and not self._stop.is_set():
                try:
                    req = self._waiting.get(timeout=0.1)
                except queue.Empty:
                    continue
            if req is None:
                self._slots_free.release()
                return
            with self._lock:
                self.num_waiting -= 1
            if req.aborted:
                self._finish(req, "abort")
                self._slots_free.release()
                continue
            first, k, v = self._prefill(req, device)
            got = self._reserve_slot()
            assert got is not None  # the semaphore guarantees a free slot
            g, slot = got
            # KV handoff: prefill device → decode device (a no-op when they are the same).
            k, v = jax.device_put((k, v), g.device)
            self._emit(req, first)
            self._ready.put(_Ready(req, g, slot, k, v))
            self._wake.set()

    def _admit_interleaved(self) -> None:
        for _ in range(self.ec.max_prefills_per_step):
            if not any(g.free_slots() for g in self.groups):
                return
            req = self._take_waiting()
            if req is None:
                return
            if req.aborted:
                self._finish(req, "abort")
                continue
            got = self._reserve_slot()
            assert got is not None
            g, slot = got
            first, k, v = self._prefill(req, g.device)
            self._emit(req, first)
            self._insert(_Ready(req, g, slot, k, v))

    def _insert(self, r: _Ready) -> None:
        g, slot, req = r.group, r.slot, r.req
        with self._lock:
            g.reserved[slot] = False
            if req.done:  # finished at its first token (eos, max_tokens=1, abort)
                self._release_slot()
                return
            g.slots[slot] = req
        g.ck, g.cv = self.steps.insert(g.ck, g.cv, r.k, r.v, np.int32(slot))
        g.pos[slot] = len(req.prompt_ids)
        g.tokens[slot] = req.output_ids[-1]

    def _release_slot(self) -> None:
        if self.split:
            self._slots_free.release()

    def _emit(self, req: Request, tok: int) -> None:
        """Records one generated token, sends it, finishes the request when it should stop."""
        now = time.perf_counter()
        if req.first_token_time is None:
            req.first_token_time = now
            if self.metrics:
                self.metrics.on_first_token(req, now)
        elif self.metrics and req.last_token_time is not None:
            self.metrics.on_token(now - req.last_token_time)
        req.last_token_time = now
        req.output_ids.append(tok)
        eos = tok == self.eos_id and not req.sampling.ignore_eos
        if not eos:
            req.sink(tok, None)
        if eos:
            self._finish(req, "stop")
        elif len(req.output_ids) >= req.sampling.max_tokens:
            self._finish(req, "length")
        elif len(req.prompt_ids) + len(req.output_ids) >= self.ec.max_seq_len:
            self._finish(req, "length")

    def _finish(self, req: Request, reason: str) -> None:
        if req.done:
            return
        req.done = True
        if self.metrics:
            self.metrics.on_finish(req, time.perf_counter())
            self.metrics.on_reason(reason.split(":")[0])
        req.sink(None, reason)

    def _generate_loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.split:
                    self._admit_interleaved()
                while True:
                    try:
                        self._insert(self._ready.get_nowait())
                    except queue.Empty:
                        break
                self._retire()
                active = [g for g in self.groups if any(s is not None for s in g.slots)]
                if not active:
                    self._update_gauges()
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                outs = []
                for g in active:  # dispatch every group before waiting on any
                    logits, g.ck, g.cv = self.steps.decode(g.params, g.ck, g.cv,
                                                           g.tokens.copy(), g.pos.copy())
                    outs.append(logits)
                if self.keep_step_log:
                    self.step_log.append(tuple(sorted(
                        r.id for g in active for r in g.slots if r is not None)))
                self.decode_steps += 1
                for g, logits in zip(active, outs, strict=True):
                    host = np.asarray(logits)
                    for i, req in enumerate(g.slots):
                        if req is None or req.done:
                            continue
                        tok = self._sample(req, host[i])
                        g.pos[i] += 1
                        g.tokens[i] = tok
                        self._emit(req, tok)
                self._retire()
                self._update_gauges()
        except Exception as e:  # noqa: BLE001 - fail every request rather than hang clients
            import traceback

            traceback.print_exc()
            for g in self.groups:
                for r in g.slots:
                    if r is not None:
                        self._finish(r, f"error: {e}")

    def _retire(self) -> None:
        with self._lock:
            for g in self.groups:
                for i, req in enumerate(g.slots):
                    if req is not None and (req.done or req.aborted):
                        if not req.done:
                            self._finish(req, "abort")
                        g.slots[i] = None
                        self._release_slot()

    def _update_gauges(self) -> None:
        if self.metrics:
            self.metrics.set_gauges(self.num_running(), self.num_waiting, self.kv_usage())


def _dummy_kv(cfg: LlamaConfig, t: int, dtype, device):
    shape = (cfg.num_layers, t, cfg.num_kv_heads, cfg.head_dim)
    z = jax.device_put(np.zeros(shape, dtype), device)
    return z, z
