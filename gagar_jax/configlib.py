"""Typed, validated views of ml_collections config sections.

Each section is a frozen dataclass whose `__post_init__` raises `ConfigError`
naming the offending field; `from_dict` is the one way a config section becomes
such a dataclass: it rejects unknown and missing fields, checks the types of plain
fields, recurses into nested sections and prefixes every error with the section's
path, so a typo on the command line fails before any compute, the same way in
every section (`rollout.top_kk: unknown field; known: [...]`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from gagar_jax.errors import ConfigError

T = TypeVar("T")


def from_dict(cls: type[T], d: Mapping[str, Any] | None, prefix: str) -> T:
  """Builds dataclass `cls` from the config section `d` mounted at `prefix`.

  Nested dataclass fields recurse; `int` values are accepted for `float` fields and
  lists for tuple fields. Raises `ConfigError` naming `prefix.field`.
  """
  if isinstance(d, cls):
    return d
  d = dict(d or {})
  fields = {f.name: f for f in dataclasses.fields(cls)}
  hints = typing.get_type_hints(cls)
  for key in d:
    if key not in fields:
      raise ConfigError(_join(prefix, key), f"unknown field; known: {sorted(fields)}")
  kwargs = {}
  for name, f in fields.items():
    if name not in d:
      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise ConfigError(_join(prefix, name), "required field is missing")
      continue
    value, hint = d[name], hints[name]
    if dataclasses.is_dataclass(hint):
      value = from_dict(hint, value, _join(prefix, name))
    else:
      value = _coerce(value, hint, _join(prefix, name))
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except ConfigError as e:
    raise e.within(prefix) from None


def _join(prefix: str, name: str) -> str:
  return f"{prefix}.{name}" if prefix else name


def _coerce(value, hint, field):
  if hint is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if typing.get_origin(hint) is tuple and isinstance(value, list | tuple):
    return tuple(value)
  if hint in (int, float, str, bool) and not (
    isinstance(value, hint) and not (hint is int and isinstance(value, bool))
  ):
    raise ConfigError(field, f"expected {hint.__name__}, got {value!r}")
  return value


def check(condition: bool, field: str, message: str) -> None:
  if not condition:
    raise ConfigError(field, message)


def check_positive_ints(obj, names, prefix: str = "") -> None:
  """Each `obj.<name>` (attribute, or key of a mapping / ConfigDict) must be a positive int."""
  for name in names:
    value = obj[name] if isinstance(obj, Mapping) or hasattr(obj, "keys") else getattr(obj, name)
    check(
      isinstance(value, int) and value > 0, prefix + name, f"must be a positive int, got {value!r}"
    )


def one_of(value, options, field: str) -> None:
  check(value in options, field, f"must be one of {tuple(options)}, got {value!r}")


def set_dotted(config, overrides: Mapping[str, Any]):
  """Sets `{"a.b.c": value}` overrides on a nested config (as `--config.a.b.c=value`
  does on the command line); returns the config."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = value
  return config
