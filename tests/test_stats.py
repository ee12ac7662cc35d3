"""The sweep statistics: standard errors and paired intervals over seeds and tasks, on
simulated evaluations whose truth is known."""

import numpy as np
import pytest

from gagar_jax import stats


def _table(p, samples, rng, ids=None, hack_p=0.0):
  passed = rng.binomial(samples, p)
  n = len(p)
  return stats.TaskTable(
    tuple(ids or (f"t{i}" for i in range(n))),
    np.full(n, samples, float),
    passed.astype(float),
    np.full(n, 200.0 * samples),
    {"hack": rng.binomial(passed, hack_p).astype(float)},
  )


def test_sampling_se_matches_the_spread_of_repeated_evaluations():
  rng = np.random.default_rng(0)
  p = rng.beta(0.6, 1.2, 256)  # heterogeneous task difficulty, like MiniRepo's
  estimates, ses = [], []
  for _ in range(400):
    t = _table(p, 8, rng)
    estimates.append(stats.pass_at_1(t))
    ses.append(stats.sampling_se(t.passed, t.samples))
  assert np.mean(ses) == pytest.approx(np.std(estimates), rel=0.12)
  assert np.mean(ses) <= 0.01  # 256 tasks x 8 samples: the bar
  # Over the task population the SE is larger: difficulty varies between tasks.
  assert stats.task_se(t.passed, t.samples) > 1.5 * np.mean(ses)


def test_pass_at_k_and_habit_share():
  t = stats.TaskTable(
    ("a", "b"),
    np.array([4.0, 4.0]),
    np.array([1.0, 4.0]),
    np.array([800.0, 400.0]),
    {"hack": np.array([1.0, 1.0])},
  )
  assert stats.pass_at_1(t) == pytest.approx((0.25 + 1.0) / 2)
  assert stats.pass_at_k(4)(t) == pytest.approx(1.0)
  assert stats.pass_at_k(2)(t) == pytest.approx((0.5 + 1.0) / 2)
  assert stats.habit_share("hack")(t) == pytest.approx(2 / 5)
  assert stats.clean_pass_at_1(t) == pytest.approx((0.0 + 0.75) / 2)
  assert stats.episode_tokens(t) == pytest.approx(150.0)


def _arms(rng, effect, seeds=4, tasks=128, seed_by_arm=0.0):
  """Two arms per seed on the same tasks; arm a's pass rates are shifted by `effect`, plus
  a per-seed shift of sd `seed_by_arm` (training randomness that moves the arms apart)."""
  a, b = {}, {}
  base = rng.beta(0.6, 1.2, tasks)  # one test set for every seed, as in a sweep
  for s in range(seeds):
    p = np.clip(base + rng.normal(0, 0.02), 0, 1)  # seed effect shared by the arms
    shift = effect + rng.normal(0, seed_by_arm)
    a[s] = _table(np.clip(p + shift, 0, 1), 8, rng)
    b[s] = _table(p, 8, rng)
  return a, b


def test_paired_interval_finds_a_real_difference_and_covers_no_difference():
  rng = np.random.default_rng(1)
  a, b = _arms(rng, 0.08)
  point, lo, hi = stats.paired_interval(a, b, stats.pass_at_1, draws=400)
  assert 0 < lo < 0.075 < hi and point == pytest.approx(0.075, abs=0.03)
  assert stats.verdict(point, lo, hi, higher_is_claimed=True) == "supported"
  assert stats.verdict(-point, -hi, -lo, higher_is_claimed=True) == "contradicted"
  covered = 0
  for r in range(30):
    a, b = _arms(np.random.default_rng(100 + r), 0.0)
    _, lo, hi = stats.paired_interval(a, b, stats.pass_at_1, draws=200, seed=r)
    covered += lo <= 0 <= hi
  assert covered >= 25  # ~95% coverage (binomial noise over 30 repetitions)


