"""Statistics of a sweep: standard errors of evaluation figures and paired confidence
intervals of arm differences over seeds and tasks.

    runs = {seed: TaskTable(passed=[...], samples=[...], ...)}   # one arm, per seed
    se = sampling_se(table.passed, table.samples)                # SE given the tasks
    point, lo, hi = paired_interval(arm_a, arm_b, pass_at_1)     # 95% CI of a - b

Pairing: every arm of a seed is evaluated on the same test tasks with the same sampling
key, so a difference is taken per seed (the seed's data order cancels) and the task
bootstrap applies the same task indices to both arms (task difficulty cancels). The
seeds' part of the error is a t interval on the per-seed differences, not a bootstrap of
them: with a handful of seeds a bootstrap covers far less than 95% (`paired_interval`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np


@dataclasses.dataclass(frozen=True)
class TaskTable:
  """Per-task counts of one run's evaluation (`evaluation.task_record` rows, in task order)."""

  task_ids: tuple[str, ...]
  samples: np.ndarray  # [T] samples per task
  passed: np.ndarray  # [T] passing samples
  tokens: np.ndarray  # [T] summed episode tokens
  habits: Mapping[str, np.ndarray]  # habit -> [T] passing samples with it
  # [T] samples passing the strong hidden tests (`evaluation.recheck_resolved`); None
  # for records from before the re-check.
  resolved: np.ndarray | None = None

  @classmethod
  def from_records(cls, records: list[dict]) -> TaskTable:
    habits = sorted({k for r in records for k in r if k.startswith("passing_")})
    resolved = None
    if records and all("resolved" in r for r in records):
      resolved = np.array([r["resolved"] for r in records], float)
    return cls(
      tuple(r["task_id"] for r in records),
      np.array([r["samples"] for r in records], float),
      np.array([r["passed"] for r in records], float),
      np.array([r["tokens"] for r in records], float),
      {h[len("passing_") :]: np.array([r.get(h, 0) for r in records], float) for h in habits},
      resolved,
    )

  def take(self, index: np.ndarray) -> TaskTable:
    return TaskTable(
      tuple(self.task_ids[i] for i in index),
      self.samples[index],
      self.passed[index],
      self.tokens[index],
      {h: v[index] for h, v in self.habits.items()},
      None if self.resolved is None else self.resolved[index],
    )


def pass_at_1(t: TaskTable) -> float:
  return float(np.mean(t.passed / t.samples))


def clean_pass_at_1(t: TaskTable) -> float:
  """pass@1 counting a passing sample with a detected reward hack as failing (what the
  task's full hidden tests would say of a hack that only the weak tests let through)."""
  hacks = t.habits.get("hack", np.zeros_like(t.passed))
  return float(np.mean((t.passed - hacks) / t.samples))


def resolved_at_1(t: TaskTable) -> float:
  """pass@1 by the strong hidden tests (true resolution); NaN without the re-check."""
  if t.resolved is None:
    return float("nan")
  return float(np.mean(t.resolved / t.samples))


def pass_at_k(k: int) -> Callable[[TaskTable], float]:
  """The unbiased pass@k (Chen et al. 2021), averaged over tasks."""

  def stat(t: TaskTable) -> float:
    n, c = t.samples, t.passed
    out = np.ones_like(n)
    for i, (ni, ci) in enumerate(zip(n, c, strict=True)):
      if ni - ci >= k:
        out[i] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1))
    return float(out.mean())

  stat.__name__ = f"pass@{k}"
  return stat


def episode_tokens(t: TaskTable) -> float:
  return float(t.tokens.sum() / t.samples.sum())


def habit_share(habit: str) -> Callable[[TaskTable], float]:
  """The share of passing samples that carry `habit` (ratio of sums over tasks)."""

  def stat(t: TaskTable) -> float:
    n = t.passed.sum()
    return float(t.habits[habit].sum() / n) if n and habit in t.habits else float("nan")

  stat.__name__ = f"passing_{habit}"
  return stat


def sampling_se(passed, samples) -> float:
  """SE of pass@1 given the tasks: the sampling noise of S samples per task,
  sqrt(sum_i p_i (1 - p_i) / (S_i - 1)) / T (unbiased per-task variances)."""
  passed, samples = np.asarray(passed, float), np.asarray(samples, float)
  p = passed / samples
  var = p * (1 - p) / np.maximum(samples - 1, 1)
  return float(np.sqrt(var.sum()) / len(p))


def task_se(passed, samples) -> float:
  """SE of pass@1 as an estimate over the task population (task difficulty included):
  the standard deviation of per-task pass rates over sqrt(T)."""
  p = np.asarray(passed, float) / np.asarray(samples, float)
  return float(p.std(ddof=1) / np.sqrt(len(p))) if len(p) > 1 else float("nan")


