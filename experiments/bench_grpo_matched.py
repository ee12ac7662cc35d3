"""`bench.py --sections=grpo_matched`: toy GRPO on the Tunix-matched configuration.

Written against gagar_jax's public API only (`Sampler` + `Learner`), the way a
user would write a GRPO loop: each step samples 4 prompts x G = 4, scores them,
computes reference log-probs under a frozen copy of the initial parameters and
takes one PPO-clip + KL k3 update. The configuration lives in
`grpo_matched_task.py`, shared with `tunix_matched.py` (the same work in Tunix).
"""

from __future__ import annotations

import time

import grpo_matched_task as task
import jax
import numpy as np

from gagar_jax import sharding
from gagar_jax.learner.config import AdvantageConfig, LearnerConfig, LossConfig, OptimConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch
from gagar_jax.models import sampler as sampler_lib
from gagar_jax.models import transformer

# Longest prompt (bos + "banana orange": 14 tokens) + 64 new tokens.
SEQ_LEN = 14 + 64


def learner_config() -> LearnerConfig:
  return LearnerConfig(
    # optax.adamw's defaults (b2 0.999, weight decay 1e-4), constant lr, no clipping.
    optim=OptimConfig(
      learning_rate=task.LEARNING_RATE,
      schedule="constant",
      b2=0.999,
      weight_decay=1e-4,
      max_grad_norm=1e9,
    ),
    loss=LossConfig(
      eps_low=task.CLIP_EPS,
      eps_high=task.CLIP_EPS,
      kl="k3",
      kl_coef=task.KL_BETA,
      agg="seq_mean_token_mean",
    ),
    advantage=AdvantageConfig(estimator="grpo", redistribute=False),
  )


def run(steps: int = task.STEPS, seed: int = 0, log=None) -> list[dict]:
  """Runs `steps` GRPO steps; returns one timing record per step."""
  n, g, t = task.PROMPTS_PER_STEP, task.GROUP_SIZE, SEQ_LEN
  model_config = transformer.ModelConfig(**task.MODEL, dtype="float32", max_seq_len=t)
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  learner = Learner(learner_config(), model_config, mesh)
  state = learner.init(seed)
  # The frozen reference: the initial parameters in buffers of their own (the step
  # donates the state, so the reference must not alias it).
  ref_params = jax.device_put(state.params, learner.state_shardings.params, may_alias=False)
  sampler = sampler_lib.Sampler(model_config, learner.graphdef, cache_size=t, pad_id=task.PAD)
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=task.MAX_NEW_TOKENS, temperature=task.TEMPERATURE, eos_id=task.EOS
  )
  key = jax.random.key(seed)
  records = []
  for step in range(steps):
    start = time.perf_counter()
    prompts = [task.encode(p) for p in task.prompts(step, seed) for _ in range(g)]
    key, sub = jax.random.split(key)
    sampled = sampler.generate(state.params, sampler.prefill(state.params, prompts), sub, sampling)
    out = jax.device_get(sampled[1])
    generated = time.perf_counter()

    tokens = np.zeros((n * g, t), np.int32)
    mask = np.zeros((n * g, t), bool)
    old = np.zeros((n * g, t), np.float32)
    rewards = np.zeros((n * g,), np.float32)
    for i, p in enumerate(prompts):
      k = int(out.num_tokens[i])
      tokens[i, : len(p)] = p
      tokens[i, len(p) : len(p) + k] = out.tokens[i, :k]
      mask[i, len(p) : len(p) + k] = True
      old[i, len(p) : len(p) + k] = out.logprobs[i, :k]
      rewards[i] = task.reward(task.decode(out.tokens[i, :k]))
    shape = lambda x: x.reshape((n, g) + x.shape[1:])
    batch = learner.shard_batch(
      Batch(
        shape(tokens),
        shape(mask),
        shape(old),  # the sampler's log-probs are the old policy's (one update per batch)
        np.zeros((n, g, t), np.float32),
        shape(rewards),
        shape(rewards > 0),
        np.zeros((n, g), np.int32),
        np.ones((n, g), bool),
      )
    )
    batch = batch._replace(ref_logprobs=learner.logprobs(ref_params, batch.tokens))
    state, metrics = learner.train_step(state, batch)
    loss = float(metrics["loss"])  # waits for the update
    end = time.perf_counter()
    record = {
      "step": step,
      "step_s": end - start,
      "generate_s": generated - start,
      "update_s": end - generated,
      "tokens": int(out.num_tokens.sum()),
      "reward": float(rewards.mean()),
      "loss": loss,
      "kl": float(metrics["kl"]),
    }
    records.append(record)
    if log:
      log(record)
  return records