def _percentile_bootstrap(a, b, stat, draws, seed):
  """The interval the reports used before `paired_interval`: seeds resampled, then tasks."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(draws):
    diffs = []
    for s in rng.choice(sorted(a), len(a)):
      idx = rng.integers(0, len(a[s].passed), len(a[s].passed))
      diffs.append(stat(a[s].take(idx)) - stat(b[s].take(idx)))
    out.append(np.mean(diffs))
  return np.quantile(out, [0.025, 0.975])


def test_paired_interval_covers_when_training_seeds_move_the_arms_apart():
  # Four seeds whose arm difference varies from run to run (sd 0.04; the pressure world's
  # sweep shows about 0.03 for pass@1 and 0.1-0.3 for habit shares), true difference 0. A
  # percentile bootstrap over the seeds takes their spread for the population's and covers
  # far less than 95% (here 49 of 60); the t interval on the seed differences does not.
  covered = covered_bootstrap = 0
  reps = 60
  for r in range(reps):
    a, b = _arms(np.random.default_rng(500 + r), 0.0, tasks=128, seed_by_arm=0.04)
    _, lo, hi = stats.paired_interval(a, b, stats.pass_at_1, draws=100, seed=r)
    covered += lo <= 0 <= hi
    blo, bhi = _percentile_bootstrap(a, b, stats.pass_at_1, draws=100, seed=r)
    covered_bootstrap += blo <= 0 <= bhi
  assert covered / reps >= 0.88
  assert covered_bootstrap / reps <= 0.88
  assert covered > covered_bootstrap


def test_paired_interval_with_one_seed_is_over_tasks_and_handles_degenerate_figures():
  rng = np.random.default_rng(3)
  a, b = _arms(rng, 0.05, seeds=1)
  point, lo, hi = stats.paired_interval(a, b, stats.pass_at_1, draws=300)
  boot = stats.task_bootstrap(a, b, stats.pass_at_1, draws=300)
  assert (lo, hi) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))
  assert lo < point < hi
  # A figure that is 0 for every run (no hacks anywhere): a zero-width interval, not NaN.
  a, b = _arms(rng, 0.05)
  point, lo, hi = stats.paired_interval(a, b, stats.habit_share("hack"), draws=50)
  assert (point, lo, hi) == (0.0, 0.0, 0.0)
  assert stats.verdict(point, lo, hi, higher_is_claimed=False) == "not resolved"


def test_task_bootstrap_shares_the_task_draw_across_seeds():
  # Arm a is better on the first half of the tasks and worse on the second, the same way
  # for every seed: the seeds' differences agree, but a new test set could hold more of
  # either half. One task draw for all seeds keeps that; a draw per seed averages it away.
  rng = np.random.default_rng(4)
  tasks, seeds = 64, 4
  a, b = {}, {}
  for s in range(seeds):
    p = np.full(tasks, 0.5)
    a[s] = _table(np.where(np.arange(tasks) < tasks // 2, 0.9, 0.1), 64, rng)
    b[s] = _table(p, 64, rng)
  shared = np.std(stats.task_bootstrap(a, b, stats.pass_at_1, draws=400))
  # one seed's task bootstrap has the same spread: the seeds do not average it away
  alone = np.std(stats.task_bootstrap({0: a[0]}, {0: b[0]}, stats.pass_at_1, draws=400))
  assert shared == pytest.approx(alone, rel=0.25)
  assert shared > 0.03


def test_pairing_narrows_the_task_part_and_needs_the_same_tasks():
  rng = np.random.default_rng(2)
  a, b = _arms(rng, 0.05)
  paired = np.std(stats.task_bootstrap(a, b, stats.pass_at_1, draws=400))
  # Unpaired: b's tasks shuffled, so a draw no longer shares task difficulty.
  shuffled = {s: t.take(np.random.default_rng(s).permutation(len(t.passed))) for s, t in b.items()}
  renamed = {s: stats.TaskTable(a[s].task_ids, *dataclass_rest(t)) for s, t in shuffled.items()}
  unpaired = np.std(stats.task_bootstrap(a, renamed, stats.pass_at_1, draws=400))
  assert paired < 0.5 * unpaired
  _, lo, hi = stats.paired_interval(a, b, stats.pass_at_1, draws=400)
  _, ulo, uhi = stats.paired_interval(a, renamed, stats.pass_at_1, draws=400)
  assert hi - lo < uhi - ulo
  with pytest.raises(ValueError, match="different tasks"):
    stats.paired_interval(a, shuffled, stats.pass_at_1, draws=10)


def dataclass_rest(t):
  return t.samples, t.passed, t.tokens, t.habits


def test_seed_bootstrap_and_mean_se():
  point, lo, hi = stats.seed_bootstrap({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.5})
  assert point == pytest.approx(0.8333, abs=1e-3) and 0 < lo <= point <= hi <= 1.0
  assert stats.mean_se([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0 / np.sqrt(3)))
  with pytest.raises(ValueError, match="no seed in common"):
    stats.seed_bootstrap({0: 1.0}, {1: 1.0})
  point, lo, hi = stats.seed_bootstrap({0: 1.0}, {0: 0.5})  # one seed: no interval
  assert point == 0.5 and stats.verdict(point, lo, hi, True) == "not measurable"


def test_seed_interval_is_student_t_on_paired_differences():
  # differences 1.0, 1.0, 0.5: mean 0.8333, SE 0.1667, t(0.975, 2) = 4.303
  point, lo, hi = stats.seed_interval({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.0, 2: 2.5})
  assert point == pytest.approx(0.8333, abs=1e-3)
  assert (lo, hi) == pytest.approx((0.8333 - 0.7172, 0.8333 + 0.7172), abs=1e-3)
  # Two seeds that agree in sign are not enough for a verdict (a bootstrap of them would be).
  point, lo, hi = stats.seed_interval({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5})
  assert lo < 0 < hi and stats.verdict(point, lo, hi, True) == "not resolved"
  lo_b = stats.seed_bootstrap({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.5})[1]
  assert lo_b > 0
  with pytest.raises(ValueError, match="no seed in common"):
    stats.seed_interval({0: 1.0}, {1: 1.0})
  point, lo, hi = stats.seed_interval({0: 1.0}, {0: 0.5})
  assert point == 0.5 and stats.verdict(point, lo, hi, True) == "not measurable"


def test_ended_on_hack_and_fisher_exact():
  rng = np.random.default_rng(0)
  p = np.full(64, 0.8)
  assert stats.ended_on_hack(_table(p, 8, rng, hack_p=1.0))
  assert not stats.ended_on_hack(_table(p, 8, rng, hack_p=0.8))
  assert not stats.ended_on_hack(_table(np.zeros(64), 8, rng, hack_p=1.0))  # nothing passes
  # Fisher's lady tasting tea: 3 of 4 right vs 1 of 4, two-sided p = 34/70; all vs none 2/70.
  assert stats.fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)
  assert stats.fisher_exact(4, 4, 0, 4) == pytest.approx(2 / 70)
  assert stats.fisher_exact(2, 4, 2, 4) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="out of range"):
    stats.fisher_exact(5, 4, 0, 4)


def test_holm_adjusts_step_down_and_keeps_the_order():
  assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
  assert stats.holm([0.2, 0.9]) == pytest.approx([0.4, 0.9])
  adjusted = stats.holm([0.001, float("nan"), 0.5])  # NaN: not measured, not counted
  assert adjusted[0] == pytest.approx(0.002) and np.isnan(adjusted[1]) and adjusted[2] == 0.5


def test_p_values_are_the_intervals_t_and_agree_with_them():
  from scipy import stats as sps

  # Run-level figures: the paired t-test over seeds.
  a = dict(enumerate([0.50, 0.61, 0.47, 0.58, 0.66]))
  b = dict(enumerate([0.44, 0.52, 0.49, 0.50, 0.55]))
  point, lo, hi, p = stats.seed_test(a, b)
  expected = sps.ttest_1samp([a[s] - b[s] for s in a], 0.0).pvalue
  assert p == pytest.approx(expected) and (lo, hi) == pytest.approx(stats.seed_interval(a, b)[1:])
  # Task tables: p < 0.05 exactly when the 95% interval excludes 0.
  rng = np.random.default_rng(0)
  for shift in (0.0, 0.05, 0.15):
    arm_a, arm_b = {}, {}
    for s in range(6):
      q = rng.uniform(0.2, 0.8, 40)
      arm_a[s] = _table(np.clip(q + shift + rng.normal(0, 0.03), 0, 1), 8, rng)
      arm_b[s] = _table(q, 8, rng)
    point, lo, hi, p = stats.paired_test(arm_a, arm_b, stats.pass_at_1, draws=400)
    assert (p < 0.05) == (lo > 0 or hi < 0)
    assert stats.paired_interval(arm_a, arm_b, stats.pass_at_1, draws=400) == (point, lo, hi)


def test_resolved_at_1_reads_the_recheck_and_is_nan_without_it():
  records = [
    {"task_id": "a", "samples": 4, "passed": 3, "tokens": 100, "resolved": 1},
    {"task_id": "b", "samples": 4, "passed": 2, "tokens": 100, "resolved": 2},
  ]
  table = stats.TaskTable.from_records(records)
  assert stats.resolved_at_1(table) == pytest.approx(3 / 8)
  assert stats.resolved_at_1(table.take(np.array([1, 1]))) == pytest.approx(0.5)
  old = stats.TaskTable.from_records(
    [{k: v for k, v in r.items() if k != "resolved"} for r in records]
  )
  assert np.isnan(stats.resolved_at_1(old))