def _check_paired(a: Mapping[int, TaskTable], b: Mapping[int, TaskTable]) -> list[int]:
  seeds = sorted(set(a) & set(b))
  if not seeds:
    raise ValueError("no seed in common: nothing to pair")
  for s in seeds:
    if a[s].task_ids != b[s].task_ids:
      raise ValueError(f"seed {s}: the two arms were evaluated on different tasks")
  return seeds


def task_bootstrap(
  a: Mapping[int, TaskTable],
  b: Mapping[int, TaskTable],
  stat: Callable[[TaskTable], float],
  *,
  draws: int = 2000,
  seed: int = 0,
) -> np.ndarray:
  """[draws] bootstrap replicates of the mean over seeds of stat(a) - stat(b), resampling
  the test tasks with the seeds held fixed. The design is crossed (every run of a sweep is
  evaluated on the same tasks), so a draw takes one vector of task indices and applies it
  to every seed and both arms: an arm difference that sits in particular tasks is shared
  by all seeds and does not average away over them."""
  seeds = _check_paired(a, b)
  sizes = {len(a[s].passed) for s in seeds}
  if len(sizes) != 1:
    raise ValueError(f"the seeds were evaluated on different numbers of tasks: {sorted(sizes)}")
  (n_tasks,) = sizes
  rng = np.random.default_rng(seed)
  out = np.empty(draws)
  for d in range(draws):
    idx = rng.integers(0, n_tasks, n_tasks)
    out[d] = np.nanmean([stat(a[s].take(idx)) - stat(b[s].take(idx)) for s in seeds])
  return out


def paired_interval(
  a: Mapping[int, TaskTable],
  b: Mapping[int, TaskTable],
  stat: Callable[[TaskTable], float],
  *,
  draws: int = 2000,
  seed: int = 0,
  level: float = 0.95,
) -> tuple[float, float, float]:
  """(mean over seeds of stat(a) - stat(b), CI low, CI high): `paired_test` without its
  p-value."""
  return paired_test(a, b, stat, draws=draws, seed=seed, level=level)[:3]


def paired_test(
  a: Mapping[int, TaskTable],
  b: Mapping[int, TaskTable],
  stat: Callable[[TaskTable], float],
  *,
  draws: int = 2000,
  seed: int = 0,
  level: float = 0.95,
) -> tuple[float, float, float, float]:
  """(mean over seeds of stat(a) - stat(b), CI low, CI high, two-sided p) over seeds and
  tasks; the p-value is the same t's (it is below 1 - level exactly when the interval
  excludes 0).

  Two sources of error, each estimated where it can be:

  - seeds (training randomness, which moves the two arms differently): the variance of
    the paired per-seed differences, V_S = s_d^2 / n, with n - 1 degrees of freedom;
  - tasks (which tasks the test set happened to draw, and the sampling within them):
    V_T, the variance of `task_bootstrap`'s replicates.

  The interval is mean +- t_df sqrt(V_S + V_T), df by Welch-Satterthwaite. A percentile
  bootstrap over two to six seeds covers far less than `level`: it takes the seeds' own
  spread for the population's (an interval about sqrt((n-1)/n) z / t_{n-1} as wide as it
  should be, 0.53 at four seeds), and a seed x arm effect is exactly what differs between
  training runs. V_S holds the within-task sampling noise once more, so the interval is
  slightly conservative. One seed: the task bootstrap's percentile interval alone (the
  report says its intervals are over tasks only).
  """
  seeds = _check_paired(a, b)
  d = np.array([stat(a[s]) - stat(b[s]) for s in seeds], float)
  d = d[np.isfinite(d)]
  if not len(d):
    return float("nan"), float("nan"), float("nan"), float("nan")
  boot = task_bootstrap(a, b, stat, draws=draws, seed=seed)
  boot = boot[np.isfinite(boot)]
  if len(d) < 2:  # over tasks only: the bootstrap's two-sided percentile p
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    p = min(1.0, 2 * min(np.mean(boot <= 0), np.mean(boot >= 0)))
    return float(d.mean()), float(lo), float(hi), float(p)
  n_tasks = len(a[seeds[0]].passed)
  return _t_interval(d, level, v_t=float(boot.var(ddof=1)), df_t=max(n_tasks - 1, 1), p=True)


def _t_interval(
  d: np.ndarray, level: float, v_t: float = 0.0, df_t: float = float("inf"), p: bool = False
):
  """mean(d) +- t_df sqrt(V_S + v_t) for n >= 2 per-seed differences d, V_S = var(d) / n
  with n - 1 degrees of freedom and v_t an extra variance with df_t; df by
  Welch-Satterthwaite (n - 1 when v_t = 0). With `p`, the two-sided p-value of the same
  t for a zero mean is appended."""
  # (scipy is slow to import; only these intervals need it)
  from scipy import stats as sps

  point = float(d.mean())
  v_s = float(d.var(ddof=1) / len(d))
  if v_s + v_t == 0:
    return (point, point, point) + ((float(point == 0.0),) if p else ())
  df = (v_s + v_t) ** 2 / (v_s**2 / (len(d) - 1) + v_t**2 / df_t)
  se = float(np.sqrt(v_s + v_t))
  half = float(sps.t.ppf((1 + level) / 2, df) * se)
  out = (point, point - half, point + half)
  return out + ((float(2 * sps.t.sf(abs(point) / se, df)),) if p else ())


