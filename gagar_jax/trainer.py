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
import json
import os
import time

import jax
import numpy as np

from gagar_jax import arms as arms_lib
from gagar_jax import cli, evaluation, files, policy_io, rollout, sharding, suites
from gagar_jax import metrics as metrics_lib
from gagar_jax import workdir as workdir_lib
from gagar_jax.configlib import check, check_positive_ints, from_dict
from gagar_jax.errors import ConfigError, Interrupted
from gagar_jax.grading import backends
from gagar_jax.learner import step as step_lib
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch, Groups, NonFiniteError
from gagar_jax.models import chat_template


def parse_config(config):
  """Validates every section up front; returns (LearnerConfig, RolloutConfig, Policy)."""
  arms_lib.get(config.arm)
  backends.check_config(config.grader)
  check_positive_ints(config, ("steps", "num_groups", "updates_per_batch", "checkpoint_every"))
  check(config.eval.every_steps > 0, "eval.every_steps", "must be > 0")
  check(config.grader.timeout_s > 0, "grader.timeout_s", "must be > 0")
  check(config.grader.workers > 0, "grader.workers", "must be > 0")
  check(config.inspect.max_steps > 0, "inspect.max_steps", "must be > 0")
  learner_cfg = arms_lib.learner_config(config.arm, config.learner)
  rollout_cfg = from_dict(rollout.RolloutConfig, config.rollout, "rollout")
  check(
    rollout_cfg.group_size >= 2,
    "rollout.group_size",
    f"must be >= 2 for RL, got {rollout_cfg.group_size}: a group of one has no baseline, so "
    "every advantage would be 0 and no step would learn",
  )
  graded_suites(config)  # checks the suite section and grader.suites
  files.writable_folder(config.data_dir, "data_dir")  # where the TFDS suites are built
  policy = policy_io.open_from_config(config)
  try:  # the episode format must render (system message, tool turns, stop tokens)
    rollout.agent_format(policy.tok, rollout_cfg)
  except chat_template.TemplateError as e:
    raise ConfigError("chat_template", str(e)) from None
  # The episode must fit the model's positions (the warm start's, which the run uses).
  max_seq_len = policy.model_config.max_seq_len
  check(
    rollout_cfg.max_episode_tokens <= max_seq_len,
    "rollout.max_episode_tokens",
    f"{rollout_cfg.max_episode_tokens} exceeds the model's max_seq_len={max_seq_len} "
    f"(of the warm start in {config.init_from})",
  )
  return learner_cfg, rollout_cfg, policy


def tiered(m: dict) -> str:
  """The tiered protocol's part of a progress line: mean lambda, capped share, hacks."""
  if "lambda_mean" not in m:
    return ""
  return (
    f" lam {m['lambda_mean']:.2f} capped {m['lambda_capped_share']:.2f} hacks "
    f"{m.get('grader_hacks', 0):.0f}"
  )


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


