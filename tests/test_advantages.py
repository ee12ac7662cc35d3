"""Properties of the GAGAR advantage kernel, its NumPy twin, and sharded execution."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gagar_jax import advantages as adv
from gagar_jax import sharding
from tests import advantages_reference as ref

SCHEMES = [("linear", {}), ("linear", {"floor": 0.1}), ("exponential", {}), ("reciprocal", {})]
ESTIMATORS = list(adv.ESTIMATORS)


@st.composite
def groups(draw, binary=True):
  """A batch [B, G]: rewards, passed, ranks (with ties), and an arbitrary valid mask."""
  b = draw(st.integers(1, 4))
  g = draw(st.sampled_from([1, 2, 3, 5, 6, 8, 12, 16]))
  seed = draw(st.integers(0, 2**31 - 1))
  rng = np.random.default_rng(seed)
  passed = rng.random((b, g)) < draw(st.sampled_from([0.0, 0.3, 0.6, 1.0]))
  valid = draw(hnp.arrays(bool, (b, g)))
  rewards = passed.astype(np.float32)
  if not binary:
    rewards = rewards + 0.3 * rng.random((b, g)).astype(np.float32)
  ranks = rng.integers(0, max(1, g // 2 + 1), (b, g)).astype(np.int32)  # ties likely
  return rewards, passed, ranks, valid


def _kernel(rewards, passed, ranks, valid, estimator="grpo", scheme="linear", params=None, **kw):
  a = adv.group_advantages(rewards, valid, estimator=estimator)
  return np.asarray(a), np.asarray(
    adv.redistribute(a, passed, ranks, valid, scheme=scheme, **(params or {}), **kw)
  )


def _conditioning(rewards, valid):
  """max over groups of max|r| / (max r - min r) on valid slots (0 for a group of equal rewards)."""
  worst = 0.0
  for r, v in zip(rewards, valid, strict=True):
    r = r[v].astype(np.float64)
    if r.size and r.max() > r.min():
      worst = max(worst, np.abs(r).max() / (r.max() - r.min()))
  return worst


def test_worked_example():
  # G=4, rewards [1,1,1,0]: mean .75, std sqrt(.1875)=.43301, A_pass=.57735, A_fail=-1.73205.
  # linear floor .5 over ranks [0,1,2]: w=[1,.75,.5]; sum_P A=1.73205, sum_P wA=1.29904,
  # ratio 4/3 -> A'=[.76980, .57735, .38490]; the failing slot keeps -1.73205.
  rewards = np.array([[1.0, 1.0, 1.0, 0.0]])
  passed = rewards > 0
  ranks = np.array([[0, 1, 2, 0]], np.int32)
  valid = np.ones((1, 4), bool)
  a, new = _kernel(rewards, passed, ranks, valid)
  np.testing.assert_allclose(a, [[0.57735, 0.57735, 0.57735, -1.73205]], atol=1e-4)
  np.testing.assert_allclose(new, [[0.76980, 0.57735, 0.38490, -1.73205]], atol=1e-4)
  ablation = adv.redistribute(a, passed, ranks, valid, preserve_sum=False)
  np.testing.assert_allclose(ablation, [[0.57735, 0.43301, 0.28868, -1.73205]], atol=1e-4)


def test_estimators_by_hand():
  r = np.array([[1.0, 0.0, 0.0, 5.0]])
  v = np.array([[True, True, True, False]])  # the 5.0 is padding
  # mean 1/3; drgrpo [2/3, -1/3, -1/3]; rloo: 1-0, 0-.5, 0-.5; std = sqrt(2/9) = .4714.
  np.testing.assert_allclose(
    adv.group_advantages(r, v, estimator="drgrpo"), [[2 / 3, -1 / 3, -1 / 3, 0]], atol=1e-6
  )
  np.testing.assert_allclose(
    adv.group_advantages(r, v, estimator="rloo"), [[1.0, -0.5, -0.5, 0]], atol=1e-6
  )
  np.testing.assert_allclose(
    adv.group_advantages(r, v), [[1.41421, -0.70711, -0.70711, 0]], atol=1e-4
  )


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("value", [1.0, 0.0, 0.1, -3.7, 1 / 3, 1e20, -1e30])
def test_equal_rewards_give_exactly_zero(estimator, value):
  # Regression: 12 valid rewards of 1.0 in 16 slots gave +0.107 each (grpo): the mean's
  # rounding residue survived in r - mean and the std normalisation turned it into credit.
  # One row per valid count 1..64, in 64 slots, leading and scattered; padding holds junk.
  rng = np.random.default_rng(0)
  valid = np.zeros((128, 64), bool)
  for n in range(1, 65):
    valid[n - 1, :n] = True
    valid[63 + n, rng.permutation(64)[:n]] = True
  rewards = np.where(valid, value, 7.0).astype(np.float32)
  a = np.asarray(adv.group_advantages(rewards, valid, estimator=estimator))
  assert not a.any(), np.flatnonzero(a.any(-1))
  for n in (1, 3, 6, 12, 24):  # groups with no padding slots at all
    a = adv.group_advantages(np.full((2, n), value, np.float32), np.ones((2, n), bool))
    assert not np.asarray(a).any(), n


@settings(max_examples=60, deadline=None)
@given(
  groups(binary=False),
  st.sampled_from(ESTIMATORS),
  st.floats(-10.0, 10.0),
  st.integers(-64, 64),
)
def test_adding_a_constant_changes_nothing(batch, estimator, shift, dyadic):
  rewards, _, _, valid = batch
  a = np.asarray(adv.group_advantages(rewards, valid, estimator=estimator))
  shifted = np.asarray(
    adv.group_advantages(rewards + np.float32(shift), valid, estimator=estimator)
  )
  # r + shift rounds to float32 (ulp(10) ~ 1e-6), amplified by max|r + shift| / spread.
  tol = 1e-5 + 8 * np.finfo(np.float32).eps * _conditioning(rewards + np.float32(shift), valid)
  np.testing.assert_allclose(shifted, a, rtol=tol, atol=tol * max(np.abs(a).max(), 1.0))
  # Rewards on a 1/64 grid plus a multiple of 1/8: every sum is exact, so is the result.
  grid = np.round(rewards * 64) / 64
  exact = np.asarray(adv.group_advantages(grid, valid, estimator=estimator))
  moved = np.asarray(adv.group_advantages(grid + dyadic / 8, valid, estimator=estimator))
  np.testing.assert_array_equal(moved, exact)


@settings(max_examples=60, deadline=None)
@given(groups(binary=False), st.floats(0.01, 100.0), st.integers(-20, 20))
def test_scaling_rewards(batch, c, k):
  rewards, _, _, valid = batch
  c = np.float32(c)
  # eps = 0 so that (r - mean) / std is exactly scale-free (eps is an absolute floor).
  base = {
    e: np.asarray(adv.group_advantages(rewards, valid, estimator=e, eps=0.0)) for e in ESTIMATORS
  }
  # rewards * c rounds each reward to float32; when a group's spread is small next to its
  # rewards, that rounding is amplified by max|r| / spread (cancellation in r - min r).
  rtol = 1e-5 + 8 * np.finfo(np.float32).eps * _conditioning(rewards, valid)
  for e, factor in (("grpo", 1.0), ("drgrpo", c), ("rloo", c)):
    scaled = np.asarray(adv.group_advantages(rewards * c, valid, estimator=e, eps=0.0))
    want = base[e] * factor
    np.testing.assert_allclose(scaled, want, rtol=rtol, atol=rtol * max(np.abs(want).max(), 1e-30))
  # A power of two scales every intermediate exactly.
  p = np.float32(2.0**k)
  np.testing.assert_array_equal(
    adv.group_advantages(rewards * p, valid, estimator="grpo", eps=0.0), base["grpo"]
  )
  np.testing.assert_array_equal(
    adv.group_advantages(rewards * p, valid, estimator="drgrpo"), base["drgrpo"] * p
  )


def test_grpo_default_eps_is_scale_free_for_binary_rewards():
  rng = np.random.default_rng(0)
  passed = rng.random((32, 12)) < 0.5
  valid = rng.random((32, 12)) < 0.8
  a = np.asarray(adv.group_advantages(passed.astype(np.float32), valid))
  for c in (0.5, 3.0, 100.0):
    np.testing.assert_allclose(
      adv.group_advantages(passed * np.float32(c), valid), a, rtol=1e-5, atol=1e-5
    )


def test_non_finite_rewards_count_as_zero():
  rewards = np.array([[np.nan, 1.0, np.inf, 0.0], [-np.inf, 0.0, 0.0, 0.0]], np.float32)
  valid = np.ones((2, 4), bool)
  for e in ESTIMATORS:
    a = np.asarray(adv.group_advantages(rewards, valid, estimator=e))
    b = np.asarray(
      adv.group_advantages(np.nan_to_num(rewards, nan=0, posinf=0, neginf=0), valid, estimator=e)
    )
    np.testing.assert_array_equal(a, b)
    assert not a[1].any()  # all four count as 0: exactly zero advantage


@settings(max_examples=60, deadline=None)
@given(groups(binary=False), st.sampled_from(SCHEMES), st.sampled_from(ESTIMATORS))
def test_sum_over_passing_is_preserved(batch, scheme, estimator):
  rewards, passed, ranks, valid = batch
  a, new = _kernel(rewards, passed, ranks, valid, estimator, scheme[0], scheme[1])
  mask = passed & valid
  before = np.where(mask, a, 0).sum(-1)
  after = np.where(mask, new, 0).sum(-1)
  scale = np.where(mask, np.abs(a), 0).sum(-1)
  np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5 * scale.max() + 1e-12)


@settings(max_examples=60, deadline=None)
@given(groups(binary=False), st.sampled_from(SCHEMES), st.booleans())
def test_failing_and_invalid_untouched(batch, scheme, preserve_sum):
  rewards, passed, ranks, valid = batch
  a, new = _kernel(rewards, passed, ranks, valid, "grpo", *scheme, preserve_sum=preserve_sum)
  keep = ~(passed & valid)
  np.testing.assert_array_equal(new[keep], a[keep])


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(SCHEMES))
def test_equal_ranks_or_single_passing_unchanged(batch, scheme):
  rewards, passed, ranks, valid = batch
  a = np.asarray(adv.group_advantages(rewards, valid))
  tied = np.zeros_like(ranks) + 3
  np.testing.assert_allclose(
    adv.redistribute(a, passed, tied, valid, scheme=scheme[0], **scheme[1]), a, rtol=1e-6
  )
  single = passed & valid & (np.cumsum(passed & valid, axis=1) == 1)
  np.testing.assert_allclose(
    adv.redistribute(a, single, ranks, valid, scheme=scheme[0], **scheme[1]), a, rtol=1e-6
  )


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(SCHEMES), st.sampled_from(ESTIMATORS), st.booleans())
def test_better_rank_never_gets_less_and_ties_equal(batch, scheme, estimator, preserve_sum):
  rewards, passed, ranks, valid = batch
  _, new = _kernel(rewards, passed, ranks, valid, estimator, *scheme, preserve_sum=preserve_sum)
  mask = passed & valid
  for b in range(rewards.shape[0]):
    idx = np.flatnonzero(mask[b])
    for i, j in itertools.product(idx, idx):
      if ranks[b, i] < ranks[b, j]:
        assert new[b, i] >= new[b, j] - 1e-6
      elif ranks[b, i] == ranks[b, j]:
        assert new[b, i] == pytest.approx(new[b, j], rel=1e-6, abs=1e-7)


@settings(max_examples=40, deadline=None)
@given(groups(binary=False), st.sampled_from(SCHEMES), st.integers(0, 2**31 - 1))
def test_permutation_equivariance(batch, scheme, seed):
  rewards, passed, ranks, valid = batch
  perm = np.random.default_rng(seed).permutation(rewards.shape[1])
  a, new = _kernel(rewards, passed, ranks, valid, "grpo", *scheme)
  a_p, new_p = _kernel(
    rewards[:, perm], passed[:, perm], ranks[:, perm], valid[:, perm], "grpo", *scheme
  )
  # Summation order changes with the permutation: float32 round-off only.
  np.testing.assert_allclose(a_p, a[:, perm], rtol=1e-5, atol=2e-5)
  np.testing.assert_allclose(new_p, new[:, perm], rtol=1e-5, atol=2e-5)


@st.composite
def arbitrary_rewards(draw):
  """A batch [B, G] with arbitrary real rewards (custom reward functions): passing
  advantages of both signs are common."""
  b, g = draw(st.integers(1, 4)), draw(st.sampled_from([2, 3, 5, 8, 16]))
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
  rewards = (scale * rng.standard_normal((b, g))).astype(np.float32)
  passed = rng.random((b, g)) < 0.6
  ranks = rng.integers(0, g, (b, g)).astype(np.int32)
  return rewards, passed, ranks, rng.random((b, g)) < 0.9


@settings(max_examples=100, deadline=None)
@given(
  st.one_of(groups(binary=False), arbitrary_rewards()),
  st.sampled_from(SCHEMES),
  st.sampled_from(ESTIMATORS),
)
def test_no_passing_advantage_grows_beyond_the_groups_passing_credit(batch, scheme, estimator):
  # Regression: shaped rewards with passing advantages of both signs passed the net-credit
  # guard and single advantages were scaled by up to 458x (1,400x with arbitrary rewards).
  rewards, passed, ranks, valid = batch
  a, new = _kernel(rewards, passed, ranks, valid, estimator, *scheme)
  mask = passed & valid
  bound = np.where(mask, np.abs(a), 0).sum(-1, keepdims=True)
  assert (np.abs(np.where(mask, new, 0)) <= bound * (1 + 1e-5) + 1e-30).all()
  np.testing.assert_allclose(
    new, ref.redistribute(a, passed, ranks, valid, scheme=scheme[0], **scheme[1]), rtol=2e-5,
    atol=2e-5 * max(1.0, np.abs(a).max()),
  )  # fmt: skip


def test_mixed_sign_passing_credit_is_left_unchanged():
  # Passing advantages [+1.0, -0.99, +0.02] (shaped rewards): sum_P A = 0.03 passes the
  # net-credit guard (> 1e-3 * 2.01). Ranks [0, 1, 1], linear floor .5: w = [1, .5, .5],
  # sum_P w A = 1 - .495 + .01 = .515, ratio .03 / .515 = .058: the old kernel shrank the
  # best candidate's +1.0 to +0.058; with ranks [1, 0, 2]: w = [.75, 1, .5], sum_P w A =
  # .75 - .99 + .01 = -.23 < 0 (refused); near-cancelling weights scaled values by 100s.
  # Whatever the ranks, a mixed-sign group is left as it was.
  a = np.array([[1.0, -0.99, 0.02, -0.5]], np.float32)
  passed = np.array([[True, True, True, False]])
  valid = np.ones_like(passed)
  for ranks in ([0, 1, 1, 0], [1, 0, 2, 0], [2, 0, 1, 0]):
    new = adv.redistribute(a, passed, np.array([ranks], np.int32), valid)
    np.testing.assert_array_equal(np.asarray(new), a)


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(SCHEMES), st.sampled_from(ESTIMATORS))
def test_no_rescale_never_increases_passing_advantage(batch, scheme, estimator):
  rewards, passed, ranks, valid = batch
  a, new = _kernel(rewards, passed, ranks, valid, estimator, *scheme, preserve_sum=False)
  mask = passed & valid
  assert (new[mask] <= a[mask] + 1e-7).all()


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_nan_or_inf_on_edge_inputs(estimator, scheme):
  cases = [
    (np.ones((2, 4)), np.ones((2, 4), bool)),  # all pass
    (np.zeros((2, 4)), np.ones((2, 4), bool)),  # all fail
    (np.ones((3, 1)), np.ones((3, 1), bool)),  # G = 1
    (np.ones((2, 4)), np.zeros((2, 4), bool)),  # everything invalid
    (np.array([[1e30, -1e30, 3e29, 0.0]]), np.ones((1, 4), bool)),  # huge
    (np.array([[1e-30, 0.0, 2e-30, 1e-38]]), np.ones((1, 4), bool)),  # tiny
    (np.array([[3.0e38, -3.0e38, 1.0, 0.0]]), np.ones((1, 4), bool)),  # near float32 max
    (np.array([[1e30, 1e30, 1e30, 1e30]]), np.ones((1, 4), bool)),  # huge and equal
    (np.array([[np.inf, -np.inf, np.nan, 1.0]]), np.ones((1, 4), bool)),  # non-finite
  ]
  for rewards, valid in cases:
    passed = rewards > 0
    ranks = np.arange(rewards.size, dtype=np.int32).reshape(rewards.shape) * 1000
    a, new = _kernel(rewards.astype(np.float32), passed, ranks, valid, estimator, *scheme)
    assert np.isfinite(a).all() and np.isfinite(new).all(), (rewards, a, new)
    w = np.asarray(adv.rank_weights(ranks, passed, valid, scheme=scheme[0], **scheme[1]))
    assert ((w > 0) & (w <= 1)).all()


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(SCHEMES))
def test_rank_weight_properties(batch, scheme):
  _, passed, ranks, valid = batch
  w = np.asarray(adv.rank_weights(ranks, passed, valid, scheme=scheme[0], **scheme[1]))
  mask = passed & valid
  assert ((w > 0) & (w <= 1)).all()
  for b in range(w.shape[0]):
    idx = np.flatnonzero(mask[b])
    if len(idx):
      assert w[b, idx[np.argmin(ranks[b, idx])]] == 1.0
    for i, j in itertools.product(idx, idx):
      if ranks[b, i] <= ranks[b, j]:
        assert w[b, i] >= w[b, j]
  assert (w[~mask] == 1.0).all()


@settings(max_examples=60, deadline=None)
@given(
  groups(binary=False),
  st.sampled_from(SCHEMES),
  st.sampled_from(ESTIMATORS),
  st.booleans(),
)
def test_matches_numpy_reference(batch, scheme, estimator, preserve_sum):
  rewards, passed, ranks, valid = batch
  a, new = _kernel(rewards, passed, ranks, valid, estimator, *scheme, preserve_sum=preserve_sum)
  a_ref = ref.group_advantages(rewards, valid, estimator=estimator)
  new_ref = ref.redistribute(
    a_ref, passed, ranks, valid, preserve_sum=preserve_sum, scheme=scheme[0], **scheme[1]
  )
  np.testing.assert_allclose(a, a_ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(new, new_ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(
    adv.informative_groups(passed, valid), ref.informative_groups(passed, valid)
  )
  np.testing.assert_allclose(
    adv.rank_weights(ranks, passed, valid, scheme=scheme[0], **scheme[1]),
    ref.rank_weights(ranks, passed, valid, scheme=scheme[0], **scheme[1]),
    rtol=1e-5,
  )


def test_informative_groups():
  passed = np.array([[1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 1]], bool)
  valid = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 1]], bool)
  # Row 3: the failing member is padding, so the group is all-pass.
  np.testing.assert_array_equal(adv.informative_groups(passed, valid), [True, False, False, False])


def test_bad_arguments_are_rejected():
  z = np.zeros((1, 2))
  with pytest.raises(ValueError, match="estimator='ppo'"):
    adv.group_advantages(z, z > 0, estimator="ppo")
  with pytest.raises(ValueError, match="scheme='cubic'"):
    adv.rank_weights(z.astype(np.int32), z > 0, z > 0, scheme="cubic")
  with pytest.raises(ValueError, match="takes only 'floor'"):
    adv.redistribute(z, z > 0, z.astype(np.int32), z > 0, scheme="linear", flor=0.2)
  with pytest.raises(ValueError, match="floor=0.0 must be in"):
    adv.rank_weights(z.astype(np.int32), z > 0, z > 0, scheme="linear", floor=0.0)


def test_sharded_kernel_runs_without_gathering(devices8):
  # [B, G] sharded over `data`: the compiled kernel contains no cross-device collective.
  mesh = sharding.make_mesh({"data": 8})
  spec = NamedSharding(mesh, P("data", None))
  rng = np.random.default_rng(0)
  passed = rng.random((64, 8)) < 0.5
  rewards = passed.astype(np.float32)
  ranks = rng.integers(0, 4, (64, 8)).astype(np.int32)
  valid = rng.random((64, 8)) < 0.9

  def kernel(r, p, k, v):
    a = adv.group_advantages(r, v)
    return adv.redistribute(a, p, k, v), adv.informative_groups(p, v)

  args = [jax.device_put(x, spec) for x in (rewards, passed, ranks, valid)]
  compiled = jax.jit(kernel, in_shardings=(spec,) * 4).lower(*args).compile()
  hlo = compiled.as_text()
  for collective in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
    assert collective not in hlo, collective
  out, informative = compiled(*args)
  assert out.sharding.spec == P("data", None)
  expected = ref.redistribute(ref.group_advantages(rewards, valid), passed, ranks, valid)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-5)
  assert jnp.asarray(informative).shape == (64,)


# ------------------------------------------------------------------- tiered protocol


@st.composite
def tiered_groups(draw, binary=True):
  """(rewards, passed, valid, tiers, tier_ranks, hacks, graded), ties in ranks likely."""
  rewards, passed, _, valid = draw(groups(binary=binary))
  b, g = passed.shape
  rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
  tiers = rng.integers(0, 3, (b, g)).astype(np.int32)
  tier_ranks = rng.integers(0, max(1, g // 3 + 1), (b, g)).astype(np.int32)
  hacks = rng.random((b, g)) < draw(st.sampled_from([0.0, 0.2, 0.5]))
  graded = rng.random(b) < draw(st.sampled_from([1.0, 0.7]))
  return rewards, passed, valid, tiers, tier_ranks, hacks, graded


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_groups(binary=False), st.sampled_from([1.5, 1.1, 3.0, float("inf")]))
def test_tiered_matches_numpy_twin_and_is_finite(batch, lambda_max):
  got = adv.tiered_advantages(*batch, lambda_max=lambda_max)
  want = ref.tiered_advantages(*batch, lambda_max=lambda_max)
  for x, y in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(x), y, rtol=1e-5, atol=1e-5)
  a, lam, capped = (np.asarray(x) for x in got)
  assert np.isfinite(a).all() and (lam <= lambda_max + 1e-6).all()
  rewards, passed, valid, *_ = batch
  assert (a[~valid] == 0).all()
  assert np.abs(np.where(valid, a, 0).sum(-1)).max() < 1e-4  # zero mean over valid slots
  np.testing.assert_allclose(
    np.asarray(adv.tier_factors(*batch[3:5], passed, valid)),
    ref.tier_factors(*batch[3:5], passed, valid),
    atol=1e-6,  # float32 against float64 rounding of the T2 interpolation
  )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_groups())
def test_tiered_below_the_cap_preserves_the_passing_sum_and_failing_credit(batch):
  rewards, passed, valid, tiers, tier_ranks, hacks, graded = batch
  a, lam, capped = (np.asarray(x) for x in adv.tiered_advantages(*batch))
  ok = passed & valid & ~hacks
  r = np.where(hacks & passed, 0.0, rewards)
  for b in range(len(a)):
    v = valid[b]
    if not graded[b] or capped[b] or not v.any():
      continue
    base = np.where(v, r[b] - r[b][v].mean(), 0.0)
    np.testing.assert_allclose(a[b][ok[b]].sum(), base[ok[b]].sum(), atol=1e-5)
    np.testing.assert_allclose(a[b][v & ~ok[b]], base[v & ~ok[b]], atol=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_groups())
def test_tiered_is_monotone_in_tier_and_rank_and_ties_are_equal(batch):
  rewards, passed, valid, tiers, tier_ranks, hacks, graded = batch
  a = np.asarray(adv.tiered_advantages(*batch)[0])
  ok = passed & valid & ~hacks
  for b in range(len(a)):
    if not graded[b]:
      continue
    idx = np.flatnonzero(ok[b])
    for i in idx:
      for j in idx:
        ki, kj = (tiers[b, i], tier_ranks[b, i]), (tiers[b, j], tier_ranks[b, j])
        if ki == kj:
          assert abs(a[b, i] - a[b, j]) < 1e-5
        elif ki < kj:
          assert a[b, i] >= a[b, j] - 1e-5


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_groups(binary=False), st.integers(0, 2**31 - 1))
def test_a_hack_is_a_failing_trajectory_with_reward_zero_and_ungraded_is_plain(batch, seed):
  rewards, passed, valid, tiers, tier_ranks, hacks, graded = batch
  got = np.asarray(adv.tiered_advantages(*batch)[0])
  as_fail = adv.tiered_advantages(
    np.where(hacks & passed, 0.0, rewards),
    passed & ~hacks,
    valid,
    tiers,
    tier_ranks,
    np.zeros_like(hacks),
    graded,
  )[0]
  # (A group whose grading was unusable has no confirmed hacks: it is plain, below.)
  np.testing.assert_allclose(got[graded], np.asarray(as_fail)[graded], atol=1e-5)
  ungraded = np.asarray(
    adv.tiered_advantages(rewards, passed, valid, tiers, tier_ranks, hacks, np.zeros_like(graded))[
      0
    ]
  )
  n = np.maximum(valid.sum(-1, keepdims=True), 1)
  plain = np.where(valid, rewards - np.where(valid, rewards, 0).sum(-1, keepdims=True) / n, 0)
  np.testing.assert_allclose(ungraded, plain, atol=1e-5)
  # Permutation equivariance.
  perm = np.random.default_rng(seed).permutation(rewards.shape[1])
  permuted = adv.tiered_advantages(*(x[:, perm] for x in batch[:6]), graded)[0]
  np.testing.assert_allclose(np.asarray(permuted), got[:, perm], atol=1e-5)


def test_tier_factors_by_hand():
  # T1 best 1.0, other T1 0.9; T2 0.85 -> 0.4 over its three tied groups; T3 0.2.
  tiers = np.array([[0, 0, 0, 1, 1, 1, 1, 2, 1]])
  ranks = np.array([[0, 0, 1, 0, 1, 1, 2, 0, 0]])
  passed = np.array([[1, 1, 1, 1, 1, 1, 1, 1, 0]], bool)
  f = np.asarray(adv.tier_factors(tiers, ranks, passed, np.ones_like(passed)))
  np.testing.assert_allclose(f[0], [1, 1, 0.9, 0.85, 0.625, 0.625, 0.4, 0.2, 0], atol=1e-6)
  one_t2 = np.asarray(adv.tier_factors([[1, 1]], [[3, 3]], [[True, True]], [[True, True]]))
  np.testing.assert_allclose(one_t2, [[0.85, 0.85]])
