"""A workdir belongs to one experiment: its kind, its config, and who may write into it.

    workdir.claim(path, "rl", config)   # after the whole config validated, before compute

`claim` makes `path` a workdir of `kind` (`rl`, `sft`, `grader_sft`) or checks that it
already is one: `workdir.json` names the kind, `config.json` the config it was started
with. Resuming compares the new config with the saved one field by field and refuses
any difference outside `SAFE_ON_RESUME` (how long to run, evaluation sizes, logging,
layout), naming every differing field; `--config.resume_override=True` lets it go on,
and the change is logged in `config_changes.jsonl` and printed. Files are written
atomically (a temporary file renamed into place), so a kill never leaves half a config.

`check_output_folder` guards the folders other tools write (`export_hf --out`,
`evaluate --out`, `sft --export`): never a run's workdir, never an existing file.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time

import jax

from gagar_jax import files
from gagar_jax.errors import ConfigError

MARKER = "workdir.json"
CONFIG = "config.json"
CHANGES = "config_changes.jsonl"
KINDS = ("rl", "sft", "grader_sft")

# Fields a resumed run may change: how long it runs, how often and how much it evaluates,
# what it logs, where data lives and how the computation is laid out on devices. The rest
# (arm, model, learner, rollout, suite, seeds...) define the experiment.
SAFE_ON_RESUME = (
  "steps",
  "sft.steps",
  "time_budget_minutes",
  "eval.*",
  "inspect.*",
  "checkpoint_every",
  "sandbox_workers",
  "grader.workers",
  "data_dir",
  "mesh.*",
  "distributed.*",
  "learner.micro_batches",
  "learner.split_step",
  "rollout.append_chunk",
  "learner.length_buckets",
  "resume_override",
)


def config_json(config) -> dict:
  """The config as the plain JSON dict `config.json` holds."""
  if hasattr(config, "to_json_best_effort"):
    return json.loads(config.to_json_best_effort())
  return json.loads(json.dumps(config, default=str))


def flatten(d, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1}; lists and scalars are leaves."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.update(flatten(v, key + "."))
    else:
      out[key] = v
  return out


def differences(saved: dict, new: dict) -> dict[str, tuple]:
  """{field: (saved value, new value)} over the flattened configs (`<absent>` if missing)."""
  a, b = flatten(saved), flatten(new)
  missing = "<absent>"
  return {
    k: (a.get(k, missing), b.get(k, missing))
    for k in sorted(set(a) | set(b))
    if a.get(k, missing) != b.get(k, missing)
  }


def is_safe(field: str) -> bool:
  return any(fnmatch.fnmatchcase(field, pattern) for pattern in SAFE_ON_RESUME)


def _launcher_file(name: str) -> bool:
  """What a launcher may put in a workdir before the run starts (the sweep's log and its
  inputs digest), or a write of ours cut short (`*.tmp<pid>`): the folder is still the
  run's to claim."""
  return name.endswith(".log") or name == "sweep_inputs.json" or ".tmp" in name


def _kind_of_legacy(saved: dict) -> str | None:
  """The kind of a workdir written before `workdir.json` existed, from its config."""
  if "arm" in saved:
    return "rl"
  if "sft" in saved:
    return "grader_sft" if saved.get("target") == "grader" else "sft"
  return None


def _fmt(value) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else text[:37] + "..."


def claim(path: str, kind: str, config, *, log=print) -> dict[str, tuple]:
  """Makes `path` this `kind` of run's workdir, or checks that it is (module docstring).

  Returns the differences that `resume_override` let through ({} normally). Raises
  `ConfigError` (field `workdir`, or the differing fields) before anything is written.
  Only process 0 writes; every process checks.
  """
  assert kind in KINDS, kind
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError("workdir", f"{path} is a file, not a folder")
  new = config_json(config)
  marker, saved_path = os.path.join(path, MARKER), os.path.join(path, CONFIG)
  saved = files.read_json(saved_path) if os.path.exists(saved_path) else None  # an object
  if jax.process_index() != 0:
    owner = kind  # process 0 judges (and may be writing the folder right now)
  elif os.path.exists(marker):
    owner = files.read_json(marker).get("kind")
  elif saved is not None:
    owner = _kind_of_legacy(saved)
  elif os.path.isdir(path) and [n for n in os.listdir(path) if not _launcher_file(n)]:
    owner = "unknown"
  else:
    owner = kind
  if owner != kind:
    what = f"the workdir of a {owner} run" if owner in KINDS else "not a run's workdir"
    raise ConfigError(
      "workdir",
      f"{path} is {what} (this is a {kind} run): it is left alone; use a new or empty --workdir",
    )
  changed = {}
  if saved is not None:
    changed = {k: v for k, v in differences(saved, new).items() if not is_safe(k)}
    if changed and not config.get("resume_override", False):
      listing = "; ".join(f"{k}: {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in changed.items())
      raise ConfigError(
        ", ".join(changed),
        f"differ from the config {path} was started with ({listing}). One workdir is one "
        "experiment: use a new --workdir, or --config.resume_override=True to go on anyway "
        f"(logged in {CHANGES}); safe to change: {', '.join(SAFE_ON_RESUME)}",
      )
    if changed:
      log(
        f"[workdir] resume_override: continuing {path} with changed "
        + ", ".join(f"{k} {_fmt(a)} -> {_fmt(b)}" for k, (a, b) in changed.items())
      )
  if jax.process_index() != 0:
    return changed
  files.writable_folder(path, "workdir")
  if not os.path.exists(marker):
    files.write_json_atomic(marker, {"kind": kind, "created": time.time()})
  if changed:
    with open(os.path.join(path, CHANGES), "a") as f:
      record = {"time": time.time(), "changed": {k: list(v) for k, v in changed.items()}}
      f.write(json.dumps(record) + "\n")
  if hasattr(config, "to_json_best_effort"):
    files.write_atomic(saved_path, config.to_json_best_effort(indent=2))
  else:
    files.write_json_atomic(saved_path, new)
  return changed


def is_run_workdir(path: str) -> bool:
  """Whether `path` is a training run's workdir (marked, or written before the marker)."""
  if not os.path.isdir(path):
    return False
  if os.path.exists(os.path.join(path, MARKER)):
    return True
  return any(os.path.exists(os.path.join(path, n)) for n in ("checkpoints", "metrics.jsonl"))


def check_output_folder(path: str, field: str, *, keeps: tuple[str, ...] = ()) -> None:
  """A folder another tool writes into (`--out`, `--export`): refused, before any compute,
  if it is a file, a run's workdir, or a non-empty folder holding none of `keeps` (the
  files of an earlier output of the same tool, which it may overwrite)."""
  if not path:
    return
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(field, f"{path} is an existing file; give a folder")
  if is_run_workdir(path):
    raise ConfigError(
      field, f"{path} is a training run's workdir; it is left alone: give another folder"
    )
  earlier = any(os.path.exists(os.path.join(path, k)) for k in keeps)
  if keeps and os.path.isdir(path) and os.listdir(path) and not earlier:
    raise ConfigError(
      field,
      f"{path} is a non-empty folder of something else (expected one of {', '.join(keeps)} "
      "from an earlier output, or an empty folder); give another folder",
    )
