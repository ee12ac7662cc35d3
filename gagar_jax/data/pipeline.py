"""Reading the suites: build what is missing, `tfds.data_source`, grain pipelines.

suite = builders.minirepo_config(n_train=500)
tasks = pipeline.task_source(data_dir, suite, "train")   # random access, len()
ds = pipeline.tasks(data_dir, suite, "train", seed=0)    # grain: shuffled, repeated
task = ds[step]                                          # the data position is an int
"""

from __future__ import annotations

import json
import os

import grain
import tensorflow_datasets as tfds

from gagar_jax.data import builders
from gagar_jax.envs import humaneval, minirepo


def _prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Builds the dataset if its files are not there yet (array_record, no TensorFlow)."""
  if not os.path.exists(os.path.join(builder.data_dir, "dataset_info.json")):
    builder.download_and_prepare(file_format="array_record")
  return builder


def minirepo_builder(data_dir: str, suite: builders.MiniRepoConfig):
  return _prepare(builders.Minirepo(data_dir=data_dir, config=suite, file_format="array_record"))


def demos_builder(data_dir: str, config: builders.DemosConfig):
  return _prepare(
    builders.MinirepoDemos(data_dir=data_dir, config=config, file_format="array_record")
  )


def humaneval_builder(data_dir: str, config: builders.HumanevalConfig | None = None):
  return _prepare(
    builders.Humaneval(
      data_dir=data_dir, config=config or builders.humaneval_config(), file_format="array_record"
    )
  )


def humaneval_tasks(
  data_dir: str,
  config: builders.HumanevalConfig,
  split: str,
  *,
  seed: int,
  shuffle: bool = True,
  repeat: bool = True,
) -> grain.MapDataset:
  """A grain `MapDataset` of `HumanEvalTask`s of `split` (see `tasks`)."""

  def decode(example):
    text = example["task"]
    return humaneval.HumanEvalTask.from_json(text.decode() if isinstance(text, bytes) else text)

  builder = humaneval_builder(data_dir, config)
  if split not in builder.info.splits:  # no problem of the file falls in this split
    return grain.MapDataset.source([])
  return _dataset(builder.as_data_source(split=split), decode, seed, shuffle, repeat)


def task_source(data_dir: str, suite: builders.MiniRepoConfig, split: str):
  """Random-access `ArrayRecordDataSource` of raw MiniRepo examples."""
  return minirepo_builder(data_dir, suite).as_data_source(split=split)


def decode_task(example) -> minirepo.MiniRepoTask:
  text = example["task"]
  return minirepo.MiniRepoTask.from_json(text.decode() if isinstance(text, bytes) else text)


def tasks(
  data_dir: str,
  suite: builders.MiniRepoConfig,
  split: str,
  *,
  seed: int,
  shuffle: bool = True,
  repeat: bool = True,
) -> grain.MapDataset:
  """A grain `MapDataset` of `Task`s; `ds[i]` is deterministic in (seed, i)."""
  return _dataset(task_source(data_dir, suite, split), decode_task, seed, shuffle, repeat)


def _dataset(source, decode, seed: int, shuffle: bool, repeat: bool) -> grain.MapDataset:
  ds = grain.MapDataset.source(source).seed(seed)
  if shuffle:
    ds = ds.shuffle()
  if repeat:
    ds = ds.repeat()
  return ds.map(decode)


def decode_demo(example) -> dict:
  text = lambda k: example[k].decode() if isinstance(example[k], bytes) else example[k]
  return {
    "task": minirepo.MiniRepoTask.from_json(text("task")),
    "prompt": text("prompt"),
    "turns": json.loads(text("turns")),
    "habits": json.loads(text("habits")),
    "signals": json.loads(text("signals")),
    "passed": bool(example["passed"]),
  }


def demos(
  data_dir: str,
  config: builders.DemosConfig,
  split: str,
  *,
  seed: int,
  shuffle: bool = True,
  repeat: bool = True,
) -> grain.MapDataset:
  """A grain `MapDataset` of decoded demonstrations (see `decode_demo`)."""
  source = demos_builder(data_dir, config).as_data_source(split=split)
  return _dataset(source, decode_demo, seed, shuffle, repeat)


def grader_demos(data_dir: str, config: builders.GraderDemosConfig, split: str) -> list[dict]:
  """Every grader demonstration of `split` (built if missing; see grading/demos.py)."""
  builder = _prepare(
    builders.MinirepoGraderDemos(data_dir=data_dir, config=config, file_format="array_record")
  )
  source = builder.as_data_source(split=split)
  text = lambda v: v.decode() if isinstance(v, bytes) else v
  return [
    {k: (text(v) if isinstance(v, (bytes, str)) else int(v)) for k, v in source[i].items()}
    for i in range(len(source))
  ]
