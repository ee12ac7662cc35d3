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

MiniRepo (`envs/minirepo.py`, `MiniRepoTask`) and HumanEval (`envs/humaneval.py`,
`HumanEvalTask`) implement it; a new suite is a module with such a task class plus one
entry in `gagar_jax/suites.py` (how its tasks are read for a split, whether it is graded,
its config section). The types the protocol speaks in live here, so that no suite imports
another: `TestCase` (a call and its expected value), `EvalResult` (the hidden evaluation),
and `run_tests` on the process-wide sandbox pool (`default_pool`).
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gagar_jax.envs import sandbox as sandbox_lib

if TYPE_CHECKING:  # (quality imports the suites' task types)
  from gagar_jax.envs.quality import QualitySignals


@dataclasses.dataclass(frozen=True)
class TestCase:
  """`module.func(*args) == expected` (module like `pkg.core`)."""

  module: str
  func: str
  args: tuple
  expected: Any

  def call_text(self) -> str:
    return f"{self.func}({', '.join(map(repr, self.args))})"

  def holds(self, ok: bool, value: Any) -> bool:
    """Whether a call that returned (`ok`) `value` passes: equal, and of the same type."""
    return ok and value == self.expected and type(value) is type(self.expected)


@dataclasses.dataclass(frozen=True)
class EvalResult:
  """`passed` is the reward. `status`: passed | failed | error | timeout | crashed."""

  passed: bool
  status: str
  n_passed: int
  n_total: int
  failures: tuple[str, ...] = ()


@runtime_checkable
class Task(Protocol):
  suite: str
  task_id: str
  issue: str
  files: dict[str, str]
  visible_tests: tuple[TestCase, ...]
  actions: tuple[str, ...]

  def evaluate(self, files: dict[str, str], pool=None) -> EvalResult: ...

  def signals(self, files: dict[str, str], turns) -> QualitySignals | None: ...

  def reference(self) -> dict[str, str] | None: ...


# ---------------------------------------------------------------------------- the sandbox

_DEFAULT_POOL: sandbox_lib.SandboxPool | None = None
_POOL_LOCK = threading.Lock()


def default_pool() -> sandbox_lib.SandboxPool:
  """A process-wide sandbox pool, created on first use and closed at exit."""
  global _DEFAULT_POOL
  with _POOL_LOCK:
    if _DEFAULT_POOL is None:
      _DEFAULT_POOL = sandbox_lib.SandboxPool()
      atexit.register(_DEFAULT_POOL.close)
    return _DEFAULT_POOL


def run_tests(files: dict[str, str], tests: Sequence[TestCase], pool=None) -> EvalResult:
  """Runs `tests` against `files` in the sandbox; expectations never leave this process."""
  pool = pool or default_pool()
  result = pool.call(files, [(t.module, t.func, list(t.args)) for t in tests])
  failures = []
  n_passed = 0
  for t, r in zip(tests, result.calls + [None] * (len(tests) - len(result.calls)), strict=True):
    if r is not None and t.holds(r.ok, r.value):
      n_passed += 1
    elif r is None:
      failures.append(f"{t.call_text()} did not run ({result.status})")
    elif r.ok:
      failures.append(f"{t.call_text()} returned {r.value!r}, expected {t.expected!r}")
    else:
      failures.append(f"{t.call_text()} raised {r.error}")
  passed = result.status == "ok" and n_passed == len(tests) and len(tests) > 0
  status = "passed" if passed else ("failed" if result.status == "ok" else result.status)
  return EvalResult(passed, status, n_passed, len(tests), tuple(failures))
