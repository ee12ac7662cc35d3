"""The GAGAR advantage kernel: group advantages, informative groups, rank -> weight,
and sum-preserving redistribution of credit among a group's passing trajectories.

Pure `jax.numpy`; each function is written for one group `[G]` and vmapped over
the `B` groups of a batch `[B, G]`, so with `B` sharded over devices nothing is
ever gathered. `tests/advantages_reference.py` holds a plain NumPy twin (the test oracle).

Notation (docs/design.md, "The method"): a group holds G trajectories with
rewards r_i; `valid` marks real (non-padding) slots, `passed` the trajectories
whose hidden tests passed, `ranks` the grader's ranking of the passing ones
(0 = best, ties share a value).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

ESTIMATORS = ("grpo", "drgrpo", "rloo")
SCHEMES = {
  # scheme -> (parameter name, default, check, description of the valid range)
  "linear": ("floor", 0.5, lambda x: 0.0 < x <= 1.0, "in (0, 1]"),
  "exponential": ("decay", 0.5, lambda x: 0.0 < x <= 1.0, "in (0, 1]"),
  "reciprocal": ("power", 1.0, lambda x: x >= 0.0, ">= 0"),
}


def _masked_mean(x, mask, n):
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(n, 1.0)


# Magnitudes are clipped here before any arithmetic: XLA divides through a reciprocal
# and flushes denormals, so 1 / x for |x| > ~8.5e37 becomes 0 and would turn a huge
# (but finite) reward into NaN. 1e30 leaves every intermediate finite and normal.
_MAX_MAGNITUDE = 1e30
# Redistribution needs the passing set to hold clearly positive net credit.
_MIN_NET_CREDIT = 1e-3


def _group_advantages_one(rewards, valid, estimator, eps):
  """One group `[G]`. Statistics over valid slots only; invalid slots get 0.

  The rewards are first shifted by the group's smallest valid reward and divided by
  the largest shifted value, so every statistic is taken of numbers in [0, 1]: a
  group whose valid rewards are all equal has scale 0 and gets exactly 0 (no
  rounding residue of a mean can become credit), adding a constant to a group's
  rewards changes nothing but the round-off of the shift, and squares of huge
  rewards never overflow.
  """
  r = rewards.astype(jnp.float32)
  r = jnp.where(valid & jnp.isfinite(r), jnp.clip(r, -_MAX_MAGNITUDE, _MAX_MAGNITUDE), 0.0)
  n = jnp.sum(valid.astype(jnp.float32))
  low = jnp.min(jnp.where(valid, r, _MAX_MAGNITUDE))
  shifted = jnp.where(valid, r - low, 0.0)  # >= 0; at most 2e30, still finite
  scale = jnp.max(shifted)  # 0 exactly when all valid rewards are equal (or n <= 1)
  safe = jnp.where(scale > 0, scale, 1.0)
  z = shifted / safe  # in [0, 1]
  dz = jnp.where(valid, z - _masked_mean(z, valid, n), 0.0)
  if estimator == "drgrpo":
    adv = dz * scale
  elif estimator == "rloo":
    # r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean); 0 for a lone trajectory.
    adv = dz * (scale * n / jnp.maximum(n - 1.0, 1.0))
  else:
    # (r - mean) / (std + eps), population std: dz / (std(dz) + eps / scale).
    std_z = jnp.sqrt(_masked_mean(dz * dz, valid, n))
    adv = dz / (std_z + eps / safe)
  return jnp.where(valid & (scale > 0), adv, 0.0).astype(jnp.float32)


def group_advantages(rewards, valid, *, estimator: str = "grpo", eps: float = 1e-6):
  """Per-trajectory advantages from group statistics.

  Args:
    rewards: `[B, G]` rewards (binary test reward, or shaped).
    valid: `[B, G]` bool, False at padding slots.
    estimator: `grpo` ((r - mean) / (std + eps), Shao et al. 2024), `drgrpo`
      (r - mean, Liu et al. 2025) or `rloo` (leave-one-out baseline, Ahmadian et al. 2024).
    eps: added to the standard deviation (`grpo`).

  Returns:
    float32 `[B, G]`; 0 at invalid slots, and exactly 0 for every slot of a group
    whose valid rewards are all equal. Rewards are clipped to +-1e30 first (so that
    every intermediate stays finite in float32); non-finite rewards count as 0.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f"estimator={estimator!r}: must be one of {ESTIMATORS}")
  rewards, valid = jnp.asarray(rewards), jnp.asarray(valid, bool)
  chex.assert_rank(rewards, 2)
  chex.assert_equal_shape((rewards, valid))
  fn = lambda r, v: _group_advantages_one(r, v, estimator, eps)
  return jax.vmap(fn)(rewards, valid)


