"""Evaluates a policy on one suite's split: unbiased pass@k, episode tokens, quality.

    python experiments/evaluate.py --policy=assets/pre_rl --suite=minirepo --split=test --samples=8
    python experiments/evaluate.py --policy=assets/pre_rl --suite=humaneval --samples=8
    python experiments/evaluate.py --policy=/path/to/hf_folder --suite=humaneval \\
        --samples=4 --max_episode_tokens=4096 --max_action_tokens=512 --out=runs/eval_qwen
    # the pressure world, on MiniRepo tasks of a seed range no split uses (out of
    # distribution: train 0.., validation 1e6.., test 2e6..):
    python experiments/evaluate.py --policy=runs/x/policy --world=pressure \\
        --seeds=3000000:3000256 --samples=8

    # HumanEval by the published protocols (all 164 problems, greedy pass@1):
    python experiments/evaluate.py --policy=SmolLM2-135M-Instruct.Q4_1.gguf \
        --suite=humaneval --mode=instruct --split=all --samples=1 --temperature=0

`--policy` is a policy folder, a Hugging Face folder or a GGUF file. `--mode`: `agentic`
(the default) runs the suite's episodes; `completion` and `instruct` are HumanEval's
standard protocols (`gagar_jax/standard_eval.py`: the prompt continued as is, or a chat
request answered in a code block, 384 new tokens, each program run against the problem's
`check`); they also take `--split=all`, and write every answer to `samples.jsonl`.

In agentic mode every task of the split (or the
first `--tasks`) is attempted `--samples` times at `--temperature`; pass@k for every k in
1..samples is the unbiased estimator of Chen et al. (2021) averaged over tasks, with its
standard error across tasks. Quality signals of passing samples are reported where the
suite has them (MiniRepo), "n/a" where it has none (HumanEval). An episode whose prompt
does not fit `--max_episode_tokens` (default: the model's max_seq_len) fails and is
counted in `prompt_too_long`. Writes `eval.json` and `eval.md` to `--out`; `eval.json`'s
`per_task` holds each task's pass count and, among its passing samples, the habit counts
(for paired comparisons and bootstraps over tasks); `episodes.jsonl` each task's first
episode (its actions, observations and whole text).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import flags, logging

from configs import common
from gagar_jax import cli, evaluation, policy_io, rollout, standard_eval, suites
from gagar_jax import workdir as workdir_lib
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.errors import ConfigError

_POLICY = flags.DEFINE_string(
  "policy", None, "A policy folder, a Hugging Face folder or a .gguf file."
)
_SUITE = flags.DEFINE_string("suite", "minirepo", f"One of {tuple(suites.REGISTRY)}.")
_SPLIT = flags.DEFINE_string(
  "split", "test", f"One of {suites.SPLITS}; 'all' too with --mode=completion|instruct."
)
_MODE = flags.DEFINE_enum(
  "mode",
  "agentic",
  ("agentic", *standard_eval.MODES),
  "agentic: the suite's episodes; completion | instruct: HumanEval's standard protocols.",
)
_MAX_NEW = flags.DEFINE_integer(
  "max_new_tokens", standard_eval.MAX_NEW_TOKENS, "completion | instruct: new tokens per answer."
)
_SAMPLES = flags.DEFINE_integer("samples", 8, "Samples per task (pass@k for k <= samples).")
_TASKS = flags.DEFINE_integer("tasks", 0, "Evaluate the first N tasks of the split (0: all).")
_BATCH = flags.DEFINE_integer("batch_tasks", 8, "Tasks per rollout batch.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_MAX_TURNS = flags.DEFINE_integer(
  "max_turns", 0, "Actions per episode (0: the world's: 6, 8 or 10)."
)
_MAX_ACTION = flags.DEFINE_integer("max_action_tokens", 40, "Tokens per action.")
_MAX_OBS = flags.DEFINE_integer("max_obs_tokens", 64, "Observation tokens kept.")
_MAX_EPISODE = flags.DEFINE_integer(
  "max_episode_tokens", 0, "Tokens per episode (0: the model's max_seq_len)."
)
_SYSTEM = flags.DEFINE_string("system_prompt", "auto", "auto | grammar | none.")
_TEMPLATE = flags.DEFINE_string("chat_template", "", "A .jinja file replacing the policy's.")
_DATA_DIR = flags.DEFINE_string("data_dir", "data/tfds", "Where the TFDS suites live.")
_OUT = flags.DEFINE_string("out", "", "Output folder (default runs/eval/<policy>_<suite>_<split>).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_WORKERS = flags.DEFINE_integer("sandbox_workers", 2, "Sandbox processes.")
_WORLD = flags.DEFINE_enum("world", "default", common.WORLDS, "MiniRepo world (configs/common.py).")
_SEEDS = flags.DEFINE_string(
  "seeds", "", "MiniRepo: START:END, tasks generated from these seeds instead of --split."
)
flags.mark_flag_as_required("policy")


def progress(done: int, total: int, start: float, note: str = "") -> None:
  """One progress line: a bar, the count, elapsed time and the ETA."""
  width = 24
  filled = int(width * done / max(total, 1))
  elapsed = time.time() - start
  eta = elapsed / done * (total - done) if done else float("nan")
  print(
    f"[eval] |{'#' * filled}{'.' * (width - filled)}| {done}/{total} tasks {note} | "
    f"{elapsed:.0f}s elapsed, eta {eta:.0f}s",
    flush=True,
  )


def summarize(groups, samples: int) -> dict:
  """pass@k (unbiased, mean and standard error over tasks), tokens, quality."""
  n_pass = [sum(t.passed for t in g) for g in groups]
  out = {"tasks": len(groups), "samples": samples}
  out.update(evaluation.pass_at_k_summary(n_pass, samples))
  flat = [t for g in groups for t in g]
  out["episode_tokens"] = float(np.mean([len(t.tokens) for t in flat]))
  out["policy_tokens"] = float(np.mean([sum(t.mask) for t in flat]))
  out["turns"] = float(np.mean([len(t.turns) for t in flat]))
  out["prompt_too_long"] = float(np.mean([t.finish == "prompt" for t in flat]))
  out["quality"] = evaluation.quality_metrics(flat) or None  # None: not applicable
  out["per_task"] = [evaluation.task_record(g) for g in groups]
  return out


def markdown(result: dict) -> str:
  s = result["samples"]
  lines = [
    f"# {result['suite']} {result['split']}"
    + (f" ({result['mode']})" if result.get("mode", "agentic") != "agentic" else "")
    + f": {result['policy']}",
    "",
    f"{result['tasks']} tasks x {s} samples at temperature {result['temperature']}; "
    f"{result['seconds']:.0f} s. pass@k is the unbiased estimator (Chen et al. 2021), "
    "mean over tasks +- its standard error.",
    "",
    "| k | pass@k | s.e. |",
    "| --- | --- | --- |",
  ]
  lines += [
    f"| {k} | {result[f'pass@{k}']:.3f} | {result[f'pass@{k}_se']:.3f} |" for k in range(1, s + 1)
  ]
  if result.get("mode", "agentic") != "agentic":
    finish = ", ".join(f"{k} {v:.1%}" for k, v in result["finish"].items())
    lines += [
      "",
      f"The {result['mode']} protocol (gagar_jax/standard_eval.py), at most "
      f"{result['max_new_tokens']} new tokens: {result['episode_tokens']:.0f} on average; "
      f"answers ended by {finish}. Every answer is in samples.jsonl.",
    ]
    return "\n".join(lines) + "\n"
  lines += [
    "",
    f"Mean episode tokens {result['episode_tokens']:.0f} (policy tokens "
    f"{result['policy_tokens']:.0f}), turns {result['turns']:.2f}; prompts too long for the "
    f"episode budget: {result['prompt_too_long']:.1%}.",
    "",
  ]
  if result["quality"] is None:
    lines.append("Quality of passing samples: n/a (no passing sample, or no quality signals).")
  else:
    lines.append(
      "Quality of passing samples: "
      + ", ".join(f"{k} {v:.3f}" for k, v in result["quality"].items())
      + "."
    )
  return "\n".join(lines) + "\n"


def seed_range_tasks(section) -> list:
  """MiniRepo tasks of `--seeds=START:END` with the suite's knobs (no TFDS split)."""
  from gagar_jax.data import builders
  from gagar_jax.envs import minirepo

  if _SUITE.value != "minirepo":
    raise ConfigError("seeds", "only MiniRepo tasks are generated from seeds")
  try:
    start, end = (int(x) for x in _SEEDS.value.split(":"))
  except ValueError:
    raise ConfigError("seeds", f"expected START:END, got {_SEEDS.value!r}") from None
  if not 0 <= start < end:
    raise ConfigError("seeds", f"need 0 <= START < END, got {_SEEDS.value!r}")
  sizes = builders.suite_from_config(section.minirepo).sizes()
  for split, n in sizes.items():
    lo = builders.SPLIT_SEED_BASE[split]
    hi = lo + n
    if start < hi and lo < end:
      raise ConfigError("seeds", f"{_SEEDS.value} overlaps the {split} split's seeds {lo}:{hi}")
  difficulty = builders.suite_from_config(section.minirepo).difficulty
  return [minirepo.generate_task(s, **difficulty) for s in range(start, end)]


