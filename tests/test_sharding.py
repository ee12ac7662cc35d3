"""Mesh construction, logical rules, sharded init and the sharded forward pass on 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from gagar_jax import sharding
from gagar_jax.errors import ConfigError
from gagar_jax.models import transformer


def test_mesh_fill_and_shape(devices8):
  mesh = sharding.make_mesh({"data": -1, "fsdp": 2, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.make_mesh({}).shape["data"] == 8


@pytest.mark.parametrize(
  "mesh,field",
  [
    ({"data": 3}, "mesh.data"),
    ({"data": -1, "tensor": 3}, "mesh.data"),
    ({"data": -1, "fsdp": -1}, "mesh.fsdp"),
    ({"data": 1, "fsdp": 1, "tensor": 4}, "mesh.tensor"),
    ({"tensro": 2}, "mesh.tensro"),
    ({"data": 0}, "mesh.data"),
  ],
)
def test_bad_mesh_names_field(devices8, mesh, field):
  with pytest.raises(ConfigError, match=field):
    sharding.make_mesh(mesh)


def test_rules_to_specs():
  rules = sharding.DEFAULT_RULES
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), rules) == P(
    "fsdp", "tensor", None
  )
  assert sharding.logical_to_spec(("batch", None), rules) == P(("data", "fsdp"), None)
  # A mesh axis is used once per array: the second 'tensor' target is dropped.
  assert sharding.logical_to_spec(("vocab", "mlp"), rules) == P("tensor", None)


@pytest.mark.parametrize(
  "rules,match",
  [
    ((("embeds", "fsdp"),), r"sharding_rules\[0\].*unknown logical axis 'embeds'"),
    ((("embed", "model"),), r"sharding_rules\[0\].*unknown mesh axis 'model'"),
    ((("embed",),), r"sharding_rules\[0\]"),
  ],
)
def test_bad_rules_name_field(rules, match):
  with pytest.raises(ConfigError, match=match):
    sharding.validate_rules(rules)


def test_indivisible_parameter_names_field(devices8, nano_config):
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
  with pytest.raises(ConfigError, match=r"mesh.tensor: parameter .*'kv_heads' of size 2"):
    transformer.init_sharded(nano_config, mesh)


def test_indivisible_batch_names_field(devices8):
  mesh = sharding.make_mesh({"data": 4, "fsdp": 2})
  with pytest.raises(ConfigError, match="batch_size: batch of 6"):
    sharding.shard_batch(np.zeros((6, 3), np.int32), mesh)


def test_sharded_forward_equals_single_device(devices8, nano_config):
  # Parameters over fsdp x tensor, the batch over data: same logits as one device.
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  graphdef, params = transformer.init_sharded(nano_config, mesh, seed=4)
  q = params["layers"]["attn"]["q_proj"].get_value()
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (2, 16, 2, 8)

  tokens = np.random.default_rng(0).integers(0, nano_config.vocab_size, (4, 16), np.int32)
  batch = sharding.shard_batch(tokens, mesh)
  assert batch.sharding.spec == P(("data", "fsdp"), None)
  forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
  sharded = forward(params, batch)

  single_params = jax.device_put(params, jax.devices()[0])
  single = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(single_params, jnp.asarray(tokens))
  reference = transformer.create(nano_config, seed=4)(jnp.asarray(tokens))
  np.testing.assert_allclose(np.asarray(sharded), np.asarray(single), atol=1e-5)
  np.testing.assert_allclose(np.asarray(single), np.asarray(reference), atol=1e-5)


def test_distributed_disabled_is_noop():
  sharding.initialize_distributed({"enabled": False})
  with pytest.raises(ConfigError, match="distributed.process_id"):
    sharding.initialize_distributed(
      {"enabled": True, "coordinator_address": "127.0.0.1:1", "num_processes": 2, "process_id": 5}
    )
