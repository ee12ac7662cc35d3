"""Shared workspaces, the rubric grader, and the grader loop under fault injection."""

import os
import time

import numpy as np
import pytest

from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.grading import loop as loop_lib
from gagar_jax.grading import protocol, rubric, workspace
from gagar_jax.rollout import Trajectory


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=65000)) as p:
    yield p


def _traj(demo, index, passed=None):
  return Trajectory(
    demo.task,
    0,
    index,
    [],
    [],
    [],
    demo.turns,
    demo.files,
    passed=demo.passed if passed is None else passed,
  )


def _demo(task, pool, **habits):
  config = expert_lib.HabitConfig(**dict.fromkeys(habits, 1.0))
  return expert_lib.Expert(config, pool=pool).demonstrate(task)


def test_workspace_layout_hides_sampling_order(pool, tmp_path):
  task = minirepo.generate_task(3)
  demos = [_demo(task, pool), _demo(task, pool, dead_code=1)]
  group = [_traj(demos[0], 0), _traj(demos[1], 1), _traj(demos[0], 2, passed=False)]
  ws = workspace.materialize(group, str(tmp_path / "ws"), seed=1)
  assert sorted(ws.ids) == ["c1", "c2", "c3"] and len(ws.passing) == 2
  assert {ws.slot_of[c] for c in ws.ids} == {0, 1, 2}
  # Ids are shuffled: across seeds, c1..c3 do not always map to slots 0..2.
  layouts = {
    tuple(w.slot_of[f"c{i}"] for i in (1, 2, 3))
    for w in (workspace.materialize(group, str(tmp_path / f"w{s}"), seed=s) for s in range(6))
  }
  assert len(layouts) > 1
  for cid in ws.ids:
    cdir = ws.candidate_dir(cid)
    assert set(os.listdir(cdir)) == {"files", "diff.patch", "transcript.txt", "status.txt"}
    status = open(os.path.join(cdir, "status.txt")).read().strip()
    assert status == ("passed" if group[ws.slot_of[cid]].passed else "failed")
  patch = open(os.path.join(ws.candidate_dir(ws.ids[1]), "diff.patch")).read()
  assert patch.startswith("--- a/pkg/")
  assert "Issue" in open(os.path.join(ws.path, "task.md")).read()


@pytest.mark.parametrize(
  "habit", ["out_of_scope", "dead_code", "redundant_view", "extra_test", "large_edit"]
)
def test_rubric_prefers_clean_minimal_fix_in_every_case(pool, tmp_path, habit):
  grader = rubric.RubricGrader()
  checked = 0
  for seed in range(25):
    task = minirepo.generate_task(100 + seed, bug_kinds=minirepo.BUG_KINDS)
    clean = _demo(task, pool)
    bloated = expert_lib.Expert(
      expert_lib.HabitConfig(**{habit: 1.0}), seed=seed, pool=pool
    ).demonstrate(task)
    if (
      habit not in bloated.habits
      or bloated.files == clean.files
      and habit in ("out_of_scope", "dead_code")
    ):
      continue
    if habit == "large_edit" and bloated.turns[0].action == clean.turns[0].action:
      continue  # the faulty line was the minimal span already
    failing = _traj(clean, 2, passed=False)
    group = [_traj(bloated, 0), _traj(clean, 1), failing]
    ws = workspace.materialize(group, str(tmp_path / f"{habit}{seed}"), seed=seed)
    ranking = grader.rank(ws)
    ranks = protocol.validate(ranking, ws)
    by_slot = {ws.slot_of[c]: r for c, r in ranks.items()}
    if habit == "large_edit":
      assert by_slot[1] <= by_slot[0], ranking.rationale  # same diff: tie allowed
    else:
      assert by_slot[1] < by_slot[0], ranking.rationale
    checked += 1
  assert checked >= 10


class FlakyGrader:
  """Misbehaves by group: 1 raises, 2 hangs, 3 returns garbage, 4 ranks the wrong ids,
  5 gives up (raises InvalidRanking, as the agent graders do after their retry)."""

  name = "flaky"

  def __init__(self):
    self.inner = rubric.RubricGrader()

  def rank(self, ws):
    group = int(ws.path.rsplit("group", 1)[1])
    if group == 1:
      raise RuntimeError("grader crashed")
    if group == 2:
      time.sleep(5)
    if group == 3:
      return "the first one is best"
    if group == 4:
      return protocol.Ranking({"c99": 0})
    if group == 5:
      raise protocol.InvalidRanking("no valid ranking after the retry")
    return self.inner.rank(ws)


