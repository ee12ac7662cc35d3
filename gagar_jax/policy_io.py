"""Policy folders in and out: the project's own, or a Hugging Face checkpoint.

A *policy folder* holds `tokenizer/` (with its chat template), `model.json` and
`params.safetensors`: what `experiments/sft.py --export=DIR` and an RL run's
`workdir/policy` write (the repository ships the pre-RL policy of `make run` this
way, in assets/pre_rl). An *HF folder* holds a Qwen2 / Llama `config.json`,
`model.safetensors` (or shards with `model.safetensors.index.json`), `tokenizer.json`,
`tokenizer_config.json` and a chat template (in it, or in `chat_template.jinja`);
`export_hf` (`experiments/export_hf.py`) writes one from a policy. A *GGUF file*
(llama.cpp's single-file format, `models/gguf_import.py`) holds the same in one file,
its weights quantized; they are dequantized to float32 as they are read.

`open_policy` reads and checks everything but the weights (so a config error comes
before any compute); `load` then reads the weights, straight into the sharded layout
when given a mesh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from gagar_jax import files, sharding
from gagar_jax.envs import transcript
from gagar_jax.errors import ConfigError, InputError
from gagar_jax.models import (
  chat_template,
  gguf_import,
  hf_export,
  hf_import,
  presets,
  tokenizers,
  transformer,
)

SHAPE_FIELDS = ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
# What a config may change on an HF checkpoint (numerics and a shorter context).
SAFE_OVERRIDES = ("dtype", "param_dtype", "max_seq_len", "remat", "scan_layers")
# How the experiment runs the model, not what the weights are: the config's, where it
# sets one (scan_layers None leaves the checkpoint's: an HF checkpoint scans).
RUNTIME_FIELDS = ("remat", "scan_layers")


@dataclasses.dataclass
class Policy:
  """A policy folder opened without its weights (see `open_policy`)."""

  path: str
  kind: str  # "policy", "hf" or "gguf"
  tok: tokenizers.HFTokenizer
  model_config: transformer.ModelConfig
  gguf: gguf_import.Checkpoint | None = None  # the opened file, for kind "gguf"


def kind(path: str, field: str = "init_from") -> str:
  """ "policy", "hf" or "gguf"; a ConfigError (naming `field`, the flag or config field
  that gave the path) saying what is missing for a path of none of these kinds."""
  if os.path.isfile(path) and (path.endswith(".gguf") or gguf_import.is_gguf(path)):
    return "gguf"
  if not os.path.isdir(path):
    what = (
      "does not exist" if not os.path.exists(path) else "is a file, not a folder (nor a .gguf file)"
    )
    raise ConfigError(field, f"{path!r} {what}")
  has = set(os.listdir(path))
  if "params.safetensors" in has:
    missing = [f for f in ("model.json", "tokenizer") if f not in has]
    if missing:
      raise ConfigError(field, f"policy folder {path!r} lacks {', '.join(missing)}")
    return "policy"
  if "config.json" in has:
    missing = []
    if not has & {"model.safetensors", "model.safetensors.index.json"}:
      missing.append("model.safetensors (or model.safetensors.index.json)")
    if "tokenizer.json" not in has:
      missing.append("tokenizer.json")
    if missing:
      raise ConfigError(field, f"HF folder {path!r} lacks {', '.join(missing)}")
    return "hf"
  raise ConfigError(
    field,
    f"{path!r} is neither a policy folder (params.safetensors, model.json, tokenizer/) "
    "nor a Hugging Face folder (config.json, model.safetensors, tokenizer.json) "
    "nor a .gguf file; "
    "make a policy with experiments/sft.py --export=DIR",
  )


def _read_hf_config(path: str, field: str) -> transformer.ModelConfig:
  try:
    return hf_import.read_config(path)
  except InputError:
    raise
  except (ValueError, KeyError) as e:
    raise ConfigError(field, f"{path}/config.json: {e}") from None


def _checkpoint_model_config(
  saved: transformer.ModelConfig, path: str, overrides, preset
) -> transformer.ModelConfig:
  """An imported checkpoint's shape `saved` (read from file `path`); `overrides`
  (config.model) may set only SAFE_OVERRIDES.

  Fields of `overrides` equal to the size `preset` they came from are not the user's
  (the presets describe the project's policies) and are ignored.
  """
  fields = {f: getattr(saved, f) for f in saved.__dataclass_fields__}
  for field, value in dict(overrides or {}).items():
    if field in RUNTIME_FIELDS:
      if value is not None:
        fields[field] = value
      continue
    if field not in fields or (preset is not None and preset.get(field) == value):
      continue
    if value == fields[field] or (isinstance(value, dict) and value == dict(fields[field] or {})):
      continue
    if field not in SAFE_OVERRIDES:
      raise ConfigError(
        f"model.{field}",
        f"{value!r} contradicts the checkpoint {path} ({fields[field]!r}); "
        f"with an imported init_from only {', '.join(SAFE_OVERRIDES)} may be set",
      )
    if field == "max_seq_len" and value > fields[field]:
      raise ConfigError(
        "model.max_seq_len",
        f"{value} exceeds the checkpoint's {fields[field]} positions ({path})",
      )
    fields[field] = value
  return transformer.ModelConfig.from_dict(fields)


def open_policy(
  path: str, model_overrides=None, *, preset=None, chat_template_spec="", field="init_from"
):
  """Reads and checks a policy or HF folder, all but its weights; returns a `Policy`.

  Args:
    path: the folder.
    model_overrides: the experiment's `config.model`. A policy folder's shape must
      agree with the fields the user set in it; an HF folder's or GGUF file's shape
      comes from the checkpoint, and the overrides may change only SAFE_OVERRIDES.
    preset: the size preset `config.model` came from (a dict), if any.
    chat_template_spec: a template to use instead of the folder's (`.jinja` path or text).
    field: the flag or config field that named `path` (in error messages).
  """
  what = kind(path, field)
  checkpoint = None
  if what == "gguf":
    checkpoint = gguf_import.open_file(path)  # header only: a damaged file fails here
    tok = _read_tokenizer(lambda: checkpoint.tokenizer(chat_template_spec), path, field)
    if tok.template is None:
      raise ConfigError(
        "chat_template",
        f"{path} has no tokenizer.chat_template; set config.chat_template to a .jinja file",
      )
    saved = checkpoint.config
    model_config = _checkpoint_model_config(saved, path, model_overrides, preset)
    return _checked(Policy(path, what, tok, model_config, checkpoint), field)
  tok_dir = os.path.join(path, "tokenizer") if what == "policy" else path
  tok = _read_tokenizer(
    lambda: tokenizers.HFTokenizer.from_file(tok_dir, chat_template=chat_template_spec),
    path,
    field,
  )
  if tok.template is None:
    raise ConfigError(
      "chat_template",
      f"the tokenizer in {tok_dir} has no chat template (neither chat_template.jinja nor "
      "tokenizer_config.json's chat_template); set config.chat_template to a .jinja file",
    )
  for name in _weight_files(path, what):  # headers only: a damaged file fails here
    files.check_safetensors(os.path.join(path, name))
  if what == "policy":
    saved = read_model_config(path)
    for key in SHAPE_FIELDS:  # a size preset's values are not the user's (as below)
      given = model_overrides is not None and key in model_overrides
      if given and preset is not None and preset.get(key) == model_overrides[key]:
        continue
      if given and model_overrides[key] != saved[key]:
        raise ConfigError(
          f"model.{key}",
          f"{model_overrides[key]} does not match the warm start in {path} ({saved[key]})",
        )
    runtime = {
      k: model_overrides[k] for k in RUNTIME_FIELDS if (model_overrides or {}).get(k) is not None
    }
    try:
      model_config = transformer.ModelConfig.from_dict({**saved, **runtime})
    except ConfigError as e:
      raise InputError(os.path.join(path, "model.json"), str(e)) from None
  else:
    saved = _read_hf_config(path, field)
    where = os.path.join(path, "config.json")
    model_config = _checkpoint_model_config(saved, where, model_overrides, preset)
  return _checked(Policy(path, what, tok, model_config), field)


def _read_tokenizer(read, path: str, field: str):
  try:
    return read()
  except chat_template.TemplateError as e:
    raise ConfigError("chat_template", str(e)) from None
  except InputError:
    raise
  except (ValueError, OSError) as e:
    raise ConfigError(field, f"tokenizer of {path}: {e}") from None


def _checked(policy: Policy, field: str) -> Policy:
  """`policy`, once its tokenizer is known to fit its embedding."""
  tok, model_config, path = policy.tok, policy.model_config, policy.path
  if tok.vocab_size > model_config.vocab_size:
    raise ConfigError(
      field,
      f"the tokenizer of {path} has {tok.vocab_size} tokens but the embedding only "
      f"{model_config.vocab_size} rows",
    )
  return policy


def describe(policy: Policy) -> str:
  """What the warm start is, in words: "policy folder", "hf folder" or "gguf file"."""
  return "gguf file" if policy.kind == "gguf" else f"{policy.kind} folder"


def open_from_config(config) -> Policy:
  """`open_policy` on an experiment config's `init_from`, `model` (from the size preset
  `model_preset`) and `chat_template`."""
  name = getattr(config, "model_preset", "")
  return open_policy(
    config.init_from,
    config.model,
    preset=presets.get(name) if name else None,
    chat_template_spec=getattr(config, "chat_template", ""),
  )


def load_weights(policy: Policy, *, mesh=None, rules=None) -> nnx.State:
  """The parameters of an opened policy (host arrays, or sharded over `mesh`)."""
  if policy.kind == "gguf":
    return policy.gguf.load_params(policy.model_config, mesh=mesh, rules=rules)
  if policy.kind == "hf":
    return hf_import.load_params(policy.path, policy.model_config, mesh=mesh, rules=rules)
  _, abstract = transformer.abstract(policy.model_config)
  file = os.path.join(policy.path, "params.safetensors")
  # Folders written before the blocks were stacked name each layer's tensors apart.
  try:
    arrays = transformer.stack_legacy_layers(files.read_safetensors(file))
  except ValueError as e:
    raise InputError(file, str(e)) from None
  flat = []
  for k, var in nnx.to_flat_state(abstract):
    name = "/".join(map(str, k))
    if name not in arrays or arrays[name].shape != var.get_value().shape:
      raise InputError(file, f"parameter {name} is missing or of the wrong shape")
    var.set_value(np.asarray(arrays[name]).astype(var.get_value().dtype))
    flat.append((k, var))
  params = nnx.from_flat_state(flat)
  if mesh is not None:
    params = jax.device_put(params, sharding.param_shardings(params, mesh, rules))
  return params


def load(
  path: str,
  model_overrides=None,
  *,
  preset=None,
  chat_template_spec="",
  mesh=None,
  rules=None,
  field="init_from",
):
  """(tokenizer, ModelConfig, params) of a policy or HF folder (see `open_policy`)."""
  policy = open_policy(
    path, model_overrides, preset=preset, chat_template_spec=chat_template_spec, field=field
  )
  return policy.tok, policy.model_config, load_weights(policy, mesh=mesh, rules=rules)


def export(path: str, tok, model_config: transformer.ModelConfig, params) -> None:
  """Writes a policy folder (the tokenizer keeps its config and chat template)."""
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


def export_hf(path: str, tok, model_config: transformer.ModelConfig, params) -> None:
  """Writes a Hugging Face folder (see `models/hf_export.py`); generation stops at the
  agent format's end-of-turn / end-of-action tokens as well as EOS."""

  stops = transcript.AgentFormat(tok).stop_token_ids
  hf_export.export(path, tok, model_config, params, stop_ids=stops)


def fingerprint(path: str) -> str:
  """sha256 of the weight files (a GGUF: the file): tells whether a warm start changed."""
  what = kind(path)
  names = _weight_files(path, what) if what != "gguf" else [os.path.basename(path)]
  folder = path if what != "gguf" else os.path.dirname(path)
  h = hashlib.sha256()
  for name in names:
    h.update(name.encode())
    with open(os.path.join(folder, name), "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
  return h.hexdigest()


def _weight_files(path: str, what: str) -> list[str]:
  if what == "policy":
    return ["params.safetensors"]
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    weight_map = files.read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise InputError(index, "lacks a weight_map object")
    return sorted(set(weight_map.values()))
  return ["model.safetensors"]


def read_model_config(path: str) -> dict:
  """The folder's `model.json` (shape fields and max_seq_len), without loading weights."""
  file = os.path.join(path, "model.json")
  saved = files.read_json(file)
  files.require(saved, SHAPE_FIELDS, file)
  return saved
