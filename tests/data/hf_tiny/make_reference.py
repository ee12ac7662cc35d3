"""Regenerates the tiny Hugging Face checkpoints and reference logits in this folder.

Needs `torch` and `transformers` (not project dependencies), e.g.:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 transformers==5.24.0
    /tmp/ref/bin/python tests/data/hf_tiny/make_reference.py

Writes, per architecture, a folder with `config.json` and safetensors weights
(the Llama one sharded, with `model.safetensors.index.json`) and
`reference.npz` holding the input tokens and the float32 logits of the
`transformers` PyTorch implementation. Weights are random but far from the
default 0.02 init (biases and norm scales too) so that a mis-mapped tensor
shows up in the logits. `tests/test_hf_import.py` compares against them.
"""

import os
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = {
  "qwen2": transformers.Qwen2Config(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    max_position_embeddings=256,
  ),
  "llama": transformers.LlamaConfig(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    attention_bias=False,
    max_position_embeddings=256,
    rope_parameters={
      "rope_type": "llama3",
      "rope_theta": 500_000.0,
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16,
    },
  ),
}


def main():
  torch.manual_seed(0)
  for name, config in CONFIGS.items():
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
      for pname, p in model.named_parameters():
        if "norm" in pname:
          p.copy_(1.0 + 0.2 * torch.randn_like(p))
        else:
          p.copy_(0.15 * torch.randn_like(p))
    out = os.path.join(HERE, name)
    # Llama is written in shards to exercise the index file.
    model.save_pretrained(out, max_shard_size="40KB" if name == "llama" else "10GB")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(2, 24)).astype(np.int32)
    with torch.no_grad():
      logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
    np.savez(os.path.join(out, "reference.npz"), tokens=tokens, logits=logits)
    print(
      f"{name}: {sorted(os.listdir(out))}, logits absmax {np.abs(logits).max():.2f}",
      file=sys.stderr,
    )
  print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)


if __name__ == "__main__":
  main()
