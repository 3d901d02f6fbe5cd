"""Sampling parameters of a request and the on-device sampler that runs inside the jitted step.

`sample_rows` turns a batch of logits into token ids on the device: greedy rows take the argmax;
sampled rows apply temperature, then top-k, top-p (over the top-k renormalised, as vLLM) and min-p
as one threshold on the sorted logits, and draw with the Gumbel-max trick from a key made of the
request's seed folded with the position of the token (`fold_in(PRNGKey(seed), position)`, the
seed's two 32-bit words folded in turn), so a
seeded request gives the same tokens whatever batch it lands in. The sort only runs when a row
samples; the logprobs (of the model distribution, with the top `NUM_TOP_LOGPROBS`) only when
a row asks for them. `mask_logits` first removes what may not be sampled (ids the tokenizer
lacks, stop ids before min_tokens), so logprobs never name such an id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

NUM_TOP_LOGPROBS = 20  # the most top logprobs a request may ask for (OpenAI's bound)


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 -> off
    min_p: float = 0.0
    seed: int | None = None  # None: the engine draws one per request
    ignore_eos: bool = False  # eos does not end the request (it may be sampled)
    min_tokens: int = 0  # no stop token is sampled and no stop applies before this many tokens
    stop: list[str] = field(default_factory=list)  # stop strings (the output processor)
    stop_token_ids: list[int] = field(default_factory=list)  # extra stop ids (output processor)
    logprobs: int | None = None  # None: none; k >= 0: the sampled token's logprob + top k
    skip_special_tokens: bool = True  # False: special tokens appear in the text (vLLM's field)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens = {self.max_tokens}], got "
                             f"{self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= NUM_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {NUM_TOP_LOGPROBS}], got {self.logprobs}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def mask_logits(logits, suppress_ids, vocab_limit: int | None = None):
    """logits [R, V] with -inf on the ids no row may sample: those >= `vocab_limit` (beyond the
    tokenizer's vocabulary, which a random model's may exceed) and each row's `suppress_ids`
    [R, K] (a request's stop ids before min_tokens; padding: ids >= V, dropped)."""
    r, v = logits.shape
    if vocab_limit is not None and vocab_limit < v:
        logits = jnp.where(jnp.arange(v)[None, :] < vocab_limit, logits, -jnp.inf)
    rows = jnp.arange(r)[:, None]
    return logits.at[rows, suppress_ids].set(-jnp.inf, mode="drop")


def _sampled_ids(logits, temperature, top_k, top_p, min_p, seeds, positions):
    """Ids drawn from the filtered, temperature-scaled distribution of every row [R, V]."""
    r, v = logits.shape
    t = jnp.where(temperature > 0, temperature, 1.0)[:, None]
    z = logits / t
    zs = -jnp.sort(-z, axis=-1)  # descending
    rank = jnp.arange(v)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)[:, None]
    zs_k = jnp.where(rank < k, zs, -jnp.inf)
    ps = jax.nn.softmax(zs_k, axis=-1)
    before = jnp.cumsum(ps, axis=-1) - ps  # mass of the better tokens
    keep = (rank < k) & ((before < top_p[:, None]) | (rank == 0))
    n_keep = jnp.sum(keep, axis=-1, keepdims=True)
    thr = jnp.take_along_axis(zs, n_keep - 1, axis=-1)  # [R, 1]
    # min-p: p_i >= min_p * p_max  <=>  z_i >= z_max + log(min_p)
    thr = jnp.maximum(thr, zs[:, :1] + jnp.log(jnp.maximum(min_p, 0.0))[:, None])
    masked = jnp.where(z >= thr, z, -jnp.inf)
    keys = jax.vmap(lambda s, p: jax.random.fold_in(
        jax.random.fold_in(jax.random.PRNGKey(s[0]), s[1]), p))(seeds, positions)
    gumbel = jax.vmap(lambda key: jax.random.gumbel(key, (v,), jnp.float32))(keys)
    return jnp.argmax(masked + gumbel, axis=-1).astype(jnp.int32)


def sample_rows(logits, temperature, top_k, top_p, min_p, seeds, positions, want_logprobs):
    """logits [R, V] f32; per-row params [R] (temperature f32, top_k i32, top_p f32, min_p f32,
    seeds [R, 2] u32 (low, high word), positions i32); want_logprobs: bool scalar.
    Returns (ids [R] i32, logprob of each id [R] f32, top ids [R, 20] i32, top logprobs [R, 20]).
    """
    logits = logits.astype(jnp.float32)
    greedy_ids = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    greedy = temperature <= 0

    def with_sampling(_):
        drawn = _sampled_ids(logits, temperature, top_k, top_p, min_p, seeds, positions)
        return jnp.where(greedy, greedy_ids, drawn)

    ids = jax.lax.cond(jnp.all(greedy), lambda _: greedy_ids, with_sampling, None)

    def with_logprobs(_):
        lp = jax.nn.log_softmax(logits, axis=-1)
        chosen = jnp.take_along_axis(lp, ids[:, None], axis=-1)[:, 0]
        top_lp, top_ids = jax.lax.top_k(lp, NUM_TOP_LOGPROBS)
        return chosen, top_ids.astype(jnp.int32), top_lp

    def without(_):
        rows = logits.shape[0]
        return (jnp.zeros((rows,), jnp.float32),
                jnp.zeros((rows, NUM_TOP_LOGPROBS), jnp.int32),
                jnp.zeros((rows, NUM_TOP_LOGPROBS), jnp.float32))

    chosen, top_ids, top_lp = jax.lax.cond(want_logprobs, with_logprobs, without, None)
    return ids, chosen, top_ids, top_lp