def informative_groups(passed, valid):
  """`[B]` bool: the group has at least one valid passing and one valid failing trajectory."""
  passed, valid = jnp.asarray(passed, bool), jnp.asarray(valid, bool)
  return jnp.any(passed & valid, axis=-1) & jnp.any(~passed & valid, axis=-1)


def scheme_param(scheme: str, scheme_params: dict) -> float:
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r}: must be one of {sorted(SCHEMES)}")
  name, default, ok, allowed = SCHEMES[scheme]
  unknown = set(scheme_params) - {name}
  if unknown:
    raise ValueError(f"scheme {scheme!r} takes only {name!r}, got {sorted(unknown)}")
  value = float(scheme_params.get(name, default))
  if not ok(value):
    raise ValueError(f"scheme {scheme!r}: {name}={value} must be {allowed}")
  return value


def _rank_weights_one(ranks, passed, valid, scheme, param):
  mask = passed & valid
  r = ranks.astype(jnp.float32)
  big = jnp.float32(3.0e38)
  best = jnp.min(jnp.where(mask, r, big))
  worst = jnp.max(jnp.where(mask, r, -big))
  gap = jnp.where(mask, r - best, 0.0)  # >= 0, 0 for the best passing rank
  if scheme == "linear":
    # 1 at the best rank, `floor` at the worst, linear in between.
    span = worst - best
    frac = jnp.where(span > 0, gap / jnp.where(span > 0, span, 1.0), 0.0)
    w = 1.0 - (1.0 - param) * frac
  elif scheme == "exponential":
    w = jnp.power(param, gap)
  else:  # reciprocal
    w = jnp.power(1.0 + gap, -param)
  # Tiny positive floor: weights stay in (0, 1] even for extreme gaps.
  w = jnp.clip(w, 1e-30, 1.0)
  return jnp.where(mask, w, 1.0).astype(jnp.float32)


def rank_weights(ranks, passed, valid, *, scheme: str = "linear", **scheme_params):
  """Rank -> weight w = f(rank) in (0, 1]: 1 for the best passing rank, non-increasing.

  Args:
    ranks: int32 `[B, G]`, 0 = best, ties share a value; ignored where not passing/valid.
    passed: `[B, G]` bool.
    valid: `[B, G]` bool.
    scheme: `linear` (`floor`=0.5: weight at the group's worst passing rank),
      `exponential` (`decay`=0.5: w = decay ** (rank - best)) or `reciprocal`
      (`power`=1: w = (1 + rank - best) ** -power).

  Returns:
    float32 `[B, G]`; 1 at non-passing or invalid slots (they are not reweighted).
  """
  param = scheme_param(scheme, scheme_params)
  fn = lambda r, p, v: _rank_weights_one(r, p, v, scheme, param)
  return jax.vmap(fn)(jnp.asarray(ranks), jnp.asarray(passed, bool), jnp.asarray(valid, bool))


def _redistribute_one(adv, passed, ranks, valid, preserve_sum, scheme, param):
  mask = passed & valid
  w = _rank_weights_one(ranks, passed, valid, scheme, param)
  weighted = w * jnp.clip(adv, -_MAX_MAGNITUDE, _MAX_MAGNITUDE)
  if preserve_sum:
    num = jnp.sum(jnp.where(mask, jnp.clip(adv, -_MAX_MAGNITUDE, _MAX_MAGNITUDE), 0.0))
    den = jnp.sum(jnp.where(mask, weighted, 0.0))
    # A'_i = w_i A_i (sum_P A_j) / (sum_P w_j A_j); the ratio first, so that huge
    # advantages cannot overflow. A zero or non-finite denominator (or a ratio that
    # would flip the sign of the credit) leaves the group as it was.
    # Also unchanged: a passing set without clearly positive net credit (sum_P A <=
    # 1e-3 sum_P |A|, e.g. an all-pass group under shaped rewards, whose advantages
    # sum to ~0): there the formula would scale every passing advantage to ~0.
    # And unchanged: a passing set holding advantages of both signs (shaped or custom
    # rewards; binary rewards never do). There the denominator can nearly cancel and the
    # ratio scale single advantages by hundreds; with one sign, each |A'_i| stays within
    # the group's total passing credit sum_P |A_j| (w_i A_i <= sum_P w_j A_j).
    total = jnp.sum(jnp.where(mask, jnp.abs(jnp.clip(adv, -_MAX_MAGNITUDE, _MAX_MAGNITUDE)), 0.0))
    ratio = num / jnp.where(den != 0, den, 1.0)
    ok = (den != 0) & jnp.isfinite(den) & jnp.isfinite(ratio) & (ratio > 0)
    ok = ok & (num > _MIN_NET_CREDIT * total)
    mixed_sign = jnp.any(mask & (adv > 0)) & jnp.any(mask & (adv < 0))
    ok = ok & ~mixed_sign
    new = weighted * ratio
    ok = ok & jnp.all(jnp.isfinite(jnp.where(mask, new, 0.0)))
    out = jnp.where(mask & ok, new, adv)
  else:
    out = jnp.where(mask, weighted, adv)
  return out.astype(jnp.float32)


