"""Sampler demo: batched KV-cache sampling on a freshly initialised policy model.

The placeholder main job until the RL trainer lands (`make run` runs it).

    python experiments/sample.py --config=configs/sampler_demo.py --workdir=runs/sampler_demo
    python experiments/sample.py --config=configs/sampler_demo.py:size=small \\
        --config.sampling.temperature=0.7 --workdir=runs/demo_small
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, size="tiny")
  config = ml_collections.ConfigDict()
  # Seed for parameter init and sampling keys.
  config.seed = 0
  # Model shape (a preset from gagar_jax/models/presets.py); vocab_size is set from the tokenizer.
  config.model = common.model_config(args.size)
  # Device mesh axis sizes; -1 fills the remaining devices.
  config.mesh = common.mesh_config()
  # Logical-axis -> mesh-axis rules for parameters and batches.
  config.sharding_rules = common.sharding_rules()
  # Multi-host settings (off on one machine).
  config.distributed = common.distributed_config()
  # BPE vocabulary size trained on the demo corpus (bytes + specials + merges).
  config.tokenizer_vocab_size = 512
  # KV-cache slots per conversation.
  config.cache_size = 512
  # How many conversations share one batch.
  config.batch_size = 8
  config.sampling = ml_collections.ConfigDict()
  # Tokens generated per turn at most.
  config.sampling.max_new_tokens = 48
  # 0 = greedy; otherwise logits are divided by it.
  config.sampling.temperature = 1.0
  # Keep the k most likely tokens (0 = off).
  config.sampling.top_k = 0
  # Nucleus mass (1.0 = off).
  config.sampling.top_p = 0.95
  # Timed repetitions for the cache vs re-forward comparison.
  config.timing_repeats = 3
  return config
