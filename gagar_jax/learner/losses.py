"""Policy-gradient losses: PPO-clip with asymmetric and dual clipping, KL, entropy.

All per-token arrays are `[B, T]` and aligned with the tokens: entry `t` is about
token `t` as a prediction target. `mask [B, T]` is True exactly at the policy's own
tokens (never prompt, observation or tool-output tokens); everything outside it
contributes nothing. Per-trajectory advantages `[B]` are broadcast to tokens.

Aggregation modes (how token losses become one number):
  token_mean               sum over all tokens / number of tokens (DAPO, Yu et al. 2025)
  seq_mean_token_mean      mean over sequences of each sequence's token mean (GRPO)
  seq_mean_token_sum_norm  mean over sequences of token sum / max_tokens (Dr. GRPO,
                           Liu et al. 2025: no length normalisation bias)
Denominators can be passed in (`num_tokens`, `num_seqs`) so that a loss summed over
micro-batches equals the loss of the whole batch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_MODES = ("off", "k1", "k3")


class Denominators(NamedTuple):
  """Batch-wide normalisers: tokens under the mask, sequences with any token."""

  num_tokens: jax.Array
  num_seqs: jax.Array


def denominators(mask) -> Denominators:
  mask = jnp.asarray(mask, bool)
  return Denominators(
    jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32),
    jnp.maximum(jnp.sum(jnp.any(mask, axis=-1)), 1).astype(jnp.float32),
  )


def aggregate(values, mask, mode: str, *, max_tokens: int | None = None, denom=None):
  """Reduces per-token `values [B, T]` under `mask` to a scalar (see module doc)."""
  if mode not in AGG_MODES:
    raise ValueError(f"loss aggregation {mode!r}: must be one of {AGG_MODES}")
  mask = jnp.asarray(mask, bool)
  denom = denom if denom is not None else denominators(mask)
  v = jnp.where(mask, values, 0.0)
  if mode == "token_mean":
    return jnp.sum(v) / denom.num_tokens
  per_seq_tokens = jnp.maximum(jnp.sum(mask, axis=-1), 1)
  if mode == "seq_mean_token_mean":
    per_seq = jnp.sum(v, axis=-1) / per_seq_tokens
  else:
    per_seq = jnp.sum(v, axis=-1) / float(max_tokens or values.shape[-1])
  return jnp.sum(per_seq) / denom.num_seqs


def kl_penalty(logprobs, ref_logprobs, kind: str):
  """Per-token KL estimate of the policy from the reference (Schulman 2020).

  k1 = log pi - log pi_ref (unbiased, can be negative);
  k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (unbiased, >= 0).
  """
  if kind not in KL_MODES:
    raise ValueError(f"kl={kind!r}: must be one of {KL_MODES}")
  if kind == "off":
    return jnp.zeros_like(logprobs)
  diff = ref_logprobs - logprobs
  if kind == "k1":
    return -diff
  # Clip the exponent: a huge log-ratio on one token must not make the loss inf.
  diff = jnp.clip(diff, -20.0, 20.0)
  return jnp.exp(diff) - diff - 1.0


def entropy_from_logits(logits):
  """Per-position entropy `[..., T]` of the categorical given by `logits [..., T, V]`."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def ppo_clip_loss(
  logprobs,
  old_logprobs,
  advantages,
  mask,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
  dual_clip: float = 0.0,
  agg: str = "token_mean",
  max_tokens: int | None = None,
  denom: Denominators | None = None,
):
  """PPO-clip policy loss (Schulman et al. 2017) with asymmetric clipping.

  ratio = exp(log pi - log pi_old); per token
    l = max(-A ratio, -A clip(ratio, 1 - eps_low, 1 + eps_high))      (clip-higher, DAPO)
  and with dual clipping (Ye et al. 2020, c = dual_clip > 1) for A < 0:
    l = min(l, -A c).

  Args:
    logprobs, old_logprobs: `[B, T]` log-probs of the taken tokens now / at sampling.
    advantages: `[B]` per trajectory (broadcast to tokens) or `[B, T]`.
    mask: `[B, T]` bool, the policy's own tokens.

  Returns:
    (loss, metrics) with clip fractions `clip_frac_low` (A < 0, ratio below 1 - eps_low)
    and `clip_frac_high` (A > 0, ratio above 1 + eps_high), `dual_clip_frac`, `ratio_mean`.
  """
  mask = jnp.asarray(mask, bool)
  adv = advantages[:, None] if advantages.ndim == 1 else advantages
  adv = jnp.broadcast_to(adv, logprobs.shape)
  # Outside the mask old log-probs may be padding: zero the difference before exp.
  log_ratio = jnp.where(mask, logprobs - old_logprobs, 0.0)
  ratio = jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  dual = jnp.zeros_like(mask)
  if dual_clip > 0:
    bound = -adv * dual_clip
    dual = (adv < 0) & (loss > bound)
    loss = jnp.where(adv < 0, jnp.minimum(loss, bound), loss)
  denom = denom if denom is not None else denominators(mask)
  total = aggregate(loss, mask, agg, max_tokens=max_tokens, denom=denom)
  token_mean = lambda x: aggregate(x.astype(jnp.float32), mask, "token_mean", denom=denom)
  metrics = {
    "clip_frac_low": token_mean((adv < 0) & (ratio < 1.0 - eps_low)),
    "clip_frac_high": token_mean((adv > 0) & (ratio > 1.0 + eps_high)),
    "dual_clip_frac": token_mean(dual),
    "ratio_mean": token_mean(ratio),
  }
  return total, metrics
