"""RL training (GAGAR / GRPO / ablations) from a warm-started policy.

    python experiments/train.py --config=configs/gagar.py --workdir=runs/gagar
    python experiments/train.py --config=configs/gagar.py:arm=grpo,seed=1 --workdir=runs/grpo_s1
    python experiments/train.py --config=configs/gagar.py:demo=True --profile_steps=3:5  # trace

Resumes automatically from the workdir's checkpoints.
"""

from absl import flags, logging
from ml_collections import config_flags

from gagar_jax import cli, trainer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/gagar.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/gagar", "Outputs and checkpoints go here.")
_PROFILE = flags.DEFINE_string(
  "profile_steps", "", "'a:b': a jax.profiler trace of RL steps a..b-1 into workdir/profile."
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # progress lines only; orbax/jax INFO is noise
  profile = trainer.parse_profile_steps(_PROFILE.value)
  trainer.Trainer(_CONFIG.value, _WORKDIR.value, profile_steps=profile).run()


if __name__ == "__main__":
  cli.run(main)
