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

    # the powered sweep (results/ablations.md): 6 arms x 4 seeds x 150 steps, final test
    # 256 tasks x 8 samples paired across arms, out-of-distribution tasks; hours of CPU,
    # resumable: each finished run's record is kept in results/sweeps/powered_<world>/
    python experiments/reproduce_ablations.py \\
        --sweep=configs/sweeps/ablations.py:preset=powered,world=pressure --max_runs=2

    # the second, cheaper setting: the same preset in the default world, 4 arms x 4 seeds
    # (records in results/sweeps/powered_default/, report results/ablations_default.md)
    python experiments/reproduce_ablations.py --report=ablations_default \\
        --sweep=configs/sweeps/ablations.py:preset=powered,world=default --max_runs=2

Presets: small (4 arms x 3 seeds within 90 minutes on 2 CPU cores), powered (the powered
sweep), runlocal (tests). world=default|pressure|pressure_caller|pressure_all picks the
MiniRepo world (configs/common.py apply_world).

    # the world with every pressure (results/ablations_pressure_all.md, 6 arms x 4 seeds):
    python experiments/reproduce_ablations.py --report=ablations_pressure_all \\
        --sweep=configs/sweeps/ablations.py:preset=powered,world=pressure_all --max_runs=2
"""

from configs import common
from gagar_jax.arms import ARMS

# The arms of the small sweep (results/ablations_small.md); gagar_paper (the paper's tiered
# protocol) and gagar_lm are added with arms=...+gagar_paper.
DEFAULT_ARMS = ("grpo", "gagar", "gagar_no_rescale", "reward_shaping")
# The powered sweep's arms (issue 18): every claim's comparison.
POWERED_ARMS = ("grpo", "gagar", "gagar_paper", "gagar_no_rescale", "reward_shaping", "gagar_lm")
# The powered sweep in the default world (the cheaper second setting): its full hidden tests
# fail nearly every hack, so the tiered protocol's hack tier has nothing to act on, and the LM
# grader's arm was measured there by the small sweep; 16 runs instead of 24.
POWERED_DEFAULT_ARMS = DEFAULT_ARMS
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
    "suite.minirepo.n_train": 48,
    "suite.minirepo.n_validation": 8,
    "suite.minirepo.n_test": 8,
  },
  # 150 RL steps; validation 32 tasks x 8 every 25 steps; final test 256 tasks x 8 samples
  # (the same tasks and sampling key for every arm of a seed)
  "powered": {
    "steps": 150,
    "num_groups": 6,
    "eval.every_steps": 25,
    "eval.tasks": 32,
    "eval.group_size": 8,
    "eval.final_tasks": 256,
    "suite.minirepo.n_test": 256,
    "checkpoint_every": 25,
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
  args = common.parse_arg(arg, preset="small", seeds=0, runlocal=False, arms="", world="default")
  powered = args.preset == "powered"
  seeds = list(range(args.seeds or (4 if powered else 3)))
  if args.world not in common.WORLDS:
    raise ValueError(f"world={args.world!r}: must be one of {common.WORLDS}")
  if not args.arms:
    if powered:
      args.arms = "+".join(POWERED_DEFAULT_ARMS if args.world == "default" else POWERED_ARMS)
    else:
      args.arms = "+".join(DEFAULT_ARMS)
  arms = args.arms.split("+")
  for arm in arms:
    if arm not in ARM_CONFIGS:
      raise ValueError(f"arms: unknown arm {arm!r} (known: {sorted(ARM_CONFIGS)})")
  if args.preset not in PRESETS:
    raise ValueError(f"preset={args.preset!r}: must be one of {sorted(PRESETS)}")
  runs = []
  # Seed-major: a partial sweep has every arm at its first seeds.
  for seed in seeds:
    for arm in arms:
      config = f"configs/gagar.py:{ARM_CONFIGS[arm]},seed={seed}"
      if args.world != "default":
        config += f",world={args.world}"
      overrides = PRESETS["runlocal" if args.runlocal else args.preset]
      runs.append(
        {"name": f"{arm}_s{seed}", "arm": arm, "config": config, "overrides": dict(overrides)}
      )
  name = f"{'runlocal' if args.runlocal else args.preset}_{args.world}"
  return {"runs": runs, "seeds": seeds, "name": name, "world": args.world}
