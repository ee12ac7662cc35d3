"""The entry points as a careless user meets them: every mistake is one line, `error: ...`,
exit status 2, no traceback, and before any compute (nothing evaluated, nothing written)."""

import json
import os
import subprocess
import sys

import pytest

from configs import gagar as gagar_config
from gagar_jax import workdir
from tests.conftest import REPO


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
  env["PYTHONPATH"] = REPO
  return env


@pytest.fixture(scope="module")
def rl_workdir(tmp_path_factory):
  """A workdir claimed by the `make run` experiment (configs/gagar.py:demo=True)."""
  path = str(tmp_path_factory.mktemp("cli") / "rl")
  workdir.claim(path, "rl", gagar_config.get_config("demo=True"))
  return path


def _cases(rl, tmp):
  demo = "--config=configs/gagar.py:demo=True"
  (tmp / "taken.json").write_text("{}")
  return [
    (["train.py", "--config=configs/gagar.py:demo=ture"], "config arg 'demo': expected true"),
    (
      ["train.py", demo, "--config.learner.optim.learning_rte=1"],
      "learner.optim.learning_rte: unknown field (did you mean learning_rate?)",
    ),
    (["train.py", "--config=configs/nope.py"], "--config: [Errno 2] No such file"),
    (["train.py", demo, "--config.steps=1.5"], "--config.steps=1.5: invalid literal"),
    (
      ["train.py", demo, "--config.learner.optim.learning_rate=-1", f"--workdir={tmp / 'a'}"],
      "learner.optim.learning_rate: must be > 0",
    ),
    (
      ["train.py", demo, "--config.rollout.group_size=1", f"--workdir={tmp / 'b'}"],
      "rollout.group_size: must be >= 2 for RL",
    ),
    # Checked before the step-0 evaluation, and the finished workdir's config is kept.
    (
      ["train.py", demo, "--config.learner.micro_batches=4", f"--workdir={rl}"],
      "learner.micro_batches: 4 does not divide the 6 groups",
    ),
    (
      ["train.py", "--config=configs/gagar.py:demo=True,arm=grpo", f"--workdir={rl}"],
      "arm: differ from the config",
    ),
    (
      ["sft.py", "--config=configs/sft.py:runlocal=True", f"--workdir={rl}"],
      "workdir: " + rl + " is the workdir of a rl run (this is a sft run)",
    ),
    (
      ["export_hf.py", "--policy=assets/pre_rl", f"--out={rl}"],
      f"out: {rl} is a training run's workdir",
    ),
    (
      ["evaluate.py", "--policy=assets/pre_rl/model.json"],
      "policy: 'assets/pre_rl/model.json' is a file, not a folder (nor a .gguf file)",
    ),
    (
      ["evaluate.py", "--policy=assets/pre_rl", f"--out={tmp / 'taken.json'}"],
      "out: " + str(tmp / "taken.json") + " is an existing file",
    ),
    (
      ["evaluate.py", "--policy=assets/pre_rl", "--seeds=3000000:3000002", "--split=test"],
      "split: --seeds generates its own tasks",
    ),
    (
      ["evaluate.py", "--policy=assets/pre_rl", "--mode=instruct"],
      "mode: instruct is a HumanEval protocol; use --suite=humaneval",
    ),
    (
      ["evaluate.py", "--policy=assets/pre_rl", "--suite=humaneval", "--split=all"],
      "split: 'all' is for --mode=completion|instruct",
    ),
  ]


def test_every_mistake_is_one_line_before_any_compute(rl_workdir, tmp_path):
  saved = open(os.path.join(rl_workdir, "config.json")).read()
  cases = _cases(rl_workdir, tmp_path)
  procs = [
    subprocess.Popen(
      [sys.executable, os.path.join(REPO, "experiments", args[0]), *args[1:]],
      cwd=REPO,
      env=_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for args, _ in cases
  ]
  for proc, (args, expected) in zip(procs, cases, strict=True):
    out, err = proc.communicate(timeout=300)
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert proc.returncode == 2, (args, out[-1000:], err[-3000:])
    assert "Traceback" not in err and len(lines) == 1, (args, err[-3000:])
    assert expected in lines[0], (args, lines[0])
    assert "[eval]" not in out and "[train] step" not in out, (args, out)
  assert open(os.path.join(rl_workdir, "config.json")).read() == saved
  assert json.load(open(os.path.join(rl_workdir, "workdir.json")))["kind"] == "rl"
  assert sorted(os.listdir(rl_workdir)) == ["config.json", "workdir.json"]
  assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


_COMPILES = """
import jax, jax.numpy as jnp
from gagar_jax import cli
cli.run(lambda argv: print(jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((64, 64))).sum()))
"""


@pytest.mark.parametrize(
  "setting, where",
  [
    ({}, ".cache/gagar_jax/xla"),  # the default, under $HOME
    ({"XDG_CACHE_HOME": "xdg"}, "xdg/gagar_jax/xla"),
    ({"JAX_COMPILATION_CACHE_DIR": "mine"}, "mine"),
    ({"JAX_ENABLE_COMPILATION_CACHE": "false"}, None),
  ],
)
def test_entry_points_keep_compiled_programs_in_a_persistent_cache(tmp_path, setting, where):
  env = {
    k: v
    for k, v in _env().items()
    if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT", "XDG_CACHE"))
  }
  env.update(
    {k: str(tmp_path / v) if k != "JAX_ENABLE_COMPILATION_CACHE" else v for k, v in setting.items()}
  )
  env.update(HOME=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  subprocess.run([sys.executable, "-c", _COMPILES], env=env, check=True, capture_output=True)
  written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*-cache"))
  if where is None:
    assert written == []
  else:
    assert written and all(p.startswith(where + "/jit_") for p in written), written
