"""A request as the scheduler sees it (its token counts, KV blocks and status), the roles of an
instance and the errors that refuse a request."""

from __future__ import annotations

from collections.abc import Hashable
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flexnpu.serving.scheduler.cohort import DecodeCohort


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
MIXED, PREFILL, DECODE = Role.MIXED, Role.PREFILL, Role.DECODE
WAITING, RUNNING, FINISHED = SeqStatus.WAITING, SeqStatus.RUNNING, SeqStatus.FINISHED


class Sequence:
    """One request as the scheduler sees it. Fields below `payload` are kept by the scheduler
    and read-only for callers (num_computed_tokens / num_output_tokens are exact at any time;
    while the sequence is in steady decode they are derived from the scheduler's step count)."""

    __slots__ = (
        "request_id",
        "num_prompt_tokens",
        "max_tokens",
        "arrival",
        "deadline",
        "priority",
        "payload",
        "status",
        "_output",
        "_computed",
        "blocks",
        "num_preemptions",
        "finish_reason",
        "needs_kv_insert",
        "pending_finish",
        "_cohort",
        "_serial",
        "_event",
    )

    def __init__(
        self,
        request_id: Hashable,
        num_prompt_tokens: int,
        max_tokens: int,
        arrival: float,
        deadline: float | None = None,
        priority: int = 0,
        payload: Any = None,
        status: SeqStatus = SeqStatus.WAITING,
        num_output_tokens: int = 0,
        num_computed_tokens: int = 0,
        blocks: list[int] | None = None,
        num_preemptions: int = 0,
        finish_reason: str | None = None,
        needs_kv_insert: bool = False,
        pending_finish: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival
        self.deadline = deadline  # absolute; passed while waiting or running -> "timeout"
        self.priority = priority  # lower is served first
        self.payload = payload  # the caller's own object
        self.status = status
        # Set while in steady decode: the two counts below are then offsets from the
        # cohort's tick (see DecodeCohort).
        self._cohort: DecodeCohort | None = None
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
        return self.status is FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(request_id={self.request_id!r}, num_prompt_tokens="
            f"{self.num_prompt_tokens}, max_tokens={self.max_tokens}, status="
            f"{self.status}, num_output_tokens={self.num_output_tokens}, "
            f"num_computed_tokens={self.num_computed_tokens}, blocks={self.blocks}, "
            f"finish_reason={self.finish_reason!r})"
        )
