"""Supervised training of the LM grader on rubric-graded workspaces (`experiments/sft.py`).

Beside `sft.py` (not in `grading/`): it composes the data, the SFT loop and the grader.

    python experiments/sft.py --config=configs/grader_sft.py --workdir=runs/grader \\
        --export=assets/lm_grader

Data: `minirepo_grader_demos` (TFDS; groups the pre-RL policy sampled on train
tasks, graded by the rubric; see `grading/demos.py`). Training: `sft.fit` (the
policy's loop, same model code). Periodic evaluation: the model runs as the
grading agent (`lm_grader.LMGrader`, greedy with one sampled retry) on held-out
groups sampled on validation tasks; agreement with the rubric (top-1, Kendall
tau-b), invalid-output rate, tokens and seconds per group. The export is a
grader folder: the policy_io layout plus grader.json (context, observation cut).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time

from gagar_jax import policy_io, rollout, run_config, sft, skeleton
from gagar_jax.configlib import check
from gagar_jax.grading import demos, lm_grader


def data_config(config):
  """The grader-demos dataset config of a grader SFT config (raw or typed); building it
  samples the policy (`sample_records`)."""
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import builders

  config = run_config.parse_sft(config)
  data = config.grader_data
  return builders.grader_demos_config(
    builders.suite_from_config(config.suite),
    data.policy_dir,
    policy_io.fingerprint(data.policy_dir),
    generate=sample_records,
    n_train_tasks=data.n_train_tasks,
    n_validation_tasks=data.n_validation_tasks,
    group_size=data.group_size,
    variants=data.variants,
    full_copies=data.full_copies,
    hack_every=data.hack_every,
    max_turns=data.max_turns,
    max_obs_chars=config.agent.max_observation_chars,
    seed=config.seed,
  )


def sample_records(cfg, split, tasks, seed):
  """Grader demonstrations of `split` for the builder config `cfg`: groups its policy
  samples on `tasks` (those with two or more passing samples), each materialized and
  graded by the rubric. Every `cfg.hack_every`-th task gets weak hidden tests and 1-2
  of its samples swapped for the expert's reward hack (`demos.inject_hacks`); with
  `hack_every=0` the groups are the policy's own."""

  tasks = hack_tasks(tasks, cfg.hack_every)
  groups = rollout.sample_groups(
    cfg.policy_dir,
    tasks,
    group_size=cfg.group_size,
    seed=seed,
    rollout_overrides={"max_turns": cfg.max_turns},
    edit=(lambda g, pool, k: demos.inject_hacks(g, pool, seed + k)) if cfg.hack_every else None,
  )
  variants = cfg.variants if split == "train" else 1
  with tempfile.TemporaryDirectory() as tmp:
    for k, group in enumerate(groups):
      records = demos.group_records(
        group, seed + k, variants, cfg.max_obs_chars, tmp, full_copies=cfg.full_copies
      )
      for record in records:
        yield {"group_index": k, **record}


def hack_tasks(tasks, every: int):
  """`tasks` with every `every`-th one (from the first; 0: none) turned weak-test."""
  return [demos.weak_variant(t) if every and k % every == 0 else t for k, t in enumerate(tasks)]


def _demonstrations(config):
  """The grader's training demonstrations, its held-out groups, and the (prompt, turns)
  pairs SFT trains on (built into `data_dir` by the policy named in `grader_data` first)."""
  # (tensorflow_datasets takes seconds to import: only where data is read or built)
  from gagar_jax.data import pipeline

  print(
    f"[grader] building/reading grader demonstrations in {config.data_dir} "
    f"(groups sampled by {config.grader_data.policy_dir})",
    flush=True,
  )
  data = data_config(config)
  train = pipeline.grader_demos(config.data_dir, data, "train")
  held_out = pipeline.grader_demos(config.data_dir, data, "validation")
  pairs = [(r["prompt"], [tuple(t) for t in json.loads(r["turns"])]) for r in train]
  print(
    f"[grader] {len(train)} demonstrations ({sum(r['variant'] == 0 for r in train)} full "
    f"groups), {len(held_out)} held-out groups",
    flush=True,
  )
  return train, held_out, pairs


def run(config, workdir: str, export: str = "") -> dict:
  """The LM grader's training: demonstrations, SFT with periodic agreement checks, the
  final agreement on every held-out group. Writes to `workdir` as `sft.run` does (and the
  grader folder to `export`). Returns the summary."""
  start = time.time()
  raw, config = config, sft.parse_config(config)  # before any compute
  check(
    isinstance(config, run_config.GraderSFTConfig),
    "target",
    "must be grader here (configs/grader_sft.py); the policy trains with sft.run",
  )
  skeleton.begin(raw, workdir, "grader_sft", export=export)  # the whole config is valid
  train, held_out, pairs = _demonstrations(config)
  acfg = config.agent
  eval_records = held_out[: config.eval.groups]

  def make_grader(model_config, tok, params):
    chat = lm_grader.LocalChatModel(
      tok, model_config, params, context=config.context, max_obs_tokens=config.max_obs_tokens
    )
    return lm_grader.LMGrader(chat, acfg)

  def evaluate(trainer, params, model_config, tok, step):
    del trainer
    ev = demos.agreement(make_grader(model_config, tok, params), eval_records)
    print(
      f"[eval] step {step}: top-1 {ev['top1']:.2f} tau {ev['kendall_tau']:.2f} invalid "
      f"{ev['invalid_rate']:.2f} | {ev['seconds_per_group']:.2f}s/group",
      flush=True,
    )
    return ev

  fitted = sft.fit(
    config,
    workdir,
    pairs,
    evaluate,
    tag="grader",
    max_obs_tokens=config.max_obs_tokens,
    start=start,
  )
  final = demos.agreement(
    make_grader(fitted.model_config, fitted.tok, fitted.state.params), held_out
  )
  summary = {
    "steps": fitted.step,
    "train_minutes": fitted.train_minutes,
    "wall_minutes": (time.time() - start) / 60,
    "demonstrations": len(train),
    "held_out": final,
    "curve": fitted.curve,
    "params": fitted.model_config.num_params(),
  }
  if export:
    export_grader(export, fitted, config)
  skeleton.write_summary(workdir, summary, export)
  sft.plot_curve(
    fitted.curve,
    os.path.join(workdir, "curve.png"),
    keys=("top1", "kendall_tau", "invalid_rate"),
    title="held-out agreement with the rubric",
    ylim=(-0.2, 1),
    loss_title="grader SFT loss",
  )
  print(
    f"[grader] done: held-out top-1 {final['top1']:.3f}, Kendall tau {final['kendall_tau']:.3f}, "
    f"invalid {final['invalid_rate']:.3f} over {final['groups']} groups; outputs in {workdir}",
    flush=True,
  )
  return summary


def export_grader(path: str, fitted, config) -> None:
  """The grader folder: the policy files and `grader.json` (its context and agent)."""
  policy_io.export(path, fitted.tok, fitted.model_config, fitted.state.params)
  with open(os.path.join(path, "grader.json"), "w") as f:
    json.dump(
      {
        "context": config.context,
        "max_obs_tokens": config.max_obs_tokens,
        "agent": dataclasses.asdict(config.agent),
      },
      f,
      indent=2,
    )
