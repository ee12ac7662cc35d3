"""The group inspector: every recorded group of a run as a static HTML site.

(Not `inspect.py`: a file of that name in experiments/ would shadow the standard
library's `inspect` for every script in this folder.)

    python experiments/inspect_groups.py --workdir=runs/demo              # -> runs/demo/inspect/
    python experiments/inspect_groups.py --workdir=runs/demo --step=12 --out=/tmp/step12

Opens from the file system (no server): index.html lists steps and groups with filters
and a search box; each group's page shows the task, the candidates side by side
(highlighted diffs, actions, signals, pass/fail), the grader's output and transcript,
and each candidate's advantage before and after redistribution. The trainer records the
groups while `config.inspect.record` is on (gagar_jax/inspection.py).
"""

import os
import sys

from absl import flags

from gagar_jax import cli, inspector

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Only this RL step's groups.")
_OUT = flags.DEFINE_string("out", "", "Output folder (default: WORKDIR/inspect).")


def main(argv):
  del argv
  try:
    path = inspector.build(_WORKDIR.value, _OUT.value, _STEP.value)
  except FileNotFoundError as e:
    sys.exit(f"inspect_groups.py: {e}")
  print(f"[inspect] open file://{os.path.abspath(path)}")


if __name__ == "__main__":
  cli.run(main)
