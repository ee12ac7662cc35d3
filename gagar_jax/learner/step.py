"""The jitted, sharded GRPO/GAGAR update step and the log-prob function.

A batch holds N groups of G trajectories (`Batch`, arrays `[N, G, ...]`), sharded
over the mesh's batch axes along N. One step:

  group advantages (GRPO / Dr. GRPO / RLOO) -> GAGAR redistribution by rank
  -> per-trajectory advantages broadcast to the policy's tokens
  -> PPO-clip loss (+ KL), gradients accumulated over micro-batches
  -> global-norm clip + AdamW, unless the loss or gradient norm is non-finite or the
     batch holds no policy token (then the state is returned unchanged).

Compiled once per run (fixed shapes, explicit in/out shardings, state donated).
"""

from __future__ import annotations

import collections
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gagar_jax import advantages as adv_lib
from gagar_jax import sharding
from gagar_jax.errors import ConfigError
from gagar_jax.learner import losses
from gagar_jax.learner.config import AdvantageConfig, LearnerConfig
from gagar_jax.learner.train_state import TrainState, make_schedule
from gagar_jax.models import transformer


class Sequences(NamedTuple):
  """The token part of a `Batch`: `[N, G, T]` (N groups x G trajectories x T positions).

  Attributes:
    tokens: int32, whole transcripts (prompt, actions, observations), right-padded.
    mask: bool, True at tokens the policy generated (the only ones the loss sees).
    old_logprobs: float32, log-probs of each token under the sampling policy.
    ref_logprobs: float32, under the reference policy; read only when KL is on (the
      trainer passes the old log-probs there when it is off).
  """

  tokens: Any
  mask: Any
  old_logprobs: Any
  ref_logprobs: Any

  DTYPES = (np.int32, np.bool_, np.float32, np.float32)


class Groups(NamedTuple):
  """The group part of a `Batch`: `[N, G]`, one entry per trajectory; all that the
  advantages are computed from (`compute_advantages`).

  Attributes:
    rewards: float32.
    passed: bool, hidden tests passed.
    ranks: int32, the grader's ranks of passing trajectories (0 = best).
    valid: bool, False at padding slots.
    tiers, tier_ranks: int32, the grader's tier (0 = T1 .. 2 = T3) and tied rank within
      it (`advantage.mode = "tiered"`); None = T2 / 0.
    hacks: bool, confirmed reward hacks; None = none.
    graded: bool (constant along G), the group's grading is usable; None = no.
  """

  rewards: Any
  passed: Any
  ranks: Any
  valid: Any
  tiers: Any = None
  tier_ranks: Any = None
  hacks: Any = None
  graded: Any = None

  DTYPES = (np.float32, np.bool_, np.int32, np.bool_, np.int32, np.int32, np.bool_, np.bool_)

  def with_grade_defaults(self) -> Groups:
    """The same groups with absent grade fields filled (T2, rank 0, no hacks, ungraded)."""
    shape = np.shape(self.rewards)
    return self._replace(
      tiers=np.ones(shape, np.int32) if self.tiers is None else self.tiers,
      tier_ranks=np.zeros(shape, np.int32) if self.tier_ranks is None else self.tier_ranks,
      hacks=np.zeros(shape, bool) if self.hacks is None else self.hacks,
      graded=np.zeros(shape, bool) if self.graded is None else self.graded,
    )


_SEQ = len(Sequences._fields)


