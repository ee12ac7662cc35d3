"""End to end on shrunken configs, through the entry points a user runs (in fresh
processes with one device): SFT a few steps, RL a few steps, interrupt, resume.
And bad configs fail before any compute, naming the field."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

from configs import gagar as gagar_config
from configs import sft as sft_config
from gagar_jax import metrics, sft, trainer
from gagar_jax.errors import ConfigError
from tests.conftest import REPO


def _env():
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
  env["PYTHONPATH"] = REPO
  return env


def _run(script, *args):
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", script), *args],
    cwd=REPO,
    env=_env(),
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


def test_sft_report_says_what_the_run_was(warm_start, tmp_path):
  """The warm-start report reads the suite, the evaluation's group size and the machine
  off the run's summary (it once said "groups of 8" and "2 CPU cores" whatever ran)."""
  summary = json.load(open(warm_start / "sft" / "summary.json"))
  group = sft_config.get_config("runlocal=True").eval.group_size
  assert summary["eval_group_size"] == group != 8
  path = tmp_path / "report.md"
  sft.write_report(summary, str(path), "make sft", str(warm_start / "sft" / "curve.png"))
  text = path.read_text()
  assert f"groups of {group})" in text and f"| pass@{group} |" in text
  assert summary["machine"] in text and f"({summary['suite']}, " in text
  assert (tmp_path / "report.png").exists()


def _rl_config(root, **overrides):
  config = gagar_config.get_config("runlocal=True")
  config.data_dir = str(root / "data")
  config.init_from = str(root / "policy")
  for k, v in overrides.items():
    config[k] = v
  return config


def _run_until(line, script, *args):
  """Starts `script`, SIGKILLs it as soon as it prints a line starting with `line`."""
  proc = subprocess.Popen(
    [sys.executable, os.path.join(REPO, "experiments", script), *args],
    cwd=REPO,
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  seen = []
  for out in proc.stdout:
    seen.append(out)
    if out.startswith(line):
      proc.kill()
      break
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, "".join(seen)[-2000:]


def _policy(path):
  return safetensors.numpy.load_file(os.path.join(path, "policy", "params.safetensors"))


def _kl_common(root):
  # From the committed tiny warm start (the nano SFT above never passes a test, so
  # its steps are skipped: dynamic sampling keeps no group).
  return [
    "--config=configs/gagar.py:runlocal=True,size=tiny",
    f"--config.data_dir={root / 'data'}",
    "--config.init_from=assets/pre_rl",
    # KL (k3) against the frozen warm start; no warmup, so the first update moves.
    "--config.learner.loss.kl=k3",
    "--config.learner.loss.kl_coef=0.04",
    "--config.learner.optim.warmup_steps=0",
    "--config.steps=3",
  ]


@pytest.fixture(scope="module")
def kl_run(warm_start):
  """An uninterrupted 3-step RL run with KL (its workdir): the resume test's reference,
  and the group inspector's records."""
  straight = str(warm_start / "rl_straight")
  out = _run("train.py", *_kl_common(warm_start), f"--workdir={straight}")
  assert "[train] step 3/3" in out and "[train] done" in out
  return straight


def test_sft_then_rl_with_kl_kill_and_resume(warm_start, kl_run):
  root, straight = warm_start, kl_run
  assert os.path.exists(root / "policy" / "params.safetensors")
  assert os.path.exists(root / "sft" / "curve.png")
  common = _kl_common(root)
  # Regression: the reference aliased the donated policy buffers ("Buffer has been
  # deleted or donated" at step 2). KL is 0 at the first update (policy = reference).
  kl = [
    r["train/kl"] for r in metrics.read(os.path.join(straight, "metrics.jsonl")) if "train/kl" in r
  ]
  assert len(kl) == 3 and abs(kl[0]) < 1e-6 and kl[1] > 0 and kl[2] > 0, kl

  # Killed (SIGKILL) once step 2 is logged; a new process on the same workdir resumes
  # (from step 1 or 2, wherever the last checkpoint landed) and finishes.
  workdir = str(root / "rl")
  _run_until("[train] step 2/3", "train.py", *common, f"--workdir={workdir}")
  out = _run("train.py", *common, f"--workdir={workdir}")
  assert "resumed from step" in out and "[train] step 3/3" in out
  records = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3]  # steps run again are logged once
  # The reference stayed the warm start across the resume: the same parameters.
  resumed, reference = _policy(workdir), _policy(straight)
  assert resumed.keys() == reference.keys()
  for name, value in reference.items():
    np.testing.assert_allclose(resumed[name], value, rtol=0, atol=1e-6, err_msg=name)
  warm = safetensors.numpy.load_file(os.path.join(REPO, "assets/pre_rl/params.safetensors"))
  assert any(np.abs(value - warm[name]).max() > 0 for name, value in reference.items())
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert "pass@1" in summary["final_test"] and summary["optimizer_steps"] == 3
  assert os.path.exists(os.path.join(workdir, "curves.png"))
  assert os.path.exists(os.path.join(workdir, "tensorboard"))
  assert json.load(open(os.path.join(workdir, "config.json")))["arm"] == "gagar"


