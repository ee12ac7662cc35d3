"""The grader protocol: `rank(workspace) -> Ranking` over the passing candidates."""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Ranking:
  """ranks: candidate id -> rank (0 = best, ties share a value); rationale: short text."""

  ranks: dict[str, int]
  rationale: str = ""


class Grader(Protocol):
  name: str

  def rank(self, workspace) -> Ranking: ...


class InvalidRanking(ValueError):
  pass


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
