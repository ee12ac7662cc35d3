"""Checkpoints of the train state (+ JSON metadata such as the data positions, and the KL
reference policy when there is one), with orbax.

Saves are asynchronous: `save` returns once the arrays are copied off the devices (the
next step may then donate them) and orbax writes the files in a background thread
while training goes on; `wait()` / `close()` / a forced save wait for it to finish.
On several processes every process calls `save` (each writes its own shards).

Atomicity comes from orbax's commit protocol: a step is written into a
temporary directory and renamed into place only once complete, so a crash
mid-save leaves at worst a temporary directory that `latest_step()` ignores and
the next manager removes. `tests/test_checkpoint.py` kills a saving process at
random moments to check exactly that.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from gagar_jax.configlib import check


class Checkpointer:
  """Saves every `save_every` steps (and when forced), keeps the last `keep`.

  Args:
    directory: where step folders go (created if missing).
    abstract_state: the state's `ShapeDtypeStruct` tree (`Learner.abstract_state`).
    shardings: the state's `NamedSharding` tree; restores land in this layout.
    save_every: save when `step % save_every == 0`.
    keep: how many checkpoints to keep.
  """

  def __init__(
    self,
    directory: str,
    abstract_state,
    shardings,
    *,
    save_every: int = 100,
    keep: int = 3,
    reference: bool = False,
    asynchronous: bool = True,
  ):
    check(save_every >= 1, "checkpoint.save_every", f"must be >= 1, got {save_every}")
    check(keep >= 1, "checkpoint.keep", f"must be >= 1, got {keep}")
    self.directory = os.path.abspath(directory)
    self._save_every = save_every
    self._target = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
    )
    self._reference = reference  # also save / restore a reference policy (params tree)
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        save_interval_steps=save_every,
        max_to_keep=keep,
        create=True,
        cleanup_tmp_directories=True,
        enable_async_checkpointing=asynchronous,
      ),
    )

  def save(
    self, step: int, state, metadata: dict[str, Any] | None = None, *, force=False, reference=None
  ) -> bool:
    """Saves if the interval says so (or `force`, which also waits for the write);
    returns whether it saved. A step that is already saved is not written again.
    `reference`: the reference policy's params (when the checkpointer keeps one)."""
    if not force and int(step) % self._save_every:
      return False
    if int(step) in self._manager.all_steps():
      return False
    items = {"state": ocp.args.StandardSave(state), "metadata": ocp.args.JsonSave(metadata or {})}
    if self._reference and reference is not None:
      items["reference"] = ocp.args.StandardSave(reference)
    saved = self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)
    if force:
      self._manager.wait_until_finished()
    return bool(saved)

  def wait(self) -> None:
    """Blocks until every save in flight is on disk."""
    self._manager.wait_until_finished()

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def restore(self, step: int | None = None):
    """(state, metadata) of `step` (default: the latest); raises if there is none."""
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    restored = self._manager.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(self._target), metadata=ocp.args.JsonRestore()
      ),
    )
    return restored["state"], dict(restored["metadata"] or {})

  def restore_reference(self, step: int | None = None):
    """The reference policy's params saved with `step` (default: the latest), laid out
    like the state's params; None if that checkpoint has none."""
    self.wait()
    step = self.latest_step() if step is None else step
    if step is None or not self._reference:
      return None
    if not os.path.isdir(os.path.join(self.directory, str(step), "reference")):
      return None
    restored = self._manager.restore(
      step, args=ocp.args.Composite(reference=ocp.args.StandardRestore(self._target.params))
    )
    return restored["reference"]

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
