"""KV-cache sampler: equivalence with re-forward decoding, randomness, stopping, multi-turn."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gagar_jax.errors import ConfigError
from gagar_jax.models import sampler as sampler_lib

PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 11, 12, 40], [60, 61], [3] * 17]


@pytest.fixture(scope="module")
def sampler(nano_config, nano_model):
  return sampler_lib.Sampler(nano_config, nano_model[0], cache_size=64, pad_id=0)


def _generate(sampler, params, prompts, key, sampling):
  state = sampler.prefill(params, prompts)
  return sampler.generate(params, state, key, sampling)


def test_greedy_cache_equals_naive_decoding(sampler, nano_model):
  # Mixed prompt lengths in one batch; every row decodes 24 tokens.
  graphdef, params = nano_model
  greedy = sampler_lib.SamplingParams(max_new_tokens=24, temperature=0.0)
  _, out = _generate(sampler, params, PROMPTS, jax.random.key(0), greedy)
  ref_tokens, ref_logps, ref_mask = sampler_lib.generate_without_cache(
    graphdef, params, PROMPTS, jax.random.key(0), greedy
  )
  np.testing.assert_array_equal(out.tokens, ref_tokens)
  np.testing.assert_array_equal(out.mask, ref_mask)
  np.testing.assert_allclose(out.logprobs, ref_logps, atol=1e-5)
  assert np.asarray(out.mask).all()
  # A single prompt alone decodes the same as inside the batch (rows are independent).
  _, alone = _generate(sampler, params, PROMPTS[1:2], jax.random.key(0), greedy)
  np.testing.assert_array_equal(alone.tokens[0], out.tokens[1])


def test_logprobs_match_full_forward_recomputation(sampler, nano_model):
  # The returned log-probs equal log_softmax of a plain forward pass over prompt + sample.
  graphdef, params = nano_model
  sampling = sampler_lib.SamplingParams(max_new_tokens=10, temperature=1.0)
  _, out = _generate(sampler, params, PROMPTS[:2], jax.random.key(3), sampling)
  model = nnx.merge(graphdef, params)
  for row, prompt in enumerate(PROMPTS[:2]):
    seq = jnp.asarray([prompt + np.asarray(out.tokens[row]).tolist()], jnp.int32)
    logp = jax.nn.log_softmax(model(seq)[0], axis=-1)
    positions = np.arange(len(prompt) - 1, len(prompt) - 1 + 10)
    expected = logp[positions, out.tokens[row]]
    np.testing.assert_allclose(out.logprobs[row], expected, atol=1e-5)


def test_temperature_sampling_is_reproducible_and_key_dependent(sampler, nano_model):
  _, params = nano_model
  sampling = sampler_lib.SamplingParams(max_new_tokens=16, temperature=1.0)
  _, a = _generate(sampler, params, PROMPTS, jax.random.key(7), sampling)
  _, b = _generate(sampler, params, PROMPTS, jax.random.key(7), sampling)
  _, c = _generate(sampler, params, PROMPTS, jax.random.key(8), sampling)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.logprobs, b.logprobs)
  assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_sampled_tokens_do_not_depend_on_the_batch(nano_config, nano_model):
  # Each row draws from its own stream (key, row id, token index): alone, in a batch,
  # or compacted into smaller batches between chunks, a row samples the same tokens.
  graphdef, params = nano_model
  prompts = PROMPTS + [[9, 8, 7], [33] * 5, [2, 4, 6, 8], [70, 71, 72]]
  sampling = sampler_lib.SamplingParams(max_new_tokens=16, temperature=1.0, eos_id=3)
  key = jax.random.key(11)
  plain = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  chunked = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0, decode_chunk=3)
  _, ref = _generate(plain, params, prompts, key, sampling)
  _, out = _generate(chunked, params, prompts, key, sampling)
  counts = np.asarray(ref.num_tokens)
  assert len(set(counts.tolist())) > 1  # rows stop at different times: compaction happens
  for a, b in ((ref.tokens, out.tokens), (ref.num_tokens, out.num_tokens)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(ref.logprobs, out.logprobs, atol=1e-5)
  for s in (plain, chunked):
    state = s.prefill(params, prompts[5:6])
    _, alone = s.generate(params, state, key, sampling, row_ids=[5])
    np.testing.assert_array_equal(alone.tokens[0], ref.tokens[5])
  _, other = plain.generate(params, plain.prefill(params, prompts[5:6]), key, sampling, row_ids=[4])
  assert not np.array_equal(np.asarray(other.tokens[0]), np.asarray(ref.tokens[5]))


def test_top_k_one_and_tiny_top_p_are_greedy(sampler, nano_model):
  _, params = nano_model
  greedy = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  _, ref = _generate(sampler, params, PROMPTS, jax.random.key(0), greedy)
  for sampling in (
    sampler_lib.SamplingParams(max_new_tokens=12, temperature=1.0, top_k=1),
    sampler_lib.SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-6),
  ):
    _, out = _generate(sampler, params, PROMPTS, jax.random.key(5), sampling)
    np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_top_k_restricts_support():
  logits = jnp.asarray([[0.0, 1.0, 2.0, 3.0, 4.0]] * 400)
  sampling = sampler_lib.SamplingParams(max_new_tokens=1, temperature=1.0, top_k=2)
  tokens, _ = sampler_lib.sample_logits(logits, jax.random.key(0), sampling)
  assert set(np.asarray(tokens).tolist()) == {3, 4}
  # top_p=0.7 over probs ~[.01,.03,.09,.23,.64]: mass before token 3 is .64 < .7 -> kept,
  # mass before token 2 is .87 -> dropped.
  sampling = sampler_lib.SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.7)
  tokens, _ = sampler_lib.sample_logits(logits, jax.random.key(0), sampling)
  assert set(np.asarray(tokens).tolist()) == {3, 4}


def test_stop_sequence_and_eos_end_rows(sampler, nano_model):
  # Use the greedy continuation itself to pick stop tokens the model will emit.
  _, params = nano_model
  greedy = sampler_lib.SamplingParams(max_new_tokens=20, temperature=0.0)
  _, ref = _generate(sampler, params, PROMPTS, jax.random.key(0), greedy)
  ref = np.asarray(ref.tokens)
  stop = tuple(ref[0, 3:5].tolist())  # row 0 emits this pair at steps 3-4
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=20, temperature=0.0, stop_sequences=(stop,), eos_id=int(ref[1, 2])
  )
  _, out = _generate(sampler, params, PROMPTS, jax.random.key(0), sampling)
  tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
  first_stop = next(i for i in range(1, 20) if tuple(ref[0, i - 1 : i + 1]) == stop)
  assert out.num_tokens[0] == first_stop + 1
  assert out.finish_reason[0] in (sampler_lib.FINISH_STOP, sampler_lib.FINISH_EOS)
  first_eos = next(i for i in range(20) if ref[1, i] == ref[1, 2])
  assert out.num_tokens[1] <= first_eos + 1
  for row in range(len(PROMPTS)):
    n = int(out.num_tokens[row])
    assert mask[row, :n].all() and not mask[row, n:].any()
    np.testing.assert_array_equal(tokens[row, :n], ref[row, :n])
    assert (tokens[row, n:] == 0).all()
    if out.finish_reason[row] == sampler_lib.FINISH_LENGTH:
      assert n == 20


def test_compacting_decode_equals_one_loop(nano_config, nano_model):
  # decode_chunk=3 moves the rows still generating into smaller batches between
  # chunks; greedy output, finish reasons, the returned state and the next turn equal
  # one decode loop over the whole batch.
  graphdef, params = nano_model
  prompts = PROMPTS + [[9, 8, 7], [33] * 5, [2, 4, 6, 8], [70, 71, 72]]
  plain = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  greedy = sampler_lib.SamplingParams(max_new_tokens=16, temperature=0.0)
  _, ref = _generate(plain, params, prompts, jax.random.key(0), greedy)
  ref = np.asarray(ref.tokens)
  # Stop tokens that rows emit at different steps, so rows finish at different times.
  stop = {int(ref[i, i % 5 + 1]) for i in range(0, len(prompts), 3)}
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=16, temperature=0.0, stop_sequences=tuple((t,) for t in sorted(stop))
  )
  chunked = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0, decode_chunk=3)
  takes = []
  take = chunked._take
  chunked._take = lambda *a: takes.append(1) or take(*a)
  results = []
  for s in (plain, chunked):
    active = np.ones(len(prompts), bool)
    active[5] = False  # a finished conversation in the batch
    state = s.prefill(params, prompts)
    state, out = s.generate(params, state, jax.random.key(0), sampling, active)
    state = s.append(params, state, [[1, 2]] * len(prompts))
    state, out2 = s.generate(params, state, jax.random.key(1), sampling)
    # Few rows take part: the rest of the batch never enters the loop (nor the append).
    few = np.zeros(len(prompts), bool)
    few[[1, 4, 7]] = True
    state = s.append(params, state, [[3, 4, 5] if f else [] for f in few])
    state, out3 = s.generate(params, state, jax.random.key(2), sampling, few)
    results.append((state, out, out2, out3))
  (ps, p1, p2, p3), (cs, c1, c2, c3) = results
  assert takes, "no compaction happened"
  counts = np.asarray(p1.num_tokens)
  assert len(set(counts.tolist())) > 2 and counts[5] == 0
  assert not np.asarray(p3.num_tokens)[~few].any()
  for a, b in ((p1, c1), (p2, c2), (p3, c3)):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.mask, b.mask)
    np.testing.assert_array_equal(a.num_tokens, b.num_tokens)
    np.testing.assert_array_equal(a.finish_reason, b.finish_reason)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
  np.testing.assert_array_equal(ps.lengths, cs.lengths)
  np.testing.assert_allclose(ps.last_logits, cs.last_logits, atol=1e-5)


def test_shared_prompts_and_appends_in_pieces_fill_the_cache_the_same(nano_config, nano_model):
  # Rows with the same prompt share one prefill (copied out of a smaller batch), and
  # append_chunk=4 runs observations in pieces over the rows that still have tokens: the
  # cache, lengths and next logits equal one append of the whole batch, and so does the
  # greedy turn after them.
  graphdef, params = nano_model
  prompts = [PROMPTS[1]] * 3 + [PROMPTS[0]] * 3 + [PROMPTS[3]] * 2
  observations = [[], [20], [21, 22, 23, 24, 25], [], [], [7] * 13, [], [5, 6]]
  greedy = sampler_lib.SamplingParams(max_new_tokens=6, temperature=0.0)
  plain = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  pieces = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0, append_chunk=4)
  calls = []
  for name in ("_chunk", "_take"):
    fn = getattr(pieces, name)
    setattr(pieces, name, lambda *a, fn=fn, name=name: calls.append((name, a)) or fn(*a))
  ref = plain.append(params, plain.init_state(len(prompts)), prompts)  # no sharing
  ref = plain.append(params, ref, observations)
  got = pieces.prefill(params, prompts)
  # The 3 distinct prompts (9, 3 and 17 tokens) and a padding row, 4 tokens at a time:
  # the first piece over all 4 rows, then the rows still holding tokens (2, 2, 1, 1) in
  # sub-batches; then the 4 rows are copied out to the 8.
  shapes = [a[2].shape if n == "_chunk" else n for n, a in calls]
  sub = ["_take", (2, 4), "_take", (2, 4), "_take", (1, 4), "_take", (1, 4)]
  assert shapes == [(4, 4), *sub, "_take"]
  calls.clear()
  got = pieces.append(params, got, observations)
  # Pieces over the rows holding tokens: 4 of the 8, then 2, 1, 1.
  assert [a[2].shape for n, a in calls if n == "_chunk"] == [(4, 4), (2, 4), (1, 4), (1, 4)]
  np.testing.assert_array_equal(got.lengths, ref.lengths)
  np.testing.assert_allclose(got.last_logits, ref.last_logits, atol=1e-5)
  for r, n in enumerate(np.asarray(ref.lengths)):
    for a, b in ((got.cache.k, ref.cache.k), (got.cache.v, ref.cache.v)):
      np.testing.assert_allclose(a[r, :, :, :n], b[r, :, :, :n], atol=1e-5)
  _, out = pieces.generate(params, got, jax.random.key(0), greedy)
  _, ref_out = plain.generate(params, ref, jax.random.key(0), greedy)
  np.testing.assert_array_equal(out.tokens, ref_out.tokens)


def test_multi_turn_append_equals_reprefill(sampler, nano_config, nano_model):
  # Turn 1, then an observation appended to the cache, then turn 2, must equal
  # prefilling the whole transcript from scratch and decoding turn 2.
  graphdef, params = nano_model
  greedy = sampler_lib.SamplingParams(max_new_tokens=6, temperature=0.0)
  prompts = PROMPTS[:3]
  state, turn1 = _generate(sampler, params, prompts, jax.random.key(0), greedy)
  observations = [[20, 21], [], [22, 23, 24, 25, 26]]
  state = sampler.append(params, state, observations)
  state, turn2 = sampler.generate(params, state, jax.random.key(1), greedy)
  transcripts = [
    p + np.asarray(turn1.tokens[i]).tolist() + observations[i] for i, p in enumerate(prompts)
  ]
  fresh = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  ref_state, ref2 = _generate(fresh, params, transcripts, jax.random.key(1), greedy)
  np.testing.assert_array_equal(turn2.tokens, ref2.tokens)
  np.testing.assert_array_equal(state.lengths, ref_state.lengths)
  np.testing.assert_allclose(state.last_logits, ref_state.last_logits, atol=1e-4)


@pytest.mark.parametrize("chunk", [0, 4])
def test_a_cache_much_larger_than_the_text_decodes_the_same(nano_config, nano_model, chunk):
  # Attention reads only the filled part of the cache (a power-of-two bound of the longest
  # row's end): a 4096-slot cache must give the tokens, log-probs and next logits of a
  # 300-slot one, across turns whose bound grows (256 slots, then 512).
  graphdef, params = nano_model
  small = sampler_lib.Sampler(nano_config, graphdef, cache_size=300, pad_id=0)
  big = sampler_lib.Sampler(nano_config, graphdef, cache_size=4096, pad_id=0, decode_chunk=chunk)
  assert [big.attend_bound(n) for n in (1, 256, 257, 600, 5000)] == [256, 256, 512, 1024, 4096]
  assert small.attend_bound(280) == 300
  greedy = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  long_obs = [[30 + i % 50 for i in range(70)], [], [9] * 240, [4, 5]]
  outs = []
  for s in (small, big):
    state, turn1 = _generate(s, params, PROMPTS, jax.random.key(0), greedy)
    state = s.append(params, state, long_obs)
    state, turn2 = s.generate(params, state, jax.random.key(1), greedy)
    outs.append((turn1, turn2, state))
  (a1, a2, sa), (b1, b2, sb) = outs
  for x, y in ((a1, b1), (a2, b2)):
    np.testing.assert_array_equal(x.tokens, y.tokens)
    np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
  np.testing.assert_array_equal(sa.lengths, sb.lengths)
  assert int(np.max(sb.lengths)) > 256  # the second turn crossed a bound
  np.testing.assert_allclose(sa.last_logits, sb.last_logits, atol=1e-5)
  transcripts = [p + np.asarray(a1.tokens[i]).tolist() + long_obs[i] for i, p in enumerate(PROMPTS)]
  ref, _, _ = sampler_lib.generate_without_cache(
    graphdef, params, transcripts, jax.random.key(1), greedy
  )
  np.testing.assert_array_equal(b2.tokens, ref)


def test_cache_limits(sampler, nano_model):
  _, params = nano_model
  state = sampler.prefill(params, [[1] * 60])
  with pytest.raises(ValueError, match="exceed the 4 free cache slots"):
    sampler.append(params, state, [[2] * 5])
  state = sampler.prefill(params, [[1] * 60])
  sampling = sampler_lib.SamplingParams(max_new_tokens=10, temperature=0.0)
  state, out = sampler.generate(params, state, jax.random.key(0), sampling)
  assert int(out.num_tokens[0]) == 4
  assert int(out.finish_reason[0]) == sampler_lib.FINISH_CACHE_FULL
  assert int(state.lengths[0]) == 64


@pytest.mark.parametrize(
  "kwargs,field",
  [
    ({"max_new_tokens": 0}, "sampling.max_new_tokens"),
    ({"max_new_tokens": 4, "temperature": -1.0}, "sampling.temperature"),
    ({"max_new_tokens": 4, "top_p": 0.0}, "sampling.top_p"),
    ({"max_new_tokens": 4, "top_k": -2}, "sampling.top_k"),
    ({"max_new_tokens": 4, "stop_sequences": ((),)}, "sampling.stop_sequences"),
  ],
)
def test_bad_sampling_params_name_field(kwargs, field):
  with pytest.raises(ConfigError, match=field):
    sampler_lib.SamplingParams(**kwargs)


def test_sharded_sampler_equals_single_device(devices8, nano_config):
  # Params over fsdp x tensor, rows over data x fsdp: same tokens as on one device.
  from gagar_jax import sharding
  from gagar_jax.models import transformer

  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  graphdef, params = transformer.init_sharded(nano_config, mesh, seed=1)
  sharded = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0, mesh=mesh)
  sampling = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  state, out = _generate(sharded, params, PROMPTS, jax.random.key(0), sampling)
  assert state.cache.k.sharding.spec == sharding.logical_to_spec(
    ("batch", "layers", "kv_heads", None, "head_dim"), None
  )
  state = sharded.append(params, state, [[1, 2]] * 4)
  state, out2 = sharded.generate(params, state, jax.random.key(1), sampling)

  single_params = jax.device_put(params, jax.devices()[0])
  single = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  ref_state, ref = _generate(single, single_params, PROMPTS, jax.random.key(0), sampling)
  ref_state = single.append(single_params, ref_state, [[1, 2]] * 4)
  _, ref2 = single.generate(single_params, ref_state, jax.random.key(1), sampling)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out2.tokens, ref2.tokens)
  with pytest.raises(ConfigError, match="sampler.batch_size"):
    sharded.prefill(params, PROMPTS[:3])


def test_sharded_compacting_decode_equals_single_device(devices8, nano_config):
  # Rows over data x fsdp (4 shards): sub-batches are multiples of 4 rows.
  from gagar_jax import sharding
  from gagar_jax.models import transformer

  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  graphdef, params = transformer.init_sharded(nano_config, mesh, seed=1)
  prompts = PROMPTS + [[9, 8, 7], [33] * 5, [2, 4, 6, 8], [70, 71, 72]]
  single_params = jax.device_put(params, jax.devices()[0])
  single = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, pad_id=0)
  greedy = sampler_lib.SamplingParams(max_new_tokens=16, temperature=0.0)
  _, ref = _generate(single, single_params, prompts, jax.random.key(0), greedy)
  stops = tuple(sorted({(int(np.asarray(ref.tokens)[i, 1]),) for i in (0, 3, 5, 6)}))
  sampling = sampler_lib.SamplingParams(max_new_tokens=16, temperature=0.0, stop_sequences=stops)
  sharded = sampler_lib.Sampler(
    nano_config, graphdef, cache_size=64, pad_id=0, mesh=mesh, decode_chunk=3
  )
  takes = []
  take = sharded._take
  sharded._take = lambda *a: takes.append(1) or take(*a)
  state, out = _generate(sharded, params, prompts, jax.random.key(0), sampling)
  ref_state, want = _generate(single, single_params, prompts, jax.random.key(0), sampling)
  assert takes, np.asarray(want.num_tokens)
  assert len(set(np.asarray(want.num_tokens).tolist())) > 1
  np.testing.assert_array_equal(out.tokens, want.tokens)
  np.testing.assert_array_equal(out.finish_reason, want.finish_reason)
  np.testing.assert_array_equal(state.lengths, ref_state.lengths)
  assert state.cache.k.sharding.spec == sharding.logical_to_spec(
    ("batch", "layers", "kv_heads", None, "head_dim"), None
  )


@pytest.mark.parametrize("chunk", [0, 3])
def test_stop_strings_end_rows_mid_token_and_rewind_the_cache(nano_config, nano_model, chunk):
  graphdef, params = nano_model
  sampler = sampler_lib.Sampler(nano_config, graphdef, cache_size=64, decode_chunk=chunk)
  greedy = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  _, ref = _generate(sampler, params, PROMPTS, jax.random.key(0), greedy)
  ref = np.asarray(ref.tokens)

  def decode(ids):
    return "".join(f"<{int(i)}>" for i in ids)

  # A string that starts inside token 3 of row 0 and ends inside token 4.
  stop = decode(ref[0, 3:5])[1:-1]
  want = [
    next((k for k in range(1, 13) if stop in decode(ref[r, :k])), 12) for r in range(len(PROMPTS))
  ]
  assert want[0] <= 5
  strings = sampler_lib.StopStrings((stop,), decode)
  state, out = sampler.generate(
    params, sampler.prefill(params, PROMPTS), jax.random.key(0), greedy, stop_strings=strings
  )
  assert np.asarray(out.num_tokens).tolist() == want
  for r, k in enumerate(want):
    np.testing.assert_array_equal(np.asarray(out.tokens)[r, :k], ref[r, :k])
    assert (np.asarray(out.tokens)[r, k:] == 0).all() and np.asarray(out.mask)[r].sum() == k
    if k < 12:
      assert int(out.finish_reason[r]) == sampler_lib.FINISH_STOP
  # The cache holds exactly prompt + kept tokens: the next turn equals a fresh prefill.
  kept = list(zip(PROMPTS, want, strict=True))
  assert np.asarray(state.lengths).tolist() == [len(p) + k for p, k in kept]
  state = sampler.append(params, state, [[1, 2]] * len(PROMPTS))
  _, turn2 = sampler.generate(params, state, jax.random.key(1), greedy)
  fresh = [p + ref[r, :k].tolist() + [1, 2] for r, (p, k) in enumerate(kept)]
  _, expect = _generate(sampler, params, fresh, jax.random.key(1), greedy)
  np.testing.assert_array_equal(turn2.tokens, expect.tokens)


def test_chunked_decode_attends_as_far_as_its_live_rows_reach(nano_config, nano_model):
  """With `decode_chunk`, each chunk's attention bound covers where its live rows can be by
  its end (rows at 250 read 256 slots for their first chunk, 512 once they cross), and the
  tokens are those of one call over the whole bound."""
  graphdef, params = nano_model
  greedy = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  prompts = [[3 + i % 40 for i in range(250)], [7] * 120]
  chunked = sampler_lib.Sampler(nano_config, graphdef, cache_size=1024, pad_id=0, decode_chunk=4)
  bounds = []
  decode = chunked._decode
  chunked._decode = lambda *a: bounds.append(a[-1]) or decode(*a)
  _, got = chunked.generate(params, chunked.prefill(params, prompts), jax.random.key(0), greedy)
  assert bounds[0] == 256 and bounds[-1] == 512 and sorted(bounds) == bounds
  whole = sampler_lib.Sampler(nano_config, graphdef, cache_size=1024, pad_id=0)
  _, want = whole.generate(params, whole.prefill(params, prompts), jax.random.key(0), greedy)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_allclose(got.logprobs, want.logprobs, atol=1e-5)
