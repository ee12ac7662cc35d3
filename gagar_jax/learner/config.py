"""The learner's config sections (`config.learner` in an experiment config)."""

from __future__ import annotations

import dataclasses

from gagar_jax import advantages
from gagar_jax.configlib import check, from_dict, one_of
from gagar_jax.errors import ConfigError
from gagar_jax.learner import losses

SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  learning_rate: float = 1e-4
  schedule: str = "cosine"
  warmup_steps: int = 0
  total_steps: int = 1000
  min_lr_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0

  def __post_init__(self):
    check(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
    one_of(self.schedule, SCHEDULES, "schedule")
    check(self.warmup_steps >= 0, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
    check(self.total_steps > 0, "total_steps", f"must be > 0, got {self.total_steps}")
    check(
      self.warmup_steps <= self.total_steps,
      "warmup_steps",
      f"{self.warmup_steps} exceeds total_steps={self.total_steps}",
    )
    check(
      0 <= self.min_lr_ratio <= 1, "min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}"
    )
    check(0 <= self.b1 < 1, "b1", f"must be in [0, 1), got {self.b1}")
    check(0 <= self.b2 < 1, "b2", f"must be in [0, 1), got {self.b2}")
    check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
    check(self.max_grad_norm > 0, "max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclasses.dataclass(frozen=True)
class LossConfig:
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float = 0.0
  agg: str = "token_mean"
  kl: str = "off"
  kl_coef: float = 0.0
  max_tokens: int = 0

  def __post_init__(self):
    check(0 < self.eps_low < 1, "eps_low", f"must be in (0, 1), got {self.eps_low}")
    check(self.eps_high > 0, "eps_high", f"must be > 0, got {self.eps_high}")
    check(
      self.dual_clip == 0 or self.dual_clip > 1,
      "dual_clip",
      f"must be 0 (off) or > 1, got {self.dual_clip}",
    )
    one_of(self.agg, losses.AGG_MODES, "agg")
    one_of(self.kl, losses.KL_MODES, "kl")
    check(self.kl_coef >= 0, "kl_coef", f"must be >= 0, got {self.kl_coef}")
    check(
      self.kl != "off" or self.kl_coef == 0,
      "kl_coef",
      f"is {self.kl_coef} but kl='off'; set kl to 'k1' or 'k3'",
    )
    check(self.max_tokens >= 0, "max_tokens", f"must be >= 0, got {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  # "rank": the grader's ranks weight the passing advantages (rank -> weight scheme, sum
  # preserved); "tiered": the paper's protocol (tiers and tied ranks -> quality factors,
  # confirmed hacks reset to 0, r - mean(r) base, rescale capped at lambda_max).
  mode: str = "rank"
  estimator: str = "grpo"
  eps: float = 1e-6
  redistribute: bool = True
  preserve_sum: bool = True
  scheme: str = "linear"
  # The scheme's one parameter: linear floor, exponential decay, reciprocal power.
  scheme_param: float = 0.5
  # tiered: the rescale cap (inf = exact sum preservation), the quality factors, and
  # whether confirmed reward hacks count as failing.
  lambda_max: float = 1.5
  f_runner: float = 0.9
  f_max: float = 0.85
  f_min: float = 0.4
  f_low: float = 0.2
  hacks: bool = True

  def __post_init__(self):
    one_of(self.mode, ("rank", "tiered"), "mode")
    check(self.lambda_max >= 1, "lambda_max", f"must be >= 1, got {self.lambda_max}")
    check(
      1 >= self.f_runner >= self.f_max >= self.f_min >= self.f_low > 0,
      "f_runner",
      "the factors need 1 >= f_runner >= f_max >= f_min >= f_low > 0, got "
      f"{self.f_runner}, {self.f_max}, {self.f_min}, {self.f_low}",
    )
    one_of(self.estimator, advantages.ESTIMATORS, "estimator")
    one_of(self.scheme, tuple(advantages.SCHEMES), "scheme")
    try:
      advantages.scheme_param(self.scheme, self.scheme_kwargs)
    except ValueError as e:
      raise ConfigError("scheme_param", str(e)) from None

  @property
  def scheme_kwargs(self) -> dict:
    return {advantages.SCHEMES[self.scheme][0]: self.scheme_param}


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
  # Micro-batches per step (gradient accumulation); must divide the number of groups.
  micro_batches: int = 1
  # Run the update as separate jitted programs (per length bucket a forward + residuals
  # and a backward, then the optimizer): "auto" does so on CPU with one micro-batch,
  # where it is 1.5x faster than the fused program.
  split_step: str = "auto"
  # Sort the batch's trajectories by length and run the loss over this many equal parts,
  # each cut to its own longest trajectory (rounded up to 64 tokens): the same update over
  # fewer padded positions (rollouts' episodes vary from ~100 tokens to the budget). 1:
  # off; with micro_batches > 1 it is off.
  length_buckets: int = 4

  def __post_init__(self):
    check(self.micro_batches >= 1, "micro_batches", f"must be >= 1, got {self.micro_batches}")
    check(self.length_buckets >= 1, "length_buckets", f"must be >= 1, got {self.length_buckets}")
    one_of(self.split_step, ("auto", "on", "off"), "split_step")
    check(
      not (self.split_step == "on" and self.micro_batches > 1),
      "split_step",
      "'on' needs micro_batches == 1 (the micro-batch scan runs fused)",
    )

  @classmethod
  def from_dict(cls, d, prefix: str = "learner") -> LearnerConfig:
    return from_dict(cls, d, prefix)
