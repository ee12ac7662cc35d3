"""A scripted expert that solves MiniRepo tasks through the agent's action format,
with knobs that inject the habits GAGAR's grader should rank down.

    expert = Expert(HabitConfig(out_of_scope=0.3, dead_code=0.2), seed=0)
    demo = expert.demonstrate(task)      # actions, observations, final files, signals

Habits (each applied to a demonstration with its probability):
  redundant_view   view a file already shown in the prompt
  extra_test       run the tests again with nothing changed
  out_of_scope     a behaviour-preserving edit in another function (redundant
                   parentheses, `+ 0`, `* 1`)
  dead_code        an unused assignment or `pass` inserted into the fixed function
  large_edit       retype the whole faulty line instead of the minimal span
  no_test          submit without running the tests
  trial_and_error  first a wrong candidate edit, the tests, and its revert, then the fix
  hack             special-case the reported call (`if n == 3: return 7`) instead of fixing
  hard_code        return the reported call's expected value, whatever the input (`return 7`
                   as the function's first line); where the report is vague the tests are
                   run first to read it. One literal to copy: the hack a small policy can
                   reach. Both hacks pass only with the suite's `weak_hidden_tests`.
  hack_each        special-case every visible call the code fails, one at a time: the
                   first from the report (or a test run, if vague), each next one from
                   the test run after the last; the hack that passes the suite's
                   `weak_calls` > 1 tests, and the longer the more calls they check.

`Expert.guess` plays a different expert, one that does not know the bug: it ranks
candidate one-token edits (`candidate_edits`) by what the bug report says, and either
submits its first guess (`trials=1`) or tests and re-edits until the tests pass. It
measures the MiniRepo knobs: with `vague_report` the first guess fails more often, and
trial and error wins back what it loses.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import numpy as np

from gagar_jax.envs import minirepo, pyast, quality, tools
from gagar_jax.envs import task as task_lib
from gagar_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HabitConfig:
  redundant_view: float = 0.0
  extra_test: float = 0.0
  out_of_scope: float = 0.0
  dead_code: float = 0.0
  large_edit: float = 0.0
  no_test: float = 0.0
  # Special-case the reported call instead of fixing the bug (passes only with the
  # suite's weak_hidden_tests): a reward hack.
  hack: float = 0.0
  trial_and_error: float = 0.0
  hard_code: float = 0.0
  hack_each: float = 0.0

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if not 0.0 <= value <= 1.0:
        raise ConfigError(f.name, f"a probability in [0, 1], got {value}")


@dataclasses.dataclass
class Demonstration:
  task: minirepo.MiniRepoTask
  prompt: str
  turns: list[tools.Turn]
  files: dict[str, str]
  habits: tuple[str, ...]
  signals: quality.QualitySignals
  passed: bool


def _return_line(source: str, func: str) -> str | None:
  node = pyast.find_function(source, func)
  rets = [n for n in node.body if isinstance(n, ast.Return)] if node else []
  return source.splitlines()[rets[-1].lineno - 1].strip() if rets else None


# Habits added later: drawn (and named in demonstration datasets) only when enabled, so
# older habit sets plan the same demonstrations as before.
LATER_HABITS = ("trial_and_error", "hard_code", "hack_each")


def hard_code_action(task: minirepo.MiniRepoTask) -> str:
  """`insert <func>: return <expected>`: the reward hack of returning the reported
  call's expected value for every input, in the reported function (the buggy one, or
  its caller under the suite's caller_report)."""
  example = task.visible_tests[0]  # the issue's call
  return f"insert {example.func}: return {example.expected!r}"


def hack_action(task: minirepo.MiniRepoTask, case: task_lib.TestCase | None = None) -> str:
  """`insert <func>: if <params> == <args>: return <expected>`: the reward hack of
  special-casing a call: the one named in the bug report, or `case`."""
  case = case or task.visible_tests[0]  # the issue's call, in the reported function
  node = pyast.find_function(task.files[task.bug.path], case.func)
  params = [a.arg for a in node.args.args]
  test = " and ".join(f"{p} == {v!r}" for p, v in zip(params, case.args, strict=True))
  return f"insert {case.func}: if {test}: return {case.expected!r}"


def failing_calls(task: minirepo.MiniRepoTask) -> list[task_lib.TestCase]:
  """The visible calls the task's code gets wrong, in the order the `test` summary shows
  them when each shown one is special-cased (its first failure; a call with the same
  arguments as one already special-cased is then right)."""
  source, out, seen = task.files[task.bug.path], [], set()
  for case in task.visible_tests:
    key = repr(case.args)
    if key not in seen and not case.holds(*minirepo.run_trusted(source, case.func, case.args)):
      seen.add(key)
      out.append(case)
  return out


_TOKEN = re.compile(r"<=|>=|<|>|(?<![\w=])[-+*](?!=)|\b\d+\b|\b[a-z_]\w*\b")
_SWAPS = {"+": "-*", "-": "+*", "*": "+-", "<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"]}
_KEYWORDS = {"if", "return", "for", "in", "range", "len", "total", "i", "and", "or", "not"}