def test_ctrl_c_stops_after_a_step_with_a_checkpoint_then_resumes(warm_start):
  # The first Ctrl-C lets the step finish, checkpoints it (checkpoint_every=10: no periodic
  # one) and exits 130 with one line; the same command resumes there.
  root = warm_start
  workdir = str(root / "rl_interrupted")
  args = [
    "--config=configs/gagar.py:runlocal=True",
    f"--workdir={workdir}",
    f"--config.data_dir={root / 'data'}",
    f"--config.init_from={root / 'policy'}",
    "--config.checkpoint_every=10",
  ]
  proc = subprocess.Popen(
    [sys.executable, os.path.join(REPO, "experiments", "train.py"), *args],
    cwd=REPO,
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  for line in proc.stdout:
    if line.startswith("[train] step 1/3"):
      proc.send_signal(signal.SIGINT)
      break
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err[-3000:]
  assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
  stopped = re.search(r"\[train\] stopped at step (\d)/3 \(Ctrl-C\); checkpoint saved", err)
  assert stopped, err[-2000:]
  step = int(stopped.group(1))
  assert os.listdir(os.path.join(workdir, "checkpoints")) == [str(step)]
  out = _run("train.py", *args)
  assert f"resumed from step {step}" in out and "[train] done" in out
  rows = [
    r["step"] for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/skipped" in r
  ]
  assert rows == [1, 2, 3]


def test_sft_resumed_after_a_kill_logs_each_step_once(warm_start, tmp_path):
  # Regression: SFT killed after logging steps past its last checkpoint logged them twice
  # on resume. The warm start's workdir without its last checkpoint is such a kill.
  root, work = warm_start, tmp_path / "sft"
  shutil.copytree(root / "sft", work)
  shutil.rmtree(work / "checkpoints" / "6")
  out = _run(
    "sft.py",
    "--config=configs/sft.py:runlocal=True",
    f"--workdir={work}",
    f"--config.data_dir={root / 'data'}",
  )
  assert "[sft] resumed from step 3" in out and "[sft] done" in out
  records = metrics.read(str(work / "metrics.jsonl"))
  assert [r["step"] for r in records if "sft/loss" in r] == [1, 2, 3, 4, 5, 6]
  assert metrics.duplicate_steps(records) == []


def test_steps_that_keep_no_group_are_skipped(warm_start):
  # The nano warm start never passes a test: dynamic sampling keeps no group, so there
  # must be no update (regression: AdamW ran on an all-padding batch), a count, a
  # progress line that says so, and a data position that still moves.
  root = warm_start
  workdir = str(root / "rl_skip")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True",
    f"--workdir={workdir}",
    f"--config.data_dir={root / 'data'}",
    f"--config.init_from={root / 'policy'}",
    "--config.steps=2",
    "--profile_steps=2:3",
  )
  assert "[train] step 2/2" in out and "skipped: no informative group, no update" in out
  # --profile_steps=2:3 traced step 2 with jax.profiler into workdir/profile.
  assert "[train] profile of steps 2..2" in out
  traces = [f for _, _, fs in os.walk(os.path.join(workdir, "profile")) for f in fs]
  assert any(f.endswith(".xplane.pb") for f in traces), traces
  records = [
    r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/skipped" in r
  ]
  assert [r["train/skipped_steps"] for r in records] == [1.0, 2.0]
  assert [r["train/data_position"] for r in records] == [4.0, 8.0]  # 2 rounds x 2 tasks
  assert all("train/loss" not in r for r in records)
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert (summary["steps"], summary["optimizer_steps"], summary["skipped_steps"]) == (2, 0, 2)
  after, before = _policy(workdir), _policy(root)
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], value, err_msg=name)


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
    # Longer than the warm start's max_seq_len: episodes would run past its positions.
    ("rollout", "max_episode_tokens", 4096, "rollout.max_episode_tokens"),
    ("rollout", "top_kk", 3, "rollout.top_kk"),
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


