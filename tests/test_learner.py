"""The jitted GRPO/GAGAR learner: compilation, accumulation, learning, sharding, errors."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gagar_jax import sharding
from gagar_jax.errors import ConfigError
from gagar_jax.learner import step as step_lib
from gagar_jax.learner import train_state
from gagar_jax.learner.config import LearnerConfig, OptimConfig
from gagar_jax.models import presets, transformer
from tests import helpers


@pytest.fixture(scope="module")
def mesh1():
  return sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])


def _params(state):
  return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_step_compiles_once_and_logprobs_match_forward(mesh1, monkeypatch):
  # The step body runs once per trace: count its traces with chex.
  chex.clear_trace_counter()
  monkeypatch.setattr(
    step_lib, "compute_advantages", chex.assert_max_traces(step_lib.compute_advantages, n=1)
  )
  learner = helpers.make_learner(mesh1)
  state = learner.init(0)
  for position in range(3):
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
    state, metrics = learner.step(state, batch)
  assert learner.train_step._cache_size() == 1
  assert int(state.step) == 3
  # The counter does count: a batch of another shape traces the step again.
  longer = helpers.synthetic_batch(3, t=32)
  with pytest.raises(AssertionError, match="traced > 1 times"):
    learner.step(state, helpers.with_logprobs(learner, state, longer))
  chex.clear_trace_counter()
  assert metrics["finite"] == 1.0 and metrics["tokens"] > 0
  # On-policy first step: ratio 1 exactly, so nothing is clipped.
  fresh = learner.init(0)
  batch = helpers.with_logprobs(learner, fresh, helpers.synthetic_batch(0))
  _, m0 = learner.step(fresh, batch)
  assert m0["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
  assert m0["clip_frac_low"] == m0["clip_frac_high"] == 0.0


def test_micro_batches_equal_full_batch(mesh1):
  results = []
  for m in (1, 2, 4):
    learner = helpers.make_learner(mesh1, micro_batches=m)
    state = learner.init(0)
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(1))
    batch = batch._replace(old_logprobs=batch.old_logprobs - 0.05)  # off-policy: ratios != 1
    state, metrics = learner.step(state, batch)
    results.append((_params(state), metrics))
  for params, metrics in results[1:]:
    for a, b in zip(params, results[0][0], strict=True):
      np.testing.assert_allclose(a, b, atol=1e-6)
    assert metrics["loss"] == pytest.approx(results[0][1]["loss"], abs=1e-6)
    assert metrics["grad_norm"] == pytest.approx(results[0][1]["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("sharded", [False, True])
def test_split_step_equals_fused_step(sharded, mesh1, devices8):
  # learner.split_step: the forward (+ residuals) and backward (+ AdamW) jits give the
  # fused program's update, step after step, also with the state over fsdp x tensor.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}) if sharded else mesh1
  out = {}
  for split in ("off", "on"):
    learner = helpers.make_learner(mesh, split_step=split)
    assert learner.train_step.split == (split == "on")
    state = learner.init(0)
    for position in range(2):
      batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
      batch = batch._replace(old_logprobs=batch.old_logprobs - 0.05)
      state, metrics = learner.step(state, batch)
    out[split] = (_params(state), metrics, int(state.step))
  assert out["on"][2] == out["off"][2] == 2
  # Sharded reductions sum in another order; AdamW's first steps amplify that to ~1e-5.
  for a, b in zip(out["on"][0], out["off"][0], strict=True):
    if sharded:
      helpers.assert_params_close(a, b)
    else:
      np.testing.assert_allclose(a, b, atol=1e-6)
  assert out["on"][1].keys() == out["off"][1].keys()
  for key, value in out["off"][1].items():
    assert out["on"][1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("split", ["off", "on"])
def test_on_policy_step_equals_a_step_after_a_logprob_pass(split, mesh1):
  # The trainer's first (only) update of a batch sampled by the current parameters: the
  # old log-probs come from the loss's own forward pass; garbage in batch.old_logprobs is
  # not read, and the update equals one with the learner's log-prob pass.
  out = []
  for on_policy in (False, True):
    learner = helpers.make_learner(mesh1, split_step=split)
    state = learner.init(0)
    for position in range(2):
      batch = helpers.synthetic_batch(position)
      if on_policy:
        batch = batch._replace(old_logprobs=np.full_like(batch.old_logprobs, -7.0))
      else:
        batch = helpers.with_logprobs(learner, state, batch)
      state, metrics = learner.step(state, batch, on_policy=on_policy)
    out.append((_params(state), metrics))
  (a, ma), (b, mb) = out
  for x, y in zip(a, b, strict=True):  # ratios of 1 +- 1e-7 against exactly 1, via AdamW
    helpers.assert_params_close(x, y)
  assert mb["ratio_mean"] == 1.0 and mb["clip_frac_low"] == mb["clip_frac_high"] == 0.0
  for key in ("loss", "grad_norm", "entropy"):
    assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), key


def test_bucket_plan_sorts_rows_and_rounds_each_bucket_up():
  lengths = np.array([[300, 40], [130, 70], [448, 65], [10, 200]])
  order, widths = step_lib.bucket_plan(lengths, 2, 448)
  assert order.tolist() == [6, 1, 5, 3, 2, 7, 0, 4]  # 10 40 65 70 | 130 200 300 448
  assert widths == (128, 448)
  assert step_lib.bucket_plan(lengths, 4, 448)[1] == (64, 128, 256, 448)
  assert step_lib.bucket_plan(lengths, 3, 448) is None  # 8 rows do not split in 3
  assert step_lib.bucket_plan(lengths, 1, 448) is None
  assert step_lib.bucket_plan(np.full((4, 2), 400), 2, 448) is None  # nothing to cut


@pytest.mark.parametrize("agg, split", [("token_mean", "on"), ("seq_mean_token_sum_norm", "off")])
def test_length_buckets_give_the_update_of_the_whole_batch(agg, split, mesh1):
  # Trajectories of 5 to 150 tokens in a 256-token batch: sorted into 2 or 4 buckets cut
  # to their longest (the widest short of 256, so seq_mean_token_sum_norm must still
  # divide by 256), the update, loss and metrics equal those of the whole padded batch.
  base = helpers.synthetic_batch(2, t=256)
  rng = np.random.default_rng(0)
  lengths = rng.integers(5, 120, base.valid.shape)
  lengths[0, 0] = 150
  assert step_lib.bucket_plan(lengths, 2, 256)[1] == (128, 192)
  assert step_lib.bucket_plan(lengths, 4, 256)[1] == (64, 128, 128, 192)
  live = np.arange(256)[None, None, :] < lengths[..., None]
  batch = base._replace(tokens=np.where(live, base.tokens, 0), mask=base.mask & live)
  out = {}
  for buckets in (1, 2, 4):
    learner = helpers.make_learner(
      mesh1, split_step=split, length_buckets=buckets, loss={"agg": agg}
    )
    state = learner.init(0)
    old = helpers.with_logprobs(learner, state, batch)
    old = old._replace(old_logprobs=old.old_logprobs - 0.05 * live)  # ratios != 1
    state, metrics = learner.step(state, old, lengths=lengths)
    out[buckets] = (_params(state), metrics)
  assert learner.train_step._cache_size() == 1
  for buckets in (2, 4):
    for a, b in zip(out[buckets][0], out[1][0], strict=True):
      helpers.assert_params_close(a, b)
    for key, value in out[1][1].items():
      assert out[buckets][1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def _preference_batch(n=4, g=4, t=12):
  """Every group: slots 0, 1 pass with tokens 10 / 11 at position 6, slots 2, 3 fail
  with token 12. The grader ranks token 10 above token 11."""
  tokens = np.full((n, g, t), 3, np.int32)
  tokens[:, 0, 6], tokens[:, 1, 6], tokens[:, 2:, 6] = 10, 11, 12
  mask = np.zeros((n, g, t), bool)
  mask[..., 6] = True
  passed = np.zeros((n, g), bool)
  passed[:, :2] = True
  ranks = np.zeros((n, g), np.int32)
  ranks[:, 1] = 1
  zeros = np.zeros((n, g, t), np.float32)
  valid = np.ones((n, g), bool)
  return step_lib.Batch(tokens, mask, zeros, zeros, passed.astype(np.float32), passed, ranks, valid)


def _train_on(learner, batch, steps):
  state = learner.init(0)
  before = np.asarray(learner.logprobs(state.params, batch.tokens))[0, :, 6]
  for _ in range(steps):
    state, metrics = learner.step(state, helpers.with_logprobs(learner, state, batch))
  after = np.asarray(learner.logprobs(state.params, batch.tokens))[0, :, 6]
  return after - before, metrics


def test_policy_learns_and_gagar_favours_better_ranked(mesh1):
  # GRPO: passing tokens 10 and 11 gain, failing token 12 loses, 10 and 11 about equally.
  # GAGAR: the better-ranked token 10 gains clearly more than token 11.
  batch = _preference_batch()
  grpo = helpers.make_learner(mesh1, advantage={"redistribute": False})
  gagar = helpers.make_learner(mesh1, advantage={"redistribute": True, "scheme_param": 0.2})
  d_grpo, m_grpo = _train_on(grpo, batch, 8)
  d_gagar, m_gagar = _train_on(gagar, batch, 8)
  assert d_grpo[0] > 0.5 and d_grpo[1] > 0.5 and d_grpo[2] < -0.5
  assert abs(d_grpo[0] - d_grpo[1]) < 0.1 * abs(d_grpo[0])
  assert d_gagar[0] > d_gagar[1] + 0.3 * abs(d_gagar[0])
  assert m_grpo["adv_abs_moved"] == 0.0 and m_gagar["adv_abs_moved"] > 0.1
  # Linear floor .2 over ranks [0, 1]: weights [1, .2], so A'_0 / A'_1 = 5.
  assert m_gagar["adv_passing_ratio"] == pytest.approx(5.0, rel=1e-4)
  assert m_gagar["groups_redistributed"] == 4.0


def test_non_finite_step_raises_and_keeps_last_state(mesh1):
  learner = helpers.make_learner(mesh1)
  state = learner.init(0)
  before = _params(state)
  batch = helpers.synthetic_batch(0)
  bad = batch._replace(old_logprobs=np.where(batch.mask, np.nan, 0.0).astype(np.float32))
  with pytest.raises(step_lib.NonFiniteError, match="step 0: non-finite loss") as info:
    learner.step(state, bad)
  kept = info.value.state
  assert int(kept.step) == 0
  for a, b in zip(_params(kept), before, strict=True):
    np.testing.assert_array_equal(a, b)


def test_sft_non_finite_step_keeps_the_last_finite_state(mesh1, nano_config):
  # SFT shares the learner's guarded update: a non-finite loss leaves the parameters and
  # the optimizer where they were (it used to apply the update, then raise).
  from gagar_jax import run_config, sft

  cfg = run_config.SFTConfig(batch_size=2, seq_len=16, steps=4, warmup_steps=0)
  trainer = sft.SFTTrainer(cfg, nano_config, mesh1)
  state = trainer.init(0)
  before = _params(state)
  tokens = np.arange(32, dtype=np.int32).reshape(2, 16) % nano_config.vocab_size
  weights = np.ones((2, 16), np.float32)
  state, metrics = trainer.step(state, tokens, weights)  # a finite step moves them
  assert int(state.step) == 1 and np.isfinite(metrics["loss"]) and "finite" not in metrics
  moved = _params(state)
  assert any(not np.array_equal(a, b) for a, b in zip(moved, before, strict=True))
  with pytest.raises(step_lib.NonFiniteError, match="non-finite loss") as info:
    trainer.step(state, tokens, np.full((2, 16), np.nan, np.float32))
  kept = info.value.state
  assert int(kept.step) == 1
  for a, b in zip(_params(kept), moved, strict=True):
    np.testing.assert_array_equal(a, b)


def test_batch_without_policy_tokens_changes_nothing(mesh1):
  # Regression: an all-padding batch (dynamic sampling kept no group) still ran AdamW,
  # whose momentum from the previous step moved the parameters.
  learner = helpers.make_learner(mesh1)
  state = learner.init(0)
  state, _ = learner.step(state, helpers.with_logprobs(learner, state, helpers.synthetic_batch(0)))
  before = jax.device_get((state.params, state.opt_state))
  empty = helpers.synthetic_batch(1)
  empty = empty._replace(mask=np.zeros_like(empty.mask), valid=np.zeros_like(empty.valid))
  state, m = learner.step(state, empty)
  assert (m["updated"], m["tokens"], m["finite"]) == (0.0, 0.0, 1.0)
  assert int(state.step) == 1
  after = jax.device_get((state.params, state.opt_state))
  for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
  "config,field",
  [
    ({"optim": {"learning_rate": -1.0}}, "learner.optim.learning_rate"),
    ({"optim": {"lr": 1e-3}}, "learner.optim.lr"),
    ({"optim": {"warmup_steps": 50, "total_steps": 10}}, "learner.optim.warmup_steps"),
    ({"loss": {"agg": "sum"}}, "learner.loss.agg"),
    ({"loss": {"kl_coef": 0.1}}, "learner.loss.kl_coef"),
    ({"loss": {"dual_clip": 0.5}}, "learner.loss.dual_clip"),
    ({"advantage": {"scheme_param": 0.0}}, "learner.advantage.scheme_param"),
    ({"advantage": {"estimator": "ppo"}}, "learner.advantage.estimator"),
    ({"micro_batches": 0}, "learner.micro_batches"),
    ({"micro_batches": "2"}, "learner.micro_batches"),
    ({"split_step": "yes"}, "learner.split_step"),
    ({"split_step": "on", "micro_batches": 2}, "learner.split_step"),
  ],
)
def test_bad_learner_config_names_field(config, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    LearnerConfig.from_dict(config)


def test_batch_that_cannot_split_is_rejected(mesh1):
  learner = helpers.make_learner(mesh1, micro_batches=3)
  with pytest.raises(ConfigError, match="learner.micro_batches: 3 does not divide the 8 groups"):
    learner.shard_batch(helpers.synthetic_batch(0))
  batch = helpers.synthetic_batch(0)
  with pytest.raises(ValueError, match=r"batch.ranks has shape \(8, 3\)"):
    helpers.make_learner(mesh1).shard_batch(batch._replace(ranks=batch.ranks[:, :3]))


def test_schedules():
  cos = train_state.make_schedule(
    OptimConfig(learning_rate=1.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
  )
  # Warmup 0 -> 1 over 10 steps; cosine to 0.1 at step 110; halfway (60): .1 + .9 * .5.
  assert float(cos(0)) == 0.0 and float(cos(5)) == pytest.approx(0.5)
  assert float(cos(60)) == pytest.approx(0.55, abs=1e-4)
  assert float(cos(110)) == pytest.approx(0.1, abs=1e-6)
  const = train_state.make_schedule(
    OptimConfig(learning_rate=2.0, schedule="constant", warmup_steps=4)
  )
  assert [float(const(s)) for s in (0, 2, 4, 100)] == pytest.approx([0.0, 1.0, 2.0, 2.0])


def test_sharded_step_equals_single_device(devices8, mesh1):
  # State over fsdp x tensor, batch over data (x fsdp): same update and advantages as one device.
  mesh8 = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  out = {}
  for name, mesh in (("single", mesh1), ("sharded", mesh8)):
    learner = helpers.make_learner(mesh, micro_batches=2)
    state = learner.init(0)
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(2))
    batch = batch._replace(old_logprobs=batch.old_logprobs - 0.05)
    device_batch = learner.shard_batch(batch)
    advantages = jax.jit(
      lambda b, learner=learner: step_lib.compute_advantages(b.groups, learner.config.advantage).new
    )(device_batch)
    state, metrics = learner.step(state, device_batch)
    q = state.params["layers"]["attn"]["q_proj"].get_value()
    out[name] = (_params(state), metrics, np.asarray(advantages), q.sharding)
  assert out["sharded"][3].spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  for a, b in zip(out["sharded"][0], out["single"][0], strict=True):
    helpers.assert_params_close(a, b)
  np.testing.assert_allclose(out["sharded"][2], out["single"][2], atol=1e-6)
  for key in ("loss", "grad_norm", "adv_abs_moved", "entropy"):
    assert out["sharded"][1][key] == pytest.approx(out["single"][1][key], rel=1e-4, abs=1e-6)


def _reference_logprobs(graphdef, params, tokens):
  """The full-vocabulary computation the chunked one replaces: log_softmax of `[B, T, V]`."""
  logp = jax.nn.log_softmax(nnx.merge(graphdef, params)(tokens[:, :-1]), axis=-1)
  taken = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  return taken, entropy


@pytest.mark.parametrize("preset,tied", [("nano", True), ("nano", False), ("tiny", True)])
def test_chunked_token_logprobs_equal_the_full_vocabulary_pass(preset, tied):
  config = transformer.ModelConfig.from_dict(
    {**presets.get(preset), "vocab_size": 300, "tie_embeddings": tied}
  )
  graphdef, params = nnx.split(transformer.create(config, 0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 300, (3, 24)), jnp.int32)
  w = jnp.asarray(np.random.default_rng(1).standard_normal((2, 3, 23)), jnp.float32)

  def loss(params, fn):
    taken, entropy = fn(params)
    return jnp.sum(w[0] * taken) + jnp.sum(w[1] * entropy)

  ref = lambda p: _reference_logprobs(graphdef, p, tokens)
  want, want_grad = _reference_logprobs(graphdef, params, tokens), jax.grad(loss)(params, ref)
  for chunk in (None, 5, 8, 64):  # one chunk; 5 chunks with padding; 3; more than T
    fn = lambda p, c=chunk: tuple(
      x[:, 1:] for x in step_lib.token_logprobs(graphdef, p, tokens, True, chunk=c)
    )
    got = fn(params)
    for a, b in zip(got, want, strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=f"chunk={chunk}")
    grads = jax.grad(loss)(params, fn)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grad), strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"chunk={chunk}")


def test_chunked_logprobs_never_hold_the_whole_vocabulary():
  # XLA's memory analysis of the compiled gradient: [4, 511, 4096] float32 logits are
  # 32 MiB each.
  config = transformer.ModelConfig.from_dict({**presets.get("nano"), "vocab_size": 4096})
  graphdef, params = nnx.split(transformer.create(config, 0))
  tokens = jnp.zeros((4, 512), jnp.int32)
  assert step_lib.logit_chunk(4, 511, 151936) == 16 and step_lib.logit_chunk(48, 447, 512) == 447

  def temp_bytes(chunk):
    fn = lambda p: jnp.sum(step_lib.token_logprobs(graphdef, p, tokens, True, chunk=chunk)[1])
    compiled = jax.jit(jax.grad(fn)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  # Unchunked, the logits, their log-softmax and its exponential (and their cotangents)
  # are live together; in chunks of 64 at least 2.5 such arrays' worth is gone.
  whole, chunked = temp_bytes(512), temp_bytes(64)
  logits_bytes = 4 * 511 * 4096 * 4
  assert whole - chunked > 2.5 * logits_bytes, (whole, chunked)
