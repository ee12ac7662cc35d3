"""Checkpoints of the train state (+ JSON metadata such as the data positions, and the KL
reference policy when there is one), with orbax.

Saves are asynchronous: `save` returns once the arrays are copied off the devices (the
next step may then donate them) and orbax writes the files in a background thread
while training goes on; `wait()` / `close()` / a forced save wait for it to finish.
On several processes every process calls `save` (each writes its own shards).

Checkpoints written before the blocks' parameters were stacked on a layer axis
(`params/layers/<i>/...`) still restore: they are read as saved, stacked, and laid out
like today's state (`_restore_legacy`).

Atomicity comes from orbax's commit protocol: a step is written into a
temporary directory and renamed into place only once complete, so a crash
mid-save leaves at worst a temporary directory that `latest_step()` ignores and
the next manager removes. `tests/test_checkpoint.py` kills a saving process at
random moments, and the moment a save is in flight, to check exactly that.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from gagar_jax.configlib import check
from gagar_jax.errors import InputError
from gagar_jax.models import transformer


def _reason(e: Exception) -> str:
  """The first line of an error, short: a restore error can be a 150-line TensorStore dump."""
  lines = [x.strip() for x in str(e).splitlines() if x.strip()]
  first = (lines[0] if lines else "").split(". See full TensorStore details")[0]
  text = f"{type(e).__name__}: {first}"
  return text if len(text) <= 160 else text[:157] + "..."


def _quiet_late_callbacks() -> None:
  """Installed before restores are tried. After a failed restore, TensorStore's reads
  still in flight call back into the event loop orbax has closed, each reporting
  `RuntimeError: Event loop is closed` as an unraisable exception, and orbax's abandoned
  read coroutines report their errors again when collected (hundreds of lines around
  the one line that matters). Those, and only those, are dropped."""
  previous = sys.unraisablehook
  if getattr(previous, "_gagar_quiet", False):
    return
  # ... and asyncio logs each of their futures as "exception was never retrieved".
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)
  warnings.filterwarnings("ignore", message="coroutine '_read_array_index", category=RuntimeWarning)

  def hook(unraisable):
    value, obj = unraisable.exc_value, unraisable.object
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
      return
    code = getattr(obj, "cr_code", None)  # orbax's abandoned read coroutines, at exit
    if code is not None and "orbax" in code.co_filename:
      return
    previous(unraisable)

  hook._gagar_quiet = True
  sys.unraisablehook = hook


def _path_name(path) -> str:
  """`params/layers/attn/q_proj/value`: a pytree key path as the names orbax saves."""
  parts = []
  for k in path:
    for attr in ("key", "idx", "name"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return "/".join(parts)


def _flat_names(tree) -> dict[str, Any]:
  return {_path_name(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


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
    if self._is_legacy(step, "state"):
      state = self._restore_legacy(step, "state", self._target)
      metadata = self._manager.restore(
        step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore())
      )["metadata"]
      return state, dict(metadata or {})
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
    if self._is_legacy(step, "reference"):
      return self._restore_legacy(step, "reference", self._target.params)
    restored = self._manager.restore(
      step, args=ocp.args.Composite(reference=ocp.args.StandardRestore(self._target.params))
    )
    return restored["reference"]

  def _is_legacy(self, step: int, item: str) -> bool:
    """Whether `item` of `step` holds per-layer parameters (written before stacking)."""
    folder = os.path.join(self.directory, str(step), item)
    with ocp.StandardCheckpointer() as reader:
      tree = reader.metadata(folder).item_metadata
    return transformer.is_legacy_layout(_flat_names(getattr(tree, "tree", tree)))

  def _restore_legacy(self, step: int, item: str, target):
    """`item` read as saved, its per-layer arrays stacked, laid out like `target`."""
    raw = self._manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.StandardRestore()}))
    flat = transformer.stack_legacy_layers(_flat_names(raw[item]))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    out = []
    for path, want in leaves:
      name = _path_name(path)
      got = flat.get(name)
      if got is None or tuple(got.shape) != tuple(want.shape):
        shape = None if got is None else tuple(got.shape)
        raise ValueError(f"{item}/{name}: saved {shape}, the model needs {tuple(want.shape)}")
      out.append(jax.device_put(np.asarray(got).astype(want.dtype), want.sharding))
    return jax.tree_util.tree_unflatten(treedef, out)

  def restore_newest(self, log=print):
    """(step, state, metadata, reference) of the newest checkpoint that restores; None if
    there is no checkpoint at all.

    A newer checkpoint that fails to restore (a truncated array file, an empty
    `_METADATA`, a broken JSON item) is skipped with a line saying which step and why,
    and moved aside to `<directory>.broken/<step>` (kept for a look, out of the
    manager's way, so the step is written anew). If none restores: an `InputError`
    naming the folder and each step's reason.
    """
    self.wait()
    failures = []
    _quiet_late_callbacks()
    for step in sorted(self.all_steps(), reverse=True):
      try:
        state, metadata = self.restore(step)
        reference = self.restore_reference(step)
      except Exception as e:  # any failure to read a step's files: try the one before
        failures.append((step, _reason(e)))
        continue
      for bad, why in failures:
        log(f"[checkpoint] step {bad} does not restore ({why}); resuming from step {step}")
        self._set_aside(bad)
      return step, state, metadata, reference
    if failures:
      raise InputError(
        self.directory,
        "no checkpoint restores ("
        + "; ".join(f"step {s}: {why}" for s, why in failures)
        + "); move the folder away to start over",
      )
    return None

  def _set_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      aside = f"{self.directory}.broken"
      os.makedirs(aside, exist_ok=True)
      target = os.path.join(aside, str(step))
      if os.path.exists(target):
        target += f".{int(time.time())}"
      shutil.move(os.path.join(self.directory, str(step)), target)
    self._manager.reload()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
