"""Small GGUF files for the tests, written with the `gguf` package's own writer.

`from_hf_folder` converts one of the tiny Hugging Face folders of `tests/data/hf_tiny`
the way llama.cpp's converter does (llama.cpp tensor names, Llama q/k rows permuted for
its rope layout, the tokenizer as `tokenizer.ggml.*`), each tensor in the type asked
for. The K-quant formats have no NumPy quantizer; `k_quant_blocks` makes random valid
blocks of them and `dequantize_reference` decodes them, written from llama.cpp's
`dequantize_row_q{4,5,6}_K` independently of the package.
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
from gguf import quants
from safetensors.numpy import load_file

Q = gguf.GGMLQuantizationType
# Hugging Face tensor names -> llama.cpp names (the inverse of the importer's table).
_TOP = {
  "model.embed_tokens.weight": "token_embd.weight",
  "model.norm.weight": "output_norm.weight",
  "lm_head.weight": "output.weight",
}
_BLOCK = {
  "input_layernorm.weight": "attn_norm.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.o_proj.weight": "attn_output.weight",
  "self_attn.q_proj.bias": "attn_q.bias",
  "self_attn.k_proj.bias": "attn_k.bias",
  "self_attn.v_proj.bias": "attn_v.bias",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
  if hf in _TOP:
    return _TOP[hf]
  i, rest = hf[len("model.layers.") :].split(".", 1)
  return f"blk.{i}.{_BLOCK[rest]}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's converter's q/k permutation (`LlamaModel.permute`)."""
  return (
    w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
  )


def hf_tensors(folder: str) -> dict[str, np.ndarray]:
  out = {}
  for name in sorted(os.listdir(folder)):
    if name.endswith(".safetensors"):
      out.update(load_file(os.path.join(folder, name)))
  return {k: np.asarray(v, np.float32) for k, v in out.items()}


def tokenizer_metadata(folder: str) -> dict:
  """tokenizer.ggml.* (and the chat template) from a folder's tokenizer.json."""
  spec = json.load(open(os.path.join(folder, "tokenizer.json")))
  vocab = dict(spec["model"]["vocab"])
  special = set()
  for added in spec["added_tokens"]:
    vocab[added["content"]] = added["id"]
    if added["special"]:
      special.add(added["id"])
  tokens = [None] * (max(vocab.values()) + 1)
  for t, i in vocab.items():
    tokens[i] = t
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
  config_file = os.path.join(folder, "tokenizer_config.json")
  config = json.load(open(config_file)) if os.path.exists(config_file) else {}
  template = config.get("chat_template")
  if os.path.exists(os.path.join(folder, "chat_template.jinja")):
    template = open(os.path.join(folder, "chat_template.jinja")).read()
  pre = "qwen2" if spec["pre_tokenizer"]["type"] == "Sequence" else "gpt-2"
  return {
    "tokens": tokens, "special": special, "merges": merges, "template": template, "pre": pre
  }  # fmt: skip


