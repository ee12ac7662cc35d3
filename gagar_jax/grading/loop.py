"""The host-side grader loop: grade groups in parallel while the device works.

    loop = GraderLoop(RubricGrader(), workers=2, timeout_s=10, root=".../workspaces")
    for n, group in enumerate(groups):
      loop.submit(n, group)            # as soon as the group's episodes are done
    old = learner.logprobs(...)        # device work overlaps with grading
    ranks, metrics = loop.collect(num_groups, group_size)   # [N, G] int32

Which groups are graded depends on the protocol: `min_passing=2` (the rank form)
grades groups with at least two passing trajectories (with one, a ranking is
trivial); `min_passing=1` (the paper's tiered protocol) grades every mixed-outcome
group, at least one passing and one failing trajectory, so a lone pass still gets
its tier and its hack check. A grader that raises, runs past the per-group timeout, or
returns an invalid ranking leaves its group with all-equal ranks (plain GRPO
advantages), and the failure is counted in the metrics. Each grading job runs
in its own daemon thread, so a hung grader never blocks the pool.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from typing import NamedTuple

import numpy as np

from gagar_jax.grading import protocol, workspace


class GradeArrays(NamedTuple):
  """A step's grades as `[N, G]` arrays (see `learner.step.Batch`)."""

  ranks: np.ndarray
  tiers: np.ndarray
  tier_ranks: np.ndarray
  hacks: np.ndarray
  graded: np.ndarray  # the group's grading is usable (repeated along G)


def transcript_lines(messages, limit: int = 600) -> list[dict]:
  """An agent grader's conversation as [{role, text}] (tool calls as their action text,
  each text cut to `limit` characters)."""

  out = []
  for m in messages or ():
    text = m.get("content") or ""
    for call in m.get("tool_calls") or ():
      fn = call.get("function", {})
      try:
        args = json.loads(fn.get("arguments") or "{}")
      except json.JSONDecodeError:
        args = {}
      text = " ".join([str(fn.get("name", "")), *(str(v) for v in dict(args).values())])
    out.append({"role": str(m.get("role", "")), "text": str(text)[:limit]})
  return out


class _Job:
  def __init__(self, index, ws):
    self.index, self.ws = index, ws
    self.result = None
    self.error = None
    self.done = threading.Event()
    self.started = time.monotonic()
    self.elapsed = 0.0
    self.holds_slot = False
    self.lock = threading.Lock()