def output_folder() -> str:
  """`--out`, or runs/eval/<policy>_<suite>_<split or seeds>[_<mode>]."""
  name = os.path.basename(os.path.normpath(_POLICY.value))
  where = _SEEDS.value.replace(":", "-") if _SEEDS.value else _SPLIT.value
  mode = "" if _MODE.value == "agentic" else f"_{_MODE.value}"
  return _OUT.value or os.path.join("runs", "eval", f"{name}_{_SUITE.value}_{where}{mode}")


def write_outputs(out: str, result: dict) -> None:
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "eval.json"), "w") as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(out, "eval.md"), "w") as f:
    f.write(markdown(result))
  ks = [k for k in (1, 2, 4, 8, 10, 16) if k <= _SAMPLES.value]
  print(
    "[eval] done: "
    + ", ".join(f"pass@{k} {result[f'pass@{k}']:.3f}" for k in ks)
    + f"; tokens {result['episode_tokens']:.0f}; outputs in {out}",
    flush=True,
  )


def run_standard() -> dict:
  """HumanEval by `--mode=completion|instruct` (see `gagar_jax/standard_eval.py`)."""
  from gagar_jax.envs import humaneval

  if _SUITE.value != "humaneval":
    raise ConfigError("mode", f"{_MODE.value} is a HumanEval protocol; use --suite=humaneval")
  for name in ("seeds", "world", "max_turns", "max_episode_tokens", "system_prompt"):
    if flags.FLAGS[name].present:
      raise ConfigError(name, f"applies to --mode=agentic only, not {_MODE.value}")
  if _SPLIT.value != "all":
    suites.check_split(_SPLIT.value, "split")
  if _MAX_NEW.value < 1:
    raise ConfigError("max_new_tokens", f"must be >= 1, got {_MAX_NEW.value}")
  out = output_folder()
  workdir_lib.check_output_folder(out, "out", keeps=("eval.json",))
  policy = policy_io.open_policy(_POLICY.value, chat_template_spec=_TEMPLATE.value, field="policy")
  section = common.suite_config("humaneval")
  tasks = humaneval.load_tasks(
    section.humaneval.get("problems", ""), None if _SPLIT.value == "all" else _SPLIT.value
  )
  tasks = tasks[: _TASKS.value or len(tasks)]
  params = jax.device_put(policy_io.load_weights(policy))
  print(
    f"[eval] {policy.kind} {_POLICY.value} ({policy.model_config.num_params() / 1e6:.1f}M "
    f"params) on HumanEval/{_SPLIT.value} by the {_MODE.value} protocol: {len(tasks)} tasks x "
    f"{_SAMPLES.value} samples at temperature {_TEMPERATURE.value}",
    flush=True,
  )
  start = time.time()

  def report(done, total, results):
    rate = np.mean([s.passed for g in results for s in g])
    progress(done, total, start, f"(pass@1 so far {rate:.3f})")

  batch_rows = (
    _BATCH.value * _SAMPLES.value
    if flags.FLAGS["batch_tasks"].present
    else standard_eval.BATCH_ROWS
  )
  with SandboxPool(SandboxConfig.for_rollouts(_WORKERS.value)) as pool:
    groups = standard_eval.run(
      policy,
      params,
      tasks,
      _MODE.value,
      samples=_SAMPLES.value,
      temperature=_TEMPERATURE.value,
      pool=pool,
      seed=_SEED.value,
      max_new_tokens=_MAX_NEW.value,
      batch_rows=batch_rows,
      progress=report,
    )
  flat = [s for g in groups for s in g]
  finishes = [s.finish for s in flat]
  result = {
    "policy": _POLICY.value,
    "kind": policy.kind,
    "suite": "humaneval",
    "split": _SPLIT.value,
    "mode": _MODE.value,
    "temperature": _TEMPERATURE.value,
    "max_new_tokens": _MAX_NEW.value,
    "tasks": len(groups),
    "samples": _SAMPLES.value,
    **evaluation.pass_at_k_summary([sum(s.passed for s in g) for g in groups], _SAMPLES.value),
    "episode_tokens": float(np.mean([s.new_tokens for s in flat])),
    "finish": {f: finishes.count(f) / len(flat) for f in sorted(set(finishes))},
    "per_task": [
      {"task_id": g[0].task_id, "samples": len(g), "passed": int(sum(s.passed for s in g))}
      for g in groups
    ],
    "seconds": time.time() - start,
    "command": " ".join(sys.argv),
  }
  write_outputs(out, result)
  with open(os.path.join(out, "samples.jsonl"), "w") as f:
    for s in flat:
      f.write(json.dumps(dataclasses.asdict(s)) + "\n")
  return result


