"""The ablation grid: every arm x seeds (experiments/reproduce_ablations.py).

    python experiments/reproduce_ablations.py --sweep=configs/sweeps/ablations.py:preset=small

    # the LM-grader arm (GAGAR with the SFT-trained grader of assets/lm_grader), same root:
    python experiments/reproduce_ablations.py \\
        --sweep=configs/sweeps/ablations.py:preset=small,arms=gagar_lm --root=runs/ablations_small
    # aggregate every arm (arms joined by '+'):
    python experiments/reproduce_ablations.py --aggregate_only --root=runs/ablations_small \\
        --sweep=configs/sweeps/ablations.py:preset=small,arms=grpo+gagar+gagar_no_rescale+reward_shaping+gagar_lm

    # the paper's tiered protocol beside them:
    python experiments/reproduce_ablations.py --root=runs/ablations_small \\
        --sweep=configs/sweeps/ablations.py:preset=small,arms=gagar_paper

Presets: small (4 arms x 3 seeds within 90 minutes on 2 CPU cores), runlocal (tests).
"""

from configs import common
from gagar_jax.arms import ARMS

# The arms of the committed sweep (results/ablations.md); gagar_paper (the paper's tiered
# protocol) and gagar_lm are added with arms=...+gagar_paper.
DEFAULT_ARMS = ("grpo", "gagar", "gagar_no_rescale", "reward_shaping")
# Sweep arm name -> config arg of configs/gagar.py.
ARM_CONFIGS = {
  **{arm: f"arm={arm}" for arm in ARMS},
  "gagar_lm": "arm=gagar,grader=lm",
}
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
  args = common.parse_arg(arg, preset="small", seeds=3, runlocal=False, arms="+".join(DEFAULT_ARMS))
  seeds = list(range(args.seeds))
  arms = args.arms.split("+")
  for arm in arms:
    if arm not in ARM_CONFIGS:
      raise ValueError(f"arms: unknown arm {arm!r} (known: {sorted(ARM_CONFIGS)})")
  if args.preset not in PRESETS:
    raise ValueError(f"preset={args.preset!r}: must be one of {sorted(PRESETS)}")
  runs = []
  for arm in arms:
    for seed in seeds:
      config = f"configs/gagar.py:{ARM_CONFIGS[arm]},seed={seed}"
      overrides = PRESETS["runlocal" if args.runlocal else args.preset]
      runs.append(
        {"name": f"{arm}_s{seed}", "arm": arm, "config": config, "overrides": dict(overrides)}
      )
  return {"runs": runs, "seeds": seeds}