def redistribute(
  advantages,
  passed,
  ranks,
  valid,
  *,
  preserve_sum: bool = True,
  scheme: str = "linear",
  **scheme_params,
):
  """GAGAR credit redistribution among each group's passing trajectories.

  Over the passing set P of a group, with w = `rank_weights(...)`:
    A'_i = w_i A_i (sum_{j in P} A_j) / (sum_{j in P} w_j A_j)   (preserve_sum)
    A'_i = w_i A_i                                                (ablation)
  The group's total passing credit is unchanged; its split moves toward the
  better-ranked trajectories. Failing and invalid slots are returned unchanged.
  A group is left as it was when the denominator is zero or non-finite, when its
  passing set holds no clearly positive net credit (sum_P A <= 1e-3 sum_P |A|: with
  binary rewards that is every group that is not informative), or when its passing
  advantages have both signs (shaped or custom rewards: the denominator could nearly
  cancel). So every redistributed advantage is bounded: |A'_i| <= sum_P |A_j|.

  Args:
    advantages: float `[B, G]` (from `group_advantages`).
    passed, ranks, valid: `[B, G]` as in `rank_weights`.
    preserve_sum: rescale so that sum_P A' = sum_P A.
    scheme, **scheme_params: the rank -> weight scheme (see `rank_weights`).

  Returns:
    float32 `[B, G]`.
  """
  param = scheme_param(scheme, scheme_params)
  args = (
    jnp.asarray(advantages, jnp.float32),
    jnp.asarray(passed, bool),
    jnp.asarray(ranks),
    jnp.asarray(valid, bool),
  )
  chex.assert_rank(args, 2)
  chex.assert_equal_shape(args)
  fn = lambda a, p, r, v: _redistribute_one(a, p, r, v, preserve_sum, scheme, param)
  return jax.vmap(fn)(*args)


# ---------------------------------------------------------------- the tiered protocol
# Quality tiers of passing candidates (the paper's grading protocol): T1 clean and
# targeted, T2 acceptable with problems, T3 poor (bloated, out of scope, hacky).
TIER_NAMES = ("T1", "T2", "T3")


def _tier_factors_one(tiers, tier_ranks, passed, valid, f_runner, f_max, f_min, f_low):
  mask = passed & valid
  big = jnp.int32(2**30)
  t = jnp.clip(tiers.astype(jnp.int32), 0, 2)
  r = tier_ranks.astype(jnp.int32)
  in1, in2 = mask & (t == 0), mask & (t == 1)
  best1 = jnp.min(jnp.where(in1, r, big))
  f1 = jnp.where(r == best1, 1.0, f_runner)
  # T2: linear in the dense rank of its tied groups, f_max at the best, f_min at the worst.
  below = jnp.sum(in2[None, :] & (r[None, :] < r[:, None]) & _first_of_tie(r, in2)[None, :], axis=1)
  levels = jnp.sum(_first_of_tie(r, in2))
  frac = jnp.where(levels > 1, below / jnp.maximum(levels - 1, 1), 0.0)
  f2 = f_max - (f_max - f_min) * frac
  f = jnp.where(t == 0, f1, jnp.where(t == 1, f2, f_low))
  return jnp.where(mask, f, 0.0).astype(jnp.float32)


def _first_of_tie(r, members):
  """True at one member of each distinct value of `r` among `members` (its first slot)."""
  g = r.shape[0]
  idx = jnp.arange(g)
  earlier_same = members[None, :] & (r[None, :] == r[:, None]) & (idx[None, :] < idx[:, None])
  return members & ~jnp.any(earlier_same, axis=1)


