"""The RL loop: rollout -> grading (parallel with log-probs) -> advantages -> update.

    trainer = Trainer(config, workdir)   # validates the whole config before any compute
    summary = trainer.run()              # resumes from workdir/checkpoints if present

Per step (docs/design.md, "One RL step"): dynamic-sampled rollouts of `num_groups`
groups; every group with two or more passing trajectories (gagar_paper: every group
with a pass and a failure) goes to the grader loop (host threads) while the device
computes old-policy (and reference) log-probs where the update needs them (one update
per batch without KL takes them from its own forward pass); the grader's ranks feed
`advantages.redistribute` inside the jitted learner step (arms gagar /
gagar_no_rescale), its tiers and hacks the tiered kernel (gagar_paper: quality tiers,
confirmed hacks reset to reward 0, the rescale capped at lambda_max; its groups need only
one pass), or they become a shaped reward (reward_shaping); grpo does not grade.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from gagar_jax import arms as arms_lib
from gagar_jax import (
  evaluation,
  files,
  inspection,
  policy_io,
  progress,
  rollout,
  run_config,
  sharding,
  skeleton,
  suites,
)
from gagar_jax import metrics as metrics_lib
from gagar_jax.configlib import check
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.errors import ConfigError
from gagar_jax.grading import backends
from gagar_jax.grading import loop as loop_lib
from gagar_jax.hosts import Hosts
from gagar_jax.learner import step as step_lib
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch, Groups, NonFiniteError
from gagar_jax.models import chat_template


def parse_config(config) -> tuple[run_config.RLConfig, policy_io.Policy]:
  """Validates the whole config up front: (the typed config, the warm start's Policy)."""
  run = run_config.parse(config)
  backends.check_config(run.grader)  # the lm grader's folder, the endpoint's address
  graded_suites(run)  # checks the suite section and grader.suites
  files.writable_folder(run.data_dir, "data_dir")  # where the TFDS suites are built
  policy = policy_io.open_from_config(run)
  try:  # the episode format must render (system message, tool turns, stop tokens)
    rollout.agent_format(policy.tok, run.rollout)
  except chat_template.TemplateError as e:
    raise ConfigError("chat_template", str(e)) from None
  # The episode must fit the model's positions (the warm start's, which the run uses).
  max_seq_len = policy.model_config.max_seq_len
  check(
    run.rollout.max_episode_tokens <= max_seq_len,
    "rollout.max_episode_tokens",
    f"{run.rollout.max_episode_tokens} exceeds the model's max_seq_len={max_seq_len} "
    f"(of the warm start in {run.init_from})",
  )
  return run, policy


def batch_metrics(groups) -> dict[str, float]:
  """Per-step host metrics of the kept groups: lengths, passes, informative groups and the
  quality of passing solutions (absent, not 0, where nothing passed or the suite has no
  quality signals)."""
  flat = [tr for grp in groups for tr in grp]
  out = {
    "episode_tokens": float(np.mean([len(tr.tokens) for tr in flat])),
    "policy_tokens": float(np.mean([sum(tr.mask) for tr in flat])),
    "kept_pass_rate": float(np.mean([tr.passed for tr in flat])),
    "kept_informative": float(
      np.mean([0 < sum(t.passed for t in grp) < len(grp) for grp in groups])
    ),
  }
  q = evaluation.quality_metrics(flat)
  out.update(
    {
      k: q[k]
      for k in (
        "passing_bloated",
        "passing_out_of_scope",
        "passing_dead_code",
        "passing_redundant",
        "passing_hack",
        "passing_invalid",
      )
      if k in q
    }
  )
  return out


def graded_suites(config: run_config.RLConfig) -> frozenset[str]:
  """The suites of the mixture whose groups go to the grader (`grader.suites`, "" = those
  graded by default); the others get plain GRPO advantages in the same batch."""
  mixture = suites.check_config(config.suite)
  names = [n for n, _ in mixture]
  spec = config.grader.suites
  if not spec:
    return frozenset(n for n in names if suites.get(n).graded)
  chosen = [x.strip() for x in spec.split(",") if x.strip()]
  for name in chosen:
    suites.get(name, "grader.suites")
    check(name in names, "grader.suites", f"{name!r} is not in suite.name={config.suite['name']!r}")
  return frozenset(chosen)


def host_part(rows, host, rewards, ranks, grades) -> Groups:
  """The advantage inputs of the groups `rows` (an index array or slice) as host `Groups`,
  for advantage statistics and group records."""
  part = Groups(rewards[rows], host.passed[rows], ranks[rows], host.valid[rows])
  if grades is None:
    return part
  return part._replace(
    tiers=grades.tiers[rows],
    tier_ranks=grades.tier_ranks[rows],
    hacks=grades.hacks[rows],
    graded=grades.graded[rows],
  )


def shaped_rewards(passed: np.ndarray, ranks: np.ndarray, coef: float) -> np.ndarray:
  """passed + coef * (1 - rank / max rank in the group) on passing trajectories."""
  top = np.max(np.where(passed, ranks, 0), axis=-1, keepdims=True)
  score = np.where(top > 0, 1.0 - ranks / np.maximum(top, 1), 1.0)
  return (passed + coef * np.where(passed, score, 0.0)).astype(np.float32)


def parse_profile_steps(spec: str) -> tuple[int, int] | None:
  """`"a:b"` -> (a, b): trace RL steps a..b-1 (1-based, as printed); `""` -> None."""
  if not spec:
    return None
  try:
    a, b = (int(x) for x in spec.split(":"))
  except ValueError:
    raise ConfigError("profile_steps", f"must look like 'a:b' (e.g. '3:5'), got {spec!r}") from None
  if not 1 <= a < b:
    raise ConfigError("profile_steps", f"needs 1 <= a < b, got {spec!r}")
  return a, b


class Trainer:
  """The RL loop of one run (module docstring): `Trainer(config, workdir).run()`."""

  def __init__(self, config, workdir: str, profile_steps: tuple[int, int] | None = None):
    # RL steps [a, b) traced with jax.profiler into workdir/profile (TensorBoard/XProf).
    self.profile_steps = profile_steps
    self.workdir = workdir
    raw, (config, policy) = config, parse_config(config)  # before any compute
    self.config, self.learner_cfg, self.rollout_cfg = config, config.learner, config.rollout
    self.tok, self.model_config = policy.tok, policy.model_config

    def checks():  # those that need the process count; then the workdir becomes this run's
      self.hosts = Hosts(workdir)
      check(
        config.num_groups % self.hosts.count == 0,
        "num_groups",
        f"{config.num_groups} groups do not split over {self.hosts.count} processes",
      )
      self.mesh = sharding.make_mesh(config.mesh)
      step_lib.check_split(
        config.num_groups, self.mesh, self.learner_cfg.micro_batches, config.sharding_rules
      )

    skeleton.begin(raw, workdir, "rl", checks=checks, log=lambda line: self.hosts.log(line))
    self.local_groups = config.num_groups // self.hosts.count
    # Rollouts run on this process's devices only (one mesh per host), with a per-host
    # replica of the weights (`Hosts.replicate`); one process: the learner's mesh.
    self.sample_mesh = self.mesh
    if self.hosts.many:
      self.sample_mesh = sharding.make_mesh({"data": -1}, devices=jax.local_devices())
    # Read straight into the sharded layout (a checkpoint larger than one device).
    self.init_params = policy_io.load_weights(policy, mesh=self.mesh, rules=config.sharding_rules)
    self.learner = Learner(self.learner_cfg, self.model_config, self.mesh, config.sharding_rules)
    self.pool = SandboxPool(SandboxConfig.for_rollouts(config.sandbox_workers))
    self.engine = self._engine(self.rollout_cfg)
    self.eval_engine = self._engine(
      dataclasses.replace(self.rollout_cfg, group_size=config.eval.group_size)
    )
    self.arm = arms_lib.get(config.arm)
    self.grades = self.arm.grades
    self.grader = backends.from_config(config.grader) if self.grades else None
    self.grader_loop = loop_lib.GraderLoop(
      self.grader,
      workers=config.grader.workers,
      timeout_s=config.grader.timeout_s,
      root=os.path.join(
        workdir, "workspaces", *([f"process_{self.hosts.index}"] if self.hosts.many else [])
      ),
      seed=config.seed,
      # The paper grades every mixed-outcome group (a lone pass gets its tier and hack
      # check); the rank form needs two passes for a ranking to say anything.
      min_passing=1 if self.learner_cfg.advantage.mode == "tiered" else 2,
    )
    self._load_tasks()
    self.ckpt = Checkpointer(
      os.path.join(workdir, "checkpoints"),
      self.learner.abstract_state,
      self.learner.state_shardings,
      save_every=config.checkpoint_every,
      keep=2,
      reference=self.learner_cfg.loss.kl != "off",
    )
    self.writer = metrics_lib.MetricWriter(workdir)
    self.current_step = 0

  def _engine(self, cfg: rollout.RolloutConfig) -> rollout.RolloutEngine:
    return rollout.RolloutEngine(
      cfg,
      self.model_config,
      self.learner.graphdef,
      self.tok,
      self.pool,
      mesh=self.sample_mesh,
      rules=self.config.sharding_rules,
    )

  def _load_tasks(self) -> None:
    """Tasks of the suite mixture by data position; held-out sets per suite. On several
    processes sharing data_dir, process 0 builds the TFDS datasets, the others wait."""
    c = self.config
    if not self.hosts.primary:
      self.hosts.barrier("datasets built")
    self.train_tasks = suites.MixedTasks(c.data_dir, c.suite, "train", seed=c.seed)
    self.by_suite = len(self.train_tasks.names) > 1
    self.graded_suites = graded_suites(c)
    self.val_tasks = suites.held_out(c.data_dir, c.suite, "validation", c.eval.tasks)
    self.test_tasks = suites.held_out(c.data_dir, c.suite, "test", c.eval.final_tasks)
    if self.hosts.primary:
      self.hosts.barrier("datasets built")

  def log(self, text: str) -> None:
    self.hosts.log(text)

  def _shard(self, x):
    return self.hosts.shard(x, self.mesh, self.config.sharding_rules)

  def _sampling_params(self, params):
    return self.hosts.replicate(params, self.mesh, self.sample_mesh)

  # -- one step -------------------------------------------------------------------------
  def step(self, state, position: int, key):
    """One RL step from data position `position`: returns (state, next position, metrics)."""
    start = time.perf_counter()
    groups, ro, position, submitted, before = self._rollout(state, position, key)
    times = {"rollout_s": time.perf_counter() - start}
    kept = len(groups)
    if self.hosts.many:  # the update is collective: skip only if no process kept one
      every = self.hosts.gather([len(groups), ro["pass_rate"]])
      kept = int(np.sum(every[:, 0]))
      # The progress line's figures over all processes (the rest of `ro` is this one's).
      ro = {**ro, "groups_kept": kept, "pass_rate": float(np.mean(every[:, 1]))}
    if not kept:
      # Dynamic sampling kept no group: an update on an all-padding batch would still
      # move the parameters (AdamW momentum), so there is none; the data position moved.
      times["step_s"] = time.perf_counter() - start
      return state, position, {**ro, **times, "skipped": 1.0, "grader_groups": 0.0}
    state, host, parts, m = self._update(state, groups, before, times)
    if self.config.inspect.record:  # the group inspector's records (inspect_groups.py)
      self._record_groups(groups, host_part(slice(0, len(groups)), host, *parts), parts[2])
    times["step_s"] = time.perf_counter() - start
    quality = {"grader_groups": float(submitted), **batch_metrics(groups)}
    if self.by_suite:  # the same per suite of the mixture, advantage statistics included
      names = [evaluation.suite_of(grp) for grp in groups]
      for name in sorted(set(names)):
        sub = [grp for grp, n in zip(groups, names, strict=True) if n == name]
        quality.update({f"{name}/{k}": v for k, v in batch_metrics(sub).items()})
        rows = np.array([i for i, n in enumerate(names) if n == name])
        adv = step_lib.compute_advantages(host_part(rows, host, *parts), self.learner_cfg.advantage)
        quality.update({f"{name}/{k}": float(v) for k, v in adv.metrics.items()})
    return state, position, {**ro, **m, **times, **quality, "skipped": 0.0}

  def _rollout(self, state, position: int, key):
    """This process's kept groups, each sent to the grader as soon as its round ends (so
    grading overlaps with later rounds and the update's forward pass). Returns (groups,
    rollout metrics, next data position, groups submitted, grader counters before)."""
    counter, drawn = [position], []

    def next_task():  # process p of P draws tasks p, p + P, p + 2P, ... of the mixture
      task = self.train_tasks[counter[0] * self.hosts.count + self.hosts.index]
      counter[0] += 1
      drawn.append(task.task_id)
      return task

    # The model graders' counters are read before any of this step's grading starts.
    before = dict(getattr(self.grader, "stats", {})) if self.grades else {}
    submitted = [0]

    def grade(slot, group):
      if group[0].task.suite in self.graded_suites:  # else equal ranks: GRPO advantages
        submitted[0] += bool(self.grader_loop.submit(slot, group))

    groups, ro = self.engine.collect(
      self._sampling_params(state.params),
      next_task,
      self.local_groups,
      jax.random.fold_in(key, self.hosts.index),  # each process its own sampling stream
      on_group=grade if self.grades else None,
      by_suite=self.by_suite,
    )
    self.hosts.audit(
      {
        "step": self.current_step,
        "position": position,
        "next_position": counter[0],
        "kept": len(groups),
        "tasks": drawn,
      }
    )
    return groups, ro, counter[0], submitted[0], before

  def _update(self, state, groups, before, times):
    """The batch of the kept groups with its grades, and the update(s) on it. Returns
    (state, host arrays, (rewards, ranks, grades) as the advantages saw them, metrics)."""
    c, learner = self.config, self.learner
    n, g, t = self.local_groups, self.rollout_cfg.group_size, self.rollout_cfg.max_episode_tokens
    host = rollout.to_arrays(groups, n, g, t)
    batch = learner.shard_batch(Batch.from_rollout(host), process_local=self.hosts.many)
    t0 = time.perf_counter()
    # One update per batch without KL: the update's own forward pass gives the old
    # log-probs (`on_policy`), so there is no log-prob pass before it.
    on_policy = c.updates_per_batch == 1 and self.learner_cfg.loss.kl == "off"
    old = ref = batch.old_logprobs  # (the sampling log-probs; not read when on_policy)
    if not on_policy:
      old = ref = learner.logprobs(state.params, batch.tokens)  # async: grading overlaps
    if self.learner_cfg.loss.kl != "off":
      ref = learner.logprobs(self.ref_params, batch.tokens)
    ranks = np.zeros((n, g), np.int32)
    grades, grade_metrics = None, {}
    if self.grades:
      grades, grade_metrics = self.grader_loop.collect_grades(n, g)
      ranks = grades.ranks
      if before:  # the agentic LM / endpoint graders: model tokens and retries this step
        after = self.grader.stats
        for k in ("tokens", "turns", "retries"):
          grade_metrics[f"grader_{k}"] = float(after[k] - before[k])
    jax.block_until_ready((old, ref))
    times["logprob_and_grading_s"] = time.perf_counter() - t0
    rewards = host.rewards
    if self.arm.shapes_reward:
      rewards = shaped_rewards(host.passed, ranks, c.grader.shaping_coef)
      ranks = np.zeros_like(ranks)
    shard = self._shard
    batch = batch._replace(
      old_logprobs=old, ref_logprobs=ref, rewards=shard(rewards), ranks=shard(ranks)
    )
    if grades is not None:  # tiers, tied ranks within them, hacks, usable gradings
      batch = batch._replace(
        tiers=shard(grades.tiers),
        tier_ranks=shard(grades.tier_ranks),
        hacks=shard(grades.hacks),
        graded=shard(grades.graded),
      )
    t0 = time.perf_counter()
    lengths = host.lengths if not self.hosts.many else None  # (host holds local groups)
    for _ in range(c.updates_per_batch):
      state, m = learner.step(state, batch, on_policy, lengths)
    times["update_s"] = time.perf_counter() - t0
    return state, host, (rewards, ranks, grades), {**m, **grade_metrics}

  def _record_groups(self, groups, part: Groups, grades) -> None:
    """This step's group records (`inspection.py`): advantages before and after
    redistribution recomputed on the host exactly as the learner's step does."""
    inspection.record_step(
      os.path.join(self.workdir, "groups"),
      groups,
      step_lib.compute_advantages(part, self.learner_cfg.advantage),
      grades=grades,
      reports=self.grader_loop.reports if self.grades else {},
      step=self.current_step,
      process=self.hosts.index,
      processes=self.hosts.count,
      max_steps=self.config.inspect.max_steps,
    )

  # -- the loop -------------------------------------------------------------------------
  def run(self) -> dict:
    """Restores (or starts) the run, trains to `steps` with periodic evaluation and
    checkpoints, then evaluates on the test tasks and writes the run's outputs."""
    c = self.config
    state, step, meta = self._restore()
    # Each process's own data position (process p draws tasks p, p + P, ...).
    positions = meta.get("data_positions") or [int(meta["data_position"])] * self.hosts.count
    if len(positions) != self.hosts.count:
      raise ConfigError(
        "distributed.num_processes",
        f"the checkpoint was written by {len(positions)} process(es), this run has "
        f"{self.hosts.count}; resume with the same process count",
      )
    loop = _Loop(
      step=step,
      position=int(positions[self.hosts.index]),
      skipped=int(meta["skipped_steps"]),
      curve=list(meta.get("curve", [])),
      warm_start=meta["init_from_sha256"],
    )
    key = jax.random.key(c.seed)
    if step == 0 and not loop.curve:
      loop.curve.append(self._evaluate(state, 0, key))
    start = time.time()
    state = self._train(state, loop, key)
    return self._finish(state, loop, key, start)

  def _restore(self):
    """(state, RL steps done, checkpoint metadata): the newest checkpoint that restores,
    or a fresh state from the warm start; and the KL reference (`self.ref_params`)."""
    c = self.config
    warm_start = policy_io.fingerprint(c.init_from)
    meta = {"data_position": 0, "skipped_steps": 0, "init_from_sha256": warm_start}
    restored = self.ckpt.restore_newest(log=self.log)
    reference = None
    kl = self.learner_cfg.loss.kl != "off"
    if restored is not None:
      step, state, saved, reference = restored
      meta.update(saved)
      if kl and reference is None and meta["init_from_sha256"] != warm_start:
        raise ConfigError(
          "init_from",
          f"{c.init_from!r} is not the warm start this run began from (its parameters "
          "changed), so it cannot serve as the KL reference; point init_from at the "
          "original policy or start a new workdir",
        )
      self.writer.rewind(step)
      self.log(f"[train] resumed from step {step} ({self.workdir})")
    else:
      state, step = self.learner.init(c.seed, params=self.init_params), 0
      # Rows of an earlier attempt that died before its first checkpoint: this run logs
      # those steps again, so they go (a step is never logged twice).
      self.writer.rewind(-1)
    # The KL reference is the warm start (init_from) for the whole run, resumes included,
    # in buffers of its own: the update step donates the policy's.
    # It is saved in the checkpoints too (a resume does not depend on init_from's files).
    self.ref_params = reference
    if kl and reference is None:
      self.ref_params = jax.device_put(
        self.init_params, self.learner.state_shardings.params, may_alias=False
      )
    return state, step, meta

  def _save(self, state, loop: _Loop, force: bool = False) -> None:
    every = [int(x) for x in np.ravel(self.hosts.gather([loop.position]))]  # collective
    self.ckpt.save(
      loop.step,
      state,
      {
        "data_position": every[0],
        "data_positions": every,
        "curve": loop.curve,
        "skipped_steps": loop.skipped,
        "init_from_sha256": loop.warm_start,
      },
      force=force,
      reference=self.ref_params,
    )

  def _train(self, state, loop: _Loop, key):
    """The steps from `loop.step` to `steps` in `skeleton.run`'s skeleton: progress lines,
    metrics, evaluations, and a checkpoint after every step (saved when due)."""
    c = self.config
    start, first = time.time(), loop.step
    profile = _Profile(self.profile_steps, os.path.join(self.workdir, "profile"), self.log)
    held = {"state": state}

    def update(step):
      profile.before(step + 1)
      self.grader_loop.round = step
      self.current_step = step + 1  # the step being run, as printed and logged
      try:
        held["state"], loop.position, held["m"] = self.step(
          held["state"], loop.position, jax.random.fold_in(key, step + 1)
        )
      except NonFiniteError as e:  # the update was skipped: the last finite state stands
        held["state"] = e.state
        raise
      loop.step = step + 1
      profile.after(loop.step, c.steps)
      return loop.step

    def record(step):
      m = held["m"]
      loop.skipped += int(m["skipped"])
      m["skipped_steps"], m["data_position"] = float(loop.skipped), float(loop.position)
      self.writer.write(step, m, prefix="train")
      rate = (time.time() - start) / (step - first)
      eta = f"{m['step_s']:.1f}s/step, eta {rate * (c.steps - step) / 60:.1f}m"
      self.log(progress.step_line(step, c.steps, m, c.num_groups, loop.skipped, eta))
      if step % c.eval.every_steps == 0 or step == c.steps:
        loop.curve.append(self._evaluate(held["state"], step, key))

    def on_exit(finished):
      profile.stop()
      if not finished:
        try:
          self.close()
        except Exception:  # best effort on the way out of a failed run
          pass

    skeleton.steps(
      "[train]",
      first=loop.step,
      total=c.steps,
      update=update,
      record=record,
      save=lambda step, force: self._save(held["state"], loop, force=force),
      checkpoints=self.ckpt.directory,
      log=self.log,
      on_exit=on_exit,
    )
    return held["state"]

  def _finish(self, state, loop: _Loop, key, start: float) -> dict:
    """The final test (the same tasks and sampling key for every arm of a seed: paired
    comparisons), the exported policy, summary.json and the curves."""
    c = self.config
    sample_params = self._sampling_params(state.params)
    final_groups = self.eval_engine.run(
      sample_params, self.test_tasks, jax.random.fold_in(key, 10**7)
    )
    # Each final answer re-checked against its task's strong hidden tests (true resolution).
    evaluation.recheck_resolved(final_groups, self.pool)
    final = evaluation.policy_metrics(final_groups, by_suite=self.by_suite)
    self.hosts.audit_digest(sample_params)
    if not self.hosts.primary:
      self.close()
      return {}
    # The RL'd policy, loadable like init_from (process 0's replica of the weights).
    policy_io.export(
      os.path.join(self.workdir, "policy"), self.tok, self.model_config, sample_params
    )
    summary = {
      "arm": arms_lib.label(c.arm, c.grader.backend),  # as the sweeps name it (gagar_lm)
      "base_arm": c.arm,
      "grader": c.grader.backend if self.grades else None,
      "seed": c.seed,
      "steps": loop.step,
      "optimizer_steps": int(state.step),
      "skipped_steps": loop.skipped,
      "final_test": final,
      "final_test_tasks": [evaluation.task_record(g) for g in final_groups],
      "curve": loop.curve,
      "wall_minutes": (time.time() - start) / 60,
    }
    skeleton.write_summary(self.workdir, summary)
    progress.plot_run(
      metrics_lib.read(self.writer.path), loop.curve, os.path.join(self.workdir, "curves.png")
    )
    self.close()
    self.log(progress.done_line(final, c.eval.group_size, self.workdir))
    return summary

  def _evaluate(self, state, step, key) -> dict:
    # Every process evaluates the same held-out tasks with the same key (the same
    # numbers); process 0 writes and prints them.
    ev = evaluation.policy_metrics(
      self.eval_engine.run(
        self._sampling_params(state.params),
        self.val_tasks,
        jax.random.fold_in(jax.random.fold_in(key, 2**30), step),
      ),
      by_suite=self.by_suite,
    )
    self.writer.write(step, ev, prefix="eval")
    self.log(progress.eval_line(step, ev))
    return {"step": step, **ev}

  def close(self):
    self.writer.close()
    self.pool.close()
    self.ckpt.close()


@dataclasses.dataclass
class _Loop:
  """Where the loop stands: RL steps done (skipped ones included), this process's data
  position, skipped steps, the evaluation curve, and the warm start's fingerprint."""

  step: int
  position: int
  skipped: int
  curve: list
  warm_start: str


class _Profile:
  """Traces RL steps [a, b) (`profile_steps`) with jax.profiler into `path`."""

  def __init__(self, steps: tuple[int, int] | None, path: str, log):
    self.steps, self.path, self.log, self.tracing = steps, path, log, False

  def before(self, step: int) -> None:
    if self.steps and step == self.steps[0]:
      jax.profiler.start_trace(self.path)
      self.tracing = True

  def after(self, step: int, last: int) -> None:
    if self.tracing and (step + 1 == self.steps[1] or step == last):
      self.stop()
      self.log(f"[train] profile of steps {self.steps[0]}..{step} in {self.path}")

  def stop(self) -> None:
    if self.tracing:
      jax.profiler.stop_trace()
      self.tracing = False
