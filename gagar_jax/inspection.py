"""Group records for the group inspector (`experiments/inspect_groups.py`).

Each RL step the trainer writes `workdir/groups/step_<N>.json` (`step_<N>_p<P>.json` per
process on several hosts): one record per kept group with

  task       id, suite, the bug report, the original files
  candidates per trajectory: actions (with observations), final diff against the
             original files, passed, reward, quality signals, the grader's candidate id,
             rank, tier, tier rank and hack flag
  grader     status (graded / invalid / timeout / exception / not graded), its output
             text (the rubric's rationale, an agent's ranking), an agent grader's
             transcript (tool calls, results, notes, answer)
  advantages before (the group advantages) and after redistribution per trajectory,
             and lambda (tiered: the capped rescale; rank mode: the passing set's
             effective rescale, sum_P A' / sum_P w A)

Bounded: texts are cut (`TEXT_LIMIT`), and when a run holds more than `max_steps` step
files the oldest half is thinned (every other one removed), so long runs keep a dense
recent history and a sparse old one.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

import numpy as np

from gagar_jax.grading import workspace

TEXT_LIMIT = 4000  # characters per diff / file / observation kept in a record
_STEP_FILE = re.compile(r"step_(\d+)(?:_p\d+)?\.json$")


def _cut(text: str, limit: int = TEXT_LIMIT) -> str:
  text = str(text)
  return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more)"


def record_step(
  root: str, groups, adv, *, grades, reports, step: int, process: int, processes: int,
  max_steps: int,
) -> None:  # fmt: skip
  """Writes a step's group records under `root` (`adv`: the learner's `Advantages` of these
  groups, recomputed on the host), then thins the oldest past `max_steps` step files."""
  records = group_records(
    groups,
    before=np.asarray(adv.base),
    after=np.asarray(adv.new),
    lam=np.asarray(adv.lam),
    grades=grades,
    reports=reports,
    step=step,
  )
  write_step(
    root, records[0]["step"] if records else 0, records, process=process, processes=processes
  )
  thin(root, max_steps * processes)


def group_records(groups, *, before, after, lam, grades, reports, step: int) -> list[dict]:
  """Records of a step's kept groups (see the module docstring).

  Args:
    groups: the kept groups (lists of `rollout.Trajectory`), slot order.
    before, after: `[N, G]` advantages before and after redistribution.
    lam: `[N]` lambda per group.
    grades: the step's `GradeArrays` (or None when the arm does not grade).
    reports: `GraderLoop.reports` (group index -> status, output, cids, transcript).
  """

  out = []
  for i, group in enumerate(groups):
    task = group[0].task
    report = reports.get(i) or {}
    cids = report.get("cids") or [None] * len(group)
    candidates = []
    for j, t in enumerate(group):
      graded = grades is not None and bool(grades.graded[i, j])
      candidates.append(
        {
          "slot": j,
          "cid": cids[j] if j < len(cids) else None,
          "passed": bool(t.passed),
          "finish": t.finish,
          "tokens": len(t.tokens),
          "actions": [
            {"action": _cut(u.action, 1000), "observation": _cut(u.observation, 1000)}
            for u in t.turns
          ],
          "diff": _cut(workspace.unified_diff(task.files, t.files)),
          "signals": dataclasses.asdict(t.signals) if t.signals is not None else {},
          "rank": int(grades.ranks[i, j]) if graded and t.passed else None,
          "tier": int(grades.tiers[i, j]) if graded and t.passed else None,
          "tier_rank": int(grades.tier_ranks[i, j]) if graded and t.passed else None,
          "hack": bool(grades.hacks[i, j]) if graded else False,
          "before": float(before[i, j]),
          "after": float(after[i, j]),
        }
      )
    status = report.get("status") or "not graded"
    out.append(
      {
        "step": int(step),
        "group": i,
        "task": {
          "id": str(task.task_id),
          "suite": str(task.suite),
          "issue": _cut(task.issue),
          "files": {k: _cut(v) for k, v in sorted(task.files.items())},
        },
        "grader": {
          "status": status,
          "output": _cut(report.get("output", "")),
          "transcript": report.get("transcript", []),
        },
        "lambda": float(lam[i]),
        "redistributed": bool(np.any(np.abs(np.asarray(after[i]) - before[i]) > 1e-6)),
        "candidates": candidates,
      }
    )
  return out


def write_step(root: str, step: int, records: list[dict], *, process: int = 0, processes=1):
  """Writes one step's records (atomically: a temporary file renamed into place)."""
  os.makedirs(root, exist_ok=True)
  name = f"step_{step:06d}" + (f"_p{process}" if processes > 1 else "") + ".json"
  tmp = os.path.join(root, f".{name}.tmp")
  with open(tmp, "w") as f:
    json.dump({"step": step, "process": process, "groups": records}, f)
  os.replace(tmp, os.path.join(root, name))