class Batch(
  collections.namedtuple(
    "Batch", Sequences._fields + Groups._fields, defaults=Groups._field_defaults.values()
  )
):
  """N groups x G trajectories: the `Sequences` fields, then the `Groups` fields (each
  part described once, there); what the rollout hands the learner, sharded along N."""

  __slots__ = ()
  DTYPES = Sequences.DTYPES + Groups.DTYPES
  NDIMS = (3,) * len(Sequences._fields) + (2,) * len(Groups._fields)

  @classmethod
  def join(cls, seqs: Sequences, groups: Groups) -> Batch:
    return cls(*seqs, *groups)

  @property
  def seqs(self) -> Sequences:
    return Sequences(*self[:_SEQ])

  @property
  def groups(self) -> Groups:
    return Groups(*self[_SEQ:])

  def with_grade_defaults(self) -> Batch:
    return Batch.join(self.seqs, self.groups.with_grade_defaults())

  @classmethod
  def from_rollout(cls, arrays) -> Batch:
    """Packs a rollout's host arrays (`tokens`, `mask`, `logprobs`, `rewards`, `passed`,
    `valid`; e.g. `rollout.to_arrays`). `old_logprobs` are the sampling log-probs (the
    trainer replaces them with the learner's recomputation); `ref_logprobs` and `ranks`
    are zeros (the trainer fills them in after grading)."""
    logprobs = np.asarray(arrays.logprobs, np.float32)
    seqs = Sequences(arrays.tokens, arrays.mask, logprobs, np.zeros_like(logprobs))
    ranks = np.zeros(np.shape(arrays.rewards), np.int32)
    return cls.join(seqs, Groups(arrays.rewards, arrays.passed, ranks, arrays.valid))


class Advantages(NamedTuple):
  """What `compute_advantages` gives: `[N, G]` advantages before (`base`) and after
  (`new`) redistribution, `[N]` lambda per group (tiered: the kernel's capped rescale;
  rank: sum_P A' / sum_P (w A) over passing slots, 1 where undefined) and the step's
  advantage metrics. The learner's step reads `new` and `metrics` (the rest is dead code
  there); the trainer's group records read all of it, so the arms' dispatch is here once."""

  base: jax.Array
  new: jax.Array
  lam: jax.Array
  metrics: dict


def compute_advantages(groups: Groups, cfg: AdvantageConfig) -> Advantages:
  """Group advantages, then redistribution (`groups`: a batch's `Groups`).

  `cfg.mode = "tiered"`: the paper's protocol (`advantages.tiered_advantages`: hacks reset,
  r - mean(r), tier factors, capped rescale, re-centred), with lambda and the capped share
  in the metrics."""
  if cfg.mode == "tiered":
    b = groups.with_grade_defaults()
    base = adv_lib.group_advantages(b.rewards, b.valid, estimator="drgrpo")
    if not cfg.redistribute:
      ones = jnp.ones(jnp.shape(base)[:-1], jnp.float32)
      return Advantages(base, base, ones, advantage_metrics(base, base, b))
    new, lam, capped = adv_lib.tiered_advantages(
      b.rewards,
      b.passed,
      b.valid,
      b.tiers,
      b.tier_ranks,
      b.hacks if cfg.hacks else jnp.zeros_like(b.hacks),
      jnp.any(b.graded, axis=-1),
      lambda_max=cfg.lambda_max,
      f_runner=cfg.f_runner,
      f_max=cfg.f_max,
      f_min=cfg.f_min,
      f_low=cfg.f_low,
    )
    graded = jnp.any(b.graded, axis=-1) & adv_lib.informative_groups(b.passed, b.valid)
    n_graded = jnp.maximum(jnp.sum(graded), 1)
    metrics = advantage_metrics(base, new, b)
    metrics["lambda_mean"] = jnp.sum(jnp.where(graded, lam, 0.0)) / n_graded
    metrics["lambda_capped_share"] = jnp.sum(graded & capped) / n_graded
    metrics["hacks_reset"] = jnp.sum(b.hacks & b.passed & b.valid & cfg.hacks).astype(jnp.float32)
    return Advantages(base, new, lam, metrics)
  g = groups
  base = adv_lib.group_advantages(g.rewards, g.valid, estimator=cfg.estimator, eps=cfg.eps)
  if cfg.redistribute:
    new = adv_lib.redistribute(
      base,
      g.passed,
      g.ranks,
      g.valid,
      preserve_sum=cfg.preserve_sum,
      scheme=cfg.scheme,
      **cfg.scheme_kwargs,
    )
  else:
    new = base
  weights = adv_lib.rank_weights(g.ranks, g.passed, g.valid, scheme=cfg.scheme, **cfg.scheme_kwargs)
  lam = credit_lambda(base, new, g.passed, g.valid, weights)
  return Advantages(base, new, lam, advantage_metrics(base, new, g))


