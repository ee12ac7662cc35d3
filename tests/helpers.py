"""Shared builders for tests and their subprocess workers: learners, sweep records."""

import json
import os

import numpy as np

from gagar_jax.learner.config import LearnerConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch
from gagar_jax.models import presets, transformer


def nano_config() -> transformer.ModelConfig:
  return transformer.ModelConfig.from_dict(presets.get("nano"))


def make_learner(mesh, **overrides) -> Learner:
  d = {"optim": {"learning_rate": 3e-3, "warmup_steps": 0, "schedule": "constant"}}
  for key, value in overrides.items():
    d[key] = {**d.get(key, {}), **value} if isinstance(value, dict) else value
  return Learner(LearnerConfig.from_dict(d), nano_config(), mesh)


def synthetic_batch(position: int, n: int = 8, g: int = 4, t: int = 24, vocab: int = 96) -> Batch:
  """A deterministic rollout batch for data position `position` (no log-probs yet)."""
  rng = np.random.default_rng(1000 + position)
  tokens = rng.integers(0, vocab, (n, g, t)).astype(np.int32)
  mask = np.zeros((n, g, t), bool)
  mask[..., 8:20] = True
  passed = rng.random((n, g)) < 0.5
  ranks = rng.integers(0, 3, (n, g)).astype(np.int32)
  valid = rng.random((n, g)) < 0.95
  zeros = np.zeros((n, g, t), np.float32)
  return Batch(tokens, mask, zeros, zeros, passed.astype(np.float32), passed, ranks, valid)


def with_logprobs(learner: Learner, state, batch: Batch) -> Batch:
  """On-policy: old (and reference) log-probs from the current parameters."""
  old = np.asarray(learner.logprobs(state.params, batch.tokens))
  return batch._replace(old_logprobs=old, ref_logprobs=old)


def assert_params_close(actual, desired) -> None:
  """Parameters after AdamW steps, computed with reductions summed in another order
  (sharded vs single device). AdamW's early updates are about lr * g / |g| (lr 3e-3 here),
  so an element whose gradient is near zero can move by a fraction of lr when the order
  changes (seen: 1.3e-5 on 1 of 2048 elements). A real sharding error moves many elements
  by O(lr): bound every element at 1e-4 (3% of one step) and all but 1% of them at 1e-5."""
  actual, desired = np.asarray(actual), np.asarray(desired)
  np.testing.assert_allclose(actual, desired, rtol=0, atol=1e-4)
  loose = np.mean(np.abs(actual - desired) > 1e-5 + 1e-7 * np.abs(desired))
  assert loose <= 0.01, f"{loose:.2%} of the elements differ by more than 1e-5"


def fake_sweep_record(
  record_dir, arm, seed, pass_p, growth, grad_norms, hack_p, rng, resolved_p=None, tasks_n=64
):
  """A finished run's record as the sweep runner writes it (what the reports read); with
  `resolved_p`, each task's samples that pass the strong re-check too."""
  os.makedirs(record_dir)
  tasks = []
  for i in range(tasks_n):  # the same task ids for every arm of a seed (paired)
    passed = int(rng.binomial(8, np.clip(pass_p + 0.3 * np.sin(i), 0, 1)))
    tasks.append(
      {
        "task_id": f"minirepo-{2000000 + i}",
        "samples": 8,
        "passed": passed,
        "tokens": 8 * 250,
        **({} if resolved_p is None else {"resolved": int(rng.binomial(passed, resolved_p))}),
        **(
          {
            "passing_bloated": int(rng.binomial(passed, 0.3)),
            "passing_out_of_scope": int(rng.binomial(passed, 0.1)),
            "passing_dead_code": 0,
            "passing_redundant": 0,
            "passing_hack": int(rng.binomial(passed, hack_p)),
          }
          if passed
          else {}
        ),
      }
    )
  curve = [
    {"step": s, "pass@1": pass_p, "episode_tokens": 200 + growth * s / 150} for s in (0, 75, 150)
  ]
  summary = {
    "steps": 150,
    "wall_minutes": 20.0,
    "curve": curve,
    "final_test": {"pass@1": pass_p, "episode_tokens_fail": 260.0},
    "final_test_tasks": tasks,
  }
  json.dump(summary, open(os.path.join(record_dir, "summary.json"), "w"))
  with open(os.path.join(record_dir, "metrics.jsonl"), "w") as f:
    for step in range(1, 151):  # every step logged once, as a finished run's log has it
      g = grad_norms[(step - 1) % len(grad_norms)]
      row = {"step": step, "train/grad_norm": g, "train/entropy": 0.3, "train/adv_abs_moved": 0.1}
      f.write(json.dumps(row) + "\n")
  json.dump({"per_task": tasks[:32]}, open(os.path.join(record_dir, "ood.json"), "w"))
  json.dump({}, open(os.path.join(record_dir, "config.json"), "w"))
  meta = {"name": f"{arm}_s{seed}", "arm": arm, "seed": seed, "config": "", "overrides": {}}
  json.dump(meta, open(os.path.join(record_dir, "record.json"), "w"))
