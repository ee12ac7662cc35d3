"""PPO-clip, aggregation modes and KL on tiny arrays worked out by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from gagar_jax.learner import losses


def test_ppo_clip_positive_advantage():
  # A=+1, ratios [1.5, .5, 1], eps .2: per-token max(-A r, -A clip(r)) = [-1.2, -.5, -1];
  # mean -0.9; token 0 is clipped high.
  old = jnp.zeros((1, 3))
  new = jnp.log(jnp.array([[1.5, 0.5, 1.0]]))
  loss, m = losses.ppo_clip_loss(new, old, jnp.array([1.0]), jnp.ones((1, 3), bool))
  assert float(loss) == pytest.approx(-0.9, abs=1e-6)
  assert float(m["clip_frac_high"]) == pytest.approx(1 / 3)
  assert float(m["clip_frac_low"]) == 0.0


def test_ppo_clip_negative_advantage_with_dual_clip():
  # A=-1, ratios [1.5, .5, 4], eps .2: [1.5, .8, 4]; dual clip c=3 caps the last at 3.
  # mean (1.5 + .8 + 3) / 3 = 1.76667; token 1 clipped low, token 2 dual-clipped.
  old = jnp.zeros((1, 3))
  new = jnp.log(jnp.array([[1.5, 0.5, 4.0]]))
  loss, m = losses.ppo_clip_loss(new, old, jnp.array([-1.0]), jnp.ones((1, 3), bool), dual_clip=3.0)
  assert float(loss) == pytest.approx(1.76667, abs=1e-5)
  assert float(m["clip_frac_low"]) == pytest.approx(1 / 3)
  assert float(m["dual_clip_frac"]) == pytest.approx(1 / 3)
  no_dual, _ = losses.ppo_clip_loss(new, old, jnp.array([-1.0]), jnp.ones((1, 3), bool))
  assert float(no_dual) == pytest.approx((1.5 + 0.8 + 4.0) / 3, abs=1e-5)


def test_asymmetric_clip_higher():
  # eps_high .28 lets ratio 1.25 through unclipped: -1.25 instead of -1.2.
  old, new = jnp.zeros((1, 1)), jnp.log(jnp.array([[1.25]]))
  loss, _ = losses.ppo_clip_loss(new, old, jnp.array([1.0]), jnp.ones((1, 1), bool), eps_high=0.28)
  assert float(loss) == pytest.approx(-1.25, abs=1e-6)


@pytest.mark.parametrize(
  "mode,expected",
  [
    ("token_mean", 2.5),  # (1+2+3+4) / 4 tokens
    ("seq_mean_token_mean", 3.0),  # (6/3 + 4/1) / 2 sequences
    ("seq_mean_token_sum_norm", 1.25),  # (6/4 + 4/4) / 2, max_tokens = T = 4
  ],
)
def test_aggregation_modes(mode, expected):
  values = jnp.array([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
  assert float(losses.aggregate(values, mask, mode)) == pytest.approx(expected)


def test_masked_tokens_never_matter():
  # Garbage (even NaN/inf) old log-probs outside the mask change nothing.
  rng = np.random.default_rng(0)
  new = jnp.asarray(rng.normal(size=(2, 5)) * 0.1)
  old = jnp.asarray(rng.normal(size=(2, 5)) * 0.1)
  mask = jnp.array([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], bool)
  adv = jnp.array([0.7, -1.3])
  ref, _ = losses.ppo_clip_loss(new, old, adv, mask)
  garbage = jnp.where(mask, old, jnp.array([jnp.nan, jnp.inf, -jnp.inf, 1e9, 0.0]))
  loss, _ = losses.ppo_clip_loss(new, garbage, adv, mask)
  assert float(loss) == pytest.approx(float(ref), abs=1e-7)


def test_kl_estimators():
  # log pi = log .5, log pi_ref = log .25: k1 = log 2 = .69315; k3 = .5 + .69315 - 1 = .19315.
  lp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
  assert float(losses.kl_penalty(lp, ref, "k1")[0, 0]) == pytest.approx(0.69315, abs=1e-5)
  assert float(losses.kl_penalty(lp, ref, "k3")[0, 0]) == pytest.approx(0.19315, abs=1e-5)
  assert float(losses.kl_penalty(lp, ref, "off")[0, 0]) == 0.0
  with pytest.raises(ValueError, match="kl='k2'"):
    losses.kl_penalty(lp, ref, "k2")


def test_entropy_of_uniform():
  # Uniform over 8 tokens: entropy log 8 = 2.07944.
  assert float(losses.entropy_from_logits(jnp.zeros((1, 1, 8)))[0, 0]) == pytest.approx(2.07944)


def test_micro_batch_denominators_add_up():
  rng = np.random.default_rng(1)
  values = jnp.asarray(rng.normal(size=(4, 6)))
  mask = jnp.asarray(rng.random((4, 6)) < 0.6)
  for mode in losses.AGG_MODES:
    full = losses.aggregate(values, mask, mode)
    denom = losses.denominators(mask)
    parts = sum(
      losses.aggregate(values[i : i + 2], mask[i : i + 2], mode, denom=denom) for i in (0, 2)
    )
    assert float(parts) == pytest.approx(float(full), abs=1e-6)