def write(
  path: str,
  arch: str,
  hf_config: dict,
  tensors: dict[str, np.ndarray],
  tokenizer: dict,
  *,
  types: dict[str, Q] | None = None,
  raw: dict[str, tuple[np.ndarray, Q]] | None = None,
  eos: str,
  bos: str | None = None,
  omit_metadata: tuple[str, ...] = (),
) -> None:
  """Writes a GGUF of `tensors` (Hugging Face names and layout, float32), each quantized
  to `types[name]` (default F32); `raw` gives ready quantized blocks (bytes, type)."""
  c = hf_config
  w = gguf.GGUFWriter(path, arch)
  meta = {
    "block_count": lambda: w.add_block_count(c["num_hidden_layers"]),
    "context_length": lambda: w.add_context_length(c["max_position_embeddings"]),
    "embedding_length": lambda: w.add_embedding_length(c["hidden_size"]),
    "feed_forward_length": lambda: w.add_feed_forward_length(c["intermediate_size"]),
    "head_count": lambda: w.add_head_count(c["num_attention_heads"]),
    "head_count_kv": lambda: w.add_head_count_kv(c["num_key_value_heads"]),
    "rope_freq_base": lambda: w.add_rope_freq_base(c["rope_theta"]),
    "rms_eps": lambda: w.add_layer_norm_rms_eps(c["rms_norm_eps"]),
    "key_length": lambda: w.add_key_length(c["head_dim"]),
  }
  for key, add in meta.items():
    if key not in omit_metadata:
      add()
  tokens = list(tokenizer["tokens"])
  token_types = [3 if i in tokenizer["special"] else 1 for i in range(len(tokens))]
  rows = tensors["model.embed_tokens.weight"].shape[0]
  if rows > len(tokens):  # llama.cpp pads the vocabulary to the embedding with unused tokens
    token_types += [5] * (rows - len(tokens))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), rows)]
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(tokenizer.get("pre", "default"))
  w.add_token_list(tokens)
  w.add_token_types(token_types)
  w.add_token_merges(tokenizer["merges"])
  w.add_eos_token_id(tokens.index(eos))
  if bos is not None:
    w.add_bos_token_id(tokens.index(bos))
  if tokenizer["template"] and "chat_template" not in omit_metadata:
    w.add_chat_template(tokenizer["template"])
  types, raw = types or {}, raw or {}
  for name in sorted(set(tensors) | set(raw)):
    if name in raw:
      data, qtype = raw[name]
      w.add_tensor(gguf_name(name), data, raw_dtype=qtype)
      continue
    value = tensors[name]
    if arch == "llama" and name.endswith("q_proj.weight"):
      value = permute(value, c["num_attention_heads"])
    elif arch == "llama" and name.endswith("k_proj.weight"):
      value = permute(value, c["num_key_value_heads"])
    qtype = types.get(name, Q.F32)
    if qtype == Q.F32:
      w.add_tensor(gguf_name(name), value)
    else:
      w.add_tensor(gguf_name(name), quants.quantize(value, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def from_hf_folder(folder: str, path: str, *, eos: str, types=None, **kw) -> dict:
  """Converts tiny HF folder `folder` to GGUF `path`; returns its config.json (with
  defaults filled in) and float32 tensors."""
  c = json.load(open(os.path.join(folder, "config.json")))
  c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
  c["rope_theta"] = (c.get("rope_parameters") or {}).get("rope_theta", c.get("rope_theta", 1e4))
  tensors = hf_tensors(folder)
  if c.get("tie_word_embeddings"):
    tensors.pop("lm_head.weight", None)
  write(path, c["model_type"], c, tensors, tokenizer_metadata(folder), eos=eos, types=types, **kw)
  return {"config": c, "tensors": tensors}


# --- K-quants: random valid blocks and an independent decoder -------------------------

BLOCK_BYTES = {Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}


def k_quant_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
  """`[rows, cols/256 * block bytes]` uint8: random blocks with small finite f16 scales."""
  blocks = rows * cols // 256
  data = rng.integers(0, 256, (blocks, BLOCK_BYTES[qtype]), dtype=np.uint8)
  scales = rng.uniform(0.001, 0.01, (blocks, 2)).astype(np.float16).view(np.uint8)
  if qtype == Q.Q6_K:
    data[:, 208:210] = scales[:, :2]  # d comes last
  else:
    data[:, 0:4] = scales  # d, dmin come first
  return data.reshape(rows, -1)


def _scale_min(j: int, s: np.ndarray) -> tuple[int, int]:
  if j < 4:
    return s[j] & 63, s[j + 4] & 63
  return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def _f16(b: np.ndarray) -> float:
  return float(np.frombuffer(bytes(b), np.float16)[0])


def _q4_k(b: np.ndarray) -> list[float]:
  d, dmin, sc, qs = _f16(b[0:2]), _f16(b[2:4]), b[4:16].astype(int), b[16:144].astype(int)
  y = []
  for j in range(4):
    s1, m1 = _scale_min(2 * j, sc)
    s2, m2 = _scale_min(2 * j + 1, sc)
    q = qs[32 * j : 32 * j + 32]
    y += [d * s1 * (v & 0xF) - dmin * m1 for v in q]
    y += [d * s2 * (v >> 4) - dmin * m2 for v in q]
  return y


def _q5_k(b: np.ndarray) -> list[float]:
  d, dmin, sc = _f16(b[0:2]), _f16(b[2:4]), b[4:16].astype(int)
  qh, qs = b[16:48].astype(int), b[48:176].astype(int)
  y, u1, u2 = [], 1, 2
  for j in range(4):
    s1, m1 = _scale_min(2 * j, sc)
    s2, m2 = _scale_min(2 * j + 1, sc)
    q = qs[32 * j : 32 * j + 32]
    y += [
      d * s1 * ((v & 0xF) + (16 if h & u1 else 0)) - dmin * m1 for v, h in zip(q, qh, strict=True)
    ]
    y += [
      d * s2 * ((v >> 4) + (16 if h & u2 else 0)) - dmin * m2 for v, h in zip(q, qh, strict=True)
    ]
    u1, u2 = u1 << 2, u2 << 2
  return y


def _q6_k(b: np.ndarray) -> list[float]:
  ql, qh = b[0:128].astype(int), b[128:192].astype(int)
  sc, d = b[192:208].view(np.int8).astype(int), _f16(b[208:210])
  y = [0.0] * 256
  for half in range(2):
    lo, hi, s, base = ql[64 * half :], qh[32 * half :], sc[8 * half :], 128 * half
    for i in range(32):
      k = i // 16
      q1 = ((lo[i] & 0xF) | (((hi[i] >> 0) & 3) << 4)) - 32
      q2 = ((lo[i + 32] & 0xF) | (((hi[i] >> 2) & 3) << 4)) - 32
      q3 = ((lo[i] >> 4) | (((hi[i] >> 4) & 3) << 4)) - 32
      q4 = ((lo[i + 32] >> 4) | (((hi[i] >> 6) & 3) << 4)) - 32
      y[base + i] = d * s[k] * q1
      y[base + i + 32] = d * s[k + 2] * q2
      y[base + i + 64] = d * s[k + 4] * q3
      y[base + i + 96] = d * s[k + 6] * q4
  return y


def dequantize_reference(data: np.ndarray, qtype: Q) -> np.ndarray:
  """Rows of K-quant blocks decoded block by block, as llama.cpp's C does."""
  decode = {Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k}[qtype]
  size = BLOCK_BYTES[qtype]
  rows = []
  for row in data:
    rows.append([v for k in range(0, len(row), size) for v in decode(row[k : k + size])])
  return np.asarray(rows, np.float32)
