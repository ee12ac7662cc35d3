"""Shared builders for learner tests and their subprocess workers."""

import numpy as np

from gagar_jax.learner.config import LearnerConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch
from gagar_jax.models import presets, transformer


def nano_config() -> transformer.ModelConfig:
  return transformer.ModelConfig.from_dict(presets.get("nano"))


def make_learner(mesh, **overrides) -> Learner:
  d = {"optim": {"learning_rate": 3e-3, "warmup_steps": 0, "schedule": "constant"}}
  for key, value in overrides.items():
    d[key] = {**d.get(key, {}), **value} if isinstance(value, dict) else value
  return Learner(LearnerConfig.from_dict(d), nano_config(), mesh)


def synthetic_batch(position: int, n: int = 8, g: int = 4, t: int = 24, vocab: int = 96) -> Batch:
  """A deterministic rollout batch for data position `position` (no log-probs yet)."""
  rng = np.random.default_rng(1000 + position)
  tokens = rng.integers(0, vocab, (n, g, t)).astype(np.int32)
  mask = np.zeros((n, g, t), bool)
  mask[..., 8:20] = True
  passed = rng.random((n, g)) < 0.5
  ranks = rng.integers(0, 3, (n, g)).astype(np.int32)
  valid = rng.random((n, g)) < 0.95
  zeros = np.zeros((n, g, t), np.float32)
  return Batch(tokens, mask, zeros, zeros, passed.astype(np.float32), passed, ranks, valid)


def with_logprobs(learner: Learner, state, batch: Batch) -> Batch:
  """On-policy: old (and reference) log-probs from the current parameters."""
  old = np.asarray(learner.logprobs(state.params, batch.tokens))
  return batch._replace(old_logprobs=old, ref_logprobs=old)


def assert_params_close(actual, desired) -> None:
  """Parameters after AdamW steps, computed with reductions summed in another order
  (sharded vs single device). AdamW's early updates are about lr * g / |g| (lr 3e-3 here),
  so an element whose gradient is near zero can move by a fraction of lr when the order
  changes (seen: 1.3e-5 on 1 of 2048 elements). A real sharding error moves many elements
  by O(lr): bound every element at 1e-4 (3% of one step) and all but 1% of them at 1e-5."""
  actual, desired = np.asarray(actual), np.asarray(desired)
  np.testing.assert_allclose(actual, desired, rtol=0, atol=1e-4)
  loose = np.mean(np.abs(actual - desired) > 1e-5 + 1e-7 * np.abs(desired))
  assert loose <= 0.01, f"{loose:.2%} of the elements differ by more than 1e-5"
