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
from gagar_jax import sft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, size="tiny", runlocal=False, world="default")
  c = ml_collections.ConfigDict()
  # What experiments/sft.py trains: the grader (configs/sft.py trains the policy).
  c.target = "grader"
  # Seed for parameter init, data order and group sampling.
  c.seed = 0
  # Where TFDS datasets are built and read (built on first use).
  c.data_dir = "data/tfds"
  # Stop training after this many minutes even if sft.steps is not reached (0 = no limit).
  c.time_budget_minutes = 0.0
  # Model shape preset (gagar_jax/models/presets.py); vocab_size follows the tokenizer.
  c.model = common.model_config(args.size)
  c.model.max_seq_len = 1536  # the context below
  # BPE vocabulary trained on the grader demonstrations.
  c.tokenizer_vocab_size = 512
  c.mesh = common.mesh_config()
  c.sharding_rules = common.sharding_rules()
  c.distributed = common.distributed_config()
  # The MiniRepo suite the groups are sampled on (the policy's suite).
  c.suite = common.minirepo_suite()

  c.grader_data = ml_collections.ConfigDict()
  # The policy whose sampled groups are graded (an exported policy folder).
  c.grader_data.policy_dir = "assets/pre_rl"
  # Train tasks sampled (groups with >= 2 passing become demonstrations) and held-out
  # validation tasks (their gradable groups measure agreement).
  c.grader_data.n_train_tasks = 400
  c.grader_data.n_validation_tasks = 64
  # Samples per task.
  c.grader_data.group_size = 8
  # Demonstrations per train group: the full group `full_copies` times (fresh candidate
  # ids each) + random passing subsets.
  c.grader_data.variants = 4
  c.grader_data.full_copies = 2
  # Every k-th task (train and validation) has weak hidden tests and 1-2 of its samples
  # swapped for the scripted expert's reward hack, so the grader sees hacks (0: never).
  c.grader_data.hack_every = 4
  # Turns per sampled episode (the policy's rollout.max_turns).
  c.grader_data.max_turns = 6

  # Model context (KV-cache slots) when grading, and the cut of each tool output in
  # tokens (the same cut is used when encoding the demonstrations).
  c.context = 1536
  c.max_obs_tokens = 96

  # The grading agent's budgets (gagar_jax/grading/agent.py).
  c.agent = common.grader_agent()

  # The optimizer and batches (gagar_jax/sft.py SFTConfig): sequences long enough for the
  # largest groups' demonstrations (8 passing candidates, tiers), 800 steps, context
  # tokens weighing 0.1.
  c.sft = common.section(sft.SFTConfig, seq_len=1536, steps=800, context_loss_weight=0.1)

  c.eval = ml_collections.ConfigDict()
  # Agreement on this many held-out groups every `every_steps` (all of them at the end).
  c.eval.every_steps = 300
  c.eval.groups = 24

  # Checkpoints under workdir/checkpoints.
  c.checkpoint_every = 250
  # Resuming a workdir with a config that differs outside gagar_jax/workdir.py's
  # SAFE_ON_RESUME fields is refused; True goes on anyway (logged in config_changes.jsonl).
  c.resume_override = False

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
