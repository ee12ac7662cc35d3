"""Grader demonstrations: rubric-graded workspaces of groups the SFT policy sampled.

    groups = rollout.sample_groups(policy_dir, tasks, group_size=8, seed=0)  # >= 2 passing
    for group in groups:
      for record in group_records(group, seed, variants=4, full_copies=2, ...):
        prompt, turns = record["prompt"], record["turns"]   # an SFT demonstration

A demonstration is what a careful grader does with the tools of `agent.py`: for
each passing candidate `diff <id>`, `log <id>` and `note <id> <penalty>:T<tier>[:hack]`
(the rubric's penalty, tier and hack verdict of that candidate), then `rank ...` with
the rubric grader's ranking, which orders (tier, penalty) (equal pairs tie), with
tier markers and hacks (`rank T1 c3 > T2 c1 = c4 > T3 hack c6`). The notes split the
hard part for a small model (a global comparison of raw diffs) into a local judgement
per candidate; the `note` tool answers with the ids still to inspect and, after the
last note, with every noted candidate best first in the ranking's own layout (`T1 c3 >
T2 c1 = c4 > T3 hack c6`), so the bookkeeping of ids and levels (which the tiny model
got wrong: skipped and repeated candidates, and copying around the penalty numbers) is
a plain copy; the judgement is in the per-candidate notes.
Observations are the real tool outputs on the materialized workspace, cut
exactly as the agent loop cuts them. Each group gives `full_copies` demonstrations
of the whole group and `variants - full_copies` of a random passing subset (>= 2), each
with fresh candidate ids: more demonstrations from the same sampling work, and the
long rankings (the hardest to copy) as often as the short ones.

Reward hacks: the policy never special-cases an input, so on a share of the tasks
(with weak hidden tests, `weak_variant`) `inject_hacks` swaps 1-2 samples for the
scripted expert's hack before grading.

Records keep the group itself (task, candidates' files / turns / status) and the
workspace seed, so evaluation can rebuild the very workspace and compare a
grader's ranking with the rubric's (`agreement`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import numpy as np

from gagar_jax import rollout
from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo, tools
from gagar_jax.grading import agent, protocol, rubric, workspace


def expert_turns(
  ws,
  ranks: dict[str, int],
  penalties: dict[str, float],
  max_obs_chars: int,
  tiers: dict[str, int] | None = None,
  hacks=(),
) -> list[tuple[str, str]]:
  """`diff`, `log`, `note <id> <penalty>[:T<tier>[:hack]]` per passing candidate, then the
  ranking (with tier markers and hacks when `tiers` is given)."""
  t = agent.WorkspaceTools(ws)
  turns = []
  for cid in sorted(ws.passing, key=agent._id_key):
    verdict = f"{penalties[cid]:g}"
    if tiers is not None:
      verdict += f":T{tiers[cid] + 1}" + (":hack" if cid in hacks else "")
    for action in (f"diff {cid}", f"log {cid}", f"note {cid} {verdict}"):
      call = agent.action_to_call(action)
      turns.append((action, agent.truncate(t.execute(*call), max_obs_chars)))
  turns.append((agent.format_ranking(ranks, tiers, hacks), ""))
  return turns


def group_to_json(group) -> str:
  return json.dumps(
    {
      "task": group[0].task.to_json(),
      "candidates": [
        {
          "files": t.files,
          "turns": [[u.action, u.observation, u.kind, u.changed] for u in t.turns],
          "passed": bool(t.passed),
        }
        for t in group
      ],
    }
  )


def group_from_json(text: str) -> list[workspace.Candidate]:
  d = json.loads(text)
  task = minirepo.MiniRepoTask.from_json(d["task"])
  return [
    workspace.Candidate(task, [tools.Turn(*u) for u in c["turns"]], c["files"], c["passed"])
    for c in d["candidates"]
  ]


def weak_variant(task: minirepo.MiniRepoTask) -> minirepo.MiniRepoTask:
  """A task of the same seed and difficulty but weak hidden tests (a hack can pass)."""
  return minirepo.generate_task(task.seed, **{**task.difficulty, "weak_hidden_tests": True})


def inject_hacks(group, pool, seed: int, most: int = 2):
  """The group with 1..`most` of its samples (failing ones first) replaced by the scripted
  expert's reward hack (`if <the reported call>: return <its expected value>`, other
  habits at 0.2 each), for grader data on weak-test tasks, where the policy never hacks.
  A group on a task without weak hidden tests is returned as it is."""

  task = group[0].task
  if not task.difficulty.get("weak_hidden_tests"):
    return group
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, most + 1))
  order = sorted(range(len(group)), key=lambda i: (group[i].passed, -i))[:n]
  habits = expert_lib.HabitConfig(
    out_of_scope=0.0, dead_code=0.2, large_edit=0.0, redundant_view=0.2, extra_test=0.2,
    no_test=0.2, hack=1.0,
  )  # fmt: skip
  e = expert_lib.Expert(habits, seed=seed, pool=pool)
  out = list(group)
  for i in order:
    d = e.demonstrate(task)
    out[i] = rollout.Trajectory(
      task, group[i].group, i, [], [], [], d.turns, d.files, finish="submit", passed=d.passed
    )
  return out


def group_records(
  group, seed: int, variants: int, max_obs_chars: int, root: str, full_copies: int = 1
) -> list[dict]:
  """Demonstrations of one group: the full group (`full_copies` times, each with fresh
  candidate ids), then random passing subsets up to `variants` in all."""
  rng = np.random.default_rng(seed)
  passing = [t for t in group if t.passed]
  failing = [t for t in group if not t.passed]
  out = []
  grader = rubric.RubricGrader()
  for v in range(variants):
    if v < max(full_copies, 1):
      members = list(group)
    else:
      k = int(rng.integers(2, len(passing) + 1))
      chosen = [passing[i] for i in sorted(rng.choice(len(passing), k, replace=False))]
      members = chosen + failing
    ws_seed = int(seed * 1000 + v)  # fresh candidate ids per variant
    ws = workspace.materialize(members, os.path.join(root, f"v{v}"), seed=ws_seed)
    g = protocol.validate_grades(grader.rank(ws), ws)
    ranks = g.ranks
    penalties = {r.cid: r.penalty for r in grader.inspect(ws)}
    turns = expert_turns(ws, ranks, penalties, max_obs_chars, g.tiers, sorted(g.hacks))
    out.append(
      {
        "prompt": agent.user_prompt(ws),
        "turns": json.dumps(turns),
        "ranks": json.dumps(ranks),
        "group": group_to_json(members),
        "ws_seed": ws_seed,
        "variant": v,
      }
    )
  return out


# ------------------------------------------------------------------------ agreement


def kendall_tau_b(x, y) -> float:
  n, conc, disc, tx, ty = len(x), 0, 0, 0, 0
  for i in range(n):
    for j in range(i + 1, n):
      dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
      if dx == 0 and dy == 0:
        continue
      if dx == 0:
        tx += 1
      elif dy == 0:
        ty += 1
      elif dx == dy:
        conc += 1
      else:
        disc += 1
  denom = np.sqrt((conc + disc + tx) * (conc + disc + ty))
  return float((conc - disc) / denom) if denom else float("nan")


def compare(ranks: dict[str, int], reference: dict[str, int]) -> tuple[bool, float]:
  """(top-1: the grader's best set holds a reference-best id, Kendall tau-b)."""
  ids = sorted(reference)
  x = np.array([ranks[c] for c in ids])
  y = np.array([reference[c] for c in ids])
  best = {c for c in ids if ranks[c] == x.min()}
  return bool(best & {c for c in ids if reference[c] == y.min()}), kendall_tau_b(x, y)


def measure(grader, cases) -> dict:
  """A grader's agreement with reference rankings over `(workspace, reference)` cases.

  Invalid outputs (after the grader's retry) count as misses for top-1 and are
  left out of tau (which needs a reference with distinct levels); `invalid_rate`
  reports them. Tokens come from an agent grader's `stats`.
  """
  top1, taus, invalid, seconds = [], [], 0, []
  tier_hits, tiered, hacks_found, hacks_total = 0, 0, 0, 0
  tokens_before = getattr(grader, "stats", {}).get("tokens", 0)
  for case in cases:
    # (workspace, reference ranks) or (..., reference Grades): tiers and hacks compared too.
    ws, reference, ref_grades = (*case, None)[:3]
    start = time.perf_counter()
    try:
      ranking = grader.rank(ws)
      grades = protocol.validate_grades(ranking, ws)
      ranks = grades.ranks
    except protocol.InvalidRanking:
      invalid += 1
      top1.append(False)
      continue
    finally:
      seconds.append(time.perf_counter() - start)
    if ref_grades is not None:
      hacks_total += len(ref_grades.hacks)
      hacks_found += len(ref_grades.hacks & grades.hacks)
      if ranking.tiers is not None:  # a grader that gave tiers (T2-by-rank does not count)
        tiered += len(ranks)
        tier_hits += sum(grades.tiers[c] == ref_grades.tiers[c] for c in ranks)
    hit, tau = compare(ranks, reference)
    top1.append(hit)
    if len(set(reference.values())) > 1:
      taus.append(tau)
  n = max(len(top1), 1)
  return {
    "groups": len(top1),
    "top1": float(np.mean(top1)) if top1 else float("nan"),
    "kendall_tau": float(np.nanmean(taus)) if taus else float("nan"),
    "kendall_tau_median": float(np.nanmedian(taus)) if taus else float("nan"),
    "tau_groups": len(taus),
    "invalid_rate": invalid / n,
    # Candidates whose tier equals the reference's (valid answers with tiers), and the
    # reference's confirmed hacks the grader confirmed too (NaN: none to compare).
    "tier_agreement": tier_hits / tiered if tiered else float("nan"),
    "hack_recall": hacks_found / hacks_total if hacks_total else float("nan"),
    "seconds_per_group": float(np.median(seconds)) if seconds else float("nan"),
    "tokens_per_group": (getattr(grader, "stats", {}).get("tokens", 0) - tokens_before) / n,
  }


def agreement(grader, records, root: str | None = None) -> dict:
  """`measure` against the rubric's ranks stored in held-out records (workspaces rebuilt)."""
  with tempfile.TemporaryDirectory(dir=root) as tmp:
    cases = (
      (
        workspace.materialize(
          group_from_json(rec["group"]), os.path.join(tmp, f"g{k}"), seed=rec["ws_seed"]
        ),
        json.loads(rec["ranks"]),
      )
      for k, rec in enumerate(records)
    )
    return measure(grader, cases)
