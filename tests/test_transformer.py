"""The decoder: shapes, cache equivalence, numerics, config validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gagar_jax.errors import ConfigError
from gagar_jax.models import presets, transformer


def test_forward_shapes_and_dtype(nano_config, nano_model):
  graphdef, params = nano_model
  model = nnx.merge(graphdef, params)
  tokens = jnp.zeros((3, 7), jnp.int32)
  logits = model(tokens)
  assert logits.shape == (3, 7, nano_config.vocab_size)
  assert logits.dtype == jnp.float32


def test_param_count_matches_formula(nano_config, nano_model):
  _, params = nano_model
  assert sum(x.size for x in jax.tree.leaves(params)) == nano_config.num_params()


def test_qwen_presets_have_published_sizes():
  # Qwen2.5-Coder-0.5B has 494M parameters, 1.5B has 1.54B, 7B has 7.62B (model cards).
  sizes = {
    n: transformer.ModelConfig.from_dict(presets.get(n)).num_params()
    for n in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-7b")
  }
  assert sizes["qwen2.5-coder-0.5b"] == pytest.approx(494e6, rel=0.01)
  assert sizes["qwen2.5-coder-1.5b"] == pytest.approx(1.54e9, rel=0.01)
  assert sizes["qwen2.5-coder-7b"] == pytest.approx(7.62e9, rel=0.01)


def test_causality(nano_model):
  # Changing a later token must not change earlier logits.
  graphdef, params = nano_model
  model = nnx.merge(graphdef, params)
  a = jnp.arange(10, dtype=jnp.int32)[None] % 50
  b = a.at[0, 6].set(7)
  la, lb = model(a), model(b)
  np.testing.assert_allclose(la[0, :6], lb[0, :6], atol=1e-6)
  assert not np.allclose(la[0, 6:], lb[0, 6:])


def test_query_chunked_attention_equals_one_block(nano_config, nano_model, monkeypatch):
  # Long sequences attend in query chunks, each over the keys up to its end; the
  # logits equal those of one unchunked causal pass (a ragged last chunk included).
  graphdef, params = nano_model
  tokens = jax.random.randint(jax.random.key(3), (2, 45), 0, nano_config.vocab_size)
  whole = nnx.merge(graphdef, params)(tokens)
  monkeypatch.setattr(transformer, "CAUSAL_CHUNK", 8)
  chunked = nnx.merge(graphdef, params)(tokens)
  np.testing.assert_allclose(chunked, whole, atol=1e-5)
  grad = lambda: jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(tokens)[:, -1] ** 2))(params)
  chunked_grad = grad()
  monkeypatch.setattr(transformer, "CAUSAL_CHUNK", 1024)
  for a, b in zip(jax.tree.leaves(chunked_grad), jax.tree.leaves(grad()), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_chunked_cache_equals_full_forward(nano_config, nano_model):
  # Feeding a sequence in chunks of 4, 1 and 5 tokens through the cache gives the
  # logits of one full causal forward pass.
  graphdef, params = nano_model
  model = nnx.merge(graphdef, params)
  tokens = jax.random.randint(jax.random.key(0), (2, 10), 0, nano_config.vocab_size)
  full = model(tokens)
  cache = transformer.init_cache(nano_config, 2, 16)
  pieces, start = [], 0
  for width in (4, 1, 5):
    index = jnp.full((2,), start, jnp.int32)
    logits, cache = model(tokens[:, start : start + width], cache=cache, write_index=index)
    pieces.append(logits)
    start += width
  np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, atol=1e-5)


def test_bfloat16_compute_is_close_to_float32(nano_config):
  model32 = transformer.create(nano_config, seed=2)
  cfg16 = dataclasses.replace(nano_config, dtype="bfloat16")
  model16 = transformer.create(cfg16, seed=2)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, nano_config.vocab_size)
  l32, l16 = model32(tokens), model16(tokens)
  assert l16.dtype == jnp.float32
  assert np.isfinite(np.asarray(l16)).all()
  # bf16 keeps ~3 significant digits; logits of a fresh model are O(0.1).
  np.testing.assert_allclose(l16, l32, atol=3e-2)
  assert not np.array_equal(np.asarray(l16), np.asarray(l32))


def test_untied_model_has_lm_head(nano_config):
  cfg = dataclasses.replace(nano_config, tie_embeddings=False, qkv_bias=True)
  state = nnx.state(transformer.create(cfg))
  assert state["lm_head"].get_value().shape == (cfg.embed_dim, cfg.vocab_size)
  assert state["layers"]["attn"]["q_bias"].get_value().shape == (
    cfg.num_layers,
    cfg.num_heads,
    cfg.head_dim,
  )
  assert sum(x.size for x in jax.tree.leaves(state)) == cfg.num_params()


def test_every_param_has_logical_axes(nano_model):
  _, params = nano_model
  for path, var in nnx.to_flat_state(params):
    axes = var.get_metadata()["logical_axes"]
    assert len(axes) == var.get_value().ndim, path
    assert set(axes) <= set(transformer.LOGICAL_AXES), path


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("num_kv_heads", 3, "model.num_kv_heads"),
    ("head_dim", 7, "model.head_dim"),
    ("embed_dim", 0, "model.embed_dim"),
    ("dtype", "float16", "model.dtype"),
    ("vocab_size", "big", "model.vocab_size"),
  ],
)
def test_bad_model_config_names_field(field, value, match):
  d = dict(presets.get("nano"))
  d[field] = value
  with pytest.raises(ConfigError, match=match):
    transformer.ModelConfig.from_dict(d)


def test_unknown_and_missing_model_fields():
  d = dict(presets.get("nano"))
  with pytest.raises(ConfigError, match="model.hidden_size: unknown field"):
    transformer.ModelConfig.from_dict({**d, "hidden_size": 3})
  del d["num_layers"]
  with pytest.raises(ConfigError, match="model.num_layers: required"):
    transformer.ModelConfig.from_dict(d)


@pytest.mark.parametrize("remat", ["block", "full"])
def test_remat_keeps_gradients_and_saves_memory(remat):
  # Rematerialisation recomputes activations in the backward pass: the same gradients,
  # fewer bytes of live temporaries in the compiled training step.
  cfg = {**presets.get("nano"), "num_layers": 3}
  base = transformer.ModelConfig.from_dict(cfg)
  tokens = jax.random.randint(jax.random.key(0), (4, 64), 0, base.vocab_size)

  def grads_and_program(config):
    graphdef, params = nnx.split(transformer.create(config, seed=1))

    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens)
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

    fn = jax.jit(jax.grad(loss))
    return fn(params), fn.lower(params).compile(), jax.make_jaxpr(jax.grad(loss))(params)

  g0, c0, j0 = grads_and_program(base)
  g1, c1, j1 = grads_and_program(dataclasses.replace(base, remat=remat))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g0, g1)
  assert "remat" in str(j1) and "remat" not in str(j0)  # jax.checkpoint's primitive
  m0, m1 = c0.memory_analysis(), c1.memory_analysis()
  if m0 is not None and m1 is not None:
    assert m1.temp_size_in_bytes < m0.temp_size_in_bytes


def test_remat_is_validated():
  with pytest.raises(ConfigError, match="remat"):
    transformer.ModelConfig.from_dict({**presets.get("nano"), "remat": "some"})
  assert presets.get("qwen2.5-coder-7b")["dtype"] == "bfloat16"
  assert presets.get("qwen2.5-coder-7b-bf16")["param_dtype"] == "bfloat16"
  with pytest.raises(ValueError, match="unknown"):
    presets.get("tiny-bf16")
