"""Decoder-only language model of the Llama / Qwen2 family in `flax.nnx`.

RMSNorm, rotary position embeddings (optionally with Llama-3 frequency scaling),
grouped-query attention, SwiGLU MLP, optional QKV bias (Qwen2), tied or untied
embeddings, float32 or bfloat16 compute.

Every parameter carries `logical_axes` metadata (names from `LOGICAL_AXES`);
`gagar_jax.sharding` maps them onto mesh axes with rules from the config.

The blocks' parameters are stacked on a leading `layers` axis (one `Block` whose
arrays are `[L, ...]`), and the KV cache is one `[B, L, kv_heads, S, head_dim]` pair.
`ModelConfig.scan_layers` picks how the layers run: a `jax.lax.scan` over that axis
(XLA compiles one block, so compile time does not grow with depth) or a Python loop
over static slices (one program per block; the few-layer CPU presets' default).
Both run the same block function, so they compute the same thing.

The same `__call__` serves training (no cache: causal attention within the
sequence) and sampling (a `KVCache` written at per-row offsets, see
`gagar_jax.models.sampler`). Sequences are right-padded: a row's real tokens
come first, so causal masking alone keeps padding out of every real token's
attention.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gagar_jax import configlib, sharding
from gagar_jax.errors import ConfigError

# Logical axis names parameters are annotated with.
LOGICAL_AXES = sharding.LOGICAL_AXES

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# `ModelConfig.remat` -> the `jax.checkpoint` policy of a block (None: no remat). The
# projections are 2-D matmuls (`_dense`), which `dots_with_no_batch_dims_saveable`
# keeps; the attention einsums are batched, so they are recomputed.
REMAT_POLICIES = {
  "none": None,
  "block": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
  "full": jax.checkpoint_policies.nothing_saveable,
}


# `scan_layers=None` scans from this depth on. Below it the Python loop is kept: the
# presets there (nano 2, tiny 4, small 6 layers) compile in seconds either way, and the
# tiny policy's path stays as it was measured (results/performance.md, section 12).
SCAN_FROM_LAYERS = 8


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of the decoder. Field names follow the design card."""

  vocab_size: int
  embed_dim: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  # None, or a Llama-3 scaling dict: factor, low_freq_factor, high_freq_factor,
  # original_max_position_embeddings.
  rope_scaling: tuple[tuple[str, float], ...] | None = None
  norm_eps: float = 1e-6
  qkv_bias: bool = False
  tie_embeddings: bool = True
  dtype: str = "float32"
  param_dtype: str = "float32"
  max_seq_len: int = 4096
  # Activation rematerialisation of each block in training (no effect when sampling):
  # none: keep every activation; block: keep the projections' outputs (2-D matmuls),
  # recompute attention, norms and activations; full: keep only each block's input.
  remat: str = "none"
  # How the layers run: True, a `lax.scan` over the stacked blocks (compile time flat in
  # depth); False, a Python loop (one program per block); None (the
  # default), scan from SCAN_FROM_LAYERS layers on. The parameters are the same either way.
  scan_layers: bool | None = None

  def __post_init__(self):
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, tuple):
      # A mapping (config.json, a ConfigDict) -> sorted pairs, so the config hashes.
      object.__setattr__(self, "rope_scaling", tuple(sorted(dict(self.rope_scaling).items())))
    self.validate()

  @classmethod
  def from_dict(cls, d: Mapping[str, Any], prefix: str = "model") -> ModelConfig:
    """Builds a config from a mapping (e.g. an `ml_collections.ConfigDict`)."""
    return configlib.from_dict(cls, d, prefix)

  def validate(self) -> None:
    for name in (
      "vocab_size",
      "embed_dim",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "mlp_dim",
      "max_seq_len",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(name, f"must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
        "num_kv_heads",
        f"{self.num_kv_heads} does not divide num_heads={self.num_heads} "
        "(grouped-query attention shares each kv head among a whole number of heads)",
      )
    if self.head_dim % 2:
      raise ConfigError("head_dim", f"must be even for rotary embeddings, got {self.head_dim}")
    if self.remat not in REMAT_POLICIES:
      raise ConfigError("remat", f"must be one of {list(REMAT_POLICIES)}, got {self.remat!r}")
    if self.scan_layers not in (None, True, False):
      raise ConfigError("scan_layers", f"must be true, false or None, got {self.scan_layers!r}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ConfigError(name, f"must be one of {sorted(_DTYPES)}, got {getattr(self, name)!r}")
    if not self.rope_theta > 0:
      raise ConfigError("rope_theta", f"must be > 0, got {self.rope_theta}")
    if not self.norm_eps > 0:
      raise ConfigError("norm_eps", f"must be > 0, got {self.norm_eps}")
    if self.rope_scaling is not None:
      need = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
      got = set(dict(self.rope_scaling))
      if got != need:
        raise ConfigError(
          "rope_scaling", f"Llama-3 scaling needs keys {sorted(need)}, got {sorted(got)}"
        )

  @property
  def scanned(self) -> bool:
    """Whether the layers run as a `lax.scan` (see `scan_layers`)."""
    if self.scan_layers is None:
      return self.num_layers >= SCAN_FROM_LAYERS
    return self.scan_layers

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def weight_dtype(self):
    return _DTYPES[self.param_dtype]

  def num_params(self) -> int:
    d, h, k, hd, f, v = (
      self.embed_dim,
      self.num_heads,
      self.num_kv_heads,
      self.head_dim,
      self.mlp_dim,
      self.vocab_size,
    )
    attn = d * hd * (h + 2 * k) + h * hd * d + (hd * (h + 2 * k) if self.qkv_bias else 0)
    layer = attn + 3 * d * f + 2 * d
    return v * d * (1 if self.tie_embeddings else 2) + self.num_layers * layer + d

  def flops_per_token(self, seq_len: int) -> float:
    """Forward FLOPs per token: 2 * matmul params + attention scores (causal)."""
    d, h, k, hd, f = self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_dim
    matmul = self.num_layers * (d * hd * (h + 2 * k) + h * hd * d + 3 * d * f) + d * self.vocab_size
    attn = self.num_layers * 2 * h * hd * seq_len  # QK^T and AV, averaged over causal positions
    return 2.0 * matmul + attn


class KVCache(NamedTuple):
  """Keys and values of every layer, `[B, L, kv_heads, S, head_dim]` each.

  Rows lead (so a sub-batch of conversations is one gather on axis 0); slots are the
  second-to-last axis so that decoding attends with plain batched matmuls over
  `(B, kv_heads)`: no per-step transpose of the cache. Each layer writes its slots in
  place and reads only the filled part of its own slice (see `Attention.__call__`), so
  a scan over the layers carries the cache without copying it.
  """

  k: jax.Array
  v: jax.Array


def cache_shape(config: ModelConfig, batch: int, size: int) -> tuple[int, ...]:
  return (batch, config.num_layers, config.num_kv_heads, size, config.head_dim)


def init_cache(config: ModelConfig, batch: int, size: int) -> KVCache:
  """An empty cache with room for `size` tokens per row."""
  shape = cache_shape(config, batch, size)
  # Distinct buffers for k and v, so the cache can be donated.
  return KVCache(jnp.zeros(shape, config.compute_dtype), jnp.zeros(shape, config.compute_dtype))


def _dense(x: jax.Array, kernel: jax.Array, in_dims: int = 1) -> jax.Array:
  """`x [..., *kernel.shape[:in_dims]] @ kernel` as one 2-D matmul.

  Leading dims are folded into one row axis: XLA:CPU differentiates a 2-D matmul
  about twice as fast as the batched `[B, T, D] @ [D, F]` form (whose weight
  gradient contracts two axes).
  """
  lead = x.shape[: x.ndim - in_dims]
  k_in = math.prod(kernel.shape[:in_dims])
  y = x.reshape(-1, k_in) @ kernel.reshape(k_in, -1)
  return y.reshape(*lead, *kernel.shape[in_dims:])


class _Draws:
  """The keys `rngs.params()` would give, in the same order, with nnx's counter written
  once at the end instead of once per draw. Under a trace (`eval_shape`, `jit`) each
  write of that counter costs time linear in the program traced so far, so a 48-layer
  model spent seconds in them; the parameters come out identical."""

  def __init__(self, rngs: nnx.Rngs):
    self._stream = rngs.params
    self._key, self._start = self._stream.key[...], self._stream.count[...]
    self._drawn = 0

  def params(self) -> jax.Array:
    self._drawn += 1
    return jax.random.fold_in(self._key, self._start + self._drawn - 1)

  def finish(self) -> None:
    self._stream.count[...] = self._start + self._drawn


def _param(rngs: nnx.Rngs | _Draws, shape, axes, dtype, init="normal") -> nnx.Param:
  if init == "normal":
    value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, computed in float32 (as Llama/Qwen2)."""

  def __init__(self, dim: int, eps: float, param_dtype, *, rngs: nnx.Rngs):
    self.scale = _param(rngs, (dim,), ("norm",), param_dtype, init="ones")
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    dtype = x.dtype
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    return (x * self.scale[...].astype(jnp.float32)).astype(dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
  """Rotary inverse frequencies `[head_dim // 2]`, Llama-3 scaled if configured."""
  dim = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  if config.rope_scaling is None:
    return inv_freq
  s = dict(config.rope_scaling)
  factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old_len = s["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
  return jnp.where(medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates `x [B, T, N, D]` by `positions [B, T]` (half-split layout, as HF Llama)."""
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with an optional KV cache."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c, pd = config, config.weight_dtype
    self.config = c
    self.q_proj = _param(
      rngs, (c.embed_dim, c.num_heads, c.head_dim), ("embed", "heads", "head_dim"), pd
    )
    self.k_proj = _param(
      rngs, (c.embed_dim, c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), pd
    )
    self.v_proj = _param(
      rngs, (c.embed_dim, c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "head_dim"), pd
    )
    self.o_proj = _param(
      rngs, (c.num_heads, c.head_dim, c.embed_dim), ("heads", "head_dim", "embed"), pd
    )
    if c.qkv_bias:
      self.q_bias = _param(rngs, (c.num_heads, c.head_dim), ("heads", "head_dim"), pd, "zeros")
      self.k_bias = _param(
        rngs, (c.num_kv_heads, c.head_dim), ("kv_heads", "head_dim"), pd, "zeros"
      )
      self.v_bias = _param(
        rngs, (c.num_kv_heads, c.head_dim), ("kv_heads", "head_dim"), pd, "zeros"
      )

  def _project(self, x, kernel, bias_name):
    dt = self.config.compute_dtype
    y = _dense(x, kernel[...].astype(dt))
    if self.config.qkv_bias:
      y = y + getattr(self, bias_name)[...].astype(dt)
    return y

  def __call__(
    self, x, positions, inv_freq, cache: KVCache | None, layer, write_index, attend=None
  ):
    """x `[B, T, D]`; positions `[B, T]`; cache: every layer's, this one is `layer` (an int
    or a traced index); write_index `[B]` (cache slot of token 0); attend: with a cache,
    attend over its first `attend` slots only (static; None: all)."""
    c = self.config
    b, t, _ = x.shape
    q = apply_rope(self._project(x, self.q_proj, "q_bias"), positions, inv_freq)
    k = apply_rope(self._project(x, self.k_proj, "k_bias"), positions, inv_freq)
    v = self._project(x, self.v_proj, "v_bias")
    kh, groups, hd = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
    q = q.reshape(b, t, kh, groups, hd).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
    if cache is None:
      keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, H]
      # Causal: key slot s is visible to query slot t iff s <= t. Long sequences go
      # in query chunks that each attend only to the keys up to their own end, which
      # skips most of the masked half of the score matrix (and keeps it small).
      chunk = CAUSAL_CHUNK if t > 2 * CAUSAL_CHUNK else t
      parts = []
      for start in range(0, t, chunk):
        end = min(start + chunk, t)
        mask = (jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None])[None]
        parts.append(_attend(q[:, :, :, start:end], keys[:, :, :end], values[:, :, :end], mask, c))
      out = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=3)
      new_cache = None
    else:
      # Scatter this chunk into each row's slots write_index + [0, T); slots past the
      # cache end are dropped (never clamped, which would overwrite real tokens).
      slots = write_index[:, None] + jnp.arange(t)[None, :]
      rows = jnp.arange(b)[:, None]
      # Indexing axes 0, 1 and 3 of [B, L, K, S, H] takes updates shaped [B, T, K, H]; the
      # scatter writes in place into the (donated, or scan-carried) buffer.
      keys = cache.k.at[rows, layer, :, slots].set(k.astype(cache.k.dtype), mode="drop")
      values = cache.v.at[rows, layer, :, slots].set(v.astype(cache.v.dtype), mode="drop")
      new_cache = KVCache(keys, values)
      # This layer's keys and values, only the filled part: a static bound (the cost of a
      # decode step follows the conversation, not the cache size). The caller guarantees
      # that every real query's slot is below `attend`.
      size = keys.shape[3] if attend is None else min(attend, keys.shape[3])
      window = (b, 1, kh, size, hd)
      start = (0, layer, 0, 0, 0)
      keys = jax.lax.dynamic_slice(keys, start, window)[:, 0]
      values = jax.lax.dynamic_slice(values, start, window)[:, 0]
      # Every slot below a query's own position holds a real token of that row.
      mask = jnp.arange(size)[None, None, :] <= slots[:, :, None]  # [B, T, S]
      out = _attend(q, keys, values, mask, c)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, c.num_heads, hd)
    return _dense(out, self.o_proj[...].astype(c.compute_dtype), in_dims=2), new_cache