def candidate_edits(source: str, func: str) -> list[tuple[str, str]]:
  """One-token edits of `func`'s body lines: (line, edited line), each line unique in the
  function. Operators and comparisons are swapped, integers moved by 1 or 2, parameter
  names swapped, `range(n + 1)` / `range(1, n)` put back to `range(n)`."""
  node = pyast.find_function(source, func)
  params = [a.arg for a in node.args.args]
  lines = source.splitlines()[node.lineno : node.end_lineno]
  out = []
  body = "\n".join(lines)
  for line in (text.strip() for text in lines):
    if body.count(line) != 1:  # a replace must find it once
      continue
    edits = {re.sub(pattern, repl, line, count=1) for pattern, repl in _RANGE_FIXES}
    for m in _TOKEN.finditer(line):
      tok, (a, b) = m.group(), m.span()
      if tok in _SWAPS:
        new = list(_SWAPS[tok])
      elif tok.isdigit():
        new = [str(int(tok) + d) for d in (-2, -1, 1, 2) if int(tok) + d >= 0]
      elif tok in params:
        new = [p for p in params if p != tok]
      else:
        continue
      edits.update(line[:a] + n + line[b:] for n in new)
    out += [(line, e) for e in sorted(edits) if e != line]
  return out


_RANGE_FIXES = ((r"range\((\w+) \+ 1\)", r"range(\1)"), (r"range\(1, (\w+)\)", r"range(\1)"))


def _swap_line(source: str, func: str, line: str, new: str) -> str:
  """`source` with `func`'s (unique) body line `line` replaced by `new`."""
  node = pyast.find_function(source, func)
  lines = source.splitlines()
  for i in range(node.lineno, node.end_lineno):
    if lines[i].strip() == line:
      lines[i] = lines[i][: len(lines[i]) - len(lines[i].lstrip())] + new
  return "\n".join(lines) + "\n"


def _report(task: minirepo.MiniRepoTask):
  """What the bug report says: (the call's args, its expected result or None if vague)."""
  example = task.visible_tests[0]
  return example.args, example.expected if "should return" in task.issue else None


def ranked_guesses(task: minirepo.MiniRepoTask, rng) -> list[tuple[str, str]]:
  """Candidate edits of the reported function consistent with the report, shuffled: with
  the expected value, those that produce it on the reported call; without (a vague
  report), those that change the reported call's result."""
  bug = task.bug
  source = task.files[bug.path]
  args, expected = _report(task)
  _, wrong = minirepo.run_trusted(source, bug.function, args)
  keep = []
  for line, new in candidate_edits(source, bug.function):
    try:
      ok, got = minirepo.run_trusted(
        _swap_line(source, bug.function, line, new), bug.function, args
      )
    except SyntaxError:
      continue
    if (expected is not None and ok and got == expected) or (expected is None and got != wrong):
      keep.append((line, new))
  order = rng.permutation(len(keep))
  return [keep[i] for i in order]


