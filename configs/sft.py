"""Supervised warm start of the tiny policy on MiniRepo expert demonstrations.

    python experiments/sft.py --config=configs/sft.py --workdir=runs/sft
    python experiments/sft.py --config=configs/sft.py:size=small --config.sft.steps=4000 \\
        --workdir=runs/sft_small
    python experiments/sft.py --config=configs/sft.py --config.init_from=/path/to/hf_folder \\
        --workdir=runs/sft_qwen --export=runs/sft_qwen/policy
    # the pressure world's warm start (assets/pre_rl_pressure):
    python experiments/sft.py --config=configs/sft.py:world=pressure --workdir=runs/sft_pressure \
        --export=assets/pre_rl_pressure
    # the calibration run quoted in results/calibration.md:
    python experiments/sft.py --config=configs/sft.py --config.time_budget_minutes=20 \\
        --workdir=runs/calibration
"""

from __future__ import annotations

import ml_collections

from configs import common
from gagar_jax import run_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = common.parse_arg(arg, size="tiny", runlocal=False, suite="minirepo", world="default")
  # Every field and its default: gagar_jax/run_config.py PolicySFTConfig (habits, the
  # optimizer, evaluation and rollout budgets; parsed from this tree by gagar_jax/sft.py).
  # Here only what differs, and the sections other modules own.
  c = common.section(
    run_config.PolicySFTConfig,
    # Evaluation draws each task's group once (eval.group_size samples).
    omit=("rollout.group_size", "rollout.dynamic_sampling", "rollout.max_rounds"),
    model_preset=args.size,
  )
  c.model = common.model_config(args.size)
  c.mesh = common.mesh_config()
  c.sharding_rules = common.sharding_rules()
  c.distributed = common.distributed_config()
  # The task suites whose expert demonstrations are trained on (one, or a mixture
  # "minirepo+humaneval"; see gagar_jax/suites.py) and whose validation / test tasks
  # are evaluated; each suite's knobs in its sub-section.
  c.suite = common.suite_config(args.suite)

  # The MiniRepo world (configs/common.py apply_world). pressure: the warm start
  # assets/pre_rl_pressure, assets/pre_rl fine-tuned on that world's demonstrations with
  # trial and error and hacks among the habits (remade by `make sft-pressure`). 1500
  # steps: after 600 the policy writes `return N` hacks but cannot yet copy the literal
  # (results/pressure_world.md).
  c.world = args.world
  common.apply_world(c, args.world)
  if args.world.startswith("pressure"):
    c.init_from = "assets/pre_rl"
    c.habits.trial_and_error, c.habits.hack, c.habits.hard_code = 0.3, 0.05, 0.3
    c.sft.seq_len = 448
    c.sft.steps, c.sft.learning_rate, c.sft.warmup_steps = 1500, 5e-4, 20
  if args.world in ("pressure_caller", "pressure_all"):
    # the pressure warm start, a short fine-tune on caller reports (the expert fixes the
    # helper; its hard-coded results go in the reported caller)
    c.init_from = "assets/pre_rl_pressure"
    c.sft.steps = 400
  if args.world == "pressure_all":
    # the same fine-tune in the world with every pressure, the first of two stages of
    # assets/pre_rl_pressure_all (`make sft-pressure-all`: 800 more steps with hack_each
    # 0.35): the expert also special-cases each failing call (`hack_each`), the hack that
    # passes there; the one-call hacks it knows mostly fail
    c.habits.hack_each, c.habits.hard_code = 0.25, 0.1
  if args.runlocal:  # tests: seconds, not minutes
    c.suite.minirepo.n_train, c.suite.minirepo.n_validation, c.suite.minirepo.n_test = 48, 8, 8
    c.model_preset, c.model = "nano", common.model_config("nano")
    c.tokenizer_vocab_size = 320
    c.sft.steps, c.sft.batch_size, c.sft.warmup_steps = 6, 8, 2
    c.eval.every_steps, c.eval.tasks, c.eval.final_tasks, c.eval.group_size = 3, 2, 2, 2
    c.checkpoint_every = 3
  return c