# Query chunk of causal attention without a cache (see `Attention.__call__`).
CAUSAL_CHUNK = 128


def _attend(q, keys, values, mask, c: ModelConfig):
  """Softmax attention of `q [B, K, G, T, H]` over `keys/values [B, K, S, H]`.

  `mask [B or 1, T, S]` says which slots each query sees. The G query heads that
  share a kv head and the T positions form one query axis, so this is two 4-D
  batched matmuls over (B, K): XLA:CPU runs those several times faster than a 5-D
  einsum with separate group and time axes. Returns `[B, K, G, T, H]`.
  """
  b, kh, groups, t, hd = q.shape
  s_len = keys.shape[2]
  scores = jnp.einsum("bkqh,bksh->bkqs", q.reshape(b, kh, groups * t, hd), keys.astype(q.dtype))
  scores = scores.astype(jnp.float32) / math.sqrt(hd)
  mask = jnp.broadcast_to(mask[:, None, None], (mask.shape[0], 1, groups, t, s_len))
  scores = jnp.where(
    mask.reshape(mask.shape[0], 1, groups * t, s_len), scores, jnp.finfo(jnp.float32).min
  )
  probs = jax.nn.softmax(scores, axis=-1).astype(c.compute_dtype)
  out = jnp.einsum("bkqs,bksh->bkqh", probs, values.astype(c.compute_dtype))
  return out.reshape(b, kh, groups, t, hd)


