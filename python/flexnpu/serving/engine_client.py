"""What the HTTP server needs of what serves its requests: one engine over this host's devices
(serving.engine.Engine) or the multi-host front over the engines of a Ray cluster
(serving.multihost.front.ClusterFront). vLLM's EngineClient plays this part there; the server
and its streaming code see nothing else of either, so they never ask which one they have."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from flexnpu.serving.output import RequestOutput
from flexnpu.serving.sampling import SamplingParams


@dataclass(frozen=True)
class InstanceHealth:
    """One serving instance (a device's engine instance, or a host's replica): its state is
    "serving", "restarting" (it failed; its requests went on elsewhere) or "down" (out of
    service)."""

    name: str
    where: str  # its device, or its host
    role: str
    state: str
    restarts: int = 0
    last_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ModelLimits:
    """The limits an EngineClient derives from its model config (`cfg`), `max_model_len` and
    engine config (`ec`), for the classes that have those."""

    cfg: Any
    ec: Any
    max_model_len: int

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def max_prompt_len(self) -> int:
        return self.max_model_len - 1

    @property
    def request_timeout(self) -> float | None:
        return self.ec.request_timeout


@runtime_checkable
class EngineClient(Protocol):
    """Submit, abort, health and the model's limits. `submit` raises EngineDeadError (HTTP 503:
    not serving), QueueFullError (503: retry later), RequestTooLongError and ValueError (400)."""

    @property
    def healthy(self) -> bool: ...  # serves new requests

    @property
    def error(self) -> str | None: ...  # why not, when not healthy

    @property
    def eos_ids(self) -> Any: ...  # a collection of token ids

    @property
    def max_model_len(self) -> int: ...

    @property
    def max_prompt_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def request_timeout(self) -> float | None: ...  # seconds; None: no deadline by default

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, output: RequestOutput, *,
               deadline: float | None = None, priority: int = 0) -> Any: ...

    def abort(self, request: Any) -> None: ...  # a handle submit returned

    def health(self) -> Sequence[InstanceHealth]: ...

    def update_gauges(self) -> None: ...  # before /metrics is rendered

    def topology(self) -> Any: ...  # the hosts and links (serving.topology), or None

    def inject_fault(self, instance: str) -> None: ...  # fault tests; ValueError if it can't
