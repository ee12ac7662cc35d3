"""Reads llama.cpp GGUF files: the model's shape, its tokenizer and chat template, its weights.

    checkpoint = gguf_import.open_file("SmolLM2-135M-Instruct.Q4_1.gguf")  # metadata only
    params = checkpoint.load_params(checkpoint.config)  # dequantized to float32

A GGUF file holds everything a Hugging Face folder spreads over `config.json`,
`tokenizer.json`, `tokenizer_config.json` and the safetensors: metadata under
`<arch>.*` (the shape), `tokenizer.ggml.*` (a byte-level BPE: tokens, merges, token
types, special ids) and `tokenizer.chat_template`, then the tensors, most of them
quantized in blocks. This module translates the metadata into a `config.json` dict
and the tensors into Hugging Face names and layouts, so the mapping onto our model is
`hf_import`'s, written once. The `gguf` package (NumPy only) parses the file and
dequantizes the blocks.

llama.cpp's converter stores the rows of a Llama q/k projection permuted for its own
rope layout (the two halves of each head interleaved); they are put back here.

`open_file` reads only the header: a truncated file, an unknown architecture or
tokenizer, missing metadata, a tensor of a type we cannot dequantize or of the wrong
shape all fail there, naming what is wrong, before any weight is read.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import tokenizers as hf
from gguf import quants

from gagar_jax.errors import InputError
from gagar_jax.models import chat_template as chat_lib
from gagar_jax.models import hf_import, tokenizers

# Tensor types we dequantize (the gguf package's NumPy kernels); others are refused by name.
TYPES = tuple(
  gguf.GGMLQuantizationType[t]
  for t in (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
  )
)  # fmt: skip
# general.architecture -> the config.json model_type / architectures entry.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# <arch>.<key> -> config.json key; the first five are required.
_SHAPE_KEYS = {
  "block_count": "num_hidden_layers",
  "embedding_length": "hidden_size",
  "feed_forward_length": "intermediate_size",
  "attention.head_count": "num_attention_heads",
  "context_length": "max_position_embeddings",
  "attention.head_count_kv": "num_key_value_heads",
  "rope.freq_base": "rope_theta",
  "attention.layer_norm_rms_epsilon": "rms_norm_eps",
  "attention.key_length": "head_dim",
}
_REQUIRED = tuple(list(_SHAPE_KEYS)[:5])
# llama.cpp tensor names (blocks: blk.{i}.) -> Hugging Face names (model.layers.{i}.).
_TENSORS = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_BLOCK_TENSORS = {
  "attn_norm.weight": "input_layernorm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
CONTROL, USER_DEFINED = 3, 4
# tokenizer.ggml.pre (llama.cpp's name for the pre-tokenizer's split) -> the split regex
# of the model's own tokenizer.json, None for GPT-2's (ByteLevel's built-in regex).
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
  r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
  "default": None,
  "gpt-2": None,
  "smollm": None,
  "qwen2": _QWEN2_SPLIT,
  "llama-bpe": _QWEN2_SPLIT.replace(r"\p{N}|", r"\p{N}{1,3}|"),
}


def is_gguf(path: str) -> bool:
  """Whether `path` is a file that starts with the GGUF magic."""
  try:
    with open(path, "rb") as f:
      return f.read(4) == b"GGUF"
  except OSError:
    return False


def hf_name(name: str) -> str | None:
  """The Hugging Face name of llama.cpp tensor `name` (None for one we do not know)."""
  if name in _TENSORS:
    return _TENSORS[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_TENSORS:
    return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
  return None


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation: within each head, its converter interleaves
  the two rope halves (rows [h, 2, d/2] stored as [h, d/2, 2])."""
  rows = w.shape[0]
  return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Checkpoint:
  """A GGUF file opened for its metadata (see `open_file`); weights are read on demand."""

  def __init__(self, path: str, reader: gguf.GGUFReader):
    self.path, self._reader = path, reader
    self.metadata = {}
    for key, field in reader.fields.items():
      if key.startswith("GGUF."):
        continue
      try:
        self.metadata[key] = field.contents()
      except Exception as e:  # the package's own error types vary by field kind
        raise InputError(path, f"metadata field {key} is unreadable ({e})") from None
    arch = self.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
      raise InputError(
        path,
        f"general.architecture={arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})",
      )
    self.arch = arch
    self.hf_config = self._hf_config()
    self.tensors = {}
    for t in reader.tensors:
      name = hf_name(t.name)
      if name is None:
        raise InputError(path, f"tensor {t.name} is not a {arch} tensor this reader knows")
      if t.tensor_type not in TYPES:
        raise InputError(
          path,
          f"tensor {t.name} is of type {t.tensor_type.name}, which is not supported "
          f"(supported: {', '.join(q.name for q in TYPES)})",
        )
      self.tensors[name] = t
    self.config = hf_import.config_from_hf(self.hf_config)
    self._check_shapes()

  def _meta(self, key: str, default=KeyError):
    if key in self.metadata:
      return self.metadata[key]
    if default is KeyError:
      raise InputError(self.path, f"lacks the metadata field {key}")
    return default

  def _hf_config(self) -> dict:
    a = self.arch
    for key in _REQUIRED:
      self._meta(f"{a}.{key}")
    out = {
      "architectures": [ARCHITECTURES[a]],
      "model_type": a,
      "hidden_act": "silu",
      "vocab_size": self._meta(f"{a}.vocab_size", None) or self._embedding_rows(),
    }
    for key, hf_key in _SHAPE_KEYS.items():
      value = self.metadata.get(f"{a}.{key}")
      if isinstance(value, float):  # stored as float32: its shortest decimal (1e-06)
        value = float(str(np.float32(value)))
      if value is not None:
        out[hf_key] = value
    scaling = self._meta(f"{a}.rope.scaling.type", "none")
    if scaling != "none":
      raise InputError(self.path, f"{a}.rope.scaling.type={scaling!r} is not supported")
    out["tie_word_embeddings"] = "output.weight" not in {t.name for t in self._reader.tensors}
    return out

  def _embedding_rows(self) -> int:
    for t in self._reader.tensors:
      if t.name == "token_embd.weight" and len(t.shape) == 2:
        return int(t.shape[1])
    return len(self._meta("tokenizer.ggml.tokens"))

  def _check_shapes(self) -> None:
    c = self.config
    heads, kv, hd, d = c.num_heads, c.num_kv_heads, c.head_dim, c.embed_dim
    want = {
      "model.embed_tokens.weight": (c.vocab_size, d),
      "model.norm.weight": (d,),
    }
    if not c.tie_embeddings:
      want["lm_head.weight"] = (c.vocab_size, d)
    block = {
      "input_layernorm.weight": (d,),
      "post_attention_layernorm.weight": (d,),
      "self_attn.q_proj.weight": (heads * hd, d),
      "self_attn.k_proj.weight": (kv * hd, d),
      "self_attn.v_proj.weight": (kv * hd, d),
      "self_attn.o_proj.weight": (d, heads * hd),
      "mlp.gate_proj.weight": (c.mlp_dim, d),
      "mlp.up_proj.weight": (c.mlp_dim, d),
      "mlp.down_proj.weight": (d, c.mlp_dim),
    }
    if c.qkv_bias:
      block.update(
        {
          "self_attn.q_proj.bias": (heads * hd,),
          "self_attn.k_proj.bias": (kv * hd,),
          "self_attn.v_proj.bias": (kv * hd,),
        }
      )
    for i in range(c.num_layers):
      want.update({f"model.layers.{i}.{k}": v for k, v in block.items()})
    for name, shape in want.items():
      if name not in self.tensors:
        raise InputError(self.path, f"lacks the tensor {_gguf_name(name)}")
      got = tuple(int(n) for n in reversed(self.tensors[name].shape))
      if got != shape:
        raise InputError(self.path, f"tensor {_gguf_name(name)} has shape {got}, expected {shape}")
    extra = sorted(set(self.tensors) - set(want))
    if extra:
      raise InputError(self.path, f"tensor {_gguf_name(extra[0])} does not belong to this model")

  def get(self, name: str) -> np.ndarray:
    """The tensor of Hugging Face name `name`, float32, in Hugging Face layout."""
    t = self.tensors[name]
    value = quants.dequantize(t.data, t.tensor_type)
    value = np.asarray(value, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
    if self.arch == "llama" and name.endswith("q_proj.weight"):
      value = unpermute(value, self.config.num_heads)
    elif self.arch == "llama" and name.endswith("k_proj.weight"):
      value = unpermute(value, self.config.num_kv_heads)
    return value

  def load_params(self, config, *, mesh=None, rules=None):
    """The parameters as an `nnx.State` of `config` (this file's shape, with the
    experiment's numerics), placed over `mesh` when given."""
    return hf_import.load_params(self.path, config, mesh=mesh, rules=rules, weights=_Weights(self))

  def tokenizer(self, chat_template: str = "") -> tokenizers.HFTokenizer:
    """The byte-level BPE tokenizer of `tokenizer.ggml.*`, with the file's chat template
    (or `chat_template`, a `.jinja` path or Jinja text, instead)."""
    return build_tokenizer(self.metadata, self.path, chat_template)


class _Weights:
  """`hf_import`'s weight source over a GGUF file (Hugging Face names)."""

  def __init__(self, checkpoint: Checkpoint):
    self._ckpt, self.used = checkpoint, set()

  def __contains__(self, name):
    return name in self._ckpt.tensors

  def get(self, name: str) -> np.ndarray:
    if name not in self._ckpt.tensors:
      raise KeyError(f"{self._ckpt.path}: tensor {_gguf_name(name)} missing")
    self.used.add(name)
    return self._ckpt.get(name)

  def unused(self) -> list[str]:
    return sorted(set(self._ckpt.tensors) - self.used)


def _gguf_name(hf: str) -> str:
  """The llama.cpp name of Hugging Face tensor `hf` (for messages)."""
  inverse = {v: k for k, v in _TENSORS.items()}
  if hf in inverse:
    return inverse[hf]
  if hf.startswith("model.layers."):
    i, rest = hf[len("model.layers.") :].split(".", 1)
    block = {v: k for k, v in _BLOCK_TENSORS.items()}
    return f"blk.{i}.{block.get(rest, rest)}"
  return hf


def open_file(path: str) -> Checkpoint:
  """Opens GGUF file `path` for its metadata; an `InputError` naming what is wrong for a
  file that is not a complete GGUF of a supported model."""
  if not os.path.isfile(path):
    raise InputError(path, "file not found")
  if not is_gguf(path):
    raise InputError(path, "is not a GGUF file (it does not start with the GGUF magic)")
  try:
    reader = gguf.GGUFReader(path, "r")
  except Exception as e:  # the reader raises ValueError, IndexError, ... on damage
    raise InputError(path, f"is not a readable GGUF file ({type(e).__name__}: {e})") from None
  size = os.path.getsize(path)
  for t in reader.tensors:
    if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
      raise InputError(
        path,
        f"is truncated: tensor {t.name} needs bytes up to {t.data_offset + t.n_bytes}, "
        f"the file has {size}",
      )
  return Checkpoint(path, reader)


def build_tokenizer(meta: dict, path: str, chat_template: str = "") -> tokenizers.HFTokenizer:
  """A `tokenizers.HFTokenizer` from GGUF metadata `meta` (read from `path`)."""
  model = meta.get("tokenizer.ggml.model")
  if model != "gpt2":
    raise InputError(
      path, f"tokenizer.ggml.model={model!r} is not supported (only 'gpt2', a byte-level BPE)"
    )
  for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id"):
    if key not in meta:
      raise InputError(path, f"lacks the metadata field {key}")
  tokens = list(meta["tokenizer.ggml.tokens"])
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  if len(types) != len(tokens):
    raise InputError(path, f"has {len(tokens)} tokens but {len(types)} token types")
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  backend = hf.Tokenizer(
    hf.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
  )
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise InputError(
      path, f"tokenizer.ggml.pre={pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})"
    )
  if PRE_TOKENIZERS[pre] is None:
    backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  else:  # as the model's own tokenizer.json: NFC, the split, then bytes
    backend.normalizer = hf.normalizers.NFC() if pre == "qwen2" else None
    backend.pre_tokenizer = hf.pre_tokenizers.Sequence(
      [
        hf.pre_tokenizers.Split(hf.Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),
        hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
      ]
    )
  backend.decoder = hf.decoders.ByteLevel()
  added = [
    hf.AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
    for i in range(len(tokens))
    if types[i] in (CONTROL, USER_DEFINED)
  ]
  backend.add_tokens(added)

  def name(key):
    i = meta.get(f"tokenizer.ggml.{key}_token_id")
    if i is None:
      return None
    if not 0 <= int(i) < len(tokens):
      raise InputError(path, f"tokenizer.ggml.{key}_token_id={i} is outside the vocabulary")
    return tokens[int(i)]

  config = {f"{k}_token": name(k) for k in ("bos", "eos", "unknown", "padding")}
  config = {
    "bos_token": config["bos_token"],
    "eos_token": config["eos_token"],
    "unk_token": config["unknown_token"],
    "pad_token": config["padding_token"] or config["eos_token"],
    "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
  }
  config = {k: v for k, v in config.items() if v is not None}
  for token in ("eos_token", "pad_token"):  # the ids must be special to serve as stops
    if config[token] not in {t.content for t in added if t.special}:
      backend.add_special_tokens([config[token]])
  tok = tokenizers.HFTokenizer(
    backend,
    eos_token=config["eos_token"],
    pad_token=config["pad_token"],
    config=config,
    name=f"tokenizer of {path}",
  )
  if chat_template:
    source, where = chat_lib.load_source(chat_template)
  else:
    source, where = meta.get("tokenizer.chat_template"), "tokenizer.chat_template"
  if source is not None:
    tok.set_template(source, name=f"chat template ({where} of {path})")
  return tok
