"""The skeleton every training run shares (RL: `trainer.py`; SFT of the policy and of the
LM grader: `sft.py`, `grader_sft.py`).

    skeleton.begin(config, workdir, "rl", checks=...)   # before any output is written
    last = skeleton.steps(
      "[train]", first=step, total=steps, update=update, record=record, save=save,
      checkpoints=ckpt.directory, log=print,
    )

Steps run until `total` (or until `more()` says no: a time budget). A step is
`update(step) -> step + 1` (the state moves), then `record(step)` (its metrics rows,
progress line and any evaluation), then `save(step, force=False)` (a checkpoint when one
is due). Ctrl-C finishes the current step, checkpoints it and raises
`Interrupted` (a clean stop, exit 130). When the loop ends, for any reason, a forced
checkpoint is written only for a step whose records are all written, so a resume never
misses a row or logs one twice; after an error, a failure to write it (an update the
error cut short holds the state's buffers) is reported, not raised over the error, and
the last periodic checkpoint stands.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from gagar_jax import cli, sharding
from gagar_jax import workdir as workdir_lib
from gagar_jax.errors import Interrupted

# What an exported policy folder holds (an earlier export may be overwritten).
POLICY_FILES = ("model.json", "params.safetensors")


def begin(
  config, workdir: str, kind: str, *, export: str = "", checks=lambda: None, log=print
) -> None:
  """A run's start, once its config is valid: the `export` folder checked, `jax.distributed`
  started (`config.distributed`), the checks that need the process count run, and the
  workdir claimed for this run (`workdir.claim`: a resume with another config refused)."""
  workdir_lib.check_output_folder(export, "export", keeps=POLICY_FILES)
  sharding.initialize_distributed(config.distributed)
  checks()
  workdir_lib.claim(workdir, kind, config, log=log)


def write_summary(workdir: str, summary: dict, export: str = "") -> None:
  """`workdir/summary.json`, and beside an exported policy the same without its curve."""
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  if export:
    with open(os.path.join(export, "summary.json"), "w") as f:
      json.dump({k: v for k, v in summary.items() if k != "curve"}, f, indent=2)


def steps(
  tag: str,
  *,
  first: int,
  total: int,
  update: Callable[[int], int],
  record: Callable[[int], None],
  save: Callable[..., None],
  checkpoints: str,
  log: Callable[[str], None],
  more: Callable[[], bool] = lambda: True,
  on_exit: Callable[[bool], None] = lambda finished: None,
) -> int:
  """Runs steps from `first` to `total` (module docstring); returns the last step.

  `save(step, force=...)` checkpoints; `on_exit(finished)` runs last, whatever happened
  (finished: the loop reached its end without an error)."""
  step = logged = first
  finished = False
  stop = cli.GracefulStop(tag).install()
  try:
    while step < total and more():
      step = update(step)
      record(step)
      logged = step
      save(step, force=False)
      if stop.requested and step < total:
        raise Interrupted(
          f"{tag} stopped at step {step}/{total} (Ctrl-C); checkpoint saved in "
          f"{checkpoints}: rerun the same command to resume"
        )
    finished = True
  finally:
    stop.restore()
    try:
      if finished or logged == step:
        save(step, force=True)
    except Exception as e:
      if finished:
        raise
      log(f"{tag} no final checkpoint ({type(e).__name__}); the last saved one stands")
    finally:
      on_exit(finished)
  return step
