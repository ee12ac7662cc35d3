"""HumanEval through the task protocol and the sandbox."""

import pytest

from gagar_jax.envs import humaneval, tools
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=64000)) as p:
    yield p


@pytest.fixture(scope="module")
def tasks():
  return humaneval.load_tasks()


def test_all_canonical_solutions_pass_and_empty_bodies_fail(pool, tasks):
  assert len(tasks) == 164
  canonical = pool.map(
    lambda t: humaneval.evaluate(t, {humaneval.PATH: t.prompt + t.canonical_solution}, pool), tasks
  )
  empty = pool.map(
    lambda t: humaneval.evaluate(t, {humaneval.PATH: t.prompt + "    pass\n"}, pool), tasks
  )
  assert [t.task_id for t, r in zip(tasks, canonical, strict=True) if not r.passed] == []
  assert sum(r.passed for r in empty) == 0


def test_agent_episode_on_humaneval(pool, tasks):
  task = tasks[0]
  assert task.visible_tests and task.visible_tests[0].func == task.entry_point
  ep = tools.Episode(task, pool=pool)
  assert ep.step(f"write {humaneval.PATH}\n{task.prompt}{task.canonical_solution}").startswith(
    "ok: wrote"
  )
  obs = ep.step("test")
  assert obs.startswith(f"{len(task.visible_tests)} passed, 0 failed"), obs
  ep.step("submit")
  assert humaneval.evaluate(task, ep.files, pool).passed
  # A wrong solution fails the benchmark's check.
  wrong = task.prompt + "    return not " + task.canonical_solution.strip().split("return ")[-1]
  assert not humaneval.evaluate(task, {humaneval.PATH: wrong}, pool).passed
