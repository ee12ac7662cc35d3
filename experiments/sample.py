"""Sampler demo: batched, multi-turn KV-cache sampling, checked against re-forward decoding.

    python experiments/sample.py --config=configs/sampler_demo.py --workdir=runs/demo

Writes `summary.json` to the workdir.
"""

from absl import app, flags
from ml_collections import config_flags

from gagar_jax import sampler_demo

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sampler_demo.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Where outputs are written.")


def main(argv):
  del argv
  sampler_demo.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
