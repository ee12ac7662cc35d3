"""Writes a policy as a Hugging Face folder: `config.json`, safetensors, tokenizer files.

    hf_export.export("runs/qwen/hf", tok, model_config, params, stop_ids=(eot,))

The folder is what `transformers` (`AutoModelForCausalLM` / `AutoTokenizer`), vLLM,
lm-eval and EvalPlus read: a Qwen2 `config.json` when the model has QKV biases, else
a Llama one (Llama-3 rope scaling included); HF tensor names and the PyTorch
`nn.Linear` layout; `tokenizer.json`, `tokenizer_config.json` and the chat template
(`chat_template.jinja`); a `generation_config.json` whose EOS ids include the given
stop tokens (`policy_io.export_hf` passes the end-of-turn and end-of-action tokens,
so generation stops where a rollout's action does). `hf_import` reads it back to the
same parameters.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from gagar_jax.models import hf_import, transformer

# The weight files an HF folder holds (one of them); an earlier export may be overwritten.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# Tensors per safetensors file before the checkpoint is sharded with an index.
MAX_SHARD_BYTES = 4 << 30


def hf_config(c: transformer.ModelConfig, tok) -> dict:
  """The `config.json` of model `c` (in the `transformers` 4.x field names, which 5.x
  and vLLM also read)."""
  qwen = c.qkv_bias
  d = {
    "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
    "model_type": "qwen2" if qwen else "llama",
    "vocab_size": c.vocab_size,
    "hidden_size": c.embed_dim,
    "intermediate_size": c.mlp_dim,
    "num_hidden_layers": c.num_layers,
    "num_attention_heads": c.num_heads,
    "num_key_value_heads": c.num_kv_heads,
    "head_dim": c.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": c.max_seq_len,
    "rms_norm_eps": c.norm_eps,
    "rope_theta": c.rope_theta,
    "rope_scaling": None,
    "tie_word_embeddings": c.tie_embeddings,
    "torch_dtype": c.param_dtype,
    "bos_token_id": _special_id(tok, "bos_token"),
    "eos_token_id": tok.eos_id,
    "pad_token_id": tok.pad_id,
    "use_cache": True,
  }
  if c.rope_scaling is not None:
    d["rope_scaling"] = {"rope_type": "llama3", **dict(c.rope_scaling)}
    d["rope_scaling"]["original_max_position_embeddings"] = int(
      d["rope_scaling"]["original_max_position_embeddings"]
    )
  if qwen:
    d.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.num_layers)
  else:
    d.update(attention_bias=False, mlp_bias=False)
  return d


def _special_id(tok, name: str):
  text = getattr(tok, "template_tokens", {}).get(name)
  return getattr(tok, "special_tokens", {}).get(text) if text else None


def export(path: str, tok, model_config: transformer.ModelConfig, params, stop_ids=()) -> None:
  """Writes the HF folder `path` for a policy (tokenizer, ModelConfig, `nnx.State`).

  `stop_ids`: tokens besides EOS that end a generation (`generation_config.json`).
  """
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_config(model_config, tok), f, indent=2)
  stops = [tok.eos_id, *(i for i in stop_ids if i != tok.eos_id)]
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump(
      {
        "bos_token_id": _special_id(tok, "bos_token"),
        "eos_token_id": stops if len(stops) > 1 else stops[0],
        "pad_token_id": tok.pad_id,
      },
      f,
      indent=2,
    )
  tensors = hf_import.to_hf_tensors(model_config, params)
  _save_tensors(path, tensors)
  tok.save(path)
  # A tokenizer the project trained names no class; transformers then needs one.
  config_file = os.path.join(path, "tokenizer_config.json")
  with open(config_file) as f:
    config = json.load(f)
  config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
  config.setdefault("model_max_length", model_config.max_seq_len)
  with open(config_file, "w") as f:
    json.dump(config, f, indent=2)


def _save_tensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  """One `model.safetensors`, or shards of at most MAX_SHARD_BYTES with an index."""
  for name in os.listdir(path):  # a previous export's weights would be read too
    if name.startswith("model") and name.endswith((".safetensors", ".safetensors.index.json")):
      os.remove(os.path.join(path, name))
  shards, size = [{}], 0
  for name, value in tensors.items():
    if size and size + value.nbytes > MAX_SHARD_BYTES:
      shards.append({})
      size = 0
    shards[-1][name] = value
    size += value.nbytes
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return
  weight_map = {}
  for i, shard in enumerate(shards, 1):
    file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, file), metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(shard, file))
  total = sum(v.nbytes for v in tensors.values())
  with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
