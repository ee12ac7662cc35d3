"""Exports the latest checkpoint of an SFT workdir as a portable policy folder.

    python experiments/export_policy.py --config=configs/sft.py --workdir=runs/sft \\
        --out=assets/pre_rl

(`experiments/sft.py --export=DIR` does the same at the end of a run.)
"""

import json
import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from gagar_jax import policy_io, sft, sharding
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.models import tokenizers, transformer

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sft.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sft", "The SFT run's workdir.")
_OUT = flags.DEFINE_string("out", "assets/pre_rl", "Where the policy folder goes.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config, workdir = _CONFIG.value, _WORKDIR.value
  tok = tokenizers.HFTokenizer.from_file(os.path.join(workdir, "tokenizer"))
  model_config = transformer.ModelConfig.from_dict({**config.model, "vocab_size": tok.vocab_size})
  mesh = sharding.make_mesh(config.mesh)
  trainer = sft.SFTTrainer(sft.parse_config(config), model_config, mesh)
  ckpt = Checkpointer(
    os.path.join(workdir, "checkpoints"), trainer.abstract_state, trainer.state_shardings
  )
  state, _ = ckpt.restore()
  policy_io.export(_OUT.value, tok, model_config, state.params)
  summary = os.path.join(workdir, "summary.json")
  if os.path.exists(summary):
    with open(summary) as f:
      s = json.load(f)
    with open(os.path.join(_OUT.value, "summary.json"), "w") as f:
      json.dump({k: v for k, v in s.items() if k != "curve"}, f, indent=2)
  print(f"exported step {int(state.step)} of {workdir} to {_OUT.value}")


if __name__ == "__main__":
  jax.config.config_with_absl()  # JAX's own flags (--jax_platforms, ...) on the command line
  app.run(main)
