"""Grader backends by name, built from a `grader` config section (or from flags).

rubric   the deterministic agentic grader (`rubric.py`)
lm       the SFT-trained LM grader, in-process (`lm_grader.py`; a grader folder)
openai   the same agent against an OpenAI-compatible endpoint (`openai_grader.py`)
"""

from __future__ import annotations

import os

from gagar_jax import configlib
from gagar_jax.errors import ConfigError
from gagar_jax.grading import agent, lm_grader, openai_grader, rubric

BACKENDS = ("rubric", "lm", "openai")


def agent_config(section, prefix: str = "grader.agent"):
  """`agent.AgentConfig` of a config section (the budgets of the lm / openai agent)."""

  return configlib.from_dict(agent.AgentConfig, section, prefix)


def openai_config(section, prefix: str = "grader.openai"):

  return configlib.from_dict(openai_grader.OpenAIConfig, section, prefix)


def check_config(grader, prefix: str = "grader") -> None:
  """Validates a `grader` section before any compute; errors name the field."""
  configlib.one_of(grader.backend, BACKENDS, f"{prefix}.backend")
  if grader.backend == "lm" and not os.path.exists(os.path.join(grader.lm_path, "grader.json")):
    raise ConfigError(
      f"{prefix}.lm_path",
      f"{grader.lm_path!r} is not a grader folder (no grader.json; make one with "
      "experiments/sft.py --config=configs/grader_sft.py --export=DIR)",
    )
  if grader.backend in ("lm", "openai"):
    agent_config(grader.agent, f"{prefix}.agent")
  if grader.backend == "openai":
    openai_config(grader.openai, f"{prefix}.openai").resolved()


def make(backend: str, *, agent=None, lm_path: str = "", openai=None):
  """The grader of `backend`; `agent`: an `AgentConfig`, `openai`: an `OpenAIConfig`."""

  configlib.one_of(backend, BACKENDS, "grader.backend")
  if backend == "rubric":
    return rubric.RubricGrader()
  if backend == "lm":
    return lm_grader.LMGrader.load(lm_path, agent)
  return openai_grader.OpenAIGrader.from_config(openai, agent)


def from_config(grader):
  """The grader a `grader` config section describes (validated by `check_config`)."""
  check_config(grader)
  return make(
    grader.backend,
    agent=agent_config(grader.agent),
    lm_path=grader.lm_path,
    openai=openai_config(grader.openai),
  )
