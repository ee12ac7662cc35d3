"""Policy metrics from groups of finished trajectories (rollout evaluation).

Quality metrics (`passing_*`) describe passing trajectories whose suite has quality
signals; where there are none (a HumanEval episode, or nothing passed) they are absent,
not 0. `by_suite` adds every metric per suite (`minirepo/pass@1`, ...).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gagar_jax.envs.task import run_tests

NAN = float("nan")


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples of which c passed (Chen et al. 2021):
  1 - C(n - c, k) / C(n, k), computed as a stable product."""
  if not 0 < k <= n:
    raise ValueError(f"pass@{k} needs 1 <= k <= n={n}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_summary(passed: Sequence[int], samples: int) -> dict[str, float]:
  """`pass@k` for k in 1..samples (the unbiased estimator averaged over tasks, `passed`
  holding each task's passing samples) and `pass@k_se`, its standard error over tasks."""
  out = {}
  for k in range(1, samples + 1):
    per_task = np.array([pass_at_k(samples, int(c), k) for c in passed])
    out[f"pass@{k}"] = float(per_task.mean())
    se = per_task.std(ddof=1) / np.sqrt(len(per_task)) if len(per_task) > 1 else float("nan")
    out[f"pass@{k}_se"] = float(se)
  return out


def quality_metrics(trajectories: Sequence) -> dict[str, float]:
  """Habit shares of the passing trajectories that have quality signals ({} if none)."""
  winners = [t for t in trajectories if t.passed and t.signals is not None]
  if not winners:
    return {}
  share = lambda f: float(np.mean([f(t.signals) for t in winners]))
  return {
    "passing_bloated": share(lambda s: s.bloated),
    "passing_out_of_scope": share(lambda s: s.out_of_scope),
    "passing_dead_code": share(lambda s: s.dead_code > 0),
    "passing_redundant": share(lambda s: s.redundant),
    "passing_excess_diff": share(lambda s: s.excess_diff_lines > 0),
    "passing_untested": share(lambda s: not s.tested),
    "passing_hack": share(lambda s: s.hack),
    "passing_invalid": share(lambda s: s.invalid_actions > 0),
    "passing_diff_lines": float(np.mean([t.signals.diff_lines for t in winners])),
  }


HABITS = {
  "bloated": lambda s: s.bloated,
  "out_of_scope": lambda s: s.out_of_scope,
  "dead_code": lambda s: s.dead_code > 0,
  "redundant": lambda s: s.redundant,
  "hack": lambda s: s.hack,
  "invalid": lambda s: s.invalid_actions > 0,
}


def recheck_resolved(groups: Sequence[Sequence], pool) -> None:
  """Sets each trajectory's `resolved`: whether its final files pass the task's strong
  hidden tests (`task.strong_tests()`, MiniRepo's tests before a world weakened them).
  A pass that only satisfies weakened tests is then told from a real fix, independently
  of the hack detector. A failing episode is unresolved (the weak tests are among the
  strong); a task without `strong_tests` (HumanEval) keeps its own verdict."""
  checks = []
  for group in groups:
    strong = getattr(group[0].task, "strong_tests", None)
    tests = strong() if strong is not None else None
    for t in group:
      t.resolved = bool(t.passed)
      if tests is not None and t.passed:
        checks.append((t, tests))
  outcomes = pool.map(lambda c: run_tests(c[0].files, c[1], pool).passed, checks)
  for (t, _), resolved in zip(checks, outcomes, strict=True):
    t.resolved = bool(resolved)


def task_record(group) -> dict:
  """One task's compact record: samples, passes, summed episode tokens and, where samples
  passed and have quality signals, the habit counts among the passes (`passing_<habit>`).
  Records of two policies on the same tasks compare pairwise (bootstraps over tasks)."""
  winners = [t.signals for t in group if t.passed and t.signals is not None]
  record = {
    "task_id": group[0].task.task_id,
    "samples": len(group),
    "passed": int(sum(t.passed for t in group)),
    "tokens": int(sum(len(t.tokens) for t in group)),
  }
  if winners:
    record.update({f"passing_{h}": int(sum(f(s) for s in winners)) for h, f in HABITS.items()})
  if all(t.resolved is not None for t in group):  # re-checked (`recheck_resolved`)
    record["resolved"] = int(sum(t.resolved for t in group))
    outcome = {"real_fix": [], "unresolved_pass": [], "fail": []}
    for t in group:
      kind = "real_fix" if t.resolved else "unresolved_pass" if t.passed else "fail"
      outcome[kind].append(len(t.tokens))
    record.update({f"tokens_{k}": int(sum(v)) for k, v in outcome.items()})
  return record


def _metrics(groups: Sequence[Sequence]) -> dict[str, float]:
  flat = [t for g in groups for t in g]
  passed = np.array([t.passed for t in flat], bool)
  per_group = [np.array([t.passed for t in g], bool) for g in groups]
  return {
    "pass@1": float(passed.mean()),
    # A pass with a detected reward hack (quality signals) counted as failing.
    "clean_pass@1": float(
      np.mean([t.passed and not (t.signals is not None and t.signals.hack) for t in flat])
    ),
    f"pass@{len(groups[0])}": float(np.mean([p.any() for p in per_group])),
    "informative_groups": float(np.mean([p.any() and not p.all() for p in per_group])),
    "all_pass_groups": float(np.mean([p.all() for p in per_group])),
    "episode_tokens": float(np.mean([len(t.tokens) for t in flat])),
    "policy_tokens": float(np.mean([sum(t.mask) for t in flat])),
    "turns": float(np.mean([len(t.turns) for t in flat])),
    **_resolution(flat),
    # Episodes whose prompt left no room to act (they fail without a token).
    "prompt_too_long": float(np.mean([getattr(t, "finish", "") == "prompt" for t in flat])),
    **quality_metrics(flat),
  }


def _resolution(flat: Sequence) -> dict[str, float]:
  """Where episodes were re-checked (`recheck_resolved`): the share passing the strong
  tests, and the mean episode length of real fixes, unresolved passes and failures."""
  if not flat or any(getattr(t, "resolved", None) is None for t in flat):
    return {}
  out = {"resolved@1": float(np.mean([t.resolved for t in flat]))}
  for kind, pick in (
    ("real_fix", lambda t: t.resolved),
    ("unresolved_pass", lambda t: t.passed and not t.resolved),
    ("fail", lambda t: not t.passed),
  ):
    lengths = [len(t.tokens) for t in flat if pick(t)]
    if lengths:
      out[f"episode_tokens_{kind}"] = float(np.mean(lengths))
  return out


def suite_of(group) -> str:
  return getattr(group[0].task, "suite", "minirepo")


def policy_metrics(groups: Sequence[Sequence], by_suite: bool = False) -> dict[str, float]:
  """pass@1 (over all samples), pass@k (k = group size), informative-group share,
  episode length, and the quality habits of *passing* trajectories (where applicable).

  Each trajectory needs `passed`, `tokens`, `mask`, `turns`, `signals` and `task`.
  """
  groups = [g for g in groups if len(g)]
  if not groups:
    return {}
  out = _metrics(groups)
  if by_suite:
    for name in sorted({suite_of(g) for g in groups}):
      sub = _metrics([g for g in groups if suite_of(g) == name])
      out.update({f"{name}/{k}": v for k, v in sub.items()})
  return out


def fmt(value, spec: str = ".2f") -> str:
  """A metric for a log line: "n/a" when absent (None) or NaN."""
  if value is None or (isinstance(value, float) and math.isnan(value)):
    return "n/a"
  return format(value, spec)
