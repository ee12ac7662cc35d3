"""The confirmatory sweep (results/preregistration.md): GRPO and GAGAR, 12 fresh seeds.

    # run by run, resumable: each finished run's record goes to
    # results/sweeps/confirmatory_pressure_all/ and is skipped at the next sitting
    python experiments/reproduce_ablations.py --sweep=configs/sweeps/confirmatory.py \\
        --report=confirmatory_progress --max_runs=1
    # the pre-registered analysis (refuses until all 24 runs are recorded)
    python experiments/confirmatory.py

The `pressure_all` world, warm start and powered config of the pilot
(`configs/sweeps/ablations.py:preset=powered,world=pressure_all`, seeds 0-3) unchanged,
except the final test: 512 test tasks x 8 samples, paired across the two arms (the same
tasks and sampling key for both arms of a seed).
"""

from configs import common
from configs.sweeps import ablations

ARMS = ("grpo", "gagar")
SEEDS = tuple(range(4, 16))  # the pilot used 0-3
WORLD = "pressure_all"
OVERRIDES = {
  **ablations.PRESETS["powered"],
  "eval.final_tasks": 512,
  "suite.minirepo.n_test": 512,
}


def get_sweep(arg=None):
  args = common.parse_arg(arg, runlocal=False, seeds="")
  seeds = [int(s) for s in args.seeds.split("+")] if args.seeds else list(SEEDS)
  overrides = ablations.PRESETS["runlocal"] if args.runlocal else OVERRIDES
  runs = []
  for seed in seeds:  # seed-major: a partial sweep has both arms of its first seeds
    for arm in ARMS:
      config = f"configs/gagar.py:{ablations.ARM_CONFIGS[arm]},seed={seed},world={WORLD}"
      runs.append(
        {"name": f"{arm}_s{seed}", "arm": arm, "config": config, "overrides": dict(overrides)}
      )
  name = f"{'runlocal' if args.runlocal else 'confirmatory'}_{WORLD}"
  return {"runs": runs, "seeds": seeds, "name": name, "world": WORLD}
