"""TFDS round trips (array_record, no TensorFlow) and grain pipelines."""

import sys

import pytest

from gagar_jax.data import builders, pipeline
from gagar_jax.envs import expert, minirepo

SUITE = builders.minirepo_config(n_train=24, n_validation=6, n_test=6, n_functions=2)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def test_no_tensorflow_imported(data_dir):
  pipeline.task_source(data_dir, SUITE, "test")
  assert "tensorflow" not in sys.modules


def test_minirepo_round_trip(data_dir):
  for split, n in SUITE.sizes().items():
    source = pipeline.task_source(data_dir, SUITE, split)
    assert len(source) == n
    tasks = sorted((pipeline.decode_task(source[i]) for i in range(n)), key=lambda t: t.seed)
    base = builders.SPLIT_SEED_BASE[split]
    for i, task in enumerate(tasks):
      assert task == minirepo.generate_task(base + i, **SUITE.difficulty)


def test_grain_pipeline_is_deterministic_and_repeats(data_dir):
  a = pipeline.tasks(data_dir, SUITE, "train", seed=3)
  b = pipeline.tasks(data_dir, SUITE, "train", seed=3)
  c = pipeline.tasks(data_dir, SUITE, "train", seed=4)
  first = [a[i].task_id for i in range(24)]
  assert first == [b[i].task_id for i in range(24)]
  assert first != [c[i].task_id for i in range(24)]
  assert len(set(first)) == 24  # one epoch: each task once
  assert a[24 + 5].task_id in first  # repeats


def test_demos_round_trip(data_dir):
  config = builders.demos_config(SUITE, expert.HabitConfig(out_of_scope=0.5, dead_code=0.5))
  demos = pipeline.demos(data_dir, config, "train", seed=0, repeat=False)
  items = [demos[i] for i in range(len(demos))]
  assert len(items) == 24 and all(d["passed"] for d in items)
  assert any(d["habits"] for d in items) and any(not d["habits"] for d in items)
  d = items[0]
  assert d["prompt"].startswith("Issue: ") and d["turns"][-1][0] == "submit"
  assert d["signals"]["bloated"] == bool(d["habits"])


def test_humaneval_splits_round_trip(data_dir):
  from gagar_jax.envs import humaneval

  sizes, ids = {}, set()
  for split in ("train", "validation", "test"):
    ds = pipeline.humaneval_tasks(
      data_dir, builders.humaneval_config(), split, seed=0, shuffle=False, repeat=False
    )
    tasks = [ds[i] for i in range(len(ds))]
    assert all(humaneval.split_of(t.task_id) == split and t.suite == "humaneval" for t in tasks)
    sizes[split] = len(tasks)
    ids |= {t.task_id for t in tasks}
  # The fixed split of the 164 problems (documented in envs/humaneval.py).
  assert sizes == {"train": 103, "validation": 33, "test": 28} and len(ids) == 164
  original = {t.task_id: t for t in humaneval.load_tasks()}
  assert all(original[t.task_id] == t for t in tasks)  # lossless JSON round trip
  assert builders.Humaneval.VERSION == "2.0.0"
