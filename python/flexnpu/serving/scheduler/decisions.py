"""What one step gives one sequence. The per-sequence path (Scheduler) and the steady-decode
cohort (DecodeCohort) make these decisions for the same sequences; each is made here, once, so
the two paths agree by construction."""

from __future__ import annotations

from flexnpu.serving.scheduler.sequence import Sequence


def remaining_tokens(seq: Sequence) -> int:
    """Known tokens whose KV is not computed yet: 1 for a decoding sequence, more for a prompt
    (or a recompute after preemption). Read from the stored counts: in the cohort both carry
    the same offset, so their difference is exact there too."""
    return seq.num_prompt_tokens + seq._output - seq._computed


def chunk_tokens(remaining: int, budget: int, chunked: bool) -> int:
    """KV positions one step gives a sequence with `remaining` to compute: what the token
    budget allows, or all of them when prompts are not chunked."""
    return (remaining if remaining < budget else budget) if chunked else remaining


def output_limit(seq: Sequence, max_model_len: int) -> int:
    """The output count at which `seq` finishes by length: max_tokens, or what max_model_len
    leaves after its prompt. The step that samples the token reaching it is its last."""
    room = max_model_len - seq.num_prompt_tokens
    return seq.max_tokens if seq.max_tokens < room else room