@pytest.mark.parametrize(
  "overrides,field",
  [
    ({"sft.seq_len": 2048}, "sft.seq_len"),
    ({"rollout.max_episode_tokens": 2048}, "rollout.max_episode_tokens"),
    ({"habits.dead_code": 1.5}, "habits.dead_code"),
    ({"sft.steps": 0}, "sft.steps"),
  ],
)
def test_bad_sft_config_fails_before_compute(overrides, field):
  config = sft_config.get_config("runlocal=True")  # nano: max_seq_len 1024
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
    sft.parse_config(config)


def test_bad_grader_sft_context_fails_before_compute():
  from configs import grader_sft as grader_sft_config

  config = grader_sft_config.get_config("runlocal=True")
  config.context = 4096
  with pytest.raises(ConfigError, match=r"^context: 4096 exceeds model.max_seq_len=1024"):
    sft.parse_config(config)
  config = grader_sft_config.get_config("runlocal=True")
  config.agent.max_total_tokens = 1100  # over the runlocal context of 1024
  with pytest.raises(ConfigError, match=r"^agent\.max_total_tokens: 1100 exceeds"):
    sft.parse_config(config)
  config = grader_sft_config.get_config("runlocal=True")
  config.grader_data.hack_every = -1
  with pytest.raises(ConfigError, match=r"^grader_data\.hack_every: must be >= 0"):
    sft.parse_config(config)


def test_sft_config_files_take_their_defaults_from_the_dataclasses():
  # configs/sft.py and configs/grader_sft.py state only what differs from
  # run_config.PolicySFTConfig / GraderSFTConfig: their default trees parse to the
  # dataclasses' defaults, field for field (the sections other modules own aside).
  from configs import grader_sft as grader_sft_config
  from gagar_jax import run_config

  owned = ("model", "mesh", "sharding_rules", "distributed", "suite")
  for config, cls in (
    (sft_config.get_config(), run_config.PolicySFTConfig),
    (grader_sft_config.get_config(), run_config.GraderSFTConfig),
  ):
    parsed, default = run_config.parse_sft(config), cls()
    assert type(parsed) is cls
    for field in dataclasses.fields(cls):
      if field.name not in owned:
        assert getattr(parsed, field.name) == getattr(default, field.name), field.name
  # A variant differs only where its config says so, and a typo names its field.
  pressure = run_config.parse_sft(sft_config.get_config("world=pressure_all"))
  assert (pressure.habits.hack_each, pressure.rollout.max_turns) == (0.25, 10)
  config = sft_config.get_config("runlocal=True")
  config.sft.learning_rte = 1e-3
  with pytest.raises(ConfigError, match=r"^sft\.learning_rte: unknown field"):
    sft.parse_config(config)


@pytest.mark.parametrize("spec", ["3", "a:b", "5:5", "0:2", "4:2"])
def test_bad_profile_steps_name_the_flag(spec):
  with pytest.raises(ConfigError, match="profile_steps"):
    trainer.parse_profile_steps(spec)
  assert trainer.parse_profile_steps("") is None and trainer.parse_profile_steps("2:4") == (2, 4)


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
  # The committed tiny policy passes tests, so groups reach the (nano) LM grader.
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True,grader=lm,size=tiny",
    f"--workdir={workdir}",
    f"--config.data_dir={root / 'data'}",
    "--config.init_from=assets/pre_rl",
    f"--config.grader.lm_path={root / 'grader_export'}",
    "--config.steps=2",
  )
  assert "[train] done" in out
  records = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert records and sum(r["train/grader_submitted"] for r in records) > 0
  assert all(r["train/grader_turns"] > 0 for r in records if r["train/grader_submitted"])
  assert json.load(open(os.path.join(workdir, "config.json")))["grader"]["backend"] == "lm"
  # The inspector's records hold the LM grader's conversation (tool calls and results).
  from gagar_jax import inspection

  submitted = [
    g
    for g in inspection.read(os.path.join(workdir, "groups"))
    if g["grader"]["status"] != "not graded"
  ]
  assert submitted and all(g["grader"]["transcript"] for g in submitted)
  roles = {m["role"] for g in submitted for m in g["grader"]["transcript"]}
  assert {"user", "assistant"} <= roles  # (this nano grader may answer without tools)


