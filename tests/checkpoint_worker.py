"""Subprocess side of the checkpoint tests.

resume DIR OUT   restore the latest checkpoint in DIR, take 2 more steps, save params to OUT
churn DIR        save ever-changing states forever (the test kills it mid-save)
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from gagar_jax import sharding  # noqa: E402
from gagar_jax.learner.checkpoint import Checkpointer  # noqa: E402
from tests import helpers  # noqa: E402


def resume(directory, out):
  mesh = sharding.make_mesh({"data": 1})
  learner = helpers.make_learner(mesh)
  ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings, save_every=1)
  state, meta = ckpt.restore()
  position = meta["data_position"]
  for _ in range(2):
    batch = helpers.with_logprobs(learner, state, helpers.synthetic_batch(position))
    state, _ = learner.step(state, batch)
    position += 1
  np.savez(out, *[np.asarray(x) for x in jax.tree.leaves(state)], position=position)


def churn(directory):
  mesh = sharding.make_mesh({"data": 1})
  learner = helpers.make_learner(mesh)
  ckpt = Checkpointer(directory, learner.abstract_state, learner.state_shardings, keep=2)
  state = learner.init(0)
  step = ckpt.latest_step() or 0
  while True:
    step += 1
    # Every leaf of checkpoint k holds k (float) or k (int): easy to verify after a crash.
    state = jax.tree.map(lambda x, s=step: (x * 0 + s).astype(x.dtype), state)
    ckpt.save(step, state, {"step": step}, force=True)
    print(step, flush=True)


if __name__ == "__main__":
  if sys.argv[1] == "resume":
    resume(sys.argv[2], sys.argv[3])
  else:
    churn(sys.argv[2])
