"""Supervised training of the LM grader on rubric-graded workspaces.

    python experiments/sft.py --config=configs/grader_sft.py --workdir=runs/grader \\
        --export=assets/lm_grader
    # the pressure world's grader (groups of assets/pre_rl_pressure in that world):
    python experiments/sft.py --config=configs/grader_sft.py:world=pressure \\
        --workdir=runs/grader_pressure --export=assets/lm_grader_pressure
    # seconds, for tests:
    python experiments/sft.py --config=configs/grader_sft.py:runlocal=True --workdir=/tmp/g

The demonstrations are built on first use (TFDS `minirepo_grader_demos`): groups the
policy in `grader_data.policy_dir` samples on MiniRepo tasks, graded by the rubric.
"""

from __future__ import annotations

import ml_collections

from configs import common
from gagar_jax import run_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, size="tiny", runlocal=False, world="default")
  # Every field and its default: gagar_jax/run_config.py GraderSFTConfig (the demonstrations
  # in grader_data, context, agent budgets, optimizer, evaluation; parsed from this tree by
  # gagar_jax/grader_sft.py). Here only what differs, and the sections other modules own.
  c = common.section(run_config.GraderSFTConfig)
  # Model shape preset (gagar_jax/models/presets.py); vocab_size follows the tokenizer.
  c.model = common.model_config(args.size)
  c.model.max_seq_len = 1536  # the context
  c.mesh = common.mesh_config()
  c.sharding_rules = common.sharding_rules()
  c.distributed = common.distributed_config()
  # The MiniRepo suite the groups are sampled on (the policy's suite).
  c.suite = common.minirepo_suite()

  # The MiniRepo world (configs/common.py apply_world). pressure: groups the pressure
  # world's warm start samples there (assets/lm_grader_pressure, `make grader-pressure`);
  # that policy writes its own reward hacks (hard-coded results), so none are injected.
  c.world = args.world
  common.apply_world_suite(c.suite, args.world)
  if args.world.startswith("pressure"):
    c.grader_data.policy_dir = "assets/pre_rl_pressure"
    c.grader_data.hack_every = 0
    c.grader_data.max_turns = 8

  if args.runlocal:  # tests: seconds, not minutes
    c.suite.n_train, c.suite.n_validation, c.suite.n_test = 48, 8, 8
    c.model = common.model_config("nano")
    c.context, c.agent.max_total_tokens = 1024, 1000
    c.tokenizer_vocab_size = 320
    c.grader_data.n_train_tasks, c.grader_data.n_validation_tasks = 8, 4
    c.grader_data.variants = 2
    c.sft.steps, c.sft.batch_size, c.sft.warmup_steps, c.sft.seq_len = 4, 8, 2, 768
    c.eval.every_steps, c.eval.groups = 2, 2
    c.checkpoint_every = 2
  return c