class GraderLoop:
  def __init__(
    self,
    grader,
    *,
    workers: int = 2,
    timeout_s: float = 30.0,
    root: str,
    seed: int = 0,
    min_passing: int = 2,
  ):
    if workers < 1 or timeout_s <= 0 or min_passing not in (1, 2):
      raise ValueError("grader loop needs workers >= 1, timeout_s > 0 and min_passing 1 or 2")
    self.grader, self.timeout_s, self.root, self.seed = grader, timeout_s, root, seed
    self.min_passing = min_passing
    self._slots = threading.Semaphore(workers)
    self._jobs: dict[int, _Job] = {}
    # Numbers the grading rounds (workspace folders and id shuffles); the trainer sets
    # it to the RL step so that a resumed run grades exactly like an uninterrupted one.
    self.round = 0
    self.totals = {"graded": 0, "exceptions": 0, "timeouts": 0, "invalid": 0, "skipped": 0}
    # Per group index of the last collect_grades: status (graded / invalid / timeout /
    # exception), the grader's output text, candidate id per slot, agent transcript.
    self.reports: dict[int, dict] = {}

  def _run(self, job: _Job):
    self._slots.acquire()
    with job.lock:
      job.holds_slot = True
    try:
      job.result = self.grader.rank(job.ws)
    except BaseException as e:  # counted as a grader failure, never fatal
      job.error = e
    finally:
      job.elapsed = time.monotonic() - job.started
      self._release(job)
      job.done.set()

  def _release(self, job: _Job):
    """Frees the job's worker slot once (also when the loop abandons a hung grader)."""
    with job.lock:
      if job.holds_slot:
        job.holds_slot = False
        self._slots.release()

  def submit(self, index: int, group) -> bool:
    """Queues group `index` for grading; returns False if it needs none (fewer than
    `min_passing` passes; with `min_passing=1`, also a group without a failure)."""
    passes = sum(t.passed for t in group)
    mixed = 0 < passes < len(group)
    if passes < self.min_passing or (self.min_passing == 1 and not mixed):
      self.totals["skipped"] += 1
      return False
    root = os.path.join(self.root, f"round{self.round}", f"group{index}")
    ws = workspace.materialize(group, root, seed=self.seed + 7919 * self.round + index)
    job = _Job(index, ws)
    self._jobs[index] = job
    threading.Thread(target=self._run, args=(job,), daemon=True).start()
    return True

  def collect(self, num_groups: int, group_size: int):
    """Waits for the submitted groups; returns (ranks `[N, G]` int32, metrics)."""
    grades, metrics = self.collect_grades(num_groups, group_size)
    return grades.ranks, metrics

  def _outcome(self, job, report: dict, counts: dict):
    """Waits for one group's grading: its validated grades, or None (timed out, raised,
    or invalid), with the group's `report` filled in and `counts` advanced."""
    # Each group gets timeout_s from its submission (time queued for a slot included).
    left = self.timeout_s - (time.monotonic() - job.started)
    if not job.done.wait(max(0.0, left)):
      counts["timeouts"] += 1
      report["status"] = "timeout"
      self._release(job)  # a hung grader keeps its thread, not its slot
      return None
    if job.error is not None:
      # A grader that gives up with InvalidRanking produced no valid output: invalid.
      invalid = isinstance(job.error, protocol.InvalidRanking)
      counts["invalid" if invalid else "exceptions"] += 1
      report.update(
        status="invalid" if invalid else "exception",
        output=f"{type(job.error).__name__}: {job.error}",
        transcript=transcript_lines(getattr(job.error, "transcript", ())),
      )
      return None
    report.update(  # whatever the grader returned (validated below)
      output=str(getattr(job.result, "rationale", repr(job.result)[:200])),
      transcript=transcript_lines(getattr(job.result, "transcript", ())),
    )
    try:
      g = protocol.validate_grades(job.result, job.ws)
    except protocol.InvalidRanking as e:
      counts["invalid"] += 1
      report.update(status="invalid", output=f"{e} ({report['output']})")
      return None
    report["status"] = "graded"
    return g

  def collect_grades(self, num_groups: int, group_size: int):
    """Waits for the submitted groups; returns (`GradeArrays` `[N, G]`, metrics).

    A group that was not graded (not eligible, or its grading failed) keeps equal ranks,
    tier T2, no hacks and `graded` False."""
    ranks = np.zeros((num_groups, group_size), np.int32)
    tiers = np.ones((num_groups, group_size), np.int32)
    tier_ranks = np.zeros((num_groups, group_size), np.int32)
    hacks = np.zeros((num_groups, group_size), bool)
    graded = np.zeros((num_groups, group_size), bool)
    counts = dict.fromkeys(
      ("graded", "exceptions", "timeouts", "invalid", "hacks", "tier0", "tier1", "tier2"), 0
    )
    waited = 0.0
    start = time.monotonic()
    # What the grader said about each submitted group (the group inspector's record).
    self.reports = {}
    for index, job in sorted(self._jobs.items()):
      cids = [None] * group_size
      for cid, slot in job.ws.slot_of.items():
        cids[slot] = cid
      report = self.reports[index] = {"status": "", "output": "", "cids": cids, "transcript": []}
      g = self._outcome(job, report, counts)
      if g is None:
        continue
      for cid, rank in g.ranks.items():
        slot = job.ws.slot_of[cid]
        ranks[index, slot], tiers[index, slot] = rank, g.tiers[cid]
        tier_ranks[index, slot], hacks[index, slot] = g.tier_ranks[cid], cid in g.hacks
      graded[index] = True
      counts["graded"] += 1
      counts["hacks"] += len(g.hacks)
      for t in g.tiers.values():
        counts[f"tier{t}"] += 1
    waited = time.monotonic() - start
    submitted = len(self._jobs)
    for k in ("graded", "exceptions", "timeouts", "invalid"):
      self.totals[k] += counts[k]
    rated = max(counts["tier0"] + counts["tier1"] + counts["tier2"], 1)
    metrics = {
      "grader_submitted": float(submitted),  # groups eligible (see `min_passing`)
      "grader_ok": float(counts["graded"]),
      "grader_fallback": float(submitted - counts["graded"]),  # plain advantages
      "grader_errors": float(counts["exceptions"] + counts["timeouts"] + counts["invalid"]),
      "grader_exceptions": float(counts["exceptions"]),
      "grader_timeouts": float(counts["timeouts"]),
      "grader_invalid": float(counts["invalid"]),
      "grader_hacks": float(counts["hacks"]),
      "grader_wait_s": waited,
    }
    if counts["graded"]:
      for t, name in enumerate(protocol.TIERS):
        metrics[f"grader_tier_{name}"] = counts[f"tier{t}"] / rated
    self._jobs = {}
    shutil.rmtree(os.path.join(self.root, f"round{self.round}"), ignore_errors=True)
    self.round += 1
    return GradeArrays(ranks, tiers, tier_ranks, hacks, graded), metrics
