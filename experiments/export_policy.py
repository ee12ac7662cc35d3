"""Exports the latest checkpoint of an SFT workdir as a portable policy folder.

    python experiments/export_policy.py --config=configs/sft.py --workdir=runs/sft \\
        --out=assets/pre_rl

(`experiments/sft.py --export=DIR` does the same at the end of a run.)
"""

import json
import os

from absl import flags, logging
from ml_collections import config_flags

from gagar_jax import cli, policy_io, sft, sharding, skeleton
from gagar_jax import workdir as workdir_lib
from gagar_jax.errors import InputError
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.models import tokenizers, transformer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sft.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "The SFT run's workdir.")
_OUT = flags.DEFINE_string("out", "assets/pre_rl", "Where the policy folder goes.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config, workdir = _CONFIG.value, _WORKDIR.value
  workdir_lib.check_output_folder(_OUT.value, "out", keeps=skeleton.POLICY_FILES)
  tok = tokenizers.HFTokenizer.from_file(os.path.join(workdir, "tokenizer"))
  model_config = transformer.ModelConfig.from_dict({**config.model, "vocab_size": tok.vocab_size})
  mesh = sharding.make_mesh(config.mesh)
  trainer = sft.SFTTrainer(sft.parse_config(config).sft, model_config, mesh)
  ckpt = Checkpointer(
    os.path.join(workdir, "checkpoints"), trainer.abstract_state, trainer.state_shardings
  )
  restored = ckpt.restore_newest()
  if restored is None:
    raise InputError(ckpt.directory, "no checkpoint to export")
  state = restored[1]
  policy_io.export(_OUT.value, tok, model_config, state.params)
  summary = os.path.join(workdir, "summary.json")
  if os.path.exists(summary):
    with open(summary) as f:
      s = json.load(f)
    with open(os.path.join(_OUT.value, "summary.json"), "w") as f:
      json.dump({k: v for k, v in s.items() if k != "curve"}, f, indent=2)
  print(f"exported step {int(state.step)} of {workdir} to {_OUT.value}")


if __name__ == "__main__":
  cli.run(main)