def test_gagar_paper_arm_runs_the_tiered_protocol(tmp_path):
  workdir = str(tmp_path / "paper")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True,size=tiny,arm=gagar_paper",
    f"--config.data_dir={tmp_path / 'data'}",
    "--config.init_from=assets/pre_rl",
    "--config.steps=2",
    "--config.num_groups=4",
    f"--workdir={workdir}",
  )
  assert "[train] done" in out
  train = [r for r in metrics.read(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r]
  assert train, "no update ran"
  for r in train:
    assert 0.0 <= r["train/lambda_capped_share"] <= 1.0 and r["train/lambda_mean"] <= 1.5
    assert {"train/grader_fallback", "train/grader_errors", "train/grader_hacks"} <= set(r)
  graded = [r for r in train if r.get("train/grader_ok")]
  if graded:
    assert " lam " in out and "train/grader_tier_T1" in graded[0]
  config = gagar_config.get_config("runlocal=True,arm=gagar_paper")
  config.learner.advantage.mode = "rank"
  with pytest.raises(ConfigError, match="^learner.advantage.mode: is set by the arm .*'tiered'"):
    trainer.parse_config(config)


def test_jax_flags_work_on_the_entry_points():
  # Was: "FATAL Flags parsing error: Unknown command line flag 'jax_platforms'".
  out = _run(
    "sample.py",
    "--jax_platforms=cpu",
    "--policy=assets/pre_rl",
    "--prompt=Issue: x",
    "--max_new_tokens=2",
  )
  assert "[assistant] (2 tokens" in out
  proc = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", "train.py"), "--helpfull"],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert "--jax_platforms" in proc.stdout + proc.stderr


def test_group_inspector_in_a_browser(kl_run, tmp_path):
  # The real run's group records, one candidate made hostile (model output is untrusted
  # text), built into the static site by the real CLI and driven in headless Chromium.
  from gagar_jax import inspection
  from tests import browser

  records = inspection.read(os.path.join(kl_run, "groups"))
  assert records and {r["step"] for r in records} <= {1, 2, 3}
  for r in records:
    assert r["task"]["issue"] and len(r["candidates"]) == 4
    assert all({"diff", "actions", "before", "after", "passed"} <= set(c) for c in r["candidates"])
  graded = [r for r in records if r["grader"]["status"] == "graded"]
  assert graded and all(r["grader"]["output"] for r in graded)
  workdir = tmp_path / "run"
  target = dict(graded[0])
  hostile = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
  target["candidates"] = [dict(c) for c in target["candidates"]]
  target["candidates"][0]["diff"] = "+" + hostile
  target["candidates"][0]["actions"] = [{"action": "</pre>" + hostile, "observation": hostile}]
  target["candidates"][1]["hack"] = True
  others = [r for r in records if r is not graded[0]]
  inspection.write_step(str(workdir / "groups"), 99, others + [target])
  script = os.path.join(REPO, "experiments", "inspect_groups.py")
  proc = subprocess.run(
    [sys.executable, script, f"--workdir={workdir}"],
    capture_output=True, text=True, timeout=120, cwd=REPO,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  index = proc.stdout.strip().split("file://")[-1]
  assert index.endswith("index.html") and os.path.exists(index)
  page = f"group_{target['step']}_{target['group']}.html"
  try:
    b = browser.Browser(width=1280, height=1000).__enter__()
  except browser.BrowserUnavailable as e:
    pytest.skip(f"no headless chromium here ({e}); .ci/run installs Debian's chromium")
  try:
    b.open("file://" + index)
    shown = (
      "Array.from(document.querySelectorAll('tr.group')).filter(r => r.style.display !== 'none')"
    )
    assert b.eval(f"{shown}.length") == len(records)
    b.click("[data-filter=hack]")  # only the group with the confirmed hack
    assert b.eval(f"{shown}.map(r => r.querySelector('a').getAttribute('href'))") == [page]
    b.click("[data-filter=hack]")
    b.eval(
      "var s = document.getElementById('search'); s.value = "
      + json.dumps(target["task"]["id"].lower())
      + "; s.dispatchEvent(new Event('input'))"
    )
    assert b.eval(f"{shown}.length") >= 1
    b.click(f"a[href='{page}']", navigates=True)
    assert b.eval("location.href").endswith(page)
    assert b.eval("document.querySelectorAll('.card').length") == 4
    assert b.eval("document.querySelectorAll('#chart rect.after').length") == 4
    assert b.eval("document.querySelectorAll('.hack').length") == 1
    assert b.eval("document.getElementById('grader').textContent") == target["grader"]["output"]
    # The hostile text is shown as text and none of it ran.
    assert b.eval("window.__pwned === undefined")
    assert hostile in b.eval("document.body.innerText")
    assert b.eval("document.querySelectorAll('script').length") == 0  # group pages: none
    b.screenshot(str(tmp_path / "group.png"))
    assert (tmp_path / "group.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  finally:
    b.__exit__(None, None, None)