def graded_suites(config) -> frozenset[str]:
  """The suites of the mixture whose groups go to the grader (`grader.suites`, "" = those
  graded by default); the others get plain GRPO advantages in the same batch."""
  mixture = suites.check_config(config.suite)
  names = [n for n, _ in mixture]
  spec = config.grader.get("suites", "")
  if not spec:
    return frozenset(n for n in names if suites.get(n).graded)
  chosen = [x.strip() for x in spec.split(",") if x.strip()]
  for name in chosen:
    suites.get(name, "grader.suites")
    check(name in names, "grader.suites", f"{name!r} is not in suite.name={config.suite.name!r}")
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
  def __init__(self, config, workdir: str, profile_steps: tuple[int, int] | None = None):
    # RL steps [a, b) traced with jax.profiler into workdir/profile (TensorBoard/XProf).
    self.profile_steps = profile_steps
    self.config, self.workdir = config, workdir
    self.learner_cfg, self.rollout_cfg, policy = parse_config(config)  # before any compute
    from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
    from gagar_jax.grading import loop as loop_lib

    sharding.initialize_distributed(config.distributed)
    # Multi-host: each process rolls out, sandboxes and grades its own num_groups / P
    # groups (its own tasks and seed stream) on its own devices; the learner assembles
    # the global batch from every process's rows. Only process 0 writes and prints.
    self.processes, self.process = jax.process_count(), jax.process_index()
    self.primary = self.process == 0
    check(
      config.num_groups % self.processes == 0,
      "num_groups",
      f"{config.num_groups} groups do not split over {self.processes} processes",
    )
    self.local_groups = config.num_groups // self.processes
    self.tok, model_config = policy.tok, policy.model_config
    self.model_config = model_config
    self.mesh = sharding.make_mesh(config.mesh)
    step_lib.check_split(
      config.num_groups, self.mesh, self.learner_cfg.micro_batches, config.sharding_rules
    )
    # The whole config is valid: the workdir becomes (or must already be) this run's.
    workdir_lib.claim(workdir, "rl", config, log=self.log)
    # Rollouts run on this process's devices only (one mesh per host), with a per-host
    # replica of the weights (`_sampling_params`); one process: the learner's mesh.
    self.sample_mesh = self.mesh
    if self.processes > 1:
      self.sample_mesh = sharding.make_mesh({"data": -1}, devices=jax.local_devices())
    # Read straight into the sharded layout (a checkpoint larger than one device).
    params = policy_io.load_weights(policy, mesh=self.mesh, rules=config.sharding_rules)
    self.learner = Learner(self.learner_cfg, model_config, self.mesh, config.sharding_rules)
    self.init_params = params
    self.pool = SandboxPool(SandboxConfig.for_rollouts(config.sandbox_workers))
    self.engine = rollout.RolloutEngine(
      self.rollout_cfg,
      model_config,
      self.learner.graphdef,
      self.tok,
      self.pool,
      mesh=self.sample_mesh,
      rules=config.sharding_rules,
    )
    eval_cfg = dataclasses.replace(self.rollout_cfg, group_size=config.eval.group_size)
    self.eval_engine = rollout.RolloutEngine(
      eval_cfg,
      model_config,
      self.learner.graphdef,
      self.tok,
      self.pool,
      mesh=self.sample_mesh,
      rules=config.sharding_rules,
    )
    self.arm = arms_lib.get(config.arm)
    self.grades = self.arm.grades
    self.grader = backends.from_config(config.grader) if self.grades else None
    self.grader_loop = loop_lib.GraderLoop(
      self.grader,
      workers=config.grader.workers,
      timeout_s=config.grader.timeout_s,
      root=os.path.join(
        workdir, "workspaces", *([f"process_{self.process}"] if self.processes > 1 else [])
      ),
      seed=config.seed,
      # The paper grades every mixed-outcome group (a lone pass gets its tier and hack
      # check); the rank form needs two passes for a ranking to say anything.
      min_passing=1 if self.learner_cfg.advantage.mode == "tiered" else 2,
    )
    # Tasks of the suite mixture by data position; held-out sets per suite. On several
    # processes sharing data_dir, process 0 builds the TFDS datasets, the others wait.
    if self.processes > 1 and not self.primary:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("gagar_jax: datasets built")
    self.train_tasks = suites.MixedTasks(config.data_dir, config.suite, "train", seed=config.seed)
    self.by_suite = len(self.train_tasks.names) > 1
    self.graded_suites = graded_suites(config)
    self.val_tasks = suites.held_out(config.data_dir, config.suite, "validation", config.eval.tasks)
    self.test_tasks = suites.held_out(
      config.data_dir, config.suite, "test", config.eval.final_tasks
    )
    if self.processes > 1 and self.primary:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices("gagar_jax: datasets built")
    self.ckpt = Checkpointer(
      os.path.join(workdir, "checkpoints"),
      self.learner.abstract_state,
      self.learner.state_shardings,
      save_every=config.checkpoint_every,
      keep=2,
      reference=self.learner_cfg.loss.kl != "off",
    )
    self.writer = metrics_lib.MetricWriter(workdir)
    # Per process: the tasks it drew each step (hosts/process_<p>.jsonl), for audits.
    self.host_log = os.path.join(workdir, "hosts", f"process_{self.process}.jsonl")
    self.current_step = 0

  def log(self, text: str) -> None:
    """Progress lines: process 0 only."""
    if self.primary:
      print(text, flush=True)

  def _sampling_params(self, params):
    """The weights the rollouts use: the learner's (one process), else a replica on this
    process's devices (an all-gather over the mesh, then this host's copies, no host
    round trip)."""
    if self.processes == 1:
      return params
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    full = jax.jit(lambda x: x, out_shardings=NamedSharding(self.mesh, P()))(params)
    local = NamedSharding(self.sample_mesh, P())
    return jax.tree.map(
      lambda x: jax.make_array_from_single_device_arrays(
        x.shape, local, [s.data for s in x.addressable_shards]
      ),
      full,
    )

  def _shard(self, x):
    """Host rows of this process's groups (all groups when single-process) on the mesh."""
    if self.processes > 1:
      return sharding.shard_local_batch(x, self.mesh, self.config.sharding_rules)
    return sharding.shard_batch(x, self.mesh, self.config.sharding_rules)

  # -- one step -------------------------------------------------------------------------
  def step(self, state, position: int, key):
    c, learner = self.config, self.learner
    n, g, t = self.local_groups, self.rollout_cfg.group_size, self.rollout_cfg.max_episode_tokens
    times = {}
    start = time.perf_counter()
    counter = [position]
    drawn = []

    def next_task():  # process p of P draws tasks p, p + P, p + 2P, ... of the mixture
      task = self.train_tasks[counter[0] * self.processes + self.process]
      counter[0] += 1
      drawn.append(task.task_id)
      return task

    key = jax.random.fold_in(key, self.process)  # each process its own sampling stream
    sample_params = self._sampling_params(state.params)

    # Each kept group goes to the grader as soon as its round ends, so grading overlaps
    # with later rounds and with the device's log-prob pass below. The model graders'
    # counters are read before any of this step's grading starts.
    before = dict(getattr(self.grader, "stats", {})) if self.grades else {}
    submitted = [0]

    def grade(slot, group):
      if group[0].task.suite in self.graded_suites:  # else equal ranks: GRPO advantages
        submitted[0] += bool(self.grader_loop.submit(slot, group))

    groups, ro = self.engine.collect(
      sample_params,
      next_task,
      n,
      key,
      on_group=grade if self.grades else None,
      by_suite=self.by_suite,
    )
    times["rollout_s"] = time.perf_counter() - start
    submitted = submitted[0]
    self._log_host(position, counter[0], drawn, len(groups))
    kept = len(groups)
    if self.processes > 1:  # the update is collective: skip only if no process kept one
      from jax.experimental import multihost_utils

      every = multihost_utils.process_allgather(np.array([len(groups), ro["pass_rate"]]))
      every = np.reshape(every, (self.processes, 2))
      kept = int(np.sum(every[:, 0]))
      # The progress line's figures over all processes (the rest of `ro` is this one's).
      ro = {**ro, "groups_kept": kept, "pass_rate": float(np.mean(every[:, 1]))}
    if not kept:
      # Dynamic sampling kept no group: an update on an all-padding batch would still
      # move the parameters (AdamW momentum), so there is none; the data position moved.
      times["step_s"] = time.perf_counter() - start
      return state, counter[0], {**ro, **times, "skipped": 1.0, "grader_groups": 0.0}
    host = rollout.to_arrays(groups, n, g, t)
    batch = learner.shard_batch(Batch.from_rollout(host), process_local=self.processes > 1)
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
    lengths = host.lengths if self.processes == 1 else None  # (host holds local groups)
    for _ in range(c.updates_per_batch):
      state, m = learner.step(state, batch, on_policy, lengths)
    times["update_s"] = time.perf_counter() - t0
    if c.inspect.record:  # the group inspector's records (experiments/inspect_groups.py)
      self._record_groups(groups, host, rewards, ranks, grades)
    times["step_s"] = time.perf_counter() - start
    quality = {"grader_groups": float(submitted), **batch_metrics(groups)}
    if self.by_suite:  # the same per suite of the mixture, advantage statistics included
      names = [evaluation.suite_of(grp) for grp in groups]
      for name in sorted(set(names)):
        sub = [grp for grp, n in zip(groups, names, strict=True) if n == name]
        quality.update({f"{name}/{k}": v for k, v in batch_metrics(sub).items()})
        rows = np.array([i for i, n in enumerate(names) if n == name])
        part = host_part(rows, host, rewards, ranks, grades)
        adv = step_lib.compute_advantages(part, self.learner_cfg.advantage).metrics
        quality.update({f"{name}/{k}": float(v) for k, v in adv.items()})
    metrics = {**ro, **m, **grade_metrics, **times, **quality, "skipped": 0.0}
    return state, counter[0], metrics

  def _record_groups(self, groups, host, rewards, ranks, grades) -> None:
    """Writes this step's group records (`inspection.py`): advantages before and after
    redistribution recomputed on the host exactly as the learner's step does."""
    from gagar_jax import inspection

    part = host_part(slice(0, len(groups)), host, rewards, ranks, grades)
    adv = step_lib.compute_advantages(part, self.learner_cfg.advantage)
    records = inspection.group_records(
      groups,
      before=np.asarray(adv.base),
      after=np.asarray(adv.new),
      lam=np.asarray(adv.lam),
      grades=grades,
      reports=self.grader_loop.reports if self.grades else {},
      step=self.current_step,
    )
    root = os.path.join(self.workdir, "groups")
    inspection.write_step(
      root, records[0]["step"] if records else 0, records,
      process=self.process, processes=self.processes,
    )  # fmt: skip
    inspection.thin(root, self.config.inspect.max_steps * self.processes)

  def _log_host(self, start: int, end: int, tasks, kept: int) -> None:
    os.makedirs(os.path.dirname(self.host_log), exist_ok=True)
    with open(self.host_log, "a") as f:
      record = {
        "step": self.current_step,
        "position": start,
        "next_position": end,
        "kept": kept,
        "tasks": tasks,
      }
      f.write(json.dumps(record) + "\n")

  # -- the loop -------------------------------------------------------------------------
  def run(self) -> dict:
    c = self.config
    warm_start = policy_io.fingerprint(c.init_from)
    meta = {"data_position": 0, "skipped_steps": 0, "init_from_sha256": warm_start}
    # RL steps done (skipped ones included): the newest checkpoint that restores.
    restored = self.ckpt.restore_newest(log=self.log)
    reference = None
    if restored is not None:
      step, state, saved, reference = restored
      meta.update(saved)
      kl = self.learner_cfg.loss.kl != "off"
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
    if self.learner_cfg.loss.kl != "off" and reference is None:
      self.ref_params = jax.device_put(
        self.init_params, self.learner.state_shardings.params, may_alias=False
      )
    # Each process's own data position (process p draws tasks p, p + P, ...).
    positions = meta.get("data_positions") or [int(meta["data_position"])] * self.processes
    if len(positions) != self.processes:
      raise ConfigError(
        "distributed.num_processes",
        f"the checkpoint was written by {len(positions)} process(es), this run has "
        f"{self.processes}; resume with the same process count",
      )
    position, skipped = int(positions[self.process]), int(meta["skipped_steps"])
    curve = list(meta.get("curve", []))
    key = jax.random.key(c.seed)
    start, steps_done = time.time(), 0

    def save(force=False):
      every = [position]
      if self.processes > 1:  # collective: every process calls save() every step
        from jax.experimental import multihost_utils

        every = [int(x) for x in np.ravel(multihost_utils.process_allgather(np.array([position])))]
      self.ckpt.save(
        step,
        state,
        {
          "data_position": every[0],
          "data_positions": every,
          "curve": curve,
          "skipped_steps": skipped,
          "init_from_sha256": meta["init_from_sha256"],
        },
        force=force,
        reference=self.ref_params,
      )

    if step == 0 and not curve:
      curve.append(self._evaluate(state, 0, key))
    # The last step whose records (metrics rows, evaluation) are all written: only such a
    # step is checkpointed when the loop ends early, so a resume never misses a row.
    logged, finished, tracing = step, False, False
    stop = cli.GracefulStop("[train]").install()
    try:
      while step < c.steps:
        step_key = jax.random.fold_in(key, step + 1)
        if self.profile_steps and step + 1 == self.profile_steps[0]:
          jax.profiler.start_trace(os.path.join(self.workdir, "profile"))
          tracing = True
        self.grader_loop.round = step
        self.current_step = step + 1  # the step being run, as printed and logged
        try:
          state, position, m = self.step(state, position, step_key)
        except NonFiniteError as e:
          state = e.state
          raise
        step += 1
        steps_done += 1
        if tracing and (step + 1 == self.profile_steps[1] or step == c.steps):
          jax.profiler.stop_trace()
          tracing = False
          self.log(
            f"[train] profile of steps {self.profile_steps[0]}..{step} in "
            f"{os.path.join(self.workdir, 'profile')}"
          )
        skipped += int(m["skipped"])
        m["skipped_steps"], m["data_position"] = float(skipped), float(position)
        self.writer.write(step, m, prefix="train")
        rate = (time.time() - start) / steps_done
        eta = f"{m['step_s']:.1f}s/step, eta {rate * (c.steps - step) / 60:.1f}m"
        if m["skipped"]:
          self.log(
            f"[train] step {step}/{c.steps} | pass {m['pass_rate']:.2f} kept 0/{c.num_groups} "
            f"in {m['rounds']} round(s) | skipped: no informative group, no update "
            f"({skipped} skipped so far) | {eta}"
          )
        else:
          self.log(
            f"[train] step {step}/{c.steps} | pass {m['pass_rate']:.2f} kept "
            f"{m['groups_kept']}/{c.num_groups} in {m['rounds']} round(s) | loss "
            f"{m['loss']:+.4f} gn {m['grad_norm']:.3f} kl {m['kl']:.4f} | moved "
            f"{m['adv_abs_moved']:.3f} graded {m.get('grader_ok', 0):.0f}/"
            f"{m['grader_groups']:.0f}{tiered(m)} | tokens {m['episode_tokens']:.0f} | {eta}"
          )
        if step % c.eval.every_steps == 0 or step == c.steps:
          curve.append(self._evaluate(state, step, key))
        logged = step
        save()
        if stop.requested and step < c.steps:
          raise Interrupted(
            f"[train] stopped at step {step}/{c.steps} (Ctrl-C); checkpoint saved in "
            f"{self.ckpt.directory}: rerun the same command to resume"
          )
      finished = True
    finally:
      stop.restore()
      if tracing:
        jax.profiler.stop_trace()
      self._final_save(save, consistent=step == logged, finished=finished)
    sample_params = self._sampling_params(state.params)
    # The same test tasks and sampling key for every arm of a seed: paired comparisons.
    final_groups = self.eval_engine.run(
      sample_params, self.test_tasks, jax.random.fold_in(key, 10**7)
    )
    final = evaluation.policy_metrics(final_groups, by_suite=self.by_suite)
    self._log_digest(sample_params)
    if not self.primary:
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
      "steps": step,
      "optimizer_steps": int(state.step),
      "skipped_steps": skipped,
      "final_test": final,
      "final_test_tasks": [evaluation.task_record(g) for g in final_groups],
      "curve": curve,
      "wall_minutes": (time.time() - start) / 60,
    }
    with open(os.path.join(self.workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
    plot_run(metrics_lib.read(self.writer.path), curve, os.path.join(self.workdir, "curves.png"))
    self.close()
    self.log(
      f"[train] done: test pass@1 {final['pass@1']:.3f}, pass@{c.eval.group_size} "
      f"{final[f'pass@{c.eval.group_size}']:.3f}, bloated passing "
      f"{evaluation.fmt(final.get('passing_bloated'))}, tokens {final['episode_tokens']:.0f}; "
      "outputs in "
      f"{self.workdir}"
    )
    return summary

  def _final_save(self, save, *, consistent: bool, finished: bool) -> None:
    """The forced checkpoint when the loop ends. After an error or a Ctrl-C it is written
    only for a step whose records are complete, and a failure to write it (the state's
    buffers given to an update the error cut short) is reported, not raised over the
    error; the last periodic checkpoint then stands."""
    if finished:
      save(force=True)
      return
    try:
      if consistent:
        save(force=True)
    except Exception as e:  # the original error is what the user must see
      self.log(f"[train] no final checkpoint ({type(e).__name__}); the last saved one stands")
    finally:
      try:
        self.close()
      except Exception:  # best effort on the way out of a failed run
        pass

  def _log_digest(self, params) -> None:
    """The sha256 of this process's replica of the final weights, in its host log (the
    replicas of all processes must agree)."""
    import hashlib

    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.asarray(leaf.addressable_data(0)).tobytes())
    os.makedirs(os.path.dirname(self.host_log), exist_ok=True)
    with open(self.host_log, "a") as f:
      f.write(json.dumps({"final_params_sha256": digest.hexdigest()}) + "\n")

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
    self.log(
      f"[eval] step {step}: pass@1 {ev['pass@1']:.3f} informative "
      f"{ev['informative_groups']:.2f} bloated-passing {evaluation.fmt(ev.get('passing_bloated'))} "
      "tokens "
      f"{ev['episode_tokens']:.0f}"
    )
    return {"step": step, **ev}

  def close(self):
    self.writer.close()
    self.pool.close()
    self.ckpt.close()


def plot_run(records: list[dict], curve: list[dict], path: str) -> None:
  """Training curves: batch pass rate, eval pass@1, episode length, gradient norm."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train = [r for r in records if "train/pass_rate" in r]
  fig, ax = plt.subplots(1, 4, figsize=(16, 3.6))
  if train:
    steps = [r["step"] for r in train]
    ax[0].plot(steps, [r["train/pass_rate"] for r in train], label="rollout pass rate")
    # Skipped steps (no group kept) have no tokens or gradient: gaps in those curves.
    get = lambda k: [r.get(k, np.nan) for r in train]
    ax[2].plot(steps, get("train/episode_tokens"), label="train")
    ax[3].plot(steps, get("train/grad_norm"))
  if curve:
    ax[0].plot([p["step"] for p in curve], [p["pass@1"] for p in curve], "o-", label="eval pass@1")
    ax[1].plot([p["step"] for p in curve], [p.get("passing_bloated", np.nan) for p in curve], "o-")
    ax[2].plot([p["step"] for p in curve], [p["episode_tokens"] for p in curve], "o-", label="eval")
  ax[0].set(title="pass rate", xlabel="step", ylim=(0, 1))
  ax[0].legend()
  ax[1].set(title="bloated share of passing", xlabel="step", ylim=(0, 1))
  ax[2].set(title="episode tokens", xlabel="step")
  ax[2].legend()
  ax[3].set(title="gradient norm", xlabel="step")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
