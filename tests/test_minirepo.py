"""MiniRepo generation and evaluation, the action format, quality signals, the expert."""

import pytest

from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo, quality, tools
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=63000)) as p:
    yield p


def test_generation_is_deterministic():
  a = minirepo.generate_task(11, n_functions=2)
  b = minirepo.generate_task(11, n_functions=2)
  assert a == b
  assert minirepo.generate_task(12, n_functions=2).files != a.files
  assert minirepo.generate_task(11, n_functions=3).files != a.files


@pytest.mark.parametrize(
  "difficulty",
  [
    {},
    {"n_functions": 1},
    {"n_files": 2, "n_functions": 2, "distractors": 1},
    {"bug_kinds": minirepo.BUG_KINDS},
  ],
)
def test_reference_passes_and_buggy_fails(pool, difficulty):
  def check(seed):
    task = minirepo.generate_task(seed, **difficulty)
    ref = minirepo.evaluate(task, task.reference_files, pool)
    bad = minirepo.evaluate(task, task.files, pool)
    return ref.passed, bad.passed, bad.status, len(task.hidden_tests)

  for ref_ok, bad_ok, status, n in pool.map(check, range(40)):
    assert ref_ok and not bad_ok and status == "failed"
    assert n >= 16


def test_task_contents():
  task = minirepo.generate_task(3, n_files=2, n_functions=2)
  assert set(task.files) == set(task.reference_files)
  assert task.bug.function in task.issue and "should return" in task.issue
  assert task.visible_tests[0].func == task.bug.function
  # Hidden tests cover every function of the package, not only the buggy one.
  assert {t.func for t in task.hidden_tests} == set(task.functions())
  with pytest.raises(ValueError, match="bug kind 'typo'"):
    minirepo.generate_task(1, bug_kinds=("typo",))


def test_candidate_that_breaks_other_functions_fails(pool):
  task = minirepo.generate_task(5, n_functions=3)
  files = dict(task.reference_files)
  other = next(f for f in task.functions() if f != task.bug.function)
  path = task.functions()[other]
  files[path] = files[path].replace(f"def {other}(", f"def {other}_renamed(")
  result = minirepo.evaluate(task, files, pool)
  assert not result.passed and any(other in f for f in result.failures)
  assert not minirepo.evaluate(
    task, {"pkg/__init__.py": "", **dict.fromkeys(files, "x = (")}, pool
  ).passed


@pytest.mark.parametrize(
  "text,expected",
  [
    ("view pkg/core.py", tools.Action("view", path="pkg/core.py")),
    ("replace f: a + b => a - b", tools.Action("replace", func="f", old="a + b", new="a - b")),
    ("insert f: if x < 0: return 0", tools.Action("insert", func="f", text="if x < 0: return 0")),
    (
      "insert pkg/core.py 3:     pass",
      tools.Action("insert", path="pkg/core.py", line=3, text="    pass"),
    ),
    ("delete pkg/core.py 2", tools.Action("delete", path="pkg/core.py", line=2)),
    ("  test\n", tools.Action("test")),
    ("submit", tools.Action("submit")),
  ],
)
def test_parse_action(text, expected):
  assert tools.parse_action(text) == expected


@pytest.mark.parametrize(
  "text", ["", "run tests", "replace f a => b", "view", "delete pkg/core.py x", "sudo rm -rf /"]
)
def test_malformed_actions_give_error_observations(text, pool):
  task = minirepo.generate_task(2)
  episode = tools.Episode(task, pool=pool)
  obs = episode.step(text)
  assert obs.startswith("error:") and episode.files == task.files and not episode.done


