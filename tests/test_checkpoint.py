"""Checkpoints: resume in a fresh process equals a straight run; crashes mid-save are safe."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gagar_jax import sharding
from gagar_jax.errors import InputError
from gagar_jax.learner.checkpoint import Checkpointer
from tests import helpers
from tests.conftest import REPO

WORKER = os.path.join(REPO, "tests", "checkpoint_worker.py")


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
  env["PYTHONPATH"] = REPO
  return env


@pytest.fixture(scope="module")
def learner():
  return helpers.make_learner(sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]))


def test_resume_in_fresh_process_equals_straight_run(learner, tmp_path):
  # Straight: 4 steps. Interrupted: 2 steps, checkpoint, a new process restores + 2 steps.
  state = learner.init(0)
  straight = state
  for position in range(4):
    batch = helpers.with_logprobs(learner, straight, helpers.synthetic_batch(position))
    straight, _ = learner.step(straight, batch)

  state = learner.init(0)
  ckpt = Checkpointer(
    str(tmp_path / "ckpt"), learner.abstract_state, learner.state_shardings, save_every=1
  )
  for position in range(2):
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
    state, _ = learner.step(state, batch)
  ckpt.save(int(state.step), state, {"data_position": 2})
  ckpt.close()

  out = tmp_path / "resumed.npz"
  proc = subprocess.run(
    [sys.executable, WORKER, "resume", str(tmp_path / "ckpt"), str(out)],
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  resumed = np.load(out)
  leaves = [np.asarray(x) for x in jax.tree.leaves(straight)]
  assert int(resumed["position"]) == 4
  assert len(leaves) == len(resumed.files) - 1
  for i, leaf in enumerate(leaves):  # step, params, optimizer state, rng
    np.testing.assert_allclose(resumed[f"arr_{i}"], leaf, atol=1e-6)


def test_interval_and_retention(learner, tmp_path):
  ckpt = Checkpointer(
    str(tmp_path), learner.abstract_state, learner.state_shardings, save_every=2, keep=2
  )
  state = learner.init(0)
  saved = [ckpt.save(s, state, {"s": s}) for s in range(7)]
  assert saved == [True, False, True, False, True, False, True]
  assert ckpt.save(7, state, {"s": 7}, force=True)
  assert ckpt.all_steps() == [6, 7]
  restored, meta = ckpt.restore()
  assert meta == {"s": 7}
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ckpt.close()
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    Checkpointer(str(tmp_path / "empty"), learner.abstract_state, learner.state_shardings).restore()


TMP = ocp.utils.TMP_DIR_SUFFIX  # orbax names a step being written `<step><TMP>`


def _kill_churning_worker(directory, *, wait_s=None, poll_until_s=20.0) -> None:
  """Starts a worker that saves forever and SIGKILLs it: after `wait_s` seconds, or
  (`wait_s=None`) the moment a save's temporary directory is seen, i.e. mid-save."""
  proc = subprocess.Popen(
    [sys.executable, WORKER, "churn", directory],
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  try:
    assert proc.stdout.readline().strip()  # wait until it is saving
    if wait_s is not None:
      time.sleep(wait_s)
    else:
      deadline = time.monotonic() + poll_until_s
      while time.monotonic() < deadline and not any(TMP in n for n in os.listdir(directory)):
        pass
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_crash_mid_save_never_restores_wrongly(learner, tmp_path):
  # Kill a process that saves continuously, at random moments and then the moment a
  # save is in flight; each time the latest checkpoint must restore to exactly the
  # state saved under that step, and the half-written step must be ignored.
  directory = str(tmp_path / "churn")
  rng = np.random.default_rng(0)
  # Four kills at random moments, then kills aimed at a save in flight until one
  # leaves a half-written temporary directory behind (at most six tries).
  plans = [float(rng.uniform(0.0, 0.5)) for _ in range(4)] + [None] * 6
  interrupted = 0
  for i, wait_s in enumerate(plans):
    if i >= 4 and interrupted:
      break
    _kill_churning_worker(directory, wait_s=wait_s)
    half_written = [n for n in os.listdir(directory) if TMP in n]
    interrupted += bool(half_written)
    ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings)
    step = ckpt.latest_step()
    assert step is not None and all(str(step) != n.split(".")[0] for n in half_written)
    state, meta = ckpt.restore()
    assert meta == {"step": step}
    for leaf in jax.tree.leaves(state):
      np.testing.assert_array_equal(np.asarray(leaf), step)
    ckpt.close()
  # A kill did land mid-save (a half-written temporary directory was left) and the
  # restores above skipped it.
  assert interrupted >= 1


def _damage(step_dir, how: str) -> None:
  """Fault injection into a saved step: its array data cut short, or an empty _METADATA."""
  if how == "truncated arrays":
    for root, _, names in os.walk(os.path.join(step_dir, "state")):
      for name in names:
        if os.sep + "d" in root and "ocdbt" in root:  # the array data files
          os.truncate(os.path.join(root, name), 10)
  else:
    open(os.path.join(step_dir, "state", "_METADATA"), "w").close()


@pytest.mark.parametrize("how", ["truncated arrays", "empty _METADATA"])
def test_resume_falls_back_past_a_damaged_newest_checkpoint(learner, tmp_path, how):
  directory = str(tmp_path / "ckpt")
  ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings, save_every=1)
  state = learner.init(0)
  saved = {}
  for position in range(2):
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
    state, _ = learner.step(state, batch)
    saved[int(state.step)] = jax.device_get(state.params)
    ckpt.save(int(state.step), state, {"data_position": position + 1})
  ckpt.close()
  _damage(os.path.join(directory, "2"), how)
  lines = []
  ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings, save_every=1)
  step, restored, meta, _ = ckpt.restore_newest(log=lines.append)
  assert step == 1 and meta == {"data_position": 1}
  for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(saved[1]), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert len(lines) == 1 and lines[0].startswith("[checkpoint] step 2 does not restore (")
  assert lines[0].endswith("resuming from step 1") and len(lines[0]) < 400
  # The damaged step is kept aside, out of the way: step 2 can be written anew.
  assert os.path.isdir(directory + ".broken/2") and ckpt.all_steps() == [1]
  assert ckpt.save(2, restored, {}, force=True)
  ckpt.close()
  # When no checkpoint restores: one error naming the folder and each step's reason.
  _damage(os.path.join(directory, "1"), how)
  _damage(os.path.join(directory, "2"), how)
  ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings, save_every=1)
  with pytest.raises(
    InputError, match=rf"^{directory}: no checkpoint restores \(step 2: .*; step 1: "
  ):
    ckpt.restore_newest()
  ckpt.close()
