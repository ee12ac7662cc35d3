"""The ablation report: aggregation over seeds, claim verdicts, markdown and plot."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def _fake_run(workdir, pass_rate, tokens, grad_norms):
  os.makedirs(workdir)
  curve = [
    {
      "step": s,
      "pass@1": pass_rate * (0.8 + 0.1 * i),
      "episode_tokens": tokens + 10 * i,
      "passing_bloated": 0.3,
    }
    for i, s in enumerate((0, 6, 12))
  ]
  final = {
    "pass@1": pass_rate,
    "episode_tokens": tokens,
    "passing_out_of_scope": 0.1,
    "passing_dead_code": 0.2,
    "passing_bloated": 0.3,
  }
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"curve": curve, "final_test": final}, f)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, g in enumerate(grad_norms, 1):
      f.write(json.dumps({"step": step, "train/grad_norm": g, "train/pass_rate": 0.4}) + "\n")


def test_report_from_existing_runs(tmp_path):
  root = tmp_path / "runs"
  for seed in range(3):
    _fake_run(root / f"grpo_s{seed}", 0.30 + 0.01 * seed, 300, [1.0, 3.0, 1.0, 3.0])
    _fake_run(root / f"gagar_s{seed}", 0.40 + 0.01 * seed, 260, [1.0, 1.2, 1.0, 1.2])
    _fake_run(root / f"gagar_no_rescale_s{seed}", 0.20, 280, [1.0, 2.0, 1.0, 2.0])
    _fake_run(root / f"reward_shaping_s{seed}", 0.35, 290, [0.5, 4.0, 0.5, 4.0])
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = REPO
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "experiments", "reproduce_ablations.py"),
      "--sweep=configs/sweeps/ablations.py:preset=quick",
      f"--root={root}",
      f"--results={tmp_path / 'results'}",
      "--aggregate_only",
    ],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  md = open(tmp_path / "results" / "ablations.md").read()
  assert "| final test pass@1 | 0.310 +- 0.008 | 0.410 +- 0.008 |" in md
  assert "GAGAR raises pass rate over GRPO: gagar 0.410" in md and "-> holds" in md
  assert "sum preservation matters" in md
  assert "reward shaping is less stable" in md
  assert os.path.exists(tmp_path / "results" / "ablations.png")