def credit_lambda(base, new, passed, valid, weights=None) -> jax.Array:
  """Per group: sum_P A' / sum_P (w A) over passing valid slots (1 where undefined)."""
  p = jnp.asarray(passed) & jnp.asarray(valid)
  w = jnp.ones_like(base) if weights is None else weights
  den = jnp.sum(jnp.where(p, w * base, 0.0), axis=-1)
  num = jnp.sum(jnp.where(p, new, 0.0), axis=-1)
  ok = jnp.abs(den) > 1e-9
  return jnp.where(ok, num / jnp.where(ok, den, 1.0), 1.0)


def advantage_metrics(base, new, batch: Groups) -> dict:
  """How much credit redistribution moved, and plain advantage statistics."""
  valid, passing = batch.valid, batch.passed & batch.valid
  informative = adv_lib.informative_groups(batch.passed, batch.valid)
  n_valid = jnp.maximum(jnp.sum(valid), 1)
  mean = jnp.sum(jnp.where(valid, new, 0.0)) / n_valid
  std = jnp.sqrt(jnp.sum(jnp.where(valid, (new - mean) ** 2, 0.0)) / n_valid)
  n_pass = jnp.sum(passing)
  moved = jnp.sum(jnp.where(passing, jnp.abs(new - base), 0.0)) / jnp.maximum(n_pass, 1)
  # max/min passing advantage per group with >= 2 passing members and positive credit.
  big = jnp.float32(3e38)
  hi = jnp.max(jnp.where(passing, new, -big), axis=-1)
  lo = jnp.min(jnp.where(passing, new, big), axis=-1)
  has_ratio = (jnp.sum(passing, axis=-1) >= 2) & (lo > 0)
  ratio = jnp.where(has_ratio, hi / jnp.where(has_ratio, lo, 1.0), 0.0)
  return {
    "adv_mean": mean,
    "adv_std": std,
    "adv_abs_moved": moved,
    "adv_passing_ratio": jnp.sum(ratio) / jnp.maximum(jnp.sum(has_ratio), 1),
    "groups_informative": jnp.sum(informative).astype(jnp.float32),
    "groups_redistributed": jnp.sum(
      jnp.any(jnp.abs(new - base) > 1e-6 * (1 + jnp.abs(base)), axis=-1)
    ).astype(jnp.float32),
    "trajectories_passed": n_pass.astype(jnp.float32),
  }


# Float32 logits held at once by `token_logprobs` (rows x positions x vocabulary): past
# this the sequence is cut into chunks whose logits are recomputed in the backward pass.
LOGIT_CHUNK_ELEMENTS = 1 << 24


def logit_chunk(rows: int, positions: int, vocab: int) -> int:
  """Positions per chunk so that `rows x chunk x vocab` stays within LOGIT_CHUNK_ELEMENTS
  (a power of two); `positions` (one chunk) when everything fits."""
  if rows * positions * vocab <= LOGIT_CHUNK_ELEMENTS:
    return positions
  chunk = 1
  while rows * chunk * 2 * vocab <= LOGIT_CHUNK_ELEMENTS:
    chunk *= 2
  return chunk


def _chunk_logprobs(head, hidden, targets):
  """(log p(target), entropy) `[B, C]` from hidden states `[B, C, D]`: the logits'
  log-sum-exp, the target's logit and the softmax-weighted logits; never log_softmax's
  full `[B, C, V]` output beside the logits."""
  logits = transformer.head_logits(hidden, head)
  lse = jax.nn.logsumexp(logits, axis=-1)
  taken = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse
  probs = jnp.exp(logits - lse[..., None])
  entropy = lse - jnp.sum(probs * logits, axis=-1)
  return taken, entropy


