"""Agreement of a grader with a reference on held-out groups.

    # the rubric grader vs the expert's habit labels (expert groups):
    python experiments/grader_agreement.py --groups=100 --group_size=6
    # the SFT-trained LM grader vs the rubric (groups the pre-RL policy samples on test tasks):
    python experiments/grader_agreement.py --grader=lm --reference=rubric --groups=200
    # the same agent through an OpenAI-compatible endpoint (experiments/serve_grader.py):
    python experiments/grader_agreement.py --grader=openai --base_url=http://127.0.0.1:8000/v1 \\
        --reference=rubric

--reference=labels: each group is `group_size` expert demonstrations of one held-out
MiniRepo task (test split seeds), every demonstration with its own random habits
(probability `--habit_p` each), plus one failing candidate; the label of a
demonstration is the weighted count of its habits (out_of_scope 3, dead_code 2,
large_edit 1, redundant_view 0.5, extra_test 0.5, no_test 0.25; lower is better).

--reference=rubric: the policy in --policy_dir samples groups of 8 on test-split tasks;
groups with two or more passing samples are graded by the rubric and by --grader
(with --hack_every=k, every k-th task has weak hidden tests and 1-2 expert hacks).

Reported: top-1 agreement (the grader's best set contains a reference-best
candidate), Kendall tau-b (mean over groups whose reference has distinct levels),
invalid-output rate (after the agent's retry), model tokens and time per group.
"""

import tempfile

from absl import flags

from configs import common
from gagar_jax import cli, grader_sft, rollout
from gagar_jax.data import builders
from gagar_jax.data.builders import SPLIT_SEED_BASE
from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.grading import agent, backends, openai_grader, protocol, rubric, workspace
from gagar_jax.grading import demos as demos_lib
from gagar_jax.rollout import Trajectory

_GRADER = flags.DEFINE_enum("grader", "rubric", ["rubric", "lm", "openai"], "Grader to measure.")
_REFERENCE = flags.DEFINE_enum("reference", "labels", ["labels", "rubric"], "What to agree with.")
_GROUPS = flags.DEFINE_integer("groups", 100, "Held-out groups (tasks, for --reference=rubric).")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 6, "Passing demonstrations per group (labels).")
_HABIT_P = flags.DEFINE_float("habit_p", 0.35, "Probability of each habit per demonstration.")
_N_FUNCTIONS = flags.DEFINE_integer(
  "n_functions", 3, "MiniRepo functions per module (labels; rubric uses the policy's suite)."
)
_HACK_P = flags.DEFINE_float(
  "hack_p", 0.0, "labels: probability of the reward-hack habit (weak hidden tests then)."
)
_HACK_EVERY = flags.DEFINE_integer(
  "hack_every",
  0,
  "rubric: every k-th task has weak hidden tests and 1-2 samples swapped for the expert's "
  "reward hack (as in the grader's training data; 0: none).",
)
_GRADER_PATH = flags.DEFINE_string("grader_path", "assets/lm_grader", "LM grader folder.")
_POLICY = flags.DEFINE_string("policy_dir", "assets/pre_rl", "Policy sampling the groups.")
_BASE_URL = flags.DEFINE_string("base_url", "", "Endpoint ('' -> $OPENAI_BASE_URL).")
_MODEL = flags.DEFINE_string("model", "gagar-lm-grader", "Endpoint model.")
_FROM_NOTES = flags.DEFINE_bool(
  "rank_from_notes", True, "Agent graders: rank by the model's notes when its answer is invalid."
)

WEIGHTS = {
  "out_of_scope": 3,
  "dead_code": 2,
  "large_edit": 1,
  "redundant_view": 0.5,
  "extra_test": 0.5,
  "no_test": 0.25,
}


def make_grader():
  return backends.make(
    _GRADER.value,
    agent=agent.AgentConfig(rank_from_notes=_FROM_NOTES.value),
    lm_path=_GRADER_PATH.value,
    openai=openai_grader.OpenAIConfig(base_url=_BASE_URL.value, model=_MODEL.value),
  )


