"""Policy metrics from groups of finished trajectories (rollout evaluation)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def policy_metrics(groups: Sequence[Sequence]) -> dict[str, float]:
  """pass@1 (over all samples), pass@k (k = group size), informative-group share,
  episode length, and the quality habits of *passing* trajectories.

  Each trajectory needs `passed`, `tokens`, `mask`, `turns` and `signals`.
  """
  flat = [t for g in groups for t in g]
  if not flat:
    return {}
  passed = np.array([t.passed for t in flat], bool)
  per_group = [np.array([t.passed for t in g], bool) for g in groups]
  winners = [t for t in flat if t.passed and t.signals is not None]
  share = lambda f: float(np.mean([f(t.signals) for t in winners])) if winners else 0.0
  return {
    "pass@1": float(passed.mean()),
    f"pass@{len(groups[0])}": float(np.mean([p.any() for p in per_group])),
    "informative_groups": float(np.mean([p.any() and not p.all() for p in per_group])),
    "all_pass_groups": float(np.mean([p.all() for p in per_group])),
    "episode_tokens": float(np.mean([len(t.tokens) for t in flat])),
    "policy_tokens": float(np.mean([sum(t.mask) for t in flat])),
    "turns": float(np.mean([len(t.turns) for t in flat])),
    "passing_bloated": share(lambda s: s.bloated),
    "passing_out_of_scope": share(lambda s: s.out_of_scope),
    "passing_dead_code": share(lambda s: s.dead_code > 0),
    "passing_redundant": share(lambda s: s.redundant),
    "passing_excess_diff": share(lambda s: s.excess_diff_lines > 0),
    "passing_untested": share(lambda s: not s.tested),
    "passing_diff_lines": float(np.mean([t.signals.diff_lines for t in winners]))
    if winners
    else 0.0,
  }
