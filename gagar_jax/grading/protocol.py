"""The grader protocol: `rank(workspace) -> Ranking` over the passing candidates."""

from __future__ import annotations

import dataclasses
from typing import Protocol

TIERS = ("T1", "T2", "T3")  # clean and targeted / acceptable with problems / poor


@dataclasses.dataclass(frozen=True)
class Ranking:
  """A grader's verdict on a group's passing candidates.

  Attributes:
    ranks: candidate id -> rank (0 = best, ties share a value).
    rationale: short text.
    tiers: candidate id -> tier (0 = T1 clean and targeted, 1 = T2 acceptable with
      problems, 2 = T3 poor: bloated, out of scope, hacky), or None. A ranking without
      tiers puts every candidate in T2, ordered by its rank.
    hacks: ids of passing candidates confirmed as reward hacks (they count as failing).
    transcript: an agent grader's conversation (OpenAI chat messages: its tool calls,
      their results, its notes and answer), for inspection; empty for the rubric.
  """

  ranks: dict[str, int]
  rationale: str = ""
  tiers: dict[str, int] | None = None
  hacks: tuple[str, ...] = ()
  transcript: tuple = ()


@dataclasses.dataclass(frozen=True)
class Grades:
  """A validated ranking: per candidate its rank, tier and tied rank within the tier."""

  ranks: dict[str, int]
  tiers: dict[str, int]
  tier_ranks: dict[str, int]
  hacks: frozenset[str]


class Grader(Protocol):
  name: str

  def rank(self, workspace) -> Ranking: ...


class InvalidRanking(ValueError):
  """No usable ranking; `transcript` holds an agent grader's last conversation, if any."""

  transcript: tuple = ()


def validate(ranking, workspace) -> dict[str, int]:
  """Exactly the passing ids, each with a non-negative int rank; raises InvalidRanking."""
  if not isinstance(ranking, Ranking) or not isinstance(ranking.ranks, dict):
    raise InvalidRanking(f"not a Ranking: {type(ranking).__name__}")
  ids = set(ranking.ranks)
  if ids != set(workspace.passing):
    raise InvalidRanking(f"ranked {sorted(ids)}, passing are {sorted(workspace.passing)}")
  for cid, rank in ranking.ranks.items():
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
      raise InvalidRanking(f"rank of {cid} is {rank!r}, not a non-negative int")
  return dict(ranking.ranks)


def validate_grades(ranking, workspace) -> Grades:
  """`validate` plus the tiers (T2 for all when absent) and hack ids; the tier rank is the
  dense rank of `ranks` among the candidates of the same tier. Raises InvalidRanking."""
  ranks = validate(ranking, workspace)
  tiers = ranking.tiers if ranking.tiers is not None else dict.fromkeys(ranks, 1)
  if not isinstance(tiers, dict) or set(tiers) != set(ranks):
    raise InvalidRanking(f"tiers name {sorted(tiers or {})}, ranked are {sorted(ranks)}")
  for cid, tier in tiers.items():
    if tier not in (0, 1, 2) or isinstance(tier, bool):
      raise InvalidRanking(f"tier of {cid} is {tier!r}, not 0 (T1), 1 (T2) or 2 (T3)")
  hacks = frozenset(ranking.hacks or ())
  if not hacks <= set(ranks):
    raise InvalidRanking(f"hacks {sorted(hacks - set(ranks))} are not passing candidates")
  tier_ranks = {}
  for tier in (0, 1, 2):
    members = [c for c in ranks if tiers[c] == tier]
    levels = sorted({ranks[c] for c in members})
    tier_ranks.update({c: levels.index(ranks[c]) for c in members})
  return Grades(ranks, dict(tiers), tier_ranks, hacks)
