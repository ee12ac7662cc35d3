"""The Tunix-matched toy GRPO task, run with Tunix 0.1.7 (the peer in results/performance.md).

Not part of gagar_jax: it runs from a throwaway venv that holds Tunix and never
the project's dependencies:

    python3.11 -m venv /tmp/tunix_venv && /tmp/tunix_venv/bin/pip install google-tunix==0.1.7
    /tmp/tunix_venv/bin/python experiments/tunix_matched.py --json=/tmp/tunix.json

It imports only `grpo_matched_task` (plain Python) from this repository, so both
sides draw the same prompts, tokenize the same bytes and score the same reward.
Tunix side: a Llama-3 decoder (tied embeddings, no biases), `GRPOLearner` on an
`RLCluster` with the vanilla rollout, actor and reference on one device. Tunix
reuses one sampling key by default; here the rollout's seed is advanced every
step. Timings: `generate_s` is the rollout call (tokens back on the host);
`update_s` is the rest of the step (reference log-probs, advantages, update,
weight sync); `step_s` is the time between the ends of consecutive steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpo_matched_task as task  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.llama3 import model as llama3  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

_JSON = flags.DEFINE_string("json", "", "Write the summary here.")
_STEPS = flags.DEFINE_integer("steps", task.STEPS, "GRPO steps (the first 5 are not counted).")
_SEED = flags.DEFINE_integer("seed", 0, "Prompt and sampling seed.")

PROMPT_LEN = 16  # the longest prompt is 14 tokens (bos + "banana orange")


class ByteTokenizer:
  """pad 0, bos 1, eos 2, byte b -> b + 3 (Tunix's sampler prepends bos itself)."""

  def encode(self, text, **kwargs):
    if not isinstance(text, str):  # Tunix's data queue hands numpy string scalars
      text = str(text.item() if hasattr(text, "item") else text)
    return task.encode(text, bos=False)

  def decode(self, ids, **kwargs):
    return task.decode(ids)

  def bos_id(self):
    return task.BOS

  def eos_id(self):
    return task.EOS

  def pad_id(self):
    return task.PAD


def model_config():
  m = task.MODEL
  return llama3.ModelConfig(
    num_layers=m["num_layers"],
    vocab_size=m["vocab_size"],
    embed_dim=m["embed_dim"],
    hidden_dim=m["mlp_dim"],
    num_heads=m["num_heads"],
    head_dim=m["head_dim"],
    num_kv_heads=m["num_kv_heads"],
    rope_theta=int(m["rope_theta"]),
    norm_eps=1e-6,
    weight_tying=m["tie_embeddings"],
  )


def reward_fn(prompts, completions, **kwargs):
  return [task.reward(c) for c in completions]


def main(argv):
  del argv
  mesh = jax.make_mesh(
    (1, 1),
    ("fsdp", "tp"),
    devices=jax.devices()[:1],
    axis_types=(jax.sharding.AxisType.Auto,) * 2,
  )
  with mesh:
    actor = llama3.Llama3(model_config(), rngs=nnx.Rngs(0))
    reference = llama3.Llama3(model_config(), rngs=nnx.Rngs(0))  # the frozen initial parameters
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=task.MAX_NEW_TOKENS,
    max_prompt_length=PROMPT_LEN,
    kv_cache_size=PROMPT_LEN + task.MAX_NEW_TOKENS,
    temperature=task.TEMPERATURE,
    top_p=1.0,
    top_k=None,
    eos_tokens=[task.EOS],
  )
  cluster_config = rl_cluster_lib.ClusterConfig(
    role_to_mesh=dict.fromkeys(rl_cluster_lib.Role, mesh),
    rollout_engine="vanilla",
    offload_to_cpu=False,
    training_config=rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.adamw(task.LEARNING_RATE),
      eval_every_n_steps=10**9,
      max_steps=_STEPS.value + 1,  # one more: a step's time runs from the previous end
      mini_batch_size=task.PROMPTS_PER_STEP,
      train_micro_batch_size=task.PROMPTS_PER_STEP,
    ),
    rollout_config=rollout,
  )
  cluster = rl_cluster_lib.RLCluster(
    actor=actor, reference=reference, tokenizer=ByteTokenizer(), cluster_config=cluster_config
  )
  learner = grpo_learner.GRPOLearner(
    rl_cluster=cluster,
    algo_config=grpo_learner.GRPOConfig(
      num_generations=task.GROUP_SIZE,
      num_iterations=1,
      beta=task.KL_BETA,
      kl_loss_mode="low_var_kl",  # k3
      epsilon=task.CLIP_EPS,
      loss_agg_mode="sequence-mean-token-mean",
    ),
    reward_fns=reward_fn,
  )

  # Timers around the rollout and the update; the rollout's seed advances every call.
  records, marks = [], {"end": None, "gen": 0.0, "tokens": 0, "reward": 0.0}
  generate = cluster.rollout.generate

  def timed_generate(prompts, rollout_config, **kwargs):
    start = time.perf_counter()
    seed = len(records) + 1_000 * _SEED.value
    out = generate(prompts, dataclasses.replace(rollout_config, seed=seed), **kwargs)
    marks["gen"] = time.perf_counter() - start
    marks["tokens"] = sum(len(t) for t in out.tokens)
    marks["reward"] = sum(task.reward(t) for t in out.text) / len(out.text)
    return out

  cluster.rollout.generate = timed_generate
  update = cluster.update_actor

  def timed_update(*args, **kwargs):
    out = update(*args, **kwargs)
    jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
    now = time.perf_counter()
    if marks["end"] is not None:
      step_s = now - marks["end"]
      records.append(
        {
          "step": len(records),
          "step_s": step_s,
          "generate_s": marks["gen"],
          "update_s": step_s - marks["gen"],
          "tokens": marks["tokens"],
          "reward": marks["reward"],
        }
      )
      print(json.dumps({k: round(v, 4) for k, v in records[-1].items()}), flush=True)
    marks["end"] = now
    return out

  cluster.update_actor = timed_update

  def dataset():
    for step in range(_STEPS.value + 1):
      # An array: Tunix repeats every leaf G times with np.repeat (a list would be split).
      yield {"prompts": np.asarray(task.prompts(step, _SEED.value))}

  learner.train(dataset())
  summary = {"peer": "tunix 0.1.7", **task.summarize(records)}
  print(json.dumps(summary, indent=1))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(summary, f, indent=1)


if __name__ == "__main__":
  app.run(main)
