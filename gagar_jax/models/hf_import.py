"""Loads Hugging Face Qwen2 / Llama checkpoints (`config.json` + safetensors) into NNX.

    model = hf_import.load("/path/to/Qwen2.5-Coder-0.5B")
    logits = model(tokens)  # int32 [B, T] -> float32 [B, T, V]

Reads a single `model.safetensors` or a sharded set through
`model.safetensors.index.json`, with NumPy only (no torch). With a mesh, every
tensor is placed straight into its sharded layout as it is read, so a model
larger than one device never lives whole on any device.

Layout changes from the PyTorch `nn.Linear` convention (weight `[out, in]`):
q/k/v `[H*Dh, D]` -> `[D, H, Dh]`; o `[D, H*Dh]` -> `[H, Dh, D]`; MLP and
`lm_head` are transposed.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open

from gagar_jax import files
from gagar_jax import sharding as sharding_lib
from gagar_jax.errors import InputError
from gagar_jax.models import transformer

SUPPORTED = ("qwen2", "llama")
# config.json `architectures` entries this loader reads, and their model_type.
ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}


def config_from_hf(
  hf: dict[str, Any], *, dtype: str = "float32", param_dtype: str = "float32"
) -> transformer.ModelConfig:
  """Maps a Hugging Face `config.json` dict onto `ModelConfig`."""
  for arch in hf.get("architectures") or ():
    if arch not in ARCHITECTURES:
      raise ValueError(
        f"config.json architectures entry {arch!r} is not supported "
        f"(supported: {', '.join(ARCHITECTURES)})"
      )
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED:
    raise ValueError(f"config.json model_type={model_type!r}; supported: {SUPPORTED}")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}; only 'silu' is supported")
  if hf.get("mlp_bias"):
    raise ValueError("config.json mlp_bias=true is not supported")
  if hf.get("use_sliding_window"):
    raise ValueError("config.json use_sliding_window=true is not supported")
  heads = hf["num_attention_heads"]
  # Transformers 5 nests rope settings under rope_parameters; 4.x keeps them at top level.
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  scaling = None
  if rope_type == "llama3":
    scaling = {k: float(rope[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")}
    scaling["original_max_position_embeddings"] = float(rope["original_max_position_embeddings"])
  elif rope_type != "default":
    raise ValueError(f"rope type {rope_type!r} is not supported (default, llama3)")
  return transformer.ModelConfig.from_dict(
    dict(
      vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      mlp_dim=hf["intermediate_size"],
      rope_theta=float(theta),
      rope_scaling=scaling,
      norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      qkv_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      dtype=dtype,
      param_dtype=param_dtype,
      max_seq_len=int(hf.get("max_position_embeddings", 4096)),
      scan_layers=True,  # real checkpoints: compile time flat in depth
    ),
    prefix="config.json",
  )


class _Weights:
  """Lazy access to the tensors of a (possibly sharded) safetensors checkpoint."""

  def __init__(self, path: str):

    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      weight_map = files.read_json(index).get("weight_map")
      if not isinstance(weight_map, dict):
        raise InputError(index, "lacks a weight_map object")
    elif os.path.exists(single):
      with safe_open(single, framework="numpy") as f:
        weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    else:
      raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
    self._path, self._map, self._open = path, weight_map, safe_open
    self.used: set[str] = set()

  def __contains__(self, name):
    return name in self._map

  def get(self, name: str) -> np.ndarray:
    if name not in self._map:
      raise KeyError(f"{self._path}: tensor {name!r} missing from the checkpoint")
    self.used.add(name)
    with self._open(os.path.join(self._path, self._map[name]), framework="numpy") as f:
      return np.asarray(f.get_tensor(name))  # bf16 arrives as ml_dtypes.bfloat16

  def unused(self) -> list[str]:
    return sorted(set(self._map) - self.used)


def _converters(c: transformer.ModelConfig):
  """Our parameter path -> (HF tensor name, HF -> ours, ours -> HF).

  The blocks' parameters (paths under `layers`) are stacked on a leading layer axis;
  their HF name is a template with `{}` for the layer index, and the conversions
  apply to one layer's tensor.
  """
  d, h, k, hd = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim
  same = (lambda w: w, lambda w: w)
  transpose = (lambda w: w.T, lambda w: w.T)

  def heads_in(n):  # q/k/v: [n*hd, d] <-> [d, n, hd]
    return (lambda w: w.T.reshape(d, n, hd), lambda w: w.reshape(d, n * hd).T)

  def bias(n):
    return (lambda w: w.reshape(n, hd), lambda w: w.reshape(n * hd))

  table = {
    ("embed",): ("model.embed_tokens.weight", *same),
    ("final_norm", "scale"): ("model.norm.weight", *same),
  }
  if not c.tie_embeddings:
    table[("lm_head",)] = ("lm_head.weight", *transpose)
  p = "model.layers.{}."
  table.update(
    {
      ("layers", "input_norm", "scale"): (p + "input_layernorm.weight", *same),
      ("layers", "post_attn_norm", "scale"): (p + "post_attention_layernorm.weight", *same),
      ("layers", "attn", "q_proj"): (p + "self_attn.q_proj.weight", *heads_in(h)),
      ("layers", "attn", "k_proj"): (p + "self_attn.k_proj.weight", *heads_in(k)),
      ("layers", "attn", "v_proj"): (p + "self_attn.v_proj.weight", *heads_in(k)),
      ("layers", "attn", "o_proj"): (
        p + "self_attn.o_proj.weight",
        lambda w: w.T.reshape(h, hd, d),
        lambda w: w.reshape(h * hd, d).T,
      ),
      ("layers", "mlp", "gate_proj"): (p + "mlp.gate_proj.weight", *transpose),
      ("layers", "mlp", "up_proj"): (p + "mlp.up_proj.weight", *transpose),
      ("layers", "mlp", "down_proj"): (p + "mlp.down_proj.weight", *transpose),
    }
  )
  if c.qkv_bias:
    table.update(
      {
        ("layers", "attn", "q_bias"): (p + "self_attn.q_proj.bias", *bias(h)),
        ("layers", "attn", "k_bias"): (p + "self_attn.k_proj.bias", *bias(k)),
        ("layers", "attn", "v_bias"): (p + "self_attn.v_proj.bias", *bias(k)),
      }
    )
  return table


def read_config(path: str, *, dtype: str = "float32", param_dtype: str = "float32"):
  """The `ModelConfig` of the HF folder `path` (its `config.json`), weights unread."""
  saved = files.read_json(os.path.join(path, "config.json"))
  return config_from_hf(saved, dtype=dtype, param_dtype=param_dtype)


def load_params(
  path: str,
  config: transformer.ModelConfig,
  *,
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
  weights=None,
) -> nnx.State:
  """The parameters of HF folder `path` as an `nnx.State` of `config`'s shape.

  With `mesh`, each tensor is placed in its sharded layout as it is read (host
  arrays otherwise). Every parameter must be found and every checkpoint tensor used.
  `weights` replaces the folder's safetensors as the source of HF-named tensors (an
  object with `get(name)` and `unused()`, as `gguf_import` gives).
  """
  _, state = transformer.abstract(config)
  shardings = None
  if mesh is not None:
    shardings = sharding_lib.param_shardings(state, mesh, rules)
  weights = weights if weights is not None else _Weights(path)
  table = _converters(config)
  flat = dict(nnx.to_flat_state(state))
  flat_shardings = dict(nnx.to_flat_state(shardings)) if shardings is not None else {}
  for key, var in flat.items():
    if key not in table:
      raise KeyError(f"no Hugging Face tensor mapped to parameter {'/'.join(map(str, key))}")
    name, convert, _ = table[key]
    if key[0] == "layers":  # one tensor per layer, stacked
      value = np.stack([convert(weights.get(name.format(i))) for i in range(config.num_layers)])
      name = name.format("*")
    else:
      value = convert(weights.get(name))
    target = var.get_value()  # a ShapeDtypeStruct
    if value.shape != target.shape:
      raise ValueError(
        f"{name}: shape {value.shape} does not fit parameter "
        f"{'/'.join(map(str, key))} {target.shape}"
      )
    value = np.ascontiguousarray(value.astype(target.dtype))
    if key in flat_shardings:
      var.set_value(jax.device_put(value, flat_shardings[key].get_value()))
    else:
      var.set_value(value)
  unused = [n for n in weights.unused() if not n.endswith("rotary_emb.inv_freq")]
  if config.tie_embeddings:
    unused = [n for n in unused if n != "lm_head.weight"]
  if unused:
    raise ValueError(
      f"{path}: checkpoint tensors not used by the model: {unused[:5]}"
      f"{' ...' if len(unused) > 5 else ''}"
    )
  return nnx.from_flat_state(flat)


def to_hf_tensors(config: transformer.ModelConfig, params) -> dict[str, np.ndarray]:
  """Our parameters (an `nnx.State`) as HF-named tensors (the inverse of `load_params`)."""
  table = _converters(config)
  out = {}
  for key, var in nnx.to_flat_state(params):
    name, _, convert = table[tuple(key)]
    value = np.asarray(jax.device_get(var.get_value()))
    if key[0] == "layers":
      for i, layer in enumerate(value):
        out[name.format(i)] = np.ascontiguousarray(convert(layer))
    else:
      out[name] = np.ascontiguousarray(convert(value))
  return out


def load(
  path: str,
  *,
  dtype: str = "float32",
  param_dtype: str = "float32",
  mesh: jax.sharding.Mesh | None = None,
  rules=None,
) -> transformer.Transformer:
  """Reads a Hugging Face Qwen2/Llama model folder into a `Transformer`.

  Args:
    path: folder with `config.json` and safetensors weights.
    dtype: compute dtype (`float32` or `bfloat16`); logits are always float32.
    param_dtype: storage dtype of the parameters.
    mesh: optional mesh; with it each tensor is placed in its sharded layout.
    rules: logical-axis rules for `mesh` (default: `sharding.DEFAULT_RULES`).

  Returns:
    The model; `model(tokens [B, T] int32)` gives float32 logits `[B, T, V]`.
  """
  config = read_config(path, dtype=dtype, param_dtype=param_dtype)
  graphdef, _ = transformer.abstract(config)
  params = load_params(path, config, mesh=mesh, rules=rules)
  return nnx.merge(graphdef, jax.tree.map(jnp.asarray, params))