def test_grader_loop_fault_injection(pool, tmp_path):
  tasks = [minirepo.generate_task(200 + i) for i in range(7)]
  groups = []
  for task in tasks:
    clean = _demo(task, pool)
    dead = _demo(task, pool, dead_code=1)
    groups.append([_traj(dead, 0), _traj(clean, 1), _traj(clean, 2, passed=False)])
  loop = loop_lib.GraderLoop(FlakyGrader(), workers=2, timeout_s=1.0, root=str(tmp_path))
  for n, group in enumerate(groups):
    assert loop.submit(n, group)
  start = time.monotonic()
  ranks, metrics = loop.collect(7, 3)
  assert time.monotonic() - start < 4
  assert metrics["grader_ok"] == 2  # groups 0 and 6
  assert (metrics["grader_exceptions"], metrics["grader_timeouts"], metrics["grader_invalid"]) == (
    1,
    1,
    3,
  )
  for n in (1, 2, 3, 4, 5):
    np.testing.assert_array_equal(ranks[n], 0)  # plain GRPO advantages for these groups
  for n in (0, 6):
    assert ranks[n, 1] < ranks[n, 0]  # clean above dead code
  # The loop still works on the next step, with its slots freed.
  loop.grader = rubric.RubricGrader()
  for n, group in enumerate(groups[:2]):
    loop.submit(n, group)
  ranks, metrics = loop.collect(2, 3)
  assert metrics["grader_ok"] == 2 and loop.totals["timeouts"] == 1
  assert not loop.submit(0, [groups[0][0], groups[0][2]])  # one passing: nothing to rank


