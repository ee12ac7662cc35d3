"""Real 2-process `jax.distributed` runs on localhost: a sharded forward, and training."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np

from gagar_jax import sharding
from tests import helpers
from tests.conftest import REPO


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two(mode, *extra):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["PYTHONPATH"] = REPO
  worker = os.path.join(REPO, "tests", "distributed_worker.py")
  procs = [
    subprocess.Popen(
      [sys.executable, worker, mode, str(port), str(i), *extra],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=240)
      outputs.append(out)
  finally:
    for p in procs:
      p.kill()
  for i, (p, out) in enumerate(zip(procs, outputs, strict=True)):
    assert p.returncode == 0, f"process {i} failed:\n{out[-3000:]}"
    assert f"process {i}: devices 4" in out


def test_two_process_sharded_forward():
  _run_two("forward")


def test_two_process_training_matches_single_process(tmp_path):
  # Each process feeds only its half of every batch; both must end with the same
  # parameters, equal to one process training on the whole batches.
  _run_two("train", str(tmp_path))
  a, b = (np.load(tmp_path / f"params_{i}.npz") for i in range(2))
  leaves = [k for k in a.files if k.startswith("arr_")]
  for k in leaves:
    np.testing.assert_array_equal(a[k], b[k])

  learner = helpers.make_learner(sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]))
  state = learner.init(0)
  for position in range(3):
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
    state, _ = learner.step(state, batch)
  reference = [np.asarray(x) for x in jax.tree.leaves(state.params)]
  assert len(reference) == len(leaves)
  for i, ref in enumerate(reference):
    np.testing.assert_allclose(a[f"arr_{i}"], ref, atol=1e-5)
