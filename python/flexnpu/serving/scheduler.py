"""The serving scheduler: queue, admission, token-budget batching with chunked prefill, paged-KV
block accounting, preemption by recompute, backpressure and deadlines.

Pure and clock-injected: no JAX, no threads, no wall clock. Every call that needs time takes
`now` (seconds, any epoch). Not thread-safe: the caller serialises calls (the engine holds its
lock; the cluster simulator is single-threaded). The same class schedules the real engine and
every instance of the cluster simulator, so what the simulator shows is what production does.

Unified token view (as vLLM v1): a sequence knows `num_tokens = prompt + output` tokens and has
`num_computed_tokens` KV positions. A step gives each scheduled sequence
`min(num_tokens - num_computed_tokens, budget left)` new positions: a decoding sequence needs 1, a
prompt (or a recompute after preemption) many, and may be chunked over several steps. An entry
whose chunk reaches the end of the known tokens samples a new token.

Output is counted optimistically: scheduling an entry that samples already adds the (not yet
known) token, so step k+1 can be planned and dispatched before step k's values arrive. A finish by
length (max_tokens or max_model_len) is therefore known when the last token is scheduled; a finish
by a stop token or string is reported by the caller to `on_step_done(stopped=...)`, and whatever a
later in-flight plan computed for that sequence is ignored.

Order within a step (Sarathi-Serve / vLLM v1): running sequences first (decodes, then unfinished
prompt chunks), then waiting ones by (priority, arrival). A running sequence that cannot get a KV
block preempts the lowest-priority, latest-arrived running sequence (its blocks are freed; it is
recomputed from the start later). New prompts are admitted only while blocks, batch slots and the
token budget allow: KV usage is the admission signal.

Roles: MIXED does both phases; PREFILL finishes a sequence with reason "prefilled" once its first
token is sampled (its KV is then handed to a DECODE instance); DECODE takes handed-off sequences
through `add_prefilled` and lists them in `StepPlan.kv_inserts` when blocks for them are allocated,
so the runner writes their KV before the step runs.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections import deque
from collections.abc import Hashable, Mapping
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass
from enum import Enum, StrEnum
from itertools import repeat, starmap
from typing import Any


class QueueFullError(RuntimeError):
    """The waiting queue is at `max_waiting`: retry later (HTTP 503)."""


class RequestTooLongError(ValueError):
    """The request can never be served by this configuration (HTTP 400)."""


class Role(StrEnum):
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# The members as module constants: on Python 3.11 an Enum member read through its class
# (SeqStatus.RUNNING) costs ~0.5 us, a global ~20 ns, and the hot paths test them per sequence.
_MIXED, _PREFILL, _DECODE = Role.MIXED, Role.PREFILL, Role.DECODE
_WAITING, _RUNNING, _FINISHED = SeqStatus.WAITING, SeqStatus.RUNNING, SeqStatus.FINISHED


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8  # sequences holding KV and scheduled together (the decode batch)
    max_num_batched_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    block_size: int = 16  # KV positions per block
    num_blocks: int = 1024  # blocks in this instance's KV pool
    max_model_len: int = 2048  # prompt + output positions of one sequence
    max_waiting: int = 1024  # bound of the waiting queue (QueueFullError beyond)
    chunked_prefill: bool = True  # False: a prompt is prefilled whole, in one step
    mixed_batches: bool = True  # False: a step is all prefill or all decode (prefill first)
    max_prefill_seqs: int = 0  # 0: no cap; else at most this many prompt chunks per step
    role: Role = Role.MIXED
    watermark_blocks: int = 0  # blocks kept free when admitting a new prompt

    def validate(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_blocks",
                     "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"scheduler: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_waiting < 0 or self.max_prefill_seqs < 0 or self.watermark_blocks < 0:
            raise ValueError("scheduler: max_waiting, max_prefill_seqs and watermark_blocks "
                             "must be >= 0")
        if self.watermark_blocks >= self.num_blocks:
            raise ValueError(f"scheduler: watermark_blocks {self.watermark_blocks} must be < "
                             f"num_blocks {self.num_blocks}")
        self.role = Role(self.role)


class _Cohort:
    """The running sequences in steady decode (each step: one new position, one sampled
    token), kept in aggregate: a member stores its token counts as offsets from `tick`, the
    number of steps the cohort has taken, so one step advances every member by `tick += 1`.
    A member is touched one by one only at its next event (a KV block boundary or its last
    token by length), found in `events` (tick -> members), or when it leaves (finish, stop,
    abort, preemption). Lists in running (admission) order."""

    __slots__ = ("tick", "seqs", "offs", "serials", "off_sum", "events", "shared")

    def __init__(self) -> None:
        self.tick = 0
        self.seqs: list[Sequence] = []
        self.offs: list[int] = []  # num_computed_tokens - tick of each member
        self.serials: list[int] = []
        self.off_sum = 0
        self.events: dict[int, list[Sequence]] = {}
        # Plans whose bulk holds seqs / offs / serials (a plan reads only their first members,
        # so appends are safe; copy before any other change). Scheduler.release gives one back.
        self.shared = 0

    def unshare(self) -> None:
        if self.shared:
            self.seqs, self.offs, self.serials = \
                self.seqs.copy(), self.offs.copy(), self.serials.copy()
            self.shared = 0


class Sequence:
    """One request as the scheduler sees it. Fields below `payload` are kept by the scheduler
    and read-only for callers (num_computed_tokens / num_output_tokens are exact at any time;
    while the sequence is in steady decode they are derived from the scheduler's step count)."""

    __slots__ = ("request_id", "num_prompt_tokens", "max_tokens", "arrival", "deadline",
                 "priority", "payload", "status", "_output", "_computed", "blocks",
                 "num_preemptions", "finish_reason", "needs_kv_insert", "pending_finish",
                 "_cohort", "_serial", "_event")

    def __init__(self, request_id: Hashable, num_prompt_tokens: int, max_tokens: int,
                 arrival: float, deadline: float | None = None, priority: int = 0,
                 payload: Any = None, status: SeqStatus = SeqStatus.WAITING,
                 num_output_tokens: int = 0, num_computed_tokens: int = 0,
                 blocks: list[int] | None = None, num_preemptions: int = 0,
                 finish_reason: str | None = None, needs_kv_insert: bool = False,
                 pending_finish: str | None = None) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.deadline = deadline  # absolute; passed while waiting or running -> "timeout"
        self.priority = priority  # lower is served first
        self.payload = payload  # the caller's own object
        self.status = status
        self._cohort: _Cohort | None = None  # set while in steady decode (see _Cohort)
        self._output = num_output_tokens
        self._computed = num_computed_tokens
        self.blocks: list[int] = [] if blocks is None else blocks
        self.num_preemptions = num_preemptions
        self.finish_reason = finish_reason
        # DECODE role: handed-off KV not yet written into `blocks`.
        self.needs_kv_insert = needs_kv_insert
        # Its last token is scheduled: not scheduled again; finishes with this reason when
        # that step is done ("length", or "prefilled" in a PREFILL instance).
        self.pending_finish = pending_finish
        self._serial = 0  # admission order into the running batch
        self._event = -1  # the cohort tick of its next event

    @property
    def num_output_tokens(self) -> int:
        c = self._cohort
        return self._output if c is None else self._output + c.tick

    @num_output_tokens.setter
    def num_output_tokens(self, value: int) -> None:
        c = self._cohort
        self._output = value if c is None else value - c.tick

    @property
    def num_computed_tokens(self) -> int:
        c = self._cohort
        return self._computed if c is None else self._computed + c.tick

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        c = self._cohort
        self._computed = value if c is None else value - c.tick

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def finished(self) -> bool:
        return self.status is _FINISHED

    def __repr__(self) -> str:
        return (f"Sequence(request_id={self.request_id!r}, num_prompt_tokens="
                f"{self.num_prompt_tokens}, max_tokens={self.max_tokens}, status="
                f"{self.status}, num_output_tokens={self.num_output_tokens}, "
                f"num_computed_tokens={self.num_computed_tokens}, blocks={self.blocks}, "
                f"finish_reason={self.finish_reason!r})")


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # first KV position computed in this step
    num_tokens: int  # positions computed in this step
    samples: bool  # the step yields a new token for `seq`
    finishes: bool = False  # that token is its last (length, or the handoff of a prefill)

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.start >= self.seq.num_prompt_tokens


class StepPlan:
    """One step. `scheduled` lists its entries: decodes in running order, then prompt chunks,
    then newly admitted sequences. The scheduler may hold the leading decodes in aggregate
    (`bulk_decodes`) and build their entries only when `scheduled` is first read; callers
    that need only totals (the cluster simulator) read `bulk_decodes`, `entries_after_bulk`
    and `num_scheduled` instead and never pay for the entries."""

    __slots__ = ("step_id", "kv_inserts", "preempted", "finished", "_bulk", "_entries",
                 "_finishing")

    def __init__(self, step_id: int, scheduled: list[ScheduledSeq] | None = None,
                 kv_inserts: list[Sequence] | None = None,
                 preempted: list[Sequence] | None = None,
                 finished: list[Sequence] | None = None) -> None:
        self.step_id = step_id
        self.kv_inserts: list[Sequence] = [] if kv_inserts is None else kv_inserts
        self.preempted: list[Sequence] = [] if preempted is None else preempted
        self.finished: list[Sequence] = [] if finished is None else finished
        # Bulk decodes: (tick, members, their offsets, their serials, the number of members
        # this plan reads from those lists, the entries of the members that finish (they left
        # the lists; placed by serial), count, sum of starts); start of an entry = offset + tick.
        self._bulk: tuple[int, list[Sequence], list[int], list[int], int,
                          list[ScheduledSeq], int, int] | None = None
        self._entries: list[ScheduledSeq] = [] if scheduled is None else scheduled
        # Entries that finish, in plan order (None: not tracked, scan `scheduled`).
        self._finishing: list[ScheduledSeq] | None = None if scheduled else []

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        if self._bulk is not None:
            tick, seqs, offs, serials, n, last, _, _ = self._bulk
            self._bulk = None
            bulk = [ScheduledSeq(s, off + tick, 1, True)
                    for s, off in zip(seqs[:n], offs[:n], strict=True)]
            for k, e in enumerate(last):  # in serial order: k of them are before e
                bulk.insert(bisect.bisect_left(serials, e.seq._serial, 0, n) + k, e)
            self._entries[:0] = bulk
        return self._entries

    @scheduled.setter
    def scheduled(self, entries: list[ScheduledSeq]) -> None:
        self._bulk, self._entries, self._finishing = None, entries, None

    @property
    def num_scheduled(self) -> int:
        b = self._bulk
        return len(self._entries) + (b[6] if b is not None else 0)

    @property
    def bulk_decodes(self) -> tuple[int, int]:
        """(count, sum of start positions) of the leading decode entries held in aggregate,
        not in `entries_after_bulk`. Each is a single-token entry that samples."""
        b = self._bulk
        if b is None:
            return 0, 0
        return b[6], b[7]

    @property
    def entries_after_bulk(self) -> list[ScheduledSeq]:
        """The entries not counted by `bulk_decodes` (all of them once `scheduled` is read)."""
        return self._entries

    @property
    def finishing(self) -> list[ScheduledSeq]:
        """Entries whose token is their sequence's last (`finishes`), in plan order."""
        if self._finishing is None:
            return [e for e in self.scheduled if e.finishes]
        return self._finishing

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled and not self.kv_inserts

    @property
    def num_tokens(self) -> int:
        return self.bulk_decodes[0] + sum(e.num_tokens for e in self._entries)

    @property
    def decodes(self) -> list[ScheduledSeq]:
        return [e for e in self.scheduled if e.is_decode]

    @property
    def prefills(self) -> list[ScheduledSeq]:
        return [e for e in self.scheduled if not e.is_decode]

    @property
    def num_prefill_tokens(self) -> int:  # bulk entries are decodes
        return sum(e.num_tokens for e in self._entries if not e.is_decode)

    def __repr__(self) -> str:
        return (f"StepPlan(step_id={self.step_id}, scheduled={self.scheduled}, kv_inserts="
                f"{self.kv_inserts}, preempted={self.preempted}, finished={self.finished})")


_serial_of = operator.attrgetter("_serial")  # a Sequence's admission order


class _WaitQueue:
    """Waiting sequences by (priority, arrival order); preempted ones go back in front of their
    priority class. Removal (abort) is lazy."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Sequence]] = []
        self._order = itertools.count()
        self._front = itertools.count(-1, -1)
        self._live: set[int] = set()

    def __len__(self) -> int:
        return len(self._live)

    def push(self, seq: Sequence, front: bool = False) -> None:
        key = next(self._front) if front else next(self._order)
        heapq.heappush(self._heap, (seq.priority, key, seq))
        self._live.add(id(seq))

    def remove(self, seq: Sequence) -> None:
        self._live.discard(id(seq))

    def peek(self) -> Sequence | None:
        heap, live = self._heap, self._live
        while heap and id(heap[0][2]) not in live:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def pop(self) -> Sequence:
        heap, live = self._heap, self._live
        while id(heap[0][2]) not in live:
            heapq.heappop(heap)
        seq = heapq.heappop(heap)[2]
        live.discard(id(seq))
        return seq

    def __iter__(self):
        return (s for _, _, s in sorted(self._heap) if id(s) in self._live)


class Scheduler:
    def __init__(self, config: SchedulerConfig) -> None:
        config.validate()
        self.config = config
        self._free_blocks: deque[int] = deque(range(config.num_blocks))
        self._waiting = _WaitQueue()
        # In admission order (a dict as an ordered set: a finish or preemption removes its
        # sequence in O(1) from batches of a thousand).
        self._running: dict[Sequence, None] = {}
        self._by_id: dict[Hashable, Sequence] = {}
        self._step_ids = itertools.count()
        self._waiting_tokens = 0
        self._num_deadlines = 0  # live sequences with a deadline (skip the expiry scan if none)
        self._serials = itertools.count(1)
        # Steady decodes in aggregate (see _Cohort); a PREFILL instance hands a sequence off
        # at its first token, so it has none.
        self._cohort = _Cohort()
        self._bulk_ok = config.role is not _PREFILL
        self._joiners: list[Sequence] = []  # sampled in this step: decoding from the next
        # least_loaded's key, cleared by every call that changes the state.
        self._load: tuple[int, int, float] | None = None

    # ---- admission -------------------------------------------------------------------------

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.config.block_size)

    def _check(self, seq: Sequence, bounded: bool = True) -> None:
        c = self.config
        total = seq.num_prompt_tokens + seq.max_tokens
        # The common case in one test; any failure is named by the checks below.
        if seq.num_prompt_tokens >= 1 and seq.max_tokens >= 1 and total <= c.max_model_len \
                and -(-total // c.block_size) <= c.num_blocks - c.watermark_blocks \
                and (not bounded or len(self._waiting._live) < c.max_waiting) \
                and seq.request_id not in self._by_id:
            return
        if seq.request_id in self._by_id:
            raise ValueError(f"scheduler: request id {seq.request_id!r} is already scheduled")
        if seq.num_prompt_tokens < 1:
            raise RequestTooLongError("the prompt must have at least one token")
        if seq.max_tokens < 1:
            raise RequestTooLongError(f"max_tokens must be >= 1, got {seq.max_tokens}")
        total = seq.num_prompt_tokens + seq.max_tokens
        if total > c.max_model_len:
            raise RequestTooLongError(
                f"this model's maximum context length is {c.max_model_len} tokens; the request "
                f"has {seq.num_prompt_tokens} prompt tokens + max_tokens {seq.max_tokens} = "
                f"{total}")
        # The whole sequence must fit the pool alone, or it could never finish.
        if self.blocks_needed(total) > c.num_blocks - c.watermark_blocks:
            raise RequestTooLongError(
                f"a sequence of {total} tokens needs {self.blocks_needed(total)} KV blocks of "
                f"{c.block_size}; the KV pool has {c.num_blocks - c.watermark_blocks}")
        if bounded and len(self._waiting) >= c.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({c.max_waiting} requests); retry later")

    def add(self, seq: Sequence) -> None:
        """Queue a new request. RequestTooLongError / QueueFullError say why not."""
        self._load = None
        if self.config.role is _DECODE:
            raise ValueError("scheduler: a decode instance takes sequences via add_prefilled()")
        self._check(seq)
        seq.status = _WAITING
        seq.num_computed_tokens = 0
        if seq.deadline is not None:
            self._num_deadlines += 1
        self._by_id[seq.request_id] = seq
        w = self._waiting  # w.push(seq), inline
        heapq.heappush(w._heap, (seq.priority, next(w._order), seq))
        w._live.add(id(seq))
        self._waiting_tokens += seq.num_prompt_tokens + seq.num_output_tokens

    def add_prefilled(self, seq: Sequence) -> None:
        """A decode instance takes a sequence prefilled elsewhere (its KV arrives with it)."""
        self._load = None
        if self.config.role is not _DECODE:
            raise ValueError("scheduler: add_prefilled() is for decode instances")
        if seq.num_output_tokens < 1:
            raise ValueError("scheduler: a prefilled sequence has at least its first token")
        self._check(seq, bounded=False)  # backpressure applies at the front door only
        seq.status = _WAITING
        seq.blocks = []
        seq.finish_reason = None
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.needs_kv_insert = True
        if seq.deadline is not None:  # _enqueue (not known: _check passed)
            self._num_deadlines += 1
        self._by_id[seq.request_id] = seq
        w = self._waiting  # w.push(seq), inline
        heapq.heappush(w._heap, (seq.priority, next(w._order), seq))
        w._live.add(id(seq))
        self._waiting_tokens += 1  # num_tokens - num_computed_tokens

    def _enqueue(self, seq: Sequence, front: bool = False) -> None:
        if seq.request_id not in self._by_id and seq.deadline is not None:
            self._num_deadlines += 1
        self._by_id[seq.request_id] = seq
        self._waiting.push(seq, front)
        self._waiting_tokens += seq.num_tokens - seq.num_computed_tokens

    def _dequeue(self, seq: Sequence) -> None:
        self._waiting_tokens -= seq.num_tokens - seq.num_computed_tokens

    def abort(self, request_id: Hashable) -> Sequence | None:
        """Finish a request now ("abort"), freeing its KV blocks. None if unknown/finished."""
        self._load = None
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        self._finish(seq, "abort")
        return seq

    # ---- scheduling ------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """Plan one step. The plan may be empty (nothing runnable now)."""
        self._load = None
        c = self.config
        plan = StepPlan(next(self._step_ids))
        if self._num_deadlines:
            self._expire(now, plan)
        if self._bulk_ok:
            self._joiners.clear()
            if self._schedule_bulk(plan):
                self._join_new()
                return plan
            # A step the aggregate cannot take exactly (decodes beyond the token budget, or
            # blocks that need a preemption): every sequence one by one, as below.
            self._dissolve()
        decoding: list[Sequence] = []
        chunking: list[Sequence] = []
        for seq in self._running:
            if seq.pending_finish is None:
                remaining = seq.num_prompt_tokens + seq.num_output_tokens - \
                    seq.num_computed_tokens
                (decoding if remaining == 1 else chunking).append(seq)
        # A decode instance only ever decodes: handed-off sequences join the running batch.
        if c.mixed_batches or c.role is _DECODE:
            budget, prefills = self._schedule_running(decoding + chunking, plan)
            self._admit(plan, budget, prefills)
        elif any(self._fits(s) for s in chunking) or self._admissible_prompt() is not None:
            # A prefill-only step (prefill first, as vLLM without chunking); it never preempts
            # decodes that are waiting for their turn, which could livelock.
            budget, prefills = self._schedule_running([s for s in chunking if self._fits(s)],
                                                      plan)
            self._admit(plan, budget, prefills)
        else:  # a decode-only step
            self._schedule_running(decoding, plan)
        if self._bulk_ok:
            self._join_all()
        return plan

    # ---- steady decode in aggregate (the same decisions as the loop in _schedule_running) --

    def _schedule_bulk(self, plan: StepPlan) -> bool:
        """schedule()'s step with the cohort advanced in aggregate. False, having changed
        nothing, when this step needs the per-sequence path."""
        c, co, running = self.config, self._cohort, self._running
        chunking: list[Sequence] = []
        if len(running) > len(co.seqs):
            for seq in running:
                if seq._cohort is None and seq.pending_finish is None:
                    if seq.num_prompt_tokens + seq._output - seq._computed == 1:
                        return False  # a decode outside the cohort (not expected)
                    chunking.append(seq)
        decode_step = True
        if not (c.mixed_batches or c.role is _DECODE):
            chunking = [s for s in chunking if self._fits(s)]
            if chunking or self._admissible_prompt() is not None:
                decode_step = False  # prefill-only
            else:
                chunking = []  # decode-only: no chunks, no admission
        n = len(co.seqs)
        due: list[Sequence] = []
        if decode_step and n:
            if n > c.max_num_batched_tokens:
                return False
            tick, bs = co.tick, c.block_size
            bucket = co.events.get(tick)
            if bucket:
                due = [s for s in dict.fromkeys(bucket) if s._cohort is co and
                       s._event == tick]
                due.sort(key=_serial_of)
                need = 0
                for s in due:
                    if len(s.blocks) * bs <= s._computed + tick:
                        need += 1
                if need > len(self._free_blocks):
                    return False
            self._advance(plan, due)
        if decode_step and not (c.mixed_batches or c.role is _DECODE):
            return True
        budget = c.max_num_batched_tokens - n * decode_step
        prefills = 0
        if chunking:  # (with none, _schedule_running returns (budget, 0))
            budget, prefills = self._schedule_running(chunking, plan, budget)
        self._admit(plan, budget, prefills)
        return True

    def _advance(self, plan: StepPlan, due: list[Sequence]) -> None:
        """Every cohort member decodes one token; `due` (in running order) are the members
        whose event is now: a new KV block, or the last token by length."""
        co = self._cohort
        tick = co.tick
        co.events.pop(tick, None)
        bs, max_len, free = self.config.block_size, self.config.max_model_len, self._free_blocks
        last: list[ScheduledSeq] = []
        ending: list[Sequence] = []
        events = co.events
        for seq in due:
            computed = seq._computed + tick
            blocks = seq.blocks
            if len(blocks) * bs <= computed:  # position `computed` opens a block
                blocks.append(free.popleft())
            output = seq._output
            out = output + tick + 1
            prompt, max_tokens = seq.num_prompt_tokens, seq.max_tokens
            if out >= max_tokens or prompt + out >= max_len:
                e = ScheduledSeq(seq, computed, 1, True, True)
                last.append(e)
                plan._finishing.append(e)  # type: ignore[union-attr]
                ending.append(seq)
                continue
            # self._schedule_event(seq), inline
            block_tick = len(blocks) * bs - seq._computed
            last_tick = (max_tokens if max_tokens < max_len - prompt else max_len - prompt) \
                - output - 1
            event = block_tick if block_tick < last_tick else last_tick
            seq._event = event
            bucket = events.get(event)
            if bucket is None:
                events[event] = [seq]
            else:
                bucket.append(seq)
        count = len(co.seqs)
        starts = co.off_sum + tick * count
        co.tick = tick + 1
        for seq in ending:  # they leave before the plan takes the lists: no copy for them
            self._leave(seq)
            seq.pending_finish = "length"
        plan._bulk = (tick, co.seqs, co.offs, co.serials, len(co.seqs), last, count, starts)
        co.shared += 1

    def _schedule_event(self, seq: Sequence) -> None:
        """Files a member under the tick of its next event. With offsets (count - tick) the
        event ticks do not depend on the current tick."""
        c = self.config
        block_tick = len(seq.blocks) * c.block_size - seq._computed
        last = c.max_model_len - seq.num_prompt_tokens
        if seq.max_tokens < last:
            last = seq.max_tokens
        last_tick = last - seq._output - 1
        tick = block_tick if block_tick < last_tick else last_tick
        seq._event = tick
        events = self._cohort.events
        bucket = events.get(tick)
        if bucket is None:
            events[tick] = [seq]
        else:
            bucket.append(seq)

    def _join(self, seq: Sequence) -> None:
        co = self._cohort
        seq._computed -= co.tick
        seq._output -= co.tick
        seq._cohort = co
        serials = co.serials
        if not serials or serials[-1] < seq._serial:  # the common case: the latest admitted
            co.seqs.append(seq)  # past what a plan holding the lists reads
            co.offs.append(seq._computed)
            serials.append(seq._serial)
        else:
            co.unshare()
            serials = co.serials
            i = bisect.bisect_left(serials, seq._serial)
            co.seqs.insert(i, seq)
            co.offs.insert(i, seq._computed)
            serials.insert(i, seq._serial)
        co.off_sum += seq._computed
        self._schedule_event(seq)

    def _leave(self, seq: Sequence) -> None:
        co = seq._cohort
        if co is None:
            return
        if co.shared:
            co.unshare()
        i = bisect.bisect_left(co.serials, seq._serial)
        del co.seqs[i], co.offs[i], co.serials[i]
        co.off_sum -= seq._computed
        seq._computed += co.tick
        seq._output += co.tick
        seq._cohort = None
        seq._event = -1

    def _dissolve(self) -> None:
        co = self._cohort
        for seq in co.seqs:
            seq._computed += co.tick
            seq._output += co.tick
            seq._cohort = None
            seq._event = -1
        co.seqs, co.offs, co.serials, co.off_sum, co.shared = [], [], [], 0, 0
        co.events.clear()

    @staticmethod
    def _decoding(seq: Sequence) -> bool:
        return seq._cohort is None and seq.status is _RUNNING and \
            seq.pending_finish is None and \
            seq.num_prompt_tokens + seq._output - seq._computed == 1

    def _join_new(self) -> None:
        running, join = _RUNNING, self._join
        for seq in self._joiners:
            # self._decoding(seq), inline
            if seq._cohort is None and seq.status is running and seq.pending_finish is None \
                    and seq.num_prompt_tokens + seq._output - seq._computed == 1:
                join(seq)

    def _join_all(self) -> None:
        for seq in self._running:
            if self._decoding(seq):
                self._join(seq)

    def _schedule_running(self, seqs: list[Sequence], plan: StepPlan,
                          budget: int | None = None) -> tuple[int, int]:
        """Schedules running sequences in order; returns (budget left, prompt chunks)."""
        c = self.config
        budget = c.max_num_batched_tokens if budget is None else budget
        prefills = 0
        bs, free, scheduled = c.block_size, self._free_blocks, plan._entries
        finishing = plan._finishing
        max_len, prefill_role = c.max_model_len, c.role is _PREFILL
        running = _RUNNING
        for seq in seqs:
            if seq.status is not running:
                continue  # preempted by an earlier one in this loop
            computed = seq.num_computed_tokens
            remaining = seq.num_prompt_tokens + seq.num_output_tokens - computed
            if remaining == 1:  # the decode fast path (most entries of most steps)
                if budget < 1:
                    break
                if len(seq.blocks) * bs <= computed:  # position `computed` opens a block
                    if free:
                        seq.blocks.append(free.popleft())
                    elif not self._grow(seq, computed + 1, plan):
                        continue  # seq itself was preempted
                seq.num_computed_tokens = computed + 1
                out = seq.num_output_tokens + 1  # placeholder for the token it samples
                seq.num_output_tokens = out
                if out >= seq.max_tokens or seq.num_prompt_tokens + out >= max_len:
                    seq.pending_finish = "length"
                elif prefill_role:
                    seq.pending_finish = "prefilled"
                e = ScheduledSeq(seq, computed, 1, True, seq.pending_finish is not None)
                scheduled.append(e)
                if e.finishes and finishing is not None:
                    finishing.append(e)
                budget -= 1
                continue
            is_prefill = True
            if is_prefill and c.max_prefill_seqs and prefills >= c.max_prefill_seqs:
                continue
            n = min(remaining, budget) if c.chunked_prefill else remaining
            if n <= 0 or (n > budget and plan.num_scheduled):
                continue
            if not self._grow(seq, seq.num_computed_tokens + n, plan):
                continue  # seq itself was preempted
            self._schedule_entry(seq, n, plan)
            budget -= n
            prefills += is_prefill
            if budget <= 0:
                break
        return budget, prefills

    def _fits(self, seq: Sequence) -> bool:
        """The next chunk of a running sequence gets its blocks without preempting anyone."""
        remaining = seq.num_tokens - seq.num_computed_tokens
        n = min(remaining, self.config.max_num_batched_tokens) if self.config.chunked_prefill \
            else remaining
        need = self.blocks_needed(seq.num_computed_tokens + n) - len(seq.blocks)
        return need <= len(self._free_blocks)

    def _admissible_prompt(self) -> Sequence | None:
        seq = self._waiting.peek()
        if seq is None or len(self._running) >= self.config.max_num_seqs:
            return None
        need = self.blocks_needed(self._first_chunk(seq, self.config.max_num_batched_tokens))
        if need + self._reserve(seq) > len(self._free_blocks):
            return None
        return seq

    def _reserve(self, seq: Sequence) -> int:
        return 0 if seq.needs_kv_insert else self.config.watermark_blocks

    def _first_chunk(self, seq: Sequence, budget: int) -> int:
        """KV positions the first step of a waiting sequence covers."""
        if seq.needs_kv_insert:  # handed-off KV plus the first decode
            return seq.num_tokens
        remaining = seq.num_tokens - seq.num_computed_tokens
        return seq.num_computed_tokens + (min(remaining, budget) if self.config.chunked_prefill
                                          else remaining)

    def _admit(self, plan: StepPlan, budget: int, prefill_seqs: int) -> None:
        c = self.config
        max_seqs, cap, chunked, bs = (c.max_num_seqs, c.max_prefill_seqs, c.chunked_prefill,
                                      c.block_size)
        max_len, prefill_role = c.max_model_len, c.role is _PREFILL
        running, waiting, free = self._running, self._waiting, self._free_blocks
        heap, live = waiting._heap, waiting._live
        entries, finishing, kv_inserts = plan._entries, plan._finishing, plan.kv_inserts
        joiners, serials = self._joiners, self._serials
        take, pop, status_running = free.popleft, heapq.heappop, _RUNNING
        while budget > 0 and len(running) < max_seqs:
            if cap and prefill_seqs >= cap:
                break
            while heap and id(heap[0][2]) not in live:  # waiting.peek(), inline
                pop(heap)
            if not heap:
                break
            seq = heap[0][2]
            # A waiting sequence is in no cohort: its counts are its fields.
            computed = seq._computed
            output = seq._output
            total = seq.num_prompt_tokens + output
            kv_insert = seq.needs_kv_insert
            if kv_insert:  # handed-off KV plus the first decode (see _first_chunk)
                upto = total
            else:
                remaining = total - computed
                upto = computed + (min(remaining, budget) if chunked else remaining)
            n = upto - computed
            if not kv_insert and not chunked and n > budget and plan.num_scheduled:
                break  # a whole prompt that does not fit this step waits for the next
            need = -(-upto // bs)
            if need + (0 if kv_insert else c.watermark_blocks) > len(free):
                break  # head-of-line: keep arrival order, wait for blocks
            pop(heap)  # = waiting.pop(): `seq` is on top
            live.discard(id(seq))
            self._waiting_tokens -= total - computed
            seq.blocks = list(starmap(take, repeat((), need)))  # need x popleft, in C
            seq.status = status_running
            seq._serial = next(serials)
            running[seq] = None
            if kv_insert:
                kv_inserts.append(seq)
                seq.needs_kv_insert = False
            else:
                prefill_seqs += 1
            # _schedule_entry(seq, n, plan), with the counts read above
            seq._computed = upto
            samples = upto == total
            finishes = False
            if samples:
                output += 1  # placeholder for the token it samples
                seq._output = output
                if output >= seq.max_tokens or seq.num_prompt_tokens + output >= max_len:
                    seq.pending_finish = "length"
                    finishes = True
                elif prefill_role:
                    seq.pending_finish = "prefilled"
                    finishes = True
                else:
                    joiners.append(seq)
            elif seq.pending_finish is not None:
                finishes = True
            e = ScheduledSeq(seq, computed, n, samples, finishes)
            entries.append(e)
            if finishes and finishing is not None:
                finishing.append(e)
            budget -= n

    def _schedule_entry(self, seq: Sequence, n: int, plan: StepPlan) -> None:
        start = seq.num_computed_tokens
        seq.num_computed_tokens += n
        samples = seq.num_computed_tokens == seq.num_tokens
        if samples:
            seq.num_output_tokens += 1  # placeholder for the token this step samples
            if seq.num_output_tokens >= seq.max_tokens or \
                    seq.num_tokens >= self.config.max_model_len:
                seq.pending_finish = "length"
            elif self.config.role is _PREFILL:
                seq.pending_finish = "prefilled"
            else:
                self._joiners.append(seq)
        e = ScheduledSeq(seq, start, n, samples, seq.pending_finish is not None)
        plan._entries.append(e)
        if e.finishes and plan._finishing is not None:
            plan._finishing.append(e)

    def _grow(self, seq: Sequence, upto: int, plan: StepPlan) -> bool:
        """Blocks for `upto` positions of a running sequence, preempting others if needed.
        False when `seq` itself had to be preempted."""
        need = self.blocks_needed(upto) - len(seq.blocks)
        while need > len(self._free_blocks):
            victim = self._victim()
            self._preempt(victim, plan)
            if victim is seq:
                return False
        for _ in range(max(0, need)):
            seq.blocks.append(self._free_blocks.popleft())
        return True

    def _victim(self) -> Sequence:
        # Lowest priority class first (largest value), latest admitted within it. Sequences
        # whose last token is in flight are about to free their blocks anyway.
        candidates = [s for s in reversed(self._running) if s.pending_finish is None]
        return max(candidates, key=lambda s: s.priority)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self._leave(seq)
        del self._running[seq]
        self._free(seq)
        # Drop its entry already in this plan (it restarts from scratch), with the placeholder
        # token that entry counted.
        for e in [e for e in plan.scheduled if e.seq is seq]:
            plan.scheduled.remove(e)
            if plan._finishing is not None and e in plan._finishing:
                plan._finishing.remove(e)
            if e.samples:
                seq.num_output_tokens -= 1
                seq.pending_finish = None
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = _WAITING
        plan.preempted.append(seq)
        self._enqueue(seq, front=True)

    def _expire(self, now: float, plan: StepPlan) -> None:
        expired = [s for s in self._by_id.values() if s.deadline is not None and now > s.deadline]
        for seq in expired:
            self._finish(seq, "timeout")
            plan.finished.append(seq)

    # ---- completion ------------------------------------------------------------------------

    def on_step_done(self, plan: StepPlan, now: float,
                     stopped: Mapping[Hashable, str] | None = None) -> list[Sequence]:
        """Record a completed step; returns the sequences it finished (blocks freed)."""
        self._load = None
        stopped = stopped or {}
        done: list[Sequence] = []
        finished = _FINISHED
        for e in plan.finishing:
            seq = e.seq
            if seq.status is not finished:
                reason = stopped.get(seq.request_id, seq.pending_finish) if stopped else \
                    seq.pending_finish
                self._finish(seq, reason or "length")
                done.append(seq)
        for rid, reason in stopped.items():  # stops of sequences that go on in later plans
            seq = self._by_id.get(rid)
            if seq is not None:
                self._finish(seq, reason)
                done.append(seq)
        return done

    def release(self, plan: StepPlan) -> None:
        """The caller is done with `plan` (it reads none of its entries or totals again, e.g.
        the cluster simulator after on_step_done): the aggregate decode lists it holds go
        back to the scheduler, which then changes them in place instead of copying."""
        b = plan._bulk
        if b is None:
            return
        plan._bulk = None
        plan._entries = []
        co = self._cohort
        if b[1] is co.seqs and co.shared:
            co.shared -= 1

    def _finish(self, seq: Sequence, reason: str) -> None:
        status = seq.status
        if status is _FINISHED:
            return
        if seq._cohort is not None:
            self._leave(seq)
        if status is _RUNNING:  # (exactly the members of _running)
            del self._running[seq]
        elif status is _WAITING:
            self._waiting.remove(seq)
            self._dequeue(seq)
        self._free_blocks.extend(seq.blocks)  # _free
        seq.blocks = []
        seq.status = _FINISHED
        seq.finish_reason = reason
        seq.pending_finish = None
        if self._by_id.pop(seq.request_id, None) is not None and seq.deadline is not None:
            self._num_deadlines -= 1

    def _free(self, seq: Sequence) -> None:
        self._free_blocks.extend(seq.blocks)
        seq.blocks = []

    def finish_all(self, reason: str) -> list[Sequence]:
        """Finish every queued and running sequence (e.g. the engine failed)."""
        self._load = None
        seqs = list(self._by_id.values())
        for seq in seqs:
            self._finish(seq, reason)
        return seqs

    # ---- observability ---------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def kv_usage(self) -> float:
        return 1.0 - len(self._free_blocks) / self.config.num_blocks

    @property
    def waiting_tokens(self) -> int:
        """Prompt (or recompute) tokens not yet computed of the waiting sequences."""
        return self._waiting_tokens

    def _load_key(self) -> tuple[int, int, float]:
        # (waiting_tokens + num_waiting, num_running, kv_usage), read directly
        self._load = (self._waiting_tokens + len(self._waiting._live), len(self._running),
                      1.0 - len(self._free_blocks) / self.config.num_blocks)
        return self._load

    @property
    def has_work(self) -> bool:
        return bool(self._by_id)

    def running(self) -> list[Sequence]:
        return list(self._running)

    def waiting(self) -> list[Sequence]:
        return list(self._waiting)


def least_loaded(schedulers: SequenceOf[Scheduler]) -> int:
    """Router: the instance with the least queued work (waiting tokens, then running sequences,
    then KV usage); ties go to the lowest index."""
    if not schedulers:
        raise ValueError("least_loaded: no instances")
    # Each instance's key (waiting_tokens + num_waiting, num_running, kv_usage) is kept until
    # its state changes: the simulator routes every arrival and handoff through here, and
    # between two of them only the instances that ran a step changed.
    keys = [s._load or s._load_key() for s in schedulers]
    return min(range(len(keys)), key=keys.__getitem__)
