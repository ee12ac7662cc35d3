"""`Learner`: the optimizer, sharded train state, jitted step and log-prob function together."""

from __future__ import annotations

import jax
import numpy as np

from gagar_jax import sharding
from gagar_jax.learner import step as step_lib
from gagar_jax.learner import train_state
from gagar_jax.learner.config import LearnerConfig
from gagar_jax.models import transformer


class Learner:
  """Owns everything device-side that an RL step needs.

  Usage:
    learner = Learner(LearnerConfig.from_dict(config.learner), model_config, mesh)
    state = learner.init(seed=0)                     # or init(seed, params=sft_params)
    old = learner.logprobs(state.params, tokens)     # [N, G, T]
    state, metrics = learner.step(state, batch)      # batch: step.Batch of host arrays
  """

  def __init__(
    self,
    config: LearnerConfig,
    model_config: transformer.ModelConfig,
    mesh: jax.sharding.Mesh,
    rules=None,
  ):
    self.config, self.model_config, self.mesh, self.rules = config, model_config, mesh, rules
    self.optimizer = train_state.make_optimizer(config.optim)
    self.graphdef, self.abstract_state, self.state_shardings = train_state.state_shardings(
      model_config, self.optimizer, mesh, rules
    )
    self.train_step = step_lib.make_train_step(
      config, self.graphdef, self.optimizer, self.state_shardings, mesh, rules
    )
    self._logprobs = step_lib.make_logprob_fn(
      self.graphdef, self.state_shardings.params, mesh, rules
    )

  def init(self, seed: int, params=None) -> train_state.TrainState:
    return train_state.init_train_state(
      self.model_config, self.optimizer, self.state_shardings, seed, params
    )

  def shard_batch(self, batch: step_lib.Batch, process_local: bool = False) -> step_lib.Batch:
    """Checks a host batch and lays it out over the mesh (groups over the batch axes).

    With `process_local`, `batch` holds only this process's groups (multi-host).
    """
    if not process_local:
      step_lib.check_batch(batch, self.mesh, self.config.micro_batches, self.rules)
    host = step_lib.Batch(
      *(
        np.asarray(x, dtype)
        for x, dtype in zip(batch.with_grade_defaults(), step_lib.Batch.DTYPES, strict=True)
      )
    )
    if process_local:
      device = sharding.shard_local_batch(host, self.mesh, self.rules)
      step_lib.check_batch(device, self.mesh, self.config.micro_batches, self.rules)
      return device
    return sharding.shard_batch(host, self.mesh, self.rules, field="batch.groups")

  def logprobs(self, params, tokens) -> jax.Array:
    """Log-probs `[N, G, T]` of `tokens [N, G, T]` under `params` (0 at t = 0)."""
    if not isinstance(tokens, jax.Array):
      tokens = sharding.shard_batch(np.asarray(tokens, np.int32), self.mesh, self.rules)
    return self._logprobs(params, tokens)

  def step(
    self, state: train_state.TrainState, batch: step_lib.Batch, on_policy=False, lengths=None
  ):
    """One update; returns (new state, metrics as Python floats). Raises on non-finite.

    `on_policy`: the batch was sampled by `state.params` and this is its first update;
    `batch.old_logprobs` is then not read. `lengths` (host `[N, G]`, tokens per
    trajectory): lets the update skip padding (`learner.length_buckets`). See
    `step.TrainStep`."""
    if not isinstance(batch.tokens, jax.Array) or batch.graded is None:
      batch = self.shard_batch(batch)
    step = int(state.step)
    state, metrics = self.train_step(state, batch, on_policy, lengths)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    step_lib.check_finite(metrics, step, state)
    return state, metrics
