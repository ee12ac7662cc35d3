"""Reading and writing the project's files, with errors that name the file.

Every reader raises `InputError(path, what is wrong)` for a missing, truncated or
malformed file (printed as one line by the entry points); writers go through a
temporary file renamed into place, so a kill never leaves half a file.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file

from gagar_jax.errors import ConfigError, InputError


def writable_folder(path: str, field: str) -> None:
  """Creates folder `path` if needed; a `ConfigError` naming `field` if it cannot be
  created or written (checked before any compute, not when the first file is written)."""

  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ConfigError(field, f"{path} cannot be created ({e.strerror or e})") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ConfigError(field, f"{path} is not writable")


def write_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file in the same folder."""
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def write_json_atomic(path: str, payload) -> None:
  write_atomic(path, json.dumps(payload, indent=2))


def _read_text(path: str) -> str:
  try:
    with open(path) as f:
      return f.read()
  except FileNotFoundError:
    raise InputError(path, "file not found") from None
  except IsADirectoryError:
    raise InputError(path, "is a folder, expected a file") from None
  except UnicodeDecodeError:
    raise InputError(path, "is not a text file") from None
  except OSError as e:
    raise InputError(path, f"cannot be read ({e.strerror or e})") from None


def read_json(path: str, *, kind: type | None = dict):
  """The JSON in `path` (of type `kind`, default an object)."""
  try:
    value = json.loads(_read_text(path))
  except json.JSONDecodeError as e:
    raise InputError(path, f"is not valid JSON ({e})") from None
  if kind is not None and not isinstance(value, kind):
    raise InputError(path, f"holds a JSON {type(value).__name__}, expected an object")
  return value


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file; a bad line is an error naming its number."""
  out = []
  for n, line in enumerate(_read_text(path).splitlines(), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise InputError(path, f"line {n} is not valid JSON ({e})") from None
    if not isinstance(record, dict):
      raise InputError(path, f"line {n} is not a JSON object")
    out.append(record)
  return out


def require(record: dict, keys, path: str) -> None:
  """Each of `keys` must be in `record` (read from `path`)."""
  missing = [k for k in keys if k not in record]
  if missing:
    raise InputError(path, f"lacks the field(s) {', '.join(missing)}")


def check_safetensors(path: str) -> list[str]:
  """The tensor names of a safetensors file, reading only its header (which must cover the
  whole file: a truncated file is caught here, before any compute)."""

  if not os.path.isfile(path):
    raise InputError(path, "file not found")
  try:
    with safe_open(path, "np") as f:
      return list(f.keys())
  except (SafetensorError, OSError) as e:
    raise InputError(path, f"is not a readable safetensors file ({e})") from None


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file as NumPy arrays."""

  try:
    return load_file(path)
  except FileNotFoundError:
    raise InputError(path, "file not found") from None
  except (SafetensorError, OSError) as e:
    raise InputError(path, f"is not a readable safetensors file ({e})") from None
