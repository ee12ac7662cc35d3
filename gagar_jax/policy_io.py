"""A portable policy folder: `tokenizer/`, `model.json` and `params.safetensors`.

What `experiments/sft.py --export=DIR` writes and `configs/gagar.py:init_from` reads
(the repository ships the pre-RL policy of `make run` this way, in assets/pre_rl).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

from gagar_jax.errors import ConfigError
from gagar_jax.models import tokenizers, transformer


def export(path: str, tok, model_config: transformer.ModelConfig, params) -> None:
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer"))
  with open(os.path.join(path, "model.json"), "w") as f:
    d = {k: getattr(model_config, k) for k in model_config.__dataclass_fields__}
    d["rope_scaling"] = dict(d["rope_scaling"]) if d["rope_scaling"] else None
    json.dump(d, f, indent=2)
  flat = {
    "/".join(map(str, k)): np.asarray(jax.device_get(v.get_value()))
    for k, v in nnx.to_flat_state(params)
  }
  save_file(flat, os.path.join(path, "params.safetensors"))


def fingerprint(path: str) -> str:
  """sha256 of the folder's parameters: tells whether a warm start changed."""
  import hashlib

  h = hashlib.sha256()
  with open(os.path.join(path, "params.safetensors"), "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def read_model_config(path: str) -> dict:
  """The folder's `model.json` (shape fields and max_seq_len), without loading weights."""
  with open(os.path.join(path, "model.json")) as f:
    return json.load(f)


def load(path: str, model_overrides=None):
  """(tokenizer, ModelConfig, params `nnx.State` on the host).

  `model_overrides` (the experiment's `config.model`) must agree with the saved
  shape; a mismatch is a ConfigError naming the field.
  """
  tok = tokenizers.HFTokenizer.from_file(os.path.join(path, "tokenizer"))
  saved = read_model_config(path)
  if model_overrides is not None:
    for key in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"):
      if key in model_overrides and model_overrides[key] != saved[key]:
        raise ConfigError(
          f"model.{key}",
          f"{model_overrides[key]} does not match the warm start in {path} ({saved[key]})",
        )
  model_config = transformer.ModelConfig.from_dict(saved)
  _, abstract = transformer.abstract(model_config)
  arrays = load_file(os.path.join(path, "params.safetensors"))
  flat = []
  for k, var in nnx.to_flat_state(abstract):
    name = "/".join(map(str, k))
    if name not in arrays or arrays[name].shape != var.get_value().shape:
      raise ValueError(f"{path}: parameter {name} missing or of the wrong shape")
    var.set_value(np.asarray(arrays[name]))
    flat.append((k, var))
  return tok, model_config, nnx.from_flat_state(flat)
