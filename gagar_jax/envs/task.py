"""The task protocol: what the rollout, the trainer, SFT, grading and metrics use of a task.

    task.suite            registry name of its suite ("minirepo", "humaneval", ...)
    task.task_id          unique within the suite
    task.issue            what the first message asks for
    task.files            {path: source} the workspace starts from
    task.visible_tests    `TestCase`s the `test` action runs (in the sandbox)
    task.actions          the tool actions an episode accepts (`envs/tools.py` names)
    task.evaluate(files, pool) -> EvalResult   hidden evaluation, sandboxed (the reward)
    task.signals(files, turns) -> QualitySignals | None   quality, where the suite has it
    task.reference() -> {path: source} | None  a reference solution, where there is one

MiniRepo (`envs/minirepo.py`) and HumanEval (`envs/humaneval.py`) implement it; a new
suite is a module with such a task class plus one entry in `gagar_jax/suites.py` (how
its tasks are read for a split, whether it is graded, its config section).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Task(Protocol):
  suite: str
  task_id: str
  issue: str
  files: dict[str, str]
  visible_tests: tuple
  actions: tuple[str, ...]

  def evaluate(self, files: dict[str, str], pool=None): ...

  def signals(self, files: dict[str, str], turns): ...

  def reference(self) -> dict[str, str] | None: ...
