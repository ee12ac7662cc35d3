"""The runs' configs, typed: each config file's whole tree as frozen dataclasses.

    run = run_config.parse(config)      # RL (configs/gagar.py), once at the entry point
    run.steps, run.eval.every_steps, run.grader.workers, run.learner.optim.learning_rate
    run = run_config.parse_sft(config)  # SFT: PolicySFTConfig (configs/sft.py) or
                                        # GraderSFTConfig (configs/grader_sft.py)

The dataclasses are the one source of every default and of the comment on each field;
the config files build their sections from them (`configs.common.section`) and state
only what differs. Errors name the field. `parse` expands the arm into the learner's
advantage fields (`arms.learner_config`), so the arm and the update cannot disagree. The
sections other modules own stay plain mappings, each parsed by its owner: `model` (with
`model_preset`: `policy_io`), `mesh`, `sharding_rules` and `distributed` (`sharding`),
and `suite` (`suites`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gagar_jax import arms, configlib, rollout
from gagar_jax.configlib import check, check_positive_ints, one_of
from gagar_jax.envs.expert import HabitConfig
from gagar_jax.grading.agent import AgentConfig
from gagar_jax.grading.backends import BACKENDS
from gagar_jax.grading.openai_grader import OpenAIConfig
from gagar_jax.learner.config import LearnerConfig, OptimConfig


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
class OwnedSections:
  """The sections of a run's tree that their modules parse (module docstring), held as
  the mappings the config gives."""

  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mesh: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sharding_rules: Any = ()
  distributed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  suite: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RLConfig(OwnedSections):
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
  # The model shape preset (`model`'s defaults; "" = none).
  model_preset: str = ""

  def __post_init__(self):
    arms.get(self.arm)
    check_positive_ints(
      self, ("steps", "num_groups", "updates_per_batch", "checkpoint_every", "sandbox_workers")
    )
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
  # The arm (checked first) sets the learner's advantage fields; a config that sets them
  # is refused.
  d["learner"] = arms.learner_config(d["arm"], d.get("learner"))
  return configlib.from_dict(RLConfig, d, "")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """The optimizer and batches of supervised training: AdamW on a cosine schedule."""

  batch_size: int = 16
  seq_len: int = 384  # tokens per sequence (longer demonstrations are dropped)
  steps: int = 2000
  learning_rate: float = 2e-3
  warmup_steps: int = 50
  min_lr_ratio: float = 0.1
  weight_decay: float = 0.01
  max_grad_norm: float = 1.0
  # Loss weight of the prompt and observation tokens (the policy's own tokens weigh 1).
  context_loss_weight: float = 0.25

  def __post_init__(self):
    check_positive_ints(self, ("batch_size", "seq_len", "steps"))
    check(
      0 <= self.context_loss_weight <= 1,
      "context_loss_weight",
      f"must be in [0, 1], got {self.context_loss_weight}",
    )

  def optim(self) -> OptimConfig:
    return OptimConfig(
      learning_rate=self.learning_rate,
      schedule="cosine",
      # At least one step after warmup (the cosine needs a positive decay length).
      warmup_steps=min(self.warmup_steps, self.steps - 1),
      total_steps=self.steps,
      min_lr_ratio=self.min_lr_ratio,
      weight_decay=self.weight_decay,
      max_grad_norm=self.max_grad_norm,
    )


@dataclasses.dataclass(frozen=True)
class SFTRunConfig(OwnedSections):
  """What every supervised run has (`experiments/sft.py`): the policy's warm start and the
  LM grader's training."""

  # Seed for parameter init, data order and sampling.
  seed: int = 0
  # Where TFDS datasets are built and read (built on first use).
  data_dir: str = "data/tfds"
  # Stop training after this many minutes even if sft.steps is not reached (0 = no limit).
  time_budget_minutes: float = 0.0
  # BPE vocabulary trained on the demonstrations (bytes + specials + merges).
  tokenizer_vocab_size: int = 512
  sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
  # Checkpoints under workdir/checkpoints.
  checkpoint_every: int = 500
  # Resuming a workdir with a config that differs outside gagar_jax/workdir.py's
  # SAFE_ON_RESUME fields is refused; True goes on anyway (logged in config_changes.jsonl).
  resume_override: bool = False
  # The MiniRepo world (configs/common.py apply_world).
  world: str = "default"

  def __post_init__(self):
    check_positive_ints(self, ("tokenizer_vocab_size", "checkpoint_every"))
    check(
      self.time_budget_minutes >= 0,
      "time_budget_minutes",
      f"must be >= 0, got {self.time_budget_minutes}",
    )


