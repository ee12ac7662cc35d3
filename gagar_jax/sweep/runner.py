"""Running an ablation sweep (arms x seeds): each run's workdir claimed for its inputs,
trained and evaluated in processes of their own, and its compact record kept.

    sweep = runner.load_sweep("configs/sweeps/ablations.py:preset=powered,world=pressure_all")
    for run in sweep["runs"]:
      seconds = runner.run_one(run, workdir, sweep["world"], runner.RunOptions(ood_seeds=...))
      runner.save_record(run, workdir, record_dir, seconds)

`experiments/reproduce_ablations.py` is the command; `report.py` reads the records.
A record (config.json, summary.json with the final test's per-task counts, metrics.jsonl,
ood.json, record.json written last) is a few hundred KB; a run whose log lacks a step or
logs one twice is not recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from gagar_jax import configlib, files
from gagar_jax import metrics as metrics_lib
from gagar_jax.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command; a run's config digest is taken in a fresh process of it (`fresh_digest`).
SCRIPT = os.path.join(REPO, "experiments", "reproduce_ablations.py")
RECORD_FILES = ("config.json", "summary.json", "metrics.jsonl", "ood.json", "record.json")


def _module(path: str):
  """A config file of the repository (configs/...py) as a module."""
  name = os.path.splitext(os.path.basename(path))[0]
  module_spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_sweep(spec: str):
  """The sweep of `--sweep=FILE:ARG`; a `ConfigError` naming `sweep` for a missing file or
  a bad argument."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(os.path.join(REPO, path)):
    raise ConfigError("sweep", f"{path}: no such sweep file")
  try:
    return _module(path).get_sweep(arg or None)
  except ValueError as e:
    raise ConfigError("sweep", str(e)) from None


def run_config(run: dict, data_dir: str = ""):
  """The experiment config a run trains with (its spec, overrides and `data_dir`)."""
  path, _, arg = run["config"].partition(":")
  config = _module(path).get_config(arg or None)
  overrides = dict(run.get("overrides", {}))
  if data_dir:
    overrides["data_dir"] = data_dir
  return configlib.set_dotted(config, overrides)


def _assets(config) -> list[str]:
  """Files of the repository's assets (warm starts, graders) the config names."""
  out = []
  for value in _flat_values(config.to_dict()):
    path = os.path.join(REPO, value) if isinstance(value, str) and value else ""
    if path and os.path.commonpath([path, os.path.join(REPO, "assets")]) == os.path.join(
      REPO, "assets"
    ):
      for root, _, files in os.walk(path):
        out += [os.path.join(root, f) for f in files]
      if os.path.isfile(path):
        out.append(path)
  return sorted(set(out))


def _flat_values(d):
  for v in d.values():
    if isinstance(v, dict):
      yield from _flat_values(v)
    else:
      yield v


def inputs_digest(config) -> str:
  """A digest of what a run starts from: its config and the asset files it names."""
  h = hashlib.sha256(config.to_json_best_effort(sort_keys=True).encode())
  for path in _assets(config):
    h.update(os.path.relpath(path, REPO).encode())
    with open(path, "rb") as f:
      h.update(hashlib.sha256(f.read()).digest())
  return h.hexdigest()


