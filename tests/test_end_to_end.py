"""End to end on shrunken configs, through the entry points a user runs (in fresh
processes with one device): SFT a few steps, RL a few steps, interrupt, resume.
And bad configs fail before any compute, naming the field."""

import json
import os
import subprocess
import sys

import pytest

from configs import gagar as gagar_config
from configs import sft as sft_config
from gagar_jax import metrics, trainer
from gagar_jax.errors import ConfigError
from tests.conftest import REPO


def _run(script, *args):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
  env["PYTHONPATH"] = REPO
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", script), *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc.stdout


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
  root = tmp_path_factory.mktemp("e2e")
  out = _run(
    "sft.py",
    "--config=configs/sft.py:runlocal=True",
    f"--workdir={root / 'sft'}",
    f"--config.data_dir={root / 'data'}",
    f"--export={root / 'policy'}",
  )
  assert "[sft] done" in out
  steps = sft_config.get_config("runlocal=True").sft.steps
  assert json.load(open(root / "sft" / "summary.json"))["steps"] == steps
  return root


def _rl_config(root, **overrides):
  config = gagar_config.get_config("runlocal=True")
  config.data_dir = str(root / "data")
  config.init_from = str(root / "policy")
  for k, v in overrides.items():
    config[k] = v
  return config


def test_sft_then_rl_with_resume(warm_start):
  root = warm_start
  assert os.path.exists(root / "policy" / "params.safetensors")
  assert os.path.exists(root / "sft" / "curve.png")
  workdir = str(root / "rl")
  common = [
    "--config=configs/gagar.py:runlocal=True",
    f"--workdir={workdir}",
    f"--config.data_dir={root / 'data'}",
    f"--config.init_from={root / 'policy'}",
  ]
  out = _run("train.py", *common, "--config.steps=2")
  assert "[train] step 2/2" in out and "[train] done" in out
  # "Interrupted" after 2 steps: a new process on the same workdir resumes and finishes.
  out = _run("train.py", *common, "--config.steps=3")
  assert "resumed from step 2" in out and "[train] step 3/3" in out
  records = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3]
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert "pass@1" in summary["final_test"]
  assert os.path.exists(os.path.join(workdir, "curves.png"))
  assert os.path.exists(os.path.join(workdir, "tensorboard"))
  assert json.load(open(os.path.join(workdir, "config.json")))["arm"] == "gagar"


@pytest.mark.parametrize(
  "overrides,field",
  [
    ({"arm": "ppo"}, "arm"),
    ({"steps": 0}, "steps"),
    ({"init_from": "/nonexistent"}, "init_from"),
  ],
)
def test_bad_rl_config_fails_before_compute(warm_start, overrides, field):
  with pytest.raises(ConfigError, match=f"^{field}:"):
    trainer.parse_config(_rl_config(warm_start, **overrides))


@pytest.mark.parametrize(
  "section,key,value,field",
  [
    ("learner.optim", "learning_rate", -1.0, "learner.optim.learning_rate"),
    ("learner.loss", "agg", "sum", "learner.loss.agg"),
    ("learner.advantage", "preserve_sum", True, "learner.advantage.preserve_sum"),
    ("rollout", "max_episode_tokens", 64, "rollout.max_episode_tokens"),
    ("grader", "backend", "gpt", "grader.backend"),
  ],
)
def test_bad_nested_config_names_field(warm_start, section, key, value, field):
  config = gagar_config.get_config("runlocal=True,arm=gagar_no_rescale")
  config.data_dir = str(warm_start / "data")
  config.init_from = str(warm_start / "policy")
  node = config
  for part in section.split("."):
    node = node[part]
  node[key] = value
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    trainer.parse_config(config)


def test_unknown_arm_in_config_arg():
  with pytest.raises(ValueError, match="arm='best'"):
    gagar_config.get_config("arm=best")


@pytest.mark.parametrize(
  "settings,field",
  [
    ({"backend": "lm", "lm_path": "/nonexistent"}, "grader.lm_path"),
    ({"backend": "openai"}, "grader.openai.base_url"),
    (
      {"backend": "openai", "openai.base_url": "http://127.0.0.1:9/v1", "openai.concurrency": 0},
      "grader.openai.concurrency",
    ),
    (
      {"backend": "openai", "openai.base_url": "http://127.0.0.1:9/v1", "agent.max_turns": 0},
      "grader.agent.max_turns",
    ),
  ],
)
def test_bad_grader_backend_config_names_field(warm_start, settings, field, monkeypatch):
  monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
  config = _rl_config(warm_start)
  for key, value in settings.items():
    node = config.grader
    *path, last = key.split(".")
    for part in path:
      node = node[part]
    node[last] = value
  with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
    trainer.parse_config(config)


def test_grader_sft_then_rl_with_the_lm_grader(warm_start):
  """The LM grader made by experiments/sft.py drives a GAGAR run (plumbing, nano sizes)."""
  root = warm_start
  out = _run(
    "sft.py",
    "--config=configs/grader_sft.py:runlocal=True",
    f"--workdir={root / 'grader'}",
    f"--config.data_dir={root / 'data'}",
    f"--export={root / 'grader_export'}",
  )
  assert "[grader] done: held-out top-1" in out
  summary = json.load(open(root / "grader" / "summary.json"))
  assert summary["demonstrations"] > 0 and "kendall_tau" in summary["held_out"]
  assert os.path.exists(root / "grader_export" / "grader.json")
  workdir = str(root / "rl_lm")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True,grader=lm",
    f"--workdir={workdir}",
    f"--config.data_dir={root / 'data'}",
    f"--config.init_from={root / 'policy'}",
    f"--config.grader.lm_path={root / 'grader_export'}",
    "--config.steps=1",
  )
  assert "[train] done" in out
  records = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert records and "train/grader_submitted" in records[0]
  assert json.load(open(os.path.join(workdir, "config.json")))["grader"]["backend"] == "lm"