def thin(root: str, max_steps: int) -> int:
  """Keeps at most about `max_steps` step files: while there are more, every other file
  of the oldest half is removed. Returns how many files were removed."""
  removed = 0
  while True:
    files = step_files(root)
    steps = sorted({s for s, _ in files})
    if len(steps) <= max_steps:
      return removed
    old = steps[: len(steps) // 2]
    drop = set(old[1::2]) or {old[0]}
    for s, path in files:
      if s in drop:
        os.remove(path)
        removed += 1


def step_files(root: str) -> list[tuple[int, str]]:
  """(step, path) of every record file under `root`, by step."""
  out = []
  for path in glob.glob(os.path.join(root, "step_*.json")):
    m = _STEP_FILE.search(os.path.basename(path))
    if m:
      out.append((int(m[1]), path))
  return sorted(out)


def read(root: str, step: int | None = None) -> list[dict]:
  """Every record under `root` (one `step`'s if given), by step and group."""
  out = []
  for s, path in step_files(root):
    if step is not None and s != step:
      continue
    with open(path) as f:
      out += json.load(f)["groups"]
  return out


def out_of_scope(s: dict) -> bool:
  """Whether quality signals (a record's `signals`) show an edit outside the bug's function."""
  return s["out_of_scope_lines"] > 0 or s["out_of_scope_functions"] > 0


def _row(candidates: list[dict]) -> dict:
  passed = [c for c in candidates if c["passed"]]
  hacks = [c for c in candidates if c["signals"] and c["signals"]["special_cases"] > 0]

  def share(pred, among: list[dict]) -> float:
    return float(np.mean([pred(c["signals"]) for c in among])) if among else float("nan")

  def among_passing(pred) -> float:
    return share(pred, passed)

  def junk(s: dict) -> bool:
    return s["invalid_actions"] > 0

  passing_hacks = [c for c in passed if c["signals"]["special_cases"] > 0]
  passing_fixes = [c for c in passed if c["signals"]["special_cases"] == 0]

  return {
    "episodes": len(candidates),
    "pass_rate": float(np.mean([c["passed"] for c in candidates])),
    # Episode tokens (records written before they were kept: nan).
    "tokens": float(np.mean([c.get("tokens", np.nan) for c in candidates])),
    "hack_attempts": len(hacks) / len(candidates),
    "hack_attempt_pass_rate": (
      float(np.mean([c["passed"] for c in hacks])) if hacks else float("nan")
    ),
    "passing_hack": len(passing_hacks) / len(passed) if passed else float("nan"),
    "passing_out_of_scope": among_passing(out_of_scope),
    # out of scope and no hack (a hard-coded result in a reported caller is both)
    "passing_out_of_scope_no_hack": among_passing(
      lambda s: out_of_scope(s) and s["special_cases"] == 0
    ),
    "passing_invalid": among_passing(junk),
    # the junk-turn share within the passing hacks and within the passing fixes: which
    # kind of passing episode carries the junk
    "passing_hack_invalid": share(junk, passing_hacks),
    "passing_fix_invalid": share(junk, passing_fixes),
  }


def trends(root: str, bins: int) -> list[dict]:
  """Per bin of RL steps (equal step counts), over every candidate with quality signals
  of the records under `root`: pass rate, episode tokens, hack attempts (the signals'
  `special_cases`, passing or not) and their pass rate, and among passing candidates the
  hack, out-of-scope (with and without a hack) and invalid-action (junk turn) shares, the
  last also within the passing hacks and within the passing fixes."""
  by_step: dict[int, list[dict]] = {}
  for g in read(root):
    by_step.setdefault(g["step"], []).extend(c for c in g["candidates"] if c["signals"])
  if not by_step:
    raise FileNotFoundError(f"no group records with quality signals under {root}")
  steps = sorted(by_step)
  rows = []
  for chunk in np.array_split(np.array(steps), min(bins, len(steps))):
    candidates = [c for s in chunk for c in by_step[int(s)]]
    rows.append({"steps": f"{chunk[0]}-{chunk[-1]}", **_row(candidates)})
  return rows
