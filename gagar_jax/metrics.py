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


class MetricWriter:
  def __init__(self, workdir: str, *, tensorboard: bool = True):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      if tensorboard:
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
        if record["step"] <= step:
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
  """All records of a metrics.jsonl file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
