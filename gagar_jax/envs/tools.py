"""The agent's text actions, their parser, and one MiniRepo episode.

One action per turn; the policy ends it with the end-of-action marker. Format:

    view <path>                       numbered lines of a file
    replace <func>: <old> => <new>    replace the span <old> (unique in function <func>)
    insert <func>: <code>             new first line of <func>'s body (indented for you)
    insert <path> <n>: <code>         new line before line n (text as given)
    delete <path> <n>                 remove line n
    write <path>                      replace the whole file with the lines that follow
    test                              run the visible tests (summary)
    submit                            end the episode

A malformed or impossible action yields an `error: ...` observation and changes
nothing; it never raises. Text that is not an action gets the grammar (`HELP`).
The episode ends on `submit` or when the turn budget is spent (the files as they
are count as submitted).
"""

from __future__ import annotations

import dataclasses
import re

from gagar_jax.envs import pyast
from gagar_jax.envs import task as task_lib

ACTIONS = ("view", "replace", "insert", "delete", "write", "test", "submit")
# The action grammar, as the system message states it and a malformed action's error quotes it.
GRAMMAR = (
  "view <path> | replace <func>: <old> => <new> | insert <func>: <code> | "
  "insert <path> <n>: <code> | delete <path> <n> | write <path> (then the new file) | "
  "test | submit"
)
HELP = f"actions: {GRAMMAR}"


@dataclasses.dataclass(frozen=True)
class Action:
  kind: str
  path: str = ""
  func: str = ""
  line: int = 0
  old: str = ""
  new: str = ""
  text: str = ""


class ActionError(ValueError):
  pass


_REPLACE = re.compile(r"^replace ([A-Za-z_]\w*): (.+?) => (.*)$", re.S)
_INSERT_FUNC = re.compile(r"^insert ([A-Za-z_]\w*): (.+)$", re.S)
_INSERT_LINE = re.compile(r"^insert (\S+\.py) (\d+): (.*)$", re.S)
_DELETE = re.compile(r"^delete (\S+\.py) (\d+)$")
_VIEW = re.compile(r"^view (\S+)$")
_WRITE = re.compile(r"^write (\S+\.py)\n(.*)$", re.S)


def parse_action(text: str) -> Action:
  """Parses one action (surrounding whitespace ignored); raises ActionError."""
  text = text.strip()
  if text in ("test", "submit"):
    return Action(text)
  if m := _WRITE.match(text):
    return Action("write", path=m[1], text=m[2] + "\n")
  if m := _VIEW.match(text):
    return Action("view", path=m[1])
  if m := _REPLACE.match(text):
    return Action("replace", func=m[1], old=m[2], new=m[3])
  if m := _INSERT_LINE.match(text):
    return Action("insert", path=m[1], line=int(m[2]), text=m[3])
  if m := _INSERT_FUNC.match(text):
    return Action("insert", func=m[1], text=m[2])
  if m := _DELETE.match(text):
    return Action("delete", path=m[1], line=int(m[2]))
  word = text.split(maxsplit=1)[0] if text else ""
  if word in ACTIONS:
    raise ActionError(f"malformed {word}")
  raise ActionError("unknown action")


def number_lines(source: str) -> str:
  return "\n".join(f"{i} {line}" for i, line in enumerate(source.splitlines(), 1))


def _function_span(source: str, func: str) -> tuple[int, int] | None:
  """0-based [start, end) line range of top-level function `func` (def line included)."""
  try:
    pyast.parse(source)
  except SyntaxError:
    return _function_span_text(source, func)
  node = pyast.find_function(source, func)
  return None if node is None else (node.lineno - 1, node.end_lineno)


def _function_span_text(source: str, func: str):
  """Fallback for files that no longer parse: from `def func(` to the next top-level line."""
  lines = source.splitlines()
  for i, line in enumerate(lines):
    if line.startswith(f"def {func}("):
      end = i + 1
      while end < len(lines) and (not lines[end] or lines[end][0] in " \t"):
        end += 1
      return i, end
  return None


@dataclasses.dataclass
class Turn:
  action: str
  observation: str
  kind: str  # the action kind, or "error"
  changed: bool = False


