"""`bench.py --sections=rl_step`: the GAGAR step of `make run`, timed by phase.

Builds the trainer of `configs/gagar.py:demo=True` (warm start `assets/pre_rl`)
in a temporary workdir and runs N RL steps, with timers around the sampler's
decode loop and cache appends, the host tools, the sandbox, and the trainer's
own log-prob/grading and update phases; XLA compilation time comes from JAX's
monitoring events. Phases overlap (grading runs on threads during the rollout
and the log-prob pass; sandbox calls run on the pool's workers), so they do not
add up to the step.
"""

from __future__ import annotations

import collections
import functools
import statistics
import tempfile
import time

import jax

from configs import gagar
from gagar_jax import trainer as trainer_lib

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class Timers:
  def __init__(self):
    self.total = collections.defaultdict(float)
    self.compile_s = 0.0

  def wrap(self, name, fn, block=False):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
      start = time.perf_counter()
      out = fn(*args, **kwargs)
      if block:
        jax.block_until_ready(out)
      self.total[name] += time.perf_counter() - start
      return out

    return timed

  def on_event(self, event, duration, **kwargs):
    if event == COMPILE_EVENT:
      self.compile_s += duration

  def take(self):
    out = dict(self.total, compilation=self.compile_s)
    self.total.clear()
    self.compile_s = 0.0
    return out


def run(steps: int, arm: str = "gagar", grader: str = "rubric", log=print, overrides=None) -> dict:
  """Runs `steps` RL steps of the `make run` config; returns per-phase medians (s)."""
  timers = Timers()
  jax.monitoring.register_event_duration_secs_listener(timers.on_event)
  config = gagar.get_config(f"demo=True,arm={arm},grader={grader}")
  for name, value in (overrides or {}).items():  # dotted names, e.g. grader.workers
    section, _, leaf = name.rpartition(".")
    setattr(config[section] if section else config, leaf, value)
  with tempfile.TemporaryDirectory() as workdir:
    trainer = trainer_lib.Trainer(config, workdir)
    try:
      sampler = trainer.engine.sampler
      sampler.generate = timers.wrap("decode", sampler.generate, block=True)
      sampler.append = timers.wrap("prefill/append", sampler.append, block=True)
      pool = trainer.pool
      pool.map = timers.wrap("host tools (incl. sandbox)", pool.map)
      call = pool.call
      pool.call = timers.wrap("sandbox calls (summed over workers)", call)
      state = trainer.learner.init(config.seed, params=trainer.init_params)
      if trainer.learner_cfg.loss.kl != "off":
        trainer.ref_params = jax.device_put(
          trainer.init_params, trainer.learner.state_shardings.params, may_alias=False
        )
      key, position, rows = jax.random.key(config.seed), 0, []
      timers.take()
      for step in range(steps):
        trainer.grader_loop.round = step
        state, position, m = trainer.step(state, position, jax.random.fold_in(key, step + 1))
        row = {
          "step": m["step_s"],
          "rollout": m["rollout_s"],
          "log-probs + grading": m.get("logprob_and_grading_s", 0.0),
          "grading wait": m.get("grader_wait_s", 0.0),
          "update": m.get("update_s", 0.0),
          **timers.take(),
        }
        rows.append(row)
        if log:
          log(
            f"[rl_step] step {step + 1}/{steps}: "
            + ", ".join(f"{k} {v:.2f}s" for k, v in row.items())
          )
    finally:
      trainer.close()
  counted = rows[1:] if len(rows) > 1 else rows  # the first step compiles
  return {k: statistics.median(r.get(k, 0.0) for r in counted) for k in rows[0]}