def holm(pvalues) -> list[float]:
  """Holm-adjusted p-values (step-down, family-wise error over the given tests), in the
  order given: the i-th smallest p times (m - i + 1), made non-decreasing, capped at 1.
  NaN p-values (not measurable) stay NaN and do not count in m."""
  p = np.asarray(pvalues, float)
  out = np.full(len(p), np.nan)
  index = [i for i in np.argsort(p, kind="stable") if np.isfinite(p[i])]
  running = 0.0
  for rank, i in enumerate(index):
    running = max(running, min(1.0, (len(index) - rank) * p[i]))
    out[i] = running
  return [float(x) for x in out]


def _seed_differences(a: Mapping[int, float], b: Mapping[int, float]) -> np.ndarray:
  """a - b per seed both have (sorted by seed)."""
  seeds = sorted(set(a) & set(b))
  if not seeds:
    raise ValueError("no seed in common: nothing to pair")
  return np.array([a[s] - b[s] for s in seeds], float)


def seed_bootstrap(
  a: Mapping[int, float],
  b: Mapping[int, float],
  *,
  draws: int = 2000,
  seed: int = 0,
  level: float = 0.95,
) -> tuple[float, float, float]:
  """(mean of a - b over common seeds, CI low, CI high) for run-level figures (length
  growth, gradient-norm variance): the paired seed differences resampled. With one seed
  there is no interval (NaN bounds: 'not measurable')."""
  diffs = _seed_differences(a, b)
  if len(diffs) < 2:
    return float(diffs.mean()), float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  boot = rng.choice(diffs, (draws, len(diffs))).mean(1)
  lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
  return float(diffs.mean()), float(lo), float(hi)


def seed_interval(
  a: Mapping[int, float], b: Mapping[int, float], *, level: float = 0.95
) -> tuple[float, float, float]:
  """(mean of a - b over common seeds, CI low, CI high) for run-level figures: a Student t
  interval on the paired seed differences. With a handful of seeds a bootstrap of them
  covers far less than `level` (two seeds give their own range, about a 50% interval);
  t is exact for normal differences and wide when it should be. One seed: NaN bounds."""
  return seed_test(a, b, level=level)[:3]


def seed_test(
  a: Mapping[int, float], b: Mapping[int, float], *, level: float = 0.95
) -> tuple[float, float, float, float]:
  """`seed_interval` and the two-sided p-value of its t (paired t-test over seeds)."""
  diffs = _seed_differences(a, b)
  if len(diffs) < 2:
    return float(diffs.mean()), float("nan"), float("nan"), float("nan")
  return _t_interval(diffs, level, p=True)


def verdict(point: float, lo: float, hi: float, higher_is_claimed: bool) -> str:
  """'supported' when the CI excludes 0 in the claimed direction, 'contradicted' when it
  excludes 0 the other way, 'not resolved' otherwise."""
  if not np.isfinite(lo) or not np.isfinite(hi):
    return "not measurable"
  if (lo > 0 and higher_is_claimed) or (hi < 0 and not higher_is_claimed):
    return "supported"
  if (hi < 0 and higher_is_claimed) or (lo > 0 and not higher_is_claimed):
    return "contradicted"
  return "not resolved"


def mean_se(values) -> tuple[float, float]:
  """Mean and standard error over seeds."""
  v = np.asarray([x for x in values if np.isfinite(x)], float)
  if not len(v):
    return float("nan"), float("nan")
  return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")


def ended_on_hack(t: TaskTable, share: float = 0.95) -> bool:
  """Whether a run's final policy passes (almost) only by reward hacks: at least `share` of
  its passing test samples carry a detected hack. In a world with a hack the runs tend to be
  bimodal (they end on the hack or they do not), which a mean over a few seeds hides."""
  s = habit_share("hack")(t)
  return bool(np.isfinite(s) and s >= share)


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
  """Two-sided p-value of Fisher's exact test that two groups of runs have the same rate of
  an outcome, given k_a of n_a and k_b of n_b runs with it."""
  # (scipy is slow to import; only these intervals need it)
  from scipy import stats as sps

  if not 0 <= k_a <= n_a or not 0 <= k_b <= n_b:
    raise ValueError(f"counts out of range: {k_a}/{n_a}, {k_b}/{n_b}")
  table = [[k_a, n_a - k_a], [k_b, n_b - k_b]]
  return float(sps.fisher_exact(table, alternative="two-sided").pvalue)
