"""The scheduler of one serving instance: admission, token-budget steps, preemption and
completion (the package docstring describes the model)."""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Mapping

from flexnpu.serving.scheduler.cohort import DecodeCohort
from flexnpu.serving.scheduler.config import SchedulerConfig
from flexnpu.serving.scheduler.decisions import (
    chunk_tokens,
    output_limit,
    remaining_tokens,
)
from flexnpu.serving.scheduler.kv_blocks import BlockPool
from flexnpu.serving.scheduler.sequence import (
    DECODE,
    FINISHED,
    PREFILL,
    RUNNING,
    WAITING,
    QueueFullError,
    RequestTooLongError,
    Sequence,
)
from flexnpu.serving.scheduler.step_plan import ScheduledSeq, StepPlan
from flexnpu.serving.scheduler.wait_queue import WaitQueue


class Scheduler:
    """Plans the steps of one instance (schedule), records them (on_step_done) and takes
    requests in (add, add_prefilled) and out (abort, finish_all)."""

    def __init__(self, config: SchedulerConfig) -> None:
        config.validate()
        self.config = config
        self._pool = BlockPool(config.num_blocks, config.block_size)
        self._waiting = WaitQueue()
        # In admission order (a dict as an ordered set: a finish or preemption removes its
        # sequence in O(1) from batches of a thousand).
        self._running: dict[Sequence, None] = {}
        self._by_id: dict[Hashable, Sequence] = {}
        self._step_ids = itertools.count()
        self._num_deadlines = 0  # live sequences with a deadline (skip the expiry scan if none)
        self._serials = itertools.count(1)
        # Steady decodes in aggregate (see DecodeCohort); a PREFILL instance hands a sequence
        # off at its first token, so it has none.
        self._cohort = DecodeCohort(self._pool, config.max_model_len)
        self._bulk_ok = config.role is not PREFILL
        # A decode instance only ever decodes: its handed-off sequences join the running batch.
        self._mixed = config.mixed_batches or config.role is DECODE
        self._joiners: list[Sequence] = []  # sampled in this step: decoding from the next
        # Running sequences aborted since the last schedule() (an ordered set): they leave there.
        self._aborting: dict[Sequence, None] = {}
        # least_loaded's key, cleared by every call that changes the state.
        self._load: tuple[int, int, float] | None = None

    # ---- admission -------------------------------------------------------------------------

    def _check(self, seq: Sequence, bounded: bool = True) -> None:
        c = self.config
        total = seq.num_prompt_tokens + seq.max_tokens
        blocks = self._pool.blocks_needed(total)
        usable = c.num_blocks - c.watermark_blocks
        # The common case in one test; any failure is named by the checks below.
        if (
            seq.num_prompt_tokens >= 1
            and seq.max_tokens >= 1
            and total <= c.max_model_len
            and blocks <= usable
            and (not bounded or len(self._waiting.live) < c.max_waiting)
            and seq.request_id not in self._by_id
        ):
            return
        if seq.request_id in self._by_id:
            raise ValueError(f"scheduler: request id {seq.request_id!r} is already scheduled")
        if seq.num_prompt_tokens < 1:
            raise RequestTooLongError("the prompt must have at least one token")
        if seq.max_tokens < 1:
            raise RequestTooLongError(f"max_tokens must be >= 1, got {seq.max_tokens}")
        if total > c.max_model_len:
            raise RequestTooLongError(
                f"this model's maximum context length is {c.max_model_len} tokens; the request "
                f"has {seq.num_prompt_tokens} prompt tokens + max_tokens {seq.max_tokens} = "
                f"{total}"
            )
        # The whole sequence must fit the pool alone, or it could never finish.
        if blocks > usable:
            raise RequestTooLongError(
                f"a sequence of {total} tokens needs {blocks} KV blocks of "
                f"{c.block_size}; the KV pool has {usable}"
            )
        if bounded and len(self._waiting.live) >= c.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({c.max_waiting} requests); retry later"
            )

    def add(self, seq: Sequence) -> None:
        """Queue a new request. RequestTooLongError / QueueFullError say why not."""
        self._load = None
        if self.config.role is DECODE:
            raise ValueError("scheduler: a decode instance takes sequences via add_prefilled()")
        self._check(seq)
        seq.status = WAITING
        seq.finish_reason = None
        seq.num_computed_tokens = 0
        self._enqueue(seq)

    def add_prefilled(self, seq: Sequence) -> None:
        """A decode (or mixed) instance takes a sequence prefilled elsewhere (its KV arrives
        with it)."""
        self._load = None
        if self.config.role is PREFILL:
            raise ValueError("scheduler: add_prefilled() is for decode and mixed instances")
        if seq.num_output_tokens < 1:
            raise ValueError("scheduler: a prefilled sequence has at least its first token")
        self._check(seq, bounded=False)  # backpressure applies at the front door only
        seq.status = WAITING
        seq.blocks = []
        seq.finish_reason = None
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.needs_kv_insert = True
        self._enqueue(seq)

    def _enqueue(self, seq: Sequence, front: bool = False) -> None:
        if seq.request_id not in self._by_id and seq.deadline is not None:
            self._num_deadlines += 1
        self._by_id[seq.request_id] = seq
        self._waiting.push(seq, front)

    def abort(self, request_id: Hashable) -> Sequence | None:
        """Finish a request ("abort"); None if unknown, finished or aborted already. A waiting
        sequence leaves at once. A running one may be in a plan the caller is still preparing
        or running (the engine prepares a plan outside its lock, and a client's disconnect
        aborts from another thread): it is planned no more, and leaves (its KV blocks back
        to the pool) at the next schedule(), on the planning thread. A sequence leaves every
        plan before its blocks are freed."""
        self._load = None
        seq = self._by_id.get(request_id)
        if seq is None or seq in self._aborting:
            return None
        if seq.status is RUNNING:
            self._aborting[seq] = None
        else:
            self._finish(seq, "abort")
        return seq

    # ---- scheduling ------------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """Plan one step. The plan may be empty (nothing runnable now)."""
        self._load = None
        plan = StepPlan(next(self._step_ids))
        if self._aborting:  # before any planning: no plan from now on holds them
            for seq in self._aborting:
                self._finish(seq, "abort")
            self._aborting.clear()
        if self._num_deadlines:
            self._expire(now, plan)
        self._joiners.clear()
        if self._bulk_ok:
            if self._schedule_bulk(plan):
                self._join_new()
                return plan
            # A step the aggregate cannot take exactly (decodes beyond the token budget, or
            # blocks that need a preemption): every sequence one by one, as below.
            self._cohort.dissolve()
        decoding: list[Sequence] = []
        chunking: list[Sequence] = []
        for seq in self._running:
            if seq.pending_finish is None:
                (decoding if remaining_tokens(seq) == 1 else chunking).append(seq)
        decodes = prefills = True
        if not self._mixed:
            decodes, prefills, chunking = self._unmixed_step(chunking)
        budget, chunks = self._schedule_running(
            (decoding if decodes else []) + chunking, plan, self.config.max_num_batched_tokens
        )
        if prefills:
            self._admit(plan, budget, chunks)
        if self._bulk_ok:
            self._join_all()
        return plan

    def _unmixed_step(self, chunking: list[Sequence]) -> tuple[bool, bool, list[Sequence]]:
        """A step of an instance whose batches are not mixed (a mixed step runs the running
        decodes, their prompt chunks and admits prompts): (the decodes run, prompts run, the
        chunks that run). A prefill-only step (prefill first, as vLLM without chunking) runs
        when a chunk fits without preempting anyone or a prompt can be admitted, else a
        decode-only step: a prefill step never preempts decodes that wait for their turn,
        which could livelock."""
        fitting = [s for s in chunking if self._fits(s)]
        if fitting or self._admissible_prompt() is not None:
            return False, True, fitting
        return True, False, []

    def _schedule_running(
        self, seqs: list[Sequence], plan: StepPlan, budget: int
    ) -> tuple[int, int]:
        """Schedules running sequences (in no cohort) in order; returns (budget left, prompt
        chunks)."""
        c = self.config
        cap, chunked = c.max_prefill_seqs, c.chunked_prefill
        prefills = 0
        for seq in seqs:
            if seq.status is not RUNNING:
                continue  # preempted by an earlier one in this loop
            remaining = remaining_tokens(seq)
            is_prefill = remaining != 1
            if not is_prefill:
                if budget < 1:
                    break
                n = 1
            else:
                if cap and prefills >= cap:
                    continue
                n = chunk_tokens(remaining, budget, chunked)
                if n <= 0 or (n > budget and plan.num_scheduled):
                    continue
            if not self._grow(seq, seq._computed + n, plan):
                continue  # seq itself was preempted
            self._schedule_entry(seq, n, plan)
            budget -= n
            prefills += is_prefill
            if budget <= 0:
                break
        return budget, prefills

    def _schedule_entry(self, seq: Sequence, n: int, plan: StepPlan) -> None:
        """The next `n` KV positions of `seq` (in no cohort) in `plan`; it samples when they
        reach its last known token."""
        start = seq._computed
        end = seq._computed = start + n
        samples = end == seq.num_prompt_tokens + seq._output
        if samples:
            seq._output += 1  # placeholder for the token this step samples
            c = self.config
            if seq._output >= output_limit(seq, c.max_model_len):
                seq.pending_finish = "length"
            elif c.role is PREFILL:  # handed off to a decode instance at its first token
                seq.pending_finish = "prefilled"
            else:
                self._joiners.append(seq)
        plan.add(ScheduledSeq(seq, start, n, samples, seq.pending_finish is not None))

    def _fits(self, seq: Sequence) -> bool:
        """The next chunk of a running sequence gets its blocks without preempting anyone."""
        c = self.config
        n = chunk_tokens(remaining_tokens(seq), c.max_num_batched_tokens, c.chunked_prefill)
        return self._pool.blocks_short(seq, seq._computed + n) <= len(self._pool.free)

    def _first_chunk(self, seq: Sequence, budget: int) -> tuple[int, int, int]:
        """(KV positions the first step of a waiting sequence covers, the blocks they take, the
        blocks that must stay free besides: the watermark kept for running sequences, if it is
        a new prompt)."""
        if seq.needs_kv_insert:  # handed-off KV plus the first decode
            upto = seq.num_prompt_tokens + seq._output
            return upto, self._pool.blocks_needed(upto), 0
        upto = seq._computed + chunk_tokens(
            remaining_tokens(seq), budget, self.config.chunked_prefill
        )
        return upto, self._pool.blocks_needed(upto), self.config.watermark_blocks

    def _admissible_prompt(self) -> Sequence | None:
        """The head of the queue, if an empty step could admit it."""
        seq = self._waiting.peek()
        if seq is None or len(self._running) >= self.config.max_num_seqs:
            return None
        _, need, reserve = self._first_chunk(seq, self.config.max_num_batched_tokens)
        if need + reserve > len(self._pool.free):
            return None
        return seq

    def _admit(self, plan: StepPlan, budget: int, prefill_seqs: int) -> None:
        """Waiting sequences join the running batch in queue order while batch slots, the
        token budget and free blocks allow; the first that does not fit stops admission
        (head-of-line: arrival order is kept)."""
        c = self.config
        running, waiting, pool = self._running, self._waiting, self._pool
        while budget > 0 and len(running) < c.max_num_seqs:
            if c.max_prefill_seqs and prefill_seqs >= c.max_prefill_seqs:
                break
            seq = waiting.peek() if waiting.live else None
            if seq is None:
                break
            # A waiting sequence is in no cohort: its counts are its fields.
            upto, need, reserve = self._first_chunk(seq, budget)
            n = upto - seq._computed
            if (
                not seq.needs_kv_insert
                and not c.chunked_prefill
                and n > budget
                and plan.num_scheduled
            ):
                break  # a whole prompt that does not fit this step waits for the next
            if need + reserve > len(pool.free):
                break  # wait for blocks
            waiting.pop()  # `seq`
            seq.blocks = pool.take(need)
            seq.status = RUNNING
            seq._serial = next(self._serials)
            running[seq] = None
            if seq.needs_kv_insert:
                plan.kv_inserts.append(seq)
                seq.needs_kv_insert = False
            else:
                prefill_seqs += 1
            self._schedule_entry(seq, n, plan)
            budget -= n

    def _grow(self, seq: Sequence, upto: int, plan: StepPlan) -> bool:
        """Blocks for `upto` positions of a running sequence, preempting others if needed.
        False when `seq` itself had to be preempted."""
        pool = self._pool
        need = pool.blocks_short(seq, upto)
        while need > len(pool.free):
            victim = self._victim()
            self._preempt(victim, plan)
            if victim is seq:
                return False
        if need > 0:
            seq.blocks += pool.take(need)
        return True

    def _victim(self) -> Sequence:
        # Lowest priority class first (largest value), latest admitted within it. Sequences
        # whose last token is in flight are about to free their blocks anyway.
        candidates = [s for s in reversed(self._running) if s.pending_finish is None]
        return max(candidates, key=lambda s: s.priority)

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        if seq._cohort is not None:
            seq._cohort.leave(seq)
        del self._running[seq]
        self._pool.give_back(seq)
        # Drop its entry already in this plan (it restarts from scratch), with the placeholder
        # token that entry counted.
        for e in plan.drop_entries_of(seq):
            if e.samples:
                seq.num_output_tokens -= 1
                seq.pending_finish = None
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = WAITING
        plan.preempted.append(seq)
        self._enqueue(seq, front=True)

    def _expire(self, now: float, plan: StepPlan) -> None:
        expired = [s for s in self._by_id.values() if s.deadline is not None and now > s.deadline]
        for seq in expired:
            self._finish(seq, "timeout")
            plan.finished.append(seq)

    # ---- steady decode in aggregate (DecodeCohort) -----------------------------------------

    def _schedule_bulk(self, plan: StepPlan) -> bool:
        """schedule()'s step with the cohort advanced in aggregate. False, having changed
        nothing, when this step needs the per-sequence path."""
        c, co, running = self.config, self._cohort, self._running
        chunking: list[Sequence] = []
        if len(running) > len(co.seqs):
            for seq in running:
                if seq._cohort is None and seq.pending_finish is None:
                    if remaining_tokens(seq) == 1:
                        return False  # a decode outside the cohort (not expected)
                    chunking.append(seq)
        decodes = prefills = True
        if not self._mixed:
            decodes, prefills, chunking = self._unmixed_step(chunking)
        n = len(co.seqs) if decodes else 0
        if n and (n > c.max_num_batched_tokens or not co.advance(plan)):
            return False
        if prefills:
            budget, chunks = c.max_num_batched_tokens - n, 0
            if chunking:  # (with none, _schedule_running returns (budget, 0))
                budget, chunks = self._schedule_running(chunking, plan, budget)
            self._admit(plan, budget, chunks)
        return True

    def _decoding(self, seq: Sequence) -> bool:
        """A running sequence outside the cohort that decodes in the next step."""
        return (
            seq._cohort is None
            and seq.status is RUNNING
            and seq.pending_finish is None
            and remaining_tokens(seq) == 1
        )

    def _join_new(self) -> None:
        for seq in self._joiners:
            if self._decoding(seq):
                self._cohort.join(seq)

    def _join_all(self) -> None:
        for seq in self._running:
            if self._decoding(seq):
                self._cohort.join(seq)

    # ---- completion ------------------------------------------------------------------------

    def on_step_done(
        self, plan: StepPlan, now: float, stopped: Mapping[Hashable, str] | None = None
    ) -> list[Sequence]:
        """Record a completed step; returns the sequences it finished (blocks freed)."""
        self._load = None
        stopped = stopped or {}
        done: list[Sequence] = []
        for e in plan.finishing:
            seq = e.seq
            if seq.status is not FINISHED:
                reason = (
                    stopped.get(seq.request_id, seq.pending_finish)
                    if stopped
                    else seq.pending_finish
                )
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
        seqs = plan.release_bulk()
        co = self._cohort
        if seqs is not None and seqs is co.seqs and co.shared:
            co.shared -= 1

    def _finish(self, seq: Sequence, reason: str) -> None:
        status = seq.status
        if status is FINISHED:
            return
        if seq._cohort is not None:
            seq._cohort.leave(seq)
        if status is RUNNING:  # (exactly the members of _running)
            del self._running[seq]
        elif status is WAITING:
            self._waiting.remove(seq)
        self._pool.give_back(seq)
        seq.status = FINISHED
        seq.finish_reason = reason
        seq.pending_finish = None
        if self._by_id.pop(seq.request_id, None) is not None and seq.deadline is not None:
            self._num_deadlines -= 1

    def take_out(
        self, *, decoding: bool, handoffs: bool = False
    ) -> list[tuple[Sequence, list[int]]]:
        """Removes sequences that go on at another instance (a role change), with the blocks
        that held their KV (back in this pool now: the caller copies them out before this
        scheduler plans another step). decoding=True: the running sequences in steady decode
        (KV complete up to their last sampled token; they continue through `add_prefilled`);
        False: the waiting prompts nothing was computed for (they continue through `add`);
        handoffs=True instead: the handed-off sequences still waiting for a batch slot (no
        blocks yet: their KV is still the caller's; they continue through `add_prefilled`).
        Only between steps: no planned step may be in flight, or its tokens would be lost.
        Each leaves finished "moved"; its counts stay as they were."""
        self._load = None
        if handoffs:
            picked = [s for s in self._waiting if s.needs_kv_insert]
        elif decoding:
            picked = [
                s
                for s in self._running
                if s.pending_finish is None and remaining_tokens(s) == 1
            ]
        else:
            picked = [s for s in self._waiting if s.num_computed_tokens == 0 and not s.blocks]
        out = []
        for seq in picked:
            blocks = list(seq.blocks)
            self._finish(seq, "moved")
            out.append((seq, blocks))
        return out

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
        return len(self._pool.free)

    @property
    def kv_usage(self) -> float:
        return self._pool.usage

    @property
    def waiting_tokens(self) -> int:
        """Prompt (or recompute) tokens not yet computed of the waiting sequences."""
        return self._waiting.tokens

    def load_key(self) -> tuple[int, int, float]:
        """The router's key: (waiting_tokens + num_waiting, num_running, kv_usage), kept until
        this scheduler's state changes (routers ask it of every instance per request)."""
        load = self._load
        if load is None:
            load = self._load = (
                self._waiting.tokens + len(self._waiting.live),
                len(self._running),
                self._pool.usage,
            )
        return load

    @property
    def has_work(self) -> bool:
        return bool(self._by_id)

    def running(self) -> list[Sequence]:
        return list(self._running)

    def waiting(self) -> list[Sequence]:
        return list(self._waiting)
