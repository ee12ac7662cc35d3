"""The confirmatory sweep of results/preregistration.md: its runs, then its analysis.

    # run the next missing run(s), resumable, one at a time, each record kept as it ends
    python experiments/confirmatory.py --max_runs=1
    # the pre-registered analysis: results/confirmatory.md and .png, from the records
    python experiments/confirmatory.py --max_runs=-1

Until all 24 runs (GRPO and GAGAR x seeds 4-15) are recorded it reports only how many
are, never an outcome (the pre-registered stopping rule); then it writes the report with
`gagar_jax/sweep/confirmatory.py`, which the pre-registration names by commit.
"""

from __future__ import annotations

import os
import sys

from absl import flags

from gagar_jax import cli
from gagar_jax.sweep import confirmatory, report, runner

_RECORDS = flags.DEFINE_string(
  "records",
  os.path.join(runner.REPO, "results", "sweeps", "confirmatory_pressure_all"),
  "The confirmatory runs' records.",
)
_PILOT = flags.DEFINE_string(
  "pilot",
  os.path.join(runner.REPO, "results", "sweeps", "powered_pressure_all"),
  "The pilot's records (seeds 0-3); '' for none.",
)
_SWEEP = flags.DEFINE_string("sweep", "configs/sweeps/confirmatory.py", "The sweep file.")
_ROOT = flags.DEFINE_string("root", "runs/confirmatory", "Workdirs of the runs go here.")
_MAX_RUNS = flags.DEFINE_integer(
  "max_runs", 1, "Run at most this many missing runs (0: all, -1: none, only analyse)."
)
_RESULTS = flags.DEFINE_string("results", "results", "Where confirmatory.md and .png go.")
_DRAWS = flags.DEFINE_integer("draws", 2000, "Bootstrap draws over the test tasks.")
_ABOUT = flags.DEFINE_string("about", "", "What it means, a paragraph under the tables.")
_OOD_SEEDS = flags.DEFINE_string(
  "ood_seeds", "3000000:3000256", "MiniRepo seeds of the out-of-distribution evaluation."
)

PREREGISTRATION = "results/preregistration.md"


def _arms(records: str, sweep: dict) -> dict:
  dirs = [os.path.join(records, r["name"]) for r in sweep["runs"]]
  return report.by_arm([report.load_run(d) for d in dirs if runner.finished(d)])


def main(argv):
  del argv
  runner.stop_children_on_sigterm()
  sweep = runner.load_sweep(_SWEEP.value)
  if _MAX_RUNS.value >= 0:
    options = runner.RunOptions(ood_seeds=_OOD_SEEDS.value)
    try:
      runner.run_missing(sweep, _RECORDS.value, _ROOT.value, options, _MAX_RUNS.value)
    except (runner.StaleWorkdir, runner.IncompleteLog, runner.RunFailed) as e:
      sys.exit(f"confirmatory.py: {e}")
  done = sum(runner.finished(os.path.join(_RECORDS.value, r["name"])) for r in sweep["runs"])
  if done < len(sweep["runs"]):
    print(f"[confirmatory] {done}/{len(sweep['runs'])} runs recorded; the analysis waits for all")
    return
  pilot = None
  if _PILOT.value:
    pilot = report.by_arm(
      [
        report.load_run(os.path.join(_PILOT.value, f"{a}_s{s}"))
        for s in confirmatory.PILOT_SEEDS
        for a in (confirmatory.CONTROL, confirmatory.TREATMENT)
      ]
    )
  result = confirmatory.analyse(_arms(_RECORDS.value, sweep), pilot, _DRAWS.value, _RECORDS.value)
  os.makedirs(_RESULTS.value, exist_ok=True)
  md = os.path.join(_RESULTS.value, "confirmatory.md")
  png = os.path.join(_RESULTS.value, "confirmatory.png")
  command = "python " + " ".join(a for a in sys.argv if not a.startswith("--about"))
  confirmatory.write_report(result, md, png, PREREGISTRATION, command, about=_ABOUT.value)
  for r in result["primaries"]:
    print(
      f"- {r['name']}: {r['point']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], Holm p "
      f"{r['p_holm']:.3f} -> {r['verdict']}"
    )
  print(f"[confirmatory] wrote {md} and {png}")


if __name__ == "__main__":
  cli.run(main)
