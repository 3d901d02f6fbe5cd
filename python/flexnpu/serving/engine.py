"""The serving engine: instances (a scheduler + a runner on one device, each with its own thread)
over `jax.devices()`, request routing, KV handoff between instances, and failure handling.

Layouts (JetStream-style slices of `jax.devices()` in order):
- co-located (default): every device is a MIXED instance; a step carries the decodes of its
  running sequences and one prefill chunk (Sarathi-style mixed batch), and the instances run
  concurrently, so prefill bursts and decode streams contend for the devices underneath;
- split: the first `prefill_devices` devices are PREFILL instances, the next `decode_devices`
  DECODE instances; a prefilled sequence's KV goes to the least loaded decode instance with
  `jax.device_put` and is written into its blocks before the decode step that continues it;
- static-colocate: every device hosts a PREFILL and a DECODE instance (the paper's static
  co-location: both phases share each device, the KV handed over on the device);
- adaptive: static-colocate's instances, and the split advisor decides
  how many devices take new prompts (the others decode); when a device changes side its running
  decodes move to the decode side with their KV and its queued prompts go back to the router.

Which instance takes a prompt or a prefilled sequence, the split and what moves are decided by
the cluster layer (serving/cluster.py), the same code the simulator runs; this module does the
mechanics (threads, steps, KV copies).

Each instance thread plans step k+1 and dispatches it before it waits for step k's tokens (the
scheduler counts outputs optimistically; a decode row reads its input token from step k's ids on
the device), then does step k's host work: output callbacks, finishes, handoffs.

Robustness: an instance whose thread fails is isolated: its requests go on at the other
instances (recomputed from their prompt and the tokens they have: none lost or repeated; one
that cannot move ends with an error naming the instance), its scheduler and KV cache start
afresh and it serves again; one that fails MAX_INSTANCE_FAILURES times within
INSTANCE_FAILURE_WINDOW_S is taken out of service (routers pass it over). The engine stops
serving (every request ends with the error, new ones are refused) only when no instance can
take a prompt or its handoff. `health()` says which instance is in what state. Requests have
optional deadlines ("timeout"); the waiting queue is bounded (QueueFullError); `abort` ends a
request at once, and its KV blocks go back when its instance next plans a step (a plan being
prepared or in flight may still hold them).

Across engines (hosts, serving/multihost): `submit(..., export=...)` stops a request after its
prompt (at its first token) and gives its KV and what its decode needs to `export` as a
PrefilledSequence; `export_running` does the same for requests already decoding (at their next
token: the prompt, the tokens so far and the KV of all of them); `submit_prefilled` continues
such a sequence in another engine, its KV written into its blocks before the decode step that
continues it (as a handoff between instances). A token's randomness is its seed and its
position, so a moved request samples what it would have where it was.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import threading
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from flexnpu.serving.cluster import (
    LAYOUTS,
    Cluster,
    ClusterInstance,
    NoLiveInstanceError,
    SplitSettings,
    unit_roles,
)
from flexnpu.serving.engine_client import InstanceHealth, ModelLimits
from flexnpu.serving.layout import emulated_time_scale
from flexnpu.serving.output import (
    IdsOutput,
    RequestOutput,
    TokenLogprobs,
    deliver_finish,
    observe_token,
    suppressed_ids,
)
from flexnpu.serving.runner import (
    Dispatched,
    ModelSteps,
    NeedsPreviousStep,
    Runner,
    RunnerShapes,
    Steps,
    powers_of_two,
    top_logprobs,
)
from flexnpu.serving.sampling import SamplingParams
from flexnpu.serving.scheduler import (
    QueueFullError,
    RequestTooLongError,
    Role,
    Scheduler,
    SchedulerConfig,
    Sequence,
)

__all__ = ["Engine", "EngineConfig", "EngineDeadError", "ModelSteps", "PrefilledSequence",
           "QueueFullError", "Request", "RequestTooLongError"]

# An instance that fails this often within this window is taken out of service instead of
# restarted: a device that keeps failing would otherwise fail every request routed to it.
MAX_INSTANCE_FAILURES = 3
INSTANCE_FAILURE_WINDOW_S = 60.0
# A request on an instance when it failed goes on elsewhere this many times; at the next
# failure it ends with the error: a request that itself fails its steps would otherwise take
# every instance down in turn.
MAX_REQUEUES = 1


class EngineDeadError(RuntimeError):
    """The engine failed (see `engine.error`) and takes no more requests (HTTP 503)."""


class InjectedFault(RuntimeError):
    """A failure asked for by `Engine.inject_fault` (soak and fault tests)."""


@dataclass
class EngineConfig:
    max_num_seqs: int = 8  # decode batch per instance
    max_model_len: int = 1024  # prompt + output positions per request
    max_num_batched_tokens: int = 256  # token budget per step = the largest prefill chunk
    block_size: int = 16
    num_kv_blocks: int = 0  # per instance; 0: max_num_seqs full-length sequences (no preemption)
    max_waiting: int = 1024  # per entry instance; QueueFullError beyond
    request_timeout: float | None = None  # seconds; requests without a deadline get this one
    layout: str = "colocated"
    num_devices: int = 0  # co-located: instances; adaptive: devices (0: every device)
    prefill_devices: int = 1  # split layout
    decode_devices: int = 1  # split layout
    chunk_buckets: list[int] | None = None  # default: powers of two from 64 to the budget
    # Decode-only steps are compiled for these block-table widths in blocks (attention reads
    # only the blocks in use); default: max_blocks_per_seq / 4 and all of them (each width and
    # each chunk bucket is one more program to compile per device at start-up).
    decode_widths: list[int] | None = None
    # Adaptive layout: one device's prefill throughput at a full batch (tokens/s) for the
    # split advisor; 0: measured at warm-up (a full-budget prefill step, timed).
    prefill_tokens_per_s: float = 0.0
    split_hold_s: float = 2.0  # the advisor's hysteresis hold (0: off)
    split_backlog_drain_s: float = 2.0  # queued prompts drained over this (0: not counted)
    split_colocate: bool = True  # every device co-located while the needs fill the cluster ...
    split_tpot_target_s: float = 0.1  # ... unless a full prompt chunk takes longer (0: unchecked)
    keep_cluster_log: bool = False  # the cluster layer's decisions, for tests
    # Compile the KV handoff programs in every layout: prefilled sequences go to or come from
    # other engines (submit(export=...), submit_prefilled).
    kv_handoff: bool = False

    def validate(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: expected one of {', '.join(LAYOUTS)}")
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_kv_blocks < 0 or self.num_devices < 0:
            raise ValueError("num_kv_blocks and num_devices must be >= 0")
        if self.layout == "split" and (self.prefill_devices < 1 or self.decode_devices < 1):
            raise ValueError("the split layout needs >= 1 prefill and >= 1 decode device")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0, got {self.request_timeout}")
        if not self.prefill_tokens_per_s >= 0:
            raise ValueError(f"prefill_tokens_per_s must be >= 0, got {self.prefill_tokens_per_s}")
        if not (self.split_hold_s >= 0 and self.split_backlog_drain_s >= 0
                and self.split_tpot_target_s >= 0):
            raise ValueError("split_hold_s, split_backlog_drain_s and split_tpot_target_s must "
                             "be >= 0")

    @property
    def max_blocks_per_seq(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def blocks_per_instance(self) -> int:
        return self.num_kv_blocks or self.max_num_seqs * self.max_blocks_per_seq

    def resolved_decode_widths(self) -> tuple[int, ...]:
        mb = self.max_blocks_per_seq
        if self.decode_widths is not None:
            bad = [w for w in self.decode_widths if not 1 <= w <= mb]
            if bad:
                raise ValueError(f"decode widths {bad} outside [1, {mb}] blocks")
            return tuple(sorted({*self.decode_widths, mb}))
        return tuple(sorted({max(1, mb // 4), mb}))

    def resolved_chunk_buckets(self) -> tuple[int, ...]:
        if self.chunk_buckets:
            b = tuple(sorted(set(self.chunk_buckets)))
            if b[-1] < self.max_num_batched_tokens:
                raise ValueError(f"largest chunk bucket {b[-1]} < max_num_batched_tokens "
                                 f"{self.max_num_batched_tokens}")
            return b
        return powers_of_two(min(64, self.max_num_batched_tokens), self.max_num_batched_tokens)


@dataclass(eq=False)
class Request:
    id: int
    prompt_ids: list[int]
    sampling: SamplingParams
    output: RequestOutput
    seed_words: tuple[int, int]
    arrival: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)  # sampled so far (known on the host)
    seq: Sequence | None = None
    instance: _Instance | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_reason: str | None = None
    aborted: bool = False
    handoff: tuple[Any, Any] | None = None  # KV on its way to a decode instance
    # Stops at its next token and gives its KV here instead of decoding (another engine does):
    # its first (submit(export=...)), or any (export_running, which sets `moving`).
    export: Callable[[PrefilledSequence], Any] | None = None
    moving: bool = False
    suppressed_ids: tuple[int, ...] = ()  # not sampled before sampling.min_tokens tokens
    requeues: int = 0  # times it went on elsewhere after its instance failed

    def known_tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class PrefilledSequence:
    """A request stopped after its prompt (or later, moved while decoding), as another engine
    continues it: its tokens, its sampling seed and the KV of its computed positions (k, v
    [layers, positions, kv heads, head dim]: on the exporting engine's device, padded to a
    handoff bucket, as exported; as host arrays, exactly `num_blocks` blocks, from
    `host_kv()`)."""

    prompt_ids: list[int]
    output_ids: list[int]  # sampled so far (the first token, or every token of a moved one)
    seed_words: tuple[int, int]
    num_blocks: int  # blocks holding the computed positions
    block_size: int
    k: Any
    v: Any

    @property
    def num_positions(self) -> int:
        """KV positions computed: every known token but the last (its KV is the next step's)."""
        return len(self.prompt_ids) + len(self.output_ids) - 1

    def host_kv(self) -> tuple[np.ndarray, np.ndarray]:
        """The KV as host arrays of exactly its blocks (waits for the device)."""
        n = self.num_blocks * self.block_size
        return np.asarray(self.k)[:, :n], np.asarray(self.v)[:, :n]

    @property
    def nbytes(self) -> int:
        """What `host_kv()` weighs."""
        per_position = math.prod(self.k.shape[2:]) * np.dtype(self.k.dtype).itemsize
        return 2 * self.k.shape[0] * self.num_blocks * self.block_size * per_position


class _Instance(ClusterInstance):
    def __init__(self, idx: int, unit: int, role: Role, runner: Runner,
                 scheduler: Scheduler) -> None:
        super().__init__(idx, unit, role, scheduler)
        self.name = f"{role.value}-{idx}"
        self.runner = runner
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.state = "serving"  # "restarting" after a failure, "down" out of service
        self.failures: list[float] = []  # monotonic times, within the failure window
        self.restarts = 0
        self.last_error: str | None = None
        self.fault: str | None = None  # inject_fault's message, raised at its next step

    @property
    def device(self) -> Any:
        return self.runner.device


class Engine(ModelLimits):
    def __init__(self, steps: Steps | None, params: Any, config: EngineConfig,
                 devices: list | None = None, metrics: Any = None,
                 eos_ids: Collection[int] | None = None, model_config: Any = None,
                 split_advisor: Any = None,
                 cluster_clock: Callable[[], float] | None = None) -> None:
        """`steps`: the compiled programs (None: jitted from the model code for
        `model_config`). `split_advisor`: the adaptive layout's advisor (None: the placement
        core's, from the config; cluster.Cluster says what else it takes). `cluster_clock`:
        the time the cluster layer's decisions see (None: the wall clock; a test replays a
        trace's times)."""
        config.validate()
        if steps is None:
            if model_config is None:
                raise ValueError("Engine needs steps or a model_config")
            steps = ModelSteps(model_config, config.block_size)
        if steps.block_size != config.block_size:
            raise ValueError(f"steps are for block size {steps.block_size}, the engine is "
                             f"configured with {config.block_size}")
        self.steps = steps
        self.cfg = steps.config
        self.ec = config
        self.metrics = metrics
        self.eos_ids = frozenset([self.cfg.eos_id] if eos_ids is None else eos_ids)
        self.max_model_len = config.max_model_len
        devices = list(devices if devices is not None else jax.devices())
        if config.layout == "split":
            units = config.prefill_devices + config.decode_devices
            if units > len(devices):
                raise ValueError(f"split layout: {config.prefill_devices} prefill + "
                                 f"{config.decode_devices} decode devices requested, only "
                                 f"{len(devices)} available")
        else:
            units = config.num_devices or len(devices)
            if units > len(devices):
                raise ValueError(f"{units} devices requested, only {len(devices)} available")
        roles = unit_roles(config.layout, units, config.prefill_devices)
        dtype = jax.tree_util.tree_leaves(params)[0].dtype
        shapes = RunnerShapes(
            num_seqs=config.max_num_seqs, block_size=config.block_size,
            num_blocks=config.blocks_per_instance(),
            max_blocks_per_seq=config.max_blocks_per_seq,
            chunk_buckets=config.resolved_chunk_buckets(),
            handoff_buckets=powers_of_two(1, config.max_blocks_per_seq)
            if config.layout != "colocated" or config.kv_handoff else (),
            decode_widths=config.resolved_decode_widths())
        placed: dict[Any, Any] = {}
        self.instances: list[_Instance] = []
        for i, role in enumerate(roles):
            dev = devices[i % units]
            if dev not in placed:
                placed[dev] = jax.device_put(params, dev)
            sc = SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                block_size=config.block_size, num_blocks=shapes.num_blocks,
                max_model_len=config.max_model_len, max_waiting=config.max_waiting,
                max_prefill_seqs=1, role=role)
            runner = Runner(steps, placed[dev], dev, shapes, dtype)
            self.instances.append(_Instance(i, i % units, role, runner, Scheduler(sc)))
        self.units = units
        # Routing and role changes: the cluster layer, under self._lock (its schedulers change
        # on the instance threads: every pick reads every load). The adaptive layout's advisor
        # is made at warm-up, which measures the prefill throughput it needs.
        self.cluster: Cluster | None = None
        self._split_advisor = split_advisor
        self._cluster_clock = cluster_clock
        if config.layout != "adaptive":
            self.cluster = Cluster(self.instances, units, incremental=False,
                                   keep_log=config.keep_cluster_log)
            if metrics and config.layout == "split":
                metrics.set_split(config.prefill_devices, 0, units)
        self.healthy = True
        self.error: str | None = None
        self._ids = itertools.count()
        self._seeds = random.Random()
        self._lock = threading.Lock()  # live requests, finishes, handoff routing
        self._live: dict[int, Request] = {}
        self._stop = threading.Event()
        self.keep_step_log = False
        # (instance, decoding request ids, (request id, tokens) of the prompt chunk or None)
        self.step_log: list[tuple[str, tuple[int, ...], tuple[int, int] | None]] = []

    # ---- public API ---------------------------------------------------------------------------

    def _warmup_runners(self) -> list[Runner]:
        """One runner per device: the instances on one device (the adaptive layout's prefill
        and decode instance) run the same programs there."""
        seen: set[Any] = set()
        runners = []
        for x in self.instances:
            if x.device not in seen:
                seen.add(x.device)
                runners.append(x.runner)
        return runners

    def num_warmup_programs(self) -> int:
        return sum(len(r.programs()) for r in self._warmup_runners())

    def warmup(self, progress: Callable[[int], Any] | None = None) -> int:
        """Compiles every program on every device it runs on (bounded: chunk buckets,
        the decode-only step, KV handoff buckets in the split layouts); the adaptive layout
        also times a full prefill step for its advisor (unless configured)."""
        n = sum(r.warmup(progress) for r in self._warmup_runners())
        self._make_cluster()
        return n

    def _make_cluster(self) -> None:
        if self.cluster is not None:
            return
        ec = self.ec
        advisor = self._split_advisor
        if advisor is None:
            rate = ec.prefill_tokens_per_s
            if not rate:
                tokens, seconds = self.instances[0].runner.time_prefill_step()
                rate = tokens / seconds
            advisor = self.split_settings = SplitSettings(
                prefill_tokens_per_s=rate, decode_batch=ec.max_num_seqs,
                hold_s=ec.split_hold_s, backlog_drain_s=ec.split_backlog_drain_s,
                colocate_at_capacity=ec.split_colocate,
                chunk_tokens=ec.max_num_batched_tokens, tpot_target_s=ec.split_tpot_target_s,
                time_scale=emulated_time_scale(self.instances[0].device))
        self.cluster = Cluster(self.instances, self.units, advisor, incremental=False,
                               keep_log=ec.keep_cluster_log)
        if self.metrics:
            self.metrics.set_split(self.cluster.prefill_units, self.cluster.mixed_units,
                                   self.units)

    def start(self) -> None:
        self._make_cluster()
        for x in self.instances:
            x.thread = threading.Thread(target=self._loop, args=(x,), name=f"engine-{x.name}",
                                        daemon=True)
            x.thread.start()

    def stop(self) -> None:
        """Stops the threads; requests still queued or running finish "abort", new ones are
        refused (EngineDeadError)."""
        if self.healthy:
            self.healthy, self.error = False, "the engine was stopped"
        self._stop.set()
        for x in self.instances:
            x.wake.set()
        for x in self.instances:
            if x.thread is not None:
                x.thread.join(timeout=30)
        with self._lock:
            live = list(self._live.values())
        for req in live:
            self._finish(req, "abort")

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, output: RequestOutput,
               *, deadline: float | None = None, priority: int = 0,
               export: Callable[[PrefilledSequence], Any] | None = None) -> Request:
        """Queues a request; its tokens go to `output` on an engine thread. Raises
        RequestTooLongError (ValueError), QueueFullError, EngineDeadError, ValueError.
        `export`: the request stops at its first token (unless that token finishes it) and
        its PrefilledSequence goes to `export`, on an engine thread, before `output` hears
        the finish "prefilled" (the engine needs kv_handoff)."""
        if export is not None and not self._handoff_programs():
            raise ValueError("exporting a prefilled sequence needs an engine built with "
                             "kv_handoff=True (its handoff programs)")
        req = self._new_request(prompt_ids, [], sampling, output, deadline, priority, None)
        req.export = export
        now = req.arrival
        cluster = self._cluster()
        with self._lock:
            at = now if self._cluster_clock is None else self._cluster_clock()
            if cluster.on_arrival(len(prompt_ids), at):
                self._on_split()
            inst = self._route_arrival(req.id)
        return self._place(req, inst)

    def _route_arrival(self, request_id: int) -> _Instance:
        """The instance that takes a new prompt (the caller holds self._lock)."""
        try:
            return self._cluster().route_arrival(request_id)  # type: ignore[return-value]
        except NoLiveInstanceError as e:
            raise EngineDeadError(f"the engine is not serving: {e}") from None

    def submit_prefilled(self, prefilled: PrefilledSequence, sampling: SamplingParams,
                         output: RequestOutput, *, deadline: float | None = None,
                         priority: int = 0) -> Request:
        """Continues a sequence another engine prefilled (`export`) or moved (`export_running`):
        its KV (on a device, as exported, or host arrays, e.g. from another host) goes to the
        instance the cluster layer picks and is written into its blocks before the decode step
        that continues it; `output` hears the tokens after `prefilled.output_ids` (sampled as
        they would have been there: `sampling` is the request's own, its max_tokens counting
        those too). Raises ValueError (a KV of
        another shape), RequestTooLongError, EngineDeadError."""
        if not self._handoff_programs():
            raise ValueError("continuing a prefilled sequence needs an engine built with "
                             "kv_handoff=True (its handoff programs)")
        if not prefilled.output_ids:
            raise ValueError("a prefilled sequence has at least its first token")
        kv = self._bucketed_kv(prefilled)
        req = self._new_request(prefilled.prompt_ids, prefilled.output_ids, sampling, output,
                                deadline, priority, prefilled.seed_words)
        assert req.seq is not None
        cluster = self._cluster()
        with self._lock:
            try:
                inst = (cluster.route_handoff(req.id) if cluster.back_router is not None
                        else cluster.route_arrival(req.id))
            except NoLiveInstanceError as e:
                raise EngineDeadError(f"the engine is not serving: {e}") from None
        req.handoff = jax.device_put(kv, inst.device)  # (a host copy: not under the lock)
        return self._place(req, inst)

    def export_running(self, requests: Collection[Request] | None,
                       export: Callable[[Request, PrefilledSequence], Any]) -> list[Request]:
        """Moves requests out of this engine (their host stops decoding, say): each stops at its
        next token, which its output hears first, and `export(request, prefilled)` gets its
        PrefilledSequence (the prompt, every token sampled so far, the seed, the KV of them all)
        on an engine thread; then its output hears the finish "moved". `submit_prefilled`
        continues it elsewhere with the tokens it would have sampled here. One still computing
        its prompt stops at its first token (as with submit(export=...)); one queued for a
        decode slot (a handoff) after its first step. `requests` None: every live request.
        Finished, aborted and foreign requests, and those exported already, are skipped;
        returns those marked. A failing `export` ends its request with "error: exporting the
        running sequence failed: ..."."""
        if not self._handoff_programs():
            raise ValueError("exporting a running sequence needs an engine built with "
                             "kv_handoff=True (its handoff programs)")
        marked = []
        with self._lock:
            for req in list(self._live.values()) if requests is None else requests:
                if self._live.get(req.id) is not req or req.aborted or req.export is not None:
                    continue
                req.moving = True
                req.export = functools.partial(export, req)
                marked.append(req)
        for req in marked:
            if req.instance is not None:
                req.instance.wake.set()
        return marked

    def _place(self, req: Request, inst: _Instance) -> Request:
        """A new request to `inst`'s scheduler: a prompt, or a prefilled sequence (its KV in
        `req.handoff`)."""
        assert req.seq is not None
        # Under the engine's lock: a live request is in its instance's scheduler, or on its
        # way on that instance's own thread (what an instance's failure recovery relies on).
        with self._lock:
            if inst.down:  # it failed since it was picked: another takes a prompt
                if req.handoff is not None:
                    raise EngineDeadError(f"instance {inst.name} went out of service")
                inst = self._route_arrival(req.id)
            self._live[req.id] = req
            req.instance = inst
            try:
                with inst.lock:
                    if req.handoff is not None:
                        inst.sched.add_prefilled(req.seq)
                    else:
                        inst.sched.add(req.seq)
            except BaseException:
                self._live.pop(req.id, None)
                raise
        inst.wake.set()
        self.update_gauges()
        return req

    def _handoff_programs(self) -> bool:
        return bool(self.instances[0].runner.shapes.handoff_buckets)

    def _new_request(self, prompt_ids: list[int], output_ids: list[int],
                     sampling: SamplingParams, output: RequestOutput, deadline: float | None,
                     priority: int, seed_words: tuple[int, int] | None) -> Request:
        if not self.healthy:
            raise EngineDeadError(f"the engine is not serving: {self.error}")
        bad = [t for t in [*prompt_ids, *output_ids] if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.cfg.vocab_size}): "
                             f"{bad[:5]}")
        suppressed = suppressed_ids(sampling, self.eos_ids)
        now = time.perf_counter()
        if deadline is None and self.ec.request_timeout is not None:
            deadline = now + self.ec.request_timeout
        if seed_words is None:
            seed = sampling.seed if sampling.seed is not None else self._seeds.getrandbits(63)
            seed_words = (seed & 0xFFFFFFFF, seed >> 32)
        req = Request(next(self._ids), list(prompt_ids), sampling, output, seed_words,
                      arrival=now, output_ids=list(output_ids), suppressed_ids=suppressed)
        req.seq = Sequence(req.id, len(prompt_ids), sampling.max_tokens, now, deadline,
                           priority, payload=req, num_output_tokens=len(output_ids))
        if output_ids:  # a continuation: its next token's latency is an inter-token one
            req.first_token_time = req.last_token_time = now
        return req

    def _bucketed_kv(self, p: PrefilledSequence) -> tuple[Any, Any]:
        """The KV of `p` padded to one of this engine's handoff buckets (checked against its
        model and block size)."""
        bs = self.ec.block_size
        k, v = p.k, p.v
        cfg = self.cfg
        want = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        shape = tuple(k.shape)
        if (len(shape) != 4 or (shape[0], *shape[2:]) != want or tuple(v.shape) != shape
                or p.block_size != bs or shape[1] % bs
                or shape[1] < math.ceil(p.num_positions / bs) * bs):
            raise ValueError(
                f"prefilled KV of shape {shape} (block size {p.block_size}) does not fit "
                f"{p.num_positions} positions of this model ({cfg.num_layers} layers, "
                f"{cfg.num_kv_heads} KV heads of {cfg.head_dim}) in blocks of {bs}")
        blocks = shape[1] // bs
        bucket = self.instances[0].runner.shapes.handoff_bucket(blocks)
        if bucket != blocks:
            pad = ((0, 0), (0, (bucket - blocks) * bs), (0, 0), (0, 0))
            k, v = np.pad(np.asarray(k), pad), np.pad(np.asarray(v), pad)
        return k, v

    def abort(self, req: Request, reason: str = "abort") -> None:
        """Finishes the request (`reason`) now (a client went away); its KV blocks go back when
        its instance next plans a step."""
        with self._lock:
            if req.done:
                return
            req.aborted = True
            inst = req.instance
        if inst is not None:
            with inst.lock:
                inst.sched.abort(req.id)
            inst.wake.set()
        self._finish(req, reason)

    def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                 timeout: float = 120) -> tuple[list[int], str]:
        """Blocking: the generated ids (stop tokens excluded) and the finish reason."""
        out = IdsOutput(sampling, self.eos_ids)
        req = self.submit(prompt_ids, sampling, out)
        if not out.done.wait(timeout):
            self.abort(req)
            raise TimeoutError(f"generation did not finish within {timeout}s")
        assert out.finish_reason is not None
        return out.ids, out.finish_reason

    def _entry_instances(self) -> list[_Instance]:
        """The instances new requests go to."""
        if self.cluster is not None:
            return self.cluster.front_router.insts
        return [x for x in self.instances if x.role is not Role.DECODE]

    def entry_load_key(self) -> tuple[int, int, float]:
        """The load key (Scheduler.load_key) of the instance a new request would go to: what a
        router above engines (serving/multihost) compares across them."""
        return min(x.sched.load_key() for x in self._entry_instances())

    def entry_free_slots(self) -> int:
        """How many more sequences the entry instances would start at once: their batch slots
        (max_num_seqs each) less what runs and waits there. A router above engines prefers a
        free slot to a queue behind a full batch, which waits for a whole sequence to end."""
        cap = self.ec.max_num_seqs
        return sum(
            max(0, cap - x.sched.num_running - x.sched.num_waiting)
            for x in self._entry_instances()
        )

    # ---- what the server reads (serving.engine_client.EngineClient) ----------------------------

    def health(self) -> list[InstanceHealth]:
        """Each instance's state: "serving", "restarting" after a failure, or "down" (out of
        service)."""
        return [
            InstanceHealth(x.name, str(x.device), x.role.value, x.state, x.restarts,
                           x.last_error)
            for x in self.instances
        ]

    def inject_fault(self, instance: str) -> None:
        """Makes `instance` (a name from health()) fail at its next step, as a failing device
        would: for fault tests and the soak (the server exposes it only when asked)."""
        for x in self.instances:
            if x.name == instance:
                x.fault = f"a fault injected into {instance}"
                x.wake.set()
                return
        raise ValueError(f"no instance {instance!r} (instances: "
                         f"{', '.join(x.name for x in self.instances)})")

    def topology(self) -> None:
        """One engine has no hosts to describe (the multi-host front does)."""
        return None

    def num_running(self) -> int:
        return sum(x.sched.num_running for x in self.instances)

    def num_waiting(self) -> int:
        return sum(x.sched.num_waiting for x in self.instances)

    def kv_usage(self) -> float:
        return sum(x.sched.kv_usage for x in self.instances) / len(self.instances)

    # ---- the instance loop ----------------------------------------------------------------------

    def _loop(self, inst: _Instance) -> None:
        """The instance's thread: its steps, and a restart after each failure (until it is
        taken out of service)."""
        while not self._stop.is_set():
            try:
                self._run_steps(inst)
                return
            except BaseException as e:  # noqa: BLE001 - isolate the instance, keep serving
                if self._stop.is_set():
                    return
                traceback.print_exc()
                if not self._recover(inst, f"{type(e).__name__}: {e}"):
                    return

    def _run_steps(self, inst: _Instance) -> None:
        prev: Dispatched | None = None
        while not self._stop.is_set():
            if inst.fault is not None:
                why, inst.fault = inst.fault, None
                raise InjectedFault(why)
            if inst.draining:  # outside its side of the split: give up what can move
                if prev is not None:
                    self._complete(inst, prev)
                    prev = None
                self._move_out(inst)
            with inst.lock:
                plan = inst.sched.schedule(time.perf_counter())
            for seq in plan.finished:
                self._finish(seq.payload, seq.finish_reason or "timeout")
            if plan.is_empty:
                if prev is not None:
                    self._complete(inst, prev)
                    prev = None
                    continue
                self.update_gauges()
                inst.wake.wait(0.05)
                inst.wake.clear()
                continue
            for seq in plan.kv_inserts:
                req = seq.payload
                if req.handoff is not None:
                    inst.runner.insert_kv(*req.handoff, seq.blocks)
                    req.handoff = None
            try:
                inp, d = inst.runner.prepare(plan, prev)
            except NeedsPreviousStep:
                assert prev is not None, "a token is missing with no step in flight"
                self._complete(inst, prev)
                prev = None
                inp, d = inst.runner.prepare(plan, None)
            d = inst.runner.dispatch(inp, d, prev)
            if self.keep_step_log:
                chunks = [(e.seq.request_id, e.num_tokens) for e in plan.scheduled
                          if e.num_tokens > 1]
                self.step_log.append((inst.name, tuple(
                    e.seq.request_id for e in plan.scheduled if e.is_decode),
                    chunks[0] if chunks else None))
            if prev is not None:
                self._complete(inst, prev)
            prev = d

    def _complete(self, inst: _Instance, d: Dispatched) -> None:
        """Step d's host work: tokens to the outputs, stops, finishes, handoffs."""
        out = inst.runner.fetch(d)
        now = time.perf_counter()
        stopped: dict[int, str] = {}
        handoff_blocks: dict[int, list[int]] = {}
        for e, row in out.rows:
            req: Request = e.seq.payload
            if req.done or e.seq.finished:
                continue  # aborted, timed out or stopped while this step was in flight
            tok = int(out.ids[row])
            req.output_ids.append(tok)
            lp = None
            if req.sampling.logprobs is not None:
                chosen, top = top_logprobs(out, row, req.sampling.logprobs)
                lp = TokenLogprobs(chosen, top)
            observe_token(self.metrics, req, now)
            try:
                reason = req.output.on_token(tok, lp, now)
            except Exception as exc:  # noqa: BLE001 - one bad output fails its request only
                reason = f"error: output processing failed: {exc}"
            if reason is not None:
                stopped[req.id] = reason
            elif inst.role is Role.PREFILL and e.finishes:
                handoff_blocks[req.id] = list(e.seq.blocks)
            elif req.export is not None and not e.finishes:  # to export: stop here
                stopped[req.id] = "prefilled"
                handoff_blocks[req.id] = list(e.seq.blocks)
        with inst.lock:
            finished = inst.sched.on_step_done(d.plan, now, stopped)
        for seq in finished:
            req = seq.payload
            if seq.finish_reason == "prefilled" and req.id in handoff_blocks:
                self._handoff(inst, req, handoff_blocks[req.id])
            else:
                self._finish(req, seq.finish_reason or "stop")
        self.update_gauges()

    def _handoff(self, src: _Instance, req: Request, blocks: list[int]) -> None:
        """A prefilled (or moved) sequence's KV to the decode instance the cluster layer
        picks (jax.device_put; on the same device it stays there), or to its `export`. No
        blocks: a handoff that was queued at `src`, its KV still in `req.handoff`."""
        k, v = src.runner.extract_kv(blocks) if blocks else req.handoff
        if req.export is not None:
            self._export(req, k, v)
            return
        try:
            with self._lock:
                dst = self._cluster().route_handoff(req.id)
        except NoLiveInstanceError as e:
            self._finish(req, f"error: no decode instance takes the prefilled request: {e}")
            return
        req.handoff = jax.device_put((k, v), dst.device)
        assert req.seq is not None
        with self._lock:
            if req.done:
                req.handoff = None
                return
            why_not = None
            if not dst.down:
                req.instance = dst
                with dst.lock:
                    dst.sched.add_prefilled(req.seq)
            else:  # it failed since it was picked: the request is recomputed elsewhere
                why_not = self._requeue(req, None)
        if why_not is not None:
            self._finish(req, f"error: its decode instance {dst.name} failed; the request "
                         f"could not go on elsewhere: {why_not}")
        elif req.instance is not None:
            req.instance.wake.set()

    def _export(self, req: Request, k: Any, v: Any) -> None:
        """Gives a prefilled (or moving) request's KV (still on its device) to its `export`,
        then finishes it "prefilled" ("moved") here."""
        bs = self.ec.block_size
        p = PrefilledSequence(list(req.prompt_ids), list(req.output_ids), req.seed_words, 0, bs,
                              k, v)
        p.num_blocks = math.ceil(p.num_positions / bs)
        with self._lock:
            done = req.done
        if not done:
            assert req.export is not None
            try:
                req.export(p)
            except Exception as exc:  # noqa: BLE001 - one bad export fails its request only
                what = "running" if req.moving else "prefilled"
                self._finish(req, f"error: exporting the {what} sequence failed: {exc}")
                return
        self._finish(req, "moved" if req.moving else "prefilled")

    def _move_out(self, inst: _Instance) -> None:
        """A role change, on `inst`'s thread with no step in flight: the decodes it gives up go
        to the decode side with their KV, its queued prompts back to the router."""
        with self._lock:
            cluster = self._cluster()
            with inst.lock:
                taken = cluster.take_moves(inst)
        for seq, blocks in taken:
            req: Request = seq.payload
            if req.done:
                continue
            if cluster.is_handoff(seq, blocks):  # goes on where the layer hands it, KV and all
                self._handoff(inst, req, blocks)
                continue
            try:
                with self._lock:
                    dst = cluster.route_arrival(req.id)
                    req.instance = dst
                    with dst.lock:
                        dst.sched.add(seq)
            except (QueueFullError, RequestTooLongError) as e:
                self._finish(req, f"error: moving a queued prompt: {e}")
                continue
            dst.wake.set()
        if taken and self.metrics:
            self.metrics.on_moves(len(taken))

    def _on_split(self) -> None:
        """The split changed (the caller holds self._lock): wake the instances that now give
        up work."""
        cluster = self._cluster()
        if self.metrics:
            self.metrics.set_split(cluster.prefill_units, cluster.mixed_units, self.units)
        for x in self.instances:
            if x.draining:
                x.wake.set()

    def _cluster(self) -> Cluster:
        if self.cluster is None:
            raise EngineDeadError("the adaptive layout's engine was not warmed up or started")
        return self.cluster

    # ---- finishing --------------------------------------------------------------------------

    def _finish(self, req: Request, reason: str) -> None:
        """Exactly once per request."""
        with self._lock:
            if req.done:
                return
            req.finish_reason = reason
            req.handoff = None
            self._live.pop(req.id, None)
        deliver_finish(self.metrics, req, reason, time.perf_counter())

    def _recover(self, inst: _Instance, why: str) -> bool:
        """`inst`'s thread failed (no step of it is in flight any more): it starts afresh (a
        new scheduler and KV cache) and its requests go on at the other instances (or at it,
        restarted, if no other can take them); after MAX_INSTANCE_FAILURES within the window
        it stays out of service instead. Returns whether it serves again."""
        now = time.monotonic()
        inst.failures = [t for t in inst.failures if now - t < INSTANCE_FAILURE_WINDOW_S]
        inst.failures.append(now)
        inst.last_error = why
        retire = len(inst.failures) >= MAX_INSTANCE_FAILURES
        with self._lock:
            # Out of every router while it recovers. The requests it held are the live ones
            # that name it: in its scheduler, or cut short on its thread (a handoff, say).
            inst.down = True
            inst.state = "down" if retire else "restarting"
            held = [r for r in self._live.values() if r.instance is inst and not r.done]
            with inst.lock:
                inst.sched = Scheduler(inst.sched.config)  # the old one may be mid-change
        if not retire:
            try:
                inst.runner.reset_cache()
            except Exception as e:  # noqa: BLE001 - a device that cannot restart stays out
                inst.last_error = f"{why}; restarting it failed: {type(e).__name__}: {e}"
                retire = True
        with self._lock:
            fallback = None if retire else inst
            stuck = [(r, no) for r in held if (no := self._requeue(r, fallback)) is not None]
            if retire:
                inst.state = "down"
                serving = self._cluster().can_serve()
            else:
                inst.state, inst.down = "serving", False
                inst.restarts += 1
                serving = True
        dead = f"no instance left to serve (the last failure: {inst.name}: {inst.last_error})"
        if not serving:  # before any client hears of it: new requests are refused from now
            self.healthy, self.error = False, dead
        error = f"error: instance {inst.name} failed ({inst.last_error})"
        for r, why_not in stuck:
            self._finish(r, f"{error}; the request could not go on elsewhere: {why_not}")
        moved = [r for r in held if not r.done]
        if self.metrics:
            self.metrics.on_instance_failure(inst.name, len(moved))
        for r in moved:
            if r.instance is not None:
                r.instance.wake.set()
        print(f"flexnpu: engine instance {inst.name} failed ({inst.last_error}); "
              f"{len(moved)} of its {len(held)} requests go on; "
              + ("it is out of service" if retire else "it restarted"), flush=True)
        if not serving:
            self._fail(dead)
        self.update_gauges()
        return not retire

    def _requeue(self, req: Request, fallback: _Instance | None) -> str | None:
        """A request of a failed instance goes on at another (`fallback` if no other takes
        prompts), recomputed from its prompt and the tokens it has (its seed makes it sample
        what it would have); returns why not if none takes it. The caller holds
        self._lock."""
        if req.done:
            return None
        if req.requeues >= MAX_REQUEUES:
            return (f"it was on a failing instance {req.requeues + 1} times (it may be what "
                    "fails the steps)")
        req.requeues += 1
        old = req.seq
        assert old is not None
        req.handoff = None
        req.seq = Sequence(req.id, len(req.prompt_ids), old.max_tokens, req.arrival,
                           old.deadline, old.priority, payload=req,
                           num_output_tokens=len(req.output_ids))
        try:
            try:
                dst: _Instance = self._cluster().route_arrival(req.id)  # type: ignore[assignment]
            except NoLiveInstanceError:
                if fallback is None or fallback.role is Role.DECODE:
                    raise
                dst = fallback
            with dst.lock:
                dst.sched.add(req.seq)
        except (NoLiveInstanceError, QueueFullError, RequestTooLongError) as e:
            return str(e)
        req.instance = dst
        return None

    def _fail(self, message: str) -> None:
        """The engine can serve no more: every queued and running request gets the error."""
        self.healthy = False
        self.error = message
        self._stop.set()
        for x in self.instances:
            x.wake.set()
        with self._lock:
            live = list(self._live.values())
            for x in self.instances:  # fresh and empty: a thread still stepping plans nothing
                with x.lock:
                    x.sched = Scheduler(x.sched.config)
        for req in live:
            self._finish(req, f"error: {message}")
        self.update_gauges()

    # ---- metrics ------------------------------------------------------------------------------

    def update_gauges(self) -> None:
        if self.metrics:
            self.metrics.set_gauges(self.num_running(), self.num_waiting(), self.kv_usage())