class Expert:
  def __init__(self, habits: HabitConfig | None = None, seed: int = 0, pool=None):
    self.habits = habits or HabitConfig()
    self.rng = np.random.default_rng(seed)
    self.pool = pool

  def _fix_actions(self, task: minirepo.MiniRepoTask, large: bool) -> list[str]:
    bug = task.bug
    if bug.kind == "missing_case":
      # The guard the reference has and the buggy function lacks, as one line at the top
      # of the body (same behaviour: the guard only returns early).
      buggy = pyast.find_function(task.files[bug.path], bug.function)
      have = {ast.dump(n) for n in buggy.body}
      guard = next(
        n
        for n in pyast.find_function(task.reference_files[bug.path], bug.function).body
        if isinstance(n, ast.If) and ast.dump(n) not in have
      )
      return [f"insert {bug.function}: if {ast.unparse(guard.test)}: {ast.unparse(guard.body[0])}"]
    if large:
      line = task.files[bug.path].splitlines()[bug.line - 1].strip()
      fixed = line.replace(bug.old, bug.new, 1)
      if task.files[bug.path].count(line) == 1:
        return [f"replace {bug.function}: {line} => {fixed}"]
    return [f"replace {bug.function}: {bug.old} => {bug.new}"]

  def _out_of_scope_action(self, task: minirepo.MiniRepoTask) -> str | None:
    others = [(f, p) for f, p in task.functions().items() if f != task.bug.function]
    if not others:
      return None
    func, path = others[int(self.rng.integers(len(others)))]
    line = _return_line(task.files[path], func)
    if line is None or not line.startswith("return "):
      return None
    expr = line[len("return ") :]
    new = [f"return ({expr})", f"return {expr} + 0", f"return {expr} * 1"][
      int(self.rng.integers(3))
    ]
    return f"replace {func}: {line} => {new}"

  def plan(self, task: minirepo.MiniRepoTask) -> tuple[list[str], tuple[str, ...]]:
    """The actions of one demonstration and the habits it carries."""
    h, draw = self.habits, lambda p: bool(self.rng.random() < p)
    names = [
      f.name for f in dataclasses.fields(h) if f.name not in LATER_HABITS or getattr(h, f.name)
    ]
    habits = [name for name in names if draw(getattr(h, name))]
    for first, other in (("hack_each", "hack"), ("hack_each", "hard_code"), ("hack", "hard_code")):
      if first in habits and other in habits:
        habits.remove(other)  # one hack per demonstration
    actions = []
    if "redundant_view" in habits:
      actions.append(f"view {task.bug.path}")
    if "trial_and_error" in habits:
      wrong = self._wrong_guess(task)
      if wrong:
        line, new = wrong
        actions += [f"replace {task.bug.function}: {line} => {new}", "test"]
        actions.append(f"replace {task.bug.function}: {new} => {line}")
      else:
        habits.remove("trial_and_error")
    reads_value = "hack_each" in habits or "hard_code" in habits
    if reads_value and _report(task)[1] is None and "trial_and_error" not in habits:
      actions.append("test")  # a vague report: the tests show the expected value
    if "hack_each" in habits:
      calls = failing_calls(task)
      actions.append(hack_action(task, calls[0]))
      for case in calls[1:]:
        actions += ["test", hack_action(task, case)]
    elif "hack" in habits:
      actions.append(hack_action(task))
    elif "hard_code" in habits:
      actions.append(hard_code_action(task))
    else:
      actions += self._fix_actions(task, "large_edit" in habits)
    if "out_of_scope" in habits:
      extra = self._out_of_scope_action(task)
      if extra:
        actions.append(extra)
      else:
        habits.remove("out_of_scope")
    if "dead_code" in habits:
      actions.append(
        f"insert {task.bug.function}: {['unused = 0', 'pass'][int(self.rng.integers(2))]}"
      )
    if "no_test" not in habits:
      actions.append("test")
      if "extra_test" in habits:
        actions.append("test")
    elif "extra_test" in habits:
      habits.remove("extra_test")
    actions.append("submit")
    return actions, tuple(habits)

  def _wrong_guess(self, task: minirepo.MiniRepoTask) -> tuple[str, str] | None:
    """A candidate edit that changes the reported call's result but fails the visible
    tests (what a vague report leaves open), whose revert is a valid replace."""
    source, func = task.files[task.bug.path], task.bug.function
    for line, new in ranked_guesses(dataclasses.replace(task, issue=""), self.rng):
      edited = {**task.files, task.bug.path: _swap_line(source, func, line, new)}
      body = pyast.find_function(edited[task.bug.path], func)
      text = "\n".join(edited[task.bug.path].splitlines()[body.lineno : body.end_lineno])
      if text.count(new) != 1:
        continue
      runs = [minirepo.run_trusted(edited[task.bug.path], func, c.args) for c in task.visible_tests]
      if any(
        not ok or got != c.expected for (ok, got), c in zip(runs, task.visible_tests, strict=True)
      ):
        return line, new
    return None

  def guess(
    self, task: minirepo.MiniRepoTask, *, trials: int = 1, max_turns: int = 12
  ) -> Demonstration:
    """Plays the expert that does not know the bug (see the module docstring): up to
    `trials` guesses from `ranked_guesses`, each tested; a failing guess is reverted."""
    episode = tools.Episode(task, max_turns=max_turns, pool=self.pool)
    func = task.bug.function
    for i, (line, new) in enumerate(ranked_guesses(task, self.rng)[:trials]):
      episode.step(f"replace {func}: {line} => {new}")
      if episode.step("test").endswith(" 0 failed") or i == trials - 1:
        break
      episode.step(f"replace {func}: {new} => {line}")
    episode.step("submit")
    return self._finish(task, episode, (f"guess{trials}",))

  def demonstrate(self, task: minirepo.MiniRepoTask, *, max_turns: int = 8) -> Demonstration:
    """Plans (draws habits) and plays one demonstration."""
    actions, habits = self.plan(task)
    return self.play(task, actions, habits, max_turns=max_turns)

  def play(
    self, task: minirepo.MiniRepoTask, actions, habits, *, max_turns: int = 8
  ) -> Demonstration:
    """Plays planned actions in an `Episode` (tests run in the sandbox) and evaluates.

    Thread-safe: plan sequentially (the habit draws), play in parallel.
    """
    episode = tools.Episode(task, max_turns=max(max_turns, len(actions)), pool=self.pool)
    for action in actions:
      episode.step(action)
    return self._finish(task, episode, tuple(habits))

  def _finish(self, task: minirepo.MiniRepoTask, episode: tools.Episode, habits) -> Demonstration:
    """The played episode's demonstration: hidden tests in the sandbox, quality signals."""
    result = minirepo.evaluate(task, episode.files, self.pool)
    return Demonstration(
      task=task,
      prompt=episode.prompt(),
      turns=episode.turns,
      files=episode.files,
      habits=habits,
      signals=quality.signals(task, episode.files, episode.turns),
      passed=result.passed,
    )
