"""Batched multi-turn episodes (sampler <-> tools) and dynamic sampling.

B tasks x G episodes run as one sampling batch. Each turn, every live episode's
next action is sampled in one device call (KV cache extended, never re-run);
the host parses the actions and applies them, running `test` actions in the
sandbox pool in parallel; observations are appended to the cache; an episode
ends on `submit`, on its turn budget or when its token budget would overflow (an
episode whose prompt leaves no room for an action fails at once: finish "prompt").
A finished episode's hidden-test evaluation (and its quality signals) is submitted to
the sandbox pool at once, so it overlaps with the device decoding the episodes still
running.

Dynamic sampling (DAPO): keep groups with both passing and failing
trajectories; draw a fresh batch of tasks, up to `max_rounds`, until
`num_groups` informative groups are kept; report drawn / kept / rounds / fill.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import NamedTuple

import jax
import numpy as np

from gagar_jax import policy_io
from gagar_jax.configlib import check, check_positive_ints
from gagar_jax.envs import quality, tools, transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.models import sampler as sampler_lib
from gagar_jax.models import transformer


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Episode budgets, sampling and dynamic sampling (`config.rollout`)."""

  group_size: int = 8
  max_turns: int = 6
  max_action_tokens: int = 40
  max_obs_tokens: int = 64
  # KV-cache slots per episode: the whole episode must fit.
  max_episode_tokens: int = 512
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  dynamic_sampling: bool = True
  max_rounds: int = 4
  # Decode actions this many tokens at a time, moving the rows still generating into
  # a smaller batch between chunks (0: one decode loop over every row).
  decode_chunk: int = 8
  # Run prompts and observations into the cache this many tokens at a time, each piece
  # over only the rows that still have tokens (0: one piece as wide as the longest).
  # Observations vary from a few tokens to max_obs_tokens: one piece as wide as the
  # longest computes mostly padding (results/performance.md, section 13).
  append_chunk: int = 32
  # The system message: auto (the action grammar unless the tokenizer has the
  # end-of-action token, i.e. the project's policies), grammar, or none.
  system_prompt: str = "auto"
  # The groups of a round run as this many batches on concurrent threads: while one
  # batch's actions run in the tools, another decodes. Every row samples from its own
  # random stream, so the episodes are the same whatever the split. 0: 2 on a CPU
  # backend whose sampling mesh is one device (a small model's decode step leaves the
  # second core idle: results/performance.md, section 16), else 1.
  concurrent_batches: int = 0

  def __post_init__(self):
    check_positive_ints(
      self,
      (
        "group_size",
        "max_turns",
        "max_action_tokens",
        "max_obs_tokens",
        "max_episode_tokens",
        "max_rounds",
      ),
    )
    check(self.decode_chunk >= 0, "decode_chunk", f"must be >= 0, got {self.decode_chunk}")
    check(self.append_chunk >= 0, "append_chunk", f"must be >= 0, got {self.append_chunk}")
    check(
      self.concurrent_batches >= 0,
      "concurrent_batches",
      f"must be >= 0, got {self.concurrent_batches}",
    )
    check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
    check(
      self.system_prompt in transcript.SYSTEM_MODES,
      "system_prompt",
      f"must be one of {transcript.SYSTEM_MODES}, got {self.system_prompt!r}",
    )
    check(
      self.max_episode_tokens > self.max_action_tokens + self.max_obs_tokens + 64,
      "max_episode_tokens",
      "leaves no room for a prompt, an action and an observation",
    )


@dataclasses.dataclass
class Trajectory:
  """One episode: what the policy saw and did, and how it turned out."""

  task: object  # the task protocol (envs/task.py)
  group: int
  index: int
  tokens: list[int]
  mask: list[bool]  # True exactly at tokens the policy sampled
  logprobs: list[float]  # sampling log-probs at those tokens, 0 elsewhere
  turns: list[tools.Turn]
  files: dict[str, str]
  finish: str = ""  # submit | turns | tokens | prompt (no room left for an action)
  passed: bool = False
  status: str = ""
  signals: quality.QualitySignals | None = None
  # Final test only: whether the files pass the task's strong hidden tests
  # (`evaluation.recheck_resolved`); None where not re-checked.
  resolved: bool | None = None

  @property
  def reward(self) -> float:
    return float(self.passed)

  def add(self, ids: list[int], logprobs: list[float] | None = None) -> None:
    """Appends tokens: sampled by the policy (with their log-probs) or not (None)."""
    self.tokens += ids
    self.mask += [logprobs is not None] * len(ids)
    self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


