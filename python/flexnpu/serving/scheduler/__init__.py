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

Modules: `sequence` (Sequence, SeqStatus, Role, the errors), `config` (SchedulerConfig),
`kv_blocks` (the free-block pool), `wait_queue`, `step_plan` (StepPlan, ScheduledSeq),
`decisions` (what one step gives one sequence), `scheduler` (Scheduler, one sequence at a time),
`cohort` (the steady decodes in aggregate: the same decisions for many sequences at once, so that
a step costs O(events), not O(batch)), `router` (least_loaded).
"""

from flexnpu.serving.scheduler.config import SchedulerConfig
from flexnpu.serving.scheduler.router import least_loaded
from flexnpu.serving.scheduler.scheduler import Scheduler
from flexnpu.serving.scheduler.sequence import (
    QueueFullError,
    RequestTooLongError,
    Role,
    SeqStatus,
    Sequence,
)
from flexnpu.serving.scheduler.step_plan import ScheduledSeq, StepPlan

__all__ = [
    "QueueFullError",
    "RequestTooLongError",
    "Role",
    "ScheduledSeq",
    "Scheduler",
    "SchedulerConfig",
    "SeqStatus",
    "Sequence",
    "StepPlan",
    "least_loaded",
]