def token_logprobs(graphdef, params, tokens, with_entropy: bool = False, *, chunk=None):
  """log p(token_t | tokens_<t) for `tokens [B, T]` -> `[B, T]` (0 at t = 0), and with
  `with_entropy` the policy's entropy at each position.

  The vocabulary projection runs over chunks of `chunk` positions (default
  `logit_chunk`), each under `jax.checkpoint`: the forward pass and the gradient hold
  one chunk's `[B, chunk, V]` float32 logits, never the whole `[B, T, V]`.
  """
  model = nnx.merge(graphdef, params)
  hidden, _ = model.hidden(tokens[:, :-1])
  targets = tokens[:, 1:]
  b, t = targets.shape
  head = model.head()
  chunk = logit_chunk(b, t, head.shape[1]) if chunk is None else min(int(chunk), t)
  if chunk >= t:
    taken, entropy = _chunk_logprobs(head, hidden, targets)
  else:
    n = -(-t // chunk)
    pad = n * chunk - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, hidden.shape[-1])
    y = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk)
    per_chunk = jax.checkpoint(lambda xs: _chunk_logprobs(head, *xs))
    taken, entropy = jax.lax.map(per_chunk, (jnp.swapaxes(h, 0, 1), jnp.swapaxes(y, 0, 1)))
    taken = jnp.swapaxes(taken, 0, 1).reshape(b, n * chunk)[:, :t]
    entropy = jnp.swapaxes(entropy, 0, 1).reshape(b, n * chunk)[:, :t]
  taken = jnp.pad(taken, ((0, 0), (1, 0)))
  if not with_entropy:
    return taken
  return taken, jnp.pad(entropy, ((0, 0), (1, 0)))


