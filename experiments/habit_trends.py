"""How a run's sampled behaviour moves over training, from its recorded groups.

    python experiments/habit_trends.py --workdir=runs/pilot_grpo --bins=6
    python experiments/habit_trends.py --workdir=runs/pilot_grpo --out=results/pilots/x/trends.json

Reads the group records the trainer keeps under WORKDIR/groups (`config.inspect.record`)
and prints, per bin of RL steps, a markdown table over every candidate of the kept
groups: the pass rate; episode tokens; how many episodes attempt a reward hack (the
quality signals' `special_cases`, passing or not) and how often those pass; and among
the *passing* episodes the shares with a hack, an out-of-scope edit and an invalid
(junk) action, the last also within the passing hacks and within the passing fixes.
These are training samples (the policy as it was sampled at each step), so the trend
shows what the reward reinforced.
"""

import json
import os
import sys

from absl import flags

from gagar_jax import cli, inspection

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.", required=True)
_BINS = flags.DEFINE_integer("bins", 6, "Bins of RL steps (equal numbers of steps).")
_OUT = flags.DEFINE_string("out", "", "Also write the rows as JSON here.")


def table(rows: list[dict]) -> str:
  cols = [
    ("steps", "steps", "{}"),
    ("pass_rate", "pass rate", "{:.2f}"),
    ("tokens", "tokens", "{:.0f}"),
    ("hack_attempts", "hack attempts", "{:.3f}"),
    ("hack_attempt_pass_rate", "... passing", "{:.2f}"),
    ("passing_hack", "passing: hack", "{:.3f}"),
    ("passing_out_of_scope", "passing: out of scope", "{:.3f}"),
    ("passing_out_of_scope_no_hack", "... not a hack", "{:.3f}"),
    ("passing_invalid", "passing: junk turn", "{:.3f}"),
    ("passing_hack_invalid", "... within hacks", "{:.3f}"),
    ("passing_fix_invalid", "... within fixes", "{:.3f}"),
  ]
  lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + " --- |" * len(cols)]
  for r in rows:
    lines.append("| " + " | ".join(fmt.format(r[k]) for k, _, fmt in cols) + " |")
  return "\n".join(lines)


def main(argv):
  del argv
  try:
    rows = inspection.trends(os.path.join(_WORKDIR.value, "groups"), _BINS.value)
  except FileNotFoundError as e:
    sys.exit(f"habit_trends.py: {e}")
  print(table(rows))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
