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

from typing import NamedTuple

from gagar_jax.configlib import check


class Arm(NamedTuple):
  grades: bool  # passing trajectories go to the grader
  redistribute: bool  # learner.advantage.redistribute
  preserve_sum: bool  # learner.advantage.preserve_sum
  shapes_reward: bool  # ranks become a reward bonus instead of weights
  mode: str = "rank"  # learner.advantage.mode


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


def check_advantage(name: str, advantage) -> None:
  """The learner's advantage settings must be those of arm `name` (`ConfigError` if not);
  `preserve_sum` only matters where the arm redistributes."""
  arm = get(name)
  check(
    advantage.mode == arm.mode,
    "learner.advantage.mode",
    f"must be {arm.mode!r} for arm={name}",
  )
  check(
    advantage.redistribute == arm.redistribute,
    "learner.advantage.redistribute",
    f"must be {arm.redistribute} for arm={name}",
  )
  if arm.redistribute:
    check(
      advantage.preserve_sum == arm.preserve_sum,
      "learner.advantage.preserve_sum",
      f"must be {arm.preserve_sum} for arm={name}",
    )
