"""Hugging Face import: parity with the committed `transformers` reference logits.

The checkpoints and `reference.npz` files come from `tests/data/hf_tiny/make_reference.py`
(run with torch + transformers; see its docstring).
"""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from gagar_jax import sharding
from gagar_jax.models import hf_import

DATA = os.path.join(os.path.dirname(__file__), "data", "hf_tiny")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_logits_match_transformers(arch):
  model = hf_import.load(os.path.join(DATA, arch))
  ref = np.load(os.path.join(DATA, arch, "reference.npz"))
  logits = model(jnp.asarray(ref["tokens"], jnp.int32))
  assert logits.dtype == jnp.float32
  assert logits.shape == ref["logits"].shape
  assert np.abs(np.asarray(logits) - ref["logits"]).max() < 1e-4
  # The references are not trivially small: a wrong mapping would show.
  assert np.abs(ref["logits"]).max() > 1.0


def test_configs_are_mapped():
  qwen = hf_import.load(os.path.join(DATA, "qwen2")).config
  llama = hf_import.load(os.path.join(DATA, "llama")).config
  assert qwen.qkv_bias and qwen.tie_embeddings and qwen.rope_scaling is None
  assert not llama.qkv_bias and not llama.tie_embeddings
  assert llama.head_dim == 24 and dict(llama.rope_scaling)["factor"] == 8.0
  # The Llama checkpoint is sharded into several files through an index.
  assert os.path.exists(os.path.join(DATA, "llama", "model.safetensors.index.json"))


def test_sharded_load_matches(devices8):
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  model = hf_import.load(os.path.join(DATA, "qwen2"), mesh=mesh)
  q = model.layers.attn.q_proj.get_value()
  assert q.sharding.spec == sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"), None)
  ref = np.load(os.path.join(DATA, "qwen2", "reference.npz"))
  np.testing.assert_allclose(model(jnp.asarray(ref["tokens"])), ref["logits"], atol=1e-4)


def test_bfloat16_load_is_close():
  model = hf_import.load(os.path.join(DATA, "qwen2"), dtype="bfloat16", param_dtype="bfloat16")
  ref = np.load(os.path.join(DATA, "qwen2", "reference.npz"))
  logits = np.asarray(model(jnp.asarray(ref["tokens"])))
  assert model.embed.get_value().dtype == jnp.bfloat16
  assert np.abs(logits - ref["logits"]).max() < 0.25


def test_missing_tensor_and_bad_config_are_reported(tmp_path):
  src = os.path.join(DATA, "qwen2")
  dst = tmp_path / "broken"
  shutil.copytree(src, dst)
  with open(dst / "config.json") as f:
    config = json.load(f)
  config["num_hidden_layers"] = 3
  with open(dst / "config.json", "w") as f:
    json.dump(config, f)
  with pytest.raises(KeyError, match="model.layers.2"):
    hf_import.load(str(dst))
  config["model_type"] = "gpt2"
  with open(dst / "config.json", "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match="model_type='gpt2'"):
    hf_import.load(str(dst))
  config.update(model_type="qwen2", num_key_value_heads=3)
  with open(dst / "config.json", "w") as f:
    json.dump(config, f)
  with pytest.raises(ValueError, match=r"config.json.num_kv_heads"):
    hf_import.load(str(dst))
