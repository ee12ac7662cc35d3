"""The `make run` RL step of two source trees, alternating in one sitting (issue 48's measure).

    git worktree add /tmp/old 25ce2e7
    python experiments/step_ab.py --trees=/tmp/old,. --rounds=2

Each round runs `experiments/train.py --config=configs/gagar.py:demo=True --config.steps=10`
once per tree (in the tree's own directory, with its own code and its own persistent
compilation cache under `--cache_root`, warmed by a first unrecorded run), then prints per
run the median `train/step_s`, `train/rollout_s` and `train/update_s` of steps 4-10 and the
first four steps' pass rates and losses (the learning must not change), and at the end the
medians over rounds and their ratio. Runs take 2-4 minutes each on 2 cores; keep the machine
otherwise idle.

`--seeds=1,2` then runs each tree's first four steps with those seeds too and prints each
step's mean pass rate and loss over the seeds, with their spread: the sampling noise a
changed tree's first steps are judged against. `--out=FILE` keeps every run's per-step rows.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from gagar_jax import cli
from gagar_jax.errors import ConfigError

_TREES = flags.DEFINE_list("trees", None, "Two (or more) source trees; the first is the baseline.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternating rounds (each runs every tree once).")
_STEPS = flags.DEFINE_integer("steps", 10, "RL steps per run (medians over steps 4..steps).")
_WARM = flags.DEFINE_bool("warm", True, "First run each tree once, unrecorded, to fill its cache.")
_SEEDS = flags.DEFINE_list("seeds", [], "Extra config seeds: first four steps of each tree.")
_OUT = flags.DEFINE_string("out", None, "A JSON file for every run's per-step rows.")
_KEPT = ("step_s", "rollout_s", "update_s", "rounds", "pass_rate", "loss", "episode_tokens")
_CACHE_ROOT = flags.DEFINE_string(
  "cache_root", os.path.join(tempfile.gettempdir(), "step_ab_cache"), "Per-tree caches here."
)

# Runs a script with the package and configs of the tree given first (not the installed one).
_BOOT = """
import os, runpy, sys
tree, script = sys.argv[1], sys.argv[2]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:0] = [os.path.join(tree, os.path.dirname(script)), tree]
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(os.path.join(tree, script), run_name="__main__")
"""


def run_tree(tree: str, index: int, workdir: str, steps: int | None = None, seed: int = 0) -> dict:
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(_CACHE_ROOT.value, str(index)))
  steps = steps or _STEPS.value
  args = [
    "experiments/train.py",
    "--config=configs/gagar.py:demo=True",
    f"--config.steps={steps}",
    f"--config.seed={seed}",
    f"--workdir={workdir}",
  ]
  subprocess.run(
    [sys.executable, "-c", _BOOT, os.path.abspath(tree), *args],
    cwd=tree,
    env=env,
    check=True,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = {r["step"]: r for r in map(json.loads, f) if "train/step_s" in r}
  later = [rows[s] for s in range(4, steps + 1) if s in rows]
  med = {k: statistics.median(r[f"train/{k}"] for r in later) for k in ("step_s", "rollout_s")}
  med["update_s"] = statistics.median(r.get("train/update_s", 0.0) for r in later)
  med["first4"] = [
    (round(rows[s]["train/pass_rate"], 3), round(rows[s]["train/loss"], 4)) for s in range(1, 5)
  ]
  med["rows"] = [{"step": s, **{k: rows[s].get(f"train/{k}") for k in _KEPT}} for s in sorted(rows)]
  return med


def seed_noise(trees) -> dict:
  """Each tree's first four steps under every seed of `--seeds` (and seed 0's timing runs)."""
  noise = {}
  with tempfile.TemporaryDirectory() as tmp:
    for i, tree in enumerate(trees):
      runs = [run_tree(tree, i, os.path.join(tmp, f"s{s}_{i}"), 4, int(s)) for s in _SEEDS.value]
      noise[tree] = [m["first4"] for m in runs]
      for step in range(4):
        passes = [run[step][0] for run in noise[tree]]
        losses = [run[step][1] for run in noise[tree]]
        spread = lambda x: statistics.stdev(x) if len(x) > 1 else 0.0  # noqa: E731
        print(
          f"[step_ab] {tree} step {step + 1} over seeds {','.join(_SEEDS.value)}: pass "
          f"{statistics.mean(passes):.3f} (sd {spread(passes):.3f}), loss "
          f"{statistics.mean(losses):.4f} (sd {spread(losses):.4f})",
          flush=True,
        )
  return noise


def main(argv):
  del argv
  trees = _TREES.value
  if not trees or len(trees) < 2:
    raise ConfigError("trees", "give two source trees, the baseline first")
  results = {i: [] for i in range(len(trees))}
  with tempfile.TemporaryDirectory() as tmp:
    if _WARM.value:
      for i, tree in enumerate(trees):
        run_tree(tree, i, os.path.join(tmp, f"warm{i}"))
    for r in range(_ROUNDS.value):
      for i, tree in enumerate(trees):
        med = run_tree(tree, i, os.path.join(tmp, f"r{r}_{i}"))
        results[i].append(med)
        print(
          f"[step_ab] round {r + 1} {tree}: step {med['step_s']:.2f}s rollout "
          f"{med['rollout_s']:.2f}s update {med['update_s']:.2f}s; first four steps "
          f"(pass, loss) {med['first4']}",
          flush=True,
        )
  base = statistics.median(m["step_s"] for m in results[0])
  for i, tree in enumerate(trees):
    step = statistics.median(m["step_s"] for m in results[i])
    roll = statistics.median(m["rollout_s"] for m in results[i])
    print(f"[step_ab] {tree}: median step {step:.2f}s, rollout {roll:.2f}s, {base / step:.2f}x")
  noise = seed_noise(trees) if _SEEDS.value else {}
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"trees": trees, "runs": results, "seed_first4": noise}, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
