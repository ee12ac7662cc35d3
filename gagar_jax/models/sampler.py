"""Jitted, batched sampling with a KV cache, for single- and multi-turn use.

Layout: each row of the batch owns a cache of `cache_size`
slots; row `b` has `lengths[b]` real tokens in slots `[0, lengths[b])`. Every
write (prompt prefill, a decoded token, an appended observation) scatters a
padded chunk at the row's own offset and advances that row by its real count.
So prompts of different lengths share one batch with no left padding, and a
rotary position is simply the slot index.

Multi-turn: a conversation continues by *extending the cache* (`append`):
only the new observation tokens are run through the model, at each row's own
offset. We chose this over re-prefilling the whole transcript because a turn
then costs O(new tokens) instead of O(transcript), and because the per-row
offsets that make mixed-length prompts work make appends to mixed-length
conversations work for free. Re-prefilling stays available: `prefill` on a
fresh state with the full transcript gives the same result (a test checks it).

Randomness: row `r`'s `j`-th new token of a `generate` call is drawn with
`fold_in(fold_in(key, row_ids[r]), j)`, so what a row samples does not depend on the
batch it shares (which rows, how many, how they are compacted or split across threads).

Log-probs: `logprobs[b, t]` is log p(token) under the distribution the token
was drawn from before top-k / top-p truncation, i.e. `log_softmax(logits / T)`
(`T = 1` for greedy). The learner recomputes the same quantity from logits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding

from gagar_jax import sharding as sharding_lib
from gagar_jax.errors import ConfigError
from gagar_jax.models import transformer

# Why a row stopped generating.
FINISH_LENGTH = 0  # max_new_tokens reached
FINISH_EOS = 1
FINISH_STOP = 2  # a stop sequence was emitted
FINISH_CACHE_FULL = 3
FINISH_NAMES = ("length", "eos", "stop", "cache_full")
# The smallest attention bound (`Sampler.attend_bound`).
MIN_ATTEND = 256


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to draw tokens. Hashable: it is a static argument of the jitted loop.

  Attributes:
    max_new_tokens: upper bound on tokens generated per row per call.
    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of tokens whose probability reaches top_p (1 = off).
    eos_id: stop a row when it emits this token (None = never).
    stop_sequences: token-id sequences that stop a row once emitted (e.g. the
      agent's end-of-action marker); the stop tokens are part of the output.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eos_id: int | None = None
  stop_sequences: tuple[tuple[int, ...], ...] = ()

  def __post_init__(self):
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
      raise ConfigError(
        "sampling.max_new_tokens", f"must be a positive int, got {self.max_new_tokens!r}"
      )
    if self.temperature < 0:
      raise ConfigError("sampling.temperature", f"must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ConfigError("sampling.top_k", f"must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ConfigError("sampling.top_p", f"must be in (0, 1], got {self.top_p}")
    stops = tuple(tuple(int(t) for t in s) for s in self.stop_sequences)
    if any(len(s) == 0 for s in stops):
      raise ConfigError("sampling.stop_sequences", "a stop sequence is empty")
    object.__setattr__(self, "stop_sequences", stops)


class SamplerState(NamedTuple):
  """A batch of conversations on device.

  Attributes:
    cache: every layer's keys/values `[B, L, kv_heads, S, head_dim]` (`transformer.KVCache`).
    lengths: int32 `[B]`, real tokens held per row.
    last_logits: float32 `[B, V]`, the next-token logits after each row's last token.
  """

  cache: transformer.KVCache
  lengths: jax.Array
  last_logits: jax.Array


class SampleOutput(NamedTuple):
  """What `generate` returns (arrays `[B, N]`, N = max_new_tokens).

  Attributes:
    tokens: int32 sampled tokens; `pad_id` after a row stopped.
    logprobs: float32 log-probs of the sampled tokens (0 where masked).
    mask: bool, True exactly at generated tokens (stop/EOS tokens included).
    num_tokens: int32 `[B]`, generated tokens per row.
    finish_reason: int32 `[B]`, one of the FINISH_* codes.
  """

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  num_tokens: jax.Array
  finish_reason: jax.Array


class StopStrings(NamedTuple):
  """Stop strings matched on the decoded text of each row's new tokens.

  A row stops at the token that completes a string (it is kept; tokens sampled after
  it are dropped and the row's cache is rewound). Matching happens on the host after
  the decode loop, and between chunks with `decode_chunk`.

  Attributes:
    strings: the stop strings.
    decode: token ids -> text (the tokenizer's `decode`).
  """

  strings: tuple[str, ...]
  decode: Callable[[Sequence[int]], str]

  def cut(self, ids: Sequence[int]) -> int | None:
    """Tokens to keep: the shortest prefix whose text holds a stop string (None: none)."""
    if not self.strings or not any(s in self.decode(ids) for s in self.strings):
      return None
    lo, hi = 1, len(ids)  # the prefix of `hi` tokens holds one
    while lo < hi:
      mid = (lo + hi) // 2
      if any(s in self.decode(ids[:mid]) for s in self.strings):
        hi = mid
      else:
        lo = mid + 1
    return hi


def sample_logits(logits: jax.Array, key: jax.Array, params: SamplingParams):
  """Draws one token per row from float32 `logits [B, V]`; `key` is one key for the
  batch, or a key per row (`[B]`: each row's draw then depends on its key alone).

  Returns:
    tokens int32 `[B]` and their log-probs float32 `[B]` under `log_softmax(logits / T)`.
  """
  logits = logits.astype(jnp.float32)
  if params.temperature == 0:
    tokens = jnp.argmax(logits, axis=-1)
    logp = jax.nn.log_softmax(logits, axis=-1)
  else:
    scaled = logits / params.temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    filtered = scaled
    neg_inf = jnp.finfo(jnp.float32).min
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
      kth = jax.lax.top_k(scaled, params.top_k)[0][..., -1:]
      filtered = jnp.where(scaled < kth, neg_inf, filtered)
    if params.top_p < 1.0:
      order = jnp.argsort(-filtered, axis=-1)
      sorted_logits = jnp.take_along_axis(filtered, order, axis=-1)
      probs = jax.nn.softmax(sorted_logits, axis=-1)
      # Keep a token if the mass strictly before it is below top_p (the top one always).
      before = jnp.cumsum(probs, axis=-1) - probs
      keep_sorted = before < params.top_p
      keep = (
        jnp.zeros_like(keep_sorted)
        .at[jnp.arange(keep_sorted.shape[0])[:, None], order]
        .set(keep_sorted)
      )
      filtered = jnp.where(keep, filtered, neg_inf)
    if key.ndim:  # a key per row
      tokens = jax.vmap(lambda k, row: jax.random.categorical(k, row))(key, filtered)
    else:
      tokens = jax.random.categorical(key, filtered, axis=-1)
  tokens = tokens.astype(jnp.int32)
  token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
  return tokens, token_logp


def _stop_table(stop_sequences):
  """Right-aligned stop sequences `[S, L]` with -1 padding on the left."""
  width = max((len(s) for s in stop_sequences), default=1)
  table = np.full((max(len(stop_sequences), 1), width), -1, np.int32)
  for i, s in enumerate(stop_sequences):
    table[i, width - len(s) :] = s
  return table


def _forward_chunk(graphdef, params, state: SamplerState, tokens, counts, attend=None, layers=None):
  """Writes `tokens [B, T]` (row b's first `counts[b]` real) at each row's offset;
  attention reads the first `attend` cache slots (static, see `Sampler.attend_bound`);
  `layers`: the blocks' parameters split per layer (`Transformer.split_layers`), or None."""
  model = nnx.merge(graphdef, params)
  hidden, cache = model.hidden(
    tokens, cache=state.cache, write_index=state.lengths, attend=attend, layers=layers
  )
  last = jnp.clip(counts - 1, 0, tokens.shape[1] - 1)
  last_hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
  logits = model.logits(last_hidden)
  # Rows that received nothing keep their previous logits.
  logits = jnp.where((counts > 0)[:, None], logits, state.last_logits)
  return SamplerState(cache, state.lengths + counts, logits)


def token_keys(key: jax.Array, row_ids: jax.Array, j) -> jax.Array:
  """The key of each row's `j`-th new token in a `generate` call: `[B]`."""
  return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(key, r), j))(row_ids)


class DecodeCarry(NamedTuple):
  """What a decode loop hands the next one when generation goes on in chunks."""

  key: jax.Array  # the call's key
  rows: jax.Array  # int32 [B]: each row's id (`token_keys`)
  drawn: jax.Array  # int32 []: tokens drawn so far in this call
  window: jax.Array  # int32 [B, W]: the last tokens, for stop-sequence matching
  done: jax.Array  # bool [B]
  reason: jax.Array  # int32 [B]


def _stopped(tok, window, alive, reason, stop_table, params_s: SamplingParams):
  """Rows that just emitted a stop sequence (`window` ends with one) or EOS, and the
  finish reasons updated for them: (hit_stop, hit_eos, reason)."""
  hit_stop = hit_eos = jnp.zeros_like(alive)
  if params_s.stop_sequences:
    match = (stop_table[None] == window[:, None]) | (stop_table[None] < 0)
    hit_stop = jnp.any(jnp.all(match, axis=-1), axis=-1) & alive
    reason = jnp.where(hit_stop, FINISH_STOP, reason)
  if params_s.eos_id is not None:
    hit_eos = alive & (tok == params_s.eos_id)
  return hit_stop, hit_eos, jnp.where(hit_eos, FINISH_EOS, reason)


def _decode(
  graphdef,
  params,
  state: SamplerState,
  key,
  params_s: SamplingParams,
  pad_id: int,
  active,
  row_ids,
  carry_in: DecodeCarry | None = None,
  attend: int | None = None,
  split_layers: bool = False,
):
  """The jitted decode loop (lax.while_loop; stops early when every row is done).

  `row_ids` (int32 `[B]`): whose random stream each row draws from (see the module
  docstring); ignored with `carry_in`, which carries them.

  `split_layers` (static): slice the blocks' weights out of their stack once, before the
  loop, and run the layers as a Python loop over them (see `Sampler`).

  `attend` (static): attention reads only the first `attend` cache slots; every row
  that generates must end within them (`Sampler.attend_bound`).

  With `carry_in` (from a previous chunk) it continues that chunk's random streams,
  stop-sequence window and per-row state; `active` is then ignored. Returns
  (state, SampleOutput, DecodeCarry)."""
  b = state.lengths.shape[0]
  n = params_s.max_new_tokens
  cache_size = state.cache.k.shape[3]
  stop_table = jnp.asarray(_stop_table(params_s.stop_sequences))
  width = stop_table.shape[1]
  layers = nnx.merge(graphdef, params).split_layers() if split_layers else None

  def cond(carry):
    step, _, _, _, _, done, _, _ = carry
    return (step < n) & ~jnp.all(done)

  def body(carry):
    step, st, tokens, logps, window, done, reason, count = carry
    tok, lp = sample_logits(st.last_logits, token_keys(key, rows, drawn + step), params_s)
    alive = ~done
    tok = jnp.where(alive, tok, pad_id)
    lp = jnp.where(alive, lp, 0.0)
    tokens = tokens.at[:, step].set(tok)
    logps = logps.at[:, step].set(lp)
    window = jnp.concatenate([window[:, 1:], tok[:, None]], axis=1)
    hit_stop, hit_eos, new_reason = _stopped(tok, window, alive, reason, stop_table, params_s)
    # The sampled token enters the cache (so the conversation can continue after it).
    st = _forward_chunk(graphdef, params, st, tok[:, None], alive.astype(jnp.int32), attend, layers)
    full = alive & (st.lengths >= cache_size)
    new_reason = jnp.where(full & ~hit_eos & ~hit_stop, FINISH_CACHE_FULL, new_reason)
    done = done | hit_eos | hit_stop | full
    count = count + alive.astype(jnp.int32)
    return step + 1, st, tokens, logps, window, done, new_reason, count

  tokens = jnp.full((b, n), pad_id, jnp.int32)
  logps = jnp.zeros((b, n), jnp.float32)
  if carry_in is None:
    window = jnp.full((b, width), -2, jnp.int32)
    done = (state.lengths >= cache_size) | ~active
    reason = jnp.where(state.lengths >= cache_size, FINISH_CACHE_FULL, FINISH_LENGTH).astype(
      jnp.int32
    )
    rows, drawn = row_ids, jnp.int32(0)
  else:
    key, rows, drawn, window, done, reason = carry_in
  count = jnp.zeros((b,), jnp.int32)
  carry = (jnp.int32(0), state, tokens, logps, window, done, reason, count)
  steps, state, tokens, logps, window, done, reason, count = jax.lax.while_loop(cond, body, carry)
  # Rows generate at consecutive steps from step 0 until they stop.
  mask = jnp.arange(n)[None, :] < count[:, None]
  return (
    state,
    SampleOutput(tokens, logps, mask, count, reason),
    DecodeCarry(key, rows, drawn + steps, window, done, reason),
  )


def _take_rows(tree, rows):
  return jax.tree.map(lambda x: x[rows], tree)


def _put_rows(full, part, rows):
  # Row indices >= B (padding of a sub-batch) are dropped.
  return jax.tree.map(lambda f, p: f.at[rows].set(p, mode="drop"), full, part)


class Sampler:
  """Batched KV-cache sampling for one model architecture.

  Usage:
    graphdef, params = nnx.split(model)
    sampler = Sampler(model.config, graphdef, cache_size=1024, pad_id=tok.pad_id)
    state = sampler.prefill(params, prompts)          # list of token lists
    state, out = sampler.generate(params, state, key, SamplingParams(64))
    state = sampler.append(params, state, observations) # next turn
    state, out = sampler.generate(params, state, key2, SamplingParams(64))

  Compiles once per (batch, chunk bucket, sampling params); chunks are padded to
  a power of two (at least `min_bucket`) to bound the number of compilations.

  With `decode_chunk=k > 0`, `generate` decodes k tokens at a time and, between
  chunks, moves the rows still generating into a smaller batch (a power of two times
  the batch shards, at most half the current one). A decode step's cost grows with
  the rows it carries (each attends over its whole cache), and in agent turns a few
  long actions would otherwise keep every finished row in the loop. The output is
  unchanged, sampled or greedy: each row draws from its own stream (`row_ids`).
  With `append_chunk=k > 0`, `append` runs new tokens in pieces of k over only the rows
  that still hold tokens (observations of a few tokens beside one of 77 no longer pad
  every row to 128). `prefill` runs each distinct prompt once when they are at most half
  the rows (the episodes of a group share theirs).
  With a `mesh`, the cache and every per-row array are sharded along the logical
  `batch` axis (and kv heads along `kv_heads`), matching parameters laid out by
  `gagar_jax.sharding` with the same rules.

  `split_layers` (default: on CPU backends): the decode loop slices the blocks' weights
  out of their stack once and runs the layers as a Python loop, instead of the model's
  scan. XLA:CPU copies each weight out of the stack at every scan step, which at one
  token per row costs about as much as the matmuls (SmolLM2-135M shape: see
  results/performance.md, section 12); the price is a decode program compiled per layer.
  Accelerators keep the scan. Prefill and appends, many tokens per row, always follow
  `scan_layers`.
  """

  def __init__(
    self,
    config: transformer.ModelConfig,
    graphdef: nnx.GraphDef,
    *,
    cache_size: int,
    pad_id: int = 0,
    min_bucket: int = 16,
    mesh: jax.sharding.Mesh | None = None,
    rules=None,
    decode_chunk: int = 0,
    append_chunk: int = 0,
    split_layers: bool | None = None,
  ):
    if cache_size <= 0:
      raise ConfigError("sampler.cache_size", f"must be positive, got {cache_size}")
    if decode_chunk < 0:
      raise ConfigError("sampler.decode_chunk", f"must be >= 0, got {decode_chunk}")
    if append_chunk < 0:
      raise ConfigError("sampler.append_chunk", f"must be >= 0, got {append_chunk}")
    self.decode_chunk = int(decode_chunk)
    self.append_chunk = int(append_chunk)
    self.graphdef = graphdef
    self.cache_size = int(cache_size)
    self.pad_id = int(pad_id)
    self.min_bucket = min_bucket
    self._config = config
    self._mesh, self._rules = mesh, rules
    self._one_device = {}  # ndim -> the row sharding on a one-device mesh
    state_out = output_out = None
    if mesh is not None:
      # Rows over the batch axes, kv heads over the tensor axis; the layout is pinned
      # so that consecutive calls never see a new input sharding (no recompiles).
      state_out = self._state_shardings()
      rows = sharding_lib.batch_sharding(mesh, rules, 1)
      rows2 = sharding_lib.batch_sharding(mesh, rules, 2)
      output_out = SampleOutput(rows2, rows2, rows2, rows, rows)
    self._chunk = jax.jit(
      functools.partial(_forward_chunk, graphdef),
      static_argnums=(4,),
      donate_argnums=(1,),
      out_shardings=state_out,
    )
    carry_out = None
    if mesh is not None:
      whole = NamedSharding(mesh, jax.sharding.PartitionSpec())
      carry_out = DecodeCarry(whole, rows, whole, rows2, rows, rows)
    if split_layers is None:
      split_layers = jax.default_backend() == "cpu"
    self.split_layers = bool(split_layers)
    self._decode = jax.jit(
      functools.partial(_decode, graphdef, split_layers=self.split_layers),
      static_argnums=(3, 4, 8),
      donate_argnums=(1,),
      out_shardings=None if mesh is None else (state_out, output_out, carry_out),
    )
    self._zeros = jax.jit(self._empty, static_argnums=0, out_shardings=state_out)
    self._take = jax.jit(_take_rows, out_shardings=state_out)
    self._put = jax.jit(_put_rows, donate_argnums=(0,), out_shardings=state_out)

  def _state_shardings(self) -> SamplerState:
    def named(*axes):
      return NamedSharding(self._mesh, sharding_lib.logical_to_spec(axes, self._rules))

    kv = named("batch", "layers", "kv_heads", None, "head_dim")
    cache = transformer.KVCache(kv, kv)
    return SamplerState(cache, named("batch"), named("batch", "vocab"))

  def init_state(self, batch: int) -> SamplerState:
    """An empty batch of conversations (laid out over the mesh, if one was given)."""
    if self._mesh is not None:
      self._check_batch(batch)
    return self._zeros(batch)

  def _empty(self, batch: int) -> SamplerState:
    return SamplerState(
      transformer.init_cache(self._config, batch, self.cache_size),
      jnp.zeros((batch,), jnp.int32),
      jnp.zeros((batch, self._config.vocab_size), jnp.float32),
    )

  def attend_bound(self, needed: int) -> int:
    """The static attention bound for work that fills slots below `needed`: the next power
    of two (at least `MIN_ATTEND`), at most the cache size. Attention then reads only
    that much of the cache, so a large `cache_size` costs memory, not time, and there are
    at most log2(cache_size / MIN_ATTEND) + 1 bounds to compile for."""
    bound = MIN_ATTEND
    while bound < needed:
      bound *= 2
    return min(bound, self.cache_size)

  def _check_batch(self, batch: int) -> None:
    axes, size = sharding_lib.batch_axes(self._mesh, self._rules)
    if batch % size:
      raise ConfigError(
        "sampler.batch_size", f"{batch} rows do not divide over mesh axes {axes} (size {size})"
      )

  def _pad(self, seqs: Sequence[Sequence[int]]):
    longest = max((len(s) for s in seqs), default=0)
    width = self.min_bucket
    while width < longest:
      width *= 2
    if self.append_chunk:  # pieces of at most append_chunk tokens
      width = min(width, self.append_chunk)
    tokens = np.full((len(seqs), width), self.pad_id, np.int32)
    for i, s in enumerate(seqs):
      tokens[i, : len(s)] = s
    counts = np.asarray([len(s) for s in seqs], np.int32)
    return self._shard(tokens), self._shard(counts)

  def append(self, params, state: SamplerState, seqs: Sequence[Sequence[int]]) -> SamplerState:
    """Runs each row's new tokens (possibly none) through the model into the cache.

    With `append_chunk=k`, the tokens go in pieces of k: each piece runs only the rows
    that still have tokens, in a smaller batch when they are at most half of it (see
    `_sub_batch`); otherwise in one piece as wide as the longest row. The input `state`
    is donated; use the returned one.
    """
    if len(seqs) != state.lengths.shape[0]:
      raise ValueError(f"got {len(seqs)} sequences for a batch of {state.lengths.shape[0]}")
    room = self.cache_size - np.asarray(state.lengths)
    for i, s in enumerate(seqs):
      if len(s) > room[i]:
        raise ValueError(
          f"row {i}: {len(s)} new tokens exceed the {room[i]} free cache slots "
          f"(cache_size={self.cache_size})"
        )
    lengths = self.cache_size - room
    longest = max((len(s) for s in seqs), default=0)
    piece = self.append_chunk or max(longest, 1)
    for start in range(0, max(longest, 1), piece):
      part = [s[start : start + piece] for s in seqs]
      ends = [int(n) + min(len(s), start + piece) for n, s in zip(lengths, seqs, strict=True)]
      state = self._append_piece(params, state, part, self.attend_bound(max(ends)))
    return state

  def _append_piece(self, params, state: SamplerState, seqs, attend: int) -> SamplerState:
    size, rows = self._sub_batch(np.flatnonzero([len(x) > 0 for x in seqs]), len(seqs))
    if size is None or not (self.decode_chunk or self.append_chunk):
      tokens, counts = self._pad(seqs)
      return self._chunk(params, state, tokens, counts, attend)
    # Only the rows that receive tokens run (in a smaller batch).
    batch = len(seqs)
    part = self._take(state, self._shard(np.where(rows < batch, rows, rows[0])))
    tokens, counts = self._pad([seqs[r] if r < batch else [] for r in rows])
    part = self._chunk(params, part, tokens, counts, attend)
    return self._put(state, part, self._shard(rows))

  def _sub_batch(self, live: np.ndarray, batch: int):
    """(size, rows) of a smaller batch holding rows `live` (padding rows = `batch`), or
    (None, None) when the batch would not be at most half."""
    if not live.size:
      return None, None
    size = 1 if self._mesh is None else sharding_lib.batch_axes(self._mesh, self._rules)[1]
    while size < live.size:
      size *= 2
    if size > batch // 2:
      return None, None
    return size, np.concatenate([live, np.full(size - live.size, batch)])

  def prefill(self, params, prompts: Sequence[Sequence[int]]) -> SamplerState:
    """A new batch of conversations holding `prompts` (each non-empty).

    Rows with the same prompt (the episodes of a group) share one prefill: when the
    distinct prompts are at most half the rows, they run in a smaller batch whose rows
    are then copied out."""
    if any(len(p) == 0 for p in prompts):
      raise ValueError("every prompt needs at least one token")
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    size, _ = self._sub_batch(np.arange(len(distinct)), len(prompts))
    if size is None:
      return self.append(params, self.init_state(len(prompts)), prompts)
    rows = [list(p) for p in distinct] + [[] for _ in range(size - len(distinct))]
    small = self.append(params, self.init_state(size), rows)
    return self._take(small, self._shard(np.asarray(index, np.int32)))

  def generate(
    self,
    params,
    state: SamplerState,
    key: jax.Array,
    sampling: SamplingParams,
    active=None,
    stop_strings: StopStrings | None = None,
    row_ids=None,
  ) -> tuple[SamplerState, SampleOutput]:
    """Samples up to `sampling.max_new_tokens` per row; the state is donated.

    `active` (bool `[B]`, default all): rows that are False generate nothing and keep
    their cache (finished conversations in a batch that goes on). `stop_strings`: text
    that ends a row (see `StopStrings`); the output and cache end at its last token.
    `row_ids` (int `[B]`, default `arange(B)`): each row's random stream (module
    docstring): a row with the same id, key and history samples the same tokens in any
    batch.
    """
    batch = state.lengths.shape[0]
    if active is None:
      active = np.ones((batch,), bool)
    active = np.asarray(active, bool)
    row_ids = np.arange(batch, dtype=np.int32) if row_ids is None else np.asarray(row_ids, np.int32)
    # Every generating row ends within its length + max_new_tokens slots.
    lengths = np.asarray(jax.device_get(state.lengths))
    longest = int(lengths[active].max()) if active.any() else 0
    attend = self.attend_bound(longest + sampling.max_new_tokens)
    if self.decode_chunk and sampling.max_new_tokens > self.decode_chunk:
      state, out = self._generate_compacting(
        params, state, key, sampling, active, row_ids, stop_strings, attend
      )
    else:
      active, ids = self._shard(active), self._shard(row_ids)
      state, out, _ = self._decode(
        params, state, key, sampling, self.pad_id, active, ids, None, attend
      )
    if stop_strings is not None and stop_strings.strings:
      state, out = self._cut_at_stop_strings(params, state, out, stop_strings)
    return state, out

  def _cut_at_stop_strings(self, params, state, out: SampleOutput, stop: StopStrings):
    """Ends rows at the token completing a stop string: the output drops later tokens,
    the row's length is rewound and its last kept token re-run (fresh next logits)."""
    got = jax.device_get((out.tokens, out.logprobs, out.num_tokens, out.finish_reason))
    tokens, logps, counts, reasons = (np.array(x) for x in got)
    keep = {}
    for r in np.flatnonzero(counts):
      k = stop.cut(tokens[r, : counts[r]].tolist())
      if k is not None and (k < counts[r] or reasons[r] != FINISH_STOP):
        keep[r] = k
    if not keep:
      return state, out
    lengths = np.array(jax.device_get(state.lengths))
    rerun = [[] for _ in range(len(counts))]
    for r, k in keep.items():
      lengths[r] -= counts[r] - k + 1
      rerun[r] = [int(tokens[r, k - 1])]
      tokens[r, k:], logps[r, k:], counts[r], reasons[r] = self.pad_id, 0.0, k, FINISH_STOP
    state = state._replace(lengths=self._shard(lengths.astype(np.int32)))
    state = self.append(params, state, rerun)
    mask = np.arange(tokens.shape[1])[None, :] < counts[:, None]
    return state, SampleOutput(tokens, logps, mask, counts, reasons)

  def _generate_compacting(self, params, state, key, sampling, active, ids, stop, attend):
    """`generate` in chunks of `decode_chunk` tokens, dropping finished rows between them."""
    batch, n = state.lengths.shape[0], sampling.max_new_tokens
    tokens = np.full((batch, n), self.pad_id, np.int32)
    logps = np.zeros((batch, n), np.float32)
    counts = np.zeros((batch,), np.int32)
    lengths = np.asarray(jax.device_get(state.lengths))
    full_cache = lengths >= self.cache_size
    reasons = np.where(full_cache, FINISH_CACHE_FULL, FINISH_LENGTH).astype(np.int32)
    rows = np.arange(batch)  # the full-batch row of each row of `part` (>= batch: padding)
    full, part, carry = None, state, None
    first = self._shard(active)
    live = np.flatnonzero(active)
    size, slots = self._sub_batch(live, batch)
    if size is not None:  # few rows take part at all: start in a smaller batch
      real = slots < batch
      pick = np.where(real, slots, live[0])
      full, rows = state, np.where(real, pick, batch)
      part = self._take(full, self._shard(pick))
      width = _stop_table(sampling.stop_sequences).shape[1]
      carry = DecodeCarry(
        key,
        self._shard(ids[pick]),
        jnp.int32(0),
        self._shard(np.full((size, width), -2, np.int32)),
        self._shard(~real | full_cache[pick]),
        self._shard(reasons[pick]),
      )
    going = np.asarray(active, bool) & ~full_cache  # full-batch rows still generating
    step = 0
    while step < n:
      chunk = dataclasses.replace(sampling, max_new_tokens=min(self.decode_chunk, n - step))
      flags = first if carry is None else carry.done  # ignored once a carry exists
      # Each chunk attends only as far as its live rows can reach by its end (rows of
      # ~250 tokens with 384 to go read 512 slots, not the 1024 the whole call needs).
      reach = int((lengths + counts)[going].max()) if going.any() else 0
      bound = min(attend, self.attend_bound(reach + chunk.max_new_tokens))
      row_ids = carry.rows if carry is not None else self._shard(ids)  # (ignored with a carry)
      part, out, carry = self._decode(
        params, part, key, chunk, self.pad_id, flags, row_ids, carry, bound
      )
      got, lp, cnt, why, done = jax.device_get(
        (out.tokens, out.logprobs, out.num_tokens, out.finish_reason, carry.done)
      )
      for i, r in enumerate(rows):
        if r < batch:
          k, c = int(cnt[i]), int(counts[r])
          tokens[r, c : c + k], logps[r, c : c + k] = got[i, :k], lp[i, :k]
          counts[r], reasons[r] = c + k, why[i]
      step += chunk.max_new_tokens
      if stop is not None and stop.strings:  # rows whose text stopped leave the loop
        hit = [
          i
          for i, r in enumerate(rows)
          if r < batch and not done[i] and stop.cut(tokens[r, : counts[r]].tolist())
        ]
        if hit:
          done = np.array(done)
          done[hit] = True
          carry = carry._replace(done=self._shard(done))
      live = np.flatnonzero(~done & (rows < batch))
      going[:] = False
      going[rows[live]] = True
      if not live.size or step >= n:
        break
      full, part, carry, rows = self._compact(full, part, carry, rows, live, ids)
    if full is not None:
      part = self._put(full, part, self._shard(rows))
    mask = np.arange(n)[None, :] < counts[:, None]
    return part, SampleOutput(tokens, logps, mask, counts, reasons)

  def _compact(self, full, part, carry: DecodeCarry, rows, live, ids):
    """Moves the rows `live` of `part` (full-batch rows `rows`, padding >= the batch) into
    a batch of the `_sub_batch` size, when there is one: returns (full, part, carry, rows).
    Padding rows repeat a live row, are marked done, and are never written back."""
    size, slots = self._sub_batch(live, len(rows))
    if size is None:
      return full, part, carry, rows
    batch = len(ids)
    real = slots < len(rows)
    pick = np.where(real, slots, live[0])
    full = part if full is None else self._put(full, part, self._shard(rows))
    gather = rows[pick]
    rows = np.where(real, gather, batch)
    part = self._take(full, self._shard(gather))
    window, why = jax.device_get((carry.window, carry.reason))
    carry = DecodeCarry(
      carry.key,
      self._shard(ids[np.minimum(rows, batch - 1)]),
      carry.drawn,
      self._shard(window[pick]),
      self._shard(rows >= batch),
      self._shard(why[pick]),
    )
    return full, part, carry, rows

  def _shard(self, x):
    x = np.asarray(x)
    if self._mesh is None:
      return jnp.asarray(x)
    if self._mesh.size == 1:  # (a plain transfer: this runs several times per decode chunk)
      if x.ndim not in self._one_device:
        self._one_device[x.ndim] = sharding_lib.batch_sharding(self._mesh, self._rules, x.ndim)
      return jax.device_put(x, self._one_device[x.ndim])
    return sharding_lib.shard_batch(x, self._mesh, self._rules)


def _naive_decode(graphdef, params, tokens, lengths, key, params_s: SamplingParams, pad_id: int):
  """Re-runs the whole sequence every step (no cache); same sampling as `_decode`."""
  model = nnx.merge(graphdef, params)
  b, width = tokens.shape
  n = params_s.max_new_tokens
  stop_table = jnp.asarray(_stop_table(params_s.stop_sequences))
  rows = jnp.arange(b)

  def body(step, carry):
    tokens, lengths, key, out, logps, done, count = carry
    logits = model(tokens)[rows, lengths - 1]
    tok, lp = sample_logits(logits, token_keys(key, rows, step), params_s)
    alive = ~done
    tok = jnp.where(alive, tok, pad_id)
    out = out.at[:, step].set(tok)
    logps = logps.at[:, step].set(jnp.where(alive, lp, 0.0))
    tokens = tokens.at[rows, lengths].set(tok, mode="drop")
    lengths = lengths + alive
    count = count + alive
    window = jnp.take_along_axis(
      out,
      jnp.clip(step - stop_table.shape[1] + 1 + jnp.arange(stop_table.shape[1]), 0)[None].repeat(
        b, 0
      ),
      axis=1,
    )
    valid = (step - stop_table.shape[1] + 1 + jnp.arange(stop_table.shape[1])) >= 0
    window = jnp.where(valid[None], window, -2)
    hit = jnp.zeros_like(done)
    if params_s.stop_sequences:
      match = (stop_table[None] == window[:, None]) | (stop_table[None] < 0)
      hit = jnp.any(jnp.all(match, axis=-1), axis=-1)
    if params_s.eos_id is not None:
      hit = hit | (tok == params_s.eos_id)
    done = done | (alive & hit) | (lengths >= width)
    return tokens, lengths, key, out, logps, done, count

  out = jnp.full((b, n), pad_id, jnp.int32)
  logps = jnp.zeros((b, n), jnp.float32)
  zeros = jnp.zeros((b,), jnp.int32)
  carry = (tokens, lengths, key, out, logps, zeros.astype(bool), zeros)
  _, _, _, out, logps, _, count = jax.lax.fori_loop(0, n, body, carry)
  mask = jnp.arange(n)[None, :] < count[:, None]
  return out, logps, mask


def generate_without_cache(
  graphdef,
  params,
  prompts: Sequence[Sequence[int]],
  key: jax.Array,
  sampling: SamplingParams,
  *,
  pad_id: int = 0,
):
  """Reference decoding that re-runs the full sequence for every new token.

  Quadratic in length and only for checks and benchmarks: greedy output must
  equal `Sampler.generate` token for token. Returns (tokens, logprobs, mask), `[B, N]`.
  """
  width = max(len(p) for p in prompts) + sampling.max_new_tokens
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  for i, p in enumerate(prompts):
    tokens[i, : len(p)] = p
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  fn = _naive_jit(graphdef)
  return fn(params, jnp.asarray(tokens), lengths, key, sampling, pad_id)


@functools.lru_cache(maxsize=8)
def _naive_jit(graphdef):
  return jax.jit(functools.partial(_naive_decode, graphdef), static_argnums=(4, 5))
