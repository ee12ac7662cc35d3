"""The experiment arms: their names and what each one sets (one home for the trainer,
`configs/gagar.py` and the ablation sweeps).

  grpo              no grading: plain group advantages
  gagar             the grader's ranks redistribute credit among passing trajectories,
                    the group's total passing credit preserved
  gagar_no_rescale  rank weights without the rescale (total credit shrinks)
  reward_shaping    the grader's score is added to the binary reward (the alternative
                    the paper argues against)
  gagar_paper       the paper's protocol: tiers and tied ranks within them -> quality
                    factors, confirmed reward hacks reset to reward 0, r - mean(r) base,
                    the rescale capped at lambda_max = 1.5, re-centred
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from gagar_jax.configlib import check
from gagar_jax.learner.config import LearnerConfig


class Arm(NamedTuple):
  grades: bool  # passing trajectories go to the grader
  redistribute: bool  # learner.advantage.redistribute
  preserve_sum: bool  # learner.advantage.preserve_sum
  shapes_reward: bool  # ranks become a reward bonus instead of weights
  mode: str = "rank"  # learner.advantage.mode


# The `learner.advantage` fields an arm sets (`learner_config`).
ADVANTAGE_FIELDS = ("redistribute", "preserve_sum", "mode")

ARMS: dict[str, Arm] = {
  "grpo": Arm(grades=False, redistribute=False, preserve_sum=True, shapes_reward=False),
  "gagar": Arm(grades=True, redistribute=True, preserve_sum=True, shapes_reward=False),
  "gagar_no_rescale": Arm(grades=True, redistribute=True, preserve_sum=False, shapes_reward=False),
  "reward_shaping": Arm(grades=True, redistribute=False, preserve_sum=True, shapes_reward=True),
  "gagar_paper": Arm(
    grades=True, redistribute=True, preserve_sum=True, shapes_reward=False, mode="tiered"
  ),
}


def get(name: str, field: str = "arm") -> Arm:
  check(name in ARMS, field, f"must be one of {tuple(ARMS)}, got {name!r}")
  return ARMS[name]


def label(name: str, backend: str) -> str:
  """The arm as sweeps and reports name it: the grader backend joins the name when it is
  not the default rubric (gagar graded by the LM grader: `gagar_lm`)."""
  return name if backend == "rubric" or not get(name).grades else f"{name}_{backend}"


def learner_config(name: str, section) -> LearnerConfig:
  """The `LearnerConfig` of config section `section` (`config.learner`) under arm `name`:
  the arm sets the `ADVANTAGE_FIELDS` (the config leaves them out; one that sets them is a
  `ConfigError` naming the field, so an arm and its advantage settings cannot disagree)."""
  arm = get(name)
  given = dict(section or {}).get("advantage") or {}
  for field in ADVANTAGE_FIELDS:
    check(
      field not in given,
      f"learner.advantage.{field}",
      f"is set by the arm (arm={name}: {getattr(arm, field)!r}); leave it out of the config",
    )
  cfg = LearnerConfig.from_dict(section)
  advantage = dataclasses.replace(
    cfg.advantage, **{field: getattr(arm, field) for field in ADVANTAGE_FIELDS}
  )
  return dataclasses.replace(cfg, advantage=advantage)
