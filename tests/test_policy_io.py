"""Policy folders: export -> load round trip, and the committed pre-RL policy."""

import dataclasses
import os

import jax
import numpy as np
import pytest
from flax import nnx

from gagar_jax import policy_io
from gagar_jax.errors import ConfigError
from gagar_jax.models import tokenizers, transformer
from tests.conftest import REPO


def test_round_trip(tmp_path, nano_config):
  tok_hf = tokenizers.train_bpe(["def f(x):\n    return x\n"] * 50, 300)
  config = dataclasses.replace(nano_config, vocab_size=tok_hf.vocab_size)
  params = nnx.state(transformer.create(config, 0))
  policy_io.export(str(tmp_path), tok_hf, config, params)
  tok2, config2, params2 = policy_io.load(str(tmp_path))
  assert config2 == config and tok2.encode("def f") == tok_hf.encode("def f")
  # The tokenizer keeps its chat template (the project's agent format).
  assert tok2.template.source == tok_hf.template.source
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ConfigError, match="model.embed_dim: 64 does not match"):
    policy_io.load(str(tmp_path), {"embed_dim": 64})


def test_committed_pre_rl_policy_loads_and_runs():
  tok, config, params = policy_io.load(os.path.join(REPO, "assets", "pre_rl"))
  assert config.vocab_size == tok.vocab_size and config.num_params() < 2_000_000
  model = nnx.merge(nnx.graphdef(transformer.Transformer(config, rngs=nnx.Rngs(0))), params)
  logits = model(np.asarray([tok.encode("Issue: f(1) returns 2")], np.int32))
  assert np.isfinite(np.asarray(logits)).all()
