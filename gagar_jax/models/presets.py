"""Model shape presets: tiny CPU sizes, SmolLM2-135M and the Qwen2.5-Coder shapes for pods.

    from gagar_jax.models import presets
    config = transformer.ModelConfig.from_dict(presets.get("tiny"))

The real shapes match the published `config.json`s, so `gagar_jax.models.hf_import` on
those checkpoints yields the same config. Experiment configs name a preset with
`size=` (`configs/common.py` `model_config`); policy folders record only the fields that
differ from their preset (`gagar_jax/policy_io.py`).
"""

from __future__ import annotations

# scan_layers: the real shapes (SmolLM2, Qwen) run their layers as a `lax.scan` (compile time
# flat in depth); the CPU presets leave it None, which scans from 8 layers on and loops
# below (nano, tiny and small loop; see `gagar_jax.models.transformer.SCAN_FROM_LAYERS`).
_COMMON = dict(rope_scaling=None, dtype="float32", param_dtype="float32", remat="none")
# The Qwen2.5-Coder presets compute in bfloat16 with float32 parameters (mixed precision:
# the optimizer updates float32 weights); `<preset>-bf16` keeps the parameters (and so the
# optimizer state and gradients) in bfloat16 too, for half the memory.
_QWEN = dict(dtype="bfloat16", param_dtype="float32", remat="block", scan_layers=True)

PRESETS = {
  # Unit tests: compiles in a second or two.
  "nano": dict(
    vocab_size=96,
    embed_dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    rope_theta=10_000.0,
    norm_eps=1e-6,
    qkv_bias=False,
    tie_embeddings=True,
    max_seq_len=1024,
  ),
  # Laptop-CPU policy (about 0.9M parameters with a 512-token BPE).
  "tiny": dict(
    vocab_size=512,
    embed_dim=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=384,
    rope_theta=10_000.0,
    norm_eps=1e-6,
    qkv_bias=False,
    tie_embeddings=True,
    max_seq_len=1024,
  ),
  # A few minutes per experiment arm on 2 cores; benchmark size.
  "small": dict(
    vocab_size=1024,
    embed_dim=256,
    num_layers=6,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    mlp_dim=768,
    rope_theta=10_000.0,
    norm_eps=1e-6,
    qkv_bias=False,
    tie_embeddings=True,
    max_seq_len=1024,
  ),
  # SmolLM2-135M-Instruct's shape (Llama; the real-shape benchmarks use random weights).
  "smollm2-135m": dict(
    vocab_size=49152,
    embed_dim=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    mlp_dim=1536,
    rope_theta=100_000.0,
    norm_eps=1e-5,
    qkv_bias=False,
    tie_embeddings=True,
    max_seq_len=8192,
    scan_layers=True,
  ),
  "qwen2.5-coder-0.5b": dict(
    vocab_size=151936,
    embed_dim=896,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    mlp_dim=4864,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
    max_seq_len=32768,
  ),
  "qwen2.5-coder-1.5b": dict(
    vocab_size=151936,
    embed_dim=1536,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    head_dim=128,
    mlp_dim=8960,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=True,
    max_seq_len=32768,
  ),
  "qwen2.5-coder-7b": dict(
    vocab_size=152064,
    embed_dim=3584,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    mlp_dim=18944,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    qkv_bias=True,
    tie_embeddings=False,
    max_seq_len=32768,
  ),
}


def names() -> list[str]:
  """Every preset name `get` takes (the `-bf16` variants included)."""
  return sorted([*PRESETS, *(f"{n}-bf16" for n in PRESETS if n.startswith("qwen"))])


def get(name: str = "tiny") -> dict:
  """The `ModelConfig` fields of preset `name` (see PRESETS; `qwen...-bf16`: bf16 weights).
  `scan_layers` is None (by depth) unless the preset sets it. Raises ValueError naming the
  presets for an unknown name."""
  name = name or "tiny"
  base, bf16 = (name[: -len("-bf16")], True) if name.endswith("-bf16") else (name, False)
  if base not in PRESETS or (bf16 and not base.startswith("qwen")):
    raise ValueError(f"model size {name!r}: unknown; presets are {names()}")
  d = {**_COMMON, "scan_layers": None, **(_QWEN if base.startswith("qwen") else {})}
  d.update(PRESETS[base])
  if bf16:
    d["param_dtype"] = "bfloat16"
  return d