def test_workspace_relative_root_and_escaping_paths(pool, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  task = minirepo.generate_task(4)
  demo = _demo(task, pool)
  ws = workspace.materialize([_traj(demo, 0), _traj(demo, 1)], "relative/ws", seed=0)
  assert os.path.exists(os.path.join(ws.path, "original", "pkg", "__init__.py"))
  evil = _traj(demo, 0)
  evil.files = {**demo.files, "../../escape.py": "x = 1\n"}
  with pytest.raises(ValueError, match="escapes the workspace"):
    workspace.materialize([evil], "relative/ws2", seed=0)
  assert not os.path.exists(tmp_path / "escape.py")


@pytest.mark.parametrize("habit", ["hack", "hard_code"])
def test_a_passing_reward_hack_is_confirmed_and_gets_the_failing_advantage(pool, tmp_path, habit):
  """Under weak hidden tests special-casing the reported call (or returning its expected
  value outright) passes. GRPO credits it like a fix; the tiered protocol with the rubric's
  confirmation treats it as failing."""
  from gagar_jax import advantages

  task = minirepo.generate_task(3, weak_hidden_tests=True)
  clean, hack = _demo(task, pool), _demo(task, pool, **{habit: 1})
  dead = _demo(task, pool, dead_code=1)
  assert hack.passed and clean.passed and hack.habits == (habit,)
  assert not minirepo.evaluate(minirepo.generate_task(3), hack.files, pool).passed  # real tests
  group = [_traj(clean, 0), _traj(hack, 1), _traj(dead, 2), _traj(clean, 3, passed=False)]
  ws = workspace.materialize(group, str(tmp_path / "ws"), seed=0)
  grades = protocol.validate_grades(rubric.RubricGrader().rank(ws), ws)
  slot = {ws.slot_of[c]: c for c in ws.ids}
  assert grades.hacks == {slot[1]}
  assert grades.tiers[slot[0]] == 0 and grades.tiers[slot[1]] == 2 and grades.tiers[slot[2]] == 2
  passed = np.array([[t.passed for t in group]])
  rewards, valid = passed.astype(np.float32), np.ones_like(passed)
  tiers = np.array([[grades.tiers.get(slot[i], 1) for i in range(4)]])
  tier_ranks = np.array([[grades.tier_ranks.get(slot[i], 0) for i in range(4)]])
  hacks = np.array([[slot[i] in grades.hacks for i in range(4)]])
  grpo = np.asarray(advantages.group_advantages(rewards, valid))[0]
  assert grpo[1] == grpo[0] > 0  # GRPO: the hack gets full credit
  tiered, lam, _ = advantages.tiered_advantages(
    rewards, passed, valid, tiers, tier_ranks, hacks, np.array([True])
  )
  tiered = np.asarray(tiered)[0]
  assert abs(tiered[1] - tiered[3]) < 1e-6 and tiered[1] < 0  # the failing advantage
  assert tiered[0] > tiered[2] > 0  # the clean fix above the dead-code one


def test_the_tiered_loop_grades_a_lone_passing_hack_and_it_gets_no_credit(pool, tmp_path):
  """The paper grades every mixed-outcome group: a lone pass gets its tier and hack check.
  Rewards [1, 0, 0, 0] with the pass a confirmed hack: the paper's formula gives all zeros
  (the hack is reset to reward 0, so the group has no signal); skipping the group, as the
  rank form does, would leave the hack [0.75, -0.25, -0.25, -0.25] (r - mean r)."""
  from gagar_jax import advantages

  task = minirepo.generate_task(3, weak_hidden_tests=True)
  clean, hack = _demo(task, pool), _demo(task, pool, hack=1)
  group = [_traj(hack, 0)] + [_traj(clean, i, passed=False) for i in (1, 2, 3)]
  rank_loop = loop_lib.GraderLoop(rubric.RubricGrader(), root=str(tmp_path / "rank"))
  assert not rank_loop.submit(0, group)  # the rank form: one pass, nothing to rank
  tiered_loop = loop_lib.GraderLoop(
    rubric.RubricGrader(), root=str(tmp_path / "tiered"), min_passing=1
  )
  assert tiered_loop.submit(0, group)
  assert not tiered_loop.submit(1, [_traj(hack, 0), _traj(clean, 1)])  # no failure: not mixed
  grades, metrics = tiered_loop.collect_grades(1, 4)
  assert metrics["grader_ok"] == 1 and metrics["grader_hacks"] == 1
  np.testing.assert_array_equal(grades.hacks[0], [True, False, False, False])
  passed = np.array([[True, False, False, False]])
  rewards, valid = passed.astype(np.float32), np.ones_like(passed)
  tiered, _, _ = advantages.tiered_advantages(
    rewards, passed, valid, grades.tiers, grades.tier_ranks, grades.hacks, grades.graded[:, 0]
  )
  np.testing.assert_allclose(np.asarray(tiered)[0], 0.0, atol=1e-7)
  skipped, _, _ = advantages.tiered_advantages(
    rewards, passed, valid, grades.tiers, grades.tier_ranks, 0 * grades.hacks, np.array([False])
  )
  np.testing.assert_allclose(np.asarray(skipped)[0], [0.75, -0.25, -0.25, -0.25], atol=1e-6)


def test_a_ranking_without_tiers_is_all_t2_by_rank(tmp_path, pool):
  task = minirepo.generate_task(4)
  group = [_traj(_demo(task, pool), i) for i in range(3)]
  ws = workspace.materialize(group, str(tmp_path / "ws"), seed=0)
  ranks = {c: i for i, c in enumerate(sorted(ws.passing))}
  grades = protocol.validate_grades(protocol.Ranking(ranks), ws)
  assert set(grades.tiers.values()) == {1} and grades.tier_ranks == ranks and not grades.hacks
  with pytest.raises(protocol.InvalidRanking, match="tier of"):
    protocol.validate_grades(protocol.Ranking(ranks, tiers=dict.fromkeys(ranks, 3)), ws)
  with pytest.raises(protocol.InvalidRanking, match="hacks"):
    protocol.validate_grades(protocol.Ranking(ranks, hacks=("c99",)), ws)


def test_the_rubric_follows_a_reported_caller_to_the_helper_it_calls(pool, tmp_path):
  """Under caller_report the issue names a caller: fixing the helper it calls is in scope
  (T1), a hard-coded result in the caller is a confirmed hack."""
  task = minirepo.generate_task(5, caller_report=1.0, weak_hidden_tests=True)
  clean, hack = _demo(task, pool), _demo(task, pool, hard_code=1)
  assert clean.passed and hack.passed
  group = [_traj(clean, 0), _traj(hack, 1)]
  ws = workspace.materialize(group, str(tmp_path / "ws"), seed=0)
  reports = {r.cid: r for r in rubric.RubricGrader().inspect(ws)}
  slot = {ws.slot_of[c]: c for c in ws.ids}
  assert reports[slot[0]].functions_out_of_scope == 0 and not reports[slot[0]].hack
  assert reports[slot[1]].hack
  grades = protocol.validate_grades(rubric.RubricGrader().rank(ws), ws)
  assert grades.tiers[slot[0]] == 0 and grades.hacks == {slot[1]}
