"""Train state (one pytree), the optimizer, and their shardings.

The state is built straight into its sharded layout: `eval_shape` of the init
gives the abstract state, parameter shardings come from the logical-axis rules,
optimizer-state shardings mirror them (`optax.tree_map_params`), and a jitted
init with those `out_shardings` materialises every shard on its own device.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gagar_jax import sharding
from gagar_jax.learner.config import OptimConfig
from gagar_jax.models import transformer


class TrainState(NamedTuple):
  """Everything a step reads and writes; checkpoints save exactly this.

  Attributes:
    step: int32 scalar, optimizer steps taken.
    params: `nnx.State` of the policy's parameters.
    opt_state: the optax state.
    rng: uint32 key data (`jax.random.key_data`), split per step.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def make_schedule(cfg: OptimConfig) -> optax.Schedule:
  """Linear warmup, then cosine decay to `min_lr_ratio * lr` or a constant."""
  if cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(
      init_value=0.0 if cfg.warmup_steps else cfg.learning_rate,
      peak_value=cfg.learning_rate,
      warmup_steps=cfg.warmup_steps,
      decay_steps=cfg.total_steps,
      end_value=cfg.learning_rate * cfg.min_lr_ratio,
    )
  if not cfg.warmup_steps:
    return optax.constant_schedule(cfg.learning_rate)
  return optax.join_schedules(
    [
      optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps),
      optax.constant_schedule(cfg.learning_rate),
    ],
    [cfg.warmup_steps],
  )


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW; no weight decay on vectors (norms, biases)."""

  def decay_mask(params):
    return jax.tree.map(lambda x: x.ndim >= 2, params)

  return optax.chain(
    optax.clip_by_global_norm(cfg.max_grad_norm),
    optax.adamw(
      make_schedule(cfg),
      b1=cfg.b1,
      b2=cfg.b2,
      eps=cfg.eps,
      weight_decay=cfg.weight_decay,
      mask=decay_mask,
    ),
  )


def state_shardings(
  model_config: transformer.ModelConfig,
  optimizer: optax.GradientTransformation,
  mesh: jax.sharding.Mesh,
  rules=None,
):
  """(graphdef, abstract TrainState, TrainState of NamedShardings)."""
  graphdef, abstract_params = transformer.abstract(model_config)
  param_sh = sharding.param_shardings(abstract_params, mesh, rules)
  abstract_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract_params)
  abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
  replicated = NamedSharding(mesh, P())
  opt_sh = optax.tree_map_params(
    optimizer,
    lambda _, s: s,
    abstract_opt,
    param_sh,
    transform_non_params=lambda _: replicated,
  )
  abstract = TrainState(
    jax.ShapeDtypeStruct((), jnp.int32),
    abstract_params,
    abstract_opt,
    jax.ShapeDtypeStruct((2,), jnp.uint32),
  )
  return graphdef, abstract, TrainState(replicated, param_sh, opt_sh, replicated)


def init_train_state(
  model_config: transformer.ModelConfig,
  optimizer: optax.GradientTransformation,
  shardings: TrainState,
  seed: int,
  params=None,
) -> TrainState:
  """A fresh state in its sharded layout; `params` (e.g. an SFT policy) if given."""

  def init(params):
    if params is None:
      params = nnx.state(transformer.create(model_config, seed))
    rng = jax.random.key_data(jax.random.key(seed))
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params), rng)

  if params is None:
    return jax.jit(lambda: init(None), out_shardings=shardings)()
  params = jax.device_put(params, shardings.params)
  return jax.jit(init, in_shardings=(shardings.params,), out_shardings=shardings)(params)
