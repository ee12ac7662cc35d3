"""The RL run's config, typed: `configs/gagar.py`'s whole tree as frozen dataclasses.

    run = run_config.parse(config)     # once, at the entry point; errors name the field
    run.steps, run.eval.every_steps, run.grader.workers, run.learner.optim.learning_rate

The dataclasses are the one source of every default and of the comment on each field;
`configs/gagar.py` builds its sections from them (`configs.common.section`) and states
only what differs. `parse` expands the arm into the learner's advantage fields
(`arms.learner_config`), so the arm and the update cannot disagree. The sections other
modules own stay plain mappings, each parsed by its owner: `model` (with
`model_preset`: `policy_io`), `mesh`, `sharding_rules` and `distributed` (`sharding`),
and `suite` (`suites`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gagar_jax import arms, configlib, rollout
from gagar_jax.configlib import check, check_positive_ints, one_of
from gagar_jax.grading.agent import AgentConfig
from gagar_jax.grading.backends import BACKENDS
from gagar_jax.grading.openai_grader import OpenAIConfig
from gagar_jax.learner.config import LearnerConfig


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Periodic evaluation on held-out validation tasks, and at the end on test tasks."""

  every_steps: int = 10
  tasks: int = 32  # validation tasks per evaluation
  final_tasks: int = 64  # test tasks of the final evaluation
  group_size: int = 4  # samples per task (pass@k up to this k)

  def __post_init__(self):
    check_positive_ints(self, ("every_steps", "tasks", "final_tasks", "group_size"))


@dataclasses.dataclass(frozen=True)
class InspectConfig:
  """The group inspector (experiments/inspect_groups.py): a record of every kept group per
  step in workdir/groups (actions, diffs, grader output, advantages before and after);
  past `max_steps` step files the oldest half is thinned."""

  record: bool = True
  max_steps: int = 200

  def __post_init__(self):
    check_positive_ints(self, ("max_steps",))


@dataclasses.dataclass(frozen=True)
class GraderConfig:
  """The grader, used by every arm but grpo."""

  # rubric (the deterministic agentic grader), lm (the SFT-trained LM grader, in process)
  # or openai (the same agent against an OpenAI-compatible endpoint).
  backend: str = "rubric"
  # The suites whose groups are graded ("" = those graded by default: minirepo); the
  # groups of the others get plain GRPO advantages in the same batch.
  suites: str = ""
  # lm: a grader folder (experiments/sft.py --config=configs/grader_sft.py --export=DIR).
  lm_path: str = "assets/lm_grader"
  # openai: endpoint, model and key ("" -> $OPENAI_BASE_URL, $OPENAI_MODEL, the variable
  # named by api_key_env). The key is read from the environment, never from the config,
  # so it is not written into a workdir.
  openai: OpenAIConfig = dataclasses.field(default_factory=OpenAIConfig)
  # Budgets of the lm / openai grading agent.
  agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
  workers: int = 2
  # Seconds per group from its submission (a model grader queues for one model).
  timeout_s: float = 20.0
  # reward_shaping: reward = passed + coef * (1 - rank / max_rank) for passing trajectories.
  shaping_coef: float = 0.5

  def __post_init__(self):
    one_of(self.backend, BACKENDS, "backend")
    check_positive_ints(self, ("workers",))
    check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """One RL run (`experiments/train.py --config=configs/gagar.py`)."""

  # The experiment arm: grpo, gagar, gagar_no_rescale, reward_shaping, gagar_paper.
  arm: str = "gagar"
  # Seed for data order, sampling and (if no warm start) parameter init.
  seed: int = 0
  # Where TFDS datasets are built and read.
  data_dir: str = "data/tfds"
  # Pre-RL policy: a policy folder (tokenizer/, model.json, params.safetensors; what
  # experiments/sft.py --export writes), a Hugging Face Qwen2 / Llama folder or a
  # llama.cpp GGUF file of one.
  init_from: str = "assets/pre_rl"
  # A chat template (.jinja file or Jinja text) replacing the checkpoint's ("" = its own).
  chat_template: str = ""
  steps: int = 40  # RL steps
  # Groups (tasks) per step; each holds rollout.group_size trajectories.
  num_groups: int = 8
  # PPO updates per rollout batch (each a full pass over the batch).
  updates_per_batch: int = 1
  # Checkpoints under workdir/checkpoints every this many steps (and at the end).
  checkpoint_every: int = 10
  # Resuming a workdir with a config that differs outside workdir.SAFE_ON_RESUME is
  # refused; True goes on anyway (logged in config_changes.jsonl).
  resume_override: bool = False
  sandbox_workers: int = 2
  # The MiniRepo world (configs/common.py apply_world); its knobs live in `suite`.
  world: str = "default"
  rollout: rollout.RolloutConfig = dataclasses.field(default_factory=rollout.RolloutConfig)
  learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
  grader: GraderConfig = dataclasses.field(default_factory=GraderConfig)
  eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
  inspect: InspectConfig = dataclasses.field(default_factory=InspectConfig)
  # Sections their modules parse (module docstring).
  model_preset: str = ""
  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mesh: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sharding_rules: Any = ()
  distributed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  suite: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    arms.get(self.arm)
    check_positive_ints(self, ("steps", "num_groups", "updates_per_batch", "checkpoint_every"))
    check_positive_ints(self, ("sandbox_workers",))
    check(
      self.rollout.group_size >= 2,
      "rollout.group_size",
      f"must be >= 2 for RL, got {self.rollout.group_size}: a group of one has no baseline, "
      "so every advantage would be 0 and no step would learn",
    )


def parse(config) -> RLConfig:
  """The typed config of a `configs/gagar.py` tree (a ConfigDict or mapping); a
  `ConfigError` naming the field for an unknown, missing or invalid one."""
  if isinstance(config, RLConfig):
    return config
  d = dict(config)
  check("arm" in d, "arm", "required field is missing")
  arms.get(d["arm"])
  # The arm sets the learner's advantage fields (a config that sets them is refused).
  d["learner"] = arms.learner_config(d["arm"], d.get("learner"))
  return configlib.from_dict(RLConfig, d, "")