def run() -> dict:
  if _SAMPLES.value < 1:
    raise ConfigError("samples", f"must be >= 1, got {_SAMPLES.value}")
  if _TASKS.value < 0 or _BATCH.value < 1:
    raise ConfigError("tasks" if _TASKS.value < 0 else "batch_tasks", "must be positive")
  suites.get(_SUITE.value, "suite")
  if _MODE.value != "agentic":
    return run_standard()
  if _SPLIT.value == "all":
    raise ConfigError("split", "'all' is for --mode=completion|instruct; agentic runs one split")
  suites.check_split(_SPLIT.value, "split")
  if _SEEDS.value and flags.FLAGS["split"].present:
    raise ConfigError("split", "--seeds generates its own tasks; give --split or --seeds, not both")
  out = output_folder()  # checked now, written after the evaluation
  workdir_lib.check_output_folder(out, "out", keeps=("eval.json",))
  policy = policy_io.open_policy(_POLICY.value, chat_template_spec=_TEMPLATE.value, field="policy")
  max_episode = _MAX_EPISODE.value or policy.model_config.max_seq_len
  world = ml_collections.ConfigDict(
    {"suite": common.suite_config(_SUITE.value), "rollout": {"max_turns": 6}}
  )
  world.rollout.max_episode_tokens = max_episode
  common.apply_world(world, _WORLD.value)
  max_episode = _MAX_EPISODE.value or min(max_episode, world.rollout.max_episode_tokens)
  cfg = rollout.RolloutConfig(
    group_size=_SAMPLES.value,
    max_turns=_MAX_TURNS.value or world.rollout.max_turns,
    max_action_tokens=_MAX_ACTION.value,
    max_obs_tokens=_MAX_OBS.value,
    max_episode_tokens=max_episode,
    temperature=_TEMPERATURE.value,
    system_prompt=_SYSTEM.value,
  )
  if max_episode > policy.model_config.max_seq_len:
    raise ConfigError(
      "max_episode_tokens",
      f"{max_episode} exceeds the model's max_seq_len={policy.model_config.max_seq_len}",
    )
  section = world.suite
  if _SEEDS.value:
    tasks, split = seed_range_tasks(section), f"seeds {_SEEDS.value}"
  else:
    ds = suites.tasks(
      _DATA_DIR.value, section, _SUITE.value, _SPLIT.value, seed=0, shuffle=False, repeat=False
    )
    tasks, split = [ds[i] for i in range(len(ds))], _SPLIT.value
  n = len(tasks) if not _TASKS.value else min(_TASKS.value, len(tasks))
  tasks = tasks[:n]
  params = jax.device_put(policy_io.load_weights(policy))
  from gagar_jax.models import transformer

  graphdef, _ = transformer.abstract(policy.model_config)
  size = policy.model_config.num_params() / 1e6
  print(
    f"[eval] {policy_io.describe(policy)} {_POLICY.value} ({size:.2f}M "
    f"params) on {_SUITE.value}/{split} ({_WORLD.value} world): {n} tasks x {_SAMPLES.value} "
    "samples",
    flush=True,
  )
  groups, start = [], time.time()
  with SandboxPool(SandboxConfig.for_rollouts(_WORKERS.value)) as pool:
    engine = rollout.RolloutEngine(cfg, policy.model_config, graphdef, policy.tok, pool)
    key = jax.random.key(_SEED.value)
    for b in range(0, n, _BATCH.value):
      groups += engine.run(params, tasks[b : b + _BATCH.value], jax.random.fold_in(key, b))
      rate = np.mean([t.passed for g in groups for t in g])
      progress(len(groups), n, start, f"(pass@1 so far {rate:.3f})")
  result = {
    "policy": _POLICY.value,
    "kind": policy.kind,
    "suite": _SUITE.value,
    "split": split,
    "world": _WORLD.value,
    "temperature": _TEMPERATURE.value,
    "rollout": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
    **summarize(groups, _SAMPLES.value),
    "seconds": time.time() - start,
    "command": " ".join(sys.argv),
  }
  write_outputs(out, result)
  with open(os.path.join(out, "episodes.jsonl"), "w") as f:
    for g in groups:  # each task's first episode, as the policy saw and wrote it
      t = g[0]
      record = {
        "task_id": t.task.task_id,
        "passed": t.passed,
        "finish": t.finish,
        "turns": [{"action": x.action, "observation": x.observation} for x in t.turns],
        "text": policy.tok.decode(t.tokens),
      }
      f.write(json.dumps(record) + "\n")
  return result


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  run()


if __name__ == "__main__":
  cli.run(main)