class RolloutEngine:
  """Runs groups of episodes of one policy on tasks of any suite (envs/task.py)."""

  def __init__(
    self,
    config: RolloutConfig,
    model_config,
    graphdef,
    tokenizer,
    pool,
    *,
    mesh=None,
    rules=None,
  ):
    self.config = config
    self.tok = tokenizer
    self.pool = pool
    self.format = agent_format(tokenizer, config)
    single = mesh is None or mesh.size == 1
    self.batches = config.concurrent_batches or (
      2 if jax.default_backend() == "cpu" and single else 1
    )
    self.sampler = sampler_lib.Sampler(
      model_config,
      graphdef,
      cache_size=config.max_episode_tokens,
      pad_id=tokenizer.pad_id,
      mesh=mesh,
      rules=rules,
      decode_chunk=config.decode_chunk,
      append_chunk=config.append_chunk,
    )
    self.sampling = sampler_lib.SamplingParams(
      max_new_tokens=config.max_action_tokens,
      temperature=config.temperature,
      top_k=config.top_k,
      top_p=config.top_p,
      eos_id=tokenizer.eos_id,
      stop_sequences=tuple((i,) for i in self.format.stop_token_ids),
    )
    self.stop_strings = sampler_lib.StopStrings(self.format.stop_strings, tokenizer.decode)

  def run(self, params, tasks: Sequence, key: jax.Array) -> list[list[Trajectory]]:
    """G episodes for each task; returns groups in task order."""
    parts = min(self.batches, len(tasks))
    if parts <= 1:
      return self._run_batch(params, tasks, key, 0)
    bounds = np.linspace(0, len(tasks), parts + 1).round().astype(int)
    with futures.ThreadPoolExecutor(parts, thread_name_prefix="rollout") as threads:
      jobs = [
        threads.submit(self._run_batch, params, tasks[a:b], key, a)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
      ]
      return [group for job in jobs for group in job.result()]

  def _run_batch(self, params, tasks, key, first: int) -> list[list[Trajectory]]:
    """The episodes of `tasks` (groups `first`, `first + 1`, ...) as one sampling batch."""
    c, g = self.config, self.config.group_size
    episodes = [
      tools.Episode(t, max_turns=c.max_turns, pool=self.pool) for t in tasks for _ in range(g)
    ]
    trajs = [
      Trajectory(ep.task, first + i // g, i % g, [], [], [], ep.turns, ep.files)
      for i, ep in enumerate(episodes)
    ]
    row_ids = first * g + np.arange(len(episodes))  # each episode's random stream
    prompts = [self._start(traj, ep) for traj, ep in zip(trajs, episodes, strict=True)]
    state = self.sampler.prefill(params, prompts)
    lengths = np.array([len(p) for p in prompts])
    evaluations = {}

    def judge(ep):  # on the pool's threads, while the device decodes the others
      return ep.task.evaluate(ep.files, self.pool), ep.task.signals(ep.files, ep.turns)

    def finish(i, how):
      trajs[i].finish = how
      trajs[i].files = episodes[i].files
      evaluations[i] = self.pool.submit(judge, episodes[i])

    for turn in range(c.max_turns):
      active = np.array([not ep.done for ep in episodes])
      if not active.any():
        break
      state, out = self.sampler.generate(
        params,
        state,
        jax.random.fold_in(key, turn),
        self.sampling,
        active,
        self.stop_strings,
        row_ids=row_ids,
      )
      tokens, logps, counts = jax.device_get((out.tokens, out.logprobs, out.num_tokens))
      lengths += counts
      rows = np.flatnonzero(active)
      actions, ended_turn = {}, {}
      for i in rows:
        n = int(counts[i])
        ids = tokens[i, :n].tolist()
        trajs[i].add(ids, logps[i, :n].tolist())
        actions[i] = self.format.action_text(ids)
        ended_turn[i] = bool(ids) and ids[-1] == self.format.end_of_turn
      # Tools: views and edits are instant; `test` runs in the sandbox, in parallel.
      steps = [(episodes[i], actions[i]) for i in rows]
      observations = dict(zip(rows, self.pool.map(lambda s: s[0].step(s[1]), steps), strict=True))
      appended = [[] for _ in episodes]
      for i in rows:
        ep = episodes[i]
        if ep.done:
          finish(i, "submit" if ep.turns[-1].kind == "submit" else "turns")
          continue
        obs = self.format.observation_ids(
          observations[i], c.max_obs_tokens, after_end_of_turn=ended_turn[i]
        )
        if lengths[i] + len(obs) + c.max_action_tokens > c.max_episode_tokens:
          ep.done = True  # the token budget is spent: the files as they are count
          finish(i, "tokens")
          continue
        appended[i] = obs
        lengths[i] += len(obs)
        trajs[i].add(obs)
      if any(appended):
        state = self.sampler.append(params, state, appended)
    for i, ep in enumerate(episodes):
      if i not in evaluations and trajs[i].finish != "prompt":
        ep.done = True
        finish(i, "turns")
    for i, future in evaluations.items():
      result, signals = future.result()
      trajs[i].passed, trajs[i].status = result.passed, result.status
      trajs[i].signals = signals  # quality signals where the suite has them (else None)
    return [trajs[k * g : (k + 1) * g] for k in range(len(tasks))]

  def _start(self, traj: Trajectory, ep) -> list[int]:
    """The episode's prompt ids (what its row of the batch is prefilled with). An episode
    whose prompt leaves no room to act fails at once, without a token to train on."""
    c = self.config
    ids = self.format.prompt_ids(ep.prompt())
    if len(ids) + c.max_action_tokens > c.max_episode_tokens:
      ep.done, traj.finish, traj.status = True, "prompt", "prompt_too_long"
      return [self.tok.pad_id]
    traj.add(ids)
    return ids

  def collect(
    self,
    params,
    next_task: Callable[[], object],
    num_groups: int,
    key: jax.Array,
    on_group: Callable[[int, list[Trajectory]], object] | None = None,
    by_suite: bool = False,
  ):
    """Dynamic sampling: rounds of `num_groups` fresh tasks until as many informative
    groups are kept (or `max_rounds`). Returns (groups, stats); groups may be fewer
    than `num_groups` if the rounds ran out (`to_arrays` pads with invalid groups).

    `on_group(slot, group)` is called as soon as a group is kept (at the end of its
    round), e.g. to start grading it while later rounds are still rolling out.
    """
    c = self.config
    kept, drawn, rounds, passed, total = [], 0, 0, 0, 0
    per_suite: dict[str, list[int]] = {}  # suite -> [drawn groups, kept, passed, total]
    start = time.perf_counter()
    while len(kept) < num_groups and rounds < (c.max_rounds if c.dynamic_sampling else 1):
      tasks = [next_task() for _ in range(num_groups)]
      groups = self.run(params, tasks, jax.random.fold_in(key, rounds))
      drawn += len(tasks)
      rounds += 1
      for group in groups:
        flags = [t.passed for t in group]
        passed += sum(flags)
        total += len(flags)
        counts = per_suite.setdefault(group[0].task.suite, [0, 0, 0, 0])
        counts[0] += 1
        counts[2] += sum(flags)
        counts[3] += len(flags)
        if (not c.dynamic_sampling or (any(flags) and not all(flags))) and len(kept) < num_groups:
          counts[1] += 1
          kept.append(group)
          if on_group is not None:
            on_group(len(kept) - 1, group)
    kept = kept[:num_groups]
    informative = sum(1 for grp in kept if 0 < sum(t.passed for t in grp) < len(grp))
    stats = {
      "groups_drawn": drawn,
      "groups_kept": len(kept),
      "groups_informative": informative,
      "rounds": rounds,
      "fill_ratio": len(kept) / num_groups,
      "pass_rate": passed / max(total, 1),
      "rollout_s": time.perf_counter() - start,
    }
    if by_suite:
      for name, (n_drawn, n_kept, n_pass, n_total) in sorted(per_suite.items()):
        stats[f"{name}/groups_drawn"] = n_drawn
        stats[f"{name}/groups_kept"] = n_kept
        stats[f"{name}/pass_rate"] = n_pass / max(n_total, 1)
    return kept, stats


def agent_format(tok, config: RolloutConfig) -> transcript.AgentFormat:
  """The episode format of a policy with tokenizer `tok` (shared by rollouts and SFT)."""
  return transcript.AgentFormat(tok, transcript.resolve_system(tok, config.system_prompt))


class Arrays(NamedTuple):
  """Groups as plain host arrays, right-padded; what the learner packs into its batch.

  Attributes:
    tokens: int32 `[N, G, T]` whole transcripts (prompt, actions, observations).
    mask: bool `[N, G, T]`, True exactly at tokens the policy sampled.
    logprobs: float32 `[N, G, T]`, the sampling log-probs at those tokens, 0 elsewhere.
    rewards: float32 `[N, G]`; passed: bool `[N, G]`; valid: bool `[N, G]` (False at
      padding slots and at the groups dynamic sampling could not fill).
    lengths: int32 `[N, G]`, tokens held per transcript (0 at padding).
  """

  tokens: np.ndarray
  mask: np.ndarray
  logprobs: np.ndarray
  rewards: np.ndarray
  passed: np.ndarray
  valid: np.ndarray
  lengths: np.ndarray


def to_arrays(
  groups: Sequence[Sequence[Trajectory]], num_groups: int, group_size: int, seq_len: int
) -> Arrays:
  """Packs groups into `[num_groups, group_size, seq_len]` arrays (missing groups: padding)."""
  g = group_size
  tokens = np.zeros((num_groups, g, seq_len), np.int32)
  mask = np.zeros((num_groups, g, seq_len), bool)
  logps = np.zeros((num_groups, g, seq_len), np.float32)
  rewards = np.zeros((num_groups, g), np.float32)
  passed = np.zeros((num_groups, g), bool)
  valid = np.zeros((num_groups, g), bool)
  lengths = np.zeros((num_groups, g), np.int32)
  for n, group in enumerate(groups[:num_groups]):
    for i, t in enumerate(group):
      length = min(len(t.tokens), seq_len)
      tokens[n, i, :length] = t.tokens[:length]
      mask[n, i, :length] = t.mask[:length]
      logps[n, i, :length] = t.logprobs[:length]
      rewards[n, i], passed[n, i], valid[n, i] = t.reward, t.passed, True
      lengths[n, i] = length
  return Arrays(tokens, mask, logps, rewards, passed, valid, lengths)


def sample_groups(
  policy_dir: str, tasks, *, group_size: int, seed: int, rollout_overrides=None, edit=None
):
  """Groups an exported policy samples on `tasks` (temperature 1), keeping those with at
  least two passing samples (gradable): grader demonstrations and agreement sets.
  `edit(group, pool, index) -> group`, if given, rewrites each group before that filter
  (grader data: `grading.demos.inject_hacks`)."""

  tok, model_config, params = policy_io.load(policy_dir)
  graphdef, _ = transformer.abstract(model_config)
  cfg = RolloutConfig(group_size=group_size, **(rollout_overrides or {}))
  params = jax.device_put(params)
  kept, start = [], time.time()
  with SandboxPool(SandboxConfig.for_rollouts(2)) as pool:
    engine = RolloutEngine(cfg, model_config, graphdef, tok, pool)
    batch = 8
    for b in range(0, len(tasks), batch):
      groups = engine.run(params, tasks[b : b + batch], jax.random.key(seed * 100_003 + b))
      if edit is not None:
        groups = [edit(g, pool, b + i) for i, g in enumerate(groups)]
      kept += [g for g in groups if sum(t.passed for t in g) >= 2]
      print(
        f"[grader-data] sampled {min(b + batch, len(tasks))}/{len(tasks)} tasks, "
        f"{len(kept)} gradable groups, {time.time() - start:.0f}s",
        flush=True,
      )
  return kept
