"""One process of the 2-process `jax.distributed` test (run by test_distributed.py).

Usage: python tests/distributed_worker.py PORT PROCESS_ID
Each process has 2 CPU devices; together they form a 4-device mesh (data=2, tensor=2).
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from configs import model_sizes  # noqa: E402
from gagar_jax import sharding  # noqa: E402
from gagar_jax.models import transformer  # noqa: E402


def main():
  port, process_id = int(sys.argv[1]), int(sys.argv[2])
  sharding.initialize_distributed(
    {
      "enabled": True,
      "coordinator_address": f"127.0.0.1:{port}",
      "num_processes": 2,
      "process_id": process_id,
    }
  )
  assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.devices())
  config = transformer.ModelConfig.from_dict(model_sizes.get_config("nano"))
  mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 2})
  graphdef, params = sharding.init_model(config, mesh, seed=3)
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 12), np.int32)
  batch = sharding.shard_batch(tokens, mesh)
  logits = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, batch)
  gathered = multihost_utils.process_allgather(logits, tiled=True)
  local = transformer.create(config, seed=3)(jnp.asarray(tokens))
  diff = float(np.abs(np.asarray(gathered) - np.asarray(local)).max())
  print(f"process {process_id}: devices {jax.device_count()} max|diff| {diff:.2e}", flush=True)
  assert diff < 1e-5, diff
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
