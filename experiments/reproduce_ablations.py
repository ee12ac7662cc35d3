"""Runs an ablation sweep (arms x seeds), keeps each finished run's compact record, and
reports the paper's claims with paired confidence intervals over seeds and tasks.

    # the powered sweep, two runs per sitting (each sitting continues where the last stopped):
    python experiments/reproduce_ablations.py \\
        --sweep=configs/sweeps/ablations.py:preset=powered,world=pressure --max_runs=2
    # the report alone, from the committed records:
    python experiments/reproduce_ablations.py \\
        --sweep=configs/sweeps/ablations.py:preset=powered,world=pressure --aggregate_only

Each run is `experiments/train.py` in its own process, in its own workdir under --root
(an interrupted run resumes from its checkpoint), then `experiments/evaluate.py` on the
final policy over MiniRepo tasks of a seed range no split uses (--ood_seeds). A finished
run's record (config.json, summary.json with the final test's per-task counts,
metrics.jsonl, ood.json: a few hundred KB) goes to --records
(default results/sweeps/<preset>_<world>); a run whose record exists is skipped, so the
sweep continues across sittings from what is committed there. The report (--results/
<--report>.md and .png) is computed from the records alone (`gagar_jax/sweep/report.py`
says how its intervals and verdicts are computed; `gagar_jax/sweep/runner.py` runs and
records).
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags

from gagar_jax import cli
from gagar_jax.sweep import report as report_lib
from gagar_jax.sweep import runner

_SWEEP = flags.DEFINE_string(
  "sweep",
  "configs/sweeps/ablations.py:preset=small",
  "Sweep file (with :arg), defining get_sweep(arg).",
)
_ROOT = flags.DEFINE_string("root", "runs/ablations", "Workdirs of the runs go here.")
_RECORDS = flags.DEFINE_string(
  "records", "", "Finished runs' records (default results/sweeps/<sweep name>)."
)
_RESULTS = flags.DEFINE_string("results", "results", "Where the report and its plot go.")
_REPORT = flags.DEFINE_string("report", "", "Report name (default ablations_<sweep name>).")
_DRY = flags.DEFINE_bool("aggregate_only", False, "Skip running; report from the records.")
_MAX_RUNS = flags.DEFINE_integer("max_runs", 0, "Run at most this many missing runs (0: all).")
_OOD_SEEDS = flags.DEFINE_string(
  "ood_seeds", "3000000:3000256", "MiniRepo seeds of the out-of-distribution evaluation."
)
_OOD_SAMPLES = flags.DEFINE_integer("ood_samples", 4, "Samples per out-of-distribution task.")
_DRAWS = flags.DEFINE_integer("draws", 2000, "Bootstrap draws.")
_ABOUT = flags.DEFINE_string("about", "", "A paragraph for the report, under its title.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "TFDS data_dir for the runs ('' = the config's).")
_DIGEST_OF = flags.DEFINE_string(
  "digest_of", "", "Internal: print the inputs digest of this run (JSON) and exit."
)


def main(argv):
  del argv
  if _DIGEST_OF.value:
    print(runner.inputs_digest(runner.run_config(json.loads(_DIGEST_OF.value), _DATA_DIR.value)))
    return
  runner.stop_children_on_sigterm()
  sweep = runner.load_sweep(_SWEEP.value)
  records = _RECORDS.value or os.path.join(runner.REPO, "results", "sweeps", sweep["name"])
  options = runner.RunOptions(_DATA_DIR.value, _OOD_SEEDS.value, _OOD_SAMPLES.value)
  if not _DRY.value:
    try:
      runner.run_missing(sweep, records, _ROOT.value, options, _MAX_RUNS.value)
    except (runner.StaleWorkdir, runner.IncompleteLog, runner.RunFailed) as e:
      sys.exit(f"reproduce_ablations.py: {e}")
  runs = [
    report_lib.load_run(os.path.join(records, r["name"]))
    for r in sweep["runs"]
    if runner.finished(os.path.join(records, r["name"]))
  ]
  if not runs:
    print(f"[ablations] no finished run in {records} yet", flush=True)
    return
  report = _REPORT.value or f"ablations_{sweep['name']}"
  os.makedirs(_RESULTS.value, exist_ok=True)
  md = os.path.join(_RESULTS.value, f"{report}.md")
  png = os.path.join(_RESULTS.value, f"{report}.png")
  # The command that continues the sweep (an --aggregate_only report names it too).
  shown = [a for a in sys.argv if not a.startswith(("--about", "--aggregate_only"))]
  command = "python " + " ".join(shown)
  rows = report_lib.write_report(
    sweep,
    runs,
    records,
    command,
    md,
    png,
    draws=_DRAWS.value,
    about=_ABOUT.value,
    ood_seeds=_OOD_SEEDS.value,
  )
  for r in rows:
    print(
      f"- {r['claim']}: {r['a']} - {r['b']} {r['figure']} {r['point']:+.3f} "
      f"[{r['lo']:+.3f}, {r['hi']:+.3f}] -> {r['verdict']}"
    )
  print(f"[ablations] {len(runs)}/{len(sweep['runs'])} runs; wrote {md} and {png}")


if __name__ == "__main__":
  cli.run(main)
