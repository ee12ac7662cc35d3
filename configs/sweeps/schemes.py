"""The rank-to-weight schemes of GAGAR, each with a few parameters (one seed each).

    python experiments/reproduce_ablations.py --sweep=configs/sweeps/schemes.py \\
        --root=runs/schemes --results=results/schemes
"""

from configs import common

GRID = {"linear": (0.25, 0.5, 0.75), "exponential": (0.3, 0.6), "reciprocal": (0.5, 1.0)}


def get_sweep(arg=None):
  args = common.parse_arg(arg, seed=0, steps=24)
  runs = []
  for scheme, params in GRID.items():
    for p in params:
      runs.append(
        {
          "name": f"{scheme}_{p:g}",
          "arm": f"{scheme}_{p:g}",
          "config": f"configs/gagar.py:arm=gagar,seed={args.seed}",
          "overrides": {
            "learner.advantage.scheme": scheme,
            "learner.advantage.scheme_param": p,
            "steps": args.steps,
            "num_groups": 6,
            "eval.every_steps": 8,
            "eval.tasks": 24,
            "eval.final_tasks": 48,
          },
        }
      )
  return {"runs": runs, "seeds": [args.seed]}
