"""The shared workspace of one group: what a grader inspects, on disk.

    <root>/task.md                       the issue and the grading instructions
    <root>/original/<files>              the package before any change
    <root>/candidates/<id>/files/...     each candidate's final files
    <root>/candidates/<id>/diff.patch    unified diff against the original
    <root>/candidates/<id>/transcript.txt  its actions and observations
    <root>/candidates/<id>/status.txt    "passed" or "failed" (hidden tests)

Candidates get neutral, shuffled ids (`c1`, `c2`, ...), so a grader sees neither
the sampling order nor anything but pass/fail. The mapping back to trajectory
slots stays with the caller (`Workspace.slot_of`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil

import numpy as np

INSTRUCTIONS = """Rank the PASSING candidates by the quality of their fix (0 = best, ties allowed):
prefer the minimal change that fixes the issue; penalise changes outside the faulty
function, dead or unreachable code, larger edits than needed, and redundant or invalid
actions in the transcript. Failing candidates are context only; do not rank them.
"""


@dataclasses.dataclass
class Candidate:
  """What `materialize` needs of a trajectory (a `rollout.Trajectory` also has it)."""

  task: object
  turns: list
  files: dict[str, str]
  passed: bool


@dataclasses.dataclass(frozen=True)
class Workspace:
  path: str
  ids: tuple[str, ...]  # every candidate, in slot order
  passing: tuple[str, ...]  # ids of passing candidates, sorted
  slot_of: dict[str, int]  # id -> trajectory slot in the group

  def candidate_dir(self, cid: str) -> str:
    return os.path.join(self.path, "candidates", cid)


def unified_diff(original: dict[str, str], files: dict[str, str]) -> str:
  out = []
  for path in sorted(set(original) | set(files)):
    a, b = original.get(path, ""), files.get(path, "")
    if a != b:
      out += difflib.unified_diff(
        a.splitlines(keepends=True), b.splitlines(keepends=True), f"a/{path}", f"b/{path}"
      )
  return "".join(out)


def _write(root: str, files: dict[str, str]) -> None:
  root = os.path.abspath(root)
  for rel, src in files.items():
    path = os.path.normpath(os.path.join(root, rel))
    if not path.startswith(root + os.sep):
      raise ValueError(f"file path {rel!r} escapes the workspace")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(src)


def transcript_text(turns) -> str:
  return "".join(f"> {t.action}\n{t.observation}\n" for t in turns)


def read_transcript(text: str) -> list[tuple[str, str]]:
  """[(action, observation)] back from `transcript_text`."""
  turns, action, obs = [], None, []
  for line in text.splitlines():
    if line.startswith("> "):
      if action is not None:
        turns.append((action, "\n".join(obs)))
      action, obs = line[2:], []
    else:
      obs.append(line)
  if action is not None:
    turns.append((action, "\n".join(obs)))
  return turns


def materialize(group, root: str, seed: int) -> Workspace:
  """Writes a group of trajectories (same task) into `root` (replaced if present)."""
  if os.path.exists(root):
    shutil.rmtree(root)
  task = group[0].task
  os.makedirs(root)
  with open(os.path.join(root, "task.md"), "w") as f:
    f.write(f"# Issue\n{task.issue}\n\n# Instructions\n{INSTRUCTIONS}")
  _write(os.path.join(root, "original"), task.files)
  order = np.random.default_rng(seed).permutation(len(group))
  ids, slot_of, passing = [], {}, []
  for slot, traj in enumerate(group):
    cid = f"c{int(order[slot]) + 1}"
    ids.append(cid)
    slot_of[cid] = slot
    cdir = os.path.join(root, "candidates", cid)
    _write(os.path.join(cdir, "files"), traj.files)
    with open(os.path.join(cdir, "diff.patch"), "w") as f:
      f.write(unified_diff(task.files, traj.files))
    with open(os.path.join(cdir, "transcript.txt"), "w") as f:
      f.write(transcript_text(traj.turns))
    with open(os.path.join(cdir, "status.txt"), "w") as f:
      f.write("passed\n" if traj.passed else "failed\n")
    if traj.passed:
      passing.append(cid)
  return Workspace(root, tuple(ids), tuple(sorted(passing)), slot_of)
