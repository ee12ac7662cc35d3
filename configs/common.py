"""Helpers shared by the config files."""

from __future__ import annotations

import ml_collections


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses `"key=value,key2=value2"` into a ConfigDict, typed like `defaults`.

  `--config=configs/x.py:size=tiny,seed=3` passes `"size=tiny,seed=3"` here.
  Unknown keys are an error naming the key.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    if "=" not in item:
      raise ValueError(f"config arg {item!r}: expected key=value (known keys: {sorted(defaults)})")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise ValueError(f"config arg {key!r}: unknown key (known keys: {sorted(defaults)})")
    kind = type(defaults[key])
    if kind is bool:
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = kind(value)
  return out


def mesh_config(data: int = -1, fsdp: int = 1, tensor: int = 1) -> ml_collections.ConfigDict:
  """Mesh axis sizes; -1 fills the remaining devices."""
  return ml_collections.ConfigDict({"data": data, "fsdp": fsdp, "tensor": tensor})


def sharding_rules() -> tuple:
  """Logical axis -> mesh axes (see gagar_jax/sharding.py)."""
  from gagar_jax import sharding

  return sharding.DEFAULT_RULES


def distributed_config() -> ml_collections.ConfigDict:
  """jax.distributed settings; disabled on a single host."""
  return ml_collections.ConfigDict(
    {"enabled": False, "coordinator_address": "", "num_processes": 1, "process_id": 0}
  )
