"""A plain NumPy reference for `gagar_jax.advantages`, one group at a time: a test oracle.

Written for clarity, not speed (float64, explicit loops); `test_advantages.py` checks
that the jitted kernel agrees with it on random inputs.
"""

from __future__ import annotations

import numpy as np


def group_advantages(rewards, valid, *, estimator="grpo", eps=1e-6):
  rewards, valid = np.asarray(rewards, np.float64), np.asarray(valid, bool)
  out = np.zeros(rewards.shape, np.float64)
  for b in range(rewards.shape[0]):
    r = rewards[b][valid[b]]
    n = len(r)
    if n == 0 or np.all(r == r[0]):
      continue  # equal rewards carry no signal: exactly 0
    mean = r.mean()
    if estimator == "grpo":
      a = (r - mean) / (r.std() + eps)
    elif estimator == "drgrpo":
      a = r - mean
    elif estimator == "rloo":
      a = np.array([r[i] - (r.sum() - r[i]) / (n - 1) for i in range(n)]) if n > 1 else 0 * r
    else:
      raise ValueError(estimator)
    out[b][valid[b]] = a
  return out.astype(np.float32)


def informative_groups(passed, valid):
  passed, valid = np.asarray(passed, bool), np.asarray(valid, bool)
  return np.array([(p & v).any() and (~p & v).any() for p, v in zip(passed, valid, strict=True)])


def rank_weights(ranks, passed, valid, *, scheme="linear", **params):
  ranks = np.asarray(ranks, np.float64)
  mask = np.asarray(passed, bool) & np.asarray(valid, bool)
  w = np.ones(ranks.shape, np.float64)
  for b in range(ranks.shape[0]):
    if not mask[b].any():
      continue
    r = ranks[b][mask[b]]
    gap = r - r.min()
    if scheme == "linear":
      span = r.max() - r.min()
      floor = params.get("floor", 0.5)
      w[b][mask[b]] = 1.0 - (1.0 - floor) * (gap / span if span > 0 else 0 * gap)
    elif scheme == "exponential":
      w[b][mask[b]] = params.get("decay", 0.5) ** gap
    elif scheme == "reciprocal":
      w[b][mask[b]] = (1.0 + gap) ** -params.get("power", 1.0)
    else:
      raise ValueError(scheme)
  return np.clip(w, 1e-30, 1.0).astype(np.float32)


def redistribute(advantages, passed, ranks, valid, *, preserve_sum=True, scheme="linear", **params):
  adv = np.asarray(advantages, np.float64)
  mask = np.asarray(passed, bool) & np.asarray(valid, bool)
  w = rank_weights(ranks, passed, valid, scheme=scheme, **params).astype(np.float64)
  out = adv.copy()
  for b in range(adv.shape[0]):
    p = mask[b]
    if not p.any():
      continue
    weighted = w[b][p] * adv[b][p]
    if not preserve_sum:
      out[b][p] = weighted
      continue
    den = weighted.sum()
    if den == 0 or not np.isfinite(den):
      continue
    if adv[b][p].sum() <= 1e-3 * np.abs(adv[b][p]).sum():
      continue  # no clearly positive net credit to redistribute
    if (adv[b][p] > 0).any() and (adv[b][p] < 0).any():
      continue  # mixed signs: the denominator could nearly cancel
    ratio = adv[b][p].sum() / den
    if not np.isfinite(ratio) or ratio <= 0:
      continue
    out[b][p] = weighted * ratio
  return out.astype(np.float32)


def tier_factors(
  tiers, tier_ranks, passed, valid, *, f_runner=0.9, f_max=0.85, f_min=0.4, f_low=0.2
):
  tiers, tier_ranks = np.asarray(tiers), np.asarray(tier_ranks)
  mask = np.asarray(passed, bool) & np.asarray(valid, bool)
  f = np.zeros(tiers.shape, np.float64)
  for b in range(tiers.shape[0]):
    t1 = sorted(
      {int(tier_ranks[b, i]) for i in range(tiers.shape[1]) if mask[b, i] and tiers[b, i] <= 0}
    )
    t2 = sorted(
      {int(tier_ranks[b, i]) for i in range(tiers.shape[1]) if mask[b, i] and tiers[b, i] == 1}
    )
    for i in range(tiers.shape[1]):
      if not mask[b, i]:
        continue
      t, r = min(max(int(tiers[b, i]), 0), 2), int(tier_ranks[b, i])
      if t == 0:
        f[b, i] = 1.0 if r == t1[0] else f_runner
      elif t == 1:
        j = t2.index(r)
        f[b, i] = f_max - (f_max - f_min) * (j / (len(t2) - 1) if len(t2) > 1 else 0.0)
      else:
        f[b, i] = f_low
  return f.astype(np.float32)


def tiered_advantages(
  rewards, passed, valid, tiers, tier_ranks, hacks, graded, *, lambda_max=1.5, **factors
):
  r = np.asarray(rewards, np.float64)
  passed, valid = np.asarray(passed, bool), np.asarray(valid, bool)
  hacks = np.asarray(hacks, bool)
  graded = np.broadcast_to(np.asarray(graded, bool), r.shape[:1])
  out = np.zeros(r.shape, np.float64)
  lam = np.ones(r.shape[0], np.float64)
  capped = np.zeros(r.shape[0], bool)
  for b in range(r.shape[0]):
    v = valid[b]
    if not v.any():
      continue
    if not graded[b]:
      out[b][v] = r[b][v] - r[b][v].mean()
      continue
    hack = hacks[b] & passed[b] & v
    rh = np.where(hack, 0.0, r[b])
    ok = passed[b] & v & ~hack
    a = np.where(v, rh - rh[v].mean(), 0.0)
    f = tier_factors(tiers[b : b + 1], tier_ranks[b : b + 1], ok[None], v[None], **factors)[0]
    pos = np.maximum(a, 0.0)
    num, den = pos[ok].sum(), (f[ok] * pos[ok]).sum()
    bvec = a.copy()
    if den > 0:
      ratio = num / den
      lam[b] = min(ratio, lambda_max)
      capped[b] = ratio > lambda_max
      bvec[ok] = lam[b] * f[ok] * pos[ok]
    out[b][v] = bvec[v] - bvec[v].mean()
  return out.astype(np.float32), lam.astype(np.float32), capped
