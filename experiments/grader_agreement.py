"""Agreement of a grader with the expert's quality labels on held-out groups.

    python experiments/grader_agreement.py --groups=100 --group_size=6

Each group: `group_size` expert demonstrations of one held-out MiniRepo task (test
split seeds), every demonstration with its own random habits (probability
`--habit_p` each), plus one failing candidate as context. The expert's label of a
demonstration is the weighted count of its habits (out_of_scope 3, dead_code 2,
large_edit 1, redundant_view 0.5, extra_test 0.5, no_test 0.25; lower is better).
The grader sees only the workspace. Reported: top-1 agreement (the grader's best
set contains a label-best demonstration), Kendall tau-b between grader ranks and
labels (mean over groups with distinct labels), and grading time per group.
"""

import tempfile
import time

import numpy as np
from absl import app, flags

from gagar_jax.data.builders import SPLIT_SEED_BASE
from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.grading import protocol, rubric, workspace
from gagar_jax.rollout import Trajectory

_GROUPS = flags.DEFINE_integer("groups", 100, "Held-out groups.")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 6, "Passing demonstrations per group.")
_HABIT_P = flags.DEFINE_float("habit_p", 0.35, "Probability of each habit per demonstration.")
_N_FUNCTIONS = flags.DEFINE_integer("n_functions", 3, "MiniRepo functions per module.")

WEIGHTS = {
  "out_of_scope": 3,
  "dead_code": 2,
  "large_edit": 1,
  "redundant_view": 0.5,
  "extra_test": 0.5,
  "no_test": 0.25,
}


def kendall_tau_b(x, y) -> float:
  n, conc, disc, tx, ty = len(x), 0, 0, 0, 0
  for i in range(n):
    for j in range(i + 1, n):
      dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
      if dx == 0 and dy == 0:
        continue
      if dx == 0:
        tx += 1
      elif dy == 0:
        ty += 1
      elif dx == dy:
        conc += 1
      else:
        disc += 1
  denom = np.sqrt((conc + disc + tx) * (conc + disc + ty))
  return float((conc - disc) / denom) if denom else float("nan")


def main(argv):
  del argv
  habits = expert_lib.HabitConfig(**dict.fromkeys(WEIGHTS, _HABIT_P.value))
  grader = rubric.RubricGrader()
  top1, taus, times = [], [], []
  with SandboxPool(SandboxConfig(workers=2)) as pool, tempfile.TemporaryDirectory() as tmp:
    for k in range(_GROUPS.value):
      task = minirepo.generate_task(SPLIT_SEED_BASE["test"] + k, n_functions=_N_FUNCTIONS.value)
      e = expert_lib.Expert(habits, seed=k, pool=pool)
      demos = [e.demonstrate(task) for _ in range(_GROUP_SIZE.value)]
      assert all(d.passed for d in demos)
      labels = [sum(WEIGHTS[h] for h in d.habits) for d in demos]
      group = [
        Trajectory(task, 0, i, [], [], [], d.turns, d.files, passed=True)
        for i, d in enumerate(demos)
      ]
      group.append(Trajectory(task, 0, len(group), [], [], [], [], task.files, passed=False))
      ws = workspace.materialize(group, f"{tmp}/g{k}", seed=k)
      start = time.perf_counter()
      ranks = protocol.validate(grader.rank(ws), ws)
      times.append(time.perf_counter() - start)
      by_slot = np.array([ranks[c] for c in sorted(ranks, key=ws.slot_of.get)])
      best = set(np.flatnonzero(by_slot == by_slot.min()))
      top1.append(bool(best & set(np.flatnonzero(np.array(labels) == min(labels)))))
      if len(set(labels)) > 1:
        taus.append(kendall_tau_b(by_slot, np.array(labels)))
  print(
    f"grader {grader.name}: {_GROUPS.value} held-out groups of {_GROUP_SIZE.value} passing "
    f"(+1 failing), habit probability {_HABIT_P.value}"
  )
  print(f"  top-1 agreement   {np.mean(top1):.3f}")
  print(
    f"  Kendall tau-b     {np.nanmean(taus):.3f} (median {np.nanmedian(taus):.3f}, "
    f"{len(taus)} groups with distinct labels)"
  )
  print(f"  grading time      {1e3 * np.median(times):.1f} ms/group (median)")


if __name__ == "__main__":
  app.run(main)
