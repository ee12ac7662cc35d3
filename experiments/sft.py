"""Supervised training: the policy's warm start, or the LM grader (config.target).

python experiments/sft.py --config=configs/sft.py --workdir=runs/sft
python experiments/sft.py --config=configs/grader_sft.py --workdir=runs/grader \\
    --export=assets/lm_grader
"""

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from gagar_jax import cli, sft

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sft.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "Outputs and checkpoints go here.")
_REPORT = flags.DEFINE_string(
  "report", "", "Also write a markdown report of the calibration figures here (+ .png)."
)
_EXPORT = flags.DEFINE_string(
  "export", "", "Also write the final policy here (tokenizer/, model.json, params.safetensors)."
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # progress lines only; orbax/jax INFO is noise
  if _CONFIG.value.get("target", "policy") == "grader":
    from gagar_jax import grader_sft

    grader_sft.run(_CONFIG.value, _WORKDIR.value, export=_EXPORT.value)
    return
  summary = sft.run(_CONFIG.value, _WORKDIR.value, export=_EXPORT.value)
  if _REPORT.value:
    command = "python " + " ".join(sys.argv)
    sft.write_report(summary, _REPORT.value, command, os.path.join(_WORKDIR.value, "curve.png"))


if __name__ == "__main__":
  cli.run(main)