def label_groups(pool):
  """[(group, reference ranks by slot)] of expert demonstrations with habit labels (with
  `--hack_p`, hacks too: the tasks then have weak hidden tests, so hacks pass)."""
  habits = expert_lib.HabitConfig(**dict.fromkeys(WEIGHTS, _HABIT_P.value), hack=_HACK_P.value)
  out = []
  for k in range(_GROUPS.value):
    task = minirepo.generate_task(
      SPLIT_SEED_BASE["test"] + k,
      n_functions=_N_FUNCTIONS.value,
      weak_hidden_tests=_HACK_P.value > 0,
    )
    e = expert_lib.Expert(habits, seed=k, pool=pool)
    demos = [e.demonstrate(task) for _ in range(_GROUP_SIZE.value)]
    assert all(d.passed for d in demos)
    labels = [sum(WEIGHTS.get(h, 10) for h in d.habits) for d in demos]  # a hack: 10
    group = [
      Trajectory(task, 0, i, [], [], [], d.turns, d.files, passed=True) for i, d in enumerate(demos)
    ]
    group.append(Trajectory(task, 0, len(group), [], [], [], [], task.files, passed=False))
    out.append((group, labels))
  return out


def policy_groups():
  """[(group, None)]: the rubric ranks each workspace (the reference)."""
  suite = builders.suite_from_config(common.minirepo_suite())  # what the policy learned on
  tasks = [
    minirepo.generate_task(SPLIT_SEED_BASE["test"] + k, **suite.difficulty)
    for k in range(_GROUPS.value)
  ]
  tasks = grader_sft.hack_tasks(tasks, _HACK_EVERY.value)
  groups = rollout.sample_groups(
    _POLICY.value,
    tasks,
    group_size=8,
    seed=7,
    edit=lambda g, pool, k: demos_lib.inject_hacks(g, pool, 7_000 + k),
  )
  return [(g, None) for g in groups]


def main(argv):
  del argv
  grader = make_grader()
  with SandboxPool(SandboxConfig(workers=2)) as pool, tempfile.TemporaryDirectory() as tmp:
    groups = label_groups(pool) if _REFERENCE.value == "labels" else policy_groups()

    def cases():
      for k, (group, labels) in enumerate(groups):
        ws = workspace.materialize(group, f"{tmp}/g{k}", seed=k)
        if labels is None:
          ref = protocol.validate_grades(rubric.RubricGrader().rank(ws), ws)
          yield ws, ref.ranks, ref
        else:  # the rubric's tiers and hacks are the reference for those
          ref = protocol.validate_grades(rubric.RubricGrader().rank(ws), ws)
          yield ws, {c: labels[ws.slot_of[c]] for c in ws.passing}, ref

    m = demos_lib.measure(grader, cases())
  n = len(groups)
  print(
    f"grader {grader.name} vs {_REFERENCE.value}: {n} held-out groups"
    + (
      f" of {_GROUP_SIZE.value} passing (+1 failing), habit probability {_HABIT_P.value}"
      if _REFERENCE.value == "labels"
      else f" sampled by {_POLICY.value} (>= 2 passing of 8)"
    )
  )
  print(f"  top-1 agreement   {m['top1']:.3f}")
  print(
    f"  Kendall tau-b     {m['kendall_tau']:.3f} (median {m['kendall_tau_median']:.3f}, "
    f"{m['tau_groups']} groups with distinct reference levels)"
  )
  print(f"  invalid outputs   {m['invalid_rate']:.3f}")
  print(
    f"  tier agreement    {m['tier_agreement']:.3f} (candidates, valid answers with tiers); "
    f"hack recall {m['hack_recall']:.3f}"
  )
  print(f"  grading time      {1e3 * m['seconds_per_group']:.1f} ms/group (median)")
  stats = getattr(grader, "stats", None)
  if stats:
    print(
      f"  model tokens      {stats['tokens'] / max(n, 1):.0f}/group, turns "
      f"{stats['turns'] / max(n, 1):.1f}/group, retries {stats['retries']}, ranked from "
      f"the notes {stats['from_notes']} (rank_from_notes={_FROM_NOTES.value})"
    )
  chat = getattr(grader, "chat", None)
  if hasattr(chat, "metrics"):
    e = chat.metrics()
    print(
      f"  endpoint          {e['requests']:.0f} requests, latency p50 "
      f"{1e3 * e['latency_p50_s']:.0f} ms p95 {1e3 * e['latency_p95_s']:.0f} ms, "
      f"{e['retries']:.0f} retries, {e['failures']:.0f} failures"
    )


if __name__ == "__main__":
  cli.run(main)
