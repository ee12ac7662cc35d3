"""The agentic grading loop shared by the LM grader and the OpenAI-compatible client.

A grader agent talks in OpenAI chat messages: a system message (instructions for
general-purpose models), a user message (the issue and the candidate ids), then
turns of an assistant message with one or more tool calls and the tool results,
until an assistant message whose content is the ranking:

    rank c3 > c1 = c4          best first; `>` separates levels, `=` ties
    rank T1 c3 > T2 c1 = c4 > T3 hack c6    with quality tiers (a marker holds until the
                               next; T1 clean and targeted, T2 acceptable with problems,
                               T3 poor) and confirmed reward hacks (`hack`, in T3)

A ranking without tier markers puts every candidate in T2 (ordered by its rank).

Tools (all read-only over the workspace of `workspace.py`):

    list                     every candidate with its status
    diff <id>                the candidate's changes, grouped by function (changed lines only)
    log <id>                 its actions, one per line, with their outcome
    read <id> <path>         a file of the candidate (id `original`: before any change)
    test <id>                re-runs the issue's example on its files (when a runner is given)
    note <id> <verdict>      records a verdict on a passing candidate (a scratchpad:
                             `<penalty>[:T1|T2|T3[:hack]]`); answers with the passing
                             candidates not noted yet, and once all are noted, with every
                             noted candidate best first in the ranking's layout (levels by
                             tier, then penalty: `T1 c3 > T2 c1 = c4`)

`AgentGrader.rank` runs the loop against any `ChatModel` (`complete(messages,
...)`): the project's model in-process (`lm_grader.LocalChatModel`) or an HTTP
endpoint (`openai_grader.HTTPChatModel`). Turns and tokens are bounded; an
attempt that runs out of either, errors, or ends in an invalid ranking is retried
once with sampling; then `rank` raises `InvalidRanking` and the `GraderLoop`
falls back to equal ranks (plain GRPO for that group).

In the model's own token format (`envs.transcript`) a tool call is written as the
action text above (`diff c3`), so the same demonstrations train the model and the
same strings cross the HTTP API as tool calls.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import threading
import time
from typing import Protocol

from gagar_jax.configlib import check, check_positive_ints
from gagar_jax.grading import workspace as workspace_lib
from gagar_jax.grading.protocol import InvalidRanking, Ranking

SYSTEM = """You grade candidate fixes of one bug report. Several agents worked on copies
of the same small Python package; some candidates pass the hidden tests, some fail.
Inspect the workspace with the tools (note a verdict per candidate if you like),
then answer with one line ranking ALL passing
candidates, best first: `rank c3 > c1 = c4` (`>` separates quality levels, `=` ties),
optionally with quality tiers and confirmed reward hacks: `rank T1 c3 > T2 c1 = c4 > T3
hack c6` (a tier marker holds until the next; T1 clean and targeted, T2 acceptable with
problems, T3 poor; `hack` marks a candidate that special-cases the tested input instead
of fixing the bug).
Prefer the minimal change inside the faulty function; penalise edits to other
functions, dead or unreachable code, larger edits than needed, and redundant or
invalid actions. Do not rank failing candidates."""


def _fn(name, description, **props):
  return {
    "type": "function",
    "function": {
      "name": name,
      "description": description,
      "parameters": {
        "type": "object",
        "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
        "required": list(props),
      },
    },
  }


TOOLS = [
  _fn("list", "Every candidate id with its status (passed / failed)."),
  _fn(
    "diff",
    "The candidate's changes against the original, grouped by function (changed lines only).",
    candidate="candidate id, e.g. c3",
  ),
  _fn("log", "The candidate's actions, one per line, with their outcome.", candidate="id"),
  _fn(
    "read",
    "A file of the candidate (candidate `original`: the package before any change).",
    candidate="id or `original`",
    path="file path, e.g. pkg/core.py",
  ),
  _fn("test", "Re-runs the bug report's example on the candidate's files.", candidate="id"),
  _fn(
    "note",
    "Records your verdict on a passing candidate (a scratchpad). Returns the passing "
    "candidates not noted yet; once all are noted, every noted candidate best first, in "
    "the ranking's layout (levels by tier, then penalty).",
    candidate="id",
    verdict="one word, e.g. a penalty (lower is better): 2.5",
  ),
]
TOOL_ARGS = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}
_ID = re.compile(r"^[A-Za-z0-9_]+$")


# ----------------------------------------------------------- action text <-> tool call


def action_to_call(text: str) -> tuple[str, dict[str, str]] | None:
  """`diff c3` -> ("diff", {"candidate": "c3"}); None if `text` is not a tool call."""
  parts = text.strip().split()
  if not parts or parts[0] not in TOOL_ARGS:
    return None
  names = TOOL_ARGS[parts[0]]
  if len(parts) - 1 != len(names):
    return None
  return parts[0], dict(zip(names, parts[1:], strict=True))


def call_to_action(name: str, args) -> str:
  """The inverse of `action_to_call`; raises ValueError for an unknown or malformed call."""
  if name not in TOOL_ARGS:
    raise ValueError(f"unknown tool {name!r}; tools: {', '.join(TOOL_ARGS)}")
  if not isinstance(args, dict):
    raise ValueError(f"arguments of {name} must be a JSON object")
  missing = [k for k in TOOL_ARGS[name] if not isinstance(args.get(k), str) or not args.get(k)]
  if missing:
    raise ValueError(f"tool {name} needs string argument(s) {missing}")
  values = [args[k] for k in TOOL_ARGS[name]]
  if any(len(v.split()) != 1 for v in values):
    raise ValueError(f"arguments of {name} must be single words, got {values}")
  return " ".join([name, *values])


def format_ranking(ranks: dict[str, int], tiers=None, hacks=()) -> str:
  """`rank c3 > c1 = c4`; with `tiers` (id -> 0..2) a marker where the tier changes, and
  `hack` before confirmed hacks: `rank T1 c3 > T2 c1 = c4 > T3 hack c6`."""
  levels = sorted(set(ranks.values()))
  hacks, current, parts = set(hacks), None, []
  for lv in levels:
    members = sorted(
      (c for c in ranks if ranks[c] == lv), key=lambda c: (tiers[c] if tiers else 0, _id_key(c))
    )
    words = []
    for c in members:
      mark = ""
      if tiers is not None and tiers[c] != current:
        current, mark = tiers[c], f"T{tiers[c] + 1} "
      words.append(f"{mark}{'hack ' if c in hacks else ''}{c}")
    parts.append(" = ".join(words))
  return "rank " + " > ".join(parts)


def _id_key(cid: str):
  digits = cid.lstrip("c")
  return (0, int(digits)) if digits.isdigit() else (1, cid)


def parse_ranking(text: str, passing) -> dict[str, int]:
  """`rank c3 > c1 = c4` -> {c3: 0, c1: 1, c4: 1}; every passing id exactly once."""
  return parse_grades(text, passing)[0]


_TIER_MARK = {"T1": 0, "T2": 1, "T3": 2}


def parse_grades(text: str, passing):
  """(ranks, tiers or None, hacks) of `rank [T1] [hack] c3 > ...` (see the module doc).

  Tier markers, if any, start the ranking and never go back to a better tier; a hack is
  in T3. Raises InvalidRanking."""
  text = text.strip()
  if not text.startswith("rank "):
    raise InvalidRanking(f"not a ranking (must start with 'rank '): {text[:80]!r}")
  ranks, tiers, hacks, current = {}, {}, [], None
  for level, group in enumerate(text[5:].split(">")):
    for member in group.split("="):
      words = member.split()
      hack = False
      while words and (words[0] in _TIER_MARK or words[0] == "hack"):
        word = words.pop(0)
        if word == "hack":
          hack = True
          continue
        if current is not None and _TIER_MARK[word] < current:
          raise InvalidRanking(f"tier {word} after T{current + 1} in {text[:80]!r}")
        current = _TIER_MARK[word]
      cid = words[0] if len(words) == 1 else ""
      if not cid or not _ID.match(cid):
        raise InvalidRanking(f"bad candidate id {member.strip()!r} in {text[:80]!r}")
      if cid in ranks:
        raise InvalidRanking(f"{cid} ranked twice in {text[:80]!r}")
      ranks[cid] = level
      tiers[cid] = current
      if hack:
        hacks.append(cid)
  if set(ranks) != set(passing):
    raise InvalidRanking(f"ranked {sorted(ranks)}, passing are {sorted(passing)}")
  marked = [t is not None for t in tiers.values()]
  if any(marked) and not all(marked):
    raise InvalidRanking(f"a tier marker must come before the first id: {text[:80]!r}")
  if any(marked) and any(tiers[c] != 2 for c in hacks):
    raise InvalidRanking(f"a hack is ranked outside T3: {text[:80]!r}")
  return ranks, (tiers if any(marked) else None), tuple(hacks)


def notes_grades(notes: dict[str, str]):
  """(ranks, tiers or None, hacks) that notes `<penalty>[:T1|T2|T3[:hack]]` imply: levels
  by (tier, penalty) when every note has a tier, else by penalty (equal ties); None if a
  note has no leading number."""
  try:
    words = {c: v.split(":") for c, v in notes.items()}
    scores = {c: float(w[0]) for c, w in words.items()}
  except (ValueError, IndexError):
    return None
  marks = {
    c: next((_TIER_MARK[x] for x in w[1:] if x in _TIER_MARK), None) for c, w in words.items()
  }
  tiers = marks if marks and all(m is not None for m in marks.values()) else None
  keys = {c: ((tiers[c] if tiers else 0), scores[c]) for c in notes}
  levels = sorted(set(keys.values()))
  ranks = {c: levels.index(k) for c, k in keys.items()}
  hacks = tuple(sorted((c for c, w in words.items() if "hack" in w[1:]), key=_id_key))
  if tiers is not None and any(tiers[c] != 2 for c in hacks):
    hacks = tuple(c for c in hacks if tiers[c] == 2)  # a hack outside T3 is not one
  return ranks, tiers, hacks


def format_notes(notes: dict[str, str]) -> str:
  """Every noted candidate, best first, in the ranking's own layout (`T1 c3 > T2 c1 = c4 >
  T3 hack c6`: levels by (tier, penalty) as `notes_grades` reads them); notes without a
  leading number follow in id order with their verdict, `, `-separated."""
  scored = {c: v for c, v in notes.items() if _score(v) is not None}
  parts = []
  if scored:
    parts.append(format_ranking(*notes_grades(scored))[len("rank ") :])
  parts += [f"{c} {notes[c]}" for c in sorted(notes, key=_id_key) if c not in scored]
  return ", ".join(parts)


def _score(verdict: str):
  try:
    return float(verdict.split(":")[0])
  except (ValueError, IndexError):
    return None


# ----------------------------------------------------------------------------- tools


def function_diff(original: str, changed: str) -> str:
  """Changed lines only, each hunk under `@@ <function>` (the def it falls in)."""
  a, b = original.splitlines(), changed.splitlines()

  def owner(lines, at):
    for i in range(min(at, len(lines) - 1), -1, -1):
      m = re.match(r"\s*def (\w+)", lines[i])
      if m:
        return m[1]
    return "<module>"

  out, last = [], None
  for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
    if tag == "equal":
      continue
    fn = owner(b, j1) if j2 > j1 else owner(a, i1)
    if fn != last:
      out.append(f"@@ {fn}")
      last = fn
    out += [f"-{line}" for line in a[i1:i2]] + [f"+{line}" for line in b[j1:j2]]
  return "\n".join(out)


def _summarize_turn(action: str, observation: str) -> str:
  head = action.split("\n", 1)[0]
  kind = head.split(maxsplit=1)[0] if head else "?"
  if kind == "replace" and ": " in head and " => " in head:
    func, rest = head[len("replace ") :].split(": ", 1)
    old = rest.split(" => ", 1)[0]
    text = f"replace {func} [{len(old)} chars]"
  elif kind in ("insert", "delete", "write", "view"):
    text = " ".join(head.split()[:2])
  else:
    text = head[:24]
  obs = observation.strip()
  if obs.startswith("error:"):
    return f"{text} -> error"
  if kind == "test":
    return f"{text} -> {obs.splitlines()[0][:24] if obs else ''}"
  return text


class WorkspaceTools:
  """Executes the grader's tools on a workspace; never writes to it."""

  def __init__(self, ws, run_tests=None):
    self.ws, self.run_tests = ws, run_tests
    self.notes: dict[str, str] = {}

  def _note(self, cid: str, verdict: str) -> str:
    if cid not in self.ws.passing:
      raise ValueError(f"{cid} is not a passing candidate")
    self.notes[cid] = verdict
    left = [c for c in sorted(self.ws.passing, key=_id_key) if c not in self.notes]
    if left:
      return f"noted; to inspect: {' '.join(left)}"
    return "all noted, best first: " + format_notes(self.notes)

  def _read(self, *parts) -> str:
    root = os.path.realpath(self.ws.path)
    path = os.path.realpath(os.path.join(root, *parts))
    if not path.startswith(root + os.sep):
      raise ValueError("path outside the workspace")
    with open(path) as f:
      return f.read()

  def _files(self, cid: str) -> dict[str, str]:
    base = "original" if cid == "original" else os.path.join("candidates", cid, "files")
    root = os.path.join(self.ws.path, base)
    out = {}
    for dirpath, _, names in os.walk(root):
      for name in sorted(names):
        full = os.path.join(dirpath, name)
        with open(full) as f:
          out[os.path.relpath(full, root)] = f.read()
    return out

  def _check(self, cid: str, allow_original: bool = False) -> None:
    if not (cid in self.ws.ids or (allow_original and cid == "original")):
      raise ValueError(f"no candidate {cid!r}; candidates: {' '.join(self.ws.ids)}")

  def execute(self, name: str, args: dict[str, str]) -> str:
    """The observation of one tool call (`error: ...` for a bad call; never raises)."""
    try:
      action = call_to_action(name, args)
      cid = args.get("candidate", "")
      if name == "list":
        return "\n".join(
          f"{c} {self._read('candidates', c, 'status.txt').strip()}"
          for c in sorted(self.ws.ids, key=_id_key)
        )
      self._check(cid, allow_original=name == "read")
      if name == "diff":
        orig, files = self._files("original"), self._files(cid)
        parts = []
        for path in sorted(set(orig) | set(files)):
          d = function_diff(orig.get(path, ""), files.get(path, ""))
          if d:
            parts.append(f"{path}\n{d}")
        return "\n".join(parts) or "no changes"
      if name == "log":
        turns = workspace_lib.read_transcript(self._read("candidates", cid, "transcript.txt"))
        return "\n".join(_summarize_turn(a, o) for a, o in turns) or "no actions"
      if name == "read":
        base = ("original",) if cid == "original" else ("candidates", cid, "files")
        return self._read(*base, args["path"])
      if name == "note":
        return self._note(cid, args["verdict"])
      if name == "test":
        if self.run_tests is None:
          return "error: this grader has no test runner"
        return "example passes" if self.run_tests(self._files(cid)) else "example fails"
      raise ValueError(f"unhandled tool {action}")
    except (ValueError, OSError) as e:
      return f"error: {e}"


# ------------------------------------------------------------------------ the agent


class ChatModel(Protocol):
  def complete(
    self, messages: list[dict], *, tools: list[dict], max_tokens: int, temperature: float, seed: int
  ) -> dict:
    """An OpenAI chat-completion response dict (`choices[0].message`, `usage`)."""


class AgentError(RuntimeError):
  """An attempt that ended without a ranking (budget spent, model/endpoint error)."""


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Budgets of one grading attempt, and the retry."""

  max_turns: int = 32  # a careful pass over 8 passing candidates takes 25
  max_action_tokens: int = 48  # the ranking of 8 candidates with tiers takes ~30
  max_total_tokens: int = 1500
  max_observation_chars: int = 600
  attempts: int = 2  # the first greedy, the rest sampled at retry_temperature
  retry_temperature: float = 0.7
  # A final answer that is not a valid ranking is sampled again (at retry_temperature,
  # same conversation) up to this many times before the attempt counts as invalid.
  answer_samples: int = 4
  # When the final answer is not a valid ranking but the model noted a number for every
  # passing candidate, rank by those notes (counted in stats["from_notes"]).
  rank_from_notes: bool = True

  def __post_init__(self):
    check_positive_ints(
      self,
      ("max_turns", "max_action_tokens", "max_total_tokens", "max_observation_chars", "attempts"),
    )
    check(self.retry_temperature >= 0, "retry_temperature", "must be >= 0")
    check(self.answer_samples >= 0, "answer_samples", "must be >= 0")


def user_prompt(ws) -> str:
  """The task message: the bug report's first line and the passing candidates."""
  with open(os.path.join(ws.path, "task.md")) as f:
    issue = f.read().split("# Issue\n", 1)[-1].splitlines()[0]
  return f"Issue: {issue}\nPassing: {' '.join(sorted(ws.passing, key=_id_key))}"


def truncate(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit] + " ..."


class AgentGrader:
  """`rank(workspace) -> Ranking` by a tool-using chat model (see the module docstring)."""

  name = "agent"

  def __init__(self, chat: ChatModel, config: AgentConfig | None = None, run_tests=None):
    self.chat, self.config, self.run_tests = chat, config or AgentConfig(), run_tests
    self._lock = threading.Lock()
    self.stats = {
      "groups": 0,
      "valid": 0,
      "invalid": 0,
      "attempts": 0,
      "retries": 0,
      "from_notes": 0,
      "answer_samples": 0,
      "turns": 0,
      "tokens": 0,
      "seconds": 0.0,
    }
    self.last_messages: list[dict] = []

  def _count(self, **kv):
    with self._lock:
      for k, v in kv.items():
        self.stats[k] += v

  def rank(self, workspace) -> Ranking:
    start = time.perf_counter()
    errors = []
    try:
      for attempt in range(self.config.attempts):
        self._count(attempts=1, retries=int(attempt > 0))
        try:
          messages = []
          (ranks, tiers, hacks), text = self._attempt(workspace, attempt, messages)
          self._count(valid=1)
          return Ranking(ranks, text, tiers=tiers, hacks=hacks, transcript=tuple(messages))
        except (InvalidRanking, AgentError) as e:
          errors.append(f"attempt {attempt + 1}: {e}")
      self._count(invalid=1)
      error = InvalidRanking("; ".join(errors))
      error.transcript = tuple(messages)
      raise error
    finally:
      self._count(groups=1, seconds=time.perf_counter() - start)

  @staticmethod
  def _from_notes(tools: WorkspaceTools, workspace):
    """(ranks, tiers or None, hacks) the model's own notes imply (`notes_grades`), if it
    noted every passing id with a number; else None."""
    if set(tools.notes) != set(workspace.passing):
      return None
    return notes_grades(tools.notes)

  def messages(self, workspace) -> list[dict]:
    return [
      {"role": "system", "content": SYSTEM},
      {"role": "user", "content": user_prompt(workspace)},
    ]

  def _attempt(self, workspace, attempt: int, messages: list) -> tuple[dict[str, int], str]:
    """One attempt; `messages` (empty) receives its conversation as it goes."""
    c = self.config
    tools = WorkspaceTools(workspace, self.run_tests)
    messages += self.messages(workspace)
    self.last_messages = messages
    temperature = 0.0 if attempt == 0 else c.retry_temperature
    for _ in range(c.max_turns):
      try:
        response = self.chat.complete(
          messages,
          tools=TOOLS,
          max_tokens=c.max_action_tokens,
          temperature=temperature,
          seed=attempt,
        )
        message = response["choices"][0]["message"]
        used = int(response.get("usage", {}).get("total_tokens", 0))
      except (KeyError, IndexError, TypeError) as e:
        raise AgentError(f"malformed response: {e!r}") from e
      except Exception as e:  # endpoint or model failure: this attempt is lost
        raise AgentError(f"{type(e).__name__}: {e}") from e
      self._count(turns=1, tokens=used)
      message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
      messages.append(message)
      calls = message.get("tool_calls") or []
      if not calls:
        text = message.get("content") or ""
        try:
          return parse_grades(text, workspace.passing), text
        except InvalidRanking:
          pass
        # A malformed final answer is asked for again (sampled; the conversation so far
        # kept), as a harness re-asks for a malformed tool call: the answer is still
        # the model's own, parsed alone.
        for k in range(c.answer_samples):
          try:
            again = self.chat.complete(
              messages[:-1],
              tools=TOOLS,
              max_tokens=c.max_action_tokens,
              temperature=max(c.retry_temperature, 1e-3),
              seed=1000 * (attempt + 1) + k,
            )
            retry = again["choices"][0]["message"]
          except Exception:  # noqa: BLE001 - the retries are a bonus, never fatal
            break
          self._count(answer_samples=1, tokens=int(again.get("usage", {}).get("total_tokens", 0)))
          if retry.get("tool_calls"):
            continue
          candidate = retry.get("content") or ""
          try:
            grades = parse_grades(candidate, workspace.passing)
          except InvalidRanking:
            continue
          messages[-1] = {"role": "assistant", "content": candidate}
          return grades, candidate
        try:
          return parse_grades(text, workspace.passing), text
        except InvalidRanking:
          grades = self._from_notes(tools, workspace) if c.rank_from_notes else None
          if grades is None:
            raise
          self._count(from_notes=1)
          answer = format_ranking(*grades)
          return grades, f"{answer} (from the notes; the answer was {text[:80]!r})"
      for call in calls:
        fn = call.get("function", {})
        try:
          args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
          args = None
        observation = truncate(tools.execute(fn.get("name", ""), args), c.max_observation_chars)
        messages.append(
          {"role": "tool", "tool_call_id": call.get("id", ""), "content": observation}
        )
      if used >= c.max_total_tokens:
        raise AgentError(f"token budget spent ({used} >= {c.max_total_tokens})")
    raise AgentError(f"no ranking within {c.max_turns} turns")
