"""Real 2-process `jax.distributed` runs on localhost: a sharded forward, and training."""

import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import safetensors.numpy

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
    helpers.assert_params_close(a[f"arr_{i}"], ref)


def _built(path: str) -> bool:
  """Whether a TFDS dataset under `path` is complete (its dataset_info.json written)."""
  return any("dataset_info.json" in files for _, _, files in os.walk(path))


def _launch(port, workdir, data_dir, process_id):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env.update(PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  args = [
    "--config=configs/gagar.py:runlocal=True,size=tiny",
    "--config.init_from=assets/pre_rl",
    f"--config.data_dir={data_dir}",
    "--config.steps=3",
    "--config.distributed.enabled=True",
    f"--config.distributed.coordinator_address=127.0.0.1:{port}",
    "--config.distributed.num_processes=2",
    f"--config.distributed.process_id={process_id}",
    f"--workdir={workdir}",
  ]
  return subprocess.Popen(
    [sys.executable, os.path.join(REPO, "experiments", "train.py"), *args],
    cwd=REPO,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def test_train_py_as_two_processes_kill_and_resume(tmp_path):
  # The real entry point as 2 jax.distributed processes (one CPU device and one sandbox
  # pool each): each rolls out its own group per step, the learner's batch has both.
  import json
  import signal

  from gagar_jax import metrics

  workdir, data_dir = str(tmp_path / "run"), str(tmp_path / "data")

  def finish(workdir):
    port = _free_port()
    procs = [_launch(port, workdir, data_dir, i) for i in range(2)]
    outs = []
    try:
      for p in procs:
        outs.append(p.communicate(timeout=600)[0])
    finally:
      for p in procs:
        p.kill()
    for i, (p, out) in enumerate(zip(procs, outs, strict=True)):
      assert p.returncode == 0, f"process {i}:\n{out[-4000:]}"
    return outs

  # The uninterrupted run and the one to kill run side by side (it halves the test's
  # wall time). They share the TFDS data: the straight pair builds it, the other pair
  # starts once it is complete (two builders must not write one dataset at once).
  straight = str(tmp_path / "straight")
  straight_port = _free_port()
  straight_procs = [_launch(straight_port, straight, data_dir, i) for i in range(2)]
  # Killed (SIGKILL, both) once process 0 has logged step 2; then resumed to the end.
  built = os.path.join(data_dir, "minirepo")
  deadline = time.time() + 600
  while not _built(built) and time.time() < deadline:
    time.sleep(1)
  port = _free_port()
  procs = [_launch(port, workdir, data_dir, i) for i in range(2)]
  seen = []
  try:
    for line in procs[0].stdout:
      seen.append(line)
      if line.startswith("[train] step 2/3"):
        break
  finally:
    for p in procs:
      p.kill()
      p.wait(timeout=60)
  assert procs[0].returncode == -signal.SIGKILL, "".join(seen)[-3000:]
  try:
    straight_outs = [p.communicate(timeout=600)[0] for p in straight_procs]
  finally:
    for p in straight_procs:
      p.kill()
  for i, (p, out) in enumerate(zip(straight_procs, straight_outs, strict=True)):
    assert p.returncode == 0, f"straight process {i}:\n{out[-4000:]}"
  outs = finish(workdir)
  assert "resumed from step" in outs[0] and "[train] done" in outs[0]
  assert "[train]" not in outs[1]  # progress from process 0 only
  records = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3]  # written once, by one process
  assert json.load(open(os.path.join(workdir, "summary.json")))["steps"] == 3
  logs = [
    [json.loads(x) for x in open(os.path.join(workdir, "hosts", f"process_{i}.jsonl"))]
    for i in range(2)
  ]
  tasks = [{t for r in log for t in r.get("tasks", [])} for log in logs]
  assert tasks[0] and tasks[1] and not tasks[0] & tasks[1]  # each process its own tasks
  digests = [log[-1]["final_params_sha256"] for log in logs]
  assert digests[0] == digests[1]  # every process holds the same parameters
  # Resuming is exact: the same parameters as the uninterrupted 2-process run.
  a, b = (
    safetensors.numpy.load_file(os.path.join(w, "policy", "params.safetensors"))
    for w in (workdir, straight)
  )
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6, err_msg=name)
