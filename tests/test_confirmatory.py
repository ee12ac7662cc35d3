"""The pre-registered confirmatory analysis: its sweep, its stopping rule, its verdicts."""

import os
import subprocess
import sys

import numpy as np
import pytest

from configs.sweeps import confirmatory as sweep_cfg
from gagar_jax import stats
from gagar_jax.errors import InputError
from gagar_jax.sweep import confirmatory, report
from tests import helpers
from tests.conftest import REPO

SCRIPT = os.path.join(REPO, "experiments", "confirmatory.py")


def _records(root, seeds, gap, resolved=True, tasks_n=48):
  """GRPO and GAGAR records for `seeds`; GAGAR's pass rate higher by `gap`, its length
  growth lower."""
  rng = np.random.default_rng(0)
  for seed in seeds:
    r = 0.8 if resolved else None
    base = 0.3 + 0.02 * (seed % 3)  # seeds differ; the pairs share it
    helpers.fake_sweep_record(
      root / f"grpo_s{seed}", "grpo", seed, base, 60, [1, 2] * 20, 0.3, rng, r, tasks_n
    )
    helpers.fake_sweep_record(
      root / f"gagar_s{seed}", "gagar", seed, base + gap, 20, [1, 2] * 20, 0.1, rng, r, tasks_n
    )


def _script(*args):
  env = {**os.environ, "PYTHONPATH": REPO}
  proc = subprocess.run(
    [sys.executable, SCRIPT, *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc.stdout


def test_the_sweep_is_both_arms_of_seeds_4_to_15_with_a_512_task_test():
  sweep = sweep_cfg.get_sweep()
  assert [r["name"] for r in sweep["runs"][:3]] == ["grpo_s4", "gagar_s4", "grpo_s5"]
  assert len(sweep["runs"]) == 24 and sweep["seeds"] == list(range(4, 16))
  for run in sweep["runs"]:
    assert "world=pressure_all" in run["config"]
    assert run["overrides"]["eval.final_tasks"] == 512
    assert run["overrides"]["steps"] == 150
  assert tuple(sweep["seeds"]) == confirmatory.SEEDS


def test_no_outcome_before_every_run_is_recorded(tmp_path):
  _records(tmp_path / "records", range(4, 10), 0.2)
  out = _script(f"--records={tmp_path / 'records'}", "--max_runs=-1", f"--results={tmp_path}")
  assert "12/24 runs recorded; the analysis waits for all" in out
  assert not os.path.exists(tmp_path / "confirmatory.md")
  arms = report.by_arm([report.load_run(str(p)) for p in sorted((tmp_path / "records").iterdir())])
  with pytest.raises(InputError, match=r"12 of 24 runs are not recorded yet \(grpo_s10"):
    confirmatory.analyse(arms, None, draws=50)


def test_report_of_a_whole_sweep_with_pilot_and_pooled_rows(tmp_path):
  _records(tmp_path / "records", confirmatory.SEEDS, 0.15)
  _records(tmp_path / "pilot", confirmatory.PILOT_SEEDS, 0.15, resolved=False, tasks_n=32)
  out = _script(
    f"--records={tmp_path / 'records'}",
    f"--pilot={tmp_path / 'pilot'}",
    "--max_runs=-1",
    f"--results={tmp_path}",
    "--draws=200",
    "--about=At this scale ...",
  )
  assert "-> supported" in out
  md = (tmp_path / "confirmatory.md").read_text()
  rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
  assert rows["test pass@1 (reward view)"].endswith("| 12 | **supported** |")
  assert rows["test resolved@1 (strong hidden tests)"].endswith("| 12 | **supported** |")
  # GAGAR's growth is 40 tokens lower on a 200-token start: -0.2 exactly on every seed.
  assert "| -0.200 [-0.200, -0.200] |" in rows["relative episode-length growth since step 0"]
  assert "| pilot | test resolved@1 (strong hidden tests) | n/a [n/a, n/a] | n/a | 4 |" in md
  assert "| pooled | test pass@1 (reward view) | +0.1" in md
  assert "| pooled | test resolved@1 (strong hidden tests) | n/a" in md  # not on the pilot
  assert "## What it means\n\nAt this scale ..." in md
  assert "| passing: reward hack |" in md and "(unadjusted)" in md
  assert "| grpo | n/a | n/a | 260.0 +- 0.0 |" in md  # tokens by outcome, as recorded
  assert os.path.getsize(tmp_path / "confirmatory.png") > 10_000


def test_holm_decides_the_primary_verdicts():
  assert confirmatory.primary_verdict(0.05, 0.049) == "supported"
  assert confirmatory.primary_verdict(-0.05, 0.01) == "contradicted"
  assert confirmatory.primary_verdict(0.05, 0.051) == "not resolved"
  assert confirmatory.primary_verdict(0.05, float("nan")) == "not measurable"
  # Raw p 0.03 and 0.04: Holm makes them 0.06 and 0.06, so neither is supported alone.
  assert stats.holm([0.03, 0.04]) == pytest.approx([0.06, 0.06])
