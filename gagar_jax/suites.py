"""Task suites by name: how each reads a split's tasks and its demonstrations, and whether
it is graded. The tasks themselves implement `envs/task.py`.

    mixture = suites.parse_mixture("minirepo:0.8+humaneval:0.2")
    ds = suites.tasks(config.data_dir, config.suite, "humaneval", "test", seed=0)
    draw = suites.MixedTasks(config.data_dir, config.suite, "train", seed=0)
    task = draw[position]             # deterministic in (seed, position): resumable

An experiment's `suite` section (configs/common.py `suite_config`) holds `name` (one
suite, or a weighted mixture `a:w+b:w`, a syntax the config-argument parser and the
command line both pass through) and one sub-section per suite. To add a suite: a module
in `envs/` whose task class implements the protocol, and an entry in `REGISTRY`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from gagar_jax.envs import humaneval
from gagar_jax.envs import task as task_lib
from gagar_jax.errors import ConfigError

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class SuiteEntry:
  """One suite.

  Attributes:
    name: the registry name (`task.suite`).
    tasks: (data_dir, section, split, seed, shuffle, repeat) -> a grain MapDataset of tasks.
    check: (section, prefix) -> None; validates the suite's config section (ConfigError).
    demos: (config, section, split) -> [(prompt, [(action, observation)])] expert
      demonstrations for SFT, or None.
    graded: whether GAGAR grades its groups by default (the rubric reads quality
      signals and a reference fix); ungraded groups get plain GRPO advantages.
  """

  name: str
  tasks: Callable
  check: Callable
  demos: Callable | None = None
  graded: bool = False


def _minirepo_tasks(data_dir, section, split, seed, shuffle, repeat):
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import builders, pipeline

  return pipeline.tasks(
    data_dir, builders.suite_from_config(section), split, seed=seed, shuffle=shuffle, repeat=repeat
  )


def _minirepo_check(section, prefix):
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import builders

  builders.minirepo_config(prefix, **dict(section))


def minirepo_demos(config, split: str, section=None):
  """(prompt, [(action, observation)]) pairs of the MiniRepo expert on `split` (built if
  missing), and the raw records. `config`: the policy's typed SFT config
  (`run_config.PolicySFTConfig`), whose `habits` the expert has; `section`: the MiniRepo
  suite (default `config.suite["minirepo"]`)."""
  from gagar_jax.data import builders, pipeline  # (TFDS: imported when data is read)

  section = config.suite["minirepo"] if section is None else section
  ds = pipeline.demos(
    config.data_dir,
    builders.demos_config(builders.suite_from_config(section), config.habits, config.seed),
    split,
    seed=config.seed,
    shuffle=False,
    repeat=False,
  )
  demos = [ds[i] for i in range(len(ds))]
  return [(d["prompt"], [(a, o) for a, o, _, _ in d["turns"]]) for d in demos], demos


def _minirepo_demos(config, section, split):
  return minirepo_demos(config, split, section)[0]


def _humaneval_config(section, prefix):
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import builders

  unknown = sorted(set(section) - {"problems"})
  if unknown:
    raise ConfigError(f"{prefix}.{unknown[0]}", "unknown field (humaneval has: problems)")
  problems = section.get("problems", "")
  try:
    humaneval.load_tasks(problems)
    return builders.humaneval_config(problems)
  except (ValueError, OSError) as e:
    raise ConfigError(f"{prefix}.problems", str(e)) from None


def _humaneval_tasks(data_dir, section, split, seed, shuffle, repeat):
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import pipeline

  cfg = _humaneval_config(section, "suite.humaneval")
  return pipeline.humaneval_tasks(data_dir, cfg, split, seed=seed, shuffle=shuffle, repeat=repeat)


def _humaneval_demos(config, section, split):

  tasks = humaneval.load_tasks(section.get("problems", ""), split)
  pool = task_lib.default_pool()
  return pool.map(lambda t: humaneval.demonstrate(t, pool), tasks)


REGISTRY = {
  "minirepo": SuiteEntry(
    "minirepo", _minirepo_tasks, _minirepo_check, demos=_minirepo_demos, graded=True
  ),
  "humaneval": SuiteEntry(
    "humaneval",
    _humaneval_tasks,
    lambda section, prefix: _humaneval_config(section, prefix) and None,
    demos=_humaneval_demos,
  ),
}


def get(name: str, field: str = "suite.name") -> SuiteEntry:
  if name not in REGISTRY:
    raise ConfigError(field, f"unknown suite {name!r} (suites: {', '.join(REGISTRY)})")
  return REGISTRY[name]


def parse_mixture(spec: str, field: str = "suite.name") -> tuple[tuple[str, float], ...]:
  """`"minirepo"` -> ((minirepo, 1.0),); `"minirepo:0.8+humaneval:0.2"` -> weights summing
  to 1. Unknown suites, repeated suites and weights that do not parse, are negative or sum
  to zero are ConfigErrors naming `field`."""
  if not isinstance(spec, str) or not spec.strip():
    raise ConfigError(
      field, f"must name a suite or a mixture like 'minirepo:0.8+humaneval:0.2', got {spec!r}"
    )
  parts = []
  for item in spec.split("+"):
    name, sep, weight = item.strip().partition(":")
    get(name.strip(), field)
    try:
      w = float(weight) if sep else 1.0
    except ValueError:
      raise ConfigError(field, f"weight {weight!r} of {name!r} is not a number") from None
    if not math.isfinite(w) or w < 0:
      raise ConfigError(field, f"weight {weight!r} of {name!r} must be a finite number >= 0")
    parts.append((name.strip(), w))
  names = [n for n, _ in parts]
  if len(set(names)) != len(names):
    raise ConfigError(field, f"a suite appears twice in {spec!r}")
  total = sum(w for _, w in parts)
  if total <= 0:
    raise ConfigError(field, f"the weights of {spec!r} sum to zero")
  return tuple((n, w / total) for n, w in parts)


def check_config(suite_section, prefix: str = "suite") -> tuple[tuple[str, float], ...]:
  """Validates a `suite` section (its mixture and each named suite's sub-section)."""
  if "name" not in suite_section:
    raise ConfigError(f"{prefix}.name", "missing (a suite name or a mixture)")
  mixture = parse_mixture(suite_section.name, f"{prefix}.name")
  for name, _ in mixture:
    if name not in suite_section:
      raise ConfigError(f"{prefix}.{name}", f"the {name} section is missing")
    REGISTRY[name].check(suite_section[name], f"{prefix}.{name}")
  return mixture


def check_split(split: str, field: str = "split") -> str:
  if split not in SPLITS:
    raise ConfigError(field, f"unknown split {split!r} (splits: {', '.join(SPLITS)})")
  return split


def tasks(data_dir, suite_section, name: str, split: str, *, seed: int, shuffle=True, repeat=True):
  """The tasks of suite `name`'s `split` (a grain MapDataset; built if missing)."""
  check_split(split)
  return get(name).tasks(data_dir, suite_section[name], split, seed, shuffle, repeat)


def draw_suite(mixture, seed: int, position: int) -> str:
  """The suite of data position `position` (a generator seeded by (seed, position))."""
  if len(mixture) == 1:
    return mixture[0][0]
  rng = np.random.default_rng([seed, position, 7919])
  return mixture[int(rng.choice(len(mixture), p=[w for _, w in mixture]))][0]


class MixedTasks:
  """Tasks of a mixture by position: position p draws its suite from the weights with a
  generator seeded by (seed, p), then that suite's shuffled, repeated task p. So a batch
  mixes task types and a data position (an int in the checkpoint) resumes exactly."""

  def __init__(self, data_dir, suite_section, split: str, *, seed: int):
    self.mixture = check_config(suite_section)
    self.names = [n for n, _ in self.mixture]
    self._seed = seed
    self._ds = {n: tasks(data_dir, suite_section, n, split, seed=seed) for n in self.names}
    for name in self.names:
      if len(tasks(data_dir, suite_section, name, split, seed=seed, repeat=False)) == 0:
        raise ConfigError(f"suite.{name}", f"has no {split} tasks")

  def suite_at(self, position: int) -> str:
    return draw_suite(self.mixture, self._seed, position)

  def __getitem__(self, position: int):
    return self._ds[self.suite_at(position)][position]


def held_out(data_dir, suite_section, split: str, per_suite: int) -> list:
  """The first `per_suite` tasks (unshuffled) of each suite of the mixture in `split`
  (fewer where the split is smaller): evaluation sets."""
  out = []
  for name, _ in check_config(suite_section):
    ds = tasks(data_dir, suite_section, name, split, seed=0, shuffle=False, repeat=False)
    out += [ds[i] for i in range(min(per_suite, len(ds)))]
  return out