@dataclasses.dataclass(frozen=True)
class PolicySFTConfig(SFTRunConfig):
  """The policy's supervised warm start on expert demonstrations (`configs/sft.py`):
  sampled evaluation on held-out tasks every `eval.every_steps`."""

  # Start from this policy folder, Hugging Face folder or GGUF file ("" = random weights
  # and a BPE trained on the demonstrations). With an HF folder or GGUF file the model
  # shape and tokenizer are its own.
  init_from: str = ""
  # A chat template (.jinja file or Jinja text) replacing the checkpoint's ("" = its own).
  chat_template: str = ""
  # Model shape preset (gagar_jax/models/presets.py); vocab_size follows the tokenizer. With an
  # HF or GGUF init_from only dtype, param_dtype and max_seq_len may differ from its own.
  model_preset: str = "tiny"
  # Share of demonstrations carrying each habit (the grader should rank them down).
  habits: HabitConfig = dataclasses.field(
    default_factory=lambda: HabitConfig(
      redundant_view=0.15,
      extra_test=0.2,
      out_of_scope=0.35,
      dead_code=0.3,
      large_edit=0.15,
      no_test=0.2,
    )
  )
  # 2200 cosine steps over sequences of 320 tokens.
  sft: SFTConfig = dataclasses.field(default_factory=lambda: SFTConfig(seq_len=320, steps=2200))
  # Sampled evaluation on held-out tasks (the calibration figures): groups of
  # eval.group_size per task.
  eval: EvalConfig = dataclasses.field(
    default_factory=lambda: EvalConfig(every_steps=400, tasks=48, final_tasks=128, group_size=8)
  )
  # Episode budgets and sampling for evaluation rollouts (the groups are eval.group_size,
  # drawn once; group_size, dynamic_sampling and max_rounds are not used). The system
  # message is also the one the demonstrations are encoded with.
  rollout: rollout.RolloutConfig = dataclasses.field(
    default_factory=lambda: rollout.RolloutConfig(max_episode_tokens=448)
  )
  # Sandbox pool for tests and evaluation.
  sandbox_workers: int = 2

  def __post_init__(self):
    super().__post_init__()
    check_positive_ints(self, ("sandbox_workers",))


@dataclasses.dataclass(frozen=True)
class GraderDataConfig:
  """The LM grader's demonstrations: groups a policy samples on MiniRepo tasks, graded by
  the rubric (TFDS `minirepo_grader_demos`, built on first use)."""

  # The policy whose sampled groups are graded (an exported policy folder).
  policy_dir: str = "assets/pre_rl"
  # Train tasks sampled (groups with >= 2 passing become demonstrations) and held-out
  # validation tasks (their gradable groups measure agreement).
  n_train_tasks: int = 400
  n_validation_tasks: int = 64
  group_size: int = 8  # samples per task
  # Demonstrations per train group: the full group `full_copies` times (fresh candidate
  # ids each) + random passing subsets.
  variants: int = 4
  full_copies: int = 2
  # Every k-th task (train and validation) has weak hidden tests and 1-2 of its samples
  # swapped for the scripted expert's reward hack, so the grader sees hacks (0: never).
  hack_every: int = 4
  # Turns per sampled episode (the policy's rollout.max_turns).
  max_turns: int = 6

  def __post_init__(self):
    check_positive_ints(
      self,
      ("n_train_tasks", "n_validation_tasks", "group_size", "variants", "full_copies", "max_turns"),
    )
    check(self.hack_every >= 0, "hack_every", f"must be >= 0, got {self.hack_every}")


@dataclasses.dataclass(frozen=True)
class GraderEvalConfig:
  """Agreement with the rubric on `groups` held-out groups every `every_steps` (all of them
  at the end)."""

  every_steps: int = 300
  groups: int = 24

  def __post_init__(self):
    check_positive_ints(self, ("every_steps", "groups"))


@dataclasses.dataclass(frozen=True)
class GraderSFTConfig(SFTRunConfig):
  """Supervised training of the LM grader on rubric-graded workspaces
  (`configs/grader_sft.py`). Its `suite` is the MiniRepo section the groups are sampled
  on (the policy's suite)."""

  # What experiments/sft.py trains: the grader (configs/sft.py trains the policy).
  target: str = "grader"
  grader_data: GraderDataConfig = dataclasses.field(default_factory=GraderDataConfig)
  # Model context (KV-cache slots) when grading, and the cut of each tool output in
  # tokens (the same cut is used when encoding the demonstrations).
  context: int = 1536
  max_obs_tokens: int = 96
  # The grading agent's budgets (gagar_jax/grading/agent.py).
  agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
  # Sequences long enough for the largest groups' demonstrations (8 passing candidates,
  # tiers), 800 steps, context tokens weighing 0.1.
  sft: SFTConfig = dataclasses.field(
    default_factory=lambda: SFTConfig(seq_len=1536, steps=800, context_loss_weight=0.1)
  )
  eval: GraderEvalConfig = dataclasses.field(default_factory=GraderEvalConfig)
  checkpoint_every: int = 250

  def __post_init__(self):
    super().__post_init__()
    one_of(self.target, ("grader",), "target")
    check_positive_ints(self, ("context", "max_obs_tokens"))
    check(
      self.agent.max_total_tokens <= self.context,
      "agent.max_total_tokens",
      f"{self.agent.max_total_tokens} exceeds the grader's context={self.context}",
    )


def parse_sft(config) -> PolicySFTConfig | GraderSFTConfig:
  """The typed config of an `experiments/sft.py` tree: `GraderSFTConfig` when its `target`
  is the grader, else `PolicySFTConfig`; a `ConfigError` naming the field."""
  if isinstance(config, SFTRunConfig):
    return config
  d = dict(config)
  cls = GraderSFTConfig if d.get("target", "policy") == "grader" else PolicySFTConfig
  return configlib.from_dict(cls, d, "")
