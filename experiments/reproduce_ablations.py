"""Runs the ablation sweep (every arm x seeds), aggregates it, writes results/ablations.md.

    python experiments/reproduce_ablations.py --sweep=configs/sweeps/ablations.py:preset=small \\
        --root=runs/ablations --results=results

Each run is `experiments/train.py` in its own process (its own workdir under --root,
resumed if it already finished or was interrupted). Then, per arm, mean +- std over
seeds of: final and best validation pass@1, final test pass@1, mean episode length and
its growth since the start of RL, out-of-scope-edit and dead-code rates among passing
test solutions, and the variance of the gradient norm over training; plus PNG curves
per arm with seed bands. The results file says where the claims hold and where not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
from absl import app, flags

_SWEEP = flags.DEFINE_string(
  "sweep",
  "configs/sweeps/ablations.py:preset=small",
  "Sweep file (with :arg), defining get_sweep(arg).",
)
_ROOT = flags.DEFINE_string("root", "runs/ablations", "Workdirs of the runs go here.")
_RESULTS = flags.DEFINE_string("results", "results", "Where ablations.md and plots go.")
_DRY = flags.DEFINE_bool("aggregate_only", False, "Skip running; aggregate existing runs.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_sweep(spec: str):
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("sweep", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_sweep(arg or None)


def run_one(run: dict, workdir: str) -> float:
  args = [
    sys.executable,
    os.path.join(REPO, "experiments", "train.py"),
    f"--config={run['config']}",
    f"--workdir={workdir}",
  ]
  args += [f"--config.{k}={v}" for k, v in run.get("overrides", {}).items()]
  start = time.time()
  with open(os.path.join(workdir, "stdout.log"), "a") as log:
    proc = subprocess.run(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
  if proc.returncode:
    raise RuntimeError(
      f"run {run['name']} failed (exit {proc.returncode}); see {workdir}/stdout.log"
    )
  return time.time() - start


def summarize_run(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  train = [r for r in records if "train/grad_norm" in r]
  curve = summary["curve"]
  final = summary["final_test"]
  return {
    "final_val_pass@1": curve[-1]["pass@1"],
    "best_val_pass@1": max(p["pass@1"] for p in curve),
    "final_test_pass@1": final["pass@1"],
    "episode_tokens": final["episode_tokens"],
    "token_growth": curve[-1]["episode_tokens"] - curve[0]["episode_tokens"],
    "out_of_scope_rate": final.get("passing_out_of_scope", float("nan")),
    "dead_code_rate": final.get("passing_dead_code", float("nan")),
    "bloated_rate": final.get("passing_bloated", float("nan")),
    "grad_norm_var": float(np.var([r["train/grad_norm"] for r in train])) if train else 0.0,
    "wall_minutes": float(summary.get("wall_minutes", 0.0)),
    "curve": curve,
    "train_pass": [(r["step"], r["train/pass_rate"]) for r in train],
  }


METRICS = [
  ("final_val_pass@1", "final validation pass@1", True),
  ("best_val_pass@1", "best validation pass@1", True),
  ("final_test_pass@1", "final test pass@1", True),
  ("episode_tokens", "episode tokens (test)", False),
  ("token_growth", "episode-token growth since step 0", False),
  ("out_of_scope_rate", "out-of-scope edits in passing", False),
  ("dead_code_rate", "dead code in passing", False),
  ("bloated_rate", "any bloat in passing", False),
  ("grad_norm_var", "gradient-norm variance", False),
]


def aggregate(results: dict[str, list[dict]]) -> dict[str, dict[str, tuple[float, float]]]:
  return {
    arm: {
      k: (float(np.mean([r[k] for r in runs])), float(np.std([r[k] for r in runs])))
      for k, _, _ in METRICS
    }
    for arm, runs in results.items()
  }


def verdicts(agg) -> list[str]:
  """Each claim of the paper, checked against the means (and the seeds' spread)."""
  out = []

  def cmp(a, b, key, better_high, claim):
    if a not in agg or b not in agg:
      return
    (ma, sa), (mb, sb) = agg[a][key], agg[b][key]
    diff = ma - mb if better_high else mb - ma
    spread = max(sa, sb)
    if abs(diff) < 1e-12:
      verdict = "no difference"
    elif diff > spread:
      verdict = "holds"
    elif diff > 0:
      verdict = "same direction, within seed noise"
    else:
      verdict = "does NOT hold"
    out.append(f"- {claim}: {a} {ma:.3f} +- {sa:.3f} vs {b} {mb:.3f} +- {sb:.3f} -> {verdict}")

  cmp("gagar", "grpo", "final_test_pass@1", True, "GAGAR raises pass rate over GRPO")
  cmp("gagar", "grpo", "token_growth", False, "GAGAR curbs trajectory-length growth")
  cmp("gagar", "grpo", "grad_norm_var", False, "GAGAR trains more stably (grad-norm variance)")
  cmp("gagar", "grpo", "bloated_rate", False, "GAGAR's passing solutions are cleaner")
  cmp("gagar", "gagar_no_rescale", "final_test_pass@1", True, "sum preservation matters")
  cmp("gagar", "reward_shaping", "grad_norm_var", False, "reward shaping is less stable")
  cmp("gagar_lm", "grpo", "final_test_pass@1", True, "GAGAR with the LM grader raises pass rate")
  cmp("gagar_lm", "grpo", "bloated_rate", False, "the LM grader's GAGAR gives cleaner solutions")
  cmp("gagar_lm", "gagar", "final_test_pass@1", True, "the LM grader matches the rubric grader")
  return out


def plot(results: dict[str, list[dict]], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(1, 3, figsize=(15, 4))
  for arm, runs in results.items():
    steps = [p["step"] for p in runs[0]["curve"]]
    for i, (key, title) in enumerate(
      (
        ("pass@1", "validation pass@1"),
        ("episode_tokens", "episode tokens"),
        ("passing_bloated", "bloated share of passing"),
      )
    ):
      ys = np.array([[p[key] for p in r["curve"]] for r in runs])
      mean, std = ys.mean(0), ys.std(0)
      line = ax[i].plot(steps, mean, "o-", label=arm)[0]
      ax[i].fill_between(steps, mean - std, mean + std, alpha=0.2, color=line.get_color())
      ax[i].set(title=title, xlabel="RL step")
  ax[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def write_markdown(agg, sweep, command: str, minutes: float, path: str) -> None:
  arms = list(agg)
  lines = [
    "# GAGAR ablations (MiniRepo, tiny policy)",
    "",
    f"Command: `{command}`",
    "",
    *(
      [
        "(Aggregation only: each arm's runs were made by the same command without "
        "`--aggregate_only`, with that arm in `arms=`, into the same `--root`.)",
        "",
      ]
      if "--aggregate_only" in command
      else []
    ),
    f"{len(sweep['runs'])} runs ({', '.join(arms)} x {len(sweep['seeds'])} seeds), "
    f"{minutes:.0f} minutes of training runs on this machine (sum over runs). "
    "Mean +- std over seeds.",
    "",
    "| metric | " + " | ".join(arms) + " |",
    "| --- |" + " --- |" * len(arms),
  ]
  for key, name, _ in METRICS:
    lines.append(
      f"| {name} | "
      + " | ".join(f"{agg[a][key][0]:.3f} +- {agg[a][key][1]:.3f}" for a in arms)
      + " |"
    )
  lines += [
    "",
    "## The paper's claims, here",
    "",
    "A claim 'holds' when the means differ in its direction by more than the larger of the "
    "two arms' seed standard deviations; with 3 seeds that is a screen, not a significance "
    "test. 'Within seed noise' means the direction agrees but the gap is smaller.",
    "",
    *verdicts(agg),
    "",
    "![curves](ablations.png)",
    "",
  ]
  with open(path, "w") as f:
    f.write("\n".join(lines))


def main(argv):
  del argv
  sweep = load_sweep(_SWEEP.value)
  results: dict[str, list[dict]] = {}
  for run in sweep["runs"]:
    workdir = os.path.join(_ROOT.value, run["name"])
    os.makedirs(workdir, exist_ok=True)
    if not _DRY.value and not os.path.exists(os.path.join(workdir, "summary.json")):
      print(f"[ablations] running {run['name']} ...", flush=True)
      seconds = run_one(run, workdir)
      print(f"[ablations] {run['name']} done in {seconds / 60:.1f} min", flush=True)
    results.setdefault(run["arm"], []).append(summarize_run(workdir))
  agg = aggregate(results)
  os.makedirs(_RESULTS.value, exist_ok=True)
  plot(results, os.path.join(_RESULTS.value, "ablations.png"))
  command = "python " + " ".join(sys.argv)
  minutes = sum(r["wall_minutes"] for runs in results.values() for r in runs)
  write_markdown(agg, sweep, command, minutes, os.path.join(_RESULTS.value, "ablations.md"))
  print("\n".join(verdicts(agg)))
  print(f"[ablations] wrote {_RESULTS.value}/ablations.md and ablations.png")


if __name__ == "__main__":
  jax.config.config_with_absl()  # JAX's own flags (--jax_platforms, ...) on the command line
  app.run(main)
