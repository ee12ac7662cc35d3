"""Typed, validated views of ml_collections config sections.

Each section is a frozen dataclass whose `validate()` raises `ConfigError` naming
the offending field; `from_dict` rejects unknown and missing fields, so a typo on
the command line fails before any compute instead of silently doing nothing.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from gagar_jax.errors import ConfigError

T = TypeVar("T")


def from_dict(cls: type[T], d: Mapping[str, Any], prefix: str) -> T:
  """Builds dataclass `cls` from `d`; nested dataclass fields recurse."""
  d = dict(d)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  hints = typing.get_type_hints(cls)
  for key in d:
    if key not in fields:
      raise ConfigError(f"{prefix}.{key}", f"unknown field; known: {sorted(fields)}")
  kwargs = {}
  for name, f in fields.items():
    if name not in d:
      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise ConfigError(f"{prefix}.{name}", "required field is missing")
      continue
    value, hint = d[name], hints[name]
    if dataclasses.is_dataclass(hint):
      value = from_dict(hint, value, f"{prefix}.{name}")
    else:
      value = _coerce(value, hint, f"{prefix}.{name}")
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except ConfigError as e:
    raise ConfigError(f"{prefix}.{e.field}", str(e).split(": ", 1)[1]) from None


def _coerce(value, hint, field):
  if hint is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
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
