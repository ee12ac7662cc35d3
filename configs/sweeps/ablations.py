"""The ablation grid: every arm x seeds (experiments/reproduce_ablations.py).

    python experiments/reproduce_ablations.py --sweep=configs/sweeps/ablations.py:preset=small

Presets: small (4 arms x 3 seeds within 90 minutes on 2 CPU cores), runlocal (tests).
"""

from configs import common

ARMS = ("grpo", "gagar", "gagar_no_rescale", "reward_shaping")
PRESETS = {
  # a first look in ~40 minutes (too few steps to test the claims well)
  "quick": {
    "steps": 12,
    "num_groups": 6,
    "eval.every_steps": 6,
    "eval.tasks": 24,
    "eval.final_tasks": 48,
    "checkpoint_every": 6,
  },
  # steps, groups per step, eval tasks, final test tasks
  "small": {
    "steps": 24,
    "num_groups": 6,
    "eval.every_steps": 8,
    "eval.tasks": 24,
    "eval.final_tasks": 48,
    "checkpoint_every": 8,
  },
  # seconds per run, for checking the pipeline
  "runlocal": {
    "steps": 2,
    "num_groups": 2,
    "rollout.group_size": 4,
    "eval.every_steps": 1,
    "eval.tasks": 2,
    "eval.final_tasks": 2,
    "eval.group_size": 2,
    "checkpoint_every": 1,
  },
  "full": {
    "steps": 60,
    "num_groups": 8,
    "eval.every_steps": 10,
    "eval.tasks": 48,
    "eval.final_tasks": 128,
    "checkpoint_every": 10,
  },
}


def get_sweep(arg=None):
  args = common.parse_arg(arg, preset="small", seeds=3, runlocal=False)
  seeds = list(range(args.seeds))
  runs = []
  for arm in ARMS:
    for seed in seeds:
      config = f"configs/gagar.py:arm={arm},seed={seed}"
      overrides = PRESETS["runlocal" if args.runlocal else args.preset]
      runs.append(
        {"name": f"{arm}_s{seed}", "arm": arm, "config": config, "overrides": dict(overrides)}
      )
  return {"runs": runs, "seeds": seeds}