def fresh_digest(run: dict, data_dir: str = "") -> str:
  """`inputs_digest` of the run's config as a new process builds it, which is what its
  train.py subprocess trains with. This process may hold config (and gagar_jax) modules
  imported before they were edited on disk; a sweep left running across such an edit
  would otherwise refuse (or accept) a workdir for a config the run never sees."""
  proc = subprocess.run(
    [
      sys.executable,
      SCRIPT,
      f"--digest_of={json.dumps(run)}",
      *([f"--data_dir={data_dir}"] if data_dir else []),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
  )
  if proc.returncode:
    raise RuntimeError(f"the config of {run['name']} does not build:\n{proc.stderr[-3000:]}")
  return proc.stdout.split()[-1]


class StaleWorkdir(RuntimeError):
  pass


class IncompleteLog(RuntimeError):
  pass


class RunFailed(RuntimeError):
  """A run's process failed; its log says why (the sweep stops with one line)."""


def claim_workdir(run: dict, workdir: str, data_dir: str = "") -> None:
  """Makes sure an existing workdir was started from this run's inputs, so a resumed
  (or already finished) run is never recorded for a changed config or warm start.

  The digest is kept in WORKDIR/sweep_inputs.json. A workdir from before that file
  existed is taken as stale if an asset its config names is newer than its config.json.
  """
  config = run_config(run, data_dir)
  digest = fresh_digest(run, data_dir)
  marker = os.path.join(workdir, "sweep_inputs.json")
  started = os.path.join(workdir, "config.json")
  hint = f"move or delete {workdir} to run {run['name']} afresh"
  if os.path.exists(marker):
    with open(marker) as f:
      if json.load(f)["digest"] != digest:
        raise StaleWorkdir(f"{workdir} was started from other inputs (config or assets); {hint}")
  elif os.path.exists(started):
    newer = [p for p in _assets(config) if os.path.getmtime(p) > os.path.getmtime(started)]
    if newer:
      raise StaleWorkdir(
        f"{workdir} predates {os.path.relpath(newer[0], REPO)}, which its config names; {hint}"
      )
  with open(marker, "w") as f:
    json.dump({"digest": digest, "run": run["name"]}, f)


def _call(args: list[str], workdir: str, what: str) -> None:
  with open(os.path.join(workdir, "stdout.log"), "a") as log:
    proc = subprocess.run(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
  if proc.returncode:
    raise RunFailed(f"{what} failed (exit {proc.returncode}); see {workdir}/stdout.log")


@dataclasses.dataclass(frozen=True)
class RunOptions:
  """How a sweep's runs are run: TFDS `data_dir` ("" = the config's), and the
  out-of-distribution evaluation's seed range ("" = none) and samples per task."""

  data_dir: str = ""
  ood_seeds: str = ""
  ood_samples: int = 4


def run_one(run: dict, workdir: str, world: str, options: RunOptions = RunOptions()) -> float:
  """Trains (resuming if the workdir has a checkpoint), then evaluates out of distribution."""
  start = time.time()
  claim_workdir(run, workdir, options.data_dir)
  args = [
    sys.executable,
    os.path.join(REPO, "experiments", "train.py"),
    f"--config={run['config']}",
    f"--workdir={workdir}",
  ]
  args += [f"--config.{k}={v}" for k, v in run.get("overrides", {}).items()]
  data_dir = [f"--data_dir={options.data_dir}"] if options.data_dir else []
  if options.data_dir:
    args.append(f"--config.data_dir={options.data_dir}")
  if not os.path.exists(os.path.join(workdir, "summary.json")):
    _call(args, workdir, f"run {run['name']}")
  if options.ood_seeds and not os.path.exists(os.path.join(workdir, "ood", "eval.json")):
    _call(
      [
        sys.executable,
        os.path.join(REPO, "experiments", "evaluate.py"),
        f"--policy={os.path.join(workdir, 'policy')}",
        f"--world={world}",
        f"--seeds={options.ood_seeds}",
        f"--samples={options.ood_samples}",
        f"--out={os.path.join(workdir, 'ood')}",
        *data_dir,
      ],
      workdir,
      f"out-of-distribution evaluation of {run['name']}",
    )
  return time.time() - start


def stop_children_on_sigterm() -> None:
  """Makes `kill PID` of a sweep stop the run it waits on as well: SIGTERM raises SystemExit,
  and subprocess.run kills its child when its wait is interrupted. (Python's default SIGTERM
  ends only this process; the training process then lived on unseen, and a workdir removed
  under it lost the rows it had logged.)"""

  def stop(signum, frame):
    del frame
    sys.exit(f"{os.path.basename(SCRIPT)}: stopped by signal {signum}; rerun to resume the run")

  signal.signal(signal.SIGTERM, stop)


def missing_in(steps: int, rows: list[dict]) -> list[int]:
  return sorted(set(range(1, int(steps) + 1)) - {r.get("step") for r in rows})


def missing_steps(run_dir: str) -> list[int]:
  """Training steps 1..steps that the run's (or record's) metrics.jsonl has no row for. A
  resumed run logs every step once; a gap means rows were lost, and the run-level figures
  (gradient-norm variance, entropy, credit moved) would be computed from part of the run."""
  summary_file = os.path.join(run_dir, "summary.json")
  summary = files.read_json(summary_file)
  files.require(summary, ("steps",), summary_file)
  return missing_in(summary["steps"], files.read_jsonl(os.path.join(run_dir, "metrics.jsonl")))


def steps_text(steps: list[int]) -> str:
  return f"{len(steps)} steps ({steps[0]}..{steps[-1]})"


def save_record(run: dict, workdir: str, record_dir: str, seconds: float) -> None:
  """Copies the run's compact record into `record_dir` (written last: record.json).
  A run whose log lacks steps is not recorded."""
  gaps = missing_steps(workdir)
  if gaps:
    raise IncompleteLog(
      f"{workdir}/metrics.jsonl has no row for {steps_text(gaps)}; not recorded. "
      f"Move or delete {workdir} and rerun {run['name']}."
    )
  twice = metrics_lib.duplicate_steps(files.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  if twice:
    raise IncompleteLog(
      f"{workdir}/metrics.jsonl logs {steps_text(twice)} more than once; not recorded. "
      f"Move or delete {workdir} and rerun {run['name']}."
    )
  os.makedirs(record_dir, exist_ok=True)
  for name in ("config.json", "summary.json", "metrics.jsonl"):
    shutil.copyfile(os.path.join(workdir, name), os.path.join(record_dir, name))
  ood = os.path.join(workdir, "ood", "eval.json")
  if os.path.exists(ood):
    shutil.copyfile(ood, os.path.join(record_dir, "ood.json"))
  meta = {k: run[k] for k in ("name", "arm", "config", "overrides")}
  meta["seed"] = int(run["name"].rsplit("_s", 1)[1])
  meta["sitting_minutes"] = seconds / 60
  meta["commit"] = code_commit()
  with open(os.path.join(record_dir, "record.json"), "w") as f:
    json.dump(meta, f, indent=2)


def finished(record_dir: str) -> bool:
  return os.path.exists(os.path.join(record_dir, "record.json"))


def run_missing(sweep: dict, records: str, root: str, options: RunOptions, max_runs: int = 0):
  """Runs the sweep's runs that have no record in `records` yet, in order, at most
  `max_runs` (0: all), each in `root/<sweep>/<run>` (resuming what a workdir holds), and
  records each as it finishes. Returns how many it ran."""
  started = 0
  for run in sweep["runs"]:
    record_dir = os.path.join(records, run["name"])
    if finished(record_dir):
      continue
    if max_runs and started >= max_runs:
      print(f"[sweep] --max_runs={max_runs} reached; the rest next sitting", flush=True)
      break
    started += 1
    workdir = os.path.join(root, sweep["name"], run["name"])
    os.makedirs(workdir, exist_ok=True)
    print(f"[sweep] running {run['name']} in {workdir} ...", flush=True)
    seconds = run_one(run, workdir, sweep.get("world", "default"), options)
    save_record(run, workdir, record_dir, seconds)
    print(f"[sweep] {run['name']} done in {seconds / 60:.1f} min; record {record_dir}", flush=True)
  return started


def code_commit() -> str:
  """The commit of the code that ran (with "+changes" if the tree differs from it), or
  "unknown" outside a git checkout."""
  try:
    head = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
      [
        "git",
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "gagar_jax",
        "configs",
        "experiments",
        "assets",
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      check=True,
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+changes" if dirty else "")
