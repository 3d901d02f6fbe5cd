"""Which instance takes the next request."""

from __future__ import annotations

from collections.abc import Sequence as SequenceOf

from flexnpu.serving.scheduler.scheduler import Scheduler


def least_loaded(schedulers: SequenceOf[Scheduler]) -> int:
    """Router: the instance with the least queued work (waiting tokens, then running sequences,
    then KV usage); ties go to the lowest index."""
    if not schedulers:
        raise ValueError("least_loaded: no instances")
    # Each instance's key (waiting_tokens + num_waiting, num_running, kv_usage) is kept until
    # its state changes: the simulator routes every arrival and handoff through here, and
    # between two of them only the instances that ran a step changed.
    keys = [s.load_key() for s in schedulers]
    return min(range(len(keys)), key=keys.__getitem__)
