"""Exports a policy folder (e.g. an RL run's workdir/policy) as a Hugging Face folder.

    python experiments/export_hf.py --policy=runs/gagar/policy --out=runs/gagar/hf

The result loads in `transformers` (`AutoModelForCausalLM.from_pretrained(out)`,
`AutoTokenizer.from_pretrained(out)` with the chat template), vLLM, lm-eval and
EvalPlus, and back here with `--config.init_from=out`. A policy imported from an HF
folder keeps that tokenizer's files and template.
"""

from absl import flags, logging

from gagar_jax import cli, policy_io
from gagar_jax import workdir as workdir_lib
from gagar_jax.models import hf_export

_POLICY = flags.DEFINE_string("policy", None, "The policy (or HF) folder to export.")
_OUT = flags.DEFINE_string("out", None, "Where the Hugging Face folder goes.")
flags.mark_flags_as_required(["policy", "out"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir_lib.check_output_folder(_OUT.value, "out", keeps=hf_export.WEIGHT_FILES)
  tok, model_config, params = policy_io.load(_POLICY.value, field="policy")
  policy_io.export_hf(_OUT.value, tok, model_config, params)
  print(
    f"exported {_POLICY.value} ({model_config.num_params() / 1e6:.2f}M parameters, "
    f"{hf_export.hf_config(model_config, tok)['architectures'][0]}) to {_OUT.value}"
  )


if __name__ == "__main__":
  cli.run(main)
