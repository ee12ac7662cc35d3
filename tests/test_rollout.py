"""Rollouts on real MiniRepo tasks: masks, log-probs vs the learner, dynamic sampling."""

import dataclasses

import jax
import numpy as np
import pytest

from gagar_jax import rollout, sharding
from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo, transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.learner.config import LearnerConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.models import tokenizers, transformer
from tests import helpers


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=66000)) as p:
    yield p


@pytest.fixture(scope="module")
def setup(pool):
  demos = [expert_lib.Expert(pool=pool).demonstrate(minirepo.generate_task(s)) for s in range(40)]
  texts = transcript.corpus(
    [d.prompt for d in demos], [[(t.action, t.observation) for t in d.turns] for d in demos]
  )
  tok = tokenizers.train_bpe(texts, 400, transcript.SPECIALS)
  config = transformer.ModelConfig.from_dict(
    {**dict(helpers.nano_config().__dict__), "vocab_size": tok.vocab_size}
  )
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  learner = Learner(LearnerConfig(), config, mesh)
  return tok, config, learner, learner.init(0)


def test_rollout_masks_and_logprobs_match_learner(setup, pool):
  tok, config, learner, state = setup
  cfg = rollout.RolloutConfig(
    group_size=3, max_turns=3, max_action_tokens=24, max_obs_tokens=32, max_episode_tokens=512
  )
  engine = rollout.RolloutEngine(cfg, config, learner.graphdef, tok, pool)
  tasks = [minirepo.generate_task(900 + i) for i in range(2)]
  groups = engine.run(state.params, tasks, jax.random.key(0))
  assert [len(g) for g in groups] == [3, 3]
  end = tok.token_id(transcript.END_ACTION)
  for group, task in zip(groups, tasks, strict=True):
    for t in group:
      assert t.task is task and t.finish in ("submit", "turns", "tokens") and t.status
      assert len(t.tokens) == len(t.mask) == len(t.logprobs) <= cfg.max_episode_tokens
      # The prompt is context; every turn adds sampled tokens (ending at the marker or
      # the action budget) followed by a context observation.
      # The project's tokenizer renders the agent format it was always trained on.
      prompt = tok.encode(
        f"<|im_start|>user\n{tools_prompt(task)}<|im_end|>\n<|im_start|>assistant\n"
      )
      assert t.tokens[: len(prompt)] == prompt and not any(t.mask[: len(prompt)])
      # Sampled runs: one per turn, each ending at the end-of-action marker (or EOS) or
      # at the action budget; log-probs are 0 exactly outside them.
      mask = np.asarray(t.mask, int)
      starts = np.flatnonzero(np.diff(np.r_[0, mask]) == 1)
      stops = np.flatnonzero(np.diff(np.r_[mask, 0]) == -1)
      assert len(starts) == len(t.turns)
      for a, b in zip(starts, stops, strict=True):
        assert t.tokens[b] in (end, tok.eos_id) or b - a + 1 == cfg.max_action_tokens
      assert all(x == 0 for x, m in zip(t.logprobs, t.mask, strict=True) if not m)
  batch = rollout.to_arrays(groups, 2, 3, cfg.max_episode_tokens)
  recomputed = np.asarray(learner.logprobs(state.params, batch.tokens))
  diff = np.abs(np.where(batch.mask, recomputed - batch.logprobs, 0.0)).max()
  assert diff < 1e-4, diff
  assert batch.mask.sum() == sum(sum(t.mask) for g in groups for t in g)


def test_concurrent_batches_run_the_same_episodes(setup, pool):
  # Groups split over two threads' batches sample exactly what one batch samples: each
  # episode draws from its own random stream.
  tok, config, learner, state = setup
  cfg = rollout.RolloutConfig(
    group_size=2, max_turns=2, max_action_tokens=16, max_obs_tokens=32, concurrent_batches=1
  )
  tasks = [minirepo.generate_task(700 + i) for i in range(3)]
  runs = []
  for batches in (1, 2):
    engine = rollout.RolloutEngine(
      dataclasses.replace(cfg, concurrent_batches=batches), config, learner.graphdef, tok, pool
    )
    assert engine.batches == batches
    runs.append(engine.run(state.params, tasks, jax.random.key(4)))
  one, two = ([t for g in groups for t in g] for groups in runs)
  assert [(t.group, t.index) for t in two] == [(i // 2, i % 2) for i in range(6)]
  assert len({tuple(t.tokens) for t in one}) > 3  # the episodes differ from one another
  for a, b in zip(one, two, strict=True):
    assert a.task is b.task and (a.tokens, a.mask, a.finish) == (b.tokens, b.mask, b.finish)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  # By default a CPU backend runs two batches.
  auto = rollout.RolloutEngine(rollout.RolloutConfig(), config, learner.graphdef, tok, pool)
  assert auto.batches == (2 if jax.default_backend() == "cpu" else 1)


def tools_prompt(task):
  from gagar_jax.envs import tools

  return tools.Episode(task).prompt()


def test_dynamic_sampling_keeps_informative_groups(setup, pool):
  tok, config, learner, state = setup
  engine = rollout.RolloutEngine(
    rollout.RolloutConfig(group_size=2, max_rounds=3), config, learner.graphdef, tok, pool
  )

  # Outcomes are scripted per task seed (the rollout machinery itself is tested above):
  # even seeds mixed, seeds % 3 == 0 all-pass, others all-fail.
  def fake_run(params, tasks, key):
    groups = []
    for task in tasks:
      s = task.seed
      outcome = [True, False] if s % 2 == 0 else [True, True] if s % 3 == 0 else [False, False]
      groups.append(
        [
          rollout.Trajectory(task, 0, i, [1], [True], [0.0], [], task.files, passed=p)
          for i, p in enumerate(outcome)
        ]
      )
    return groups

  engine.run = fake_run
  seeds = iter(range(1000))
  groups, stats = engine.collect(
    None, lambda: minirepo.generate_task(next(seeds)), 4, jax.random.key(0)
  )
  assert all(any(t.passed for t in g) and not all(t.passed for t in g) for g in groups)
  assert stats["groups_kept"] == 4 and stats["groups_informative"] == 4
  assert stats["rounds"] == 2 and stats["groups_drawn"] == 8 and stats["fill_ratio"] == 1.0
  # Switched off: every drawn group is kept, one round.
  engine.config = rollout.RolloutConfig(group_size=2, dynamic_sampling=False)
  groups, stats = engine.collect(
    None, lambda: minirepo.generate_task(next(seeds)), 4, jax.random.key(0)
  )
  assert stats["rounds"] == 1 and stats["groups_kept"] == 4 and stats["groups_informative"] < 4
  # Too few informative groups within max_rounds: the batch is padded with invalid groups.
  engine.config = rollout.RolloutConfig(group_size=2, max_rounds=1)
  odd = iter(range(1, 1000, 2))
  groups, stats = engine.collect(
    None, lambda: minirepo.generate_task(next(odd)), 4, jax.random.key(0)
  )
  assert stats["groups_kept"] == 0 and stats["fill_ratio"] == 0.0
  batch = rollout.to_arrays(groups, 4, 2, 16)
  assert not batch.valid.any()