def test_episode_edits_and_errors(pool):
  task = minirepo.generate_task(4, n_functions=2)
  ep = tools.Episode(task, max_turns=14, pool=pool)
  assert ep.prompt().startswith(f"Issue: {task.issue}") and task.bug.path in ep.prompt()
  assert ep.step(f"replace {task.bug.function}: zzz => y").startswith("error: 'zzz' not found")
  assert ep.step("replace no_such_fn: a => b").startswith("error: no function")
  # Text that is not an action gets the grammar; an impossible edit gets its reason only.
  for bad, reason in (("fix the bug please", "unknown action"), ("replace f a b", "malformed")):
    obs = ep.step(bad)
    assert obs.startswith(f"error: {reason}") and tools.GRAMMAR in obs
    assert "replace <func>: <old> => <new>" in obs
  assert tools.GRAMMAR not in ep.step(f"delete {task.bug.path} 999")
  assert ep.step(f"view {task.bug.path}").startswith("1 def ")
  obs = ep.step(f"replace {task.bug.function}: {task.bug.old} => {task.bug.new}")
  assert obs.startswith(f"ok: {task.bug.path} line {task.bug.line}")
  assert ep.step("test").startswith(f"{len(task.visible_tests)} passed, 0 failed")
  assert ep.step(f"insert {task.bug.path} 1: # note") == f"ok: inserted {task.bug.path} line 1"
  assert ep.step(f"delete {task.bug.path} 1").startswith("ok: deleted")
  assert ep.step(f"delete {task.bug.path} 999").startswith("error: line 999")
  ep.step("submit")
  assert ep.done and minirepo.evaluate(task, ep.files, pool).passed
  with pytest.raises(RuntimeError):
    ep.step("test")


def test_turn_budget_ends_episode(pool):
  ep = tools.Episode(minirepo.generate_task(1), max_turns=2, pool=pool)
  ep.step("view pkg/nope.py")
  assert not ep.done
  ep.step("test")
  assert ep.done


def test_quality_signals_by_hand(pool):
  task = minirepo.generate_task(8, n_functions=3)
  clean = expert_lib.Expert(pool=pool).demonstrate(task)
  assert clean.passed and not clean.signals.bloated and clean.signals.tested
  assert clean.signals.diff_lines == 1 and clean.signals.turns == 3

  other = next(f for f in task.functions() if f != task.bug.function)
  ep = tools.Episode(task, max_turns=10, pool=pool)
  ret = expert_lib._return_line(task.files[task.functions()[other]], other)
  for action in [
    f"view {task.bug.path}",  # redundant: the prompt showed it
    f"replace {task.bug.function}: {task.bug.old} => {task.bug.new}",
    f"replace {other}: {ret} => {ret} + 0",  # out of scope, behaviour kept
    f"insert {task.bug.function}: unused = 0",  # dead code
    "test",
    "test",  # redundant: nothing changed
    "jump",  # invalid
    "submit",
  ]:
    ep.step(action)
  s = quality.signals(task, ep.files, ep.turns)
  assert minirepo.evaluate(task, ep.files, pool).passed
  assert (s.redundant_views, s.redundant_tests, s.invalid_actions) == (1, 1, 1)
  assert s.out_of_scope_functions == 1 and s.out_of_scope_lines == 1
  assert s.dead_code == 1 and s.diff_lines == 3 and s.excess_diff_lines == 2
  assert s.bloated and s.turns == 8


def test_expert_always_passes_with_and_without_habits(pool):
  habits = expert_lib.HabitConfig(
    redundant_view=0.3,
    extra_test=0.3,
    out_of_scope=0.5,
    dead_code=0.4,
    large_edit=0.3,
    no_test=0.2,
  )
  for config, seed in ((expert_lib.HabitConfig(), 0), (habits, 1)):
    e = expert_lib.Expert(config, seed=seed, pool=pool)
    demos = [
      e.demonstrate(minirepo.generate_task(s, bug_kinds=minirepo.BUG_KINDS)) for s in range(40)
    ]
    assert all(d.passed for d in demos)
    bloated = sum(d.signals.bloated for d in demos)
    if config == expert_lib.HabitConfig():
      assert bloated == 0
    else:
      assert 10 <= bloated < 40  # both clean and bloated demonstrations
      seen = {h for d in demos for h in d.habits}
      drawn = {f.name for f in __import__("dataclasses").fields(habits) if getattr(habits, f.name)}
      assert seen == drawn
      for d in demos:
        if "out_of_scope" in d.habits:
          assert d.signals.out_of_scope
        if "dead_code" in d.habits:
          assert d.signals.dead_code > 0
        if "no_test" in d.habits:
          assert not d.signals.tested