class MLP(nnx.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c, pd = config, config.weight_dtype
    self.dtype = c.compute_dtype
    self.gate_proj = _param(rngs, (c.embed_dim, c.mlp_dim), ("embed", "mlp"), pd)
    self.up_proj = _param(rngs, (c.embed_dim, c.mlp_dim), ("embed", "mlp"), pd)
    self.down_proj = _param(rngs, (c.mlp_dim, c.embed_dim), ("mlp", "embed"), pd)

  def __call__(self, x):
    dt = self.dtype
    gate = _dense(x, self.gate_proj[...].astype(dt))
    up = _dense(x, self.up_proj[...].astype(dt))
    return _dense(jax.nn.silu(gate) * up, self.down_proj[...].astype(dt))


class Block(nnx.Module):
  """Pre-norm residual block: attention then MLP."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    pd = config.weight_dtype
    self.input_norm = RMSNorm(config.embed_dim, config.norm_eps, pd, rngs=rngs)
    self.attn = Attention(config, rngs=rngs)
    self.post_attn_norm = RMSNorm(config.embed_dim, config.norm_eps, pd, rngs=rngs)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, positions, inv_freq, cache, layer, write_index, attend=None):
    h, cache = self.attn(self.input_norm(x), positions, inv_freq, cache, layer, write_index, attend)
    x = x + h
    x = x + self.mlp(self.post_attn_norm(x))
    return x, cache


def stack_blocks(blocks: list[Block]) -> Block:
  """One `Block` whose parameters are the blocks' stacked on a leading `layers` axis."""
  graphdef, _ = nnx.split(blocks[0])
  states = [nnx.to_flat_state(nnx.state(b)) for b in blocks]
  flat = []
  for i, (key, var) in enumerate(states[0]):
    value = jnp.stack([s[i][1].get_value() for s in states])
    axes = var.get_metadata().get("logical_axes")
    flat.append((key, var.replace(value, logical_axes=("layers", *axes) if axes else None)))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _layer_index_at(parts: list[str]) -> int | None:
  """Where `layers/<i>` (the per-layer layout) starts in a split name; None if nowhere."""
  for i, (p, q) in enumerate(itertools.pairwise(parts)):
    if p == "layers" and q.isdigit():
      return i
  return None


def stack_legacy_layers(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
  """Flat parameters (or optimizer moments) named per layer, `.../layers/3/attn/q_proj`
  (the layout written before the blocks were stacked), renamed and stacked into
  `.../layers/attn/q_proj` `[L, ...]`; other names pass through. Host arrays (numpy)."""

  out, per_layer = {}, {}
  for name, value in flat.items():
    parts = name.split(sep)
    at = _layer_index_at(parts)
    if at is None:
      out[name] = value
      continue
    stacked = sep.join(parts[: at + 1] + parts[at + 2 :])
    per_layer.setdefault(stacked, {})[int(parts[at + 1])] = value
  for name, layers in per_layer.items():
    if sorted(layers) != list(range(len(layers))):
      raise ValueError(f"{name}: layers {sorted(layers)} are not 0..{len(layers) - 1}")
    out[name] = np.stack([np.asarray(layers[i]) for i in range(len(layers))])
  return out


def is_legacy_layout(names) -> bool:
  """Whether flat names (`a/b/c`) are in the per-layer layout of `stack_legacy_layers`."""
  return any(_layer_index_at(name.split("/")) is not None for name in names)


def head_logits(hidden: jax.Array, head: jax.Array) -> jax.Array:
  """float32 logits `[..., V]` of hidden states `[..., D]` through `head [D, V]`."""
  return _dense(hidden.astype(head.dtype), head).astype(jnp.float32)


class Transformer(nnx.Module):
  """The policy (and grader) language model."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    draws = _Draws(rngs)
    self.embed = _param(draws, (c.vocab_size, c.embed_dim), ("vocab", "embed"), c.weight_dtype)
    # Built one by one (the same random draws as separate blocks), then stacked.
    self.layers = stack_blocks([Block(c, rngs=draws) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.embed_dim, c.norm_eps, c.weight_dtype, rngs=draws)
    if not c.tie_embeddings:
      self.lm_head = _param(draws, (c.embed_dim, c.vocab_size), ("embed", "vocab"), c.weight_dtype)
    draws.finish()

  def hidden(
    self,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    cache: KVCache | None = None,
    write_index: jax.Array | None = None,
    attend: int | None = None,
    layers: tuple[nnx.State, ...] | None = None,
  ):
    """Final-norm hidden states `[B, T, D]` and the updated cache (or None).

    Args:
      tokens: int32 `[B, T]`.
      positions: int32 `[B, T]` rotary positions; defaults to `arange(T)`, or to
        `write_index + arange(T)` when a cache is given.
      cache: a `KVCache` to attend over and write into, or None (plain causal).
      write_index: int32 `[B]`, the cache slot of each row's first token.
      attend: with a cache, a static bound on the slots attention reads: every real
        token's slot (write_index + its offset) must be below it (None: the whole cache).
      layers: the blocks' parameters already split per layer (`split_layers`): the
        layers then run as a Python loop over them, whatever `scan_layers` says.
    """
    b, t = tokens.shape
    if cache is not None and write_index is None:
      raise ValueError("write_index is required with a cache")
    if positions is None:
      base = write_index[:, None] if cache is not None else jnp.zeros((b, 1), jnp.int32)
      positions = base + jnp.arange(t, dtype=jnp.int32)[None, :]
    inv_freq = rope_inv_freq(self.config)
    c = self.config
    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.compute_dtype)
    graphdef, stacked = nnx.split(self.layers)

    def block(carry, layer_params, i):
      h, kv = carry
      return nnx.merge(graphdef, layer_params)(h, positions, inv_freq, kv, i, write_index, attend)

    policy = REMAT_POLICIES[c.remat] if cache is None else None
    if policy is not None:  # training: recompute the block's activations in backward
      # (prevent_cse matters only unrolled: a scan already keeps XLA from merging them.)
      block = jax.checkpoint(block, policy=policy, prevent_cse=not c.scanned)
    carry = (x, cache)
    if layers is not None:
      for i, layer_params in enumerate(layers):
        carry = block(carry, layer_params, i)
    elif c.scanned:
      carry, _ = jax.lax.scan(
        lambda carry, xs: (block(carry, *xs), None),
        carry,
        (stacked, jnp.arange(c.num_layers, dtype=jnp.int32)),
      )
    else:
      for i in range(c.num_layers):
        carry = block(carry, jax.tree.map(lambda a, i=i: a[i], stacked), i)
    x, cache = carry
    return self.final_norm(x), cache

  def split_layers(self) -> tuple[nnx.State, ...]:
    """The blocks' parameters as one state per layer (slices of the stack), for `hidden`'s
    `layers`. On XLA:CPU a scan slices every weight out of the stack at each step, a copy
    that costs decoding (one token per row) about as much as the matmuls themselves; the
    sampler splits once per decode loop instead (see `Sampler`)."""
    _, stacked = nnx.split(self.layers)
    return tuple(jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(self.config.num_layers))

  def head(self) -> jax.Array:
    """The output projection `[D, V]` in the compute dtype (the embedding's transpose
    when tied)."""
    dt = self.config.compute_dtype
    if self.config.tie_embeddings:
      return self.embed[...].astype(dt).T
    return self.lm_head[...].astype(dt)

  def logits(self, hidden: jax.Array) -> jax.Array:
    """float32 logits `[..., V]` from hidden states `[..., D]`."""
    return head_logits(hidden, self.head())

  def __call__(
    self,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    cache: KVCache | None = None,
    write_index: jax.Array | None = None,
  ):
    """Logits `[B, T, V]` (float32); with a cache, returns `(logits, new_cache)`."""
    hidden, new_cache = self.hidden(tokens, positions, cache, write_index)
    logits = self.logits(hidden)
    return logits if cache is None else (logits, new_cache)


def create(config: ModelConfig, seed: int = 0) -> Transformer:
  """A freshly initialised model on the default device."""
  return Transformer(config, rngs=nnx.Rngs(seed))


def abstract(config: ModelConfig):
  """(graphdef, abstract params `nnx.State` of `ShapeDtypeStruct`s): no memory used."""
  return nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))


def init_sharded(config: ModelConfig, mesh, rules=None, seed: int = 0):
  """Initialises a `Transformer` straight into its sharded layout.

  Returns:
    (graphdef, params): `params` is an `nnx.State` of sharded `jax.Array`s.
  """
  graphdef, shapes = abstract(config)
  shardings = sharding.param_shardings(shapes, mesh, rules)
  params = jax.jit(lambda: nnx.state(create(config, seed)), out_shardings=shardings)()
  return graphdef, params