def _flatten(x):
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _micro_split(x, m: int):
  """`[B, ...]` -> `[m, B / m, ...]`, strided, so each micro-batch spans every device."""
  return jnp.moveaxis(x.reshape((x.shape[0] // m, m) + x.shape[1:]), 1, 0)


class TrainStep:
  """The learner's update: `step(state, batch) -> (state, metrics)`; `state` is donated.

  With a `SplitStep` (`learner.split_step`) it runs as separate jitted programs: the
  forward pass with its residuals (`jax.vjp`), then the backward pass, then the optimizer
  update. On XLA:CPU this is 1.5-1.8x faster than the one fused program (whose forward
  matmuls and elementwise ops run several times slower than the same ops in a
  forward-only program), at the price of a few dispatches. Both give the same update.
  `lower` always lowers the fused program (the planner reads its memory analysis).

  `on_policy=True`: the batch was sampled by `state.params` and this is its first update,
  so the old log-probs are the current ones: the loss takes them from its own forward pass
  (under `stop_gradient`: ratio 1, the same gradient) and `batch.old_logprobs` is not
  read, which spares the trainer a log-prob pass over the batch.

  `lengths` (`[N, G]` tokens per trajectory, host): with `buckets = k > 1`
  (`learner.length_buckets`), the trajectories are sorted by length and the loss runs
  over k equal parts, each cut to its own longest trajectory (`bucket_plan`): the same
  loss and gradient over fewer padded positions. The fused program compiles per set of
  widths, the split one per width.
  """

  def __init__(self, fused, split=None, buckets: int = 1):
    self.fused, self.parts = fused, split
    self.split = split is not None
    self.buckets = buckets

  def __call__(self, state: TrainState, batch: Batch, on_policy: bool = False, lengths=None):
    rows, width = batch.tokens.shape[0] * batch.tokens.shape[1], batch.tokens.shape[2]
    plan = None if lengths is None else bucket_plan(lengths, self.buckets, width)
    order, widths = plan if plan is not None else (np.arange(rows, dtype=np.int32), None)
    on_policy = bool(on_policy)
    if not self.split:
      return self.fused(state, batch, order, on_policy, widths)
    return self.parts(state, batch, order, on_policy, widths or (width,))

  def lower(self, state, batch):
    return self.fused.lower(state, batch, np.arange(batch.tokens.shape[0] * batch.tokens.shape[1]))

  def _cache_size(self) -> int:
    return self.parts.cache_size() if self.split else self.fused._cache_size()


class SplitStep:
  """`TrainStep`'s split form: one jitted program prepares the batch's loss inputs (the
  advantages, the rows flattened), then per length bucket a forward program (the loss over
  the bucket's rows cut to its width, with its residuals: `jax.vjp`) and a backward program
  (its gradient), and one program sums the buckets and applies the update. The forward and
  backward programs compile per bucket width, not per set of widths, so after a few steps
  every update reuses programs already in memory."""

  def __init__(self, prepare, forward, backward, apply):
    self.prepare, self.forward, self.backward, self.apply = prepare, forward, backward, apply

  def __call__(self, state: TrainState, batch: Batch, order, on_policy: bool, widths):
    arrays, denom, adv_metrics, totals = self.prepare(batch)
    size = len(order) // len(widths)
    outs = []
    for k, w in enumerate(widths):
      rows = np.asarray(order[k * size : (k + 1) * size], np.int32)
      loss, vjp_fn, metrics = self.forward(state.params, arrays, rows, denom, on_policy, w)
      outs.append((loss, metrics, self.backward(vjp_fn, loss)))
    return self.apply(state, outs, adv_metrics, totals)

  def cache_size(self) -> int:
    return max(j._cache_size() for j in (self.prepare, self.apply))


# Bucket widths are multiples of this (fewer programs than one per length).
BUCKET_ROUND = 64


def bucket_plan(lengths, buckets: int, width: int):
  """(order, widths) for `TrainStep`: the rows (trajectories, flattened `[N * G]`) sorted
  by length, and per bucket of `rows / buckets` consecutive sorted rows the width that
  holds its longest (rounded up to `BUCKET_ROUND`, at most `width`). None when there is
  nothing to gain (one bucket, rows that do not split evenly, or every width full)."""
  flat = np.asarray(lengths).reshape(-1)
  if buckets <= 1 or flat.size % buckets:
    return None
  order = np.argsort(flat, kind="stable").astype(np.int32)
  size = flat.size // buckets
  widths = []
  for k in range(buckets):
    longest = int(flat[order[(k + 1) * size - 1]])
    widths.append(min(width, max(BUCKET_ROUND, -(-longest // BUCKET_ROUND) * BUCKET_ROUND)))
  if all(w == width for w in widths):
    return None
  return order, tuple(widths)


def _buckets(arrays, order, widths):
  """`arrays` (rows first) as one part, or sorted by `order` and cut into the buckets of
  `widths` (see `bucket_plan`)."""
  if widths is None:
    return [arrays]
  size = arrays[0].shape[0] // len(widths)
  ordered = [x[order] for x in arrays]
  return [
    tuple(
      x[k * size : (k + 1) * size, :w] if x.ndim > 1 else x[k * size : (k + 1) * size]
      for x in ordered
    )
    for k, w in enumerate(widths)
  ]


def resolve_split(split: str, micro_batches: int) -> bool:
  """`learner.split_step`: "auto" splits on CPU backends with one micro-batch."""
  if split == "auto":
    return jax.default_backend() == "cpu" and micro_batches == 1
  return split == "on"


def guarded_update(optimizer, state: TrainState, grads, loss, has_tokens=True):
  """The optimizer's update of `state`, applied only if the loss and the gradient norm are
  finite (and `has_tokens`): otherwise the state comes back unchanged, and the host raises
  on `finite == 0` (`check_finite`) with the last finite state. Shared by the RL step and
  SFT. Returns (state, gradient norm, finite, applied)."""
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  apply = finite & has_tokens
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(apply, a, b), new, old)
  new_state = TrainState(
    state.step + apply.astype(jnp.int32),
    keep(params, state.params),
    keep(opt_state, state.opt_state),
    state.rng,
  )
  return new_state, grad_norm, finite, apply


def part_loss(graphdef, loss_cfg, params, tokens, mask, old, ref, adv, denom, on_policy, full_t):
  """PPO-clip (+ KL) over one part of a batch's rows, normalised by the batch-wide `denom`
  (so parts add up to the batch's loss); (loss, metrics)."""
  logp, entropy = token_logprobs(graphdef, params, tokens, with_entropy=True)
  if on_policy:  # sampled by these very parameters (see `TrainStep`)
    old = jax.lax.stop_gradient(logp)
  # seq_mean_token_sum_norm divides by the untrimmed length (a bucket's is shorter).
  max_tokens = loss_cfg.max_tokens or full_t
  pg, metrics = losses.ppo_clip_loss(
    logp,
    old,
    adv,
    mask,
    eps_low=loss_cfg.eps_low,
    eps_high=loss_cfg.eps_high,
    dual_clip=loss_cfg.dual_clip,
    agg=loss_cfg.agg,
    max_tokens=max_tokens,
    denom=denom,
  )
  kl = losses.aggregate(
    losses.kl_penalty(logp, ref, loss_cfg.kl),
    mask,
    loss_cfg.agg,
    max_tokens=max_tokens,
    denom=denom,
  )
  total = pg + loss_cfg.kl_coef * kl
  metrics = dict(
    metrics,
    pg_loss=pg,
    kl=kl,
    entropy=losses.aggregate(entropy, mask, "token_mean", denom=denom),
  )
  return total, metrics


def _loss_inputs(batch: Batch, advantage_cfg):
  """The loss's row arrays (tokens, mask, old, ref, advantages), each `[N * G, T]` (advantages
  `[N * G]`), the batch-wide denominators and the advantage metrics."""
  adv = compute_advantages(batch.groups, advantage_cfg)
  tokens, mask = _flatten(batch.tokens), _flatten(batch.mask)
  old, ref = _flatten(batch.old_logprobs), _flatten(batch.ref_logprobs)
  # Batch-wide denominators make the sum of micro-batch losses equal the full loss.
  denom = losses.denominators(mask)
  return (tokens, mask, old, ref, _flatten(adv.new)), denom, adv.metrics


def _micro_batched(grad_fn, params, arrays, m: int, *args):
  """Loss, metrics and gradients of `grad_fn` summed over `m` micro-batches of the rows
  (a scan: one micro-batch's activations live at a time)."""
  parts = [_micro_split(x, m) for x in arrays]

  def run(part):
    (loss, metrics), grads = grad_fn(params, [part], *args)
    return loss, metrics, grads

  def accumulate(carry, part):
    return jax.tree.map(jnp.add, carry, run(part)), None

  shapes = jax.eval_shape(run, [p[0] for p in parts])
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  (loss, metrics, grads), _ = jax.lax.scan(accumulate, zeros, parts)
  return loss, metrics, grads


def _apply_update(
  optimizer, schedule, state: TrainState, loss, metrics, grads, adv_metrics, has_tokens
):
  """The guarded optimizer update and the step's metrics. A batch without policy tokens
  (all padding) changes nothing either: AdamW's momentum would still move the parameters
  on zero gradients."""
  new_state, grad_norm, finite, apply = guarded_update(optimizer, state, grads, loss, has_tokens)
  rng = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0])
  metrics = dict(
    metrics,
    **adv_metrics,
    loss=loss,
    grad_norm=grad_norm,
    learning_rate=schedule(state.step),
    finite=finite.astype(jnp.float32),
    updated=apply.astype(jnp.float32),
  )
  return new_state._replace(rng=rng), metrics


def make_train_step(
  config: LearnerConfig,
  graphdef,
  optimizer: optax.GradientTransformation,
  state_shardings: TrainState,
  mesh,
  rules=None,
) -> TrainStep:
  """Returns the jitted `TrainStep`; `state` is donated."""
  loss_cfg = config.loss
  schedule = make_schedule(config.optim)
  m = config.micro_batches

  def loss_fn(params, parts, denom, on_policy, full_t):
    """The loss over `parts`, each (tokens, mask, old, ref, adv) of some rows (one part,
    or the length buckets of `bucket_plan`): losses and metrics add up, since every
    part is normalised by the batch-wide `denom`; `full_t` is the batch's own length."""
    out = [part_loss(graphdef, loss_cfg, params, *part, denom, on_policy, full_t) for part in parts]
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *out)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  update = functools.partial(_apply_update, optimizer, schedule)

  def step(state: TrainState, batch: Batch, order, on_policy=False, widths=None):
    arrays, denom, adv_metrics = _loss_inputs(batch, config.advantage)
    full_t = arrays[0].shape[-1]
    if m == 1:
      parts = _buckets(arrays, order, widths)
      (loss, metrics), grads = grad_fn(state.params, parts, denom, on_policy, full_t)
    else:
      loss, metrics, grads = _micro_batched(
        grad_fn, state.params, arrays, m, denom, on_policy, full_t
      )
    metrics = dict(metrics, tokens=jnp.sum(arrays[1]).astype(jnp.float32))
    return update(state, loss, metrics, grads, adv_metrics, jnp.any(arrays[1]))

  def prepare(batch: Batch):
    arrays, denom, adv_metrics = _loss_inputs(batch, config.advantage)
    totals = (jnp.sum(arrays[1]).astype(jnp.float32), jnp.any(arrays[1]))
    return arrays, denom, adv_metrics, totals

  def forward(params, arrays, rows, denom, on_policy, width):
    part = tuple(x[rows, :width] if x.ndim > 1 else x[rows] for x in arrays)
    full_t = arrays[0].shape[-1]
    return jax.vjp(
      lambda p: part_loss(graphdef, loss_cfg, p, *part, denom, on_policy, full_t),
      params,
      has_aux=True,
    )

  def backward(vjp_fn, loss):
    return vjp_fn(jnp.ones_like(loss))[0]

  def apply(state: TrainState, outs, adv_metrics, totals):
    loss, metrics, grads = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *outs)
    metrics = dict(metrics, tokens=totals[0])
    return update(state, loss, metrics, grads, adv_metrics, totals[1])

  batch_sh = batch_shardings(mesh, rules)
  order_sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  split = resolve_split(config.split_step, m)
  static = (3, 4)  # on_policy, widths
  fused = jax.jit(
    step,
    in_shardings=(state_shardings, batch_sh, order_sh),
    out_shardings=(state_shardings, None),
    donate_argnums=(0,),
    static_argnums=static,
  )
  if not split:
    return TrainStep(fused, buckets=config.length_buckets if m == 1 else 1)
  parts = SplitStep(
    jax.jit(prepare, in_shardings=(batch_sh,)),
    jax.jit(forward, static_argnums=(4, 5)),  # on_policy, width
    jax.jit(backward),
    jax.jit(apply, out_shardings=(state_shardings, None), donate_argnums=(0,)),
  )
  return TrainStep(fused, parts, buckets=config.length_buckets)


def batch_shardings(mesh, rules=None) -> Batch:
  """Every batch field sharded along its group axis N over the batch mesh axes."""
  return Batch(*(sharding.batch_sharding(mesh, rules, nd) for nd in Batch.NDIMS))


def make_logprob_fn(graphdef, params_shardings, mesh, rules=None):
  """Jitted `logprobs(params, tokens [N, G, T]) -> [N, G, T]` (old-policy / reference)."""
  tok_sh = sharding.batch_sharding(mesh, rules, 3)

  def fn(params, tokens):
    n, g, t = tokens.shape
    return token_logprobs(graphdef, params, tokens.reshape(n * g, t)).reshape(n, g, t)

  return jax.jit(fn, in_shardings=(params_shardings, tok_sh), out_shardings=tok_sh)


def check_batch(batch: Batch, mesh, micro_batches: int, rules=None) -> None:
  """Clear errors for shapes that cannot be split as configured."""
  n, g, t = np.shape(batch.tokens)
  for (name, x), nd in zip(batch.with_grade_defaults()._asdict().items(), Batch.NDIMS, strict=True):
    want = (n, g, t)[:nd]
    if tuple(np.shape(x)) != want:
      raise ValueError(f"batch.{name} has shape {np.shape(x)}, expected {want}")
  check_split(n, mesh, micro_batches, rules)


def check_split(n: int, mesh, micro_batches: int, rules=None) -> None:
  """`n` groups must split into `micro_batches` micro-batches over the mesh's batch axes;
  a `ConfigError` naming `learner.micro_batches` if not (checked before any compute)."""
  axes, shards = sharding.batch_axes(mesh, rules)
  if n % micro_batches:
    raise ConfigError(
      "learner.micro_batches", f"{micro_batches} does not divide the {n} groups of a batch"
    )
  if (n // micro_batches) % shards:
    raise ConfigError(
      "learner.micro_batches",
      f"each micro-batch holds {n // micro_batches} groups, not divisible over mesh axes "
      f"{axes} of size {shards}",
    )


class NonFiniteError(FloatingPointError):
  """A step's loss or gradient norm was not finite; `.state` is the last finite state."""

  def __init__(self, message: str, state=None):
    super().__init__(message)
    self.state = state


def check_finite(metrics: dict, step: int, state=None) -> None:
  """Fail fast: raise `NonFiniteError` if the step's loss or gradient norm was not finite."""
  if float(metrics["finite"]) < 1:
    raise NonFiniteError(
      f"step {step}: non-finite loss ({float(metrics['loss'])}) or gradient norm "
      f"({float(metrics['grad_norm'])}); the update was skipped and the state is the "
      "last finite one (NonFiniteError.state). Lower the learning rate or check the "
      "batch's log-probs.",
      state,
    )
