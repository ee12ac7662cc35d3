"""One process of the 2-process `jax.distributed` tests (run by test_distributed.py).

Usage: python tests/distributed_worker.py forward PORT PROCESS_ID
       python tests/distributed_worker.py train PORT PROCESS_ID OUT_DIR
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

from gagar_jax import sharding  # noqa: E402
from gagar_jax.models import (
  presets,  # noqa: E402
  transformer,  # noqa: E402
)
from tests import helpers  # noqa: E402


def main():
  mode, port, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
  sharding.initialize_distributed(
    {
      "enabled": True,
      "coordinator_address": f"127.0.0.1:{port}",
      "num_processes": 2,
      "process_id": process_id,
    }
  )
  assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.devices())
  mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 2})
  if mode == "train":
    train(mesh, process_id, sys.argv[4])
  else:
    forward(mesh, process_id)
  jax.distributed.shutdown()


def train(mesh, process_id, out_dir):
  """3 steps, each process feeding only its own 4 of the 8 groups."""
  learner = helpers.make_learner(mesh)
  state = learner.init(0)
  for position in range(3):
    full = helpers.synthetic_batch(position)
    local = jax.tree.map(lambda x: x[4 * process_id : 4 * (process_id + 1)], full)
    batch = learner.shard_batch(local, process_local=True)
    old = learner.logprobs(state.params, batch.tokens)
    state, metrics = learner.step(state, batch._replace(old_logprobs=old, ref_logprobs=old))
  params = multihost_utils.process_allgather(state.params, tiled=True)
  leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
  np.savez(os.path.join(out_dir, f"params_{process_id}.npz"), *leaves, loss=metrics["loss"])
  print(f"process {process_id}: devices {jax.device_count()} trained 3 steps", flush=True)


def forward(mesh, process_id):
  config = transformer.ModelConfig.from_dict(presets.get("nano"))
  graphdef, params = transformer.init_sharded(config, mesh, seed=3)
  tokens = np.random.default_rng(0).integers(0, config.vocab_size, (4, 12), np.int32)
  batch = sharding.shard_batch(tokens, mesh)
  logits = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, batch)
  gathered = multihost_utils.process_allgather(logits, tiled=True)
  local = transformer.create(config, seed=3)(jnp.asarray(tokens))
  diff = float(np.abs(np.asarray(gathered) - np.asarray(local)).max())
  print(f"process {process_id}: devices {jax.device_count()} max|diff| {diff:.2e}", flush=True)
  assert diff < 1e-5, diff


if __name__ == "__main__":
  main()
