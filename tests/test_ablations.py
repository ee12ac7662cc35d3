"""The ablation sweep: records of finished runs, skipping them, and the report with
paired intervals over seeds and tasks."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gagar_jax import metrics
from gagar_jax.errors import InputError
from gagar_jax.sweep import report, runner
from tests import helpers
from tests.conftest import REPO

SCRIPT = os.path.join(REPO, "experiments", "reproduce_ablations.py")
SWEEP = "configs/sweeps/ablations.py:preset=powered,world=pressure,arms=grpo+gagar,seeds=3"


def _env():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = REPO
  return env


def _script(*args, timeout=600, check=True):
  proc = subprocess.run(
    [sys.executable, SCRIPT, *args],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  if check:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout
  return proc


def test_report_from_committed_records(tmp_path):
  records, rng = tmp_path / "records", np.random.default_rng(0)
  for seed in range(3):
    hack_p = 1.0 if seed == 0 else 0.4  # grpo's seed 0 ends wholly on the hack
    helpers.fake_sweep_record(
      records / f"grpo_s{seed}", "grpo", seed, 0.30, 60, [1, 3] * 20, hack_p, rng
    )
    helpers.fake_sweep_record(
      records / f"gagar_s{seed}", "gagar", seed, 0.40, 10, [1, 1.2] * 20, 0.05, rng
    )
  out = _script(
    f"--sweep={SWEEP}",
    f"--records={records}",
    f"--results={tmp_path / 'results'}",
    "--report=report",
    "--aggregate_only",
    "--draws=300",
  )
  md = (tmp_path / "results" / "report.md").read_text()
  assert "**6 of 6 runs finished**" in md
  assert "SE of a run's test pass@1 from sampling, given the tasks" in md
  assert "| seeds finished | 3 | 3 |" in md
  lines = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
  # A large pass-rate gap with 3 seeds x 64 paired tasks: the interval excludes 0.
  assert "**supported**" in lines["GAGAR resolves more tasks than GRPO"]
  assert "**supported**" in lines["GAGAR curbs trajectory-length growth"]
  # Growth over the second half: the last validation point minus the middle one (30 vs 5).
  assert (
    "late_token_growth | -25.000 [-25.000, -25.000]"
    in lines["... in the second half of training (post hoc)"]
  )
  # Hack shares: grpo's 1.0, 0.4, 0.4 against gagar's 0.05. Every seed agrees in sign, but
  # three seeds this far apart leave the mean unknown (a t interval; a percentile bootstrap
  # over the seeds called it supported).
  assert "**not resolved**" in lines["... fewer reward hacks"]
  assert "**supported**" in lines["GAGAR trains more stably (gradient-norm variance)"]
  # Each row's p-value and its Holm adjustment over the table's rows (never below p).
  for claim in ("GAGAR resolves more tasks than GRPO", "... fewer reward hacks"):
    p, holm = (float(x.lstrip("< ")) for x in lines[claim].rstrip(" |").split(" | ")[-2:])
    assert 0 <= p <= holm <= 1
  assert "... less dead code (post hoc)" in lines
  # Out-of-scope shares are equal in truth: not resolved (or, rarely, a chance verdict).
  assert "[" in lines["... fewer out-of-scope edits"]
  # Every component of bloat has its own row.
  assert "passing: dead code" in lines["... less dead code (post hoc)"]
  assert "passing: redundant action" in lines["... fewer redundant actions (post hoc)"]
  assert "sum preservation" not in md  # gagar_no_rescale not in this sweep's arms
  # Per run, and the count of runs that ended on the hack with Fisher's exact test.
  assert " | 1.00 | " in lines["grpo_s0"] and lines["grpo_s0"].endswith(" | yes |")
  assert lines["grpo_s1"].endswith(" | no |") and lines["gagar_s2"].endswith(" | no |")
  assert lines["grpo"] == "| grpo | 1/3 | n/a | 1.000 |"
  assert lines["gagar"] == "| gagar | 0/3 | 1.000 | 1.000 |"
  assert "GAGAR resolves more tasks than GRPO: gagar - grpo test pass@1 +0.1" in out
  assert os.path.getsize(tmp_path / "results" / "report.png") > 10_000


def test_report_with_one_seed_says_its_intervals_are_over_tasks_only(tmp_path):
  records, rng = tmp_path / "records", np.random.default_rng(0)
  helpers.fake_sweep_record(records / "grpo_s0", "grpo", 0, 0.30, 60, [1, 3] * 20, 0.4, rng)
  helpers.fake_sweep_record(records / "gagar_s0", "gagar", 0, 0.40, 10, [1, 1.2] * 20, 0.05, rng)
  _script(
    f"--sweep={SWEEP}",
    f"--records={records}",
    f"--results={tmp_path}",
    "--report=report",
    "--aggregate_only",
    "--draws=200",
  )
  md = (tmp_path / "report.md").read_text()
  lines = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
  assert " | tasks only | 1 | " in lines["GAGAR resolves more tasks than GRPO"]
  assert " | seeds | 1 | **not measurable** |" in lines["GAGAR curbs trajectory-length growth"]


def test_sweep_runs_records_and_skips_finished_runs(tmp_path):
  # One real run (train.py + the out-of-distribution evaluate.py), its record, then a
  # second sitting that finds it finished and only reports.
  records = tmp_path / "records"
  common = [
    "--sweep=configs/sweeps/ablations.py:runlocal=True,arms=grpo,seeds=2",
    f"--root={tmp_path / 'runs'}",
    f"--records={records}",
    f"--results={tmp_path / 'results'}",
    "--ood_seeds=3000000:3000002",
    "--ood_samples=1",
    "--draws=50",
    f"--data_dir={tmp_path / 'data'}",
  ]
  out = _script(*common, "--max_runs=1", timeout=900)
  assert "running grpo_s0" in out and "--max_runs=1 reached" in out and "1/2 runs" in out
  files = sorted(os.listdir(records / "grpo_s0"))
  assert files == ["config.json", "metrics.jsonl", "ood.json", "record.json", "summary.json"]
  size = sum(os.path.getsize(records / "grpo_s0" / f) for f in files)
  assert size < 500_000
  summary = json.load(open(records / "grpo_s0" / "summary.json"))
  assert len(summary["final_test_tasks"]) == 2
  ood = json.load(open(records / "grpo_s0" / "ood.json"))
  assert [r["task_id"].split("-")[1] for r in ood["per_task"]] == ["3000000", "3000001"]
  again = _script(*common, "--aggregate_only")
  assert "running" not in again and "1/2 runs" in again
  md = (tmp_path / "results" / "ablations_runlocal_default.md").read_text()
  assert "**1 of 2 runs finished**" in md and "the 1 left need about" in md
  assert "--aggregate_only" not in md  # the command shown is the one that continues the sweep
  # A workdir left from other inputs is refused, not resumed and recorded: one older
  # than an asset its config names (the warm start was remade), one with another digest.
  stale = tmp_path / "runs" / "runlocal_default" / "grpo_s1"
  stale.mkdir(parents=True)
  (stale / "config.json").write_text("{}")
  os.utime(stale / "config.json", (0, 0))
  for expected in ("predates assets/", "started from other inputs"):
    proc = _script(*common, timeout=300, check=False)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr[-2000:]
    assert not (records / "grpo_s1").exists()
    (stale / "sweep_inputs.json").write_text('{"digest": "other", "run": "grpo_s1"}')


def test_length_note_fits_the_world():
  # The pressure sweep's history (a short hack shortens every arm early) is told only in
  # the pressure world's report.
  pressure = " ".join(report._length_note("pressure"))
  default = " ".join(report._length_note("default"))
  assert "Length growth is measured twice" in pressure and "measured twice" in default
  assert "5 of the powered sweep's 24 runs" in pressure
  assert "24 runs" not in default and "does not arise" in default
  every = " ".join(report._length_note("pressure_all"))
  assert "lengthens the episode" in every and "does not arise" not in every


def test_trailing_window_of_the_training_panels():
  # The figure's train panels: a trailing mean (10 steps) and variance (20 steps), over the
  # steps so far at the start, never over steps still to come.
  v = np.array([1.0, 3.0, 5.0, 100.0])
  np.testing.assert_allclose(report._trailing(v, 2, np.mean), [1.0, 2.0, 4.0, 52.5])
  np.testing.assert_allclose(
    report._trailing(v, 3, np.var), [0.0, 1.0, np.var([1, 3, 5]), np.var([3, 5, 100])]
  )


def test_workdir_digest_is_what_a_fresh_process_builds(monkeypatch):
  # A sweep left running while configs/ is edited holds the old modules; the digest it
  # checks a workdir against must be of the config the run's train.py will build.
  run = {"name": "grpo_s0", "config": "configs/gagar.py:arm=grpo", "overrides": {"steps": 2}}
  fresh = runner.fresh_digest(run)
  assert fresh == runner.inputs_digest(runner.run_config(run))
  from configs import common

  mesh_config = common.mesh_config

  def edited(*args, **kwargs):  # as if a key were added to configs/common.py in this process
    c = mesh_config(*args, **kwargs)
    c.new_key = 1
    return c

  monkeypatch.setattr(common, "mesh_config", edited)
  assert runner.inputs_digest(runner.run_config(run)) != fresh
  assert runner.fresh_digest(run) == fresh
  assert runner.fresh_digest({**run, "overrides": {"steps": 3}}) != fresh


def test_a_record_with_lost_log_rows_is_refused(tmp_path):
  # A run's log that lacks steps (here the first 18, lost when its workdir was removed under
  # a training process left running) would give run-level figures from part of the run.
  record = tmp_path / "grpo_s3"
  helpers.fake_sweep_record(record, "grpo", 3, 0.3, 0, [1, 3], 0.0, np.random.default_rng(0))
  assert runner.missing_steps(str(record)) == []
  assert report.load_run(str(record))["level"]["grad_norm_var"] == 1.0
  rows = (record / "metrics.jsonl").read_text().splitlines()
  (record / "metrics.jsonl").write_text("\n".join(rows[18:]) + "\n")
  assert runner.missing_steps(str(record)) == list(range(1, 19))
  with pytest.raises(ValueError, match=r"no row for 18 steps \(1\.\.18\).*rerun grpo_s3"):
    report.load_run(str(record))
  # ... and a sweep does not record such a run.
  run = {"name": "grpo_s3", "arm": "grpo", "config": "", "overrides": {}}
  with pytest.raises(runner.IncompleteLog, match="not recorded"):
    runner.save_record(run, str(record), str(tmp_path / "records" / "grpo_s3"), 60.0)
  assert not (tmp_path / "records" / "grpo_s3").exists()


def test_a_record_with_duplicated_rows_or_a_broken_file_is_refused(tmp_path):
  # Regression: gagar_s0 (pressure_all) logged steps 1-12 twice after a restart and the
  # aggregation counted them twice. A broken record file names itself.
  record = tmp_path / "gagar_s0"
  helpers.fake_sweep_record(record, "gagar", 0, 0.3, 0, [1, 3], 0.0, np.random.default_rng(0))
  report.load_run(str(record))
  metrics_file = record / "metrics.jsonl"
  rows = metrics_file.read_text().splitlines()
  metrics_file.write_text("\n".join(rows[:4] + rows[1:4] + rows[4:]) + "\n")
  with pytest.raises(InputError, match=r"metrics.jsonl: logs 3 steps \(2\.\.4\) more than once"):
    report.load_run(str(record))
  run = {"name": "gagar_s0", "arm": "gagar", "config": "", "overrides": {}}
  with pytest.raises(runner.IncompleteLog, match="more than once; not recorded"):
    runner.save_record(run, str(record), str(tmp_path / "records" / "gagar_s0"), 60.0)
  metrics_file.write_text("\n".join(rows) + "\n")
  meta = json.loads((record / "record.json").read_text())
  (record / "record.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "name"}))
  with pytest.raises(InputError, match=r"record.json: lacks the field\(s\) name"):
    report.load_run(str(record))
  (record / "record.json").write_text("{")
  with pytest.raises(InputError, match=r"record.json: is not valid JSON"):
    report.load_run(str(record))
  (record / "record.json").write_text(json.dumps(meta))
  metrics_file.write_text("\n".join(rows[:5] + ['{"step": 3, "train/lo'] + rows[5:]) + "\n")
  with pytest.raises(InputError, match=r"metrics.jsonl: line 6 is not valid JSON"):
    report.load_run(str(record))


def test_committed_records_are_whole():
  # The reports in results/ are aggregated from these records; each must log every step,
  # once, and name its arm as the sweep does.
  records = sorted(glob.glob(os.path.join(REPO, "results", "sweeps", "*", "*", "record.json")))
  assert len(records) >= 40
  for record in records:
    folder = os.path.dirname(record)
    assert runner.missing_steps(folder) == [], record
    assert metrics.duplicate_steps(metrics.read(os.path.join(folder, "metrics.jsonl"))) == []
    summary = json.load(open(os.path.join(folder, "summary.json")))
    assert summary["arm"] == json.load(open(record))["arm"], record


def test_sigterm_stops_the_run_the_sweep_waits_on(tmp_path):
  # `kill PID` of a sweep must not leave its training process running on its own.
  pidfile = tmp_path / "child.pid"
  child = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
  code = (
    "import sys\n"
    "from gagar_jax.sweep import runner\n"
    "runner.stop_children_on_sigterm()\n"
    f"runner._call([sys.executable, '-c', {child!r}], {str(tmp_path)!r}, 'a sleeping run')\n"
  )
  sweep = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env())
  pid = None
  try:
    deadline = time.time() + 120
    while not (pidfile.exists() and pidfile.read_text()) and time.time() < deadline:
      assert sweep.poll() is None, "the sweep process ended before starting its run"
      time.sleep(0.2)
    pid = int(pidfile.read_text())
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) != 0
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
  finally:
    sweep.kill()
    if pid is not None:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_sweep_grid_per_world():
  # The powered sweep: 6 arms in the pressure world, the cheaper 4-arm setting in the
  # default world, each with its own records folder; bad arguments name what is wrong.
  import pytest

  from configs.sweeps import ablations

  pressure = ablations.get_sweep("preset=powered,world=pressure")
  default = ablations.get_sweep("preset=powered,world=default")
  assert (pressure["name"], len(pressure["runs"])) == ("powered_pressure", 24)
  assert (default["name"], len(default["runs"])) == ("powered_default", 16)
  assert [r["name"] for r in default["runs"][:4]] == [
    "grpo_s0",
    "gagar_s0",
    "gagar_no_rescale_s0",
    "reward_shaping_s0",
  ]
  assert all("world=" not in r["config"] for r in default["runs"])
  assert all(r["config"].endswith(",world=pressure") for r in pressure["runs"])
  assert all(r["overrides"]["steps"] == 150 for r in default["runs"] + pressure["runs"])
  picked = ablations.get_sweep("preset=powered,world=default,arms=gagar_lm,seeds=2")
  assert [r["name"] for r in picked["runs"]] == ["gagar_lm_s0", "gagar_lm_s1"]
  for arg, message in [
    ("preset=powered,world=moon", "world='moon'"),
    ("preset=huge", "preset='huge'"),
    ("arms=grpo+dpo", "unknown arm 'dpo'"),
  ]:
    with pytest.raises(ValueError, match=message):
      ablations.get_sweep(arg)