class Episode:
  """One agent working on one task: apply actions, produce observations.

  Args:
    task: a task (the protocol of `envs/task.py`: MiniRepo, HumanEval, ...); actions
      outside `task.actions` get an error observation.
    max_turns: the turn budget; reaching it ends the episode.
    show_files: put every file in the first prompt (no `view` needed).
    pool: the sandbox pool for `test` (default: `task_lib.default_pool()`).
  """

  def __init__(self, task, *, max_turns: int = 6, show_files: bool = True, pool=None):
    self.task = task
    self.files = dict(task.files)
    self.max_turns = max_turns
    self.show_files = show_files
    self.pool = pool
    self.turns: list[Turn] = []
    self.done = False

  def prompt(self) -> str:
    """The first user message: the issue, then the code (or the file list)."""
    parts = [f"Issue: {self.task.issue}"]
    for path, src in sorted(self.task.files.items()):
      if not src:
        continue
      parts.append(f"{path}:\n{src.rstrip()}" if self.show_files else f"file {path}")
    return "\n".join(parts)

  def _func_file(self, func: str) -> tuple[str, tuple[int, int]]:
    for path, src in sorted(self.files.items()):
      span = _function_span(src, func)
      if span is not None:
        return path, span
    raise ActionError(f"no function {func}")

  def _path(self, path: str) -> str:
    if path not in self.files:
      raise ActionError(f"no file {path}")
    return path

  def step(self, text: str) -> str:
    """Applies one action; returns the observation ("" after submit). `test` runs the
    visible tests in the sandbox pool."""
    if self.done:
      raise RuntimeError("episode is over")
    try:
      action = parse_action(text)
    except ActionError as e:  # not an action: quote the grammar
      action, obs, changed, kind = None, f"error: {e}. {HELP}", False, "error"
    if action is not None and action.kind not in self.task.actions:
      allowed = ", ".join(self.task.actions)
      obs = f"error: no {action.kind} action for this task (actions: {allowed})"
      action, changed, kind = None, False, "error"
    if action is not None:
      try:
        obs, changed = self._apply(action)
        kind = action.kind
      except ActionError as e:
        obs, changed, kind = f"error: {e}", False, "error"
    self.turns.append(Turn(text.strip(), obs, kind, changed))
    if kind == "submit" or len(self.turns) >= self.max_turns:
      self.done = True
    return obs

  def _apply(self, a: Action) -> tuple[str, bool]:
    if a.kind == "submit":
      return "", False
    if a.kind == "test":
      return summarize(task_lib.run_tests(self.files, self.task.visible_tests, self.pool)), False
    if a.kind == "view":
      return number_lines(self.files[self._path(a.path)]), False
    if a.kind == "replace":
      path, (start, end) = self._func_file(a.func)
      lines = self.files[path].splitlines()
      body = "\n".join(lines[start:end])
      count = body.count(a.old)
      if count == 0:
        raise ActionError(f"{a.old!r} not found in {a.func}")
      if count > 1:
        raise ActionError(f"{a.old!r} occurs {count} times in {a.func}")
      offset = body.index(a.old)
      new_body = body[:offset] + a.new + body[offset + len(a.old) :]
      lines[start:end] = new_body.split("\n")
      self.files[path] = "\n".join(lines) + "\n"
      at = start + body[:offset].count("\n")
      return f"ok: {path} line {at + 1} is now: {lines[at].strip()}", True
    if a.kind == "insert":
      if a.func:
        path, (start, end) = self._func_file(a.func)
        lines = self.files[path].splitlines()
        indent = next(
          (ln[: len(ln) - len(ln.lstrip())] for ln in lines[start + 1 : end] if ln.strip()), "    "
        )
        at, text = start + 1, indent + a.text.strip()
      else:
        path = self._path(a.path)
        lines = self.files[path].splitlines()
        if not 1 <= a.line <= len(lines) + 1:
          raise ActionError(f"line {a.line} is outside 1..{len(lines) + 1}")
        at, text = a.line - 1, a.text
      lines.insert(at, text)
      self.files[path] = "\n".join(lines) + "\n"
      return f"ok: inserted {path} line {at + 1}", True
    if a.kind == "write":
      path = self._path(a.path)
      self.files[path] = a.text
      return f"ok: wrote {path} ({a.text.count(chr(10))} lines)", True
    if a.kind == "delete":
      path = self._path(a.path)
      lines = self.files[path].splitlines()
      if not 1 <= a.line <= len(lines):
        raise ActionError(f"line {a.line} is outside 1..{len(lines)}")
      removed = lines.pop(a.line - 1)
      self.files[path] = "\n".join(lines) + ("\n" if lines else "")
      return f"ok: deleted {path} line {a.line}: {removed.strip()}", True
    raise ActionError("unknown action")


def summarize(result: task_lib.EvalResult) -> str:
  """Short test summary: counts and the first failure."""
  failed = result.n_total - result.n_passed
  text = f"{result.n_passed} passed, {failed} failed"
  if result.failures:
    text += f": {result.failures[0]}"
  return text
