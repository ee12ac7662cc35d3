"""Stacked layers: the scan equals the loop; per-layer folders and checkpoints still load."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from gagar_jax import policy_io, sharding
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.models import transformer
from tests import helpers
from tests.conftest import REPO

VARIANTS = {
  "tied": {},
  "untied_bias": {"tie_embeddings": False, "qkv_bias": True},
}


def _pair(config, **changes):
  """(loop model, scan model) with the same parameters."""
  cfg = dataclasses.replace(config, **changes)
  graphdef, params = nnx.split(transformer.create(dataclasses.replace(cfg, scan_layers=False), 3))
  scan_def, _ = nnx.split(transformer.create(dataclasses.replace(cfg, scan_layers=True), 3))
  return cfg, (graphdef, params), (scan_def, params)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("remat", ["none", "full"])
def test_scan_equals_loop_logits_and_gradients(nano_config, variant, remat):
  cfg, loop, scan = _pair(nano_config, remat=remat, **VARIANTS[variant])
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 40)), jnp.int32)

  def loss(params, graphdef):
    logits = nnx.merge(graphdef, params)(tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 7]), logits

  results = {}
  for name, (graphdef, params) in (("loop", loop), ("scan", scan)):
    grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, logits), grads = grad_fn(params, graphdef)
    results[name] = (np.asarray(logits), jax.tree.leaves(grads))
  np.testing.assert_allclose(results["scan"][0], results["loop"][0], atol=1e-5, rtol=0)
  for a, b in zip(results["scan"][1], results["loop"][1], strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_scan_equals_loop_through_the_cache(nano_config):
  # Chunks of 5, 1 and 3 tokens through a 64-slot cache, attention bounded at 32 slots.
  cfg, loop, scan = _pair(nano_config)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
  out = {}
  for name, (graphdef, params) in (("loop", loop), ("scan", scan)):
    model = nnx.merge(graphdef, params)
    cache = transformer.init_cache(cfg, 2, 64)
    logits, start = [], 0
    for width in (5, 1, 3):
      index = jnp.full((2,), start, jnp.int32)
      hidden, cache = model.hidden(
        tokens[:, start : start + width], cache=cache, write_index=index, attend=32
      )
      logits.append(np.asarray(model.logits(hidden)))
      start += width
    out[name] = (np.concatenate(logits, axis=1), np.asarray(cache.k), np.asarray(cache.v))
  assert out["loop"][1].shape == (2, cfg.num_layers, cfg.num_kv_heads, 64, cfg.head_dim)
  for a, b in zip(out["scan"], out["loop"], strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
  # And both equal the plain causal forward.
  full = np.asarray(nnx.merge(*loop)(tokens))
  np.testing.assert_allclose(out["scan"][0], full, atol=1e-5, rtol=0)


def test_scan_layers_default_follows_depth(nano_config):
  assert not nano_config.scanned  # 2 layers: the loop
  assert dataclasses.replace(nano_config, num_layers=transformer.SCAN_FROM_LAYERS).scanned
  assert dataclasses.replace(nano_config, scan_layers=True).scanned
  with pytest.raises(Exception, match="scan_layers"):
    dataclasses.replace(nano_config, scan_layers="yes")


def test_shipped_warm_start_is_per_layer_and_loads_stacked():
  # assets/pre_rl was written before the blocks were stacked: it must still load.
  path = os.path.join(REPO, "assets", "pre_rl")
  names = list(load_file(os.path.join(path, "params.safetensors")))
  assert transformer.is_legacy_layout(names)
  tok, config, params = policy_io.load(path)
  q = params["layers"]["attn"]["q_proj"].get_value()
  assert q.shape == (config.num_layers, config.embed_dim, config.num_heads, config.head_dim)
  old = load_file(os.path.join(path, "params.safetensors"))
  for i in range(config.num_layers):
    np.testing.assert_array_equal(np.asarray(q[i]), old[f"layers/{i}/attn/q_proj"])


def test_per_layer_policy_folder_with_a_gap_fails_naming_the_file(tmp_path):
  src = os.path.join(REPO, "assets", "pre_rl")
  dst = tmp_path / "policy"
  shutil.copytree(src, dst)
  arrays = load_file(os.path.join(dst, "params.safetensors"))
  arrays = {k: v for k, v in arrays.items() if not k.startswith("layers/1/")}
  save_file(arrays, os.path.join(dst, "params.safetensors"))
  with pytest.raises(Exception, match=r"params.safetensors.*layers \[0, 2, 3\]"):
    policy_io.load(str(dst))


def _unstack(tree) -> dict:
  """A state as nested dicts in the per-layer layout checkpoints had before stacking."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    leaf = np.asarray(leaf)
    if "layers" in parts:
      at = parts.index("layers") + 1
      items = [(parts[:at] + [str(i)] + parts[at:], leaf[i]) for i in range(leaf.shape[0])]
    else:
      items = [(parts, leaf)]
    for names, value in items:
      node = out
      for name in names[:-1]:
        node = node.setdefault(name, {})
      node[names[-1]] = value
  return out


def test_per_layer_checkpoint_restores_stacked(tmp_path):
  learner = helpers.make_learner(sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]))
  state = learner.init(0)
  batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(0))
  state, _ = learner.step(state, batch)
  legacy = _unstack(state)
  assert "0" in legacy["params"]["layers"]
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), legacy)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  old = Checkpointer(
    str(tmp_path / "ckpt"), abstract, jax.tree.map(lambda _: device, legacy), reference=True
  )
  old.save(1, legacy, {"data_position": 1}, force=True, reference=legacy["params"])
  old.close()

  new = Checkpointer(
    str(tmp_path / "ckpt"), learner.abstract_state, learner.state_shardings, reference=True
  )
  step, restored, metadata, reference = new.restore_newest()
  new.close()
  assert (step, metadata) == (1, {"data_position": 1})
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(state.params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The restored state trains on.
  learner.step(restored, helpers.with_logprobs(learner, restored, helpers.synthetic_batch(1)))


def test_policy_folder_written_now_is_stacked(tmp_path, nano_config):
  graphdef, params = nnx.split(transformer.create(nano_config, 2))
  tok, _, _ = policy_io.load(os.path.join(REPO, "assets", "pre_rl"))
  policy_io.export(str(tmp_path), tok, nano_config, params)
  names = list(load_file(os.path.join(tmp_path, "params.safetensors")))
  assert "layers/attn/q_proj" in names and not transformer.is_legacy_layout(names)
  with open(tmp_path / "model.json") as f:
    assert "scan_layers" in json.load(f)


def test_decoding_with_split_layers_equals_the_scan(nano_config):
  # The sampler's decode loop may slice the weights out of the stack once (CPU default)
  # instead of scanning: same tokens, log-probs and cache.
  from gagar_jax.models import sampler as sampler_lib

  cfg = dataclasses.replace(nano_config, scan_layers=True)
  graphdef, params = nnx.split(transformer.create(cfg, 5))
  prompts = [[3, 5, 7, 9, 11], [2, 4, 6]]
  sampling = sampler_lib.SamplingParams(max_new_tokens=12, temperature=0.0)
  out = {}
  for split in (False, True):
    sampler = sampler_lib.Sampler(cfg, graphdef, cache_size=64, pad_id=0, split_layers=split)
    state = sampler.prefill(params, prompts)
    state, result = sampler.generate(params, state, jax.random.key(0), sampling)
    out[split] = (np.asarray(result.tokens), np.asarray(result.logprobs), np.asarray(state.cache.k))
  for a, b in zip(out[True], out[False], strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
