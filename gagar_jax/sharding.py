"""Device mesh, logical-axis rules and `NamedSharding`s: the one place that knows them.

The mesh has axes `('data', 'fsdp', 'tensor')`. Parameters carry logical axis
names (`LOGICAL_AXES`); rules from the config map each logical
name to a mesh axis, a tuple of mesh axes, or None (replicated). Batches are
sharded along the logical `batch` axis (by default over `data` and `fsdp`).

A model is initialised straight into its sharded layout
(`transformer.init_sharded`): `eval_shape` gives the abstract state, the rules
here give its shardings, and a jitted init with those `out_shardings`
materialises each shard only on its own device.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from gagar_jax import configlib
from gagar_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# The logical axis names parameters carry (`logical_axes` metadata, see
# models/transformer.py); `batch` is the batch axis of activations and rollouts.
# `layers` is the stacking axis of the blocks' parameters (and of the KV cache).
LOGICAL_AXES = ("vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm", "layers")

# Logical axis -> mesh axis (or axes, or None). FSDP shards the embedding dimension
# of every weight; tensor parallelism shards heads, MLP width and the vocabulary.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
  ("batch", ("data", "fsdp")),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  ("norm", None),
  ("layers", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes; exactly one may be -1, meaning "all remaining devices"."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  def __post_init__(self):
    for key in MESH_AXES:
      value = getattr(self, key)
      if not isinstance(value, int) or isinstance(value, bool) or not (value == -1 or value > 0):
        raise ConfigError(key, f"must be a positive int or -1, got {value!r}")

  @classmethod
  def from_dict(cls, d: Mapping[str, Any], prefix: str = "mesh") -> MeshConfig:
    return configlib.from_dict(cls, d, prefix)

  def shape(self, num_devices: int, prefix: str = "mesh") -> tuple[int, int, int]:
    """Resolves -1 and checks that the sizes multiply to `num_devices`."""
    sizes = {a: getattr(self, a) for a in MESH_AXES}
    free = [a for a, s in sizes.items() if s == -1]
    if len(free) > 1:
      raise ConfigError(f"{prefix}.{free[1]}", f"only one mesh axis may be -1, got {free}")
    fixed = math.prod(s for s in sizes.values() if s != -1)
    if free:
      if num_devices % fixed:
        raise ConfigError(
          f"{prefix}.{free[0]}",
          f"cannot fill: the other axes use {fixed} devices, which does not "
          f"divide the {num_devices} available",
        )
      sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
      bad = next(a for a in reversed(MESH_AXES) if sizes[a] != 1) if fixed > 1 else "data"
      raise ConfigError(
        f"{prefix}.{bad}",
        f"mesh {sizes} uses {fixed} devices but {num_devices} are available "
        "(set one axis to -1 to fill)",
      )
    return tuple(sizes[a] for a in MESH_AXES)


def make_mesh(
  config: MeshConfig | Mapping[str, Any], devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A `('data', 'fsdp', 'tensor')` mesh over `devices` (default: all, every host)."""
  if not isinstance(config, MeshConfig):
    config = MeshConfig.from_dict(config)
  devices = list(devices) if devices is not None else jax.devices()
  shape = config.shape(len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def validate_rules(rules, prefix: str = "sharding_rules") -> dict[str, Any]:
  """Checks rule names and targets; returns them as a dict."""
  out = {}
  known = set(LOGICAL_AXES) | {"batch"}
  for i, pair in enumerate(rules):
    if len(pair) != 2:
      raise ConfigError(f"{prefix}[{i}]", f"expected (logical_axis, mesh_axes), got {pair!r}")
    name, target = pair
    if name not in known:
      raise ConfigError(f"{prefix}[{i}]", f"unknown logical axis {name!r}; known: {sorted(known)}")
    targets = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    for t in targets:
      if t not in MESH_AXES:
        raise ConfigError(
          f"{prefix}[{i}]", f"{name!r} maps to unknown mesh axis {t!r}; axes are {MESH_AXES}"
        )
    out[name] = targets
  return out


def logical_to_spec(axes: Sequence[str | None], rules) -> P:
  """`PartitionSpec` for an array whose dimensions have logical names `axes`."""
  table = validate_rules(rules if rules is not None else DEFAULT_RULES)
  spec, used = [], set()
  for axis in axes:
    targets = tuple(t for t in table.get(axis, ()) if t not in used) if axis else ()
    used.update(targets)
    spec.append(None if not targets else targets[0] if len(targets) == 1 else targets)
  return P(*spec)


def _check_divisible(path: str, shape, spec: P, axes, mesh: Mesh):
  for dim, entry, name in zip(shape, spec, axes, strict=True):
    if entry is None:
      continue
    mesh_axes = (entry,) if isinstance(entry, str) else entry
    size = math.prod(mesh.shape[a] for a in mesh_axes)
    if dim % size:
      raise ConfigError(
        f"mesh.{mesh_axes[-1]}",
        f"parameter {path}: dimension {name!r} of size {dim} is not divisible by mesh "
        f"axes {mesh_axes} of total size {size}; change the mesh, or map {name!r} to None "
        "in sharding_rules",
      )


def param_shardings(state: nnx.State, mesh: Mesh, rules=None) -> nnx.State:
  """Same tree as `state`, each variable holding its `NamedSharding`."""
  rules = rules if rules is not None else DEFAULT_RULES
  flat = []
  for key, var in nnx.to_flat_state(state):
    axes = var.get_metadata().get("logical_axes") or (None,) * len(var.get_value().shape)
    spec = logical_to_spec(axes, rules)
    _check_divisible("/".join(map(str, key)), var.get_value().shape, spec, axes, mesh)
    flat.append((key, var.replace(NamedSharding(mesh, spec))))
  return nnx.from_flat_state(flat)


def batch_sharding(mesh: Mesh, rules=None, ndim: int = 2) -> NamedSharding:
  """Sharding of a batch array `[B, ...]`: B over the `batch` rule's axes."""
  spec = logical_to_spec(("batch",) + (None,) * (ndim - 1), rules)
  return NamedSharding(mesh, spec)


def batch_axes(mesh: Mesh, rules=None) -> tuple[tuple[str, ...], int]:
  """The mesh axes a batch dimension is split over, and their total size."""
  entry = logical_to_spec(("batch",), rules)[0]
  axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
  return axes, math.prod(mesh.shape[a] for a in axes)


def shard_batch(tree, mesh: Mesh, rules=None, field: str = "batch_size"):
  """Places global host arrays `[B, ...]` on the mesh, B split over the batch axes."""

  def put(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, rules, x.ndim)
    mesh_axes, size = batch_axes(mesh, rules)
    if x.shape[0] % size:
      raise ConfigError(
        field,
        f"batch of {x.shape[0]} does not divide over mesh axes {mesh_axes} of total size {size}",
      )
    # Every process holds the same global batch and contributes its own shards
    # (works on one host and across `jax.distributed` processes alike).
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(put, tree)


def shard_local_batch(tree, mesh: Mesh, rules=None):
  """Builds global arrays from each process's own rows (multi-host data loading).

  Process p passes the rows `[B / P, ...]` that belong to its devices (in mesh
  order); the result is the global `[B, ...]` array, sharded like `shard_batch`.
  """

  def put(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, rules, x.ndim)
    global_shape = (x.shape[0] * jax.process_count(),) + x.shape[1:]
    return jax.make_array_from_process_local_data(sharding, x, global_shape)

  return jax.tree.map(put, tree)


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Multi-host settings; empty coordinator means single-process (or auto-detected)."""

  enabled: bool = False
  coordinator_address: str = ""
  num_processes: int = 1
  process_id: int = 0


def initialize_distributed(config: DistributedConfig | Mapping[str, Any]) -> None:
  """Calls `jax.distributed.initialize` when enabled (once, before any device use).

  With no coordinator address JAX detects the cluster (TPU pods, SLURM, ...).
  """
  if not isinstance(config, DistributedConfig):
    config = configlib.from_dict(DistributedConfig, config, "distributed")
  if not config.enabled:
    return
  if config.coordinator_address:
    if not 0 <= config.process_id < config.num_processes:
      raise ConfigError(
        "distributed.process_id",
        f"{config.process_id} is not in [0, num_processes={config.num_processes})",
      )
    jax.distributed.initialize(config.coordinator_address, config.num_processes, config.process_id)
  else:
    jax.distributed.initialize()
