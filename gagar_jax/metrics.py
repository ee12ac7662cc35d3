"""Metrics: JSON lines + TensorBoard event files (tensorboardX, no TensorFlow), process 0 only.

writer = MetricWriter(workdir)
writer.write(step, {"loss": 0.3}, prefix="train")
writer.close()
"""

from __future__ import annotations

import json
import os
import time

import jax

from gagar_jax import files


class MetricWriter:
  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
        # (only when TensorBoard files are written)
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, metrics: dict, prefix: str = "") -> None:
    if not self.enabled:
      return
    record = {
      "step": int(step),
      "time": time.time(),
      **{
        (f"{prefix}/{k}" if prefix else k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float)
      },
    }
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k not in ("step", "time"):
          self._tb.add_scalar(k, v, int(step))

  def rewind(self, step: int) -> None:
    """Drops the JSONL records after `step`: on resume from a checkpoint at `step`, the
    steps a killed run logged past it are run again and must not appear twice."""
    if not self.enabled or not os.path.exists(self.path):
      return
    kept = []
    with open(self.path) as f:
      for line in f:
        try:
          record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by the kill
          continue
        if isinstance(record, dict) and record.get("step", step + 1) <= step:
          kept.append(record)
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(tmp, self.path)

  def close(self):
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def read(path: str) -> list[dict]:
  """All records of a metrics.jsonl file (an `InputError` naming it and the line if one
  is not a JSON object)."""
  return files.read_jsonl(path)


def row_kind(record: dict) -> tuple[str, ...]:
  """What a row logs: the prefixes of its metrics (("train",), ("eval",), ("sft",)...)."""
  return tuple(sorted({k.split("/", 1)[0] for k in record if "/" in k}))


def duplicate_steps(records: list[dict]) -> list[int]:
  """Steps logged more than once with the same kind of row (a resumed run that logged a
  step again); a train and an eval row of one step are not duplicates."""
  seen, dup = set(), set()
  for r in records:
    key = (r.get("step"), row_kind(r))
    (dup if key in seen else seen).add(key)
  return sorted({step for step, _ in dup})


def first_occurrences(records: list[dict]) -> list[dict]:
  """`records` without the rows that repeat an earlier (step, kind)."""
  seen, out = set(), []
  for r in records:
    key = (r.get("step"), row_kind(r))
    if key not in seen:
      seen.add(key)
      out.append(r)
  return out