def tier_factors(
  tiers, tier_ranks, passed, valid, *, f_runner=0.9, f_max=0.85, f_min=0.4, f_low=0.2
):
  """Quality factor f of each passing candidate from its tier and tied rank within it.

  T1: 1.0 for its best tied group, `f_runner` for the other T1 groups; T2: linear from
  `f_max` (its best tied group) to `f_min` (its worst; `f_max` if it has one); T3: `f_low`.

  Args:
    tiers: int32 `[B, G]`, 0 = T1, 1 = T2, 2 = T3 (ignored where not passing / valid).
    tier_ranks: int32 `[B, G]`, the rank of the candidate's tied group within its tier
      (0 = best; equal values are ties).
    passed, valid: bool `[B, G]`.

  Returns:
    float32 `[B, G]`; 0 at failing and invalid slots.
  """
  fn = lambda t, r, p, v: _tier_factors_one(t, r, p, v, f_runner, f_max, f_min, f_low)
  return jax.vmap(fn)(
    jnp.asarray(tiers), jnp.asarray(tier_ranks), jnp.asarray(passed, bool), jnp.asarray(valid, bool)
  )


def _tiered_one(rewards, passed, valid, tiers, tier_ranks, hacks, graded, lambda_max, factors):
  r = rewards.astype(jnp.float32)
  r = jnp.where(valid & jnp.isfinite(r), jnp.clip(r, -_MAX_MAGNITUDE, _MAX_MAGNITUDE), 0.0)
  n = jnp.sum(valid.astype(jnp.float32))
  plain = jnp.where(valid, r - _masked_mean(r, valid, n), 0.0)
  # Confirmed hacks: reward 0 before the group statistics, and they count as failing.
  hack = hacks & passed & valid
  r_h = jnp.where(hack, 0.0, r)
  ok_pass = passed & valid & ~hack
  a = jnp.where(valid, r_h - _masked_mean(r_h, valid, n), 0.0)
  f = _tier_factors_one(tiers, tier_ranks, ok_pass, valid, *factors)
  pos = jnp.maximum(a, 0.0)
  num = jnp.sum(jnp.where(ok_pass, pos, 0.0))
  den = jnp.sum(jnp.where(ok_pass, f * pos, 0.0))
  ratio = num / jnp.where(den > 0, den, 1.0)
  has_credit = (den > 0) & jnp.isfinite(ratio)
  lam = jnp.where(has_credit, jnp.minimum(ratio, lambda_max), 1.0)
  capped = has_credit & (ratio > lambda_max)
  b = jnp.where(ok_pass, jnp.where(has_credit, lam * f * pos, a), a)
  out = jnp.where(valid, b - _masked_mean(b, valid, n), 0.0)
  out = jnp.where(graded, out, plain)
  lam = jnp.where(graded, lam, 1.0)
  capped = graded & capped
  return out.astype(jnp.float32), lam.astype(jnp.float32), capped


def tiered_advantages(
  rewards,
  passed,
  valid,
  tiers,
  tier_ranks,
  hacks,
  graded,
  *,
  lambda_max=1.5,
  f_runner=0.9,
  f_max=0.85,
  f_min=0.4,
  f_low=0.2,
):
  """The paper's tiered redistribution (Eq. 6-8 as its public implementation reads them).

  Per group: confirmed hacks get reward 0 and count as failing; a_i = r_i - mean(r) over
  the valid slots (no std normalisation); with quality factors f (`tier_factors`) over the
  passing set P and a+ = max(a, 0),
    lambda = min(sum_P a+ / sum_P f a+, lambda_max),
    B_i = lambda f_i a_i+ on P, B_i = a_i elsewhere,  A_i = B_i - mean(B) over valid slots.
  Below the cap mean(B) = 0 for binary rewards, so the passing sum is preserved and the
  failing trajectories keep a_i; `lambda_max=inf` is the seeds' exact sum preservation.
  A group without positive passing credit keeps a (lambda 1); a group whose grading was
  unusable (`graded` False) is returned as plain r - mean(r).

  Args:
    rewards: float `[B, G]`; passed, valid: bool `[B, G]`.
    tiers, tier_ranks: int32 `[B, G]` (see `tier_factors`); hacks: bool `[B, G]`
      (confirmed reward hacks; ignored where not passing).
    graded: bool `[B]`.

  Returns:
    (advantages float32 `[B, G]`, lambda float32 `[B]`, capped bool `[B]`).
  """
  args = (
    jnp.asarray(rewards, jnp.float32),
    jnp.asarray(passed, bool),
    jnp.asarray(valid, bool),
    jnp.asarray(tiers),
    jnp.asarray(tier_ranks),
    jnp.asarray(hacks, bool),
  )
  chex.assert_rank(args, 2)
  chex.assert_equal_shape(args)
  graded = jnp.broadcast_to(jnp.asarray(graded, bool), args[0].shape[:1])
  factors = (f_runner, f_max, f_min, f_low)
  fn = lambda *x: _tiered_one(*x, jnp.float32(lambda_max), factors)
  return jax.vmap(fn)(*args, graded)
